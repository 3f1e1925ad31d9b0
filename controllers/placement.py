"""Router-side placement policies and the reassignment rule (paper §6.3).

* :class:`Consolidating` — Algorithm 2: among instances with ``U_i < θ_cons·U_max``
  pick the lowest index (keep the others idle); if none, the least ``U_i`` (spread).
* :class:`RoundRobin`, :class:`LeastContext` — baselines with the same interface.
* :class:`ReassignmentRule` — Algorithm 3: after ``T_reassign`` requests since the
  last (re)assignment, move the agent to the *active* instance ``j`` of least
  ``U_j`` if ``U_i ≥ ρ·U_j``. Idle instances are not targets, or reassignment would
  undo consolidation.

Policies are pure: callers pass the loads of the *candidate* instances (healthy,
not draining) and a monotonically increasing request sequence number, so even
round-robin needs no hidden state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controllers.errors import InvalidConfigError, InvalidSnapshotError


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One candidate instance as the router sees it.

    ``index`` orders instances for consolidation (Algorithm 2 picks the lowest).
    ``active`` is true when the instance has at least one ongoing agent.
    """

    name: str
    index: int
    usage_tokens: int
    capacity_tokens: int
    active: bool = True


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """A new agent to place; ``sequence`` counts placements (for round-robin)."""

    agent_id: str
    sequence: int
    context_tokens: int = 0


class PlacementPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def place(self, request: PlacementRequest, candidates: Sequence[InstanceLoad]) -> str: ...


def _require(candidates: Sequence[InstanceLoad]) -> None:
    if not candidates:
        raise InvalidSnapshotError("no candidate instance to place an agent on")


def _least_loaded(candidates: Sequence[InstanceLoad]) -> InstanceLoad:
    return min(candidates, key=lambda c: (c.usage_tokens, c.index))


@dataclass(frozen=True, slots=True)
class Consolidating:
    """Algorithm 2 with ``θ_cons`` (default 0.5)."""

    theta_cons: float = 0.5
    name: str = "consolidating"

    def place(self, request: PlacementRequest, candidates: Sequence[InstanceLoad]) -> str:
        _require(candidates)
        light = [c for c in candidates if c.usage_tokens < self.theta_cons * c.capacity_tokens]
        if light:
            return min(light, key=lambda c: c.index).name
        return _least_loaded(candidates).name


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """Cycle through candidates by placement sequence number."""

    name: str = "round-robin"

    def place(self, request: PlacementRequest, candidates: Sequence[InstanceLoad]) -> str:
        _require(candidates)
        ordered = sorted(candidates, key=lambda c: c.index)
        return ordered[request.sequence % len(ordered)].name


@dataclass(frozen=True, slots=True)
class LeastContext:
    """Always the instance with the least aggregate context (pure spreading)."""

    name: str = "least-context"

    def place(self, request: PlacementRequest, candidates: Sequence[InstanceLoad]) -> str:
        _require(candidates)
        return _least_loaded(candidates).name


@dataclass(frozen=True, slots=True)
class ReassignmentConfig:
    """Algorithm 3 constants: ``T_reassign`` (8 requests) and ``ρ`` (2).

    ``enabled`` False switches Algorithm 3 off, and in the simulator overflow
    relief with it (docs/control-law.md, point 10): a research setting, the law
    always reassigns."""

    enabled: bool = True
    interval_requests: int = 8
    rho: float = 2.0


@dataclass(frozen=True, slots=True)
class ReassignmentDecision:
    """``target`` is the instance to move to (None: stay); ``reset_counter`` tells
    the caller to set the agent's step counter back to 0."""

    target: str | None
    reset_counter: bool


class ReassignmentRule:
    """Algorithm 3, evaluated when an agent issues a request.

    The caller increments the agent's step counter ``s_a`` first and passes it in.
    """

    def __init__(self, config: ReassignmentConfig | None = None) -> None:
        self.config = config or ReassignmentConfig()
        if self.config.interval_requests < 1:
            raise InvalidConfigError("interval_requests must be >= 1")

    def decide(
        self,
        current: str,
        steps_since_assignment: int,
        candidates: Sequence[InstanceLoad],
        context_tokens: int | None = None,
    ) -> ReassignmentDecision:
        """``context_tokens``, the requesting agent's context ``C_a``, is not read:
        Algorithm 3 weighs instances, not agents (the confident rule reads it)."""
        cfg = self.config
        if not cfg.enabled or steps_since_assignment < cfg.interval_requests:
            return ReassignmentDecision(target=None, reset_counter=False)
        by_name = {c.name: c for c in candidates}
        here = by_name.get(current)
        active = [c for c in candidates if c.active or c.name == current]
        if here is None or not active:
            return ReassignmentDecision(target=None, reset_counter=True)
        best = _least_loaded(active)
        if best.name != current and here.usage_tokens >= cfg.rho * best.usage_tokens:
            return ReassignmentDecision(target=best.name, reset_counter=True)
        return ReassignmentDecision(target=None, reset_counter=True)
