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
from controllers.kairos import KAIROS, KAIROS_ALG1, KairosController
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
from controllers.policy import Intents, Policy
from controllers.predictive import PredictiveConfig, PredictiveController
from controllers.reason import Cap, Reason
from controllers.registry import (
    PLACEMENTS,
    POLICIES,
    PolicySpec,
    law_for,
    levels_for,
    make_controller,
    make_placement_policy,
    rule_for,
)
from controllers.types import (
    AdmissionRule,
    AgentView,
    ControlDecision,
    Controller,
    InstanceSnapshot,
    ModelReport,
    RequestObservation,
)

__all__ = [
    "KAIROS",
    "KAIROS_ALG1",
    "PLACEMENTS",
    "POLICIES",
    "AdmissionRule",
    "AgentView",
    "BudgetOutcome",
    "Cap",
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
    "Intents",
    "InvalidConfigError",
    "InvalidSnapshotError",
    "KairosController",
    "LeastContext",
    "ModelReport",
    "NoControl",
    "OnlinePerfModel",
    "PerfModelConfig",
    "PlacementPolicy",
    "PlacementRequest",
    "Policy",
    "PolicySpec",
    "PredictiveConfig",
    "PredictiveController",
    "Reason",
    "ReassignmentConfig",
    "ReassignmentRule",
    "RequestObservation",
    "RoundRobin",
    "UnknownPolicyError",
    "law_for",
    "levels_for",
    "make_controller",
    "make_placement_policy",
    "nnls",
    "rule_for",
]
