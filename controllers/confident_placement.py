"""Confident placement (placement ``confident``): fewer, better moves than Algorithm 3.

Algorithm 3 moves an agent every ``T`` requests whenever its instance holds
``ρ`` times the context of the least-loaded active one, even when neither is
under pressure — and every move re-prefills the agent's whole context on the
target (its KV cache stays behind). Following Vertumnus' placement cost (cache
reuse vs load vs GPU opportunity cost) and Evolving Infra's "act only on a
confident gain", a move here must pay for itself:

* the **source is under pressure** (``U_i ≥ hot·U_max``: KAIROS runs it at the
  maximum clock and it is near thrashing) — otherwise balance buys nothing;
* the **target has room** after the move (``U_j + C_a ≤ cool·U_max``) and is
  active (waking an idle GPU costs its static power);
* the **expected relief exceeds the recompute**: with the agent's remaining
  requests estimated by its completed ones (a long-lived agent is likely to
  live on), ``remaining · (u_i − u_j) ≥ recompute_factor`` where ``u`` is
  usage as a fraction of capacity — i.e. the pressure gap, summed over the
  requests it will still make, outweighs re-prefilling ``C_a`` once;
* the case **persists** for ``confirm`` consecutive evaluations of that agent.

New agents go to the lowest-index *active* instance that still has room for
them (``U + C_new ≤ θ·U_max``, accounting for the newcomer's size, which
Algorithm 2 ignores), then to an idle one, then to the least loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controllers.errors import InvalidConfigError, InvalidSnapshotError
from controllers.placement import InstanceLoad, PlacementRequest, ReassignmentDecision


@dataclass(frozen=True, slots=True)
class ConfidentPlacement:
    """Size-aware consolidation that prefers already-active instances."""

    theta: float = 0.5
    name: str = "confident"

    def place(self, request: PlacementRequest, candidates: Sequence[InstanceLoad]) -> str:
        if not candidates:
            raise InvalidSnapshotError("no candidate instance to place an agent on")
        ordered = sorted(candidates, key=lambda c: c.index)
        size = request.context_tokens
        for c in ordered:
            if c.active and c.usage_tokens + size <= self.theta * c.capacity_tokens:
                return c.name
        idle = [c for c in ordered if not c.active]
        if idle:
            return idle[0].name
        return min(candidates, key=lambda c: (c.usage_tokens, c.index)).name


@dataclass(frozen=True, slots=True)
class ConfidentReassignmentConfig:
    interval_requests: int = 8
    hot: float = 0.75
    cool: float = 0.5
    recompute_factor: float = 2.0
    confirm: int = 2

    def __post_init__(self) -> None:
        if self.interval_requests < 1 or self.confirm < 1:
            raise InvalidConfigError("interval_requests and confirm must be >= 1")
        if not 0.0 < self.cool <= self.hot <= 1.0:
            raise InvalidConfigError("need 0 < cool <= hot <= 1")


class ConfidentReassignment:
    """Moves an agent only when the relief confidently outweighs the recompute."""

    def __init__(self, config: ConfidentReassignmentConfig | None = None) -> None:
        self.config = config or ConfidentReassignmentConfig()
        self._streak: dict[str, int] = {}

    def decide_agent(
        self,
        current: str,
        steps_since_assignment: int,
        candidates: Sequence[InstanceLoad],
        *,
        agent_id: str,
        context_tokens: int,
        completed_steps: int,
    ) -> ReassignmentDecision:
        cfg = self.config
        if steps_since_assignment < cfg.interval_requests:
            return ReassignmentDecision(target=None, reset_counter=False)
        target = self._target(current, candidates, context_tokens, completed_steps)
        if target is None:
            self._streak.pop(agent_id, None)
            return ReassignmentDecision(target=None, reset_counter=True)
        streak = self._streak.get(agent_id, 0) + 1
        if streak < cfg.confirm:
            self._streak[agent_id] = streak
            return ReassignmentDecision(target=None, reset_counter=True)
        self._streak.pop(agent_id, None)
        return ReassignmentDecision(target=target, reset_counter=True)

    def forget(self, agent_id: str) -> None:
        """Drop an agent's streak (it finished or vanished)."""
        self._streak.pop(agent_id, None)

    def _target(
        self,
        current: str,
        candidates: Sequence[InstanceLoad],
        context_tokens: int,
        completed_steps: int,
    ) -> str | None:
        cfg = self.config
        here = next((c for c in candidates if c.name == current), None)
        if here is None or here.capacity_tokens <= 0:
            return None
        u_here = here.usage_tokens / here.capacity_tokens
        if u_here < cfg.hot:
            return None
        best: tuple[float, str] | None = None
        for c in candidates:
            if c.name == current or not c.active or c.capacity_tokens <= 0:
                continue
            if c.usage_tokens + context_tokens > cfg.cool * c.capacity_tokens:
                continue
            gap = u_here - c.usage_tokens / c.capacity_tokens
            if completed_steps * gap < cfg.recompute_factor:
                continue
            if best is None or gap > best[0]:
                best = (gap, c.name)
        return None if best is None else best[1]
