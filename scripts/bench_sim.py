"""Speed benchmark of the simulator (docs/simulator.md, "Speed"), not a test.

Targets (from the CLI on 2 cores): 3 simulated hours at 0.08 jobs/s on
one instance in ≤ 2.5 s; 4 instances at 0.16 jobs/s in ≤ 6 s. In-process, the
baseline column is the same simulation with the closed-form decode fast-forward
switched off (one Python iteration per engine step), run on a shorter window and
compared per simulated hour, side by side on this machine.

Every timing is the minimum over ``--repeat`` runs and is given both as wall
time and as CPU time of the process: on a machine shared with other jobs the
wall time mostly measures the others, the CPU time much less so.

    .venv/bin/python scripts/bench_sim.py                 # in-process, 3 scenarios
    .venv/bin/python scripts/bench_sim.py --cli --repeat 3  # `kairos sim` end to end
    .venv/bin/python scripts/bench_sim.py --hours 1 --baseline-minutes 10
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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
    Scenario("1 inst, 0.08 jobs/s, kairos", "kairos", 1, 0.08, 2.5),
    Scenario("1 inst, 0.08 jobs/s, no-control", "no-control", 1, 0.08, 2.5),
    Scenario("4 inst, 0.16 jobs/s, kairos", "kairos", 4, 0.16, 6.0),
)
CLI_SCENARIOS = (SCENARIOS[0], SCENARIOS[2])


def timed(
    sc: Scenario, duration_s: float, seed: int, fast_forward: bool
) -> tuple[float, float, int]:
    """Wall and CPU seconds of one in-process run and the engine steps it simulated."""
    cfg = ClusterConfig(
        policy=sc.policy,
        instances=sc.instances,
        duration_s=duration_s,
        fast_forward=fast_forward,
    )
    arrivals = poisson_arrivals(sc.rate_per_s, duration_s, seed)
    cluster = Cluster(get_preset(), cfg, PaperWorkload(seed), arrivals)
    start, cpu = time.perf_counter(), time.process_time()
    cluster.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, sum(i.engine.counters.steps for i in cluster.instances)


def best(
    sc: Scenario, duration_s: float, seed: int, fast_forward: bool, repeat: int
) -> tuple[float, float, int]:
    runs = [timed(sc, duration_s, seed, fast_forward) for _ in range(repeat)]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2]


def timed_cli(sc: Scenario, hours: float, seed: int) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one ``kairos sim`` process."""
    kairos = Path(sys.executable).with_name("kairos")
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            str(kairos), "sim", "--workload", "paper", "--rate", f"{sc.rate_per_s}",
            "--duration-s", f"{hours * 3600:g}", "--instances", f"{sc.instances}",
            "--policy", sc.policy, "--seed", f"{seed}", "--json", "--no-plots", "--out", out,
        ]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main_cli(args: argparse.Namespace) -> int:
    head = f"{'kairos sim':34s} {'sim h':>5s} {'wall s':>7s} {'cpu s':>6s} {'target':>6s}"
    print(f"{head} {'ok':>3s}")
    worst = 0
    for sc in CLI_SCENARIOS:
        runs = [timed_cli(sc, args.hours, args.seed) for _ in range(args.repeat)]
        wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
        target = sc.target_s_per_3h * args.hours / 3.0
        ok = wall <= target
        worst += not ok
        print(
            f"{sc.name:34s} {args.hours:5.1f} {wall:7.2f} {cpu:6.2f} {target:6.1f} "
            f"{'yes' if ok else 'NO':>3s}",
            flush=True,
        )
    return 1 if worst else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours per run")
    ap.add_argument("--baseline-minutes", type=float, default=20.0, help="per-step baseline window")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs per timing (the minimum counts)")
    ap.add_argument("--cli", action="store_true", help="time `kairos sim` processes instead")
    args = ap.parse_args(argv)
    if args.cli:
        return main_cli(args)
    dur = args.hours * 3600.0
    base_dur = args.baseline_minutes * 60.0
    print(
        f"{'scenario':34s} {'sim h':>5s} {'steps':>9s} {'wall s':>7s} {'cpu s':>6s} "
        f"{'s/sim h':>8s} {'target(3h)':>10s} {'ok':>3s} {'per-step s/sim h':>16s} "
        f"{'speed-up':>8s}"
    )
    worst = 0
    for sc in SCENARIOS:
        wall, cpu, steps = best(sc, dur, args.seed, True, args.repeat)
        per_h = wall / args.hours
        _, base_cpu, _ = best(sc, base_dur, args.seed, False, args.repeat)
        base_per_h = base_cpu / (base_dur / 3600.0)
        _, fast_short, _ = best(sc, base_dur, args.seed, True, args.repeat)
        speedup = base_cpu / fast_short if fast_short > 0 else float("inf")
        ok = per_h * 3.0 <= sc.target_s_per_3h
        worst += not ok
        print(
            f"{sc.name:34s} {args.hours:5.1f} {steps:9d} {wall:7.2f} {cpu:6.2f} {per_h:8.2f} "
            f"{sc.target_s_per_3h:10.1f} {'yes' if ok else 'NO':>3s} {base_per_h:16.2f} "
            f"{speedup:7.1f}x",
            flush=True,
        )
    return 1 if worst else 0


if __name__ == "__main__":
    raise SystemExit(main())
