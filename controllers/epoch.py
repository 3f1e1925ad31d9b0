"""One control epoch as every stage of a policy reads it: weighed once, then read.

:func:`weigh` turns an :class:`~controllers.types.InstanceSnapshot` into an
:class:`Epoch` by the policy's :class:`~kairos_common.views.AdmissionRule`:
``U`` (Eq. 6), the part of it that stands for room in HBM (points 13–14), whether
contexts must drain (context pressure, point 6), the contexts of the agents at
work, the queued prefill and every agent's Eq. 10 throughput. The stages of
:mod:`controllers.stages` and the admission step then read these values; none
of them recomputes one, so a value means the same in every stage.

Two constants of the law live here, as the open points decided them
(docs/control-law.md): the size of an agent before its first response (point 1)
and the grace before a held agent without history enters the SLO minimum
(point 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from controllers.admission import Activity, activity
from controllers.errors import InvalidSnapshotError
from controllers.frequency import FrequencyLevels
from controllers.types import AgentView, InstanceSnapshot
from kairos_common.views import AdmissionRule

NEW_AGENT_CONTEXT_TOKENS = 3000
"""Point 1: ``C_a`` of an agent with no completed request and no estimate of its
first prompt (the first author's placeholder). The router sizes a newcomer by its
first request's body instead wherever it can."""
PENDING_GRACE_S = 10.0
"""Point 2: a held agent with no completed request has no Eq. 10 throughput; after
this long (two 5 s epochs) it enters the SLO minimum at 0 tok/s, so that a boost
drains the contexts that hold it."""


def agent_context(agent: AgentView) -> int:
    """``C_a``, else the estimate of its held first prompt, else the placeholder."""
    if agent.context_tokens is not None:
        return agent.context_tokens
    if agent.estimated_context_tokens is not None:
        return agent.estimated_context_tokens
    return NEW_AGENT_CONTEXT_TOKENS


def waited_s(agent: AgentView, now_s: float) -> float:
    """How long a held agent has waited (since its wait began, else its arrival)."""
    since = agent.waiting_since_s if agent.waiting_since_s is not None else agent.arrival_s
    return max(0.0, now_s - since)


@dataclass(frozen=True, slots=True)
class Epoch:
    """Everything a policy's stages read at one epoch, computed by :func:`weigh`."""

    snapshot: InstanceSnapshot
    levels: FrequencyLevels
    rule: AdmissionRule
    usage_tokens: int
    """``U_k`` (Eq. 6): every ongoing context, or the caller's measured value."""
    resident_tokens: int
    """``U`` where it stands for room in HBM: less the evictable contexts (point 14)
    and the idle ones the CPU KV tier holds (point 13). What Eq. 13 admits against
    and what context pressure weighs."""
    held_tokens: int
    """``U`` less the evictable contexts only: what Eq. 9 reads under pressure
    (contexts must drain; the tier does not drain them, an agent away does not
    come back sooner for a higher clock)."""
    active_contexts: tuple[int, ...]
    """The contexts of the agents at work: a request in flight or one that ended
    within ``idle_after_s`` (point 6; unknown activity counts as active)."""
    offload_tokens: int
    """The CPU KV tier the law counts on (0: none, ignored, or a measured ``U``)."""
    pressed: bool
    """Must contexts drain? Agents are held here or ``U_res ≥ γ·U_max`` (point 6)."""
    throughputs: tuple[tuple[float, bool], ...]
    """Eq. 10 per agent, with whether it was measured (False: a held agent without
    history past the policy's grace, :data:`PENDING_GRACE_S`, entered at 0)."""

    @property
    def measured(self) -> bool:
        """``U`` was measured from vLLM: no per-agent activity to weigh it by."""
        return self.snapshot.usage_tokens is not None

    @property
    def capacity_tokens(self) -> int:
        return self.snapshot.capacity_tokens

    @property
    def prefill_tokens(self) -> int:
        """Uncached prompt tokens waiting for their first output (point 9)."""
        return sum(a.prefill_tokens for a in self.snapshot.ongoing)

    @property
    def min_throughput_tok_s(self) -> float | None:
        """Eq. 11 over ongoing ∪ pending (with point 2's rule), as reported."""
        return min((v for v, _ in self.throughputs), default=None)


def weigh(
    snapshot: InstanceSnapshot,
    levels: FrequencyLevels,
    rule: AdmissionRule,
    pending_grace_s: float = PENDING_GRACE_S,
) -> Epoch:
    """The :class:`Epoch` of ``snapshot`` under ``rule``'s windows and tier."""
    cap = snapshot.capacity_tokens
    if cap <= 0:
        raise InvalidSnapshotError(f"U_max must be positive, got {cap}")
    measured = snapshot.usage_tokens is not None
    now = snapshot.now_s
    contexts = [agent_context(a) for a in snapshot.ongoing]
    usage = snapshot.usage_tokens if snapshot.usage_tokens is not None else sum(contexts)
    tier = 0 if measured or not rule.offload_aware else max(0, snapshot.offload_tokens)
    window = None if measured else rule.evictable_after_s
    active: list[int] = []
    idle = 0
    for agent, tokens in zip(snapshot.ongoing, contexts, strict=True):
        state = activity(agent.in_flight, agent.last_active_s, now, rule.idle_after_s, window)
        if state is Activity.ACTIVE:
            active.append(tokens)
        elif state is Activity.IDLE:
            idle += tokens
    at_work = sum(active)
    held = usage if window is None else at_work + idle
    if tier <= 0 and window is None:
        resident = usage
    else:
        resident = at_work + idle - min(idle, max(0, tier - at_work))
    return Epoch(
        snapshot=snapshot,
        levels=levels,
        rule=rule,
        usage_tokens=usage,
        resident_tokens=resident,
        held_tokens=held,
        active_contexts=tuple(active),
        offload_tokens=tier,
        pressed=bool(snapshot.pending) or resident >= rule.gamma * cap,
        throughputs=_throughputs(snapshot, pending_grace_s),
    )


def _throughputs(
    snapshot: InstanceSnapshot, pending_grace_s: float
) -> tuple[tuple[float, bool], ...]:
    values: list[tuple[float, bool]] = []
    for agent in snapshot.ongoing:
        tput = agent.throughput_tok_s
        if tput is not None:
            values.append((tput, True))
    for agent in snapshot.pending:
        tput = agent.throughput_tok_s
        if tput is not None:
            values.append((tput, True))
        elif waited_s(agent, snapshot.now_s) >= pending_grace_s:
            values.append((0.0, False))
    return tuple(values)
