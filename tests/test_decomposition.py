"""Tests of nwlib.decomposition against explicit numpy computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nwlib import Decomposition, IntegratedDecomposition, decompose


def _random_predictions(r, h, m, *, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    # A common factor makes the heads correlated and a per-head offset gives them bias.
    common = torch.randn(r, 1, m, generator=g, dtype=dtype, device=device)
    own = torch.randn(r, h, m, generator=g, dtype=dtype, device=device)
    offset = torch.randn(1, h, m, generator=g, dtype=dtype, device=device)
    target = torch.randn(m, generator=g, dtype=dtype, device=device)
    weights = torch.rand(h, generator=g, dtype=dtype, device=device) + 0.1
    return 0.7 * common + own + offset, target, weights


def _numpy_reference(p: np.ndarray, f: np.ndarray, a: np.ndarray) -> dict[str, np.ndarray]:
    """Term by term, with explicit loops over heads: independent of the library's algebra."""
    r, h, m = p.shape
    mean = p.sum(axis=0) / r
    cov = np.zeros((h, h, m))
    for i in range(h):
        for j in range(h):
            cov[i, j] = ((p[:, i] - mean[i]) * (p[:, j] - mean[j])).sum(axis=0) / (r - 1)
    ens = np.zeros((r, m))
    for i in range(h):
        ens += a[i] * p[:, i]
    variance = sum(a[i] ** 2 * cov[i, i] for i in range(h))
    covariance = sum(a[i] * a[j] * cov[i, j] for i in range(h) for j in range(h) if i != j)
    corr = np.array([[cov[i, j] / np.sqrt(cov[i, i] * cov[j, j]) for j in range(h)] for i in range(h)])
    return {
        "ensemble_mean": (a[:, None] * mean).sum(axis=0),
        "mse": ((ens - f) ** 2).mean(axis=0),
        # unbiased: the squared replicate mean minus the variance of the ensemble mean
        "bias_sq": ((a[:, None] * mean).sum(axis=0) - f) ** 2 - ens.var(axis=0, ddof=1) / r,
        "variance": variance,
        "covariance": covariance,
        "head_variance": np.array([cov[i, i] for i in range(h)]),
        "head_covariance": cov,
        "head_correlation": corr,
    }


def _jackknife_reference(p: np.ndarray, f: np.ndarray, a: np.ndarray) -> dict[str, float]:
    """Delete-one jackknife by brute force: recompute every term R times."""
    r = p.shape[0]

    def terms(q):
        ref = _numpy_reference(q, f, a)
        return np.array([ref[k].mean() for k in ("mse", "bias_sq", "variance", "covariance")])

    loo = np.array([terms(np.delete(p, i, axis=0)) for i in range(r)])
    se = np.sqrt((r - 1) / r * ((loo - loo.mean(axis=0)) ** 2).sum(axis=0))
    return dict(zip(("mse_se", "bias_sq_se", "variance_se", "covariance_se"), se, strict=True))


def test_matches_bruteforce_numpy(device):
    p, f, a = _random_predictions(40, 4, 7, dtype=torch.float64, device=device)
    dec = decompose(p, f, a)
    ref = _numpy_reference(p.cpu().numpy(), f.cpu().numpy(), a.cpu().numpy())
    for name, expected in ref.items():
        got = getattr(dec, name)
        assert got.device == p.device and got.dtype == p.dtype
        torch.testing.assert_close(got.cpu(), torch.from_numpy(np.asarray(expected)), rtol=1e-12, atol=1e-12)


def test_identity_to_rounding(dtype, device):
    p, f, a = _random_predictions(300, 5, 11, dtype=dtype, device=device, seed=3)
    for weights in (None, a):
        dec = decompose(p, f, weights)
        eps = torch.finfo(dtype).eps
        scale = dec.mse.abs().max()
        assert (dec.mse - (dec.bias_sq + dec.variance + dec.covariance)).abs().max() <= 50 * eps * scale
        integ = dec.integrated()
        assert math.isclose(integ.mse, integ.bias_sq + integ.variance + integ.covariance, rel_tol=100 * eps)


