"""Online execution-time model of one instance, learned from what it observes.

Evolving Infra §4.2: fit per-request execution times with non-negative least
squares on physically meaningful features, start predicting after a warm-up and
refit on a sliding window. Nothing here reads the simulator's coefficients: the
inputs are what a router and vLLM expose per finished request (prompt, cached
and completion tokens, TTFT, decode time per token, the number of running
requests and the instance's active context) plus the SM clock it ran at.

Clock enters through ``g(f) = 1000/f`` (time per cycle, in 1/GHz) and hinge
features ``max(0, g(f) − g(f_j))`` at knots ``f_j`` (the controllable levels).
A non-negative combination of these is convex and non-increasing in ``f``:
flat-ish above a memory knee and ``∝ 1/f`` below it — the shape of a GPU whose
decode is memory-bound at high clocks and compute-bound at low ones — without
knowing where the knee is.

* decode time per token ≈ Σ_k clock_k(f) · (a_k + b_k·B + c_k·K)
  (``B`` running requests, ``K`` active context in 100k tokens);
* TTFT ≈ Σ_k clock_k(f) · (d_k + e_k·u + h_k·P)
  (``u`` uncached prompt tokens in thousands, ``P`` attention pairs in 10⁷).

Both are refitted every ``refit_every`` observations on the last ``window``.
Prediction error (mean absolute percentage error of each new observation
against the model *before* it was refitted on it) is kept for metrics.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controllers.errors import InvalidSnapshotError
from controllers.types import RequestObservation

FloatArray = npt.NDArray[np.float64]


def nnls(a: FloatArray, b: FloatArray, ridge: float = 0.0) -> FloatArray:
    """``argmin ‖Ax − b‖₂² + λ‖x‖₂² s.t. x ≥ 0`` (Lawson–Hanson, :func:`scipy.optimize.nnls`).

    ``ridge`` sets λ relative to the mean squared column norm of ``A`` (0: plain
    NNLS). When ``A`` is rank-deficient the plain minimiser is not unique and which
    one the solver returns depends on floating-point rounding; any λ > 0 makes the
    problem strictly convex, so the answer is unique and, with λ well above
    rounding, the same whatever the column order or the last bit of ``b``.

    A thin wrapper so the callers keep one name and one error for bad shapes;
    the solver is scipy's, which is maintained and tested far beyond what a
    hand-written active-set loop here was (it once returned zeros on a 0/0).
    scipy is imported when a model is built (:class:`OnlinePerfModel`), not at
    module import: importing it costs about a second, and every ``kairos`` command
    (and KAIROS-only simulations) would pay it for nothing. Not on the first fit
    either: that second then fell inside the predictive daemon's first epoch.
    """
    from scipy.optimize import nnls as scipy_nnls

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise InvalidSnapshotError(f"nnls needs A (m×n) and b (m), got {a.shape} {b.shape}")
    if ridge > 0.0:
        n = a.shape[1]
        lam = ridge * float(np.einsum("ij,ij->", a, a)) / max(n, 1)
        if lam > 0.0:  # a zero matrix has nothing to regularise
            a = np.vstack([a, np.sqrt(lam) * np.eye(n)])
            b = np.concatenate([b, np.zeros(n)])
    x, _residual = scipy_nnls(a, b)
    return np.asarray(x, dtype=np.float64)


def clock_features(clock_mhz: float, knots_mhz: Sequence[int]) -> FloatArray:
    """``[1, g(f), max(0, g(f) − g(f_j)) …]`` with ``g(f) = 1000/f``."""
    g = 1000.0 / max(float(clock_mhz), 1.0)
    hinges = [max(0.0, g - 1000.0 / k) for k in knots_mhz]
    return np.array([1.0, g, *hinges], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class PerfModelConfig:
    """Warm-up, window and refit cadence of the online fit."""

    warmup: int = 40
    window: int = 600
    refit_every: int = 20
    error_window: int = 200
    ridge: float = 1e-6
    """Tikhonov term of each fit, relative to the mean squared column norm (see
    :func:`nnls`). While the model has seen one or two clocks its hinge columns are
    proportional and plain NNLS picks among equally good fits by rounding (a
    1e-13 change of the targets moved predicted slowdowns by 16×); 1e-6 makes
    the fit unique and moves a well-posed fit's predicted slowdowns by < 1e-4."""


@dataclass(frozen=True, slots=True)
class RequestShape:
    """A representative request: what the controller asks the model about."""

    uncached_tokens: float
    cached_tokens: float
    completion_tokens: float
    running: float
    active_context_tokens: float


