"""Event-driven model of one vLLM V1 engine on one simulated GPU.

What it models (issue 3, "Engine model"): continuous batching with a per-step
token budget and a cap on running sequences; chunked prefill; prefix caching in
which a finished request's context stays resident as evictable blocks and is
reused by the next request with the same ``cache_key``; block-granular KV
capacity; and, when a step cannot allocate, preemption of the most recently
admitted running request, which is recomputed later (V1 has no swap). Nothing
about thrashing is scripted: it emerges when running contexts outgrow the cache.

The scheduler mirrors V1's: running requests first, in admission order (decodes
need one token, partial prefills the rest of their prompt up to the budget);
on allocation failure pop the *last* running request; waiting requests are
admitted FCFS only in steps without preemption, head-of-line blocking.

Driving it (also how the fake vLLM server drives it in scaled real time)::

    engine.submit(EngineRequest(...))   # arrival_s ≥ the engine's last submit
    t = engine.next_event_time()        # end of the step/run in progress, or None
    events = engine.advance_to(t)       # runs steps that *start* before t

Steps whose start precedes ``t`` are executed whole, so returned events may be
stamped slightly after ``t``. A run of pure-decode steps is fast-forwarded in
closed form and split exactly when something external happens (a submission,
a clock change) — the hot loop has no per-token Python work.
"""

from __future__ import annotations

from collections import deque

