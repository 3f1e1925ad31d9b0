"""The calibration's arithmetic: probes priced by the simulator's own engine are
fitted back to the coefficients that priced them, and noise is handled."""

from __future__ import annotations

import dataclasses
import random

import pytest

from simulator.engine import Engine
from simulator.engine_types import EngineRequest, FirstToken, TokenProgress
from simulator.presets import Preset, get_preset
from tests.simulator.conftest import drain, make_engine
from whatif.errors import FitError
from whatif.fit import COEFFICIENTS, Observation, features, fit
from whatif.probe import TimedCall
from whatif.probes import decode_window, prefill_features

BUDGET = 2048
BLOCK = 128


def cpu_like_preset() -> Preset:
    """A preset shaped like a fitted CPU engine: every term of the step model on,
    the GPU-only terms (weights roofline, clock-scaled fixed cost) off."""
    p = get_preset()
    timing = dataclasses.replace(
        p.timing,
        cpu_overhead_s=3.0e-3,
        gpu_fixed_s=0.0,
        seq_overhead_s=2.5e-4,
        prefill_s_per_token=3.0e-5,
        attn_s_per_pair=2.5e-8,
        base_weight_bytes=0.0,
        expert_weight_bytes=0.0,
        kv_bw_efficiency=1.0,
        mem_bw_bytes_s=p.timing.kv_bytes_per_token / 4.0e-7,
        request_overhead_s=8.0e-3,
        request_s_per_prompt_token=2.0e-7,
    )
    engine = dataclasses.replace(
        p.engine,
        kv_capacity_tokens=131_072,
        block_size=BLOCK,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=128,
        max_model_len=65_536,
    )
    return dataclasses.replace(p, timing=timing, engine=engine)


TRUE = {
    "cpu_overhead_s": 3.0e-3,
    "seq_overhead_s": 2.5e-4,
    "prefill_s_per_token": 3.0e-5,
    "attn_s_per_pair": 2.5e-8,
    "kv_s_per_token": 4.0e-7,
    "request_overhead_s": 8.0e-3,
    "request_s_per_prompt_token": 2.0e-7,
}


def _prefill(engine: Engine, cached: int, uncached: int, key: str, t: float) -> tuple[float, float]:
    """A lone request through the engine (after its warm-up): (ttft, end time)."""
    if cached:
        engine.submit(EngineRequest(f"{key}-w", cached, 1, t, cache_key=key))
        t = max(e.t_s for e in drain(engine))
    engine.submit(
        EngineRequest(
            f"{key}-m", cached + uncached, 1, t, cache_key=key, shared_prefix_tokens=cached
        )
    )
    first = [e for e in drain(engine) if isinstance(e, FirstToken)]
    return first[0].t_s - t, first[0].t_s


def _decode(
    engine: Engine, batch: int, context: int, tokens: int, t: float
) -> tuple[list[TimedCall], float]:
    calls = {f"d{i}-{t}": TimedCall(t) for i in range(batch)}
    for rid in calls:
        engine.submit(EngineRequest(rid, context, tokens, t))
    end = t
    for ev in drain(engine):
        if isinstance(ev, TokenProgress) and ev.request_id in calls:
            call = calls[ev.request_id]
            call.token_s.extend([ev.t_s] * (ev.generated_tokens - len(call.token_s)))
            end = max(end, ev.t_s)
    return list(calls.values()), end


def test_fit_recovers_the_coefficients_that_priced_the_probes() -> None:
    """Probes run through the simulator's engine on a known preset: the features the
    calibration computes for them are that engine's schedule, so NNLS gets the
    preset's own coefficients back (up to float rounding)."""
    preset = cpu_like_preset()
    engine = make_engine(preset, emit_progress=True, fast_forward=False)
    observations = []
    t = 0.0
    for cached in (0, 1024, 8192):
        for uncached in (64, 700, 2048, 5000):
            ttft, t = _prefill(engine, cached, uncached, f"k{cached}-{uncached}", t + 1.0)
            f = prefill_features(cached, uncached, BUDGET, BLOCK)
            observations.append(Observation("prefill", f"{cached}+{uncached}", f, ttft))
    for batch in (1, 3, 8, 20):
        for context in (64, 3000):
            calls, t = _decode(engine, batch, context, 80, t + 1.0)
            window = decode_window(calls, context, f"b{batch} c{context}")
            assert window is not None
            observations.append(window)
    result = fit(observations)
    for name in COEFFICIENTS:
        assert result.coefficients[name] == pytest.approx(TRUE[name], rel=1e-3), name
    assert max(abs(e) for e in result.relative_errors()) < 1e-3
    assert result.outliers == 0


def test_a_burst_of_other_work_is_left_out_and_still_shown() -> None:
    rng = random.Random(3)
    truth = [2e-3, 1e-4, 3e-5, 0.0, 0.0, 5e-3, 0.0]
    observations = []
    for i in range(40):
        counts = dict(
            steps=rng.randint(1, 100),
            seq_steps=rng.randint(1, 400),
            prefill_tokens=rng.randint(0, 5000),
            requests=rng.randint(0, 2),
        )
        f = features(**counts)
        measured = sum(c * x for c, x in zip(truth, f, strict=True)) * (1 + rng.gauss(0, 0.01))
        if i in (5, 17):
            measured *= 3.0  # another job took the core
        observations.append(Observation("decode", f"p{i}", f, measured))
    result = fit(observations)
    assert result.outliers == 2
    assert result.coefficients["cpu_overhead_s"] == pytest.approx(2e-3, rel=0.05)
    assert result.coefficients["prefill_s_per_token"] == pytest.approx(3e-5, rel=0.05)
    errors = result.relative_errors()
    assert errors[5] < -0.5 and errors[17] < -0.5  # the outliers stay in the residuals


def test_too_few_probes_is_a_clear_error() -> None:
    obs = [Observation("decode", "a", features(steps=10, seq_steps=10), 0.05)]
    with pytest.raises(FitError, match="budget"):
        fit(obs)


def test_prefill_features_chunk_at_the_budget_and_count_pairs_once() -> None:
    f = dict(zip(("steps", "seq_steps", "tokens", "pairs", "ctx", "req", "req_tokens"),
                 prefill_features(1000, 5000, 2048, 128), strict=True))  # fmt: skip
    # The hit is whole blocks: 896 of the 1000 cached tokens.
    assert f["tokens"] == 6000 - 896
    assert f["steps"] == 3  # 5104 tokens in chunks of 2048
    u, c = 6000 - 896, 896
    assert f["pairs"] == u * c + u * (u + 1) // 2  # chunking does not change the pairs
    assert (f["req"], f["req_tokens"]) == (1, 6000)


def test_a_prompt_wholly_cached_still_computes_its_last_block() -> None:
    f = prefill_features(1024, 0, 2048, 128)
    assert f[2] == 128  # vLLM recomputes at least the last token: its whole block
