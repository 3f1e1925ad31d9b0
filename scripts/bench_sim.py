"""Speed benchmark of the simulator (issue 3 targets), not a test.

Targets: 3 simulated hours at 0.08 jobs/s on one instance in ≤ 5 s wall on one
core; 4 instances at 0.16 jobs/s in ≤ 15 s. The baseline column is the same
simulation with the closed-form decode fast-forward switched off (one Python
iteration per engine step), run on a shorter window and compared per simulated
hour, side by side on this machine.

    .venv/bin/python scripts/bench_sim.py
    .venv/bin/python scripts/bench_sim.py --hours 1 --baseline-minutes 10
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from controllers import KairosConfig
from simulator.arrivals import poisson_arrivals
from simulator.cluster import Cluster, ClusterConfig
from simulator.presets import get_preset
from simulator.workload_paper import PaperWorkload


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: str
    instances: int
    rate_per_s: float
    target_s_per_3h: float


SCENARIOS = (
    Scenario("1 inst, 0.08 jobs/s, kairos", "kairos", 1, 0.08, 5.0),
    Scenario("1 inst, 0.08 jobs/s, no-control", "no-control", 1, 0.08, 5.0),
    Scenario("4 inst, 0.16 jobs/s, kairos", "kairos", 4, 0.16, 15.0),
)


def timed(sc: Scenario, duration_s: float, seed: int, fast_forward: bool) -> tuple[float, int]:
    """Wall seconds of one run and the engine steps it simulated."""
    cfg = ClusterConfig(
        policy=sc.policy,
        instances=sc.instances,
        duration_s=duration_s,
        kairos=KairosConfig(),
        fast_forward=fast_forward,
    )
    arrivals = poisson_arrivals(sc.rate_per_s, duration_s, seed)
    cluster = Cluster(get_preset(), cfg, PaperWorkload(seed), arrivals)
    start = time.perf_counter()
    cluster.run()
    wall = time.perf_counter() - start
    return wall, sum(i.engine.counters.steps for i in cluster.instances)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours per run")
    ap.add_argument("--baseline-minutes", type=float, default=20.0, help="per-step baseline window")
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args(argv)
    dur = args.hours * 3600.0
    base_dur = args.baseline_minutes * 60.0
    print(
        f"{'scenario':34s} {'sim h':>5s} {'steps':>9s} {'wall s':>7s} {'s/sim h':>8s} "
        f"{'target(3h)':>10s} {'ok':>3s} {'per-step s/sim h':>16s} {'speed-up':>8s}"
    )
    worst = 0
    for sc in SCENARIOS:
        wall, steps = timed(sc, dur, args.seed, True)
        per_h = wall / args.hours
        base_wall, _ = timed(sc, base_dur, args.seed, False)
        base_per_h = base_wall / (base_dur / 3600.0)
        fast_short, _ = timed(sc, base_dur, args.seed, True)
        speedup = base_wall / fast_short if fast_short > 0 else float("inf")
        ok = per_h * 3.0 <= sc.target_s_per_3h
        worst += not ok
        print(
            f"{sc.name:34s} {args.hours:5.1f} {steps:9d} {wall:7.2f} {per_h:8.2f} "
            f"{sc.target_s_per_3h:10.1f} {'yes' if ok else 'NO':>3s} {base_per_h:16.2f} "
            f"{speedup:7.1f}x",
            flush=True,
        )
    return 1 if worst else 0


if __name__ == "__main__":
    raise SystemExit(main())
