"""The decoding cohort: every running sequence past its prefill, advanced lazily.

A decode step gives each decoding sequence one token, so between two changes of
membership every member's ``computed`` and ``generated`` grow by the same count.
The cohort keeps that count once (``tick``) and each member only its offsets
(``cbase = computed − tick``, ``gbase = generated − tick``): a decode run of ``k``
steps, or the decode part of a mixed step, is ``tick += k`` with no pass over
the sequences (docs/simulator.md, "Speed"). What a step or run needs of the members is kept as sums:

* their context ``Σ computed = Σ cbase + size·tick`` (the step cost);
* when the next one finishes: a heap of ``(tick at which it finishes, order)``;
* the KV blocks ``k`` more steps need: a member owns ``⌈computed / bs⌉`` blocks, so
  it needs one more at every step that takes ``computed`` past a multiple of
  ``bs``. Counting members per ``cbase mod bs`` (a histogram) turns
  ``Σ (⌈(c + k)/bs⌉ − ⌈c/bs⌉)`` into ``size·(k // bs)`` plus the members whose
  residue lies in a window of ``k mod bs`` residues: exact integers, so plans and
  results are the same as with a pass over the sequences.

Members' ``computed``/``generated``/``total``/``blocks`` fields are stale while
``seq.lazy``; :meth:`DecodeCohort.leave` writes them back. Internal to
:mod:`simulator.engine`.
"""

from __future__ import annotations

import heapq

from simulator.engine_state import Seq


class DecodeCohort:
    """Lazily advanced decoding sequences of one engine (see the module doc)."""

    __slots__ = ("_bs", "_heap", "_hist", "_joins", "base_sum", "size", "tick")

    def __init__(self, block_size: int) -> None:
        self._bs = block_size
        self.tick = 0
        self.size = 0
        self.base_sum = 0
        self._hist = [0] * block_size
        self._heap: list[tuple[int, int, int, Seq]] = []
        self._joins = 0

    def context(self) -> int:
        """Σ ``computed`` of the members now."""
        return self.base_sum + self.size * self.tick

    def join(self, seq: Seq) -> None:
        """``seq`` (running, decoding: ``total == computed + 1``) joins at the current tick."""
        tick = self.tick
        cbase = seq.computed - tick
        seq.cbase = cbase
        seq.gbase = seq.generated - tick
        seq.lazy = True
        self.size += 1
        self.base_sum += cbase
        self._hist[cbase % self._bs] += 1
        self._joins += 1
        seq.join_id = self._joins
        heapq.heappush(self._heap, (seq.out - seq.gbase, seq.order, self._joins, seq))

    def leave(self, seq: Seq) -> None:
        """``seq`` leaves; its fields are written back (its heap entry goes stale)."""
        cbase = seq.cbase
        computed = cbase + self.tick
        seq.computed = computed
        seq.generated = seq.gbase + self.tick
        seq.total = computed + 1
        seq.blocks = -(-computed // self._bs)
        seq.lazy = False
        self.size -= 1
        self.base_sum -= cbase
        self._hist[cbase % self._bs] -= 1

    def steps_left(self) -> int:
        """Decode steps until the first member finishes (≥ 1 while it has members)."""
        heap = self._heap
        while True:
            _, _, join_id, seq = heap[0]
            if seq.lazy and seq.join_id == join_id:
                return heap[0][0] - self.tick
            heapq.heappop(heap)

    def need(self, steps: int) -> int:
        """New KV blocks the members need for ``steps`` more decode steps."""
        bs = self._bs
        full, r = divmod(steps, bs)
        need = self.size * full
        if r:
            # Members with computed ≡ bs−r+1 … bs (mod bs) cross a block boundary in
            # the last r steps; in cbase terms the window starts at (1 − r − tick).
            hist = self._hist
            start = (1 - r - self.tick) % bs
            stop = start + r
            if stop <= bs:
                need += sum(hist[start:stop])
            else:
                need += sum(hist[start:]) + sum(hist[: stop - bs])
        return need

    def steps_fitting(self, available: int, upper: int) -> int:
        """Largest k ≤ ``upper`` whose :meth:`need` fits in ``available`` blocks."""
        if self.size * (upper // self._bs + 1) <= available or self.need(upper) <= available:
            return upper  # the first test: even a new block every bs steps fits
        lo, hi = 0, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.need(mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def advance(self, steps: int) -> list[Seq]:
        """Every member gains ``steps`` tokens; returns those that finished (they
        are still members), in running order. ``steps`` ≤ :meth:`steps_left`."""
        tick = self.tick = self.tick + steps
        heap = self._heap
        done: list[Seq] = []
        while heap and heap[0][0] <= tick:
            _, _, join_id, seq = heapq.heappop(heap)
            if seq.lazy and seq.join_id == join_id:
                done.append(seq)
        return done
