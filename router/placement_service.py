"""Placement (Algorithm 2) and reassignment (Algorithm 3) applied to live state.

The decisions themselves are the pure policies of :mod:`controllers.placement`;
this module only builds their inputs from the pool and the ledger (eligible
instances only: healthy and not draining) and applies their outputs.

An instance whose capacity is unknown (no daemon, no ``/metrics``, nothing
configured) is presented with capacity 0, which makes Algorithm 2 spread onto
the least-loaded instance: without a capacity the router cannot know it is safe
to consolidate.
"""

from __future__ import annotations

from collections.abc import Collection

import structlog

from controllers.placement import (
    InstanceLoad,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentRule,
)
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
    ) -> None:
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.rule = rule
        self.metrics = metrics
        self._sequence = 0

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
        """Algorithm 2 for ``agent``; raises :class:`NoBackendError` when nothing is eligible."""
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
        return inst

    def maybe_reassign(self, agent: Agent) -> str | None:
        """Algorithm 3 on a request of an admitted agent; returns the new instance or None."""
        agent.steps_since_assign += 1
        current = agent.instance
        if current is None or not agent.admitted:
            return None
        cfg = self.rule.config
        if not cfg.enabled or agent.steps_since_assign < cfg.interval_requests:
            return None  # the rule would not act: skip building every instance's load
        decision = self.rule.decide(current, agent.steps_since_assign, self.loads())
        if decision.reset_counter:
            agent.steps_since_assign = 0
        if decision.target is None or decision.target == current:
            return None
        self.ledger.set_ongoing(agent, decision.target)
        self.metrics.reassignments.labels(current, decision.target, "imbalance").inc()
        log.info("agent_reassigned", agent=agent.agent_id, source=current, target=decision.target)
        return decision.target
