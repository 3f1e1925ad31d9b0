"""Fleet admission on real processes (docs/control-law.md point 8): ``kairos-router``
in front of two 10K-token backends, agents launched through ``id-tracker`` using the real
``openai`` SDK. Agent A fills i0, agent C fills i1, agent B (a large first
prompt) finds no room anywhere and is held; when C ends, B is placed on i1 at
once — it never waits for i0. Every wait is on an observable event (a line an
agent prints, a process exit, the router's state) with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.testing import FakeBackend
from simulator.stack import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# The agent: one chat turn (size from argv), print "turn-done", then wait for a line on stdin.
AGENT = """
import sys, openai
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model="fake-model",
    messages=[{"role": "user", "content": "x" * int(sys.argv[1])}])
print("turn-done", flush=True)
sys.stdin.readline()
"""


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture
async def backends() -> AsyncIterator[list[FakeBackend]]:
    fakes = [FakeBackend(), FakeBackend()]
    for fake in fakes:
        fake.behaviour.capacity_tokens = 10_000
        fake.behaviour.prompt_tokens = 9_500  # every turn leaves its instance above γ·U_max
        await fake.start()
    yield fakes
    for fake in fakes:
        await fake.stop()


async def _router_state(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
        body: dict[str, Any] = await r.json()
    return {i["name"]: i for i in body["instances"]}


async def _until(url: str, ok: Any, deadline_s: float = 20.0) -> dict[str, Any]:
    """Re-read the router's instance table until ``ok(table)``; bounded."""
    async with asyncio.timeout(deadline_s):
        while True:
            table = await _router_state(url)
            if ok(table):
                return table
            await asyncio.sleep(0.05)


async def _agent(router_url: str, chars: int, log: Path) -> Any:
    env = {**os.environ, "KAIROS_ROUTER_URL": router_url, "OPENAI_API_KEY": "sk-user",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    return await asyncio.create_subprocess_exec(
        _tool("id-tracker"), "--", sys.executable, "-c", AGENT, str(chars),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=log.open("ab"), env=env,
    )  # fmt: skip


async def _turn_done(proc: Any) -> None:
    async with asyncio.timeout(30):
        line = await proc.stdout.readline()
    assert line.strip() == b"turn-done"


async def _release(proc: Any) -> int:
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    async with asyncio.timeout(30):
        return int(await proc.wait())


async def test_held_agent_is_placed_on_a_second_instance(
    backends: list[FakeBackend], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "router.log"
    router = await asyncio.create_subprocess_exec(
        _tool("kairos-router"), "run",
        "--backend", f"i0={backends[0].url}", "--backend", f"i1={backends[1].url}",
        "--port", str(port), "--state-dir", str(tmp_path / "state"),
        "--records", str(tmp_path / "agents.jsonl"), "--log-json",
        stdin=asyncio.subprocess.DEVNULL, stdout=log.open("ab"), stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    agents: list[Any] = []
    try:
        await _wait_capacity(url)
        a = await _agent(url, 40, tmp_path / "a.log")
        agents.append(a)
        await _turn_done(a)
        c = await _agent(url, 40, tmp_path / "c.log")
        agents.append(c)
        await _turn_done(c)  # i0 had no room for c: it went to i1
        assert len(backends[0].received) == len(backends[1].received) == 1
        b = await _agent(url, 20_000, tmp_path / "b.log")  # ≈ 5000 tokens: no room anywhere
        agents.append(b)
        table = await _until(url, lambda t: t["i0"]["pending"] + t["i1"]["pending"] == 1)
        held_on = "i0" if table["i0"]["pending"] else "i1"
        assert held_on == "i0"  # spread rule: least U_i, lowest index
        assert await _release(c) == 0  # C ends: i1 has room, i0 still has none
        await _turn_done(b)
        assert len(backends[1].received) == 2 and len(backends[0].received) == 1
        table = await _router_state(url)
        assert table["i0"]["pending"] == 0 and table["i1"]["ongoing"] == 1
        assert await _release(b) == 0 and await _release(a) == 0
        metrics = await _metrics(url)
        assert 'kairos_router_admissions_total{instance="i1",source="fleet"} 1.0' in metrics
        moved = [json.loads(x) for x in log.read_text().splitlines() if "held_agent_moved" in x]
        assert [(m["source"], m["target"]) for m in moved] == [("i0", "i1")]
    finally:
        for proc in agents:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        router.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await router.wait()


async def _wait_capacity(url: str) -> None:
    """The router learns both capacities from the backends' /metrics (health loop)."""

    def known(t: dict[str, Any]) -> bool:
        return all(t[n]["capacity_tokens"] == 10_000 for n in ("i0", "i1"))

    async with asyncio.timeout(30):
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                await _until(url, known, 30)
                return
            await asyncio.sleep(0.1)


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return await r.text()
