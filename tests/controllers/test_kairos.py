"""Unit tests for Algorithm 1 (Eq. 6–13), including its boundaries."""

from __future__ import annotations

import pytest

from controllers import (
    AgentView,
    FrequencyLevels,
    InstanceSnapshot,
    InvalidConfigError,
    InvalidSnapshotError,
    KairosConfig,
    KairosController,
    kairos_config_for,
    make_controller,
)
from controllers.kairos import context_level

LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))  # L = 5
CAP = 100_000


def agent(
    aid: str,
    ctx: int | None = None,
    *,
    dec: int = 0,
    t: float = 0.0,
    steps: int = 0,
    arrival: float = 0.0,
    est: int | None = None,
) -> AgentView:
    return AgentView(
        aid,
        arrival,
        context_tokens=ctx,
        estimated_context_tokens=est,
        decode_tokens=dec,
        llm_time_s=t,
        completed_steps=steps,
    )


def snap(
    ongoing: tuple[AgentView, ...] = (),
    pending: tuple[AgentView, ...] = (),
    now: float = 0.0,
    cap: int = CAP,
) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=now, epoch=1, capacity_tokens=cap, ongoing=ongoing, pending=pending
    )


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


def test_zero_capacity_is_a_clear_error() -> None:
    ctrl = KairosController(LEVELS)
    with pytest.raises(InvalidSnapshotError, match="U_max"):
        ctrl.decide(snap(cap=0))


def test_empty_instance_runs_lowest_clock_and_admits_nothing() -> None:
    d = KairosController(LEVELS).decide(snap())
    assert (d.level, d.clock_mhz, d.admit, d.boost, d.defer_admissions) == (
        1,
        600,
        (),
        False,
        False,
    )
    assert d.min_throughput_tok_s is None


def test_usage_is_sum_of_ongoing_contexts_with_placeholder_for_new_agents() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(new_agent_context_tokens=3000))
    d = ctrl.decide(snap(ongoing=(agent("a", 10_000), agent("b"), agent("c", est=7_000))))
    assert d.usage_tokens == 20_000
    assert d.level == 2


def test_slo_boost_when_any_agent_below_tau() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(slo_tok_s=20.0))
    slow = agent("slow", 1000, dec=190, t=10.0, steps=2)  # 19 tok/s
    fast = agent("fast", 1000, dec=500, t=10.0, steps=2)
    d = ctrl.decide(snap(ongoing=(slow, fast)))
    assert d.boost and d.level == 5 and d.clock_mhz == 1400 and d.reason == "slo-boost"
    assert d.min_throughput_tok_s == pytest.approx(19.0)


def test_no_boost_at_exactly_tau() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(slo_tok_s=20.0))
    d = ctrl.decide(snap(ongoing=(agent("a", 1000, dec=200, t=10.0, steps=1),)))
    assert not d.boost and d.level == 1


def test_pending_agent_without_history_enters_min_after_grace() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(pending_grace_s=10.0))
    fresh = ctrl.decide(
        snap(
            pending=(agent("p", arrival=0.0),),
            now=9.9,
            ongoing=(agent("o", 90_000, dec=900, t=10.0, steps=1),),
        )
    )
    assert not fresh.boost
    waited = ctrl.decide(
        snap(
            pending=(agent("p", arrival=0.0),),
            now=10.0,
            ongoing=(agent("o", 90_000, dec=900, t=10.0, steps=1),),
        )
    )
    assert waited.boost and waited.min_throughput_tok_s == 0.0


def test_all_agents_pending_admits_in_arrival_order_up_to_gamma() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(new_agent_context_tokens=30_000))
    pending = tuple(agent(f"p{i}", arrival=float(i)) for i in range(5))
    d = ctrl.decide(snap(pending=pending))
    # 0 → 30k → 60k → 90k (= γ·U_max, stop).
    assert d.admit == ("p0", "p1", "p2")
    assert not d.defer_admissions


def test_admission_never_exceeds_beta_and_is_head_of_line() -> None:
    ctrl = KairosController(LEVELS)
    ongoing = (agent("o", 80_000),)
    pending = (agent("big", 20_000, arrival=1.0), agent("small", 1_000, arrival=2.0))
    d = ctrl.decide(snap(ongoing=ongoing, pending=pending))
    assert d.admit == ()  # 80k + 20k > 95k; "small" may not jump the queue


def test_paper_overshoot_when_beta_check_disabled() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(admit_within_beta=False))
    d = ctrl.decide(snap(ongoing=(agent("o", 80_000),), pending=(agent("big", 20_000),)))
    assert d.admit == ("big",) and d.defer_admissions


def test_empty_instance_admits_an_agent_larger_than_beta() -> None:
    d = KairosController(LEVELS).decide(snap(pending=(agent("huge", 200_000),)))
    assert d.admit == ("huge",)


def test_defer_flag_above_beta() -> None:
    d = KairosController(LEVELS).decide(snap(ongoing=(agent("o", 99_000),)))
    assert d.defer_admissions and d.admit == ()
    d2 = KairosController(LEVELS).decide(snap(ongoing=(agent("o", 98_000),)))
    assert not d2.defer_admissions


def test_default_admits_closer_to_full_than_the_paper() -> None:
    # β, γ = 0.98, 0.95 (docs/control-law.md, point 18) against the paper's 0.95, 0.90:
    # at U = 91K of 100K a 3K newcomer is admitted by ``kairos``, held by ``kairos-paper``.
    s = snap(ongoing=(agent("o", 91_000),), pending=(agent("n", est=3_000),))
    assert KairosController(LEVELS).decide(s).admit == ("n",)
    assert make_controller("kairos-paper", LEVELS).decide(s).admit == ()
    paper = kairos_config_for("kairos-paper")
    assert (paper.beta, paper.gamma) == (0.95, 0.90)


def test_without_thrashing_avoidance_everyone_is_admitted() -> None:
    ctrl = KairosController(LEVELS, KairosConfig(thrashing_avoidance=False))
    d = ctrl.decide(snap(ongoing=(agent("o", 99_000),), pending=(agent("p1"), agent("p2"))))
    assert d.admit == ("p1", "p2") and not d.defer_admissions


def test_measured_usage_overrides_sum() -> None:
    s = InstanceSnapshot(now_s=0, epoch=0, capacity_tokens=CAP, usage_tokens=80_000)
    assert KairosController(LEVELS).decide(s).level == 5


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"alpha": 1.5}, {"gamma": 0.96, "beta": 0.95}, {"slo_tok_s": -1.0}],
)
def test_bad_config_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidConfigError):
        KairosConfig(**kwargs)  # type: ignore[arg-type]
