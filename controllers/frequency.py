"""Frequency level sets ``F = f(1) < … < f(L)`` built from what a GPU reports.

Clock lists are never hard-coded: the daemon reads the supported graphics clocks
from the GPU (or the simulated GPU) at start-up and builds the level set here,
optionally restricted to ``[floor_mhz, ceiling_mhz]`` and thinned to
``num_levels`` evenly spaced levels (always keeping both ends).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from controllers.errors import InvalidConfigError

DEFAULT_FLOOR_MHZ = 660
"""Lowest clock adaptive policies use by default: the bottom of the paper's
Fig. 4 sweep. Below it the simulated H100 thrashes at the paper's load and even
light work loses more throughput than it saves power (docs/simulator.md)."""
DEFAULT_NUM_LEVELS = 8
"""Levels adaptive policies use by default (≈160 MHz apart on an H100): fine
enough for Eq. 9's linear map, coarse enough that a one-agent change in context
does not move the clock."""


@dataclass(frozen=True, slots=True)
class FrequencyLevels:
    """Sorted, de-duplicated clock levels in MHz; level ``ℓ`` is 1-based."""

    clocks_mhz: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.clocks_mhz:
            raise InvalidConfigError("a frequency level set needs at least one clock")
        if list(self.clocks_mhz) != sorted(set(self.clocks_mhz)):
            raise InvalidConfigError("clock levels must be strictly ascending")
        if self.clocks_mhz[0] <= 0:
            raise InvalidConfigError("clock levels must be positive MHz values")

    @classmethod
    def from_supported(
        cls,
        supported_mhz: Iterable[int],
        *,
        floor_mhz: int | None = None,
        ceiling_mhz: int | None = None,
        num_levels: int | None = None,
    ) -> FrequencyLevels:
        """Build levels from a GPU's supported clocks.

        ``num_levels`` picks that many clocks spread evenly (by index) across the
        allowed range, so a 15 MHz-step H100 list can be reduced to e.g. 8 levels
        without inventing clocks the GPU does not support.
        """
        clocks = sorted({int(c) for c in supported_mhz})
        if floor_mhz is not None:
            clocks = [c for c in clocks if c >= floor_mhz]
        if ceiling_mhz is not None:
            clocks = [c for c in clocks if c <= ceiling_mhz]
        if not clocks:
            raise InvalidConfigError(f"no supported clock lies in [{floor_mhz}, {ceiling_mhz}] MHz")
        if num_levels is not None:
            if num_levels < 1:
                raise InvalidConfigError("num_levels must be >= 1")
            if num_levels < len(clocks):
                if num_levels == 1:
                    clocks = [clocks[-1]]
                else:
                    last = len(clocks) - 1
                    picks = sorted({round(i * last / (num_levels - 1)) for i in range(num_levels)})
                    clocks = [clocks[i] for i in picks]
        return cls(tuple(clocks))

    @property
    def count(self) -> int:
        """``L``, the number of levels."""
        return len(self.clocks_mhz)

    @property
    def max_mhz(self) -> int:
        return self.clocks_mhz[-1]

    @property
    def min_mhz(self) -> int:
        return self.clocks_mhz[0]

    def clock_of(self, level: int) -> int:
        """Clock of 1-based level ``level`` (clamped to ``[1, L]``)."""
        index = min(max(level, 1), self.count) - 1
        return self.clocks_mhz[index]

    def level_of(self, clock_mhz: int) -> int:
        """1-based level of the highest clock not above ``clock_mhz`` (at least 1)."""
        level = 1
        for i, c in enumerate(self.clocks_mhz, start=1):
            if c <= clock_mhz:
                level = i
        return level

    def level_at_least(self, clock_mhz: int) -> int:
        """1-based level of the lowest clock not below ``clock_mhz`` (``L`` if none)."""
        return min(bisect.bisect_left(self.clocks_mhz, clock_mhz) + 1, self.count)

    def snap(self, clock_mhz: int) -> int:
        """The supported level clock nearest to ``clock_mhz`` (ties go up)."""
        return min(self.clocks_mhz, key=lambda c: (abs(c - clock_mhz), -c))
