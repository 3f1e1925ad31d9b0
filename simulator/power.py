"""Per-instance power model: what an H100-class GPU draws during engine steps.

Power while the engine steps (docs/simulator.md, "Power model")::

    P = idle + busy_static                         # any work at any clock
      + mem_w · (mem_s / t)                          # HBM traffic
      + (a·f + b·f³) · activity                      # clock-dependent compute
    activity = (κ·(mem_s + fixed_s) + comp_s) / t    # κ < 1 for memory-bound kernels

capped at the TDP, and ``idle (+ idle_w_per_ghz·f)`` when no work is queued. Because
every term is linear in the step's time components, the energy of a whole
closed-form decode run is exact (:meth:`PowerModel.energy_j` on the summed
:class:`~simulator.timing.StepCost`); only the TDP cap is applied to the run's
average rather than per step.
"""

from __future__ import annotations

from simulator.presets import PowerParams
from simulator.timing import StepCost


class PowerModel:
    def __init__(self, params: PowerParams) -> None:
        self.params = params
        self._dynamic_cache: dict[float, float] = {}  # per clock: few clocks, every step

    def dynamic_w(self, clock_mhz: float) -> float:
        """``a·f + b·f³`` with f in GHz: the compute term at full activity."""
        got = self._dynamic_cache.get(clock_mhz)
        if got is None:
            f = clock_mhz / 1000.0
            got = self.params.dyn_a_w_per_ghz * f + self.params.dyn_b_w_per_ghz3 * f**3
            self._dynamic_cache[clock_mhz] = got
        return got

    def idle_w(self, clock_mhz: float) -> float:
        """Draw with nothing queued (deep idle; optional locked-clock term)."""
        return self.params.idle_w + self.params.idle_w_per_ghz * clock_mhz / 1000.0

    def energy_j(self, clock_mhz: float, cost: StepCost) -> float:
        """Energy of one step or of a run of steps with summed ``cost``."""
        p = self.params
        t = cost.time_s
        if t <= 0.0:
            return 0.0
        dyn = self._dynamic_cache.get(clock_mhz)
        if dyn is None:
            dyn = self.dynamic_w(clock_mhz)
        e = (p.idle_w + p.busy_static_w) * t
        e += p.mem_w * cost.mem_s
        e += dyn * (p.mem_bound_activity * (cost.mem_s + cost.fixed_s) + cost.comp_s)
        return min(e, p.tdp_w * t)

    def power_w(self, clock_mhz: float, cost: StepCost) -> float:
        """Average power over ``cost``'s duration."""
        t = cost.time_s
        return self.energy_j(clock_mhz, cost) / t if t > 0.0 else self.idle_w(clock_mhz)
