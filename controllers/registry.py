"""Build a per-instance controller from its operator-facing policy name.

Names: ``kairos`` (activity-aware clock, docs/control-law.md point 6),
``kairos-paper`` (the paper-exact Algorithm 1), ``kairos-no-ta`` (thrashing
avoidance off, for Fig. 10–11),
``predictive`` (online-model DVFS, ``docs/beyond.md``),
``no-control``, ``fixed:MHZ``. Later policies register here too, so the daemon,
the simulator and reports accept the same names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from controllers.baselines import FixedClock, NoControl
from controllers.confident_placement import ConfidentPlacement
from controllers.errors import UnknownPolicyError
from controllers.frequency import DEFAULT_FLOOR_MHZ, DEFAULT_NUM_LEVELS, FrequencyLevels
from controllers.kairos import KairosConfig, KairosController
from controllers.placement import PlacementPolicy, make_placement
from controllers.predictive import PredictiveConfig, PredictiveController
from controllers.types import Controller

PLACEMENT_NAMES = ("consolidating", "round-robin", "least-context", "confident")
POLICY_NAMES = ("kairos", "kairos-paper", "kairos-no-ta", "predictive", "no-control", "fixed:MHZ")


def levels_for(
    policy: str,
    supported_mhz: Iterable[int],
    *,
    floor_mhz: int | None = DEFAULT_FLOOR_MHZ,
    ceiling_mhz: int | None = None,
    num_levels: int | None = DEFAULT_NUM_LEVELS,
) -> FrequencyLevels:
    """The clock levels ``policy`` controls, from the clocks a GPU supports.

    Adaptive policies use the configured range and number of levels; the
    fixed-clock and no-control baselines see every supported clock, so
    ``fixed:900`` really locks 900 MHz and no-control runs the true maximum.
    """
    if policy.startswith("fixed:") or policy == "no-control":
        return FrequencyLevels.from_supported(supported_mhz)
    return FrequencyLevels.from_supported(
        supported_mhz, floor_mhz=floor_mhz, ceiling_mhz=ceiling_mhz, num_levels=num_levels
    )


def kairos_config_for(name: str, kairos: KairosConfig | None = None) -> KairosConfig:
    """The KAIROS constants policy ``name`` runs with (the router's admission rule
    for that deployment uses the same)."""
    cfg = kairos or KairosConfig()
    if name == "kairos-paper":
        return dataclasses.replace(cfg, activity_aware=False, boost_reachable_only=False)
    if name == "kairos-no-ta":
        return dataclasses.replace(cfg, thrashing_avoidance=False)
    return cfg


def make_controller(
    name: str,
    levels: FrequencyLevels,
    kairos: KairosConfig | None = None,
    predictive: PredictiveConfig | None = None,
) -> Controller:
    """Return the controller named ``name`` over ``levels`` (``predictive`` only
    configures the ``predictive`` policy)."""
    cfg = kairos_config_for(name, kairos)
    if name in ("kairos", "kairos-paper", "kairos-no-ta"):
        ctrl = KairosController(levels, cfg)
        ctrl.name = name
        return ctrl
    if name == "predictive":
        return PredictiveController(levels, cfg, predictive)
    if name == "no-control":
        return NoControl(levels, cfg.new_agent_context_tokens)
    if name.startswith("fixed:"):
        raw = name.removeprefix("fixed:")
        try:
            mhz = int(raw)
        except ValueError:
            raise UnknownPolicyError(
                f"fixed clock needs MHz, e.g. fixed:900; got {name!r}"
            ) from None
        return FixedClock(levels, mhz, cfg.new_agent_context_tokens)
    raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def make_placement_policy(name: str, theta_cons: float = 0.5) -> PlacementPolicy:
    """Placement by name, including ``confident`` (``controllers.confident_placement``)."""
    if name == "confident":
        return ConfidentPlacement(theta=theta_cons)
    if name not in PLACEMENT_NAMES:
        raise UnknownPolicyError(
            f"unknown placement policy {name!r}; choose one of {', '.join(PLACEMENT_NAMES)}"
        )
    return make_placement(name, theta_cons)
