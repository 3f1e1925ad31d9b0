"""Closed-loop cluster: real controllers and placement, held agents, records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from controllers import (
    KairosController,
    NoControl,
    ReassignmentConfig,
    ReassignmentRule,
)
from reporting.metrics import summarize
from reporting.records import read_records
from simulator.cluster import Cluster, ClusterConfig
from simulator.runner import SimSpec, result_json, run_sim, write_jsonl
from tests.simulator.conftest import ListWorkload, list_agent, small_preset


def test_uses_real_controller_objects_and_closed_loop_timing() -> None:
    cluster = Cluster(
        small_preset(kv_tokens=200_000),
        ClusterConfig(policy="kairos", duration_s=120.0),
        ListWorkload([list_agent(0, turns=4, think_s=3.0)]),
        [1.0],
    )
    assert isinstance(cluster.instances[0].controller, KairosController)
    assert isinstance(cluster.reassign, ReassignmentRule)
    cluster.run()
    (rec,) = cluster.agents_done
    assert rec.turns == 4 and rec.decode_tokens == 200
    assert rec.pending_s == 0.0  # fast path: admitted at once on an idle instance
    # closed loop: lifetime = Σ LLM latency + Σ think times (3 × 3 s)
    assert abs((rec.end_s - rec.start_s) - (rec.llm_time_s + 9.0)) < 1e-6
    assert rec.throughput_tok_s == rec.decode_tokens / rec.llm_time_s


def test_kairos_holds_agents_when_the_cache_is_full_and_admits_later() -> None:
    preset = small_preset(kv_tokens=20_000)
    programs = [list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]
    arrivals = [0.5 * i for i in range(6)]
    kairos = Cluster(
        preset, ClusterConfig(policy="kairos", duration_s=900.0), ListWorkload(programs), arrivals
    )
    kairos.run()
    assert len(kairos.agents_done) == 6  # everybody is eventually admitted
    assert max(a.pending_s for a in kairos.agents_done) > 0.0
    assert any(e.pending > 0 for e in kairos.epochs)
    base = Cluster(
        preset,
        ClusterConfig(policy="no-control", duration_s=900.0),
        ListWorkload(programs),
        arrivals,
    )
    base.run()
    assert isinstance(base.instances[0].controller, NoControl)
    assert all(a.pending_s == 0.0 for a in base.agents_done)


def test_a_prompt_beyond_the_engine_limit_is_rejected_at_once_not_held() -> None:
    # The cache full of held sessions, then one whose first prompt exceeds the model's
    # length: it is rejected when it arrives (as vLLM answers a 400 at once), not after
    # waiting for room it would never use.
    preset = small_preset(kv_tokens=20_000)
    programs = [list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]
    programs.append(list_agent(6, turns=2, prompt=25_000))
    arrivals = [0.5 * i for i in range(7)]
    cluster = Cluster(
        preset, ClusterConfig(policy="kairos", duration_s=900.0), ListWorkload(programs), arrivals
    )
    cluster.run()
    huge = next(a for a in cluster.agents_done if a.agent_id == "a6")
    assert huge.end_reason == "rejected" and huge.pending_s == 0.0 and huge.end_s == 3.0
    assert max(a.pending_s for a in cluster.agents_done) > 0.0  # others did wait


def test_consolidating_placement_and_reassignment_across_instances() -> None:
    spec = SimSpec(
        policy="kairos",
        rate_per_s=0.3,
        duration_s=900.0,
        instances=3,
        seed=4,
        preset=small_preset(kv_tokens=60_000),
    )
    res = run_sim(spec)
    used = {inst for a in res.agents for inst in a.instances}
    assert "sim0" in used
    # Round-robin spreads from the start (a cache nobody outgrows, so that no
    # agent is held back mid-session, point 16, and every early agent finishes).
    roomy = dataclasses.replace(
        spec, placement="round-robin", preset=small_preset(kv_tokens=200_000)
    )
    rr = run_sim(roomy)
    first = [a.instances[0] for a in sorted(rr.agents, key=lambda a: a.start_s)[:6]]
    assert len(set(first)) == 3
    assert res.run.counters["reassignments"] > 0  # Algorithm 3 moved some agents
    moved = [a for a in res.agents if len(a.instances) > 1]
    assert moved and all(len(set(a.instances)) == len(a.instances) for a in moved)
    no_reassign = run_sim(dataclasses.replace(spec, reassignment=ReassignmentConfig(enabled=False)))
    assert no_reassign.run.counters["reassignments"] == 0


def _outgrown(config: ClusterConfig) -> Cluster:
    """Three agents that grow to ~11K tokens each on a 20K cache, run back to back, on
    an engine that admits a prompt on its first chunk (V1 before the full-sequence
    gate): one that no longer fits is preempted mid-prefill, which relief and the
    hold-back avoid. (vLLM's default gate keeps such a prompt queued in the engine
    instead, tests/simulator/test_engine.py.)"""
    programs = [list_agent(i, turns=30, think_s=0.5, prompt=4000) for i in range(3)]
    preset = small_preset(kv_tokens=20_000, full_isl=False)
    cluster = Cluster(preset, config, ListWorkload(programs), [0.0, 0.5, 1.0])
    cluster.run()
    return cluster


def test_overflow_relief_moves_agents_off_an_instance_they_outgrew() -> None:
    # The three agents are consolidated on sim0: with neither relief nor point 16's
    # hold (no control, with Algorithm 3 and relief switched off in code) sim0
    # preempts (Algorithm 3 never fires: sim1 is idle, not a target); under the law
    # the agents that cannot fit move to sim1.
    relieved = _outgrown(ClusterConfig(policy="kairos", duration_s=1800.0, instances=2))
    paper = _outgrown(
        ClusterConfig(
            policy="no-control",
            duration_s=1800.0,
            instances=2,
            reassignment=ReassignmentConfig(enabled=False),
        )
    )
    assert paper.overflow_moves == 0 and sum(e.preemptions for e in paper.epochs) > 0
    assert relieved.overflow_moves > 0 and sum(e.preemptions for e in relieved.epochs) == 0
    assert {a.instances[0] for a in relieved.agents_done} == {"sim0"}  # consolidated first
    assert any(a.instances[-1] == "sim1" for a in relieved.agents_done)
    assert max(a.end_s for a in relieved.agents_done) < max(a.end_s for a in paper.agents_done)


def test_an_agent_that_moves_loses_its_confident_streak() -> None:
    # Confident placement's streak is evidence about the agent's instance: any move
    # (here an agent held back by point 16 and admitted on the other instance) voids
    # it, as the router's Ledger.on_move.
    programs = [list_agent(i, turns=30, think_s=0.5, prompt=4000) for i in range(3)]
    config = ClusterConfig(policy="kairos", duration_s=1800.0, instances=2, placement="confident")
    cluster = Cluster(small_preset(kv_tokens=20_000), config, ListWorkload(programs), [0, 0.5, 1])
    assert cluster.confident is not None
    assert cluster.admission.on_move == cluster.confident.forget
    moved: list[str] = []
    cluster.admission.on_move = moved.append
    cluster.run()
    moves = cluster.held_moves + cluster.overflow_moves + cluster.reassignments + cluster.room_moves
    assert moved and len(moved) == moves


def test_an_agent_whose_request_would_overflow_waits_instead_of_preempting() -> None:
    # One instance, so overflow relief has nowhere to send the three agents. Without
    # point 16 (kairos-no-ta: no admission control, so no hold-back either) the
    # instance preempts; under the law the agent whose request would not fit beside
    # the running ones goes back to the hold queue, ahead of nobody but later
    # arrivals, and is admitted again.
    held = _outgrown(ClusterConfig(policy="kairos", duration_s=3600.0))
    thrashed = _outgrown(ClusterConfig(policy="kairos-no-ta", duration_s=3600.0))
    assert thrashed.overflow_holds == 0 and sum(e.preemptions for e in thrashed.epochs) > 0
    assert held.overflow_holds > 0 and sum(e.preemptions for e in held.epochs) == 0
    assert len(held.agents_done) == 3 and all(a.end_reason == "end" for a in held.agents_done)
    assert max(a.pending_s for a in held.agents_done) > 0.0  # the held-back agents waited
    # Without admission control nobody is held back (no control admits everyone).
    free = _outgrown(ClusterConfig(policy="no-control", duration_s=3600.0))
    assert free.overflow_holds == 0


def test_reproducible_from_seed_and_records_round_trip(tmp_path: Path) -> None:
    spec = SimSpec(policy="kairos", rate_per_s=0.08, duration_s=1200.0, seed=9)
    a, b = run_sim(spec), run_sim(spec)
    assert result_json(a) | {"wall_s": 0} == result_json(b) | {"wall_s": 0}
    path = write_jsonl(a, tmp_path)
    records = list(read_records([path]))
    kinds = {r.kind for r in records}
    assert kinds == {"run", "epoch", "agent"}
    assert sum(1 for r in records if r.kind == "epoch") == len(a.epochs)
    energy = sum(e.energy_j for e in a.epochs)
    assert abs(energy - a.summary.energy_j) < 1e-6
    assert a.summary.avg_power_w > 50.0
    other = run_sim(dataclasses.replace(spec, seed=10))
    assert result_json(other)["energy_j"] != result_json(a)["energy_j"]


def test_policies_compared_on_identical_arrivals() -> None:
    base = SimSpec(rate_per_s=0.05, duration_s=900.0, seed=3)
    nc = run_sim(dataclasses.replace(base, policy="no-control"))
    fx = run_sim(dataclasses.replace(base, policy="fixed:900"))
    assert nc.run.counters["arrivals"] == fx.run.counters["arrivals"]
    assert fx.summary.avg_power_w < nc.summary.avg_power_w
    assert set(fx.summary.time_at_clock_s) == {900}


def test_c3_short_window_lower_clock_saves_power_keeps_jobs() -> None:
    """Cheap version of calibration C3 (the full check is scripts/calibrate.py)."""
    base = SimSpec(rate_per_s=0.08, duration_s=2400.0, seed=2)
    hi = run_sim(dataclasses.replace(base, policy="fixed:1680"))
    lo = run_sim(dataclasses.replace(base, policy="fixed:900"))
    cut = 1.0 - lo.summary.avg_power_w / hi.summary.avg_power_w
    assert 0.2 <= cut <= 0.4
    assert lo.summary.completed_agents >= 0.9 * hi.summary.completed_agents


def test_sessions_held_when_the_run_ends_are_counted_as_unfinished() -> None:
    # Agent records exist only for finished sessions: a session still held at the
    # end must show up in ``unfinished`` with the time it waited, or the mean
    # pending time of the records hides exactly the sessions that waited longest.
    preset = small_preset(kv_tokens=20_000)
    programs = [list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]
    arrivals = [0.5 * i for i in range(6)]
    end_s = 20.0
    cluster = Cluster(
        preset, ClusterConfig(policy="kairos", duration_s=end_s), ListWorkload(programs), arrivals
    )
    cluster.run()
    held = [a for inst in cluster.instances for a in inst.pending]
    assert held, "the scenario must end with sessions still held"
    count, held_s = cluster.unfinished(end_s)
    assert count == len(programs) - len(cluster.agents_done)
    assert held_s >= sum(end_s - a.waiting_since_s for a in held) > 0.0
    result = run_sim(SimSpec(policy="kairos", rate_per_s=0.5, duration_s=60.0))
    obj = result_json(result)
    assert obj["unfinished_agents"] > 0  # 60 s of arrivals: most are still running
    n = len(result.agents) + obj["unfinished_agents"]
    held_s = sum(a.pending_s for a in result.agents) + obj["unfinished_held_s"]
    assert abs(obj["mean_pending_all_s"] * n - held_s) < 1e-6


def test_sessions_the_window_ends_in_their_last_turns_are_counted_as_nearly_done() -> None:
    # A 10-turn session with 9 turns done when the run ends is one a slightly
    # faster run would have finished; one with 2 turns left, or one still held,
    # is not. ``unfinished_nearly_done`` tells the window's edge from real losses.
    preset = small_preset(kv_tokens=200_000)
    programs = [list_agent(0, turns=10, think_s=5.0)]
    cluster = Cluster(
        preset, ClusterConfig(policy="kairos", duration_s=15.0), ListWorkload(programs), [0.0]
    )
    cluster.run()
    (agent,) = [a for inst in cluster.instances for a in inst.unfinished_agents()]
    assert agent.admitted and agent.steps < 8  # 15 s: a few turns of ten
    assert cluster.nearly_done() == 0
    agent.steps = 9  # as if the window had ended in its last turn
    assert agent.nearly_done and cluster.nearly_done() == 1
    agent.steps = 8
    assert not agent.nearly_done and cluster.nearly_done() == 0
    agent.steps, agent.admitted = 9, False
    assert not agent.nearly_done
    obj = result_json(run_sim(SimSpec(policy="kairos", rate_per_s=0.5, duration_s=60.0)))
    assert 0 <= obj["unfinished_nearly_done"] <= obj["unfinished_agents"]


def test_unfinished_sessions_are_judged_by_their_throughput_so_far() -> None:
    """A session held since it arrived has produced nothing (Eq. 3 so far: 0, a
    miss, as one that gave up); one between requests scores its Eq. 3 as the
    controllers see it; one waiting on a request counts that wait too."""
    preset = small_preset(kv_tokens=20_000)
    programs = [list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]
    end_s = 20.0
    cluster = Cluster(
        preset,
        ClusterConfig(policy="kairos", duration_s=end_s),
        ListWorkload(programs),
        [0.5 * i for i in range(6)],
    )
    cluster.run()
    held = [a for inst in cluster.instances for a in inst.pending]
    running = [a for inst in cluster.instances for a in inst.ongoing.values()]
    assert held and running, "the scenario must end with sessions held and running"
    assert all(a.throughput_so_far(end_s) == 0.0 for a in held)
    for a in running:
        waiting = end_s - a.release_s if a.in_flight else 0.0
        assert a.throughput_so_far(end_s) == a.decode_tokens / (a.llm_time_s + waiting)
    so_far = cluster.unfinished_throughputs(end_s)
    assert len(so_far) == len(held) + len(running)


def test_attainment_over_every_session_counts_the_unfinished_ones() -> None:
    """``slo_attainment`` judges finished sessions only; ``slo_attainment_all``
    adds the ones the run ended before, by their Eq. 3 so far."""
    end_s, slo = 20.0, 1.0
    cluster = Cluster(
        small_preset(kv_tokens=20_000),
        ClusterConfig(policy="kairos", duration_s=end_s),
        ListWorkload([list_agent(i, turns=6, think_s=5.0, prompt=6000) for i in range(6)]),
        [0.5 * i for i in range(6)],
    )
    cluster.run()
    so_far = cluster.unfinished_throughputs(end_s)
    assert so_far and 0.0 in so_far  # sessions still held count, as misses
    s = summarize(
        "kairos", cluster.epochs, cluster.agents_done, slo_tok_s=slo, unfinished_tok_s=so_far
    )
    judged = [a for a in cluster.agents_done if a.throughput_tok_s is not None]
    met = sum(1 for a in judged if a.slo_met) + sum(t >= slo for t in so_far)
    assert s.slo_attainment_all == met / (len(judged) + len(so_far))
    assert (
        summarize("router", cluster.epochs, cluster.agents_done, slo_tok_s=slo).slo_attainment_all
        is None
    )

    result = run_sim(SimSpec(policy="kairos", rate_per_s=0.5, duration_s=60.0))
    obj = result_json(result)
    # 60 s of a paper workload: no session has finished, so only the second judges.
    assert obj["slo_attainment"] is None
    assert obj["slo_attainment_all"] == result.summary.slo_attainment_all is not None
