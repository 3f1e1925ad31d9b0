"""Fleet admission in the simulator: which instance each agent is admitted on.

:class:`~simulator.cluster.Cluster` runs the closed loop (events, turns, epochs);
this module is the part of the router it replays across the fleet — the
router's ``AdmissionService`` and overflow relief — kept apart so that each can
be read, and checked against the router (``tests/simulator/test_admission_parity.py``),
on its own:

* a newcomer's placement and fast path (:func:`controllers.admission.place`);
* held agents that another instance admits now move there (fleet admission,
  docs/control-law.md point 8), then idle agents move to make room for one still
  held (point 15, :func:`controllers.room.make_room`);
* overflow relief (point 10) and holding a request that would overflow its
  instance (point 16);
* client patience: held sessions whose clients have stopped retrying.

Every decision calls the same :mod:`controllers` function as the router, with
the same inputs, so a simulated result describes the router's behaviour.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from controllers import (
    AdmissionRule,
    InstanceLoad,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentConfig,
    room,
)
from controllers import admission as law
from controllers.admission import HeldAgent, InstanceGate, Move, Placement
from simulator.agents import SimAgent
from simulator.instance import SimInstance

Admit = Callable[[SimInstance, SimAgent, float], None]
"""The cluster's admission of an agent on an instance at ``t`` (its held request goes out)."""


