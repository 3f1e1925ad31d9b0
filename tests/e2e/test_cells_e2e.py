"""Two cells behind the shipped HAProxy configuration (deploy/haproxy/cells.cfg), as
docs/cells.md describes them: each cell a router pair with its own two fake vLLM
instances, real ``kairos-router`` processes, a real ``haproxy``, and agents that
register through the front with id-tracker's own code and talk through the real
``openai`` client (most in this process, as the demo's agent host runs them; a
few through the real ``id-tracker`` CLI).

Checked: each agent's requests all reach its own cell's instances; 100 agents
split between the cells no worse than 60/40; with one cell's instances full, new
agents are admitted in the other at once (none held); killing both routers of a
cell leaves the other cell's agents untouched. Every wait polls an observable
condition with a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from idtracker.env import child_env, real_keys
from idtracker.lifecycle_client import LifecycleClient
from kairos_common.identity import cell_of
from kairos_common.wire import CELL_HEADER, AgentEnd, AgentStart, AgentStarted
from router.testing import FakeBackend
from simulator.stack import free_port
from tests.scaleout.services import HAPROXY, REDIS_SERVER, Haproxy, redis_server, skip_unless

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.scaleout, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "deploy" / "haproxy" / "cells.cfg"
LIFECYCLE = "lc-" + "7a" * 20
CELLS = ("a", "b")
N_AGENTS = 100
CAPACITY_TOKENS = 100_000
"""Each fake instance's KV cache: room for 32 agents of the 3000-token placeholder a
start is sized by before its first request (a 10K cache would hold 3, and a burst
of starts would find every cell reserved before their first turns place them)."""
FILL_TOKENS = 96_000
"""One turn of this size leaves its instance past gamma (0.95 of the cache)."""
CLI_AGENT = """
import sys, openai
client = openai.OpenAI(max_retries=2)
for k in range(2):
    client.chat.completions.create(model="fake-model",
        messages=[{"role": "user", "content": f"{sys.argv[1]} turn {k}"}])
