"""Behaviour-preservation harness for refactoring the control law (its stages).

Runs the simulator over a matrix that exercises every departure of the law
(docs/control-law.md points 6–18): the paper workload and the Claude Code trace,
1 and 4 instances, every per-instance policy, with and without vLLM's CPU KV
tier, tool gaps of 60 s and of 30 min (the eviction window), consolidating and
confident placement, a fleet power budget, and a few seeds, on short windows.
Each run is reduced to its summary metrics plus digests of every epoch record
(clock, reason, admissions, usage, energy) and every agent record, so that two
code versions can be compared for *exact* equality, epoch by epoch.

    .venv/bin/python -m scripts.law_equality --out /tmp/law-main.json       # baseline
    .venv/bin/python -m scripts.law_equality --check /tmp/law-main.json     # after a change
    .venv/bin/python -m scripts.law_equality --check /tmp/law-main.json \\
        --rename kairos-paper=kairos-alg1 --changed kairos-alg1             # a renamed policy

``--changed POLICY`` lists policies whose behaviour a change meant to alter:
their differences are printed as before → after rather than failing the check.
A research tool: nothing in the test suite imports it. About 5 minutes on one
core (``--jobs``), ``--quick`` a subset in well under one.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "claude-code-dev.jsonl"
"""The full Claude Code development trace where the development machine keeps it
(beside the checkout; not shipped); the tests' embedded sample otherwise."""
SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "simulator" / "data"
POLICIES = ("kairos", "kairos-paper", "kairos-no-ta", "predictive", "no-control", "fixed:900")
IGNORED = {"wall_s", "policy"}
"""Keys of the summary that say nothing about behaviour (a renamed policy keeps its runs)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One simulated run of the matrix."""

    policy: str
    workload: str
    rate: float
    instances: int
    duration_s: float
    seed: int
    placement: str = "consolidating"
    tier_gib: float = 0.0
    think_cap_s: float = 60.0
    cap_w: float | None = None

    @property
    def key(self) -> str:
        wl = "paper" if self.workload == "paper" else "trace"
        parts = [
            wl,
            f"r{self.rate:g}",
            f"n{self.instances}",
            f"s{self.seed}",
            self.placement,
            f"tier{self.tier_gib:g}",
            f"gap{self.think_cap_s:g}",
            f"cap{self.cap_w:g}" if self.cap_w else "nocap",
        ]
        return "/".join(parts)


def matrix(trace: Path, quick: bool) -> list[Case]:
    """Every policy over settings chosen so that each departure acts somewhere."""
    tr = f"trace:{trace}"
    seeds = (1,) if quick else (1, 2)
    settings: list[dict[str, Any]] = [
        # Paper workload: below, at and past capacity; one and four instances.
        dict(workload="paper", rate=0.04, instances=1, duration_s=2400.0),
        dict(workload="paper", rate=0.12, instances=1, duration_s=2400.0),
        dict(workload="paper", rate=0.24, instances=4, duration_s=2400.0),
        dict(workload="paper", rate=0.12, instances=1, duration_s=2400.0, tier_gib=192.0),
        dict(workload="paper", rate=0.24, instances=4, duration_s=2400.0, cap_w=1100.0),
        # Claude Code: long contexts, holds, moves, the tier, the eviction window.
        dict(workload=tr, rate=0.002, instances=1, duration_s=5400.0),
        dict(workload=tr, rate=0.008, instances=4, duration_s=5400.0),
        dict(workload=tr, rate=0.012, instances=4, duration_s=5400.0),
        dict(workload=tr, rate=0.008, instances=4, duration_s=5400.0, tier_gib=192.0),
        dict(workload=tr, rate=0.008, instances=4, duration_s=5400.0, think_cap_s=1800.0),
        dict(workload=tr, rate=0.008, instances=4, duration_s=5400.0, placement="confident"),
        dict(workload=tr, rate=0.008, instances=4, duration_s=5400.0, cap_w=1400.0),
    ]
    if quick:
        settings = [settings[1], settings[6], settings[8], settings[9]]
    return [Case(policy=p, seed=s, **kw) for kw in settings for s in seeds for p in POLICIES]


