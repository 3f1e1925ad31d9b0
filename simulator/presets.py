"""Named hardware/model presets: every coefficient of the timing, power, engine
and GPU models in one place, with where each number comes from.

The default preset ``h100-nvl-qwen3-30b`` is the KAIROS paper's testbed: one
H100 NVL (400 W TDP) serving Qwen3-Coder-30B-A3B in FP8 under vLLM V1. The
derivations (and which numbers are assumptions) are in ``docs/simulator.md``.
Keeping them as frozen dataclasses lets the robustness sweep perturb any
coefficient with ``dataclasses.replace`` and lets the fake vLLM server build the
very same engine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from controllers.energy_attribution import WorkWeights
from controllers.frequency import DEFAULT_FLOOR_MHZ, DEFAULT_NUM_LEVELS, FrequencyLevels
from controllers.registry import levels_for
from simulator.errors import PresetError


@dataclass(frozen=True, slots=True)
class TimingParams:
    """Per-step latency model (see :mod:`simulator.timing`)."""

    cpu_overhead_s: float = 0.0030
    """Clock-independent per-step host overhead (scheduler, sampling, launch)."""
    gpu_fixed_s: float = 0.0010
    """Latency-bound kernel time per step at ``ref_clock_mhz`` (scales ∝ 1/f)."""
    mem_bw_bytes_s: float = 3.35e12
    """HBM bandwidth (H100 NVL spec sheet: 3.9 TB/s; SXM/PCIe-class 3.35 TB/s)."""
    weight_bw_efficiency: float = 0.30
    """Achieved fraction of ``mem_bw_bytes_s`` when streaming FP8 MoE weights at
    decode batch sizes. Calibrated (docs/simulator.md): gives the paper's ~17
    concurrent agents at 0.08 jobs/s; block-FP8 fused-MoE kernels run far from peak."""
    kv_bw_efficiency: float = 0.80
    """Achieved fraction of ``mem_bw_bytes_s`` when reading the KV cache (paged attention)."""
    base_weight_bytes: float = 1.35e9
    """Non-expert weights read every step: attention, router, LM head (FP8 + bf16 head)."""
    expert_weight_bytes: float = 0.2265e9
    """One expert across all 48 layers: 48 · 3 · 2048 · 768 bytes in FP8."""
    num_experts: int = 128
    experts_per_token: int = 8
    kv_bytes_per_token: int = 98_304
    """bf16 KV: 2 · 48 layers · 4 KV heads · 128 dims · 2 bytes = 96 KiB."""
    prefill_s_per_token: float = 15e-6
    """Linear (GEMM) prefill cost per uncached token at ``ref_clock_mhz``."""
    attn_s_per_pair: float = 1.75e-9
    """Attention cost per (query, key) pair at ``ref_clock_mhz``."""
    ref_clock_mhz: int = 1785
    compute_cap_mhz: int = 1785
    """Compute work stops speeding up above this clock (power/thermal limit)."""
    mem_knee_mhz: int = 875
    """Below this SM clock memory-bound kernels slow down ∝ 1/f."""
    mem_slope_above_knee: float = 0.04
    """Residual clock sensitivity of memory-bound work above the knee."""
    h2d_bytes_s: float = 25e9
    """Host-to-GPU copy rate of the CPU KV tier (``EngineParams.kv_offload_tokens``):
    PCIe Gen5 x16 peaks at 64 GB/s; vLLM gathers scattered 16-token blocks, so
    less than half is assumed (a 100K-token context loads in 0.4 s)."""
    seq_overhead_s: float = 0.0
    """Host time per sequence a step schedules (a decode or a prefill chunk): its
    inputs prepared, its token sampled and turned into output (detokenized,
    streamed). Clock-independent. 0 in the GPU presets, whose per-step host cost
    ``cpu_overhead_s`` stands for it at their batch sizes; fitted by ``kairos
    calibrate`` (docs/whatif.md), and a visible part of a step on a CPU engine,
    where the API server shares the cores with the model."""
    request_overhead_s: float = 0.0
    """Host time per request the engine admits for the first time (its set-up:
    sampling parameters, block table, first response), charged to the step that
    admits it. 0 in the GPU presets; fitted by ``kairos calibrate``."""
    request_s_per_prompt_token: float = 0.0
    """Host time per prompt token of a request admitted for the first time, cached
    or not (the prompt received and parsed, its blocks hashed for the prefix
    cache), charged like ``request_overhead_s``. 0 in the GPU presets."""


@dataclass(frozen=True, slots=True)
class PowerParams:
    """Per-instance power model (see :mod:`simulator.power`)."""

    idle_w: float = 50.0
    """No work queued: the paper's idle H100 (~50 W)."""
    idle_w_per_ghz: float = 0.0
    """Optional clock-dependent idle term (H100 SXM data shows ~+50 W/GHz locked)."""
    busy_static_w: float = 65.0
    """Added as soon as the engine is stepping, at any clock (leakage, HBM refresh)."""
    mem_w: float = 50.0
    """HBM traffic power while memory-bound kernels run."""
    dyn_a_w_per_ghz: float = 125.0
    dyn_b_w_per_ghz3: float = 18.0
    """Clock-dependent dynamic term ``a·f + b·f³`` (f in GHz), times activity."""
    mem_bound_activity: float = 0.85
    """Activity of SMs during memory-bound kernels relative to compute-bound ones."""
    tdp_w: float = 400.0


