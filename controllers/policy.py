"""A per-instance policy as a value: its admission rule and its list of stages.

A :class:`Policy` is everything that distinguishes one law from another: the
:class:`~kairos_common.views.AdmissionRule` it weighs contexts and admits by
(Eq. 13, points 3, 13, 14, 18), and the :mod:`controllers.stages` its decision
path runs through, in order. :class:`~controllers.kairos.KairosController` runs
one; the definitions of ``kairos``, ``kairos-alg1`` and the rest are in
:mod:`controllers.kairos`.

Operators state intents (:class:`Intents`: τ, β, γ) and research varies any
stage constant in code (:meth:`Policy.varied`); both address a constant by its
field name, wherever in the policy it lives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.epoch import PENDING_GRACE_S
from controllers.errors import InvalidConfigError
from controllers.stages import Stage
from kairos_common.views import AdmissionRule


@dataclass(frozen=True, slots=True)
class Intents:
    """What an operator states about the law (``kairosd``'s ``[kairos]`` table).

    Each unset value is the policy's own (``kairos`` admits to β = 0.98 and stops at
    γ = 0.95, ``kairos-alg1`` at the paper's 0.95 and 0.90; τ = 20 tok/s). Every
    other constant of a law is its stages' (:mod:`controllers.kairos`).
    """

    slo_tok_s: float | None = None
    """The SLO τ of Eq. 4 (tokens/s) the boost defends."""
    beta: float | None = None
    """Eq. 13: a newcomer is admitted only while it fits under ``β·U_max``."""
    gamma: float | None = None
    """Eq. 13: admission stops at ``γ·U_max``; context pressure starts there."""

    def changes(self) -> dict[str, float]:
        """The values set, by field name (:meth:`Policy.varied`)."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }


@dataclass(frozen=True, slots=True)
class Policy:
    """A named law: the rule it admits by and the stages its level goes through."""

    name: str
    rule: AdmissionRule
    stages: tuple[Stage, ...]
    pending_grace_s: float = PENDING_GRACE_S
    """Point 2: how long a held agent without history stays out of the SLO minimum."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pending_grace_s) and self.pending_grace_s >= 0.0):
            raise InvalidConfigError(f"pending_grace_s must be >= 0, got {self.pending_grace_s}")

    def setting(self, name: str) -> Any:
        """The constant ``name`` of the first component that has it (KeyError if none)."""
        if name == "pending_grace_s":
            return self.pending_grace_s
        for part in (self.rule, *self.stages):
            if name in _fields(part):
                return getattr(part, name)
        raise KeyError(name)

    def settings(self) -> list[str]:
        """Every constant :meth:`varied` can change."""
        names = {n for part in (self.rule, *self.stages) for n in _fields(part)}
        return sorted(names | {"pending_grace_s"})

    def time_scaled(self, speedup: float) -> Policy:
        """This policy on a clock ``speedup`` times faster: every time constant (its
        ``*_s`` fields: activity, eviction and Eq. 9 windows, the held agents'
        grace) divided by it. The accelerated CPU stack runs the law so."""
        if speedup == 1.0:
            return self
        scaled = {
            name: value / speedup
            for name in self.settings()
            if _seconds(name) and (value := self.setting(name)) is not None
        }
        return self.varied(scaled)

    def varied(self, changes: Mapping[str, Any] | None = None, **more: Any) -> Policy:
        """This policy with constants changed, each found by field name in the rule
        or the stages (every component that has it). ``None`` for a field that is
        not optional drops that stage (``prefill_boost_tokens=None``: no prefill
        boost). An unknown name is an :class:`InvalidConfigError` naming the known
        ones; the stages check their own values."""
        items = {**(changes or {}), **more}
        grace = items.pop("pending_grace_s", self.pending_grace_s)
        unknown = set(items) - set(self.settings())
        if unknown:
            raise InvalidConfigError(
                f"policy {self.name!r} has no setting {', '.join(sorted(unknown))}; "
                f"it has {', '.join(self.settings())}"
            )
        rule = _replace(self.rule, items)
        stages: list[Stage] = []
        for stage in self.stages:
            mine = {k: v for k, v in items.items() if k in _fields(stage)}
            if any(v is None and not _optional(stage, k) for k, v in mine.items()):
                continue  # a required constant set to None: the stage goes
            stages.append(_replace(stage, mine))
        try:
            return dataclasses.replace(self, rule=rule, stages=tuple(stages), pending_grace_s=grace)
        except TypeError as exc:
            raise InvalidConfigError(f"pending_grace_s: {exc}") from exc


def _seconds(name: str) -> bool:
    """Is ``name`` a time in seconds (``_s``, not a rate such as ``_tok_s``)?"""
    return name.endswith("_s") and not name.endswith("_tok_s")


def _fields(part: object) -> set[str]:
    return {f.name for f in dataclasses.fields(part)}  # type: ignore[arg-type]


def _optional(part: object, name: str) -> bool:
    field = next(f for f in dataclasses.fields(part) if f.name == name)  # type: ignore[arg-type]
    return "None" in str(field.type)


def _replace(part: Any, items: Mapping[str, Any]) -> Any:
    """``part`` with those of ``items`` it has, all at once (β and γ are checked
    together)."""
    mine = {k: v for k, v in items.items() if k in _fields(part)}
    if not mine:
        return part
    try:
        return dataclasses.replace(part, **mine)
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(f"{', '.join(sorted(mine))}: {exc}") from exc
