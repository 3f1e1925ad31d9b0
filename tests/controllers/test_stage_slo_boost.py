"""The SLO boost (Eq. 10–12, :class:`~controllers.stages.SloBoost`): the top level
while the slowest agent is under τ, held agents without history entering at 0
after the grace (point 2); and ``kairos``'s boost only for agents a clock can lift
(point 7, :class:`~controllers.stages.ReachableSloBoost`)."""

from __future__ import annotations

import math

import pytest

from controllers import (
    KAIROS,
    KAIROS_ALG1,
    InvalidConfigError,
    KairosController,
    Reason,
    make_controller,
)
from controllers.stages import SloBoost
from controllers.testing import FIVE_LEVELS, agent, newcomer, snapshot, throughput
from controllers.types import AgentView
from tests.controllers.test_stage_activity import LEVELS, snapshot_of


def test_slo_boost_when_any_agent_below_tau() -> None:
    d = KairosController(FIVE_LEVELS).decide(
        snapshot(throughput("slow", 19.0), throughput("fast", 50.0))
    )
    assert d.boost and d.level == 5 and d.clock_mhz == 1400 and d.reason is Reason.SLO_BOOST
    assert d.min_throughput_tok_s == pytest.approx(19.0)


def test_no_boost_at_exactly_tau() -> None:
    d = KairosController(FIVE_LEVELS).decide(snapshot(throughput("a", 20.0)))
    assert not d.boost and d.level == 1


def test_tau_is_the_policy_s_and_the_operator_s() -> None:
    snap = snapshot(throughput("a", 25.0))
    assert not KairosController(FIVE_LEVELS).decide(snap).boost
    assert KairosController(FIVE_LEVELS, KAIROS.varied(slo_tok_s=30.0)).decide(snap).boost


def test_pending_agent_without_history_enters_min_after_grace() -> None:
    busy = agent("o", 90_000, decode_tokens=900, llm_time_s=10.0, steps=1)  # 90 tok/s
    ctrl = KairosController(FIVE_LEVELS)
    fresh = ctrl.decide(snapshot(busy, pending=(newcomer("p", 1, now_s=9.9, waited_s=9.9),),
                                 now_s=9.9))  # fmt: skip
    assert not fresh.boost
    waited = ctrl.decide(snapshot(busy, pending=(newcomer("p", 1, now_s=10.0, waited_s=10.0),),
                                  now_s=10.0))  # fmt: skip
    assert waited.boost and waited.min_throughput_tok_s == 0.0


def test_an_agent_no_clock_can_lift_does_not_pin_the_top_clock() -> None:
    # f(L)/f(1) = 1400/600: under 20·600/1400 = 8.6 tok/s no clock reaches τ.
    snap = snapshot(throughput("huge-prompt", 8.0), throughput("ok", 40.0))
    kairos = KairosController(FIVE_LEVELS).decide(snap)
    assert not kairos.boost and kairos.min_throughput_tok_s == pytest.approx(8.0)
    paper = KairosController(FIVE_LEVELS, KAIROS_ALG1).decide(snap)
    assert paper.boost and paper.reason is Reason.SLO_BOOST
    # One a clock can lift still boosts, under both.
    liftable = snapshot(throughput("slow", 10.0))
    assert KairosController(FIVE_LEVELS).decide(liftable).boost


def test_held_agents_past_the_grace_still_boost_under_kairos() -> None:
    held = (newcomer("p", 1_000, now_s=100.0, waited_s=30.0),)
    assert KairosController(FIVE_LEVELS).decide(snapshot(pending=held, now_s=100.0)).boost


@pytest.mark.parametrize("tau", [-1.0, math.nan, math.inf])
def test_tau_is_validated(tau: float) -> None:
    with pytest.raises(InvalidConfigError, match="slo_tok_s"):
        SloBoost(slo_tok_s=tau)


# -- on levels whose top is three times the bottom ------------------------------------------
def slow(aid: str, tput_tok_s: float) -> AgentView:
    return throughput(aid, tput_tok_s)


def test_boost_ignores_agents_no_clock_can_lift() -> None:
    # f(L)/f(1) = 3: an agent under τ/3 = 6.7 tok/s stays under τ at any clock.
    hopeless = snapshot_of((slow("huge-prompt", 5.0),))
    assert not KairosController(LEVELS).decide(hopeless).boost
    assert make_controller("kairos-alg1", LEVELS).decide(hopeless).boost
    liftable = snapshot_of((slow("huge-prompt", 5.0), slow("lagging", 12.0)))
    assert KairosController(LEVELS).decide(liftable).boost


def test_held_agents_still_trigger_the_draining_boost() -> None:
    waiting = newcomer("p", 1_000, now_s=100.0, waited_s=50.0)
    snap = snapshot_of((slow("ok", 30.0),), pending=(waiting,))  # held 50 s > grace
    assert KairosController(LEVELS).decide(snap).boost
