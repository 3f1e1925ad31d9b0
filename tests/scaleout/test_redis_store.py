"""The Redis store and its lease against a real ``redis-server``: acquisition and
its fence, renewal, the write script's fence check, a batch read back whole and
through the change stream, and an unreachable Redis translated at the edge."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import FencedError, LeaseLapsedError, StoreUnavailableError
from router.redis_store import RedisStore, apply_summary
from router.store import Changes, Snapshot
from simulator.stack import free_port
from tests.scaleout.services import RedisServer

pytestmark = pytest.mark.scaleout


def _row(agent_id: str, **kw: object) -> dict[str, object]:
    return {"agent_id": agent_id, "start_unix_s": 1.0, "instances": [], **kw}


async def test_one_lease_a_new_fence_each_time_and_stale_writes_refused(
    redis: RedisServer,
) -> None:
    a, b = RedisStore(redis.url), RedisStore(redis.url)
    try:
        mine, _ = await a.try_acquire("a", "http://a:1", 300)
        assert mine is not None and mine.fence == 1 and mine.url == "http://a:1"
        none, held = await b.try_acquire("b", "", 300)
        assert none is None and held is not None and held.router_id == "a"
        assert await a.renew(300) == mine
        await a.write(Changes(rows=[_row("x", turns=1)]))
        # a stops renewing (paused): the lease lapses and b takes it with a new fence
        deadline = asyncio.get_running_loop().time() + 5
        while (taken := await b.try_acquire("b", "", 5000))[0] is None:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert taken[0] is not None and taken[0].fence == 2
        with pytest.raises(FencedError):
            await a.write(Changes(rows=[_row("x", turns=99)]))
        holder = await a.renew(300)
        assert holder is not None and holder.router_id == "b"
        assert (await b.load()).agents == [_row("x", turns=1)]  # the stale write left nothing
    finally:
        await a.close()
        await b.close()


async def test_a_batch_reads_back_whole_and_through_the_stream(redis: RedisServer) -> None:
    store, reader = RedisStore(redis.url), RedisStore(redis.url)
    try:
        await store.try_acquire("a", "", 5000)
        view, position = await reader.load_with_position()
        await store.write(
            Changes(
                rows=[_row("x", instances=["i0"]), _row("y")],
                queues={"i0": [("y", 12.5)]},
                instances={"i0": {"url": "http://h:1", "draining": False}},
                records={"z": {"kind": "agent", "agent_id": "z"}},
            )
        )
        await store.write(Changes(deleted=["x"], records_done=["z"], queues={"i0": []}))
        snap = await reader.load()
        assert snap.agents == [_row("y")]
        assert snap.queues == {} and snap.records == []
        assert snap.instances == {"i0": {"url": "http://h:1", "draining": False}}
        entries = await reader.follow(position, 100)
        assert [v for _, v, _ in entries] == [1, 2]
        ids = sorted({i for _, _, b in entries for i in b["rows"]})
        rows, records = await reader.current(ids, ["z"])
        for _id, _version, batch in entries:
            apply_summary(view, batch, rows, records)
        assert (view.agents, view.queues, view.instances) == (
            snap.agents,
            snap.queues,
            snap.instances,
        )
        # a full write replaces everything (a leader writing back after an outage)
        await store.write(Changes(rows=[_row("w", instances=[])], full=True))
        full = await reader.load()
        assert full.agents == [_row("w")] and full.instances == {}
        assert full.agents[0]["instances"] == []  # lists stay lists through Lua
    finally:
        await store.close()
        await reader.close()


async def test_secret_and_credential_digests_are_shared_first_come(redis: RedisServer) -> None:
    a, b = RedisStore(redis.url), RedisStore(redis.url)
    try:
        assert await a.share_secret("aa" * 16) == "aa" * 16
        assert await b.share_secret("bb" * 16) == "aa" * 16
        assert await a.share_credentials({"admin": "d1"}) == {"admin": "d1"}
        got = await b.share_credentials({"admin": "d2", "daemon:i0": "d3"})
        assert got == {"admin": "d1", "daemon:i0": "d3"}
    finally:
        await a.close()
        await b.close()


async def test_an_unreachable_redis_is_a_store_unavailable_error() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.current_lease()
        assert store.describe()["reachable"] is False
    finally:
        await store.close()


def test_a_row_gone_since_its_entry_leaves_the_view() -> None:
    view = Snapshot(agents=[{"agent_id": "a"}])
    apply_summary(
        view, {"rows": ["a", "b"], "deleted": []}, {"a": None, "b": {"agent_id": "b"}}, {}
    )
    assert view.agents == [{"agent_id": "b"}]


async def test_a_write_sent_under_a_lease_since_renewed_is_not_a_fence(
    redis: RedisServer,
) -> None:
    """Redis came back: the leader's flusher had a write in flight under its lapsed
    lease while it re-acquired a new one. That refusal must not make it step down."""
    store = RedisStore(redis.url)
    try:
        old, _ = await store.try_acquire("a", "", 60_000)
        await store._redis.delete(store.keys["lease"])  # lapsed while Redis was away
        stale = asyncio.create_task(store.write(Changes(rows=[_row("x")])))
        await asyncio.sleep(0)  # the stale write is on its way under the old lease
        new, _ = await store.try_acquire("a", "", 60_000)
        assert old is not None and new is not None and new.fence == old.fence + 1
        with pytest.raises(LeaseLapsedError):
            await stale
        await store.write(Changes(rows=[_row("x")]))  # under the new lease it lands
        assert [r["agent_id"] for r in (await store.load()).agents] == ["x"]
    finally:
        await store.close()


async def test_a_leader_back_from_an_outage_may_not_retake_a_lease_another_held(
    redis: RedisServer,
) -> None:
    """While the old leader could not reach Redis another router led (and its lease
    lapsed too): the old leader's memory is older than the store, so no write-back."""
    a, b = RedisStore(redis.url), RedisStore(redis.url)
    try:
        old, _ = await a.try_acquire("a", "", 60_000)
        assert old is not None
        await a._redis.delete(a.keys["lease"])  # a cut off: its lease lapses
        led, _ = await b.try_acquire("b", "", 60_000)
        assert led is not None and led.fence == old.fence + 1
        await b._redis.delete(b.keys["lease"])  # b dies; its lease lapses too
        with pytest.raises(FencedError):
            await a.try_acquire("a", "", 60_000, after_fence=old.fence)
        back, _ = await b.try_acquire("b", "", 60_000, after_fence=led.fence)
        assert back is not None  # nobody led since b: b may take it back
    finally:
        await a.close()
        await b.close()
