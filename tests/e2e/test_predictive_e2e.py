"""The ``predictive`` policy end to end on CPU: real fake-vLLM, router, kairosd and
id-tracker processes on 127.0.0.1. The online model is fed only by what the
router observes on streamed requests (usage, first byte, last byte) and the
clock the daemon applied — so leaving warm-up proves the whole observation path
(router → /kairos/v1 state → daemon snapshot → controller) works."""

from __future__ import annotations

import asyncio

import pytest

from simulator.demo_run import DemoConfig, PolicyResult, run_policy
from tests.e2e.conftest import agent_program, require_valid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    # Twelve busy agents (10 streamed turns each) in 240 simulated seconds:
    # enough finished requests for the model's 40-observation warm-up.
    arrivals = [
        (10.0 * i, agent_program(f"busy-{i}", 3_000, 400, 10, 1.0, output=200)) for i in range(12)
    ]
    cfg = DemoConfig(
        out_dir=tmp_path_factory.mktemp("e2e-predictive"),
        window_s=240.0,
        drain_s=40.0,
        speedup=20.0,
        seed=3,
        kv_capacity_tokens=96_000,
    )
    return asyncio.run(run_policy(cfg, "predictive", arrivals))


def test_the_model_warms_up_from_router_observations(run: PolicyResult) -> None:
    require_valid(run)
    reasons = [e.reason for e in run.epochs]
    assert reasons and reasons[0].startswith("warmup")
    warm = [r for r in reasons if not r.startswith(("warmup", "failsafe"))]
    assert warm, f"the predictive model never left warm-up: {sorted(set(reasons))}"


def test_agents_finish_and_meet_the_slo(run: PolicyResult) -> None:
    require_valid(run)
    done = [a for a in run.agents if a.exit_code == 0]
    assert len(done) == 12
    assert run.summary.slo_attainment == 1.0
    assert len(run.clocks_mhz) >= 2  # the clock moved off the start value
