"""Invariants of the vLLM V1 engine model: conservation, scheduling order,
preemption, prefix reuse, closed-form fast-forward, reproducibility."""

from __future__ import annotations

import dataclasses
import itertools
import random

from simulator.engine import Engine
from simulator.engine_state import Run
from simulator.engine_types import (
    EngineRequest,
    FirstToken,
    Preempted,
    RequestFinished,
    RequestRejected,
    TokenProgress,
)
from tests.simulator.conftest import drain, make_engine, small_preset


def _blocks_conserved(e: Engine) -> None:
    states = [e.seq_state(s) for s in e.running]
    owned = sum(blocks for *_, blocks in states)
    assert e.kv.free_blocks >= 0 and e.kv.cached_blocks >= 0
    assert e.kv.free_blocks + e.kv.cached_blocks + owned == e.kv.total_blocks
    assert e.kv.cached_blocks == sum(e.kv.cached_contexts().values())
    for computed, _, _, blocks in states:
        assert blocks == -(-computed // e.kv.block_size)


def test_block_and_token_conservation_under_random_load() -> None:
    rng = random.Random(7)
    e = make_engine(small_preset(kv_tokens=8192))
    outputs = {}
    t = 0.0
    for i in range(60):
        t += rng.expovariate(5.0)
        prompt, out = rng.randint(50, 2500), rng.randint(1, 200)
        outputs[f"r{i}"] = out
        e.advance_to(t)
        _blocks_conserved(e)
        e.submit(EngineRequest(f"r{i}", prompt, out, t, cache_key=f"a{i % 7}"))
    finished = [ev for ev in drain(e) if isinstance(ev, RequestFinished)]
    _blocks_conserved(e)
    assert {f.request_id for f in finished} | set() <= set(outputs)
    done = {f.request_id: f for f in finished}
    assert sum(f.output_tokens for f in done.values()) == sum(outputs[r] for r in done)
    assert e.counters.generation_tokens >= sum(outputs[r] for r in done)
    assert e.kv.free_blocks + e.kv.cached_blocks == e.kv.total_blocks  # idle: nothing owned


def test_no_starvation_every_request_finishes_under_memory_pressure() -> None:
    e = make_engine(small_preset(kv_tokens=4096))
    for i in range(20):
        e.submit(EngineRequest(f"r{i}", 900, 300, 0.0, cache_key=f"a{i}"))
    events = drain(e)
    finished = {ev.request_id for ev in events if isinstance(ev, RequestFinished)}
    assert finished == {f"r{i}" for i in range(20)}
    assert e.counters.preemptions > 0  # the pressure was real
    assert not e.running and not e.waiting


def test_preemption_takes_most_recently_admitted_first() -> None:
    # Four requests fill the cache while decoding; the last admitted is preempted.
    e = make_engine(small_preset(kv_tokens=1024))
    for i in range(4):
        e.submit(EngineRequest(f"r{i}", 240, 200, 0.0, cache_key=f"a{i}"))
    events = drain(e)
    preempted = [ev.request_id for ev in events if isinstance(ev, Preempted)]
    assert preempted, "expected preemption"
    assert preempted[0] == "r3"
    finishes = [ev.request_id for ev in events if isinstance(ev, RequestFinished)]
    assert finishes.index("r0") < finishes.index("r3")


def _late_long_prompt(full_isl: bool) -> list[object]:
    """A 1500-token prompt arrives while a 3000-token request decodes on a 4096-token
    cache: its first 256-token chunk fits, the whole prompt does not."""
    e = make_engine(small_preset(kv_tokens=4096, budget=256, full_isl=full_isl))
    e.submit(EngineRequest("r0", 3000, 400, 0.0, cache_key="a0"))
    events: list[object] = []
    while not any(isinstance(ev, FirstToken) for ev in events):
        t = e.next_event_time()
        assert t is not None
        events += e.advance_to(t)
    e.submit(EngineRequest("r1", 1500, 10, e.now_s, cache_key="a1"))
    return events + drain(e)


def test_a_waiting_prompt_is_admitted_only_when_all_of_it_fits() -> None:
    # vLLM's --scheduler-reserve-full-isl (its default): r1 waits, nobody is preempted.
    events = _late_long_prompt(full_isl=True)
    assert not [ev for ev in events if isinstance(ev, Preempted)]
    done = {ev.request_id: ev for ev in events if isinstance(ev, RequestFinished)}
    first = {ev.request_id: ev.t_s for ev in events if isinstance(ev, FirstToken)}
    assert first["r1"] >= done["r0"].t_s  # admitted once r0 left room for all of it
    # Admitting on the first chunk (V1 before the gate): r1 takes the free blocks,
    # a later chunk finds none, and the newest running request is preempted.
    events = _late_long_prompt(full_isl=False)
    assert [ev for ev in events if isinstance(ev, Preempted)]
    assert {ev.request_id for ev in events if isinstance(ev, RequestFinished)} == {"r0", "r1"}


def test_prefix_reuse_when_resident_and_recompute_when_evicted() -> None:
    e = make_engine(small_preset(kv_tokens=16384))
    e.submit(EngineRequest("t1", 3000, 100, 0.0, cache_key="agent"))
    drain(e)
    e.submit(EngineRequest("t2", 3600, 50, 100.0, cache_key="agent", shared_prefix_tokens=3100))
    (fin,) = [ev for ev in drain(e) if isinstance(ev, RequestFinished)]
    assert fin.cached_tokens == 3099 // 16 * 16  # full blocks of the resident context
    assert e.counters.recomputed_tokens == 0
    # Another agent fills the cache: the idle context is evicted (LRU), then recomputed.
    e.submit(EngineRequest("big", 16000, 10, 200.0, cache_key="other"))
    drain(e)
    assert e.counters.evicted_tokens > 0
    e.submit(EngineRequest("t3", 4000, 10, 300.0, cache_key="agent", shared_prefix_tokens=3649))
    (fin3,) = [ev for ev in drain(e) if isinstance(ev, RequestFinished)]
    assert fin3.cached_tokens < 3600
    assert e.counters.recomputed_tokens >= 3600 - fin3.cached_tokens - 16


def test_eviction_keeps_prefix_and_takes_lru_context_first() -> None:
    e = make_engine(small_preset(kv_tokens=4096))
    e.submit(EngineRequest("old", 1600, 1, 0.0, cache_key="old"))
    drain(e)
    e.submit(EngineRequest("new", 1600, 1, 10.0, cache_key="new"))
    drain(e)
    e.submit(EngineRequest("x", 1600, 1, 20.0, cache_key="x"))
    drain(e)
    cached = e.kv.cached_contexts()
    assert cached["new"] == 100 and cached["x"] == 100
    assert 0 < cached.get("old", 0) < 100  # partly evicted from its tail


def test_fast_forward_equals_stepwise_and_external_cuts_do_not_change_results() -> None:
    def run(cut_every: float | None) -> list[tuple[str, float]]:
        e = make_engine(small_preset(kv_tokens=65536))
        for i in range(5):
            e.submit(EngineRequest(f"r{i}", 500 + 300 * i, 400 + 50 * i, 0.0, cache_key=f"a{i}"))
        out: list[tuple[str, float]] = []
        if cut_every is None:
            evs = drain(e)
        else:
            evs = []
            t = 0.0
            while e.next_event_time() is not None:
                t += cut_every
                evs.extend(e.advance_to(t))
        out = [(ev.request_id, ev.t_s) for ev in evs if isinstance(ev, RequestFinished)]
        return sorted(out)

    a, b = run(None), run(0.0137)
    assert [r for r, _ in a] == [r for r, _ in b]
    for (_, ta), (_, tb) in zip(a, b, strict=True):
        assert abs(ta - tb) < 1e-9


def test_progress_events_stream_every_token_count() -> None:
    e = make_engine(small_preset(kv_tokens=8192), emit_progress=True)
    e.submit(EngineRequest("r", 100, 50, 0.0))
    events = drain(e)
    first = [ev for ev in events if isinstance(ev, FirstToken)]
    prog = [ev for ev in events if isinstance(ev, TokenProgress)]
    assert len(first) == 1 and prog[-1].generated_tokens == 50
    assert all(a.t_s <= b.t_s for a, b in itertools.pairwise(prog))


def test_reject_request_longer_than_cache() -> None:
    e = make_engine(small_preset(kv_tokens=1024))
    e.submit(EngineRequest("huge", 2000, 10, 0.0))
    assert isinstance(e.poll_events()[0], RequestRejected)
    assert e.next_event_time() is None


def test_a_reply_past_the_model_length_is_cut_there_not_refused() -> None:
    # vLLM clamps max_tokens to max_model_len − prompt (tests/realvllm checks it):
    # a prompt that fits runs and stops at the length; one that fills it is refused.
    params = dataclasses.replace(small_preset(kv_tokens=8192).engine, max_model_len=2048)
    e = make_engine(dataclasses.replace(small_preset(kv_tokens=8192), engine=params))
    e.submit(EngineRequest("long", 2000, 300, 0.0))
    e.submit(EngineRequest("full", 2048, 1, 0.0))
    events = drain(e)
    done = [ev for ev in events if isinstance(ev, RequestFinished)]
    refused = [ev for ev in events if isinstance(ev, RequestRejected)]
    assert [(d.request_id, d.prompt_tokens, d.output_tokens) for d in done] == [("long", 2000, 48)]
    assert [r.request_id for r in refused] == ["full"]
    assert (e.counters.truncated_requests, e.counters.rejected_requests) == (1, 1)


def test_abort_releases_blocks() -> None:
    e = make_engine(small_preset(kv_tokens=8192))
    e.submit(EngineRequest("r", 1000, 500, 0.0, cache_key="a"))
    e.advance_to(0.5)
    assert e.abort("r", 0.5)
    drain(e)
    assert not e.running and e.kv.free_blocks + e.kv.cached_blocks == e.kv.total_blocks
    assert not [ev for ev in e.poll_events() if isinstance(ev, RequestFinished)]


def test_energy_is_integrated_over_idle_and_busy_time() -> None:
    e = make_engine()
    e.advance_to(10.0)
    assert abs(e.gpu.energy_j - 10.0 * e.power.params.idle_w) < 1e-9
    e.submit(EngineRequest("r", 2000, 100, 10.0))
    drain(e)
    busy_end = e.now_s
    e.advance_to(busy_end + 5.0)
    idle = e.power.params.idle_w
    busy_energy = e.gpu.energy_j - 15.0 * idle + idle * (busy_end - 10.0)
    assert busy_energy / (busy_end - 10.0) > idle + 100.0
    assert abs(e.energy_j_at(busy_end + 5.0) - e.gpu.energy_j) < 1e-9


def test_reproducible() -> None:
    def once() -> list[tuple[str, float]]:
        rng = random.Random(3)
        e = make_engine(small_preset(kv_tokens=4096))
        for i in range(30):
            e.submit(EngineRequest(f"r{i}", rng.randint(10, 900), rng.randint(1, 90), i * 0.05))
        return [(ev.request_id, ev.t_s) for ev in drain(e) if isinstance(ev, RequestFinished)]

    assert once() == once()


def _mixed_load(fast_forward: bool, cut_s: float | None) -> tuple[list[tuple[str, float]], float]:
    """Random arrivals on a small cache (preemptions, prefix reuse, aborts), driven
    either event to event or by ``advance_to`` every ``cut_s`` seconds; returns the
    finishes and the energy counter at the end."""
    rng = random.Random(11)
    e = make_engine(small_preset(kv_tokens=4096), fast_forward=fast_forward)
    e.set_clock(900, 0.0)
    t, events = 0.0, []
    for i in range(40):
        t += rng.expovariate(8.0)
        if cut_s is None:
            events.extend(e.advance_to(t))
        else:
            while e.now_s < t and e.next_event_time() is not None:
                events.extend(e.advance_to(min(e.now_s + cut_s, t)))
            events.extend(e.advance_to(t))
        prompt = rng.randint(50, 1200)
        e.submit(EngineRequest(f"r{i}", prompt, rng.randint(2, 400), t, f"a{i % 5}", prompt // 2))
        if i % 9 == 8:
            e.abort(f"r{i - 3}", t)
    events.extend(drain(e))
    assert e.counters.preemptions > 0  # the pressure was real
    finished = sorted((ev.request_id, ev.t_s) for ev in events if isinstance(ev, RequestFinished))
    return finished, e.energy_j_at(e.now_s)


def test_fast_forward_gives_the_stepwise_events_and_energy_under_pressure_and_aborts() -> None:
    stepwise, e_step = _mixed_load(False, None)
    assert len(stepwise) > 20
    for fast, e_fast in (_mixed_load(True, None), _mixed_load(True, 0.0137)):
        assert [r for r, _ in fast] == [r for r, _ in stepwise]
        for (_, a), (_, b) in zip(fast, stepwise, strict=True):
            assert abs(a - b) < 1e-6
        assert abs(e_fast - e_step) <= 1e-6 * e_step  # 900 MHz: below the TDP cap


def test_runs_planned_from_a_committed_run_match_a_fresh_scan() -> None:
    """The next run after a committed one reuses its context sum and shortest
    remainder; it must be the run a full pass over the sequences would plan."""
    e = make_engine(small_preset(kv_tokens=65536))
    for i in range(6):
        e.submit(EngineRequest(f"r{i}", 300 + 50 * i, 40 + 30 * i, 0.0, cache_key=f"a{i}"))
    plans = 0
    while e.next_event_time() is not None:
        plan = e._plan
        if isinstance(plan, Run):
            states = [e.seq_state(s) for s in e.running]
            assert plan.seqs == len(e.running)
            assert plan.context0 == sum(computed for computed, *_ in states)
            assert plan.steps <= min(s.out - st[1] for s, st in zip(e.running, states, strict=True))
            plans += 1
        e.advance_to(e.next_event_time() or 0.0)
    assert plans >= 5
