"""``kairos calibrate``'s work: probe a vLLM, fit the step model, build the preset.

Order: read what the engine says about itself (served model and length from
``/v1/models``, KV capacity and block size from ``cache_config_info``, version),
run a pilot (two prefills, one decode) to price probes, plan the probes within
the time budget (:mod:`whatif.plan`) and say how long that takes, run them one
at a time on the idle engine (:mod:`whatif.probes`), fit (:mod:`whatif.fit`), and
turn the coefficients into a preset: the chosen base preset with the fitted
timing and the engine's limits.

Clocks are never changed here. The power model, the clocks and how each timing
term scales with the clock are the base preset's, and the preset file says so:
a calibration on a CPU or a GPU in observe mode fits the engine at the clock it
runs (the base preset's highest, what no control runs).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.presets import EngineParams, Preset, get_preset
from whatif.errors import FitError, ProbeError
from whatif.fit import FitResult, Observation, fit
from whatif.plan import Costs, Plan, plan
from whatif.probe import VllmProbe
from whatif.probes import DecodeProbe, EngineShape, PrefillProbe, Probe, ProbeResult, ProbeRunner

CPU_DEFAULTS = (2048, 128)
"""``vllm serve``'s ``max_num_batched_tokens`` and ``max_num_seqs`` on a CPU."""
GPU_DEFAULTS = (8192, 1024)
"""The same on an H100/H200-class GPU (70 GB or more; vLLM's ``EngineArgs``)."""
UNBOUNDED_BW = 1e18
"""Bytes per second standing for "decodes read the KV cache for free" (a zero fit)."""
POWER_NOTE = (
    "not fitted: clocks were not changed (a CPU engine, or a GPU in observe mode); "
    "power model, clocks and clock scaling are the base preset's"
)


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    vllm_url: str
    api_key: str | None = None
    model: str | None = None
    budget_s: float = 240.0
    base_preset: str = "h100-nvl-qwen3-30b"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    reserve_full_isl: bool = True
    name: str | None = None
    seed: int | None = None


@dataclass(slots=True)
class Calibration:
    """Everything a calibration learned, for the report and the preset file."""

    settings: CalibrationSettings
    model: str
    version: str
    shape: EngineShape
    assumed: list[str]
    plan: Plan | None = None
    fit: FitResult | None = None
    preset: Preset | None = None
    hits_checked: int = 0
    hit_mismatches: list[str] = field(default_factory=list)
    foreign: int = 0
    unrun: int = 0
    """Planned probes not run: the budget ran out (a machine slower than the pilot)."""
    elapsed_s: float = 0.0

    def fitted_on(self) -> dict[str, str | int | float | bool]:
        s = self.shape
        return {
            "engine": f"vllm {self.version}",
            "model": self.model,
            "vllm_url": self.settings.vllm_url,
            "kv_capacity_tokens": s.capacity_tokens,
            "block_size": s.block_size,
            "max_model_len": s.max_model_len,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "max_num_seqs": s.max_num_seqs,
            "assumed": "; ".join(self.assumed) or "nothing",
            "fitted_at_unix_s": round(time.time()),
            "calibration_s": round(self.elapsed_s, 1),
            "power": POWER_NOTE,
        }

    def fit_summary(self) -> dict[str, str | int | float | bool]:
        out: dict[str, str | int | float | bool] = {}
        if self.fit is not None:
            out.update({k: round(v, 6) for k, v in self.fit.summary().items()})
            out["outliers_left_out"] = self.fit.outliers
        out["prefix_hits_checked"] = self.hits_checked
        out["prefix_hit_mismatches"] = len(self.hit_mismatches)
        out["probes_dropped_for_other_traffic"] = self.foreign
        out["probes_not_run_for_the_budget"] = self.unrun
        return out


