"""Build a per-instance controller from its operator-facing policy name.

Names: ``kairos`` (the default law), ``kairos-alg1`` (Algorithm 1 per instance as
the paper states it), ``kairos-no-ta`` (thrashing avoidance off, for Fig. 10–11),
``predictive`` (online-model DVFS, ``docs/beyond.md``), ``no-control``,
``fixed:MHZ``.

A policy is one row of :data:`POLICIES` (and a placement one of
:data:`PLACEMENTS`): its builder, the law it runs (a
:class:`~controllers.policy.Policy`: admission rule and stages, defined in
:mod:`controllers.kairos`) and whether it sees every supported clock. A new
policy is a new row, and the daemon, the router, the simulator and reports
accept its name with no other change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from controllers.baselines import FixedClock, NoControl
from controllers.confident_placement import ConfidentPlacement
from controllers.errors import InvalidConfigError, UnknownPolicyError
from controllers.frequency import DEFAULT_FLOOR_MHZ, DEFAULT_NUM_LEVELS, FrequencyLevels
from controllers.kairos import KAIROS, KAIROS_ALG1, KAIROS_NO_TA, PREDICTIVE_NETS, KairosController
from controllers.perf_model import PerfModelConfig
from controllers.placement import Consolidating, LeastContext, PlacementPolicy, RoundRobin
from controllers.policy import Intents, Policy
from controllers.predictive import PredictiveConfig, PredictiveController
from controllers.types import ADMIT_ALL, AdmissionRule, Controller

Builder = Callable[[str, FrequencyLevels, Policy | None, PredictiveConfig], Controller]
"""``(name, levels, the law it runs, predictive constants) -> controller``."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One policy: how to build it and what it needs.

    ``law``: the per-instance law it runs (None: a baseline that admits everyone
    and sets its clock by no law). ``argument``: the name takes a value after a
    colon (``fixed:900``), written as ``argument`` in :data:`POLICY_NAMES`.
    ``all_clocks``: the policy sees every supported clock, not the configured
    range (``fixed:900`` must really lock 900 MHz, no-control must run the true
    maximum).
    """

    build: Builder
    law: Policy | None = None
    argument: str | None = None
    all_clocks: bool = False


def _kairos(
    _name: str, levels: FrequencyLevels, law: Policy | None, _p: PredictiveConfig
) -> Controller:
    assert law is not None
    return KairosController(levels, law)


def _predictive(
    _name: str, levels: FrequencyLevels, law: Policy | None, p: PredictiveConfig
) -> Controller:
    assert law is not None
    return PredictiveController(levels, law, p)


def _no_control(
    _name: str, levels: FrequencyLevels, _law: Policy | None, _p: PredictiveConfig
) -> Controller:
    return NoControl(levels)


def _fixed(
    name: str, levels: FrequencyLevels, _law: Policy | None, _p: PredictiveConfig
) -> Controller:
    try:
        mhz = int(name.partition(":")[2])
    except ValueError:
        raise UnknownPolicyError(f"fixed clock needs MHz, e.g. fixed:900; got {name!r}") from None
    return FixedClock(levels, mhz)


POLICIES: Mapping[str, PolicySpec] = MappingProxyType(
    {
        "kairos": PolicySpec(_kairos, KAIROS),
        "kairos-alg1": PolicySpec(_kairos, KAIROS_ALG1),
        "kairos-no-ta": PolicySpec(_kairos, KAIROS_NO_TA),
        "predictive": PolicySpec(_predictive, PREDICTIVE_NETS),
        "no-control": PolicySpec(_no_control, all_clocks=True),
        "fixed": PolicySpec(_fixed, argument="MHZ", all_clocks=True),
    }
)
"""Every per-instance policy, by the name before any ``:``."""

RENAMED: Mapping[str, str] = MappingProxyType(
    {
        "kairos-paper": "kairos-alg1: Algorithm 1 per instance as the paper states it; the "
        "fleet rules of docs/control-law.md points 8, 10, 15 and 16 apply to every policy",
    }
)
"""Policy names that no longer exist, with what to use instead."""

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
    if key in RENAMED:
        raise UnknownPolicyError(f"policy {name!r} was renamed {RENAMED[key]}")
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


Variant = Mapping[str, Any]
"""Constants changed in code, by field name (research only: ``kairos[busy_floor_mhz=1020]``)."""


def _split(variant: Variant | None, predictive: bool) -> tuple[dict[str, Any], PredictiveConfig]:
    """``variant``'s law changes, and the predictive constants with its own applied
    (a field of :class:`PredictiveConfig`, or ``perf.FIELD`` of its online model's)."""
    changes = dict(variant or {})
    config = PredictiveConfig()
    if not predictive:
        return changes, config
    own = {f.name for f in dataclasses.fields(PredictiveConfig)} - {"perf"}
    mine = {k: changes.pop(k) for k in list(changes) if k in own}
    perf_fields = {f.name for f in dataclasses.fields(PerfModelConfig)}
    perf = {k.removeprefix("perf."): changes.pop(k) for k in list(changes) if k.startswith("perf.")}
    unknown = sorted(set(perf) - perf_fields)
    if unknown:
        raise InvalidConfigError(f"predictive's model has no setting {', '.join(unknown)}")
    try:
        config = dataclasses.replace(config, **mine)
        config = dataclasses.replace(config, perf=dataclasses.replace(config.perf, **perf))
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(str(exc)) from exc
    return changes, config


def law_for(
    name: str,
    intents: Intents | None = None,
    variant: Variant | None = None,
    speedup: float = 1.0,
) -> Policy | None:
    """The law policy ``name`` runs, with the operator's ``intents`` and a research
    ``variant`` applied, on a clock ``speedup`` times faster than its own seconds
    (the accelerated CPU stack; :meth:`Policy.time_scaled`). None for the
    baselines, which run no law."""
    spec = policy_spec(name)
    changes, _ = _split(variant, spec.build is _predictive)
    if spec.law is None:
        if changes:
            raise InvalidConfigError(f"policy {name!r} has no settings to vary")
        return None
    law = spec.law.varied((intents or Intents()).changes())
    law = law.varied(changes) if changes else law
    return law.time_scaled(speedup)


def rule_for(
    name: str,
    intents: Intents | None = None,
    variant: Variant | None = None,
    speedup: float = 1.0,
) -> AdmissionRule:
    """The admission rule of policy ``name``: what the router applies on an instance
    whose daemon is stale or absent, and what the simulator's fleet admits by."""
    law = law_for(name, intents, variant, speedup)
    return ADMIT_ALL if law is None else law.rule


def make_controller(
    name: str,
    levels: FrequencyLevels,
    intents: Intents | None = None,
    variant: Variant | None = None,
    speedup: float = 1.0,
) -> Controller:
    """The controller named ``name`` over ``levels``, with the operator's ``intents``
    (τ, β, γ), a research ``variant`` (constants changed in code) and the clock's
    ``speedup`` (:func:`law_for`)."""
    spec = policy_spec(name)
    _, predictive = _split(variant, spec.build is _predictive)
    return spec.build(name, levels, law_for(name, intents, variant, speedup), predictive)


def make_placement_policy(name: str, theta_cons: float = 0.5) -> PlacementPolicy:
    """Placement by name (:data:`PLACEMENTS`)."""
    build = PLACEMENTS.get(name)
    if build is None:
        raise UnknownPolicyError(
            f"unknown placement policy {name!r}; choose one of {', '.join(PLACEMENT_NAMES)}"
        )
    return build(theta_cons)
