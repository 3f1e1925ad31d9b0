"""The paper's metrics, defined once (Eq. 3–5) and used by every report.

* per-agent throughput, Eq. 3: Σ decode tokens / Σ request latency;
* P5 per-agent throughput: the 5th percentile over finished agents (linear
  interpolation, numpy's default);
* SLO attainment, Eq. 4: fraction of finished agents with throughput ≥ τ;
  a session that gave up while held (``end_reason`` ``gave-up``) is not a
  finished agent but counts here, and in P5, at throughput 0;
* average power, Eq. 5: total energy / wall time of the measured window;
* energy per output token: total energy / total decode tokens;
* job throughput: finished agents / window length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reporting.records import GAVE_UP, AgentRecord, EpochRecord

SPEC_JSON_KEYS: frozenset[str] = frozenset(
    {
        "policy",
        "avg_power_w",
        "energy_j",
        "energy_per_output_token_j",
        "p5_agent_throughput_tok_s",
        "slo_attainment",
        "job_throughput_per_s",
        "completed_agents",
        "preemptions",
        "recomputed_tokens",
        "boost_fraction",
        "mean_pending_s",
    }
)
"""Keys every ``kairos sim --json`` / ``kairos report --json`` object carries
(docs/design.md §4: scripts and operators rely on them)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """``q``-th percentile (0–100) or None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def slo_attainment(throughputs: Sequence[float], slo_tok_s: float) -> float | None:
    """Eq. 4: share of agents whose throughput meets ``slo_tok_s``."""
    if not throughputs:
        return None
    return sum(1 for t in throughputs if t >= slo_tok_s) / len(throughputs)


@dataclass(frozen=True, slots=True)
class Summary:
    """The headline metrics of one policy run (``kairos sim/report --json`` keys)."""

    policy: str
    duration_s: float
    avg_power_w: float
    energy_j: float
    energy_per_output_token_j: float | None
    p5_agent_throughput_tok_s: float | None
    slo_attainment: float | None
    job_throughput_per_s: float
    completed_agents: int
    preemptions: int
    recomputed_tokens: int
    boost_fraction: float
    mean_pending_s: float | None
    output_tokens: int = 0
    time_at_clock_s: dict[int, float] = field(default_factory=dict)
    per_instance_avg_power_w: dict[str, float] = field(default_factory=dict)
    gave_up_agents: int = 0
    """Sessions whose clients stopped retrying while held (not in ``completed_agents``)."""
    slo_attainment_all: float | None = None
    """Attainment over every session that arrived: ``slo_attainment``'s plus the
    sessions the window ended before, by their Eq. 3 so far (``unfinished_tok_s``
    of :func:`summarize`); None where those are not known (router records)."""


def summarize(
    policy: str,
    epochs: Sequence[EpochRecord],
    agents: Sequence[AgentRecord],
    *,
    slo_tok_s: float,
    duration_s: float | None = None,
    preemptions: int | None = None,
    recomputed_tokens: int = 0,
    unfinished_tok_s: Sequence[float] | None = None,
) -> Summary:
    """Compute :class:`Summary` from epoch and agent records of one run.

    ``unfinished_tok_s``: Eq. 3 so far of each session the run ended before it
    finished (the simulator knows them; a session held since it arrived is 0).
    Under overload ``slo_attainment`` favours a policy that leaves sessions running
    slowly at the end (they are not judged) over one that held them until they
    gave up (they are); ``slo_attainment_all`` judges both."""
    energy = sum(e.energy_j for e in epochs)
    per_instance_energy: dict[str, float] = {}
    per_instance_time: dict[str, float] = {}
    time_at_clock: dict[int, float] = {}
    boost_time = 0.0
    total_epoch_time = 0.0
    for e in epochs:
        per_instance_energy[e.instance] = per_instance_energy.get(e.instance, 0.0) + e.energy_j
        per_instance_time[e.instance] = per_instance_time.get(e.instance, 0.0) + e.epoch_s
        clock = e.actual_clock_mhz if e.actual_clock_mhz is not None else e.target_clock_mhz
        time_at_clock[clock] = time_at_clock.get(clock, 0.0) + e.epoch_s
        total_epoch_time += e.epoch_s
        if e.boost:
            boost_time += e.epoch_s
    window = duration_s if duration_s is not None else max(per_instance_time.values(), default=0.0)
    per_instance_power = {
        k: per_instance_energy[k] / per_instance_time[k]
        for k in per_instance_energy
        if per_instance_time[k] > 0
    }
    avg_power = energy / window if window > 0 else 0.0
    finished = [a for a in agents if a.end_reason != GAVE_UP]
    gave_up = len(agents) - len(finished)
    tputs = [a.throughput_tok_s for a in finished if a.throughput_tok_s is not None]
    tputs += [0.0] * gave_up
    out_tokens = sum(a.decode_tokens for a in agents)
    epoch_tokens = [e.output_tokens for e in epochs if e.output_tokens is not None]
    if epoch_tokens:
        out_tokens = max(out_tokens, int(sum(epoch_tokens)))
    if preemptions is None:
        preemptions = int(sum(e.preemptions or 0 for e in epochs))
    pend = [a.pending_s for a in agents]
    return Summary(
        policy=policy,
        duration_s=window,
        avg_power_w=avg_power,
        energy_j=energy,
        energy_per_output_token_j=energy / out_tokens if out_tokens else None,
        p5_agent_throughput_tok_s=percentile(tputs, 5.0),
        slo_attainment=slo_attainment(tputs, slo_tok_s),
        slo_attainment_all=None
        if unfinished_tok_s is None
        else slo_attainment([*tputs, *unfinished_tok_s], slo_tok_s),
        job_throughput_per_s=len(finished) / window if window > 0 else 0.0,
        completed_agents=len(finished),
        preemptions=preemptions,
        recomputed_tokens=recomputed_tokens,
        boost_fraction=boost_time / total_epoch_time if total_epoch_time > 0 else 0.0,
        mean_pending_s=float(np.mean(pend)) if pend else None,
        output_tokens=out_tokens,
        time_at_clock_s=dict(sorted(time_at_clock.items())),
        per_instance_avg_power_w=per_instance_power,
        gave_up_agents=gave_up,
    )
