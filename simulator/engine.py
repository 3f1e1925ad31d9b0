"""Event-driven model of one vLLM V1 engine on one simulated GPU.

What it models (docs/simulator.md, "Engine model"): continuous batching with a per-step
token budget and a cap on running sequences; chunked prefill; prefix caching in
which a finished request's context stays resident as evictable blocks and is
reused by the next request with the same ``cache_key``; block-granular KV
capacity; and, when a step cannot allocate, preemption of the most recently
admitted running request, which is recomputed later (V1 has no swap). Nothing
about thrashing is scripted: it emerges when running contexts outgrow the cache.

The scheduler mirrors V1's: running requests first, in admission order (decodes
need one token, partial prefills the rest of their prompt up to the budget);
on allocation failure pop the *last* running request; waiting requests are
admitted FCFS only in steps without preemption, head-of-line blocking (the
step itself: :mod:`simulator.engine_step`).

Driving it (also how the fake vLLM server drives it in scaled real time)::

    engine.submit(EngineRequest(...))   # arrival_s ≥ the engine's last submit
    t = engine.next_event_time()        # end of the step/run in progress, or None
    events = engine.advance_to(t)       # runs steps that *start* before t

Steps whose start precedes ``t`` are executed whole, so returned events may be
stamped slightly after ``t``. A run of pure-decode steps is fast-forwarded in
closed form and split exactly when something external happens (a submission,
a clock change) — the hot loop has no per-token Python work. Nor, with
``fast_forward`` on, per-sequence work for decodes: the decoding sequences are a
:class:`~simulator.engine_cohort.DecodeCohort` advanced by one counter, so a run
or the decode part of a mixed step costs the same for 2 or 200 sequences
(``fast_forward=False`` is the sequence-by-sequence reference the tests compare
against).
"""

from __future__ import annotations

import dataclasses
from collections import deque

from simulator.energy_truth import EnergyTruth
from simulator.engine_cohort import DecodeCohort
from simulator.engine_state import Run as _Run
from simulator.engine_state import Seq as _Seq
from simulator.engine_state import Step as _Step
from simulator.engine_step import cohort_step, reference_step
from simulator.engine_types import (
    EngineCounters,
    EngineEvent,
    EngineRequest,
    RequestFinished,
    RequestRejected,
    TokenProgress,
)
from simulator.errors import EngineError
from simulator.gpu import SimulatedGpu
from simulator.kv_offload import CpuKvTier
from simulator.kvcache import KvCache
from simulator.power import PowerModel
from simulator.presets import EngineParams
from simulator.timing import StepCost, TimingModel

_MAX_RUN_STEPS = 1_000_000


