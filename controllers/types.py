"""Immutable snapshot and decision types shared by every controller.

Units are in the names: ``_tokens`` for KV/context sizes, ``_s`` for seconds,
``_mhz`` for clocks, ``_tok_s`` for per-agent throughput (tokens per second).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from controllers.frequency import FrequencyLevels


def agent_throughput_tok_s(
    decode_tokens: int, llm_time_s: float, completed_steps: int
) -> float | None:
    """Eq. 3/10: Σ decode tokens / Σ request latency, or None without history.

    The one definition the controllers, the router's ledger and the simulator share.
    """
    if completed_steps <= 0 or llm_time_s <= 0.0:
        return None
    return decode_tokens / llm_time_s


@dataclass(frozen=True, slots=True)
class AgentView:
    """What a controller may know about one agent at an epoch.

    ``context_tokens`` is ``C_a``: prompt + completion tokens of the agent's latest
    completed request, or ``None`` when it has not completed one yet (the
    controller then sizes it with ``KairosConfig.new_agent_context_tokens`` unless
    ``estimated_context_tokens`` is given, e.g. from the held request's prompt).

    ``decode_tokens`` and ``llm_time_s`` are the sums of Eq. 3/10 over completed
    requests: generated tokens and request latency (arrival at the router to last
    byte, including time held pending; tool time excluded).

    ``in_flight`` and ``last_active_s`` tell whether the agent is working or
    sitting in a tool call / think gap; an activity-aware clock counts only the
    contexts of working agents (docs/control-law.md, point 6).
    """

    agent_id: str
    arrival_s: float
    context_tokens: int | None = None
    estimated_context_tokens: int | None = None
    decode_tokens: int = 0
    llm_time_s: float = 0.0
    completed_steps: int = 0
    waiting_since_s: float | None = None
    in_flight: bool = False
    """A request of this agent is being served (or held) right now."""
    last_active_s: float | None = None
    """When its latest request ended (None: unknown, counted as active)."""

    @property
    def throughput_tok_s(self) -> float | None:
        """Eq. 10: Σ decode tokens / Σ request latency, or None without history."""
        return agent_throughput_tok_s(self.decode_tokens, self.llm_time_s, self.completed_steps)


@dataclass(frozen=True, slots=True)
class RequestObservation:
    """One finished request as the router/vLLM saw it (input to the online model).

    ``t_s`` is when it finished (the caller's clock, used to de-duplicate);
    ``ttft_s`` is arrival at the engine to first token; ``decode_s_per_token``
    the mean inter-token time after it; ``running`` the number of requests the
    engine was running and ``active_context_tokens`` the instance's aggregate
    context when it finished; ``clock_mhz`` the SM clock it ran at.
    """

    t_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    decode_s_per_token: float
    running: int
    active_context_tokens: int
    clock_mhz: int


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


@dataclass(frozen=True, slots=True)
class ControlDecision:
    """What a controller decided for one epoch: clock, admissions, and why."""

    epoch: int
    level: int
    clock_mhz: int
    admit: tuple[str, ...] = ()
    defer_admissions: bool = False
    boost: bool = False
    usage_tokens: int = 0
    capacity_tokens: int = 0
    min_throughput_tok_s: float | None = None
    reason: str = ""
    extras: dict[str, float] = field(default_factory=dict)


class Controller(Protocol):
    """A per-instance policy: ``decide(snapshot) -> decision``, no I/O."""

    name: str
    levels: FrequencyLevels
    admission_control: bool
    """False when the policy admits every agent at once (no thrashing avoidance):
    the router must then not hold agents either, not even for one epoch."""

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision: ...
