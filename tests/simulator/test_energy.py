"""Simulator energy per agent: the ground truth is exact, and the cluster's records
carry the production attribution, whose parts sum to the measured energy."""

from __future__ import annotations

import math

import pytest

from controllers.energy_attribution import EnergyAccountant, WorkWeights
from simulator.cluster import Cluster, ClusterConfig
from simulator.energy_truth import EnergyTruth
from simulator.engine_types import EngineRequest
from simulator.presets import get_preset
from simulator.timing import TimingModel
from simulator.workload import AgentProgram, Turn
from tests.simulator.conftest import ListWorkload, drain, list_agent, make_engine, small_preset


@pytest.mark.parametrize("fast_forward", [True, False])
def test_truth_plus_idle_is_the_gpu_energy(fast_forward: bool) -> None:
    """Every joule above idle of every step (or fast-forwarded run) lands on a request's key."""
    engine = make_engine(small_preset(kv_tokens=60_000), fast_forward=fast_forward)
    engine.truth = truth = EnergyTruth(engine.timing)
    for i, (prompt, out) in enumerate([(3000, 200), (500, 800), (8000, 20), (1200, 300)]):
        engine.submit(EngineRequest(f"r{i}", prompt, out, 0.1 * i, cache_key=f"agent{i % 3}"))
    drain(engine)
    idle_w = engine.power.idle_w(engine.gpu.clock_at(0.0))
    assert set(truth.by_key) == {"agent0", "agent1", "agent2"}
    assert math.fsum(truth.by_key.values()) == pytest.approx(truth.total_j, rel=1e-12)
    assert truth.total_j + idle_w * engine.now_s == pytest.approx(engine.gpu.energy_j, rel=1e-9)


def test_fast_forward_keeps_the_truth() -> None:
    """A decode run split in closed form gives each request what stepping would."""
    results = []
    for ff in (True, False):
        engine = make_engine(small_preset(kv_tokens=60_000), fast_forward=ff)
        engine.truth = EnergyTruth(engine.timing)
        engine.submit(EngineRequest("x", 4000, 400, 0.0, cache_key="x"))
        engine.submit(EngineRequest("y", 100, 400, 0.0, cache_key="y"))
        drain(engine)
        results.append(engine.truth.by_key)
    assert results[0]["x"] == pytest.approx(results[1]["x"], rel=1e-6)
    assert results[0]["y"] == pytest.approx(results[1]["y"], rel=1e-6)
    assert results[0]["x"] > results[0]["y"]  # it reads ten times the context


def test_cluster_records_carry_attributed_energy_that_sums_to_measured() -> None:
    programs = [list_agent(i, turns=4, think_s=3.0, prompt=2000 + 3000 * i) for i in range(4)]
    cluster = Cluster(
        small_preset(kv_tokens=200_000),
        ClusterConfig(policy="kairos", duration_s=600.0),
        ListWorkload(programs),
        [1.0, 2.0, 20.0, 40.0],
    )
    engine = cluster.instances[0].engine
    engine.truth = truth = EnergyTruth(engine.timing)
    # The idle draw as an operator would configure it (energy_idle_power_w): this run
    # has no idle epoch before its agents work, so a learned one would come too late.
    cluster.energy = EnergyAccountant(idle_power_w=engine.power.idle_w(0))
    cluster.run()
    assert len(cluster.agents_done) == 4
    measured = math.fsum(e.energy_j for e in cluster.epochs)
    inst = cluster.energy.instances["sim0"]
    assert inst.counted_j == pytest.approx(measured, rel=1e-9)
    own = [r.energy_own_j for r in cluster.agents_done]
    assert all(e is not None and e > 0 for e in own)
    assert math.fsum(e or 0.0 for e in own) == pytest.approx(inst.attributed_j, rel=1e-9)
    for rec in cluster.agents_done:
        assert rec.energy_j == rec.energy_own_j  # no sub-agents here
        assert rec.energy_own_j == pytest.approx(
            (rec.energy_prefill_j or 0.0) + (rec.energy_decode_j or 0.0)
        )
        assert rec.energy_own_j == pytest.approx(truth.by_key[rec.agent_id], rel=0.1)


def _mixed_programs() -> list[AgentProgram]:
    """Agents whose work differs in kind: long fresh prompts, or long answers."""
    prefill = [
        AgentProgram(f"p{i}", tuple(Turn(12_000 * (k + 1), 12_000 * k, 20, 1.0) for k in range(3)))
        for i in range(3)
    ]
    decode = [
        AgentProgram(f"d{i}", tuple(Turn(400, 0, 1500, 1.0) for _ in range(3))) for i in range(3)
    ]
    return prefill + decode


def _by_kind(weights: WorkWeights | None) -> dict[str, tuple[float, float]]:
    """(attributed, true) joules of the prefill-heavy and the decode-heavy agents."""
    preset = get_preset("h100-nvl-dense-32b")
    cluster = Cluster(
        preset,
        ClusterConfig(policy="fixed:1410", duration_s=900.0),
        ListWorkload(_mixed_programs()),
        [1.0 + i for i in range(6)],
    )
    engine = cluster.instances[0].engine
    engine.truth = truth = EnergyTruth(engine.timing)
    cluster.energy = EnergyAccountant(idle_power_w=engine.power.idle_w(0), weights=weights)
    cluster.run()
    assert len(cluster.agents_done) == 6
    out: dict[str, tuple[float, float]] = {}
    for r in cluster.agents_done:
        got, true = out.get(r.agent_id[0], (0.0, 0.0))
        out[r.agent_id[0]] = (got + (r.energy_own_j or 0.0), true + truth.by_key[r.agent_id])
    return out


def test_weights_derived_for_a_dense_model_attribute_it_better_than_the_defaults() -> None:
    """The built-in weights are a MoE model's; on a dense model they undercharge the
    long prompts (a dense prefill costs ten times more per token) and overcharge
    the answers. Weights derived from the model's architecture (what an operator
    sets in ``[energy_weights]``) take away more than half of that bias; what is
    left is the work model's (a compute-bound prefill step draws more power than a
    memory-bound decode step, and the weights count seconds)."""
    derived = TimingModel(get_preset("h100-nvl-dense-32b").timing).work_weights()
    assert derived.token_s == 0.0  # dense: no experts, every weight read is shared
    default, fitted = _by_kind(None), _by_kind(derived)
    for kind in ("p", "d"):
        got, true = default[kind]
        better, _ = fitted[kind]
        assert abs(better - true) / true < 0.2
        assert abs(better - true) < 0.6 * abs(got - true)
    assert default["p"][0] < default["p"][1]  # the defaults undercharge the prompts


def test_derived_weights_share_a_moe_step_more_as_the_batch_grows() -> None:
    timing = TimingModel(get_preset().timing)
    small, large = timing.work_weights(batch=2), timing.work_weights(batch=32)
    assert small.token_s > large.token_s > 0.0  # a further token touches fewer new experts
    assert small.step_shared_s < large.step_shared_s


def test_the_simulator_weighs_work_as_configured_for_the_presets_model() -> None:
    def weights_of(preset: str) -> WorkWeights:
        config = ClusterConfig(policy="kairos", duration_s=10.0)
        return Cluster(get_preset(preset), config, ListWorkload([]), []).energy.weights

    assert weights_of("h100-nvl-qwen3-30b") == WorkWeights()  # the built-in ones are its
    assert weights_of("h100-80gb-qwen3-30b") == WorkWeights()  # the same model
    dense = TimingModel(get_preset("h100-nvl-dense-32b").timing).work_weights()
    assert weights_of("h100-nvl-dense-32b") == dense != WorkWeights()
