"""The items of docs/results.md, in document order: name, title, tasks, build, render."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts.results_lib import items_claude as cc
from scripts.results_lib import items_multi as m
from scripts.results_lib import items_oracle as o
from scripts.results_lib import items_single as s
from scripts.results_lib import items_slo_ta as st
from scripts.results_lib import items_trace as tr
from scripts.results_lib.energy import energy_render
from scripts.results_lib.items_single import Data, Results, VerdictRow
from scripts.results_lib.plan import Plan
from scripts.results_lib.runs import Task

AllData = dict[str, Data]


@dataclass(frozen=True, slots=True)
class Item:
    number: int
    name: str
    title: str
    tasks: Callable[[Plan], list[Task]]
    build: Callable[[Plan, Results], Data]
    render: Callable[[Data, Path, bool, AllData], str]
    verdicts: Callable[[Data], list[VerdictRow]] = lambda _d: []
    """This item's rows of the paper-vs-simulator table (none by default)."""


def _no_tasks(_: Plan) -> list[Task]:
    return []


def _no_build(_: Plan, __: Results) -> Data:
    return {}


def _plain(fn: Callable[[Data, Path, bool], str]) -> Callable[[Data, Path, bool, AllData], str]:
    def render(d: Data, out: Path, quick: bool, _: AllData) -> str:
        return fn(d, out, quick)

    return render


def _trace_render(d: Data, out: Path, quick: bool, all_data: AllData) -> str:
    return tr.trace_render(d, out, quick, all_data.get("fig7", {}).get("rows", []))


ITEMS: tuple[Item, ...] = (
    Item(
        1,
        "fig4",
        "Fig. 4 analogue: fixed clocks and the thrashing knee",
        s.fig4_tasks,
        s.fig4_build,
        _plain(s.fig4_render),
        s.fig4_verdicts,
    ),
    Item(
        2,
        "fig7",
        "Fig. 7 analogue: no control vs fixed 810 MHz vs KAIROS across rates",
        s.fig7_tasks,
        s.fig7_build,
        _plain(s.fig7_render),
        s.fig7_verdicts,
    ),
    Item(
        3,
        "fig8",
        "Fig. 8 analogue: SLO targets at 0.03 jobs/s",
        st.fig8_tasks,
        st.fig8_build,
        _plain(st.fig8_render),
        st.fig8_verdicts,
    ),
    Item(
        4,
        "fig10",
        "Fig. 10–11 analogue: thrashing avoidance on vs off",
        st.fig10_tasks,
        st.fig10_build,
        _plain(st.fig10_render),
        st.fig10_verdicts,
    ),
    Item(
        5,
        "fig12",
        "Fig. 12 analogue: four instances at 0.16 jobs/s",
        m.fig12_tasks,
        m.fig12_build,
        _plain(m.fig12_render),
        m.fig12_verdicts,
    ),
    Item(
        6,
        "trace",
        "The same comparisons on the Claude Code trace",
        tr.trace_tasks,
        tr.trace_build,
        _trace_render,
    ),
    Item(7, "energy", "Energy per output token next to power", _no_tasks, _no_build, energy_render),
    Item(
        8,
        "oracle",
        "Oracle lower bound: the best fixed-per-window clock schedule",
        o.oracle_tasks,
        o.oracle_build,
        _plain(o.oracle_render),
        o.oracle_verdicts,
    ),
    Item(
        9,
        "robustness",
        "Robustness: the headline savings under ±30 % coefficients",
        m.robust_tasks,
        m.robust_build,
        _plain(m.robust_render),
        m.robust_verdicts,
    ),
    Item(
        10,
        "claude",
        "Long-context coding agents: Claude Code sessions on four instances",
        cc.claude_tasks,
        cc.claude_build,
        _plain(cc.claude_render),
    ),
    Item(
        11,
        "claude-tier",
        "Long-context coding agents on vLLM with a CPU KV tier",
        cc.tier_tasks,
        cc.tier_build,
        _plain(cc.claude_render),
    ),
    Item(
        12,
        "claude-gaps",
        "Long-context coding agents with their real tool and think gaps",
        cc.gaps_tasks,
        cc.gaps_build,
        _plain(cc.claude_render),
    ),
)

ITEM_NAMES: tuple[str, ...] = tuple(i.name for i in ITEMS)
