"""Build a per-instance controller from its operator-facing policy name.

Names: ``kairos`` (activity-aware clock, docs/control-law.md point 6),
``kairos-paper`` (the paper-exact Algorithm 1), ``kairos-no-ta`` (thrashing
avoidance off, for Fig. 10–11), ``predictive`` (online-model DVFS,
``docs/beyond.md``), ``no-control``, ``fixed:MHZ``.

A policy is one row of :data:`POLICIES` (and a placement one of
:data:`PLACEMENTS`): its builder, the KAIROS constants it changes and whether it
sees every supported clock. A new policy is a new row, and the daemon, the
simulator and reports accept its name with no other change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from controllers.baselines import FixedClock, NoControl
from controllers.confident_placement import ConfidentPlacement
from controllers.errors import UnknownPolicyError
from controllers.frequency import DEFAULT_FLOOR_MHZ, DEFAULT_NUM_LEVELS, FrequencyLevels
from controllers.kairos import KairosConfig, KairosController
from controllers.placement import Consolidating, LeastContext, PlacementPolicy, RoundRobin
from controllers.predictive import PredictiveConfig, PredictiveController
from controllers.types import Controller

Builder = Callable[[str, FrequencyLevels, KairosConfig, PredictiveConfig | None], Controller]
"""``(name, levels, kairos constants, predictive knobs) -> controller``."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One policy: how to build it and what it needs.

    ``argument``: the name takes a value after a colon (``fixed:900``), written
    as ``argument`` in :data:`POLICY_NAMES`. ``all_clocks``: the policy sees every
    supported clock, not the configured range (``fixed:900`` must really lock 900
    MHz, no-control must run the true maximum). ``kairos_changes``: KAIROS
    constants the policy overrides (its admission rule in the router uses them too).
    """

    build: Builder
    argument: str | None = None
    all_clocks: bool = False
    kairos_changes: Mapping[str, Any] = field(default_factory=dict)


def _kairos(
    name: str, levels: FrequencyLevels, cfg: KairosConfig, _p: PredictiveConfig | None
) -> Controller:
    ctrl = KairosController(levels, cfg)
    ctrl.name = name
    return ctrl


def _predictive(
    _name: str, levels: FrequencyLevels, cfg: KairosConfig, p: PredictiveConfig | None
) -> Controller:
    return PredictiveController(levels, cfg, p)


def _no_control(
    _name: str, levels: FrequencyLevels, cfg: KairosConfig, _p: PredictiveConfig | None
) -> Controller:
    return NoControl(levels, cfg.new_agent_context_tokens)


def _fixed(
    name: str, levels: FrequencyLevels, cfg: KairosConfig, _p: PredictiveConfig | None
) -> Controller:
    try:
        mhz = int(name.partition(":")[2])
    except ValueError:
        raise UnknownPolicyError(f"fixed clock needs MHz, e.g. fixed:900; got {name!r}") from None
    return FixedClock(levels, mhz, cfg.new_agent_context_tokens)


POLICIES: Mapping[str, PolicySpec] = MappingProxyType(
    {
        "kairos": PolicySpec(_kairos),
        "kairos-paper": PolicySpec(
            _kairos,
            kairos_changes={
                "activity_aware": False,
                "boost_reachable_only": False,
                "prefill_boost_tokens": None,
                "busy_floor_mhz": None,
                "offload_aware": False,
                "evictable_after_s": None,
                "context_window_s": None,
                "beta": 0.95,
                "gamma": 0.90,
            },
        ),
        "kairos-no-ta": PolicySpec(_kairos, kairos_changes={"thrashing_avoidance": False}),
        # Its own model prices prefill per level (docs/control-law.md, point 9),
        # finds the efficient floor (its elasticity rule; point 11) and steps down
        # only when confident (its damping; KAIROS's level is only its ceiling,
        # which the window of point 17 left 0.2–0.4 point worse off).
        "predictive": PolicySpec(
            _predictive,
            kairos_changes={
                "prefill_boost_tokens": None,
                "busy_floor_mhz": None,
                "context_window_s": None,
            },
        ),
        "no-control": PolicySpec(_no_control, all_clocks=True),
        "fixed": PolicySpec(_fixed, argument="MHZ", all_clocks=True),
    }
)
"""Every per-instance policy, by the name before any ``:``."""

POLICY_NAMES = tuple(f"{k}:{s.argument}" if s.argument else k for k, s in POLICIES.items())

PLACEMENTS: Mapping[str, Callable[[float], PlacementPolicy]] = MappingProxyType(
    {
        "consolidating": lambda theta: Consolidating(theta_cons=theta),
        "round-robin": lambda _theta: RoundRobin(),
        "least-context": lambda _theta: LeastContext(),
        "confident": lambda theta: ConfidentPlacement(theta=theta),
    }
)
"""Every placement policy by name; the argument is the consolidation threshold θ."""

PLACEMENT_NAMES = tuple(PLACEMENTS)


def policy_spec(name: str) -> PolicySpec:
    """The row for ``name`` (``fixed:900`` is the ``fixed`` row); UnknownPolicyError if none."""
    key, colon, _arg = name.partition(":")
    spec = POLICIES.get(key)
    if spec is None or bool(colon) != (spec.argument is not None):
        raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return spec


def levels_for(
    policy: str,
    supported_mhz: Iterable[int],
    *,
    floor_mhz: int | None = DEFAULT_FLOOR_MHZ,
    ceiling_mhz: int | None = None,
    num_levels: int | None = DEFAULT_NUM_LEVELS,
) -> FrequencyLevels:
    """The clock levels ``policy`` controls, from the clocks a GPU supports.

    Adaptive policies use the configured range and number of levels; policies
    marked ``all_clocks`` see every supported clock.
    """
    spec = POLICIES.get(policy.partition(":")[0])
    if spec is not None and spec.all_clocks:
        return FrequencyLevels.from_supported(supported_mhz)
    return FrequencyLevels.from_supported(
        supported_mhz, floor_mhz=floor_mhz, ceiling_mhz=ceiling_mhz, num_levels=num_levels
    )


def kairos_config_for(name: str, kairos: KairosConfig | None = None) -> KairosConfig:
    """The KAIROS constants policy ``name`` runs with (the router's admission rule
    for that deployment uses the same)."""
    cfg = kairos or KairosConfig()
    spec = POLICIES.get(name.partition(":")[0])
    if spec is None or not spec.kairos_changes:
        return cfg
    return dataclasses.replace(cfg, **spec.kairos_changes)


def make_controller(
    name: str,
    levels: FrequencyLevels,
    kairos: KairosConfig | None = None,
    predictive: PredictiveConfig | None = None,
) -> Controller:
    """Return the controller named ``name`` over ``levels`` (``predictive`` only
    configures the ``predictive`` policy)."""
    spec = policy_spec(name)
    return spec.build(name, levels, kairos_config_for(name, kairos), predictive)


def make_placement_policy(name: str, theta_cons: float = 0.5) -> PlacementPolicy:
    """Placement by name (:data:`PLACEMENTS`)."""
    build = PLACEMENTS.get(name)
    if build is None:
        raise UnknownPolicyError(
            f"unknown placement policy {name!r}; choose one of {', '.join(PLACEMENT_NAMES)}"
        )
    return build(theta_cons)