async def engine_shape(
    probe: VllmProbe, settings: CalibrationSettings
) -> tuple[EngineShape, str, str, list[str]]:
    """The engine's limits (read, else vLLM's defaults, named in ``assumed``)."""
    model = await probe.served_model()
    version = await probe.version()
    m = await probe.metrics()
    if m.capacity_tokens is None or m.block_size is None:
        raise ProbeError(f"{probe.url}/metrics has no cache_config_info with the KV capacity")
    assumed: list[str] = []
    cpu = m.block_size == 128  # vLLM's block on its CPU backend; 16 on GPUs
    defaults = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    kind = "CPU" if cpu else "70 GB+ GPU"
    batched = settings.max_num_batched_tokens
    if batched is None:
        batched = defaults[0]
        assumed.append(f"max_num_batched_tokens {batched} (vLLM's {kind} default)")
    seqs = settings.max_num_seqs
    if seqs is None:
        seqs = defaults[1]
        assumed.append(f"max_num_seqs {seqs} (vLLM's {kind} default)")
    length = probe.max_model_len
    if length is None:
        length = m.capacity_tokens
        assumed.append("max_model_len = the KV capacity (/v1/models does not list it)")
    if m.kv_offloading_gib:
        assumed.append("its CPU KV tier is not modelled (set --kv-offload-gib when replaying)")
    shape = EngineShape(m.capacity_tokens, m.block_size, length, batched, seqs)
    return shape, model, version, assumed


async def _pilot(runner: ProbeRunner, shape: EngineShape) -> tuple[Costs, list[ProbeResult]]:
    room = min(shape.max_model_len - 1, shape.capacity_tokens // 2)
    short, long = min(256, room), min(2048, room)
    # Not timed: a freshly started server's first requests pay one-off costs
    # (allocations, lazy imports) that no step of a running engine does.
    for n in (short, long):
        await runner.probe.complete(runner.prompt(n), 4)
    results = []
    for probe in (PrefillProbe(0, short), PrefillProbe(0, long), DecodeProbe(1, 64, 40)):
        result = await runner.run(probe)
        if result is None or not result.observations:
            raise ProbeError("the pilot probes were disturbed: calibrate an idle engine")
        results.append(result)
    t_short = results[0].observations[-1].measured_s
    t_long = results[1].observations[-1].measured_s
    window = results[2].observations[0]
    step = window.measured_s / max(window.features[0], 1.0)
    return Costs.from_pilot((short, t_short), (long, t_long), step), results


async def calibrate(
    settings: CalibrationSettings, echo: Callable[[str], None], progress: bool = True
) -> Calibration:
    """Probe, fit, build the preset (see the module doc)."""
    started = time.monotonic()
    seed = settings.seed if settings.seed is not None else time.time_ns() & 0xFFFFFFFF
    async with VllmProbe(settings.vllm_url, settings.api_key, settings.model) as probe:
        shape, model, version, assumed = await engine_shape(probe, settings)
        cal = Calibration(settings, model, version, shape, assumed)
        runner = ProbeRunner(probe, shape, seed)
        await runner.wait_idle()
        costs, pilot = await _pilot(runner, shape)
        cal.plan = plan(shape, costs, settings.budget_s)
        echo(
            f"calibrating {model} (vLLM {version}) at {settings.vllm_url}: "
            f"{len(cal.plan.probes)} probes, about {cal.plan.estimate_s:.0f} s"
            + (f" ({len(cal.plan.dropped)} costly probes left out)" if cal.plan.dropped else "")
        )
        observations = [o for r in pilot for o in r.observations]
        deadline = time.monotonic() + settings.budget_s
        for i, p in enumerate(cal.plan.probes, start=1):
            if time.monotonic() > deadline:  # slower than the pilot said: stop on time
                cal.unrun = len(cal.plan.probes) - i + 1
                break
            result = await runner.run(p)
            if result is None:
                continue
            _check_hits(cal, p, result)
            observations += result.observations
            if progress:
                echo(f"  [{i}/{len(cal.plan.probes)}] {p.label}")
        cal.foreign = runner.foreign
    cal.elapsed_s = time.monotonic() - started
    cal.fit = fit(observations)
    cal.preset = fitted_preset(cal)
    return cal


def _check_hits(cal: Calibration, probe: Probe, result: ProbeResult) -> None:
    if result.measured_hits is None or not isinstance(probe, PrefillProbe):
        return
    cal.hits_checked += 1
    if result.measured_hits != result.expected_hits:
        cal.hit_mismatches.append(
            f"{probe.label}: vLLM served {result.measured_hits} prompt tokens from its "
            f"prefix cache, the simulator's cache model {result.expected_hits}"
        )


def fitted_preset(cal: Calibration) -> Preset:
    """The base preset with the fitted timing and the engine's limits."""
    if cal.fit is None:
        raise FitError("no fit to build a preset from")
    base = get_preset(cal.settings.base_preset)
    c = cal.fit.coefficients
    kv = c["kv_s_per_token"]
    timing = dataclasses.replace(
        base.timing,
        cpu_overhead_s=c["cpu_overhead_s"],
        gpu_fixed_s=0.0,
        seq_overhead_s=c["seq_overhead_s"],
        request_overhead_s=c["request_overhead_s"],
        request_s_per_prompt_token=c["request_s_per_prompt_token"],
        prefill_s_per_token=c["prefill_s_per_token"],
        attn_s_per_pair=c["attn_s_per_pair"],
        # Weights stream in a step's constant here (one clock, no roofline to fit).
        base_weight_bytes=0.0,
        expert_weight_bytes=0.0,
        # Decodes read the KV cache at an effective rate that gives the fitted price.
        kv_bw_efficiency=1.0,
        mem_bw_bytes_s=base.timing.kv_bytes_per_token / kv if kv > 0 else UNBOUNDED_BW,
    )
    s = cal.shape
    engine = EngineParams(
        kv_capacity_tokens=s.capacity_tokens,
        block_size=s.block_size,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        max_model_len=s.max_model_len,
        reserve_full_isl=cal.settings.reserve_full_isl,
    )
    name = cal.settings.name or f"fitted-{_slug(cal.model)}-{s.capacity_tokens}tok"
    description = (
        f"{cal.model} on vLLM {cal.version}, fitted by kairos calibrate; "
        f"power and clocks: {base.name}'s"
    )
    return dataclasses.replace(
        base,
        name=name,
        description=description,
        timing=timing,
        engine=engine,
        energy_weights=None,
    )


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)[:60]


