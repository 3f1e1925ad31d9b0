"""Immutable snapshot and decision types shared by every controller.

``AgentView``, ``RequestObservation`` and ``agent_throughput_tok_s`` are defined in
:mod:`kairos_common.views` (standard library only, so the wire contract can use
them without loading the controllers) and re-exported here.

Units are in the names: ``_tokens`` for KV/context sizes, ``_s`` for seconds,
``_mhz`` for clocks, ``_tok_s`` for per-agent throughput (tokens per second).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from controllers.frequency import FrequencyLevels
from controllers.reason import Cap, Reason
from controllers.reason import label as reason_label
from kairos_common.views import (
    ADMIT_ALL,
    AdmissionRule,
    AgentView,
    ModelReport,
    RequestObservation,
    agent_throughput_tok_s,
)

__all__ = [
    "ADMIT_ALL",
    "AdmissionRule",
    "AgentView",
    "ControlDecision",
    "Controller",
    "InstanceSnapshot",
    "ModelReport",
    "RequestObservation",
    "agent_throughput_tok_s",
]


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """Everything a per-instance controller sees at control epoch ``epoch``.

    ``ongoing`` are admitted agents; ``pending`` are held agents in arrival order.
    ``capacity_tokens`` is ``U_max`` (vLLM's KV token capacity). ``usage_tokens``
    overrides ``U_k`` when the caller measures it directly (standalone daemon mode,
    from vLLM's KV usage); otherwise ``U_k`` is the sum of ongoing contexts.
    """

    now_s: float
    epoch: int
    capacity_tokens: int
    ongoing: tuple[AgentView, ...] = ()
    pending: tuple[AgentView, ...] = ()
    usage_tokens: int | None = None
    clock_mhz: int | None = None
    power_w: float | None = None
    observations: tuple[RequestObservation, ...] = ()
    """Recent finished requests (optional; only learning controllers use them)."""
    offload_tokens: int = 0
    """Tokens the engine's CPU KV tier holds (vLLM ``--kv-offloading-size``); 0: none.
    Idle contexts the tier holds come back as a copy, not a recompute, so they need
    no room in HBM (:func:`controllers.admission.resident_tokens`)."""


@dataclass(frozen=True, slots=True)
class ControlDecision:
    """What a controller decided for one epoch: clock, admissions, and why.

    ``reason`` names the stage that set the level (:class:`~controllers.reason.Reason`);
    ``warmup`` and ``cap`` qualify it (:attr:`label` is the text reports show).
    ``rule`` is the policy's Eq. 13, which the daemon carries whole to the router.
    """

    epoch: int
    level: int
    clock_mhz: int
    reason: Reason
    admit: tuple[str, ...] = ()
    defer_admissions: bool = False
    boost: bool = False
    usage_tokens: int = 0
    capacity_tokens: int = 0
    min_throughput_tok_s: float | None = None
    report: ModelReport | None = None
    """A learning controller's own numbers (per-level SLO margins, model error)."""
    fleet_conflict: bool = False
    """The fleet budget lowered this decision and meeting its cap needed an
    SLO-unsafe step (or was impossible)."""
    offload_tokens: int = 0
    """The snapshot's CPU KV tier, passed on so the router sizes admission by the
    same resident usage (:func:`controllers.admission.resident_tokens`)."""
    level_tokens: int | None = None
    """The context Eq. 9 set the level from: the working set, or its recent mean
    while nothing presses (docs/control-law.md, points 6 and 17). None for
    policies without Eq. 9 (fixed clocks, no control)."""
    rule: AdmissionRule = ADMIT_ALL
    """The policy's admission rule (Eq. 13 and how it weighs contexts)."""
    warmup: bool = False
    """A learning controller followed KAIROS's decision while its model warms up."""
    cap: Cap | None = None
    """A power cap lowered the clock below the policy's choice."""

    @property
    def label(self) -> str:
        """``reason`` with its qualifiers, as power reports and metrics show it."""
        return reason_label(self.reason, warmup=self.warmup, cap=self.cap)


class Controller(Protocol):
    """A per-instance policy: ``decide(snapshot) -> decision``, no I/O."""

    name: str
    levels: FrequencyLevels

    @property
    def rule(self) -> AdmissionRule:
        """The policy's admission rule; ``rule.enabled`` is False when it admits every
        agent at once (no thrashing avoidance): the router must then not hold agents
        either, not even for one epoch."""
        ...

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision: ...
