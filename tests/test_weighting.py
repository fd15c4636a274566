"""Tests of nwlib.weighting: structured head weights and the optimal linear weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from nwlib import (
    HeadRanking,
    assign_by_rank,
    combination_mse,
    error_second_moments,
    fibonacci_weights,
    geometric_weights,
    optimal_weights,
    rank_heads,
    replicate_mse,
    uniform_weights,
)


def _ref(values, dtype, device):
    return torch.as_tensor(np.asarray(values, dtype=np.float64)).to(device=device, dtype=dtype)


def _random_spd(H: int, generator: torch.Generator, dtype, device, batch=()) -> torch.Tensor:
    A = torch.randn(*batch, H, H, generator=generator, dtype=torch.float64, device=device)
    # Well conditioned: A Aᵀ / H plus a diagonal shift.
    M = A @ A.mT / H + 0.5 * torch.eye(H, dtype=torch.float64, device=device)
    return M.to(dtype)


# ---------------------------------------------------------------- structured schemes


@pytest.mark.parametrize("H", [1, 2, 5, 17])
def test_uniform_weights(H, dtype, device, tol):
    w = uniform_weights(H, dtype=dtype, device=device)
    assert w.shape == (H,) and w.dtype == dtype and w.device.type == device.type
    torch.testing.assert_close(w, _ref(np.full(H, 1.0 / H), dtype, device), **tol)


@pytest.mark.parametrize(
    "H, ratio, expected",
    [
        (1, 0.5, [1.0]),
        (3, 0.5, [4 / 7, 2 / 7, 1 / 7]),
        (4, 1.0, [0.25] * 4),
        (2, 0.25, [0.8, 0.2]),
    ],
)
def test_geometric_weights_explicit(H, ratio, expected, dtype, device, tol):
    w = geometric_weights(H, ratio, dtype=dtype, device=device)
    assert w.dtype == dtype and w.device.type == device.type
    torch.testing.assert_close(w, _ref(expected, dtype, device), **tol)


@pytest.mark.parametrize("ratio", [0.9, 0.618, 0.1, 1e-3])
def test_geometric_weights_closed_form(ratio, dtype, device, tol):
    H = 12
    h = np.arange(1, H + 1)
    expected = ratio ** (h - 1) * (1 - ratio) / (1 - ratio**H)
    w = geometric_weights(H, ratio, dtype=dtype, device=device)
    torch.testing.assert_close(w, _ref(expected, dtype, device), **tol)
    assert bool((w[1:] <= w[:-1]).all())


@pytest.mark.parametrize(
    "H, unnormalised",
    [
        (1, [1]),
        (2, [1, 1]),
        (3, [2, 1, 1]),
        (5, [5, 3, 2, 1, 1]),
        (8, [21, 13, 8, 5, 3, 2, 1, 1]),
    ],
)
def test_fibonacci_weights_explicit(H, unnormalised, dtype, device, tol):
    expected = np.array(unnormalised, dtype=np.float64) / sum(unnormalised)
    w = fibonacci_weights(H, dtype=dtype, device=device)
    assert w.shape == (H,) and w.dtype == dtype and w.device.type == device.type
    torch.testing.assert_close(w, _ref(expected, dtype, device), **tol)


def test_fibonacci_weights_large_H_ratio_tends_to_golden():
    H = 60
    w = fibonacci_weights(H, dtype=torch.float64)
    phi = (1 + math.sqrt(5)) / 2
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=torch.float64))
    # Leading weights: F_H / (F_{H+2} - 1) -> 1/phi^2.
    assert abs(float(w[0]) - phi**-2) < 1e-12
    assert abs(float(w[1] / w[0]) - 1 / phi) < 1e-12
    assert float(w[-1]) == float(w[-2]) > 0
    # Large H stays finite (exact integers inside), no overflow to inf/nan.
    big = fibonacci_weights(2000, dtype=torch.float64)
    assert bool(torch.isfinite(big).all()) and abs(float(big.sum()) - 1) < 1e-12


@pytest.mark.parametrize("fn", [uniform_weights, fibonacci_weights, lambda H, **k: geometric_weights(H, 0.5, **k)])
@pytest.mark.parametrize(
    "bad_H, exc", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError)]
)
def test_schemes_reject_bad_num_heads(fn, bad_H, exc):
    with pytest.raises(exc, match="num_heads must"):
        fn(bad_H)


@pytest.mark.parametrize(
    "ratio, exc",
    [
        (0.0, ValueError),
        (-0.5, ValueError),
        (1.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("0.5", TypeError),
        (None, TypeError),
    ],
)
def test_geometric_rejects_bad_ratio(ratio, exc):
    with pytest.raises(exc, match="ratio"):
        geometric_weights(4, ratio)


@pytest.mark.parametrize("fn", [uniform_weights, fibonacci_weights])
def test_schemes_reject_bad_dtype_and_device(fn):
    with pytest.raises(TypeError, match="dtype"):
        fn(3, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        fn(3, dtype="float32")
    with pytest.raises(ValueError, match="device"):
        fn(3, device="not-a-device")
    with pytest.raises(TypeError, match="device"):
        fn(3, device=0.5)


def test_schemes_default_dtype_is_torch_default():
    assert uniform_weights(3).dtype == torch.get_default_dtype()
    assert geometric_weights(3, 0.5).device.type == "cpu"


# ---------------------------------------------------------------- optimal weights


def test_optimal_weights_h2_closed_form(dtype, device, tol):
    M11, M22, M12 = 2.0, 0.7, 0.3
    M = _ref([[M11, M12], [M12, M22]], dtype, device)
    a1 = (M22 - M12) / (M11 + M22 - 2 * M12)
    w = optimal_weights(M)
    assert w.dtype == dtype and w.device.type == device.type
    torch.testing.assert_close(w, _ref([a1, 1 - a1], dtype, device), **tol)


@pytest.mark.parametrize("H", [1, 3, 8])
def test_optimal_weights_match_scipy_solve(H, dtype, device, tol, generator):
    M = _random_spd(H, generator, dtype, device)
    M64 = M.double().cpu().numpy()
    z = scipy.linalg.solve(M64, np.ones(H), assume_a="pos")
    expected = z / z.sum()
    w = optimal_weights(M)
    torch.testing.assert_close(w, _ref(expected, dtype, device), **tol)
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=dtype, device=device), **tol)
    # Its MSE is 1 / (1ᵀ M⁻¹ 1).
    torch.testing.assert_close(combination_mse(w, M), torch.tensor(1.0 / z.sum(), dtype=dtype, device=device), **tol)


def test_optimal_weights_batched(dtype, device, tol, generator):
    M = _random_spd(4, generator, dtype, device, batch=(3, 2))
    w = optimal_weights(M)
    assert w.shape == (3, 2, 4)
    for i in range(3):
        for j in range(2):
            z = np.linalg.solve(M[i, j].double().cpu().numpy(), np.ones(4))
            torch.testing.assert_close(w[i, j], _ref(z / z.sum(), dtype, device), **tol)


def test_optimal_weights_diagonal_are_inverse_variance(dtype, device, tol):
    V = np.array([1.0, 2.0, 4.0, 8.0])
    w = optimal_weights(_ref(np.diag(V), dtype, device))
    torch.testing.assert_close(w, _ref((1 / V) / (1 / V).sum(), dtype, device), **tol)
    # Independent heads with geometric variances: the optimum is geometric with ratio 1/q.
    torch.testing.assert_close(w, geometric_weights(4, 0.5, dtype=dtype, device=device), **tol)


def test_optimal_weights_beat_perturbations_and_schemes(device, generator):
    dtype = torch.float64
    H = 6
    M = _random_spd(H, generator, dtype, device)
    w = optimal_weights(M)
    best = combination_mse(w, M)
    d = torch.randn(500, H, generator=generator, dtype=dtype, device=device)
    d = d - d.mean(-1, keepdim=True)  # keep the sum at one
    for scale in (1e-3, 1e-1, 1.0):
        worse = combination_mse(w + scale * d, M)
        assert bool((worse > best).all())
        # Excess is exactly the quadratic form of the perturbation (first-order term vanishes).
        torch.testing.assert_close(worse - best, combination_mse(scale * d, M))
    for scheme in (
        uniform_weights(H, dtype=dtype, device=device),
        fibonacci_weights(H, dtype=dtype, device=device),
        geometric_weights(H, 0.7, dtype=dtype, device=device),
    ):
        assert float(combination_mse(scheme, M)) >= float(best)


def test_optimal_weights_ridge(dtype, device, tol):
    M = _ref([[1.0, 0.2, 0.0], [0.2, 3.0, 0.5], [0.0, 0.5, 9.0]], dtype, device)
    lam = 0.3
    M64 = M.double().cpu().numpy()
    shifted = M64 + lam * np.trace(M64) / 3 * np.eye(3)
    z = np.linalg.solve(shifted, np.ones(3))
    torch.testing.assert_close(optimal_weights(M, ridge=lam), _ref(z / z.sum(), dtype, device), **tol)
    # Scale free: multiplying M changes nothing.
    torch.testing.assert_close(optimal_weights(7.0 * M, ridge=lam), optimal_weights(M, ridge=lam), **tol)
    # Heavy shrinkage tends to uniform.
    torch.testing.assert_close(
        optimal_weights(M, ridge=1e6), uniform_weights(3, dtype=dtype, device=device), rtol=0, atol=1e-5
    )


def test_optimal_weights_singular_needs_ridge(dtype, device):
    # Two identical heads: M is singular.
    M = _ref([[1.0, 1.0, 0.2], [1.0, 1.0, 0.2], [0.2, 0.2, 2.0]], dtype, device)
    with pytest.raises(ValueError, match="M must be symmetric positive definite"):
        optimal_weights(M)
    w = optimal_weights(M, ridge=1e-2)
    assert bool(torch.isfinite(w).all())
    # The twins get equal weight by symmetry (up to the rounding a near-singular solve amplifies).
    torch.testing.assert_close(w[0], w[1], rtol=1e-3 if dtype == torch.float32 else 1e-10, atol=0)


@pytest.mark.parametrize(
    "M, exc, match",
    [
        (torch.ones(2, 3, dtype=torch.float64), ValueError, "M must be square"),
        (torch.ones(3, dtype=torch.float64), ValueError, "M must have at least 2"),
        (torch.zeros(0, 0, dtype=torch.float64), ValueError, "M must be at least 1 x 1"),
        (torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=torch.float64), ValueError, "M must be symmetric"),
        (torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64), ValueError, "positive definite"),
        (-torch.eye(3, dtype=torch.float64), ValueError, "positive definite"),
        (torch.tensor([[1.0, math.nan], [math.nan, 1.0]], dtype=torch.float64), ValueError, "M must be finite"),
        (torch.eye(2, dtype=torch.int64), TypeError, "M must have a floating"),
        (np.eye(2), TypeError, "M must be a torch.Tensor"),
    ],
)
def test_optimal_weights_rejects_bad_M(M, exc, match):
    with pytest.raises(exc, match=match):
        optimal_weights(M)


@pytest.mark.parametrize(
    "ridge, exc", [(-0.1, ValueError), (math.nan, ValueError), (True, TypeError), ("1", TypeError)]
)
def test_optimal_weights_rejects_bad_ridge(ridge, exc):
    with pytest.raises(exc, match="ridge"):
        optimal_weights(torch.eye(2, dtype=torch.float64), ridge=ridge)


def test_symmetry_tolerance_accepts_rounding(dtype):
    M = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=dtype)
    M[0, 1] += 10 * torch.finfo(dtype).eps
    optimal_weights(M)  # rounding-level asymmetry is accepted


# ---------------------------------------------------------------- quadratic form and Monte Carlo helpers


def test_combination_mse_matches_explicit(dtype, device, tol, generator):
    M = _random_spd(5, generator, dtype, device)
    a = torch.randn(5, generator=generator, dtype=torch.float64, device=device).to(dtype)
    a64, M64 = a.double().cpu().numpy(), M.double().cpu().numpy()
    expected = sum(a64[i] * M64[i, j] * a64[j] for i in range(5) for j in range(5))
    torch.testing.assert_close(combination_mse(a, M), torch.tensor(expected, dtype=dtype, device=device), **tol)


def test_combination_mse_rejects_wrong_size():
    with pytest.raises(ValueError, match="weights must have one entry per row of M"):
        combination_mse(torch.ones(3, dtype=torch.float64) / 3, torch.eye(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="weights has dtype"):
        combination_mse(torch.ones(2, dtype=torch.float32), torch.eye(2, dtype=torch.float64))


def _fake_predictions(generator, dtype, device, R=40, H=4, m=7):
    target = torch.randn(m, generator=generator, dtype=torch.float64, device=device)
    scale = torch.tensor([0.2, 1.0, 0.5, 2.0], dtype=torch.float64, device=device)[:H]
    common = torch.randn(R, 1, m, generator=generator, dtype=torch.float64, device=device)
    own = torch.randn(R, H, m, generator=generator, dtype=torch.float64, device=device)
    bias = torch.linspace(0.0, 0.3, H, dtype=torch.float64, device=device)[:, None]
    pred = target + bias + scale[:, None] * (0.6 * common + 0.8 * own)
    return pred.to(dtype), target.to(dtype)


def test_error_second_moments_matches_loop(dtype, device, tol, generator):
    pred, target = _fake_predictions(generator, dtype, device)
    e = (pred - target).double().cpu().numpy()
    R, H, m = e.shape
    expected = np.zeros((H, H))
    for r in range(R):
        for j in range(m):
            expected += np.outer(e[r, :, j], e[r, :, j])
    expected /= R * m
    M = error_second_moments(pred, target)
    assert M.shape == (H, H) and M.dtype == dtype and M.device.type == device.type
    torch.testing.assert_close(M, _ref(expected, dtype, device), **tol)
    torch.testing.assert_close(M, M.mT, rtol=0, atol=0)


def test_quadratic_form_equals_replicate_mse(dtype, device, tol, generator):
    """For weights summing to one, αᵀ M̂ α is exactly the mean per-replicate squared error."""
    pred, target = _fake_predictions(generator, dtype, device)
    M = error_second_moments(pred, target)
    H = pred.shape[1]
    schemes = torch.stack(
        [
            uniform_weights(H, dtype=dtype, device=device),
            fibonacci_weights(H, dtype=dtype, device=device),
            geometric_weights(H, 0.3, dtype=dtype, device=device),
            optimal_weights(M),
        ]
    )
    per_rep = replicate_mse(pred, target, schemes)
    assert per_rep.shape == (4, pred.shape[0])
    torch.testing.assert_close(per_rep.mean(-1), combination_mse(schemes, M), **tol)


def test_replicate_mse_matches_loop(dtype, device, tol, generator):
    pred, target = _fake_predictions(generator, dtype, device, R=5)
    w = torch.tensor([0.5, -0.25, 1.0, 0.1], dtype=dtype, device=device)  # need not sum to one
    p, f, a = pred.double().cpu().numpy(), target.double().cpu().numpy(), w.double().cpu().numpy()
    expected = [np.mean((sum(a[h] * p[r, h] for h in range(4)) - f) ** 2) for r in range(5)]
    torch.testing.assert_close(replicate_mse(pred, target, w), _ref(expected, dtype, device), **tol)


def test_replicate_mse_rejects_wrong_sizes(generator):
    pred, target = _fake_predictions(generator, torch.float64, torch.device("cpu"))
    with pytest.raises(ValueError, match="weights must have one entry per head"):
        replicate_mse(pred, target, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="target must have shape"):
        replicate_mse(pred, target[:-1], torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="predictions must have shape"):
        replicate_mse(pred[None], target, torch.ones(4, dtype=torch.float64))


def test_rank_heads(dtype, device, tol, generator):
    pred, target = _fake_predictions(generator, dtype, device, R=200)
    ranking = rank_heads(pred, target)
    assert isinstance(ranking, HeadRanking)
    # Construction: head scales 0.2, 1.0, 0.5, 2.0 with small biases -> order 0, 2, 1, 3.
    assert ranking.order.tolist() == [0, 2, 1, 3]
    assert ranking.order.dtype == torch.int64 and ranking.order.device.type == device.type
    per_rep = ((pred - target) ** 2).mean(-1).double().cpu().numpy()
    torch.testing.assert_close(ranking.head_mse, _ref(per_rep.mean(0), dtype, device), **tol)
    torch.testing.assert_close(ranking.head_mse_se, _ref(per_rep.std(0, ddof=1) / math.sqrt(200), dtype, device), **tol)
    torch.testing.assert_close(ranking.head_mse, error_second_moments(pred, target).diagonal(), **tol)


def test_rank_heads_ties_are_stable():
    target = torch.zeros(3, dtype=torch.float64)
    pred = torch.ones(2, 3, 3, dtype=torch.float64)
    pred[:, 1] = 0.5
    ranking = rank_heads(pred, target)
    assert ranking.order.tolist() == [1, 0, 2]
    assert ranking.head_mse_se.tolist() == [0.0, 0.0, 0.0]


def test_assign_by_rank(dtype, device):
    w = fibonacci_weights(5, dtype=dtype, device=device)
    order = torch.tensor([3, 0, 4, 1, 2], device=device)
    out = assign_by_rank(w, order)
    assert out[3] == w[0] and out[0] == w[1] and out[4] == w[2] and out[1] == w[3] and out[2] == w[4]
    # Inverse: reading the head-order weights in rank order gives back the scheme.
    torch.testing.assert_close(out[order], w, rtol=0, atol=0)
    batched = assign_by_rank(torch.stack([w, w.flip(0)]), order)
    torch.testing.assert_close(batched[0], out, rtol=0, atol=0)


@pytest.mark.parametrize(
    "order, exc, match",
    [
        (torch.tensor([0, 1, 1]), ValueError, "order must be a permutation"),
        (torch.tensor([0, 1]), ValueError, "order must have shape"),
        (torch.tensor([0.0, 1.0, 2.0]), TypeError, "order must have an integer dtype"),
        ([0, 1, 2], TypeError, "order must be a torch.Tensor"),
    ],
)
def test_assign_by_rank_rejects_bad_order(order, exc, match):
    with pytest.raises(exc, match=match):
        assign_by_rank(uniform_weights(3, dtype=torch.float64), order)


def test_least_squares_weights_match_numpy_lstsq(dtype, device, tol):
    from nwlib import least_squares_weights

    g = torch.Generator(device=device).manual_seed(3)
    p = torch.randn(40, 4, 25, generator=g, dtype=dtype, device=device)
    y = torch.randn(40, 25, generator=g, dtype=dtype, device=device)
    for target in (y, y[0]):
        a = least_squares_weights(p, target)
        X = p.permute(0, 2, 1).reshape(-1, 4).double().cpu().numpy()
        b = target.expand(40, 25).reshape(-1).double().cpu().numpy()
        ref = np.linalg.lstsq(X, b, rcond=None)[0]
        assert a.dtype == dtype and a.device == p.device
        torch.testing.assert_close(
            a.cpu().double(), torch.from_numpy(ref), rtol=100 * tol["rtol"], atol=100 * tol["atol"]
        )
    # Not constrained to sum to one: summing heads that each carry half the signal gives weights (1, 1).
    u = torch.randn(40, 25, generator=g, dtype=dtype, device=device)
    half = torch.stack([0.5 * y + u, 0.5 * y - u], dim=1)
    torch.testing.assert_close(
        least_squares_weights(half, y).double().cpu(), torch.ones(2, dtype=torch.float64), rtol=1e-4, atol=1e-4
    )
    with pytest.raises(ValueError, match="target"):
        least_squares_weights(p, y[:, :3])
    with pytest.raises(ValueError, match="ridge"):
        least_squares_weights(p, y, ridge=-1.0)
