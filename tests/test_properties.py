"""Property-based checks (hypothesis) of invariants that span modules.

Each property states its number of examples; module-specific properties live in the module's
own tests (kernels: weights sum to 1 and key/value permutation invariance; subspaces: HDI in
[0, 1] and symmetric under permuting heads).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nwlib as nw

shapes = st.tuples(st.integers(2, 12), st.integers(1, 5), st.integers(1, 6))  # (R, H, m)


@settings(max_examples=50, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_decomposition_identity_for_any_weights(shape, seed, scale):
    g = torch.Generator().manual_seed(seed)
    r, h, m = shape
    predictions = scale * torch.randn(r, h, m, generator=g, dtype=torch.float64)
    target = scale * torch.randn(m, generator=g, dtype=torch.float64)
    weights = torch.rand(h, generator=g, dtype=torch.float64) * 2 - 0.5  # need not sum to 1
    dec = nw.decompose(predictions, target, weights)
    total = dec.bias_sq + dec.variance + dec.covariance
    torch.testing.assert_close(dec.mse, total, rtol=1e-9, atol=1e-12 * scale**2)
    assert torch.all(dec.variance >= 0)
    # The unbiased bias² may dip below 0; adding back the variance of the mean gives a square.
    r_count = predictions.shape[0]
    plug_in = dec.bias_sq + dec.ensemble_variance / r_count
    torch.testing.assert_close(plug_in, (dec.ensemble_mean - target).pow(2), rtol=1e-9, atol=1e-12 * scale**2)


@settings(max_examples=50, deadline=None)
@given(h=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_optimal_weights_never_lose_to_uniform_or_fibonacci(h, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(h, h, generator=g, dtype=torch.float64)
    m = a @ a.T + 0.1 * torch.eye(h, dtype=torch.float64)  # symmetric positive definite
    best = nw.optimal_weights(m)
    torch.testing.assert_close(best.sum(), torch.tensor(1.0, dtype=torch.float64))
    for other in (
        nw.uniform_weights(h, dtype=torch.float64),
        nw.fibonacci_weights(h, dtype=torch.float64),
        nw.geometric_weights(h, 0.5, dtype=torch.float64),
    ):
        torch.testing.assert_close(other.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert nw.combination_mse(best, m) <= nw.combination_mse(other, m) * (1 + 1e-10)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), seed=st.integers(0, 2**31 - 1), shift=st.floats(-50, 50))
def test_gaussian_nw_is_translation_invariant_and_affine_equivariant(n, seed, shift):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(5, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
    v = torch.randn(n, generator=g, dtype=torch.float64)
    base = nw.nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=0.7)
    moved = nw.nadaraya_watson(q + shift, k + shift, 3 * v - 1, kernel="gaussian", bandwidth=0.7)
    torch.testing.assert_close(moved, 3 * base - 1, rtol=1e-8, atol=1e-8)
