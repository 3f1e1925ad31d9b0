"""Item 8's oracle task: the search of :mod:`simulator.oracle` as a results worker.

The oracle itself (its definition, the schedule controller and the greedy
search) lives in :mod:`simulator.oracle`, where ``kairos whatif`` runs it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from scripts.results_lib.runs import Metrics
from simulator.oracle import COMPLETION_FLOOR, ScheduleController, run_schedule
from simulator.oracle import oracle_search as search
from simulator.runner import SimSpec

__all__ = ["COMPLETION_FLOOR", "OracleSpec", "ScheduleController", "oracle_search", "run_schedule"]


@dataclass(frozen=True, slots=True)
class OracleSpec:
    spec: SimSpec  # workload, rate, SLO, seed, preset, duration (policy ignored)
    window_s: float


def oracle_search(task: OracleSpec) -> Metrics:
    """Worker entry point: the greedy search; returns the schedule and its metrics."""
    spec, window_s = task.spec, task.window_s
    r = search(spec, window_s)
    return {
        **r.metrics,
        "feasible": r.feasible,
        "schedule_mhz": r.schedule_mhz,
        "window_s": window_s,
        "best_constant_mhz": r.best_constant_mhz,
        "constants": {str(c): v for c, v in r.constants.items()},
        "no_control": r.no_control,
        "completion_floor": r.completion_floor,
        "search_runs": r.search_runs,
        "rate_per_s": spec.rate_per_s,
        "slo_tok_s": spec.slo_tok_s,
        "seed": spec.seed,
    }
