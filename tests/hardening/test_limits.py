"""Input limits, the connection limit, read bounds, retries and the circuit breaker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from kairos_common.testing import ManualClock
from router.testing import FakeBackend, RunningRouter, start_router
from tests.router.conftest import CHAT, agent_key, start_agent

CHAT_URL = "/v1/chat/completions"


async def post(
    url: str, data: bytes | Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def _chat(**extra: Any) -> bytes:
    return json.dumps({"model": "fake-model", "messages": CHAT, **extra}).encode()


async def test_body_over_the_cap_is_413_openai_style(backend: FakeBackend, tmp_path: Path) -> None:
    router = await start_router([backend.url], tmp_path / "s", max_body_bytes=64 * 1024)
    try:
        big = _chat(pad="x" * 100_000)
        status, body = await post(router.url + CHAT_URL, big)
        assert status == 413 and body["error"]["code"] == "request_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: cut while reading
            for _ in range(10):
                yield b" " * 16_384
            yield big

        status, body = await post(router.url + CHAT_URL, chunks())
        assert status == 413 and body["error"]["type"] == "invalid_request_error"
        assert backend.received == []
    finally:
        await router.stop()


def test_default_body_cap_is_at_most_32_mib() -> None:
    from router.config import RouterConfig

    assert RouterConfig().max_body_bytes <= 32 * 1024 * 1024


@pytest.mark.parametrize("depth", [200, 5_000, 100_000])
async def test_deeply_nested_json_is_400_never_500(
    backend: FakeBackend, tmp_path: Path, depth: int
) -> None:
    router = await start_router([backend.url], tmp_path / "s")
    try:
        nested = b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
        status, body = await post(router.url + CHAT_URL, nested)
        assert status == 400 and "nested" in body["error"]["message"]
        status, _ = await post(router.url + "/kairos/v1/agents", b"[" * depth + b"]" * depth)
        assert status in (400, 401)
    finally:
        await router.stop()


async def _filled(backend: FakeBackend, tmp_path: Path, **kw: Any) -> RunningRouter:
    """One instance (U_max = 10000) above γ·U_max after a first agent's turn."""
    backend.behaviour.capacity_tokens = 10_000
    backend.behaviour.prompt_tokens = 9_500
    router = await start_router([backend.url], tmp_path / "s", **kw)
    await router.health.check_once()
    first = await start_agent(router.url)
    headers = {"Authorization": f"Bearer {agent_key(first, backend.behaviour.api_key)}"}
    status, _ = await post(router.url + CHAT_URL, _chat(), headers)
    assert status == 200
    return router


async def test_bogus_keys_never_take_a_hold_queue_slot(
    backend: FakeBackend, tmp_path: Path
) -> None:
    backend.behaviour.api_key = "sk-good"
    router = await _filled(backend, tmp_path)
    try:
        queue = router.core.admission
        for i in range(5):
            token = await start_agent(router.url)
            bogus = {"Authorization": f"Bearer {agent_key(token, f'sk-bogus-{i}')}"}
            status, body = await post(router.url + CHAT_URL, _chat(), bogus)
            assert status == 401, body
            assert len(queue.queue("i0")) == 0
        status, _ = await post(router.url + CHAT_URL, _chat(), {"Authorization": "Bearer nope"})
        assert status == 401 and len(queue.queue("i0")) == 0
        good = await start_agent(router.url)
        task = asyncio.create_task(
            post(
                router.url + CHAT_URL,
                _chat(),
                {"Authorization": f"Bearer {agent_key(good, 'sk-good')}"},
            )
        )
        await queue.wait_until(lambda: len(queue.queue("i0")) == 1)
        task.cancel()
    finally:
        await router.stop()


async def test_waiting_requests_per_agent_are_bounded(backend: FakeBackend, tmp_path: Path) -> None:
    router = await _filled(backend, tmp_path, max_waiting_per_agent=2)
    try:
        token = await start_agent(router.url)
        headers = {"Authorization": f"Bearer {agent_key(token)}"}
        waiting = [
            asyncio.create_task(post(router.url + CHAT_URL, _chat(), headers)) for _ in range(2)
        ]
        agent = router.core.ledger.get(token.split(".")[1])
        assert agent is not None
        adm = router.core.admission
        await adm.wait_until(lambda: agent.in_flight == 2 and len(adm.queue("i0")) == 1)
        status, body = await post(router.url + CHAT_URL, _chat(), headers)
        assert status == 429 and body["error"]["code"] == "too_many_waiting_requests"
        for t in waiting:
            t.cancel()
    finally:
        await router.stop()


