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
    naive = torch.exp(-(torch.cdist(q.float(), k.float()) ** 2) / (2 * bandwidth**2))
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
        (
            lambda q, k, v: nadaraya_watson(q[None].expand(3, -1, -1), k[None].expand(2, -1, -1), v[None]),
            ValueError,
            "batch",
        ),
        (lambda q, k, v: nadaraya_watson(q, k[:0], v[:0]), ValueError, "keys"),
        (lambda q, k, v: nadaraya_watson_weights(q, k[:, :1]), ValueError, "keys"),
        (lambda q, k, v: nadaraya_watson_weights(q, k, kernel="gaussian", bandwidth=-2), ValueError, "bandwidth"),
    ],
)
def test_bad_input_names_the_argument(call, exc, match):
    q, k, v = torch.randn(4, 3), torch.randn(10, 3), torch.randn(10, 2)
    with pytest.raises(exc, match=match):
        call(q, k, v)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_mixed_devices_rejected():
    with pytest.raises(ValueError, match="keys"):
        nadaraya_watson(torch.randn(4, 3), torch.randn(10, 3, device="cuda"), torch.randn(10))


# --- tensor bandwidths: gradients, 0-dim tensors, torch.func ---------------------------------


def explicit_nw_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: torch.Tensor, kernel: str) -> torch.Tensor:
    """Differentiable textbook NW in torch: direct differences, materialised softmax weights."""
    if kernel == "gaussian":
        logits = -((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1) / (2 * h * h)
    else:
        logits = q @ k.mT / (h * h)
    return torch.softmax(logits, dim=-1) @ v


@pytest.mark.parametrize("kernel", ["gaussian", "exp"])
@pytest.mark.parametrize("per_head", [False, True], ids=["0-dim", "per-head"])
def test_tensor_bandwidth_gradcheck(device, generator, kernel, per_head):
    # Gradients w.r.t. the bandwidth and the data go through SDPA's fused backward (the
    # Gaussian offsets are folded into a coordinate); gradcheck compares them with
    # finite differences, and the reference's autograd gradients pin them down too.
    q, k, v = make_data(generator, device, torch.float64, batch=(2,), m=4, n=9, d=2, p=2)
    h0 = (
        torch.tensor([0.7, 1.3], device=device, dtype=torch.float64)
        if per_head
        else torch.tensor(0.9, device=device, dtype=torch.float64)
    )
    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v, h0))
    assert torch.autograd.gradcheck(lambda q, k, v, h: nadaraya_watson(q, k, v, kernel=kernel, bandwidth=h), inputs)
    out = nadaraya_watson(*inputs[:3], kernel=kernel, bandwidth=inputs[3])
    hb = inputs[3][..., None, None]
    ref = explicit_nw_torch(*inputs[:3], hb, kernel)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    weights = torch.randn(out.shape, generator=generator, device=device, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weights).sum(), inputs)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)


def test_zero_dim_bandwidth_gets_the_reference_gradient(device, dtype, tol, generator):
    # A 0-dim bandwidth used to be turned into a float, which silently dropped its gradient.
    q, k, v = make_data(generator, device, dtype, batch=(3,), m=5, n=20)
    h = torch.tensor(0.8, device=device, dtype=dtype, requires_grad=True)
    nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h).sum().backward()
    assert h.grad is not None
    h_ref = torch.tensor(0.8, device=device, dtype=torch.float64, requires_grad=True)
    explicit_nw_torch(q.double(), k.double(), v.double(), h_ref, "gaussian").sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad.to(dtype), **tol)


def test_tensor_and_float_bandwidths_agree(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype)
    out = nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=torch.tensor(0.6, device=device, dtype=dtype))
    torch.testing.assert_close(out, nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=0.6), **tol)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap's fallback loop over SDPA
def test_vmap_over_bandwidths_matches_a_loop(device, dtype, tol, generator):
    q, k, v = make_data(generator, device, dtype, batch=(2,), m=6, n=30)
    hs = torch.tensor([0.3, 0.8, 2.0, 5.0], device=device, dtype=dtype)
    out = torch.func.vmap(lambda h: nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h))(hs)
    assert out.shape == (4, 2, 6, 3)
    for i, h in enumerate(hs.tolist()):
        torch.testing.assert_close(out[i], nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h), **tol)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_bandwidth_values_are_not_checked_under_vmap(generator):
    # Documented: reading the values would need concrete tensors; only h² enters the kernel,
    # so a negative bandwidth acts as its absolute value instead of raising.
    q, k, v = make_data(generator, "cpu", torch.float64, batch=(), m=3, n=10)
    hs = torch.tensor([-0.7, 0.7], dtype=torch.float64)
    out = torch.func.vmap(lambda h: nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h))(hs)
    torch.testing.assert_close(out[0], out[1])
    with pytest.raises(ValueError, match="bandwidth"):
        nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=hs[0])


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -1.0])
def test_zero_dim_tensor_bandwidth_is_checked_on_cpu(bad):
    q, k, v = torch.randn(4, 3), torch.randn(10, 3), torch.randn(10, 2)
    with pytest.raises(ValueError, match="bandwidth"):
        nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=torch.tensor(bad))


