"""Placement (Algorithm 2 or ``confident``) and reassignment applied to live state.

The decisions themselves are the pure policies of :mod:`controllers.placement` and
:mod:`controllers.confident_placement`; this module only builds their inputs from
the pool and the ledger (eligible instances only: healthy and not draining) and
applies their outputs.

Reassignment is Algorithm 3 (:class:`ReassignmentRule`, reason ``imbalance``) for
every policy but ``confident``, which uses :class:`ConfidentReassignment` (reason
``pressure``): each move re-prefills the agent's whole context on the target (its
KV cache stays behind), so a move happens only when the source is under pressure,
the target has room, the expected relief outweighs the recompute, and the case
held for ``confirm`` checks. Its per-agent streaks are dropped when an agent
leaves the ledger or is placed anew. Before either, under every policy, overflow
relief (:func:`controllers.admission.overflow_target`, reason ``overflow``) moves
an agent whose request would not fit beside those running on its instance to one
with room.

An instance whose capacity is unknown (no daemon, no ``/metrics``, nothing
configured) is presented with capacity 0, which makes Algorithm 2 spread onto
the least-loaded instance: without a capacity the router cannot know it is safe
to consolidate (``confident`` never moves an agent off or onto such an instance).
"""

from __future__ import annotations

from collections.abc import Collection

import structlog

from controllers.admission import overflow_target, place
from controllers.confident_placement import ConfidentReassignment
from controllers.placement import (
    InstanceLoad,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentConfig,
    ReassignmentDecision,
    ReassignmentRule,
)
from router.admission import AdmissionService
from router.config import PlacementSettings
from router.errors import NoBackendError
from router.instances import Instance, InstancePool
from router.ledger import Agent, Ledger
from router.metrics import RouterMetrics

log = structlog.get_logger("kairos.router.placement")


class PlacementService:
    def __init__(
        self,
        pool: InstancePool,
        ledger: Ledger,
        policy: PlacementPolicy,
        rule: ReassignmentRule,
        metrics: RouterMetrics,
        admission: AdmissionService,
        confident: ConfidentReassignment | None = None,
    ) -> None:
        """``confident``, when given, replaces ``rule`` for reassignment;
        ``admission`` tells which instances would admit a newcomer now."""
        self.admission = admission
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.rule = rule
        self.confident = confident
        self.metrics = metrics
        self._sequence = 0
        if confident is not None:
            ledger.on_remove.append(confident.forget)
            ledger.on_move.append(confident.forget)  # room moves, overflow relief, fleet moves

    @classmethod
    def from_settings(
        cls,
        settings: PlacementSettings,
        pool: InstancePool,
        ledger: Ledger,
        metrics: RouterMetrics,
        admission: AdmissionService,
    ) -> PlacementService:
        """The service ``[placement]`` describes (same policy names as the simulator)."""
        confident = None
        if settings.policy == "confident" and settings.reassign:
            confident = ConfidentReassignment(settings.confident_reassignment())
        rule = ReassignmentRule(
            ReassignmentConfig(
                enabled=settings.reassign,
                interval_requests=settings.reassign_interval_requests,
                rho=settings.rho,
            )
        )
        policy = admission.policy
        return cls(pool, ledger, policy, rule, metrics, admission, confident)

    @property
    def interval_requests(self) -> int:
        if self.confident is not None:
            return self.confident.config.interval_requests
        return self.rule.config.interval_requests

    def loads(self, exclude: Collection[str] = ()) -> list[InstanceLoad]:
        """Inputs of the policies: eligible instances with their ``U_i`` and ``U_max``."""
        ledger = self.ledger
        return [
            ledger.load_of(i.name, i.index, i.capacity_tokens)
            for i in self.pool.eligible()
            if i.name not in exclude
        ]

    def choose(self, agent: Agent, exclude: Collection[str] = ()) -> Instance:
        """Place ``agent`` anew; raises :class:`NoBackendError` when nothing is eligible.

        Fleet admission (:func:`controllers.admission.place`): the policy's choice
        among instances that would admit the agent now, else overall (held there).
        """
        return self.choose_admitting(agent, exclude)[0]

    def choose_admitting(
        self, agent: Agent, exclude: Collection[str] = ()
    ) -> tuple[Instance, bool]:
        """:meth:`choose`, and whether the chosen instance admits the agent now (the
        rule has just been evaluated on it: the proxy's newcomer need not ask again)."""
        gates = self.admission.gates(exclude)
        if not gates:
            raise NoBackendError("no healthy backend instance is available", retry_after_s=5.0)
        request = PlacementRequest(
            agent_id=agent.agent_id,
            sequence=self._sequence,
            context_tokens=self.ledger.context_of(agent),
        )
        self._sequence += 1
        placement = place(self.policy, request, gates, self.admission.rule)
        inst = self.pool.get(placement.instance)
        assert inst is not None
        agent.steps_since_assign = 0
        if self.confident is not None:
            self.confident.forget(agent.agent_id)  # evidence about the old instance is void
        return inst, placement.admit_now

    def maybe_reassign(self, agent: Agent, request_tokens: int | None = None) -> str | None:
        """Reassignment on a request of an admitted agent; returns the new instance or None.

        ``request_tokens``: the context the request brings, which overflow relief
        must fit beside the running requests (default: the agent's ``C_a``); the
        proxy passes its conversation's (:meth:`Ledger.cached_tokens`)."""
        agent.steps_since_assign += 1
        current = agent.instance
        if current is None or not agent.admitted:
            return None
        if not self.rule.config.enabled:
            return None
        relief = self._overflow_target(agent, current, request_tokens)
        if relief is not None:
            decision, reason = ReassignmentDecision(target=relief, reset_counter=True), "overflow"
        elif agent.steps_since_assign < self.interval_requests:
            return None  # the rule would not act: skip building every instance's load
        else:
            decision, reason = self._decide(agent, current)
        if decision.reset_counter:
            agent.steps_since_assign = 0
        if decision.target is None or decision.target == current:
            return None
        self.ledger.set_ongoing(agent, decision.target)
        self.metrics.reassignments.labels(current, decision.target, reason).inc()
        log.info(
            "agent_reassigned",
            agent=agent.agent_id,
            source=current,
            target=decision.target,
            reason=reason,
        )
        return decision.target

    def _overflow_target(
        self, agent: Agent, current: str, request_tokens: int | None = None
    ) -> str | None:
        """Overflow relief (:func:`controllers.admission.overflow_target`): the
        agent's request would not fit beside those running on ``current``."""
        if self.admission.overcommitted(current) is None:
            return None  # the common case: nothing more to read
        ledger = self.ledger
        return overflow_target(
            agent.agent_id,
            current,
            ledger.context_of(agent) if request_tokens is None else request_tokens,
            ledger.running_tokens(current, agent),
            self.admission.gates(),
            self.admission.rule,
        )

    def _decide(self, agent: Agent, current: str) -> tuple[ReassignmentDecision, str]:
        context = self.ledger.context_of(agent)
        if self.confident is None:
            decision = self.rule.decide(
                current, agent.steps_since_assign, self.loads(), context_tokens=context
            )
            return decision, "imbalance"
        decision = self.confident.decide_agent(
            current,
            agent.steps_since_assign,
            self.loads(),
            agent_id=agent.agent_id,
            context_tokens=context,
            completed_steps=agent.turns,
        )
        return decision, "pressure"
