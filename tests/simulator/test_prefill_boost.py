"""The simulator builds the prefill signal as the router does (prompt − C_a until the
first token), so the default law runs a long prefill at the top clock."""

from __future__ import annotations

from simulator.cluster import Cluster, ClusterConfig
from simulator.workload import AgentProgram, Turn
from tests.simulator.conftest import ListWorkload, small_preset


def _run(policy: str) -> Cluster:
    program = AgentProgram("a0", (Turn(120_000, 0, 40, 0.0), Turn(121_000, 120_040, 40, 30.0)))
    cluster = Cluster(
        small_preset(kv_tokens=400_000, budget=8192),
        ClusterConfig(policy=policy, duration_s=120.0),
        ListWorkload([program]),
        [1.0],
    )
    cluster.run()
    return cluster


def test_long_prefill_runs_at_the_top_clock_and_only_while_it_lasts() -> None:
    cluster = _run("kairos")
    (rec,) = cluster.agents_done
    assert rec.turns == 2
    levels = cluster.instances[0].controller.levels
    boosted = [e for e in cluster.epochs if e.reason == "prefill"]
    assert boosted and all(e.target_clock_mhz == levels.clock_of(levels.count) for e in boosted)
    # The second turn adds 960 uncached tokens (below the threshold) after a 30 s
    # think gap: the epochs after the first prefill are not boosted.
    assert max(e.t_s for e in boosted) < rec.end_s - 30.0
    assert cluster.epochs[-1].reason != "prefill"


def test_paper_law_has_no_prefill_boost() -> None:
    assert all(e.reason != "prefill" for e in _run("kairos-alg1").epochs)
