"""Fitting the step model to probe timings by non-negative least squares.

The simulator's engine prices a step (:mod:`simulator.timing`) as a sum of terms,
each a coefficient times a count the schedule knows::

    t_step = cpu_overhead_s                       · 1
           + seq_overhead_s                       · sequences in the step
           + prefill_s_per_token                  · prefill tokens computed
           + attn_s_per_pair                      · attention (query, key) pairs
           + kv_s_per_token                       · context tokens the decodes read
           + request_overhead_s                   · requests admitted (first time)
           + request_s_per_prompt_token           · their prompt tokens

(the GPU presets' weight-streaming roofline is not fitted: at one clock and a
model whose weights stream in well under a step it is part of the constant). A
probe's measured time is a sum of known steps, so it is one linear equation in
the coefficients; many probes of different shapes determine them. The fit is
the Evolving Infra execution model's: non-negative least squares (a coefficient
cannot be negative: every term is work), here on relative errors, so a 20 ms
decode window and a 10 s prefill count alike. What it prints are its residuals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from whatif.errors import FitError

FEATURES: tuple[str, ...] = (
    "steps",
    "seq_steps",
    "prefill_tokens",
    "attn_pairs",
    "decode_context_tokens",
    "requests",
    "request_prompt_tokens",
)
"""What a probe's steps add up to, in the coefficients' order (:data:`COEFFICIENTS`)."""
COEFFICIENTS: tuple[str, ...] = (
    "cpu_overhead_s",
    "seq_overhead_s",
    "prefill_s_per_token",
    "attn_s_per_pair",
    "kv_s_per_token",
    "request_overhead_s",
    "request_s_per_prompt_token",
)


@dataclass(frozen=True, slots=True)
class Observation:
    """One probe: what its steps add up to (:data:`FEATURES`) and the time measured."""

    kind: str
    label: str
    features: tuple[float, ...]
    measured_s: float

    def __post_init__(self) -> None:
        if len(self.features) != len(FEATURES):
            raise FitError(f"observation {self.label}: {len(self.features)} features")
        if not (math.isfinite(self.measured_s) and self.measured_s > 0):
            raise FitError(f"observation {self.label}: measured {self.measured_s!r} s")


def features(**counts: float) -> tuple[float, ...]:
    """A feature vector from named counts (unnamed ones 0)."""
    unknown = set(counts) - set(FEATURES)
    if unknown:
        raise FitError(f"unknown feature(s) {', '.join(sorted(unknown))}")
    return tuple(float(counts.get(name, 0.0)) for name in FEATURES)


@dataclass(frozen=True, slots=True)
class FitResult:
    """The coefficients and how well they reproduce every probe (outliers included)."""

    coefficients: dict[str, float]
    observations: tuple[Observation, ...]
    predicted_s: tuple[float, ...]
    outliers: int = 0
    """Probes left out of the final fit (see :func:`fit`)."""

    def relative_errors(self) -> list[float]:
        """(predicted − measured) / measured, per observation."""
        return [
            (p - o.measured_s) / o.measured_s
            for o, p in zip(self.observations, self.predicted_s, strict=True)
        ]

    def summary(self) -> dict[str, float]:
        """Residual statistics per probe kind and overall (absolute relative errors)."""
        errors = [abs(e) for e in self.relative_errors()]
        out = _stats("all", errors)
        for kind in sorted({o.kind for o in self.observations}):
            mine = [
                abs(e)
                for o, e in zip(self.observations, self.relative_errors(), strict=True)
                if o.kind == kind
            ]
            out.update(_stats(kind, mine))
        return out


def _stats(prefix: str, errors: Sequence[float]) -> dict[str, float]:
    if not errors:
        return {}
    arr = np.asarray(errors)
    return {
        f"{prefix}_count": float(len(arr)),
        f"{prefix}_median_abs_rel_error": float(np.median(arr)),
        f"{prefix}_p90_abs_rel_error": float(np.percentile(arr, 90)),
        f"{prefix}_max_abs_rel_error": float(arr.max()),
    }


OUTLIER_MADS = 4.0
"""A probe whose relative residual is further than this many (normal-scaled) median
absolute deviations from the median is an outlier: a burst of other work on the
machine, which a step model cannot and should not explain."""
OUTLIER_FLOOR = 0.15
MAX_OUTLIERS = 0.2
"""At most this share of the probes is left out."""


def fit(observations: Sequence[Observation]) -> FitResult:
    """NNLS on relative errors, then once more without the outliers of the first fit
    (:data:`OUTLIER_MADS`, at most :data:`MAX_OUTLIERS` of the probes). The result's
    residuals cover every probe, outliers included."""
    first = _fit(observations)
    errors = np.asarray(first.relative_errors())
    center = float(np.median(errors))
    mad = float(np.median(np.abs(errors - center))) * 1.4826
    limit = max(OUTLIER_MADS * mad, OUTLIER_FLOOR)
    far = sorted(
        (i for i, e in enumerate(errors) if abs(e - center) > limit),
        key=lambda i: -abs(errors[i] - center),
    )[: int(MAX_OUTLIERS * len(observations))]
    kept = [o for i, o in enumerate(observations) if i not in set(far)]
    if not far or len(kept) < len(FEATURES):
        return first
    coefficients = _fit(kept).coefficients
    a = np.array([o.features for o in observations], dtype=float)
    predicted = a @ np.array([coefficients[c] for c in COEFFICIENTS])
    return FitResult(
        coefficients, tuple(observations), tuple(float(p) for p in predicted), len(far)
    )


def _fit(observations: Sequence[Observation]) -> FitResult:
    """Non-negative least squares on relative errors (rows scaled by 1/measured)."""
    if len(observations) < len(FEATURES):
        raise FitError(
            f"{len(observations)} probes cannot determine {len(FEATURES)} coefficients; "
            "give the calibration more time (--budget-s)"
        )
    from scipy.optimize import nnls  # imported on use: the CLI starts without scipy

    a = np.array([o.features for o in observations], dtype=float)
    y = np.array([o.measured_s for o in observations], dtype=float)
    # Columns are scaled to unit norm first: counts span 1 (a request) to 1e9
    # (attention pairs), which NNLS's active-set steps handle badly otherwise.
    norms = np.linalg.norm(a, axis=0)
    used = norms > 0
    scaled = a[:, used] / norms[used]
    weights = 1.0 / y
    solution, _ = nnls(scaled * weights[:, None], y * weights, maxiter=50 * a.shape[1])
    coef = np.zeros(len(FEATURES))
    coef[used] = solution / norms[used]
    predicted = a @ coef
    return FitResult(
        coefficients={name: float(c) for name, c in zip(COEFFICIENTS, coef, strict=True)},
        observations=tuple(observations),
        predicted_s=tuple(float(p) for p in predicted),
    )
