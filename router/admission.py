"""Admission: who may run on an instance now, and who waits in its hold queue.

The rule is pure and shared with the simulator (:mod:`controllers.admission`):
Eq. 13 per instance, and fleet admission on top — a newcomer is placed where it
is admitted now if any instance would (``PlacementService.choose``), and a held
agent moves to any instance that would admit it now (:meth:`AdmissionService.rehome`,
after every daemon decision and maintenance round; admission source ``fleet``).
Holding is for when no instance has room.

Five sources of admission, all with the same rule per instance: the one its
daemon's decision carries (its policy's whole :class:`~kairos_common.views.AdmissionRule`)
while it is fresh, else the rule of the router's ``policy``:

* **daemon** — the instance's ``kairosd`` posts versioned decisions; they are
  applied only in increasing ``(daemon_start_unix_s, epoch)`` order, and only to
  agents still pending, so a late or repeated decision never admits twice.
* **fast path** — a new agent arriving at an *empty* queue is checked against the
  same rule at once, so it is not delayed by a daemon epoch at low load (unless
  the daemon's latest decision says to defer admissions).
* **local** — while the daemon is absent or stale (its decision's validity has
  run out), the router runs the same rule itself whenever usage or the queue
  changes.
* **fleet** — a held agent another instance admits now moves there.
* **room** — when agents are still held, idle agents move off one instance to
  others that admit them, so that the longest-held agent that fits that way is
  admitted there (:meth:`AdmissionService.make_room`, :mod:`controllers.room`).

An admitted agent can also go back to the hold queue: when its request would
overflow the instance's KV cache beside the running ones and no other instance
has room for it (:meth:`AdmissionService.hold_overflow`, point 16), it waits and
is admitted again by these same sources.

An instance whose capacity is unknown admits everything: no thrashing
avoidance is possible without ``U_max``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable

import structlog

from controllers.admission import (
    AdmissionRule,
    HeldAgent,
    InstanceGate,
    Move,
    admission_tokens,
    admit_in_order,
    admits_now,
    holds_overflow,
    new_agent_tokens,
    rehome_held,
)
from controllers.placement import Consolidating, PlacementPolicy
from controllers.room import IdleAgent, idle_agents, make_room
from kairos_common.wire import AdmissionDecision, DecisionAck, InstanceState
from router.config import AdmissionSettings
from router.errors import HoldQueueFullError, HoldTimeoutError, NoBackendError
from router.hold_queue import HoldQueue
from router.instances import Instance, InstancePool
from router.ledger import Agent, Ledger
from router.metrics import RouterMetrics
from router.observations import ObservationLog
from router.token_ratio import BytesPerToken

log = structlog.get_logger("kairos.router.admission")


class AdmissionService:
    def __init__(
        self,
        pool: InstancePool,
        ledger: Ledger,
        rule: AdmissionRule,
        settings: AdmissionSettings,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        observations: ObservationLog | None = None,
        policy: PlacementPolicy | None = None,
        body_tokens: BytesPerToken | None = None,
    ) -> None:
        """``rule`` is the fleet's: the rule of the router's ``policy``, which applies
        on an instance whose daemon is stale or absent; ``policy`` places held
        agents that move (the router's placement policy)."""
        self.observations = observations or ObservationLog()
        self.policy: PlacementPolicy = policy or Consolidating()
        self.rule = rule
        self._moves = 0
        self.pool = pool
        self.ledger = ledger
        self.settings = settings
        self.body_tokens = body_tokens or BytesPerToken()
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

    def gate(self, inst: Instance) -> InstanceGate:
        """What fleet admission sees of ``inst``: while its daemon's latest decision
        is valid, that decision's rule (its policy's, whole), its defer and the CPU
        KV tier it read; else the fleet's rule over every context."""
        now = self.clock()
        rule = inst.decision_rule if inst.daemon_fresh(now) else None
        q = self.queues.get(inst.name)
        resident, evictable = (None, 0) if rule is None else self._admission_tokens(inst, rule, now)
        return InstanceGate(
            self.ledger.load_of(inst.name, inst.index, inst.capacity_tokens),
            held=len(q) if q else 0,
            defer=rule is not None and inst.decision_defer,
            resident_tokens=resident,
            evictable_tokens=evictable,
            rule=rule,
        )

    def _admission_tokens(
        self, inst: Instance, rule: AdmissionRule, now_s: float
    ) -> tuple[int | None, int]:
        """``(resident, evictable)`` by the daemon's rule (docs/control-law.md,
        points 13–14): ``U`` less the evictable contexts and the idle ones the
        instance's CPU KV tier holds (None when that rule counts every context),
        and the evictable contexts alone. Only while the daemon is fresh: a stale
        one may describe a vLLM since restarted, and the local fallback then holds
        by the fleet's rule over every context."""
        ledger = self.ledger
        weighed = admission_tokens(
            (
                (ledger.context_of(a), a.in_flight > 0, a.last_active_s)
                for a in ledger.ongoing(inst.name)
            ),
            now_s,
            rule.idle_after_s,
            rule.evictable_after_s,
            inst.decision_offload_tokens if rule.offload_aware else 0,
        )
        return (None, 0) if weighed is None else weighed

    def gates(self, exclude: Collection[str] = ()) -> list[InstanceGate]:
        """Gates of every eligible (healthy, not draining) instance."""
        return [self.gate(i) for i in self.pool.eligible() if i.name not in exclude]

    def estimate_tokens(self, body_bytes: int) -> int:
        """A newcomer's size from its first request body (bytes a token learned
        from earlier agents' first requests, :mod:`router.token_ratio`), bounded by
        the model's length, else by the largest known KV capacity: a padded body
        must not size an agent beyond what vLLM would ever hold."""
        limit = self.settings.max_model_len_tokens or self.pool.max_capacity_tokens()
        tokens = self.body_tokens.tokens(body_bytes)
        return new_agent_tokens(tokens, self.ledger.placeholder_tokens, limit)

    def _rule_admits(self, inst: Instance, agents: Iterable[Agent]) -> tuple[str, ...]:
        agents = list(agents)
        gate = self.gate(inst)
        cap = gate.load.capacity_tokens
        rule = gate.rule_here(self.rule)
        if not rule.enabled or not cap:
            return tuple(a.agent_id for a in agents)
        if gate.defer:
            return ()
        sizes = ((a.agent_id, self.ledger.context_of(a)) for a in agents)
        admitted, _ = admit_in_order(sizes, gate.admission_usage_tokens, cap, rule)
        return admitted

    def rehome(self) -> tuple[Move, ...]:
        """Fleet admission: held agents another instance admits now move there."""
        if not any(self.queues.values()):
            return ()
        held: list[tuple[float, HeldAgent]] = []
        for name, q in self.queues.items():
            for agent_id, since in q.places():
                agent = self.ledger.get(agent_id)
                if agent is not None and agent.instance == name:
                    size = self.ledger.context_of(agent)
                    held.append((since, HeldAgent(agent_id, name, size)))
        if not held:
            return ()
        held.sort(key=lambda pair: pair[0])
        views = [h for _, h in held]
        moves = rehome_held(self.policy, views, self.gates(), self.rule, self._moves)
        self._moves += len(moves)
        for move in moves:
            agent = self.ledger.get(move.agent_id)
            target = self.pool.get(move.target)
            if agent is not None and target is not None:
                self._admit(agent, target, "fleet", queue=move.source)
                log.info("held_agent_moved", agent=agent.agent_id, source=move.source,
                         target=move.target)  # fmt: skip
        moved = {m.agent_id for m in moves}
        still = [h for h in views if h.agent_id not in moved]
        return moves + (self.make_room(still) if still else ())

    def make_room(self, held: list[HeldAgent]) -> tuple[Move, ...]:
        """Move idle agents so that a held one is admitted (:func:`controllers.room.make_room`;
        docs/control-law.md, point 15): the moved agents' next requests go to their
        new instance, the held agent is admitted with source ``room``."""
        now = self.clock()
        idle = [a for inst in self.pool.eligible() for a in self._idle_agents(inst, now)]
        if not idle:
            return ()
        moves = make_room(self.policy, held, idle, self.gates(), self.rule, self._moves)
        if not moves:
            return ()
        self._moves += len(moves)
        *movers, admitted = moves
        for move in movers:
            agent = self.ledger.get(move.agent_id)
            assert agent is not None and not agent.in_flight  # listed idle in this same pass
            self.ledger.set_ongoing(agent, move.target)
            agent.steps_since_assign = 0
            self.metrics.reassignments.labels(move.source, move.target, "room").inc()
            log.info("agent_moved_for_room", agent=agent.agent_id, source=move.source,
                     target=move.target, held_agent=admitted.agent_id)  # fmt: skip
        agent = self.ledger.get(admitted.agent_id)
        target = self.pool.get(admitted.target)
        if agent is not None and target is not None:
            self._admit(agent, target, "room", queue=admitted.source)
        return moves

    def _idle_agents(self, inst: Instance, now_s: float) -> list[IdleAgent]:
        """``inst``'s agents that making room may move, by its daemon's windows (the
        paper's, counting every context, while the daemon is stale); none on an
        instance whose CPU KV tier the daemon counts on (idle contexts need no room)."""
        fresh = inst.daemon_fresh(now_s)
        if fresh and inst.decision_offload_tokens > 0:
            return []
        rule = inst.decision_rule or self.rule
        ledger = self.ledger
        return idle_agents(
            inst.name,
            (
                (a.agent_id, ledger.context_of(a), a.in_flight > 0, a.last_active_s)
                for a in ledger.ongoing(inst.name)
            ),
            now_s,
            rule.idle_after_s,
            rule.evictable_after_s if fresh else None,
        )

    def _admit(
        self, agent: Agent, inst: Instance, source: str, *, queue: str | None = None
    ) -> None:
        """Admit ``agent`` on ``inst``, waking its held requests in ``queue``
        (its own instance's hold queue unless it moves from another one)."""
        now = self.clock()
        if agent.waiting_since_s is not None:
            agent.pending_s += max(0.0, now - agent.waiting_since_s)
        agent.queue_since_s = agent.gave_up_s = None
        self.queue(queue or inst.name).release(agent.agent_id)
        self.ledger.set_ongoing(agent, inst.name)
        self.metrics.admissions.labels(inst.name, source).inc()
        self._notify()

    # -- request path -------------------------------------------------------------------

    def admit_placed(self, agent: Agent, inst: Instance) -> None:
        """Admit a newcomer that fleet admission placed on ``inst`` as admitted now."""
        self._admit(agent, inst, "fast_path")

    def overcommitted(self, name: str) -> Instance | None:
        """Instance ``name`` if its ``U`` is past its known ``U_max``, else None: only
        then can a request not fit beside the running ones (overflow relief, point
        10; holding back, point 16), so the common case reads no other agent."""
        inst = self.pool.get(name)
        if inst is None or not inst.capacity_tokens:
            return None
        return inst if self.ledger.usage_tokens(name) > inst.capacity_tokens else None

    def hold_overflow(self, agent: Agent, request_tokens: int | None = None) -> bool:
        """Point 16 (:func:`controllers.admission.holds_overflow`): on a request of an
        admitted agent, after placement's overflow relief found it no other instance,
        whether the request would overflow the instance's KV cache beside the running
        ones; if so the agent goes back to the hold queue (its context stops counting)
        and the request waits for admission as a newcomer's does. Only the agent's
        sole request in flight: one beside another of its own is already running.
        ``request_tokens``: the context the request brings (default: the agent's
        ``C_a``; the proxy passes its conversation's)."""
        name = agent.instance
        if not agent.admitted or name is None or agent.in_flight != 1:
            return False
        inst = self.overcommitted(name)
        if inst is None:
            return False  # the common case: nothing more to read
        ledger = self.ledger
        context = ledger.context_of(agent) if request_tokens is None else request_tokens
        running = ledger.running_tokens(name, agent)
        if not holds_overflow(context, running, self.gate(inst), self.rule):
            return False
        now = self.clock()
        ledger.set_pending(agent, name, now)
        # Its place in line is its arrival (ahead of newcomers that came after it),
        # taken as a retry within the grace takes its old place (_place_in_line).
        agent.queue_since_s, agent.gave_up_s = agent.arrival_s, now
        self.metrics.overflow_holds.labels(name).inc()
        log.info(
            "agent_held_overflow",
            agent=agent.agent_id,
            instance=name,
            context_tokens=context,
            running_tokens=running,
            capacity_tokens=inst.capacity_tokens,
        )
        self._notify()
        return True

    def admit_now(self, agent: Agent) -> bool:
        """The fast path: whether ``agent`` is admitted, admitting it at once when no
        one of its own is held and the rule admits it now. Synchronous, so a request
        that needs no wait costs no task and no extra turn of the event loop."""
        if agent.admitted:
            return True
        inst = self.pool.get(agent.instance)
        if inst is None:
            return False
        q = self.queues.get(inst.name)
        if (q is None or agent.agent_id not in q) and admits_now(
            self.gate(inst), self.ledger.context_of(agent), self.rule
        ):
            self._admit(agent, inst, "fast_path")
            return True
        return False

    async def wait_admitted(self, agent: Agent, max_wait_s: float | None = None) -> float:
        """Return once ``agent`` is admitted on its instance; the seconds it waited.

        Raises 429 (queue full) or 503 (waited too long), both with Retry-After.
        """
        if self.admit_now(agent):
            return 0.0
        inst = self.pool.get(agent.instance)
        if inst is None:
            raise NoBackendError("agent has no instance", retry_after_s=5.0)
        q = self.queue(inst.name)
        start = self.clock()
        since = self._place_in_line(agent, q, start)
        try:
            future = q.join(agent.agent_id, since)
        except HoldQueueFullError:
            self.metrics.hold_rejections.labels(inst.name, "queue_full").inc()
            raise
        self.ledger.set_pending(agent, inst.name, start)
        agent.queue_since_s, agent.gave_up_s = since, None
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

    def _place_in_line(self, agent: Agent, q: HoldQueue, now_s: float) -> float:
        """Where ``agent`` queues: its old place if its last waiting request gave up
        less than ``requeue_grace_s`` ago (a client retrying a 503 or a dropped
        connection), else now. Without it a session held past ``max_wait_s`` went
        to the back at every retry, behind everyone who arrived after it."""
        since = agent.queue_since_s
        if since is None:
            return now_s
        if agent.agent_id in q:
            return since  # another request of an agent already in line
        if agent.gave_up_s is not None and now_s - agent.gave_up_s <= self.settings.requeue_grace_s:
            return since
        return now_s

    def _give_up(self, agent: Agent) -> None:
        if agent.instance is not None and self.queue(agent.instance).leave(agent.agent_id):
            now = self.clock()
            if agent.waiting_since_s is not None:
                agent.pending_s += max(0.0, now - agent.waiting_since_s)
            agent.waiting_since_s = None
            agent.gave_up_s = now  # queue_since_s kept: a prompt retry keeps its place
            self._notify()

    # -- local fallback and daemon decisions -------------------------------------------

    def pump(self, inst: Instance) -> tuple[str, ...]:
        """Local same-rule admission while the daemon is absent or stale, then
        fleet admission (usage or a queue changed: a held agent may fit elsewhere)."""
        q = self.queues.get(inst.name)
        admitted: tuple[str, ...] = ()
        if q and not inst.daemon_fresh(self.clock()):
            pending = [a for a in (self.ledger.get(i) for i in q.order()) if a is not None]
            admitted = self._rule_admits(inst, pending)
            for agent_id in admitted:
                agent = self.ledger.get(agent_id)
                if agent is not None:
                    self._admit(agent, inst, "local")
        self.rehome()
        self._notify()  # usage changed (an agent ended or a request completed)
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
        adm = decision.admission
        inst.decision_defer = adm.defer
        inst.decision_rule = adm.rule
        inst.decision_offload_tokens = adm.offload_tokens
        inst.daemon_id = decision.daemon_id
        inst.clock_mhz = decision.clock.clock_mhz
        inst.boost = decision.clock.boost
        if adm.capacity_tokens:
            inst.daemon_capacity_tokens = adm.capacity_tokens
        q = self.queue(inst.name)
        admitted: list[str] = []
        for agent_id in adm.admit:
            agent = self.ledger.get(agent_id)
            if agent is None or agent_id not in q or agent.instance != inst.name:
                continue
            self._admit(agent, inst, "daemon")
            admitted.append(agent_id)
        self.metrics.decisions.labels(inst.name, "applied").inc()
        self.rehome()
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
