"""Mixed steps of the engine model: V1's scheduler for one step, two ways.

:func:`reference_step` is the scheduler written out sequence by sequence:
running requests first, in admission order (decodes need one token, partial
prefills the rest of their prompt up to the token budget); on allocation
failure pop the *last* running request (recompute preemption); then waiting
requests FCFS, only in steps without preemption, head-of-line blocking.

:func:`cohort_step` gives the same step without a pass over the decoding
sequences (docs/simulator.md, "Speed"): they are the engine's
:class:`~simulator.engine_cohort.DecodeCohort` and each takes one token, so only
the few prefilling ones are scheduled one by one. It applies when the step is
one in which nothing is cut short for a decoding sequence and nothing is
preempted (the budget reaches every decode; the step's blocks fit); otherwise it
returns None having changed nothing, and the engine takes the reference path.
Both build the step's cost from the same integer sums, so they give the same
floats. Internal to :mod:`simulator.engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.energy_truth import step_rows
from simulator.engine_state import Seq, Step
from simulator.engine_types import EngineEvent, FirstToken, Preempted, TokenProgress
from simulator.errors import EngineError
from simulator.timing import StepCost, attention_pairs

if TYPE_CHECKING:
    from simulator.engine import Engine


def _is_decode(seq: Seq, n: int) -> bool:
    return n == 1 and seq.computed == seq.total - 1 and seq.generated > 0


def reference_step(eng: Engine) -> Step:
    """Schedule one step V1-style, sequence by sequence; decisions apply now,
    effects at its end. Every cohort member is written back first and the
    decoding sequences rejoin afterwards."""
    cohort = eng.cohort
    for seq in eng.running:
        if seq.lazy:
            cohort.leave(seq)
    bs = eng._bs
    kv = eng.kv
    budget = eng.params.max_num_batched_tokens
    scheduled: list[tuple[Seq, int]] = []
    events: list[EngineEvent] = []
    preempted = False
    running = eng.running
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
                _preempt(eng, victim, events)
                preempted = True
                if victim is seq:
                    ok = False
                    break
            if not ok:
                break
            seq.blocks += need
        scheduled.append((seq, n))
        budget -= n
        i += 1
    if not preempted:
        admit_waiting(eng, budget, scheduled)
    truth = step_rows(scheduled) if eng.truth is not None else None
    clock, cost = _price(eng, scheduled, 0, 0)
    end = eng.now_s + cost.time_s
    progress = eng.emit_progress
    done: list[Seq] = []
    tokens = 0
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
            if seq.out - generated <= 0:
                done.append(seq)
    eng.counters.generation_tokens += tokens
    energy_j = eng.account(clock, cost, 1)
    if eng.truth is not None and truth is not None:
        eng.truth.step(clock, cost, eng.above_idle_j(clock, cost, energy_j), truth)
    step = Step(eng.now_s, end, events)
    eng.now_s = end
    if eng.aborted_running:
        eng.retire_all(end, events)
    elif done:
        eng.retire(done, end, events)
    if eng.lazy:
        for seq in eng.running:
            if seq.total - seq.computed == 1 and seq.generated > 0 and not seq.aborted:
                cohort.join(seq)
    return step


def cohort_step(eng: Engine) -> Step | None:
    """The step :func:`reference_step` would take, scheduling only the prefilling
    sequences one by one; None (nothing changed) when a decode would be cut short
    by the budget or the blocks do not fit (a preemption)."""
    cohort = eng.cohort
    running = eng.running
    m = cohort.size
    budget = eng.params.max_num_batched_tokens
    bs = eng._bs
    actives = [(i, s) for i, s in enumerate(running) if not s.lazy] if m < len(running) else []
    last = len(running) - 1  # the last decoding sequence's index
    for i, _ in reversed(actives):
        if i != last:
            break
        last -= 1
    need = cohort.need(1) if m else 0
    used = 0
    # Every decode gets its token iff the budget is not spent before the last one
    # (index ``last``): checked once the walk passes it, or at the end.
    reached = False
    scheduled: list[tuple[Seq, int]] = []
    for j, (i, seq) in enumerate(actives):
        if i > last and not reached:
            if budget - m - used < 0:
                return None
            reached = True
        left = budget - (i - j) - used  # i − j decodes come before index i
        if left <= 0:
            break
        computed = seq.computed
        n = min(seq.total - computed, left)
        seq_need = -(-(computed + n) // bs) - seq.blocks
        if seq_need > 0:
            need += seq_need
        scheduled.append((seq, n))
        used += n
    if not reached and budget - m - used < 0:
        return None
    kv = eng.kv
    if need > kv.available_blocks:
        return None
    # From here on the step happens: the same decisions as the reference path.
    if need and not kv.allocate(need):
        raise EngineError("KV allocation failed after a successful check")
    for seq, n in scheduled:
        seq_need = -(-(seq.computed + n) // bs) - seq.blocks
        if seq_need > 0:
            seq.blocks += seq_need
    admit_waiting(eng, budget - m - used, scheduled)
    clock, cost = _price(eng, scheduled, m, cohort.context())
    end = eng.now_s + cost.time_s
    done = cohort.advance(1) if m else []
    finished: list[Seq] = []
    events: list[EngineEvent] = []
    tokens = m
    for seq, n in scheduled:
        computed = seq.computed = seq.computed + n
        if computed == seq.total:
            generated = seq.generated = seq.generated + 1
            seq.total = computed + 1
            tokens += 1
            if seq.first_token_s < 0:
                seq.first_token_s = end
                events.append(FirstToken(seq.req.request_id, end))
            if seq.out - generated <= 0:
                finished.append(seq)
            else:
                cohort.join(seq)
    eng.counters.generation_tokens += tokens
    eng.account(clock, cost, 1)
    step = Step(eng.now_s, end, events)
    eng.now_s = end
    if finished:
        done = sorted(done + finished, key=_order) if done else finished
    if done:
        eng.retire(done, end, events)
    return step


def _price(
    eng: Engine, scheduled: list[tuple[Seq, int]], decode_seqs: int, decode_ctx: int
) -> tuple[int, StepCost]:
    """The step's clock and cost: ``decode_seqs`` decodes over ``decode_ctx``
    tokens already counted (the cohort's) plus what ``scheduled`` holds. Both
    paths price a step here, from the same integer sums, so they give the same
    floats. Counts the prefill tokens computed."""
    prefill = pairs = chunks = 0
    for seq, n in scheduled:
        if _is_decode(seq, n):
            decode_seqs += 1
            decode_ctx += seq.computed
        else:
            prefill += n
            pairs += attention_pairs(n, seq.computed)
            chunks += 1
    clock = eng.gpu.clock_at(eng.now_s)
    cost = eng.timing.step(
        clock,
        decode_seqs=decode_seqs,
        decode_context_tokens=decode_ctx,
        prefill_tokens=prefill,
        attn_pairs=pairs,
        prefill_seqs=chunks,
    )
    eng.counters.prefill_computed_tokens += prefill
    return clock, eng.with_load(cost)


def _order(seq: Seq) -> int:
    return seq.order


def admit_waiting(eng: Engine, budget: int, scheduled: list[tuple[Seq, int]]) -> int:
    """FCFS admission of waiting requests into the step's remaining ``budget``."""
    bs = eng._bs
    kv = eng.kv
    c = eng.counters
    waiting = eng.waiting
    max_seqs = eng.params.max_num_seqs
    while waiting and budget > 0 and len(eng.running) < max_seqs:
        seq = waiting[0]
        hit, load = eng.prefix_blocks(seq)
        n, need, gate = eng.admission_blocks(seq, hit, load, budget)
        if gate > kv.available_blocks - hit:
            break  # stays queued, head of line: nothing is preempted to admit it
        waiting.popleft()
        if seq.computed == 0:
            if seq.req.cache_key:
                hit = kv.claim(seq.req.cache_key, hit)
            seq.blocks = hit
            seq.computed = (hit + load) * bs
            if load:
                _load(eng, seq.req.cache_key, load)
            if seq.hit_tokens < 0:
                seq.hit_tokens = seq.computed
                c.prompt_tokens += seq.req.prompt_tokens
                if eng.admit_cost:
                    eng.admit_s += eng.timing.admission_s(seq.req.prompt_tokens)
            c.prefix_queried_tokens += seq.total
            c.prefill_reused_tokens += hit * bs
            upto = seq.recompute_upto // bs * bs
            c.recomputed_tokens += max(0, upto - seq.computed)
        if not kv.allocate(need):  # cannot happen: checked above
            raise EngineError("KV allocation failed after a successful check")
        seq.blocks += need
        seq.order = eng.next_order()
        eng.running.append(seq)
        scheduled.append((seq, n))
        budget -= n
    return budget


def _load(eng: Engine, key: str, blocks: int) -> None:
    """A prefix comes back from the CPU tier: counted, and charged to the step."""
    tokens = blocks * eng._bs
    if eng.kv.tier is not None:
        eng.kv.tier.load(key, blocks)
    eng.counters.loaded_tokens += tokens
    eng.load_tokens += tokens


def _preempt(eng: Engine, seq: Seq, events: list[EngineEvent]) -> None:
    """Recompute-mode preemption: blocks become the key's cached context."""
    eng.kv.release(seq.req.cache_key, seq.blocks, seq.computed // eng._bs)
    seq.recompute_upto = max(seq.recompute_upto, seq.computed)
    seq.prefix_limit = seq.total - 1
    seq.computed = 0
    seq.blocks = 0
    seq.preemptions += 1
    eng.counters.preemptions += 1
    eng.waiting.appendleft(seq)
    events.append(Preempted(seq.req.request_id, eng.now_s))
