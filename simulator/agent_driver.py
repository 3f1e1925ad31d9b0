"""Start replay agents through ``id-tracker`` at given arrival times.

Used by ``make demo`` and the end-to-end test: each arrival becomes a real
process tree ``id-tracker -- python -m simulator.replay_agent``, exactly how an
operator launches agents, so identity, start/end reporting, key rewriting and
the router's accounting are all exercised. Arrival times are simulated seconds,
divided by ``speedup`` to get real time. Everything is bounded: agents still
running at the deadline get SIGTERM (forwarded by id-tracker), then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from simulator.replay_agent import program_to_json
from simulator.workload import AgentProgram


@dataclass(slots=True)
class DriverResult:
    """How the launched agents ended (exit status per agent id)."""

    launched: int = 0
    exit_codes: dict[str, int] = field(default_factory=dict)
    terminated_at_deadline: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> int:
        return sum(1 for c in self.exit_codes.values() if c == 0)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    router_url: str
    speedup: float = 1.0
    deadline_real_s: float = 300.0
    grace_real_s: float = 10.0
    api_key: str = "sk-kairos-demo"
    stream: bool = True
    python: str = sys.executable
    prestart_real_s: float = 3.0
    """Launch each agent this early; it waits for its arrival time before its
    first request, so Python start-up (≈1 s of CPU on a busy 2-core machine)
    does not delay arrivals by tens of simulated seconds."""


def agent_command(
    cfg: DriverConfig, program: AgentProgram, name: str, start_at_unix_s: float | None = None
) -> list[str]:
    """The argv of one agent launch: id-tracker wrapping the replay agent."""
    agent = [
        cfg.python,
        "-m",
        "simulator.replay_agent",
        "--speedup",
        str(cfg.speedup),
        "--program-json",
        json.dumps(program_to_json(program)),
    ]
    if start_at_unix_s is not None:
        agent += ["--start-at", f"{start_at_unix_s:.3f}"]
    if not cfg.stream:
        agent.append("--no-stream")
    return [
        cfg.python,
        "-m",
        "idtracker",
        "--router-url",
        cfg.router_url,
        "--name",
        name,
        "--",
        *agent,
    ]


async def _launch_at(
    cfg: DriverConfig, program: AgentProgram, at_real_s: float, t0: float, log: IO[bytes] | None
) -> tuple[str, asyncio.subprocess.Process]:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, t0 + at_real_s - cfg.prestart_real_s - loop.time()))
    start_at = time.time() + max(0.0, t0 + at_real_s - loop.time())
    env = dict(os.environ, OPENAI_API_KEY=cfg.api_key)
    env.pop("KAIROS_AGENT_ID", None)
    proc = await asyncio.create_subprocess_exec(
        *agent_command(cfg, program, program.agent_id, start_at),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    return program.agent_id, proc


async def _stop(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout=grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def drive(
    cfg: DriverConfig, arrivals: Sequence[tuple[float, AgentProgram]], log_path: Path | None = None
) -> DriverResult:
    """Launch every ``(arrival_sim_s, program)``; wait until all end or the deadline."""
    result = DriverResult()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    deadline = t0 + cfg.deadline_real_s
    log = log_path.open("ab") if log_path is not None else None
    try:
        launches = [
            asyncio.create_task(_launch_at(cfg, p, at / cfg.speedup, t0, log))
            for at, p in arrivals
            if at / cfg.speedup < cfg.deadline_real_s
        ]
        procs: list[tuple[str, asyncio.subprocess.Process]] = []
        for task in asyncio.as_completed(launches):
            procs.append(await task)
        result.launched = len(procs)
        waits = {asyncio.ensure_future(p.wait()): (aid, p) for aid, p in procs}
        remaining = max(0.0, deadline - loop.time())
        _done, pending = await asyncio.wait(waits, timeout=remaining) if waits else (set(), set())
        stragglers = [waits[fut] for fut in pending]
        result.terminated_at_deadline.extend(aid for aid, _ in stragglers)
        await asyncio.gather(*(_stop(proc, cfg.grace_real_s) for _, proc in stragglers))
        for fut in pending:
            fut.cancel()
        for aid, proc in procs:
            if proc.returncode is not None:
                result.exit_codes[aid] = proc.returncode
    finally:
        if log is not None:
            log.close()
    return result