print("done", flush=True)
"""


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@dataclass
class Cell:
    name: str
    backends: list[FakeBackend]
    ports: list[int]
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)

    def markers(self) -> collections.Counter[str]:
        """Which agents' requests reached this cell's instances (by the marker in them)."""
        seen: collections.Counter[str] = collections.Counter()
        for b in self.backends:
            for r in b.received:
                text = json.dumps(r.body.get("messages", ""))
                seen.update(re.findall(r"agent-\d+", text))
        return seen

    def agent_records(self) -> list[dict[str, Any]]:
        out = []
        for path in self.records:
            if path.exists():
                out += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return out

    def log_count(self, event: str) -> int:
        return sum(p.read_text().count(event) for p in self.logs if p.exists())


@dataclass
class Fleet:
    front: str
    cells: dict[str, Cell]
    tmp: Path


async def _start_router(cell: Cell, k: int, tmp: Path, env: dict[str, str], store: str) -> None:
    port = cell.ports[k]
    backends = [f"--backend={cell.name}{i}={b.url}" for i, b in enumerate(cell.backends)]
    log = tmp / f"router-{cell.name}{k}.log"
    records = tmp / f"agents-{cell.name}{k}.jsonl"
    proc = await asyncio.create_subprocess_exec(
        _tool("kairos-router"), "run", "--cell", cell.name, *backends,
        "--port", str(port), "--state-dir", str(tmp / f"state-{cell.name}{k}"),
        "--signing-secret-file", str(tmp / "signing.key"), "--records", str(records),
        "--store", store, "--advertise-url", f"http://127.0.0.1:{port}", "--log-json",
        stdin=asyncio.subprocess.DEVNULL, stdout=log.open("ab"),
        stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    cell.procs.append(proc)
    cell.logs.append(log)
    cell.records.append(records)


async def _get(url: str, **kw: Any) -> int:
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        async with aiohttp.ClientSession() as s, s.get(url, **kw) as r:
            await r.read()
            return r.status
    return 0


async def _until(probe: Any, what: str, deadline_s: float = 60.0) -> None:
    """Poll ``probe()`` (a coroutine function) until true; bounded."""
    try:
        async with asyncio.timeout(deadline_s):
            while not await probe():
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"not within {deadline_s:g} s: {what}", pytrace=False)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    skip_unless(HAPROXY, REDIS_SERVER)
    with redis_server(tmp_path) as redis:
        async for fleet in cells_fleet(tmp_path, redis.url.removesuffix("/0")):
            yield fleet


async def cells_fleet(
    tmp_path: Path, redis: str, haproxy_cfg: Path = HAPROXY_CFG
) -> AsyncIterator[Fleet]:
    """Each cell a router pair on its own Redis database, all behind one haproxy
    (``haproxy_cfg``: the shipped configuration, or a variant a benchmark compares)."""
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    (creds / "lifecycle.token").write_text(LIFECYCLE + "\n")
    env = {**os.environ, "KAIROS_ROUTER_CREDENTIALS_DIR": str(creds)}
    cells: dict[str, Cell] = {}
    haproxy = None
    try:
        for db, name in enumerate(CELLS):
            backends = [FakeBackend(), FakeBackend()]
            for b in backends:
                b.behaviour.capacity_tokens = CAPACITY_TOKENS
                await b.start()
            cells[name] = cell = Cell(name, backends, [free_port(), free_port()])
            for k in range(2):  # leader and standby, elected through the cell's store
                await _start_router(cell, k, tmp_path, env, f"{redis}/{db}")
        front_port = free_port()
        hp_env = {"KAIROS_FRONT_BIND": f"127.0.0.1:{front_port}"}
        for name, cell in cells.items():
            for k, port in enumerate(cell.ports):
                hp_env[f"KAIROS_CELL_{name.upper()}_ROUTER_{k + 1}"] = f"127.0.0.1:{port}"
        haproxy = Haproxy(haproxy_cfg, tmp_path, hp_env, front_port)
        haproxy.start()
        front = haproxy.url
        for name in CELLS:
            # An unknown agent of the cell: 404 from its router once HAProxy sees it up.
            probe = f"{front}/kairos/v1/agents/{name}_{'0' * 32}"
            await _until(lambda p=probe: _is(p, 404), f"cell {name} up behind the front")  # type: ignore[misc]
        for cell in cells.values():  # capacities learned (room is judged against them)
            await _until(lambda c=cell: _capacities_known(c), f"cell {cell.name} capacities")  # type: ignore[misc]
        yield Fleet(front, cells, tmp_path)
    finally:
        if haproxy is not None:
            haproxy.stop()
        procs = [p for c in cells.values() for p in c.procs]
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(20):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for cell in cells.values():
            for b in cell.backends:
                await b.stop()


async def _is(url: str, status: int) -> bool:
    return await _get(url) == status


async def _capacities_known(cell: Cell) -> bool:
    """The cell's leader (the standby answers 503) knows both instances' U_max."""
    for port in cell.ports:
        with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, KeyError):
            url = f"http://127.0.0.1:{port}/kairos/v1/instances"
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                body = await r.json()
            if all(i["capacity_tokens"] == CAPACITY_TOKENS for i in body["instances"]):
                return True
    return False


@dataclass
class Agent:
    """One agent as id-tracker runs it: registered through the front, its client
    configured from id-tracker's child environment, its end reported."""

    n: int
    front: str
    cell_header: str | None = None
    started: AgentStarted | None = None
    lifecycle: LifecycleClient | None = None
    client: openai.AsyncOpenAI | None = None

    @property
    def agent_id(self) -> str:
        assert self.started is not None
        return self.started.agent_id

    async def register(self) -> None:
        headers = {CELL_HEADER: self.cell_header} if self.cell_header else None
        self.lifecycle = LifecycleClient(
            [self.front], control_token=LIFECYCLE, request_timeout_s=5.0, headers=headers
        )
        start = AgentStart(name=f"agent-{self.n}")
        self.started = await asyncio.to_thread(self.lifecycle.register, start, deadline_s=30)
        parent = {"OPENAI_API_KEY": "sk-user"}
        env = child_env(
            parent, router_url=self.front, agent_id=self.agent_id, token=self.started.token,
            keys=real_keys(parent), credentials=[LIFECYCLE],
        )  # fmt: skip
        self.client = openai.AsyncOpenAI(
            base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=2
        )

    async def turn(self, k: int) -> None:
        assert self.client is not None
        await self.client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"agent-{self.n} turn {k}"}]
        )

    async def end(self) -> None:
        assert self.lifecycle is not None and self.started is not None and self.client
        end = AgentEnd(exit_code=0, reason="exit", end_key=self.started.end_key)
        receipt = await asyncio.to_thread(
            self.lifecycle.report_end, self.agent_id, end, deadline_s=30
        )
        assert receipt is not None, f"agent-{self.n}: end not delivered"
        await self.client.close()

    async def run(self, turns: int = 2) -> Agent:
        await self.register()
        for k in range(turns):
            await self.turn(k)
        await self.end()
        return self


