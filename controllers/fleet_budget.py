"""A power budget over a set of instances (the cap Algorithm 1 lists but never uses).

Called once per epoch with every instance's decision (decide first, then act):
if the fleet's predicted power at the decided clocks exceeds the cap, clocks
are lowered one level at a time, each time on the instance with the most SLO
slack at its next lower level, until the prediction fits. When lowering further
would push an instance below its SLO margin (or every instance is at its
floor), the cap and the SLO conflict: the cap wins (it is a hard limit, e.g. a
breaker or a power contract) and the outcome says so, so the operator sees it.

Power per instance is predicted from what it drew last epoch at the clock it
ran, scaled by a shape ``r(f) = a + b·f + c·f³`` fitted online (NNLS, pooled
over instances) on measured (clock, power) pairs. Epoch power is noisy (a
prefill burst draws far more than decode), so the allocation aims below the
cap by a headroom that tracks the ``quantile`` of measured fleet power: it
grows after an epoch over the cap and shrinks slowly after one under it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from controllers.errors import InvalidConfigError
from controllers.frequency import FrequencyLevels
from controllers.perf_model import FloatArray, nnls
from controllers.reason import Cap
from controllers.types import ControlDecision


@dataclass(frozen=True, slots=True)
class FleetBudgetConfig:
    """``cap_w`` is the budget for the whole set; ``slo_tok_s`` the per-agent SLO."""

    cap_w: float
    slo_tok_s: float = 20.0
    margin: float = 0.1
    """Lowering an instance is SLO-safe while its predicted slack stays ≥ this."""
    correction_gain: float = 1.0
    """Headroom step per epoch, in % of the cap (quantile tracking)."""
    quantile: float = 0.95
    """Fraction of epochs whose measured fleet power should stay under the cap."""
    fit_window: int = 400
    warmup: int = 30

    def __post_init__(self) -> None:
        if self.cap_w <= 0:
            raise InvalidConfigError(f"fleet cap must be positive, got {self.cap_w}")


@dataclass(frozen=True, slots=True)
class InstancePower:
    """One instance at an epoch: its decision and what it drew last epoch."""

    name: str
    levels: FrequencyLevels
    decision: ControlDecision
    measured_power_w: float | None = None
    measured_clock_mhz: int | None = None


@dataclass(frozen=True, slots=True)
class BudgetOutcome:
    decisions: dict[str, ControlDecision]
    predicted_power_w: float
    effective_cap_w: float
    lowered_levels: int
    conflict: bool
    """True when meeting the cap needed an SLO-unsafe step or was impossible."""
    infeasible: bool
    """True when even every instance at its lowest level is predicted over the cap."""


def _shape_row(clock_mhz: float) -> FloatArray:
    g = clock_mhz / 1000.0
    return np.array([1.0, g, g**3])


class FleetBudget:
    """Stateful (the power-shape fit and the correction) but free of I/O."""

    def __init__(self, config: FleetBudgetConfig) -> None:
        self.config = config
        self._rows: deque[tuple[float, float]] = deque(maxlen=config.fit_window)
        self._seen: dict[str, tuple[float, int]] = {}
        self._coef: FloatArray | None = None
        self._bias_w = 0.0
        self._last_predicted_w: float | None = None
        self.conflict_epochs = 0
        self.epochs = 0

    @property
    def fit_samples(self) -> int:
        """(clock, power) measurements in the power-shape fit window."""
        return len(self._rows)

    # ------------------------------------------------------------ power shape
    def shape(self, clock_mhz: float) -> float:
        """``r(f)``: relative busy power at ``f`` (prior until the fit warms up)."""
        if self._coef is not None:
            return max(float(_shape_row(clock_mhz) @ self._coef), 1e-6)
        g = clock_mhz / 1000.0
        return 0.5 + 0.1 * g + 0.05 * g**3

    def _learn(self, views: Sequence[InstancePower]) -> None:
        """Add each new (clock, power) measurement to the fit window.

        A measurement seen again unchanged (a daemon slower than the round pace
        reports the same closed epoch twice) is learned once.
        """
        for v in views:
            if v.measured_power_w is None or not v.measured_clock_mhz:
                continue
            sample = (v.measured_power_w, v.measured_clock_mhz)
            if self._seen.get(v.name) == sample:
                continue
            self._seen[v.name] = sample
            self._rows.append((float(v.measured_clock_mhz), v.measured_power_w))
        clocks = {c for c, _ in self._rows}
        if len(self._rows) >= self.config.warmup and len(clocks) >= 3:
            a = np.vstack([_shape_row(c) for c, _ in self._rows])
            b = np.array([p for _, p in self._rows])
            self._coef = nnls(a, b)

    def predict_w(self, view: InstancePower, clock_mhz: int) -> float:
        """Power of ``view`` at ``clock_mhz``, scaled from what it drew last epoch."""
        if view.measured_power_w is None or not view.measured_clock_mhz:
            return 0.0  # first epoch: nothing measured yet; the correction catches up
        ratio = self.shape(clock_mhz) / self.shape(view.measured_clock_mhz)
        return view.measured_power_w * ratio

    # ----------------------------------------------------------------- slack
    def slack(self, view: InstancePower, level: int) -> float:
        """Predicted SLO slack of ``view`` at ``level`` (its controller's, if it says)."""
        d = view.decision
        predicted = d.report.slo_margin(level) if d.report is not None else None
        if predicted is not None:
            return predicted
        if d.min_throughput_tok_s is None or self.config.slo_tok_s <= 0:
            return 1.0
        # Pessimistic without a model: throughput scales with the clock.
        f_ratio = view.levels.clock_of(level) / max(d.clock_mhz, 1)
        return d.min_throughput_tok_s * f_ratio / self.config.slo_tok_s - 1.0

    @staticmethod
    def floor(view: InstancePower) -> int:
        """Lowest level the budget may take ``view`` to: its controller's efficient
        floor when its report has one (``efficient_floor_level``, the predictive
        controller), else level 1.

        Below that floor the model predicts requests slowing as fast as the clock
        falls: the GPU stays busy longer at ≥ its static power, so a lower clock
        draws less *now* but more on average — measured with a cap of 800 W on
        four instances, ignoring the floor raised the fleet's average power.
        """
        report = view.decision.report
        floor = report.efficient_floor_level if report is not None else None
        return min(max(floor or 1, 1), view.decision.level)

    # -------------------------------------------------------------- allocate
    def allocate(self, views: Sequence[InstancePower], *, reserved_w: float = 0.0) -> BudgetOutcome:
        """Lower clocks (most slack first, never below an instance's
        :meth:`floor`) until the predicted fleet power fits.

        ``reserved_w`` is power outside these views that the cap must also cover
        (instances nobody can lower right now: a stale daemon, an observe-only
        one); the views share what is left of the cap.
        """
        cfg = self.config
        cap_w = max(cfg.cap_w - reserved_w, 0.0)
        self.epochs += 1
        measured = [v.measured_power_w for v in views if v.measured_power_w is not None]
        if self._last_predicted_w is not None and len(measured) == len(views):
            # Quantile tracking: the headroom grows by q·η after an epoch over the
            # cap and shrinks by (1 − q)·η after one under it, so in steady state
            # a fraction 1 − q of epochs exceeds the cap, whatever the noise.
            over = sum(measured) > cap_w
            step = cfg.correction_gain * cfg.cap_w / 100.0
            self._bias_w += step * (cfg.quantile if over else -(1.0 - cfg.quantile))
            self._bias_w = min(max(self._bias_w, 0.0), 0.5 * cfg.cap_w)
        self._learn(views)
        cap = cap_w - self._bias_w
        levels = {v.name: v.decision.level for v in views}
        power = {v.name: self.predict_w(v, v.levels.clock_of(levels[v.name])) for v in views}
        lowered, conflict = 0, False
        floors = {v.name: self.floor(v) for v in views}
        while sum(power.values()) > cap:
            options = [
                (self.slack(v, levels[v.name] - 1), v)
                for v in views
                if levels[v.name] > floors[v.name]
            ]
            if not options:
                break
            best_slack, best = max(options, key=lambda o: (o[0], power[o[1].name]))
            if best_slack < cfg.margin:
                conflict = True
            levels[best.name] -= 1
            power[best.name] = self.predict_w(best, best.levels.clock_of(levels[best.name]))
            lowered += 1
        total = sum(power.values())
        infeasible = total > cap
        conflict = conflict or infeasible
        self.conflict_epochs += int(conflict)
        self._last_predicted_w = total
        decisions = {}
        for v in views:
            d = v.decision
            if levels[v.name] != d.level:
                d = replace(
                    d,
                    level=levels[v.name],
                    clock_mhz=v.levels.clock_of(levels[v.name]),
                    cap=Cap.FLEET,
                    fleet_conflict=conflict,
                )
            decisions[v.name] = d
        return BudgetOutcome(decisions, total, cap, lowered, conflict, infeasible)
