"""id-tracker's lifecycle calls over several router URLs (a pair, or a front first):
the known leader first, the next URL at once on a connection error or a standby's
``not_leader``, the named leader only when it is a configured URL, a backoff only
after a whole round failed — on a fake clock against stand-in routers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idtracker.errors import RouterUnavailableError
from idtracker.lifecycle_client import LifecycleClient
from idtracker.testing import StandInRouter
from kairos_common.wire import AgentEnd, AgentStart
from tests.idtracker.test_lifecycle_client import FakeTime


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback URL that refuses connections (a router that died)."""
    router = StandInRouter()
    router.start()
    url = router.url
    router.stop()
    yield url


def _client(urls: list[str], t: FakeTime) -> LifecycleClient:
    return LifecycleClient(urls, control_token="c", clock=t.clock, wait=t.wait)


def test_a_dead_first_router_is_passed_over_at_once(dead_url: str) -> None:
    t = FakeTime()
    with StandInRouter(control_token="c") as leader:
        client = _client([dead_url, leader.url], t)
        started = client.register(AgentStart(name="a"), deadline_s=5)
        assert leader.starts[0].agent_id == started.agent_id
        assert client.routers.current == leader.url  # the end goes straight there
        assert client.report_end(started.agent_id, AgentEnd(0), deadline_s=5)
    assert t.waits == []  # no backoff: the next URL was tried at once


def test_a_standby_naming_a_configured_leader_is_followed(dead_url: str) -> None:
    t = FakeTime()
    with StandInRouter(control_token="c") as leader:
        with StandInRouter(standby_of=leader.url + "/") as standby:
            client = _client([standby.url, dead_url, leader.url], t)
            client.register(AgentStart(), deadline_s=5)
            assert standby.start_attempts == 1
        assert len(leader.starts) == 1
    assert t.waits == []


def test_a_leader_header_naming_another_url_is_never_followed() -> None:
    """The header comes from whoever answered; the credential goes only where the
    operator said."""
    t = FakeTime()
    with (
        StandInRouter(control_token="c") as elsewhere,
        StandInRouter(control_token="c") as leader,
        StandInRouter(standby_of=elsewhere.url) as standby,
    ):
        _client([standby.url, leader.url], t).register(AgentStart(), deadline_s=5)
        assert len(leader.starts) == 1
        assert elsewhere.start_attempts == 0


def test_the_end_reaches_the_new_leader_after_the_starting_router_died() -> None:
    t = FakeTime()
    first = StandInRouter(control_token="c")
    with first, StandInRouter(control_token="c", standby_of=first.url, peer=first) as second:
        client = _client([first.url, second.url], t)
        started = client.register(AgentStart(), deadline_s=5)
        first.stop()  # the leader dies while the agent runs; the standby takes over
        second.standby_of = None
        assert client.report_end(started.agent_id, AgentEnd(3), deadline_s=5)
        assert second.wait_end(started.agent_id) == AgentEnd(3)


def test_with_every_router_down_it_waits_only_after_each_round(dead_url: str) -> None:
    t = FakeTime()
    with StandInRouter(standby_of="") as standby:  # a standby that knows no leader
        client = _client([dead_url, standby.url], t)
        with pytest.raises(RouterUnavailableError, match=r"not the leader|refused"):
            client.register(AgentStart(), deadline_s=1.0)
        rounds = len(t.waits)
        assert standby.start_attempts in (rounds, rounds + 1)  # one try of each per round
    assert t.waits[:3] == [0.1, 0.2, 0.4]
    assert sum(t.waits) == pytest.approx(1.0)
