"""Agent arrival times: a seeded Poisson process, or a replay of recorded times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from simulator.errors import WorkloadError


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process of ``rate_per_s`` on ``[0, duration_s)``."""
    if rate_per_s <= 0.0:
        raise WorkloadError(f"arrival rate must be positive, got {rate_per_s}")
    rng = np.random.default_rng([seed, 0xA771])
    times: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate_per_s))
        if t >= duration_s:
            return times
        times.append(t)


def replay_arrivals(path: Path, duration_s: float | None = None) -> list[float]:
    """Recorded arrival times: a JSON list of seconds, or one number per line.

    Times are shifted so the first arrival is at 0 and clipped to ``duration_s``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"cannot read arrivals file {path}: {exc}") from exc
    values: list[float] = []
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            values = [float(v) for v in json.loads(stripped)]
        else:
            for lineno, line in enumerate(text.splitlines(), start=1):
                if line.strip() and not line.lstrip().startswith("#"):
                    try:
                        values.append(float(line.split(",")[0]))
                    except ValueError:
                        raise WorkloadError(f"{path}:{lineno}: not a number: {line!r}") from None
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{path}: not a list of arrival times: {exc}") from exc
    if not values:
        raise WorkloadError(f"{path}: no arrival times")
    values.sort()
    first = values[0]
    out = [v - first for v in values]
    return [v for v in out if duration_s is None or v < duration_s]
