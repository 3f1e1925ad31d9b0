"""The what-if plots: simulated against measured per agent, and the policies over time.

matplotlib's object API on the Agg canvas (no pyplot state, no display), as
:mod:`simulator.plots`, whose side-by-side policy plot the replay reuses.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from whatif.compare import Comparison


def plot_comparison(comparison: Comparison, path: Path, title: str) -> Path:
    """Per agent: simulated against measured LLM time (left) and completion time
    (right), with y = x and the ±5 % and ±10 % bands."""
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    points = comparison.agents
    panels = (
        ("per-agent LLM time (s)", [(a.measured_llm_s, a.simulated_llm_s) for a in points]),
        ("per-agent completion time (s)", [
            (a.measured_completion_s, a.simulated_completion_s) for a in points
        ]),
    )  # fmt: skip
    for ax, (label, xy) in zip(axes, panels, strict=True):
        if not xy:
            continue
        hi = max(max(x, y) for x, y in xy) * 1.05
        lo = min(min(x, y) for x, y in xy) * 0.95
        line = [lo, hi]
        ax.plot(line, line, color="k", lw=0.8, label="simulated = measured")
        for band, style in ((0.05, "--"), (0.10, ":")):
            ax.plot(line, [v * (1 + band) for v in line], color="grey", lw=0.7, ls=style)
            ax.plot(line, [v * (1 - band) for v in line], color="grey", lw=0.7, ls=style,
                    label=f"±{band:.0%}")  # fmt: skip
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=14, zorder=3)
        ax.set_xlabel(f"measured {label} (median of {comparison.repeats} runs)")
        ax.set_ylabel(f"simulated {label}")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.legend(fontsize=7, loc="upper left")
    figs = comparison.figures()
    llm_med = figs["llm_time_median_abs_error"] or 0.0
    llm_p90 = figs["llm_time_p90_abs_error"] or 0.0
    fig.suptitle(
        f"{title}: per-agent LLM time |error| median {llm_med:.1%}, P90 {llm_p90:.1%} "
        f"({figs['agents']} agents)"
    )
    fig.savefig(path, dpi=110)
    return path
