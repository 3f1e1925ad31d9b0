"""Putting the GPUs back at their default clocks, on every way out of the daemon.

:func:`reset_clocks` never raises (it logs the fix: ``kairosd reset``, which
systemd's ExecStopPost runs too); :func:`wait_gpu_idle` lets vendor calls still
in flight land first, so a late ``set_locked_clock`` cannot undo the reset.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

import structlog

from kairosd.errors import KairosdError
from kairosd.gpu.base import GpuBackend

log = structlog.get_logger()


@runtime_checkable
class _WaitsIdle(Protocol):
    async def wait_idle(self) -> None: ...


async def wait_gpu_idle(backend: GpuBackend, timeout_s: float) -> bool:
    """Wait (at most ``timeout_s``) for the backend's in-flight vendor calls to land."""
    inner = getattr(backend, "inner", backend)  # observe mode wraps the real backend
    if not isinstance(inner, _WaitsIdle):
        return True
    try:
        await asyncio.wait_for(inner.wait_idle(), timeout_s)
    except TimeoutError:
        log.error("gpu_calls_still_in_flight_at_reset", waited_s=timeout_s)
        return False
    return True


async def reset_clocks(backend: GpuBackend) -> bool:
    """Best-effort clock reset used on every exit path; never raises."""
    if not backend.controls:
        return True
    try:
        await backend.reset_clocks()
    except (KairosdError, OSError) as exc:
        log.error(
            "gpu_clock_reset_failed",
            error=str(exc),
            hint="run `kairosd reset` (systemd ExecStopPost does) to unlock the clocks",
        )
        return False
    log.info("gpu_clocks_reset", backend=backend.name)
    return True
