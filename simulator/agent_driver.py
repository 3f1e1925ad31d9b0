"""Start replay agents at given arrival times, with their start-up cost outside
the measured window.

Used by ``make demo`` and the end-to-end tests. Two kinds of launch, both
registering each agent with the router under its own identity:

* a few agents (``cli_agents``) are real process trees ``id-tracker -- python
  -m simulator.replay_agent``, exactly how an operator launches agents, so the
  CLI's identity, start/end reporting, key rewriting and signal forwarding are
  exercised end to end. They are started *before* the window and wait for their
  arrival time (``--await-go``: the clock starts when every agent is ready);
* every other agent runs in one :mod:`simulator.agent_host` process, started
  and ready (its ``openai`` import paid) before the window; it registers each
  agent at its arrival with id-tracker's own code.

A process launch costs about 2 s of CPU; doing dozens of them inside a 20×
accelerated window on 2 cores is what made agents miss their first turn.

Arrival times are simulated seconds, divided by ``speedup`` to get real time.
Every agent reports how late its first request left (``late_s``), the input to
the stack's self-check. Everything is bounded: at the deadline the host and
the id-trackers get SIGTERM (each ends its agents and reports their end), then
SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from simulator.agent_host import EXIT_TERMINATED, PlannedAgent, plan_to_json
from simulator.replay_agent import program_to_json
from simulator.workload import AgentProgram


class DriverError(RuntimeError):
    """The agent host did not start (its log is named in the message)."""


@dataclass(slots=True)
class DriverResult:
    """How the agents ended (exit status per agent id) and how late they arrived."""

    launched: int = 0
    """Agents that arrived within the deadline (host agents registered + CLI agents)."""
    exit_codes: dict[str, int] = field(default_factory=dict)
    terminated_at_deadline: list[str] = field(default_factory=list)
    late_s: dict[str, float] = field(default_factory=dict)
    """Real seconds each agent's first request left after its arrival time."""
    cli_agents: list[str] = field(default_factory=list)
    t0_unix_s: float = 0.0
    """When arrival time 0 fell (the start of the measured window)."""
    start_up_s: float = 0.0
    """Real seconds until the host and the CLI agents were all ready (start-up
    cost, paid before the window)."""

    @property
    def succeeded(self) -> int:
        return sum(1 for c in self.exit_codes.values() if c == 0)

    @property
    def max_late_s(self) -> float:
        return max(self.late_s.values(), default=0.0)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    router_url: str
    speedup: float = 1.0
    deadline_real_s: float = 300.0
    """Real seconds after the window starts; agents still running are stopped."""
    grace_real_s: float = 10.0
    api_key: str = "sk-kairos-demo"
    stream: bool = True
    python: str = sys.executable
    cli_agents: int = 2
    """How many agents go through the real ``id-tracker`` CLI (spread over the arrivals)."""
    summary_wait_s: float = 5.0
    """The CLI agents run with ``id-tracker --summary``: each writes what it cost to
    the agents' log, waiting at most this long for its last joules."""
    min_lead_s: float = 0.5
    """Between every agent process being ready and the window's start."""
    ready_timeout_s: float = 120.0


def agent_command(
    cfg: DriverConfig,
    program: AgentProgram,
    name: str,
    start_at_unix_s: float | None = None,
    lag_report: Path | None = None,
    await_go_offset_s: float | None = None,
) -> list[str]:
    """The argv of one CLI agent launch: id-tracker wrapping the replay agent."""
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
    if await_go_offset_s is not None:
        agent += ["--await-go", f"{await_go_offset_s:.6f}"]
    if lag_report is not None:
        agent += ["--lag-report", str(lag_report)]
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
        "--summary",
        "--summary-wait-s",
        f"{cfg.summary_wait_s:g}",
        "--",
        *agent,
    ]


def cli_indices(n: int, k: int) -> set[int]:
    """``k`` arrival indices spread evenly over ``n`` (first and last included)."""
    if n <= 0 or k <= 0:
        return set()
    if k == 1 or n == 1:
        return {0}
    return {round(j * (n - 1) / (k - 1)) for j in range(min(k, n))}


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


def _agent_env(cfg: DriverConfig) -> dict[str, str]:
    env = dict(os.environ, OPENAI_API_KEY=cfg.api_key, PYTHONUNBUFFERED="1")
    env.pop("KAIROS_AGENT_ID", None)
    return env


async def _spawn_host(
    cfg: DriverConfig, plan: list[PlannedAgent], files: Path, log: IO[bytes]
) -> asyncio.subprocess.Process:
    """Start the agent host (it prints ``ready`` once its imports are paid)."""
    plan_path = files / "host-plan.json"
    plan_path.write_text(json.dumps(plan_to_json(plan)))
    argv = [
        cfg.python,
        "-m",
        "simulator.agent_host",
        "--router-url",
        cfg.router_url,
        "--plan",
        str(plan_path),
        "--report",
        str(files / "host-report.jsonl"),
        "--speedup",
        str(cfg.speedup),
        *([] if cfg.stream else ["--no-stream"]),
    ]
    return await asyncio.create_subprocess_exec(
        *argv,
        env=_agent_env(cfg),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )


