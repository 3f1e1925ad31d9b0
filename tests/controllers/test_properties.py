"""Hypothesis property tests for the control law as a pipeline of stages, and
placement: every policy's level stays within its levels, the SLO boost always
yields the top level, ``kairos-alg1``'s level is Eq. 8–9 exactly, admission is a
prefix of arrival order within β, and the stages only move the level as they
document."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    KAIROS,
    KAIROS_ALG1,
    AgentView,
    Consolidating,
    FrequencyLevels,
    InstanceLoad,
    InstanceSnapshot,
    KairosController,
    LeastContext,
    PlacementRequest,
    Reason,
    RoundRobin,
)
from controllers.epoch import agent_context
from controllers.kairos import KAIROS_NO_TA, PREDICTIVE_NETS
from controllers.stages import context_level
from controllers.testing import snapshot

levels_st = st.lists(st.integers(100, 2000), min_size=1, max_size=20, unique=True).map(
    lambda xs: FrequencyLevels(tuple(sorted(xs)))
)
cap_st = st.integers(1, 2_000_000)


@given(
    levels_st, cap_st, st.integers(0, 3_000_000), st.integers(0, 3_000_000), st.floats(0.05, 1.0)
)
def test_level_monotone_in_usage(
    levels: FrequencyLevels, cap: int, u1: int, u2: int, alpha: float
) -> None:
    lo, hi = sorted((u1, u2))
    a = context_level(lo, cap, levels.count, alpha)
    b = context_level(hi, cap, levels.count, alpha)
    assert 1 <= a <= b <= levels.count


agents_st = st.lists(
    st.builds(
        AgentView,
        agent_id=st.uuids().map(str),
        arrival_s=st.floats(0, 100),
        context_tokens=st.one_of(st.none(), st.integers(0, 200_000)),
        decode_tokens=st.integers(0, 10_000),
        llm_time_s=st.floats(0, 1000),
        completed_steps=st.integers(0, 50),
        in_flight=st.booleans(),
        last_active_s=st.one_of(st.none(), st.floats(0, 200)),
        prefill_tokens=st.integers(0, 100_000),
    ),
    max_size=12,
    unique_by=lambda a: a.agent_id,
)


def _snapshot(
    ongoing: list[AgentView], pending: list[AgentView], cap: int, tier: int = 0
) -> InstanceSnapshot:
    pending_sorted = tuple(sorted(pending, key=lambda a: a.arrival_s))
    return snapshot(*ongoing, pending=pending_sorted, now_s=200.0, epoch=0, capacity_tokens=cap,
                    offload_tokens=tier)  # fmt: skip


LAWS = (KAIROS, KAIROS_ALG1, KAIROS_NO_TA, PREDICTIVE_NETS)


@given(
    levels_st, cap_st, agents_st, agents_st, st.floats(0, 100), st.integers(0, 10**7),
    st.sampled_from(LAWS),
)  # fmt: skip
def test_every_policy_keeps_its_levels_and_the_boost_is_the_top(
    levels: FrequencyLevels,
    cap: int,
    on: list[AgentView],
    pend: list[AgentView],
    slo: float,
    tier: int,
    law: object,
) -> None:
    policy = law.varied(slo_tok_s=slo)  # type: ignore[attr-defined]
    d = KairosController(levels, policy).decide(_snapshot(on, pend, cap, tier))
    assert 1 <= d.level <= levels.count and d.clock_mhz == levels.clock_of(d.level)
    if d.boost:
        assert d.level == levels.count and d.clock_mhz == levels.max_mhz
        assert d.reason is Reason.SLO_BOOST
    assert d.rule is policy.rule


@given(levels_st, cap_st, agents_st, agents_st, st.integers(0, 10**7))
def test_alg1_s_level_is_eq_8_9_exactly(
    levels: FrequencyLevels, cap: int, on: list[AgentView], pend: list[AgentView], tier: int
) -> None:
    """Algorithm 1 as the paper states it: the level of Eq. 8–9 over every ongoing
    context (whatever their activity, the tier, the queued prefill), or the top one
    when the SLO boost fires."""
    snap = _snapshot(on, pend, cap, tier)
    d = KairosController(levels, KAIROS_ALG1).decide(snap)
    usage = sum(agent_context(a) for a in snap.ongoing)
    eq9 = context_level(usage, cap, levels.count, 0.75)
    assert d.level == (levels.count if d.boost else eq9)
    assert d.level_tokens == d.usage_tokens == usage


@given(levels_st, cap_st, agents_st, agents_st)
def test_admission_is_a_prefix_of_arrival_order(
    levels: FrequencyLevels, cap: int, on: list[AgentView], pend: list[AgentView]
) -> None:
    snap = _snapshot(on, pend, cap)
    d = KairosController(levels).decide(snap)
    order = [a.agent_id for a in snap.pending]
    assert list(d.admit) == order[: len(d.admit)]


@given(levels_st, cap_st, agents_st, agents_st)
def test_no_admission_while_above_beta(
    levels: FrequencyLevels, cap: int, on: list[AgentView], pend: list[AgentView]
) -> None:
    ctrl = KairosController(levels, KAIROS_ALG1)  # every context counts towards admission
    snap = _snapshot(on, pend, cap)
    d = ctrl.decide(snap)
    if d.usage_tokens > ctrl.rule.beta * cap:
        assert d.admit == () and d.defer_admissions
    if d.usage_tokens > 0 and d.admit:
        admitted = sum(agent_context(a) for a in snap.pending if a.agent_id in d.admit)
        assert d.usage_tokens + admitted <= ctrl.rule.beta * cap


loads_st = st.lists(
    st.builds(
        InstanceLoad,
        name=st.text("abcdefgh", min_size=1, max_size=4),
        index=st.integers(0, 50),
        usage_tokens=st.integers(0, 10**6),
        capacity_tokens=st.integers(1, 10**6),
        active=st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda c: c.name,
)


@given(loads_st, st.integers(0, 1000))
def test_placement_only_picks_candidates(cands: list[InstanceLoad], seq: int) -> None:
    names = {c.name for c in cands}
    req = PlacementRequest("a", seq)
    for policy in (Consolidating(), RoundRobin(), LeastContext()):
        assert policy.place(req, cands) in names
