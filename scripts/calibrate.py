"""Calibration checks C1–C8 of the simulator against the KAIROS paper (docs/simulator.md, C1–C8).

Each check runs the default preset (single H100 NVL, Qwen3-Coder-30B FP8,
synthetic paper workload unless noted) and prints measured vs paper values with
a verdict. Results are reported in ``docs/simulator.md``.

    .venv/bin/python scripts/calibrate.py                 # all checks, 3 h windows
    .venv/bin/python scripts/calibrate.py --only C3,C4    # a subset
    .venv/bin/python scripts/calibrate.py --workload-stats
    .venv/bin/python scripts/calibrate.py --timing-scale 1.3 --power-scale 0.7
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable

from simulator.engine import Engine
from simulator.engine_types import EngineRequest
from simulator.gpu import SimulatedGpu
from simulator.power import PowerModel
from simulator.presets import Preset, get_preset, scaled
from simulator.runner import SimResult, SimSpec, run_many
from simulator.timing import TimingModel
from simulator.workload_paper import PaperWorkload, workload_stats

Row = tuple[str, str, str, str]  # check, quantity, measured, paper / target
Check = Callable[["Ctx"], list[tuple[str, str, str, bool | None]]]


@dataclasses.dataclass
class Ctx:
    preset: Preset
    duration_s: float
    seed: int
    processes: int

    def run(self, specs: list[SimSpec]) -> list[SimResult]:
        specs = [
            dataclasses.replace(s, preset=self.preset, duration_s=self.duration_s, seed=self.seed)
            for s in specs
        ]
        return run_many(specs, self.processes)


def _pct(a: float, b: float) -> float:
    return 100.0 * (1.0 - a / b) if b else 0.0


def _p5(r: SimResult) -> float:
    return r.summary.p5_agent_throughput_tok_s or 0.0


def c1(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    """Idle ≈ 50 W; any work at the lowest clock ≥ ~150 W."""
    p = ctx.preset
    gpu = SimulatedGpu(p.gpu)
    eng = Engine(p.engine, TimingModel(p.timing), PowerModel(p.power), gpu)
    eng.advance_to(10.0)
    idle = gpu.energy_j / 10.0
    low = gpu.supported_clocks_mhz[0]
    eng.set_clock(low, 10.0)
    eng.submit(EngineRequest("r", 512, 64, 10.1))
    e0 = eng.energy_j_at(10.1)
    events = []
    while (t := eng.next_event_time()) is not None:
        events.extend(eng.advance_to(t))
    busy = (eng.energy_j_at(eng.now_s) - e0) / (eng.now_s - 10.1)
    return [
        ("idle power (W)", f"{idle:.1f}", "≈50", abs(idle - 50.0) <= 10.0),
        (f"one agent at {low} MHz (W)", f"{busy:.1f}", "≥ ~150", busy >= 140.0),
    ]


def c2(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    (r,) = ctx.run([SimSpec(policy="no-control", rate_per_s=0.06)])
    p = r.summary.avg_power_w
    return [("no-control @0.06 avg power (W)", f"{p:.1f}", "367.9 ±10%", abs(p / 367.9 - 1) <= 0.1)]


def c3(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    hi, lo = ctx.run(
        [
            SimSpec(policy="fixed:1680", rate_per_s=0.08),
            SimSpec(policy="fixed:900", rate_per_s=0.08),
        ]
    )
    cut = _pct(lo.summary.avg_power_w, hi.summary.avg_power_w)
    dj = _pct(lo.summary.job_throughput_per_s, hi.summary.job_throughput_per_s)
    ongoing = hi.run.counters.get("mean_ongoing_per_instance", 0.0)
    return [
        ("mean concurrent agents @1680", f"{ongoing:.1f}", "~17", 12.0 <= ongoing <= 22.0),
        (
            "avg power 1680 → 900 (W)",
            f"{hi.summary.avg_power_w:.0f} → {lo.summary.avg_power_w:.0f} (−{cut:.1f}%)",
            "−25…35%",
            25.0 <= cut <= 35.0,
        ),
        (
            "job throughput 1680 / 900 (/s)",
            f"{hi.summary.job_throughput_per_s:.4f} / {lo.summary.job_throughput_per_s:.4f}",
            "within 5%",
            abs(dj) <= 5.0,
        ),
    ]


def c4(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    """Run on five seeds: near the knee the outcome depends on the arrivals."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for seed in range(ctx.seed, ctx.seed + 5):
        sub = dataclasses.replace(ctx, seed=seed)
        ok, bad = sub.run(
            [
                SimSpec(policy="fixed:900", rate_per_s=0.08),
                SimSpec(policy="fixed:660", rate_per_s=0.08),
            ]
        )
        cap = bad.run.counters["capacity_tokens"]
        peak = bad.run.counters.get("max_usage_tokens", 0.0)
        epj = [r.summary.energy_j / max(1, r.summary.completed_agents) for r in (ok, bad)]
        jobs = bad.summary.job_throughput_per_s
        rec = (ok.summary.recomputed_tokens, bad.summary.recomputed_tokens)
        rows += [
            (f"seed {seed}: peak context @660 / capacity", f"{peak / cap:.2f}", "> 1", peak > cap),
            (
                f"seed {seed}: recomputed tokens 900 → 660",
                f"{rec[0]:,} → {rec[1]:,}",
                "sharp rise",
                rec[1] > 10 * max(1, rec[0]),
            ),
            (
                f"seed {seed}: jobs/s 900 → 660",
                f"{ok.summary.job_throughput_per_s:.4f} → {jobs:.4f}",
                "660 < 0.08 arrival",
                jobs < 0.95 * 0.08,
            ),
            (
                f"seed {seed}: energy per job 900 → 660 (kJ)",
                f"{epj[0] / 1e3:.1f} → {epj[1] / 1e3:.1f}",
                "rises",
                epj[1] > epj[0],
            ),
        ]
    return rows