# --- values shared by the heads (nwlib.simulate's layout) -------------------------------------


@pytest.mark.parametrize("scalar", [True, False], ids=["scalar", "vector"])
@pytest.mark.parametrize("tensor_bandwidth", [False, True], ids=["float-h", "tensor-h"])
def test_values_broadcast_over_heads(device, dtype, tol, generator, scalar, tensor_bandwidth):
    c, heads, m, n, d = 3, 4, 5, 40, 3

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float64)

    q, k = randn(heads, m, d), randn(c, heads, n, d)  # queries shared by replicates
    v = randn(c, 1, n) if scalar else randn(c, 1, n, 2)  # values shared by the heads
    h = randn(heads).abs() + 0.5 if tensor_bandwidth else 0.9
    out = nadaraya_watson(
        q.to(dtype), k.to(dtype), v.to(dtype), kernel="gaussian", bandwidth=h.to(dtype) if tensor_bandwidth else h
    )
    hb = h[:, None, None] if tensor_bandwidth else torch.tensor(h, dtype=torch.float64, device=device)
    ref = explicit_nw_torch(q, k, v.unsqueeze(-1) if scalar else v, hb, "gaussian")
    ref = ref.squeeze(-1) if scalar else ref
    assert out.shape == ((c, heads, m) if scalar else (c, heads, m, 2))
    torch.testing.assert_close(out, ref.to(dtype), **tol)


def test_values_broadcast_over_some_leading_dimensions(device, dtype, tol, generator):
    # Two leading batch dimensions, values shared over the first only: merging them for
    # SDPA cannot be a view, so reshape copies; the result must not change.
    q, k, v = make_data(generator, device, torch.float64, batch=(2, 3, 4), m=5, n=25, d=3, p=2)
    v = v[:1]
    out = nadaraya_watson(q.to(dtype), k.to(dtype), v.to(dtype), kernel="gaussian", bandwidth=0.8)
    ref = explicit_nw_torch(q, k, v, torch.tensor(0.8, dtype=torch.float64, device=device), "gaussian")
    torch.testing.assert_close(out, ref.to(dtype), **tol)


def test_shared_values_reach_the_kernel_without_per_head_copies():
    # The layout claim behind the comments in _sdpa_view: an input broadcast over the
    # heads (last batch dim) or the replicates (leading dim) stays a stride-0 view.
    from nwlib.kernels import _sdpa_view

    batch = torch.Size([3, 4])
    values = torch.randn(3, 1, 40, 8)
    shared = _sdpa_view(values, batch, 40, 8)
    assert shared.shape == (3, 4, 40, 8) and shared.stride(1) == 0
    assert shared.data_ptr() == values.data_ptr()
    queries = torch.randn(4, 5, 8)
    view = _sdpa_view(queries, batch, 5, 8)
    assert view.stride(0) == 0 and view.data_ptr() == queries.data_ptr()
    # Shared over the first of two leading dimensions: merging them copies, but once per
    # leading element, and the heads stay a stride-0 expansion of that copy.
    partly = torch.randn(1, 3, 1, 40, 8)
    merged = _sdpa_view(partly, torch.Size([2, 3, 4]), 40, 8)
    assert merged.shape == (6, 4, 40, 8) and merged.stride(1) == 0
    torch.testing.assert_close(merged, partly.expand(2, 3, 4, 40, 8).reshape(6, 4, 40, 8))


# ---------------------------------------------------------------------------------- the fused CPU kernel
# nadaraya_watson takes nwlib's fused kernel (nwlib/_fused.py) on the CPU without autograd where it
# is built, and SDPA otherwise. Both paths must give the textbook estimate; the shapes below cover
# what the kernel special-cases: key counts that are not a multiple of the vector width (padding),
# query counts that are not a multiple of its query tile, head dimensions 1 to 64, one value column
# or several, broadcast batches, and logits far above the first keys' (the running-maximum rescale).