def test_single_head_is_bias_plus_variance(dtype, device, tol):
    p, f, _ = _random_predictions(200, 1, 9, dtype=dtype, device=device, seed=5)
    dec = decompose(p, f)
    assert torch.equal(dec.covariance, torch.zeros_like(dec.covariance))
    torch.testing.assert_close(dec.mse, dec.bias_sq + dec.variance, **tol)
    # Textbook unbiased estimates: sample variance, and (mean - f)^2 less the variance of the mean.
    x = p[:, 0]
    torch.testing.assert_close(dec.variance, x.var(dim=0, correction=1), **tol)
    torch.testing.assert_close(dec.bias_sq, (x.mean(0) - f) ** 2 - x.var(dim=0, correction=1) / 200, **tol)
    torch.testing.assert_close(dec.head_correlation, torch.ones_like(dec.head_correlation), **tol)
    assert math.isnan(dec.integrated().mean_correlation)


def test_permuting_heads_with_weights_is_invariant(dtype, device, tol):
    p, f, a = _random_predictions(100, 6, 5, dtype=dtype, device=device, seed=7)
    perm = torch.tensor([3, 0, 5, 1, 4, 2], device=device)
    dec, dec_p = decompose(p, f, a), decompose(p[:, perm], f, a[perm])
    for name in ("mse", "bias_sq", "variance", "covariance", "ensemble_mean"):
        torch.testing.assert_close(getattr(dec_p, name), getattr(dec, name), **tol)
    torch.testing.assert_close(dec_p.head_covariance, dec.head_covariance[perm][:, perm], **tol)
    # Permuting heads without their weights does change the ensemble: the test can fail.
    assert not torch.allclose(decompose(p[:, perm], f, a).mse, dec.mse, **tol)


def test_weights_need_not_sum_to_one(device):
    p, f, _ = _random_predictions(50, 3, 4, dtype=torch.float64, device=device, seed=9)
    a = torch.tensor([2.0, -0.5, 1.5], dtype=torch.float64, device=device)
    dec = decompose(p, f, a)
    ens = (p * a[None, :, None]).sum(1)
    torch.testing.assert_close(dec.bias_sq, (ens.mean(0) - f) ** 2 - ens.var(0) / 50)
    torch.testing.assert_close(dec.mse, ((ens - f) ** 2).mean(0))


def test_default_weights_are_uniform(dtype, device, tol):
    p, f, _ = _random_predictions(60, 4, 3, dtype=dtype, device=device, seed=2)
    dec = decompose(p, f)
    torch.testing.assert_close(dec.weights, torch.full((4,), 0.25, dtype=dtype, device=device))
    torch.testing.assert_close(dec.ensemble_mean, p.mean(dim=(0, 1)), **tol)


def test_integrated_standard_errors_match_bruteforce_jackknife(device):
    p, f, a = _random_predictions(30, 3, 5, dtype=torch.float64, device=device, seed=11)
    integ = decompose(p, f, a).integrated()
    ref = _jackknife_reference(p.cpu().numpy(), f.cpu().numpy(), a.cpu().numpy())
    for name, expected in ref.items():
        assert math.isclose(getattr(integ, name), expected, rel_tol=1e-9), name
    # For the mse the jackknife equals the plain standard error of the mean.
    ens = (p * a[None, :, None]).sum(1)
    ise = ((ens - f) ** 2).mean(-1)
    assert math.isclose(integ.mse_se, float(ise.std() / math.sqrt(30)), rel_tol=1e-9)


def test_integrated_values_are_point_means(dtype, device):
    p, f, a = _random_predictions(80, 3, 6, dtype=dtype, device=device, seed=4)
    dec = decompose(p, f, a)
    integ = dec.integrated()
    assert isinstance(integ, IntegratedDecomposition) and integ.replicates == 80
    rel = 1e-5 if dtype == torch.float32 else 1e-12
    for name in ("mse", "bias_sq", "variance", "covariance"):
        assert math.isclose(getattr(integ, name), float(getattr(dec, name).double().mean()), rel_tol=rel)
    off = ~torch.eye(3, dtype=torch.bool, device=device)
    assert math.isclose(integ.mean_correlation, float(dec.head_correlation[off].double().mean()), rel_tol=rel)
    assert set(integ.as_dict()) >= {"mse", "mse_se", "mean_correlation"}


def test_equicorrelated_form_is_exact_for_uniform_weights(device):
    p, f, _ = _random_predictions(500, 4, 8, dtype=torch.float64, device=device, seed=6)
    integ = decompose(p, f).integrated()
    h, v, c = 4, integ.mean_head_variance, integ.mean_head_covariance
    rho = c / v
    assert math.isclose(integ.variance + integ.covariance, v * (rho + (1 - rho) / h), rel_tol=1e-12)


