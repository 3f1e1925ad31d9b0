"""The small protocol every GPU backend implements, and what it reports.

A backend is built for the GPUs of one serving instance (one GPU, or the GPUs
of a tensor-parallel group) and acts on all of them together: an instance
runs at one clock, because a TP group runs at the pace of its slowest GPU.
Every method is async and bounded in time; blocking vendor calls run in a
worker thread inside the backend, never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """One GPU as read now. ``None`` = the backend cannot read that value."""

    index: int
    name: str
    supported_clocks_mhz: tuple[int, ...]
    current_clock_mhz: int | None
    energy_mj: int | None
    power_w: float | None
    locked_clock_mhz: int | None = None


class GpuBackend(Protocol):
    """Read and (if permitted) lock the graphics clock of an instance's GPUs."""

    name: str

    @property
    def controls(self) -> bool:
        """Whether this backend changes clocks (False for observe mode)."""
        ...

    async def status(self) -> list[GpuStatus]:
        """Read every GPU of the instance (clock, energy counter, power)."""
        ...

    async def supported_clocks_mhz(self) -> tuple[int, ...]:
        """Graphics clocks every GPU of the instance supports (intersection)."""
        ...

    async def set_locked_clock(self, clock_mhz: int) -> None:
        """Lock every GPU of the instance at ``clock_mhz`` (min = max)."""
        ...

    async def reset_clocks(self) -> None:
        """Undo any clock lock on every GPU of the instance."""
        ...

    async def close(self) -> None:
        """Release sessions/handles; never raises."""
        ...


def common_clocks(statuses: list[GpuStatus]) -> tuple[int, ...]:
    """Clocks supported by all GPUs (a TP group's GPUs should agree; be safe)."""
    if not statuses:
        return ()
    common = set(statuses[0].supported_clocks_mhz)
    for s in statuses[1:]:
        common &= set(s.supported_clocks_mhz)
    return tuple(sorted(common))