def _digest(rows: Iterator[tuple[Any, ...]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(repr(row).encode())
    return h.hexdigest()[:16]


def run_case(case: Case) -> dict[str, Any]:
    """One run, reduced to what behaviour it showed."""
    from controllers import FleetBudgetConfig
    from simulator.presets import get_preset, with_kv_offload
    from simulator.runner import SimSpec, cluster_config, result_json, run_sim

    spec = SimSpec(
        policy=case.policy,
        workload=case.workload,
        rate_per_s=case.rate,
        duration_s=case.duration_s,
        instances=case.instances,
        seed=case.seed,
        placement=case.placement,
        preset=with_kv_offload(get_preset(), case.tier_gib),
        think_cap_s=case.think_cap_s,
    )
    config = cluster_config(spec)
    if case.cap_w is not None:
        config = dataclasses.replace(config, fleet_budget=FleetBudgetConfig(cap_w=case.cap_w))
    result = run_sim(spec, config=config)
    metrics = {k: v for k, v in result_json(result).items() if k not in IGNORED}
    epochs = (
        (e.instance, e.epoch, e.target_clock_mhz, e.actual_clock_mhz, e.reason, e.admitted,
         e.ongoing, e.pending, e.usage_tokens, e.boost, e.deferred, e.min_throughput_tok_s,
         round(e.energy_j, 6))
        for e in result.epochs
    )  # fmt: skip
    agents = (
        (a.agent_id, a.start_s, a.end_s, a.turns, a.pending_s, a.instances, a.end_reason,
         a.energy_j)
        for a in result.agents
    )  # fmt: skip
    reasons = Counter(e.reason for e in result.epochs)
    return {
        "key": case.key,
        "policy": case.policy,
        "metrics": metrics,
        "epochs": _digest(epochs),
        "agents": _digest(agents),
        "reasons": dict(sorted(reasons.items())),
    }


def _summary_line(run: dict[str, Any]) -> str:
    m = run["metrics"]
    att = m["slo_attainment"]
    return (
        f"{m['avg_power_w']:.1f} W, attainment {att if att is None else round(att, 3)}, "
        f"done {m['completed_agents']}, pending {m['mean_pending_s'] or 0:.1f} s, "
        f"preemptions {m['preemptions']}"
    )


def compare(
    base: dict[str, dict[str, Any]],
    new: dict[str, dict[str, Any]],
    rename: dict[str, str],
    changed: set[str],
) -> int:
    """Print differences; the number of runs that differ where none was meant to."""
    failures = 0
    same = 0
    for key, before in sorted(base.items()):
        policy = before["policy"]
        now_policy = rename.get(policy, policy)
        new_key = f"{now_policy}|{key.split('|', 1)[1]}"
        after = new.get(new_key)
        if after is None:
            print(f"MISSING {new_key}")
            failures += 1
            continue
        diff = [
            part
            for part in ("metrics", "epochs", "agents", "reasons")
            if before[part] != after[part]
        ]
        if not diff:
            same += 1
            continue
        if now_policy in changed:
            print(f"changed (intended) {new_key}: {_summary_line(before)} → {_summary_line(after)}")
            continue
        failures += 1
        keys = [k for k in before["metrics"] if before["metrics"][k] != after["metrics"].get(k)]
        print(f"DIFFERS {new_key}: {', '.join(diff)}; metrics {keys[:6]}")
        if before["reasons"] != after["reasons"]:
            print(f"   reasons {before['reasons']} → {after['reasons']}")
    print(f"{same} of {len(base)} runs identical; {failures} unexpected difference(s)")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, help="write the runs to this JSON file")
    ap.add_argument("--check", type=Path, help="compare with a JSON file written by --out")
    ap.add_argument("--rename", action="append", default=[], help="OLD=NEW policy name")
    ap.add_argument("--changed", action="append", default=[], help="a policy meant to change")
    ap.add_argument("--trace", type=Path, default=TRACE, help="Claude Code trace (JSONL)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes (default 1)")
    ap.add_argument("--quick", action="store_true", help="a subset, one seed")
    args = ap.parse_args(argv)
    rename = dict(r.split("=", 1) for r in args.rename)
    if not args.trace.is_file():
        args.trace = SAMPLE / "claude-code-sample.jsonl"
    cases = [dataclasses.replace(c, policy=rename.get(c.policy, c.policy))
             for c in matrix(args.trace, args.quick)]  # fmt: skip
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_case, cases))
    else:
        runs = [run_case(c) for c in cases]
    out = {f"{r['policy']}|{r['key']}": r for r in runs}
    print(f"{len(runs)} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True), encoding="utf-8")
    if args.check is not None:
        base = json.loads(args.check.read_text(encoding="utf-8"))
        if args.quick:
            wanted = {c.key for c in matrix(args.trace, True)}
            base = {k: v for k, v in base.items() if v["key"] in wanted}
        return 1 if compare(base, out, rename, set(args.changed)) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
