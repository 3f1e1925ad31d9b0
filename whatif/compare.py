"""A replay set beside the recorded run: how well the fitted engine predicts it.

Inputs: one or more recordings of the same programs (repeats of one run) and a
preset. Each recording is replayed under no control (what the recorded run
had: a CPU engine, or a GPU the daemon only observed), every call kept
(:func:`whatif.replay.simulate_calls`). An agent is found across repeats and
replays by its key (:mod:`whatif.recorded`); per agent the measured value is the
median over the repeats and the simulated one the median over their replays.

Figures (errors are (simulated − measured) / measured):

* per-agent LLM time (Σ call latency, the part the engine decides) and
  completion time (first arrival to last byte): median and P90 of |error|;
* per-call latency: median and P90 of |error| over calls;
* mean time to first token (streamed calls), preemptions and prefix-cache hit
  tokens: one error each (the latter two need the runs' vLLM counters);
* the noise floor: per agent, how far each repeat's LLM time is from the
  agents' median (median and P90 over agents and repeats): no model can be
  closer than the engine is to itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.presets import Preset
from whatif.errors import RecordingError
from whatif.recorded import MeasuredRun, MeasuredSession, session_keys
from whatif.replay import SimulatedRun, simulate_calls


@dataclass(frozen=True, slots=True)
class AgentPoint:
    key: str
    measured_llm_s: float
    simulated_llm_s: float
    measured_completion_s: float
    simulated_completion_s: float


@dataclass(slots=True)
class Comparison:
    """Everything :func:`compare` found, for the table, the plot and JSON."""

    agents: list[AgentPoint] = field(default_factory=list)
    call_errors: list[float] = field(default_factory=list)
    ttft_measured_s: float | None = None
    ttft_simulated_s: float | None = None
    preemptions_measured: float | None = None
    preemptions_simulated: float = 0.0
    hits_measured: float | None = None
    hits_simulated: float = 0.0
    noise: list[float] = field(default_factory=list)
    repeats: int = 0
    unfinished_simulated: int = 0

    def llm_errors(self) -> list[float]:
        return [_rel(a.simulated_llm_s, a.measured_llm_s) for a in self.agents]

    def completion_errors(self) -> list[float]:
        return [_rel(a.simulated_completion_s, a.measured_completion_s) for a in self.agents]

    def figures(self) -> dict[str, Any]:
        """The comparison's figures (fractions; None where not measured)."""
        llm = [abs(e) for e in self.llm_errors()]
        done = [abs(e) for e in self.completion_errors()]
        calls = [abs(e) for e in self.call_errors]
        return {
            "agents": len(self.agents),
            "repeats": self.repeats,
            "llm_time_median_abs_error": _pct(llm, 50),
            "llm_time_p90_abs_error": _pct(llm, 90),
            "llm_time_mean_error": float(np.mean(self.llm_errors())) if llm else None,
            "completion_median_abs_error": _pct(done, 50),
            "completion_p90_abs_error": _pct(done, 90),
            "call_latency_median_abs_error": _pct(calls, 50),
            "call_latency_p90_abs_error": _pct(calls, 90),
            "ttft_measured_s": self.ttft_measured_s,
            "ttft_simulated_s": self.ttft_simulated_s,
            "ttft_error": _maybe_rel(self.ttft_simulated_s, self.ttft_measured_s),
            "preemptions_measured": self.preemptions_measured,
            "preemptions_simulated": self.preemptions_simulated,
            "preemptions_error": _maybe_rel(self.preemptions_simulated, self.preemptions_measured),
            "prefix_hits_measured": self.hits_measured,
            "prefix_hits_simulated": self.hits_simulated,
            "prefix_hits_error": _maybe_rel(self.hits_simulated, self.hits_measured),
            "noise_median_abs": _pct(self.noise, 50),
            "noise_p90_abs": _pct(self.noise, 90),
            "unfinished_simulated": self.unfinished_simulated,
        }


