"""Admission: who may run on an instance now, and who waits in its hold queue.

Three sources of admission, all with the same thresholds (Eq. 13 via
:meth:`controllers.KairosController.admissions`):

* **daemon** — the instance's ``kairosd`` posts versioned decisions; they are
  applied only in increasing ``(daemon_start_unix_s, epoch)`` order, and only to
  agents still pending, so a late or repeated decision never admits twice.
* **fast path** — a new agent arriving at an *empty* queue is checked against the
  same rule at once, so it is not delayed by a daemon epoch at low load (unless
  the daemon's latest decision says to defer admissions).
* **local** — while the daemon is absent or stale (its decision's validity has
  run out), the router runs the same rule itself whenever usage or the queue
  changes.

An instance whose capacity is unknown admits everything: no thrashing
avoidance is possible without ``U_max``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog

from controllers.kairos import KairosController
from controllers.types import InstanceSnapshot
from kairos_common.wire import AdmissionDecision, DecisionAck, InstanceState
from router.config import AdmissionSettings
from router.errors import HoldQueueFullError, HoldTimeoutError, NoBackendError
from router.hold_queue import HoldQueue
from router.instances import Instance, InstancePool
from router.ledger import Agent, Ledger
from router.metrics import RouterMetrics
from router.observations import ObservationLog

log = structlog.get_logger("kairos.router.admission")


class AdmissionService:
    def __init__(
        self,
        pool: InstancePool,
        ledger: Ledger,
        controller: KairosController,
        settings: AdmissionSettings,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        observations: ObservationLog | None = None,
    ) -> None:
        self.observations = observations or ObservationLog()
        self.pool = pool
        self.ledger = ledger
        self.controller = controller
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.queues: dict[str, HoldQueue] = {}
        self._watchers: list[asyncio.Future[None]] = []

    def queue(self, instance: str) -> HoldQueue:
        q = self.queues.get(instance)
        if q is None:
            q = self.queues[instance] = HoldQueue(
                self.settings.max_pending_agents, self.settings.retry_after_s
            )
        return q

    def _notify(self) -> None:
        """Wake :meth:`wait_until` callers (queue or admission state changed)."""
        if self._watchers:
            watchers, self._watchers = self._watchers, []
            for fut in watchers:
                if not fut.done():
                    fut.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait (bounded) until ``predicate()`` holds, re-checking on every hold-queue
        or admission change; lets tests and tools synchronise without sleeping."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while not predicate():
                fut = loop.create_future()
                self._watchers.append(fut)
                await fut

    # -- the rule -----------------------------------------------------------------------

    def _rule_admits(self, inst: Instance, agents: Iterable[Agent]) -> tuple[str, ...]:
        agents = list(agents)
        cap = inst.capacity_tokens
        if not self.settings.enabled or not cap:
            return tuple(a.agent_id for a in agents)
        now = self.clock()
        if inst.daemon_fresh(now):
            if not inst.decision_admission_control:
                return tuple(a.agent_id for a in agents)  # e.g. a no-control daemon
            if inst.decision_defer:
                return ()
        usage = self.ledger.usage_tokens(inst.name)
        snapshot = InstanceSnapshot(
            now_s=now,
            epoch=0,
            capacity_tokens=cap,
            pending=tuple(self.ledger.view(a) for a in agents),
            usage_tokens=usage,
        )
        admitted, _ = self.controller.admissions(snapshot, usage)
        return admitted

    def _admit(self, agent: Agent, inst: Instance, source: str) -> None:
        now = self.clock()
        if agent.waiting_since_s is not None:
            agent.pending_s += max(0.0, now - agent.waiting_since_s)
        self.queue(inst.name).release(agent.agent_id)
        self.ledger.set_ongoing(agent, inst.name)
        self.metrics.admissions.labels(inst.name, source).inc()
        self._notify()

    # -- request path -------------------------------------------------------------------

    async def wait_admitted(self, agent: Agent, max_wait_s: float | None = None) -> float:
        """Return once ``agent`` is admitted on its instance; the seconds it waited.

        Raises 429 (queue full) or 503 (waited too long), both with Retry-After.
        """
        if agent.admitted:
            return 0.0
        inst = self.pool.get(agent.instance)
        if inst is None:
            raise NoBackendError("agent has no instance", retry_after_s=5.0)
        q = self.queue(inst.name)
        if agent.agent_id not in q and not len(q) and self._rule_admits(inst, (agent,)):
            self._admit(agent, inst, "fast_path")
            return 0.0
        start = self.clock()
        try:
            future = q.join(agent.agent_id)
        except HoldQueueFullError:
            self.metrics.hold_rejections.labels(inst.name, "queue_full").inc()
            raise
        self.ledger.set_pending(agent, inst.name, start)
        self._notify()
        self.pump(inst)
        timeout = self.settings.max_wait_s if max_wait_s is None else max_wait_s
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(future)
        except TimeoutError:
            self._give_up(agent)
            self.metrics.hold_rejections.labels(inst.name, "timeout").inc()
            raise HoldTimeoutError(
                f"agent was held {timeout:.0f}s waiting for admission; retry later",
                retry_after_s=self.settings.retry_after_s,
            ) from None
        except asyncio.CancelledError:
            self._give_up(agent)
            raise
        waited = self.clock() - start
        self.metrics.hold_wait.labels(agent.instance or inst.name).observe(waited)
        return waited

    def _give_up(self, agent: Agent) -> None:
        if agent.instance is not None and self.queue(agent.instance).leave(agent.agent_id):
            if agent.waiting_since_s is not None:
                agent.pending_s += max(0.0, self.clock() - agent.waiting_since_s)
            agent.waiting_since_s = None
            self._notify()

    # -- local fallback and daemon decisions -------------------------------------------

    def pump(self, inst: Instance) -> tuple[str, ...]:
        """Local same-rule admission while the daemon is absent or stale."""
        q = self.queues.get(inst.name)
        if not q or inst.daemon_fresh(self.clock()):
            return ()
        pending = [a for a in (self.ledger.get(i) for i in q.order()) if a is not None]
        admitted = self._rule_admits(inst, pending)
        for agent_id in admitted:
            agent = self.ledger.get(agent_id)
            if agent is not None:
                self._admit(agent, inst, "local")
        return admitted

    def pump_all(self) -> None:
        for inst in self.pool:
            if inst.eligible:
                self.pump(inst)

    def apply_decision(self, decision: AdmissionDecision) -> DecisionAck:
        inst = self.pool.resolve(decision.instance)
        key = decision.order_key
        if inst.decision_key is not None and key <= inst.decision_key:
            result = "duplicate" if key == inst.decision_key else "stale"
            self.metrics.decisions.labels(inst.name, result).inc()
            return DecisionAck(accepted=False, reason=f"{result} decision {key}")
        now = self.clock()
        inst.decision_key = key
        valid_s = self.settings.stale_after_s or decision.valid_for_s
        inst.decision_valid_until_s = now + valid_s
        inst.decision_defer = decision.defer_admissions
        inst.decision_admission_control = decision.admission_control
        inst.daemon_id = decision.daemon_id
        inst.clock_mhz = decision.clock_mhz
        inst.boost = decision.boost
        if decision.capacity_tokens:
            inst.daemon_capacity_tokens = decision.capacity_tokens
        q = self.queue(inst.name)
        admitted: list[str] = []
        for agent_id in decision.admit:
            agent = self.ledger.get(agent_id)
            if agent is None or agent_id not in q or agent.instance != inst.name:
                continue
            self._admit(agent, inst, "daemon")
            admitted.append(agent_id)
        self.metrics.decisions.labels(inst.name, "applied").inc()
        return DecisionAck(accepted=True, admitted=tuple(admitted))

    def state(self, inst: Instance) -> InstanceState:
        """The snapshot a daemon pulls: ongoing and pending (arrival order) agents."""
        ledger = self.ledger
        ongoing = [ledger.get(a) for a in sorted(ledger.ongoing_ids(inst.name))]
        q = self.queues.get(inst.name)
        pending = [ledger.get(a) for a in (q.order() if q else [])]
        return InstanceState(
            instance=inst.name,
            now_s=self.clock(),
            ongoing=tuple(ledger.view(a) for a in ongoing if a is not None),
            pending=tuple(ledger.view(a) for a in pending if a is not None),
            capacity_tokens=inst.capacity_tokens,
            healthy=inst.healthy,
            draining=inst.draining,
            observations=self.observations.recent(inst.name),
        )

    def remove_pending(self, agent: Agent) -> None:
        """An ending agent leaves its queue; its waiting requests fail with 503."""
        if agent.instance is None:
            return
        q = self.queues.get(agent.instance)
        if q is not None and agent.agent_id in q:
            for agent_id, held in q.take_all():
                if agent_id == agent.agent_id:
                    if not held.future.done():
                        held.future.set_exception(
                            HoldTimeoutError("agent ended while held", retry_after_s=1.0)
                        )
                else:
                    q.adopt(agent_id, held)
            self._notify()
