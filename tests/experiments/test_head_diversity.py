"""Tests of nwlib.experiments.head_diversity: geometry, closed forms, the Monte Carlo machinery and the studies.

Every driver is checked against an independent reference or a case with a known answer: SciPy's principal
angles, torch's MultiheadAttention initialisation, Gauss–Hermite quadrature, numpy least squares, explicit loops
and formulas; and for determinism (same seed, same numbers).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import torch
from scipy.stats import rankdata

from nwlib import decompose, hdi, make_task, random_subspaces, replicate_mse, simulate
from nwlib.evidence import Comparison, estimate
from nwlib.experiments import head_diversity as hd

F64 = torch.float64
SMALL = dict(embed_dim=6, num_heads=2, head_dim=2, noise_sd=0.5, n_train=30, n_eval=16, replicates=6)
SMALL_MC = dict(replicates_fit=10, replicates_confirm=4)


def _design(seed=0, device="cpu", dtype=torch.float32, **changes):
    return hd.make_design(**(SMALL | SMALL_MC | changes), seed=seed, device=device, dtype=dtype)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# Gauss–Hermite nodes for E over z ~ N(0, 1) (probabilists' weights, normalised)
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def _g(t):
    return np.sin(2 * t) + t / 2


# --- geometry ----------------------------------------------------------------------------------


def test_pair_with_angles_has_the_prescribed_angles_by_scipy():
    A, B = hd.pair_with_angles((0.3, 1.2), 7, generator=_gen(1))
    assert A.shape == (7, 2) and B.shape == (7, 2) and A.dtype == F64
    angles = np.sort(scipy.linalg.subspace_angles(A.numpy(), B.numpy()))
    np.testing.assert_allclose(angles, [0.3, 1.2], atol=1e-12)
    assert not torch.allclose(A.T @ A, torch.eye(2, dtype=F64))  # a random, non-orthonormal basis


def test_pair_with_angles_rejects_bad_input():
    with pytest.raises(ValueError, match="embed_dim"):
        hd.pair_with_angles((0.1, 0.2, 0.3), 5, generator=_gen())
    with pytest.raises(TypeError, match="angles"):
        hd.pair_with_angles([], 5, generator=_gen())
    with pytest.raises(TypeError, match="generator"):
        hd.pair_with_angles((0.1,), 4, generator=0)


def test_angle_accuracy_known_cases_and_determinism():
    table = hd.angle_accuracy((1e-4, 1e-9), generator=_gen(2))
    assert list(table.columns) == ["principal_angles", "arccos", "scipy"] and list(table.index) == [1e-4, 1e-9]
    assert table["principal_angles"].max() < 1e-6
    # cos(1e-9) rounds to 1 in float64: arccos of the cosine returns 0, a relative error of exactly 1
    assert table.loc[1e-9, "arccos"] == 1.0
    again = hd.angle_accuracy((1e-4, 1e-9), generator=_gen(2))
    assert table.equals(again)


def test_xavier_key_heads_are_multihead_attentions_key_blocks():
    E, H, seed = 16, 4, 7
    ours = hd.xavier_key_heads(E, H, generator=_gen(seed))
    mha = torch.nn.MultiheadAttention(E, H, bias=False, dtype=F64)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        mha._reset_parameters()  # its first draw is xavier_uniform_ of in_proj_weight
    W_K = mha.in_proj_weight.detach().chunk(3)[1]
    dh = E // H
    assert ours.shape == (H, E, dh)
    for h in range(H):
        torch.testing.assert_close(ours[h], W_K[h * dh : (h + 1) * dh].T, rtol=0, atol=0)


def test_xavier_key_heads_have_the_xavier_law():
    E = 64
    W = hd.xavier_key_heads(E, 8, generator=_gen(3))
    bound = math.sqrt(6 / (E + 3 * E))
    assert float(W.abs().max()) <= bound
    squares = W.pow(2).flatten()
    se = float(squares.std()) / math.sqrt(squares.numel())
    assert abs(float(squares.mean()) - 1 / (2 * E)) < 5 * se
    with pytest.raises(ValueError, match="num_heads"):
        hd.xavier_key_heads(10, 3, generator=_gen())


def _brute_force_hdi(Q):
    H, _, k = Q.shape
    overlaps = [np.linalg.norm(Q[a].T @ Q[b]) ** 2 / k for a in range(H) for b in range(a + 1, H)]
    return 1 - np.mean(overlaps)


def test_random_hdi_point_against_the_law_and_a_numpy_draw():
    point = {"embed_dim": 10, "head_dim": 3, "num_heads": 3, "families": 4000}
    r = hd.random_hdi_point(point, seed=5)
    assert r["law"] == 0.7 and r["embed_dim"] == 10 and r["device"] == "cpu"
    assert abs(r["gap"]) < 5 * r["se"] and math.isclose(r["gap"], r["mean"] - r["law"], abs_tol=1e-12)
    # an independent simulation: QR of numpy Gaussians, the index pair by pair
    rng = np.random.default_rng(0)
    draws = [_brute_force_hdi(np.linalg.qr(rng.standard_normal((3, 10, 3)))[0]) for _ in range(2000)]
    se_np = np.std(draws, ddof=1) / math.sqrt(len(draws))
    assert abs(np.mean(draws) - r["mean"]) < 5 * math.hypot(se_np, r["se"])
    assert hd.random_hdi_point(point, seed=5) == r


def test_random_hdi_point_rejects_bad_points():
    with pytest.raises(ValueError, match="families"):
        hd.random_hdi_point({"embed_dim": 4, "head_dim": 2, "num_heads": 2}, seed=0)
    with pytest.raises(ValueError, match="head_dim"):
        hd.random_hdi_point({"embed_dim": 4, "head_dim": 5, "num_heads": 2, "families": 3}, seed=0)
    with pytest.raises(TypeError, match="seed"):
        hd.random_hdi_point({"embed_dim": 4, "head_dim": 2, "num_heads": 2, "families": 3}, seed=1.5)


def test_random_hdi_check_runs_the_grid_through_the_sweep():
    check = hd.random_hdi_check([[8, 2], [12, 3]], num_heads=3, families=500, seed=1)
    assert list(check.table.columns) == ["D", "d_k", "mean HDI", "SE", "1 - d_k/D", "z"]
    assert check.table["1 - d_k/D"].tolist() == [0.75, 0.75] and len(check.gaps) == 2
    assert all(isinstance(g, Comparison) for g in check.gaps)
    assert check.table["z"].tolist() == [g.z for g in check.gaps]
    again = hd.random_hdi_check([[8, 2], [12, 3]], num_heads=3, families=500, seed=1)
    assert check.table.equals(again.table)
    with pytest.raises(ValueError, match="dims"):
        hd.random_hdi_check([[8, 2, 1]], num_heads=3, families=10, seed=0)


def test_orthogonal_signal_mass_by_brute_force():
    H, k, D = 3, 2, 8
    result = hd.orthogonal_signal_mass(H, k, D, families=500, generator=_gen(4))
    assert result.heads.shape == (500, H, D, k) and result.mass_sums.shape == (500,)
    Q = result.heads[:5]
    for a in range(H):
        torch.testing.assert_close(Q[:, a].mT @ Q[:, a], torch.eye(k, dtype=F64).expand(5, k, k))
        for b in range(a + 1, H):
            assert float((Q[:, a].mT @ Q[:, b]).abs().max()) < 1e-12
    # ||Q_h^T e_1||^2 is the squared norm of row 0 of each head's orthonormal basis
    by_rows = result.heads[:, :, 0, :].pow(2).sum((-1, -2))
    torch.testing.assert_close(result.mass_sums, by_rows)
    assert float(result.mass_sums.max()) <= 1 + 1e-12
    se = float(result.mass_sums.std()) / math.sqrt(500)
    assert abs(float(result.mass_sums.mean()) - H * k / D) < 5 * se
    with pytest.raises(ValueError, match="num_heads"):
        hd.orthogonal_signal_mass(3, 3, 8, families=2, generator=_gen())


# --- closed forms --------------------------------------------------------------------------------


def _head_limit(c, s):
    """E[g(c s + sqrt(1 - c^2) z)] over z by Gauss–Hermite: what a head with signal share c^2 learns at s."""
    return np.sum(_WEIGHTS[:, None] * _g(c * s + math.sqrt(1 - c**2) * _NODES[:, None]), axis=0)


@pytest.mark.parametrize("c", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_head_signal_variance_against_gauss_hermite(c):
    m = _head_limit(c, _NODES)  # m(t) at t's nodes
    mean = np.sum(_WEIGHTS * m)
    variance = np.sum(_WEIGHTS * (m - mean) ** 2)
    assert math.isclose(hd.head_signal_variance(c), variance, rel_tol=1e-10, abs_tol=1e-14)


def test_head_signal_variance_at_one_is_var_f():
    var_f = np.sum(_WEIGHTS * _g(_NODES) ** 2) - np.sum(_WEIGHTS * _g(_NODES)) ** 2
    assert math.isclose(hd.head_signal_variance(1.0), var_f, rel_tol=1e-12)
    with pytest.raises(ValueError, match="c"):
        hd.head_signal_variance(1.5)


def test_additive_residual_against_quadrature_for_one_tilted_head():
    task = make_task("single_index", 3, noise_sd=0.5)
    a = 0.7
    Q = torch.tensor([[[math.cos(a)], [math.sin(a)], [0.0]]], dtype=F64)  # one head on u = (cos a, sin a, 0)
    x = torch.randn(5, 3, generator=_gen(6), dtype=F64)
    s = (x @ Q[0]).squeeze(-1).numpy()
    # x_1 = cos(a) s + sin(a) w with w independent of s: E[g(x_1) | s] by quadrature
    expected = task.f(x).numpy() - _head_limit(math.cos(a), s)
    np.testing.assert_allclose(hd.additive_residual(task, Q, x).numpy(), expected, atol=1e-10)
    # a head that contains e_1 learns f itself
    e1 = torch.eye(3, dtype=F64)[:, :1][None]
    assert float(hd.additive_residual(task, e1, x).abs().max()) < 1e-12
    with pytest.raises(ValueError, match="task"):
        hd.additive_residual(make_task("isotropic", 3), Q, x)


def test_first_order_noise_cov_is_the_closed_form_product():
    b, sigma, n, H = 0.6, 0.5, 200, 4
    beta = 1 / b**2

    def phi(t):
        return (1 + beta) ** 2 / math.sqrt(
            (1 + 2 * beta + beta**2 * math.sin(t) ** 2) ** 2 - beta**2 * math.cos(t) ** 2
        )

    angles = [0.4, 1.1]
    expected = (H - 1) / H * sigma**2 / n * math.sqrt((1 + beta) ** 3 / (1 + 3 * beta)) * phi(0.4) * phi(1.1)
    got = hd.first_order_noise_cov(angles, num_heads=H, noise_sd=sigma, n_train=n, bandwidth=b)
    assert math.isclose(got, expected, rel_tol=1e-12)
    with pytest.raises(ValueError, match="bandwidth"):
        hd.first_order_noise_cov(angles, num_heads=H, noise_sd=sigma, n_train=n, bandwidth=0.0)


# --- the Monte Carlo machinery ---------------------------------------------------------------------


def test_ensemble_contributions_by_a_loop(dtype, device):
    R, H, m = 5, 3, 4
    pred = torch.randn(R, H, m, generator=_gen(7), dtype=F64)
    w = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    cov, spread = hd.ensemble_contributions(pred.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device))
    d = (pred - pred.mean(0)).numpy()
    cov_ref = np.zeros(R)
    spread_ref = np.zeros(R)
    for r in range(R):
        for j in range(m):
            ens = sum(w[h].item() * d[r, h, j] for h in range(H))
            cov_ref[r] += sum(
                w[h].item() * w[g].item() * d[r, h, j] * d[r, g, j] for h in range(H) for g in range(H) if g != h
            )
            spread_ref[r] += ens**2
    scale = R / (R - 1) / m
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(cov.numpy(), cov_ref * scale, atol=atol)
    np.testing.assert_allclose(spread.numpy(), spread_ref * scale, atol=atol)
    assert cov.dtype == F64 and cov.device.type == "cpu"
    # their means are decompose's covariance term and its variance + covariance
    dec = decompose(pred, torch.zeros(m, dtype=F64), w)
    assert math.isclose(float(cov.mean()), float(dec.covariance.mean()), abs_tol=atol)
    assert math.isclose(float(spread.mean()), float(dec.ensemble_variance.mean()), abs_tol=atol)


def test_evaluate_against_explicit_formulas():
    R, H, m = 6, 2, 5
    pred = torch.randn(R, H, m, generator=_gen(8), dtype=F64)
    target = torch.randn(m, generator=_gen(9), dtype=F64)
    w = torch.tensor([0.7, 0.3], dtype=F64)
    ev = hd.evaluate(pred, w, target)
    err = (torch.einsum("h,rhm->rm", w, pred) - target).pow(2)
    torch.testing.assert_close(ev.per_replicate["err"], err.mean(-1))
    torch.testing.assert_close(ev.per_point["err"], err.mean(0))
    torch.testing.assert_close(ev.per_replicate["err"], ev.per_replicate["bias"] + ev.per_replicate["spread"])
    assert math.isclose(ev.row["MSE"], float(err.mean()), rel_tol=1e-12)
    se_points = float(ev.per_point["err"].std()) / math.sqrt(m)
    assert math.isclose(ev.se["MSE"], math.hypot(ev.row["MSE SE"], se_points), rel_tol=1e-12)
    assert ev.level("covariance") == estimate(ev.row["covariance"], ev.se["covariance"])
    assert set(ev.levels()) == {"mse", "cov", "bias", "var"} and ev.values()["bias"] == ev.row["bias^2"]
    assert ev.leave_out == {} and ev.condition == 1.0


def _evaluation(err, points, leave_out=None):
    err = torch.as_tensor(err, dtype=F64)
    points = torch.as_tensor(points, dtype=F64)
    zeros = {q: torch.zeros_like(err) for q in ("cov", "bias", "spread")}
    zeros_points = {q: torch.zeros_like(points) for q in ("cov", "bias", "spread")}
    leave = {} if leave_out is None else {"err": torch.as_tensor(leave_out, dtype=F64)}
    return hd.Evaluation({"MSE": float(err.mean())}, {}, {"err": err, **zeros}, {"err": points, **zeros_points}, leave)


def test_contrast_is_the_mean_with_replicate_and_point_variance():
    a = _evaluation([1.0, 2.0, 4.0, 3.0], [1.5, 3.5, 2.0])
    b = _evaluation([0.5, 1.5, 2.5, 2.5], [1.0, 2.0, 1.5])
    c = hd.contrast((1, a, "err"), (-2, b, "err"))
    series = np.array([1.0, 2.0, 4.0, 3.0]) - 2 * np.array([0.5, 1.5, 2.5, 2.5])
    points = np.array([1.5, 3.5, 2.0]) - 2 * np.array([1.0, 2.0, 1.5])
    var = np.var(series, ddof=1) / 4 + np.var(points, ddof=1) / 3
    assert math.isclose(c.estimate, series.mean(), rel_tol=1e-12)
    assert math.isclose(c.se, math.sqrt(var), rel_tol=1e-12)


def test_contrast_adds_the_jackknife_over_the_fitting_batch():
    a = _evaluation([1.0, 2.0, 4.0], [1.0, 2.0], leave_out=[2.0, 2.5, 1.5, 2.2])
    b = _evaluation([0.5, 1.0, 2.0], [0.5, 1.5])  # fixed weights: its mean in every group
    c = hd.contrast((1, a, "err"), (-1, b, "err"))
    theta = np.array([2.0, 2.5, 1.5, 2.2]) - np.mean([0.5, 1.0, 2.0])
    jack = 3 / 4 * np.sum((theta - theta.mean()) ** 2)
    series, points = np.array([0.5, 1.0, 2.0]), np.array([0.5, 0.5])
    var = np.var(series, ddof=1) / 3 + np.var(points, ddof=1) / 2 + jack
    assert math.isclose(c.se, math.sqrt(var), rel_tol=1e-12)


def test_contrast_rejects_bad_terms():
    a = _evaluation([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="quantity"):
        hd.contrast((1, a, "mse"))
    with pytest.raises(ValueError, match="terms"):
        hd.contrast()
    with pytest.raises(ValueError, match="same training sets"):
        hd.contrast((1, a, "err"), (-1, _evaluation([1.0, 2.0], [1.0, 2.0]), "err"))
    with pytest.raises(TypeError, match="Evaluation"):
        hd.contrast((1, "run", "err"))


def test_steps_relative_change_and_count_moves():
    a = _evaluation([1.0, 2.0, 3.0], [1.0, 2.0])
    b = _evaluation([2.0, 2.5, 4.0], [1.5, 2.5])
    (step,) = hd.steps([a, b])
    assert step == hd.contrast((1, b, "err"), (-1, a, "err"))
    change = hd.relative_change(b, a)
    ratio = np.mean([2.0, 2.5, 4.0]) / np.mean([1.0, 2.0, 3.0])
    assert math.isclose(change.estimate, ratio - 1, rel_tol=1e-12)
    assert math.isclose(change.se, hd.contrast((1, b, "err"), (-ratio, a, "err")).se / 2.0, rel_tol=1e-12)
    same = hd.relative_change(a, a)
    assert same.estimate == 0.0 and same.se < 1e-12
    assert hd.count_moves([estimate(5.0, 1.0), estimate(-6.0, 1.0), estimate(0.1, 1.0)]) == (1, 1)


def test_make_design_is_deterministic_and_checks_its_sizes():
    d1, d2 = _design(seed=3), _design(seed=3)
    assert torch.equal(d1.eval_points, d2.eval_points) and torch.equal(d1.fit_responses, d2.fit_responses)
    assert d1.eval_points.shape == (16, 6) and d1.fit_responses.shape == (10, 16) and d1.fresh_points.shape == (16, 6)
    assert not torch.equal(d1.eval_points, d1.fresh_points) and not torch.equal(
        d1.eval_points, _design(seed=4).eval_points
    )
    noise = (d1.fit_responses - d1.task.f(d1.fit_points)) / 0.5
    assert abs(float(noise.mean())) < 0.2 and abs(float(noise.std()) - 1) < 0.2
    with pytest.raises(ValueError, match="replicates_fit"):
        _design(replicates_fit=15)
    with pytest.raises(ValueError, match="replicates"):
        _design(replicates=2)
    with pytest.raises(TypeError, match="seed"):
        _design(seed=1.0)


def test_run_family_uniform_mse_by_an_explicit_formula(dtype, device):
    design = _design(seed=1, device=device, dtype=dtype)
    Q = design.path_heads(0.6, 1)
    run = hd.run_family(design, Q)
    assert "ls" not in run and run.weights is None
    # the same training sets (seed + 4), scored by hand
    pred = simulate(
        design.task, Q, design.eval_points, n=30, replicates=6, generator=torch.Generator(device=device).manual_seed(5)
    )
    err = (pred.double().mean(1) - design.task.f(design.eval_points).double()).pow(2)
    assert math.isclose(run.uniform.row["MSE"], float(err.mean()), rel_tol=1e-5 if dtype == torch.float32 else 1e-12)
    assert math.isclose(run.hdi, float(hdi(Q.double())), rel_tol=1e-12)
    assert run.uniform.per_replicate["err"].shape == (6,) and run.uniform.per_point["err"].shape == (16,)
    assert run.uniform.dtype == dtype
    # simulate's options pass through: another bandwidth, independent training sets per head
    gen = torch.Generator(device=device).manual_seed(5)
    wide = simulate(design.task, Q, design.eval_points, n=30, replicates=6, generator=gen, bandwidth=2.0)
    err = (wide.double().mean(1) - design.task.f(design.eval_points).double()).pow(2)
    rel = 1e-5 if dtype == torch.float32 else 1e-12
    assert math.isclose(hd.run_family(design, Q, bandwidth=2.0).uniform.row["MSE"], float(err.mean()), rel_tol=rel)
    independent = hd.run_family(design, Q, head_data="independent")
    assert independent.uniform.row["MSE"] != run.uniform.row["MSE"]
    with pytest.raises(ValueError, match="head_data"):
        hd.run_family(design, Q, head_data="separate")


def test_run_family_least_squares_weights_by_numpy():
    design = _design(seed=2, dtype=F64)
    Q = design.path_heads(0.9, 0)
    run = hd.run_family(design, Q, fit=True)
    fit = simulate(design.task, Q, design.fit_points, n=30, replicates=10, generator=torch.Generator().manual_seed(7))
    X = fit.permute(0, 2, 1).reshape(-1, 2).numpy()  # (R * m, H)
    y = design.fit_responses.reshape(-1).numpy()
    np.testing.assert_allclose(run.weights.numpy(), np.linalg.lstsq(X, y, rcond=None)[0], rtol=1e-6)
    # the first leave-out group (10 training sets in 10 groups: set 0) refitted by numpy, scored on the main runs
    keep = np.arange(10) >= 10 // hd.GROUPS
    Xg = fit[torch.from_numpy(keep)].permute(0, 2, 1).reshape(-1, 2).numpy()
    yg = design.fit_responses[torch.from_numpy(keep)].reshape(-1).numpy()
    alpha_g = torch.from_numpy(np.linalg.lstsq(Xg, yg, rcond=None)[0])
    pred = simulate(design.task, Q, design.eval_points, n=30, replicates=6, generator=torch.Generator().manual_seed(6))
    err_g = float(replicate_mse(pred, design.task.f(design.eval_points), alpha_g).mean())
    assert math.isclose(float(run.ls.leave_out["err"][0]), err_g, rel_tol=1e-6)
    assert run.ls.leave_out["err"].shape == (hd.GROUPS,) and run.ls.condition >= 1.0
    assert set(run.ls.se) == {"MSE", "covariance"} and run.ls.se["MSE"] >= run.ls.row["MSE SE"]


def test_run_family_is_deterministic_and_fresh_runs_use_their_own_draws():
    design = _design(seed=3)
    Q = design.path_heads(0.0, 1)
    a, b = hd.run_family(design, Q, fit=True), hd.run_family(design, Q, fit=True)
    assert a.uniform.row == b.uniform.row and a.ls.row == b.ls.row and torch.equal(a.weights, b.weights)
    assert abs(a.hdi) < 1e-6  # identical heads
    fresh = hd.run_family(design, Q, fresh=True)
    assert fresh.uniform.per_replicate["err"].shape == (4,) and fresh.uniform.row != a.uniform.row
    with pytest.raises(ValueError, match="key_projections"):
        hd.run_family(design, torch.zeros(2, 5, 2))
    with pytest.raises(TypeError, match="design"):
        hd.run_family("design", Q)


def test_attention_heads_and_their_projections(device):
    heads = hd.attention_heads(3, 3, 7, generator=_gen(11))
    R = heads.rotations
    torch.testing.assert_close(R.mT @ R, torch.eye(3, dtype=F64).expand(3, 3, 3))
    assert torch.allclose(torch.linalg.det(R), torch.ones(3, dtype=F64))
    angles = torch.arccos((R.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2)  # the angle of a 3-d rotation
    torch.testing.assert_close(angles, torch.full((3,), math.pi / 8, dtype=F64))
    torch.testing.assert_close(heads.key_scales, torch.tensor([0.8, 1.0, 1.2], dtype=F64))
    gamma = heads.value_projections[:, -1]
    assert bool(((gamma >= 0.5) & (gamma <= 1.5)).all())
    Q = torch.stack([torch.eye(7, dtype=F64)[:, 2 * h : 2 * h + 3] for h in range(3)]).to(device)
    W, extra = heads.projections(Q, dtype=torch.float32, device=torch.device(device))
    torch.testing.assert_close(W.double().cpu(), heads.key_scales[:, None, None] * Q.cpu(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(extra["query_projections"].double().cpu(), (W.double().cpu() @ R), rtol=1e-5, atol=1e-6)
    assert extra["kernel"] == "exp" and extra["value_projections"].shape == (3, 8)
    assert hd.attention_heads(3, 3, 7, generator=_gen(11)).rotations.equal(R)  # determinism
    with pytest.raises(ValueError, match="k"):
        hd.random_rotation(1, 0.3, _gen())


def test_random_rotation_in_the_plane_turns_by_the_angle():
    R = hd.random_rotation(2, 0.4, _gen(12))
    assert math.isclose(float(R.trace()), 2 * math.cos(0.4), rel_tol=1e-12)


def test_run_family_under_attention_runs_on_the_device(device):
    design = _design(seed=4, device=device)
    heads = hd.attention_heads(2, 2, 6, generator=_gen(13))
    run = hd.run_family(design, design.path_heads(0.5, 1), attention=heads, fit=True)
    assert run.ls.tolerance() > 0 and math.isfinite(run.ls.row["MSE"])
    assert run.uniform.row == hd.run_family(design, design.path_heads(0.5, 1), attention=heads).uniform.row


# --- the studies ---------------------------------------------------------------------------------------


def test_angle_grid():
    assert hd.angle_grid(3) == [0.0, math.pi / 4, math.pi / 2]
    with pytest.raises(ValueError, match="count"):
        hd.angle_grid(1)


def test_summarise_path_against_numpy_ranks():
    design = _design(seed=5)
    thetas = hd.angle_grid(3)
    runs = [hd.run_family(design, design.path_heads(t, 0)) for t in thetas]
    path = hd.summarise_path(runs, thetas)
    assert path.table["theta"].tolist() == thetas and len(path.mse_steps) == 2 and len(path.cov_steps) == 2
    ranks = [rankdata(path.table[c]) for c in ("HDI", "MSE")]
    assert math.isclose(path.rho, float(np.corrcoef(*ranks)[0, 1]), rel_tol=1e-12)
    assert path.mse_steps[0] == hd.contrast((1, runs[1].uniform, "err"), (-1, runs[0].uniform, "err"))
    with pytest.raises(ValueError, match="weights"):
        hd.summarise_path(runs, thetas, "fitted")


def test_two_angle_surface_has_the_stated_index_and_steps():
    design = _design(seed=6, embed_dim=9, head_dim=3)
    surface = hd.two_angle_surface(design, 2)
    assert surface.runs[0, 1] is surface.runs[1, 0] and surface.distinct == [(0, 0), (0, 1), (1, 1)]
    for (i, j), run in surface.runs.items():
        expected = (math.sin(surface.angles[i]) ** 2 + math.sin(surface.angles[j]) ** 2) / 3
        assert math.isclose(run.hdi, expected, abs_tol=1e-6)
    assert len(surface.steps["MSE"]) == 2 and surface.grid("MSE").shape == (2, 2)
    assert surface.grid("MSE")[0, 1] == surface.runs[0, 1].uniform.row["MSE"]


def test_signal_splits_and_keeps_signal():
    splits = hd.signal_splits(3)
    assert list(splits) == ["one head", "two heads", "all heads", "no head"]
    assert all(len(m) == 3 and sum(m) <= 1 + 1e-12 for m in splits.values())
    design = _design()
    assert hd.keeps_signal(design.path_heads(1.0, 1)) and not hd.keeps_signal(design.path_heads(1.0, 0))


def test_orthogonal_study_bounds_and_closed_forms():
    design = _design(seed=7, embed_dim=8)
    splits = hd.signal_splits(2)
    var_f = hd.head_signal_variance(1.0)
    study = hd.orthogonal_study(design, splits, var_f=var_f, generator=_gen(14), design_sample=20_000)
    assert list(study.table.index) == list(splits)
    for name, masses in splits.items():
        S = sum(hd.head_signal_variance(math.sqrt(m)) for m in masses)
        assert math.isclose(study.table.loc[name, "bound (any weights)"], var_f - S, rel_tol=1e-12)
        assert math.isclose(study.table.loc[name, "limit (uniform)"], var_f - 3 / 4 * S, rel_tol=1e-12)
        assert abs(study.runs[name].hdi - 1) < 1e-6 and "ls" in study.runs[name]
    # the closed-form bound against the design sample: a known answer, within its SE
    assert len(study.law_gaps) == 3 and all(abs(g.estimate) < 5 * g.se for g in study.law_gaps)
    assert len(study.limit_gaps) == 4 and len(study.bound_gaps) == 8


def test_non_orthogonal_pool_and_the_contest():
    design = _design(seed=8)
    thetas = hd.angle_grid(3)
    runs_i = [hd.run_family(design, design.path_heads(t, 1)) for t in thetas]
    runs_ii = [hd.run_family(design, design.path_heads(t, 0)) for t in thetas]
    pool = hd.non_orthogonal_pool(design, thetas, runs_i, runs_ii)
    assert list(pool) == [f"path (i), θ = {t:.2f}" for t in thetas] + [f"path (ii), θ = {t:.2f}" for t in thetas[:2]]
    splits = hd.signal_splits(2)
    orthogonal = {
        k: (design.orthogonal_heads(m), hd.run_family(design, design.orthogonal_heads(m))) for k, m in splits.items()
    }
    contest = hd.best_family_contest(design, orthogonal, pool, "uniform")
    assert contest.other == min(pool, key=lambda k: pool[k][1].uniform.row["MSE"])
    assert contest.orthogonal == min(orthogonal, key=lambda k: orthogonal[k][1].uniform.row["MSE"])
    fresh = [
        hd.run_family(design, q, fresh=True).uniform
        for q in (orthogonal[contest.orthogonal][0], pool[contest.other][0])
    ]
    assert contest.gap == hd.contrast((1, fresh[0], "err"), (-1, fresh[1], "err"))
    assert len(contest.vs_losing) == 1  # of the pool only path (ii) at θ = π/4 turns away from e_1
    assert contest.hdi_other == pool[contest.other][1].hdi
    with pytest.raises(ValueError, match="weights"):
        hd.best_family_contest(design, orthogonal, pool, "fitted")


def test_first_least_breaks_rounding_ties_by_order():
    # a rounding-level difference (1e-15 relative, inside fp_tolerance(float64) = 2.3e-13) is a tie: the
    # first name wins whichever side rounding favoured; a real difference (1e-9) is not a tie
    assert hd.first_least({"a": 1.0 + 1e-15, "b": 1.0}, torch.float64) == "a"
    assert hd.first_least({"b": 1.0, "a": 1.0 + 1e-15}, torch.float64) == "b"
    assert hd.first_least({"a": 1.0 + 1e-9, "b": 1.0}, torch.float64) == "b"
    assert hd.first_least({"a": 1.0 + 1e-5, "b": 1.0}, torch.float32) == "a"  # float32: 1.2e-4 relative
    with pytest.raises(ValueError, match="values"):
        hd.first_least({}, torch.float64)


# --- issue 19: QK-normalised heads, the zero predictor, the additive bound, degrees of freedom ------------------


def test_cosine_predictions_match_an_explicit_softmax_loop():
    task = make_task("single_index", 6, noise_sd=0.5)
    from nwlib import equiangular_heads

    Q = equiangular_heads(0.7, num_heads=2, head_dim=2, embed_dim=6, shared_dim=1, dtype=F64)
    heads = hd.cosine_heads(2, 2, 6, generator=_gen(3))
    z = torch.randn(5, 6, generator=_gen(4), dtype=F64)
    out = hd.cosine_predictions(task, Q, heads, z, n=7, replicates=3, generator=_gen(5), temperatures=[0.1, 1.0])
    assert out.shape == (2, 3, 2, 5)
    x, y = task.sample((3,), 7, generator=_gen(5), dtype=F64)  # the same draw: one chunk
    ln = lambda v: (v - v.mean(-1, keepdim=True)) / torch.sqrt(v.var(-1, unbiased=False, keepdim=True) + 1e-5)  # noqa: E731
    for t, tau in enumerate((0.1, 1.0)):
        for r in range(3):
            for h in range(2):
                k = ln(x[r]) @ Q[h]
                q = ln(z) @ Q[h] @ heads.rotations[h]
                k, q = k / k.norm(dim=-1, keepdim=True), q / q.norm(dim=-1, keepdim=True)
                v = heads.value_projections[h, -1] * y[r] + ln(x[r]) @ heads.value_projections[h, :-1]
                ref = torch.softmax(q @ k.T / tau, dim=-1) @ v
                torch.testing.assert_close(out[t, r, h], ref)


def test_cosine_heads_homogeneous_and_bad_input():
    homog = hd.cosine_heads(3, 3, 16, generator=_gen(1), homogeneous=True)
    assert torch.equal(homog.rotations[0], homog.rotations[2])
    assert torch.equal(homog.value_projections[:, -1], torch.ones(3, dtype=F64))
    assert not homog.value_projections[:, :-1].any()
    hetero = hd.cosine_heads(3, 3, 16, generator=_gen(1))
    assert not torch.equal(hetero.rotations[0], hetero.rotations[1])
    with pytest.raises(ValueError, match="temperatures"):
        hd.cosine_heads(3, 3, 16, generator=_gen(1), temperatures=[0.1, -1.0])
    with pytest.raises(TypeError, match="homogeneous"):
        hd.cosine_heads(3, 3, 16, generator=_gen(1), homogeneous=1)


def test_homogeneous_cosine_heads_are_one_estimator_in_their_own_coordinates():
    # a permutation of coordinates that maps head 0 of a path-(i) family onto head 1 commutes with LayerNorm and
    # leaves N(0, I) and f invariant: the heads' expected squared errors agree (equal in law; here: up to MC error)
    d = _design(embed_dim=16, num_heads=2, head_dim=3, n_train=60, n_eval=64, replicates=40)
    heads = hd.cosine_heads(2, 3, 16, generator=_gen(2), homogeneous=True)
    Q = d.path_heads(1.2, 1)
    pred = hd.cosine_predictions(
        d.task, Q, heads, d.eval_points, n=60, replicates=40, generator=_gen(6), temperatures=[0.2]
    )
    err = (pred[0] - d.task.f(d.eval_points)).pow(2).mean(-1)  # (R, H)
    gap = (err[:, 0] - err[:, 1]).double()
    assert abs(float(gap.mean())) < 4 * float(gap.std()) / math.sqrt(40) + 1e-6


def test_cosine_family_picks_a_temperature_on_the_fitting_batch_and_is_deterministic():
    d = _design(embed_dim=16, num_heads=2, head_dim=3, n_train=40, n_eval=24, replicates=6)
    heads = hd.cosine_heads(2, 3, 16, generator=_gen(2))
    Q = d.path_heads(0.5, 1)
    a = hd.run_family(d, Q, attention=heads, fit=True)
    b = hd.run_family(d, Q, attention=heads, fit=True)
    assert set(a.temperature) == {"uniform", "ls"} and a.temperature["uniform"] in hd.TEMPERATURES
    assert a.uniform.row == b.uniform.row and torch.equal(a.weights, b.weights)
    # the uniform choice minimises the validation error on the fitting batch (an explicit loop over the grid)
    pf = hd.cosine_predictions(
        d.task,
        Q,
        heads,
        d.fit_points,
        n=40,
        replicates=d.replicates_fit,
        generator=_gen(d.seed + 5),
        temperatures=list(hd.TEMPERATURES),
    ).double()
    val = [float(((p.mean(1) - d.fit_responses.double()) ** 2).mean()) for p in pf]
    assert a.temperature["uniform"] == hd.TEMPERATURES[int(np.argmin(val))]
    with pytest.raises(ValueError, match="bandwidth"):
        hd.run_family(d, Q, attention=heads, bandwidth=0.5)


def test_zero_evaluation_contrast_is_the_explicit_difference():
    d = _design()
    r = hd.run_family(d, d.path_heads(0.3, 1))
    f = d.task.f(d.eval_points)
    zero = hd.zero_evaluation(f, d.replicates)
    assert zero.row["MSE"] == pytest.approx(float((f.double() ** 2).mean()))
    c = hd.contrast((1, zero, "err"), (-1, r.uniform, "err"))
    assert c.estimate == pytest.approx(float((f.double() ** 2).mean()) - float(r.uniform.per_replicate["err"].mean()))
    with pytest.raises(ValueError, match="target"):
        hd.zero_evaluation(torch.zeros(1), 4)


def test_contrast_degrees_of_freedom_follow_welch_satterthwaite():
    from nwlib.evidence import welch_df

    d = _design()
    a, b = (hd.run_family(d, d.path_heads(t, 1)).uniform for t in (0.0, 1.0))
    c = hd.contrast((1, a, "err"), (-1, b, "err"))
    diff_r = a.per_replicate["err"] - b.per_replicate["err"]
    diff_m = a.per_point["err"] - b.per_point["err"]
    parts = [
        (float(diff_r.var()) / diff_r.numel(), diff_r.numel() - 1),
        (float(diff_m.var()) / diff_m.numel(), diff_m.numel() - 1),
    ]
    assert c.df == pytest.approx(welch_df(*parts))
    assert c.se == pytest.approx(math.sqrt(sum(v for v, _ in parts)))
    assert math.isfinite(c.df) and c.df < diff_r.numel() - 1 + diff_m.numel() - 1 + 1e-9


def _best_additive_residual(Q, f, x, degree):
    """Brute force: least squares of f on polynomials (up to ``degree``) of each head's own coordinates, summed."""
    feats = [torch.ones(x.shape[0], 1, dtype=F64)]
    for h in range(Q.shape[0]):
        p = x @ Q[h]
        feats += [p**j for j in range(1, degree + 1)]
        if degree >= 2 and p.shape[1] > 1:
            feats.append(p[:, :1] * p[:, 1:])
    A = torch.cat(feats, 1)
    coef = torch.linalg.lstsq(A, f[:, None]).solution
    return float((f - (A @ coef)[:, 0]).pow(2).mean())


