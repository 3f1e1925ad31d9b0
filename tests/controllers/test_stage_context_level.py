"""The context level (Eq. 8–9, :class:`~controllers.stages.ContextLevel`) and Eq. 9
over a window (point 17, :class:`~controllers.stages.WindowedContextLevel`): while
nothing presses the level follows the working set's mean over ``context_window_s``,
so a session stepping between requests and tool calls does not swing the clock;
pressure and Eq. 8's ``α·U_max`` act at once; ``kairos-alg1`` reads each epoch's
own value."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    KAIROS,
    KAIROS_ALG1,
    AgentView,
    InstanceSnapshot,
    InvalidConfigError,
    KairosController,
    Reason,
)
from controllers.kairos import PREDICTIVE_NETS
from controllers.stages import ContextLevel, WindowedContextLevel, context_level
from controllers.testing import FIVE_LEVELS, active, newcomer, snapshot

CAP = 100_000
WIDE = 1_000_000  # α·U_max = 750K: level ⌊W / 750K · 4⌋ + 1
EPOCH_S = 5.0
WINDOW_S = 60.0
WINDOWED = KAIROS.varied(prefill_boost_tokens=None, busy_floor_mhz=None, context_window_s=WINDOW_S)
"""``kairos`` with a 60 s window and neither prefill boost nor busy floor."""


def test_eq9_linear_partition_of_safe_region() -> None:
    # α·U_max = 75_000 split into L-1 = 4 intervals of 18_750 tokens.
    assert context_level(0, CAP, 5, 0.75) == 1
    assert context_level(18_749, CAP, 5, 0.75) == 1
    assert context_level(18_750, CAP, 5, 0.75) == 2
    assert context_level(56_250, CAP, 5, 0.75) == 4
    assert context_level(74_999, CAP, 5, 0.75) == 4


def test_eq8_exactly_at_alpha_umax_is_max_level() -> None:
    assert context_level(75_000, CAP, 5, 0.75) == 5
    assert context_level(10**9, CAP, 5, 0.75) == 5


def test_single_level_and_two_levels() -> None:
    assert context_level(0, CAP, 1, 0.75) == 1
    assert context_level(74_999, CAP, 2, 0.75) == 1
    assert context_level(75_000, CAP, 2, 0.75) == 2


def test_empty_instance_runs_lowest_clock_and_admits_nothing() -> None:
    d = KairosController(FIVE_LEVELS).decide(snapshot())
    assert (d.level, d.clock_mhz, d.admit, d.boost, d.defer_admissions) == (
        1, 600, (), False, False,
    )  # fmt: skip
    assert d.min_throughput_tok_s is None and d.reason is Reason.CONTEXT


def test_the_level_reads_usage_and_says_context_or_context_high() -> None:
    ctrl = KairosController(FIVE_LEVELS, KAIROS_ALG1)
    assert ctrl.decide(snapshot(active("a", 20_000))).level == 2
    high = ctrl.decide(snapshot(usage_tokens=80_000))
    assert high.level == 5 and high.reason is Reason.CONTEXT_HIGH


@pytest.mark.parametrize("alpha", [0.0, 1.5, -0.1])
def test_alpha_is_validated(alpha: float) -> None:
    with pytest.raises(InvalidConfigError, match="alpha"):
        ContextLevel(alpha=alpha)


def _snap(t: float, working: int, pending: tuple[AgentView, ...] = ()) -> InstanceSnapshot:
    """An instance at ``t`` whose one agent has a ``working``-token request in flight
    (none when 0)."""
    ongoing = (active("a", working),) if working else ()
    return snapshot(*ongoing, pending=pending, now_s=t, epoch=int(t / EPOCH_S),
                    capacity_tokens=WIDE)  # fmt: skip


def _levels(ctrl: KairosController, workings: list[int]) -> list[int]:
    return [ctrl.decide(_snap(i * EPOCH_S, w)).level for i, w in enumerate(workings)]


def test_a_session_between_request_and_tool_call_does_not_swing_the_clock() -> None:
    swing = [600_000, 0] * 12
    # Each epoch's own: 600K → level 4, nothing active → level 1 (no Activity stage in
    # kairos-alg1, but with nothing in flight U is the one 600K context or none).
    assert set(_levels(KairosController(FIVE_LEVELS, KAIROS_ALG1), swing)) == {1, 4}
    # Over 60 s (12 epochs): half of them at 600K, mean 300K → level 2, epoch after epoch.
    assert _levels(KairosController(FIVE_LEVELS, WINDOWED), swing)[12:] == [2] * 12


def test_pressure_acts_at_once() -> None:
    ctrl = KairosController(FIVE_LEVELS, WINDOWED)
    _levels(ctrl, [0] * 12)
    held = (newcomer("h", 50_000, now_s=12 * EPOCH_S, waited_s=0.0),)
    assert ctrl.decide(_snap(12 * EPOCH_S, 600_000, pending=held)).level == 4
    # Calm again: the pressed epoch was not recorded, the mean is of the calm ones.
    assert ctrl.decide(_snap(13 * EPOCH_S, 600_000)).level == context_level(
        600_000 // 12, WIDE, FIVE_LEVELS.count, 0.75
    )


def test_eq8_acts_at_once() -> None:
    ctrl = KairosController(FIVE_LEVELS, WINDOWED)
    _levels(ctrl, [0] * 12)
    d = ctrl.decide(_snap(12 * EPOCH_S, 800_000))
    assert d.level == FIVE_LEVELS.count and d.reason is Reason.CONTEXT_HIGH


def test_the_window_forgets() -> None:
    ctrl = KairosController(FIVE_LEVELS, WINDOWED)
    assert _levels(ctrl, [600_000] * 12 + [0] * 12)[-1] == 1
    assert ctrl.decide(_snap(24 * EPOCH_S, 0)).level == 1


def test_one_instant_is_one_sample_and_a_clock_going_back_replaces_later_ones() -> None:
    ctrl = KairosController(FIVE_LEVELS, WINDOWED)
    assert ctrl.decide(_snap(100.0, 600_000)).level == 4
    # Decided again at the same instant, the first decision does not dilute it.
    assert ctrl.decide(_snap(100.0, 0)).level == 1
    assert ctrl.decide(_snap(105.0, 600_000)).level == 2  # mean of 0 and 600K
    assert ctrl.decide(_snap(50.0, 600_000)).level == 4  # back in time: only this one


def test_each_controller_keeps_its_own_window() -> None:
    one, two = KairosController(FIVE_LEVELS, WINDOWED), KairosController(FIVE_LEVELS, WINDOWED)
    _levels(one, [600_000] * 12)
    assert two.decide(_snap(60.0, 0)).level == 1  # nothing of one's epochs in two's mean


@given(st.lists(st.tuples(st.integers(0, 740_000), st.floats(0.5, 30.0)), min_size=1, max_size=40))
def test_the_level_stays_within_the_window_s_own_levels(steps: list[tuple[int, float]]) -> None:
    ctrl = KairosController(FIVE_LEVELS, WINDOWED)
    seen: list[tuple[float, int]] = []
    t = 0.0
    for working, dt in steps:
        t += dt
        seen.append((t, context_level(working, WIDE, FIVE_LEVELS.count, 0.75)))
        own = [lv for ts, lv in seen if ts > t - WINDOW_S]
        assert min(own) <= ctrl.decide(_snap(t, working)).level <= max(own)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_the_window_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(InvalidConfigError, match="context_window_s"):
        WindowedContextLevel(context_window_s=bad)


def test_the_window_is_kairos_s_not_alg1_s_nor_predictive_s() -> None:
    assert KAIROS.setting("context_window_s") == 120.0
    assert not any(isinstance(s, WindowedContextLevel) for s in KAIROS_ALG1.stages)
    assert not any(isinstance(s, WindowedContextLevel) for s in PREDICTIVE_NETS.stages)
