"""Reproduce the KAIROS paper's results on the calibrated simulator (docs/results.md).

Runs every experiment of the items in parallel processes (progress on
stderr), writes each item's numbers to ``<out>/results/<item>.json`` and its
plots to ``<out>/results/*.png``, and regenerates ``<out>/results.md`` from all
items' JSON (so ``--only`` reruns some items and keeps the others).

    .venv/bin/python -m scripts.results                   # everything (~6 min on 2 quiet cores)
    .venv/bin/python -m scripts.results --only fig7,oracle --jobs 2
    .venv/bin/python -m scripts.results --quick --out /tmp/results   # smoke run (< 1 min)

Items: fig4, fig7, fig8, fig10, fig12, trace, energy, oracle, robustness (the paper's);
claude, claude-tier, claude-gaps (the long-context Claude Code cells: docs/results.md 10–12).
Add a policy to every comparison in ``scripts/results_lib/plan.py``
(``COMPARE_POLICIES`` / ``OPTIONAL_POLICIES``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from scripts.results_lib.doc import headline, render_doc
from scripts.results_lib.items import ITEM_NAMES, ITEMS, AllData
from scripts.results_lib.plan import compare_policies, full_plan, quick_plan
from scripts.results_lib.runs import run_tasks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("docs"),
        help="folder for results.md; JSON and PNGs go to OUT/results/ (default docs)",
    )
    ap.add_argument(
        "--jobs", type=int, default=0, help="parallel simulation processes (default: all cores)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="tiny windows and one seed: a smoke run, not results"
    )
    ap.add_argument(
        "--only", default="", help=f"comma-separated items to rerun: {','.join(ITEM_NAMES)}"
    )
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ITEM_NAMES)
    unknown = sorted(set(names) - set(ITEM_NAMES))
    if unknown:
        ap.error(f"unknown item(s) {', '.join(unknown)}; known: {', '.join(ITEM_NAMES)}")
    args.items = names
    args.jobs = args.jobs or os.cpu_count() or 1
    return args


def load_existing(res_dir: Path, quick: bool) -> AllData:
    """Items generated earlier in the same mode (kept when ``--only`` reruns others)."""
    data: AllData = {}
    for name in ITEM_NAMES:
        path = res_dir / f"{name}.json"
        if path.exists():
            d = json.loads(path.read_text())
            if d.get("_run", {}).get("quick") == quick:
                data[name] = d
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    policies = compare_policies()
    plan = quick_plan(policies) if args.quick else full_plan(policies)
    selected = [i for i in ITEMS if i.name in args.items]
    tasks = [t for item in selected for t in item.tasks(plan)]
    print(
        f"results: items {', '.join(args.items)}; policies {', '.join(policies)}; "
        f"{len({t.key for t in tasks})} runs on {args.jobs} processes",
        file=sys.stderr,
    )
    results = run_tasks(tasks, args.jobs)
    res_dir = args.out / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    all_data = load_existing(res_dir, args.quick)
    wall = time.perf_counter() - started
    run_meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "wall_s": wall,
        "jobs": args.jobs,
        "cpus": os.cpu_count() or 1,
        "items": list(args.items),
        "quick": args.quick,
    }
    for item in selected:
        data = item.build(plan, results)
        data["_run"] = run_meta
        all_data[item.name] = data
        (res_dir / f"{item.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    meta: dict[str, Any] = {
        "quick": args.quick,
        "hours": plan.hours,
        "seeds": plan.seeds,
        "policies": policies,
    }
    (args.out / "results.md").write_text(render_doc(all_data, args.out, meta))
    total = time.perf_counter() - started
    print(f"wrote {args.out / 'results.md'} in {total:.0f} s", file=sys.stderr)
    print(headline(all_data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
