"""``kairos report``: group daemon / router / simulator records by run and
policy, and compute the paper's metrics (via :func:`reporting.metrics.summarize`)
per instance and in total.

Grouping: a :class:`RunRecord` names the policy of its ``run`` label; epoch
records carry their policy; agent records (the router's) carry only ``run``,
so they join the group of the same run label — or, when the files describe a
single group, that group. Mixed daemon JSONL + router JSONL of one deployment
therefore report together without any labelling.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reporting.metrics import Summary, summarize
from reporting.records import AgentRecord, EpochRecord, Record, RunRecord, read_records

DEFAULT_SLO_TOK_S = 20.0
_MAX_CLOCKS_SHOWN = 8  # the table line; --json has every clock


@dataclass
class Group:
    """All records of one (policy, run)."""

    policy: str
    run: str
    epochs: list[EpochRecord] = field(default_factory=list)
    agents: list[AgentRecord] = field(default_factory=list)
    run_record: RunRecord | None = None

    @property
    def instances(self) -> list[str]:
        return sorted({e.instance for e in self.epochs})


@dataclass(frozen=True, slots=True)
class GroupReport:
    """One group's total summary and per-instance summaries."""

    policy: str
    run: str
    slo_tok_s: float
    total: Summary
    per_instance: dict[str, Summary]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self.total)
        out["run"] = self.run
        out["slo_tok_s"] = self.slo_tok_s
        out["time_at_clock_s"] = {str(k): v for k, v in self.total.time_at_clock_s.items()}
        out["instances"] = {
            name: {
                "avg_power_w": s.avg_power_w,
                "energy_j": s.energy_j,
                "duration_s": s.duration_s,
                "boost_fraction": s.boost_fraction,
                "preemptions": s.preemptions,
                "output_tokens": s.output_tokens,
                "time_at_clock_s": {str(k): v for k, v in s.time_at_clock_s.items()},
            }
            for name, s in self.per_instance.items()
        }
        return out


def load(paths: Iterable[Path]) -> list[Record]:
    """Every record of ``paths`` (raises ``RecordError``/``OSError`` with the file)."""
    return list(read_records(paths))


def group_records(records: Sequence[Record]) -> list[Group]:
    """Split records into (policy, run) groups, in first-seen order."""
    run_policy = {r.run: r.policy for r in records if isinstance(r, RunRecord)}
    groups: dict[tuple[str, str], Group] = {}

    def get(policy: str, run: str) -> Group:
        return groups.setdefault((policy, run), Group(policy=policy, run=run))

    for r in records:
        if isinstance(r, RunRecord):
            get(r.policy, r.run).run_record = r
        elif isinstance(r, EpochRecord):
            get(run_policy.get(r.run, r.policy), r.run).epochs.append(r)
    orphans: list[AgentRecord] = []
    for r in records:
        if not isinstance(r, AgentRecord):
            continue
        same_run = [g for g in groups.values() if g.run == r.run]
        if len(same_run) == 1:
            same_run[0].agents.append(r)
        elif len(groups) == 1:
            next(iter(groups.values())).agents.append(r)
        else:
            orphans.append(r)
    for r in orphans:
        get(run_policy.get(r.run, "unknown"), r.run).agents.append(r)
    return list(groups.values())


def _agent_window_s(agents: Sequence[AgentRecord]) -> float | None:
    if not agents:
        return None
    return max(a.end_s for a in agents) - min(a.start_s for a in agents)


def summarize_group(group: Group, slo_tok_s: float | None = None) -> GroupReport:
    """Total and per-instance :class:`Summary` of one group."""
    run = group.run_record
    slo = slo_tok_s
    if slo is None:
        slo = run.slo_tok_s if run is not None and run.slo_tok_s else DEFAULT_SLO_TOK_S
    duration: float | None = run.duration_s if run is not None and run.duration_s > 0 else None
    if duration is None and not group.epochs:
        duration = _agent_window_s(group.agents)
    counters = run.counters if run is not None else {}
    preemptions = int(counters["preemptions"]) if "preemptions" in counters else None
    total = summarize(
        group.policy,
        group.epochs,
        group.agents,
        slo_tok_s=slo,
        duration_s=duration,
        preemptions=preemptions,
        recomputed_tokens=int(counters.get("recomputed_tokens", 0)),
    )
    per_instance = {
        name: summarize(
            group.policy, [e for e in group.epochs if e.instance == name], [], slo_tok_s=slo
        )
        for name in group.instances
    }
    return GroupReport(group.policy, group.run, slo, total, per_instance)


def build_reports(records: Sequence[Record], slo_tok_s: float | None = None) -> list[GroupReport]:
    return [summarize_group(g, slo_tok_s) for g in group_records(records)]


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


_HEADER = (
    f"{'scope':<16} {'avg W':>8} {'energy J':>11} {'J/tok':>7} {'P5 tok/s':>9} "
    f"{'SLO %':>6} {'jobs/s':>7} {'agents':>6} {'preempt':>7} {'boost %':>7} {'pend s':>7}"
)


def _row(scope: str, s: Summary) -> str:
    agents = s.completed_agents > 0  # agent columns are blank without agent records
    return (
        f"{scope[:16]:<16} {s.avg_power_w:>8.1f} {s.energy_j:>11.0f} "
        f"{_fmt(s.energy_per_output_token_j, '.3f'):>7} "
        f"{_fmt(s.p5_agent_throughput_tok_s if agents else None, '.1f'):>9} "
        f"{_fmt(s.slo_attainment if agents else None, '.1f', 100.0):>6} "
        f"{_fmt(s.job_throughput_per_s if agents else None, '.4f'):>7} "
        f"{s.completed_agents if agents else '-':>6} {s.preemptions:>7} "
        f"{s.boost_fraction * 100:>7.1f} {_fmt(s.mean_pending_s if agents else None, '.1f'):>7}"
    )


def render_table(reports: Sequence[GroupReport]) -> str:
    """Human-readable table: per instance, then the total, for every group."""
    lines: list[str] = []
    for rep in reports:
        label = f"policy {rep.policy}" + (f"  run {rep.run}" if rep.run else "")
        lines += [
            f"{label}  (window {rep.total.duration_s:.0f} s, SLO {rep.slo_tok_s:g} tok/s)",
            _HEADER,
        ]
        lines += [_row(name, s) for name, s in rep.per_instance.items()]
        lines.append(_row("TOTAL", rep.total))
        clocks = rep.total.time_at_clock_s
        spent = sum(clocks.values())
        if spent > 0:
            top = sorted(sorted(clocks.items(), key=lambda kv: -kv[1])[:_MAX_CLOCKS_SHOWN])
            shares = ", ".join(f"{mhz}: {t:.0f}s ({t / spent:.0%})" for mhz, t in top)
            more = f" (+{len(clocks) - len(top)} more)" if len(clocks) > len(top) else ""
            lines.append(f"time at clock (MHz): {shares}{more}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
