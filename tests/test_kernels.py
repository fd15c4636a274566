"""nadaraya_watson and nadaraya_watson_weights against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nwlib import nadaraya_watson, nadaraya_watson_weights


def explicit_softmax_nw(q: np.ndarray, k: np.ndarray, v: np.ndarray, logits_fn) -> np.ndarray:
    """Textbook NW in float64 numpy: weights = exp(logit - max) / sum, then average."""
    logits = logits_fn(q, k)
    logits = logits - logits.max(axis=-1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=-1, keepdims=True)
    return w @ v


def exp_logits(h: float):
    return lambda q, k: q @ np.swapaxes(k, -1, -2) / h**2


def gaussian_logits(h: float):
    def logits(q, k):
        diff = q[..., :, None, :] - k[..., None, :, :]
        return -(diff**2).sum(-1) / (2 * h**2)

    return logits


def make_data(generator, device, dtype, batch=(3, 2), m=7, n=50, d=4, p=3):
    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float64).to(dtype)

    return randn(*batch, m, d), randn(*batch, n, d), randn(*batch, n, p)


@pytest.mark.parametrize("kernel,bandwidth", [("exp", None), ("exp", 0.8), ("gaussian", 0.6), ("gaussian", 2.5)])
def test_matches_explicit_softmax(device, dtype, tol, generator, kernel, bandwidth):
    q, k, v = make_data(generator, device, dtype)
    out = nadaraya_watson(q, k, v, kernel=kernel, bandwidth=bandwidth)
    h = bandwidth if bandwidth is not None else q.shape[-1] ** 0.25
    logits = exp_logits(h) if kernel == "exp" else gaussian_logits(h)
    ref = explicit_softmax_nw(*(t.double().cpu().numpy() for t in (q, k, v)), logits)
    assert out.shape == (3, 2, 7, 3) and out.dtype == dtype and out.device == q.device
    torch.testing.assert_close(out, torch.from_numpy(ref).to(device=device, dtype=dtype), **tol)


def test_default_is_scaled_dot_product_attention(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, d=16, p=16)
    torch.testing.assert_close(nadaraya_watson(q, k, v), F.scaled_dot_product_attention(q, k, v), **tol)


def test_scalar_values_match_vector_column(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype)
    scalar = nadaraya_watson(q, k, v[..., 1], kernel="gaussian", bandwidth=0.9)
    vector = nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=0.9)
    assert scalar.shape == (3, 2, 7)
    torch.testing.assert_close(scalar, vector[..., 1], **tol)


def test_values_wider_than_features(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, d=2, p=9)
    w = nadaraya_watson_weights(q, k, kernel="gaussian", bandwidth=0.7)
    torch.testing.assert_close(nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=0.7), w @ v, **tol)


def test_batch_dimensions_broadcast(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, batch=(4, 1))
    keys = k[:1]  # (1, 1, n, d): shared training inputs
    values = v[:, :1].expand(4, 5, -1, -1).contiguous()  # (4, 5, n, p)
    out = nadaraya_watson(q, keys, values, kernel="gaussian", bandwidth=1.1)
    assert out.shape == (4, 5, 7, 3)
    w = nadaraya_watson_weights(q, keys, kernel="gaussian", bandwidth=1.1)  # (4, 1, m, n)
    torch.testing.assert_close(out, w @ values, **tol)


def test_per_batch_bandwidth_tensor(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, batch=(3,))
    h = torch.tensor([0.4, 1.0, 3.0], device=device, dtype=dtype)
    out = nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h)
    for b in range(3):
        ref = nadaraya_watson(q[b], k[b], v[b], kernel="gaussian", bandwidth=float(h[b]))
        torch.testing.assert_close(out[b], ref, **tol)


def test_bandwidth_tensor_adds_a_batch_dimension(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, batch=(3,))
    h = torch.tensor([0.3, 0.9], device=device, dtype=dtype)[:, None]  # (2, 1) against batch (3,)
    out = nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h)
    assert out.shape == (2, 3, 7, 3)
    for i in range(2):
        ref = nadaraya_watson_weights(q, k, kernel="gaussian", bandwidth=float(h[i])) @ v
        torch.testing.assert_close(out[i], ref, **tol)


def test_matches_statsmodels_kernelreg(dtype, tol):
    """statsmodels' local-constant KernelReg with a fixed Gaussian bandwidth is NW."""
    from statsmodels.nonparametric.kernel_regression import KernelReg

    rng = np.random.default_rng(0)
    x, xq = rng.normal(size=(80, 2)), rng.normal(size=(12, 2))
    y = np.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.normal(size=80)
    h = 0.45
    ref, _ = KernelReg(endog=y, exog=x, var_type="cc", reg_type="lc", bw=np.array([h, h]), ckertype="gaussian").fit(xq)
    t = lambda a: torch.from_numpy(a).to(dtype)  # noqa: E731
    out = nadaraya_watson(t(xq), t(x), t(y), kernel="gaussian", bandwidth=h)
    torch.testing.assert_close(out, t(ref), **tol)


