"""A simulated GPU: supported clocks, locked clocks that take effect after a
latency, a cumulative energy counter and instant power.

It mirrors what Zeus/NVML expose for a real GPU (and the fields of
:class:`kairos_common.simgpu.SimGpuState`), so the fake vLLM server can serve it
over HTTP and ``kairosd --gpu-backend sim`` can control it. The engine model
feeds it energy; the GPU itself only keeps state (no timing or power logic).
"""

from __future__ import annotations

from kairos_common.simgpu import SimGpuState
from simulator.errors import EngineError
from simulator.presets import GpuParams


class SimulatedGpu:
    """One GPU (or the lead GPU of a TP group) under the simulator's virtual time."""

    def __init__(self, params: GpuParams, *, index: int = 0) -> None:
        if not params.supported_clocks_mhz:
            raise EngineError("a simulated GPU needs at least one supported clock")
        self.params = params
        self.index = index
        self.supported_clocks_mhz: tuple[int, ...] = tuple(sorted(params.supported_clocks_mhz))
        self.locked_min_mhz: int | None = None
        self.locked_max_mhz: int | None = None
        self._clock_mhz = self.supported_clocks_mhz[-1]
        self._pending: tuple[float, int] | None = None
        self.energy_j = 0.0
        self.power_w = 0.0

    @property
    def max_clock_mhz(self) -> int:
        return self.supported_clocks_mhz[-1]

    def set_locked_clocks(self, min_mhz: int, max_mhz: int, now_s: float) -> None:
        """Lock SM clocks to ``[min_mhz, max_mhz]``; under load the GPU runs at
        ``max_mhz``. Takes effect ``clock_latency_s`` after ``now_s``."""
        lo, hi = self.supported_clocks_mhz[0], self.supported_clocks_mhz[-1]
        if not lo <= min_mhz <= max_mhz <= hi:
            raise EngineError(
                f"locked clocks [{min_mhz}, {max_mhz}] MHz outside supported [{lo}, {hi}]"
            )
        self.locked_min_mhz, self.locked_max_mhz = min_mhz, max_mhz
        self._schedule(max_mhz, now_s)

    def reset_locked_clocks(self, now_s: float) -> None:
        """Unlock: the GPU boosts to its highest clock under load."""
        self.locked_min_mhz = self.locked_max_mhz = None
        self._schedule(self.max_clock_mhz, now_s)

    def _schedule(self, clock_mhz: int, now_s: float) -> None:
        self._settle(now_s)
        self._pending = (now_s + self.params.clock_latency_s, clock_mhz)

    def _settle(self, t_s: float) -> None:
        if self._pending is not None and self._pending[0] <= t_s:
            self._clock_mhz = self._pending[1]
            self._pending = None

    def clock_at(self, t_s: float) -> int:
        """SM clock in effect at time ``t_s`` (not before the last query)."""
        pending = self._pending  # _settle, inline: asked several times per step
        if pending is not None and pending[0] <= t_s:
            self._clock_mhz = pending[1]
            self._pending = None
        return self._clock_mhz

    def next_change_s(self) -> float | None:
        """When a requested clock change takes effect, or None."""
        return None if self._pending is None else self._pending[0]

    def add_energy(self, energy_j: float, power_w: float) -> None:
        self.energy_j += energy_j
        self.power_w = power_w

    def state(self, now_s: float, *, name: str | None = None) -> SimGpuState:
        """The HTTP-contract view of this GPU at ``now_s``."""
        return SimGpuState(
            index=self.index,
            name=name or self.params.name,
            supported_clocks_mhz=self.supported_clocks_mhz,
            locked_min_mhz=self.locked_min_mhz,
            locked_max_mhz=self.locked_max_mhz,
            current_clock_mhz=self.clock_at(now_s),
            energy_mj=int(self.energy_j * 1000.0),
            power_w=self.power_w,
        )
