"""The fleet power budget's clock cap, as one daemon holds and applies it.

When the router coordinates a fleet budget (``[fleet_budget] cap_w``), the ack
of each decision may carry ``clock_cap_mhz``. The daemon applies
``min(decision, cap)`` snapped *down* to one of its levels — the cap is a hard
limit and wins even over the SLO boost — and honours it only for the validity
of the decision it answered: if the router stops answering, the cap lapses with
it and the stale-input fail-safe runs uncapped (the daemon cannot see the rest
of the fleet, and an unseen SLO miss is the worse failure).
"""

from __future__ import annotations

import dataclasses

import structlog

from controllers.frequency import FrequencyLevels
from controllers.reason import Cap
from controllers.types import ControlDecision
from kairos_common.wire import DecisionAck

log = structlog.get_logger("kairos.kairosd.clock_cap")


class ClockCap:
    """The cap in force (``None``: none), its deadline and the router's conflict flag."""

    def __init__(self) -> None:
        self.cap_mhz: int | None = None
        self.conflict = False
        self._until_s = 0.0

    def take(self, ack: DecisionAck, now_s: float, valid_for_s: float, epoch: int) -> None:
        """Hold the router's answer for as long as the decision it answers is valid."""
        if (ack.clock_cap_mhz is None) != (self.cap_mhz is None):  # log changes, not every move
            log.info("fleet_clock_cap", clock_cap_mhz=ack.clock_cap_mhz, epoch=epoch)
        self.cap_mhz = ack.clock_cap_mhz
        self.conflict = ack.budget_conflict
        self._until_s = now_s + valid_for_s

    def expire(self, now_s: float, router_stale: bool, epoch: int) -> None:
        """Drop the cap once its decision is no longer valid or the router is stale."""
        if self.cap_mhz is not None and (now_s >= self._until_s or router_stale):
            log.info("fleet_clock_cap_lapsed", clock_cap_mhz=self.cap_mhz, epoch=epoch)
            self.cap_mhz, self.conflict = None, False

    def apply(
        self, decision: ControlDecision, reason: str, levels: FrequencyLevels
    ) -> tuple[ControlDecision, str] | None:
        """``min(decision, cap)`` snapped down to a level; ``None`` when the cap
        does not lower the decision."""
        cap = self.cap_mhz
        if cap is None or decision.clock_mhz <= cap:
            return None
        level = levels.level_of(cap)
        capped = dataclasses.replace(
            decision,
            level=level,
            clock_mhz=levels.clock_of(level),
            cap=Cap.BUDGET,
        )
        return capped, f"budget-cap:{reason}"
