"""Scheduler state of the engine model: per-request sequences, planned work and
the KV-fit rule of a decode run.

Internal to :mod:`simulator.engine` (kept apart only to keep modules small).
"""

from __future__ import annotations

from simulator.engine_types import EngineEvent, EngineRequest
from simulator.timing import StepCost


class Seq:
    """Mutable scheduler state of one request (``out``: its output tokens, copied
    from ``req`` because the hot loops read it for every sequence at every step)."""

    __slots__ = (
        "aborted",
        "blocks",
        "computed",
        "first_token_s",
        "generated",
        "hit_tokens",
        "out",
        "preemptions",
        "prefix_limit",
        "recompute_upto",
        "req",
        "total",
    )

    def __init__(self, req: EngineRequest) -> None:
        self.req = req
        self.out = req.output_tokens
        self.total = req.prompt_tokens
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.first_token_s = -1.0
        self.hit_tokens = -1
        self.prefix_limit = min(req.shared_prefix_tokens, req.prompt_tokens - 1)
        self.recompute_upto = self.prefix_limit
        self.preemptions = 0
        self.aborted = False


class Step:
    """A scheduled mixed step: decisions taken at ``start_s``, effects at ``end_s``."""

    __slots__ = ("end_s", "events", "start_s")

    def __init__(self, start_s: float, end_s: float, events: list[EngineEvent]) -> None:
        self.start_s = start_s
        self.end_s = end_s
        self.events = events


class Run:
    """Up to ``steps`` pure-decode steps over ``seqs`` at ``clock_mhz`` from ``start_s``."""

    __slots__ = ("clock_mhz", "context0", "cost", "end_s", "seqs", "start_s", "steps")

    def __init__(
        self,
        start_s: float,
        seqs: list[Seq],
        steps: int,
        clock_mhz: int,
        context0: int,
        cost: StepCost,
    ) -> None:
        self.start_s = start_s
        self.seqs = seqs
        self.steps = steps
        self.clock_mhz = clock_mhz
        self.context0 = context0
        self.cost = cost
        """Summed cost of all ``steps`` (reused when the run is committed whole)."""
        self.end_s = start_s + cost.time_s


def steps_fitting(running: list[Seq], block_size: int, available: int, upper: int) -> int:
    """Largest k ≤ ``upper`` such that ``running``'s new blocks after k decode steps
    fit in ``available`` blocks (how far a decode run may go before the cache is full)."""
    bs = block_size
    if len(running) * (upper // bs + 1) <= available:
        return upper  # even the worst case (a new block every bs steps) fits
    comps = [s.computed for s in running]

    def need(k: int) -> int:
        return sum(-(-(c + k) // bs) - -(-c // bs) for c in comps)

    if need(upper) <= available:
        return upper
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo
