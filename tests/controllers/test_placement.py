from __future__ import annotations

import pytest

from controllers import (
    Consolidating,
    InstanceLoad,
    InvalidSnapshotError,
    LeastContext,
    PlacementRequest,
    ReassignmentConfig,
    ReassignmentRule,
    RoundRobin,
    UnknownPolicyError,
    make_placement_policy,
)

CAP = 100


def inst(name: str, idx: int, u: int, active: bool = True) -> InstanceLoad:
    return InstanceLoad(name=name, index=idx, usage_tokens=u, capacity_tokens=CAP, active=active)


REQ = PlacementRequest(agent_id="a", sequence=0)


def test_consolidating_picks_lowest_index_under_theta() -> None:
    cands = [inst("g0", 0, 60), inst("g1", 1, 49), inst("g2", 2, 0)]
    assert Consolidating().place(REQ, cands) == "g1"


def test_consolidating_spreads_to_least_usage_when_all_heavy() -> None:
    cands = [inst("g0", 0, 60), inst("g1", 1, 90), inst("g2", 2, 55)]
    assert Consolidating().place(REQ, cands) == "g2"


def test_consolidating_threshold_is_strict() -> None:
    cands = [inst("g0", 0, 50), inst("g1", 1, 70)]
    assert Consolidating().place(REQ, cands) == "g0"  # spread: least U
    assert Consolidating(theta_cons=0.6).place(REQ, [inst("g1", 1, 70), inst("g0", 0, 50)]) == "g0"


def test_round_robin_cycles_by_sequence() -> None:
    cands = [inst("g1", 1, 0), inst("g0", 0, 0)]
    picks = [RoundRobin().place(PlacementRequest("a", s), cands) for s in range(4)]
    assert picks == ["g0", "g1", "g0", "g1"]


def test_least_context() -> None:
    assert LeastContext().place(REQ, [inst("g0", 0, 5), inst("g1", 1, 4)]) == "g1"


def test_no_candidates_is_an_error() -> None:
    with pytest.raises(InvalidSnapshotError):
        Consolidating().place(REQ, [])


def test_make_placement() -> None:
    assert make_placement_policy("round-robin").name == "round-robin"
    with pytest.raises(UnknownPolicyError):
        make_placement_policy("random")


def test_reassignment_waits_for_interval() -> None:
    rule = ReassignmentRule()
    cands = [inst("g0", 0, 80), inst("g1", 1, 10)]
    d = rule.decide("g0", 7, cands)
    assert d.target is None and not d.reset_counter


def test_reassignment_moves_on_rho_imbalance_to_active_instance() -> None:
    rule = ReassignmentRule()
    cands = [inst("g0", 0, 80), inst("g1", 1, 40), inst("g2", 2, 0, active=False)]
    d = rule.decide("g0", 8, cands)
    assert d.target == "g1" and d.reset_counter


def test_reassignment_stays_below_rho_but_resets_counter() -> None:
    rule = ReassignmentRule(ReassignmentConfig(rho=2.0))
    d = rule.decide("g0", 8, [inst("g0", 0, 79), inst("g1", 1, 40)])
    assert d.target is None and d.reset_counter


def test_idle_instance_is_never_a_target() -> None:
    d = ReassignmentRule().decide("g0", 9, [inst("g0", 0, 80), inst("g1", 1, 0, active=False)])
    assert d.target is None


def test_disabled_reassignment() -> None:
    rule = ReassignmentRule(ReassignmentConfig(enabled=False))
    assert rule.decide("g0", 100, [inst("g0", 0, 80), inst("g1", 1, 1)]).target is None


# ---- Algorithm 3 weighs instances, not agents ------------------------------------------


def test_default_moves_even_when_the_move_reverses_the_imbalance() -> None:
    """The paper's Algorithm 3: ``U_i ≥ ρ·U_j`` is enough, whatever the agent's size."""
    d = ReassignmentRule().decide("g0", 8, [inst("g0", 0, 80), inst("g1", 1, 30)], 60)
    assert d.target == "g1"