@dataclass(frozen=True, slots=True)
class EngineParams:
    """vLLM V1 scheduler and KV cache limits."""

    kv_capacity_tokens: int = 501_760
    """H100 NVL (93.1 GiB usable) · 0.90 − 31 GiB FP8 weights − 5 GiB activations and
    CUDA graphs ≈ 46 GiB of KV = 31 360 blocks of 16 tokens at 96 KiB per token."""
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    """vLLM's defaults for ``vllm serve`` on an H100/H200 (``EngineArgs``: 8192
    batched tokens, 1024 sequences; 256 sequences on smaller GPUs)."""
    max_model_len: int = 262_144
    reserve_full_isl: bool = True
    """Admit a waiting request only if its whole sequence fits the free KV (vLLM's
    default ``--scheduler-reserve-full-isl``); False: only its first prefill chunk,
    as older V1 releases did, so that long prompts admitted into a full cache are
    preempted mid-prefill (``Engine.admission_blocks``)."""
    kv_offload_tokens: int = 0
    """Host-memory tier of the prefix cache, in tokens (vLLM's
    ``--kv-offloading-size`` GiB · 2^30 / KV bytes per token; 0: off, vLLM's
    default). :mod:`simulator.kv_offload`."""


@dataclass(frozen=True, slots=True)
class GpuParams:
    """What the simulated GPU reports and how fast it obeys."""

    name: str = "NVIDIA H100 NVL"
    supported_clocks_mhz: tuple[int, ...] = tuple(range(210, 1786, 15))
    clock_latency_s: float = 0.020


@dataclass(frozen=True, slots=True)
class ControlParams:
    """Control-plane defaults used by ``kairos sim`` (same meaning as the daemon's)."""

    epoch_s: float = 5.0
    levels_floor_mhz: int | None = DEFAULT_FLOOR_MHZ
    levels_ceiling_mhz: int | None = None
    num_levels: int | None = DEFAULT_NUM_LEVELS


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    timing: TimingParams = field(default_factory=TimingParams)
    power: PowerParams = field(default_factory=PowerParams)
    engine: EngineParams = field(default_factory=EngineParams)
    gpu: GpuParams = field(default_factory=GpuParams)
    control: ControlParams = field(default_factory=ControlParams)
    energy_weights: WorkWeights | None = None
    """The router's ``[energy_weights]`` as an operator would set them for this
    model (docs/energy.md); None: derived from the timing
    (:meth:`simulator.timing.TimingModel.work_weights`)."""


def _presets() -> dict[str, Preset]:
    h100 = Preset(
        name="h100-nvl-qwen3-30b",
        description="H100 NVL 400 W, Qwen3-Coder-30B-A3B FP8, vLLM V1 (the paper's testbed)",
        energy_weights=WorkWeights(),  # the router's built-in weights are this model's
    )
    gb80 = dataclasses.replace(
        h100,
        name="h100-80gb-qwen3-30b",
        description="as h100-nvl-qwen3-30b with the paper's literal 80 GB (386k-token KV cache)",
        engine=dataclasses.replace(h100.engine, kv_capacity_tokens=386_048),
    )
    small = dataclasses.replace(
        h100,
        name="h100-nvl-qwen3-30b-small-kv",
        description="as h100-nvl-qwen3-30b with a 4x smaller KV cache (fast thrashing tests)",
        engine=dataclasses.replace(h100.engine, kv_capacity_tokens=96_512, max_model_len=65_536),
    )
    dense = dataclasses.replace(
        h100,
        name="h100-nvl-dense-32b",
        description="H100 NVL 400 W, a dense 32B model in FP8 (Qwen2.5-Coder-32B class), vLLM V1",
        timing=dataclasses.replace(
            h100.timing,
            # Every weight is read every step (no experts): 32.5B params in FP8 plus
            # the bf16 LM head; a dense GEMV streams near the bandwidth.
            base_weight_bytes=33.3e9,
            expert_weight_bytes=0.0,
            num_experts=1,
            experts_per_token=1,
            weight_bw_efficiency=0.80,
            # 2 · 64 layers · 8 KV heads · 128 dims · 2 bytes.
            kv_bytes_per_token=262_144,
            # 2 · 32.5e9 FLOPs per token at the default preset's achieved GEMM rate
            # (its 15 µs for 3.3B active parameters: ~440 TFLOP/s).
            prefill_s_per_token=1.48e-4,
            # 4 · 64 layers · 40 query heads · 128 dims per pair, the default's
            # 1.75 ns for 4 · 48 · 32 · 128, scaled.
            attn_s_per_pair=2.92e-9,
        ),
        # 93.1 GiB · 0.90 − 31 GiB of weights − 5 GiB ≈ 47.8 GiB at 256 KiB per token.
        engine=dataclasses.replace(h100.engine, kv_capacity_tokens=195_584, max_model_len=131_072),
        energy_weights=None,  # derived for this model, not the MoE model's
    )
    return {p.name: p for p in (h100, gb80, small, dense)}


