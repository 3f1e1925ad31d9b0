"""The KAIROS per-instance controller (paper §6.2, Algorithm 1, Eq. 6–13).

Paper-exact by default. The points the paper leaves open are named fields of
:class:`KairosConfig`; see ``docs/control-law.md`` for the reasoning:

* ``new_agent_context_tokens`` (3000): size of an agent with no completed request
  (the first author's placeholder), unless the caller supplies an estimate from
  the held request's prompt, which is preferred (it is what vLLM will allocate).
* ``pending_grace_s`` (10 s): a pending agent with no completed request has no
  Eq. 10 throughput. It is left out of the min-throughput until it has waited
  this long; after that it enters with throughput 0 (its eventual Eq. 3
  throughput is falling while it waits), which forces a boost that drains
  ongoing agents faster. Pending agents *with* history use their measured value.
* ``admit_within_beta`` (True): Algorithm 1 admits while ``U < γ·U_max`` and
  updates ``U`` after each admission, which can overshoot. §6.2.4 says an agent
  whose admission would violate ``U ≤ β·U_max`` stays pending, so by default the
  head of the queue is admitted only if ``U + C_head ≤ β·U_max`` (head-of-line:
  arrival order is never skipped). An empty instance always admits its head, or an
  agent larger than ``β·U_max`` would starve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controllers.errors import InvalidSnapshotError
from controllers.frequency import FrequencyLevels
from controllers.types import AgentView, ControlDecision, InstanceSnapshot


@dataclass(frozen=True, slots=True)
class KairosConfig:
    """Constants of Algorithm 1 with the paper's defaults (§6.2)."""

    alpha: float = 0.75
    beta: float = 0.95
    gamma: float = 0.90
    slo_tok_s: float = 20.0
    slo_boost: bool = True
    thrashing_avoidance: bool = True
    new_agent_context_tokens: int = 3000
    pending_grace_s: float = 10.0
    admit_within_beta: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise InvalidSnapshotError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 < self.gamma <= self.beta < 1.0 + 1e-12:
            raise InvalidSnapshotError(
                f"need 0 < gamma <= beta <= 1, got gamma={self.gamma} beta={self.beta}"
            )
        if self.slo_tok_s < 0.0:
            raise InvalidSnapshotError("slo_tok_s must be >= 0")
        if self.new_agent_context_tokens < 0:
            raise InvalidSnapshotError("new_agent_context_tokens must be >= 0")


def context_level(usage_tokens: int, capacity_tokens: int, levels: int, alpha: float) -> int:
    """Eq. 8–9: ``L`` if ``U ≥ α·U_max`` else ``⌊U/(α·U_max)·(L−1)⌋ + 1``."""
    if capacity_tokens <= 0:
        raise InvalidSnapshotError(f"U_max must be positive, got {capacity_tokens}")
    if levels < 1:
        raise InvalidSnapshotError("need at least one frequency level")
    threshold = alpha * capacity_tokens
    if usage_tokens >= threshold:
        return levels
    return math.floor(max(usage_tokens, 0) / threshold * (levels - 1)) + 1


class KairosController:
    """Algorithm 1: context-aware level, SLO boost, two-threshold admission."""

    name = "kairos"

    def __init__(self, levels: FrequencyLevels, config: KairosConfig | None = None) -> None:
        self.levels = levels
        self.config = config or KairosConfig()
        self.admission_control = self.config.thrashing_avoidance

    def agent_context(self, agent: AgentView) -> int:
        """``C_a``, or the documented size of an agent without a completed request."""
        if agent.context_tokens is not None:
            return agent.context_tokens
        if agent.estimated_context_tokens is not None:
            return agent.estimated_context_tokens
        return self.config.new_agent_context_tokens

    def usage(self, snapshot: InstanceSnapshot) -> int:
        """Eq. 6: ``U_k = Σ_{a ongoing} C_a`` (or the caller's measured value)."""
        if snapshot.usage_tokens is not None:
            return snapshot.usage_tokens
        return sum(self.agent_context(a) for a in snapshot.ongoing)

    def min_throughput(self, snapshot: InstanceSnapshot) -> float | None:
        """Eq. 11 over ongoing ∪ pending, with the pending-without-history rule."""
        values: list[float] = []
        for agent in snapshot.ongoing:
            tput = agent.throughput_tok_s
            if tput is not None:
                values.append(tput)
        for agent in snapshot.pending:
            tput = agent.throughput_tok_s
            if tput is not None:
                values.append(tput)
            elif self._waited(agent, snapshot.now_s) >= self.config.pending_grace_s:
                values.append(0.0)
        return min(values) if values else None

    @staticmethod
    def _waited(agent: AgentView, now_s: float) -> float:
        since = agent.waiting_since_s if agent.waiting_since_s is not None else agent.arrival_s
        return max(0.0, now_s - since)

    def admissions(
        self, snapshot: InstanceSnapshot, usage_tokens: int
    ) -> tuple[tuple[str, ...], int]:
        """Eq. 13 two-threshold admission, in arrival order, head-of-line.

        Returns the admitted agent ids and ``U`` after admitting them.
        """
        cfg = self.config
        u = usage_tokens
        if not cfg.thrashing_avoidance:
            u += sum(self.agent_context(a) for a in snapshot.pending)
            return tuple(a.agent_id for a in snapshot.pending), u
        cap = snapshot.capacity_tokens
        admitted: list[str] = []
        for agent in snapshot.pending:
            if u >= cfg.gamma * cap:
                break
            size = self.agent_context(agent)
            if cfg.admit_within_beta and u > 0 and u + size > cfg.beta * cap:
                break
            admitted.append(agent.agent_id)
            u += size
        return tuple(admitted), u

    def decide(self, snapshot: InstanceSnapshot) -> ControlDecision:
        cfg = self.config
        if snapshot.capacity_tokens <= 0:
            raise InvalidSnapshotError(f"U_max must be positive, got {snapshot.capacity_tokens}")
        usage = self.usage(snapshot)
        level = context_level(usage, snapshot.capacity_tokens, self.levels.count, cfg.alpha)
        reason = "context" if level < self.levels.count else "context-high"
        min_tput = self.min_throughput(snapshot)
        boost = cfg.slo_boost and min_tput is not None and min_tput < cfg.slo_tok_s
        if boost:
            level = self.levels.count
            reason = "slo-boost"
        admit, usage_after = self.admissions(snapshot, usage)
        defer = cfg.thrashing_avoidance and usage_after > cfg.beta * snapshot.capacity_tokens
        return ControlDecision(
            epoch=snapshot.epoch,
            level=level,
            clock_mhz=self.levels.clock_of(level),
            admit=admit,
            defer_admissions=defer,
            boost=boost,
            usage_tokens=usage,
            capacity_tokens=snapshot.capacity_tokens,
            min_throughput_tok_s=min_tput,
            reason=reason,
        )