def c5(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    rates = (0.02, 0.04, 0.06, 0.08)
    specs = [SimSpec(policy=p, rate_per_s=r) for r in rates for p in ("no-control", "kairos")]
    res = ctx.run(specs)
    rows: list[tuple[str, str, str, bool | None]] = []
    for i, rate in enumerate(rates):
        base, k = res[2 * i], res[2 * i + 1]
        save = _pct(k.summary.avg_power_w, base.summary.avg_power_w)
        target = "−34.5% (367.9→240.9 W)" if rate == 0.06 else "−25…40%"
        rows.append(
            (
                f"KAIROS vs no-control @{rate} (W, P5 tok/s)",
                f"{base.summary.avg_power_w:.0f}→{k.summary.avg_power_w:.0f} (−{save:.1f}%),"
                f" P5 {_p5(k):.1f}",
                target + ", P5 ≥ 20",
                25.0 <= save <= 40.0 and _p5(k) >= 19.0,
            )
        )
    return rows


def c6(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    """At the paper's 0.05 jobs/s (DABStep) and at 0.10, where our SWE-like
    workload is as close to its capacity as DABStep was at 0.05."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for rate in (0.05, 0.10):
        base, no_ta, ta = ctx.run(
            [
                SimSpec(policy="no-control", rate_per_s=rate),
                SimSpec(policy="kairos-no-ta", rate_per_s=rate),
                SimSpec(policy="kairos", rate_per_s=rate),
            ]
        )
        collapse = no_ta.summary.job_throughput_per_s < 0.95 * rate
        keeps_up = ta.summary.job_throughput_per_s >= 0.9 * rate
        for r, target, ok in (
            (base, "(baseline)", None),
            (no_ta, "collapse: P5 2.3, 0.046 jobs/s", collapse if rate > 0.05 else None),
            (ta, "P5 ≈ 20, keeps up with arrivals", keeps_up),
        ):
            rows.append(
                (
                    f"{r.summary.policy} @{rate}",
                    f"P5 {_p5(r):.1f}, {r.summary.job_throughput_per_s:.4f} jobs/s,"
                    f" {r.summary.preemptions} preempt., {r.summary.avg_power_w:.0f} W",
                    target,
                    ok,
                )
            )
    return rows


def c7(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    base, rr, cons = ctx.run(
        [
            SimSpec(policy="no-control", rate_per_s=0.16, instances=4, placement="round-robin"),
            SimSpec(policy="kairos", rate_per_s=0.16, instances=4, placement="round-robin"),
            SimSpec(policy="kairos", rate_per_s=0.16, instances=4, placement="consolidating"),
        ]
    )
    return [
        ("no-control, 4 inst @0.16 (W)", f"{base.summary.avg_power_w:.0f}", "1279.5", None),
        (
            "KAIROS round-robin (W, P5)",
            f"{rr.summary.avg_power_w:.0f}, P5 {_p5(rr):.1f}",
            "784.8, P5 25.4",
            None,
        ),
        (
            "KAIROS consolidating (W, P5)",
            f"{cons.summary.avg_power_w:.0f}, P5 {_p5(cons):.1f}",
            "686.5, P5 26.9",
            cons.summary.avg_power_w < rr.summary.avg_power_w < base.summary.avg_power_w,
        ),
    ]


def c8(ctx: Ctx) -> list[tuple[str, str, str, bool | None]]:
    slos = (20.0, 35.0, 45.0, 55.0, 65.0)
    specs = [SimSpec(policy="no-control", rate_per_s=0.03)] + [
        SimSpec(policy="kairos", rate_per_s=0.03, slo_tok_s=s) for s in slos
    ]
    base, *ks = ctx.run(specs)
    saves = [_pct(k.summary.avg_power_w, base.summary.avg_power_w) for k in ks]
    rows: list[tuple[str, str, str, bool | None]] = [
        (
            "no-control @0.03 (W, P5)",
            f"{base.summary.avg_power_w:.0f}, P5 {_p5(base):.1f}",
            "-",
            None,
        )
    ]
    paper = {20.0: "−32.9%", 35.0: "-", 45.0: "−6.3% (max attainable)", 55.0: "", 65.0: ""}
    for slo, k, save in zip(slos, ks, saves, strict=True):
        rows.append(
            (
                f"KAIROS SLO {slo:g} tok/s",
                f"−{save:.1f}%, P5 {_p5(k):.1f}, attain {k.summary.slo_attainment or 0:.2f}",
                paper[slo],
                None,
            )
        )
    shrink = all(a >= b - 0.5 for a, b in itertools.pairwise(saves)) and saves[0] > saves[-1]
    rows.append(("savings shrink as SLO tightens", "", "monotone", shrink))
    return rows


CHECKS: dict[str, Check] = {
    "C1": c1,
    "C2": c2,
    "C3": c3,
    "C4": c4,
    "C5": c5,
    "C6": c6,
    "C7": c7,
    "C8": c8,
}


def print_workload_stats(agents: int, seed: int) -> None:
    stats = workload_stats(PaperWorkload(seed), agents)
    print(f"{'statistic':32s} {'generated':>12s}  paper target")
    for name, value, target in stats.rows():
        print(f"{name:32s} {value:>12s}  {target}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated checks, e.g. C2,C3")
    ap.add_argument("--duration-s", type=float, default=3 * 3600.0, help="simulated window")
    ap.add_argument("--seed", type=int, default=2, help="arrival/workload seed")
    ap.add_argument("--processes", type=int, default=2, help="parallel simulation processes")
    ap.add_argument("--preset", default="h100-nvl-qwen3-30b", help="preset name")
    ap.add_argument("--timing-scale", type=float, default=1.0, help="scale timing coefficients")
    ap.add_argument("--power-scale", type=float, default=1.0, help="scale power coefficients")
    ap.add_argument("--workload-stats", action="store_true", help="print workload statistics")
    args = ap.parse_args(argv)
    if args.workload_stats:
        print_workload_stats(5000, args.seed)
        return 0
    preset = get_preset(args.preset)
    if args.timing_scale != 1.0 or args.power_scale != 1.0:
        preset = scaled(preset, timing=args.timing_scale, power=args.power_scale)
    ctx = Ctx(preset, args.duration_s, args.seed, args.processes)
    names = [n.strip().upper() for n in args.only.split(",") if n.strip()] or list(CHECKS)
    failed = 0
    print(f"preset {preset.name}, {args.duration_s / 3600:g} h windows, seed {args.seed}")
    print(f"{'check':5s} {'quantity':42s} {'measured':44s} {'paper/target':28s} verdict")
    for name in names:
        for quantity, measured, target, ok in CHECKS[name](ctx):
            verdict = "-" if ok is None else ("PASS" if ok else "MISS")
            failed += ok is False
            print(f"{name:5s} {quantity:42s} {measured:44s} {target:28s} {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