class FleetAdmission:
    """Who is admitted where across the cluster's instances, as the router decides it."""

    def __init__(
        self,
        instances: list[SimInstance],
        placement: PlacementPolicy,
        rule: AdmissionRule,
        reassignment: ReassignmentConfig,
        client_patience_s: float | None,
        admit: Admit,
    ) -> None:
        self.instances = instances
        self.names = [inst.name for inst in instances]
        self.placement = placement
        self.rule = rule
        """The fleet's admission rule, the policy's (the router's from its ``policy``)."""
        self.reassignment = reassignment
        self.client_patience_s = client_patience_s
        self._admit = admit
        self.placements = 0
        """Placements and moves so far: each one's number, as the router counts them."""
        self.held_moves = 0
        """Held agents admitted on another instance (fleet admission)."""
        self.room_moves = 0
        """Idle agents moved to make room for a held one (controllers/room.py)."""
        self.overflow_holds = 0
        """Requests held back because they would overflow their instance (point 16)."""
        self.on_move: Callable[[str], None] | None = None
        """Called with an agent's id when it runs on another instance from now (the
        router's ``Ledger.on_move``): confident placement drops its streak."""

    def instance(self, name: str) -> SimInstance:
        return self.instances[self.names.index(name)]

    def loads(self) -> list[InstanceLoad]:
        cap = self.instances[0].engine.capacity_tokens if self.instances else 0
        return [inst.load(cap) for inst in self.instances]

    def gates(self, t: float) -> list[InstanceGate]:
        """What fleet admission sees of each instance at ``t`` (as the router builds it)."""
        return [self.gate(inst, t) for inst in self.instances]

    def gate(self, inst: SimInstance, t: float) -> InstanceGate:
        """What fleet admission sees of ``inst`` at ``t`` (``AdmissionService.gate``)."""
        rule = inst.controller.rule
        resident, evictable = inst.admission_tokens(t, rule)
        return InstanceGate(
            inst.load(self.instances[0].engine.capacity_tokens),
            held=len(inst.pending),
            defer=inst.decision is not None and inst.decision.defer_admissions,
            resident_tokens=resident,
            evictable_tokens=evictable,
            rule=rule,
        )

    def place(self, agent_id: str, size: int, t: float) -> Placement:
        """A newcomer's instance, and whether it is admitted there at once."""
        request = PlacementRequest(agent_id, self.placements, size)
        self.placements += 1
        return law.place(self.placement, request, self.gates(t), self.rule)

    def rehome_held(self, t: float) -> tuple[Move, ...]:
        """Held agents another instance admits now move there (fleet admission);
        then, if some still wait, idle agents move to make room for one. The moves,
        as the router's ``AdmissionService.rehome`` returns them."""
        for inst in self.instances:  # a loop, not any(genexpr): runs at every completion
            if inst.pending:
                break
        else:
            return ()
        held = sorted(
            ((a.arrival_s, a) for inst in self.instances for a in inst.pending),
            key=lambda pair: pair[0],
        )
        views = [HeldAgent(a.agent_id, self.names[a.instance], a.usage_tokens()) for _, a in held]
        moves = law.rehome_held(self.placement, views, self.gates(t), self.rule, self.placements)
        by_id = {a.agent_id: a for _, a in held}
        for move in moves:
            self._admit_held(by_id[move.agent_id], move.target, t)
            self.held_moves += 1
        self.placements += len(moves)
        moved = {m.agent_id for m in moves}
        still = [view for view in views if view.agent_id not in moved]
        return moves + (self._make_room(t, still, by_id) if still else ())

    def _admit_held(self, agent: SimAgent, target_name: str, t: float) -> None:
        self.instances[agent.instance].pending.remove(agent)
        target = self.instance(target_name)
        if target.index != agent.instance:
            agent.instance = target.index
            agent.instances.append(target.index)
            self._moved(agent.agent_id)
        self._admit(target, agent, t)

    def _make_room(
        self, t: float, held: list[HeldAgent], by_id: dict[str, SimAgent]
    ) -> tuple[Move, ...]:
        """Idle agents move so that a held one is admitted (:func:`controllers.room.make_room`)."""
        idle = [a for inst in self.instances for a in inst.idle_agents(t, inst.controller.rule)]
        if not idle:
            return ()
        moves = room.make_room(
            self.placement, held, idle, self.gates(t), self.rule, self.placements
        )
        if not moves:
            return ()
        *movers, admitted = moves
        for move in movers:
            source = self.instance(move.source)
            agent = source.ongoing[move.agent_id]
            self.move_admitted(agent, source, move.target)
            agent.steps_since_assignment = 0
            self.room_moves += 1
        self._admit_held(by_id[admitted.agent_id], admitted.target, t)
        self.placements += len(moves)
        return moves

    def move_admitted(self, agent: SimAgent, source: SimInstance, target_name: str) -> SimInstance:
        """Reassign an admitted agent: its context counts on ``target_name`` from now;
        its next request goes there (and re-prefills: the cache stays behind)."""
        target = self.instance(target_name)
        source.leave(agent.agent_id)
        target.join(agent)
        agent.instance = target.index
        agent.instances.append(target.index)
        self._moved(agent.agent_id)
        return target

    def _moved(self, agent_id: str) -> None:
        if self.on_move is not None:
            self.on_move(agent_id)

    def overflow_target(self, inst: SimInstance, agent: SimAgent, t: float) -> str | None:
        """The router's overflow relief (:func:`controllers.admission.overflow_target`)."""
        if not self.reassignment.enabled:
            return None
        if not inst.overcommitted:
            return None  # the common case, without building every instance's gate
        return law.overflow_target(
            agent.agent_id,
            inst.name,
            agent.usage_tokens(),
            inst.running_tokens(agent),
            self.gates(t),
            self.rule,
        )

    def hold_overflow(self, inst: SimInstance, agent: SimAgent, t: float) -> bool:
        """Point 16 (:func:`controllers.admission.holds_overflow`): the agent's request
        would overflow ``inst`` beside the running ones, so the agent leaves it and
        waits in its hold queue, to be admitted again as a newcomer is."""
        if not inst.overcommitted:
            return False  # the common case, as in overflow_target
        running = inst.running_tokens(agent)
        if not law.holds_overflow(agent.usage_tokens(), running, self.gate(inst, t), self.rule):
            return False
        inst.leave(agent.agent_id)
        agent.admitted, agent.held, agent.waiting_since_s = False, True, t
        # Its place in line is its arrival, as the router's (ahead of later newcomers).
        bisect.insort(inst.pending, agent, key=lambda a: a.arrival_s)
        self.overflow_holds += 1
        return True

    def drop_impatient(self, t: float) -> list[SimAgent]:
        """Held sessions whose clients have stopped retrying leave their hold queues.

        The simulator would otherwise hold a session for as long as it takes, while
        in production its client gives up after ``client_patience_s``: the session
        fails (the cluster records it with ``end_reason`` ``gave-up``; metrics count
        it as an SLO miss, not as a finished session). Checked once an epoch; returns
        the sessions that gave up, their time held counted.
        """
        patience = self.client_patience_s
        if patience is None:
            return []
        gave_up = []
        for inst in self.instances:
            for agent in [a for a in inst.pending if t - a.waiting_since_s >= patience]:
                inst.pending.remove(agent)
                agent.pending_s += t - agent.waiting_since_s
                gave_up.append(agent)
        return gave_up
