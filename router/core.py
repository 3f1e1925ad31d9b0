"""The router's state services, built once and wired together (the composition
root's first half; :func:`router.app.create_app` is the second).

Also owns the operations that touch several services at once: adding, removing
and draining instances, evacuating agents from an instance that died, health
transitions, the instance listing, and persisting/restoring the ledger.

Nothing below the composition root receives this object whole: the HTTP
components are handed the individual services, and the core itself only as one
of the narrow Protocols of :mod:`router.ports` (``HealthSink``, ``Evacuator``,
``InstanceAdmin``, ``InstanceListing``) or as a bound method (``persist``). A
service locator would let any component reach any state, hiding which parts
depend on which; the constructors now say it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from controllers.epoch import NEW_AGENT_CONTEXT_TOKENS
from controllers.registry import make_placement_policy
from reporting.records import AgentRecord, JsonlWriter, Record
from router.admission import AdmissionService
from router.agents import AgentService
from router.config import RouterConfig, parse_backend
from router.energy import EnergyService
from router.errors import FencedError, NoBackendError, RouterError
from router.fleet_budget import FleetBudgetService
from router.instances import Instance, InstancePool
from router.ledger import Agent, Ledger
from router.metrics import FleetMetrics, InstanceGauges, RouterMetrics
from router.observations import ObservationLog
from router.placement_service import PlacementService
from router.record_watch import RecordWatch
from router.state_sync import RecordJournal, StateSync
from router.store import Snapshot, StateStore
from router.token_ratio import BytesPerToken

log = structlog.get_logger("kairos.router")


class RouterCore:
    def __init__(
        self,
        config: RouterConfig,
        *,
        secret: bytes | None,
        store: StateStore | None,
        records: JsonlWriter | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.wall_clock = wall_clock
        self.metrics = RouterMetrics()
        adm = config.admission
        self.pool = InstancePool(adm.capacity_tokens)
        for index, spec in enumerate(config.backends):
            self.pool.add(*parse_backend(spec, index))
        self.ledger = Ledger(NEW_AGENT_CONTEXT_TOKENS, clock, config.conversation_window_s)
        self.body_tokens = BytesPerToken()
        self.metrics.body_bytes_per_token.set_function(lambda: self.body_tokens.value)
        self.observations = ObservationLog()
        self.admission = AdmissionService(
            self.pool,
            self.ledger,
            config.rule(),
            adm,
            self.metrics,
            clock,
            self.observations,
            make_placement_policy(config.placement.policy, config.placement.theta_cons),
            self.body_tokens,
        )
        self.placement = PlacementService.from_settings(
            config.placement, self.pool, self.ledger, self.metrics, self.admission
        )
        self.watch = RecordWatch()
        shared = store is not None and store.shared
        self.journal = RecordJournal()
        self.sync = StateSync(
            ledger=self.ledger,
            pool=self.pool,
            admission=self.admission,
            journal=self.journal,
            shared=shared,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._persisting = asyncio.Lock()
        self.on_fenced: Callable[[], None] = lambda: None
        """Called when the store refuses a write for a stale fence (set by the lease keeper)."""

        def write(record: Record) -> None:
            if records is not None:
                records.write(record)
            if isinstance(record, AgentRecord):
                self.journal.written(record.agent_id)
            self.watch.written(record)  # an end call may be waiting for its summary

        self.write_record = write

        self.energy = EnergyService(
            self.metrics.registry,
            write=write,
            is_live=lambda agent_id: self.ledger.get(agent_id) is not None,
            has_live_children=self.ledger.has_children,
            clock=clock,
            wall_clock=wall_clock,
            run=config.run,
            idle_power_w=config.energy_idle_power_w,
            weights=config.energy_weights.work_weights(),
        )
        self.agents = AgentService(
            self.ledger,
            self.pool,
            self.admission,
            self.metrics,
            secret=secret,
            idle_expiry_s=config.idle_expiry_s,
            default_slo_tok_s=config.slo_tok_s,
            records=records,
            run=config.run,
            clock=clock,
            wall_clock=wall_clock,
            energy=self.energy,
            cell=config.cell,
            journal=self.journal if shared else None,
        )
        self.metrics.attach_state(self.gauges)
        self.fleet: FleetBudgetService | None = None
        if config.fleet_budget.cap_w is not None:
            self.fleet = FleetBudgetService(
                config.fleet_budget,
                slo_tok_s=config.slo_tok_s,
                clock=clock,
                metrics=FleetMetrics(self.metrics.registry),
                stale_after_s=adm.stale_after_s,
            )

    def gauges(self) -> list[InstanceGauges]:
        now = self.clock()
        return [
            InstanceGauges(
                name=i.name,
                usage_tokens=self.ledger.usage_tokens(i.name),
                capacity_tokens=i.capacity_tokens,
                ongoing=len(self.ledger.ongoing_ids(i.name)),
                pending=len(self.admission.queues.get(i.name, ())),
                healthy=i.healthy,
                draining=i.draining,
                daemon_fresh=i.daemon_fresh(now),
            )
            for i in self.pool
        ]

    def instances_json(self) -> list[dict[str, object]]:
        return [
            i.to_json(
                self.ledger.usage_tokens(i.name),
                len(self.ledger.ongoing_ids(i.name)),
                len(self.admission.queues.get(i.name, ())),
            )
            | {"admission_usage_tokens": self.admission.gate(i).admission_usage_tokens}
            for i in self.pool
        ]

    # -- instance membership and health -------------------------------------------------

    def add_instance(self, name: str, url: str) -> Instance:
        inst = self.pool.add(*parse_backend(f"{name}={url}", len(self.pool)))
        log.info("instance_added", instance=name, url=inst.base_url)
        return inst

    def remove_instance(self, name: str) -> None:
        inst = self.pool.resolve(name)
        self.pool.remove(inst.name)
        self.evacuate(inst.name, ongoing_too=True, reason="removed")
        log.info("instance_removed", instance=inst.name)

    def set_draining(self, name: str, draining: bool) -> Instance:
        inst = self.pool.resolve(name)
        inst.draining = draining
        if draining:
            self.evacuate(inst.name, ongoing_too=False, reason="draining")
        log.info("instance_draining", instance=inst.name, draining=draining)
        return inst

    def mark_health(self, inst: Instance, ok: bool) -> None:
        """Apply one health observation (active check or a failed proxy attempt)."""
        if ok:
            inst.consecutive_failures = 0
            if not inst.healthy:
                inst.healthy = True
                log.info("instance_healthy", instance=inst.name)
                self.admission.pump(inst)
            return
        inst.consecutive_failures += 1
        limit = self.config.timeouts.unhealthy_after_failures
        if inst.healthy and inst.consecutive_failures >= limit:
            inst.healthy = False
            log.warning("instance_unhealthy", instance=inst.name)
            self.evacuate(inst.name, ongoing_too=True, reason="failover")

    def evacuate(self, name: str, *, ongoing_too: bool, reason: str) -> None:
        """Move agents off instance ``name``: held ones keep their arrival order."""
        q = self.admission.queues.pop(name, None)
        held = q.take_all() if q else []
        if ongoing_too:
            for agent_id in sorted(self.ledger.ongoing_ids(name)):
                agent = self.ledger.get(agent_id)
                if agent is not None:
                    self._move_ongoing(agent, name, reason)
        targets: set[str] = set()
        for agent_id, item in held:
            agent = self.ledger.get(agent_id)
            if agent is None:
                continue
            try:
                target = self.placement.choose(agent, exclude={name})
            except NoBackendError as exc:
                agent.instance = None
                if not item.future.done():
                    item.future.set_exception(exc)
                continue
            agent.instance = target.name
            self.admission.queue(target.name).adopt(agent_id, item)
            targets.add(target.name)
        for target_name in targets:
            inst = self.pool.get(target_name)
            if inst is not None:
                self.admission.pump(inst)

    def _move_ongoing(self, agent: Agent, source: str, reason: str) -> None:
        try:
            target = self.placement.choose(agent, exclude={source})
        except NoBackendError:
            self.ledger.forget_instance(source)
            return
        self.ledger.set_ongoing(agent, target.name)
        self.metrics.reassignments.labels(source, target.name, reason).inc()

    # -- persistence ----------------------------------------------------------------------

    async def restore(self) -> int:
        """Take over the store's state (start-up, or a standby's promotion): agents
        with their assignments, and with a shared store the instance registry,
        places in line and the records not yet written."""
        if self.store is None:
            return 0
        snap = await self.store.load()
        return self.apply(snap)

    def apply(self, snap: Snapshot) -> int:
        return self.sync.apply(
            snap,
            add_instance=self.add_instance,
            remove_instance=self.remove_instance,
            write_record=self.write_record,
        )

    async def persist(self, *, full: bool = False) -> None:
        """Write what changed (periodically, before acknowledging a start or an end,
        and at shutdown); ``full``: the whole state, replacing the store's."""
        if self.store is None:
            self.ledger.dirty.clear()
            self.ledger.deleted.clear()
            return
        async with self._persisting:  # one write at a time: batches land in order
            await self._persist(self.store, full)

    async def _persist(self, store: StateStore, full: bool) -> None:
        changes = self.sync.take(full=full)
        try:
            await store.write(changes)
        except FencedError:
            self.on_fenced()  # another router leads now: what we had is not ours to write
            raise
        except BaseException:
            # Not written (full disk, Redis down, cancelled): keep every change for the
            # next try, or ended agents would come back after a restart.
            self.sync.failed(changes)
            raise
        self.sync.committed(changes)

    def drop_state(self, refusal: RouterError) -> int:
        """Forget every agent (the lease was lost): held requests fail with
        ``refusal``, parked records are the new leader's to write."""
        self.energy.drop_parked()
        return self.sync.drop(refusal)