@pytest.mark.parametrize(
    ("coefficients", "masses", "zero"),
    [
        ([1.0], [0.5, 0.5], True),  # linear g, e_1 in the sum of the heads: 0
        ([1.0], [0.3, 0.3], False),  # linear g alone is not enough: e_1 partly outside (the old statement said 0)
        ([0.0, 1.0], [0.5, 0.5], False),  # e_1 in the sum alone is not enough: g not linear
        ([0.6, 0.8], [1.0, 0.0], True),  # one head contains e_1
    ],
)
def test_additive_bound_against_brute_force_least_squares(coefficients, masses, zero):
    from nwlib.angles import orthogonal_heads

    Q = orthogonal_heads(masses, head_dim=2, embed_dim=8, dtype=F64)
    x = torch.randn(200_000, 8, generator=_gen(9), dtype=F64)
    t = x[:, 0]
    he = [t, (t**2 - 1) / math.sqrt(2)]
    f = sum(a * he[k] for k, a in enumerate(coefficients))
    brute = _best_additive_residual(Q, f, x, degree=len(coefficients))
    bound = hd.additive_bound(coefficients, masses)
    assert brute == pytest.approx(bound, abs=0.01)
    assert (bound < 1e-12) == zero


def test_additive_bound_and_overlap_reject_bad_input():
    with pytest.raises(ValueError, match="masses"):
        hd.additive_bound([1.0], [0.7, 0.7])
    with pytest.raises(ValueError, match="masses"):
        hd.additive_bound([1.0], [1.5])
    with pytest.raises(TypeError, match="coefficients"):
        hd.additive_bound([], [0.5])
    assert hd.keep_signal_overlap(16, 1) == (1 / 16, 15 / 16)
    with pytest.raises(ValueError, match="signal_dim"):
        hd.keep_signal_overlap(4, 5)


