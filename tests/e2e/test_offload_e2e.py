"""Idle sessions that need no room in HBM, end to end on CPU: real fake-vLLM
(with vLLM's ``--kv-offloading-size``), router, kairosd and id-tracker processes
on 127.0.0.1. Three sessions fill one instance's KV cache to within a newcomer's
room and then sit idle in a long tool call; a fourth arrives meanwhile.

* Under ``kairos-alg1`` (the paper's law: every context counts until its agent
  ends, no tier read), the router holds it until a session ends.
* Under ``kairos`` with a CPU KV tier (docs/control-law.md, point 13), kairosd reads
  the tier from vLLM's ``cache_config_info`` and passes it on, the idle contexts
  wait in host memory, and nobody waits.
* Under ``kairos`` without a tier, the sessions have been away longer than the
  eviction window (point 14) when the newcomer comes: their blocks are only
  evictable prefix cache in vLLM, and nobody waits either."""

from __future__ import annotations

import asyncio
import json

import pytest

from simulator.demo_run import DemoConfig, PolicyResult, run_policy
from tests.e2e.conftest import agent_program, require_valid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _run(
    tmp_path_factory: pytest.TempPathFactory,
    tier_gib: float,
    policy: str = "kairos",
    newcomer_at_s: float = 150.0,
) -> PolicyResult:
    # 3 × 12.2K tokens on a 40K-token cache: all three admitted under either law
    # (36.6K under the paper's β·U_max = 38K), then a 300 s tool call each; an
    # 8K-token newcomer does not fit beside them. It arrives 150 s in, when they
    # have been idle for longer than the law's 10 s and, by about 100 s, its 60 s
    # eviction window (simulated, as the stack scales them; launching an agent
    # process costs up to 2 real seconds, 40 simulated, hence the margins).
    arrivals = [
        (20.0 + i, agent_program(f"long-{i}", 12_100, 500, 2, 300.0, output=100)) for i in range(3)
    ]
    arrivals.append((newcomer_at_s, agent_program("newcomer", 8_000, 500, 2, 3.0, output=100)))
    cfg = DemoConfig(
        out_dir=tmp_path_factory.mktemp(f"e2e-{policy}-tier-{tier_gib:g}"),
        window_s=400.0,
        drain_s=60.0,
        speedup=20.0,
        instances=1,
        seed=5,
        kv_capacity_tokens=40_000,
        kv_offloading_size_gib=tier_gib,
    )
    return asyncio.run(run_policy(cfg, policy, arrivals))


def _daemon_events(run: PolicyResult) -> list[dict[str, object]]:
    lines = (run.workdir / "kairosd-i0.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _pending_s(run: PolicyResult, name: str) -> float:
    return next(a.pending_s for a in run.agents if a.name == name)


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    # Early, while the sessions are idle but (launch delays allowing) not yet
    # evictable: the tier is what admits the newcomer.
    return _run(tmp_path_factory, 16.0, newcomer_at_s=60.0)


@pytest.fixture(scope="module")
def no_tier(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    return _run(tmp_path_factory, 0.0, policy="kairos-alg1")


@pytest.fixture(scope="module")
def evicting(tmp_path_factory: pytest.TempPathFactory) -> PolicyResult:
    return _run(tmp_path_factory, 0.0)


def test_under_the_paper_s_law_the_newcomer_waits_for_room(no_tier: PolicyResult) -> None:
    require_valid(no_tier)
    assert _pending_s(no_tier, "newcomer") > 5.0  # until the sessions come back and end


def test_with_a_tier_nobody_waits_and_every_agent_finishes(tier: PolicyResult) -> None:
    require_valid(tier)
    assert len([a for a in tier.agents if a.exit_code == 0]) == 4
    assert max(a.pending_s for a in tier.agents) < 1.0
    said = [e for e in _daemon_events(tier) if e.get("event") == "kv_offloading_tier"]
    assert said and said[0]["kv_offloading_gib"] == 16.0


def test_sessions_away_past_the_eviction_window_hold_nobody(evicting: PolicyResult) -> None:
    require_valid(evicting)
    assert len([a for a in evicting.agents if a.exit_code == 0]) == 4
    assert _pending_s(evicting, "newcomer") < 1.0  # held > 5 s under the paper's law
