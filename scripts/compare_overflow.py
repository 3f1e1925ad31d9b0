"""Overflow relief on and off, side by side (issue 14; docs/control-law.md point 10).

Runs the Claude Code dev trace (the same specs as docs/results.md item 10) with
``ReassignmentConfig(relieve_overflow=False)`` and ``True`` on identical arrivals,
seeds 1..N, for ``no-control`` and the default ``kairos``, in parallel processes,
and prints one markdown row per setting and policy (sums over seeds for counts,
means for the rest) plus, for ``kairos``, how many (rate, seed) cells meet issue
14's bar against the no control of the same run.

    .venv/bin/python -m scripts.compare_overflow --seeds 16   # 0.004 and 0.008, 4 instances
    .venv/bin/python -m scripts.compare_overflow --seeds 8 --setting 0.012x4 --setting 0.004x2
    .venv/bin/python -m scripts.compare_overflow --seeds 8 --setting 0.008x4rr  # round-robin
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor

from controllers import ReassignmentConfig
from scripts.results_lib.items_claude import claude_spec, kairos_failures
from scripts.results_lib.plan import full_plan
from scripts.results_lib.runs import Metrics, run_metrics
from simulator.runner import SimSpec

POLICIES = ("no-control", "kairos")
Key = tuple[str, str, bool, int]


def parse_setting(text: str) -> tuple[float, int, str]:
    """``RATExINSTANCES`` with an optional ``rr`` suffix (round-robin placement)."""
    placement = "consolidating"
    if text.endswith("rr"):
        text, placement = text[:-2], "round-robin"
    rate, _, instances = text.partition("x")
    return float(rate), int(instances or 4), placement


def spec_for(setting: str, policy: str, relieve: bool, seed: int) -> SimSpec:
    rate, instances, placement = parse_setting(setting)
    base = claude_spec(full_plan((policy,)), policy, rate, seed)
    return dataclasses.replace(
        base,
        instances=instances,
        placement=placement,
        reassignment=ReassignmentConfig(relieve_overflow=relieve),
    )


def _run(key: Key) -> tuple[Key, Metrics]:
    return key, run_metrics(spec_for(*key))


def row(runs: list[Metrics]) -> str:
    n = len(runs)

    def mean(k: str) -> float:
        return sum(float(m[k] or 0.0) for m in runs) / n

    return (
        f"{sum(int(m['preemptions']) for m in runs)} | {mean('slo_attainment'):.3f} | "
        f"{sum(int(m['completed_agents']) for m in runs)} | {mean('avg_power_w'):.0f} | "
        f"{mean('energy_per_output_token_j'):.3f} | {mean('mean_pending_s'):.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--setting", action="append", default=[], help="e.g. 0.008x4, 0.008x4rr")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    settings = args.setting or ["0.004x4", "0.008x4"]
    seeds = range(1, args.seeds + 1)
    keys = [
        (st, p, r, s) for st in settings for p in POLICIES for r in (False, True) for s in seeds
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        res: dict[Key, Metrics] = dict(pool.map(_run, keys))
    print(
        "| setting | policy | relief | preemptions | attainment | sessions done | W | J/token"
        " | pending s | cells at issue 14's bar |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for st in settings:
        for p in POLICIES:
            for r in (False, True):
                runs = [res[(st, p, r, s)] for s in seeds]
                cells = "–"
                if p == "kairos":
                    ok = sum(
                        not kairos_failures(res[(st, "no-control", r, s)], res[(st, p, r, s)])
                        for s in seeds
                    )
                    cells = f"{ok} of {len(seeds)}"
                print(f"| {st} | {p} | {'on' if r else 'off'} | {row(runs)} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