def _rel(simulated: float, measured: float) -> float:
    return (simulated - measured) / measured if measured > 0 else 0.0


def _maybe_rel(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return (simulated - measured) / measured


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def compare(runs: Sequence[MeasuredRun], preset: Preset) -> Comparison:
    """Replay every run on ``preset`` and set the replays beside the runs."""
    if not runs:
        raise RecordingError("nothing to compare: no recording")
    sims = [simulate_calls(run.path, preset) for run in runs]
    return compare_simulated(runs, sims)


def compare_simulated(runs: Sequence[MeasuredRun], sims: Sequence[SimulatedRun]) -> Comparison:
    """:func:`compare` once the replays exist (tests give their own)."""
    keys = session_keys(runs)
    if not keys:
        raise RecordingError("the recordings share no agent (different programs?)")
    out = Comparison(repeats=len(runs))
    by_key = [run.by_key() for run in runs]
    for key in keys:
        measured = [m[key] for m in by_key]
        ids = [m.session_id for m in measured]
        sim_llm = [s.llm_time_s[i] for s, i in zip(sims, ids, strict=True) if i in s.llm_time_s]
        sim_done = [
            s.completion_s[i] for s, i in zip(sims, ids, strict=True) if i in s.completion_s
        ]
        if not sim_llm:
            continue  # not finished in any replay: counted in unfinished_simulated
        llm = [m.llm_time_s for m in measured]
        median_llm = _median(llm)
        out.agents.append(
            AgentPoint(
                key,
                median_llm,
                _median(sim_llm),
                _median([m.completion_s for m in measured]),
                _median(sim_done),
            )
        )
        out.noise += [abs(x - median_llm) / median_llm for x in llm if median_llm > 0]
        _calls(out, measured, sims, ids)
    _totals(out, runs, sims)
    return out


def _calls(
    out: Comparison,
    measured: Sequence[MeasuredSession],
    sims: Sequence[SimulatedRun],
    ids: list[str],
) -> None:
    """Per call: the median measured latency against the median simulated one."""
    turns = min(len(m.calls) for m in measured)
    for turn in range(turns):
        lat = _median([m.calls[turn].latency_s for m in measured])
        sim = [
            s.calls[(i, turn)].latency_s
            for s, i in zip(sims, ids, strict=True)
            if (i, turn) in s.calls
        ]
        if sim and lat > 0:
            out.call_errors.append(_rel(_median(sim), lat))


def _totals(out: Comparison, runs: Sequence[MeasuredRun], sims: Sequence[SimulatedRun]) -> None:
    measured_ttft: list[float] = []
    simulated_ttft: list[float] = []
    for run, sim in zip(runs, sims, strict=True):
        # The calls whose first byte was measured (streamed) and that the replay ran.
        pairs = [
            (c.ttft_s, sim.calls[(s.session_id, turn)].ttft_s)
            for s in run.sessions
            for turn, c in enumerate(s.calls)
            if c.ttft_s is not None and (s.session_id, turn) in sim.calls
        ]
        if pairs:
            measured_ttft.append(float(np.mean([m for m, _ in pairs])))
            simulated_ttft.append(float(np.mean([x for _, x in pairs])))
    out.ttft_measured_s = _median(measured_ttft) if measured_ttft else None
    out.ttft_simulated_s = _median(simulated_ttft) if simulated_ttft else None
    pre = [r.preemptions for r in runs if r.preemptions is not None]
    out.preemptions_measured = _median(pre) if pre else None
    out.preemptions_simulated = _median([s.preemptions for s in sims])
    hits = [r.prefix_cache_hits_tokens for r in runs if r.prefix_cache_hits_tokens is not None]
    out.hits_measured = _median(hits) if hits else None
    out.hits_simulated = _median([s.prefix_cache_hits_tokens for s in sims])
    out.unfinished_simulated = max(s.unfinished for s in sims)
