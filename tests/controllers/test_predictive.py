"""The predictive controller (policy ``predictive``, issue 10)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import (
    KAIROS,
    AgentView,
    ControlDecision,
    FrequencyLevels,
    InstanceSnapshot,
    KairosController,
    make_controller,
)
from controllers.errors import InvalidConfigError
from controllers.kairos import PREDICTIVE_NETS
from controllers.predictive import PredictiveConfig, PredictiveController, confident_positive
from controllers.testing import agent, snapshot
from tests.controllers.conftest import synthetic_observations

LEVELS = FrequencyLevels((660, 825, 975, 1140, 1305, 1470, 1620, 1785))
CAP = 500_000


def _agents(tputs: list[float], ctx: int = 10_000) -> tuple[AgentView, ...]:
    return tuple(
        agent(f"a{i}", ctx, decode_tokens=int(t * 100), llm_time_s=100.0, steps=5)
        for i, t in enumerate(tputs)
    )


def _snap(epoch: int, tputs: list[float], clock: int, obs: int = 0) -> InstanceSnapshot:
    snap = snapshot(*_agents(tputs), now_s=5.0 * epoch + 1000.0, epoch=epoch,
                    capacity_tokens=CAP, clock_mhz=clock)  # fmt: skip
    observations = tuple(synthetic_observations(obs, seed=epoch, t0=epoch * 1000.0))
    return dataclasses.replace(snap, observations=observations)


def _warm(ctrl: PredictiveController, clock: int, tputs: list[float]) -> int:
    """Feed enough observations to pass warm-up; return the next epoch number."""
    ctrl.decide(_snap(0, tputs, clock, obs=200))
    assert ctrl.model.ready
    return 1


def test_registry_builds_predictive() -> None:
    ctrl = make_controller("predictive", LEVELS)
    assert ctrl.name == "predictive"
    assert ctrl.rule.enabled and ctrl.rule is KAIROS.rule


def test_follows_kairos_until_warm() -> None:
    ctrl = PredictiveController(LEVELS)
    kairos = KairosController(LEVELS)
    snap = _snap(0, [60.0, 70.0], 1785, obs=5)
    d = ctrl.decide(snap)
    k = kairos.decide(snap)
    assert (d.level, d.admit, d.defer_admissions) == (k.level, k.admit, k.defer_admissions)
    assert d.warmup and d.reason is k.reason and d.label == f"warmup-{k.reason}"


def test_steps_down_only_after_confidence_and_cooldown() -> None:
    # The confidence mechanics alone: without KAIROS's ceiling (which would drop
    # straight to KAIROS's low context level here).
    cfg = PredictiveConfig(min_samples=4, cooldown_epochs=3, max_step_down=1, kairos_ceiling=False)
    ctrl = PredictiveController(LEVELS, config=cfg)
    epoch = _warm(ctrl, 1785, [80.0, 90.0])
    clock, levels_seen = 1785, []
    for e in range(epoch, epoch + 40):
        d = ctrl.decide(_snap(e, [80.0, 90.0], clock))
        levels_seen.append(d.level)
        clock = d.clock_mhz
    assert levels_seen[0] == LEVELS.count  # one margin sample: not confident yet
    drops = [i for i in range(1, len(levels_seen)) if levels_seen[i] < levels_seen[i - 1]]
    assert drops, "ample slack should eventually step down"
    assert levels_seen[drops[0] - 1] == LEVELS.count
    assert all(b - a >= cfg.cooldown_epochs for a, b in itertools.pairwise(drops))
    assert levels_seen[-1] < LEVELS.count


def test_steps_up_at_once_when_predicted_below_slo() -> None:
    cfg = PredictiveConfig(future_share=1.0, kairos_ceiling=False)
    ctrl = PredictiveController(LEVELS, config=cfg)
    epoch = _warm(ctrl, 975, [80.0])
    # At 975 MHz the slowest agent makes 21.9 tok/s: above τ (no KAIROS boost) but
    # below τ·(1+margin) = 22, so the controller must raise the clock now.
    d = ctrl.decide(_snap(epoch, [21.9, 60.0], 975))
    assert d.level > 3
    assert d.reason == "predicted-slo-up"
    assert not d.boost


def test_kairos_ceiling_caps_proactive_steps_up() -> None:
    """With the ceiling (default) a predicted shortfall raises the clock only up
    to KAIROS's context level; τ itself stays guarded by the boost."""
    cfg = PredictiveConfig(future_share=1.0)
    ctrl = PredictiveController(LEVELS, config=cfg)
    kairos = KairosController(LEVELS)
    epoch = _warm(ctrl, 975, [80.0])
    snap = _snap(epoch, [21.9, 60.0], 975)
    d, k = ctrl.decide(snap), kairos.decide(snap)
    assert not k.boost
    assert d.report is not None and d.report.efficient_floor_level is not None
    assert d.level <= max(k.level, d.report.efficient_floor_level)
    assert d.level < 4  # uncapped it steps above level 3 (previous test)