def test_wide_design_has_the_least_embed_dim():
    d = hd.wide_design(
        8,
        num_heads=4,
        noise_sd=0.5,
        n_train=10,
        n_eval=4,
        replicates=3,
        replicates_fit=10,
        replicates_confirm=3,
        seed=0,
    )
    assert d.embed_dim == 36 and d.head_dim == 8
    d.path_heads(1.0, 1)  # fits
    with pytest.raises(TypeError, match="embed_dim"):
        hd.wide_design(8, num_heads=4, embed_dim=40)


def test_random_placement_study_keeps_the_hdi_and_is_deterministic():
    sizes = dict(embed_dim=12, num_heads=2, head_dim=2, noise_sd=0.5, n_train=30, n_eval=16, replicates=4)
    sizes |= dict(replicates_fit=10, replicates_confirm=3)
    thetas = [0.0, 0.8, math.pi / 2]
    a = hd.random_placement_study(thetas, placements=3, seed=1, **sizes)
    b = hd.random_placement_study(thetas, placements=3, seed=1, **sizes)
    assert a.mse.shape == (3, 3) and torch.equal(a.mse, b.mse)
    # a rotation of all heads keeps the HDI of the path: (r/d_k) sin^2 theta with r = d_k for shared_dim 0
    np.testing.assert_allclose(a.hdi, [math.sin(t) ** 2 for t in thetas], atol=1e-6)
    # placement 0 by hand: its own design, its own Haar rotation
    d0 = hd.make_design(**sizes, seed=101)
    rot = random_subspaces(1, 12, 12, generator=torch.Generator().manual_seed(101))[0].float()
    ref = hd.run_family(d0, rot @ d0.path_heads(0.8, 0)).uniform.per_replicate["err"].mean()
    assert float(a.mse[0, 1]) == pytest.approx(float(ref))
    assert not torch.equal(a.mse[0], a.mse[1])  # other placements, other draws
    with pytest.raises(ValueError, match="placements"):
        hd.random_placement_study(thetas, placements=1, seed=1, **sizes)


