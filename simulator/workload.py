"""Agent programs: what the simulator replays, independent of where they came from.

An :class:`AgentProgram` is one agent (a sub-agent is its own agent with a
parent link): its turns in order. Each turn carries the full prompt length, the
leading tokens it shares with the agent's previous context (what the prefix
cache can reuse), the tokens it generates, and the tool/think gap that precedes
it. Closed loop: turn ``i`` is released ``think_s`` after turn ``i−1`` completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Turn:
    prompt_tokens: int
    shared_prefix_tokens: int
    output_tokens: int
    think_s: float


@dataclass(frozen=True, slots=True)
class AgentProgram:
    """One agent's turns; ``offset_s`` is a sub-agent's start after its parent's."""

    agent_id: str
    turns: tuple[Turn, ...]
    parent_id: str | None = None
    offset_s: float = 0.0
    children: tuple[AgentProgram, ...] = ()

    @property
    def decode_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    @property
    def max_context_tokens(self) -> int:
        return max((t.prompt_tokens + t.output_tokens for t in self.turns), default=0)


class Workload(Protocol):
    """A source of agent programs; ``program(i)`` is the i-th arriving top-level
    agent. Deterministic in ``i`` so every policy replays identical agents."""

    name: str

    def program(self, index: int) -> AgentProgram: ...
