"""Tests of nwlib.experiments.bias_variance_covariance: chapter 2's drivers against explicit formulas and brute force."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
import sympy as sp
import torch
from scipy import integrate

from nwlib import make_task, simulate
from nwlib.evidence import Comparison, estimate, fp_tolerance
from nwlib.experiments import bias_variance_covariance as bvc
from nwlib.sweep import grid, point_seed, run_sweep

F64 = torch.float64


def _rng(seed=0):
    return torch.Generator().manual_seed(seed)


def _equicorrelated(rhos, *, replicates=400, heads=4, m=6, bias=0.3, seed=0):
    """Synthetic batches with known ρ per family: sqrt(ρ)·common + sqrt(1 − ρ)·own + bias, unit variance."""
    g = _rng(seed)
    out = {}
    for name, rho in zip(bvc.FAMILIES, rhos, strict=True):
        common = torch.randn(replicates, 1, m, generator=g, dtype=F64)
        own = torch.randn(replicates, heads, m, generator=g, dtype=F64)
        out[name] = math.sqrt(rho) * common + math.sqrt(1 - rho) * own + bias
    return out


RHOS = (1.0, 0.6, 0.3, 0.0)


@pytest.fixture(scope="module")
def small_design():
    return bvc.surrogate_design(
        embed_dim=7, max_num_heads=4, n_eval=6, noise_sd=1.0, partial_angle_deg=30.0, dtype=F64, device="cpu"
    )


@pytest.fixture(scope="module")
def small_batches(small_design):
    kw = dict(n_train=40, replicates=40, bandwidth=0.5)
    return bvc.gaussian_batch(small_design, seed=1, **kw), bvc.gaussian_batch(small_design, seed=2, **kw)


# --- jackknife and glue entries -----------------------------------------------------------


def test_jackknife_of_the_mean_is_the_standard_error():
    x = torch.randn(30, generator=_rng(), dtype=F64)
    c = bvc.jackknife(lambda v: v.mean(), x, groups=30)  # delete-one: std / sqrt(R) exactly
    assert isinstance(c, Comparison)
    assert math.isclose(c.estimate, float(x.mean()), rel_tol=1e-12)
    assert math.isclose(c.se, float(x.std() / math.sqrt(30)), rel_tol=1e-10)


def test_jackknife_each_against_a_delete_a_group_loop():
    x = torch.randn(40, 3, generator=_rng(1), dtype=F64)
    got = bvc.jackknife_each(lambda v: v.var(0), x, groups=8)
    loo = np.stack([np.delete(x.numpy(), range(5 * g, 5 * g + 5), axis=0).var(0, ddof=1) for g in range(8)])
    se = np.sqrt(7 / 8 * ((loo - loo.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose([c.se for c in got], se, rtol=1e-10)
    np.testing.assert_allclose([c.estimate for c in got], x.numpy().var(0, ddof=1), rtol=1e-12)


def test_jackknife_shapes_are_checked():
    x = torch.randn(10, 2, generator=_rng(), dtype=F64)
    with pytest.raises(ValueError, match="scalar"):
        bvc.jackknife(lambda v: v.mean(0), x, groups=5)
    with pytest.raises(ValueError, match="vector"):
        bvc.jackknife_each(lambda v: v.mean(), x, groups=5)
    with pytest.raises(ValueError, match="groups"):
        bvc.jackknife(lambda v: v.mean(), x, groups=3)


def test_estimate_entries_classes_and_tolerances():
    eps = torch.finfo(F64).eps
    mc, se = bvc.estimate_entries("k", estimate(0.5, 0.01), "k_se", dtype=F64, replicates=100)
    assert (mc.name, mc.value, mc.options) == ("k", 0.5, {"se": 0.01})
    assert se.name == "k_se" and math.isclose(se.options["tol"], 2**10 * eps * (0.5 + 0.01 * 10), rel_tol=1e-12)
    exact, se = bvc.estimate_entries("r", estimate(1.0, 1e-17), "r_se", dtype=F64, replicates=100, exact_scale=1.0)
    assert exact.options == {"tol": fp_tolerance(F64, scale=1.0)} and se.options == {"tol": 2**10 * eps}
    with pytest.raises(ValueError, match="rounding-level"):
        bvc.estimate_entries("r", estimate(1.0, 1e-17), "r_se", dtype=F64, replicates=100)


# --- symbolic bookkeeping ------------------------------------------------------------------


def test_expectation_of_a_quadratic_form():
    # E(c + b'e)^2 = c^2 + b' S b for zero-mean e with covariance S
    e = sp.symbols("e1:4")
    b, c = [1.5, -2.0, 0.5], 0.7
    s = np.array([[2.0, 0.3, -0.1], [0.3, 1.0, 0.2], [-0.1, 0.2, 0.5]])
    expr = (sp.nsimplify(c) + sum(sp.nsimplify(bi) * ei for bi, ei in zip(b, e, strict=True))) ** 2
    got = float(bvc.expectation(expr, e, sp.Matrix(s.tolist())))
    assert math.isclose(got, c**2 + np.array(b) @ s @ np.array(b), rel_tol=1e-12)
    with pytest.raises(ValueError, match="degree"):
        bvc.expectation(e[0] ** 3, e, sp.eye(3))


@pytest.mark.parametrize("heads", [2, 3])
def test_bvc_terms_numerically(heads):
    mse, bias_sq, variance, covariance = bvc.bvc_terms(heads)
    rng = np.random.default_rng(heads)
    alpha, mu, f = rng.normal(size=heads), rng.normal(size=heads), 0.4
    a = rng.normal(size=(heads, heads))
    cov = a @ a.T
    subs = {sp.Symbol("f", real=True): f}
    for i in range(heads):
        subs[sp.Symbol(f"alpha_{i + 1}", real=True)] = alpha[i]
        subs[sp.Symbol(f"mu_{i + 1}", real=True)] = mu[i]
        subs[sp.Symbol(f"V_{i + 1}", positive=True)] = cov[i, i]
        for j in range(i + 1, heads):
            subs[sp.Symbol(f"C_{i + 1}{j + 1}", real=True)] = cov[i, j]
    # E(alpha'(mu + e) - f)^2 = (alpha'mu - f)^2 + alpha' C alpha
    assert math.isclose(float(mse.subs(subs)), (alpha @ mu - f) ** 2 + alpha @ cov @ alpha, rel_tol=1e-10)
    assert math.isclose(float(bias_sq.subs(subs)), (alpha @ mu - f) ** 2, rel_tol=1e-10)
    assert math.isclose(float(variance.subs(subs)), alpha**2 @ np.diag(cov), rel_tol=1e-10)
    off = alpha @ cov @ alpha - alpha**2 @ np.diag(cov)
    assert math.isclose(float(covariance.subs(subs)), off, rel_tol=1e-9, abs_tol=1e-12)


def test_normal_mean_against_quadrature():
    s = sp.Symbol("s", real=True)
    for expr, fn in ((sp.cos(2 * s), lambda t: math.cos(2 * t)), (sp.exp(2 * s), lambda t: math.exp(2 * t))):
        ref, _ = integrate.quad(lambda t, fn=fn: fn(t) * math.exp(-t * t / 2) / math.sqrt(2 * math.pi), -40, 40)
        assert math.isclose(float(bvc.normal_mean(expr, s)), ref, rel_tol=1e-9)  # e^-2 and e^2
    assert math.isclose(float(bvc.std_normal_pdf(sp.Float(0.3))), math.exp(-0.045) / math.sqrt(2 * math.pi))


# --- the surrogate's design ------------------------------------------------------------------


def test_head_frames_are_orthonormal_with_their_nuisance_direction(dtype, device, tol):
    theta = 0.4
    w = bvc.head_frames(theta, max_num_heads=3, embed_dim=7, dtype=dtype, device=device)
    assert w.shape == (3, 7, 3) and w.dtype == dtype and w.device.type == device.type
    eye = torch.eye(3, dtype=dtype, device=device).expand(3, 3, 3)
    torch.testing.assert_close(w.mT @ w, eye, **tol)
    for h in range(3):
        expected = torch.zeros(7, dtype=F64)
        expected[2], expected[3 + h] = math.cos(theta), math.sin(theta)
        torch.testing.assert_close(w[h, :, 2].double().cpu(), expected, **tol)
    with pytest.raises(ValueError, match="embed_dim"):
        bvc.head_frames(0.0, max_num_heads=5, embed_dim=7)


def test_surrogate_design_is_fixed_and_in_the_signal_plane(small_design):
    again = bvc.surrogate_design(
        embed_dim=7, max_num_heads=4, n_eval=6, noise_sd=1.0, partial_angle_deg=30.0, dtype=F64, device="cpu"
    )
    assert torch.equal(again.eval_points, small_design.eval_points)  # the same for every seed and call
    assert small_design.head_counts == (1, 2, 4)
    assert bool((small_design.eval_points[:, 2:] == 0).all())
    z = small_design.eval_points
    torch.testing.assert_close(small_design.target, (torch.sin(2 * z[:, 0]) + torch.sin(2 * z[:, 1])) / math.sqrt(2))
    assert list(small_design.thetas.values()) == [0.0, math.radians(30.0), math.pi / 2]
    with pytest.raises(ValueError, match="max_num_heads"):
        bvc.surrogate_design(
            embed_dim=9, max_num_heads=3, n_eval=4, noise_sd=1.0, partial_angle_deg=30.0, dtype=F64, device="cpu"
        )


def test_gaussian_batch_shapes_determinism_and_common_random_numbers(small_design, small_batches):
    a, b = small_batches
    assert set(a) == set(bvc.FAMILIES)
    assert all(p.shape == (40, 4, 6) for p in a.values())
    again = bvc.gaussian_batch(small_design, n_train=40, replicates=40, bandwidth=0.5, seed=1)
    assert all(torch.equal(a[n], again[n]) for n in bvc.FAMILIES)
    assert not torch.equal(a["partly turned"], b["partly turned"])
    # identical heads on shared data are one head; with independent data they differ
    assert torch.equal(a["identical"], a["identical"][:, :1].expand_as(a["identical"]))
    assert not torch.allclose(a["independent data"][:, 0], a["independent data"][:, 1])
    # the shared families see the training sets of a plain simulate call from the same seed
    one = simulate(
        small_design.task,
        small_design.frames(math.pi / 2),
        small_design.eval_points,
        n=40,
        replicates=40,
        generator=torch.Generator().manual_seed(1),
        bandwidth=0.5,
    )
    torch.testing.assert_close(a["orthogonal nuisance"], one, rtol=1e-12, atol=1e-12)


def test_gaussian_batch_float32_is_the_float64_run_cast(tol):
    kw = dict(embed_dim=6, max_num_heads=2, n_eval=4, noise_sd=1.0, partial_angle_deg=20.0, device="cpu")
    runs = {}
    for dt in (torch.float32, F64):
        design = bvc.surrogate_design(dtype=dt, **kw)
        runs[dt] = bvc.gaussian_batch(design, n_train=30, replicates=8, bandwidth=0.5, seed=3)
    for n in bvc.FAMILIES:
        assert runs[torch.float32][n].dtype == torch.float32
        torch.testing.assert_close(runs[torch.float32][n].double(), runs[F64][n], rtol=1e-4, atol=1e-5)


# --- the equicorrelated law, gains, steps ------------------------------------------------


def test_variance_ratios_brute_force():
    p = torch.randn(50, 4, 3, generator=_rng(2), dtype=F64)
    got = bvc.variance_ratios(p, [1, 2, 4])
    x = p.numpy()
    ref = [x[:, :h].mean(1).var(0, ddof=1).mean() / x[:, :h].var(0, ddof=1).mean() for h in (2, 4)]
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)


def test_law_check_recovers_known_correlations():
    fit_batch, test_batch = _equicorrelated(RHOS, seed=0), _equicorrelated(RHOS, seed=1)
    target = torch.zeros(6, dtype=F64)
    law = bvc.law_check(fit_batch, test_batch, target, head_counts=[1, 2, 4], groups=20)
    assert len(law.table) == 4 * 3 and {"setting", "H", "mse", "predicted", "ratio_gap", "z"} <= set(law.table)
    assert law.identity_gap < 1e-12
    for name, rho in zip(bvc.FAMILIES, RHOS, strict=True):
        fit = law.fits[name]
        assert abs(fit.rho.estimate - rho) <= 4 * fit.rho.se + 1e-12, name
        assert abs(fit.rho_b.estimate - rho) <= 4 * fit.rho_b.se + 1e-12, name
        for gap in fit.ratio_gap:  # B's measured ratio against A's prediction
            assert abs(gap.estimate) <= 4 * gap.se + 1e-12, name
        # the predicted MSE of 4 heads: b^2 + V(rho + (1 - rho)/H) with b = 0.3, V = 1
        row = law.table[(law.table.setting == name) & (law.table.H == 4)].iloc[0]
        truth = 0.09 + rho + (1 - rho) / 4
        assert abs(row.predicted - truth) <= 4 * row.predicted_se + 1e-12, name
        assert abs(row.mse - truth) <= 4 * row.mse_se + 1e-12, name


def test_law_check_validates_its_input():
    batch = _equicorrelated(RHOS, replicates=40)
    with pytest.raises(ValueError, match="groups"):
        bvc.law_check(batch, batch, torch.zeros(6, dtype=F64), head_counts=[1, 2, 4], groups=7)
    with pytest.raises(ValueError, match="batch_fit"):
        bvc.law_check({"identical": batch["identical"]}, batch, torch.zeros(6, dtype=F64), head_counts=[1, 2], groups=4)
    with pytest.raises(ValueError, match="head_counts"):
        bvc.law_check(batch, batch, torch.zeros(6, dtype=F64), head_counts=[2, 4], groups=4)


def test_per_replicate_gain_brute_force():
    p = torch.randn(5, 3, 4, generator=_rng(3), dtype=F64)
    f = torch.randn(4, generator=_rng(4), dtype=F64)
    x, t = p.numpy(), f.numpy()
    ref = [((x[r, 0] - t) ** 2).mean() - ((x[r].mean(0) - t) ** 2).mean() for r in range(5)]
    np.testing.assert_allclose(bvc.per_replicate_gain(p, f).numpy(), ref, rtol=1e-12)


def test_gains_and_order_are_paired_means():
    batch = _equicorrelated(RHOS, replicates=200, seed=5)
    target = torch.zeros(6, dtype=F64)
    gains = bvc.gains_and_order(batch, target)
    per = {n: bvc.per_replicate_gain(batch[n], target).numpy() for n in bvc.FAMILIES}
    for n in bvc.FAMILIES:
        assert math.isclose(gains.gains[n].estimate, per[n].mean(), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(gains.gains[n].se, per[n].std(ddof=1) / math.sqrt(200), rel_tol=1e-10, abs_tol=1e-15)
    d = per["partly turned"] - per["identical"]
    step = gains.steps["identical → partly turned"]
    assert math.isclose(step.estimate, d.mean(), rel_tol=1e-10) and math.isclose(
        step.se, d.std(ddof=1) / math.sqrt(200)
    )
    assert len(gains.claim) == 4 and list(gains.step_table().columns) == ["step", "diff", "se", "z"]
    # identical heads gain nothing; the gain grows as the correlation falls (V(1 - rho)(1 - 1/H))
    assert abs(gains.gains["identical"].estimate) < 1e-12
    assert all(c.estimate > 0 for c in gains.steps.values())


def test_rho_steps_against_numpy_covariances():
    batch = _equicorrelated(RHOS, replicates=100, seed=6)
    target = torch.zeros(6, dtype=F64)
    steps = bvc.rho_steps(batch, target, groups=10)

    def rho(x):
        c = np.stack([np.cov(x[:, :, j].T) for j in range(x.shape[2])])  # (m, H, H), R - 1 denominator
        off = ~np.eye(x.shape[1], dtype=bool)
        return c[:, off].mean() / np.stack([np.diag(cj) for cj in c]).mean()

    ref = [rho(batch[lo].numpy()) - rho(batch[hi].numpy()) for lo, hi in pairwise(bvc.FAMILIES)]
    np.testing.assert_allclose([c.estimate for c in steps], ref, rtol=1e-9)
    assert all(c.se > 0 for c in steps)


def test_family_summary_and_entries():
    fit_batch, test_batch = _equicorrelated(RHOS, seed=0), _equicorrelated(RHOS, seed=1)
    target = torch.zeros(6, dtype=F64)
    law = bvc.law_check(fit_batch, test_batch, target, head_counts=[1, 2, 4], groups=20)
    gains = bvc.gains_and_order(test_batch, target)
    summary = bvc.family_summary(law, gains, max_num_heads=4)
    assert list(summary["orthogonal nuisance"]) == [
        "rho",
        "rhoB",
        "mse1",
        "mseH",
        "predH",
        "gain",
        "floor",
        "bias",
        "var1",
        "cov",
    ]
    row = law.table[(law.table.setting == "partly turned") & (law.table.H == 4)].iloc[0]
    assert summary["partly turned"]["mseH"] == estimate(row.mse, row.mse_se)
    entries = {e.name: e.options for e in bvc.family_entries(summary, dtype=F64, replicates=400)}
    assert len(entries) == 4 * 10 * 2
    assert set(entries["rho_ident"]) == {"tol"} and set(entries["gain_ident"]) == {"tol"}
    assert set(entries["mse1_ident"]) == {"se"} and set(entries["rho_orth"]) == {"se"}
    assert set(entries["rho_se_orth"]) == {"tol"}


# --- the shared-data floor -------------------------------------------------------------------


def _explicit_floor(design, x_all, theta, bandwidth, noise_sd):
    """ρ and its parts from explicit Gaussian weights, design by design (numpy loop)."""
    w = design.frames(theta).numpy()
    z, f = design.eval_points.numpy(), design.task.f
    means, noises = [], []
    for x in x_all:
        weights = []
        for h in range(w.shape[0]):
            q, k = z @ w[h], x.numpy() @ w[h]
            logit = -((q[:, None, :] - k[None, :, :]) ** 2).sum(-1) / (2 * bandwidth**2)
            e = np.exp(logit - logit.max(1, keepdims=True))
            weights.append(e / e.sum(1, keepdims=True))
        weights = np.stack(weights)  # (H, m, n)
        means.append(weights @ f(x).numpy())
        noises.append(noise_sd**2 * np.einsum("hmn,gmn->hgm", weights, weights))
    means, noises = np.stack(means), np.stack(noises)
    centred = means - means.mean(0)
    design_part = np.einsum("ghm,gkm->hkm", centred, centred) / (len(x_all) - 1)
    noise_part, total = noises.mean(0), noises.mean(0) + design_part
    off = ~np.eye(w.shape[0], dtype=bool)
    vbar = np.stack([np.diag(total[:, :, j]) for j in range(total.shape[2])]).mean()
    return [t[off].mean() / vbar for t in (total, noise_part, design_part)]


def test_floor_comparison_against_explicit_weights(small_design):
    rho_b = {n: estimate(0.5, 0.01) for n in bvc.SHARED_FAMILIES}
    floor = bvc.floor_comparison(
        small_design, rho_b, n_train=25, floor_designs=12, bandwidth=0.6, groups=4, seed=3, chunk=5
    )
    x_all, _ = small_design.task.sample((12,), 25, generator=torch.Generator().manual_seed(3), dtype=F64)
    for name, theta in small_design.thetas.items():
        parts = floor.parts[name]
        ref = _explicit_floor(small_design, x_all, theta, 0.6, 1.0)
        got = [parts[k].estimate for k in ("rho_predicted_C", "noise_part", "design_part")]
        np.testing.assert_allclose(got, ref, rtol=1e-9)
        assert math.isclose(parts["noise_excess"].estimate, ref[1] - 0.5 * ref[0], rel_tol=1e-9, abs_tol=1e-12)
        assert parts["diff"] == Comparison(0.5 - got[0], math.hypot(0.01, parts["rho_predicted_C"].se))
    assert abs(floor.parts["identical"]["rho_predicted_C"].estimate - 1) < 1e-12  # identical heads: ρ = 1
    assert floor.min_noise >= 0 and len(floor.table) == 3
    entries = {e.name: e.options for e in bvc.floor_entries(floor, dtype=F64, replicates=40)}
    assert len(entries) == 3 * 4 * 2 and set(entries["floor_diff_ident"]) == {"tol"}
    assert "floor_rho_predicted_se_orth" in entries and set(entries["floor_noise_part_orth"]) == {"se"}


# --- dot-product weights and attention ---------------------------------------------------------


def test_dot_product_weights_against_explicit_kernels():
    study = bvc.dot_product_weights(seed=4, groups=20)
    keys = torch.randn(400, 2, generator=torch.Generator().manual_seed(4), dtype=F64).numpy()
    q = np.array([1.5, 0.5])
    for (row, kind), st in study.stats.items():
        h = study.bandwidths[row]
        kk = keys if kind != "unit" else study.unit_keys.numpy()
        logit = -((kk - q) ** 2).sum(1) / (2 * h * h) if kind == "gauss" else kk @ q / (h * h)
        w = np.exp(logit - logit.max())
        w /= w.sum()
        np.testing.assert_allclose(study.weights[(row, kind)].numpy(), w, rtol=1e-10, atol=1e-300)
        ref = dict(
            mean_distance=w @ np.linalg.norm(kk - q, axis=1),
            mean_key_norm=w @ np.linalg.norm(kk, axis=1),
            n_eff=1 / (w**2).sum(),
        )
        for stat, v in ref.items():
            assert math.isclose(st[stat], v, rel_tol=1e-10), (row, kind, stat)
    assert study.unit_gap < 1e-12  # keys of one norm: the two kernels coincide
    s = study.stats
    assert math.isclose(
        study.contrasts[0].estimate,
        s[("att", "exp")]["mean_key_norm"] - s[("att", "gauss")]["mean_key_norm"],
        rel_tol=1e-10,
    )
    assert len(study.contrasts) == len(bvc.WEIGHT_CONTRASTS) and all(c.se > 0 for c in study.contrasts)
    names = {e.name for e in bvc.weight_entries(study, dtype=F64)}
    assert {"w_n_eff_exp_small", "w_mean_key_norm_gauss_att", "w_query_norm", "w_radius"} <= names


def test_attention_design_matches_its_construction(small_design):
    att = bvc.attention_design(small_design, value_mix=0.5)
    again = bvc.attention_design(small_design, value_mix=0.5)
    assert torch.equal(att.eval_points, again.eval_points) and torch.equal(att.mix, again.mix)
    for name, theta in small_design.thetas.items():
        w_k, w_q, w_v = att.heads[name]
        frames = small_design.frames(theta)
        # W_Q W_K^T / sqrt(d_k) = Q Q^T: the kernel sees the frame only
        torch.testing.assert_close(w_q @ w_k.mT / math.sqrt(3), frames @ frames.mT, rtol=1e-10, atol=1e-12)
        xi = w_v[:, :-1] / 0.5
        torch.testing.assert_close(xi.norm(dim=1), torch.ones(4, dtype=F64))
        torch.testing.assert_close(
            torch.einsum("hd,hdk->hk", xi, frames), torch.zeros(4, 3, dtype=F64), atol=1e-12, rtol=0
        )
        assert bool((w_v[:, -1] == 1).all())
    ident_v = att.heads["identical"][2]
    assert (
        torch.equal(ident_v, ident_v[:1].expand_as(ident_v)) and att.heads["independent data"] is att.heads["identical"]
    )
    torch.testing.assert_close(att.target, small_design.task.f(att.eval_points))


def test_attention_checks_are_at_rounding(small_design):
    att = bvc.attention_design(small_design, value_mix=0.5)
    assert bvc.factorisation_gap(small_design, att, n_train=30, seed=6) < 1e-10
    assert bvc.signal_plane_gap(small_design, n_train=30, seed=7) < 1e-12


@pytest.fixture(scope="module")
def attention_batches(small_design):
    att = bvc.attention_design(small_design, value_mix=0.5)
    kw = dict(n_train=30, replicates=40)
    return (
        att,
        bvc.attention_batch(small_design, att, seed=11, **kw),
        bvc.attention_batch(small_design, att, seed=12, **kw),
    )


def test_attention_batch_shapes_and_determinism(small_design, attention_batches):
    att, a, _ = attention_batches
    again = bvc.attention_batch(small_design, att, n_train=30, replicates=40, seed=11)
    assert all(a[n].shape == (40, 4, 6) and torch.equal(a[n], again[n]) for n in bvc.FAMILIES)
    assert torch.equal(a["identical"], a["identical"][:, :1].expand_as(a["identical"]))


def test_least_squares_study_against_lstsq(attention_batches):
    att, a, b = attention_batches
    ls = bvc.least_squares_study(a, b, att.target, head_counts=[1, 2, 4], groups=10)
    assert len(ls.table) == 4 * 3
    x = a["orthogonal nuisance"].numpy()  # (R, H, m): regress f on the heads over replicates × points
    design = x.transpose(0, 2, 1).reshape(-1, 4)
    y = np.tile(att.target.numpy(), x.shape[0])
    alpha = np.linalg.lstsq(design, y, rcond=None)[0]
    row = ls.table[(ls.table.setting == "orthogonal nuisance") & (ls.table.H == 4)].iloc[0]
    assert math.isclose(row.weight_sum, alpha.sum(), rel_tol=1e-6)
    assert math.isclose(ls.sums["orthogonal nuisance"].estimate, alpha.sum(), rel_tol=1e-6)
    pb = b["orthogonal nuisance"].numpy()
    mse_ls = (((pb * alpha[None, :, None]).sum(1) - att.target.numpy()) ** 2).mean(1)
    mse_uni = ((pb.mean(1) - att.target.numpy()) ** 2).mean(1)
    np.testing.assert_allclose(ls.diffs["orthogonal nuisance"].numpy(), mse_ls - mse_uni, rtol=1e-5, atol=1e-9)
    assert math.isclose(row.ls_minus_uniform, (mse_ls - mse_uni).mean(), rel_tol=1e-5, abs_tol=1e-9)


def test_bias_excess_and_relative_gains_brute_force(small_batches, attention_batches, small_design):
    att, _, att_b = attention_batches
    _, batch_b = small_batches
    excess = bvc.bias_excess(att_b, att.target, groups=10)
    x, t = att_b["partly turned"].numpy(), att.target.numpy()
    ens = x.mean(1)  # (R, m)
    mse = ((ens - t) ** 2).mean(0)
    bias_sq = (ens.mean(0) - t) ** 2 - ens.var(0, ddof=1) / x.shape[0]  # unbiased squared bias
    assert math.isclose(excess[1].estimate, (bias_sq - 0.5 * mse).mean(), rel_tol=1e-9)

    def relative_gain(p, f):
        one = ((p[:, 0] - f) ** 2).mean()
        return (one - ((p.mean(1) - f) ** 2).mean()) / one

    gaps = bvc.relative_gain_gaps(batch_b, small_design.target, att_b, att.target, groups=10)
    ref = [
        relative_gain(batch_b[n].numpy(), small_design.target.numpy()) - relative_gain(att_b[n].numpy(), t)
        for n in bvc.FAMILIES[1:]
    ]
    np.testing.assert_allclose([c.estimate for c in gaps], ref, rtol=1e-9)


# --- heads on disjoint blocks --------------------------------------------------------------------


POINT = dict(
    task="single_index",
    embed_dim=4,
    num_heads=2,
    n=30,
    m=8,
    replicates=12,
    bandwidths=3,
    noise_sd=1.0,
    groups=4,
    dtype="float64",
)


@pytest.fixture(scope="module")
def point_record():
    return bvc.combination_point(POINT, seed=5)


def test_combination_point_is_deterministic_json(point_record):
    assert json.loads(json.dumps(point_record)) == point_record
    assert bvc.combination_point(POINT, seed=5) == point_record
    assert bvc.combination_point(POINT, seed=6)["combinations"] != point_record["combinations"]


def test_combination_point_against_a_direct_simulation(point_record):
    res = bvc.combination_results([point_record])["single_index"]
    grid_h = bvc.combination_bandwidths(3, dtype=F64)
    assert set(res.bandwidth.values()) <= set(grid_h.tolist())
    # the uniform average on batch B, rebuilt from the engine at the chosen bandwidth
    z = torch.randn(8, 4, generator=torch.Generator().manual_seed(bvc.DESIGN_SEEDS["blocks"]), dtype=F64)
    task = make_task("single_index", 4, noise_sd=1.0)
    f = torch.sin(2 * z[:, 0]) + 0.5 * z[:, 0]
    assert math.isclose(res.signal, float(f.pow(2).mean()), rel_tol=1e-12)
    eye = torch.eye(4, dtype=F64)
    blocks = torch.stack([eye[:, h::2] for h in range(2)])
    k = grid_h.tolist().index(res.bandwidth["uniform average"])
    heads = simulate(
        task,
        blocks.repeat(3, 1, 1),
        z,
        n=30,
        replicates=12,
        bandwidth=grid_h.repeat_interleave(2),
        generator=torch.Generator().manual_seed(point_seed(5, {"batch": "B"})),
    )
    per_rep = ((heads.unflatten(1, (3, 2))[:, k].mean(1) - f) ** 2).mean(1).numpy()
    assert math.isclose(res.mse["uniform average"].estimate, per_rep.mean(), rel_tol=1e-10)
    assert math.isclose(res.mse["uniform average"].se, per_rep.std(ddof=1) / math.sqrt(12), rel_tol=1e-8)


def test_combination_point_consistency(point_record):
    res = bvc.combination_results([point_record])["single_index"]
    avg, sum_, ls_, full = bvc.COMBINATIONS
    assert len(res.pairs) == 12
    for (a, b), c in res.pairs.items():
        assert math.isclose(c.estimate, -res.pairs[(b, a)].estimate, rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(c.estimate, res.mse[a].estimate - res.mse[b].estimate, rel_tol=1e-9, abs_tol=1e-12)
    assert res.full_min == min(res.full_every_h, key=lambda c: c.estimate) and len(res.full_every_h) == 3
    for kind in bvc.COMBINATIONS:
        assert math.isclose(res.lost[kind].estimate, res.mse[kind].estimate - 0.9 * res.signal, rel_tol=1e-9)
    gap = (res.mse[sum_].estimate - res.mse[avg].estimate) / res.mse[avg].estimate
    assert math.isclose(res.sum_avg_gap.estimate, gap, rel_tol=1e-9)
    assert math.isclose(
        res.full_minus_ls_bias.estimate, res.bias_sq[full] - res.bias[ls_].estimate, rel_tol=1e-6, abs_tol=1e-12
    )


def test_combination_point_rejects_bad_points():
    with pytest.raises(ValueError, match="num_heads"):
        bvc.combination_point({**POINT, "num_heads": 3}, seed=0)
    with pytest.raises(ValueError, match="task"):
        bvc.combination_point({**POINT, "task": "nope"}, seed=0)
    with pytest.raises(ValueError, match="groups"):
        bvc.combination_point({**POINT, "groups": 5}, seed=0)
    with pytest.raises(ValueError, match="lacks"):
        bvc.combination_point({k: v for k, v in POINT.items() if k != "m"}, seed=0)


def test_combination_sweep_tables_and_entries(dtype):
    points = grid(
        task=list(bvc.COMBINATION_TASKS),
        **{k: [v] for k, v in POINT.items() if k not in ("task", "dtype")},
        dtype=[str(dtype).removeprefix("torch.")],
    )
    cmb = bvc.combination_results(run_sweep(bvc.combination_point, points, seed=0, progress=False))
    assert list(cmb) == list(bvc.COMBINATION_TASKS)
    combos, pairs = bvc.combination_tables(cmb)
    assert len(combos) == 3 * 4 and len(pairs) == 3 * 12
    entries = bvc.combination_entries(cmb, dtype=dtype, replicates=12)
    names = {e.name: e.options for e in entries}
    assert len(entries) == len(names) == 3 * (1 + 2 + 4 * 5 + 12 * 2)
    assert names["cmb_ls_h_iso"] == {"verify": False} and set(names["cmb_sum_avg_si"]) == {"se"}
    assert set(names["cmb_signal_int"]) == {"tol"} and set(names["cmb_full_min_se_int"]) == {"tol"}


def test_combination_bandwidths(dtype, device):
    h = bvc.combination_bandwidths(5, dtype=dtype, device=device)
    assert h.dtype == dtype and h.device.type == device.type
    np.testing.assert_allclose(h.double().cpu().numpy(), np.geomspace(0.15, 2.0, 5), rtol=1e-6)


def test_engine_benchmark_runs_the_benchmark_size():
    bench = bvc.engine_benchmark(replicates=2, seed=4)
    assert bench.shape == (2, 8, 256) and bench.finite and bench.seconds > 0 and bench.threads >= 1


# --- attention where it can smooth: LayerNorm'd tokens, QK-normalised heads ----------------------


@pytest.fixture(scope="module")
def cosine_small():
    return bvc.cosine_design(
        embed_dim=9,
        max_num_heads=4,
        n_eval=5,
        noise_sd=1.0,
        partial_angle_deg=30.0,
        value_mix=0.5,
        dtype=F64,
        device="cpu",
    )


def test_centred_basis_is_orthonormal_and_orthogonal_to_one(dtype, device, tol):
    c = bvc.centred_basis(6, dtype=dtype, device=device)
    assert c.shape == (6, 5) and c.dtype == dtype and c.device.type == torch.device(device).type
    torch.testing.assert_close(c.T @ c, torch.eye(5, dtype=dtype, device=device), **tol)
    torch.testing.assert_close(c.sum(0), torch.zeros(5, dtype=dtype, device=device), **tol)
    with pytest.raises(ValueError, match="embed_dim"):
        bvc.centred_basis(1)


def test_layer_norm_tokens_and_target_against_explicit_formulas():
    x = torch.randn(7, 5, generator=_rng(1), dtype=F64)
    xn = x.numpy()
    ref = (xn - xn.mean(1, keepdims=True)) / np.sqrt(xn.var(1, keepdims=True) + 1e-5)  # torch's eps
    t = bvc.layer_norm_tokens(x)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-12, atol=1e-12)
    c = bvc.centred_basis(5, dtype=F64).numpy()
    f_ref = (np.sin(2 * ref @ c[:, 0]) + np.sin(2 * ref @ c[:, 1])) / np.sqrt(2)
    np.testing.assert_allclose(bvc.centred_target(t, torch.from_numpy(c)).numpy(), f_ref, rtol=1e-12, atol=1e-12)


def test_cosine_design_matches_its_construction(cosine_small):
    d, again = (
        cosine_small,
        bvc.cosine_design(
            embed_dim=9,
            max_num_heads=4,
            n_eval=5,
            noise_sd=1.0,
            partial_angle_deg=30.0,
            value_mix=0.5,
            dtype=F64,
            device="cpu",
        ),
    )
    assert torch.equal(d.eval_points, again.eval_points) and torch.equal(d.mix, again.mix)
    torch.testing.assert_close(d.eval_points.sum(1), torch.zeros(5, dtype=F64), atol=1e-12, rtol=0)  # LayerNorm'd
    c = d.basis
    for name, theta in zip(bvc.SHARED_FAMILIES, (0.0, math.radians(30.0), math.pi / 2), strict=True):
        w_k, w_q, xi = d.heads[name]
        for h in range(4):
            frame = torch.stack([c[:, 0], c[:, 1], math.cos(theta) * c[:, 2] + math.sin(theta) * c[:, 3 + h]], 1)
            torch.testing.assert_close(w_k[h], frame @ d.mix)
            torch.testing.assert_close(w_q[h], frame @ torch.linalg.inv(d.mix).T)
            assert not torch.allclose(w_q[h], w_k[h])  # W_Q != W_K
            # the value direction: unit, orthogonal to 1, to the signal and to the head's frame
            assert abs(float(xi[h].norm()) - 1) < 1e-12 and abs(float(xi[h].sum())) < 1e-12
            assert float((frame.T @ xi[h]).abs().max()) < 1e-12
    assert torch.equal(d.heads["identical"][2], d.heads["identical"][2][:1].expand(4, 9))
    assert d.heads["independent data"] is d.heads["identical"]
    assert math.isclose(d.zero_mse, float(d.target.pow(2).mean()))
    with pytest.raises(ValueError, match="embed_dim"):
        bvc.cosine_design(
            embed_dim=7,
            max_num_heads=4,
            n_eval=5,
            noise_sd=1.0,
            partial_angle_deg=30.0,
            value_mix=0.5,
            dtype=F64,
            device="cpu",
        )


def _explicit_cosine_head(d, t, y, family, h, tau):
    """softmax(<q̂, k̂>/τ) v for one head and one training set, with numpy."""
    w_k, w_q, xi = (a[h].numpy() for a in d.heads[family])
    k, q = t @ w_k, d.eval_points.numpy() @ w_q
    k, q = k / np.linalg.norm(k, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)
    s = q @ k.T / tau
    w = np.exp(s - s.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    return w @ (y + 0.5 * t @ xi)


def test_cosine_batch_against_an_explicit_softmax(cosine_small):
    d = cosine_small
    out = bvc.cosine_batch(d, n_train=12, replicates=3, temperature=0.2, seed=5, chunk=2)
    assert all(out[n].shape == (3, 4, 5) for n in bvc.FAMILIES)
    again = bvc.cosine_batch(d, n_train=12, replicates=3, temperature=0.2, seed=5, chunk=2)
    assert all(torch.equal(out[n], again[n]) for n in bvc.FAMILIES)
    # redraw the training sets as the function does: blocks of `chunk` replicates, a set per head
    g = torch.Generator().manual_seed(5)
    for start in (0, 2):
        r = min(2, 3 - start)
        x = torch.randn(r, 4, 12, 9, generator=g, dtype=F64)
        t = bvc.layer_norm_tokens(x)
        y = bvc.centred_target(t, d.basis) + torch.randn(r, 4, 12, generator=g, dtype=F64)
        for j in range(r):
            for h in range(4):
                for fam in bvc.FAMILIES:
                    s = h if fam == "independent data" else 0
                    ref = _explicit_cosine_head(d, t[j, s].numpy(), y[j, s].numpy(), fam, h, 0.2)
                    np.testing.assert_allclose(out[fam][start + j, h].numpy(), ref, rtol=1e-10, atol=1e-12)
    # common random numbers: head 1 of independent data is the identical head (to rounding: another einsum)
    torch.testing.assert_close(out["independent data"][:, 0], out["identical"][:, 0], rtol=1e-13, atol=1e-14)
    # identical heads: the same estimator (to rounding: the heads go through one batched call)
    torch.testing.assert_close(
        out["identical"], out["identical"][:, :1].expand_as(out["identical"]), rtol=1e-13, atol=1e-14
    )
    with pytest.raises(ValueError, match="temperature"):
        bvc.cosine_batch(d, n_train=12, replicates=3, temperature=0.0, seed=5)
    with pytest.raises(ValueError, match="families"):
        bvc.cosine_batch(d, n_train=12, replicates=3, temperature=0.2, seed=5, families=["other"])


def test_select_temperature_is_the_argmin_on_the_validation_batch(cosine_small):
    grid = bvc.temperature_grid(3)
    assert math.isclose(grid[0], 0.01) and math.isclose(grid[-1], 0.5)
    choice = bvc.select_temperature(cosine_small, grid=grid, n_train=20, replicates=4, seed=9)
    ref = []
    for tau in grid:
        p = bvc.cosine_batch(cosine_small, n_train=20, replicates=4, temperature=tau, seed=9)["identical"][:, 0]
        ref.append(float((p - cosine_small.target).pow(2).mean()))
    np.testing.assert_allclose(choice.mse, ref, rtol=1e-12)
    assert choice.temperature == grid[int(np.argmin(ref))]
    with pytest.raises(ValueError, match="grid"):
        bvc.select_temperature(cosine_small, grid=[0.1, -1.0], n_train=20, replicates=4, seed=9)


def test_zero_predictor_table_and_beats_zero():
    import pandas as pd

    t = pd.DataFrame(dict(setting=["a", "a"], H=[1, 2], mse=[0.2, 0.1], mse_se=[0.02, 0.01]))
    z = bvc.zero_predictor_table(t, 0.4)
    np.testing.assert_allclose(z.removed, [0.5, 0.75])
    np.testing.assert_allclose(z.removed_se, [0.05, 0.025])
    with pytest.raises(ValueError, match="zero_mse"):
        bvc.zero_predictor_table(t, 0.0)
    batch = _equicorrelated(RHOS, replicates=50, heads=3, m=4)
    target = torch.linspace(-1, 1, 4, dtype=F64)
    ise = ((batch["identical"][:, 0] - target) ** 2).mean(1).numpy() - float((target**2).mean())
    c = bvc.beats_zero(batch, target)
    assert math.isclose(c.estimate, ise.mean(), rel_tol=1e-12)
    assert math.isclose(c.se, ise.std(ddof=1) / math.sqrt(50), rel_tol=1e-10) and c.df == 49


def test_variance_reduction_claim_against_numpy_and_the_equicorrelated_law():
    heads, batch = 4, _equicorrelated(RHOS, replicates=4000, heads=4, m=3, seed=2)
    vr = {}
    for n in bvc.FAMILIES:
        p = batch[n].numpy()
        vr[n] = p[:, 0].var(0, ddof=1).mean() - p.mean(1).var(0, ddof=1).mean()
    got = bvc.variance_reduction_claim(batch, groups=20)
    ident, part, orth, indep = (vr[n] for n in bvc.FAMILIES)
    np.testing.assert_allclose([c.estimate for c in got], [part - ident, orth - ident, indep - part, indep - orth])
    # unit variances: the reduction is (1 − ρ)(1 − 1/H), so the steps are known
    law = [(1 - r) * (1 - 1 / heads) for r in RHOS]
    for c, ref in zip(got, [law[1] - law[0], law[2] - law[0], law[3] - law[1], law[3] - law[2]], strict=True):
        assert abs(c.estimate - ref) < 5 * c.se and c.se > 0


def _plug_in_terms(p, target):
    """Plug-in bias² (no correction), unbiased variance and covariance terms of the uniform average (numpy)."""
    avg = p.mean(1)
    bias_plug = ((avg.mean(0) - target) ** 2).mean()
    heads = p.shape[1]
    cov = np.einsum("rhm,rkm->hkm", p - p.mean(0), p - p.mean(0)) / (p.shape[0] - 1)
    variance = np.trace(cov, axis1=0, axis2=1).mean() / heads**2
    covariance = (cov.sum((0, 1)) - np.trace(cov, axis1=0, axis2=1)).mean() / heads**2
    return bias_plug, variance, covariance


def test_term_agreement_against_a_loop_and_it_can_fail():
    a = _equicorrelated(RHOS, replicates=400, heads=4, m=3, seed=3)
    b = _equicorrelated(RHOS, replicates=400, heads=4, m=3, seed=4)
    target = torch.zeros(3, dtype=F64)
    got = bvc.term_agreement(a, b, target, group_size=2, groups=20)
    for n in bvc.FAMILIES:
        pa, pb = a[n].numpy(), b[n].numpy()
        small = []
        for q in pa.reshape(-1, 2, *pa.shape[1:]):
            bias_plug, var, cov = _plug_in_terms(q, 0.0)
            small.append([bias_plug - (var + cov) / 2, var, cov])  # unbiased: minus Var(average)/R
        bias_b, var_b, cov_b = _plug_in_terms(pb, 0.0)
        on_b = [bias_b - (var_b + cov_b) / 400, var_b, cov_b]
        mse_b = ((pb.mean(1) - 0.0) ** 2).mean()
        ref = (np.mean(small, 0) - on_b) / mse_b
        mse_a = ((pa.mean(1) - 0.0) ** 2).mean()
        ref = [*ref, (mse_a - mse_b) / mse_b]  # the terms add up on A and on B
        np.testing.assert_allclose([c.estimate for c in got[n]], ref, rtol=1e-9, atol=1e-12)
        assert all(abs(c.estimate) < 5 * c.se for c in got[n])  # unbiased: mean 0
        # The plug-in squared bias from pairs is off by Var(average)/2: in units of the MSE beyond the ±15 % margin.
        plug = (np.mean([_plug_in_terms(q, 0.0)[0] for q in pa.reshape(-1, 2, *pa.shape[1:])]) - on_b[0]) / mse_b
        assert plug > 0.15 + 2 * got[n][0].se
    with pytest.raises(ValueError, match="group_size"):
        bvc.term_agreement(a, b, target, group_size=3, groups=20)


def test_average_variance_bound_symbolically_and_numerically():
    var_avg, c_bar, spread = bvc.average_variance_bound(4)
    assert sp.expand(var_avg - (c_bar + spread / 4)) == 0
    m = torch.randn(4, 6, generator=_rng(7), dtype=F64)
    cov = (m @ m.T).numpy()  # any covariance matrix
    subs = {sp.Symbol(f"V_{i + 1}", positive=True): cov[i, i] for i in range(4)}
    subs.update({sp.Symbol(f"C_{i + 1}{j + 1}", real=True): cov[i, j] for i in range(4) for j in range(i + 1, 4)})
    assert math.isclose(float(var_avg.subs(subs)), cov.sum() / 16, rel_tol=1e-12)
    off = (cov.sum() - np.trace(cov)) / 12
    assert math.isclose(float(c_bar.subs(subs)), off, rel_tol=1e-12)
    assert math.isclose(float(spread.subs(subs)), np.trace(cov) / 4 - off, rel_tol=1e-12) and np.trace(cov) / 4 >= off
    with pytest.raises(ValueError, match="num_heads"):
        bvc.average_variance_bound(1)


def test_shared_data_floor_proposition_by_enumeration():
    """prop-shared-data-floor on a finite model, by brute force: every design and every noise sign pattern.

    n = 3 inputs on {-1, 0, 1} (27 equally likely designs), Rademacher noise (mean 0, variance 1,
    8 sign patterns), two Gaussian-kernel NW heads with different bandwidths at x = 0.3. The exact
    covariance over all 216 outcomes must equal the noise part σ²E Σ w w' plus the design part
    Cov_X(E[f̂|X]), both computed with nwlib.combination.conditional_moments; the noise part is > 0
    (positive weights), and the design part is the population covariance of the conditional means.
    """
    from itertools import product

    from nwlib.combination import conditional_moments

    sigma, f = 0.7, (lambda x: np.sin(2 * x) + x)
    designs = np.array(list(product([-1.0, 0.0, 1.0], repeat=3)))
    signs = np.array(list(product([-1.0, 1.0], repeat=3)))

    def weights(xs, h):
        k = np.exp(-((0.3 - xs) ** 2) / (2 * h**2))
        return k / k.sum()

    w = np.stack([np.stack([weights(xs, h) for h in (0.4, 1.5)]) for xs in designs])  # (27, 2, 3)
    outcomes = np.array([[w[g, k] @ (f(designs[g]) + sigma * e) for k in range(2)] for g in range(27) for e in signs])
    exact = np.mean(outcomes[:, 0] * outcomes[:, 1]) - outcomes[:, 0].mean() * outcomes[:, 1].mean()
    mean, noise = conditional_moments(
        torch.from_numpy(w)[:, :, None, :], torch.from_numpy(f(designs)), sigma
    )  # (27, 2, 1), (27, 2, 2, 1)
    noise_part = float(noise[:, 0, 1, 0].mean())
    m0, m1 = mean[:, 0, 0].numpy(), mean[:, 1, 0].numpy()
    design_part = np.mean(m0 * m1) - m0.mean() * m1.mean()
    assert math.isclose(exact, noise_part + design_part, rel_tol=1e-12)
    assert noise_part > 0 and math.isclose(noise_part, sigma**2 * np.mean((w[:, 0] * w[:, 1]).sum(1)), rel_tol=1e-12)
    # a wrong split (the noise part alone, or with the design covariance of the *weights*) would not match
    assert not math.isclose(exact, noise_part, rel_tol=1e-3)


# --- the chapter's tables, for reading ---------------------------------------------------------


def _pm(value: float, se: float) -> str:
    """Estimate ± SE, the SE to two significant digits and the estimate to its decimals, as the book typesets it."""
    d = 1 - math.floor(math.log10(se))
    text = f"{round(value, d):.{d}f} ± {se:.{d}f}"
    return text.replace(" ± ", "\u00a0±\u00a0").replace("-", "\u2212")  # typeset: no break at ±, a minus sign


def test_format_table_pairs_standard_errors_and_drops_rounding():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        dict(
            setting=["identical", "identical", "partly turned"],
            H=[1, 2, 8],
            mse=[0.169431, 0.169431, 0.128093],
            mse_se=[0.00321, 0.00321, 0.00229],
            predicted=[0.1637, 0.1637, 0.12244],
            predicted_se=[0.0023, 0.0023, 0.00171],
            z=[1.4399, 1.4399, -1.9904],
            ratio_gap=[math.nan, -2.2e-16, 0.011234],
            ratio_gap_se=[math.nan, 5e-16, 0.005612],
            bias_sq=[0.0273, 0.0273, 0.0272],
        )
    )
    shown = bvc.format_table(frame, columns=["setting", "H", "mse", "ratio_gap", "z"], rounding=1e-12)
    assert list(shown.index.names) == ["family", "H"]  # the columns that name a row
    assert list(shown.index) == [("identical", "1"), ("identical", "2"), ("partly turned", "8")]
    assert list(shown.columns) == ["MSE", "variance ratio, B − predicted", "z"]
    assert shown["MSE"].tolist() == [_pm(0.169431, 0.00321)] * 2 + [_pm(0.128093, 0.00229)]
    assert shown["MSE"].iloc[2] == "0.1281\u00a0±\u00a00.0023"
    # H = 1 has no ratio (–); identical heads' gap is 0 to rounding: no SE of 1e-16 printed
    assert shown["variance ratio, B − predicted"].tolist() == ["–", "0", _pm(0.011234, 0.005612)]
    assert shown["z"].tolist() == ["1.44", "1.44", "\u22121.99"]
    # a bare "se" pairs with the column before it; "a_B" pairs with "a_se"
    steps = pd.DataFrame(dict(step=["a → b"], diff=[0.035931], se=[0.001733], z=[20.7]))
    shown = bvc.format_table(steps)
    assert list(shown.index) == ["a → b"] and shown.iloc[0].tolist() == [_pm(0.035931, 0.001733), "20.7"]
    floor = pd.DataFrame(dict(rho_measured_B=[0.67201], rho_measured_se=[0.00652]))
    assert bvc.format_table(floor).iloc[0].tolist() == [_pm(0.67201, 0.00652)]
    assert bvc.format_table(floor, se={}).shape == (1, 2)  # no pairing asked for: both columns shown
    temps = pd.DataFrame(dict(temperature=[0.0266, 0.5], task=["single_index", "isotropic"], mse=[0.3697, 0.4577]))
    shown = bvc.format_table(temps, index=["task"])
    assert list(shown.index) == ["single index", "isotropic"] and list(shown.columns) == ["temperature τ", "MSE"]
    assert list(bvc.format_table(temps).index) == [("0.0266", "single index"), ("0.5", "isotropic")]
    with pytest.raises(TypeError, match="frame"):
        bvc.format_table(frame.to_dict())
    with pytest.raises(ValueError, match="rounding"):
        bvc.format_table(frame, rounding=-1.0)
    with pytest.raises(ValueError, match="missing"):
        bvc.format_table(frame, se={"mse": "missing"})
    with pytest.raises(ValueError, match="index"):
        bvc.format_table(frame, index=["missing"])


def test_format_summary_terms_and_pairs():
    pd = pytest.importorskip("pandas")
    summary = {
        "identical": {"rho": estimate(1.0, 4e-16), "gain": estimate(0.0, 0.0)},
        "orthogonal nuisance": {"rho": estimate(0.41993, 0.00631), "gain": estimate(0.07191, 0.00271)},
    }
    shown = bvc.format_summary(summary, rounding=1e-12)
    assert list(shown.columns) == ["identical", "orthogonal nuisance"]
    assert list(shown.index) == ["ρ (A)", "gain MSE₁ − MSE_Hmax"]
    assert shown["identical"].tolist() == ["1", "0"]  # fixed by construction: no SE of 1e-16
    assert shown["orthogonal nuisance"].tolist() == [_pm(0.41993, 0.00631), _pm(0.07191, 0.00271)]
    cs = [estimate(0.0008, 0.0179), estimate(-0.0042, 0.0028), estimate(-0.0297, 0.0193), estimate(-0.0332, 0.0272)]
    t = bvc.format_terms({"identical": cs})
    assert list(t.index) == ["identical"] and t.index.name == "family"
    assert list(t.columns) == ["bias², A − B", "variance, A − B", "covariance, A − B", "sum, A − B"]
    assert t.iloc[0].tolist() == [_pm(c.estimate, c.se) for c in cs]
    names = list(bvc.COMBINATIONS)
    pairs = [(a, b) for a in names for b in names if a != b]
    rows = [dict(task="isotropic", a=a, b=b, mean=0.1 * i, se=0.01) for i, (a, b) in enumerate(pairs)]
    once = bvc.format_pairs(pd.DataFrame(rows))
    assert len(once) == len(names) * (len(names) - 1) // 2  # each pair once
    assert all(names.index(a) < names.index(b) for _, a, b in once.index)
    assert list(once.index.names) == ["target", "a", "b"] and list(once.columns) == ["MSE a − MSE b"]
    with pytest.raises(TypeError, match="summary"):
        bvc.format_summary({})


def test_format_weight_stats_names_the_kernels():
    study = bvc.dot_product_weights(seed=4, groups=20)
    shown = bvc.format_weight_stats(study)
    assert list(shown.index.names) == ["bandwidth h", "kernel"]
    assert list(shown.columns) == ["mean ‖k − q‖", "mean ‖k‖", "n_eff"]
    kernels = ["Gaussian", "dot-product (exp)", "exp, keys normalised"]
    assert [k for _, k in shown.index][:3] == kernels
    assert shown.index[0][0] == f"{study.bandwidths['att']:.3g}"
    n_eff = [st["n_eff"] for st in study.stats.values()]
    assert shown["n_eff"].tolist() == [f"{v:.0f}" for v in n_eff]  # three significant digits of the largest (> 100)
    with pytest.raises(TypeError, match="study"):
        bvc.format_weight_stats(study.stats)
