"""The engine's lazy decode cohort (docs/simulator.md, "Speed") against the step-by-step reference.

Every mixed step the cohort path takes is replayed on a deep copy of the engine
through :func:`~simulator.engine_step.reference_step`; both must leave the same
engine (events, counters, KV cache, energy, every sequence's state) exactly.
The KV-need histogram is checked against a per-sequence sum at every planned run.
"""

from __future__ import annotations

import copy
import random

import pytest

import simulator.engine as engine_module
from simulator.engine import Engine
from simulator.engine_cohort import DecodeCohort
from simulator.engine_state import Run, Seq, Step
from simulator.engine_step import cohort_step, reference_step
from simulator.engine_types import EngineRequest, RequestFinished
from tests.simulator.conftest import drain, make_engine, small_preset


def _state(e: Engine) -> tuple[object, ...]:
    """Everything a step may change, with cohort members written out."""
    kv = e.kv
    return (
        e.now_s,
        e.gpu.energy_j,
        e.counters,
        (kv.free_blocks, kv.cached_blocks, kv.evicted_blocks, kv.cached_contexts()),
        [(s.req.request_id, e.seq_state(s), s.first_token_s, s.preemptions) for s in e.running],
        [(s.req.request_id, s.computed, s.total) for s in e.waiting],
    )