def test_paths_grid_long_table_from_path_tables():
    import types

    import pandas as pd

    from nwlib.experiments.head_diversity import paths_grid

    table = pd.DataFrame({"HDI": [0.0, 0.5], **{c: [1.0, 2.0] for c in ("MSE", "bias^2", "variance", "covariance")},
                          **{f"{c} SE": [0.1, 0.2] for c in ("MSE", "bias^2", "variance", "covariance")}})  # fmt: skip
    path = types.SimpleNamespace(table=table)
    grid = paths_grid({"surrogate": {"(i)": path, "(ii)": path}, "attention": {"(i)": path}})
    assert len(grid) == 3 * 4 * 2 and set(grid.term) == {"MSE", "squared bias", "variance", "covariance"}
    row = grid[(grid.estimator == "attention") & (grid.term == "variance") & (grid.HDI == 0.5)].iloc[0]
    assert (row.value, row.se, row.path) == (2.0, 0.2, "(i)")
    with pytest.raises(TypeError, match="runs"):
        paths_grid({})


# --- tables for reading ---------------------------------------------------------------------------------


def _plain(frame):
    """Cells with the book's typesetting undone (no-break spaces, minus signs)."""
    return frame.map(lambda c: c.replace("\u00a0", " ").replace("\u2212", "-"))


