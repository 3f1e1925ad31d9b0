"""The step model's host terms (TimingParams.seq_overhead_s, request_overhead_s,
request_s_per_prompt_token): what kairos calibrate fits on a CPU engine. Zero in
every named preset, so those presets' results do not move."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.engine_types import EngineRequest, FirstToken, RequestFinished
from simulator.presets import PRESET_NAMES, get_preset
from simulator.timing import TimingModel
from tests.simulator.conftest import drain, make_engine, small_preset

SEQ_S, REQ_S, PER_TOKEN_S = 2e-4, 5e-3, 1e-6


def _host_preset(seq: float = SEQ_S, req: float = REQ_S, per_token: float = PER_TOKEN_S):  # type: ignore[no-untyped-def]
    p = small_preset(kv_tokens=65_536)
    timing = dataclasses.replace(
        p.timing, seq_overhead_s=seq, request_overhead_s=req, request_s_per_prompt_token=per_token
    )
    return dataclasses.replace(p, timing=timing)


def test_every_named_preset_has_no_host_terms() -> None:
    for name in PRESET_NAMES:
        t = get_preset(name).timing
        assert (t.seq_overhead_s, t.request_overhead_s, t.request_s_per_prompt_token) == (0, 0, 0)


def test_a_step_pays_per_sequence_and_a_run_pays_it_every_step() -> None:
    base = TimingModel(small_preset().timing)
    host = TimingModel(_host_preset().timing)
    kw = dict(decode_seqs=6, decode_context_tokens=6000, prefill_tokens=500, attn_pairs=10**5)
    plain = base.step(1785, **kw)
    more = host.step(1785, prefill_seqs=2, **kw)
    assert more.time_s - plain.time_s == pytest.approx(8 * SEQ_S)
    assert more.cpu_s - plain.cpu_s == pytest.approx(8 * SEQ_S)
    run = host.decode_run(1785, 4, 4000, 50)
    steps = sum(
        host.step(
            1785, decode_seqs=4, decode_context_tokens=4000 + 4 * k, prefill_tokens=0, attn_pairs=0
        ).time_s
        for k in range(50)
    )
    assert run.time_s == pytest.approx(steps, rel=1e-12)
    const, _, _ = host.decode_coeffs(1785, 4, 4000)
    const0, _, _ = base.decode_coeffs(1785, 4, 4000)
    assert const - const0 == pytest.approx(4 * SEQ_S)


def test_admitting_a_request_costs_its_host_time_once() -> None:
    """A lone request's first token comes request_overhead_s + its prompt tokens ×
    request_s_per_prompt_token later than without them."""
    lone = []
    for preset in (small_preset(kv_tokens=65_536), _host_preset(seq=0.0)):
        engine = make_engine(preset)
        engine.submit(EngineRequest("r", 3000, 1, 0.0))
        (first,) = [e for e in drain(engine) if isinstance(e, FirstToken)]
        lone.append(first.t_s)
    assert lone[1] - lone[0] == pytest.approx(REQ_S + 3000 * PER_TOKEN_S)


def test_the_fast_path_and_the_reference_agree_with_host_terms() -> None:
    """The cohort fast path prices host terms as the step-by-step reference does."""
    ends = []
    for fast in (True, False):
        engine = make_engine(_host_preset(), fast_forward=fast)
        for i in range(12):
            engine.submit(EngineRequest(f"r{i}", 500 + 97 * i, 40 + 7 * i, 0.05 * i, f"k{i}"))
        ends.append(
            sorted((e.request_id, e.t_s) for e in drain(engine) if isinstance(e, RequestFinished))
        )
    for (rid_a, t_a), (rid_b, t_b) in zip(ends[0], ends[1], strict=True):
        assert rid_a == rid_b
        assert t_a == pytest.approx(t_b, rel=1e-9)
