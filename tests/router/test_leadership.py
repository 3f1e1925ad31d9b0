"""The leader gate (router/leadership.py) on a manual clock, and the not_leader
answer of kairos_common.wire's contract as the error path builds it."""

from __future__ import annotations

import json

import pytest

from kairos_common.testing import ManualClock
from kairos_common.wire import LEADER_HEADER, NOT_LEADER_CODE, is_not_leader
from router.errors import NotLeaderError
from router.leadership import LeaderGate, ready_body
from router.openai_errors import router_error_parts


def test_a_leader_serves_until_its_confirmed_lease_runs_out() -> None:
    clock = ManualClock(100.0)
    gate = LeaderGate.standby("starting", clock)
    assert not gate.serving() and gate.role == "standby"
    gate.lead(deadline_s=101.6)
    assert gate.serving() and gate.role == "leader"
    clock.advance(1.59)
    gate.check()
    clock.advance(0.02)  # paused past its lease: refuses before Redis says anything
    assert not gate.serving()
    with pytest.raises(NotLeaderError):
        gate.check()


def test_with_the_store_down_a_leader_keeps_serving_past_its_deadline() -> None:
    clock = ManualClock(100.0)
    gate = LeaderGate(clock)
    gate.lead(deadline_s=101.0)
    gate.store_down = True
    clock.advance(60)
    assert gate.serving()
    gate.step_down("fenced: another router took the lease")
    assert not gate.serving()  # a fenced leader does not, store down or not


def test_the_refusal_is_a_503_not_leader_with_retry_after_and_the_leader() -> None:
    gate = LeaderGate.standby("standby: b leads", ManualClock())
    gate.leader_url = "http://b.example:24157"
    for anthropic in (False, True):  # OpenAI form on the Anthropic route too
        status, headers, body = router_error_parts(gate.refusal(), anthropic=anthropic)
        parsed = json.loads(body)
        assert status == 503 and is_not_leader(status, parsed)
        assert parsed["error"]["code"] == NOT_LEADER_CODE
        assert headers["Retry-After"] == "1"
        assert headers[LEADER_HEADER] == "http://b.example:24157"
    gate.leader_url = None
    assert LEADER_HEADER not in router_error_parts(gate.refusal())[1]


def test_readiness_body_says_role_reason_and_store() -> None:
    gate = LeaderGate.standby("store unreachable", ManualClock())
    body = ready_body(gate, {"kind": "redis", "reachable": False}, fence=None)
    assert body == {
        "ready": False,
        "role": "standby",
        "reason": "store unreachable",
        "store": {"kind": "redis", "reachable": False},
        "fence": None,
    }
    leader = LeaderGate(ManualClock())
    assert ready_body(leader, {"kind": "sqlite"})["ready"] is True