def test_path_table_pairs_each_term_with_its_se_and_rounds_by_it():
    frame = pd.DataFrame(
        {
            "theta": [0.0, math.pi / 2],
            "HDI": [0.0, 2 / 3],
            "MSE": [0.111234, 0.090321],
            "MSE SE": [0.00213, 0.00189],
            "bias^2": [0.08012, -0.0000004],
            "bias^2 SE": [0.0005, 0.00052],
            "mean corr": [1.0, 0.4321],
        }
    )
    shown = _plain(hd.path_table(frame, ["theta", "HDI", "MSE", "bias^2", "mean corr"], zero_mse=0.5))
    assert list(shown.columns) == [
        "θ (rad)",
        "HDI",
        "MSE",
        "bias²",
        "mean error correlation",
        "zero predictor's MSE",
        "share of it removed",
    ]
    # the estimate keeps the decimals of its SE's two significant digits (0.0021 -> 4 decimals)
    assert shown["MSE"].tolist() == ["0.1112 ± 0.0021", "0.0903 ± 0.0019"]
    assert shown["bias²"].tolist() == ["0.08012 ± 0.00050", "0.00000 ± 0.00052"]  # no "-0.00000"
    assert shown["θ (rad)"].tolist() == ["0.00", "1.57"]
    # 1 - MSE / zero: 1 - 0.111234/0.5 = 0.777532, 1 - 0.090321/0.5 = 0.819358 (3 significant digits)
    assert shown["share of it removed"].tolist() == ["0.778", "0.819"]


