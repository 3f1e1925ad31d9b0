"""Activity (point 6, :class:`~controllers.stages.Activity`): Eq. 9 reads the
working set (agents with a request in flight or one that ended within 10 s), not
every context, unless contexts must drain (agents held here or ``U_res ≥ γ·U_max``);
sessions away past the eviction window (point 14) and idle ones a CPU KV tier holds
(point 13) never press, and admission weighs the same resident usage."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from controllers import (
    KAIROS,
    KAIROS_ALG1,
    FrequencyLevels,
    KairosController,
    Reason,
    make_controller,
)
from controllers.testing import FIVE_LEVELS, active, agent, idle, newcomer, snapshot
from controllers.types import AgentView, InstanceSnapshot

NOW = 100.0
CAP = 200_000
TIER = 2_000_000
PLAIN = KAIROS.varied(busy_floor_context_tokens=50_000, prefill_boost_tokens=None)
"""``kairos`` with a 50K-token busy floor and no prefill boost."""


def _snap(
    *ongoing: AgentView, pending: tuple[AgentView, ...] = (), tier: int = 0
) -> InstanceSnapshot:
    return snapshot(*ongoing, pending=pending, now_s=NOW, capacity_tokens=CAP,
                    offload_tokens=tier)  # fmt: skip


def _idle(aid: str, ctx: int, idle_s: float = 30.0) -> AgentView:
    return idle(aid, ctx, now_s=NOW, idle_s=idle_s)


def test_idle_sessions_do_not_set_the_clock() -> None:
    # Four idle 40K sessions and one 10K request: 170K ≥ α·U_max = 150K pins the top
    # clock under the paper's law; the working set is the one 10K request.
    sessions = [_idle(f"s{i}", 40_000) for i in range(4)]
    snap = _snap(active("a", 10_000), *sessions)
    assert KairosController(FIVE_LEVELS, KAIROS_ALG1).decide(snap).level == 5
    calm = KairosController(FIVE_LEVELS, PLAIN).decide(snap)
    assert calm.level == 1 and calm.level_tokens == 10_000
    # Held agents press: every context counts again (less none evictable here).
    held = dataclasses.replace(snap, pending=(newcomer("p", 1_000, now_s=NOW),))
    pressed = KairosController(FIVE_LEVELS, PLAIN).decide(held)
    assert pressed.level == 5 and pressed.level_tokens == 170_000


def test_a_session_idle_past_the_window_does_not_hold_a_newcomer() -> None:
    # U = 190K ≥ γ·U_max = 190K; 170K of it is one session away for a while.
    ctrl = KairosController(FIVE_LEVELS, PLAIN)
    for idle_s, admitted in ((30.0, ()), (59.0, ()), (60.0, ("p",)), (900.0, ("p",))):
        snap = _snap(active("a", 20_000), _idle("b", 170_000, idle_s),
                     pending=(newcomer("p", 50_000, now_s=NOW),))  # fmt: skip
        decision = ctrl.decide(snap)
        assert decision.admit == admitted, idle_s
        assert decision.usage_tokens == 190_000  # U itself still counts every context


def test_alg1_and_a_measured_usage_count_every_context() -> None:
    snap = _snap(active("a", 20_000), _idle("b", 170_000, 900.0),
                 pending=(newcomer("p", 50_000, now_s=NOW),))  # fmt: skip
    assert make_controller("kairos-alg1", FIVE_LEVELS).decide(snap).admit == ()
    off = KairosController(FIVE_LEVELS, PLAIN.varied(evictable_after_s=None))
    assert off.decide(snap).admit == ()
    measured = dataclasses.replace(snap, usage_tokens=190_000)  # no per-agent activity
    assert KairosController(FIVE_LEVELS, PLAIN).decide(measured).admit == ()


def test_a_session_idle_past_the_window_is_no_pressure() -> None:
    # U = 240K ≥ γ·U_max: within the window that is pressure (every context sets the
    # clock, Eq. 8's top); past it only the 40K active context does.
    ctrl = KairosController(FIVE_LEVELS, PLAIN)
    near = ctrl.decide(_snap(active("a", 40_000), _idle("b", 200_000, 30.0)))
    far = ctrl.decide(_snap(active("a", 40_000), _idle("b", 200_000, 120.0)))
    alone = ctrl.decide(_snap(active("a", 40_000)))
    assert near.level == FIVE_LEVELS.count
    assert far.level == alone.level < FIVE_LEVELS.count


@given(
    at_work=st.lists(st.integers(0, 120_000), max_size=3),
    idle_ones=st.lists(st.integers(0, 120_000), max_size=3),
    away=st.lists(st.tuples(st.integers(0, 300_000), st.floats(60.0, 3600.0)), max_size=4),
    size=st.integers(1, 250_000),
)
def test_sessions_past_the_window_never_change_a_decision(
    at_work: list[int], idle_ones: list[int], away: list[tuple[int, float]], size: int
) -> None:
    """Adding sessions idle past the window, of any size, leaves level, admissions
    and deferral as they were without them."""
    base = [active(f"a{i}", c) for i, c in enumerate(at_work)]
    base += [_idle(f"i{i}", c, 30.0) for i, c in enumerate(idle_ones)]
    extra = [_idle(f"x{i}", c, s) for i, (c, s) in enumerate(away)]
    pending = (newcomer("p", size, now_s=NOW),)
    with_away = KairosController(FIVE_LEVELS, PLAIN).decide(_snap(*base, *extra, pending=pending))
    without = KairosController(FIVE_LEVELS, PLAIN).decide(_snap(*base, pending=pending))
    assert (with_away.level, with_away.admit, with_away.defer_admissions) == (
        without.level, without.admit, without.defer_admissions,
    )  # fmt: skip


def test_a_tier_admits_a_newcomer_that_idle_contexts_would_hold() -> None:
    # U = 190K ≥ γ·U_max = 190K: KAIROS holds the newcomer; 170K of U is idle.
    ongoing = (active("a", 20_000), _idle("b", 170_000))
    held = (newcomer("p", 50_000, now_s=NOW),)
    ctrl = KairosController(FIVE_LEVELS, PLAIN)
    without = ctrl.decide(_snap(*ongoing, pending=held))
    assert without.admit == () and without.offload_tokens == 0
    with_tier = ctrl.decide(_snap(*ongoing, pending=held, tier=TIER))
    assert with_tier.admit == ("p",) and not with_tier.defer_admissions
    assert with_tier.offload_tokens == TIER  # passed on for the router
    # A tier too small for the idle contexts parks only what it holds: still held.
    assert ctrl.decide(_snap(*ongoing, pending=held, tier=60_000)).admit == ()


def test_idle_contexts_past_gamma_are_no_pressure_with_a_tier() -> None:
    # U = 240K ≥ γ·U_max, but only 140K of it is active: the tier turns the
    # long-context ceiling on (points 12–13) and nothing presses.
    snap = _snap(active("a", 140_000), _idle("b", 100_000), tier=TIER)
    ctrl = KairosController(FIVE_LEVELS, PLAIN)
    d = ctrl.decide(snap)
    assert d.level == 3 and d.reason is Reason.BUSY_CEILING
    # Without the tier the same U is pressure: every context counts (Eq. 8's top).
    assert ctrl.decide(dataclasses.replace(snap, offload_tokens=0)).level == 5


def test_active_contexts_past_gamma_still_press() -> None:
    # 190K active ≥ γ·U_max: the running requests' KV must drain, the paper's law stands.
    d = KairosController(FIVE_LEVELS, PLAIN).decide(
        _snap(active("a", 95_000), active("b", 95_000), tier=TIER)
    )
    assert d.level == 5 and d.reason is not Reason.BUSY_CEILING


def test_alg1_ignores_the_tier() -> None:
    assert not KAIROS_ALG1.rule.offload_aware
    snap = _snap(active("a", 20_000), _idle("b", 170_000), pending=(active("p", 50_000),),
                 tier=TIER)  # fmt: skip
    d = make_controller("kairos-alg1", FIVE_LEVELS).decide(snap)
    assert d.admit == () and d.offload_tokens == 0


@given(
    at_work=st.lists(st.integers(0, 150_000), max_size=4),
    idle_ones=st.lists(st.integers(0, 300_000), max_size=4),
)
def test_idle_contexts_a_tier_holds_never_raise_the_level(
    at_work: list[int], idle_ones: list[int]
) -> None:
    """Adding idle sessions to an instance with a large CPU tier leaves its level as
    is (they neither press nor count towards Eq. 9), whatever their size."""
    base = [active(f"a{i}", c) for i, c in enumerate(at_work)]
    extra = [_idle(f"i{i}", c) for i, c in enumerate(idle_ones)]
    more = KairosController(FIVE_LEVELS, PLAIN).decide(_snap(*base, *extra, tier=10**9))
    less = KairosController(FIVE_LEVELS, PLAIN).decide(_snap(*base, tier=10**9))
    assert more.level == less.level


# -- the working set on levels 660–1980 MHz, against Algorithm 1 --------------------------
# On levels whose top is three times the bottom, with 100K of cache.
LEVELS = FrequencyLevels((660, 900, 1200, 1500, 1980))


def view(aid: str, ctx: int, in_flight: bool, last_s: float | None) -> AgentView:
    """An agent at 100 tok/s (no boost) with its activity as given."""
    return agent(aid, ctx, in_flight=in_flight, last_active_s=last_s, decode_tokens=100,
                 llm_time_s=1.0, steps=1)  # fmt: skip


def snapshot_of(
    ongoing: tuple[AgentView, ...], pending: tuple[AgentView, ...] = ()
) -> InstanceSnapshot:
    return snapshot(*ongoing, pending=pending, now_s=100.0)


def paper_level(snap: InstanceSnapshot) -> int:
    return make_controller("kairos-alg1", LEVELS).decide(snap).level


IDLE = (view("a", 35_000, False, 70.0), view("b", 35_000, False, 60.0))  # idle 30 and 40 s


def test_idle_contexts_do_not_raise_the_clock() -> None:
    snap = snapshot_of((*IDLE, view("c", 5_000, True, 99.0)))
    kairos = KairosController(LEVELS).decide(snap)
    paper = make_controller("kairos-alg1", LEVELS).decide(snap)
    assert paper.level == LEVELS.count  # U = 75K ≥ α·U_max
    assert kairos.level == 1  # only c's 5K is working
    assert kairos.usage_tokens == paper.usage_tokens == 75_000  # admission still sees all


def test_recently_active_agents_count() -> None:
    snap = snapshot_of((view("a", 60_000, False, 95.0),))  # ended 5 s ago < idle_after_s
    assert KairosController(LEVELS).decide(snap).level == paper_level(snap) == 4


def test_pressure_brings_back_the_paper_law() -> None:
    # Agents held here (the fleet is full) or U ≥ γ·U_max: contexts must drain.
    held = snapshot_of(IDLE, pending=(agent("p", estimate=40_000, arrival_s=99.0),))
    assert KairosController(LEVELS).decide(held).level == paper_level(held) == 4
    full = snapshot_of((*IDLE, view("c", 26_000, False, 80.0)))  # 96K ≥ γ·U_max
    assert KairosController(LEVELS).decide(full).level == paper_level(full) == LEVELS.count


def test_unknown_activity_is_the_paper_law() -> None:
    snap = snapshot_of((agent("a", 80_000),))
    assert KairosController(LEVELS).decide(snap).level == LEVELS.count
