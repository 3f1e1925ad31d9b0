"""What a takeover carries over (router/state_sync.py), in memory: a router's
agents, assignments, places in line, instance registry and daemon decisions,
and records not yet written reach a shared store; a second router applying
that snapshot has them, and a failed write loses nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import KAIROS_ALG1
from kairos_common.testing import ManualClock, decision
from kairos_common.wire import WIRE_VERSION, AgentEnd, AgentStart
from kairos_common.wire_views import rule_to_json
from router.config import RouterConfig
from router.conversations import Conversations
from router.core import RouterCore
from router.errors import StoreUnavailableError
from router.store import Changes
from router.testing import MemoryStore


def core_on(store: MemoryStore, clock: ManualClock, wall: ManualClock) -> RouterCore:
    config = RouterConfig(backends=("i0=http://127.0.0.1:9", "i1=http://127.0.0.1:10"))
    return RouterCore(config, secret=None, store=store, records=None, clock=clock,
                      wall_clock=wall)  # fmt: skip


async def test_a_second_router_takes_over_agents_queues_registry_and_records() -> None:
    store, clock, wall = MemoryStore(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    a = core_on(store, clock, wall)
    running = a.agents.start(AgentStart(name="runs")).agent_id
    held = a.agents.start(AgentStart(name="held")).agent_id
    ended = a.agents.start(AgentStart(name="ends")).agent_id
    child = a.agents.start(AgentStart(name="sub", parent_id=ended)).agent_id
    a.ledger.set_ongoing(a.ledger.get(running), "i1")  # type: ignore[arg-type]
    a.ledger.record_completion(a.ledger.get(running), prompt_tokens=900,  # type: ignore[arg-type]
                               completion_tokens=100, latency_s=1.0, estimated=False)  # fmt: skip
    agent = a.ledger.get(held)
    assert agent is not None
    waiting = asyncio.ensure_future(a.admission.queue("i0").join(held, clock() - 3.0))
    a.ledger.set_pending(agent, "i0", clock())
    a.set_draining("i1", True)
    alg1 = decision("i0", 7, start_unix_s=1.0, rule=KAIROS_ALG1.rule, capacity_tokens=50_000,
                    offload_tokens=4_000, defer=True, clock_mhz=1200)  # fmt: skip
    assert a.admission.apply_decision(alg1).accepted
    a.agents.end(ended, AgentEnd(exit_code=0))  # its record waits for its sub-agent's
    await a.persist()

    b = core_on(store, ManualClock(5.0), ManualClock(1_700_000_010.0))
    written: list[str] = []
    b.write_record = lambda record: written.append(record.agent_id)  # type: ignore[method-assign]
    assert b.apply(await store.load()) == 3
    taken = b.ledger.get(running)
    assert taken is not None and taken.instance == "i1" and taken.admitted
    assert (taken.turns, taken.prompt_tokens, taken.decode_tokens) == (1, 900, 100)
    assert taken.context_tokens == 1000 and b.ledger.usage_tokens("i1") == 1000
    queued = b.ledger.get(held)
    assert queued is not None and queued.instance == "i0" and not queued.admitted
    # its place in line: 3 s before a's clock then, 13 s before b's now (10 s later)
    assert queued.queue_since_s == pytest.approx(5.0 - 13.0)
    i0, i1 = b.pool.get("i0"), b.pool.get("i1")
    assert i0 is not None and i1 is not None and i1.draining and not i0.draining
    assert i0.decision_key == (1.0, 7) and i0.daemon_capacity_tokens == 50_000
    # the daemon's rule whole (its policy's β/γ, windows, tier), fresh for the rest
    # of its 15 s validity: 5 s on b's clock (10 s of wall time went by)
    assert i0.decision_rule == KAIROS_ALG1.rule
    assert i0.daemon_fresh(9.9) and not i0.daemon_fresh(10.1)
    assert (i0.decision_defer, i0.decision_offload_tokens, i0.clock_mhz) == (True, 4_000, 1200)
    assert i1.decision_key is None and i1.decision_rule is None
    assert b.ledger.get(ended) is None and b.ledger.get(child) is not None
    assert written == [ended]  # the record a had not written yet
    waiting.cancel()


async def test_a_decision_of_another_wire_version_is_not_taken_over() -> None:
    """A registry entry written by a router of another release (another wire
    version), or with a rule that does not parse, leaves the instance without a
    decision: the router's own rule applies until the daemon's next one."""
    store, clock, wall = MemoryStore(), ManualClock(100.0), ManualClock(1_700_000_000.0)
    a = core_on(store, clock, wall)
    assert a.admission.apply_decision(decision("i0", 3, rule=KAIROS_ALG1.rule)).accepted
    await a.persist()
    snap = await store.load()
    entry = snap.instances["i0"]
    assert entry["version"] == WIRE_VERSION and entry["decision_rule"] == rule_to_json(
        KAIROS_ALG1.rule
    )
    for bad in ({"version": WIRE_VERSION - 1}, {"decision_rule": {"beta": 7.0}}):
        changed = dataclasses.replace(snap, instances={"i0": {**entry, **bad}})
        b = core_on(MemoryStore(), ManualClock(5.0), ManualClock(1_700_000_001.0))
        b.apply(changed)
        i0 = b.pool.get("i0")
        assert i0 is not None and i0.decision_key is None and i0.decision_rule is None
        assert not i0.daemon_fresh(5.0)
        assert b.admission.apply_decision(decision("i0", 1)).accepted  # the next one is


async def test_a_failed_write_keeps_every_change_for_the_next() -> None:
    class Flaky(MemoryStore):
        down = False

        async def write(self, changes: Changes) -> None:
            if self.down:
                raise StoreUnavailableError("redis away")
            await super().write(changes)

    store, clock = Flaky(), ManualClock()
    a = core_on(store, clock, ManualClock(1e9))
    kept = a.agents.start(AgentStart()).agent_id
    gone = a.agents.start(AgentStart()).agent_id
    child = a.agents.start(AgentStart(parent_id=gone)).agent_id
    await a.persist()
    store.down = True
    a.agents.end(gone, AgentEnd(exit_code=0))
    a.set_draining("i0", True)
    with pytest.raises(StoreUnavailableError):
        await a.persist()
    store.down = False
    await a.persist()
    snap = await store.load()
    assert sorted(r["agent_id"] for r in snap.agents) == sorted([kept, child])
    assert snap.instances["i0"]["draining"] is True
    assert [r["agent_id"] for r in snap.records] == [gone]


async def test_a_full_write_replaces_what_the_store_kept() -> None:
    store, clock = MemoryStore(), ManualClock()
    a = core_on(store, clock, ManualClock(1e9))
    a.agents.start(AgentStart())
    await a.persist()
    store.snapshot.agents.append({"agent_id": "stale", "start_unix_s": 1.0})
    await a.persist(full=True)
    assert "stale" not in {r["agent_id"] for r in (await store.load()).agents}


@given(
    st.lists(
        st.tuples(st.integers(0, 2**40), st.integers(0, 10**6), st.floats(0, 1000)),
        max_size=20,
        unique_by=lambda t: t[0],
    ),
    st.floats(0, 600),
)
def test_conversation_sizes_carry_c_a_over(
    convs: list[tuple[int, int, float]], window: float
) -> None:
    mine = Conversations()
    for key, tokens, ended_s in convs:
        mine.complete(key, tokens, 1000.0 - ended_s)
    copy = Conversations.from_sizes(mine.sizes(1000.0), 50.0)
    # the same ages on another clock give the same C_a
    assert copy.context_tokens(50.0, window) == mine.context_tokens(1000.0, window)