def test_path_table_checks_its_arguments():
    frame = pd.DataFrame({"theta": [0.0], "MSE": [0.1]})
    with pytest.raises(ValueError, match="columns"):
        hd.path_table(frame, ["theta", "HDI"])
    with pytest.raises(ValueError, match="zero_mse"):
        hd.path_table(frame, ["theta", "MSE"], zero_mse=-1.0)


def test_accuracy_and_orthogonal_tables_show_every_value():
    errors = pd.DataFrame(
        {"t": [1e-4, 1e-9], "principal_angles": [3.14e-13, 0.0], "arccos": [2.2e-8, 1.0], "scipy": [1e-12, 5.54e-9]}
    ).set_index("t")
    shown = _plain(hd.accuracy_table(errors))
    assert shown.index.tolist() == ["1e-04", "1e-09"] and shown.index.name == "t"
    assert shown.iloc[:, 1].tolist() == ["2.2e-08", "1.0e+00"] and shown.iloc[1, 2] == "5.5e-09"
    orth = pd.DataFrame(
        {
            "signal in": ["one head", "no head"],
            "MSE (uniform)": [0.66512, 1.0371],
            "SE (uniform)": [0.0012, 0.0031],
            "MSE (least squares)": [0.10413, 1.0152],
            "SE (least squares)": [0.0015, 0.0044],
            "bound (any weights)": [0.0, 1.0199],
        }
    ).set_index("signal in")
    table = _plain(hd.orthogonal_table(orth))
    assert list(table.columns) == ["MSE (uniform)", "MSE (least squares)", "bound (any weights)"]
    assert table.loc["no head"].tolist() == ["1.0371 ± 0.0031", "1.0152 ± 0.0044", "1.020"]