def _nearly_full(
    ctrl: PredictiveController,
) -> tuple[ControlDecision, InstanceSnapshot, int]:
    """A warm controller's calm decision, then a snapshot with ``U = 0.8·U_max`` (past
    α = 0.75, under γ) and ample throughput slack; and the epoch after it."""
    epoch = _warm(ctrl, 660, [200.0])
    calm = ctrl.decide(_snap(epoch, [200.0, 200.0], 660))
    full = InstanceSnapshot(
        now_s=5.0 * (epoch + 1) + 1000.0,
        epoch=epoch + 1,
        capacity_tokens=CAP,
        ongoing=_agents([200.0, 200.0], ctx=int(0.4 * CAP)),
        clock_mhz=calm.clock_mhz,
    )
    return calm, full, epoch + 2


def test_without_the_eq8_net_the_context_margin_alone_raises_the_clock() -> None:
    """No Eq. 8 jump to the top (``context_high_top``, measured and not adopted,
    is gone): the context margin (no level keeps ``U`` under ``α·U_max``) raises the
    clock, capped by KAIROS's own level."""
    ctrl = PredictiveController(LEVELS)
    calm, full, _ = _nearly_full(ctrl)
    base = KairosController(LEVELS).decide(full)
    d = ctrl.decide(full)
    assert d.reason == "predicted-slo-up" and not d.boost
    assert calm.level < d.level <= base.level


def test_idle_contexts_do_not_pin_the_top_clock_without_pressure() -> None:
    """Long contexts sitting in tool calls do not pin the top clock (on the Claude
    Code trace idle contexts pinned it). The context margin, a thrashing guard like
    admission, still counts them; the KAIROS ceiling bounds what it asks."""
    ctrl = PredictiveController(LEVELS)
    epoch = _warm(ctrl, 660, [200.0])
    calm = ctrl.decide(_snap(epoch, [200.0, 200.0], 660))
    now = 5.0 * (epoch + 1) + 1000.0
    idle = tuple(
        AgentView(f"i{i}", 0.0, int(0.4 * CAP), decode_tokens=20_000, llm_time_s=100.0,
                  completed_steps=5, last_active_s=now - 30.0)
        for i in range(2)
    )  # U = 0.8·U_max: past α, under γ, nobody in flight for 30 s  # fmt: skip
    quiet = InstanceSnapshot(now, epoch + 1, CAP, ongoing=idle, clock_mhz=calm.clock_mhz)
    d = ctrl.decide(quiet)
    assert d.reason != "context-high" and d.level < LEVELS.count
    assert d.report is not None and d.report.slo_margin_by_level[1] < 0


