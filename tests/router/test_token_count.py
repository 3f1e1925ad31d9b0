"""``POST /v1/messages/count_tokens`` (router/token_count.py): passed through to the
caller's instance with its real key, never held, placed or accounted; errors in
Anthropic form. And the ``?beta=true`` query Claude Code adds to both Messages routes."""

from __future__ import annotations

from typing import Any

import aiohttp

from kairos_common.identity import issue_token
from router.testing import FakeBackend, RunningRouter
from tests.router.conftest import CHAT, StartRouter, agent_key, one_turn, start_agent

PATH = "/v1/messages/count_tokens"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "count me " * 40}]}


async def _count(
    router: RunningRouter, key: str | None, body: Any = None, raw: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
    if key is not None:
        headers["x-api-key"] = key
    data = raw if raw is not None else None
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + PATH, json=None if raw else (body or BODY), data=data,
               headers=headers) as resp,
    ):  # fmt: skip
        return resp.status, await resp.json(content_type=None)


def _requests(router: RunningRouter, code: str) -> float:
    return router.core.metrics.requests.labels("count_tokens", code).value


async def _two_full(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> tuple[RunningRouter, str]:
    """Two 10K-token instances, i0 and then i1 past γ·U_max with one 9.5K-token
    session each; returns the router and the token of the agent on i1."""
    for b in (backend, backend2):
        b.behaviour.capacity_tokens = 10_000
        b.behaviour.prompt_tokens = 9_500
    router = await make_router([backend.url, backend2.url])
    await router.health.check_once()
    await one_turn(router, await start_agent(router.url))
    on_i1 = await start_agent(router.url)
    await one_turn(router, on_i1)
    assert len(backend.received) == len(backend2.received) == 1
    return router, on_i1


async def test_count_goes_to_the_agents_instance_with_its_real_key_and_changes_nothing(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router, token = await _two_full(make_router, backend, backend2)
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.instance == "i1"
    before = (agent.turns, agent.context_tokens, agent.decode_tokens, agent.last_active_s)
    status, body = await _count(router, agent_key(token, "sk-ant"))
    assert (status, body) == (200, {"input_tokens": 9_500})
    assert backend.counted == [] and len(backend2.counted) == 1
    sent = backend2.counted[0]
    assert sent.headers["x-api-key"] == "sk-ant"
    assert not any("kairos1" in v for v in sent.headers.values())
    assert sent.body == BODY
    after = (agent.turns, agent.context_tokens, agent.decode_tokens, agent.last_active_s)
    assert after == before and agent.in_flight == 0
    assert len(backend2.received) == 1  # no inference request
    assert _requests(router, "200") == 1


async def test_a_newcomer_the_fleet_has_no_room_for_is_answered_at_once(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    router, _ = await _two_full(make_router, backend, backend2)
    token = await start_agent(router.url)  # its first request would be held
    status, body = await _count(router, agent_key(token))
    assert status == 200 and body == {"input_tokens": 9_500}
    adm = router.core.admission
    assert adm.queue("i0").order() == [] and adm.queue("i1").order() == []
    assert len(backend.counted) == 1  # no instance of its own: the first eligible
    newcomer = router.core.ledger.get(token.split(".")[1])
    assert newcomer is None or (newcomer.instance is None and newcomer.turns == 0)


async def test_an_anonymous_count_goes_to_an_instance_serving_its_model(
    make_router: StartRouter, backend: FakeBackend, backend2: FakeBackend
) -> None:
    backend2.behaviour.model = "other-model"
    router = await make_router([backend.url, backend2.url])
    await router.health.check_once()
    status, _ = await _count(router, "sk-plain", {**BODY, "model": "other-model"})
    assert status == 200
    assert backend.counted == [] and backend2.counted[0].headers["x-api-key"] == "sk-plain"


async def test_errors_come_in_anthropic_form(router: RunningRouter, backend: FakeBackend) -> None:
    forged = issue_token("victim", b"not-the-router-secret-0123456789")
    status, body = await _count(router, agent_key(forged))
    assert status == 401 and body["type"] == "error"
    assert body["error"]["type"] == "authentication_error"
    status, body = await _count(router, "sk-plain", raw=b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await _count(router, "sk-plain", raw=b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    assert backend.counted == []
    backend.behaviour.fail_next, backend.behaviour.fail_status = 1, 500
    status, body = await _count(router, "sk-plain")  # vLLM's own error: passed through
    assert status == 500 and body == {"error": {"message": "injected"}}
    assert _requests(router, "401") == 1 and _requests(router, "400") == 2
    assert _requests(router, "500") == 1


async def test_a_dead_backend_is_a_502_and_none_left_a_503(
    router: RunningRouter, backend: FakeBackend
) -> None:
    await backend.stop()
    status, body = await _count(router, "sk-plain")
    assert status == 502 and body["error"]["type"] == "api_error"
    await router.health.check_once()
    await router.health.check_once()  # two failed probes: unhealthy
    status, body = await _count(router, "sk-plain")
    assert status == 503 and body["error"]["type"] == "overloaded_error"


async def test_chat_turns_still_flow_beside_counts(
    router: RunningRouter, backend: FakeBackend
) -> None:
    token = await start_agent(router.url)
    await _count(router, agent_key(token))
    await one_turn(router, token)
    await _count(router, agent_key(token))
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.turns == 1
    assert len(backend.received) == 1 and len(backend.counted) == 2
    assert backend.received[0].body["messages"] == CHAT


async def test_the_beta_query_claude_code_adds_is_accepted(
    router: RunningRouter, backend: FakeBackend
) -> None:
    # Claude Code calls the beta Messages API: `POST /v1/messages/count_tokens?beta=true`
    headers = {"x-api-key": "sk-plain", "anthropic-version": "2023-06-01"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + PATH + "?beta=true", json=BODY, headers=headers) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["input_tokens"] > 0
    assert backend.counted[0].path == PATH


async def test_claude_codes_beta_messages_turn_is_proxied_and_accounted(
    router: RunningRouter, backend: FakeBackend
) -> None:
    token = await start_agent(router.url)
    headers = {"x-api-key": agent_key(token, "sk-ant"), "anthropic-version": "2023-06-01"}
    body = {**BODY, "max_tokens": 8}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/messages?beta=true", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["type"] == "message"
    agent = router.core.ledger.get(token.split(".")[1])
    assert agent is not None and agent.turns == 1
    assert backend.received[0].headers["x-api-key"] == "sk-ant"


async def test_a_body_over_the_limit_is_a_413_and_never_forwarded(
    make_router: StartRouter, backend: FakeBackend
) -> None:
    router = await make_router([backend.url], max_body_bytes=1_024)
    status, body = await _count(router, "sk-plain", {**BODY, "pad": "x" * 2_000})
    assert status == 413 and body["type"] == "error"
    assert backend.counted == [] and _requests(router, "413") == 1
