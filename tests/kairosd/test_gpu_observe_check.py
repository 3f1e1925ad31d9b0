"""The real-GPU check's verdicts (scripts/gpu_observe_check.py), on made-up records.

The script itself ran on an H200 (docs/real-gpu.md); these pin what it calls a
pass, so a broken comparison cannot report "all checks passed".
"""

from __future__ import annotations

import pytest

from kairosd.gpu.base import GpuStatus
from reporting.records import EpochRecord
from scripts.gpu_observe_check import Samples, _energy_check, _untouched


def epoch(t_s: float, energy_j: float) -> EpochRecord:
    return EpochRecord(
        t_s=t_s,
        instance="i0",
        epoch=0,
        epoch_s=1.0,
        policy="kairos",
        target_clock_mhz=1980,
        actual_clock_mhz=1980,
        energy_j=energy_j,
        avg_power_w=energy_j,
        usage_tokens=0,
        capacity_tokens=1,
        ongoing=0,
        pending=0,
        min_throughput_tok_s=None,
        boost=False,
        deferred=False,
    )


def counter_at_200_w(t0: float, t1: float) -> Samples:
    """A counter sampled every 0.5 s while the GPU draws a steady 200 W."""
    n = int((t1 - t0) / 0.5) + 1
    return Samples([(t0 + 0.5 * k, 200_000.0 * 0.5 * k) for k in range(n)])


def test_interpolates_between_samples_and_refuses_outside() -> None:
    s = Samples([(0.0, 0.0), (1.0, 1000.0)])
    assert s.energy_j_between(0.25, 0.75) == pytest.approx(0.5)
    assert s.energy_j_between(-1.0, 0.5) is None


def test_energy_matches_when_epochs_add_up_to_the_counter() -> None:
    epochs = [epoch(float(t), 200.0) for t in range(1, 11)]
    result = _energy_check(epochs, counter_at_200_w(0.0, 12.0), tol=0.02)
    assert result["ok"] and result["relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert result["epochs"] == 9  # the first epoch only marks where the span starts


def test_energy_fails_when_the_daemon_lost_an_epoch() -> None:
    epochs = [epoch(float(t), 200.0) for t in range(1, 11) if t != 5]
    result = _energy_check(epochs, counter_at_200_w(0.0, 12.0), tol=0.02)
    assert not result["ok"] and result["relative_error"] > 0.1


def test_energy_fails_without_counter_samples() -> None:
    assert not _energy_check([epoch(1.0, 1.0), epoch(2.0, 1.0)], Samples(), tol=0.02)["ok"]


def status(locked_clock_mhz: int | None) -> GpuStatus:
    return GpuStatus(0, "H200", (345, 1980), 345, 0, 80.0, locked_clock_mhz)


def test_a_clock_locked_during_the_run_is_reported() -> None:
    assert _untouched([status(None)], [status(None)])["ok"]
    assert not _untouched([status(None)], [status(1410)])["ok"]
