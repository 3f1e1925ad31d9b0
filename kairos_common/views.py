"""What the router observes about agents and finished requests.

These are the values that cross the wire (:mod:`kairos_common.wire`) and feed
the controllers' snapshots (:mod:`controllers.types`). They live here, in a
module that imports only the standard library, so that ``import
kairos_common.wire`` stays cheap: id-tracker must not load numpy (whose BLAS
pool starts threads) before it has blocked its signals.

Units are in the names: ``_tokens`` for KV/context sizes, ``_s`` for seconds,
``_mhz`` for clocks, ``_tok_s`` for per-agent throughput (tokens per second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    controller then sizes it with ``controllers.epoch.NEW_AGENT_CONTEXT_TOKENS`` unless
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
    prefill_tokens: int = 0
    """Prompt tokens of its requests on the engine that have produced no output yet
    and were not in its previous context (prompt − ``C_a``: what the prefix cache
    cannot supply): compute-bound work queued on the GPU (docs/control-law.md,
    point 9). 0 once the first output arrives, and for held requests."""

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
class ModelReport:
    """What a learning controller (the predictive one) says about its decision.

    Typed in place of a ``dict[str, float]`` side channel: the fleet budget reads
    the per-level SLO margins and the efficient floor, the daemon exports the
    rest as metrics, and the wire carries it between them.

    ``slo_margin_by_level`` maps a 1-based level to the predicted SLO margin of
    the slowest agents at that level (≥ 0: meets ``τ·(1 + margin)``);
    ``slo_slack`` is the margin at the decided level; ``efficient_floor_level``
    the lowest level at which a lower clock still saves energy (None: not known
    yet); ``model_error`` the online model's recent relative error (None: not
    enough data); ``model_observations`` how many requests it has learned from.
    """

    slo_margin_by_level: dict[int, float] = field(default_factory=dict)
    slo_slack: float | None = None
    efficient_floor_level: int | None = None
    model_error: float | None = None
    model_observations: int = 0

    def slo_margin(self, level: int) -> float | None:
        """The predicted SLO margin at ``level``, or None when not predicted."""
        return self.slo_margin_by_level.get(level)


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """Eq. 13 and how it weighs an instance's contexts: one value per policy.

    Defined by the policy (:mod:`controllers.policy`), carried whole in every
    decision a daemon posts (:class:`kairos_common.wire.AdmissionDecision`), and
    applied by the router on that instance while the decision is fresh; the
    simulator's fleet admission applies the same value. It lives here, in a module
    that imports only the standard library, because the wire carries it.

    ``beta`` / ``gamma``: Eq. 13 admits the head of the hold queue while
    ``U < γ·U_max`` and ``U + C_head ≤ β·U_max`` (docs/control-law.md, points 3
    and 18). ``enabled``: False for policies without thrashing avoidance (no
    control, fixed clocks, ``kairos-no-ta``), which admit every agent at once.
    ``idle_after_s``: an agent with no request in flight for this long is idle
    (point 6; making room moves only idle agents, point 15). ``evictable_after_s``:
    idle this long, its context is evictable prefix cache and holds no room
    (point 14; None: every context counts until its agent ends, as in the paper).
    ``offload_aware``: the idle contexts a CPU KV tier holds need no room either
    (point 13; False: the tier is ignored, as in the paper).
    """

    beta: float = 0.98
    gamma: float = 0.95
    enabled: bool = True
    idle_after_s: float = 10.0
    evictable_after_s: float | None = 60.0
    offload_aware: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma <= self.beta < 1.0 + 1e-12:
            raise ValueError(
                f"need 0 < gamma <= beta <= 1, got gamma={self.gamma} beta={self.beta}"
            )
        if not (math.isfinite(self.idle_after_s) and self.idle_after_s > 0.0):
            raise ValueError(f"idle_after_s must be > 0, got {self.idle_after_s}")
        window = self.evictable_after_s
        if window is not None and not (math.isfinite(window) and window > 0.0):
            raise ValueError(f"evictable_after_s must be > 0 or None, got {window}")


ADMIT_ALL = AdmissionRule(enabled=False)
"""The rule of a policy that admits every agent at once (no control, fixed clocks).
Its thresholds and windows still judge where overflow relief finds room (point 10),
which applies under every policy."""
