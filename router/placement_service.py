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
leaves the ledger or is placed anew.

An instance whose capacity is unknown (no daemon, no ``/metrics``, nothing
configured) is presented with capacity 0, which makes Algorithm 2 spread onto
the least-loaded instance: without a capacity the router cannot know it is safe
to consolidate (``confident`` never moves an agent off or onto such an instance).
"""

from __future__ import annotations

from collections.abc import Collection

import structlog

from controllers.confident_placement import ConfidentReassignment
from controllers.placement import (
    InstanceLoad,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentConfig,
    ReassignmentDecision,
    ReassignmentRule,
)
from controllers.registry import make_placement_policy
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
        confident: ConfidentReassignment | None = None,
    ) -> None:
        """``confident``, when given, replaces ``rule`` for reassignment."""
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.rule = rule
        self.confident = confident
        self.metrics = metrics
        self._sequence = 0
        if confident is not None:
            ledger.on_remove.append(confident.forget)

    @classmethod
    def from_settings(
        cls,
        settings: PlacementSettings,
        pool: InstancePool,
        ledger: Ledger,
        metrics: RouterMetrics,
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
        policy = make_placement_policy(settings.policy, settings.theta_cons)
        return cls(pool, ledger, policy, rule, metrics, confident)

    @property
    def interval_requests(self) -> int:
        if self.confident is not None:
            return self.confident.config.interval_requests
        return self.rule.config.interval_requests

    def loads(self, exclude: Collection[str] = ()) -> list[InstanceLoad]:
        """Inputs of the policies: eligible instances with their ``U_i`` and ``U_max``."""
        out = []
        for inst in self.pool.eligible():
            if inst.name in exclude:
                continue
            ongoing = self.ledger.ongoing_ids(inst.name)
            out.append(
                InstanceLoad(
                    name=inst.name,
                    index=inst.index,
                    usage_tokens=self.ledger.usage_tokens(inst.name),
                    capacity_tokens=inst.capacity_tokens or 0,
                    active=bool(ongoing),
                )
            )
        return out

    def choose(self, agent: Agent, exclude: Collection[str] = ()) -> Instance:
        """Place ``agent`` anew; raises :class:`NoBackendError` when nothing is eligible."""
        candidates = self.loads(exclude)
        if not candidates:
            raise NoBackendError("no healthy backend instance is available", retry_after_s=5.0)
        request = PlacementRequest(
            agent_id=agent.agent_id,
            sequence=self._sequence,
            context_tokens=self.ledger.context_of(agent),
        )
        self._sequence += 1
        name = self.policy.place(request, candidates)
        inst = self.pool.get(name)
        assert inst is not None
        agent.steps_since_assign = 0
        if self.confident is not None:
            self.confident.forget(agent.agent_id)  # evidence about the old instance is void
        return inst

    def maybe_reassign(self, agent: Agent) -> str | None:
        """Reassignment on a request of an admitted agent; returns the new instance or None."""
        agent.steps_since_assign += 1
        current = agent.instance
        if current is None or not agent.admitted:
            return None
        if not self.rule.config.enabled or agent.steps_since_assign < self.interval_requests:
            return None  # the rule would not act: skip building every instance's load
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

    def _decide(self, agent: Agent, current: str) -> tuple[ReassignmentDecision, str]:
        if self.confident is None:
            return self.rule.decide(current, agent.steps_since_assign, self.loads()), "imbalance"
        decision = self.confident.decide_agent(
            current,
            agent.steps_since_assign,
            self.loads(),
            agent_id=agent.agent_id,
            context_tokens=self.ledger.context_of(agent),
            completed_steps=agent.turns,
        )
        return decision, "pressure"
