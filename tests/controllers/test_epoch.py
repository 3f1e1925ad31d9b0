"""Weighing an epoch (controllers/epoch.py): ``U`` (Eq. 6), the sizes of agents
without history (point 1), activity by the rule's windows (points 6 and 14), the
resident usage a CPU KV tier leaves (point 13), context pressure, and Eq. 10 with
the held agents' grace (point 2). Every stage reads these values; none recomputes
one."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers import KAIROS, KAIROS_ALG1, InvalidConfigError, InvalidSnapshotError
from controllers.admission import Activity, activity, resident_tokens
from controllers.epoch import NEW_AGENT_CONTEXT_TOKENS, PENDING_GRACE_S, weigh
from controllers.testing import FIVE_LEVELS, active, agent, idle, newcomer, snapshot

NOW = 100.0
CAP = 200_000
RULE = KAIROS.rule
TIER = 2_000_000


def test_usage_sums_contexts_with_the_estimate_then_the_placeholder() -> None:
    snap = snapshot(agent("a", 10_000), agent("b"), agent("c", estimate=7_000))
    epoch = weigh(snap, FIVE_LEVELS, RULE)
    assert epoch.usage_tokens == 10_000 + NEW_AGENT_CONTEXT_TOKENS + 7_000 == 20_000


def test_a_measured_usage_overrides_the_sum_and_carries_no_activity() -> None:
    snap = snapshot(idle("b", 170_000, now_s=NOW, idle_s=900.0), usage_tokens=190_000,
                    now_s=NOW, capacity_tokens=CAP, offload_tokens=TIER)  # fmt: skip
    epoch = weigh(snap, FIVE_LEVELS, RULE)
    assert epoch.measured and epoch.usage_tokens == epoch.resident_tokens == 190_000
    assert epoch.offload_tokens == 0  # the tier needs per-agent activity


def test_zero_capacity_is_a_clear_error() -> None:
    with pytest.raises(InvalidSnapshotError, match="U_max"):
        weigh(snapshot(capacity_tokens=0), FIVE_LEVELS, RULE)


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


def test_resident_tokens_drops_evictable_contexts_and_parks_idle_ones() -> None:
    contexts = [(100, Activity.ACTIVE), (300, Activity.IDLE), (200, Activity.EVICTABLE)]
    assert resident_tokens(contexts, 0) == 400
    assert resident_tokens(contexts, 10_000) == 100  # the tier parks the idle one too
    idle_ones = [(100, Activity.ACTIVE), (300, Activity.IDLE), (200, Activity.IDLE)]
    assert resident_tokens(idle_ones, 0) == 600  # no tier: U
    # The tier also holds the active blocks: 350 − 100 leaves room for 250 idle.
    assert resident_tokens(idle_ones, 350) == 350
    assert resident_tokens(idle_ones, 50) == 600  # smaller than the active set


@given(
    contexts=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(Activity)), max_size=8),
    tier=st.integers(0, 10**7),
    more=st.integers(0, 10**6),
)
def test_resident_tokens_is_bounded_and_monotone(
    contexts: list[tuple[int, Activity]], tier: int, more: int
) -> None:
    """Never below the active contexts nor above U less the evictable ones; a larger
    tier never needs more room."""
    usage = sum(c for c, a in contexts if a is not Activity.EVICTABLE)
    at_work = sum(c for c, a in contexts if a is Activity.ACTIVE)
    resident = resident_tokens(contexts, tier)
    assert at_work <= resident <= usage
    if tier == 0:
        assert resident == usage  # no tier: every context not evictable needs its room
    assert resident_tokens(contexts, tier + more) <= resident


def test_the_epoch_weighs_by_the_rules_windows_and_tier() -> None:
    snap = snapshot(
        active("a", 20_000),
        idle("b", 100_000, now_s=NOW, idle_s=30.0),
        idle("c", 70_000, now_s=NOW, idle_s=900.0),
        now_s=NOW, capacity_tokens=CAP, offload_tokens=TIER,
    )  # fmt: skip
    kairos = weigh(snap, FIVE_LEVELS, RULE)
    assert kairos.usage_tokens == 190_000  # U itself still counts every context
    assert kairos.held_tokens == 120_000  # less the session away past the window
    assert kairos.resident_tokens == 20_000  # and the idle one the tier holds
    assert kairos.active_contexts == (20_000,)
    assert kairos.offload_tokens == TIER and not kairos.pressed
    paper = weigh(snap, FIVE_LEVELS, KAIROS_ALG1.rule)
    assert paper.resident_tokens == paper.held_tokens == 190_000  # every context counts
    assert paper.offload_tokens == 0 and paper.pressed  # 190K ≥ γ·U_max = 180K


def test_pressure_is_a_held_agent_or_the_resident_usage_at_gamma() -> None:
    calm = snapshot(active("a", 180_000 - 1), now_s=NOW, capacity_tokens=CAP)
    assert not weigh(calm, FIVE_LEVELS, RULE).pressed
    full = snapshot(active("a", 190_000), now_s=NOW, capacity_tokens=CAP)  # γ·U_max = 190K
    assert weigh(full, FIVE_LEVELS, RULE).pressed
    held = dataclasses.replace(calm, pending=(newcomer("p", 1_000, now_s=NOW),))
    assert weigh(held, FIVE_LEVELS, RULE).pressed


def test_a_held_agent_without_history_enters_eq10_at_zero_after_the_grace() -> None:
    def tputs(waited_s: float) -> tuple[tuple[float, bool], ...]:
        snap = snapshot(pending=(newcomer("p", 1_000, now_s=NOW, waited_s=waited_s),),
                        now_s=NOW)  # fmt: skip
        return weigh(snap, FIVE_LEVELS, RULE).throughputs

    assert tputs(PENDING_GRACE_S - 0.1) == ()
    assert tputs(PENDING_GRACE_S) == ((0.0, False),)
    assert weigh(snapshot(pending=(newcomer("p", 1, now_s=NOW, waited_s=3.0),), now_s=NOW),
                 FIVE_LEVELS, RULE, pending_grace_s=2.0).throughputs == ((0.0, False),)  # fmt: skip


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_the_rule_s_windows_are_validated(bad: float) -> None:
    with pytest.raises(InvalidConfigError, match="evictable_after_s"):
        KAIROS.varied(evictable_after_s=bad)
    with pytest.raises(InvalidConfigError, match="idle_after_s"):
        KAIROS.varied(idle_after_s=bad)
