from __future__ import annotations

import pytest

from controllers import (
    FixedClock,
    FrequencyLevels,
    InstanceSnapshot,
    InvalidConfigError,
    NoControl,
    UnknownPolicyError,
    levels_for,
    make_controller,
)
from controllers.testing import agent, snapshot

H100 = list(range(210, 1981, 15))


def test_levels_from_supported_sorted_dedup_and_bounded() -> None:
    lv = FrequencyLevels.from_supported([900, 210, 900, 1980], floor_mhz=300)
    assert lv.clocks_mhz == (900, 1980)
    assert lv.count == 2 and lv.max_mhz == 1980 and lv.min_mhz == 900


def test_num_levels_keeps_both_ends_and_only_supported_clocks() -> None:
    lv = FrequencyLevels.from_supported(H100, floor_mhz=660, ceiling_mhz=1785, num_levels=8)
    assert lv.count == 8
    assert lv.min_mhz == 660 and lv.max_mhz == 1785
    assert set(lv.clocks_mhz) <= set(H100)


def test_num_levels_one_is_the_top_clock() -> None:
    assert FrequencyLevels.from_supported(H100, num_levels=1).clocks_mhz == (1980,)


def test_empty_range_is_an_error() -> None:
    with pytest.raises(InvalidConfigError, match="no supported clock"):
        FrequencyLevels.from_supported(H100, floor_mhz=2500)


def test_unsorted_levels_rejected() -> None:
    with pytest.raises(InvalidConfigError):
        FrequencyLevels((900, 600))


def test_snap_and_level_of() -> None:
    lv = FrequencyLevels((600, 900, 1200))
    assert lv.snap(740) == 600 and lv.snap(760) == 900 and lv.snap(750) == 900
    assert lv.level_of(1000) == 2 and lv.level_of(100) == 1
    assert lv.clock_of(99) == 1200 and lv.clock_of(0) == 600
    # The floor's lookup: lowest clock not below; the top when every clock is below.
    assert lv.level_at_least(900) == 2 and lv.level_at_least(901) == 3
    assert lv.level_at_least(100) == 1 and lv.level_at_least(5000) == 3


def _pending_snapshot() -> InstanceSnapshot:
    return snapshot(pending=(agent("a"), agent("b", arrival_s=1.0)), now_s=2.0, epoch=3,
                    capacity_tokens=10)  # fmt: skip


def test_no_control_runs_max_clock_and_admits_everyone() -> None:
    d = NoControl(FrequencyLevels((600, 1400))).decide(_pending_snapshot())
    assert d.clock_mhz == 1400 and d.admit == ("a", "b") and not d.boost


def test_fixed_clock_snaps_to_supported_level() -> None:
    ctrl = FixedClock(FrequencyLevels((600, 900, 1400)), 880)
    d = ctrl.decide(_pending_snapshot())
    assert d.clock_mhz == 900 and d.level == 2 and ctrl.name == "fixed:900"
    assert d.admit == ("a", "b")


def test_levels_for_adaptive_policies_and_baselines() -> None:
    adaptive = levels_for("kairos", H100)
    assert adaptive.count == 8 and adaptive.min_mhz == 660 and adaptive.max_mhz == 1980
    assert levels_for("kairos", H100, floor_mhz=None, num_levels=None).count == len(H100)
    for baseline in ("no-control", "fixed:900"):
        assert levels_for(baseline, H100).clocks_mhz == tuple(H100)
    assert (
        make_controller("fixed:900", levels_for("fixed:900", H100))
        .decide(snapshot(epoch=0, capacity_tokens=1))
        .clock_mhz
        == 900
    )


def test_registry_names() -> None:
    lv = FrequencyLevels((600, 900, 1400))
    assert make_controller("kairos", lv).name == "kairos"
    assert make_controller("kairos-no-ta", lv).name == "kairos-no-ta"
    assert make_controller("no-control", lv).name == "no-control"
    assert make_controller("fixed:900", lv).name == "fixed:900"
    with pytest.raises(UnknownPolicyError):
        make_controller("fixed:fast", lv)
    with pytest.raises(UnknownPolicyError):
        make_controller("magic", lv)
