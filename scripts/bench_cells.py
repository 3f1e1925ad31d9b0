"""Cells behind HAProxy: how agent starts are steered, side by side (docs/cells.md).

Runs the stack of tests/e2e/test_cells_e2e.py (two cells, each a router pair on
its own Redis database with two fake vLLM instances of 100K tokens, real
``haproxy`` with deploy/haproxy/cells.cfg) and measures, for the shipped
configuration and for a variant without the immediate path (the starts backend
does not ask cells to decline a start they have no room for, so only HAProxy's
``/health/room`` checks steer):

* ``split``: 100 agents started at once (then one turn and their end each), how
  many land in each cell;
* ``held after fill``: cell a is filled (two agents past γ·U_max on its two
  instances), and at once 10 new agents start, each sending its first turn as
  soon as it has started: how many land in full cell a (held there while cell b
  had room) and how many wait at all (3 s bound);
* start latency through the front (p50 / p95 of 40 sequential starts) next to a
  start sent to a cell's leader directly.

Usage: ``python -m scripts.bench_cells [--rounds 3]`` (needs redis-server and
haproxy: ``apt-get install redis-server haproxy``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from idtracker.lifecycle_client import LifecycleClient
from kairos_common.identity import cell_of
from kairos_common.wire import READY_PATH, AgentEnd, AgentStart
from tests.e2e.test_cells_e2e import (
    FILL_TOKENS,
    HAPROXY_CFG,
    LIFECYCLE,
    Agent,
    Fleet,
    cells_fleet,
)
from tests.scaleout.services import redis_server


def _without_decline(folder: Path) -> Path:
    """cells.cfg less the header that lets a full cell decline a start."""
    text = HAPROXY_CFG.read_text()
    line = "    http-request set-header X-Kairos-Require-Room 1\n"
    assert line in text
    variant = folder / "cells.cfg"
    variant.write_text(text.replace(line, ""))
    shutil.copy(HAPROXY_CFG.with_name("cells.map"), folder / "cells.map")
    shutil.copytree(HAPROXY_CFG.with_name("errors"), folder / "errors")
    return variant


async def _split(fleet: Fleet, n: int) -> collections.Counter[str]:
    done = await asyncio.gather(*(Agent(k, fleet.front).run(turns=1) for k in range(n)))
    return collections.Counter(cell_of(a.agent_id) or "?" for a in done)


async def _held_after_fill(fleet: Fleet, base: int) -> tuple[int, int]:
    """(landed in full cell a, waited for admission at all) of 10 newcomers."""
    for b in fleet.cells["a"].backends:
        b.behaviour.prompt_tokens = FILL_TOKENS
    fillers = [Agent(base + k, fleet.front, cell_header="a") for k in range(2)]
    for f in fillers:
        await f.register()
        await f.turn(0)
    newcomers = [Agent(base + 100 + k, fleet.front) for k in range(10)]

    async def arrive(a: Agent) -> bool:
        """Start, then the first turn at once; True if it had to wait (bounded)."""
        await a.register()
        try:
            await asyncio.wait_for(a.turn(0), 3.0)
        except TimeoutError:
            return True
        return False

    waited = sum(await asyncio.gather(*(arrive(a) for a in newcomers)))
    in_a = sum(cell_of(a.agent_id) == "a" for a in newcomers)
    for a in [*fillers, *newcomers]:
        if a.client is not None:
            await a.client.close()
    return in_a, waited


async def _leader(fleet: Fleet, cell: str) -> str:
    """The URL of ``cell``'s leader (the router whose /health/ready answers 200)."""
    for port in fleet.cells[cell].ports:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s, s.get(url + READY_PATH) as r:
            if r.status == 200:
                return url
    raise RuntimeError(f"cell {cell} has no leader")


async def _start_latency_ms(url: str, n: int) -> tuple[float, float]:
    """Each start is ended at once: a started agent that has not sent a request
    reserves room in its cell, and 40 of them would leave none."""
    client = LifecycleClient([url], control_token=LIFECYCLE, request_timeout_s=5.0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        started = await asyncio.to_thread(client.register, AgentStart(name="bench"), deadline_s=10)
        times.append((time.perf_counter() - t0) * 1000)
        end = AgentEnd(exit_code=0, reason="exit", end_key=started.end_key)
        await asyncio.to_thread(client.report_end, started.agent_id, end, deadline_s=10)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


async def _round(variant: str, k: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-cells-") as tmp:
        tmp_path = Path(tmp)
        cfg = HAPROXY_CFG
        if variant != "shipped":
            (tmp_path / "cfg").mkdir()
            cfg = _without_decline(tmp_path / "cfg")
        with redis_server(tmp_path) as redis:
            async for fleet in cells_fleet(tmp_path, redis.url.removesuffix("/0"), cfg):
                split = await _split(fleet, 100)
                lead = await _leader(fleet, "b")
                front_ms = await _start_latency_ms(fleet.front, 40)
                direct_ms = await _start_latency_ms(lead, 40)
                in_a, waited = await _held_after_fill(fleet, 10000 * (k + 1))
                declined = fleet.cells["a"].log_count("start_declined_no_room")
                return {
                    "split": f"{split['a']}/{split['b']}",
                    "in_a": in_a,
                    "waited": waited,
                    "declined": declined,
                    "front_ms": front_ms,
                    "direct_ms": direct_ms,
                }
    raise RuntimeError("no fleet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for k in range(args.rounds):
        for variant in ("shipped", "checks-only"):
            rows.append((variant, k, asyncio.run(_round(variant, k))))
    print(f"{'variant':<12} {'round':>5} {'split a/b':>9} {'new in full a':>13} "
          f"{'waited':>6} {'declined by a':>13} {'start p50/p95 ms front':>22} "
          f"{'direct':>13}")  # fmt: skip
    for variant, k, r in rows:
        front = r["front_ms"]
        direct = r["direct_ms"]
        assert isinstance(front, tuple) and isinstance(direct, tuple)
        latency = f"{front[0]:>13.1f} / {front[1]:<6.1f} {direct[0]:>6.1f} / {direct[1]:<6.1f}"
        print(f"{variant:<12} {k:>5} {r['split']!s:>9} {r['in_a']!s:>10}/10 "
              f"{r['waited']!s:>6} {r['declined']!s:>13} {latency}")  # fmt: skip


if __name__ == "__main__":
    main()
