"""KAIROS on an engine with a CPU KV tier (docs/control-law.md, point 13): idle
contexts the tier holds need no room in HBM, so they neither hold newcomers nor
press; active contexts still do; without a tier the law is unchanged."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from controllers import AgentView, InstanceSnapshot, KairosController
from controllers.admission import (
    Activity,
    AdmissionRule,
    InstanceGate,
    admits_now,
    resident_tokens,
)
from controllers.placement import InstanceLoad
from controllers.registry import kairos_config_for, make_controller
from tests.controllers.test_kairos_busy_ceiling import CAP, CFG, LEVELS, NOW

PLAIN = dataclasses.replace(CFG, busy_ceiling=False)
TIER = 2_000_000


def _active(aid: str, ctx: int) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=True)


def _idle(aid: str, ctx: int) -> AgentView:
    # Idle past idle_after_s (10 s), within the eviction window (60 s, point 14).
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=False, last_active_s=NOW - 30.0)


def _snap(
    *ongoing: AgentView, pending: tuple[AgentView, ...] = (), tier: int = TIER
) -> InstanceSnapshot:
    return InstanceSnapshot(
        now_s=NOW, epoch=2, capacity_tokens=CAP, ongoing=ongoing, pending=pending,
        offload_tokens=tier,
    )  # fmt: skip


def test_resident_tokens_parks_idle_contexts_up_to_what_the_tier_has_left() -> None:
    contexts = [(100, Activity.ACTIVE), (300, Activity.IDLE), (200, Activity.IDLE)]
    assert resident_tokens(contexts, 0) == 600  # no tier: U
    assert resident_tokens(contexts, 10_000) == 100  # every idle context parked
    # The tier also holds the active blocks: 350 − 100 leaves room for 250 idle.
    assert resident_tokens(contexts, 350) == 350
    assert resident_tokens(contexts, 50) == 600  # smaller than the active set


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
    active = sum(c for c, a in contexts if a is Activity.ACTIVE)
    resident = resident_tokens(contexts, tier)
    assert active <= resident <= usage
    if tier == 0:
        assert resident == usage  # no tier: every context not evictable needs its room
    assert resident_tokens(contexts, tier + more) <= resident


def test_a_tier_admits_a_newcomer_that_idle_contexts_would_hold() -> None:
    # U = 190K ≥ γ·U_max = 180K: KAIROS holds the newcomer; 170K of U is idle.
    ongoing = (_active("a", 20_000), _idle("b", 170_000))
    newcomer = (AgentView("p", 1.0, estimated_context_tokens=50_000, waiting_since_s=1.0),)
    ctrl = KairosController(LEVELS, PLAIN)
    without = ctrl.decide(_snap(*ongoing, pending=newcomer, tier=0))
    assert without.admit == () and without.offload_tokens == 0
    with_tier = ctrl.decide(_snap(*ongoing, pending=newcomer))
    assert with_tier.admit == ("p",) and not with_tier.defer_admissions
    assert with_tier.offload_tokens == TIER  # passed on for the router
    # A tier too small for the idle contexts parks only what it holds: still held.
    assert ctrl.decide(_snap(*ongoing, pending=newcomer, tier=60_000)).admit == ()


def test_fleet_gate_admits_against_the_resident_usage() -> None:
    rule = AdmissionRule()
    load = InstanceLoad("i0", 0, usage_tokens=190_000, capacity_tokens=CAP)
    assert not admits_now(InstanceGate(load), 50_000, rule)
    assert admits_now(InstanceGate(load, resident_tokens=20_000), 50_000, rule)


def test_idle_contexts_past_gamma_are_no_pressure_with_a_tier() -> None:
    # U = 240K ≥ γ·U_max = 180K, but only 140K of it is active: the tier turns the
    # long-context ceiling on (point 12) and nothing presses.
    snap = _snap(_active("a", 140_000), _idle("b", 100_000))
    ctrl = KairosController(LEVELS, PLAIN)
    d = ctrl.decide(snap)
    assert d.level == 3 and d.reason == "busy-ceiling"
    # Without the tier the same U is pressure: every context counts (Eq. 8's top).
    assert ctrl.decide(dataclasses.replace(snap, offload_tokens=0)).level == 5


def test_active_contexts_past_gamma_still_press() -> None:
    # 190K active ≥ γ·U_max: the running requests' KV must drain, the paper's law stands.
    d = KairosController(LEVELS, PLAIN).decide(_snap(_active("a", 95_000), _active("b", 95_000)))
    assert d.level == 5 and d.reason != "busy-ceiling"


def test_kairos_paper_ignores_the_tier() -> None:
    assert not kairos_config_for("kairos-paper").offload_aware
    ctrl = make_controller("kairos-paper", LEVELS)
    snap = _snap(_active("a", 20_000), _idle("b", 170_000), pending=(_active("p", 50_000),))
    d = ctrl.decide(snap)
    assert d.admit == () and d.offload_tokens == 0


def test_a_measured_usage_carries_no_activity_and_ignores_the_tier() -> None:
    snap = dataclasses.replace(
        _snap(_idle("b", 170_000), pending=(_active("p", 50_000),)), usage_tokens=190_000
    )
    assert KairosController(LEVELS, PLAIN).decide(snap).admit == ()


@given(
    active=st.lists(st.integers(0, 150_000), max_size=4),
    idle=st.lists(st.integers(0, 300_000), max_size=4),
)
def test_idle_contexts_a_tier_holds_never_raise_the_level(
    active: list[int], idle: list[int]
) -> None:
    """Adding idle sessions to an instance with a large CPU tier leaves its level as
    is (they neither press nor count towards Eq. 9), whatever their size."""
    ctrl = KairosController(LEVELS, PLAIN)
    base = [_active(f"a{i}", c) for i, c in enumerate(active)]
    extra = [_idle(f"i{i}", c) for i, c in enumerate(idle)]
    assert ctrl.decide(_snap(*base, *extra)).level == ctrl.decide(_snap(*base)).level