# --- the families as sweep points -------------------------------------------------------------------


def _same_evaluation(a, b):
    assert a.row == b.row and a.se == b.se and a.dtype == b.dtype and a.condition == b.condition
    for name in ("per_replicate", "per_point", "leave_out"):
        x, y = getattr(a, name), getattr(b, name)
        assert list(x) == list(y), name
        for q in x:
            assert x[q].dtype == y[q].dtype == F64 and torch.equal(x[q], y[q]), (name, q)


def _same_run(a, b):
    assert a.hdi == b.hdi and a.temperature == b.temperature and ("ls" in a) == ("ls" in b)
    _same_evaluation(a.uniform, b.uniform)
    if "ls" in a:
        _same_evaluation(a.ls, b.ls)
        assert torch.equal(a.weights, b.weights)


@pytest.mark.parametrize(
    "options",
    [{}, {"fit": True}, {"fresh": True}, {"fit": True, "attention": "cosine"}, {"fit": True, "attention": "exp"}],
    ids=["uniform", "fit", "fresh", "cosine", "exp"],
)
def test_run_families_equal_a_loop_of_run_family_bit_for_bit(options):
    design = _design(seed=9)
    heads = {
        "cosine": hd.cosine_heads(2, 2, 6, generator=_gen(21)),
        "exp": hd.attention_heads(2, 2, 6, generator=_gen(22)),
    }
    options = options | ({"attention": heads[options["attention"]]} if "attention" in options else {})
    families = [design.path_heads(t, 1) for t in (0.0, 0.7)] + [design.path_heads(0.7, 0), design.path_heads(0.0, 1)]
    swept = hd.run_families(design, families, **options)
    direct = [hd.run_family(design, Q, **options) for Q in families]  # the unblocked reference, same draws
    assert len(swept) == 4
    for a, b in zip(swept, direct, strict=True):
        _same_run(a, b)
    _same_run(swept[0], swept[3])  # one family twice: run once, the same numbers


