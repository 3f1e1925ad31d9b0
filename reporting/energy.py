"""Energy per agent in reports: filling agent records, and the per-agent tables.

An agent's ``energy_own_j`` is what the attribution gave its own requests; its
``energy_j`` adds every sub-agent's ``energy_j`` (so a parent shows what its
whole tree cost). Sums across agents use ``energy_own_j`` — summing
``energy_j`` would count sub-agents twice.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reporting.records import AgentRecord, EnergyRecord, EpochRecord, Record

_MAX_AGENT_ROWS = 20  # the table; --json has every agent


def with_energy(
    records: Sequence[AgentRecord], own_j: Mapping[str, tuple[float, float]]
) -> list[AgentRecord]:
    """``records`` with energy filled from ``own_j`` (agent id → (prefill J, decode J));
    an agent absent from ``own_j`` did no attributed work (0 J). Sub-agents' totals
    are added to their parents' ``energy_j`` whatever order they ended in."""
    own = {r.agent_id: sum(own_j.get(r.agent_id, (0.0, 0.0))) for r in records}
    by_name = {r.name: r.agent_id for r in records if r.name is not None}
    children: dict[str, list[str]] = defaultdict(list)
    for r in records:
        parent = r.parent_id
        if parent is not None:
            parent = parent if parent in own else by_name.get(parent, parent)
            if parent in own and parent != r.agent_id:
                children[parent].append(r.agent_id)
    total: dict[str, float] = {}

    def tree(aid: str, seen: frozenset[str]) -> float:
        if aid in total:
            return total[aid]
        value = own[aid] + sum(tree(c, seen | {aid}) for c in children[aid] if c not in seen)
        total[aid] = value
        return value

    out = []
    for r in records:
        prefill, decode = own_j.get(r.agent_id, (0.0, 0.0))
        out.append(
            dataclasses.replace(
                r,
                energy_j=tree(r.agent_id, frozenset()),
                energy_own_j=prefill + decode,
                energy_prefill_j=prefill,
                energy_decode_j=decode,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class EnergyRow:
    """Energy of one agent, or of a group of agents (by name/label or run)."""

    scope: str
    agents: int
    energy_j: float
    prefill_j: float
    decode_j: float
    decode_tokens: int

    @property
    def j_per_output_token(self) -> float | None:
        return self.energy_j / self.decode_tokens if self.decode_tokens > 0 else None


def _row(scope: str, agents: Sequence[AgentRecord], *, own: bool) -> EnergyRow:
    return EnergyRow(
        scope=scope,
        agents=len(agents),
        energy_j=sum((a.energy_own_j if own else a.energy_j) or 0.0 for a in agents),
        prefill_j=sum(a.energy_prefill_j or 0.0 for a in agents),
        decode_j=sum(a.energy_decode_j or 0.0 for a in agents),
        decode_tokens=sum(a.decode_tokens for a in agents),
    )


def with_measured_energy(agents: Sequence[AgentRecord]) -> list[AgentRecord]:
    return [a for a in agents if a.energy_own_j is not None]


def energy_rows(agents: Sequence[AgentRecord]) -> dict[str, list[EnergyRow]]:
    """Per agent (own + sub-agents, most energy first), per name/label and per run
    (own energy summed, so no joule is counted twice)."""
    measured = with_measured_energy(agents)
    per_agent = [
        _row(
            a.agent_id if a.name in (None, a.agent_id) else f"{a.name} ({a.agent_id})",
            [a],
            own=False,
        )
        for a in measured
    ]
    per_agent.sort(key=lambda r: -r.energy_j)
    names: dict[str, list[AgentRecord]] = defaultdict(list)
    runs: dict[str, list[AgentRecord]] = defaultdict(list)
    for a in measured:
        names[_label(a.name)].append(a)
        runs[a.run or "-"].append(a)
    return {
        "agent": per_agent,
        "name": sorted((_row(n, g, own=True) for n, g in names.items()), key=lambda r: -r.energy_j),
        "run": [_row(r, g, own=True) for r, g in runs.items()],
    }


def _label(name: str | None) -> str:
    """Agent names like ``task-17`` or ``swe-3/sub-2`` group by their label ``task``."""
    if not name:
        return "-"
    head = name.split("/")[0]
    return head.rstrip("0123456789").rstrip("-_.:") or head


def render_energy(agents: Sequence[AgentRecord], measured_j: float | None = None) -> str:
    """The per-agent energy table of ``kairos report`` ('' without energy data);
    ``measured_j``: the instances' measured energy over the same records, if known."""
    rows = energy_rows(agents)
    if not rows["agent"]:
        return ""
    head = f"{'':<34} {'agents':>6} {'energy J':>11} {'prefill J':>10} {'decode J':>10} "
    head += f"{'out tok':>9} {'J/tok':>7}"
    lines = ["energy per agent (attributed GPU energy, idle draw excluded; docs/energy.md)"]
    for kind, title in (("run", "per run"), ("name", "per agent name"), ("agent", "per agent")):
        lines.append(f"{title + ':':<34}" + head[34:])
        shown = rows[kind][:_MAX_AGENT_ROWS] if kind == "agent" else rows[kind]
        for r in shown:
            jpt = "-" if r.j_per_output_token is None else f"{r.j_per_output_token:.3f}"
            lines.append(
                f"  {r.scope[:32]:<32} {r.agents:>6} {r.energy_j:>11.1f} {r.prefill_j:>10.1f} "
                f"{r.decode_j:>10.1f} {r.decode_tokens:>9} {jpt:>7}"
            )
        if len(rows[kind]) > len(shown):
            lines.append(f"  … {len(rows[kind]) - len(shown)} more agents (--json lists all)")
    if measured_j:
        own = sum(r.energy_j for r in rows["run"])
        lines.append(
            f"finished agents' own energy: {own:.0f} J = {own / measured_j:.1%} of the "
            f"{measured_j:.0f} J measured (the rest: idle draw, agents still running, "
            "intervals without work)"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class EnergyBalance:
    """Does a deployment's energy add up? From the router's agent and energy records
    and the daemons' power reports (the end-to-end check of docs/energy.md)."""

    agents: int
    agents_with_energy: int
    own_j: float
    unrecorded_j: float
    unattributed_j: float
    measured_j: float
    daemon_j: float

    @property
    def parts_error(self) -> float:
        """|Σ agents' own + unrecorded + unattributed − measured| / measured."""
        parts = self.own_j + self.unrecorded_j + self.unattributed_j
        return abs(parts - self.measured_j) / self.measured_j if self.measured_j > 0 else 0.0

    @property
    def daemon_error(self) -> float:
        """|measured (as the router received it) − the daemons' epochs| / the epochs."""
        return abs(self.measured_j - self.daemon_j) / self.daemon_j if self.daemon_j > 0 else 0.0


def energy_balance(records: Sequence[Record]) -> EnergyBalance | None:
    """None without energy records (a router that got no energy from any daemon)."""
    energy = [r for r in records if isinstance(r, EnergyRecord)]
    if not energy:
        return None
    agents = [r for r in records if isinstance(r, AgentRecord)]
    reported = {e.instance: e.daemon_epoch for e in energy}
    daemon_j = sum(
        r.energy_j
        for r in records
        if isinstance(r, EpochRecord)
        and r.instance in reported
        and (reported[r.instance] is None or r.epoch < (reported[r.instance] or 0))
    )
    return EnergyBalance(
        agents=len(agents),
        agents_with_energy=len(with_measured_energy(agents)),
        own_j=sum(a.energy_own_j or 0.0 for a in agents),
        unrecorded_j=sum(e.unrecorded_j for e in energy),
        unattributed_j=sum(e.unattributed_j for e in energy),
        measured_j=sum(e.measured_j for e in energy),
        daemon_j=daemon_j,
    )


def energy_json(agents: Sequence[AgentRecord]) -> dict[str, list[dict[str, object]]]:
    return {
        kind: [
            {
                "scope": r.scope,
                "agents": r.agents,
                "energy_j": r.energy_j,
                "prefill_j": r.prefill_j,
                "decode_j": r.decode_j,
                "decode_tokens": r.decode_tokens,
                "j_per_output_token": r.j_per_output_token,
            }
            for r in rows
        ]
        for kind, rows in energy_rows(agents).items()
    }
