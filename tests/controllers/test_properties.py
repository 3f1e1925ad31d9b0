"""Hypothesis property tests for the control law and placement."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    AgentView,
    Consolidating,
    FrequencyLevels,
    InstanceLoad,
    InstanceSnapshot,
    KairosConfig,
    KairosController,
    LeastContext,
    PlacementRequest,
    RoundRobin,
)
from controllers.kairos import context_level

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
    ),
    max_size=12,
    unique_by=lambda a: a.agent_id,
)


def _snapshot(ongoing: list[AgentView], pending: list[AgentView], cap: int) -> InstanceSnapshot:
    pending_sorted = tuple(sorted(pending, key=lambda a: a.arrival_s))
    return InstanceSnapshot(
        now_s=200.0, epoch=0, capacity_tokens=cap, ongoing=tuple(ongoing), pending=pending_sorted
    )


@given(levels_st, cap_st, agents_st, agents_st, st.floats(0, 100))
def test_boost_always_yields_max_level(
    levels: FrequencyLevels, cap: int, on: list[AgentView], pend: list[AgentView], slo: float
) -> None:
    d = KairosController(levels, KairosConfig(slo_tok_s=slo)).decide(_snapshot(on, pend, cap))
    if d.boost:
        assert d.level == levels.count and d.clock_mhz == levels.max_mhz
    assert d.clock_mhz in levels.clocks_mhz


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
    ctrl = KairosController(levels)
    snap = _snapshot(on, pend, cap)
    d = ctrl.decide(snap)
    if d.usage_tokens > ctrl.config.beta * cap:
        assert d.admit == () and d.defer_admissions
    if d.usage_tokens > 0 and d.admit:
        admitted = sum(ctrl.agent_context(a) for a in snap.pending if a.agent_id in d.admit)
        assert d.usage_tokens + admitted <= ctrl.config.beta * cap


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
