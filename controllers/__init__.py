"""Pure decision logic shared by the daemon, the router and the simulator.

Nothing here performs I/O, reads a clock, or imports asyncio, aiohttp or Zeus:
every decision is a function of an immutable snapshot (``decide(snapshot) ->
decision``), so the exact same objects can run against real GPUs, in the router,
and under the simulator's virtual time.
"""

from controllers.baselines import FixedClock, NoControl
from controllers.confident_placement import (
    ConfidentPlacement,
    ConfidentReassignment,
    ConfidentReassignmentConfig,
)
from controllers.errors import (
    ControllerError,
    InvalidConfigError,
    InvalidSnapshotError,
    UnknownPolicyError,
)
from controllers.fleet_budget import BudgetOutcome, FleetBudget, FleetBudgetConfig, InstancePower
from controllers.frequency import FrequencyLevels
from controllers.kairos import KairosConfig, KairosController
from controllers.perf_model import OnlinePerfModel, PerfModelConfig, nnls
from controllers.placement import (
    Consolidating,
    InstanceLoad,
    LeastContext,
    PlacementPolicy,
    PlacementRequest,
    ReassignmentConfig,
    ReassignmentRule,
    RoundRobin,
)
from controllers.predictive import PredictiveConfig, PredictiveController
from controllers.registry import (
    PLACEMENTS,
    POLICIES,
    PolicySpec,
    kairos_config_for,
    levels_for,
    make_controller,
    make_placement_policy,
)
from controllers.types import (
    AgentView,
    ControlDecision,
    Controller,
    InstanceSnapshot,
    ModelReport,
    RequestObservation,
)

__all__ = [
    "PLACEMENTS",
    "POLICIES",
    "AgentView",
    "BudgetOutcome",
    "ConfidentPlacement",
    "ConfidentReassignment",
    "ConfidentReassignmentConfig",
    "Consolidating",
    "ControlDecision",
    "Controller",
    "ControllerError",
    "FixedClock",
    "FleetBudget",
    "FleetBudgetConfig",
    "FrequencyLevels",
    "InstanceLoad",
    "InstancePower",
    "InstanceSnapshot",
    "InvalidConfigError",
    "InvalidSnapshotError",
    "KairosConfig",
    "KairosController",
    "LeastContext",
    "ModelReport",
    "NoControl",
    "OnlinePerfModel",
    "PerfModelConfig",
    "PlacementPolicy",
    "PlacementRequest",
    "PolicySpec",
    "PredictiveConfig",
    "PredictiveController",
    "ReassignmentConfig",
    "ReassignmentRule",
    "RequestObservation",
    "RoundRobin",
    "UnknownPolicyError",
    "kairos_config_for",
    "levels_for",
    "make_controller",
    "make_placement_policy",
    "nnls",
]
