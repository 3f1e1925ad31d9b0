"""Baseline policies with the controller interface: no control and a fixed clock.

Both admit every pending agent at once (no thrashing avoidance), which is what a
plain vLLM deployment does; they exist so the simulator, the daemon and reports
compare KAIROS against them on identical arrivals.
"""

from __future__ import annotations

from controllers.epoch import NEW_AGENT_CONTEXT_TOKENS
from controllers.errors import InvalidConfigError
from controllers.frequency import FrequencyLevels
from controllers.reason import Reason
from controllers.types import ADMIT_ALL, AdmissionRule, ControlDecision, InstanceSnapshot


def _usage(snapshot: InstanceSnapshot) -> int:
    if snapshot.usage_tokens is not None:
        return snapshot.usage_tokens
    return sum(
        a.context_tokens if a.context_tokens is not None else NEW_AGENT_CONTEXT_TOKENS
        for a in snapshot.ongoing
    )


class NoControl:
    """Maximum clock, admit everyone: the paper's "no frequency control"."""

    name = "no-control"
    rule: AdmissionRule = ADMIT_ALL

    def __init__(self, levels: FrequencyLevels) -> None:
        self.levels = levels

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        return ControlDecision(
            epoch=snapshot.epoch,
            level=self.levels.count,
            clock_mhz=self.levels.max_mhz,
            admit=tuple(a.agent_id for a in snapshot.pending),
            usage_tokens=_usage(snapshot),
            capacity_tokens=snapshot.capacity_tokens,
            reason=Reason.NO_CONTROL,
        )


class FixedClock:
    """A locked clock (snapped to the nearest supported level), admit everyone."""

    rule: AdmissionRule = ADMIT_ALL

    def __init__(self, levels: FrequencyLevels, clock_mhz: int) -> None:
        if clock_mhz <= 0:
            raise InvalidConfigError(f"fixed clock must be positive, got {clock_mhz}")
        self.levels = levels
        self.clock_mhz = levels.snap(clock_mhz)
        self.level = levels.clocks_mhz.index(self.clock_mhz) + 1
        self.name = f"fixed:{self.clock_mhz}"

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        return ControlDecision(
            epoch=snapshot.epoch,
            level=self.level,
            clock_mhz=self.clock_mhz,
            admit=tuple(a.agent_id for a in snapshot.pending),
            usage_tokens=_usage(snapshot),
            capacity_tokens=snapshot.capacity_tokens,
            reason=Reason.FIXED,
        )