def coefficient_rows(cal: Calibration) -> list[tuple[str, Any]]:
    """The fitted coefficients for printing (µs and ns where that reads better)."""
    if cal.fit is None:
        return []
    c = cal.fit.coefficients
    return [
        ("per step (cpu_overhead_s)", f"{c['cpu_overhead_s'] * 1e3:.3f} ms"),
        ("per sequence in a step (seq_overhead_s)", f"{c['seq_overhead_s'] * 1e6:.1f} µs"),
        ("per prefill token (prefill_s_per_token)", f"{c['prefill_s_per_token'] * 1e6:.2f} µs"),
        ("per attention pair (attn_s_per_pair)", f"{c['attn_s_per_pair'] * 1e9:.3f} ns"),
        ("per decode context token (KV read)", f"{c['kv_s_per_token'] * 1e9:.3f} ns"),
        ("per request admitted (request_overhead_s)", f"{c['request_overhead_s'] * 1e3:.3f} ms"),
        (
            "per prompt token admitted (request_s_per_prompt_token)",
            f"{c['request_s_per_prompt_token'] * 1e6:.3f} µs",
        ),
    ]


def worst(result: FitResult, count: int = 5) -> list[Observation]:
    """The probes the fit reproduces worst."""
    order = sorted(
        zip(result.observations, result.relative_errors(), strict=True),
        key=lambda pair: -abs(pair[1]),
    )
    return [o for o, _ in order[:count]]
