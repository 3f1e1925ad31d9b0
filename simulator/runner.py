"""Run simulations and turn them into the shared records and metrics.

:func:`run_sim` builds the workload and arrivals from a :class:`SimSpec`, runs
one :class:`~simulator.cluster.Cluster`, and returns the records the daemon and
router would have written (``EpochRecord``/``AgentRecord``/``RunRecord``) plus the
paper metrics from :func:`reporting.metrics.summarize`. :func:`run_many` runs
several specs in parallel processes (policies compared on the same arrivals).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers import ReassignmentConfig
from reporting.metrics import Summary, summarize
from reporting.records import AgentRecord, EpochRecord, RunRecord, file_slug, to_json_line
from simulator.arrivals import poisson_arrivals, replay_arrivals
from simulator.cluster import DEFAULT_CLIENT_PATIENCE_S, Cluster, ClusterConfig
from simulator.errors import WorkloadError
from simulator.presets import Preset, get_preset
from simulator.workload import Workload
from simulator.workload_paper import PaperWorkload
from simulator.workload_recorded import RecordedWorkload
from simulator.workload_trace import DEFAULT_THINK_CAP_S, TraceWorkload


@dataclass(frozen=True, slots=True)
class SimSpec:
    """Everything that defines one simulated run (and nothing else)."""

    policy: str = "kairos"
    workload: str = "paper"
    rate_per_s: float = 0.08
    duration_s: float = 3 * 3600.0
    instances: int = 1
    slo_tok_s: float = 20.0
    seed: int = 1
    placement: str = "consolidating"
    preset: Preset = field(default_factory=get_preset)
    epoch_s: float | None = None
    think_cap_s: float = DEFAULT_THINK_CAP_S
    client_patience_s: float | None = DEFAULT_CLIENT_PATIENCE_S
    """Held sessions fail after this long (``ClusterConfig.client_patience_s``)."""
    arrivals_file: Path | None = None
    arrival_offset_s: float = 0.0
    """Every arrival shifted by this much: where the control epochs fall against
    the workload, which production leaves to when each daemon started. A result
    that moves with it is the policy's own chaos (``scripts.compare_claude
    --phases``), not a property of the law."""
    variant: tuple[tuple[str, Any], ...] = ()
    """Constants of the policy changed in code, by field name, for research
    comparisons (``kairos[busy_floor_mhz=1020]``, ``predictive[max_elasticity=0.8]``;
    :func:`controllers.registry.make_controller`). Empty: the policy as defined."""
    reassignment: ReassignmentConfig = field(default_factory=ReassignmentConfig)

    @property
    def run_name(self) -> str:
        return f"sim-{self.policy}-{self.workload_label}-r{self.rate_per_s:g}-s{self.seed}"

    @property
    def workload_label(self) -> str:
        for kind in ("trace", "recorded"):
            if self.workload.startswith(f"{kind}:"):
                return f"{kind}-" + Path(self.workload.removeprefix(f"{kind}:")).stem
        return self.workload


@dataclass(frozen=True, slots=True)
class SimResult:
    spec: SimSpec
    summary: Summary
    run: RunRecord
    epochs: list[EpochRecord]
    agents: list[AgentRecord]
    wall_s: float


def build_workload(spec: SimSpec) -> Workload:
    """The workload named by ``spec.workload``: ``paper``, ``trace:PATH`` or
    ``recorded:PATH`` (a router's recording at its recorded arrivals)."""
    if spec.workload == "paper":
        return PaperWorkload(spec.seed)
    if spec.workload.startswith("trace:"):
        path = Path(spec.workload.removeprefix("trace:"))
        return TraceWorkload.from_file(path, spec.seed, spec.think_cap_s)
    if spec.workload.startswith("recorded:"):
        path = Path(spec.workload.removeprefix("recorded:"))
        return RecordedWorkload.from_file(path, spec.think_cap_s)
    raise WorkloadError(
        f"unknown workload {spec.workload!r}; use 'paper', 'trace:PATH' or 'recorded:PATH'"
    )


def build_arrivals(spec: SimSpec) -> list[float]:
    offset = spec.arrival_offset_s
    if not (math.isfinite(offset) and 0.0 <= offset < spec.duration_s):
        raise WorkloadError(f"arrival_offset_s must be in [0, duration_s), got {offset}")
    if spec.workload.startswith("recorded:") and spec.arrivals_file is None:
        path = Path(spec.workload.removeprefix("recorded:"))
        arrivals = RecordedWorkload.from_file(path, spec.think_cap_s).arrivals()
    elif spec.arrivals_file is not None:
        arrivals = replay_arrivals(spec.arrivals_file, spec.duration_s)
    else:
        arrivals = poisson_arrivals(spec.rate_per_s, spec.duration_s, spec.seed)
    return [t + offset for t in arrivals if t + offset < spec.duration_s]


def cluster_config(spec: SimSpec) -> ClusterConfig:
    """The cluster ``spec`` describes."""
    return ClusterConfig(
        policy=spec.policy,
        instances=spec.instances,
        duration_s=spec.duration_s,
        placement=spec.placement,
        reassignment=spec.reassignment,
        slo_tok_s=spec.slo_tok_s,
        variant=spec.variant,
        epoch_s=spec.epoch_s,
        run=spec.run_name,
        client_patience_s=spec.client_patience_s,
    )


def run_sim(
    spec: SimSpec,
    progress: Callable[[float], None] | None = None,
    config: ClusterConfig | None = None,
) -> SimResult:
    """Run one spec to completion (virtual time ``spec.duration_s``); ``config``
    replaces the cluster ``spec`` describes (a fleet power budget, which no spec
    field names)."""
    started = time.perf_counter()
    config = config or cluster_config(spec)
    arrivals = build_arrivals(spec)
    cluster = Cluster(spec.preset, config, build_workload(spec), arrivals, progress=progress)
    cluster.run()
    counters = _counters(cluster, len(arrivals))
    summary = summarize(
        cluster.policy_name,
        cluster.epochs,
        cluster.agents_done,
        slo_tok_s=spec.slo_tok_s,
        duration_s=spec.duration_s,
        preemptions=int(counters["preemptions"]),
        recomputed_tokens=int(counters["recomputed_tokens"]),
        unfinished_tok_s=cluster.unfinished_throughputs(cluster.config.duration_s),
    )
    wall = time.perf_counter() - started
    counters["wall_s"] = wall
    run = RunRecord(
        run=spec.run_name,
        policy=cluster.policy_name,
        source="simulator",
        duration_s=spec.duration_s,
        instances=tuple(cluster.names),
        arrival_rate_per_s=spec.rate_per_s if spec.arrivals_file is None else None,
        slo_tok_s=spec.slo_tok_s,
        seed=spec.seed,
        workload=f"{spec.workload_label} preset={spec.preset.name} placement={spec.placement}",
        counters=counters,
    )
    return SimResult(spec, summary, run, cluster.epochs, cluster.agents_done, wall)


def _counters(cluster: Cluster, arrivals: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for inst in cluster.instances:
        for key, value in dataclasses.asdict(inst.engine.counters).items():
            totals[key] = totals.get(key, 0.0) + float(value)
    epochs = cluster.epochs
    n_inst = max(1, len(cluster.instances))
    if epochs:
        totals["mean_ongoing_per_instance"] = sum(e.ongoing for e in epochs) / len(epochs)
        totals["mean_pending_per_instance"] = sum(e.pending for e in epochs) / len(epochs)
        totals["mean_usage_tokens_per_instance"] = sum(e.usage_tokens for e in epochs) / len(epochs)
        totals["max_usage_tokens"] = float(max(e.usage_tokens for e in epochs))
    totals["capacity_tokens"] = float(cluster.instances[0].engine.capacity_tokens)
    totals["arrivals"] = float(arrivals)
    totals["started_agents"] = float(cluster.started_agents)
    totals["reassignments"] = float(cluster.reassignments)
    totals["overflow_moves"] = float(cluster.overflow_moves)
    totals["room_moves"] = float(cluster.room_moves)
    totals["overflow_holds"] = float(cluster.overflow_holds)
    unfinished, held_s = cluster.unfinished(cluster.config.duration_s)
    totals["unfinished_agents"] = float(unfinished)
    totals["unfinished_held_s"] = held_s
    totals["unfinished_nearly_done"] = float(cluster.nearly_done())
    totals["instances"] = float(n_inst)
    return totals


def result_json(result: SimResult) -> dict[str, Any]:
    """The ``--json`` object: docs/design.md §4 keys first, then useful extras."""
    s = result.summary
    c = result.run.counters
    return {
        "policy": s.policy,
        "avg_power_w": s.avg_power_w,
        "energy_j": s.energy_j,
        "energy_per_output_token_j": s.energy_per_output_token_j,
        "p5_agent_throughput_tok_s": s.p5_agent_throughput_tok_s,
        "slo_attainment": s.slo_attainment,
        "job_throughput_per_s": s.job_throughput_per_s,
        "completed_agents": s.completed_agents,
        "preemptions": s.preemptions,
        "recomputed_tokens": s.recomputed_tokens,
        "boost_fraction": s.boost_fraction,
        "mean_pending_s": s.mean_pending_s,
        "gave_up_agents": s.gave_up_agents,
        "unfinished_agents": int(c.get("unfinished_agents", 0)),
        "unfinished_held_s": c.get("unfinished_held_s", 0.0),
        "unfinished_nearly_done": int(c.get("unfinished_nearly_done", 0)),
        "mean_pending_all_s": _mean_pending_all(result),
        "slo_attainment_all": s.slo_attainment_all,
        "energy_per_job_j": s.energy_j / s.completed_agents if s.completed_agents else None,
        "output_tokens": s.output_tokens,
        "duration_s": s.duration_s,
        "time_at_clock_s": {str(k): v for k, v in s.time_at_clock_s.items()},
        "per_instance_avg_power_w": s.per_instance_avg_power_w,
        "workload": result.spec.workload,
        "rate_per_s": result.spec.rate_per_s,
        "instances": result.spec.instances,
        "placement": result.spec.placement,
        "slo_tok_s": result.spec.slo_tok_s,
        "seed": result.spec.seed,
        "arrival_offset_s": result.spec.arrival_offset_s,
        "preset": result.spec.preset.name,
        "num_levels": result.spec.preset.control.num_levels,
        "kv_offload_tokens": result.spec.preset.engine.kv_offload_tokens,
        "reserve_full_isl": result.spec.preset.engine.reserve_full_isl,
        "arrivals": int(c.get("arrivals", 0)),
        "mean_ongoing_per_instance": c.get("mean_ongoing_per_instance"),
        "mean_usage_tokens_per_instance": c.get("mean_usage_tokens_per_instance"),
        "capacity_tokens": int(c.get("capacity_tokens", 0)),
        "prefill_computed_tokens": int(c.get("prefill_computed_tokens", 0)),
        "prefill_reused_tokens": int(c.get("prefill_reused_tokens", 0)),
        "loaded_tokens": int(c.get("loaded_tokens", 0)),
        "evicted_tokens": int(c.get("evicted_tokens", 0)),
        "rejected_requests": int(c.get("rejected_requests", 0)),
        "truncated_requests": int(c.get("truncated_requests", 0)),
        "reassignments": int(c.get("reassignments", 0)),
        "overflow_moves": int(c.get("overflow_moves", 0)),
        "room_moves": int(c.get("room_moves", 0)),
        "overflow_holds": int(c.get("overflow_holds", 0)),
        "wall_s": result.wall_s,
    }


def _mean_pending_all(result: SimResult) -> float | None:
    """Mean time held over every session that arrived, finished or not: the
    finished sessions' records plus what the unfinished ones were held."""
    c = result.run.counters
    n = len(result.agents) + int(c.get("unfinished_agents", 0))
    if n == 0:
        return None
    held_s = sum(a.pending_s for a in result.agents) + c.get("unfinished_held_s", 0.0)
    return held_s / n


def write_jsonl(result: SimResult, out_dir: Path) -> Path:
    """Write run + epoch + agent records to ``out_dir/<run>.jsonl`` (replacing it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{file_slug(result.spec.policy)}.jsonl"
    # One write: the file is complete when the run is (a line-flushing writer
    # cost a system call per record).
    lines = [to_json_line(result.run)]
    lines += [to_json_line(e) for e in result.epochs]
    lines += [to_json_line(a) for a in result.agents]
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def run_many(
    specs: Sequence[SimSpec],
    processes: int | None = None,
    on_done: Callable[[SimResult], None] | None = None,
) -> list[SimResult]:
    """Run ``specs`` in parallel processes (in-process when one), in input order."""
    workers = min(len(specs), processes or os.cpu_count() or 1)
    if workers <= 1:
        results = []
        for spec in specs:
            results.append(run_sim(spec))
            if on_done is not None:
                on_done(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_sim, spec) for spec in specs]
        out: list[SimResult] = []
        for fut in futures:
            out.append(fut.result())
            if on_done is not None:
                on_done(out[-1])
        return out
