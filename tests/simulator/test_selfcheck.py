"""The stack's self-check: lag in simulated seconds, and the speed-up choice."""

from __future__ import annotations

import pytest

from reporting.records import EpochRecord
from simulator.selfcheck import (
    REFERENCE_LAUNCH_S,
    LagReport,
    MachineProbe,
    choose_speedup,
    epoch_lateness_s,
)


def _epoch(instance: str, t_s: float) -> EpochRecord:
    return EpochRecord(
        t_s=t_s, instance=instance, epoch=0, epoch_s=0.25, policy="kairos",
        target_clock_mhz=1785, actual_clock_mhz=1785, energy_j=1.0, avg_power_w=400.0,
        usage_tokens=0, capacity_tokens=1, ongoing=0, pending=0, min_throughput_tok_s=None,
        boost=False, deferred=False,
    )  # fmt: skip


def test_epoch_lateness_is_the_largest_gap_beyond_the_period_per_instance() -> None:
    epochs = [_epoch("i0", t) for t in (10.0, 10.25, 10.6, 10.85)]
    epochs += [_epoch("i1", t) for t in (0.0, 0.25)]  # other instance: gaps never mixed
    assert epoch_lateness_s(epochs, 0.25) == pytest.approx(0.1)
    assert epoch_lateness_s([], 0.25) == 0.0


def test_a_run_is_valid_only_while_every_lag_stays_under_the_bound() -> None:
    ok = LagReport(speedup=20, arrival_s=1.0, epoch_s=2.0, step_s=0.5, bound_s=2.5)
    late = LagReport(speedup=20, arrival_s=1.0, epoch_s=0.2, step_s=9.0, bound_s=2.5)
    assert ok.valid and ok.max_s == 2.0 and "self-check passed" in ok.verdict()
    assert not late.valid and late.max_s == 9.0
    assert "NOT VALID ON THIS MACHINE" in late.verdict() and "fake-vLLM step 9.00" in late.verdict()


def test_the_speedup_shrinks_with_fewer_cores_slower_launches_and_more_stacks() -> None:
    def pick(cores: int, launch_s: float, stacks: int = 2, top: float = 20.0) -> float:
        return choose_speedup(top, MachineProbe(cores=cores, launch_s=launch_s), stacks=stacks)

    assert pick(2, REFERENCE_LAUNCH_S) == 20.0
    assert pick(8, REFERENCE_LAUNCH_S / 2) == 20.0  # capped
    assert pick(1, REFERENCE_LAUNCH_S) == 10.0  # taskset -c 0
    assert pick(2, 2 * REFERENCE_LAUNCH_S) == 10.0  # a loaded or slower machine
    assert pick(1, REFERENCE_LAUNCH_S, stacks=1) == 20.0
    assert pick(1, 4 * REFERENCE_LAUNCH_S) == 4.0  # never below the floor
    assert pick(2, REFERENCE_LAUNCH_S, top=5.0) == 5.0
