"""KAIROS's eviction window (docs/control-law.md, point 14): a session idle past
``evictable_after_s`` holds only evictable prefix cache in vLLM, so it neither holds
newcomers nor presses; sessions idle for less, and every session under
``kairos-paper``, still count."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import AgentView, InstanceSnapshot, KairosConfig, KairosController
from controllers.admission import Activity, activity, resident_tokens
from controllers.errors import InvalidConfigError
from controllers.registry import kairos_config_for, make_controller
from tests.controllers.test_kairos_busy_ceiling import CAP, CFG, LEVELS, NOW

PLAIN = dataclasses.replace(CFG, busy_ceiling=False)
"""The default window (60 s) and activity window (10 s)."""


def _active(aid: str, ctx: int) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True)


def _idle_for(aid: str, ctx: int, idle_s: float) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=False, last_active_s=NOW - idle_s)


def _newcomer(ctx: int = 50_000) -> tuple[AgentView, ...]:
    return (AgentView("p", 1.0, estimated_context_tokens=ctx, waiting_since_s=NOW - 1.0),)


def _snap(*ongoing: AgentView, pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=NOW, epoch=1, capacity_tokens=CAP, ongoing=ongoing, pending=pending
    )


def test_activity_classifies_by_both_windows() -> None:
    def of(in_flight: bool, last: float | None, evict: float | None = 60.0) -> Activity:
        return activity(in_flight, last, NOW, 10.0, evict)

    assert of(True, NOW - 500.0) is Activity.ACTIVE  # a request in flight
    assert of(False, None) is Activity.ACTIVE  # unknown activity: the paper
    assert of(False, NOW - 5.0) is Activity.ACTIVE
    assert of(False, NOW - 30.0) is Activity.IDLE
    assert of(False, NOW - 60.0) is Activity.EVICTABLE
    assert of(False, NOW - 600.0, evict=None) is Activity.IDLE  # no window: never
    assert of(False, NOW - 5.0, evict=1.0) is Activity.ACTIVE  # active wins


def test_resident_tokens_drops_evictable_contexts() -> None:
    contexts = [(100, Activity.ACTIVE), (300, Activity.IDLE), (200, Activity.EVICTABLE)]
    assert resident_tokens(contexts, 0) == 400
    assert resident_tokens(contexts, 10_000) == 100  # the tier parks the idle one too


def test_a_session_idle_past_the_window_does_not_hold_a_newcomer() -> None:
    # U = 190K ≥ γ·U_max = 180K; 170K of it is one session away for a while.
    ctrl = KairosController(LEVELS, PLAIN)
    for idle_s, admitted in ((30.0, ()), (59.0, ()), (60.0, ("p",)), (900.0, ("p",))):
        snap = _snap(_active("a", 20_000), _idle_for("b", 170_000, idle_s), pending=_newcomer())
        decision = ctrl.decide(snap)
        assert decision.admit == admitted, idle_s
        assert decision.usage_tokens == 190_000  # U itself still counts every context


def test_kairos_paper_and_measured_usage_count_every_context() -> None:
    assert kairos_config_for("kairos-paper").evictable_after_s is None
    assert kairos_config_for("kairos").evictable_after_s == 60.0
    snap = _snap(_active("a", 20_000), _idle_for("b", 170_000, 900.0), pending=_newcomer())
    assert make_controller("kairos-paper", LEVELS).decide(snap).admit == ()
    off = KairosController(LEVELS, dataclasses.replace(PLAIN, evictable_after_s=None))
    assert off.decide(snap).admit == ()
    measured = dataclasses.replace(snap, usage_tokens=190_000)  # no per-agent activity
    assert KairosController(LEVELS, PLAIN).decide(measured).admit == ()


def test_a_session_idle_past_the_window_is_no_pressure() -> None:
    # U = 240K ≥ γ·U_max: within the window that is pressure (every context sets the
    # clock, Eq. 8's top); past it only the 40K active context does.
    ctrl = KairosController(LEVELS, PLAIN)
    near = ctrl.decide(_snap(_active("a", 40_000), _idle_for("b", 200_000, 30.0)))
    far = ctrl.decide(_snap(_active("a", 40_000), _idle_for("b", 200_000, 120.0)))
    alone = ctrl.decide(_snap(_active("a", 40_000)))
    assert near.level == LEVELS.count
    assert far.level == alone.level < LEVELS.count


@given(
    active=st.lists(st.integers(0, 120_000), max_size=3),
    idle=st.lists(st.integers(0, 120_000), max_size=3),
    away=st.lists(st.tuples(st.integers(0, 300_000), st.floats(60.0, 3600.0)), max_size=4),
    newcomer=st.integers(1, 250_000),
)
def test_sessions_past_the_window_never_change_a_decision(
    active: list[int], idle: list[int], away: list[tuple[int, float]], newcomer: int
) -> None:
    """Adding sessions idle past the window, of any size, leaves level, admissions
    and deferral as they were without them."""
    ctrl = KairosController(LEVELS, PLAIN)
    base = [_active(f"a{i}", c) for i, c in enumerate(active)]
    base += [_idle_for(f"i{i}", c, 30.0) for i, c in enumerate(idle)]
    extra = [_idle_for(f"x{i}", c, s) for i, (c, s) in enumerate(away)]
    pending = _newcomer(newcomer)
    with_away = ctrl.decide(_snap(*base, *extra, pending=pending))
    without = ctrl.decide(_snap(*base, pending=pending))
    assert (with_away.level, with_away.admit, with_away.defer_admissions) == (
        without.level,
        without.admit,
        without.defer_admissions,
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_the_window_is_validated(bad: float) -> None:
    with pytest.raises(InvalidConfigError, match="evictable_after_s"):
        KairosConfig(evictable_after_s=bad)
