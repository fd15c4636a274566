"""Tests of nwlib.combination against explicit formulas, loops and Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nwlib import decompose, nadaraya_watson_weights, noise_covariance
from nwlib.combination import (
    Equicorrelation,
    conditional_moments,
    covariance_split,
    equicorrelation,
    grouped_jackknife,
    paired_difference,
)


def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ---------------------------------------------------------------- paired_difference


def test_paired_difference_matches_numpy(dtype, device, tol):
    g = _gen(0, device)
    a = torch.randn(3, 50, generator=g, dtype=torch.float64, device=device)
    b = a + 0.1 * torch.randn(3, 50, generator=g, dtype=torch.float64, device=device)
    out = paired_difference(a.to(dtype), b.to(dtype))
    d = (a - b).cpu().numpy()
    torch.testing.assert_close(out.mean.cpu().double(), torch.as_tensor(d.mean(-1)), **tol)
    torch.testing.assert_close(out.se.cpu().double(), torch.as_tensor(d.std(-1, ddof=1) / math.sqrt(50)), **tol)


def test_paired_difference_is_smaller_than_unpaired_for_correlated_runs():
    g = _gen(1, "cpu")
    common = torch.randn(400, generator=g, dtype=torch.float64)
    a = common + 0.05 * torch.randn(400, generator=g, dtype=torch.float64)
    b = common + 0.05 * torch.randn(400, generator=g, dtype=torch.float64)
    unpaired = math.hypot(float(a.std() / 20), float(b.std() / 20))
    assert float(paired_difference(a, b).se) < 0.1 * unpaired


@pytest.mark.parametrize(
    "a, b, exc, match",
    [
        (torch.zeros(5), torch.zeros(4), ValueError, "b must have the shape"),
        (torch.zeros(1), torch.zeros(1), ValueError, "R >= 2"),
        ([0.0, 1.0], torch.zeros(2), TypeError, "a must be"),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64), TypeError, "b has dtype"),
    ],
)
def test_paired_difference_bad_inputs(a, b, exc, match):
    with pytest.raises(exc, match=match):
        paired_difference(a, b)


# ---------------------------------------------------------------- grouped_jackknife


def test_delete_one_jackknife_of_the_mean_is_the_standard_error(device):
    x = torch.randn(40, generator=_gen(2, device), dtype=torch.float64, device=device)
    est = grouped_jackknife(lambda v: v.mean(), x, groups=40)
    assert math.isclose(float(est.estimate), float(x.mean()), rel_tol=1e-12)
    assert math.isclose(float(est.se), float(x.std(correction=1)) / math.sqrt(40), rel_tol=1e-10)


def test_grouped_jackknife_matches_an_explicit_loop():
    g = _gen(3, "cpu")
    x = torch.randn(60, 2, generator=g, dtype=torch.float64)
    y = torch.randn(60, generator=g, dtype=torch.float64)

    def stat(a, b):  # a ratio: not linear in the replicates
        return torch.stack([a[:, 0].var() / a[:, 1].var(), (a[:, 0] * b).mean()])

    est = grouped_jackknife(stat, x, y, groups=6)
    loo = []
    for k in range(6):
        idx = np.setdiff1d(np.arange(60), np.arange(10 * k, 10 * k + 10))
        loo.append(stat(x[idx], y[idx]).numpy())
    loo = np.array(loo)
    ref = np.sqrt(5 / 6 * ((loo - loo.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose(est.se.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(est.estimate.numpy(), stat(x, y).numpy(), rtol=1e-12)


def test_grouped_jackknife_standard_error_is_calibrated():
    # Over many batches the jackknife SE of a variance ratio matches the spread of the ratio.
    g = _gen(4, "cpu")
    ratios, ses = [], []
    for _ in range(300):
        x = torch.randn(100, 2, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0], dtype=torch.float64)
        est = grouped_jackknife(lambda a: a[:, 0].var() / a[:, 1].var(), x, groups=20)
        ratios.append(float(est.estimate))
        ses.append(float(est.se))
    spread = float(np.std(ratios, ddof=1))
    assert 0.8 < float(np.mean(ses)) / spread < 1.25


@pytest.mark.parametrize(
    "arrays, groups, exc, match",
    [
        ((torch.zeros(10),), 3, ValueError, "groups must divide"),
        ((torch.zeros(10),), 20, ValueError, "groups must divide"),
        ((torch.zeros(10),), 1, ValueError, "groups must be >= 2"),
        ((torch.zeros(10),), 2.0, TypeError, "groups must be an int"),
        ((torch.zeros(10), torch.zeros(8)), 2, ValueError, "arrays\\[1\\] has 8 replicates"),
        ((), 2, ValueError, "arrays must contain"),
    ],
)
def test_grouped_jackknife_bad_inputs(arrays, groups, exc, match):
    with pytest.raises(exc, match=match):
        grouped_jackknife(lambda *a: a[0].mean(), *arrays, groups=groups)


def test_grouped_jackknife_needs_a_callable():
    with pytest.raises(TypeError, match="statistic must be callable"):
        grouped_jackknife(1.0, torch.zeros(4), groups=2)


# ---------------------------------------------------------------- the equicorrelated law (equicorrelation)

M = 7


def _predictions(dtype=torch.float64, device="cpu", r_count=15, members=4, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    common = torch.randn(r_count, 1, M, generator=g, dtype=torch.float64, device=device)
    own = torch.randn(r_count, members, M, generator=g, dtype=torch.float64, device=device)
    scale = torch.linspace(0.5, 1.5, members, dtype=torch.float64, device=device)[None, :, None]
    return (common + scale * own).to(dtype)  # unequal variances: the summary is still exact


def test_equicorrelation_agrees_with_decompose(dtype, device):
    p = _predictions(dtype, device)
    fit = equicorrelation(p)
    dec = decompose(p, torch.zeros(M, dtype=dtype, device=device)).integrated()
    rel = 1e-5 if dtype == torch.float32 else 1e-12
    assert math.isclose(fit.mean_variance, dec.mean_head_variance, rel_tol=rel)
    assert math.isclose(fit.mean_covariance, dec.mean_head_covariance, rel_tol=rel * 10)
    assert math.isclose(fit.ensemble_variance, dec.variance + dec.covariance, rel_tol=rel)
    assert math.isclose(fit.rho, fit.mean_covariance / fit.mean_variance, rel_tol=1e-12)
    # At its own member count the curve is an identity.
    assert math.isclose(fit.predicted_variance(fit.num_members), fit.ensemble_variance, rel_tol=1e-9)


def test_equicorrelation_jackknife_against_brute_force():
    p = _predictions(r_count=9, members=3, seed=4)
    fit = equicorrelation(p)

    def stats(q):
        d = decompose(q, torch.zeros(M, dtype=q.dtype)).integrated()
        v, c = d.mean_head_variance, d.mean_head_covariance
        return np.array([v, c, c / v, d.variance + d.covariance, c + (v - c) / 7])

    loo = np.stack([stats(torch.cat([p[:r], p[r + 1 :]])) for r in range(9)])
    np.testing.assert_allclose(fit.leave_one_out.numpy(), loo[:, :2], rtol=1e-10)
    se = np.sqrt(8 / 9 * ((loo - loo.mean(0)) ** 2).sum(0))
    got = [
        fit.mean_variance_se,
        fit.mean_covariance_se,
        fit.rho_se,
        fit.ensemble_variance_se,
        fit.predicted_variance_se(7),
    ]
    np.testing.assert_allclose(got, se, rtol=1e-9)


def test_equicorrelation_recovers_a_known_law():
    # sigma^2 = 1 + 1 = 2, rho = 1/2: Var of the mean of 8 members = 2 (1/2 + 1/16) = 1.125.
    g = torch.Generator().manual_seed(11)
    p = torch.randn(3000, 1, 5, generator=g, dtype=torch.float64) + torch.randn(
        3000, 8, 5, generator=g, dtype=torch.float64
    )
    fit = equicorrelation(p)
    assert isinstance(fit, Equicorrelation) and fit.num_members == 8 and fit.replicates == 3000
    assert abs(fit.mean_variance - 2.0) < 4 * fit.mean_variance_se
    assert abs(fit.rho - 0.5) < 4 * fit.rho_se and fit.rho_se < 0.02
    assert abs(fit.predicted_variance(8) - 1.125) < 4 * fit.predicted_variance_se(8)
    assert abs(fit.predicted_variance(2) - 1.5) < 4 * fit.predicted_variance_se(2)


def test_equicorrelation_single_member_and_bad_inputs():
    fit = equicorrelation(_predictions(members=1))
    assert math.isnan(fit.rho) and math.isnan(fit.mean_covariance)
    with pytest.raises(ValueError, match="num_members"):
        fit.predicted_variance(3)
    with pytest.raises(ValueError, match="predictions"):
        equicorrelation(torch.zeros(2, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="predictions"):
        equicorrelation(torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="predictions"):
        equicorrelation(np.zeros((5, 3, 4)))


def test_equicorrelation_reproduces_its_own_batch_at_H(dtype, device):
    p = torch.randn(200, 5, 7, generator=_gen(5, device), dtype=torch.float64, device=device).to(dtype)
    target = torch.zeros(7, dtype=dtype, device=device)
    fit = equicorrelation(p, target)
    it = decompose(p, target).integrated()
    # At H itself the prediction is the batch's own MSE: an identity, not evidence.
    assert math.isclose(fit.mse(5), it.mse, rel_tol=1e-5 if dtype == torch.float32 else 1e-12)


def test_equicorrelation_recovers_known_parameters_and_predicts_fewer_heads():
    # Heads = bias + sqrt(rho V) common + sqrt((1 - rho) V) own: V = 2, rho = 0.3, b = 0.5.
    g = _gen(6, "cpu")
    R, H, m, V, rho, b = 20000, 6, 4, 2.0, 0.3, 0.5
    common = torch.randn(R, 1, m, generator=g, dtype=torch.float64)
    own = torch.randn(R, H, m, generator=g, dtype=torch.float64)
    p = b + math.sqrt(rho * V) * common + math.sqrt((1 - rho) * V) * own
    fit = equicorrelation(p, torch.zeros(m, dtype=torch.float64))
    assert abs(fit.rho - rho) < 0.02 and abs(fit.mean_variance - V) < 0.03 and abs(fit.bias_sq - b**2) < 0.02
    for h in (1, 2, 3):
        exact = b**2 + V * (rho + (1 - rho) / h)
        assert abs(fit.mse(h) - exact) < 0.05
        assert math.isclose(fit.variance_ratio(h), fit.rho + (1 - fit.rho) / h)


def test_equicorrelation_bad_inputs():
    with pytest.raises(ValueError, match="mse needs the squared bias"):
        equicorrelation(torch.randn(10, 2, 3)).mse(2)
    with pytest.raises(ValueError, match="positive variance"):
        equicorrelation(torch.ones(10, 2, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="target must have shape"):
        equicorrelation(torch.randn(10, 2, 3), torch.zeros(4))


# ---------------------------------------------------------------- conditional moments and the covariance split


def _designs(G, H, m, n, generator, dtype=torch.float64, device="cpu"):
    keys = torch.randn(G, H, n, 2, generator=generator, dtype=torch.float64, device=device).to(dtype)
    queries = torch.randn(H, m, 2, generator=generator, dtype=torch.float64, device=device).to(dtype)
    w = nadaraya_watson_weights(queries, keys, kernel="gaussian", bandwidth=0.7)
    f = torch.randn(G, n, generator=generator, dtype=torch.float64, device=device).to(dtype)
    return w, f


def test_conditional_moments_match_loops(dtype, device, tol):
    w, f = _designs(3, 2, 4, 6, _gen(7, device), dtype, device)
    mean, cov = conditional_moments(w, f, 0.7)
    ref_mean = torch.zeros(3, 2, 4, dtype=torch.float64)
    ref_cov = torch.zeros(3, 2, 2, 4, dtype=torch.float64)
    wd, fd = w.double().cpu(), f.double().cpu()
    for g in range(3):
        for h in range(2):
            for j in range(4):
                ref_mean[g, h, j] = sum(wd[g, h, j, i] * fd[g, i] for i in range(6))
                for k in range(2):
                    ref_cov[g, h, k, j] = 0.49 * sum(wd[g, h, j, i] * wd[g, k, j, i] for i in range(6))
    torch.testing.assert_close(mean.cpu().double(), ref_mean, **tol)
    torch.testing.assert_close(cov.cpu().double(), ref_cov, **tol)
    torch.testing.assert_close(cov, noise_covariance(w, 0.7))


def test_noise_part_matches_monte_carlo_noise_for_a_fixed_design():
    g = _gen(8, "cpu")
    w, f = _designs(1, 3, 2, 8, g)
    eps = torch.randn(50000, 8, generator=g, dtype=torch.float64)
    preds = torch.einsum("hmn,rn->rhm", w[0], f[0] + 0.8 * eps)  # (R, H, m)
    emp = decompose(preds, torch.zeros(2, dtype=torch.float64)).head_covariance
    _, cov = conditional_moments(w, f, 0.8)
    torch.testing.assert_close(emp, cov[0], rtol=0.05, atol=2e-3)
    assert bool((cov >= 0).all())  # non-negative weights: the shared-data floor


def test_covariance_split_is_the_law_of_total_covariance():
    # Take G designs as the whole (uniform) population: the exact covariance of the heads over
    # design and noise is then mean(noise) + population covariance of the conditional means.
    g = _gen(9, "cpu")
    G, H, m, n = 5, 3, 2, 6
    w, f = _designs(G, H, m, n, g)
    mean, cov = conditional_moments(w, f, 0.5)
    split = covariance_split(mean, cov)
    # Brute force: enumerate designs, draw many noise vectors per design.
    eps = torch.randn(G, 40000, n, generator=g, dtype=torch.float64)
    preds = torch.einsum("ghmn,grn->grhm", w, f[:, None, :] + 0.5 * eps).reshape(G * 40000, H, m)
    emp = decompose(preds, torch.zeros(m, dtype=torch.float64)).head_covariance
    exact = split.noise + split.design * (G - 1) / G
    torch.testing.assert_close(emp, exact, rtol=0.03, atol=3e-3)
    rho_total, rho_noise, rho_design = split.rho()
    assert math.isclose(rho_total, rho_noise + rho_design, rel_tol=1e-12, abs_tol=1e-15)


def test_covariance_split_design_part_matches_numpy():
    g = _gen(10, "cpu")
    mean = torch.randn(7, 2, 3, generator=g, dtype=torch.float64)
    noise = torch.zeros(7, 2, 2, 3, dtype=torch.float64)
    split = covariance_split(mean, noise)
    for j in range(3):
        np.testing.assert_allclose(split.design[:, :, j].numpy(), np.cov(mean[:, :, j].numpy().T, ddof=1), rtol=1e-12)


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.zeros(2, 1, 3, 4), torch.zeros(2, 5), 1.0), ValueError, "f_values must have shape"),
        ((torch.zeros(1, 3, 4), torch.zeros(1, 4), 1.0), ValueError, "weights must have shape"),
        ((torch.zeros(2, 1, 3, 4), torch.zeros(2, 4), -1.0), ValueError, "noise_sd"),
        ((torch.zeros(2, 1, 3, 4), torch.zeros(2, 4, dtype=torch.float64), 1.0), TypeError, "f_values has dtype"),
    ],
)
def test_conditional_moments_bad_inputs(args, exc, match):
    with pytest.raises(exc, match=match):
        conditional_moments(*args)


@pytest.mark.parametrize(
    "mean, noise, match",
    [
        (torch.zeros(1, 2, 3), torch.zeros(1, 2, 2, 3), "G >= 2"),
        (torch.zeros(4, 2, 3), torch.zeros(4, 2, 3), "noise_cov must have shape"),
    ],
)
def test_covariance_split_bad_inputs(mean, noise, match):
    with pytest.raises(ValueError, match=match):
        covariance_split(mean, noise)