class _Fit:
    """One NNLS regression over a sliding window of (features, target) rows."""

    def __init__(self, config: PerfModelConfig) -> None:
        self.config = config
        self.rows: deque[FloatArray] = deque(maxlen=config.window)
        self.targets: deque[float] = deque(maxlen=config.window)
        self.coef: FloatArray | None = None
        self.errors: deque[float] = deque(maxlen=config.error_window)
        self._since_fit = 0

    def add(self, row: FloatArray, y: float) -> None:
        if self.coef is not None and y > 0:
            self.errors.append(abs(float(row @ self.coef) - y) / y)
        self.rows.append(row)
        self.targets.append(y)
        self._since_fit += 1
        ready = len(self.rows) >= self.config.warmup
        if ready and (self.coef is None or self._since_fit >= self.config.refit_every):
            self.refit()

    def refit(self) -> None:
        a = np.vstack(list(self.rows))
        b = np.asarray(self.targets, dtype=np.float64)
        # Relative error matters (requests span orders of magnitude): weight rows
        # by 1/y so each observation counts as a percentage, not in seconds.
        w = 1.0 / np.maximum(b, 1e-6)
        scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
        coef = nnls(a * w[:, None] / scale, b * w, self.config.ridge) / scale
        self.coef = coef
        self._since_fit = 0

    def predict(self, row: FloatArray) -> float | None:
        if self.coef is None:
            return None
        return float(row @ self.coef)

    @property
    def mape(self) -> float | None:
        return float(np.mean(self.errors)) if self.errors else None


class OnlinePerfModel:
    """Decode-time-per-token and TTFT models of one instance, refitted online."""

    def __init__(self, knots_mhz: Iterable[int], config: PerfModelConfig | None = None) -> None:
        import scipy.optimize  # noqa: F401  # load the solver now, not in a control epoch

        self.config = config or PerfModelConfig()
        self.knots_mhz = tuple(sorted(set(int(k) for k in knots_mhz)))
        self.decode = _Fit(self.config)
        self.prefill = _Fit(self.config)
        self.observed = 0
        self.last_t_s = float("-inf")

    # ------------------------------------------------------------ features
    def _decode_row(self, clock_mhz: float, running: float, context_tokens: float) -> FloatArray:
        c = clock_features(clock_mhz, self.knots_mhz)
        return np.concatenate([c, c * running, c * (context_tokens / 1e5)])

    def _prefill_row(self, clock_mhz: float, uncached: float, cached: float) -> FloatArray:
        c = clock_features(clock_mhz, self.knots_mhz)
        pairs = uncached * cached + uncached * (uncached + 1) / 2
        return np.concatenate([c, c * (uncached / 1e3), c * (pairs / 1e7)])

    # -------------------------------------------------------------- update
    def observe(self, observations: Iterable[RequestObservation]) -> int:
        """Add observations newer than the last one seen; return how many."""
        added = 0
        for ob in sorted(observations, key=lambda o: o.t_s):
            if ob.t_s <= self.last_t_s:
                continue
            self.last_t_s = ob.t_s
            added += 1
            self.observed += 1
            uncached = max(ob.prompt_tokens - ob.cached_tokens, 0)
            if ob.ttft_s > 0:
                row = self._prefill_row(ob.clock_mhz, uncached, ob.cached_tokens)
                self.prefill.add(row, ob.ttft_s)
            if ob.completion_tokens > 1 and ob.decode_s_per_token > 0:
                row = self._decode_row(ob.clock_mhz, ob.running, ob.active_context_tokens)
                self.decode.add(row, ob.decode_s_per_token)
        return added

    # ------------------------------------------------------------- predict
    @property
    def ready(self) -> bool:
        """True once both fits have passed their warm-up."""
        return self.decode.coef is not None and self.prefill.coef is not None

    def request_time_s(self, shape: RequestShape, clock_mhz: float) -> float | None:
        """Predicted latency of ``shape`` at ``clock_mhz`` (TTFT + decode)."""
        ttft = self.prefill.predict(
            self._prefill_row(clock_mhz, shape.uncached_tokens, shape.cached_tokens)
        )
        tpot = self.decode.predict(
            self._decode_row(clock_mhz, shape.running, shape.active_context_tokens)
        )
        if ttft is None or tpot is None:
            return None
        return max(ttft, 0.0) + max(tpot, 0.0) * max(shape.completion_tokens - 1.0, 0.0)

    def slowdown(self, shape: RequestShape, clock_mhz: float, reference_mhz: float) -> float | None:
        """``T(f)/T(f_ref)`` for ``shape``: how much slower a request is at ``f``."""
        t = self.request_time_s(shape, clock_mhz)
        t_ref = self.request_time_s(shape, reference_mhz)
        if t is None or t_ref is None or t_ref <= 0:
            return None
        return t / t_ref

    @property
    def error(self) -> float | None:
        """Mean absolute percentage error of recent predictions (decode and TTFT)."""
        errs = [e for e in (self.decode.mape, self.prefill.mape) if e is not None]
        return sum(errs) / len(errs) if errs else None


def typical_shape(observations: Sequence[RequestObservation]) -> RequestShape | None:
    """Median request of ``observations`` (what 'an agent's next request' looks like)."""
    if not observations:
        return None
    arr = np.array(
        [
            (
                max(o.prompt_tokens - o.cached_tokens, 0),
                o.cached_tokens,
                o.completion_tokens,
                o.running,
                o.active_context_tokens,
            )
            for o in observations
        ],
        dtype=np.float64,
    )
    med = np.median(arr, axis=0)
    return RequestShape(*(float(v) for v in med))