class Engine:
    """One vLLM V1 instance: scheduler + KV cache + timing + power on a GPU."""

    def __init__(
        self,
        params: EngineParams,
        timing: TimingModel,
        power: PowerModel,
        gpu: SimulatedGpu,
        *,
        start_s: float = 0.0,
        emit_progress: bool = False,
        fast_forward: bool = True,
    ) -> None:
        self.params = params
        self.timing = timing
        self.power = power
        self.gpu = gpu
        tier = (
            CpuKvTier(params.kv_offload_tokens, params.block_size)
            if params.kv_offload_tokens > 0
            else None
        )
        self.kv = KvCache(params.kv_capacity_tokens, params.block_size, tier)
        self.load_tokens = 0
        """Tokens loaded from the CPU tier by the step being scheduled (its stall)."""
        t = timing.params
        self.admit_cost = bool(t.request_overhead_s or t.request_s_per_prompt_token)
        """Admitting a request costs host time (``TimingParams.request_overhead_s``)."""
        self.admit_s = 0.0
        """Host time of the requests the step being scheduled admits (its stall)."""
        self.counters = EngineCounters()
        self.emit_progress = emit_progress
        self.fast_forward = fast_forward
        self.now_s = start_s
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._plan: _Step | _Run | None = None
        self._outbox: list[EngineEvent] = []
        self._last_power_w = power.idle_w(gpu.clock_at(start_s))
        self._bs = params.block_size
        self._known_s = start_s
        self.aborted_running = False
        """Some running sequence is aborted (it leaves at the end of the next step)."""
        self.lazy = fast_forward
        """Decoding sequences live in ``cohort`` (off: the step-by-step reference)."""
        self.cohort = DecodeCohort(params.block_size)
        self._orders = 0
        self.truth: EnergyTruth | None = None
        """Ground truth of per-agent energy (docs/energy.md); None: not computed."""

    # ------------------------------------------------------------------ API
    @property
    def capacity_tokens(self) -> int:
        return self.kv.total_blocks * self._bs

    def kv_usage_fraction(self) -> float:
        """V1's ``kv_cache_usage_perc``: blocks neither free nor evictable."""
        total = self.kv.total_blocks
        return (total - self.kv.available_blocks) / total if total else 0.0

    def submit(self, req: EngineRequest) -> str:
        """Queue ``req`` (arrived at ``req.arrival_s``); returns its id as handle."""
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise EngineError(f"request {req.request_id}: needs ≥1 prompt and output token")
        self._cut(req.arrival_s)
        limit = min(self.params.max_model_len, self.capacity_tokens)
        if req.prompt_tokens >= limit:
            self.counters.rejected_requests += 1
            reason = f"{req.prompt_tokens} prompt tokens leave no output token within {limit}"
            self._outbox.append(RequestRejected(req.request_id, req.arrival_s, reason))
            return req.request_id
        if req.prompt_tokens + req.output_tokens > limit:
            # vLLM cuts the reply at the model's length (``max_tokens`` is clamped to
            # ``max_model_len − prompt``, finish reason "length"); it refuses only a
            # prompt that leaves no room for one output token.
            req = dataclasses.replace(req, output_tokens=limit - req.prompt_tokens)
            self.counters.truncated_requests += 1
        self.waiting.append(_Seq(req))
        return req.request_id

    def awaiting_first_token(self) -> set[str]:
        """Cache keys (agents) of requests that have produced no output yet: what a
        router sees as "sent, no first byte" (the clock's prefill signal)."""
        keys = {seq.req.cache_key for seq in self.waiting}
        keys.update(s.req.cache_key for s in self.running if s.first_token_s < 0)
        return keys

    def abort(self, request_id: str, t_s: float) -> bool:
        """Drop a request (client went away); its blocks are released. Returns
        whether it was found."""
        self._cut(t_s)
        for seq in self.waiting:
            if seq.req.request_id == request_id:
                self.waiting.remove(seq)
                return True
        for seq in self.running:
            if seq.req.request_id == request_id:
                seq.aborted = True
                self.aborted_running = True
                if not isinstance(self._plan, _Step):
                    self._drop_aborted()
                return True
        return False

    def set_clock(self, clock_mhz: int, t_s: float) -> None:
        """Lock the GPU at ``clock_mhz`` from ``t_s`` (effective after its latency)."""
        self._cut(t_s)
        self.gpu.set_locked_clocks(clock_mhz, clock_mhz, t_s)

    def next_event_time(self) -> float | None:
        """When the engine next needs ``advance_to``: the end of the step or decode
        run in progress, the time it can plan its next step, or None when idle."""
        if self._plan is None:
            if not self.running and not self.waiting:
                return None
            if self.now_s > self._known_s:
                return self.now_s
            self._make_plan()
        return None if self._plan is None else self._plan.end_s

    def advance_to(self, t_s: float) -> list[EngineEvent]:
        """Execute every step that starts before ``t_s``; idle time up to ``t_s``
        is spent at idle power. Returns the events produced, in time order."""
        self._run_until(t_s)
        return self.poll_events()

    def poll_events(self) -> list[EngineEvent]:
        """Events produced so far and not yet returned."""
        out, self._outbox = self._outbox, []
        return out

    def energy_j_at(self, t_s: float) -> float:
        """GPU energy counter interpolated to ``t_s`` (exact within a committed step)."""
        energy = self.gpu.energy_j
        if t_s < self.now_s:
            energy -= self._last_power_w * (self.now_s - t_s)
        elif self._plan is None and not self.running and not self.waiting:
            energy += self.power.idle_w(self.gpu.clock_at(self.now_s)) * (t_s - self.now_s)
        return energy

    # ------------------------------------------------------------- planning
    def _run_until(self, t_s: float) -> None:
        """Execute steps starting before ``t_s``. A step is planned only once the
        caller's time has reached its start, so it sees every earlier arrival."""
        if t_s > self._known_s:
            self._known_s = t_s
        while True:
            if self._plan is None:
                if not self.running and not self.waiting:
                    self._idle_until(t_s)
                    return
                if self.now_s > self._known_s:
                    return
                self._make_plan()
                if self._plan is None:
                    return
            if self._plan.start_s >= t_s:
                return
            self._commit(t_s)

    def _cut(self, t_s: float) -> None:
        """Something external happens at ``t_s``: steps starting before it run,
        a decode run planned past it is dropped and re-planned later."""
        self._run_until(t_s)
        if isinstance(self._plan, _Run):
            self._plan = None

    def _idle_until(self, t_s: float) -> None:
        if t_s > self.now_s and not self.running and not self.waiting:
            p_idle = self.power.idle_w(self.gpu.clock_at(self.now_s))
            self.gpu.add_energy(p_idle * (t_s - self.now_s), p_idle)
            self._last_power_w = p_idle
            self.now_s = t_s

    def _make_plan(self) -> None:
        if not self.running and not self.waiting:
            return
        run = self._plan_run()
        if run is not None:
            self._plan = run
        elif self.lazy and not (
            self.aborted_running or self.emit_progress or self.truth is not None
        ):
            self._plan = cohort_step(self) or reference_step(self)
        else:
            self._plan = reference_step(self)

    def _waiting_blocked(self) -> bool:
        """True if FCFS admission cannot take the waiting head now (and will not
        until a running request finishes: free space only shrinks meanwhile)."""
        if not self.waiting:
            return True
        if len(self.running) >= self.params.max_num_seqs:
            return True
        head = self.waiting[0]
        hit, load = self.prefix_blocks(head)
        budget = self.params.max_num_batched_tokens - len(self.running)
        _, _, gate = self.admission_blocks(head, hit, load, budget)
        return gate > self.kv.available_blocks - hit

    def admission_blocks(self, seq: _Seq, hit: int, load: int, budget: int) -> tuple[int, int, int]:
        """``(chunk, step, gate)`` for a waiting ``seq`` admitted into a step with
        ``budget`` tokens left: the tokens its first step computes, the blocks that
        step allocates, and those that must be free (beyond the ``hit`` cached blocks
        it reuses) to admit it at all.

        vLLM's default (``--scheduler-reserve-full-isl``, on in the V1 releases
        this project builds against) admits a waiting or preempted request only if
        its *whole* sequence fits; otherwise it stays queued and nothing is
        preempted. Older V1 checked the first chunk only: a long prompt was admitted
        into a nearly full cache, and a later chunk that found no block preempted
        the newest running request (``EngineParams.reserve_full_isl = False``)."""
        bs = self._bs
        base = (hit + load) * bs if seq.computed == 0 else seq.computed
        owned = hit if seq.computed == 0 else seq.blocks
        chunk = min(seq.total - base, budget)
        step = -(-(base + chunk) // bs) - owned
        gate = -(-seq.total // bs) - owned if self.params.reserve_full_isl else step
        return chunk, step, gate

    def prefix_blocks(self, seq: _Seq) -> tuple[int, int]:
        """``(hit, load)``: blocks of a waiting ``seq``'s prefix it would reuse if
        admitted now, from the GPU's cache and, beyond those, from the CPU tier
        (loaded rather than computed; 0 without a tier)."""
        key = seq.req.cache_key
        if seq.computed > 0 or not key:
            return 0, 0
        limit = max(seq.prefix_limit, 0) // self._bs
        hit = min(self.kv.cached_of(key), limit)
        tier = self.kv.tier
        if tier is None:
            return hit, 0
        return hit, max(0, min(tier.blocks_of(key), limit) - hit)

    def with_load(self, cost: StepCost) -> StepCost:
        """The step's cost with the CPU-tier loads it admitted, as a stall, and the
        host time of the requests it admitted (``TimingParams.request_overhead_s``)."""
        if self.admit_s:
            host = self.admit_s
            self.admit_s = 0.0
            cost = cost._replace(cpu_s=cost.cpu_s + host, time_s=cost.time_s + host)
        if not self.load_tokens:
            return cost
        extra = self.timing.load_s(self.load_tokens)
        self.load_tokens = 0
        return cost._replace(mem_s=cost.mem_s + extra, time_s=cost.time_s + extra)

    def next_order(self) -> int:
        """Stamp for a sequence entering ``running`` (running order is ascending)."""
        self._orders += 1
        return self._orders

    def _plan_run(self) -> _Run | None:
        """A run of decode steps over every running sequence, when all of them
        decode (they are the cohort) and no waiting request can be admitted."""
        running = self.running
        cohort = self.cohort
        if (
            not self.lazy
            or not running
            or cohort.size != len(running)
            or self.aborted_running
            or (self.waiting and not self._waiting_blocked())
        ):
            return None
        steps = min(cohort.steps_left(), _MAX_RUN_STEPS)
        if steps < 2:
            return None
        context = cohort.context()
        now = self.now_s
        clock = self.gpu.clock_at(now)
        change = self.gpu.next_change_s()
        if change is not None and change > now:
            steps = min(
                steps,
                self.timing.decode_steps_before(clock, len(running), context, change - now),
            )
        steps = cohort.steps_fitting(self.kv.available_blocks, steps)
        if steps < 2:
            return None
        cost = self.timing.decode_run(clock, len(running), context, steps)
        return _Run(now, len(running), steps, clock, context, cost)

    def seq_state(self, seq: _Seq) -> tuple[int, int, int, int]:
        """``(computed, generated, total, blocks)`` of ``seq`` now, whether or not
        the cohort holds it (for tests and inspection; changes nothing)."""
        if not seq.lazy:
            return seq.computed, seq.generated, seq.total, seq.blocks
        tick = self.cohort.tick
        computed = seq.cbase + tick
        return computed, seq.gbase + tick, computed + 1, -(-computed // self._bs)

    # ---------------------------------------------------------------- commit
    def _commit(self, t_s: float) -> None:
        plan = self._plan
        if isinstance(plan, _Step):
            self._outbox.extend(plan.events)
            self._plan = None
            return
        if plan is None:
            return
        k = plan.steps
        if plan.end_s > t_s:
            k = min(
                k,
                self.timing.decode_steps_before(
                    plan.clock_mhz, plan.seqs, plan.context0, t_s - plan.start_s
                ),
            )
        self._commit_run(plan, k)
        self._plan = None

    def _commit_run(self, run: _Run, k: int) -> None:
        """``k`` steps of ``run`` happen: the cohort's tick moves, nobody is visited."""
        if k <= 0:
            return
        cohort = self.cohort
        n = run.seqs
        cost = (
            run.cost
            if k == run.steps
            else self.timing.decode_run(run.clock_mhz, n, run.context0, k)
        )
        energy_j = self.account(run.clock_mhz, cost, k)
        if self.truth is not None:
            tick = cohort.tick
            keys = [(s.req.cache_key or s.req.request_id, s.cbase + tick) for s in self.running]
            above_idle_j = self.above_idle_j(run.clock_mhz, cost, energy_j)
            self.truth.run(run.clock_mhz, cost, above_idle_j, keys, k)
        now = self.now_s = run.start_s + cost.time_s
        if not self.kv.allocate(cohort.need(k)):
            raise EngineError("decode run outgrew the KV cache (planning bug)")
        done = cohort.advance(k)
        self.counters.generation_tokens += n * k
        events: list[EngineEvent] = []
        if self.emit_progress:
            tick = cohort.tick
            rows = [(s.req.request_id, s.gbase + tick) for s in self.running]
            events.extend(TokenProgress(rid, now, generated) for rid, generated in rows)
        if done:
            self.retire(done, now, events)
        self._outbox.extend(events)

    def account(self, clock_mhz: int, cost: StepCost, steps: int) -> float:
        """Add a step's (or a run's) energy; returns it."""
        energy = self.power.energy_j(clock_mhz, cost)
        t = cost.time_s
        if t > 0:
            self._last_power_w = energy / t
        self.gpu.add_energy(energy, self._last_power_w)
        counters = self.counters
        counters.steps += steps
        counters.busy_s += t
        return energy

    def above_idle_j(self, clock_mhz: int, cost: StepCost, energy_j: float) -> float:
        """The part of a step's ``energy_j`` above the idle draw (what
        :class:`~simulator.energy_truth.EnergyTruth` splits among its sequences)."""
        return energy_j - self.power.idle_w(clock_mhz) * cost.time_s

    def retire_all(self, t_s: float, events: list[EngineEvent]) -> None:
        """Finished (or aborted) sequences leave; their context stays cached."""
        self.aborted_running = False
        done = [s for s in self.running if s.aborted or (not s.lazy and s.generated >= s.out)]
        if done:
            self.retire(done, t_s, events)

    def retire(self, done: list[_Seq], t_s: float, events: list[EngineEvent]) -> None:
        """``done`` (running, in running order) leave; their context stays cached."""
        cohort = self.cohort
        for seq in done:
            if seq.lazy:
                cohort.leave(seq)
        if len(done) == 1:
            self.running.remove(done[0])
        else:
            gone = set(done)
            self.running = [s for s in self.running if s not in gone]
        bs = self._bs
        for seq in done:
            self.kv.release(seq.req.cache_key, seq.blocks, seq.computed // bs)
            seq.blocks = 0
            if seq.aborted:
                continue
            self.counters.finished_requests += 1
            r = seq.req
            events.append(
                RequestFinished(
                    r.request_id,
                    t_s,
                    r.arrival_s,
                    seq.first_token_s,
                    r.prompt_tokens,
                    seq.generated,
                    max(seq.hit_tokens, 0),
                    seq.preemptions,
                )
            )
        self.counters.evicted_tokens = self.kv.evicted_blocks * bs

    def _drop_aborted(self) -> None:
        events: list[EngineEvent] = []
        self.retire_all(self.now_s, events)
