"""The validation's two workloads: scripted agent programs with Poisson arrivals.

* ``short`` — paper-like agents (mini-swe-agent on SWE-bench, scaled to a CPU):
  24 agents, 4–8 turns, a first prompt of about 1,600 tokens, each turn adding
  an observation of about 250 tokens and its reply of about 70, a 0.5–3 s tool
  gap; contexts of a few thousand tokens; arrivals at 0.2 agents/s.
* ``long`` — long-context sessions (a coding harness with files in its context):
  5 sessions, a first prompt of about 20,000 tokens, 5–8 turns each adding about
  1,000 tokens and a reply of about 120, a 2–6 s gap; contexts of 15–40 thousand
  tokens, each turn served mostly from the prefix cache; arrivals at one per 15 s.

Every turn extends the whole previous context (prompt and reply), as agent
harnesses do. Seeded: a program set is the same in every repeat and on every
machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    agents: int
    rate_per_s: float
    turns: tuple[int, int]
    first_prompt_median: float
    first_prompt_bounds: tuple[int, int]
    added_median: float
    added_bounds: tuple[int, int]
    output_median: float
    output_bounds: tuple[int, int]
    think_s: tuple[float, float]
    sigma: float = 0.4
    slo_tok_s: float = 20.0


WORKLOADS: dict[str, WorkloadParams] = {
    "short": WorkloadParams(
        agents=24,
        rate_per_s=0.2,
        turns=(4, 8),
        first_prompt_median=1600,
        first_prompt_bounds=(600, 3000),
        added_median=250,
        added_bounds=(50, 800),
        output_median=70,
        output_bounds=(16, 200),
        think_s=(0.5, 3.0),
    ),
    "long": WorkloadParams(
        agents=5,
        rate_per_s=1 / 15,
        turns=(5, 8),
        first_prompt_median=20000,
        first_prompt_bounds=(14000, 32000),
        added_median=1000,
        added_bounds=(200, 3000),
        output_median=120,
        output_bounds=(32, 300),
        think_s=(2.0, 6.0),
        sigma=0.3,
    ),
    # The reduced form of `make test` (tests/realvllm/test_whatif.py): a few small
    # agents that fit the tier's 4,096-token cache and 2,048-token model length.
    "tiny": WorkloadParams(
        agents=4,
        rate_per_s=0.5,
        turns=(3, 4),
        first_prompt_median=300,
        first_prompt_bounds=(150, 500),
        added_median=80,
        added_bounds=(20, 150),
        output_median=40,
        output_bounds=(16, 64),
        think_s=(0.3, 1.0),
    ),
}


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One scripted agent: its name (the same in every repeat), arrival, program."""

    name: str
    offset_s: float
    seed: int
    turns: tuple[dict[str, Any], ...]
    slo_tok_s: float

    def program(self) -> dict[str, Any]:
        """``program_agent.py``'s input."""
        return {"offset_s": self.offset_s, "seed": self.seed, "turns": list(self.turns)}


def _draw(rng: random.Random, median: float, sigma: float, bounds: tuple[int, int]) -> int:
    value = math.exp(rng.gauss(math.log(median), sigma))
    return int(min(max(value, bounds[0]), bounds[1]))


def generate(kind: str, seed: int = 1, max_context: int | None = None) -> list[AgentSpec]:
    """The ``kind`` workload's agents (``max_context`` caps a context's length)."""
    p = WORKLOADS[kind]
    rng = random.Random(f"{kind}-{seed}")
    agents = []
    t = 0.0
    for i in range(p.agents):
        if i:
            t += rng.expovariate(p.rate_per_s)
        turns: list[dict[str, Any]] = []
        prompt = _draw(rng, p.first_prompt_median, p.sigma, p.first_prompt_bounds)
        context = 0
        for k in range(rng.randint(*p.turns)):
            if k:
                prompt = context + _draw(rng, p.added_median, p.sigma, p.added_bounds)
            output = _draw(rng, p.output_median, p.sigma, p.output_bounds)
            if max_context is not None and prompt + output > max_context:
                break
            think = 0.0 if k == 0 else round(rng.uniform(*p.think_s), 3)
            turns.append(
                {
                    "prompt_tokens": prompt,
                    "shared_prefix_tokens": context,
                    "output_tokens": output,
                    "think_s": think,
                }
            )
            context = prompt + output
        agents.append(
            AgentSpec(
                f"{kind}-{i:02d}", round(t, 3), rng.randrange(2**31), tuple(turns), p.slo_tok_s
            )
        )
    return agents
