"""Leader election over the shared store: acquire, renew, follow, promote, step down.

Routers that share a Redis store (:mod:`router.redis_store`) run one
:class:`LeaseKeeper` each. The lease is a key set with ``NX PX``; each
acquisition increments the fence, and every write carries lease and fence, so a
leader that was paused past its lease and wakes up is refused by the store at
its first write or renewal, and steps down (docs/scale-out.md, "Failover").

* **Leader**: renews every ``lease_s / 4``; its :class:`~router.leadership.LeaderGate`
  serves until the confirmed lease's deadline; the flusher writes the changes every
  ``flush_interval_s``.
* **Standby**: tries to acquire every ``lease_s / 8``, and follows the store's
  change stream meanwhile (a view it compares with the full read it promotes from).
* **Redis unreachable**: the leader keeps serving from memory (the gate's
  ``store_down``) and retries; when Redis answers again it renews, or, if the
  lease lapsed meanwhile, acquires a new fence and writes its whole state back.
  A standby never promotes without the store, and after an outage waits
  ``2 × lease_s`` of a reachable store before it tries, so the leader, which
  retries at once and has the newest state, wins that race.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from router.errors import (
    FencedError,
    LeaseLapsedError,
    RouterError,
    StateStoreError,
    StoreUnavailableError,
)
from router.leadership import LeaderGate
from router.redis_store import Lease, RedisStore, apply_summary
from router.store import Snapshot

log = structlog.get_logger("kairos.router.lease")


class Holder(Protocol):
    """The part of the core a lease keeper drives (:class:`router.core.RouterCore`)."""

    def apply(self, snap: Snapshot) -> int: ...

    async def persist(self, *, full: bool = False) -> None: ...

    def drop_state(self, refusal: RouterError) -> int: ...


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How fast a standby takes over: the lease lapses at most ``lease_s`` after the
    leader's last renewal, a standby sees it within ``poll_s``, and then reads the
    state (tens of ms). A front balancer adds its check interval."""

    lease_s: float = 2.0
    flush_interval_s: float = 0.1

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.lease_s * 1000))

    @property
    def renew_s(self) -> float:
        return self.lease_s / 4

    @property
    def poll_s(self) -> float:
        return self.lease_s / 8

    @property
    def margin_s(self) -> float:
        """The leader stops serving this long before the lease can lapse in Redis
        (timer and clock-rate slack between the two machines)."""
        return self.lease_s / 5

    @property
    def grace_s(self) -> float:
        """A standby's wait after the store comes back before it tries to acquire."""
        return 2 * self.lease_s


class LeaseMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.leader = Gauge("kairos_router_leader", "1 while this router leads.", registry=r)
        self.store_up = Gauge(
            "kairos_router_store_reachable", "1 while the shared store answers.", registry=r
        )
        self.transitions = Counter(
            "kairos_router_leadership_changes", "Promotions and step-downs.", ["to"], registry=r
        )
        self.write_failures = Counter(
            "kairos_router_store_write_failures",
            "Store writes that failed, by reason.",
            ["reason"],
            registry=r,
        )


class LeaseKeeper:
    """One router's side of the election (one event loop)."""

    def __init__(
        self,
        store: RedisStore,
        gate: LeaderGate,
        holder: Holder,
        *,
        router_id: str,
        advertise_url: str,
        timing: LeaseTiming,
        metrics: LeaseMetrics,
        share_secrets: Callable[[RedisStore], Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.gate = gate
        self.holder = holder
        self.router_id = router_id
        self.advertise_url = advertise_url
        self.timing = timing
        self.metrics = metrics
        metrics.store_up.set_function(lambda: 1.0 if store.status.reachable else 0.0)
        self._share_secrets = share_secrets
        self._secrets_shared = False
        self.clock = clock
        self._need_full = False
        self._reachable_since: float | None = clock()
        self._outage_seen = False
        self.view: Snapshot | None = None
        self._position = "0-0"
        self._view_version = 0
        self.last_promotion: dict[str, object] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._kicked = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._elect()),
            asyncio.create_task(self._flush()),
            asyncio.create_task(self._follow()),
        ]

    async def stop(self) -> None:
        """Cancel the loops; a leader writes what changed and hands the lease over."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.gate.leader and self.store.lease is not None:
            try:
                await self.holder.persist(full=self._need_full)
                await self.store.release()
            except StateStoreError as exc:
                log.error("final_store_write_failed", error=str(exc))
        self.gate.step_down("shutting down")

    def detail(self) -> dict[str, object]:
        """For ``/health/ready``."""
        lease = self.store.lease
        out: dict[str, object] = {"router_id": self.router_id, "fence": lease and lease.fence}
        out["lease_s"] = self.timing.lease_s
        if self.view is not None and not self.gate.leader:
            out["view"] = {"version": self._view_version, "agents": len(self.view.agents)}
        if self.last_promotion:
            out["last_promotion"] = self.last_promotion
        return out

    # -- the election loop -------------------------------------------------------------------

    async def _elect(self) -> None:
        while True:
            try:
                if self.gate.leader and self.store.lease is not None:
                    await self._renew()
                else:
                    await self._try_promote()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease_step_failed")
            fast = self.gate.store_down or not self.gate.leader
            await asyncio.sleep(self.timing.poll_s if fast else self.timing.renew_s)

    def _unreachable(self, exc: StoreUnavailableError) -> None:
        if self._reachable_since is not None:
            self._reachable_since = None
            self._outage_seen = True
            role = "leader" if self.gate.leader else "standby"
            hint = "routing from memory" if self.gate.leader else "not promoting without it"
            log.error("store_unreachable", role=role, error=str(exc), hint=hint)
        if self.gate.leader:
            self.gate.store_down = True
        else:
            self.gate.reason = "store unreachable: a standby does not promote without it"

    def _reachable(self) -> None:
        if self._reachable_since is None:
            self._reachable_since = self.clock()
            log.info("store_reachable", role="leader" if self.gate.leader else "standby")
        self.gate.store_down = False

    async def _renew(self) -> None:
        sent_s = self.clock()
        try:
            holder = await self.store.renew(self.timing.lease_ms)
        except StoreUnavailableError as exc:
            self._unreachable(exc)
            return
        self._reachable()
        mine = self.store.lease
        if holder is not None and mine is not None and holder.value == mine.value:
            self.gate.lead(sent_s + self.timing.lease_s - self.timing.margin_s)
            return
        if holder is not None:
            self.step_down(f"lease taken over by {holder.router_id} (fence {holder.fence})",
                           holder)  # fmt: skip
            return
        # The lease lapsed (Redis restarted, or was away longer than the lease) and
        # nobody took it: this router has the newest state; it takes a new fence
        # and writes everything back.
        await self._acquire(sent_s, reacquire=True)

    async def _try_promote(self) -> None:
        now = self.clock()
        try:
            if not self._secrets_shared:
                await self._share_secrets(self.store)
                self._secrets_shared = True
            lease = await self.store.current_lease()
        except StoreUnavailableError as exc:
            self._unreachable(exc)
            return
        self._reachable()
        if lease is not None:
            self.gate.leader_url = lease.url or None
            if not self.gate.reason.startswith(("fenced", "lease taken")):
                self.gate.reason = f"standby: {lease.router_id} leads"
            return
        since = self._reachable_since if self._reachable_since is not None else now
        if self._outage_seen and now - since < self.timing.grace_s:
            self.gate.reason = "store back: leaving the lease to the previous leader first"
            return
        await self._acquire(self.clock(), reacquire=False)

    async def _acquire(self, sent_s: float, *, reacquire: bool) -> None:
        mine = self.store.lease
        after = mine.fence if reacquire and mine is not None else None
        try:
            lease, held = await self.store.try_acquire(
                self.router_id, self.advertise_url, self.timing.lease_ms, after_fence=after
            )
        except StoreUnavailableError as exc:
            self._unreachable(exc)
            return
        except FencedError:
            # Another router led while this one could not reach the store: what the
            # store holds is newer than this router's memory.
            self.step_down("another router led while the store was away")
            return
        if lease is None:
            if reacquire:
                self.step_down("lease taken over while the store was away", held)
            return
        if reacquire:
            self.gate.lead(sent_s + self.timing.lease_s - self.timing.margin_s)
            self._need_full = True
            log.warning("lease_reacquired", fence=lease.fence, hint="writing the whole state back")
            await self._write_back()
            return
        await self._promote(lease, sent_s)

    async def _write_back(self) -> None:
        try:
            await self.holder.persist(full=True)
        except (StoreUnavailableError, LeaseLapsedError):
            return  # the flusher retries the full write
        self._need_full = False
        log.info("state_written_back", version=self.store.status.version)

    async def _promote(self, lease: Lease, sent_s: float) -> None:
        t0 = self.clock()
        try:
            await self._share_secrets(self.store)  # digests of routers started since
            snap, position = await self.store.load_with_position()
            # Renewed after the read (a large cell's read takes a while), so that the
            # lease outlives the apply below and the first renewal after it.
            sent_s = self.clock()
            holder = await self.store.renew(self.timing.lease_ms)
        except StoreUnavailableError as exc:
            self._unreachable(exc)
            return  # the lease lapses unrenewed; whoever can read the store takes it
        if holder is None or holder.value != lease.value:
            self.step_down("lease lost while reading the state", holder)
            return
        drift = _drift(self.view, snap) if self.view is not None else None
        self.holder.drop_state(self.gate.refusal())
        restored = self.holder.apply(snap)
        self.view, self._position = None, position
        self.gate.leader_url = self.advertise_url or None
        self.gate.lead(sent_s + self.timing.lease_s - self.timing.margin_s)
        self.metrics.leader.set(1)
        self.metrics.transitions.labels("leader").inc()
        took_s = self.clock() - t0
        self.last_promotion = {"fence": lease.fence, "agents": restored,
                               "took_s": round(took_s, 4), "view_drift_agents": drift}  # fmt: skip
        log.warning("promoted", fence=lease.fence, agents=restored, took_s=round(took_s, 4),
                    view_drift_agents=drift, version=self.store.status.version)  # fmt: skip

    def step_down(self, reason: str, holder: Lease | None = None) -> None:
        """Stop serving at once and forget the state (another router owns it now)."""
        was_leader = self.gate.leader
        self.gate.step_down(reason)
        if holder is not None:
            self.gate.leader_url = holder.url or None
        self.store.lease = None
        self._need_full = False
        dropped = self.holder.drop_state(self.gate.refusal())
        self.metrics.leader.set(0)
        if was_leader:
            self.metrics.transitions.labels("standby").inc()
            log.error("stepped_down", reason=reason, agents_dropped=dropped)

    def on_fenced(self) -> None:
        """The store refused a write: our fence is stale."""
        self.metrics.write_failures.labels("fenced").inc()
        log.error("write_refused_by_fence", router_id=self.router_id)
        self.step_down("fenced: another router took the lease")

    # -- the flusher ------------------------------------------------------------------------

    def kick(self) -> None:
        """Write soon, without waiting for the next interval (an agent was assigned
        an instance: a takeover must find it where it is)."""
        self._kicked.set()

    async def _flush(self) -> None:
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), self.timing.flush_interval_s)
            self._kicked.clear()
            if not self.gate.leader or self.store.lease is None:
                continue
            try:
                await self.holder.persist(full=self._need_full)
            except StoreUnavailableError:
                self.metrics.write_failures.labels("unreachable").inc()
                continue  # the election loop says so once and retries
            except (FencedError, LeaseLapsedError):
                continue  # on_fenced stepped down; or the next write carries the new lease
            except StateStoreError as exc:
                self.metrics.write_failures.labels("error").inc()
                if not failing:
                    log.error("store_write_failed", error=str(exc))
                failing = True
                continue
            if self._need_full:
                log.info("state_written_back", version=self.store.status.version)
            self._need_full = False
            failing = False

    # -- the standby's view -------------------------------------------------------------------

    async def _follow(self) -> None:
        """Keep a standby's view of the store current from the change stream."""
        while True:
            if self.gate.leader:
                self.view = None
                await asyncio.sleep(self.timing.poll_s)
                continue
            try:
                await self._follow_once()
            except StoreUnavailableError:
                await asyncio.sleep(self.timing.poll_s)

    async def _follow_once(self) -> None:
        if self.view is None:
            self.view, self._position = await self.store.load_with_position()
            self._view_version = self.store.status.version
            return
        block_ms = max(1, round(self.timing.poll_s * 1000))
        entries = await self.store.follow(self._position, block_ms)
        if not entries:
            return
        rows = sorted({i for _, _, b in entries for i in b.get("rows") or ()})
        records = sorted({i for _, _, b in entries for i in b.get("records") or ()})
        current_rows, current_records = await self.store.current(rows, records)
        for entry_id, version, batch in entries:
            if version != self._view_version + 1:
                self.view = None  # fell behind the stream's cap, or the store restarted
                return
            apply_summary(self.view, batch, current_rows, current_records)
            self._position, self._view_version = entry_id, version


def _drift(view: Snapshot, snap: Snapshot) -> int:
    """Agents whose row differs between a standby's view and the full read."""
    mine = {r["agent_id"]: r for r in view.agents}
    theirs = {r["agent_id"]: r for r in snap.agents}
    return sum(1 for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