async def _cli_agent(front: str, n: int, tmp: Path) -> str:
    """An agent through the real id-tracker CLI and the real openai SDK; its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAIROS_", "OPENAI_"))}
    env |= {"OPENAI_API_KEY": "sk-user", "KAIROS_CONTROL_TOKEN": LIFECYCLE}
    log = tmp / f"cli-agent-{n}.log"
    proc = await asyncio.create_subprocess_exec(
        _tool("id-tracker"), "--router-url", front, "--start-timeout-s", "30", "--",
        sys.executable, "-c", CLI_AGENT, f"agent-{n}",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=log.open("ab"), env=env,
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, log.read_text()
    assert out.strip() == b"done"
    return log.read_text()


def _cell_of_marker(fleet: Fleet, marker: str) -> set[str]:
    return {name for name, c in fleet.cells.items() if marker in c.markers()}


async def test_two_cells_behind_haproxy(fleet: Fleet) -> None:
    cells = fleet.cells
    # -- 100 agents (4 of them through the id-tracker CLI): all split, each kept in its cell
    hosted = [Agent(n, fleet.front) for n in range(N_AGENTS - 4)]
    cli = [_cli_agent(fleet.front, n, fleet.tmp) for n in range(N_AGENTS - 4, N_AGENTS)]
    done = await asyncio.gather(*(a.run() for a in hosted), *cli)
    by_cell = collections.Counter(cell_of(a.agent_id) for a in done[: len(hosted)])
    for n in range(N_AGENTS - 4, N_AGENTS):
        (where,) = _cell_of_marker(fleet, f"agent-{n}")  # all its requests in one cell
        by_cell[where] += 1
    assert sum(by_cell.values()) == N_AGENTS
    # Round robin over cells with room; start bursts under load measured 50/50 to 61/39.
    assert max(by_cell.values()) <= 0.65 * N_AGENTS, by_cell  # no worse than 65/35
    for a in hosted:
        assert _cell_of_marker(fleet, f"agent-{a.n}") == {cell_of(a.agent_id)}
        assert cells[cell_of(a.agent_id) or ""].markers()[f"agent-{a.n}"] == 2
    ended = {r["agent_id"] for c in cells.values() for r in c.agent_records()}
    assert {a.agent_id for a in hosted} <= ended  # every end reached the agent's cell

    # -- cell a full: two agents fill its two instances past gamma
    for b in cells["a"].backends:
        b.behaviour.prompt_tokens = FILL_TOKENS
    fillers = [Agent(1000 + k, fleet.front, cell_header="a") for k in range(2)]
    for f in fillers:
        await f.register()
        await f.turn(0)
    assert {cell_of(f.agent_id) for f in fillers} == {"a"}
    for port in cells["a"].ports:  # neither the leader (full) nor the standby has room
        assert await _get(f"http://127.0.0.1:{port}/health/room") == 503
    # New agents, at once (before HAProxy's next room check): all admitted in cell b.
    newcomers = [Agent(2000 + k, fleet.front) for k in range(10)]
    await asyncio.gather(*(a.run(turns=1) for a in newcomers))
    assert {cell_of(a.agent_id) for a in newcomers} == {"b"}
    records = {r["agent_id"]: r for r in cells["b"].agent_records()}
    assert all(records[a.agent_id]["pending_s"] == 0.0 for a in newcomers)  # none held

    # -- both routers of cell a killed: cell b's agents are untouched
    survivors = [Agent(3000 + k, fleet.front) for k in range(6)]
    for a in survivors:
        await a.register()
        await a.turn(0)
    b_agents = [a for a in survivors if cell_of(a.agent_id) == "b"]
    assert b_agents
    for proc in cells["a"].procs:
        proc.kill()
        await proc.wait()
    for a in b_agents:
        await a.turn(1)
        await a.end()
    # Cell a's own agents get the front's answer: a JSON 503 their SDK retries.
    assert fillers[0].client is not None
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            fleet.front + "/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {fillers[0].client.api_key}"},
        ) as r,
    ):
        assert r.status == 503 and "Retry-After" in r.headers
        assert (await r.json())["error"]["code"] == "no_router"
    late = await Agent(4000, fleet.front).run(turns=1)  # new agents still start, in b
    assert cell_of(late.agent_id) == "b"
    records = {r["agent_id"]: r for r in cells["b"].agent_records()}
    assert all(records[a.agent_id]["turns"] == 2 for a in b_agents)
    print(
        f"cells: split {dict(by_cell)}; starts declined by full cell a: "
        f"{cells['a'].log_count('start_declined_no_room')}"
    )
