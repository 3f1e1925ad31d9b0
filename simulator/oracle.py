"""The "oracle" lower bound: the least average power a fixed-per-window clock
schedule achieves while meeting the SLO on the same arrivals (docs/results.md
item 8; ``kairos whatif`` on a recording).

Definition (what the document calls the oracle). The window is split into
``K = duration / window_s`` windows; a *schedule* locks one clock from the
KAIROS level set in each window and, like the fixed-clock baseline, admits every
agent at once. A schedule is *feasible* when the run meets the SLO (P5 per-agent
throughput ≥ τ, Eq. 3 over finished agents) and finishes at least
``COMPLETION_FLOOR`` × the agents no control finishes on the same arrivals (so a
schedule cannot "meet" the SLO by leaving slow agents unfinished).

Search (offline, full re-simulation, with hindsight of the arrivals):

1. every constant schedule (one run per level); the best feasible one is the start;
2. greedy, window by window from the first: try the levels below the window's
   current clock, lowest first, each with the rest of the schedule unchanged,
   and keep the first that stays feasible *and* lowers average power.

Every accepted step keeps a feasible schedule, so the result is feasible. It is
an upper bound on the true optimum of the schedule family (greedy can miss
better schedules; clocks interact across windows through queued context), and
a lower bound only for policies inside the family — KAIROS changes clocks every
5 s and holds agents back, so it can beat it (a negative gap).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controllers import ControlDecision, FrequencyLevels, InstanceSnapshot, Reason
from controllers.types import ADMIT_ALL
from reporting.metrics import summarize
from simulator.cluster import Cluster
from simulator.presets import control_levels
from simulator.runner import SimSpec, build_arrivals, build_workload, cluster_config, run_sim

COMPLETION_FLOOR = 0.98


class ScheduleController:
    """Locks the clock of the current window; admits every pending agent."""

    name = "oracle"
    rule = ADMIT_ALL

    def __init__(
        self, levels: FrequencyLevels, schedule_mhz: Sequence[int], window_s: float
    ) -> None:
        self.levels = levels
        self.schedule_mhz = tuple(schedule_mhz)
        self.window_s = window_s

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        k = min(int(snapshot.now_s // self.window_s), len(self.schedule_mhz) - 1)
        clock = self.schedule_mhz[k]
        usage = snapshot.usage_tokens
        if usage is None:
            usage = sum(a.context_tokens or 0 for a in snapshot.ongoing)
        return ControlDecision(
            epoch=snapshot.epoch,
            level=self.levels.clocks_mhz.index(clock) + 1,
            clock_mhz=clock,
            admit=tuple(a.agent_id for a in snapshot.pending),
            usage_tokens=usage,
            capacity_tokens=snapshot.capacity_tokens,
            reason=Reason.ORACLE,
        )


def run_schedule(spec: SimSpec, schedule_mhz: Sequence[int], window_s: float) -> dict[str, Any]:
    """One single-instance run of ``spec``'s arrivals under a clock schedule."""
    config = dataclasses.replace(
        cluster_config(spec),
        policy="no-control",
        instances=1,
        run=f"oracle-r{spec.rate_per_s:g}-s{spec.seed}",
    )
    cluster = Cluster(spec.preset, config, build_workload(spec), build_arrivals(spec))
    levels = control_levels(spec.preset, "kairos")
    for inst in cluster.instances:
        inst.controller = ScheduleController(levels, schedule_mhz, window_s)
    cluster.policy_name = "oracle"
    cluster.run()
    counters = cluster.instances[0].engine.counters
    s = summarize(
        "oracle",
        cluster.epochs,
        cluster.agents_done,
        slo_tok_s=spec.slo_tok_s,
        duration_s=spec.duration_s,
        preemptions=counters.preemptions,
        recomputed_tokens=counters.recomputed_tokens,
    )
    return {
        "avg_power_w": s.avg_power_w,
        "energy_per_output_token_j": s.energy_per_output_token_j,
        "p5_agent_throughput_tok_s": s.p5_agent_throughput_tok_s,
        "slo_attainment": s.slo_attainment,
        "completed_agents": s.completed_agents,
        "job_throughput_per_s": s.job_throughput_per_s,
        "recomputed_tokens": s.recomputed_tokens,
    }


@dataclass(frozen=True, slots=True)
class OracleResult:
    """The search's outcome: the best schedule found, its run, and what it tried."""

    metrics: dict[str, Any]
    """:func:`run_schedule`'s metrics of the schedule found."""
    feasible: bool
    """False: even the top clock misses the SLO (``metrics`` are the top clock's)."""
    schedule_mhz: list[int]
    best_constant_mhz: int | None
    constants: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Every constant schedule's metrics, with ``feasible``."""
    no_control: dict[str, Any] = field(default_factory=dict)
    completion_floor: int = 0
    search_runs: int = 0


def oracle_search(spec: SimSpec, window_s: float) -> OracleResult:
    """The greedy search of the module doc on ``spec``'s arrivals (policy ignored)."""
    k_windows = max(1, math.ceil(spec.duration_s / window_s - 1e-9))
    levels = control_levels(spec.preset, "kairos").clocks_mhz
    base = run_sim(dataclasses.replace(spec, policy="no-control")).summary
    need = math.floor(COMPLETION_FLOOR * base.completed_agents)
    runs = 0

    def evaluate(schedule: Sequence[int]) -> tuple[bool, dict[str, Any]]:
        nonlocal runs
        runs += 1
        m = run_schedule(spec, schedule, window_s)
        p5 = m["p5_agent_throughput_tok_s"] or 0.0
        return p5 >= spec.slo_tok_s and m["completed_agents"] >= need, m

    constants: dict[int, dict[str, Any]] = {}
    best: tuple[list[int], dict[str, Any]] | None = None
    for clock in levels:
        ok, m = evaluate([clock] * k_windows)
        constants[clock] = {**m, "feasible": ok}
        if ok and (best is None or m["avg_power_w"] < best[1]["avg_power_w"]):
            best = ([clock] * k_windows, m)
    best_constant = None if best is None else best[0][0]
    if best is None:  # even the top clock misses the SLO: report it, no oracle
        top = levels[-1]
        best = ([top] * k_windows, constants[top])
        feasible = False
    else:
        feasible = True
        for k in range(k_windows):
            schedule, current = best
            for clock in [c for c in levels if c < schedule[k]]:
                trial = [*schedule[:k], clock, *schedule[k + 1 :]]
                ok, m = evaluate(trial)
                if ok and m["avg_power_w"] < current["avg_power_w"]:
                    best = (trial, m)
                    break
    schedule, m = best
    return OracleResult(
        metrics=m,
        feasible=feasible,
        schedule_mhz=schedule,
        best_constant_mhz=best_constant,
        constants=constants,
        no_control={"avg_power_w": base.avg_power_w, "completed_agents": base.completed_agents},
        completion_floor=need,
        search_runs=runs,
    )
