"""kairosd over several router URLs (a router pair): state and decisions go to the
leader; a dead router or a standby's ``not_leader`` moves the daemon on within the
same epoch; a leader header is followed only to a configured URL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from tests.kairosd.conftest import agent, make_daemon


@pytest.fixture
async def routers(clock: ManualClock) -> AsyncIterator[list[FakeRouter]]:
    made = [FakeRouter(instance="gpu0", clock=clock) for _ in range(3)]
    for r in made:
        await r.start()
    yield made
    for r in made:
        await r.stop()


async def test_a_dead_first_router_is_passed_over_in_the_same_epoch(
    vllm: ScriptedVllm, routers: list[FakeRouter], session: aiohttp.ClientSession,
    clock: ManualClock,
) -> None:  # fmt: skip
    dead, leader, _ = routers
    dead_url = dead.url
    await dead.stop()
    leader.pending = [agent("p", 5_000, tput=None)]
    daemon = await make_daemon(vllm, None, session, clock, router_urls=[dead_url, leader.url])
    await daemon.run_epoch()
    assert daemon.failsafe_reason is None
    assert [d.admission.admit for d in leader.decisions] == [
        ("p",)
    ]  # decided on the leader's state


async def test_a_standby_naming_the_leader_sends_the_daemon_there(
    vllm: ScriptedVllm, routers: list[FakeRouter], session: aiohttp.ClientSession,
    clock: ManualClock,
) -> None:  # fmt: skip
    standby, other, leader = routers
    standby.standby_of = leader.url
    daemon = await make_daemon(
        vllm, None, session, clock, router_urls=[standby.url, other.url, leader.url]
    )
    await daemon.run_epoch()
    assert len(leader.decisions) == 1
    assert other.calls == 0  # straight to the named leader, not the next URL
    assert standby.calls == 1  # and it stays with the leader afterwards
    await daemon.run_epoch()
    assert standby.calls == 1 and len(leader.decisions) == 2


async def test_an_unconfigured_leader_header_is_ignored(
    vllm: ScriptedVllm, routers: list[FakeRouter], session: aiohttp.ClientSession,
    clock: ManualClock,
) -> None:  # fmt: skip
    standby, leader, elsewhere = routers
    standby.standby_of = elsewhere.url  # not one of the daemon's URLs
    daemon = await make_daemon(vllm, None, session, clock, router_urls=[standby.url, leader.url])
    await daemon.run_epoch()
    assert elsewhere.calls == 0  # its credential never went there
    assert len(leader.decisions) == 1


async def test_it_follows_a_failover_and_back(
    vllm: ScriptedVllm, routers: list[FakeRouter], session: aiohttp.ClientSession,
    clock: ManualClock,
) -> None:  # fmt: skip
    first, second, _ = routers
    second.standby_of = first.url
    daemon = await make_daemon(vllm, None, session, clock, router_urls=[first.url, second.url])
    await daemon.run_epoch()
    assert len(first.decisions) == 1
    first.standby_of, second.standby_of = second.url, None  # failover: second leads now
    clock.advance(5.0)
    await daemon.run_epoch()
    assert len(second.decisions) == 1 and daemon.failsafe_reason is None


async def test_no_leader_at_all_is_a_stale_router_input(
    vllm: ScriptedVllm, routers: list[FakeRouter], session: aiohttp.ClientSession,
    clock: ManualClock,
) -> None:  # fmt: skip
    a, b, _ = routers
    a.standby_of = b.standby_of = ""  # both standbys, neither knows a leader
    daemon = await make_daemon(
        vllm, None, session, clock, router_urls=[a.url, b.url], stale_epochs=1
    )
    for _ in range(2):
        await daemon.run_epoch()
        clock.advance(5.0)
    assert daemon.failsafe_reason == "router"  # the defined fail-safe, as with one router
    assert a.calls <= 4 and b.calls <= 4  # each URL at most once per call
