"""PNG plots of power, clock and context over time (paper Fig. 9), one file per
(policy, run) group. Uses matplotlib's object API with the Agg canvas, so no
global pyplot state and no display are needed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reporting.energy import with_measured_energy
from reporting.records import file_slug
from reporting.report import Group

# Legends beside the axes, never over the curves they explain.
LEGEND_OUTSIDE = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}


def plot_group(group: Group, path: Path) -> Path | None:
    """Write ``path`` for ``group``; None when it has no epoch records."""
    if not group.epochs:
        return None
    t0 = min(e.t_s - e.epoch_s for e in group.epochs)
    fig = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_p, ax_f, ax_u = fig.subplots(3, 1, sharex=True)
    for name in group.instances:
        eps = sorted((e for e in group.epochs if e.instance == name), key=lambda e: e.t_s)
        t = [e.t_s - t0 for e in eps]
        ax_p.step(t, [e.avg_power_w for e in eps], where="pre", label=name)
        ax_f.step(t, [e.target_clock_mhz for e in eps], where="pre", label=f"{name} target")
        actual = [(ti, e.actual_clock_mhz) for ti, e in zip(t, eps, strict=True)]
        pts = [(ti, c) for ti, c in actual if c is not None]
        if pts:
            ax_f.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=3, label=f"{name} actual")
        ax_u.plot(t, [e.usage_tokens for e in eps], label=f"{name} U")
        ax_u.plot(t, [e.capacity_tokens for e in eps], "--", lw=0.8, label=f"{name} U_max")
        boosts = [ti for ti, e in zip(t, eps, strict=True) if e.boost]
        if boosts:
            ax_f.plot(boosts, [max(e.target_clock_mhz for e in eps)] * len(boosts), "r|", ms=8)
    ax_p.set_ylabel("power (W)")
    ax_f.set_ylabel("clock (MHz)")
    ax_u.set_ylabel("context (tokens)")
    ax_u.set_xlabel("time (s)")
    for ax in (ax_p, ax_f, ax_u):
        ax.grid(True, alpha=0.3)
        ax.legend(**LEGEND_OUTSIDE)
    title = f"policy {group.policy}" + (f", run {group.run}" if group.run else "")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def plot_agent_energy(group: Group, path: Path) -> Path | None:
    """Energy per agent (own requests) against its output tokens; None without energy."""
    agents = with_measured_energy(group.agents)
    if not agents:
        return None
    fig = Figure(figsize=(7, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.scatter(
        [a.decode_tokens for a in agents], [a.energy_own_j or 0.0 for a in agents], s=10, alpha=0.6
    )
    tokens = sum(a.decode_tokens for a in agents)
    if tokens > 0:
        mean = sum(a.energy_own_j or 0.0 for a in agents) / tokens
        top = max(a.decode_tokens for a in agents)
        ax.plot([0, top], [0, mean * top], "--", lw=0.8, label=f"mean {mean:.3f} J/token")
        ax.legend(fontsize="small", loc="upper left")
    ax.set_xlabel("output tokens per agent")
    ax.set_ylabel("attributed GPU energy per agent (J)")
    ax.grid(True, alpha=0.3)
    title = f"energy per agent, policy {group.policy}" + (f", run {group.run}" if group.run else "")
    ax.set_title(title, fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def write_plots(groups: Sequence[Group], out_dir: Path) -> list[Path]:
    """One PNG per group with epochs: ``<policy>.png`` as ``kairos sim`` names it
    (``fixed-810.png``), with ``-<run>`` added only when a policy has several runs;
    and ``<same>-agent-energy.png`` for a group whose agent records carry energy."""
    written: list[Path] = []
    policies = [g.policy for g in groups if g.epochs or with_measured_energy(g.agents)]
    for g in groups:
        name = file_slug(g.policy)
        if policies.count(g.policy) > 1 and g.run:
            name += f"-{file_slug(g.run)}"
        for out in (
            plot_group(g, out_dir / f"{name}.png"),
            plot_agent_energy(g, out_dir / f"{name}-agent-energy.png"),
        ):
            if out is not None:
                written.append(out)
    return written
