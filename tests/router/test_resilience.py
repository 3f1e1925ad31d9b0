"""Retries before the first byte, error passthrough after it, client disconnects,
body limit, malformed input, control-plane auth, restart keeping assignments."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import openai
import pytest
from structlog.testing import capture_logs

from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import CHAT, StartRouter, agent_key, control, start_agent


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_503_before_first_byte_retried_on_other_instance(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """503 (vLLM not ready) means the request did not run: safe to retry elsewhere."""
    router = await make_router([backend.url, backend2.url])
    backend.behaviour.fail_next = 1
    backend.behaviour.fail_status = 503
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token), max_retries=0
    )
    out = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=False)
    assert out.choices[0].message.content == "tok " * 4
    assert len(backend.received) == 1 and len(backend2.received) == 1
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.instance == "i1"  # the agent moved with the retry
    await client.close()


async def test_other_5xx_is_not_retried_no_duplicate_generation(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """A 500 may come after the backend ran (part of) the request: relayed, not resent."""
    router = await make_router([backend.url, backend2.url])
    backend.behaviour.fail_next = 1
    token = await start_agent(router.url)
    client = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key=agent_key(token), max_retries=0
    )
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    assert len(backend.received) == 1 and len(backend2.received) == 0
    await client.close()


async def test_connect_error_retried_and_instance_marked(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([_closed_port_url(), backend.url])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    for _ in range(2):
        stream = await client.chat.completions.create(
            model="fake-model", messages=CHAT, stream=True
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "tok " * 4
    await client.close()
    assert not router.core.pool.resolve("i0").healthy  # two connect failures in a row
    text = router.core.metrics.render().decode()
    assert 'kairos_router_upstream_retries_total{instance="i0",reason="connect"} 2.0' in text


async def test_all_instances_failing_returns_openai_error(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([_closed_port_url()])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    assert err.value.status_code in (502, 503)


async def test_error_after_first_byte_passed_in_protocol_form(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.drop_after_first_byte = True
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)
    with pytest.raises(openai.APIError) as err:
        _ = [c async for c in stream]
    await client.close()
    assert "upstream stream failed" in str(err.value)
    assert len(backend.received) == 1  # never retried once bytes reached the client


async def test_client_disconnect_cancels_upstream(
    router: RunningRouter, backend: FakeBackend
) -> None:
    backend.behaviour.gate = asyncio.Event()  # never opened: the backend holds the request
    body = {"model": "fake-model", "messages": CHAT, "stream": True}

    async def call() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(router.url + "/v1/chat/completions", json=body) as r,
        ):
            await r.read()

    task = asyncio.create_task(call())
    await backend.wait_received(1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    async with asyncio.timeout(5):
        await backend.cancelled_event.wait()
    assert backend.cancelled == 1


async def test_body_limit_413(make_router: StartRouter, backend: FakeBackend) -> None:
    router = await make_router([backend.url], max_body_bytes=4096)
    big = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 8000}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/chat/completions", json=big) as r,
    ):
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "request_too_large"
    assert backend.received == []


@pytest.mark.parametrize(
    ("method", "path", "data", "status"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("POST", "/v1/chat/completions", b'{"model": "m", "stream": "yes"}', 400),
        ("POST", "/v1/completions", b'{"model": 3}', 400),
        ("POST", "/v1/chat/completions", b'{"stream": true, "stream_options": 1}', 400),
        ("GET", "/v1/nope", b"", 404),
        ("GET", "/v1/chat/completions", b"", 405),
    ],
)
async def test_malformed_input_gets_openai_error_body(
    router: RunningRouter, backend: FakeBackend, method: str, path: str, data: bytes, status: int
) -> None:
    async with aiohttp.ClientSession() as s, s.request(method, router.url + path, data=data) as r:
        assert r.status == status
        body = await r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in body["error"]["message"]
    assert backend.received == []


async def test_anthropic_route_errors_in_anthropic_form(router: RunningRouter) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/messages", data=b"{oops") as r,
    ):
        assert r.status == 400
        body = await r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


async def test_control_api_requires_token_when_configured(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url], control_token="s3cret")
    status, body = await control("POST", router.url + "/kairos/v1/agents", {}, headers={})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = await control(
        "POST", router.url + "/kairos/v1/agents", {}, headers={"Authorization": "Bearer s3cret"}
    )
    assert status == 200 and body["token"].startswith("kairos1.")


async def test_restart_keeps_identities_and_assignments(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend, tmp_path: Path
) -> None:
    state = tmp_path / "persist"
    first = await make_router([backend.url, backend2.url], state_dir=state)
    admin = first.url + "/kairos/v1/admin/instances"
    a = await start_agent(first.url, name="alpha")
    b = await start_agent(first.url)
    client_a = openai.AsyncOpenAI(base_url=first.url + "/v1", api_key=agent_key(a))
    await client_a.chat.completions.create(model="fake-model", messages=CHAT)
    await control("POST", admin + "/i0/drain", {"draining": True})
    client_b = openai.AsyncOpenAI(base_url=first.url + "/v1", api_key=agent_key(b))
    await client_b.chat.completions.create(model="fake-model", messages=CHAT)
    await client_a.close()
    await client_b.close()
    await first.stop()

    second = await make_router([backend.url, backend2.url], state_dir=state)
    for token, expected in ((a, "i0"), (b, "i1")):
        agent = second.core.ledger.get(token.split(".")[1])
        assert agent is not None and agent.instance == expected and agent.admitted
        assert agent.turns == 1
    assert second.core.ledger.get(a.split(".")[1]).name == "alpha"  # type: ignore[union-attr]
    before = len(backend2.received)
    client = openai.AsyncOpenAI(base_url=second.url + "/v1", api_key=agent_key(b))
    await client.chat.completions.create(model="fake-model", messages=CHAT)  # still signed OK
    await client.close()
    assert len(backend2.received) == before + 1


async def test_first_byte_timeout_gives_504(make_router: StartRouter, backend: FakeBackend) -> None:
    from router.config import TimeoutSettings

    router = await make_router([backend.url], timeouts=TimeoutSettings(first_byte_s=0.2))
    backend.behaviour.gate = asyncio.Event()  # the backend never answers
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}) as r,
    ):
        assert r.status == 504
        assert (await r.json())["error"]["code"] == "upstream_timeout"
    assert len(backend.received) == 1  # a timed-out request is not retried elsewhere


async def test_idle_stream_timeout_ends_stream_with_error_event(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    from router.config import TimeoutSettings

    router = await make_router([backend.url], timeouts=TimeoutSettings(idle_stream_s=0.2))
    backend.behaviour.stall_after_first_byte = True
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    stream = await client.chat.completions.create(model="fake-model", messages=CHAT, stream=True)
    with pytest.raises(openai.APIError, match="upstream stream failed"):
        _ = [c async for c in stream]
    await client.close()


async def _health_status(router: RunningRouter) -> int:
    async with aiohttp.ClientSession() as s, s.get(router.url + "/health") as r:
        return r.status


async def test_late_health_probes_of_an_instance_answering_requests_are_not_failures(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    """Busy is not down: a CPU engine answers /health late while it serves agents."""
    from router.config import TimeoutSettings

    router = await make_router([backend.url], timeouts=TimeoutSettings(health_timeout_s=0.1))
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    backend.behaviour.health_gate = asyncio.Event()  # probes time out from now on
    try:
        for _ in range(3):
            await router.health.check_once()
        assert await _health_status(router) == 200
        await client.chat.completions.create(model="fake-model", messages=CHAT)
    finally:
        backend.behaviour.health_gate.set()
        await client.close()


async def test_late_health_probes_of_an_instance_answering_nothing_mark_it_unhealthy(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    from router.config import TimeoutSettings

    now = [1000.0]
    router = await make_router(
        [backend.url], timeouts=TimeoutSettings(health_timeout_s=0.1), clock=lambda: now[0]
    )
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk", max_retries=0)
    await client.chat.completions.create(model="fake-model", messages=CHAT)
    await client.close()
    backend.behaviour.health_gate = asyncio.Event()
    try:
        now[0] += 2 * (5.0 + 0.1) + 1.0  # the last answer is older than the failure window
        await router.health.check_once()
        await router.health.check_once()
        assert await _health_status(router) == 503
    finally:
        backend.behaviour.health_gate.set()


async def test_backends_serving_different_models_are_reported_once(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    """One router fronts one model: the model names in the backends' /metrics are
    listed per instance, and a fleet that mixes them is warned about, once."""
    backend2.behaviour.model = "other-model"
    router = await make_router([backend.url, backend2.url])
    with capture_logs() as logs:
        for _ in range(3):
            await router.health.check_once()
            for inst in router.core.pool:
                await router.health.scrape_metrics(inst)
    warned = [e for e in logs if e["event"] == "backends_serve_different_models"]
    assert len(warned) == 1
    assert warned[0]["models"] == {"i0": ["fake-model"], "i1": ["other-model"]}
    models = {i["name"]: i["models"] for i in router.core.instances_json()}
    assert models == {"i0": ["fake-model"], "i1": ["other-model"]}
    backend2.behaviour.model = "fake-model"  # fixed: silence
    with capture_logs() as logs:
        for inst in router.core.pool:
            await router.health.scrape_metrics(inst)
    assert not [e for e in logs if e["event"] == "backends_serve_different_models"]
    backend2.behaviour.model = "other-model"  # mixed again: warned again
    with capture_logs() as logs:
        for inst in router.core.pool:
            await router.health.scrape_metrics(inst)
    assert len([e for e in logs if e["event"] == "backends_serve_different_models"]) == 1
