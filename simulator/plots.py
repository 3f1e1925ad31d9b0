"""PNG plots of simulated runs: power, clock and aggregate context over time
(paper Fig. 9), per policy, plus a side-by-side comparison of policies.

Uses matplotlib's object API on the Agg canvas: no pyplot global state, no display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reporting.plots import LEGEND_OUTSIDE
from reporting.records import EpochRecord
from simulator.runner import SimResult


def _by_instance(epochs: Sequence[EpochRecord]) -> dict[str, list[EpochRecord]]:
    out: dict[str, list[EpochRecord]] = {}
    for e in epochs:
        out.setdefault(e.instance, []).append(e)
    return out


def plot_run(result: SimResult, path: Path) -> Path:
    """Power, clock and context of every instance of one run (Fig. 9 style)."""
    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_p, ax_f, ax_u = fig.subplots(3, 1, sharex=True)
    groups = _by_instance(result.epochs)
    for name, eps in groups.items():
        t_min = [e.t_s / 60.0 for e in eps]
        ax_p.plot(t_min, [e.avg_power_w for e in eps], lw=0.8, label=name)
        ax_f.step(t_min, [e.actual_clock_mhz or e.target_clock_mhz for e in eps], lw=0.8)
        boosts = [e for e in eps if e.boost]
        ax_f.scatter(
            [e.t_s / 60.0 for e in boosts],
            [e.target_clock_mhz for e in boosts],
            s=4,
            c="tab:blue",
            zorder=3,
        )
        ax_u.plot(t_min, [e.usage_tokens / 1000.0 for e in eps], lw=0.8)
    if result.epochs:
        cap = result.epochs[0].capacity_tokens / 1000.0
        ax_u.axhline(cap, color="k", ls="--", lw=0.8, label="KV capacity")
        ax_u.legend(**LEGEND_OUTSIDE)
    ax_p.set_ylabel("power (W)")
    ax_f.set_ylabel("SM clock (MHz)\n(dots: SLO boost)")
    ax_u.set_ylabel("aggregate context\n(k tokens)")
    ax_u.set_xlabel("time (min)")
    if len(groups) > 1:
        ax_p.legend(**LEGEND_OUTSIDE)
    s = result.summary
    fig.suptitle(
        f"{s.policy} — {result.spec.workload_label}, {result.spec.rate_per_s:g} jobs/s, "
        f"{result.spec.instances} instance(s): {s.avg_power_w:.0f} W, "
        f"P5 {s.p5_agent_throughput_tok_s or 0:.1f} tok/s"
    )
    fig.savefig(path, dpi=110)
    return path


def plot_compare(results: Sequence[SimResult], path: Path) -> Path:
    """Total power and total aggregate context over time for several policies."""
    fig = Figure(figsize=(10, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_p, ax_u = fig.subplots(2, 1, sharex=True)
    for r in results:
        power: dict[float, float] = {}
        usage: dict[float, float] = {}
        for e in r.epochs:
            power[e.t_s] = power.get(e.t_s, 0.0) + e.avg_power_w
            usage[e.t_s] = usage.get(e.t_s, 0.0) + e.usage_tokens / 1000.0
        ts = sorted(power)
        label = f"{r.summary.policy} ({r.summary.avg_power_w:.0f} W)"
        ax_p.plot([t / 60.0 for t in ts], [power[t] for t in ts], lw=0.8, label=label)
        ax_u.plot([t / 60.0 for t in ts], [usage[t] for t in ts], lw=0.8, label=r.summary.policy)
    if results and results[0].epochs:
        cap = results[0].epochs[0].capacity_tokens * results[0].spec.instances / 1000.0
        ax_u.axhline(cap, color="k", ls="--", lw=0.8, label="KV capacity (all instances)")
    ax_p.set_ylabel("total power (W)")
    ax_u.set_ylabel("aggregate context (k tokens)")
    ax_u.set_xlabel("time (min)")
    ax_p.legend(**LEGEND_OUTSIDE)
    ax_u.legend(**LEGEND_OUTSIDE)
    fig.savefig(path, dpi=110)
    return path
