"""``make demo``: the whole Kairos stack on CPU, no-control vs kairos.

Per policy, starts 2 fake vLLM instances with simulated H100s, 2 ``kairosd``
daemons (sim backend), the router, and replay agents (an agent host plus two
through the ``id-tracker`` CLI, all started before the clock starts); runs the
policies side by side on the same time-accelerated paper-like workload; stops
everything; prints a side-by-side power report, the paths of the PNG plots,
each run's self-check (its lag against the bound) and, last, one line
``demo-summary {json}``. The speed-up is chosen from the machine (cores, cost
of one agent launch). Exit status 3 when the self-check failed: the numbers
then describe the machine, not Kairos.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import asdict
from pathlib import Path

from kairos_common.logs import configure_logging
from simulator.demo_run import DemoConfig, arrivals_for, calibrated, render, run_policies
from simulator.workload_paper import PaperWorkload

DEFAULTS = DemoConfig(out_dir=Path("out/demo"))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULTS.out_dir, help="Output directory.")
    p.add_argument("--policies", default="no-control,kairos", help="Comma-separated policies.")
    p.add_argument("--rate", type=float, default=DEFAULTS.rate_per_s, help="Agents/s (sim).")
    p.add_argument(
        "--window-s",
        type=float,
        default=DEFAULTS.window_s,
        help="Arrival window, simulated seconds.",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=DEFAULTS.drain_s,
        help="Extra measured time after the last arrival, simulated seconds.",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=DEFAULTS.speedup,
        help="Largest time acceleration (simulated seconds per real second); the demo "
        "uses less if this machine cannot hold it (see --fixed-speedup).",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=240.0,
        help="Real seconds the measured window may take: sets the least speed-up chosen.",
    )
    p.add_argument(
        "--fixed-speedup",
        action="store_true",
        help="Use --speedup as given instead of choosing it from the machine.",
    )
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=DEFAULTS.kv_capacity_tokens,
        help="KV cache per simulated instance, tokens (default: the demo's).",
    )
    p.add_argument("--json", action="store_true", help="Also print the summaries as JSON.")
    return p.parse_args()


async def amain(args: argparse.Namespace) -> int:
    cfg = DemoConfig(
        out_dir=args.out,
        rate_per_s=args.rate,
        window_s=args.window_s,
        drain_s=args.drain_s,
        speedup=args.speedup,
        auto_speedup=not args.fixed_speedup,
        min_speedup=min(args.speedup, (args.window_s + args.drain_s) / args.budget_s),
        seed=args.seed,
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    policies = args.policies.split(",")
    cfg = await calibrated(cfg, stacks=len(policies))
    arrivals = arrivals_for(cfg, PaperWorkload(seed=cfg.seed))
    print(
        f"{len(arrivals)} agents arrive over {cfg.window_s:.0f} simulated s "
        f"({cfg.window_s / cfg.speedup:.0f} s real at ×{cfg.speedup:g}, chosen for "
        f"{len(os.sched_getaffinity(0))} usable core(s)) per policy; logs in {cfg.out_dir}/"
    )
    print(f"running {', '.join(policies)} side by side …", flush=True)
    results = await run_policies(cfg, policies, arrivals)
    print()
    print(render(results, cfg))
    for r in results:
        print(f"plot ({r.policy}): {r.plot}")
    valid = True
    for r in results:
        assert r.lag is not None
        print(f"{r.policy}: {r.lag.verdict()}")
        valid = valid and r.lag.valid
    if args.json:
        print(json.dumps([asdict(r.summary) for r in results], indent=2, default=str))
    summary = {r.policy: r.headline() for r in results}
    print("demo-summary " + json.dumps(summary, separators=(",", ":")), flush=True)
    return 0 if valid else 3


def main() -> None:
    configure_logging("warning")
    raise SystemExit(asyncio.run(amain(parse_args())))


if __name__ == "__main__":
    main()
