"""The lifecycle client against the stand-in router, on a fake clock (no real waiting)."""

from __future__ import annotations

import pytest

from idtracker.errors import (
    InterruptedBySignalError,
    RegistrationRejectedError,
    RouterProtocolError,
    RouterUnavailableError,
)
from idtracker.lifecycle_client import Backoff, LifecycleClient
from idtracker.testing import StandInRouter
from kairos_common.wire import AgentEnd, AgentStart


class FakeTime:
    """A clock that only moves when the client waits; records each wait."""

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.now_s = 0.0
        self.waits: list[float] = []
        self._interrupt_after = interrupt_after

    def clock(self) -> float:
        return self.now_s

    def wait(self, delay_s: float) -> int | None:
        self.waits.append(delay_s)
        self.now_s += delay_s
        if self._interrupt_after is not None and len(self.waits) >= self._interrupt_after:
            return 2
        return None


def _client(url: str, t: FakeTime, token: str | None = None) -> LifecycleClient:
    return LifecycleClient(url, control_token=token, clock=t.clock, wait=t.wait)


def test_register_and_end_round_trip() -> None:
    with StandInRouter(control_token="c") as router:
        client = _client(router.url, FakeTime(), token="c")
        started = client.register(AgentStart(name="a", slo_tok_s=20.0), deadline_s=1)
        assert router.starts[0].agent_id == started.agent_id
        assert started.token.startswith(f"kairos1.{started.agent_id}.")
        assert client.report_end(started.agent_id, AgentEnd(0), deadline_s=1)
        assert router.wait_end(started.agent_id) == AgentEnd(0)


def test_start_retries_with_backoff_until_deadline() -> None:
    with StandInRouter(start_status=503) as router:
        t = FakeTime()
        with pytest.raises(RouterUnavailableError, match="HTTP 503"):
            _client(router.url, t).register(AgentStart(), deadline_s=1.0)
    assert t.waits[:4] == [0.1, 0.2, 0.4, pytest.approx(0.3)]  # capped by the deadline
    assert sum(t.waits) == pytest.approx(1.0)


def test_backoff_is_capped() -> None:
    assert [Backoff(0.5, 2.0).delay_s(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 2, 2]


@pytest.mark.parametrize(
    ("status", "error"), [(401, RegistrationRejectedError), (400, RouterProtocolError)]
)
def test_non_transient_start_failures_are_not_retried(status: int, error: type[Exception]) -> None:
    with StandInRouter(start_status=status) as router:
        t = FakeTime()
        with pytest.raises(error):
            _client(router.url, t).register(AgentStart(), deadline_s=5)
    assert t.waits == []


def test_signal_interrupts_the_retry_wait() -> None:
    t = FakeTime(interrupt_after=1)
    with StandInRouter(start_status=503) as router, pytest.raises(InterruptedBySignalError) as info:
        _client(router.url, t).register(AgentStart(), deadline_s=9)
    assert info.value.exit_code == 130


def test_end_for_unknown_agent_counts_as_delivered() -> None:
    with StandInRouter() as router:
        assert _client(router.url, FakeTime()).report_end("gone", AgentEnd(1), deadline_s=1)


def test_end_gives_up_after_deadline_without_raising() -> None:
    with StandInRouter(end_status=503) as router:
        t = FakeTime()
        assert not _client(router.url, t).report_end("a", AgentEnd(1), deadline_s=2.0)
        assert router.end_attempts == len(t.waits) + 1 >= 4
