"""One recorded run: scripted agents through kairos-router (recording) on a real vLLM.

Every agent is a real process launched by ``id-tracker`` (its name is the
program's, so the same agent is found in every repeat) running
``tests/realvllm/agents/program_agent.py`` with the real ``openai`` SDK. All are
started, and have imported their SDK, before the run's clock starts; each then
arrives at its own offset (Poisson arrivals drawn by the workload) and runs its
program. The router records their traces (``[trace] path``) with its admission
control off: the recorded run is vLLM's own scheduling, which a no-control
replay predicts. vLLM's prefix cache is emptied before the run
(``/reset_prefix_cache``, the tier's dev-mode server), and its preemption and
prefix-hit counters are read around it into ``RUN.counters.json`` beside the
trace, where ``kairos whatif --compare`` finds them.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.whatif_lib.workloads import AgentSpec
from tests.realvllm.engine import (
    REPO,
    AgentProc,
    EngineError,
    Router,
    VllmServer,
    agent_argv,
    http,
    running_router,
    start_agent,
    wait_for,
)

AGENT = REPO / "tests" / "realvllm" / "agents" / "program_agent.py"
ROUTER_TOML = """
[admission]
enabled = false

[trace]
path = "{trace}"
"""
START_DELAY_S = 2.0


@dataclass(frozen=True, slots=True)
class RecordedRun:
    trace: Path
    counters: Path
    records: Path
    wall_s: float
    agents: int
    vllm_cpu_s: float | None = None
    """CPU time vLLM's processes used during the run."""
    others_s: float | None = None
    clients_others_s: float | None = None
    """CPU time processes other than this run's (router, agents, this script) took
    on the other cores, where the router times every call: 0 on a quiet machine."""
    """CPU time other processes took on vLLM's cores during the run (vLLM pinned):
    the run's contention, which no engine model can predict; 0 on a quiet machine."""


def vllm_cpu_s(group: int) -> float | None:
    """On-CPU seconds of every thread of process group ``group`` so far
    (``/proc/*/task/*/schedstat``); None where Linux does not say."""
    ran = 0
    found = False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != group:  # pgrp, the 5th field of stat
                continue
            for task in (stat.parent / "task").glob("*/schedstat"):
                ran += int(task.read_text().split()[0])
                found = True
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return ran / 1e9 if found else None


def busy_s(cpus: str) -> float | None:
    """Busy seconds of the CPUs ``cpus`` (``"1"`` or ``"2,3"``) so far (/proc/stat)."""
    wanted = {f"cpu{c.strip()}" for c in cpus.split(",") if c.strip()}
    total = 0
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, *values = line.split()
        if name in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values[:8])
            total += user + nice + system + irq + softirq + steal
    return total / 100.0  # USER_HZ


def own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the router and the
    agents, once stopped and reaped)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def client_cores() -> str:
    """The cores this process may run on (the router's and the agents')."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def core_usage(vllm: VllmServer) -> tuple[float, float] | None:
    """(vLLM's CPU seconds, its cores' busy seconds) now, when vLLM is pinned."""
    if vllm.proc is None or not vllm.spec.cpus:
        return None
    ran, busy = vllm_cpu_s(vllm.proc.popen.pid), busy_s(vllm.spec.cpus)
    return None if ran is None or busy is None else (ran, busy)


def _launch(spec: AgentSpec, workdir: Path, router: Router) -> AgentProc:
    program = workdir / f"{spec.name}.json"
    program.write_text(json.dumps(spec.program()), encoding="utf-8")
    argv = agent_argv(str(program), slo=spec.slo_tok_s, agent=AGENT, name=spec.name)
    return start_agent(router, workdir, argv=argv)


def reset_prefix_cache(vllm: VllmServer) -> None:
    """Empty vLLM's prefix cache (dev-mode route), so every repeat starts cold."""
    vllm.wait_idle(timeout_s=600.0)
    status, body = http("POST", vllm.url + "/reset_prefix_cache", timeout_s=60.0)
    if status != 200:
        raise EngineError(f"vLLM /reset_prefix_cache -> {status}: {body[:200]!r}")


def record_run(
    vllm: VllmServer, agents: list[AgentSpec], workdir: Path, name: str, timeout_s: float
) -> RecordedRun:
    """Run ``agents`` once through a recording router; the trace and counters."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / f"{name}.jsonl"
    for old in workdir.glob(f"{name}.jsonl*"):
        old.unlink()
    reset_prefix_cache(vllm)
    config = ROUTER_TOML.format(trace=trace)
    clients = client_cores() if vllm.spec.cpus else None
    clients_before = (busy_s(clients), own_cpu_s()) if clients else None
    procs: list[AgentProc] = []
    with running_router(workdir, vllm.url, config, name=f"router-{name}") as router:
        try:
            procs = [_launch(a, workdir, router) for a in agents]
            for p, a in zip(procs, agents, strict=True):
                if p.line() != {"ready": True}:
                    raise EngineError(f"agent {a.name} did not say it was ready")
            before = vllm.metrics()
            usage_before = core_usage(vllm)
            start = time.time() + START_DELAY_S
            for p in procs:
                assert p.popen.stdin is not None
                p.popen.stdin.write(f"{start}\n")
                p.popen.stdin.flush()
            deadline = time.monotonic() + timeout_s
            for p, a in zip(procs, agents, strict=True):
                p.line()  # its report
                code = p.wait(timeout_s=max(1.0, deadline - time.monotonic()))
                if code != 0:
                    raise EngineError(f"agent {a.name} exited {code}")
            wall = time.time() - start
            names = {a.name for a in agents}
            wait_for(
                "every agent's record",
                lambda: (
                    names <= {r.get("name") for r in router.records_by_agent().values()} or None
                ),
                timeout_s=60.0,
            )
            after = vllm.wait_idle(timeout_s=120.0)
            usage_after = core_usage(vllm)
        finally:
            for p in procs:
                p.kill()
    counters = workdir / f"{name}.counters.json"
    counters.write_text(
        json.dumps(
            {
                "preemptions": (after.preemptions_total or 0) - (before.preemptions_total or 0),
                "prefix_cache_hits_tokens": (after.prefix_cache_hits_total or 0)
                - (before.prefix_cache_hits_total or 0),
                "prompt_tokens": (after.prompt_tokens_total or 0)
                - (before.prompt_tokens_total or 0),
                "generation_tokens": (after.generation_tokens_total or 0)
                - (before.generation_tokens_total or 0),
            }
        )
        + "\n",
        encoding="utf-8",
    )
    ran = others = None
    if usage_before is not None and usage_after is not None:
        ran = usage_after[0] - usage_before[0]
        others = max(0.0, usage_after[1] - usage_before[1] - ran)
    client_others = None
    if clients and clients_before is not None and clients_before[0] is not None:
        busy = busy_s(clients)
        if busy is not None:
            own = own_cpu_s() - clients_before[1]
            client_others = max(0.0, busy - clients_before[0] - own)
    return RecordedRun(
        trace, counters, router.records, wall, len(agents), ran, others, client_others
    )