def test_run_families_pass_the_engine_options_and_check_their_arguments():
    design = _design(seed=10, dtype=F64)
    Q = design.path_heads(0.4, 1)
    for options in ({"bandwidth": 2.0}, {"head_data": "independent"}):
        _same_run(hd.run_families(design, [Q], **options)[0], hd.run_family(design, Q, **options))
    with pytest.raises(TypeError, match="key_ranges"):
        hd.run_families(design, Q)
    with pytest.raises(ValueError, match=r"key_ranges\[1\]"):
        hd.run_families(design, [Q, torch.zeros(2, 5, 2, dtype=F64)])
    with pytest.raises(TypeError, match="attention"):
        hd.run_families(design, [Q], attention="cosine")
    with pytest.raises(ValueError, match="head_data"):
        hd.run_families(design, [Q], head_data="separate")
    with pytest.raises(TypeError, match="fit"):
        hd.run_families(design, [Q], fit=1)


def test_design_spec_draws_the_design_again_and_rejects_a_changed_one():
    design = hd.wide_design(3, num_heads=2, noise_sd=0.3, n_train=30, n_eval=16, replicates=6, seed=4, **SMALL_MC)
    spec = hd.design_spec(design)
    assert spec["embed_dim"] == 7 and spec["dtype"] == "float32" and spec["noise_sd"] == 0.3
    again = hd.make_design(**(spec | {"dtype": torch.float32}))
    for name in ("eval_points", "fit_points", "fit_responses", "fresh_points"):
        assert torch.equal(getattr(design, name), getattr(again, name))
    changed = dataclasses.replace(design, eval_points=design.fresh_points)
    with pytest.raises(ValueError, match="make_design"):
        hd.design_spec(changed)
    with pytest.raises(ValueError, match="make_design"):
        hd.run_families(changed, [design.path_heads(0.3, 1)])
    with pytest.raises(TypeError, match="design"):
        hd.design_spec("design")


def test_family_point_rejects_bad_points():
    design = _design(seed=11)
    point = {
        "design": hd.design_spec(design),
        "key_ranges": design.path_heads(0.5, 1).tolist(),
        "key_dtype": "float32",
        "attention": None,
        "fit": False,
        "fresh": False,
        "bandwidth": None,
        "head_data": "shared",
    }
    result = hd.family_point(point, seed=0)
    assert result["ls"] is None and len(result["uniform"]["per_replicate"]["err"]) == 6
    assert result == json.loads(json.dumps(result))  # JSON values only
    with pytest.raises(ValueError, match="fit"):
        hd.family_point({k: v for k, v in point.items() if k != "fit"}, seed=0)
    with pytest.raises(ValueError, match="design lacks"):
        hd.family_point(point | {"design": {"seed": 0}}, seed=0)
    with pytest.raises(ValueError, match="key_dtype"):
        hd.family_point(point | {"key_dtype": "int64"}, seed=0)
    with pytest.raises(ValueError, match="key_ranges"):
        hd.family_point(point | {"key_ranges": [[1.0], [2.0, 3.0]]}, seed=0)
    with pytest.raises(ValueError, match="attention"):
        hd.family_point(point | {"attention": {"kind": "cosine"}}, seed=0)
    with pytest.raises(TypeError, match="fresh"):
        hd.family_point(point | {"fresh": "no"}, seed=0)


def test_random_placement_study_equals_the_direct_loop_over_placements():
    sizes = dict(embed_dim=8, num_heads=2, head_dim=2, noise_sd=0.5, n_train=30, n_eval=16, replicates=4)
    sizes |= dict(replicates_fit=10, replicates_confirm=3)
    thetas = [0.0, 0.6, math.pi / 2]
    study = hd.random_placement_study(thetas, placements=3, shared_dim=1, seed=2, **sizes)
    expected = torch.zeros(3, 3, dtype=F64)
    for j in range(3):  # each placement by hand: design seed + 100 + 10 j, its Haar rotation from the same seed
        design = hd.make_design(**sizes, seed=102 + 10 * j)
        rot = random_subspaces(1, 8, 8, generator=torch.Generator().manual_seed(102 + 10 * j))[0].float()
        for t, theta in enumerate(thetas):
            run = hd.run_family(design, rot @ design.path_heads(theta, 1))
            expected[j, t] = float(run.uniform.per_replicate["err"].mean())
    assert torch.equal(study.mse, expected)
    np.testing.assert_allclose(study.hdi, [math.sin(t) ** 2 / 2 for t in thetas], atol=1e-6)
    point = {"design": hd.design_spec(hd.make_design(**sizes, seed=102)), "thetas": thetas, "shared_dim": -1}
    with pytest.raises(ValueError, match="shared_dim"):
        hd.placement_point(point, seed=0)
    with pytest.raises(TypeError, match="thetas"):
        hd.placement_point(point | {"thetas": "0.5", "shared_dim": 0}, seed=0)
