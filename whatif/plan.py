"""Which probes a calibration runs: a grid over the engine's limits, cut to a time budget.

The grid spans what the fitted model will be asked about: prefills of 64 tokens
to the model's length, with and without a cached prefix; decode batches of 1 to
``max_num_seqs`` sequences over short and long contexts. Nothing exceeds half the
KV cache, so a probe never preempts and never evicts more than half of what a
production engine caches.

A short pilot (two prefills and one decode) gives a rough price per token, per
attention pair and per step; each probe's duration is estimated from it, the
most expensive probes are dropped until the grid fits the budget, and the
remaining time repeats the grid (up to three times): the calibration says how
long it will take before it starts, and stays within that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from whatif.probes import DecodeProbe, EngineShape, PrefillProbe, Probe

UNCACHED = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CACHED_BLOCKS = (0, 8, 32, 128, 256)
"""Cached prefixes, in blocks (a prefix cache holds whole blocks)."""
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (64, 512, 4096, 16384)
WINDOW_TOKENS = 48
"""Decode steps a decode probe aims to time (its window)."""
MAX_REPEATS = 3
PROBE_OVERHEAD_S = 0.5
"""Per probe: metrics scrapes and waiting for the engine to be idle."""


@dataclass(frozen=True, slots=True)
class Costs:
    """The pilot's rough prices: seconds per prefill token, per attention pair and
    per decode step (a fixed cost per request is taken as one step)."""

    token_s: float
    pair_s: float
    step_s: float

    @classmethod
    def from_pilot(cls, short: tuple[int, float], long: tuple[int, float], step_s: float) -> Costs:
        """From two lone prefills ``(tokens, seconds)`` and a decode step time."""
        (n1, t1), (n2, t2) = short, long
        p1, p2 = n1 * (n1 + 1) / 2, n2 * (n2 + 1) / 2
        y1, y2 = max(t1 - step_s, 0.0), max(t2 - step_s, 0.0)
        det = n1 * p2 - n2 * p1
        pair = max((n1 * y2 - n2 * y1) / det, 0.0) if det else 0.0
        token = max((y1 - pair * p1) / n1, 0.0) if n1 else 0.0
        if token == 0.0:
            token = y2 / n2 if n2 else 0.0
        return cls(token, pair, max(step_s, 1e-4))

    def prefill_s(self, cached: int, uncached: int) -> float:
        pairs = uncached * cached + uncached * (uncached + 1) / 2
        return self.step_s + uncached * self.token_s + pairs * self.pair_s

    def estimate_s(self, probe: Probe) -> float:
        if isinstance(probe, PrefillProbe):
            warm = self.prefill_s(0, probe.cached) if probe.cached else 0.0
            return warm + self.prefill_s(probe.cached, probe.uncached) + PROBE_OVERHEAD_S
        prefill = probe.batch * self.prefill_s(0, probe.context)
        decode = probe.tokens * self.step_s * (1.0 + 0.05 * probe.batch)
        return prefill + decode + PROBE_OVERHEAD_S


def grid(shape: EngineShape) -> list[Probe]:
    """Every probe the engine's limits allow (half the cache at most)."""
    room = min(shape.max_model_len - 1, shape.capacity_tokens // 2)
    probes: list[Probe] = []
    for blocks in CACHED_BLOCKS:
        cached = blocks * shape.block_size
        for uncached in UNCACHED:
            if cached + uncached <= room:
                probes.append(PrefillProbe(cached, uncached))
    for batch in BATCHES:
        if batch > shape.max_num_seqs:
            continue
        for context in CONTEXTS:
            spread = math.ceil(batch * context / shape.max_num_batched_tokens)
            tokens = WINDOW_TOKENS + spread + 4
            if (
                context + tokens <= shape.max_model_len
                and batch * (context + tokens) <= shape.capacity_tokens // 2
            ):
                probes.append(DecodeProbe(batch, context, tokens))
    return probes


@dataclass(frozen=True, slots=True)
class Plan:
    probes: tuple[Probe, ...]
    estimate_s: float
    dropped: tuple[Probe, ...]
    """Grid probes left out for the budget (the most expensive)."""


def plan(shape: EngineShape, costs: Costs, budget_s: float) -> Plan:
    """The grid without its most expensive probes until it fits ``budget_s``, then
    repeated while the repeats fit too."""
    kept = sorted(grid(shape), key=costs.estimate_s)
    dropped: list[Probe] = []
    while kept and sum(map(costs.estimate_s, kept)) > budget_s:
        dropped.append(kept.pop())
    once = sum(map(costs.estimate_s, kept))
    repeats = 1
    while repeats < MAX_REPEATS and once * (repeats + 1) <= budget_s:
        repeats += 1
    probes = tuple(kept) * repeats
    return Plan(probes, once * repeats, tuple(reversed(dropped)))
