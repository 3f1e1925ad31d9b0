"""Overflow relief (controllers.admission.overflow_target, control-law point 10): an
agent whose request cannot fit beside the requests running on its instance moves
to the instance of least context with room by Eq. 13; idle contexts move nobody.
With no room anywhere, it waits in the hold queue (controllers.admission.holds_overflow,
point 16)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from controllers import InstanceLoad
from controllers.admission import (
    ADMIT_ALL,
    AdmissionRule,
    InstanceGate,
    holds_overflow,
    overflow_target,
)
from tests.branches import Branches

CAP = 100_000
RULE = AdmissionRule()  # β = 0.95, γ = 0.90


def gate(name: str, idx: int, u: int, held: int = 0, defer: bool = False) -> InstanceGate:
    return InstanceGate(InstanceLoad(name, idx, u, CAP, active=u > 0), held=held, defer=defer)


FLEET = [gate("i0", 0, 130_000), gate("i1", 1, 60_000), gate("i2", 2, 30_000)]


def test_moves_to_least_context_with_room_when_the_request_cannot_fit() -> None:
    # 60K running beside a 50K agent > U_max: i2 (least context, 30K + 50K ≤ 95K)
    assert overflow_target("a", "i0", 50_000, 60_000, FLEET, RULE) == "i2"


def test_idle_contexts_move_nobody() -> None:
    # U_i0 = 130K > U_max, but only 40K run beside the agent: vLLM evicts idle caches
    assert overflow_target("a", "i0", 50_000, 40_000, FLEET, RULE) is None


def test_stays_when_no_instance_has_room_by_eq_13() -> None:
    full = [FLEET[0], gate("i1", 1, 90_000), gate("i2", 2, 50_000)]  # ≥ γ; 50K + 50K > β
    assert overflow_target("a", "i0", 50_000, 60_000, full, RULE) is None
    assert overflow_target("a", "i0", 50_000, 60_000, [*full, gate("i3", 3, 45_000)], RULE) == (
        "i3"  # 45K + 50K = 95K ≤ β·U_max
    )


def test_sessions_away_past_the_eviction_window_leave_room_on_a_target() -> None:
    # i1 holds 90K (≥ γ·U_max), 60K of it sessions away past the window (point 14):
    # vLLM gives that room to whoever needs it, so the agent moves there. Ranking
    # still weighs every context: with i2 also open, i2 (less U) wins.
    away = InstanceGate(InstanceLoad("i1", 1, 90_000, CAP, active=True), evictable_tokens=60_000)
    assert (
        overflow_target("a", "i0", 50_000, 60_000, [FLEET[0], gate("i1", 1, 90_000)], RULE) is None
    )
    assert overflow_target("a", "i0", 50_000, 60_000, [FLEET[0], away], RULE) == "i1"
    assert overflow_target("a", "i0", 50_000, 60_000, [FLEET[0], away, FLEET[2]], RULE) == "i2"


def test_held_agents_or_a_deferring_daemon_on_the_target_do_not_stop_it() -> None:
    # the mover's context is already in the fleet: the move admits nobody
    fleet = [FLEET[0], gate("i1", 1, 20_000, held=2, defer=True)]
    assert overflow_target("a", "i0", 50_000, 60_000, fleet, RULE) == "i1"


def test_room_is_judged_by_eq_13_also_without_admission_control() -> None:
    off = AdmissionRule(enabled=False)
    assert overflow_target("a", "i0", 50_000, 60_000, FLEET, off) == "i2"
    full = [FLEET[0], gate("i1", 1, 90_000)]
    assert overflow_target("a", "i0", 50_000, 60_000, full, off) is None


def test_unknown_instance_or_empty_agent_stays() -> None:
    assert overflow_target("a", "gone", 50_000, 60_000, FLEET, RULE) is None
    assert overflow_target("a", "i0", 0, 200_000, FLEET, RULE) is None


ROOMY_OR_FULL = st.one_of(st.integers(0, CAP), st.integers(int(RULE.gamma * CAP), 2 * CAP))


@given(st.lists(ROOMY_OR_FULL, min_size=1, max_size=6), st.integers(1, CAP), st.data())
def test_no_move_while_the_request_fits_beside_the_running_ones(
    usages: list[int], size: int, data: st.DataObject
) -> None:
    running = data.draw(st.integers(0, CAP - size))
    gates = [gate(f"i{k}", k, u) for k, u in enumerate(usages)]
    assert overflow_target("a", "i0", size, running, gates, RULE) is None


def test_a_target_is_another_instance_with_room_and_the_least_loaded_one() -> None:
    """The request overflows i0 beside those running there; the other instances
    are each roomy or full (seeds 1-20, 100 examples each: no room elsewhere in
    32-59, a move in 41-68)."""
    branches = Branches()

    @given(st.lists(ROOMY_OR_FULL, min_size=1, max_size=6), st.integers(1, CAP), st.data())
    def check(usages: list[int], size: int, data: st.DataObject) -> None:
        running = data.draw(st.integers(CAP - size + 1, 2 * CAP))
        gates = [gate(f"i{k}", k, u) for k, u in enumerate(usages)]
        target = overflow_target("a", "i0", size, running, gates, RULE)

        def room(u: int) -> bool:
            return u == 0 or (u < RULE.gamma * CAP and u + size <= RULE.beta * CAP)

        fits = [g.load for g in gates[1:] if room(g.load.usage_tokens)]
        if not fits:
            branches.reached("no room elsewhere")
            assert target is None
            return
        branches.reached("moves")
        assert target is not None and target != "i0"
        chosen = next(g.load for g in gates if g.load.name == target)
        assert room(chosen.usage_tokens)
        assert chosen.usage_tokens == min(f.usage_tokens for f in fits)

    check()
    branches.require(**{"no room elsewhere": 10, "moves": 10})


def test_held_back_only_when_the_request_overflows_beside_running_ones() -> None:
    # Point 16: overflow relief found no room (the caller asks only then).
    here = gate("i0", 0, 130_000)
    assert holds_overflow(50_000, 60_000, here, RULE)  # 110K > U_max
    assert not holds_overflow(50_000, 40_000, here, RULE)  # idle contexts: vLLM evicts them
    assert not holds_overflow(150_000, 0, here, RULE)  # alone: waiting frees nothing
    assert not holds_overflow(0, 200_000, here, RULE)


def test_nobody_is_held_back_without_admission_control() -> None:
    here = gate("i0", 0, 130_000)
    assert not holds_overflow(50_000, 60_000, here, AdmissionRule(enabled=False))
    free = dataclasses.replace(here, rule=ADMIT_ALL)  # no-control, fixed clocks
    assert not holds_overflow(50_000, 60_000, free, RULE)
    unknown = gate("i0", 0, 130_000)
    unknown = dataclasses.replace(
        unknown, load=dataclasses.replace(unknown.load, capacity_tokens=0)
    )
    assert not holds_overflow(50_000, 60_000, unknown, RULE)


@given(st.integers(0, 2 * CAP), st.integers(0, 2 * CAP), st.integers(0, 3 * CAP))
def test_held_back_exactly_when_running_contexts_leave_it_no_room(
    size: int, running: int, usage: int
) -> None:
    held = holds_overflow(size, running, gate("i0", 0, usage), RULE)
    assert held == (size > 0 and running > 0 and running + size > CAP)
    # Whenever it is held back, overflow relief would have moved it had any room existed.
    if held:
        assert overflow_target("a", "i0", size, running, [gate("i0", 0, usage)], RULE) is None
