"""The simulator drives the router's admission and placement, not a copy of them:
fed the same state, the router (RouterCore) and the simulator (Cluster) build the
same fleet-admission inputs and reach the same place / admit / hold / move
decisions (docs/control-law.md point 8)."""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controllers import KAIROS
from controllers.admission import HeldAgent, admits_now, place, rehome_held
from controllers.placement import PlacementRequest
from kairos_common.testing import ManualClock
from kairos_common.wire import AdmissionDecision, DecisionAdmission
from router.config import AdmissionSettings, RouterConfig
from router.core import RouterCore
from router.ledger import Agent
from simulator.agents import SimAgent
from simulator.cluster import Cluster, ClusterConfig
from simulator.presets import get_preset
from simulator.workload import AgentProgram, Turn

PRESET = get_preset()
CAP = PRESET.engine.kv_capacity_tokens
N = 3


def _program(agent_id: str, size: int) -> AgentProgram:
    return AgentProgram(agent_id=agent_id, turns=(Turn(size, 0, 10, 1.0),))


class _Workload:
    def program(self, index: int) -> AgentProgram:  # never asked: no arrivals
        raise AssertionError(index)


def _router() -> RouterCore:
    config = RouterConfig(
        backends=tuple(f"sim{i}=http://127.0.0.1:{i + 1}" for i in range(N)),  # never contacted
        admission=AdmissionSettings(capacity_tokens=CAP),
    )
    return RouterCore(config, secret=None, store=None, records=None, clock=ManualClock())


def _cluster(tier_tokens: int = 0, evict_s: float | None = None) -> Cluster:
    preset = PRESET
    if tier_tokens:
        engine = dataclasses.replace(PRESET.engine, kv_offload_tokens=tier_tokens)
        preset = dataclasses.replace(PRESET, engine=engine)
    config = ClusterConfig(policy="kairos", instances=N, variant=(("evictable_after_s", evict_s),))
    return Cluster(preset, config, _Workload(), [])  # type: ignore[arg-type]


def _report_law(core: RouterCore, tier_tokens: int, evict_s: float | None) -> None:
    """Each instance's daemon reports its CPU KV tier and its policy's rule (here
    with its eviction window), as kairosd does every epoch: the simulator models an
    instance whose daemon is fresh."""
    rule = dataclasses.replace(KAIROS.rule, evictable_after_s=evict_s)
    for i in range(N):
        decision = AdmissionDecision(
            f"sim{i}",
            "d",
            1.0,
            1,
            admission=DecisionAdmission(rule=rule, capacity_tokens=CAP, offload_tokens=tier_tokens),
        )
        assert core.admission.apply_decision(decision).accepted


# Ongoing agents per instance: (C_a, activity), activity 0 = a request in flight,
# 1 = its last ended 5 s ago (active), 2 = 30 s ago (idle), 3 = none completed yet,
# 4 = 300 s ago (idle past the eviction window).
ongoing_st = st.lists(
    st.lists(st.tuples(st.integers(1_000, 200_000), st.integers(0, 4)), max_size=4),
    min_size=N,
    max_size=N,
)
held_st = st.lists(st.tuples(st.integers(0, N - 1), st.integers(1_000, 300_000)), max_size=4)
IDLE_FOR_S = (0.0, 5.0, 30.0, 0.0, 300.0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ongoing=ongoing_st,
    held=held_st,
    newcomer=st.integers(1_000, 300_000),
    tier=st.sampled_from([0, 150_000, 2_000_000]),
    evict_s=st.sampled_from([None, 60.0]),
)
def test_router_and_simulator_decide_alike(
    ongoing: list[list[tuple[int, int]]],
    held: list[tuple[int, int]],
    newcomer: int,
    tier: int,
    evict_s: float | None,
) -> None:
    """With and without a CPU KV tier (whose idle contexts need no room, control-law
    point 13) and an eviction window (point 14), the router and the simulator see
    and decide the same."""
    asyncio.run(_check(ongoing, held, newcomer, tier, evict_s))


def _join(core: RouterCore, cluster: Cluster, i: int, aid: str, size: int, activity: int) -> None:
    now = core.clock()
    agent = core.ledger.add(
        Agent(aid, 0.0, 0.0, instance=f"sim{i}", admitted=True, context_tokens=size)
    )
    sim = SimAgent(_program(aid, size), 0.0, i)
    sim.context_tokens, sim.admitted = size, True
    if activity != 3:
        agent.turns, agent.last_seen_s = 1, now - IDLE_FOR_S[activity]
        sim.steps, sim.last_end_s = 1, now - IDLE_FOR_S[activity]
    agent.in_flight, sim.in_flight = int(activity == 0), activity == 0
    cluster.instances[i].join(sim)


