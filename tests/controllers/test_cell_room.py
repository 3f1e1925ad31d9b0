"""The cell-room rule (controllers/cell_room.py): the fleet-wide admission rule one
cell up, with the agents started but not yet placed counted as placed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controllers.admission import ADMIT_ALL, AdmissionRule, InstanceGate, admits_now
from controllers.cell_room import cell_has_room
from controllers.placement import InstanceLoad

RULE = AdmissionRule(beta=0.98, gamma=0.95)


def gate(name: str, usage: int, capacity: int = 10_000, **kw: object) -> InstanceGate:
    return InstanceGate(InstanceLoad(name, 0, usage, capacity), **kw)  # type: ignore[arg-type]


def test_room_when_one_instance_admits_the_newcomer() -> None:
    assert cell_has_room([gate("i0", 9_600), gate("i1", 1_000)], [], 3_000, RULE)


def test_no_room_when_every_instance_is_past_gamma() -> None:
    assert not cell_has_room([gate("i0", 9_600), gate("i1", 9_500)], [], 3_000, RULE)


def test_no_eligible_instance_is_no_room() -> None:
    assert not cell_has_room([], [], 3_000, RULE)


def test_started_agents_not_yet_placed_take_the_room_first() -> None:
    # 10K cache, 3K placeholder: three starts fit under beta, a fourth does not.
    one = [gate("i0", 0)]
    assert cell_has_room(one, [3_000, 3_000], 3_000, RULE)
    assert not cell_has_room(one, [3_000, 3_000, 3_000], 3_000, RULE)


def test_a_held_agent_or_a_deferring_daemon_closes_an_instance() -> None:
    assert not cell_has_room([gate("i0", 0, held=1)], [], 3_000, RULE)
    assert not cell_has_room([gate("i0", 0, defer=True)], [], 3_000, RULE)
    assert cell_has_room([gate("i0", 0, held=1), gate("i1", 0)], [], 3_000, RULE)


def test_unknown_capacity_or_no_admission_control_always_has_room() -> None:
    assert cell_has_room([gate("i0", 50_000, capacity=0)], [9_000] * 5, 3_000, RULE)
    assert cell_has_room([gate("i0", 9_900, rule=ADMIT_ALL)], [], 3_000, RULE)


@given(
    usages=st.lists(st.integers(0, 12_000), min_size=1, max_size=4),
    size=st.integers(1, 12_000),
)
def test_without_unplaced_agents_it_is_fleet_admission(usages: list[int], size: int) -> None:
    """With nothing reserved, a cell has room exactly when fleet admission would place
    the newcomer as admitted now on one of its instances."""
    gates = [gate(f"i{k}", u) for k, u in enumerate(usages)]
    assert cell_has_room(gates, [], size, RULE) == any(admits_now(g, size, RULE) for g in gates)


@given(
    usages=st.lists(st.integers(0, 12_000), min_size=1, max_size=4),
    reserved=st.lists(st.integers(1, 5_000), max_size=6),
)
def test_reserving_more_never_makes_room(usages: list[int], reserved: list[int]) -> None:
    gates = [gate(f"i{k}", u) for k, u in enumerate(usages)]
    if cell_has_room(gates, [*reserved, 2_000], 3_000, RULE):
        assert cell_has_room(gates, reserved, 3_000, RULE)
