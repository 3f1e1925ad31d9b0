"""Replaying a recording on a preset: every policy's run, and a per-call replay.

The recording's sessions arrive when they arrived and run the programs they ran
(:mod:`simulator.workload_recorded`); what changes is the engine (the fitted
preset) and the policy. The window is the recorded span plus a margin, so a
policy that slows agents down shows it as sessions not done.

:func:`simulate_calls` is the same replay with every simulated call kept, for
setting the replay beside the recorded run (:mod:`whatif.compare`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simulator.cluster import Cluster
from simulator.engine_types import RequestFinished
from simulator.oracle import OracleResult, oracle_search
from simulator.presets import Preset
from simulator.runner import (
    SimResult,
    SimSpec,
    build_arrivals,
    build_workload,
    cluster_config,
    run_many,
)
from simulator.workload_recorded import (
    NO_THINK_CAP_S,
    RecordedWorkload,
    recording_files,
    session_objects,
)
from whatif.errors import RecordingError

DEFAULT_POLICIES = ("no-control", "kairos", "predictive", "fixed:1200", "fixed:900")
MARGIN = 1.2
"""The window is the recorded span times this, plus :data:`TAIL_S`."""
TAIL_S = 60.0
COMPARE_MARGIN = 4.0
"""A comparison replay runs until every session is done (this times the span)."""
DEFAULT_SLO = 20.0


@dataclass(frozen=True, slots=True)
class RecordingFacts:
    """What a replay needs to know about a recording beyond its programs."""

    span_s: float
    """First arrival to the last call's last byte, as recorded."""
    slo_tok_s: float
    instances: int
    sessions: int


def recording_facts(path: Path) -> RecordingFacts:
    """Span, SLO (the sessions' most common, else 20 tok/s) and instance count."""
    starts: list[float] = []
    ends: list[float] = []
    slos: Counter[float] = Counter()
    instances: set[str] = set()
    for _, obj in session_objects(recording_files(path)):  # checked by load_recording
        start = float(obj.get("start_unix_s") or 0.0)
        turns = obj.get("turns") or []
        starts.append(start)
        last = max((t.get("at_s", 0.0) + t.get("latency_s", 0.0) for t in turns), default=0.0)
        ends.append(start + last)
        slo = obj.get("slo_tok_s")
        if isinstance(slo, int | float) and math.isfinite(slo) and slo > 0:
            slos[float(slo)] += 1
        instances.update(t["instance"] for t in turns if t.get("instance"))
    if not starts:
        raise RecordingError(f"{path}: no session")
    slo = slos.most_common(1)[0][0] if slos else DEFAULT_SLO
    return RecordingFacts(max(ends) - min(starts), slo, max(1, len(instances)), len(starts))


def base_spec(path: Path, preset: Preset, duration_s: float | None = None) -> SimSpec:
    """The spec of a replay of ``path`` on ``preset`` (policy left to set)."""
    facts = recording_facts(path)
    window = duration_s if duration_s is not None else facts.span_s * MARGIN + TAIL_S
    return SimSpec(
        policy="no-control",
        workload=f"recorded:{path}",
        duration_s=window,
        instances=facts.instances,
        slo_tok_s=facts.slo_tok_s,
        preset=preset,
        think_cap_s=NO_THINK_CAP_S,
        client_patience_s=None,
    )


def run_policies(
    spec: SimSpec, policies: Sequence[str], processes: int | None = None
) -> list[SimResult]:
    """Every policy on the same recorded arrivals and programs."""
    return run_many([dataclasses.replace(spec, policy=p) for p in policies], processes)


def oracle(spec: SimSpec, window_s: float) -> OracleResult:
    """The oracle lower bound on the recording (:mod:`simulator.oracle`)."""
    return oracle_search(spec, window_s)


@dataclass(frozen=True, slots=True)
class SimCall:
    latency_s: float
    """Release (arrival at the router) to the last token, time held included."""
    ttft_s: float
    """Arrival at the engine to the first token."""


@dataclass(slots=True)
class SimulatedRun:
    """A no-control replay with every call: what :mod:`whatif.compare` compares."""

    llm_time_s: dict[str, float] = field(default_factory=dict)
    completion_s: dict[str, float] = field(default_factory=dict)
    calls: dict[tuple[str, int], SimCall] = field(default_factory=dict)
    preemptions: int = 0
    prefix_cache_hits_tokens: int = 0
    unfinished: int = 0


def simulate_calls(path: Path, preset: Preset, policy: str = "no-control") -> SimulatedRun:
    """Replay ``path`` on ``preset`` until every session is done, keeping each call."""
    facts = recording_facts(path)
    spec = dataclasses.replace(
        base_spec(path, preset, facts.span_s * COMPARE_MARGIN + 600.0), policy=policy
    )
    out = SimulatedRun()

    def on_request(agent_id: str, turn: int, release_s: float, ev: RequestFinished) -> None:
        out.calls[(agent_id, turn)] = SimCall(
            ev.t_s - release_s, max(ev.first_token_s - ev.arrival_s, 0.0)
        )

    workload = build_workload(spec)
    if not isinstance(workload, RecordedWorkload):
        raise RecordingError(f"{path}: not a recorded workload")
    cluster = Cluster(
        spec.preset,
        cluster_config(spec),
        workload,
        build_arrivals(spec),
        on_request=on_request,
    )
    cluster.run()
    for record in cluster.agents_done:
        out.llm_time_s[record.agent_id] = record.llm_time_s
        out.completion_s[record.agent_id] = record.end_s - record.start_s
    for inst in cluster.instances:
        out.preemptions += inst.engine.counters.preemptions
        out.prefix_cache_hits_tokens += inst.engine.counters.prefill_reused_tokens
    out.unfinished = cluster.unfinished(spec.duration_s)[0]
    return out
