"""The predictive controller's plumbing (docs/beyond.md §5): observations over the
wire, into the daemon's snapshot, recorded by the router, fed by the simulator; the
fleet cap in the simulator."""

from __future__ import annotations

import dataclasses

from controllers import (
    ModelReport,
    PredictiveConfig,
    PredictiveController,
    RequestObservation,
)
from controllers.fleet_budget import FleetBudgetConfig
from controllers.perf_model import PerfModelConfig
from kairos_common.wire import InstanceState
from kairosd.snapshot import EpochInputs, build_snapshot, with_clock
from router.observations import ObservationLog, observation
from router.streaming import Usage, usage_from_body
from simulator.cluster import Cluster, ClusterConfig
from simulator.runner import SimSpec, build_arrivals, build_workload

OB = RequestObservation(10.0, 5000, 4000, 120, 0.2, 0.03, 8, 120_000, 0)


def test_wire_round_trips_observations_and_defaults_to_none() -> None:
    state = InstanceState("gpu0", 11.0, observations=(OB,))
    assert InstanceState.from_json(state.to_json()) == state
    legacy = state.to_json()
    del legacy["observations"]
    assert InstanceState.from_json(legacy).observations == ()


def test_daemon_fills_the_applied_clock_and_drops_unknown() -> None:
    assert with_clock((OB,), 975)[0].clock_mhz == 975
    assert with_clock((OB,), None) == ()
    known = dataclasses.replace(OB, clock_mhz=1305)
    assert with_clock((known,), 975) == (known,)
    inputs = EpochInputs(12.0, InstanceState("gpu0", 12.0, observations=(OB,)), None)
    snap = build_snapshot(3, inputs, 500_000, standalone=False, clock_mhz=825)
    assert snap is not None
    assert snap.clock_mhz == 825 and snap.observations[0].clock_mhz == 825


def test_router_log_is_bounded_per_instance() -> None:
    log = ObservationLog(maxlen=3)
    for i in range(5):
        log.record("a", dataclasses.replace(OB, t_s=float(i)))
    assert [o.t_s for o in log.recent("a")] == [2.0, 3.0, 4.0]
    assert log.recent("b") == ()
    ob = observation(
        t_sent_s=1.0,
        first_data_s=1.5,
        end_s=3.5,
        prompt_tokens=100,
        cached_tokens=64,
        completion_tokens=101,
        running=4,
        active_context_tokens=9000,
    )
    assert ob.ttft_s == 0.5 and ob.decode_s_per_token == 0.02 and ob.clock_mhz == 0


def test_usage_parses_cached_tokens() -> None:
    u = Usage()
    u.merge(
        {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
    )
    assert u.cached_tokens == 8
    body = b'{"usage": {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 3}}'
    parsed = usage_from_body(body)
    assert parsed is not None and parsed.cached_tokens == 3


def _cluster(policy: str, instances: int, rate: float, budget: FleetBudgetConfig | None) -> Cluster:
    spec = SimSpec(policy=policy, rate_per_s=rate, seed=2, instances=instances)
    cfg = ClusterConfig(
        policy=policy,
        instances=instances,
        duration_s=1800.0,
        fleet_budget=budget,
    )
    return Cluster(spec.preset, cfg, build_workload(spec), build_arrivals(spec))


def test_simulator_feeds_the_online_model() -> None:
    cluster = _cluster("predictive", 1, 0.06, None)
    cluster.run()
    ctrl = cluster.instances[0].controller
    assert isinstance(ctrl, PredictiveController)
    assert ctrl.model.ready
    assert ctrl.model.error is not None and ctrl.model.error < 0.5
    assert any(not e.reason.startswith("warmup-") for e in cluster.epochs)
    assert any(e.reason.startswith("warmup-") for e in cluster.epochs)


def test_simulated_fleet_stays_under_its_cap() -> None:
    cap = 600.0
    cluster = _cluster("kairos", 4, 0.16, FleetBudgetConfig(cap_w=cap))
    cluster.run()
    per_epoch: dict[float, float] = {}
    for e in cluster.epochs:
        per_epoch[e.t_s] = per_epoch.get(e.t_s, 0.0) + e.avg_power_w
    assert cluster.fleet is not None
    # After the correction has learned (first 10 min), ≥ 95 % of epochs fit.
    late = [w for t, w in per_epoch.items() if t > 600.0]
    assert sum(w <= cap for w in late) / len(late) >= 0.95


def test_daemon_exports_model_error() -> None:
    from kairosd.metrics import DaemonMetrics

    m = DaemonMetrics("gpu0")
    m.observe_report(ModelReport(model_error=0.07, model_observations=120, slo_slack=0.3))
    text = m.render().decode()
    assert 'kairosd_model_error_ratio{instance="gpu0"} 0.07' in text
    assert 'kairosd_predicted_slo_slack{instance="gpu0"} 0.3' in text


def test_simulator_passes_a_research_variant_of_predictive() -> None:
    spec = SimSpec(policy="predictive", rate_per_s=0.02, duration_s=60.0, seed=2)
    variant = (("margin", 0.25), ("cooldown_epochs", 7), ("perf.warmup", 20), ("alpha", 0.5))
    cfg = ClusterConfig(policy="predictive", duration_s=60.0, variant=variant)
    cluster = Cluster(spec.preset, cfg, build_workload(spec), build_arrivals(spec))
    ctrl = cluster.instances[0].controller
    assert isinstance(ctrl, PredictiveController)
    assert ctrl.config == PredictiveConfig(
        margin=0.25, cooldown_epochs=7, perf=PerfModelConfig(warmup=20)
    )
    assert ctrl.alpha == 0.5 and ctrl.kairos.policy.setting("alpha") == 0.5
