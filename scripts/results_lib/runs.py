"""Run simulations in parallel with progress, and reduce them to JSON-able metrics.

Workers return small dicts (the metrics one row of a table needs plus a
downsampled time series), not whole record lists, so hundreds of runs stay
cheap to ship between processes. Identical specs requested by several items are
run once.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from reporting.records import EpochRecord
from simulator.runner import SimResult, SimSpec, result_json, run_sim

Metrics = dict[str, Any]
Stat = dict[str, float | int | None]

#: Metrics averaged over seeds in every table.
METRIC_KEYS: tuple[str, ...] = (
    "avg_power_w",
    "energy_j",
    "energy_per_output_token_j",
    "energy_per_job_j",
    "p5_agent_throughput_tok_s",
    "slo_attainment",
    "slo_attainment_all",
    "job_throughput_per_s",
    "completed_agents",
    "mean_turn_latency_s",
    "preemptions",
    "recomputed_tokens",
    "peak_context_frac",
    "mean_pending_s",
    "mean_pending_all_s",
    "unfinished_agents",
    "gave_up_agents",
    "mean_ongoing_per_instance",
    "boost_fraction",
)

SERIES_STEP_S = 60.0


def metrics_of(result: SimResult) -> Metrics:
    """The JSON summary of one run plus per-turn latency, peak context and a series."""
    out = result_json(result)
    agents = result.agents
    turns = sum(a.turns for a in agents)
    out["mean_turn_latency_s"] = sum(a.llm_time_s for a in agents) / turns if turns else None
    cap = float(result.run.counters.get("capacity_tokens", 0.0)) or 1.0
    out["peak_context_frac"] = float(result.run.counters.get("max_usage_tokens", 0.0)) / cap
    out["boost_fraction"] = result.summary.boost_fraction
    out["series"] = series_of(result.epochs, cap)
    return out


def series_of(epochs: Sequence[EpochRecord], capacity_tokens: float) -> dict[str, list[float]]:
    """Per-minute totals over instances: context/capacity, pending agents, power, clock."""
    buckets: dict[int, list[EpochRecord]] = {}
    for e in epochs:
        buckets.setdefault(int(e.t_s // SERIES_STEP_S), []).append(e)
    t, ctx, pend, power, clock = [], [], [], [], []
    for k in sorted(buckets):
        rows = buckets[k]
        per_t: dict[float, list[EpochRecord]] = {}
        for e in rows:
            per_t.setdefault(e.t_s, []).append(e)
        n = len(per_t)
        t.append(k * SERIES_STEP_S / 60.0)
        ctx.append(sum(e.usage_tokens for e in rows) / n / capacity_tokens)
        pend.append(sum(e.pending for e in rows) / n)
        power.append(sum(e.avg_power_w for e in rows) / n)
        clock.append(sum(e.target_clock_mhz for e in rows) / len(rows))
    return {"t_min": t, "context_frac": ctx, "pending": pend, "power_w": power, "clock_mhz": clock}


def run_metrics(spec: SimSpec) -> Metrics:
    """Worker entry point: one simulation → metrics."""
    return metrics_of(run_sim(spec))


@dataclass(frozen=True, slots=True)
class Task:
    """One unit of parallel work: ``fn(arg)`` identified by ``key``."""

    key: Hashable
    label: str
    fn: Callable[[Any], Metrics]
    arg: Any
    cost: float = 1.0  # relative expected cost: long tasks are started first


def run_tasks(tasks: Sequence[Task], jobs: int) -> dict[Hashable, Metrics]:
    """Run unique tasks (longest first) in ``jobs`` processes, reporting on stderr."""
    unique: dict[Hashable, Task] = {}
    for task in tasks:
        unique.setdefault(task.key, task)
    order = sorted(unique.values(), key=lambda t: -t.cost)
    total = len(order)
    started = time.perf_counter()
    out: dict[Hashable, Metrics] = {}

    def report(done: int, task: Task, wall: float) -> None:
        elapsed = time.perf_counter() - started
        print(
            f"[{done:4d}/{total}] {task.label:48s} {wall:6.1f}s  (elapsed {elapsed:6.1f}s)",
            file=sys.stderr,
            flush=True,
        )

    if jobs <= 1 or total <= 1:
        for i, task in enumerate(order, 1):
            t0 = time.perf_counter()
            out[task.key] = task.fn(task.arg)
            report(i, task, time.perf_counter() - t0)
        return out
    with ProcessPoolExecutor(max_workers=min(jobs, total)) as pool:
        futures: dict[Future[Metrics], Task] = {pool.submit(_timed, t.fn, t.arg): t for t in order}
        for i, fut in enumerate(as_completed(futures), 1):
            task = futures[fut]
            result = fut.result()
            out[task.key] = result
            report(i, task, float(result.get("wall_s", 0.0)))
    return out


def _timed(fn: Callable[[Any], Metrics], arg: Any) -> Metrics:
    t0 = time.perf_counter()
    result = fn(arg)
    result.setdefault("wall_s", time.perf_counter() - t0)
    return result


def stat(values: Sequence[float | int | None]) -> Stat:
    """Mean, sample standard deviation, min, max and count of the non-missing values."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(vals), "max": max(vals), "n": len(vals)}


def cell(runs: Sequence[Metrics]) -> dict[str, Stat]:
    """Every ``METRIC_KEYS`` metric over a set of runs (one per seed)."""
    return {k: stat([r.get(k) for r in runs]) for k in METRIC_KEYS}


def saving_pct(base: Sequence[Metrics], other: Sequence[Metrics], key: str = "avg_power_w") -> Stat:
    """Paired (same seed) saving of ``other`` vs ``base`` in percent."""
    return stat(
        [100.0 * (1.0 - o[key] / b[key]) for b, o in zip(base, other, strict=True) if b[key]]
    )
