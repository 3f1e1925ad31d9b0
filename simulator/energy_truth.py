"""Exact per-agent energy in the simulator: the ground truth for energy attribution.

The engine knows every step's batch, so it can say whose work each joule was.
Convention (docs/energy.md), matching what production attributes: a step's
energy *above the idle draw* is split among the sequences it ran by their share
of the step's time — each sequence's own part (a decode's KV read; a prefill
chunk's GEMM and attention) plus an equal share of what the batch shares (host
overhead, fixed kernels, weight streaming). The idle draw over all time is the
static line production leaves unattributed. A fast-forwarded run of ``k`` decode
steps is split in closed form (context grows by one token per step).

The engine calls :meth:`EnergyTruth.step` / :meth:`EnergyTruth.run` from its
accounting only when a truth is attached (``engine.truth``), so the fast path
costs one ``is None`` test.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.engine_state import Seq
from simulator.timing import StepCost, TimingModel, attention_pairs


class EnergyTruth:
    """Joules above idle per key (the request's ``cache_key``: the agent)."""

    def __init__(self, timing: TimingModel) -> None:
        p = timing.params
        self.timing = timing
        self._kv_s_per_token = p.kv_bytes_per_token / (p.mem_bw_bytes_s * p.kv_bw_efficiency)
        self.by_key: dict[str, float] = {}
        self.total_j = 0.0

    def _add(self, energy_j: float, own: Sequence[tuple[str, float]], cost: StepCost) -> None:
        if energy_j <= 0.0 or not own:
            return
        shared = max(cost.time_s - sum(s for _, s in own), 0.0) / len(own)
        total = sum(s for _, s in own) + shared * len(own)
        if total <= 0.0:
            return
        by_key = self.by_key
        for key, s in own:
            by_key[key] = by_key.get(key, 0.0) + energy_j * (s + shared) / total
        self.total_j += energy_j

    def step(
        self,
        clock_mhz: float,
        cost: StepCost,
        energy_above_idle_j: float,
        scheduled: Sequence[tuple[str, int, int, bool]],
    ) -> None:
        """One mixed step: ``scheduled`` is ``(key, tokens, computed_before, is_decode)``."""
        p = self.timing.params
        sm = self.timing.mem_slowdown(clock_mhz)
        sc = self.timing.compute_slowdown(clock_mhz)
        own = []
        for key, n, computed, decode in scheduled:
            if decode:
                own.append((key, computed * self._kv_s_per_token * sm))
            else:
                gemm = n * p.prefill_s_per_token * sc
                own.append((key, gemm + attention_pairs(n, computed) * p.attn_s_per_pair * sc))
        self._add(energy_above_idle_j, own, cost)

    def run(
        self,
        clock_mhz: float,
        cost: StepCost,
        energy_above_idle_j: float,
        seqs: Sequence[tuple[str, int]],
        steps: int,
    ) -> None:
        """A run of ``steps`` decode steps; ``seqs`` is ``(key, computed_before)``."""
        sm = self.timing.mem_slowdown(clock_mhz)
        grow = steps * (steps - 1) / 2.0
        own = [(key, (steps * c + grow) * self._kv_s_per_token * sm) for key, c in seqs]
        self._add(energy_above_idle_j, own, cost)


def step_rows(scheduled: Sequence[tuple[Seq, int]]) -> list[tuple[str, int, int, bool]]:
    """``(key, tokens, computed before, is decode)`` of a mixed step's sequences, for
    :meth:`EnergyTruth.step` (the engine builds them only when a truth is attached)."""
    return [
        (
            seq.req.cache_key or seq.req.request_id,
            n,
            seq.computed,
            n == 1 and seq.computed == seq.total - 1 and seq.generated > 0,
        )
        for seq, n in scheduled
    ]