async def _spawn_cli_agent(
    cfg: DriverConfig, program: AgentProgram, at_real_s: float, files: Path, log: IO[bytes]
) -> asyncio.subprocess.Process:
    """``id-tracker -- replay_agent --await-go``: registers now, plays from t0 + at."""
    argv = agent_command(
        cfg,
        program,
        program.agent_id,
        lag_report=files / "cli-lag.jsonl",
        await_go_offset_s=at_real_s,
    )
    return await asyncio.create_subprocess_exec(
        *argv,
        env=_agent_env(cfg),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )


async def _ready(procs: list[tuple[str, asyncio.subprocess.Process]], timeout_s: float) -> str:
    """Wait until every process printed ``ready``; '' or the name of one that did not."""

    async def one(name: str, proc: asyncio.subprocess.Process) -> str:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        return "" if line.strip() == b"ready" else name

    try:
        async with asyncio.timeout(timeout_s):
            failed = await asyncio.gather(*(one(n, p) for n, p in procs))
    except TimeoutError:
        return "an agent (timed out)"
    return next((f for f in failed if f), "")


def _read_jsonl(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _collect(
    result: DriverResult,
    files: Path,
    cli: list[tuple[str, asyncio.subprocess.Process]],
    stopped: set[str],
) -> None:
    """Fill ``result`` from the host's report, the CLI agents' lag reports and exits."""
    for row in _read_jsonl(files / "host-report.jsonl"):
        name, code = str(row["agent"]), int(str(row["exit_code"]))
        if row.get("agent_id") is None and code == EXIT_TERMINATED:
            continue  # stopped while registering: never arrived
        result.launched += 1
        result.exit_codes[name] = code
        if code == EXIT_TERMINATED:
            result.terminated_at_deadline.append(name)
        if row.get("late_s") is not None:
            result.late_s[name] = float(str(row["late_s"]))
    for row in _read_jsonl(files / "cli-lag.jsonl"):
        result.late_s[str(row["agent"])] = float(str(row["late_s"]))
    for name, proc in cli:
        result.launched += 1
        if proc.returncode is not None:
            result.exit_codes[name] = proc.returncode
        if name in stopped:
            result.terminated_at_deadline.append(name)


async def drive(
    cfg: DriverConfig, arrivals: Sequence[tuple[float, AgentProgram]], log_path: Path | None = None
) -> DriverResult:
    """Run every ``(arrival_sim_s, program)`` that falls before the deadline; wait
    until all end or the deadline. The window starts once every agent process is
    up (``result.t0_unix_s``)."""
    result = DriverResult()
    due = [(at / cfg.speedup, p) for at, p in arrivals if at / cfg.speedup < cfg.deadline_real_s]
    via_cli = cli_indices(len(due), cfg.cli_agents)
    plan = [PlannedAgent(at, p) for i, (at, p) in enumerate(due) if i not in via_cli]
    with contextlib.ExitStack() as stack:
        if log_path is None:
            files = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            log_path = files / "agents.log"
        else:
            files = log_path.parent
        for name in ("host-report.jsonl", "cli-lag.jsonl"):
            (files / name).unlink(missing_ok=True)
        log = stack.enter_context(log_path.open("ab"))
        # Every agent process starts now, before the clock: the host and the CLI
        # agents (registered by id-tracker, waiting for their arrival). The
        # window starts once all of them are ready, however long that took.
        started = time.monotonic()
        host = await _spawn_host(cfg, plan, files, log)
        cli: list[tuple[str, asyncio.subprocess.Process]] = []
        for i in sorted(via_cli):
            at, program = due[i]
            cli.append((program.agent_id, await _spawn_cli_agent(cfg, program, at, files, log)))
            result.cli_agents.append(program.agent_id)
        procs = [("agent-host", host), *cli]
        failed = await _ready(procs, cfg.ready_timeout_s)
        result.start_up_s = time.monotonic() - started
        if failed:
            await asyncio.gather(*(_stop(p, cfg.grace_real_s) for _, p in procs))
            raise DriverError(f"{failed} did not start; see {log_path}")
        t0 = time.time() + cfg.min_lead_s
        result.t0_unix_s = t0
        for _, proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {t0:.6f}\n".encode())
            await proc.stdin.drain()
        waits = {asyncio.ensure_future(p.wait()): (name, p) for name, p in procs}
        remaining = max(0.0, t0 + cfg.deadline_real_s - time.time())
        _done, pending = await asyncio.wait(waits, timeout=remaining)
        stragglers = [waits[fut] for fut in pending]
        await asyncio.gather(*(_stop(proc, cfg.grace_real_s) for _, proc in stragglers))
        for fut in pending:
            fut.cancel()
        _collect(result, files, cli, {name for name, _ in stragglers})
    return result
