"""``make demo``: the whole Kairos stack on CPU, no-control vs kairos.

Starts 2 fake vLLM instances with simulated H100s, 2 ``kairosd`` daemons (sim
backend), the router, and replay agents through ``id-tracker``; runs the same
time-accelerated paper-like workload once per policy; stops everything; prints a
side-by-side power report and the paths of the PNG plots. Takes ≈3 minutes on
2 cores. ``--quick`` runs a shorter workload (the end-to-end test uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path

from kairos_common.logs import configure_logging
from simulator.demo_run import DemoConfig, arrivals_for, render, run_policy
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
        help="Simulated seconds per real second.",
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


async def amain(args: argparse.Namespace) -> None:
    cfg = DemoConfig(
        out_dir=args.out,
        rate_per_s=args.rate,
        window_s=args.window_s,
        drain_s=args.drain_s,
        speedup=args.speedup,
        seed=args.seed,
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    arrivals = arrivals_for(cfg, PaperWorkload(seed=cfg.seed))
    print(
        f"{len(arrivals)} agents arrive over {cfg.window_s:.0f} simulated s "
        f"({cfg.window_s / cfg.speedup:.0f} s real) per policy; logs in {cfg.out_dir}/"
    )
    results = []
    for policy in args.policies.split(","):
        print(f"running {policy} …", flush=True)
        results.append(await run_policy(cfg, policy, arrivals))
    print()
    print(render(results, cfg))
    for r in results:
        print(f"plot ({r.policy}): {r.plot}")
    if args.json:
        print(json.dumps([asdict(r.summary) for r in results], indent=2, default=str))


def main() -> None:
    configure_logging("warning")
    asyncio.run(amain(parse_args()))


if __name__ == "__main__":
    main()
