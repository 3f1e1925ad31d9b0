"""Making room: move idle agents so that a held agent can run (docs/control-law.md, point 15).

Fleet admission (:mod:`controllers.admission`) admits a held agent on any instance
with room for it. On a full fleet the free room is often there, only split: four
instances with 150K tokens free each hold a 235K-token Claude Code session as
long as none of them has 235K alone (dev trace, 0.008 sessions/s on 4
instances: in a fifth of the epochs with a held session at seed 1). Each
instance keeps that room filled with the contexts of agents sitting in tool
calls or think gaps, and the held session waits until one of them *ends*, for
minutes and up to the client's patience.

An idle agent's context is only a prefix cache in vLLM: its blocks were freed
when its last request ended (docs/control-law.md, point 14). Reassigning the
agent costs one re-prefill of its context where it goes, at its next request,
and nothing before. So :func:`make_room` reassigns idle agents from one instance
to others that admit them (Eq. 13, as any move does) until the held agent fits
there, and admits the held agent on it. The plan is all or nothing, and the one
with the fewest moves wins. Holding is left for when the room is not there at
all.

The router (``router/admission.py``) and the simulator
(``simulator/fleet_admission.py``) call these functions with the same inputs after
every fleet-admission pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controllers.admission import (
    Activity,
    AdmissionRule,
    HeldAgent,
    InstanceGate,
    Move,
    activity,
    admit_in_order,
    admits_now,
    with_admitted,
)
from controllers.placement import PlacementPolicy, PlacementRequest


@dataclass(frozen=True, slots=True)
class IdleAgent:
    """An admitted agent between requests whose whole context counts on ``instance``."""

    agent_id: str
    instance: str
    context_tokens: int


def idle_agents(
    instance: str,
    agents: Iterable[tuple[str, int, bool, float | None]],
    now_s: float,
    idle_after_s: float,
    evictable_after_s: float | None,
) -> list[IdleAgent]:
    """The agents of ``instance`` that :func:`make_room` may move, over
    ``(agent_id, C_a, in_flight, last_active_s)``: idle by ``idle_after_s`` (no
    request in flight, none ended within it). An active agent is working; an
    evictable one (point 14) already holds no room in admission, so moving it
    frees nothing. Callers leave out instances with a CPU KV tier, whose idle
    contexts need no room either (point 13)."""
    return [
        IdleAgent(agent_id, instance, tokens)
        for agent_id, tokens, in_flight, last in agents
        if tokens > 0
        and activity(in_flight, last, now_s, idle_after_s, evictable_after_s) is Activity.IDLE
    ]


def make_room(
    policy: PlacementPolicy,
    held: Sequence[HeldAgent],
    idle: Sequence[IdleAgent],
    gates: Sequence[InstanceGate],
    rule: AdmissionRule,
    sequence: int = 0,
) -> tuple[Move, ...]:
    """Moves that admit the first of ``held`` (global arrival order) for which room
    can be made, by moving idle agents off one instance.

    Returns the idle agents' moves, then the held agent's own (from its hold
    instance to the instance room was made on, which may be the same); () when no
    held agent can be admitted so. Call it after
    :func:`~controllers.admission.rehome_held`, with the agents that still wait:
    it never plans for an agent some instance admits as it is.

    An instance room is made on must do admission control, know its capacity, not
    defer, and hold nobody but the agent itself (its queue is its own). Each idle
    agent moves, largest first, to where ``policy`` prefers among the other
    instances that admit it now (nobody held there but the agent leaving it, Eq. 13
    on top of the moves already planned); the moves stop once Eq. 13 admits the
    held agent. Of the
    instances where that succeeds, the fewest moves (then the fewest tokens
    moved) wins.
    """
    if not rule.enabled:
        return ()
    for agent in held:
        if any(
            admits_now(g, agent.context_tokens, rule)
            for g in gates
            if g.load.name != agent.instance
        ):
            continue  # fleet admission's case (rehome_held): it runs without anyone moving
        plans = [
            plan
            for gate in gates
            if (plan := _plan_on(policy, agent, gate, idle, gates, rule, sequence)) is not None
        ]
        if plans:  # fewest moves, then fewest tokens moved; the first of equals
            return min(plans, key=lambda plan: (len(plan[0]), plan[1]))[0]
    return ()


def _plan_on(
    policy: PlacementPolicy,
    agent: HeldAgent,
    gate: InstanceGate,
    idle: Sequence[IdleAgent],
    gates: Sequence[InstanceGate],
    rule: AdmissionRule,
    sequence: int,
) -> tuple[tuple[Move, ...], int] | None:
    """The moves that admit ``agent`` on ``gate``'s instance, and the tokens they
    move; None when no moves would."""
    name = gate.load.name
    cap = gate.load.capacity_tokens
    own = name == agent.instance
    rule_here = gate.rule_here(rule)
    if agent.context_tokens <= 0 or not rule_here.enabled or cap <= 0 or gate.defer:
        return None
    if gate.held > (1 if own else 0):
        return None
    usage = gate.admission_usage_tokens
    if _admits(agent.context_tokens, usage, cap, rule_here):
        return None  # fleet admission's case (rehome_held), not ours
    others = {g.load.name: _leaving(g, agent) for g in gates if g.load.name != name}
    moves: list[Move] = []
    moved_tokens = 0
    here = sorted((a for a in idle if a.instance == name), key=lambda a: -a.context_tokens)
    for mover in here:
        size = mover.context_tokens
        open_now = [g for g in others.values() if admits_now(g, size, rule)]
        if not open_now:
            continue
        request = PlacementRequest(mover.agent_id, sequence + len(moves), size)
        target = policy.place(request, [g.load for g in open_now])
        moves.append(Move(mover.agent_id, name, target))
        others[target] = with_admitted(others[target], size)
        usage -= size
        moved_tokens += size
        if _admits(agent.context_tokens, usage, cap, rule_here):
            moves.append(Move(agent.agent_id, agent.instance, name))
            return tuple(moves), moved_tokens
    return None


def _leaving(gate: InstanceGate, agent: HeldAgent) -> InstanceGate:
    """``gate`` once ``agent``, held there, has left for the instance room is made on."""
    if gate.load.name != agent.instance or gate.held <= 0:
        return gate
    return dataclasses.replace(gate, held=gate.held - 1)


def _admits(size: int, usage: int, cap: int, rule: AdmissionRule) -> bool:
    return bool(admit_in_order((("", size),), max(0, usage), cap, rule)[0])
