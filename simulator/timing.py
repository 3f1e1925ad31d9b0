"""Per-step latency of one vLLM V1 engine step under a locked SM clock.

A step's time is the sum of four parts (docs/simulator.md, "Timing model"):

* ``cpu_s`` — host overhead (scheduling, sampling), independent of the GPU clock;
* ``fixed_s`` — latency-bound kernels, ∝ 1/f;
* ``mem_s`` — streaming the weights of the experts the batch touches plus, for
  decode, the KV cache of every decoding sequence. Memory-bound: nearly flat in
  the SM clock down to a knee (~0.875 GHz), then ∝ 1/f;
* ``comp_s`` — prefill GEMMs for uncached tokens plus attention over
  ``A = t_uc·t_c + t_uc(t_uc+1)/2`` (query, key) pairs. Compute-bound: ∝ 1/min(f, f_cap).

The weight streaming and the prefill GEMMs overlap (roofline): a step pays the
larger of the two, so a decode batch is memory-bound and a 2048-token prefill
chunk compute-bound, as on the real GPU.

Host work that grows with the step's contents (``TimingParams.seq_overhead_s`` per
sequence scheduled, ``request_overhead_s`` and ``request_s_per_prompt_token`` per
request admitted for the first time) is part of ``cpu_s``. Those terms are 0 in
the GPU presets, which fold host work into the per-step ``cpu_overhead_s``, and
are fitted by ``kairos calibrate`` where they are visible (a CPU engine, whose API
server shares the cores with the model; docs/whatif.md).

The MoE weight term uses the expected number of distinct experts a batch of
``T`` tokens reads, ``E(T) = N·(1 − (1 − k/N)^T)``. Every part is linear in the
decode context, so a run of pure-decode steps has a closed form
(:meth:`TimingModel.decode_run`), which is what makes the simulator fast.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from controllers.energy_attribution import WorkWeights
from simulator.presets import TimingParams

TYPICAL_BATCH = 8
"""Sequences decoding together at which :meth:`TimingModel.work_weights` linearises a MoE step."""


class StepCost(NamedTuple):
    """Time components of one step, or sums over a run of steps (seconds), and
    their sum ``time_s``.

    A named tuple rather than a frozen dataclass: one is built per step and per
    decode run, and a frozen dataclass's ``__init__`` was a tenth of the run time.
    ``time_s`` is stored rather than a property: the engine reads it several
    times per step."""

    cpu_s: float
    fixed_s: float
    mem_s: float
    comp_s: float
    time_s: float


def attention_pairs(uncached_tokens: int, cached_tokens: int) -> int:
    """``A = t_uc·t_c + t_uc(t_uc+1)/2`` for one prefill chunk."""
    return uncached_tokens * cached_tokens + uncached_tokens * (uncached_tokens + 1) // 2


class TimingModel:
    """Latency of engine steps for one preset; pure and cheap to call."""

    def __init__(self, params: TimingParams) -> None:
        self.params = params
        p = params
        self._weight_s_per_byte = 1.0 / (p.mem_bw_bytes_s * p.weight_bw_efficiency)
        self._kv_s_per_token = p.kv_bytes_per_token / (p.mem_bw_bytes_s * p.kv_bw_efficiency)
        self._miss = 1.0 - p.experts_per_token / p.num_experts
        self._expert_cache: dict[int, float] = {}
        self._weight_cache: dict[int, float] = {}
        # Per-clock factors ``(s_m, s_c, cpu + fixed·s_c)``: a handful of clocks are
        # ever used, and the hot loop asks for them at every step and run.
        self._clock_cache: dict[float, tuple[float, float, float]] = {}

    def _factors(self, clock_mhz: float) -> tuple[float, float, float]:
        """``(mem_slowdown, compute_slowdown, cpu + fixed·s_c)`` at ``clock_mhz``, cached
        (the same floats as computing them afresh, so results do not change)."""
        got = self._clock_cache.get(clock_mhz)
        if got is None:
            p = self.params
            sc = self.compute_slowdown(clock_mhz)
            got = (self.mem_slowdown(clock_mhz), sc, p.cpu_overhead_s + p.gpu_fixed_s * sc)
            self._clock_cache[clock_mhz] = got
        return got

    def distinct_experts(self, tokens: int) -> float:
        """``E(T) = N·(1 − (1 − k/N)^T)``: expected experts read per layer."""
        cached = self._expert_cache.get(tokens)
        if cached is None:
            n = self.params.num_experts
            cached = n * (1.0 - self._miss**tokens) if tokens > 0 else 0.0
            if len(self._expert_cache) < 20_000:
                self._expert_cache[tokens] = cached
        return cached

    def work_weights(self, batch: int = TYPICAL_BATCH) -> WorkWeights:
        """The energy-attribution weights an operator would configure for this GPU
        and model (docs/energy.md, "Weights for your model"), at the reference clock.

        From the architecture alone: a decode step shares the host overhead, the
        fixed kernels and the weights every token reads; each decoded token adds the
        experts it routes to and reads its own KV cache; a prefill costs its GEMMs
        and attention pairs. A MoE step's expert reads are linearised at ``batch``
        sequences: one more token adds ``E(batch + 1) − E(batch)`` distinct experts
        (0 for a dense model), and the rest of the batch's experts are shared.
        """
        p = self.params
        experts = self.distinct_experts(batch)
        added = self.distinct_experts(batch + 1) - experts
        shared_bytes = p.base_weight_bytes + (experts - batch * added) * p.expert_weight_bytes
        token_s = added * p.expert_weight_bytes * self._weight_s_per_byte
        if p.seq_overhead_s:  # each decoded token is a sequence in its step
            token_s += p.seq_overhead_s
        return WorkWeights(
            prefill_s_per_token=p.prefill_s_per_token,
            attn_s_per_pair=p.attn_s_per_pair,
            step_shared_s=p.cpu_overhead_s + p.gpu_fixed_s + shared_bytes * self._weight_s_per_byte,
            token_s=token_s,
            kv_s_per_token=self._kv_s_per_token,
        )

    def mem_slowdown(self, clock_mhz: float) -> float:
        """Memory-bound kernels: ~flat above the knee, ∝ 1/f below it."""
        p = self.params
        f = max(clock_mhz, 1.0)
        if f >= p.mem_knee_mhz:
            return 1.0 + p.mem_slope_above_knee * (p.ref_clock_mhz / f - 1.0)
        at_knee = 1.0 + p.mem_slope_above_knee * (p.ref_clock_mhz / p.mem_knee_mhz - 1.0)
        return at_knee * p.mem_knee_mhz / f

    def compute_slowdown(self, clock_mhz: float) -> float:
        """Compute-bound kernels: ∝ 1/min(f, f_cap), 1 at the reference clock."""
        p = self.params
        return p.ref_clock_mhz / min(max(clock_mhz, 1.0), p.compute_cap_mhz)

    def load_s(self, tokens: int) -> float:
        """Copying ``tokens`` of KV back from the CPU tier (clock-independent: PCIe)."""
        p = self.params
        return tokens * p.kv_bytes_per_token / p.h2d_bytes_s if tokens > 0 else 0.0

    def weight_s(self, tokens: int) -> float:
        """Weight-streaming time of a step with ``tokens`` tokens at the reference
        clock (cached per token count, like :meth:`distinct_experts`)."""
        got = self._weight_cache.get(tokens)
        if got is None:
            p = self.params
            if tokens <= 0:
                return 0.0
            volume = p.base_weight_bytes + self.distinct_experts(tokens) * p.expert_weight_bytes
            got = volume * self._weight_s_per_byte
            if len(self._weight_cache) < 20_000:
                self._weight_cache[tokens] = got
        return got

    def step(
        self,
        clock_mhz: float,
        *,
        decode_seqs: int,
        decode_context_tokens: int,
        prefill_tokens: int,
        attn_pairs: int,
        prefill_seqs: int = 0,
    ) -> StepCost:
        """Cost of one step: ``decode_seqs`` sequences reading ``decode_context_tokens``
        of KV in total, plus ``prefill_seqs`` prefill chunks of ``prefill_tokens`` with
        ``attn_pairs``."""
        p = self.params
        sm, sc, _ = self._factors(clock_mhz)
        weights = self.weight_s(decode_seqs + prefill_tokens) * sm
        gemm = prefill_tokens * p.prefill_s_per_token * sc
        mem = decode_context_tokens * self._kv_s_per_token * sm
        comp = attn_pairs * p.attn_s_per_pair * sc
        # Roofline for the expert/linear GEMMs: streaming the weights and the
        # prefill FLOPs overlap, so the slower of the two sets the time.
        if gemm >= weights:
            comp += gemm
        else:
            mem += weights
        cpu, fixed = p.cpu_overhead_s, p.gpu_fixed_s * sc
        if p.seq_overhead_s:  # branch: the GPU presets' floats stay exactly as they were
            cpu += (decode_seqs + prefill_seqs) * p.seq_overhead_s
        return StepCost(cpu, fixed, mem, comp, cpu + fixed + mem + comp)

    def admission_s(self, prompt_tokens: int) -> float:
        """Host time of admitting a request of ``prompt_tokens`` for the first time."""
        p = self.params
        return p.request_overhead_s + prompt_tokens * p.request_s_per_prompt_token

    def decode_coeffs(
        self, clock_mhz: float, seqs: int, context_tokens: int
    ) -> tuple[float, float, float]:
        """For a pure-decode run: ``(const_s, mem0_s, dmem_s)`` such that step ``k``
        (0-based) takes ``const_s + mem0_s + k·dmem_s`` seconds, all in ``mem_s``
        except ``const_s`` (cpu + fixed)."""
        sm, _, const = self._factors(clock_mhz)
        if self.params.seq_overhead_s:
            const += seqs * self.params.seq_overhead_s
        mem0 = (self.weight_s(seqs) + context_tokens * self._kv_s_per_token) * sm
        dmem = seqs * self._kv_s_per_token * sm
        return const, mem0, dmem

    def decode_run(self, clock_mhz: float, seqs: int, context_tokens: int, steps: int) -> StepCost:
        """Summed cost of ``steps`` decode steps; each adds one token per sequence."""
        p = self.params
        sm, sc, _ = self._factors(clock_mhz)
        kv = self._kv_s_per_token
        mem0 = (self.weight_s(seqs) + context_tokens * kv) * sm  # as in decode_coeffs
        dmem = seqs * kv * sm
        mem = steps * mem0 + dmem * steps * (steps - 1) / 2.0
        cpu, fixed = steps * p.cpu_overhead_s, steps * p.gpu_fixed_s * sc
        if p.seq_overhead_s:
            cpu += steps * seqs * p.seq_overhead_s
        return StepCost(cpu, fixed, mem, 0.0, cpu + fixed + mem + 0.0)

    def decode_steps_before(
        self, clock_mhz: float, seqs: int, context_tokens: int, budget_s: float
    ) -> int:
        """Number of decode steps that *start* strictly within ``budget_s`` from now."""
        if budget_s <= 0.0:
            return 0
        const, mem0, dmem = self.decode_coeffs(clock_mhz, seqs, context_tokens)
        a = const + mem0
        # elapsed(k) = k·a + dmem·k(k−1)/2; steps 0..K−1 start before budget iff
        # elapsed(K−1) < budget. Solve the quadratic, then fix rounding.
        if dmem <= 0.0:
            k = int(budget_s / a) + 1
        else:
            b = a - dmem / 2.0
            k = int((-b + math.sqrt(b * b + 2.0 * dmem * budget_s)) / dmem) + 1
        while k > 0 and self._elapsed(a, dmem, k - 1) >= budget_s:
            k -= 1
        while self._elapsed(a, dmem, k) < budget_s:
            k += 1
        return k

    @staticmethod
    def _elapsed(a: float, dmem: float, k: int) -> float:
        return k * a + dmem * k * (k - 1) / 2.0
