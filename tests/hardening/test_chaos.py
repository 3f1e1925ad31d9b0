"""Chaos (docs/reliability.md): a hung backend, a SIGKILLed router, a SIGKILLed kairosd.

Real processes on 127.0.0.1 where the fault is a process dying; every wait is
bounded. Timings are reported in docs/reliability.md, never asserted here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kairos_common.credentials import LIFECYCLE_FILE, discover_credential
from kairos_common.identity import compose_key
from kairos_common.testing import free_port
from kairos_common.wire import AgentStart
from kairosd.testing import ScriptedVllm
from router.config import TimeoutSettings
from router.testing import FakeBackend, start_router

pytestmark = pytest.mark.e2e
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_hung_backend_opens_the_breaker_and_traffic_moves(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    """A backend that answers /health but never answers inference: after
    ``breaker_failures`` timeouts of ``first_byte_s`` each, nothing new goes there."""
    hung, good = backends
    hung.behaviour.gate = asyncio.Event()  # never set: hangs every inference request
    timeouts = TimeoutSettings(first_byte_s=0.5, breaker_failures=1, breaker_open_s=60.0)
    router = await start_router([hung.url, good.url], tmp_path / "s", timeouts=timeouts)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(router.url + "/v1/chat/completions", json=BODY) as r:
                assert r.status == 504
            await router.health.check_once()  # /health still says ok
            i0 = router.core.pool.get("i0")
            assert i0 is not None and i0.healthy and i0.breaker_open
            for _ in range(3):
                async with s.post(router.url + "/v1/chat/completions", json=BODY) as r:
                    assert r.status == 200
        assert len(good.received) == 3 and len(hung.received) == 1
    finally:
        await router.stop()


async def _router_proc(backend: str, port: int, state: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "router.cli", "run", "--backend", backend, "--port", str(port),
        "--state-dir", str(state), "--log-json",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    async with asyncio.timeout(30):
        while line := await proc.stderr.readline():
            if b'"listening"' in line:
                break
    asyncio.get_running_loop().create_task(_drain(proc.stderr))
    return proc


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def _json(s: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with s.request(method, url, **kw) as r:
        return r.status, await r.json(content_type=None)


async def test_router_sigkill_restart_keeps_agents_and_nothing_ended_returns(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    proc = await _router_proc(backends[0].url, port, state)
    try:
        token = discover_credential(url, LIFECYCLE_FILE)
        assert token is not None  # published for local clients, no flag needed
        life = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as s:
            _, a = await _json(
                s, "POST", url + "/kairos/v1/agents", json={"name": "a"}, headers=life
            )
            _, b = await _json(
                s, "POST", url + "/kairos/v1/agents", json={"name": "b"}, headers=life
            )
            key = compose_key(a["token"], "sk-user")
            status, _ = await _json(
                s, "POST", url + "/v1/chat/completions", json=BODY,
                headers={"Authorization": f"Bearer {key}"},
            )  # fmt: skip
            assert status == 200
            end = f"{url}/kairos/v1/agents/{b['agent_id']}/end"
            body = {"exit_code": 0, "end_key": b["end_key"]}
            status, _ = await _json(s, "POST", end, json=body, headers=life)
            assert status == 200
        proc.send_signal(signal.SIGKILL)  # right after the acknowledgement
        await proc.wait()
        proc = await _router_proc(backends[0].url, port, state)
        async with aiohttp.ClientSession() as s:
            status, info = await _json(s, "GET", f"{url}/kairos/v1/agents/{a['agent_id']}")
            assert status == 200 and info["instance"] == "i0" and info["turns"] >= 1
            status, _ = await _json(s, "GET", f"{url}/kairos/v1/agents/{b['agent_id']}")
            assert status == 404  # the ended agent did not come back
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                await proc.wait()


@pytest.fixture
async def live_vllm() -> AsyncIterator[ScriptedVllm]:
    fake = ScriptedVllm()
    await fake.start()
    yield fake
    fake.release_hangs()
    await fake.stop()


async def _kairosd(*args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "KAIROSD_HTTP_TIMEOUT_S": "0.4", "KAIROSD_GPU_TIMEOUT_S": "0.4"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kairosd", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


async def test_kairosd_sigkill_then_reset_unlocks_the_simulated_gpu(
    live_vllm: ScriptedVllm,
) -> None:
    """What systemd's ExecStopPost does after a crash: `kairosd reset`."""
    proc = await _kairosd(
        "run", "--instance", "gpu0", "--vllm-url", live_vllm.url, "--gpu-backend", "sim",
        "--policy", "fixed:1000", "--epoch-s", "0.5", "--listen-port", "0",
    )  # fmt: skip
    try:
        await live_vllm.wait_for(lambda: live_vllm.gpus[0].locked_mhz is not None, 20.0)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert live_vllm.gpus[0].locked_mhz is not None  # SIGKILL: nobody reset it
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    reset = await _kairosd("reset", "--gpu-backend", "sim", "--vllm-url", live_vllm.url)
    async with asyncio.timeout(20):
        _, err = await reset.communicate()
    assert reset.returncode == 0, err.decode()
    assert live_vllm.gpus[0].locked_mhz is None  # back at the maximum clock


async def test_backend_dying_mid_stream_gives_a_clean_error_event_and_a_right_ledger(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    dying = backends[0]
    dying.behaviour.drop_after_first_byte = True  # the connection dies after one event
    router = await start_router([dying.url], tmp_path / "s")
    try:
        started = router.core.agents.start(AgentStart(name="a"))
        key = compose_key(started.token, "sk-user")
        async with aiohttp.ClientSession() as s, s.post(
            router.url + "/v1/chat/completions", json={**BODY, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as r:  # fmt: skip
            assert r.status == 200
            text = (await r.read()).decode()
        events = [e for e in text.split("\n\n") if e.strip()]
        assert events[-1].startswith("data: ") and "upstream stream failed" in events[-1]
        agent = router.core.ledger.get(started.agent_id)
        assert agent is not None and agent.in_flight == 0
        assert agent.turns == 0 and agent.decode_tokens == 0  # nothing accounted twice
        assert len(dying.received) == 1  # not resent after bytes reached the client
    finally:
        await router.stop()