def _load(e: Engine, seed: int, n: int = 60, rate: float = 6.0) -> list[RequestFinished]:
    """Random arrivals (prefix reuse, long prompts chunked, aborts) on ``e``."""
    rng = random.Random(seed)
    t, events = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        events.extend(e.advance_to(t))
        prompt = rng.randint(20, 1500)
        out = rng.randint(1, 300)
        e.submit(EngineRequest(f"r{i}", prompt, out, t, f"a{i % 6}", prompt // 2))
        if i % 11 == 10:
            e.abort(f"r{i - 4}", t)
        if i % 17 == 16:
            e.set_clock(rng.choice((660, 900, 1410)), t)
    events.extend(drain(e))
    return [ev for ev in events if isinstance(ev, RequestFinished)]


@pytest.mark.parametrize(
    ("kv_tokens", "budget", "seed", "rate"),
    [
        (4096, 8192, 1, 6.0),
        (4096, 256, 2, 6.0),
        (16384, 300, 3, 6.0),
        (2048, 64, 4, 6.0),
        (65536, 8192, 5, 6.0),
    ],
)
def test_every_cohort_step_equals_the_reference_step(
    monkeypatch: pytest.MonkeyPatch, kv_tokens: int, budget: int, seed: int, rate: float
) -> None:
    taken = {"cohort": 0, "declined": 0}

    def checked(eng: Engine) -> Step | None:
        twin = copy.deepcopy(eng)
        before = _state(eng)
        step = cohort_step(eng)
        if step is None:
            taken["declined"] += 1
            assert _state(eng) == before  # declining changes nothing
            return None
        taken["cohort"] += 1
        ref = reference_step(twin)
        assert (step.start_s, step.end_s, step.events) == (ref.start_s, ref.end_s, ref.events)
        assert _state(eng) == _state(twin)
        return step

    monkeypatch.setattr(engine_module, "cohort_step", checked)
    e = make_engine(small_preset(kv_tokens=kv_tokens, budget=budget))
    finished = _load(e, seed, rate=rate)
    assert finished and taken["cohort"] > 20
    if budget < 1000:
        assert taken["declined"] > 0  # the budget cut a decode short: reference path


def _hand_built(budget: int, layout: str) -> Engine:
    """An engine whose running sequences are laid out as ``layout``: ``p`` a
    sequence mid-prefill (800 tokens to go), ``d`` a decoding one (a cohort member).
    Through the API a mid-prefill sequence is always the last admitted; the
    cohort path must still be exact for any order."""
    e = make_engine(small_preset(kv_tokens=65536, budget=budget))
    for i, kind in enumerate(layout):
        prompt = 1000 if kind == "p" else 100 + 7 * i
        seq = Seq(EngineRequest(f"{kind}{i}", prompt, 50, 0.0, f"a{i}"))
        seq.hit_tokens, seq.first_token_s = 0, 0.0 if kind == "d" else -1.0
        seq.computed = 200 if kind == "p" else prompt + i
        seq.generated = 0 if kind == "p" else 1 + i
        seq.total = prompt if kind == "p" else seq.computed + 1
        seq.blocks = -(-seq.computed // e.kv.block_size)
        assert e.kv.allocate(seq.blocks)
        seq.order = e.next_order()
        e.running.append(seq)
        if kind == "d":
            e.cohort.join(seq)
    return e


@pytest.mark.parametrize("layout", ["dddp", "pddd", "dpdd", "ddpd", "pdpd", "dd", "p"])
@pytest.mark.parametrize("budget", [2, 3, 4, 5, 100, 803, 804, 8192])
def test_cohort_step_on_any_layout_is_the_reference_or_declines(layout: str, budget: int) -> None:
    e = _hand_built(budget, layout)
    twin = copy.deepcopy(e)
    before = _state(e)
    step = cohort_step(e)
    ref = reference_step(twin)
    decodes = [s for s in twin.running if s.req.request_id.startswith("d")]
    starved = any(twin.seq_state(s)[1] == int(s.req.request_id[1:]) + 1 for s in decodes)
    if step is None:
        assert _state(e) == before
        assert starved  # it declines only when the budget cuts a decode short
    else:
        assert not starved
        assert (step.start_s, step.end_s, step.events) == (ref.start_s, ref.end_s, ref.events)
        assert _state(e) == _state(twin)


def test_cohort_engine_gives_the_same_results_as_the_reference_only_engine() -> None:
    """Whole runs: cohort + closed-form runs vs the per-step reference (no cohort,
    no runs) agree on every finish (time within float rounding of the run sums)."""
    for kv_tokens, budget in ((4096, 8192), (2048, 128)):
        fast = _load(make_engine(small_preset(kv_tokens=kv_tokens, budget=budget)), 9)
        slow = _load(
            make_engine(small_preset(kv_tokens=kv_tokens, budget=budget), fast_forward=False), 9
        )
        assert [f.request_id for f in fast] == [f.request_id for f in slow]
        for a, b in zip(fast, slow, strict=True):
            assert (a.output_tokens, a.cached_tokens, a.preemptions) == (
                b.output_tokens,
                b.cached_tokens,
                b.preemptions,
            )
            assert a.t_s == pytest.approx(b.t_s, rel=1e-9, abs=1e-9)


def test_runs_need_the_blocks_a_per_sequence_sum_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The residue histogram's block count equals Σ ⌈(c+k)/bs⌉ − ⌈c/bs⌉ for every k."""
    checked = [0]
    plan_run = Engine._plan_run

    def spy(eng: Engine) -> Run | None:
        run = plan_run(eng)
        if run is not None:
            bs = eng.kv.block_size
            comps = [eng.seq_state(s)[0] for s in eng.running]
            for k in (1, 2, bs - 1, bs, bs + 1, 3 * bs + 5, run.steps):
                want = sum(-(-(c + k) // bs) - -(-c // bs) for c in comps)
                assert eng.cohort.need(k) == want
            checked[0] += 1
        return run

    monkeypatch.setattr(Engine, "_plan_run", spy)
    _load(make_engine(small_preset(kv_tokens=8192)), 6)
    assert checked[0] > 20


def test_steps_fitting_is_the_largest_k_that_fits() -> None:
    cohort = DecodeCohort(16)
    for i, computed in enumerate((1, 15, 16, 17, 31, 40, 64)):
        seq = Seq(EngineRequest(f"r{i}", computed, 1000, 0.0))
        seq.computed, seq.generated, seq.total = computed, 1, computed + 1
        seq.order = i
        cohort.join(seq)
    cohort.advance(3)
    for available in (0, 1, 3, 7, 8, 20, 100):
        k = cohort.steps_fitting(available, 200)
        assert cohort.need(k) <= available
        assert k == 200 or cohort.need(k + 1) > available