async def test_connection_limit_answers_503_and_serves_the_rest(
    backend: FakeBackend, tmp_path: Path
) -> None:
    router = await start_router([backend.url], tmp_path / "s", max_connections=3)
    host, port = router.url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        async with asyncio.timeout(5):
            answer = await reader.read()  # the router closes it after the 503
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        writer.close()
        _, w0 = held.pop()
        w0.close()
        await w0.wait_closed()
        async with asyncio.timeout(5):
            while True:  # the freed slot is usable again (bounded by the timeout)
                async with aiohttp.ClientSession() as s, s.get(router.url + "/health") as r:
                    if r.status == 200:
                        break
    finally:
        for _, w in held:
            w.close()
        await router.stop()


async def test_header_and_body_read_bounds_drop_slow_clients(
    backend: FakeBackend, tmp_path: Path
) -> None:
    from router.config import TimeoutSettings

    # Each bound is tested on a router where only it is short: with both at 0.3 s,
    # a loop stalled 0.3 s between connecting and sending the head (a loaded core)
    # could let the head bound close the connection the body bound should answer.
    # (The test failed once so, unexplained, with CI running on the other core.)
    timeouts = TimeoutSettings(header_read_s=0.3)
    router = await start_router([backend.url], tmp_path / "s", timeouts=timeouts)
    host, port = router.url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # closed by the router
        writer.close()
    finally:
        await router.stop()
    timeouts = TimeoutSettings(body_read_s=0.3)
    router = await start_router([backend.url], tmp_path / "s2", timeouts=timeouts)
    host, port = router.url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        async with asyncio.timeout(10):
            answer = await reader.read(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        writer.close()
    finally:
        await router.stop()


async def test_breaker_opens_on_5xx_moves_traffic_and_half_opens(
    backend: FakeBackend, backend2: FakeBackend, tmp_path: Path
) -> None:
    from router.config import TimeoutSettings

    clock = ManualClock()
    timeouts = TimeoutSettings(breaker_failures=2, breaker_open_s=30.0)
    router = await start_router(
        [backend.url, backend2.url], tmp_path / "s", clock=clock, timeouts=timeouts
    )
    try:
        backend.behaviour.fail_next = 100
        statuses = []
        for _ in range(2):  # anonymous one-turn agents are placed on i0 first
            statuses.append((await post(router.url + CHAT_URL, _chat()))[0])
        assert statuses == [500, 500]  # relayed, not retried (may have run)
        i0 = router.core.pool.get("i0")
        assert i0 is not None and i0.breaker_open and not i0.eligible
        for _ in range(3):
            assert (await post(router.url + CHAT_URL, _chat()))[0] == 200
        assert len(backend.received) == 2 and len(backend2.received) == 3
        clock.advance(31.0)
        router_proxy_tick(router)
        assert not i0.breaker_open  # half-open: the next outcome decides
    finally:
        await router.stop()


def router_proxy_tick(router: RunningRouter) -> None:
    """Run the maintenance loop's breaker step once (tests run without timers)."""
    router.breakers.tick()


async def test_a_client_that_stops_reading_a_stream_is_dropped(tmp_path: Path) -> None:
    """The backend streams ~64 MB of SSE; the client sends its request and never
    reads. Once the socket buffers fill, the router's write blocks; it drops the
    client after ``idle_stream_s`` instead of holding the handler forever."""
    from aiohttp import web

    from router.config import TimeoutSettings

    event = b"data: " + json.dumps({"choices": [{"delta": {"content": "x" * 60_000}}]}).encode()
    upstream_closed = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(1_000):
                await resp.write(event + b"\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            upstream_closed.set()
            raise
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    backend_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    router = await start_router(
        [backend_url], tmp_path / "s", timeouts=TimeoutSettings(idle_stream_s=0.5)
    )
    host, port = router.url.removeprefix("http://").split(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
        body = _chat(stream=True)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        with structlog.testing.capture_logs() as logs:
            async with asyncio.timeout(30):
                await upstream_closed.wait()  # the router gave up on the slow client
        assert any(e["event"] == "slow_client_dropped" for e in logs)
        writer.close()
    finally:
        await router.stop()
        await runner.cleanup()
