"""Helpers shared by the end-to-end tests (imported, not fixtures)."""

from __future__ import annotations

import pytest

from simulator.demo_run import PolicyResult
from simulator.workload import AgentProgram, Turn


def require_valid(*results: PolicyResult) -> None:
    """Fail with the self-check's message when a run's lag made its numbers invalid."""
    for res in results:
        assert res.lag is not None
        if not res.lag.valid:
            pytest.fail(f"{res.policy}: {res.lag.verdict()}", pytrace=False)


def agent_program(
    name: str, prompt: int, growth: int, turns: int, think_s: float, output: int = 100
) -> AgentProgram:
    """An agent whose context grows by ``growth`` tokens a turn (fully reused prefix)."""
    out = []
    for k in range(turns):
        p = prompt + k * growth
        shared = 0 if k == 0 else p - growth + output
        out.append(
            Turn(
                prompt_tokens=p,
                shared_prefix_tokens=min(shared, p),
                output_tokens=output,
                think_s=think_s,
            )
        )
    return AgentProgram(agent_id=name, turns=tuple(out))