def _fused_available() -> bool:
    from nwlib import _fused

    return _fused.enabled() and _fused.module() is not None


@pytest.mark.parametrize(
    "m,n,d,p",
    # d and p of the fused kernel's specialisations (1, 2, 4, 8) and of its general path (3),
    # key counts that leave a last odd vector and query counts that leave a partial tile
    [(1, 1, 1, 1), (5, 17, 3, 1), (9, 50, 8, 2), (7, 100, 4, 4), (5, 70, 8, 8), (6, 47, 2, 3)]
    + [(4, 33, 17, 9), (3, 100, 64, 1), (6, 31, 65, 1)],
)
@pytest.mark.parametrize("kernel,bandwidth", [("exp", None), ("gaussian", 0.7)])
def test_cpu_paths_match_explicit_softmax(dtype, tol, kernel, bandwidth, m, n, d, p, monkeypatch):
    gen = torch.Generator().manual_seed(m * 1000 + n + d)
    q, k, v = make_data(gen, "cpu", torch.float64, batch=(2, 3), m=m, n=n, d=d, p=p)
    h = bandwidth if bandwidth is not None else d**0.25
    logits = exp_logits(h) if kernel == "exp" else gaussian_logits(h)
    ref = torch.from_numpy(explicit_softmax_nw(q.numpy(), k.numpy(), v.numpy(), logits)).to(dtype)
    for fused in ("1", "0"):
        monkeypatch.setenv("NWLIB_FUSED", fused)
        out = nadaraya_watson(q.to(dtype), k.to(dtype), v.to(dtype), kernel=kernel, bandwidth=bandwidth)
        torch.testing.assert_close(out, ref, **tol)


def _count_fused_calls(monkeypatch) -> list[int]:
    """A list that grows by one each time nadaraya_watson reaches the fused kernel (its module)."""
    from nwlib import _fused

    calls: list[int] = []
    original = _fused.module

    def counting():
        calls.append(1)
        return original()

    monkeypatch.setattr(_fused, "module", counting)
    return calls


def test_fused_kernel_is_taken_where_it_applies(monkeypatch):
    from nwlib import _fused

    if not _fused_available():
        pytest.skip(f"fused kernel not built here: {_fused.STATE['error']}")
    calls = _count_fused_calls(monkeypatch)
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 20, 4), torch.randn(2, 20)
    nadaraya_watson(q, k, v)
    assert calls, "a float32 CPU call without autograd must reach the fused kernel"
    calls.clear()
    nadaraya_watson(q.requires_grad_(), k, v)  # autograd: SDPA
    nadaraya_watson(torch.randn(2, 5, 65), torch.randn(2, 20, 65), v)  # head dimension above 64: SDPA
    monkeypatch.setenv("NWLIB_FUSED", "0")
    nadaraya_watson(q.detach(), k, v)
    assert not calls


