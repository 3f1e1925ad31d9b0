"""Synthetic stand-in for the paper's workload: mini-swe-agent on SWE-bench
Verified served by Qwen3-Coder-30B (paper §3.1–3.2, Fig. 2–3, 13).

Targets from the paper: turns per agent heavy-tailed, mean ≈ 37, 25th
percentile 18 (§A.4), from 1 up to thousands (§3.2: 1–2518); a few-thousand-token
initial prompt; contexts of tens of thousands of tokens with a long tail to
hundreds of thousands (Fig. 13, traces README: 7–80k typical); tool times of
seconds. Every distribution is a named parameter of :class:`PaperWorkloadParams`
(documented with its value in ``docs/simulator.md``; the generated statistics are
checked in ``tests/simulator/test_workloads.py`` and printed by
``scripts/calibrate.py --workload-stats``).

Per agent ``a`` (independent draws from a generator seeded by ``(seed, index)``):

* turns ``N``: with probability ``p_runaway`` a runaway loop, log-uniform on
  ``[runaway_min, runaway_max]`` — a stuck loop of short commands, whose outputs
  and observations are scaled down (``runaway_out_median``, ``runaway_obs_scale``);
  otherwise ``round(LogNormal(μ_N, σ_N))`` ≥ 1;
* initial prompt ``P₀ ~ LogNormal(ln prompt_median, prompt_sigma)``;
* per-agent observation scale ``s_a ~ LogNormal(0, agent_sigma)`` (some agents
  cat big files, some run short commands); runaway loops use ``runaway_obs_scale``;
* per turn: output ``d ~ LogNormal(ln out_median, out_sigma)`` clipped to
  ``[out_min, out_max]``; next observation ``Δp ~ s_a·LogNormal(ln obs_median,
  obs_sigma)`` clipped to ``[obs_min, obs_max]``; tool time before the next turn
  ``~ LogNormal(ln tool_median_s, tool_sigma)`` clipped to ``[tool_min_s, tool_max_s]``;
* ``prompt_i = prompt_{i−1} + d_{i−1} + Δp_i`` with the whole previous context
  shared; the agent stops early when a prompt would exceed ``max_context_tokens``
  (the model's window — mini-swe-agent ends on a context-length error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.errors import WorkloadError
from simulator.workload import AgentProgram, Turn


@dataclass(frozen=True, slots=True)
class PaperWorkloadParams:
    turns_mu: float = 3.32
    turns_sigma: float = 0.68
    p_runaway: float = 0.001
    runaway_min: int = 300
    runaway_max: int = 2500
    runaway_obs_scale: float = 0.1
    runaway_out_median: float = 30.0
    prompt_median: float = 3600.0
    prompt_sigma: float = 0.25
    agent_sigma: float = 0.5
    out_median: float = 100.0
    out_sigma: float = 0.7
    out_min: int = 8
    out_max: int = 4096
    obs_median: float = 100.0
    obs_sigma: float = 1.1
    obs_min: int = 16
    obs_max: int = 3_000
    tool_median_s: float = 1.5
    tool_sigma: float = 1.0
    tool_min_s: float = 0.05
    tool_max_s: float = 120.0
    max_context_tokens: int = 262_144

    def __post_init__(self) -> None:
        if self.turns_sigma <= 0 or self.out_median <= 0 or self.prompt_median <= 0:
            raise WorkloadError("paper workload: medians and sigmas must be positive")
        if not 0.0 <= self.p_runaway < 1.0:
            raise WorkloadError("paper workload: p_runaway must be in [0, 1)")


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return np.asarray(rng.lognormal(math.log(median), sigma, size), dtype=float)


class PaperWorkload:
    """Seeded generator; ``program(i)`` is deterministic in ``(seed, i)``."""

    def __init__(self, seed: int, params: PaperWorkloadParams | None = None) -> None:
        self.seed = seed
        self.params = params or PaperWorkloadParams()
        self.name = "paper"

    def program(self, index: int) -> AgentProgram:
        p = self.params
        rng = np.random.default_rng([self.seed, 0x5EED, index])
        runaway = bool(rng.random() < p.p_runaway)
        if runaway:
            lo, hi = math.log(p.runaway_min), math.log(p.runaway_max)
            n = round(math.exp(rng.uniform(lo, hi)))
            scale = p.runaway_obs_scale
            out_median = p.runaway_out_median
        else:
            n = max(1, round(float(rng.lognormal(p.turns_mu, p.turns_sigma))))
            scale = float(rng.lognormal(0.0, p.agent_sigma))
            out_median = p.out_median
        prompt0 = max(256, round(float(rng.lognormal(math.log(p.prompt_median), p.prompt_sigma))))
        outs = np.clip(np.rint(_lognormal(rng, out_median, p.out_sigma, n)), p.out_min, p.out_max)
        obs = np.clip(
            np.rint(scale * _lognormal(rng, p.obs_median, p.obs_sigma, n)), p.obs_min, p.obs_max
        )
        tools = np.clip(
            _lognormal(rng, p.tool_median_s, p.tool_sigma, n), p.tool_min_s, p.tool_max_s
        )
        turns: list[Turn] = []
        prompt, shared = prompt0, 0
        # Plain Python numbers (same values): indexing numpy arrays per turn was slow.
        out_l, obs_l, tool_l = outs.tolist(), obs.tolist(), tools.tolist()
        limit = p.max_context_tokens
        for i in range(n):
            out = int(out_l[i])
            if prompt + out > limit:
                break
            think = 0.0 if i == 0 else tool_l[i]
            turns.append(Turn(prompt, shared, out, think))
            shared = prompt + out
            prompt = shared + int(obs_l[i])
        if not turns:
            turns.append(Turn(prompt0, 0, int(out_l[0]), 0.0))
        return AgentProgram(agent_id=f"paper-{self.seed}-{index}", turns=tuple(turns))


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    agents: int
    mean_turns: float
    p25_turns: float
    median_turns: float
    max_turns: int
    mean_initial_prompt: float
    median_max_context: float
    p90_max_context: float
    max_max_context: int
    mean_output_per_turn: float
    mean_tool_s: float

    def rows(self) -> list[tuple[str, str, str]]:
        """(statistic, generated, paper target) rows for tables."""
        return [
            ("agents", f"{self.agents}", "-"),
            ("mean turns/agent", f"{self.mean_turns:.1f}", "≈37 (§3.2)"),
            ("P25 turns/agent", f"{self.p25_turns:.0f}", "18 (§A.4)"),
            ("max turns/agent", f"{self.max_turns}", "up to 2518 (§3.2)"),
            ("mean initial prompt (tok)", f"{self.mean_initial_prompt:.0f}", "a few thousand"),
            ("median max context (tok)", f"{self.median_max_context:.0f}", "tens of thousands"),
            ("P90 max context (tok)", f"{self.p90_max_context:.0f}", "7–80k typical (README)"),
            ("max max context (tok)", f"{self.max_max_context}", "hundreds of thousands"),
            ("mean output/turn (tok)", f"{self.mean_output_per_turn:.0f}", "-"),
            ("mean tool time (s)", f"{self.mean_tool_s:.2f}", "seconds"),
        ]


def workload_stats(workload: PaperWorkload, agents: int) -> WorkloadStats:
    """Statistics of the first ``agents`` programs (what the tests check)."""
    progs = [workload.program(i) for i in range(agents)]
    turns = np.array([len(p.turns) for p in progs], dtype=float)
    maxctx = np.array([p.max_context_tokens for p in progs], dtype=float)
    outs = [t.output_tokens for p in progs for t in p.turns]
    tools = [t.think_s for p in progs for t in p.turns[1:]]
    return WorkloadStats(
        agents=agents,
        mean_turns=float(turns.mean()),
        p25_turns=float(np.percentile(turns, 25)),
        median_turns=float(np.median(turns)),
        max_turns=int(turns.max()),
        mean_initial_prompt=float(np.mean([p.turns[0].prompt_tokens for p in progs])),
        median_max_context=float(np.median(maxctx)),
        p90_max_context=float(np.percentile(maxctx, 90)),
        max_max_context=int(maxctx.max()),
        mean_output_per_turn=float(np.mean(outs)),
        mean_tool_s=float(np.mean(tools)) if tools else 0.0,
    )
