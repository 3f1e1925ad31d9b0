"""Timing, power and simulated-GPU models against the published data points and
the paper's calibration targets that are cheap to check (C1)."""

from __future__ import annotations

import pytest

from simulator.errors import EngineError, PresetError
from simulator.gpu import SimulatedGpu
from simulator.power import PowerModel
from simulator.presets import PRESET_NAMES, get_preset, scaled
from simulator.timing import TimingModel, attention_pairs

P = get_preset()
TM = TimingModel(P.timing)
PM = PowerModel(P.power)


def _dec(f: int, b: int, ctx_total: int) -> float:
    return TM.step(
        f, decode_seqs=b, decode_context_tokens=ctx_total, prefill_tokens=0, attn_pairs=0
    ).time_s


def _decode(f: int, b: int = 16, ctx: int = 4096) -> float:
    return TM.step(
        f, decode_seqs=b, decode_context_tokens=b * ctx, prefill_tokens=0, attn_pairs=0
    ).time_s


def _prefill(f: int, cached: int = 0) -> float:
    return TM.step(
        f,
        decode_seqs=0,
        decode_context_tokens=0,
        prefill_tokens=2048,
        attn_pairs=attention_pairs(2048, cached),
    ).time_s


def test_expected_distinct_experts() -> None:
    assert TM.distinct_experts(1) == pytest.approx(8.0)
    assert TM.distinct_experts(16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert TM.distinct_experts(10_000) == pytest.approx(128.0)


def test_attention_pairs_formula() -> None:
    assert attention_pairs(2048, 0) == 2048 * 2049 // 2
    assert attention_pairs(10, 100) == 1000 + 55


def test_decode_is_flat_above_knee_and_inverse_below() -> None:
    top = _decode(1785)
    assert _decode(900) / top < 1.10
    assert _decode(437) / _decode(875) == pytest.approx(2.0, rel=0.15)
    assert _decode(1785, b=64) > _decode(1785, b=16) > _decode(1785, b=1)


def test_prefill_is_compute_bound_and_pays_attention_pairs() -> None:
    assert _prefill(890) / _prefill(1785) == pytest.approx(1785 / 890, rel=0.15)
    extra = _prefill(1785, 16384) - _prefill(1785, 0)
    assert extra == pytest.approx(2048 * 16384 * P.timing.attn_s_per_pair, rel=1e-6)


def test_decode_run_closed_form_matches_sum_of_steps() -> None:
    n, ctx, k = 7, 7 * 3000, 50
    total = sum(
        TM.step(
            1200, decode_seqs=n, decode_context_tokens=ctx + i * n, prefill_tokens=0, attn_pairs=0
        ).time_s
        for i in range(k)
    )
    assert TM.decode_run(1200, n, ctx, k).time_s == pytest.approx(total, rel=1e-12)
    # steps that start strictly before the budget
    budget = TM.decode_run(1200, n, ctx, 20).time_s
    assert TM.decode_steps_before(1200, n, ctx, budget - 1e-9) == 20
    assert TM.decode_steps_before(1200, n, ctx, budget + 1e-9) == 21


def test_c1_idle_and_light_work_power() -> None:
    assert PM.idle_w(1785) == pytest.approx(50.0)
    low = P.gpu.supported_clocks_mhz[0]
    light = TM.step(low, decode_seqs=1, decode_context_tokens=4096, prefill_tokens=0, attn_pairs=0)
    assert PM.power_w(low, light) >= 150.0


def test_power_rises_with_clock_and_is_capped_at_tdp() -> None:
    powers = []
    for f in (660, 900, 1185, 1680, 1785):
        cost = TM.step(
            f, decode_seqs=16, decode_context_tokens=16 * 8000, prefill_tokens=0, attn_pairs=0
        )
        powers.append(PM.power_w(f, cost))
    assert powers == sorted(powers)
    big = TM.step(
        1785, decode_seqs=0, decode_context_tokens=0, prefill_tokens=8192, attn_pairs=10**10
    )
    assert PM.power_w(1785, big) <= P.power.tdp_w + 1e-9
    # 1680 → 900 MHz on a decode-heavy batch saves roughly the paper's ~30 %
    assert 0.2 < 1 - powers[1] / powers[3] < 0.4


def test_gpu_clock_latency_and_state() -> None:
    gpu = SimulatedGpu(P.gpu)
    assert gpu.clock_at(0.0) == gpu.max_clock_mhz
    gpu.set_locked_clocks(900, 900, 1.0)
    assert gpu.clock_at(1.0 + P.gpu.clock_latency_s / 2) == gpu.max_clock_mhz
    assert gpu.next_change_s() == pytest.approx(1.0 + P.gpu.clock_latency_s)
    assert gpu.clock_at(1.1) == 900
    gpu.add_energy(2.5, 100.0)
    state = gpu.state(1.2)
    assert (state.locked_min_mhz, state.current_clock_mhz, state.energy_mj) == (900, 900, 2500)
    assert state.supported_clocks_mhz[0] == 210
    gpu.reset_locked_clocks(2.0)
    assert gpu.clock_at(3.0) == gpu.max_clock_mhz and gpu.locked_max_mhz is None
    with pytest.raises(EngineError):
        gpu.set_locked_clocks(100, 100, 3.0)


def test_presets_and_scaling() -> None:
    assert "h100-nvl-qwen3-30b" in PRESET_NAMES
    with pytest.raises(PresetError):
        get_preset("nope")
    slow = scaled(P, timing=1.3, power=0.7)
    assert TimingModel(slow.timing).step(
        1785, decode_seqs=4, decode_context_tokens=4000, prefill_tokens=512, attn_pairs=10**6
    ).time_s == pytest.approx(
        1.3
        * TM.step(
            1785, decode_seqs=4, decode_context_tokens=4000, prefill_tokens=512, attn_pairs=10**6
        ).time_s
    )
    assert slow.power.idle_w == P.power.idle_w and slow.power.tdp_w == P.power.tdp_w
    assert PowerModel(slow.power).dynamic_w(1785) == pytest.approx(0.7 * PM.dynamic_w(1785))
