"""The line id-tracker prints when an agent run ends: what the run cost (``--summary``).

Users ask what an agent run costs in energy. The router attributes every epoch's
measured GPU energy to the agents it served (docs/energy.md) and writes each
agent's record once its last joules are in; the end call can wait for that
record and return it (``AgentEnd.summary_wait_s``). This module only words it.
"""

from __future__ import annotations

from kairos_common.wire import AgentSummary

PREFIX = "id-tracker:"


def energy_text(energy_j: float) -> str:
    """``532 J``, ``12.4 kJ``, ``3.1 MJ``: at most three significant figures."""
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if energy_j >= scale:
            return f"{energy_j / scale:.3g} {unit}"
    return f"{energy_j:.3g} J"


def _throughput(s: AgentSummary) -> str:
    if s.throughput_tok_s is None:
        return "no throughput (no output tokens)"
    text = f"{s.throughput_tok_s:.1f} tok/s"
    if s.slo_tok_s is not None and s.slo_met is not None:
        text += f", SLO {s.slo_tok_s:g} {'met' if s.slo_met else 'missed'}"
    return text


def _energy(s: AgentSummary) -> str:
    if s.energy_j is None:
        return "energy not measured (no kairosd reports energy for its GPUs)"
    per_token = (
        f", {s.energy_j / s.decode_tokens:.3g} J/output token" if s.decode_tokens > 0 else ""
    )
    label = "energy" if s.final else "energy so far"
    text = f"{label} {energy_text(s.energy_j)} ({s.energy_j / 3600:.3g} Wh{per_token})"
    if not s.final:
        text += "; the router's record will have the rest"
    return text


def summary_line(s: AgentSummary) -> str:
    """One line: who, how much work, how fast, how long held, and the energy."""
    who = f"{s.name} ({s.agent_id})" if s.name else s.agent_id
    return (
        f"{PREFIX} agent {who} {s.end_reason}: {s.turns} requests, "
        f"{s.decode_tokens} output tokens, {_throughput(s)}, held {s.pending_s:.1f} s; "
        f"{_energy(s)}"
    )


def missing_line(delivered: bool) -> str:
    """Why there is no summary to print."""
    if not delivered:
        return f"{PREFIX} no summary: the router did not confirm the agent's end"
    return (
        f"{PREFIX} no summary: the router sent none (a router older than this "
        "id-tracker, or one that had already retired the agent)"
    )
