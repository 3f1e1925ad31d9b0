"""The fleet power budget on real daemons: the router as the coordinator.

Every instance's ``kairosd`` already posts its decision to the router each
epoch, so the router sees the whole fleet. With ``[fleet_budget] cap_w`` set,
each post also carries the instance's clock levels and what it drew last epoch
(:class:`kairos_common.wire.AdmissionDecision`); this service keeps the latest
view per instance, runs :class:`controllers.fleet_budget.FleetBudget` once per
*round*, and answers each post with that instance's clock cap
(:class:`~kairos_common.wire.DecisionAck`).

Rounds. ``FleetBudget`` learns and tracks its headroom once per call, so it
must run once per fleet epoch, not once per post: a round is run when an
instance posts again after having posted in the current round (so the fastest
daemon sets the pace, and with equal epochs there is one round per epoch). A
post in between gets its cap from the latest round. A cap is only an upper
bound: an instance the round did not lower gets no cap.

Who counts. At each round, instances whose decision is still valid and that
can change clocks (they sent ``levels_mhz``) are *controllable*; the others are
counted pessimistically, as power reserved out of the cap:

* a daemon that can measure but not control (observe mode): its measured power;
* a stale daemon (no valid decision: it died, or lost the router, and then runs
  with no cap — a daemon that exits resets its clocks): its last measured power
  scaled to its top clock, until the instance is removed from the router;
* a daemon that never reported power, or a backend without a daemon: not
  counted (unknown), listed as such in :meth:`FleetBudgetService.state`.

The budget cannot lower what it cannot control, so reserved power beyond the
cap makes the round infeasible and reported as a conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog

from controllers.fleet_budget import BudgetOutcome, FleetBudget, FleetBudgetConfig, InstancePower
from controllers.frequency import FrequencyLevels
from controllers.reason import Reason
from controllers.types import ControlDecision
from kairos_common.wire import AdmissionDecision
from router.config import FleetBudgetSettings
from router.metrics import FleetMetrics

log = structlog.get_logger("kairos.router.fleet_budget")


@dataclass(frozen=True, slots=True)
class _View:
    """One instance's latest decision, when it arrived and until when it counts."""

    decision: AdmissionDecision
    received_s: float
    valid_until_s: float

    def fresh(self, now_s: float) -> bool:
        return now_s < self.valid_until_s

    @property
    def controllable(self) -> bool:
        c = self.decision.clock
        return bool(c.levels_mhz) and c.clock_mhz is not None

    def power(self, name: str) -> InstancePower:
        d, c, m = self.decision, self.decision.clock, self.decision.measured
        levels = FrequencyLevels(c.levels_mhz)
        clock = c.clock_mhz if c.clock_mhz is not None else levels.max_mhz
        level = levels.level_of(clock)
        decision = ControlDecision(
            epoch=d.epoch,
            level=level,
            clock_mhz=levels.clock_of(level),
            reason=Reason.DAEMON,
            boost=c.boost,
            min_throughput_tok_s=c.min_throughput_tok_s,
            report=c.report,
        )
        return InstancePower(name, levels, decision, m.power_w, m.clock_mhz)


@dataclass(frozen=True, slots=True)
class _Round:
    """What one allocation decided, kept for acks between rounds and for ``state``."""

    at_s: float
    caps_mhz: dict[str, int]
    kinds: dict[str, str]
    predicted_w: dict[str, float]
    reserved_w: float
    outcome: BudgetOutcome | None
    conflict: bool
    infeasible: bool


