"""Pure decision logic shared by the daemon, the router and the simulator.

Nothing here performs I/O, reads a clock, or imports asyncio, aiohttp or Zeus:
every decision is a function of an immutable snapshot (``decide(snapshot) ->
decision``), so the exact same objects can run against real GPUs, in the router,
and under the simulator's virtual time.
"""

from controllers.baselines import FixedClock, NoControl
from controllers.errors import ControllerError, InvalidSnapshotError, UnknownPolicyError
from controllers.frequency import FrequencyLevels
from controllers.kairos import KairosConfig, KairosController
from controllers.placement import (
    Consolidating,
    InstanceLoad,
    LeastContext,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentConfig,
    ReassignmentRule,
    RoundRobin,
    make_placement,
)
from controllers.registry import levels_for, make_controller
from controllers.types import (
    AgentView,
    ControlDecision,
    Controller,
    InstanceSnapshot,
)

__all__ = [
    "AgentView",
    "Consolidating",
    "ControlDecision",
    "Controller",
    "ControllerError",
    "FixedClock",
    "FrequencyLevels",
    "InstanceLoad",
    "InstanceSnapshot",
    "InvalidSnapshotError",
    "KairosConfig",
    "KairosController",
    "LeastContext",
    "NoControl",
    "PlacementPolicy",
    "PlacementRequest",
    "ReassignmentConfig",
    "ReassignmentRule",
    "RoundRobin",
    "UnknownPolicyError",
    "levels_for",
    "make_controller",
    "make_placement",
]
