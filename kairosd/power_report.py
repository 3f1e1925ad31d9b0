"""The per-epoch power report: what was decided at the start of an epoch, closed
with the GPU reading at its end.

An epoch's energy is only known once it is over, and the clock in force during
it is the one applied at its start, so the loop *opens* an epoch when it acts
and *closes* it at the next epoch's first GPU reading (or at shutdown). The
record then pairs each energy delta with the clock that actually produced it.
"""

from __future__ import annotations

from dataclasses import dataclass

from controllers.types import ControlDecision
from kairosd.gpu.base import GpuStatus
from reporting.records import EpochRecord


@dataclass(frozen=True, slots=True)
class GpuTotals:
    """Sum over an instance's GPUs at one instant."""

    energy_mj: int | None
    power_w: float | None
    clock_mhz: int | None

    @classmethod
    def of(cls, statuses: list[GpuStatus] | None) -> GpuTotals:
        if not statuses:
            return cls(None, None, None)
        energies = [s.energy_mj for s in statuses]
        powers = [s.power_w for s in statuses]
        clocks = [s.current_clock_mhz for s in statuses if s.current_clock_mhz is not None]
        return cls(
            energy_mj=None if any(e is None for e in energies) else sum(e or 0 for e in energies),
            power_w=None if any(p is None for p in powers) else sum(p or 0.0 for p in powers),
            # A TP group runs at its slowest GPU's pace: report the minimum.
            clock_mhz=min(clocks) if clocks else None,
        )


@dataclass(frozen=True, slots=True)
class OpenEpoch:
    """An epoch whose decision is applied and whose energy is still accruing."""

    epoch: int
    start_s: float
    decision: ControlDecision
    target_clock_mhz: int
    reason: str
    ongoing: int
    pending: int
    admitted: int
    start: GpuTotals
    generation_tokens_total: int | None
    preemptions_total: int | None


def _delta(end: int | None, start: int | None) -> int | None:
    if end is None or start is None or end < start:
        return None  # unknown, or the counter reset (server restart)
    return end - start


def energy_over(start: GpuTotals, end: GpuTotals, epoch_s: float) -> float:
    """Joules from the cumulative counter; mean instant power × time without it."""
    delta_mj = _delta(end.energy_mj, start.energy_mj)
    if delta_mj is not None:
        return delta_mj / 1000.0
    powers = [p for p in (start.power_w, end.power_w) if p is not None]
    return sum(powers) / len(powers) * epoch_s if powers else 0.0


def close_epoch(
    opened: OpenEpoch,
    *,
    end_s: float,
    t_s: float,
    end: GpuTotals,
    generation_tokens_total: int | None,
    preemptions_total: int | None,
    instance: str,
    policy: str,
    gpus: tuple[int, ...],
    run: str,
) -> EpochRecord:
    """The :class:`EpochRecord` of ``opened`` ending now (``t_s`` on the wall clock)."""
    epoch_s = max(end_s - opened.start_s, 0.0)
    energy_j = energy_over(opened.start, end, epoch_s)
    d = opened.decision
    return EpochRecord(
        t_s=t_s,
        instance=instance,
        epoch=opened.epoch,
        epoch_s=epoch_s,
        policy=policy,
        target_clock_mhz=opened.target_clock_mhz,
        actual_clock_mhz=end.clock_mhz,
        energy_j=energy_j,
        avg_power_w=energy_j / epoch_s if epoch_s > 0 else 0.0,
        usage_tokens=d.usage_tokens,
        capacity_tokens=d.capacity_tokens,
        ongoing=opened.ongoing,
        pending=opened.pending,
        min_throughput_tok_s=d.min_throughput_tok_s,
        boost=d.boost,
        deferred=d.defer_admissions,
        admitted=opened.admitted,
        reason=opened.reason,
        gpus=gpus,
        run=run,
        output_tokens=_delta(generation_tokens_total, opened.generation_tokens_total),
        preemptions=_delta(preemptions_total, opened.preemptions_total),
    )
