"""Fleet admission (controllers/admission.py): newcomers go where they are admitted
now, held agents move to any instance with room, and the activity-aware clock."""

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
    PlacementRequest,
    RoundRobin,
    make_controller,
)
from controllers.admission import (
    AdmissionRule,
    HeldAgent,
    InstanceGate,
    admit_in_order,
    admits_now,
    new_agent_tokens,
    place,
    rehome_held,
)
from tests.branches import Branches

CAP = 100_000
RULE = AdmissionRule()


def gate(name: str, idx: int, u: int, held: int = 0, defer: bool = False) -> InstanceGate:
    load = InstanceLoad(name, idx, u, CAP, active=u > 0)
    return InstanceGate(load, held=held, defer=defer)


def test_newcomer_skips_an_instance_that_would_hold_it() -> None:
    # Algorithm 2 alone picks g0 (U < θ·U_max) although a 60K session cannot be admitted there.
    gates = [gate("g0", 0, 40_000), gate("g1", 1, 0)]
    request = PlacementRequest("big", 0, 60_000)
    assert Consolidating().place(request, [g.load for g in gates]) == "g0"
    assert place(Consolidating(), request, gates, RULE).instance == "g1"
    assert place(Consolidating(), request, gates, RULE).admit_now


def test_consolidation_stays_when_the_lowest_instance_has_room() -> None:
    gates = [gate("g0", 0, 20_000), gate("g1", 1, 0)]
    choice = place(Consolidating(), PlacementRequest("small", 0, 3_000), gates, RULE)
    assert choice.instance == "g0" and choice.admit_now


def test_newcomer_is_held_only_when_no_instance_has_room() -> None:
    gates = [gate("g0", 0, 96_000), gate("g1", 1, 95_500, held=1), gate("g2", 2, 97_000)]
    choice = place(Consolidating(), PlacementRequest("x", 0, 3_000), gates, RULE)
    assert not choice.admit_now
    assert choice.instance == "g1"  # Algorithm 2's spread rule: least U_i


def test_an_instance_admits_by_its_own_daemons_thresholds() -> None:
    # The fleet rule (β, γ = 0.98, 0.95) admits a 3K agent at U = 91K; an instance
    # whose kairos-paper daemon sent the paper's 0.95, 0.90 does not (point 18).
    assert admits_now(gate("g", 0, 91_000), 3_000, RULE)
    paper = InstanceGate(InstanceLoad("g", 0, 91_000, CAP, active=True), thresholds=(0.95, 0.90))
    assert not admits_now(paper, 3_000, RULE)
    assert paper.rule_here(RULE) == AdmissionRule(beta=0.95, gamma=0.90)
    assert gate("g", 0, 0).rule_here(RULE) is RULE


def test_queue_and_defer_block_the_fast_path() -> None:
    assert not admits_now(gate("g", 0, 0, held=1), 10, RULE)  # head-of-line
    assert not admits_now(gate("g", 0, 0, defer=True), 10, RULE)
    assert admits_now(gate("g", 0, 0), CAP * 2, RULE)  # an empty instance admits its head
    no_control = InstanceGate(InstanceLoad("g", 0, CAP, CAP), defer=True, admission_control=False)
    assert admits_now(no_control, CAP, RULE)


def test_held_agent_moves_to_an_instance_with_room_in_arrival_order() -> None:
    gates = [gate("g0", 0, 90_000, held=2), gate("g1", 1, 50_000), gate("g2", 2, 80_000)]
    held = [HeldAgent("a", "g0", 30_000), HeldAgent("b", "g0", 30_000)]
    moves = rehome_held(Consolidating(), held, gates, RULE)
    # a fits on g1 (80K ≤ 95K); then g1 is at 80K and b fits nowhere.
    assert [(m.agent_id, m.source, m.target) for m in moves] == [("a", "g0", "g1")]


def test_held_agent_never_jumps_another_instance_queue() -> None:
    gates = [gate("g0", 0, 90_000, held=1), gate("g1", 1, 0, held=1)]
    assert rehome_held(Consolidating(), [HeldAgent("a", "g0", 1_000)], gates, RULE) == ()


def test_round_robin_rehoming_numbers_its_placements() -> None:
    gates = [gate("g0", 0, 95_000, held=2), gate("g1", 1, 0), gate("g2", 2, 0)]
    held = [HeldAgent("a", "g0", 1_000), HeldAgent("b", "g0", 1_000)]
    moves = rehome_held(RoundRobin(), held, gates, RULE, sequence=0)
    assert [m.target for m in moves] == ["g1", "g2"]


def test_new_agent_size_is_its_prompt_or_nothing_beyond_the_engine_limit() -> None:
    assert new_agent_tokens(None, 3000, 0) == 3000
    assert new_agent_tokens(262_144, 3000, 262_144) == 262_144
    assert new_agent_tokens(262_145, 3000, 262_144) == 0  # vLLM rejects it: holds no cache
    assert new_agent_tokens(10_000, 3000, 262_144) == 10_000


def test_an_agent_that_brings_no_context_is_never_held() -> None:
    # Every instance past γ·U_max with agents queued: a sized newcomer waits, but one
    # whose prompt the engine rejects at once (size 0) gets that answer now.
    gates = [gate("g0", 0, 95_000, held=2), gate("g1", 1, 92_000, held=1, defer=True)]
    assert not place(Consolidating(), PlacementRequest("a", 0, 1), gates, RULE).admit_now
    choice = place(Consolidating(), PlacementRequest("b", 1, 0), gates, RULE)
    assert choice.admit_now and choice.instance in ("g0", "g1")