async def _check(
    ongoing: list[list[tuple[int, int]]],
    held: list[tuple[int, int]],
    newcomer: int,
    tier: int,
    evict_s: float | None,
) -> None:
    core, cluster = _router(), _cluster(tier, evict_s)
    ledger, adm, fleet = core.ledger, core.admission, cluster.admission
    now = core.clock()
    _report_law(core, tier, evict_s)
    for i, agents in enumerate(ongoing):
        for k, (size, activity) in enumerate(agents):
            _join(core, cluster, i, f"on-{i}-{k}", size, activity)
    views = []
    for k, (i, size) in enumerate(held):
        aid = f"held-{k}"
        agent = ledger.add(Agent(aid, float(k), 0.0, estimated_context_tokens=size))
        ledger.set_pending(agent, f"sim{i}", float(k))
        adm.queue(f"sim{i}").join(aid, float(k))
        sim = SimAgent(_program(aid, size), float(k), i, size)
        cluster.instances[i].pending.append(sim)
        views.append(HeldAgent(aid, f"sim{i}", size))

    assert adm.gates() == fleet.gates(now)
    rules = [g.rule_here(adm.rule) for g in adm.gates()]
    assert rules == [g.rule_here(fleet.rule) for g in fleet.gates(now)]
    assert adm.rule.enabled == fleet.rule.enabled

    # A newcomer: same instance, same admit-or-hold.
    newbie = ledger.add(Agent("new", 99.0, 0.0, estimated_context_tokens=newcomer))
    request = PlacementRequest("new", 0, newcomer)
    expected = place(fleet.placement, request, fleet.gates(now), fleet.rule)
    assert core.placement.choose(newbie).name == expected.instance
    target = core.pool.resolve(expected.instance)
    assert admits_now(adm.gate(target), newcomer, adm.rule) == expected.admit_now  # fast path

    # Held agents: the router's moves are the simulator's, those that make room
    # (control-law point 15) included; rehome_held's come first.
    fleet_moves = rehome_held(fleet.placement, views, fleet.gates(now), fleet.rule)
    sim_moves = fleet.rehome_held(now)
    assert sim_moves[: len(fleet_moves)] == fleet_moves
    assert adm.rehome() == sim_moves
    assert adm.gates() == fleet.gates(now)


running_st = st.lists(
    st.lists(st.tuples(st.integers(1_000, 200_000), st.integers(0, 4)), max_size=4),
    min_size=N,
    max_size=N,
)


FULL = [(200_000, 1), (200_000, 2), (100_000, 1)]  # U ≥ γ·U_max: no room to move to


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(ongoing=[[(200_000, 0), (200_000, 0)], FULL, FULL], mover=150_000, evict_s=None)
@given(
    ongoing=running_st,
    mover=st.integers(1_000, 300_000),
    evict_s=st.sampled_from([None, 60.0]),
)
def test_overflow_relief_alike(
    ongoing: list[list[tuple[int, int]]], mover: int, evict_s: float | None
) -> None:
    """An agent of sim0 issues a request beside those in flight: the router and the
    simulator move it to the same instance, or keep it (control-law point 10), the
    room on a target counting sessions away past the eviction window as free
    (point 14); kept, both hold it back or both let it run (point 16)."""
    core, cluster = _router(), _cluster(0, evict_s)
    _report_law(core, 0, evict_s)
    for i, agents in enumerate(ongoing):
        for k, (size, activity) in enumerate(agents):
            _join(core, cluster, i, f"on-{i}-{k}", size, activity)
    ledger = core.ledger
    agent = ledger.add(Agent("m", 0.0, 0.0, instance="sim0", admitted=True, context_tokens=mover))
    sim = SimAgent(_program("m", mover), 0.0, 0)
    sim.context_tokens, sim.admitted = mover, True
    cluster.instances[0].join(sim)
    target = core.placement._overflow_target(agent, "sim0")
    assert target == cluster.admission.overflow_target(cluster.instances[0], sim, core.clock())
    if target is None:  # nowhere to go: both hold it back, or both let it run (point 16)
        agent.in_flight = 1  # the request being decided
        held = core.admission.hold_overflow(agent)
        assert held == cluster.admission.hold_overflow(cluster.instances[0], sim, core.clock())
        assert held == (not agent.admitted) == (sim in cluster.instances[0].pending)
        # Its context has left the instance's U in both (the router's request then
        # joins the hold queue in wait_admitted, as a newcomer's does).
        loads = [g.load for g in cluster.admission.gates(core.clock())]
        assert [g.load for g in core.admission.gates()] == loads
