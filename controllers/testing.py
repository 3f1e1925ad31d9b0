"""Builders of what a policy sees: agents and instance snapshots, for tests and scripts.

One builder per concept, so that "an agent with a request in flight", "an agent
idle for 30 s" or "a newcomer held with a 50K-token prompt" reads the same in
every test of the law (and means the same :class:`~controllers.types.AgentView`).
Shipped in the package, like :mod:`kairos_common.testing` and :mod:`router.testing`.
"""

from __future__ import annotations

from controllers.frequency import FrequencyLevels
from controllers.types import AgentView, InstanceSnapshot

FIVE_LEVELS = FrequencyLevels((600, 800, 1000, 1200, 1400))
"""``L`` = 5 clocks, the memory knee (900 MHz in the simulator's H100) between the
second and the third: the levels the law's unit tests reason with."""


def agent(
    agent_id: str,
    context_tokens: int | None = None,
    *,
    estimate: int | None = None,
    arrival_s: float = 0.0,
    decode_tokens: int = 0,
    llm_time_s: float = 0.0,
    steps: int = 0,
    in_flight: bool = False,
    last_active_s: float | None = None,
    prefill_tokens: int = 0,
    waiting_since_s: float | None = None,
) -> AgentView:
    """An agent as the router reports it (every field named, the rest defaults)."""
    return AgentView(
        agent_id,
        arrival_s,
        context_tokens=context_tokens,
        estimated_context_tokens=estimate,
        decode_tokens=decode_tokens,
        llm_time_s=llm_time_s,
        completed_steps=steps,
        waiting_since_s=waiting_since_s,
        in_flight=in_flight,
        last_active_s=last_active_s,
        prefill_tokens=prefill_tokens,
    )


def active(agent_id: str, context_tokens: int, *, prefill_tokens: int = 0) -> AgentView:
    """An agent with a request in flight (at work: point 6)."""
    return agent(agent_id, context_tokens, in_flight=True, prefill_tokens=prefill_tokens)


def idle(agent_id: str, context_tokens: int, *, now_s: float, idle_s: float) -> AgentView:
    """An agent whose last request ended ``idle_s`` before ``now_s`` (a tool call)."""
    return agent(agent_id, context_tokens, last_active_s=now_s - idle_s)


def throughput(agent_id: str, tok_s: float, context_tokens: int = 1_000) -> AgentView:
    """An agent whose Eq. 10 throughput is ``tok_s`` over two completed requests."""
    return agent(agent_id, context_tokens, decode_tokens=round(tok_s * 10), llm_time_s=10.0,
                 steps=2)  # fmt: skip


def newcomer(agent_id: str, estimate: int, *, now_s: float, waited_s: float = 1.0) -> AgentView:
    """A held agent without history, sized by its first prompt, waiting ``waited_s``."""
    return agent(
        agent_id, estimate=estimate, arrival_s=now_s - waited_s, waiting_since_s=now_s - waited_s
    )


def snapshot(
    *ongoing: AgentView,
    pending: tuple[AgentView, ...] = (),
    now_s: float = 0.0,
    capacity_tokens: int = 100_000,
    epoch: int = 1,
    usage_tokens: int | None = None,
    offload_tokens: int = 0,
    clock_mhz: int | None = None,
) -> InstanceSnapshot:
    """One instance at ``now_s``: its ongoing agents, held ones in arrival order."""
    return InstanceSnapshot(
        now_s=now_s,
        epoch=epoch,
        capacity_tokens=capacity_tokens,
        ongoing=ongoing,
        pending=pending,
        usage_tokens=usage_tokens,
        clock_mhz=clock_mhz,
        offload_tokens=offload_tokens,
    )