def test_rehoming_never_overfills_and_matches_the_per_instance_rule() -> None:
    """Every move lands where Eq. 13 admits it on top of earlier moves; and an
    agent left held has no instance (other than its own) that would admit it.

    Instances are empty or at least half full and agents up to half an instance,
    so one pass moves some agents and leaves others held, often one that fitted
    somewhere until an earlier move took the room (seeds 1-20, 100 examples each:
    moved 90-100, left held 28-65, of them fitted before 24-49)."""
    branches = Branches()

    @given(
        loads=st.lists(st.one_of(st.just(0), st.integers(CAP // 2, CAP)), min_size=1, max_size=3),
        sizes=st.lists(st.integers(5_000, CAP // 2), min_size=3, max_size=8),
    )
    def check(loads: list[int], sizes: list[int]) -> None:
        gates = [gate(f"g{i}", i, u) for i, u in enumerate(loads)]
        held = [HeldAgent(f"a{k}", "elsewhere", s) for k, s in enumerate(sizes)]
        moves = rehome_held(Consolidating(), held, gates, RULE)
        usage = {g.load.name: g.load.usage_tokens for g in gates}
        moved = {m.agent_id for m in moves}
        for m in moves:
            size = next(h.context_tokens for h in held if h.agent_id == m.agent_id)
            admitted, _ = admit_in_order(((m.agent_id, size),), usage[m.target], CAP, RULE)
            assert admitted
            usage[m.target] += size
        if moves:
            branches.reached("moved")
        left = [h for h in held if h.agent_id not in moved]
        for h in left:  # usage only grows, so an agent left held fits nowhere at the end
            for u in usage.values():
                assert not admit_in_order(((h.agent_id, h.context_tokens),), u, CAP, RULE)[0]
        if left:
            branches.reached("left held")
        if any(admits_now(g, h.context_tokens, RULE) for h in left for g in gates):
            branches.reached("left held, fitted before the moves")

    check()
    branches.require(**{"moved": 50, "left held": 10, "left held, fitted before the moves": 8})


# ------------------------------------------------------------ activity-aware clock
LEVELS = FrequencyLevels((660, 900, 1200, 1500, 1980))


def view(aid: str, ctx: int, in_flight: bool, last_s: float | None) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=ctx, in_flight=in_flight, last_active_s=last_s,
                     decode_tokens=100, llm_time_s=1.0, completed_steps=1)  # fmt: skip


def snapshot(
    ongoing: tuple[AgentView, ...], pending: tuple[AgentView, ...] = ()
) -> InstanceSnapshot:
    return InstanceSnapshot(now_s=100.0, epoch=1, capacity_tokens=CAP, ongoing=ongoing,
                            pending=pending)  # fmt: skip


def paper_level(snap: InstanceSnapshot) -> int:
    return make_controller("kairos-paper", LEVELS).decide(snap).level


IDLE = (view("a", 35_000, False, 70.0), view("b", 35_000, False, 60.0))  # idle 30 and 40 s


def test_idle_contexts_do_not_raise_the_clock() -> None:
    snap = snapshot((*IDLE, view("c", 5_000, True, 99.0)))
    kairos = KairosController(LEVELS).decide(snap)
    paper = make_controller("kairos-paper", LEVELS).decide(snap)
    assert paper.level == LEVELS.count  # U = 75K ≥ α·U_max
    assert kairos.level == 1  # only c's 5K is working
    assert kairos.usage_tokens == paper.usage_tokens == 75_000  # admission still sees all


def test_recently_active_agents_count() -> None:
    snap = snapshot((view("a", 60_000, False, 95.0),))  # ended 5 s ago < idle_after_s
    assert KairosController(LEVELS).decide(snap).level == paper_level(snap) == 4


def test_pressure_brings_back_the_paper_law() -> None:
    # Agents held here (the fleet is full) or U ≥ γ·U_max: contexts must drain.
    held = snapshot(IDLE, pending=(AgentView("p", 99.0, estimated_context_tokens=40_000),))
    assert KairosController(LEVELS).decide(held).level == paper_level(held) == 4
    full = snapshot((*IDLE, view("c", 26_000, False, 80.0)))  # 96K ≥ γ·U_max
    assert KairosController(LEVELS).decide(full).level == paper_level(full) == LEVELS.count


def test_unknown_activity_is_the_paper_law() -> None:
    snap = snapshot((AgentView("a", 0.0, context_tokens=80_000),))
    assert KairosController(LEVELS, KairosConfig()).decide(snap).level == LEVELS.count


def slow(aid: str, tput_tok_s: float) -> AgentView:
    return AgentView(aid, 0.0, context_tokens=1_000, decode_tokens=int(tput_tok_s * 10),
                     llm_time_s=10.0, completed_steps=3, in_flight=True)  # fmt: skip


def test_boost_ignores_agents_no_clock_can_lift() -> None:
    # f(L)/f(1) = 3: an agent under τ/3 = 6.7 tok/s stays under τ at any clock.
    hopeless = snapshot((slow("huge-prompt", 5.0),))
    assert not KairosController(LEVELS).decide(hopeless).boost
    assert make_controller("kairos-paper", LEVELS).decide(hopeless).boost
    liftable = snapshot((slow("huge-prompt", 5.0), slow("lagging", 12.0)))
    assert KairosController(LEVELS).decide(liftable).boost


def test_held_agents_still_trigger_the_draining_boost() -> None:
    waiting = AgentView("p", 0.0, estimated_context_tokens=1_000, waiting_since_s=50.0)
    snap = snapshot((slow("ok", 30.0),), pending=(waiting,))  # held 50 s > grace
    assert KairosController(LEVELS).decide(snap).boost
