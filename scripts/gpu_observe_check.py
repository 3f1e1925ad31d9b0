"""Check Kairos against this machine's real GPU without changing it (observe mode).

For an operator's first contact with a new host, and for our own runs on a
lent GPU where settings must not change. It starts the real stack (fake vLLM
serving the agents, the router, one ``kairosd run --gpu-backend observe`` reading
the real GPU through Zeus/NVML) and replays paper-like agents for a bounded
window, while this script samples the GPU's energy counter on its own. Then it
checks, and exits 1 if any check fails:

- **untouched**: the GPU's locked clock and the supported clocks read the same
  before and after (observe mode never writes);
- **epochs**: the daemon wrote epoch records with real (finite, positive) power;
- **energy**: the daemon's summed epoch energy matches the counter's own
  reading over the same span (within ``--energy-tol``);
- **attribution** (energy per agent, docs/energy.md): every agent record
  carries energy, and the agents' joules plus the unrecorded and unattributed
  parts equal the energy the daemon reported (within 0.1 %).

A GPU load of your own (training, a benchmark) may run beside it: the
daemon's energy is the GPU's, whoever drew it. Results go to ``OUT/check.json``.

    python -m scripts.gpu_observe_check --out /tmp/kairos-gpu-check --window-s 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kairosd.gpu.base import GpuBackend, GpuStatus
from kairosd.gpu.opening import open_backend
from reporting.energy import energy_balance
from reporting.records import AgentRecord, EpochRecord, read_records
from simulator.agent_driver import DriverConfig, drive
from simulator.arrivals import poisson_arrivals
from simulator.stack import StackConfig, running_stack
from simulator.workload_paper import PaperWorkload


@dataclass(slots=True)
class Samples:
    """The energy counter as this script read it: (unix s, mJ summed over GPUs)."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def energy_j_between(self, t0: float, t1: float) -> float | None:
        """Counter delta over [t0, t1], interpolated between samples."""
        a, b = self._at(t0), self._at(t1)
        return None if a is None or b is None else (b - a) / 1000.0

    def _at(self, t: float) -> float | None:
        pts = self.points
        for (ta, ea), (tb, eb) in itertools.pairwise(pts):
            if ta <= t <= tb:
                return ea if tb == ta else ea + (eb - ea) * (t - ta) / (tb - ta)
        return None


def _energy_mj(statuses: list[GpuStatus]) -> float | None:
    values = [s.energy_mj for s in statuses]
    return None if any(v is None for v in values) else float(sum(v or 0 for v in values))


async def _sample(
    backend: GpuBackend, samples: Samples, period_s: float, stop: asyncio.Event
) -> None:
    """Read the counter every ``period_s`` until ``stop`` (bounded by the caller)."""
    while not stop.is_set():
        t = time.time()
        mj = _energy_mj(await backend.status())
        if mj is not None:
            samples.points.append(((t + time.time()) / 2, mj))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)


def _untouched(before: list[GpuStatus], after: list[GpuStatus]) -> dict[str, Any]:
    same = [
        (b.locked_clock_mhz == a.locked_clock_mhz)
        and (b.supported_clocks_mhz == a.supported_clocks_mhz)
        for b, a in zip(before, after, strict=True)
    ]
    return {
        "ok": all(same),
        "locked_clock_mhz_before": [b.locked_clock_mhz for b in before],
        "locked_clock_mhz_after": [a.locked_clock_mhz for a in after],
    }


def _energy_check(epochs: list[EpochRecord], samples: Samples, tol: float) -> dict[str, Any]:
    """Compare the daemon's epochs with the counter over the same span.

    Only epochs inside the sampled span count; the first of them only marks
    where the span starts (its energy began before it), so the daemon's
    energy is that of the epochs after it, from its record to the last one's.
    """
    if not samples.points:
        return {"ok": False, "why": "no counter samples (the GPU has no energy counter?)"}
    lo, hi = samples.points[0][0], samples.points[-1][0]
    inside = sorted((e for e in epochs if lo <= e.t_s <= hi), key=lambda e: e.t_s)
    if len(inside) < 2:
        return {"ok": False, "why": "fewer than two epochs inside the sampled span"}
    daemon_j = sum(e.energy_j for e in inside[1:])
    counter_j = samples.energy_j_between(inside[0].t_s, inside[-1].t_s)
    if counter_j is None or counter_j <= 0:
        return {"ok": False, "why": "no energy counted over the epochs", "daemon_j": daemon_j}
    err = abs(daemon_j - counter_j) / counter_j
    return {
        "ok": err <= tol,
        "epochs": len(inside) - 1,
        "daemon_j": round(daemon_j, 1),
        "counter_j": round(counter_j, 1),
        "relative_error": round(err, 5),
        "span_s": round(inside[-1].t_s - inside[0].t_s, 2),
    }