PRESET_NAMES: tuple[str, ...] = tuple(_presets())
DEFAULT_PRESET = "h100-nvl-qwen3-30b"
DEFAULT_MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"
"""Served model name of the fake vLLM server (the default preset's model)."""


def get_preset(name: str = DEFAULT_PRESET) -> Preset:
    """Return the preset called ``name`` (a fresh immutable object)."""
    presets = _presets()
    if name not in presets:
        raise PresetError(f"unknown preset {name!r}; known: {', '.join(presets)}")
    return presets[name]


def with_num_levels(preset: Preset, num_levels: int | None) -> Preset:
    """``preset`` with the number of clock levels its adaptive policies use set
    (``kairosd run --num-levels``); None keeps the preset's. Fixed clocks are not
    levels and are unaffected."""
    if num_levels is None:
        return preset
    most = len(preset.gpu.supported_clocks_mhz)
    if not 2 <= num_levels <= most:
        raise PresetError(
            f"--num-levels {num_levels}: expected 2 to {most} (preset {preset.name}'s clocks)"
        )
    control = dataclasses.replace(preset.control, num_levels=num_levels)
    return dataclasses.replace(preset, control=control)


def with_kv_offload(preset: Preset, gib: float, flag: str = "--kv-offload-gib") -> Preset:
    """``preset`` with vLLM's CPU KV tier of ``gib`` GiB of host memory
    (``vllm serve --kv-offloading-backend native --kv-offloading-size GIB``); 0
    keeps the preset's (off). :mod:`simulator.kv_offload`."""
    if not (math.isfinite(gib) and 0 <= gib <= 65536):
        raise PresetError(f"{flag} {gib}: expected 0 (off) to 65536 GiB")
    if gib == 0:
        return preset
    tokens = int(gib * 2**30 // preset.timing.kv_bytes_per_token)
    engine = dataclasses.replace(preset.engine, kv_offload_tokens=tokens)
    return dataclasses.replace(preset, engine=engine)


def with_full_isl(preset: Preset, reserve: bool) -> Preset:
    """``preset`` with vLLM's admission gate on or off (``vllm serve
    --[no-]scheduler-reserve-full-isl``; ``Engine.admission_blocks``): off models the V1
    releases before it, which admitted a prompt on its first prefill chunk."""
    if reserve == preset.engine.reserve_full_isl:
        return preset
    engine = dataclasses.replace(preset.engine, reserve_full_isl=reserve)
    return dataclasses.replace(preset, engine=engine)


def control_levels(preset: Preset, policy: str) -> FrequencyLevels:
    """Levels a policy controls: the configured KAIROS range for adaptive
    policies; every supported clock for fixed/no-control baselines (so
    ``fixed:900`` really locks 900 MHz)."""
    c = preset.control
    return levels_for(
        policy,
        preset.gpu.supported_clocks_mhz,
        floor_mhz=c.levels_floor_mhz,
        ceiling_mhz=c.levels_ceiling_mhz,
        num_levels=c.num_levels,
    )


def scaled(preset: Preset, *, timing: float = 1.0, power: float = 1.0) -> Preset:
    """``preset`` with every timing (power) coefficient multiplied by a factor.

    Used by the robustness sweep: a conclusion is reported only if it survives
    ±30 % on these coefficients.
    """
    t = preset.timing
    p = preset.power
    return dataclasses.replace(
        preset,
        name=f"{preset.name}*t{timing:g}*p{power:g}",
        timing=dataclasses.replace(
            t,
            cpu_overhead_s=t.cpu_overhead_s * timing,
            gpu_fixed_s=t.gpu_fixed_s * timing,
            mem_bw_bytes_s=t.mem_bw_bytes_s / timing,
            prefill_s_per_token=t.prefill_s_per_token * timing,
            attn_s_per_pair=t.attn_s_per_pair * timing,
            seq_overhead_s=t.seq_overhead_s * timing,
            request_overhead_s=t.request_overhead_s * timing,
            request_s_per_prompt_token=t.request_s_per_prompt_token * timing,
        ),
        power=dataclasses.replace(
            p,
            busy_static_w=p.busy_static_w * power,
            mem_w=p.mem_w * power,
            dyn_a_w_per_ghz=p.dyn_a_w_per_ghz * power,
            dyn_b_w_per_ghz3=p.dyn_b_w_per_ghz3 * power,
        ),
    )
