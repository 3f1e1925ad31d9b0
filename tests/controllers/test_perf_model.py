"""The NNLS wrapper (scipy) and the online performance model (docs/beyond.md §1)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.errors import InvalidSnapshotError
from controllers.perf_model import (
    OnlinePerfModel,
    PerfModelConfig,
    RequestShape,
    clock_features,
    nnls,
    typical_shape,
)
from tests.controllers.conftest import synthetic_observations, truth_tpot, truth_ttft

KNOTS = (660, 825, 975, 1140, 1305, 1470, 1620)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 6),
    zeros=st.lists(st.booleans(), min_size=6, max_size=6),
)
# Found by hypothesis: at the exact optimum a rounding-noise gradient let a zero
# coefficient enter with z = 0, and 0/0 in the step returned all zeros.
@example(seed=605, n=5, zeros=[False, True, True, True, False, False])
def test_nnls_recovers_known_nonnegative_coefficients(seed: int, n: int, zeros: list[bool]) -> None:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.1, 2.0, size=(40, n))
    x_true = rng.uniform(0.0, 3.0, size=n)
    x_true[np.array(zeros[:n])] = 0.0
    x = nnls(a, a @ x_true)
    assert np.all(x >= 0)
    np.testing.assert_allclose(x, x_true, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_nnls_satisfies_kkt_on_infeasible_targets(seed: int) -> None:
    """Where the unconstrained optimum is negative: x ≥ 0, gradient ≥ 0, complementary."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(30, 5))
    b = rng.normal(size=30)
    x = nnls(a, b)
    grad = a.T @ (a @ x - b)
    assert np.all(x >= 0)
    assert np.all(grad >= -1e-7)
    np.testing.assert_allclose(x * grad, 0.0, atol=1e-7)


def test_nnls_rejects_bad_shapes() -> None:
    with pytest.raises(InvalidSnapshotError):
        nnls(np.ones((3, 2)), np.ones(4))


@pytest.mark.parametrize("seed", range(5))
def test_ridge_nnls_is_unique_on_rank_deficient_designs(seed: int) -> None:
    """Proportional columns (as hinges are at one clock): plain NNLS may return any
    of many minimisers; with a ridge, column order and the last bits of ``b`` do not
    change the answer."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.1, 1.0, (30, 3))
    a = np.hstack([base, base[:, :1] * 2.0, base[:, 1:2] * 0.5, base[:, :1] * 3.0])
    b = base @ np.array([1.0, 0.5, 2.0]) + rng.normal(0.0, 0.01, 30)
    x = nnls(a, b, ridge=1e-6)
    perm = rng.permutation(a.shape[1])
    x_perm = np.empty_like(x)
    x_perm[perm] = nnls(a[:, perm], b * (1 + 1e-13), ridge=1e-6)
    np.testing.assert_allclose(x_perm, x, rtol=1e-8, atol=1e-12)
    assert np.all(x >= 0)


def test_a_model_that_saw_one_clock_predicts_the_same_whatever_the_rounding() -> None:
    """Decisions of the predictive controller must not hang on rounding: a fit at
    one clock extrapolates the same when the targets move in their 13th digit."""
    obs = [dataclasses.replace(o, clock_mhz=1785) for o in synthetic_observations(60, seed=3)]
    shape = RequestShape(2000, 10_000, 200, 8, 150_000)
    predictions = []
    for factor in (1.0, 1 + 1e-13, 1 - 3e-14):
        model = OnlinePerfModel(KNOTS)
        model.observe(
            dataclasses.replace(
                o, ttft_s=o.ttft_s * factor, decode_s_per_token=o.decode_s_per_token * factor
            )
            for o in obs
        )
        predictions.append([model.slowdown(shape, f, 1785) for f in KNOTS])
    np.testing.assert_allclose(predictions[1], predictions[0], rtol=1e-9)
    np.testing.assert_allclose(predictions[2], predictions[0], rtol=1e-9)


def test_clock_features_are_convex_and_decreasing_in_clock() -> None:
    rows = [clock_features(f, KNOTS) for f in (600, 800, 1200, 1800)]
    for lo, hi in itertools.pairwise(rows):
        assert np.all(lo[1:] >= hi[1:])


def test_model_is_not_ready_before_warmup_then_learns_the_clock() -> None:
    model = OnlinePerfModel(KNOTS, PerfModelConfig(warmup=40, window=400, refit_every=20))
    obs = synthetic_observations(300)
    model.observe(obs[:30])
    assert not model.ready
    assert model.request_time_s(RequestShape(500, 8000, 100, 10, 2e5), 1000) is None
    model.observe(obs[30:])
    assert model.ready
    assert model.error is not None and model.error < 0.05
    shape = RequestShape(500, 8000, 100, 10, 2e5)
    for f in (660, 900, 1305, 1785):
        truth = truth_ttft(f, 500, 8000) + 99 * truth_tpot(f, 10, 2e5)
        pred = model.request_time_s(shape, f)
        assert pred is not None and abs(pred - truth) / truth < 0.05
    slow = model.slowdown(shape, 660, 1785)
    assert slow is not None and slow > 1.2


def test_observe_deduplicates_by_time() -> None:
    model = OnlinePerfModel(KNOTS)
    obs = synthetic_observations(10)
    assert model.observe(obs) == 10
    assert model.observe(obs) == 0
    assert model.observe(synthetic_observations(3, t0=100.0)) == 3


def test_typical_shape_is_the_median() -> None:
    obs = synthetic_observations(5)
    shape = typical_shape(obs)
    assert shape is not None
    assert shape.running == float(np.median([o.running for o in obs]))
    assert typical_shape([]) is None
