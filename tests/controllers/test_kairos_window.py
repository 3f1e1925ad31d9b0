"""Eq. 9 over a window (docs/control-law.md, point 17): while nothing presses, the
level follows the working set's mean over ``context_window_s``, so a session
stepping between requests and tool calls does not swing the clock; pressure and
Eq. 8's ``α·U_max`` act at once, and ``kairos-paper`` keeps each epoch's own."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    AgentView,
    FrequencyLevels,
    InstanceSnapshot,
    InvalidConfigError,
    KairosConfig,
    KairosController,
)
from controllers.kairos import context_level
from controllers.registry import kairos_config_for

LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))
CAP = 1_000_000  # α·U_max = 750K: level ⌊W / 750K · 4⌋ + 1
EPOCH_S = 5.0
WINDOW_S = 60.0
CFG = KairosConfig(prefill_boost_tokens=None, busy_floor_mhz=None, context_window_s=WINDOW_S)


def _snap(t: float, working: int, pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    """An instance at ``t`` whose one agent has a ``working``-token request in flight
    (none when 0)."""
    ongoing = (AgentView("a", 0.0, context_tokens=working, in_flight=True),) if working else ()
    return InstanceSnapshot(
        now_s=t, epoch=int(t / EPOCH_S), capacity_tokens=CAP, ongoing=ongoing, pending=pending
    )


def _levels(ctrl: KairosController, workings: list[int]) -> list[int]:
    return [ctrl.decide(_snap(i * EPOCH_S, w)).level for i, w in enumerate(workings)]


def test_a_session_between_request_and_tool_call_does_not_swing_the_clock() -> None:
    swing = [600_000, 0] * 12
    # Each epoch's own: 600K → level 4, nothing active → level 1.
    assert set(_levels(KairosController(LEVELS, kairos_config_for("kairos-paper")), swing)) == {
        1,
        4,
    }
    # Over 60 s (12 epochs): half of them at 600K, mean 300K → level 2, epoch after epoch.
    windowed = _levels(KairosController(LEVELS, CFG), swing)
    assert windowed[12:] == [2] * 12


def test_pressure_acts_at_once() -> None:
    ctrl = KairosController(LEVELS, CFG)
    _levels(ctrl, [0] * 12)
    held = (AgentView("h", 0.0, estimated_context_tokens=50_000, waiting_since_s=60.0),)
    assert ctrl.decide(_snap(12 * EPOCH_S, 600_000, pending=held)).level == 4
    # Calm again: the pressed epoch was not recorded, the mean is of the calm ones.
    assert ctrl.decide(_snap(13 * EPOCH_S, 600_000)).level == context_level(
        600_000 // 12, CAP, LEVELS.count, CFG.alpha
    )


def test_eq8_acts_at_once() -> None:
    ctrl = KairosController(LEVELS, CFG)
    _levels(ctrl, [0] * 12)
    d = ctrl.decide(_snap(12 * EPOCH_S, 800_000))
    assert d.level == LEVELS.count and d.reason == "context-high"


def test_the_window_forgets() -> None:
    ctrl = KairosController(LEVELS, CFG)
    assert _levels(ctrl, [600_000] * 12 + [0] * 12)[-1] == 1
    assert ctrl.decide(_snap(24 * EPOCH_S, 0)).level == 1


def test_one_instant_is_one_sample_and_a_clock_going_back_replaces_later_ones() -> None:
    ctrl = KairosController(LEVELS, CFG)
    assert ctrl.decide(_snap(100.0, 600_000)).level == 4
    # Decided again at the same instant, the first decision does not dilute it.
    assert ctrl.decide(_snap(100.0, 0)).level == 1
    assert ctrl.decide(_snap(105.0, 600_000)).level == 2  # mean of 0 and 600K
    assert ctrl.decide(_snap(50.0, 600_000)).level == 4  # back in time: only this one


@given(st.lists(st.tuples(st.integers(0, 740_000), st.floats(0.5, 30.0)), min_size=1, max_size=40))
def test_the_level_stays_within_the_window_s_own_levels(steps: list[tuple[int, float]]) -> None:
    ctrl = KairosController(LEVELS, CFG)
    seen: list[tuple[float, int]] = []
    t = 0.0
    for working, dt in steps:
        t += dt
        seen.append((t, context_level(working, CAP, LEVELS.count, CFG.alpha)))
        own = [lv for ts, lv in seen if ts > t - WINDOW_S]
        assert min(own) <= ctrl.decide(_snap(t, working)).level <= max(own)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_the_window_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(InvalidConfigError, match="context_window_s"):
        KairosConfig(context_window_s=bad)


def test_on_by_default_off_for_the_paper_and_predictive() -> None:
    assert KairosConfig().context_window_s == 120.0
    assert kairos_config_for("kairos").context_window_s == 120.0
    assert kairos_config_for("kairos-paper").context_window_s is None
    assert kairos_config_for("predictive").context_window_s is None
