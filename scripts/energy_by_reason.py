"""Where an adaptive policy's energy goes, reason by reason, against a fixed clock.

A many-seed saving (``scripts/compare_claude.py``) says how far a policy is from
the best fixed clock, not why. This runs the policy and one fixed clock on the
same Claude Code cells (the long-context bar's specs: dev trace, 4 instances, consolidating
placement, 3 h, SLO 20) and sums, per epoch reason of the policy's decisions
(``warmup-`` prefixes kept; every epoch at or below ``--low-mhz`` in one row),
the energy above the GPUs' idle draw and the output tokens of those epochs.
"excess" is that energy minus what the same tokens cost at the fixed clock's
energy per output token: the rows with the largest excess are where the policy
loses to the fixed clock (negative: where it gains).

    .venv/bin/python -m scripts.energy_by_reason --seeds 8 --rate 0.004
    .venv/bin/python -m scripts.energy_by_reason --policy 'predictive[context_high_top=false]'
    .venv/bin/python -m scripts.energy_by_reason --policy kairos --think-cap-s 1800
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

from scripts.compare_claude import DEFAULT_FLEET, cell_spec, think_cap_ok
from scripts.results_lib.variants import with_variant
from simulator.runner import SimSpec, run_sim


class Spent(NamedTuple):
    """One run's energy (J) and output tokens, per row, and its total energy."""

    energy_j: Counter[str]
    tokens: Counter[str]
    total_j: float


def row_of(reason: str, clock_mhz: int | None, low_mhz: int) -> str:
    """The table row an epoch counts in."""
    if clock_mhz is not None and clock_mhz <= low_mhz:
        return f"≤ {low_mhz} MHz" + (" (warm-up)" if reason.startswith("warmup-") else "")
    return reason or "(none)"


def spent(
    policy: str, rate: float, seed: int, low_mhz: int, think_cap_s: float | None = None
) -> Spent:
    """Run one cell and sum its epochs' energy above idle and tokens per row."""
    spec = cell_spec(DEFAULT_FLEET._replace(think_cap_s=think_cap_s), policy, rate, seed)
    idle_w = spec.preset.power.idle_w
    energy: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    total_j = 0.0
    for ep in run_sim(spec).epochs:
        key = row_of(ep.reason, ep.actual_clock_mhz, low_mhz)
        energy[key] += ep.energy_j - idle_w * ep.epoch_s * max(len(ep.gpus), 1)
        tokens[key] += ep.output_tokens or 0
        total_j += ep.energy_j
    return Spent(energy, tokens, total_j)


def _job(args: tuple[str, float, int, int, float | None]) -> Spent:
    return spent(*args)


def table(policy: Spent, fixed: Spent, fixed_name: str) -> list[str]:
    """Markdown rows, largest excess first."""
    per_token = sum(fixed.energy_j.values()) / max(sum(fixed.tokens.values()), 1)
    rows = [
        "| row | epochs' energy above idle, MJ | output tokens | J/output token | excess, MJ |",
        "|---|---|---|---|---|",
    ]
    excess = {k: e - per_token * policy.tokens[k] for k, e in policy.energy_j.items()}
    for key in sorted(excess, key=lambda k: -excess[k]):
        e, t = policy.energy_j[key], policy.tokens[key]
        j_tok = f"{e / t:.2f}" if t else "–"
        rows.append(f"| {key} | {e / 1e6:.3f} | {t} | {j_tok} | {excess[key] / 1e6:+.3f} |")
    rows.append(
        f"| **total energy** | policy {policy.total_j / 1e6:.2f} MJ, {fixed_name}"
        f" {fixed.total_j / 1e6:.2f} MJ ({fixed_name}: {per_token:.2f} J/output token"
        " above idle) | | | "
        f"{(policy.total_j - fixed.total_j) / 1e6:+.3f} |"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rate", type=float, default=0.004, help="sessions/s")
    ap.add_argument("--policy", default="predictive", help="NAME or NAME[FIELD=VALUE,...]")
    ap.add_argument("--against", default="fixed:900", help="the fixed clock compared with")
    ap.add_argument("--low-mhz", type=int, default=1000, help="epochs at or below: one row")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--think-cap-s", type=float, help="cap on the sessions' gaps (compare_claude's)"
    )
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    if not think_cap_ok(args.think_cap_s):
        ap.error("--think-cap-s must be a positive number of seconds")
    if not args.against.startswith("fixed:"):
        ap.error(f"--against must be a fixed clock (fixed:MHZ), got {args.against!r}")
    try:
        with_variant(SimSpec(), args.policy)  # a typo fails here, not in a worker
    except ValueError as exc:
        ap.error(str(exc))
    jobs = [
        (p, args.rate, s, args.low_mhz, args.think_cap_s)
        for s in range(1, args.seeds + 1)
        for p in (args.policy, args.against)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(_job, jobs))
    summed = [merge(runs[i::2]) for i in (0, 1)]
    print(f"{args.policy} against {args.against}, {args.rate} sessions/s, seeds 1–{args.seeds}\n")
    print("\n".join(table(summed[0], summed[1], args.against)))
    return 0


def merge(runs: list[Spent]) -> Spent:
    energy: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for r in runs:
        energy.update(r.energy_j)
        tokens.update(r.tokens)
    return Spent(energy, tokens, sum(r.total_j for r in runs))


if __name__ == "__main__":
    raise SystemExit(main())
