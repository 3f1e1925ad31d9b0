"""Helpers shared by the controller tests (imported, not fixtures)."""

from __future__ import annotations

import numpy as np

from controllers.types import RequestObservation


def truth_tpot(clock_mhz: float, running: float, ctx: float) -> float:
    """A synthetic GPU (not the simulator's): memory knee at 900 MHz."""
    s_m = 1.0 + 0.05 * (1785 / clock_mhz - 1) if clock_mhz >= 900 else 1785 / clock_mhz * 0.52
    return 0.004 + (0.006 + 0.0004 * running + 0.01 * ctx / 1e5) * s_m


def truth_ttft(clock_mhz: float, uncached: float, cached: float) -> float:
    pairs = uncached * cached + uncached * (uncached + 1) / 2
    return 0.01 + (2e-5 * uncached + 2e-9 * pairs) * 1785 / clock_mhz


def synthetic_observations(n: int, seed: int = 0, t0: float = 0.0) -> list[RequestObservation]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        f = int(rng.choice((660, 825, 975, 1140, 1305, 1470, 1620, 1785)))
        running = int(rng.integers(1, 30))
        ctx = int(rng.integers(10_000, 400_000))
        prompt = int(rng.integers(1000, 30_000))
        cached = int(prompt * rng.uniform(0, 0.98))
        out.append(
            RequestObservation(
                t_s=t0 + i,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=int(rng.integers(20, 400)),
                ttft_s=truth_ttft(f, prompt - cached, cached),
                decode_s_per_token=truth_tpot(f, running, ctx),
                running=running,
                active_context_tokens=ctx,
                clock_mhz=f,
            )
        )
    return out
