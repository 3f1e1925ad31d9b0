"""Observe mode: read power and clocks through another backend, never write.

For machines whose settings must not change, and the fallback when the
process lacks permission to change clocks. Writes are dropped (logged once),
so the rest of the daemon runs unchanged and still reports power and energy.
"""

from __future__ import annotations

import structlog

from kairosd.gpu.base import GpuBackend, GpuStatus

log = structlog.get_logger()


class ObserveBackend:
    """Wrap ``inner``; every read passes through, every write is a no-op."""

    def __init__(self, inner: GpuBackend, reason: str = "observe mode") -> None:
        self.inner = inner
        self.reason = reason
        self.name = f"observe({inner.name})"
        self._warned = False

    @property
    def controls(self) -> bool:
        return False

    async def status(self) -> list[GpuStatus]:
        return await self.inner.status()

    async def supported_clocks_mhz(self) -> tuple[int, ...]:
        return await self.inner.supported_clocks_mhz()

    async def set_locked_clock(self, clock_mhz: int) -> None:
        if not self._warned:
            log.info("observe_mode_clock_not_applied", clock_mhz=clock_mhz, reason=self.reason)
            self._warned = True

    async def reset_clocks(self) -> None:
        return None

    async def close(self) -> None:
        await self.inner.close()