def test_returns_to_its_level_after_a_boost() -> None:
    """A boost is a safety net, not an operating point: once nobody is under τ
    the controller resumes the level it held, instead of walking down from the top."""
    cfg = PredictiveConfig(kairos_ceiling=False)
    ctrl = PredictiveController(LEVELS, config=cfg)
    epoch = _warm(ctrl, 975, [80.0])
    before = ctrl.decide(_snap(epoch, [80.0, 90.0], 975))
    boosted = ctrl.decide(_snap(epoch + 1, [12.0, 90.0], before.clock_mhz))
    assert boosted.boost and boosted.level > before.level
    after = ctrl.decide(_snap(epoch + 2, [80.0, 90.0], boosted.clock_mhz))
    assert not after.boost
    assert after.level == before.level


def test_keeps_kairos_boost() -> None:
    ctrl = PredictiveController(LEVELS)
    epoch = _warm(ctrl, 975, [80.0])
    d = ctrl.decide(_snap(epoch, [12.0, 60.0], 975))
    assert d.boost and d.level == LEVELS.count


@settings(deadline=None)  # each example fits the online model
@given(
    tputs=st.lists(st.floats(1.0, 200.0), min_size=1, max_size=8),
    level=st.integers(1, LEVELS.count),
    slo=st.sampled_from([20.0, 35.0, 45.0]),
)
def test_never_steps_down_without_confidence_and_always_up_when_short(
    tputs: list[float], level: int, slo: float
) -> None:
    cfg = PredictiveConfig(kairos_ceiling=False)
    ctrl = PredictiveController(LEVELS, PREDICTIVE_NETS.varied(slo_tok_s=slo), cfg)
    clock = LEVELS.clock_of(level)
    epoch = _warm(ctrl, clock, tputs)
    # Only one margin sample per level exists: a step down is never confident.
    d = ctrl.decide(_snap(epoch, tputs, clock))
    assert d.level >= level
    reach = LEVELS.clock_of(LEVELS.count) / LEVELS.clock_of(1)
    liftable = [t for t in tputs if t >= slo / reach]  # no clock lifts the others
    if liftable and min(liftable) < slo and level < LEVELS.count:  # below the SLO: up at once
        assert d.level > level


@settings(max_examples=25, deadline=None)
@given(
    tputs=st.lists(st.floats(1.0, 200.0), min_size=1, max_size=8),
    level=st.integers(1, LEVELS.count),
    slo=st.sampled_from([20.0, 35.0, 45.0]),
)
def test_with_the_ceiling_never_above_kairos_outside_boosts(
    tputs: list[float], level: int, slo: float
) -> None:
    ctrl = PredictiveController(LEVELS, PREDICTIVE_NETS.varied(slo_tok_s=slo))
    kairos = KairosController(LEVELS, KAIROS.varied(slo_tok_s=slo))
    clock = LEVELS.clock_of(level)
    epoch = _warm(ctrl, clock, tputs)
    for e in range(epoch, epoch + 5):
        snap = _snap(e, tputs, clock)
        d, k = ctrl.decide(snap), kairos.decide(snap)
        assert d.boost == k.boost
        if not k.boost:
            assert d.report is not None and d.report.efficient_floor_level is not None
            assert d.level <= max(k.level, d.report.efficient_floor_level)
        clock = d.clock_mhz


def test_confident_positive_is_the_two_se_rule() -> None:
    assert not confident_positive([0.5, 0.5, 0.5], 2.0, 4)
    assert confident_positive([0.5, 0.52, 0.49, 0.51], 2.0, 4)
    assert not confident_positive([1.0, -0.9, 1.1, -1.0], 2.0, 4)
    assert not confident_positive([-0.2, -0.2, -0.2, -0.2], 2.0, 4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-5.0, 5.0), min_size=2, max_size=30))
def test_confident_positive_implies_mean_above_two_se(samples: list[float]) -> None:
    if confident_positive(samples, 2.0, 2):
        n = len(samples)
        mean = sum(samples) / n
        var = sum((s - mean) ** 2 for s in samples) / (n - 1)
        assert mean > 0 and mean > 2.0 * (var / n) ** 0.5


def test_config_validation() -> None:
    with pytest.raises(InvalidConfigError):
        PredictiveConfig(margin=-0.1)
    with pytest.raises(InvalidConfigError):
        PredictiveConfig(min_samples=1)