def _epochs_check(epochs: list[EpochRecord]) -> dict[str, Any]:
    powers = [e.avg_power_w for e in epochs]
    ok = bool(powers) and all(math.isfinite(p) and p > 0 for p in powers)
    return {
        "ok": ok,
        "count": len(epochs),
        "power_w_min": round(min(powers), 1) if powers else None,
        "power_w_max": round(max(powers), 1) if powers else None,
        "target_clocks_mhz": sorted({e.target_clock_mhz for e in epochs}),
        "actual_clocks_mhz": sorted({e.actual_clock_mhz or 0 for e in epochs}),
    }


def _attribution_check(records: list[Any]) -> dict[str, Any]:
    """Energy per agent (docs/energy.md): every agent record carries energy, and the
    agents' own joules + unrecorded + unattributed equal what the daemon reported to
    the router, which equals its power report's epochs (both within 0.1 %)."""
    balance = energy_balance(records)
    if balance is None:
        return {"ok": False, "why": "the router wrote no energy records"}
    ok = (
        balance.agents > 0
        and balance.agents_with_energy == balance.agents
        and balance.parts_error <= 0.001
        and balance.daemon_error <= 0.001
    )
    return {
        "ok": ok,
        "agents": balance.agents,
        "agents_with_energy": balance.agents_with_energy,
        "agents_energy_j": round(balance.own_j, 1),
        "unrecorded_j": round(balance.unrecorded_j, 1),
        "unattributed_j": round(balance.unattributed_j, 1),
        "measured_j": round(balance.measured_j, 1),
        "daemon_epochs_j": round(balance.daemon_j, 1),
        "parts_relative_error": round(balance.parts_error, 6),
        "daemon_relative_error": round(balance.daemon_error, 6),
    }


async def run_check(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    gpus = tuple(int(g) for g in args.gpus.split(","))
    stack_cfg = StackConfig(
        workdir=out / "stack",
        instances=1,
        speedup=args.speedup,
        gpu_backend=args.backend,
        gpus=(gpus,),
        kv_capacity_tokens=192_000,
    )
    samples, stop = Samples(), asyncio.Event()
    async with aiohttp.ClientSession() as session, running_stack(stack_cfg) as stack:
        # The check's own reader (the sim backend's GPU lives in the fake vLLM).
        kind = "observe" if args.backend == "observe" else "sim"
        backend = await open_backend(
            kind, vllm_url=stack.vllm_urls[0], gpus=gpus, timeout_s=5.0, session=session
        )
        try:
            before = await backend.status()
            sampler = asyncio.create_task(_sample(backend, samples, args.sample_s, stop))
            workload = PaperWorkload(seed=args.seed)
            times = poisson_arrivals(args.rate, args.window_s * args.speedup, args.seed)
            driver = await drive(
                DriverConfig(
                    router_url=stack.router_url,
                    speedup=args.speedup,
                    deadline_real_s=args.window_s,
                ),
                [(t, workload.program(i)) for i, t in enumerate(times)],
                out / "agents.log",
            )
            stop.set()
            await sampler
            after = await backend.status()
        finally:
            await backend.close()
    records = list(read_records(p for p in (out / "stack").glob("*.jsonl")))
    epochs = [r for r in records if isinstance(r, EpochRecord)]
    agents = [r for r in records if isinstance(r, AgentRecord)]
    return {
        "backend": args.backend,
        "gpus": [{"index": s.index, "name": s.name} for s in before],
        "agents_launched": driver.launched,
        "agent_records": len(agents),
        "untouched": _untouched(before, after),
        "epochs": _epochs_check(epochs),
        "energy": _energy_check(epochs, samples, args.energy_tol),
        "attribution": _attribution_check(records),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--backend",
        choices=("observe", "sim"),
        default="observe",
        help="observe: this machine's real GPU (default); sim: a dry run on the fake vLLM",
    )
    ap.add_argument("--gpus", default="0", help="GPU indices of the one instance (default 0)")
    ap.add_argument("--window-s", type=float, default=60.0, help="real seconds of agents")
    ap.add_argument("--speedup", type=float, default=10.0, help="fake vLLM time acceleration")
    ap.add_argument("--rate", type=float, default=0.06, help="agents per simulated second")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sample-s", type=float, default=0.2, help="counter sampling period")
    ap.add_argument("--energy-tol", type=float, default=0.02)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run_check(args))
    (args.out / "check.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    checks = ("untouched", "epochs", "energy", "attribution")
    failed = [c for c in checks if not result[c]["ok"]]
    print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
