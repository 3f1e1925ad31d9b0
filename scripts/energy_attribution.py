"""Per-agent energy: production attribution against the simulator's ground truth.

Runs the simulator with :class:`simulator.energy_truth.EnergyTruth` attached to
every engine (each step's energy above idle split by its sequences' work) while
the cluster attributes each epoch's measured energy with the router's code
(:class:`controllers.energy_attribution.EnergyAccountant`, fed only what the
router sees: finished requests' tokens and the epoch's energy). Prints, per
scenario, the P50/P90 relative error of finished agents' attributed energy
against the truth and how far the parts' sum is from the measured energy::

    .venv/bin/python -m scripts.energy_attribution            # docs/energy.md table
    .venv/bin/python -m scripts.energy_attribution --hours 0.5 --only paper-1
    .venv/bin/python -m scripts.energy_attribution --preset h100-nvl-dense-32b --weights builtin
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from controllers.energy_attribution import EnergyAccountant, WorkWeights
from reporting.metrics import percentile
from simulator.cluster import Cluster
from simulator.energy_truth import EnergyTruth
from simulator.presets import DEFAULT_PRESET, PRESET_NAMES, get_preset
from simulator.runner import SimSpec, build_arrivals, build_workload, cluster_config
from simulator.timing import TimingModel

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "claude-code-dev.jsonl"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    workload: str
    rate_per_s: float
    instances: int


SCENARIOS = (
    Scenario("paper-1", "paper", 0.06, 1),
    Scenario("paper-4", "paper", 0.06, 4),
    Scenario("trace-1", f"trace:{TRACE}", 0.002, 1),
    Scenario("trace-4", f"trace:{TRACE}", 0.008, 4),
)


def run(
    sc: Scenario,
    hours: float,
    seed: int,
    policy: str,
    preset: str = DEFAULT_PRESET,
    weights: str = "preset",
) -> dict[str, float | str]:
    """One simulated run; the comparison's numbers. ``weights``: ``preset`` (the
    preset's ``energy_weights``, as the simulator attributes), ``builtin`` (the
    router's built-in weights, whatever the model) or ``derived`` (from the
    preset's timing, :meth:`TimingModel.work_weights`)."""
    started = time.perf_counter()
    spec = SimSpec(
        preset=get_preset(preset),
        policy=policy,
        workload=sc.workload,
        rate_per_s=sc.rate_per_s,
        duration_s=hours * 3600.0,
        instances=sc.instances,
        seed=seed,
    )
    config = dataclasses.replace(cluster_config(spec), run=sc.name)
    cluster = Cluster(spec.preset, config, build_workload(spec), build_arrivals(spec))
    if weights != "preset":
        chosen = (
            WorkWeights()
            if weights == "builtin"
            else TimingModel(spec.preset.timing).work_weights()
        )
        cluster.energy = EnergyAccountant(weights=chosen)
    truths = []
    for inst in cluster.instances:
        inst.engine.truth = EnergyTruth(inst.engine.timing)
        truths.append(inst.engine.truth)
    cluster.run()
    truth: dict[str, float] = {}
    for t in truths:
        for key, joules in t.by_key.items():
            truth[key] = truth.get(key, 0.0) + joules
    errors = []
    for rec in cluster.agents_done:
        true_j = truth.get(rec.agent_id, 0.0)
        if true_j > 0 and rec.energy_own_j is not None:
            errors.append(abs(rec.energy_own_j - true_j) / true_j)
    measured = math.fsum(e.energy_j for e in cluster.epochs)
    acc = cluster.energy.instances.values()
    attributed = math.fsum(i.attributed_j for i in acc)
    unattributed = math.fsum(i.unattributed_j for i in acc)
    idle_w = [i.idle_power_w for i in acc if i.idle_power_w is not None]
    return {
        "scenario": sc.name,
        "policy": policy,
        "hours": hours,
        "agents_compared": len(errors),
        "p50_rel_error": percentile(errors, 50) or 0.0,
        "p90_rel_error": percentile(errors, 90) or 0.0,
        "measured_j": measured,
        "attributed_j": attributed,
        "unattributed_j": unattributed,
        "sum_rel_error": abs(attributed + unattributed - measured) / measured if measured else 0.0,
        "truth_above_idle_j": math.fsum(t.total_j for t in truths),
        "learned_idle_w": min(idle_w) if idle_w else float("nan"),
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", default="kairos")
    ap.add_argument("--only", action="append", help="scenario name (repeatable)")
    ap.add_argument("--preset", default=DEFAULT_PRESET, choices=PRESET_NAMES)
    ap.add_argument(
        "--weights",
        default="preset",
        choices=("preset", "builtin", "derived"),
        help="attribution weights: the preset's (as the simulator uses), the router's "
        "built-in ones, or derived from the preset's timing",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    head = f"{'scenario':<9} {'agents':>6} {'P50 err':>8} {'P90 err':>8} {'sum err':>9} "
    head += f"{'measured kJ':>12} {'unattr. %':>9} {'idle W':>7} {'wall s':>7}"
    print(head, flush=True)
    for sc in SCENARIOS:
        if args.only and sc.name not in args.only:
            continue
        r = run(sc, args.hours, args.seed, args.policy, args.preset, args.weights)
        rows.append(r)
        measured = float(r["measured_j"])
        print(
            f"{sc.name:<9} {r['agents_compared']:>6} {float(r['p50_rel_error']):>8.1%} "
            f"{float(r['p90_rel_error']):>8.1%} {float(r['sum_rel_error']):>9.1e} "
            f"{measured / 1e3:>12.0f} {float(r['unattributed_j']) / measured:>9.1%} "
            f"{float(r['learned_idle_w']):>7.1f} {float(r['wall_s']):>7.0f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
