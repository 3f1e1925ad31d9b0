"""Confident placement and reassignment (placement ``confident``, docs/beyond.md §3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import (
    ConfidentPlacement,
    ConfidentReassignment,
    ConfidentReassignmentConfig,
    InstanceLoad,
    PlacementRequest,
    make_placement_policy,
)
from controllers.errors import InvalidSnapshotError

CAP = 500_000


def _loads(*usage: int, active: tuple[bool, ...] | None = None) -> list[InstanceLoad]:
    act = active or tuple(u > 0 for u in usage)
    return [
        InstanceLoad(f"i{n}", n, u, CAP, a) for n, (u, a) in enumerate(zip(usage, act, strict=True))
    ]


def test_registry_builds_confident() -> None:
    assert make_placement_policy("confident").name == "confident"
    assert make_placement_policy("consolidating").name == "consolidating"


def test_place_accounts_for_the_newcomer_size() -> None:
    p = ConfidentPlacement(theta=0.5)
    # i0 has 240k: Algorithm 2 would add a 20k agent there (240k < 250k) and cross θ.
    loads = _loads(240_000, 100_000)
    assert p.place(PlacementRequest("a", 0, 20_000), loads) == "i1"
    assert p.place(PlacementRequest("a", 0, 5_000), loads) == "i0"


def test_place_wakes_an_idle_instance_only_when_active_ones_are_full() -> None:
    p = ConfidentPlacement(theta=0.5)
    assert p.place(PlacementRequest("a", 0, 5_000), _loads(260_000, 0)) == "i1"
    assert p.place(PlacementRequest("a", 0, 5_000), _loads(260_000, 270_000)) == "i0"
    with pytest.raises(InvalidSnapshotError):
        p.place(PlacementRequest("a", 0, 5_000), [])


def test_moves_only_from_a_hot_instance_after_confirmation() -> None:
    rule = ConfidentReassignment(ConfidentReassignmentConfig(interval_requests=8, confirm=2))
    hot = _loads(400_000, 50_000)

    def ask(steps: int) -> str | None:
        d = rule.decide_agent(
            "i0", steps, hot, agent_id="a", context_tokens=20_000, completed_steps=10
        )
        assert d.reset_counter == (steps >= 8)
        return d.target

    assert ask(7) is None  # not yet T requests
    assert ask(8) is None  # seen once: not confident
    assert ask(8) == "i1"


def test_no_move_when_source_is_not_under_pressure() -> None:
    """Algorithm 3 would move here (300k ≥ 2·100k); the move buys no power."""
    rule = ConfidentReassignment(ConfidentReassignmentConfig(confirm=1))
    d = rule.decide_agent(
        "i0", 8, _loads(300_000, 100_000), agent_id="a", context_tokens=20_000, completed_steps=30
    )
    assert d.target is None


def test_no_move_for_a_young_agent() -> None:
    """Recomputing 20k tokens for an agent with 2 requests of history does not pay."""
    rule = ConfidentReassignment(ConfidentReassignmentConfig(confirm=1))
    d = rule.decide_agent(
        "i0", 8, _loads(400_000, 50_000), agent_id="a", context_tokens=20_000, completed_steps=2
    )
    assert d.target is None


COOL = ConfidentReassignmentConfig().cool
HOT = ConfidentReassignmentConfig().hot


@st.composite
def _hot_fleet(draw: st.DrawFn, roomy: bool) -> tuple[list[int], int]:
    """A hot i0 and, around it, instances lighter by a quarter of U_max or more (a
    move there pays after 8 requests) yet too full for the agent's context; with
    ``roomy``, also one or two that have room for it. Usage > 0: all active."""
    ctx = draw(st.integers(1000, 100_000))
    source = draw(st.integers(int(HOT * CAP), CAP))
    too_full = st.integers(int(COOL * CAP) - ctx + 1, source - CAP // 4)
    others = draw(st.lists(too_full, min_size=1, max_size=3))
    if roomy:
        others += draw(st.lists(st.integers(1, int(COOL * CAP) - ctx), min_size=1, max_size=2))
    return [source, *draw(st.permutations(others))], ctx


def _decide(usage: list[int], ctx: int, steps: int) -> str | None:
    rule = ConfidentReassignment(ConfidentReassignmentConfig(confirm=1))
    return rule.decide_agent(
        "i0", 8, _loads(*usage), agent_id="a", context_tokens=ctx, completed_steps=steps
    ).target


@settings(max_examples=80, deadline=None)
@given(fleet=_hot_fleet(roomy=False), steps=st.integers(8, 100))
def test_a_move_never_overfills_the_target(fleet: tuple[list[int], int], steps: int) -> None:
    """Every other instance is lighter enough to pay for the move but would cross
    θ_cool with the agent on it: the agent stays (Algorithm 3 would move it)."""
    usage, ctx = fleet
    assert _decide(usage, ctx, steps) is None


@settings(max_examples=80, deadline=None)
@given(fleet=_hot_fleet(roomy=True), steps=st.integers(8, 100))
def test_a_move_goes_to_the_least_loaded_instance_with_room(
    fleet: tuple[list[int], int], steps: int
) -> None:
    usage, ctx = fleet
    target = _decide(usage, ctx, steps)
    assert target is not None
    chosen = usage[int(target.removeprefix("i"))]
    assert chosen + ctx <= COOL * CAP
    assert chosen == min(u for u in usage[1:] if u + ctx <= COOL * CAP)