def test_standard_errors_are_calibrated(device):
    """Jackknife SE of the variance term against its sampling spread over many repetitions."""
    g = torch.Generator(device=device).manual_seed(21)
    reps, r, m = 300, 200, 10
    p = torch.randn(reps, r, 1, m, generator=g, dtype=torch.float64, device=device)
    f = torch.zeros(m, dtype=torch.float64, device=device)
    vals, ses = [], []
    for k in range(reps):
        integ = decompose(p[k], f).integrated()
        vals.append(integ.variance)
        ses.append(integ.variance_se)
    spread = float(np.std(vals, ddof=1))
    # Var of a sample variance of R standard normals is about 2/R, averaged over m points.
    assert math.isclose(spread, math.sqrt(2 / r / m), rel_tol=0.15)
    assert math.isclose(float(np.mean(ses)), spread, rel_tol=0.15)


def test_bias_is_unbiased_where_the_plug_in_overshoots(device):
    """Known bias b and noise sd s: over many small Monte Carlo runs the estimate averages b²,
    whereas the plug-in (mean - f)² averages b² + s²/R (the bias the fix removes)."""
    g = torch.Generator(device=device).manual_seed(5)
    runs, r, m, b, s = 4000, 5, 3, 0.2, 1.0
    p = b + s * torch.randn(runs, r, 2, m, generator=g, dtype=torch.float64, device=device)
    f = torch.zeros(m, dtype=torch.float64, device=device)
    est = torch.stack([decompose(p[k], f).bias_sq.mean() for k in range(runs)])
    plug_in = p.mean(dim=(1, 2)).pow(2).mean(-1)  # uniform weights over 2 heads: Var of the mean is s²/(2R)
    se = float(est.std() / math.sqrt(runs))
    assert abs(float(est.mean()) - b**2) < 4 * se
    overshoot = float(plug_in.mean()) - b**2
    assert abs(overshoot - s**2 / (2 * r)) < 4 * float(plug_in.std() / math.sqrt(runs))
    assert overshoot > 8 * se  # the plug-in's bias is resolvable at this size: the test could fail


def test_zero_variance_head_gives_nan_correlation(device):
    p, f, _ = _random_predictions(20, 2, 3, dtype=torch.float64, device=device)
    p[:, 1] = 1.0
    dec = decompose(p, f)
    assert torch.isnan(dec.head_correlation[0, 1]).all()
    assert isinstance(dec, Decomposition)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"predictions": torch.zeros(3, 4)}, ValueError, "predictions"),
        ({"predictions": torch.zeros(0, 2, 3)}, ValueError, "predictions"),
        ({"predictions": torch.zeros(3, 2, 3, dtype=torch.int64)}, TypeError, "predictions"),
        ({"predictions": [[[0.0]]]}, TypeError, "predictions"),
        ({"target": torch.zeros(4)}, ValueError, "target"),
        ({"target": torch.zeros(3, dtype=torch.float64)}, TypeError, "target"),
        ({"weights": torch.zeros(3)}, ValueError, "weights"),
        ({"weights": torch.tensor([1.0, float("nan")])}, ValueError, "weights"),
        ({"weights": torch.ones(2, dtype=torch.float64)}, TypeError, "weights"),
    ],
)
def test_bad_input_is_rejected(kwargs, exc, match):
    args = {"predictions": torch.zeros(5, 2, 3), "target": torch.zeros(3), "weights": None}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        decompose(args["predictions"], args["target"], args["weights"])


def test_noise_covariance_matches_monte_carlo_over_the_noise(device):
    """Fixed design, fresh noise: the empirical covariance of two linear smoothers is sigma^2 W_h W_g^T."""
    from nwlib import nadaraya_watson_weights, noise_covariance

    g = torch.Generator(device=device).manual_seed(8)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64, device=device)
    z = torch.randn(5, 3, generator=g, dtype=torch.float64, device=device)
    proj = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, device=device)
    w = nadaraya_watson_weights(z @ proj, x @ proj, kernel="gaussian", bandwidth=0.8)  # (2, 5, 60)
    sigma, draws = 0.7, 20000
    eps = sigma * torch.randn(draws, 60, generator=g, dtype=torch.float64, device=device)
    est = torch.einsum("hmn,rn->rhm", w, eps)
    emp = decompose(est, torch.zeros(5, dtype=torch.float64, device=device)).head_covariance
    pred = noise_covariance(w, sigma)
    torch.testing.assert_close(emp, pred, rtol=0.1, atol=5 * float(pred.abs().max()) / math.sqrt(draws))
    assert bool((pred >= 0).all())  # non-negative weights: the shared-data floor
    with pytest.raises(ValueError, match="noise_sd"):
        noise_covariance(w, -1.0)