from simulator.energy_truth import EnergyTruth, step_rows
from simulator.engine_state import Run as _Run
from simulator.engine_state import Seq as _Seq
from simulator.engine_state import Step as _Step
from simulator.engine_state import steps_fitting
from simulator.engine_types import (
    EngineCounters,
    EngineEvent,
    EngineRequest,
    FirstToken,
    Preempted,
    RequestFinished,
    RequestRejected,
    TokenProgress,
)
from simulator.errors import EngineError
from simulator.gpu import SimulatedGpu
from simulator.kvcache import KvCache
from simulator.power import PowerModel
from simulator.presets import EngineParams
from simulator.timing import StepCost, TimingModel, attention_pairs

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
        self.kv = KvCache(params.kv_capacity_tokens, params.block_size)
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
        self._aborted_running = False
        self._decoding: tuple[int, int] | None = None
        """``(Σ computed, min tokens left)`` of ``running`` right after a decode run
        committed (all of them still decoding), so the next run is planned without
        another pass over the sequences; None once anything else touched them."""
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
        total = req.prompt_tokens + req.output_tokens
        if total > self.params.max_model_len or total > self.capacity_tokens:
            self.counters.rejected_requests += 1
            reason = f"{total} tokens exceed max_model_len/KV capacity"
            self._outbox.append(RequestRejected(req.request_id, req.arrival_s, reason))
            return req.request_id
        self.waiting.append(_Seq(req))
        return req.request_id

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
                self._aborted_running = True
                self._decoding = None
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
        self._plan = run if run is not None else self._plan_step()

    def _waiting_blocked(self) -> bool:
        """True if FCFS admission cannot take the waiting head now (and will not
        until a running request finishes: free space only shrinks meanwhile)."""
        if not self.waiting:
            return True
        if len(self.running) >= self.params.max_num_seqs:
            return True
        head = self.waiting[0]
        hit = self._hit_blocks(head)
        budget = self.params.max_num_batched_tokens - len(self.running)
        chunk = min(head.total - hit * self._bs, budget)
        need = -(-(hit * self._bs + chunk) // self._bs) - hit
        return need > self.kv.available_blocks - hit

    def _hit_blocks(self, seq: _Seq) -> int:
        if seq.computed > 0 or not seq.req.cache_key:
            return 0
        return min(self.kv.cached_of(seq.req.cache_key), max(seq.prefix_limit, 0) // self._bs)

    def _plan_run(self) -> _Run | None:
        running = self.running
        if not self.fast_forward or not running or not self._waiting_blocked():
            return None
        if self._decoding is not None:
            context, steps = self._decoding
        else:
            steps = _MAX_RUN_STEPS
            context = 0
            for seq in running:
                computed = seq.computed
                if seq.total - computed != 1 or seq.aborted:
                    return None
                left = seq.out - seq.generated
                if left < steps:
                    steps = left
                context += computed
        if steps < 2:
            return None
        now = self.now_s
        clock = self.gpu.clock_at(now)
        change = self.gpu.next_change_s()
        if change is not None and change > now:
            steps = min(
                steps,
                self.timing.decode_steps_before(clock, len(running), context, change - now),
            )
        steps = steps_fitting(running, self._bs, self.kv.available_blocks, steps)
        if steps < 2:
            return None
        cost = self.timing.decode_run(clock, len(running), context, steps)
        return _Run(now, list(running), steps, clock, context, cost)

    # ------------------------------------------------------- mixed step path
    def _plan_step(self) -> _Step:
        """Schedule one step V1-style; decisions apply now, effects at its end."""
        self._decoding = None
        bs = self._bs
        kv = self.kv
        budget = self.params.max_num_batched_tokens
        scheduled: list[tuple[_Seq, int]] = []
        events: list[EngineEvent] = []
        preempted = False
        running = self.running
        # The step's shape (see _finish_plan), summed while scheduling: one pass.
        decode_seqs = decode_ctx = prefill = pairs = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.computed
            n = seq.total - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // bs) - seq.blocks
            if need > 0:
                ok = True
                while not kv.allocate(need):
                    victim = running.pop()
                    self._preempt(victim, events)
                    preempted = True
                    if victim is seq:
                        ok = False
                        break
                if not ok:
                    break
                seq.blocks += need
            if n == 1 and computed == seq.total - 1 and seq.generated > 0:
                decode_seqs += 1
                decode_ctx += computed
            else:
                prefill += n
                pairs += attention_pairs(n, computed)
            scheduled.append((seq, n))
            budget -= n
            i += 1
        shape = (decode_seqs, decode_ctx, prefill, pairs, len(scheduled))
        if not preempted:
            budget = self._admit_waiting(budget, scheduled)
        return self._finish_plan(scheduled, events, shape)

    def _admit_waiting(self, budget: int, scheduled: list[tuple[_Seq, int]]) -> int:
        bs = self._bs
        kv = self.kv
        c = self.counters
        while self.waiting and budget > 0 and len(self.running) < self.params.max_num_seqs:
            seq = self.waiting[0]
            hit = self._hit_blocks(seq)
            base = hit * bs if seq.computed == 0 else seq.computed
            n = min(seq.total - base, budget)
            need = -(-(base + n) // bs) - (hit if seq.computed == 0 else seq.blocks)
            if need > kv.available_blocks - hit:
                break
            self.waiting.popleft()
            if seq.computed == 0:
                if seq.req.cache_key:
                    hit = kv.claim(seq.req.cache_key, hit)
                seq.blocks = hit
                seq.computed = hit * bs
                if seq.hit_tokens < 0:
                    seq.hit_tokens = seq.computed
                    c.prompt_tokens += seq.req.prompt_tokens
                c.prefix_queried_tokens += seq.total
                c.prefill_reused_tokens += seq.computed
                upto = seq.recompute_upto // bs * bs
                c.recomputed_tokens += max(0, upto - seq.computed)
            if not kv.allocate(need):  # cannot happen: checked above
                raise EngineError("KV allocation failed after a successful check")
            seq.blocks += need
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return budget

    def _preempt(self, seq: _Seq, events: list[EngineEvent]) -> None:
        """Recompute-mode preemption: blocks become the key's cached context."""
        self.kv.release(seq.req.cache_key, seq.blocks, seq.computed // self._bs)
        seq.recompute_upto = max(seq.recompute_upto, seq.computed)
        seq.prefix_limit = seq.total - 1
        seq.computed = 0
        seq.blocks = 0
        seq.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(seq)
        events.append(Preempted(seq.req.request_id, self.now_s))

    def _finish_plan(
        self,
        scheduled: list[tuple[_Seq, int]],
        events: list[EngineEvent],
        shape: tuple[int, int, int, int, int],
    ) -> _Step:
        """Cost the step and apply it. ``shape`` is ``(decode seqs, their context,
        prefill tokens, attention pairs)`` of ``scheduled[:k]`` and ``k``, summed
        by :meth:`_plan_step`; the admitted rest is summed here."""
        decode_seqs, decode_ctx, prefill, pairs, first = shape
        for seq, n in scheduled[first:]:
            computed = seq.computed
            if n == 1 and computed == seq.total - 1 and seq.generated > 0:
                decode_seqs += 1
                decode_ctx += computed
            else:
                prefill += n
                pairs += attention_pairs(n, computed)
        truth = step_rows(scheduled) if self.truth is not None else None
        clock = self.gpu.clock_at(self.now_s)
        cost = self.timing.step(
            clock,
            decode_seqs=decode_seqs,
            decode_context_tokens=decode_ctx,
            prefill_tokens=prefill,
            attn_pairs=pairs,
        )
        end = self.now_s + cost.time_s
        counters = self.counters
        counters.prefill_computed_tokens += prefill
        progress = self.emit_progress
        done: list[_Seq] = []
        tokens = 0
        # Whether every running sequence decodes next (then the next run needs no
        # pass over them: ``self._decoding``), with their context and shortest rest.
        decoding = len(scheduled) == len(self.running) and not self._aborted_running
        context = 0
        least = _MAX_RUN_STEPS
        for seq, n in scheduled:
            computed = seq.computed = seq.computed + n
            if computed == seq.total:
                generated = seq.generated = seq.generated + 1
                seq.total = computed + 1
                tokens += 1
                if seq.first_token_s < 0:
                    seq.first_token_s = end
                    events.append(FirstToken(seq.req.request_id, end))
                if progress:
                    events.append(TokenProgress(seq.req.request_id, end, generated))
                left = seq.out - generated
                if left <= 0:
                    done.append(seq)
                else:
                    context += computed
                    if left < least:
                        least = left
            else:
                decoding = False
        counters.generation_tokens += tokens
        above_idle_j = self._account(clock, cost, 1)
        if self.truth is not None and truth is not None:
            self.truth.step(clock, cost, above_idle_j, truth)
        step = _Step(self.now_s, end, events)
        self.now_s = end
        if self._aborted_running:
            self._retire(end, events)
        elif done:
            self._retire_seqs(done, end, events)
        self._decoding = (context, least) if decoding else None
        return step

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
                    plan.clock_mhz, len(plan.seqs), plan.context0, t_s - plan.start_s
                ),
            )
        self._commit_run(plan, k)
        self._plan = None

    def _commit_run(self, run: _Run, k: int) -> None:
        if k <= 0:
            return
        bs = self._bs
        n = len(run.seqs)
        cost = (
            run.cost
            if k == run.steps
            else self.timing.decode_run(run.clock_mhz, n, run.context0, k)
        )
        above_idle_j = self._account(run.clock_mhz, cost, k)
        if self.truth is not None:
            keys = [(s.req.cache_key or s.req.request_id, s.computed) for s in run.seqs]
            self.truth.run(run.clock_mhz, cost, above_idle_j, keys, k)
        now = self.now_s = run.start_s + cost.time_s
        need = 0
        done: list[_Seq] = []
        context = 0
        least = _MAX_RUN_STEPS
        for seq in run.seqs:
            computed = seq.computed + k
            blocks = -(-computed // bs)
            need += blocks - seq.blocks
            seq.blocks = blocks
            seq.computed = computed
            seq.total += k
            generated = seq.generated = seq.generated + k
            left = seq.out - generated
            if left <= 0:
                done.append(seq)
            else:
                context += computed
                if left < least:
                    least = left
        if not self.kv.allocate(need):
            raise EngineError("decode run outgrew the KV cache (planning bug)")
        self.counters.generation_tokens += n * k
        events: list[EngineEvent] = []
        if self.emit_progress:
            events.extend(TokenProgress(s.req.request_id, now, s.generated) for s in run.seqs)
        if done:
            self._retire_seqs(done, now, events)
        self._decoding = (context, least)
        self._outbox.extend(events)

    def _account(self, clock_mhz: int, cost: StepCost, steps: int) -> float:
        """Add a step's (or a run's) energy; returns the part above the idle draw
        (what :class:`~simulator.energy_truth.EnergyTruth` splits among its sequences)."""
        energy = self.power.energy_j(clock_mhz, cost)
        t = cost.time_s
        if t > 0:
            self._last_power_w = energy / t
        self.gpu.add_energy(energy, self._last_power_w)
        counters = self.counters
        counters.steps += steps
        counters.busy_s += t
        return energy - self.power.idle_w(clock_mhz) * t

    def _retire(self, t_s: float, events: list[EngineEvent]) -> None:
        """Finished (or aborted) sequences leave; their context stays cached."""
        self._aborted_running = False
        self._decoding = None
        done = [s for s in self.running if s.generated >= s.out or s.aborted]
        if done:
            self._retire_seqs(done, t_s, events)

    def _retire_seqs(self, done: list[_Seq], t_s: float, events: list[EngineEvent]) -> None:
        """``done`` (running, in running order) leave; their context stays cached."""
        if len(done) == 1:
            self.running.remove(done[0])
        else:
            self.running = [s for s in self.running if s.generated < s.out and not s.aborted]
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
        self._retire(self.now_s, events)