class FleetBudgetService:
    """Latest view per instance + one ``FleetBudget``; answers each decision post."""

    def __init__(
        self,
        settings: FleetBudgetSettings,
        *,
        slo_tok_s: float,
        clock: Callable[[], float],
        metrics: FleetMetrics | None = None,
        stale_after_s: float | None = None,
    ) -> None:
        if settings.cap_w is None:
            raise ValueError("FleetBudgetService needs fleet_budget.cap_w")
        self.cap_w = settings.cap_w
        self.config = FleetBudgetConfig(
            cap_w=settings.cap_w,
            slo_tok_s=slo_tok_s,
            margin=settings.margin,
            correction_gain=settings.correction_gain,
            quantile=settings.quantile,
        )
        self.budget = FleetBudget(self.config)
        self.clock = clock
        self.metrics = metrics
        self.stale_after_s = stale_after_s
        self._views: dict[str, _View] = {}
        self._posted: set[str] = set()
        self._last: _Round | None = None
        self.rounds = 0
        self.conflict_rounds = 0
        if metrics is not None:
            metrics.cap_w.set(self.cap_w)

    # ------------------------------------------------------------------ posts
    def on_decision(
        self, name: str, decision: AdmissionDecision, instances: Collection[str]
    ) -> tuple[int | None, bool]:
        """Record ``name``'s decision, run a round if one is due; ``(cap, conflict)``.

        ``instances`` are the router's current instance names: views of removed
        instances are forgotten.
        """
        now = self.clock()
        valid_s = self.stale_after_s or decision.valid_for_s
        self._views[name] = _View(decision, now, now + valid_s)
        for gone in set(self._views) - set(instances):
            del self._views[gone]
        if self._last is None or name in self._posted:
            self._allocate(now)
            self._posted = {name}
        else:
            self._posted.add(name)
        return self.cap_for(name)

    def cap_for(self, name: str) -> tuple[int | None, bool]:
        """``name``'s cap from the latest round (None if it was not lowered)."""
        last = self._last
        if last is None:
            return None, False
        return last.caps_mhz.get(name), last.conflict

    # -------------------------------------------------------------- a round
    def _reserve_w(self, view: _View, fresh: bool) -> float | None:
        """Power counted for an instance the budget cannot lower (None: unknown)."""
        m, levels = view.decision.measured, view.decision.clock.levels_mhz
        if m.power_w is None:
            return None
        if fresh or not m.clock_mhz:
            return m.power_w
        top = max(levels) if levels else m.clock_mhz
        ratio = self.budget.shape(top) / self.budget.shape(m.clock_mhz)
        return m.power_w * max(ratio, 1.0)

    def _allocate(self, now: float) -> None:
        controllable: list[InstancePower] = []
        kinds: dict[str, str] = {}
        predicted: dict[str, float] = {}
        reserved = 0.0
        for name, view in sorted(self._views.items()):
            fresh = view.fresh(now)
            if fresh and view.controllable:
                controllable.append(view.power(name))
                kinds[name] = "controlled"
                continue
            watts = self._reserve_w(view, fresh)
            if watts is None:
                kinds[name] = "unknown"
                continue
            kinds[name] = "fixed" if fresh else "stale"
            predicted[name] = watts
            reserved += watts
        outcome = None
        caps: dict[str, int] = {}
        if controllable:
            outcome = self.budget.allocate(controllable, reserved_w=reserved)
            for v in controllable:
                d = outcome.decisions[v.name]
                predicted[v.name] = self.budget.predict_w(v, d.clock_mhz)
                if d.level < v.decision.level:
                    caps[v.name] = d.clock_mhz
                    kinds[v.name] = "capped"
        infeasible = outcome.infeasible if outcome else reserved > self.cap_w
        conflict = (outcome.conflict if outcome else False) or infeasible
        self._finish(_Round(now, caps, kinds, predicted, reserved, outcome, conflict, infeasible))

    def _finish(self, rnd: _Round) -> None:
        was = self._last.conflict if self._last is not None else False
        self._last = rnd
        self.rounds += 1
        self.conflict_rounds += int(rnd.conflict)
        total_w = sum(rnd.predicted_w.values())
        if rnd.conflict and not was:
            log.warning(
                "fleet_budget_conflict_started",
                cap_w=self.cap_w,
                predicted_w=round(total_w, 1),
                reserved_w=round(rnd.reserved_w, 1),
                infeasible=rnd.infeasible,
                capped=sorted(rnd.caps_mhz),
            )
        elif was and not rnd.conflict:
            log.info("fleet_budget_conflict_ended", cap_w=self.cap_w, predicted_w=round(total_w, 1))
        m = self.metrics
        if m is None:
            return
        m.rounds.inc()
        m.conflict_rounds.inc(int(rnd.conflict))
        m.conflict.set(int(rnd.conflict))
        m.predicted_w.set(total_w)
        m.reserved_w.set(rnd.reserved_w)
        measured = self.measured_power_w()
        if measured is not None:
            m.measured_w.set(measured)
        for name in rnd.kinds:
            m.clock_cap.labels(name).set(rnd.caps_mhz.get(name, 0))

    # ---------------------------------------------------------------- state
    def measured_power_w(self) -> float | None:
        """Sum of every known instance's last reported epoch power (None: none yet)."""
        powers = [
            v.decision.measured.power_w
            for v in self._views.values()
            if v.decision.measured.power_w is not None
        ]
        return sum(powers) if powers else None

    def state(self, instances: Collection[str]) -> dict[str, Any]:
        """The budget as ``GET /kairos/v1/fleet`` shows it."""
        now = self.clock()
        last = self._last
        out: dict[str, Any] = {
            "enabled": True,
            "cap_w": self.cap_w,
            "measured_power_w": self.measured_power_w(),
            "rounds": self.rounds,
            "conflict_rounds": self.conflict_rounds,
            "predicted_power_w": None,
            "reserved_w": 0.0,
            "allocation_cap_w": None,
            "lowered_levels": 0,
            "conflict": False,
            "infeasible": False,
            "last_round_age_s": None,
        }
        if last is not None:
            out.update(
                predicted_power_w=sum(last.predicted_w.values()),
                reserved_w=last.reserved_w,
                allocation_cap_w=last.outcome.effective_cap_w if last.outcome else None,
                lowered_levels=last.outcome.lowered_levels if last.outcome else 0,
                conflict=last.conflict,
                infeasible=last.infeasible,
                last_round_age_s=round(now - last.at_s, 3),
            )
        out["instances"] = {name: self._instance_json(name, now) for name in sorted(instances)}
        return out

    def _instance_json(self, name: str, now: float) -> dict[str, Any]:
        view = self._views.get(name)
        if view is None:
            return {"kind": "no-daemon", "clock_cap_mhz": None}
        last = self._last
        d = view.decision
        return {
            "kind": last.kinds.get(name, "pending") if last else "pending",
            "fresh": view.fresh(now),
            "decided_clock_mhz": d.clock.clock_mhz,
            "clock_cap_mhz": last.caps_mhz.get(name) if last else None,
            "measured_power_w": d.measured.power_w,
            "measured_clock_mhz": d.measured.clock_mhz,
            "predicted_power_w": last.predicted_w.get(name) if last else None,
        }