def test_failed_build_falls_back_to_sdpa(monkeypatch):
    from nwlib import _fused

    monkeypatch.setattr(_fused, "STATE", {"module": None, "tried": True, "error": "no compiler", "build_s": None})
    q, k, v = torch.randn(3, 6, 2, dtype=torch.float64), torch.randn(3, 40, 2, dtype=torch.float64), torch.randn(3, 40)
    ref = torch.softmax(q @ k.mT / 2**0.5, dim=-1) @ v.double().unsqueeze(-1)
    torch.testing.assert_close(nadaraya_watson(q, k, v.double()), ref.squeeze(-1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_running_maximum_rescales_late_large_logits(dtype):
    # Logits growing along the keys by far more than the kernel's headroom (16): every rescale of
    # the running sums is exercised, and the last keys dominate the weights.
    n = 200
    k = torch.linspace(0, 60, n, dtype=torch.float64).unsqueeze(-1)
    q = torch.tensor([[1.0], [0.5], [-1.0]], dtype=torch.float64)
    v = torch.randn(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = torch.softmax(q @ k.mT, dim=-1) @ v
    out = nadaraya_watson(q.to(dtype), k.to(dtype), v.to(dtype), bandwidth=1.0)
    torch.testing.assert_close(out, ref.to(dtype), **{torch.float32: dict(rtol=1e-4, atol=1e-5)}.get(dtype, {}))


def test_fused_exp2_is_within_two_ulp_of_float64():
    # nwlib's float32 exp2 (the fused kernel's exponential; its logits are in base 2) against
    # float64 exp2, over the arguments the kernel feeds it: at most its headroom (16) above the
    # running maximum, down to its cutoff (-64), below which weights are exactly 0 (-inf, the
    # padding, included), so that no weight is subnormal.
    from nwlib import _fused

    if not _fused_available():
        pytest.skip(f"fused kernel not built here: {_fused.STATE['error']}")
    x = torch.linspace(-64.0, 16.0, 2**20, dtype=torch.float32)
    ref = torch.exp2(x.double())
    rel = ((_fused.module().exp2_values(x).double() - ref).abs() / ref).max().item()
    assert rel < 2 * 2.0**-23  # two ulp of float32 (the fit's 1.9e-7 includes float32 rounding)
    cut = torch.tensor([-64.0 - 2.0**-17, -64.5, -100.0, -126.0, -149.0, -150.0, -1e30] + [float("-inf")] * 9)
    assert torch.equal(_fused.module().exp2_values(cut), torch.zeros(16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_kernel_reads_strided_and_broadcast_inputs(dtype):
    # The kernel takes its inputs as views: keys and values every other row of larger tensors,
    # queries shared by the first batch dimension (stride 0), an offset (Gaussian kernel) of the
    # strided keys; against the textbook formulas on contiguous float64 copies.
    gen = torch.Generator().manual_seed(11)
    big_k = torch.randn(3, 2, 80, 5, generator=gen, dtype=torch.float64)
    big_v = torch.randn(3, 2, 80, 2, generator=gen, dtype=torch.float64)
    k, v = big_k[:, :, ::2], big_v[:, :, ::2].transpose(-1, -2).contiguous().transpose(-1, -2)
    q = torch.randn(1, 2, 6, 5, generator=gen, dtype=torch.float64).expand(3, 2, 6, 5)
    assert not k.is_contiguous() and not v.is_contiguous() and q.stride(0) == 0
    tol = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}[dtype]
    for kernel, logits in (("exp", exp_logits(5**0.25)), ("gaussian", gaussian_logits(0.9))):
        ref = explicit_softmax_nw(q.numpy(), k.contiguous().numpy(), v.contiguous().numpy(), logits)
        out = nadaraya_watson(
            q.to(dtype), k.to(dtype), v.to(dtype), kernel=kernel, bandwidth=0.9 if kernel == "gaussian" else None
        )
        torch.testing.assert_close(out, torch.from_numpy(ref).to(dtype), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", ["exp", "gaussian"])
def test_fused_kernel_takes_a_bandwidth_per_head(dtype, kernel, monkeypatch):
    # As nwlib.simulate calls it: keys and values shared by the heads (stride 0), queries shared
    # by the replicates, one bandwidth per head. The kernel lays out a shared key block once per
    # thread, so a head with another bandwidth (another Gaussian offset) must be laid out anew.
    from nwlib import _fused

    if not _fused_available():
        pytest.skip(f"fused kernel not built here: {_fused.STATE['error']}")
    gen = torch.Generator().manual_seed(11)
    R, H, m, n, d = 3, 4, 6, 70, 2
    q = torch.randn(H, m, d, generator=gen, dtype=torch.float64)
    k = torch.randn(R, 1, n, d, generator=gen, dtype=torch.float64)
    v = torch.randn(R, 1, n, generator=gen, dtype=torch.float64)
    h = torch.tensor([0.3, 0.6, 1.2, 2.4], dtype=torch.float64)
    logits = (exp_logits if kernel == "exp" else gaussian_logits)(h.numpy()[:, None, None])
    ref = explicit_softmax_nw(
        np.broadcast_to(q.numpy(), (R, H, m, d)), np.broadcast_to(k.numpy(), (R, H, n, d)), v.numpy()[..., None], logits
    )
    calls = _count_fused_calls(monkeypatch)
    shared_k, shared_v = k.to(dtype).expand(R, H, n, d), v.to(dtype).expand(R, H, n)  # views, stride 0
    out = nadaraya_watson(q.to(dtype), shared_k, shared_v, kernel=kernel, bandwidth=h.to(dtype))
    assert calls, "a bandwidth tensor without autograd must reach the fused kernel"
    tol = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}[dtype]
    torch.testing.assert_close(out, torch.from_numpy(ref[..., 0]).to(dtype), **tol)


def test_fused_kernel_gives_the_same_bits_on_any_thread_count():
    # Each query's sums stay within one thread (tiles of queries are split, never keys), so the
    # estimate does not depend on how many threads share the call.
    gen = torch.Generator().manual_seed(5)
    q, k, v = make_data(gen, "cpu", torch.float32, batch=(4, 3), m=33, n=300, d=8, p=1)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(nadaraya_watson(q, k, v))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
