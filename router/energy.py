"""Energy per agent in the router: measured joules from the daemons, work from the proxy.

Every kairosd decision carries the instance's cumulative measured GPU energy
(``energy_total_j``, monotone since that daemon started). The router closes an
interval of the instance each time that counter advances, and
:class:`controllers.energy_attribution.EnergyAccountant` splits the interval's
joules among the agents whose requests ran on the instance during it (the idle
draw stays unattributed; docs/energy.md). A lost decision costs nothing: the
next one's delta covers both intervals, and so does the work.

An agent's record is written once every interval its work fell in has been
attributed and its sub-agents' records are written, since its ``energy_j`` adds
theirs (at most ``max_lag_s`` after it ended; at router shutdown, with what is
known, sub-agents first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter

from controllers.energy_attribution import EnergyAccountant, IntervalSplit, WorkWeights
from kairos_common.wire import AdmissionDecision
from reporting.records import AgentRecord, EnergyRecord

log = structlog.get_logger("kairos.router.energy")

ONE_TURN = "(one-turn)"
"""Anonymous one-turn requests (no agent record) share this accountant entry."""


class EnergyMetrics:
    """Per-instance counters: measured = attributed + unattributed (+ not yet split)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.measured = Counter(
            "kairos_router_instance_measured_energy_joules",
            "GPU energy the instance's daemon reported (cumulative counter deltas)",
            ["instance"],
            registry=r,
        )
        self.attributed = Counter(
            "kairos_router_instance_attributed_energy_joules",
            "Measured energy attributed to agents (estimate; docs/energy.md)",
            ["instance"],
            registry=r,
        )
        self.unattributed = Counter(
            "kairos_router_instance_unattributed_energy_joules",
            "Measured energy attributed to no agent (idle draw, intervals without work)",
            ["instance"],
            registry=r,
        )


@dataclass(slots=True)
class _Daemon:
    start_unix_s: float
    total_j: float
    epoch: int | None = None


