"""Scheduler state of the engine model: per-request sequences and planned work.

Internal to :mod:`simulator.engine` (kept apart only to keep modules small).
"""

from __future__ import annotations

from simulator.engine_types import EngineEvent, EngineRequest
from simulator.timing import StepCost


class Seq:
    """Mutable scheduler state of one request (``out``: its output tokens, copied
    from ``req`` because the hot loops read it for every sequence at every step).

    While ``lazy`` (a member of the engine's
    :class:`~simulator.engine_cohort.DecodeCohort`) ``computed``, ``generated``,
    ``total`` and ``blocks`` are stale: the cohort holds them as offsets ``cbase``,
    ``gbase`` from its tick. ``order`` stamps admission into ``running`` (running
    order is ascending ``order``)."""

    __slots__ = (
        "aborted",
        "blocks",
        "cbase",
        "computed",
        "first_token_s",
        "gbase",
        "generated",
        "hit_tokens",
        "join_id",
        "lazy",
        "order",
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
        self.lazy = False
        self.cbase = 0
        self.gbase = 0
        self.join_id = 0
        self.order = 0


class Step:
    """A scheduled mixed step: decisions taken at ``start_s``, effects at ``end_s``."""

    __slots__ = ("end_s", "events", "start_s")

    def __init__(self, start_s: float, end_s: float, events: list[EngineEvent]) -> None:
        self.start_s = start_s
        self.end_s = end_s
        self.events = events


class Run:
    """Up to ``steps`` pure-decode steps of the ``seqs`` running sequences (all of
    them, all decoding) at ``clock_mhz`` from ``start_s``."""

    __slots__ = ("clock_mhz", "context0", "cost", "end_s", "seqs", "start_s", "steps")

    def __init__(
        self,
        start_s: float,
        seqs: int,
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
