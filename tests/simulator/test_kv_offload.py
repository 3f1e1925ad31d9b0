"""vLLM's CPU KV tier in the engine model (``--kv-offloading-size``): what the GPU
evicts is loaded back, not recomputed, and the copy's time is charged."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from simulator.engine import Engine
from simulator.engine_types import EngineRequest, FirstToken, RequestFinished
from simulator.errors import PresetError
from simulator.kv_offload import CpuKvTier
from simulator.presets import Preset, get_preset, with_kv_offload
from tests.simulator.conftest import drain, make_engine, small_preset


def _with_tier(p: Preset, tokens: int, h2d_bytes_s: float | None = None) -> Preset:
    engine = dataclasses.replace(p.engine, kv_offload_tokens=tokens)
    timing = (
        p.timing if h2d_bytes_s is None else dataclasses.replace(p.timing, h2d_bytes_s=h2d_bytes_s)
    )
    return dataclasses.replace(p, engine=engine, timing=timing)


def test_tier_keeps_latest_context_per_key_and_drops_least_recent_whole() -> None:
    tier = CpuKvTier(capacity_tokens=16 * 10, block_size=16)
    tier.store("a", 4)
    tier.store("b", 4)
    tier.store("a", 5)  # a grew: replaced, and now most recent
    assert (tier.blocks_of("a"), tier.blocks_of("b"), tier.used_blocks) == (5, 4, 9)
    tier.store("c", 3)  # 12 > 10: b (least recent) goes whole
    assert tier.blocks_of("b") == 0 and tier.used_blocks == 8 and tier.dropped_blocks == 4
    tier.load("a", 5)  # a load makes a the most recent
    tier.store("d", 4)
    assert tier.blocks_of("c") == 0 and tier.blocks_of("a") == 5
    tier.store("huge", 50)  # larger than the tier: clamped, everything else dropped
    assert tier.blocks_of("huge") == 10 and tier.used_blocks == 10


def _evict_then_return(p: Preset) -> tuple[Engine, RequestFinished, float]:
    """An agent's context is evicted by another agent, then the agent returns."""
    e = make_engine(p)
    e.submit(EngineRequest("t1", 3000, 10, 0.0, cache_key="agent"))
    drain(e)
    e.submit(EngineRequest("big", 16000, 10, 100.0, cache_key="other"))
    drain(e)
    assert e.kv.cached_of("agent") < 3000 // 16  # the GPU lost (part of) it
    e.submit(EngineRequest("t2", 3600, 10, 200.0, cache_key="agent", shared_prefix_tokens=3010))
    events = drain(e)
    (fin,) = [ev for ev in events if isinstance(ev, RequestFinished)]
    (first,) = [ev for ev in events if isinstance(ev, FirstToken)]
    return e, fin, first.t_s - 200.0


def test_an_evicted_context_is_loaded_back_not_recomputed() -> None:
    base = small_preset(kv_tokens=16384)
    plain, fin_plain, _ = _evict_then_return(base)
    tiered, fin, _ = _evict_then_return(_with_tier(base, 100_000))
    prefix = 3009 // 16 * 16  # full blocks of the shared prefix
    assert fin.cached_tokens == prefix
    assert tiered.counters.loaded_tokens > 0  # the GPU's part is a hit, the rest a copy
    assert tiered.counters.recomputed_tokens == 0
    assert plain.counters.recomputed_tokens > 0 and fin_plain.cached_tokens < prefix
    computed_plain = plain.counters.prefill_computed_tokens
    computed_tiered = tiered.counters.prefill_computed_tokens
    assert computed_plain - computed_tiered == tiered.counters.loaded_tokens


def test_the_copy_is_charged_to_the_step_that_loads() -> None:
    base = small_preset(kv_tokens=16384)
    slow, _, ttft_slow = _evict_then_return(_with_tier(base, 100_000, h2d_bytes_s=1e9))
    fast, _, ttft_fast = _evict_then_return(_with_tier(base, 100_000, h2d_bytes_s=1e15))
    loaded = slow.counters.loaded_tokens
    assert loaded == fast.counters.loaded_tokens > 0
    expected = loaded * base.timing.kv_bytes_per_token / 1e9
    assert ttft_slow - ttft_fast == pytest.approx(expected, rel=1e-3)


def test_preempted_requests_resume_from_the_tier_and_blocks_are_conserved() -> None:
    def run(p: Preset) -> Engine:
        rng = random.Random(3)
        e = make_engine(p)
        t = 0.0
        for i in range(40):
            t += rng.expovariate(4.0)
            e.advance_to(t)
            e.submit(
                EngineRequest(
                    f"r{i}", rng.randint(200, 1500), rng.randint(50, 300), t, f"a{i % 6}", 0
                )
            )
        drain(e)
        assert not e.running and not e.waiting
        assert e.kv.free_blocks + e.kv.cached_blocks == e.kv.total_blocks
        return e

    plain = run(small_preset(kv_tokens=4096))
    tiered = run(_with_tier(small_preset(kv_tokens=4096), 64_000))
    assert plain.counters.preemptions > 0
    assert tiered.counters.loaded_tokens > 0
    assert tiered.counters.recomputed_tokens < plain.counters.recomputed_tokens
    assert tiered.counters.finished_requests == plain.counters.finished_requests == 40


def test_no_tier_by_default_and_gib_to_tokens() -> None:
    p = get_preset()
    assert make_engine(p).kv.tier is None and p.engine.kv_offload_tokens == 0
    assert with_kv_offload(p, 0) is p
    tiered = with_kv_offload(p, 96)  # 96 GiB at 96 KiB per token
    assert tiered.engine.kv_offload_tokens == 96 * 2**30 // p.timing.kv_bytes_per_token == 1_048_576
    assert make_engine(tiered).kv.tier is not None
    for bad in (-1.0, math.nan, math.inf, 1e9):
        with pytest.raises(PresetError, match="--kv-offload-gib"):
            with_kv_offload(p, bad)