class EnergyService:
    """Attribution state of one router (one event loop; no I/O but the record sink)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        write: Callable[[AgentRecord | EnergyRecord], None] | None,
        is_live: Callable[[str], bool],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        run: str = "",
        idle_power_w: float | None = None,
        max_lag_s: float = 600.0,
        has_live_children: Callable[[str], bool] = lambda _agent_id: False,
        weights: WorkWeights | None = None,
    ) -> None:
        self.accountant = EnergyAccountant(
            idle_power_w=idle_power_w, weights=weights, max_lag_s=max_lag_s
        )
        self.metrics = EnergyMetrics(registry)
        self.write = write
        self.is_live = is_live
        self.has_live_children = has_live_children
        self.clock = clock
        self.wall_clock = wall_clock
        self.run = run
        self.max_lag_s = max_lag_s
        self._daemons: dict[str, _Daemon] = {}
        self._parked: dict[str, tuple[AgentRecord, float]] = {}
        self._children_j: dict[str, float] = {}

    # ---- hot path ---------------------------------------------------------------------

    def record(
        self,
        instance: str,
        agent_id: str,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        start_s: float,
        first_token_s: float | None,
    ) -> None:
        """A request finished now; counted only on instances that report energy."""
        if instance in self._daemons:
            self.accountant.record(
                instance, agent_id, prompt_tokens, cached_tokens, completion_tokens,
                start_s=start_s, end_s=self.clock(), first_token_s=first_token_s,
            )  # fmt: skip

    def agent_energy_j(self, agent_id: str) -> float:
        """Joules attributed so far to a live agent's own requests (an estimate)."""
        share = self.accountant.agents.get(agent_id)
        return share.energy_j if share is not None else 0.0

    def energy_so_far_j(self, agent_id: str, instances: Iterable[str]) -> float | None:
        """An agent's joules so far, its ended sub-agents' included, as its record
        would have them now; None if no daemon on ``instances`` measures energy."""
        if not any(i in self._daemons for i in instances):
            return None
        return self.agent_energy_j(agent_id) + self._children_j.get(agent_id, 0.0)

    def parked(self, agent_id: str) -> AgentRecord | None:
        """An ended agent's record still held back (for its last joules or its
        sub-agents' records), if any."""
        entry = self._parked.get(agent_id)
        return None if entry is None else entry[0]

    # ---- decisions --------------------------------------------------------------------

    def on_decision(
        self, instance: str, decision: AdmissionDecision, in_flight_since_s: float | None
    ) -> None:
        """Close an interval of ``instance`` if its daemon's energy counter advanced
        (``in_flight_since_s``: start of its oldest request in flight, None if none)."""
        total = decision.measured.energy_total_j
        if total is None:
            return
        now = self.clock()
        known = self._daemons.get(instance)
        if known is None or known.start_unix_s != decision.daemon_start_unix_s:
            # A new daemon (or a restart): its counter starts from 0 at its start.
            if known is not None and decision.daemon_start_unix_s < known.start_unix_s:
                return  # a late message of the previous daemon
            self._daemons[instance] = known = _Daemon(decision.daemon_start_unix_s, 0.0)
            self.accountant.begin(instance, now)
        delta = total - known.total_j
        if delta <= 0.0:
            return  # no new measurement (an unreadable GPU, or a repeated message)
        known.total_j = total
        known.epoch = decision.epoch
        self.metrics.measured.labels(instance).inc(delta)
        splits = self.accountant.close(instance, delta, now, in_flight_since_s=in_flight_since_s)
        self._count(instance, splits)

    def _count(self, instance: str, splits: list[IntervalSplit]) -> None:
        attributed = sum(s.attributed_j for s in splits)
        unattributed = sum(s.unattributed_j for s in splits)
        if attributed > 0:
            self.metrics.attributed.labels(instance).inc(attributed)
        if unattributed > 0:
            self.metrics.unattributed.labels(instance).inc(unattributed)
        if splits:
            self.release()

    # ---- records ----------------------------------------------------------------------

    def finish(self, record: AgentRecord) -> None:
        """An agent ended: write its record now, or once its work is attributed and
        its sub-agents' records (whose joules its ``energy_j`` adds) are written."""
        if self._waits(record.agent_id, final=False):
            self._parked[record.agent_id] = (record, self.clock())
        else:
            self._write(record)

    def _waits(self, agent_id: str, *, final: bool) -> bool:
        """Must ``agent_id``'s record wait? For its own unattributed work or a live
        sub-agent (unless ``final``: shutting down), and for a sub-agent's parked
        record in any case, so that children are written before their parent."""
        if any(rec.parent_id == agent_id for rec, _ in self._parked.values()):
            return True
        if final:
            return False
        return self.accountant.has_open_work(agent_id) or self.has_live_children(agent_id)

    def drop_parked(self) -> list[str]:
        """Forget the records held back (this router lost its lease: the store keeps
        them, and the router that took over writes them); their ids."""
        ids = list(self._parked)
        self._parked.clear()
        self._children_j.clear()
        return ids

    def release(self, *, everything: bool = False) -> None:
        """Write parked records that need not wait any more (or waited ``max_lag_s``),
        sub-agents before their parents."""
        now = self.clock()
        while self._parked:
            ready = [
                agent_id
                for agent_id, (_, since) in self._parked.items()
                if now - since > self.max_lag_s or not self._waits(agent_id, final=everything)
            ]
            if not ready:
                if not everything:
                    return
                ready = [next(iter(self._parked))]  # cannot happen (no cycles), never spin
            for agent_id in ready:
                record, _ = self._parked.pop(agent_id)
                self._write(record)

    def close(self) -> None:
        """Router shutdown: attribute what can be, write every parked record, then
        one :class:`EnergyRecord` per instance that reported energy."""
        for instance in list(self._daemons):
            self._count(instance, self.accountant.flush(instance))
        self.release(everything=True)
        for instance, daemon in self._daemons.items():
            acc = self.accountant.instance(instance)
            if self.write is not None:
                self.write(
                    EnergyRecord(
                        t_s=self.wall_clock(),
                        instance=instance,
                        measured_j=acc.measured_j,
                        attributed_j=acc.attributed_j,
                        unattributed_j=acc.unattributed_j,
                        unrecorded_j=self.accountant.unpopped_j(instance),
                        daemon_epoch=daemon.epoch,
                        idle_power_w=acc.idle_power_w,
                        run=self.run,
                    )
                )

    def _write(self, record: AgentRecord) -> None:
        share = self.accountant.pop_agent(record.agent_id)
        children = self._children_j.pop(record.agent_id, 0.0)
        measured = any(i in self._daemons for i in record.instances)
        if record.instances and not measured:
            out = record  # served where no daemon reports energy: unknown, not zero
        else:
            total = share.energy_j + children
            out = dataclasses.replace(
                record,
                energy_j=total,
                energy_own_j=share.energy_j,
                energy_prefill_j=share.prefill_j,
                energy_decode_j=share.decode_j,
            )
            parent = record.parent_id
            if parent is not None and (self.is_live(parent) or parent in self._parked):
                self._children_j[parent] = self._children_j.get(parent, 0.0) + total
        if self.write is not None:
            self.write(out)
