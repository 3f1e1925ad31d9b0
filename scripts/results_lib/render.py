"""Markdown and matplotlib helpers shared by the items (no numbers of their own)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scripts.results_lib.runs import Stat

COMMAND = ".venv/bin/python -m scripts.results"


def fmt(s: Stat | float | int | None, digits: int = 0, pct: bool = False) -> str:
    """``mean ± sd`` (sd only when several seeds), or ``–`` when missing."""
    if s is None:
        return "–"
    if isinstance(s, int | float):
        return f"{s:,.{digits}f}" + ("%" if pct else "")
    mean = s.get("mean")
    if mean is None:
        return "–"
    text = f"{mean:,.{digits}f}"
    n = s.get("n") or 0
    sd = s.get("sd")
    if n > 1 and sd is not None:
        text += f" ± {sd:,.{digits}f}"
    return text + ("%" if pct else "")


def mean(s: Any) -> float:
    """The mean of a stat as a float (NaN when missing), for plots and comparisons."""
    if s is None or s.get("mean") is None:
        return float("nan")
    return float(s["mean"])


def sd(s: Any) -> float:
    if s is None or s.get("sd") is None:
        return 0.0
    return float(s["sd"])


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def command(item: str, quick: bool) -> str:
    return f"```\n{COMMAND} --only {item}{' --quick' if quick else ''}\n```"


def save(fig: Figure, out_dir: Path, name: str) -> str:
    """Write ``fig`` as ``out_dir/name`` and return the markdown image link."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=90)
    plt.close(fig)
    return f"![{name}](results/{name})"


def subplots(rows: int, cols: int, width: float = 10.0, height: float = 6.5) -> tuple[Figure, Any]:
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False)
    return fig, axes


def errorline(ax: Any, xs: Sequence[float], stats: Sequence[Stat], label: str, **kw: Any) -> None:
    ax.errorbar(
        xs, [mean(s) for s in stats], yerr=[sd(s) for s in stats], label=label, capsize=3, **kw
    )


def paired_bars(
    ax: Any, groups: Sequence[str], series: dict[str, Sequence[Any]], ylabel: str
) -> None:
    """Grouped bars with seed spread as error bars."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (label, stats) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(
            xs, [mean(s) for s in stats], width, yerr=[sd(s) for s in stats], label=label, capsize=2
        )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
