"""``kairos-offload`` end to end on CPU (docs/control-law.md, point 13): real
fake-vLLM (with vLLM's ``--kv-offloading-size``), router, kairosd and id-tracker
processes on 127.0.0.1. Four agents whose contexts exceed one instance's KV cache
arrive together: under ``kairos`` the router holds the last until room frees;
under ``kairos-offload`` kairosd tells the router not to hold, so nobody waits.
Both daemons read the tier from vLLM's ``cache_config_info`` and say whether
their policy fits it."""

from __future__ import annotations

import asyncio
import json

import pytest

from simulator.demo_run import DemoConfig, PolicyResult, run_policy
from tests.e2e.conftest import agent_program, require_valid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _run(tmp_path_factory: pytest.TempPathFactory, policy: str) -> PolicyResult:
    # 4 × 12–17K tokens on a 40K-token cache (β·U_max = 38K): the fourth does not fit.
    arrivals = [
        (20.0 + i, agent_program(f"long-{i}", 12_000, 1_000, 6, 3.0, output=100)) for i in range(4)
    ]
    cfg = DemoConfig(
        out_dir=tmp_path_factory.mktemp(f"e2e-{policy}"),
        window_s=200.0,
        drain_s=60.0,
        speedup=20.0,
        instances=1,
        seed=5,
        kv_capacity_tokens=40_000,
        kv_offloading_size_gib=16.0,
    )
    return asyncio.run(run_policy(cfg, policy, arrivals))


def _daemon_events(run: PolicyResult) -> list[str]:
    lines = (run.workdir / "kairosd-i0.log").read_text().splitlines()
    return [json.loads(line).get("event", "") for line in lines if line.startswith("{")]


@pytest.fixture(scope="module")
def offload(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    return _run(tmp_path_factory, "kairos-offload")


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    return _run(tmp_path_factory, "kairos")


def test_kairos_holds_the_agent_that_does_not_fit(held: PolicyResult) -> None:
    require_valid(held)
    assert max(a.pending_s for a in held.agents) > 1.0
    assert "kv_offloading_unused" in _daemon_events(held)  # a tier kairos does not use


def test_kairos_offload_holds_nobody_and_every_agent_finishes(offload: PolicyResult) -> None:
    require_valid(offload)
    assert len([a for a in offload.agents if a.exit_code == 0]) == 4
    assert max(a.pending_s for a in offload.agents) < 1.0
    events = _daemon_events(offload)
    assert "kv_offloading_missing" not in events and "kv_offloading_unused" not in events
