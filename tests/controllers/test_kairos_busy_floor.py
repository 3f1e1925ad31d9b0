"""The long-context clock floor (docs/control-law.md, point 11): active agents whose
mean context is long keep the level at or above the memory knee; short contexts,
idle agents and the paper policy do not."""

from __future__ import annotations

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
from controllers.registry import kairos_config_for

LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))
CAP = 10_000_000  # context levels stay at 1 unless the floor lifts them
NOW = 100.0
CFG = KairosConfig(busy_floor_mhz=900, busy_floor_context_tokens=50_000, prefill_boost_tokens=None)


def _snap(*ongoing: AgentView) -> InstanceSnapshot:
    return InstanceSnapshot(now_s=NOW, epoch=3, capacity_tokens=CAP, ongoing=ongoing)


def _active(aid: str, ctx: int) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True)


def _idle(aid: str, ctx: int, idle_s: float = 60.0) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=False, last_active_s=NOW - idle_s)


def test_long_active_context_runs_at_the_first_level_over_the_knee() -> None:
    d = KairosController(LEVELS, CFG).decide(_snap(_active("a", 120_000)))
    assert d.level == 3 and d.clock_mhz == 1000 and d.reason == "busy-floor"


def test_the_mean_over_active_agents_decides() -> None:
    ctrl = KairosController(LEVELS, CFG)
    # 120K + 10K: mean 65K ≥ 50K → floor; 120K + 10K + 10K: mean 46.7K < 50K → none.
    assert ctrl.decide(_snap(_active("a", 120_000), _active("b", 10_000))).level == 3
    short = ctrl.decide(_snap(_active("a", 120_000), _active("b", 10_000), _active("c", 10_000)))
    assert short.level == 1 and short.reason == "context"


def test_idle_agents_neither_lift_nor_dilute() -> None:
    ctrl = KairosController(LEVELS, CFG)
    assert ctrl.decide(_snap(_idle("a", 200_000))).level == 1
    assert ctrl.decide(_snap(_active("a", 120_000), _idle("b", 1_000))).level == 3
    # Active until ``idle_after_s`` (10 s) after its last request.
    assert ctrl.decide(_snap(_idle("a", 200_000, idle_s=5.0))).level == 3


def test_never_lowers_the_context_level() -> None:
    ctrl = KairosController(LEVELS, CFG)
    big = ctrl.decide(
        InstanceSnapshot(
            now_s=NOW, epoch=1, capacity_tokens=200_000, ongoing=(_active("a", 140_000),)
        )
    )
    # Eq. 9: ⌊140K / (0.75·200K) · 4⌋ + 1 = 4, above the floor's level 3: it stands.
    assert big.level == 4 and big.reason == "context"


def test_floor_above_every_level_is_the_top_and_below_every_level_is_off() -> None:
    top = KairosController(LEVELS, KairosConfig(busy_floor_mhz=5_000, busy_floor_context_tokens=0))
    assert top.decide(_snap(_active("a", 1))).level == LEVELS.count
    off = KairosController(LEVELS, KairosConfig(busy_floor_mhz=500, busy_floor_context_tokens=0))
    assert off.decide(_snap(_active("a", 1))).level == 1


def test_on_by_default_off_for_the_paper_and_predictive() -> None:
    assert KairosConfig().busy_floor_mhz is not None
    assert kairos_config_for("kairos-paper").busy_floor_mhz is None
    assert kairos_config_for("predictive").busy_floor_mhz is None
    paper = KairosController(LEVELS, kairos_config_for("kairos-paper"))
    assert paper.decide(_snap(_active("a", 300_000))).level == 1


@pytest.mark.parametrize(
    "changes", [{"busy_floor_mhz": 0}, {"busy_floor_mhz": -1}, {"busy_floor_context_tokens": -1}]
)
def test_bad_values_are_rejected(changes: dict[str, int]) -> None:
    with pytest.raises(InvalidConfigError):
        KairosConfig(**changes)  # type: ignore[arg-type]


@given(
    contexts=st.lists(st.integers(0, 400_000), min_size=1, max_size=6),
    active=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_the_floor_only_ever_raises_the_level(contexts: list[int], active: list[bool]) -> None:
    """Same admissions; a level never below the law's without the floor, and
    above it only when the active agents' mean context reaches the threshold."""
    agents = tuple(
        _active(f"a{i}", c) if on else _idle(f"a{i}", c)
        for i, (c, on) in enumerate(zip(contexts, active, strict=False))
    )
    snap = InstanceSnapshot(now_s=NOW, epoch=1, capacity_tokens=1_000_000, ongoing=agents)
    with_floor = KairosController(LEVELS, CFG).decide(snap)
    without = KairosController(
        LEVELS, KairosConfig(busy_floor_mhz=None, prefill_boost_tokens=None)
    ).decide(snap)
    assert with_floor.level >= without.level and with_floor.admit == without.admit
    assert with_floor.defer_admissions == without.defer_admissions
    on = [c for c, a in zip(contexts, active, strict=False) if a]
    lifted = with_floor.level > without.level
    assert lifted <= (bool(on) and sum(on) >= 50_000 * len(on))
    if on and sum(on) >= 50_000 * len(on):
        assert with_floor.clock_mhz >= 1000