@pytest.mark.parametrize("bandwidth", [1e-2, 1e-3])
def test_float32_finite_for_small_bandwidth_and_far_queries(device, generator, bandwidth):
    k = torch.randn(200, 3, generator=generator, device=device, dtype=torch.float64)
    v = torch.randn(200, generator=generator, device=device, dtype=torch.float64)
    q = torch.cat([torch.randn(20, 3, generator=generator, device=device, dtype=torch.float64), 40 + k[:5]])
    ref = nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=bandwidth)
    assert torch.isfinite(ref).all()
    # The naive exp-then-normalise route underflows to 0/0 here; ours must not.
    naive = torch.exp(-torch.cdist(q.float(), k.float()) ** 2 / (2 * bandwidth**2))
    assert torch.isnan(naive @ v.float() / naive.sum(-1)).any()
    out = nadaraya_watson(q.float(), k.float(), v.float(), kernel="gaussian", bandwidth=bandwidth)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-3, atol=1e-3)
    # With such small bandwidths the far queries' estimates are their nearest key's response.
    nearest = v[torch.cdist(q, k).argmin(-1)]
    torch.testing.assert_close(out.double()[-5:], nearest[-5:], rtol=1e-4, atol=1e-4)


def test_weights_rows_sum_to_one_and_match_softmax(device, dtype, tol, generator):
    q, k, _ = make_data(generator, device, dtype)
    w = nadaraya_watson_weights(q, k)
    ref = torch.softmax(q.double() @ k.double().mT / math.sqrt(q.shape[-1]), -1).to(dtype)
    torch.testing.assert_close(w, ref, **tol)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]), **tol)


finite = st.floats(-5, 5, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    m=st.integers(1, 6),
    d=st.integers(1, 4),
    h=st.floats(0.05, 20.0),
    kernel=st.sampled_from(["exp", "gaussian"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_invariants_weights_sum_to_one_and_permutation(n, m, d, h, kernel, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(m, d, generator=g, dtype=torch.float64)
    k = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
    v = torch.randn(n, 2, generator=g, dtype=torch.float64)
    w = nadaraya_watson_weights(q, k, kernel=kernel, bandwidth=h)
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(m, dtype=torch.float64))
    out = nadaraya_watson(q, k, v, kernel=kernel, bandwidth=h)
    perm = torch.randperm(n, generator=g)
    torch.testing.assert_close(nadaraya_watson(q, k[perm], v[perm], kernel=kernel, bandwidth=h), out)
    # A weighted average stays inside the range of the responses.
    assert torch.all(out <= v.max(0).values + 1e-9) and torch.all(out >= v.min(0).values - 1e-9)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda q, k, v: nadaraya_watson(q.numpy(), k, v), TypeError, "queries"),
        (lambda q, k, v: nadaraya_watson(q, k.int(), v), TypeError, "keys"),
        (lambda q, k, v: nadaraya_watson(q, k, v.double()), TypeError, "values"),
        (lambda q, k, v: nadaraya_watson(q[..., :2], k, v), ValueError, "keys"),
        (lambda q, k, v: nadaraya_watson(q, k, v[:-1]), ValueError, "values"),
        (lambda q, k, v: nadaraya_watson(q, k, v[None, None]), ValueError, "values"),
        (lambda q, k, v: nadaraya_watson(q[0], k, v), ValueError, "queries"),
        (lambda q, k, v: nadaraya_watson(q, k, v, kernel="laplace"), ValueError, "kernel"),
        (lambda q, k, v: nadaraya_watson(q, k, v, kernel=None), TypeError, "kernel"),
        (lambda q, k, v: nadaraya_watson(q, k, v, kernel="gaussian"), ValueError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q, k, v, bandwidth=0.0), ValueError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q, k, v, bandwidth=float("inf")), ValueError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q, k, v, bandwidth=float("nan")), ValueError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q, k, v, bandwidth="1"), TypeError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q, k, v, bandwidth=torch.tensor([1.0, -1.0])), ValueError, "bandwidth"),
        (lambda q, k, v: nadaraya_watson(q[None].expand(3, -1, -1), k[None].expand(2, -1, -1), v[None]), ValueError, "batch"),
        (lambda q, k, v: nadaraya_watson(q, k[:0], v[:0]), ValueError, "keys"),
        (lambda q, k, v: nadaraya_watson_weights(q, k[:, :1]), ValueError, "keys"),
        (lambda q, k, v: nadaraya_watson_weights(q, k, kernel="gaussian", bandwidth=-2), ValueError, "bandwidth"),
    ],
)
def test_bad_input_names_the_argument(call, exc, match):
    q, k, v = torch.randn(4, 3), torch.randn(10, 3), torch.randn(10, 2)
    with pytest.raises(exc, match=match):
        call(q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_mixed_devices_rejected():
    with pytest.raises(ValueError, match="keys"):
        nadaraya_watson(torch.randn(4, 3), torch.randn(10, 3, device="cuda"), torch.randn(10))
