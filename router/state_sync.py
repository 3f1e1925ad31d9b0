"""Between the router's memory and its store: what changed since the last write
(:meth:`StateSync.take`), and the state a snapshot holds, taken over
(:meth:`StateSync.apply`).

The hot path never waits on the store: it only marks agents dirty
(:meth:`router.ledger.Ledger.touch`). A write collects the dirty agents' rows,
the deletions, and, for a shared store, the hold queues' orders, the instance
registry and the records not yet written that changed since the last
successful write (compared, not tracked: a few instances and short queues cost
nothing to compare, and no code path can forget to mark them). A failed write
gives everything back for the next one.

:class:`RecordJournal` is why a takeover neither loses nor repeats an agent's
record: an ended agent's record sits in the store from the write that deletes
the agent's row (the same atomic batch) until a records file has it, so the
router that takes over writes what the dead one had not.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from reporting.records import AgentRecord, RecordError, record_from_json, to_json_line
from router.admission import AdmissionService
from router.errors import RouterError
from router.instances import Instance, InstancePool, apply_state, shared_state, state_to_json
from router.ledger import Agent, Ledger
from router.store import Changes, Held, Row, Snapshot


class RecordJournal:
    """Records of ended agents from their end until a records file has them."""

    def __init__(self) -> None:
        self.added: dict[str, Row] = {}
        self.done: set[str] = set()
        self._stored: dict[str, Row] = {}
        self.on_written: Callable[[], None] = lambda: None
        """Called when a stored record reached a file: its deletion should be written
        at once (until then a takeover would write it again)."""

    def ended(self, record: AgentRecord) -> None:
        """``record`` will be written (now, or once its energy is attributed)."""
        self.added[record.agent_id] = orjson.loads(to_json_line(record))
        self.done.discard(record.agent_id)

    def written(self, agent_id: str) -> None:
        """A records file has it: no router writes it again."""
        self.added.pop(agent_id, None)
        if agent_id in self._stored:
            self.done.add(agent_id)
            self.on_written()

    def restored(self, agent_id: str, row: Row) -> None:
        """A record the store holds (the previous leader's), written by us now."""
        self._stored[agent_id] = row

    def take(self, *, full: bool = False) -> tuple[dict[str, Row], list[str]]:
        """What to add and delete (``full``: every record still unwritten)."""
        done = sorted(self.done)
        for agent_id in done:
            self._stored.pop(agent_id, None)
        added = (self._stored | self.added) if full else self.added
        self._stored |= self.added
        self.added, self.done = {}, set()
        return added, [] if full else done

    def give_back(self, added: dict[str, Row], done: list[str]) -> None:
        self.added = added | self.added
        self.done |= set(done)

    def forget(self) -> None:
        self.added, self.done, self._stored = {}, set(), {}


class StateSync:
    """Collects changes for the store and applies snapshots (one event loop)."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        pool: InstancePool,
        admission: AdmissionService,
        journal: RecordJournal,
        shared: bool,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.pool = pool
        self.admission = admission
        self.journal = journal
        self.shared = shared
        self.clock = clock
        self.wall_clock = wall_clock
        self._queues: dict[str, tuple[Held, ...]] = {}
        self._instances: dict[str, tuple[object, ...]] = {}
        self._taken: tuple[dict[str, tuple[Held, ...]], dict[str, tuple[object, ...]]] = ({}, {})

    # -- memory → store --------------------------------------------------------------------

    def take(self, *, full: bool = False) -> Changes:
        """Changes since the last :meth:`committed` (``full``: everything)."""
        now, now_unix = self.clock(), self.wall_clock()
        ledger = self.ledger
        ids = [a.agent_id for a in ledger] if full else list(ledger.dirty)
        rows = []
        for agent_id in ids:
            agent = ledger.get(agent_id)
            if agent is not None and not agent.ephemeral:
                rows.append(agent.to_row(now, now_unix))
        changes = Changes(rows=rows, deleted=[] if full else list(ledger.deleted), full=full)
        ledger.dirty.clear()
        ledger.deleted.clear()
        if not self.shared:
            return changes
        queues = self._queue_orders()
        old_queues = {} if full else self._queues
        for name in queues.keys() | old_queues.keys():
            order = queues.get(name, ())
            if order != old_queues.get(name, ()):
                changes.queues[name] = [(a, now_unix - (now - s)) for a, s in order]
        instances = {i.name: shared_state(i) for i in self.pool}
        old_instances = {} if full else self._instances
        for inst in self.pool:
            if instances[inst.name] != old_instances.get(inst.name):
                changes.instances[inst.name] = state_to_json(inst, now, now_unix)
        changes.removed_instances = sorted(old_instances.keys() - instances.keys())
        changes.records, changes.records_done = self.journal.take(full=full)
        self._taken = (queues, instances)
        return changes

    def _queue_orders(self) -> dict[str, tuple[Held, ...]]:
        return {name: tuple(q.places()) for name, q in self.admission.queues.items() if len(q)}

    def committed(self, changes: Changes) -> None:
        """``changes`` reached the store: they are the baseline of the next take."""
        if not self.shared:
            return
        queues, instances = self._taken  # as they were when taken, not as they are now
        if changes.full:
            self._queues, self._instances = {}, {}
        for name in changes.queues:
            order = queues.get(name, ())
            if order:
                self._queues[name] = order
            else:
                self._queues.pop(name, None)
        for name in changes.instances:
            self._instances[name] = instances[name]
        for name in changes.removed_instances:
            self._instances.pop(name, None)
            self._queues.pop(name, None)

    def failed(self, changes: Changes) -> None:
        """``changes`` did not reach the store: keep every one for the next try, or
        ended agents would come back after a takeover."""
        ledger = self.ledger
        ledger.dirty |= {r["agent_id"] for r in changes.rows} - ledger.deleted
        ledger.deleted |= set(changes.deleted) - ledger.dirty
        if self.shared:
            self.journal.give_back(changes.records, changes.records_done)

    # -- store → memory --------------------------------------------------------------------

    def apply(
        self,
        snap: Snapshot,
        *,
        add_instance: Callable[[str, str], Instance],
        remove_instance: Callable[[str], None],
        write_record: Callable[[AgentRecord], None],
    ) -> int:
        """Take over ``snap``: the instance registry, agents, places in line, and the
        records the previous leader had not written. Returns the agents restored."""
        now, now_unix = self.clock(), self.wall_clock()
        if snap.instances:
            self._apply_registry(snap.instances, add_instance, remove_instance, now, now_unix)
        count = 0
        for row in snap.agents:
            try:
                agent = Agent.from_row(row, now, now_unix)
            except (KeyError, TypeError, ValueError):
                continue
            if self.pool.get(agent.instance) is None:
                agent.instance, agent.admitted = None, False
            agent.admitted = agent.admitted and agent.instance is not None
            self.ledger.add(agent)
            count += 1
        for name, order in snap.queues.items():
            for agent_id, since_unix in order:
                held = self.ledger.get(agent_id)
                if held is not None and held.instance == name and not held.admitted:
                    # Its requests died with the old leader; a retry within the
                    # grace takes this place again (AdmissionService._place_in_line).
                    held.queue_since_s = now - max(0.0, now_unix - since_unix)
                    held.gave_up_s = now
        self.ledger.dirty.clear()
        for obj in snap.records:
            try:
                record = record_from_json(obj)
            except RecordError:
                continue
            if isinstance(record, AgentRecord):
                self.journal.restored(record.agent_id, obj)
                write_record(record)
        self._queues = self._queue_orders()
        self._instances = {i.name: shared_state(i) for i in self.pool}
        return count

    def _apply_registry(
        self,
        entries: dict[str, Row],
        add_instance: Callable[[str, str], Instance],
        remove_instance: Callable[[str], None],
        now: float,
        now_unix: float,
    ) -> None:
        for name, entry in entries.items():
            inst = self.pool.get(name)
            url = entry.get("url")
            if inst is None and isinstance(url, str):
                try:
                    inst = add_instance(name, url)
                except RouterError:
                    continue
            if inst is not None:
                apply_state(inst, entry, now, now_unix)
        for inst in self.pool:
            if inst.name not in entries:
                remove_instance(inst.name)

    def drop(self, refusal: RouterError) -> int:
        """Forget every agent, held request and unwritten record (this router lost
        its lease: the one that took over owns them now). Held requests fail with
        ``refusal``; returns the agents forgotten."""
        for q in list(self.admission.queues.values()):
            for _agent_id, held in q.take_all():
                if not held.future.done():
                    held.future.set_exception(refusal)
        self.admission.queues.clear()
        self.journal.forget()
        self._queues, self._instances = {}, {}
        return len(self.ledger.clear())
