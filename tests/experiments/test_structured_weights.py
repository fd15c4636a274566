"""Tests of nwlib.experiments.structured_weights: the independent-heads model, the surrogate and attention
experiments of chapter 4, and what the chapter quotes from them.

References: closed forms of the diagonal model, scipy (brentq, the normal quantile), NumPy brute force
(explicit ensembles, least squares, delete-a-group loops), and nwlib.simulate called directly with the
generators in the documented order (for the sweep's points: each point's own seed).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import sympy as sp
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from nwlib import fibonacci_weights, geometric_weights, simulate
from nwlib.book.verdicts import Case, judge_readings, within_conditions
from nwlib.combination import grouped_jackknife
from nwlib.evidence import Comparison
from nwlib.experiments import structured_weights as sw
from nwlib.sweep import point_seed

TINY = dict(
    model_heads=3,
    num_heads=3,
    n=32,
    m=16,
    replicates=4,
    noise_sd=0.5,
    kappas=[0.0, 1.0],
    ratios=[0.8, 0.5],
    theta_min_deg=20.0,
    theta_max_deg=80.0,
    bandwidth_span=4.0,
    fit_sizes=[1, 2, 4],
    validation_points=8,
    fit_repeats=2,
    rate_head_dims=[1, 2, 3],
    rate_ns=[32, 64],
    key_scale=2.0,
    value_leak=0.25,
    quality_replicates=4,
    quality_points=8,
)


def tiny(**changes) -> sw.Settings:
    return sw.Settings(**{**TINY, **changes})


STUDY_SEED = 3


@pytest.fixture(scope="module")
def study() -> sw.Study:
    return sw.run_study(tiny(), seed=STUDY_SEED)


def _point(settings: sw.Settings, experiment: str, setting) -> dict:
    return next(p for p in sw.setting_points(settings) if (p["experiment"], p["setting"]) == (experiment, setting))


def _point_generators(settings, experiment, setting, seed=STUDY_SEED):
    """The generators a sweep point draws from: its training sets, and the validation noise (documented)."""
    seed_p = point_seed(seed, _point(settings, experiment, setting))
    noise = torch.Generator().manual_seed(point_seed(seed_p, {"stream": "validation noise"}))
    return torch.Generator().manual_seed(seed_p), noise


def _rerun(settings, experiment, setting, seed=STUDY_SEED):
    """A setting recomputed serially by its building block from the point's seeds (the batches kept)."""
    gen, noise = _point_generators(settings, experiment, setting, seed)
    design = sw.make_design(settings, seed=0)
    if experiment == "attention":
        _, fit, _ = sw.attention_setting(settings, design, setting, generator=gen)
    elif experiment == "rates":
        fit = sw.rate_setting(settings, setting, generator=gen).fit
    else:
        design = dataclasses.replace(design, validation_generator=noise)
        _, fit = sw.surrogate_setting(settings, design, experiment, setting, generator=gen)
    return fit, gen, design


def _predictions(R=6, H=4, m=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(m, dtype=torch.float64, generator=g)
    noise = torch.randn(R, H, m, dtype=torch.float64, generator=g) * torch.linspace(0.2, 1.5, H)[:, None]
    return target + noise, target


def _ensemble_mse(pred: np.ndarray, target: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-replicate integrated squared error of one weighting, by an explicit loop."""
    R, H, m = pred.shape
    return np.array(
        [np.mean([(sum(w[h] * pred[r, h, j] for h in range(H)) - target[j]) ** 2 for j in range(m)]) for r in range(R)]
    )


# --- the independent-heads model ----------------------------------------------------------


def test_geometric_sequence_and_diagonal_risk_against_the_library_and_numpy():
    w = sw.geometric_sequence(5, 0.6)
    np.testing.assert_allclose(w, geometric_weights(5, 0.6, dtype=torch.float64).numpy(), rtol=1e-14)
    q = 1.7
    expected = np.asarray(w) @ np.diag(q ** np.arange(5)) @ np.asarray(w)
    assert math.isclose(sw.diagonal_risk(w, q), expected, rel_tol=1e-13)
    qs = sp.Symbol("q", positive=True)
    assert sp.simplify(sw.diagonal_risk([sp.Rational(1, 2)] * 2, qs) - (1 + qs) / 4) == 0
    assert sp.simplify(sum(sw.geometric_sequence(3, sp.Symbol("r", positive=True))) - 1) == 0


def test_break_even_of_two_heads_is_the_closed_form():
    # H = 2, geometric ratio r: uniform minus geometric ∝ (3q - 1) r - (3 - q), zero at q = (3 + r) / (3 r + 1)
    for r in (0.3, 0.5, 0.8):
        got = sw.break_even(np.array([1 / (1 + r), r / (1 + r)]))
        assert math.isclose(got, (3 + r) / (3 * r + 1), rel_tol=1e-12)


def test_independent_heads_model_against_scipy_and_the_optimum():
    H, ratios = 5, [0.8, 0.5]
    model = sw.independent_heads_model(H, ratios, points=41)
    kk = np.arange(H)

    def mse(w, q):
        return float(w @ np.diag(q**kk) @ w)

    unif = np.full(H, 1 / H)
    for name, w in model.weights.items():
        root = brentq(lambda q, w=w: mse(w, q) - mse(unif, q), 1.0 + 1e-9, 64.0, xtol=1e-14)
        assert math.isclose(model.thresholds[name], root, rel_tol=1e-9), name
        np.testing.assert_allclose(model.relative[name], [mse(w, q) / mse(unif, q) for q in model.qs], rtol=1e-12)
    np.testing.assert_allclose(model.weights["Fibonacci"], [5 / 12, 3 / 12, 2 / 12, 1 / 12, 1 / 12], rtol=1e-14)
    # the optimum of the diagonal model: weights ∝ 1/V_h
    opt = [(1 / q**kk / np.sum(1 / q**kk)) for q in model.qs]
    np.testing.assert_allclose(
        model.relative["optimal"], [mse(w, q) / mse(unif, q) for w, q in zip(opt, model.qs, strict=True)], rtol=1e-12
    )
    assert model.relative["optimal"][0] == pytest.approx(1.0, abs=1e-14)  # q = 1: uniform is optimal
    phi = (1 + 5**0.5) / 2
    w_opt = 1 / phi**kk / np.sum(1 / phi**kk)
    assert math.isclose(
        model.fib_efficiency_at_phi, mse(w_opt, phi) / mse(model.weights["Fibonacci"], phi), rel_tol=1e-12
    )
    assert list(model.threshold_table().index) == list(model.weights)


def test_nested_model_mse_and_adding_helps_by_brute_force():
    for r, q in ((0.5, 1.5), (0.9, 2.0), (1.0, 3.0), (0.3, 3.0)):
        direct = []
        for k in range(1, 12):
            w = np.array([r**i for i in range(k)])
            w /= w.sum()
            direct.append(float(np.sum(w**2 * q ** np.arange(k))))
        np.testing.assert_allclose(sw.nested_model_mse(r, q, 11), direct, rtol=1e-12)
        helps = sw.adding_helps(r, q, 11)
        assert helps.tolist() == [b < a for a, b in zip(direct[:-1], direct[1:], strict=True)]
        if r * q <= 1:
            assert helps.all()  # the known regime: every added head helps


# --- the design and the surrogate heads ---------------------------------------------------


def test_sobol_normal_is_the_normal_quantile_of_the_fixed_sobol_points(dtype, device, tol):
    got = sw.sobol_normal(3, 64, dtype=dtype, device=device)
    assert got.shape == (64, 3) and got.dtype == dtype and got.device.type == device.type
    u = torch.quasirandom.SobolEngine(3, scramble=True, seed=sw.DESIGN_SEED).draw(64, dtype=torch.float64)
    torch.testing.assert_close(got.double().cpu(), torch.from_numpy(norm.ppf(u.numpy())), **tol)
    torch.testing.assert_close(got, sw.sobol_normal(3, 64, dtype=dtype, device=device), rtol=0, atol=0)


def test_make_design_is_fixed_and_only_the_noise_follows_the_seed():
    s = tiny()
    d0, d1 = sw.make_design(s, seed=0), sw.make_design(s, seed=1)
    for a, b in ((d0.eval_points, d1.eval_points), (d0.val_points, d1.val_points), (d0.target, d1.target)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the validation inputs: a CPU generator seeded DESIGN_SEED + 1; the noise continues it under the design's seed
    g = torch.Generator().manual_seed(sw.DESIGN_SEED + 1)
    torch.testing.assert_close(d0.val_points, torch.randn(8, 4, generator=g, dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(torch.randn(2, generator=d0.validation_generator), torch.randn(2, generator=g))
    g1 = torch.Generator().manual_seed(2)
    torch.testing.assert_close(torch.randn(2, generator=d1.validation_generator), torch.randn(2, generator=g1))
    assert d0.task.f(d0.eval_points).shape == (16,) and d0.u.tolist() == [0.0, 0.5, 1.0]


def test_relevance_projections_are_the_stated_unit_vectors(dtype, device, tol):
    angles = torch.tensor([0.1, 0.7, 1.2], dtype=dtype, device=device)
    W = sw.relevance_projections(angles)
    assert W.shape == (3, 4, 1) and W.dtype == dtype and W.device.type == device.type
    expected = np.zeros((3, 4))
    for h, t in enumerate([0.1, 0.7, 1.2]):
        expected[h, 0], expected[h, h + 1] = math.cos(t), math.sin(t)
    torch.testing.assert_close(W[..., 0].double().cpu(), torch.from_numpy(expected), **tol)


def test_consistent_projections_span_the_signal_and_private_directions(dtype, device):
    W = sw.consistent_projections([1, 2, 3], dtype=dtype, device=device)
    assert W.shape == (3, 4, 3) and W.dtype == dtype and W.device.type == device.type
    gram = (W.mT @ W).cpu()
    for h, d in enumerate([1, 2, 3]):
        torch.testing.assert_close(gram[h], torch.diag((torch.arange(3) < d).to(dtype)))
    assert W[:, 0, 0].tolist() == [1.0, 1.0, 1.0]  # every head sees the signal direction
    nuisance = [{int(i) for i in torch.nonzero(W[h, 1:].cpu())[:, 0]} for h in range(3)]
    assert nuisance == [set(), {0}, {1, 2}]  # private, disjoint


def test_simulate_heads_is_simulate_in_float32_returned_in_the_points_dtype():
    s = tiny()
    d = sw.make_design(s, seed=0)
    W = sw.relevance_projections(torch.full((3,), 0.3, dtype=torch.float64))
    got = sw.simulate_heads(d.task, W, d.eval_points, n=32, replicates=2, generator=torch.Generator().manual_seed(5))
    ref = simulate(
        d.task, W.float(), d.eval_points.float(), n=32, replicates=2, generator=torch.Generator().manual_seed(5)
    )
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref.double(), rtol=0, atol=0)


# --- the schemes, fitted on A and scored on B ------------------------------------------------


def test_scheme_weights_follow_their_definitions(dtype, device):
    order = torch.tensor([2, 0, 3, 1], device=device)
    M = torch.diag(torch.tensor([2.0, 4.0, 1.0, 3.0], dtype=dtype, device=device))
    w = sw.scheme_weights(order, M, [0.5])
    assert list(w) == ["uniform", "Fibonacci", "geometric r=0.5", "best head only", sw.OPTIMAL]
    fib = fibonacci_weights(4, dtype=torch.float64).numpy()  # (3, 2, 1, 1)/7, best first
    expected = {
        "uniform": [0.25] * 4,
        "Fibonacci": [fib[1], fib[3], fib[0], fib[2]],
        "geometric r=0.5": [4 / 15, 1 / 15, 8 / 15, 2 / 15],
        "best head only": [0, 0, 1, 0],
    }
    inv = 1 / np.array([2.0, 4.0, 1.0, 3.0])
    expected[sw.OPTIMAL] = inv / inv.sum()  # M^-1 1 / 1^T M^-1 1 for a diagonal M
    for name, values in expected.items():
        assert w[name].dtype == dtype and w[name].device.type == device.type
        np.testing.assert_allclose(
            w[name].double().cpu().numpy(), values, rtol=1e-5 if dtype == torch.float32 else 1e-12
        )


def test_compare_schemes_rows_against_explicit_ensembles_and_a_jackknife_loop():
    batch_a, target = _predictions(seed=1)
    other, other_target = _predictions(seed=2)
    batch_b = other - other_target + target  # the same target, independent errors
    rows, fit = sw.compare_schemes("x", 0.5, batch_a, batch_b, target, ratios=[0.5], jack_groups=3)
    A, B, f = batch_a.numpy(), batch_b.numpy(), target.numpy()
    head_mse_a = ((A - f) ** 2).mean(axis=(0, 2))
    assert fit.ranking.order.tolist() == list(np.argsort(head_mse_a, kind="stable"))
    unif = _ensemble_mse(B, f, np.full(4, 0.25))
    by_scheme = {r["scheme"]: r for r in rows}
    assert set(by_scheme) == set(fit.weights) and all(r["experiment"] == "x" and r["kappa"] == 0.5 for r in rows)
    for name, r in by_scheme.items():
        s = _ensemble_mse(B, f, fit.weights[name].numpy())
        assert math.isclose(r["mse"], s.mean(), rel_tol=1e-12)
        d = s - unif
        assert math.isclose(r["diff"], d.mean(), rel_tol=1e-9, abs_tol=1e-15)
        se_a = fit.se_a.get(name, 0.0)
        assert math.isclose(r["diff_se"], math.hypot(d.std(ddof=1) / math.sqrt(6), se_a), rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(r["se"], math.hypot(s.std(ddof=1) / math.sqrt(6), se_a), rel_tol=1e-9)
    # batch A's part of the optimal weights' SE: delete-a-group jackknife by hand (3 groups of 2 replicates)
    M_full = np.einsum("rhm,rgm->hg", A - f, A - f) / (6 * 5)
    leave = []
    for g in range(3):
        keep = [r for r in range(6) if r // 2 != g]
        E = A[keep] - f
        M = np.einsum("rhm,rgm->hg", E, E) / (len(keep) * 5)
        w = np.linalg.solve(M, np.ones(4))
        leave.append(_ensemble_mse(B, f, w / w.sum()).mean())
    leave = np.array(leave)
    assert math.isclose(fit.se_a[sw.OPTIMAL], math.sqrt(2 / 3 * np.sum((leave - leave.mean()) ** 2)), rel_tol=1e-8)
    w_full = np.linalg.solve(M_full, np.ones(4))
    np.testing.assert_allclose(fit.weights[sw.OPTIMAL].numpy(), w_full / w_full.sum(), rtol=1e-10)
    M_b = np.einsum("rhm,rgm->hg", B - f, B - f) / (6 * 5)
    assert math.isclose(fit.oracle_b, 1 / np.sum(np.linalg.inv(M_b)), rel_tol=1e-10)


def test_two_way_is_crossed_and_nan_with_one_fit():
    S = torch.tensor([[1.0, 2.0, 4.0], [2.0, 3.0, 7.0]], dtype=torch.float64)
    est, se = sw._two_way(S)
    rows, cols = S.mean(1).numpy(), S.mean(0).numpy()
    assert est == pytest.approx(S.mean().item()) and se == pytest.approx(
        math.sqrt(rows.var(ddof=1) / 2 + cols.var(ddof=1) / 3)
    )
    one = sw._two_way(S[:1])
    assert one[0] == pytest.approx(7 / 3) and math.isnan(one[1])


def test_validation_fits_rank_and_weight_by_the_residual_second_moments():
    pred, f = _predictions(R=6, H=3, m=7, seed=4)
    y = f + 0.3 * torch.randn(6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    vf = sw.validation_fits(pred, y, 2, 3)
    assert vf.fib.shape == vf.opt.shape == vf.orders.shape == (3, 3)
    fib = fibonacci_weights(3, dtype=torch.float64).numpy()
    for i in range(3):
        U = (pred[2 * i : 2 * i + 2] - y[2 * i : 2 * i + 2, None, :]).numpy()  # (2, H, m) residuals
        M = np.einsum("rhm,rgm->hg", U, U) / (2 * 7)
        order = np.argsort(np.diag(M), kind="stable")
        assert vf.orders[i].tolist() == order.tolist()
        expected = np.empty(3)
        expected[order] = fib
        np.testing.assert_allclose(vf.fib[i].numpy(), expected, rtol=1e-12)
        w = np.linalg.solve(M, np.ones(3))
        np.testing.assert_allclose(vf.opt[i].numpy(), w / w.sum(), rtol=1e-9)
    with pytest.raises(ValueError, match="r_fit"):
        sw.validation_fits(pred, y, 4, 2)


# --- the experiments ----------------------------------------------------------------------------


def test_surrogate_experiment_draws_batch_a_then_b_from_the_generator():
    s = tiny()
    design = sw.make_design(s, seed=0)
    exp = sw.surrogate_experiment(s, design, "relevance", generator=torch.Generator().manual_seed(11))
    # reference: nwlib.simulate with the same generator, in the documented order (κ = 0: A at eval + validation, B)
    g = torch.Generator().manual_seed(11)
    W = sw.relevance_projections(torch.full((3,), math.radians(20.0), dtype=torch.float64)).float()
    both = simulate(
        design.task, W, torch.cat([design.eval_points, design.val_points]).float(), n=32, replicates=4, generator=g
    )
    batch_b = simulate(design.task, W, design.eval_points.float(), n=32, replicates=4, generator=g)
    fit = exp.fits[0.0]
    torch.testing.assert_close(fit.batch_a, both[..., :16].double(), rtol=0, atol=0)
    torch.testing.assert_close(fit.batch_a_val, both[..., 16:].double(), rtol=0, atol=0)
    torch.testing.assert_close(fit.batch_b, batch_b.double(), rtol=0, atol=0)
    t = exp.table
    assert list(t.columns) == ["experiment", "kappa", "scheme", "mse", "se", "diff", "diff_se"]
    assert (
        set(t.kappa) == {0.0, 1.0}
        and "Fibonacci (validation)" in set(t.scheme)
        and "optimal (validation)" in set(t.scheme)
    )
    uniform = _ensemble_mse(fit.batch_b.numpy(), design.target.numpy(), np.full(3, 1 / 3)).mean()
    assert sw.cell(t, 0.0, "uniform", "mse") == pytest.approx(uniform, rel=1e-12)
    # validation Fibonacci: the mean over the fits of each fit's MSE on B
    S = np.stack([_ensemble_mse(fit.batch_b.numpy(), design.target.numpy(), w) for w in fit.validation.fib.numpy()])
    assert sw.cell(t, 0.0, "Fibonacci (validation)", "mse") == pytest.approx(S.mean(), rel=1e-12)


def test_bandwidth_experiment_spreads_scotts_rule():
    s = tiny()
    design = sw.make_design(s, seed=0)
    exp = sw.surrogate_experiment(s, design, "bandwidth", generator=torch.Generator().manual_seed(2))
    # reference: every angle θ_min; at κ = 0 every head at Scott's rule n^(-1/5) (the engine's default), at κ = 1
    # h_S span^(2u - 1); batches A (evaluation and validation points) then B, κ by κ, from one generator
    g = torch.Generator().manual_seed(2)
    W = sw.relevance_projections(torch.full((3,), math.radians(20.0), dtype=torch.float64)).float()
    points_a = torch.cat([design.eval_points, design.val_points]).float()
    batches = {}
    for kappa, h in ((0.0, None), (1.0, (32 ** (-1 / 5) * 4.0 ** (2 * design.u - 1)).float())):
        simulate(design.task, W, points_a, n=32, replicates=4, generator=g, bandwidth=h)
        batches[kappa] = simulate(
            design.task, W, design.eval_points.float(), n=32, replicates=4, generator=g, bandwidth=h
        )
    for kappa, batch_b in batches.items():
        torch.testing.assert_close(exp.fits[kappa].batch_b, batch_b.double(), rtol=1e-6, atol=1e-7)


def test_surrogate_experiment_runs_on_the_device(device):
    s = tiny(kappas=[0.0, 0.5])
    design = sw.make_design(s, seed=0, device=device)
    exp = sw.surrogate_experiment(s, design, "relevance", generator=torch.Generator(device=device).manual_seed(1))
    assert exp.fits[0.5].batch_b.device.type == device.type and np.isfinite(exp.table.mse).all()


def test_nested_study_against_explicit_ensembles_of_the_best_heads():
    batch_a, target = _predictions(R=6, H=4, m=5, seed=5)
    other, other_target = _predictions(R=6, H=4, m=5, seed=6)
    batch_b = other - other_target + target
    run = sw.nested_study("s", batch_a, batch_b, target, ratios=[0.5])
    A, B, f = batch_a.numpy(), batch_b.numpy(), target.numpy()
    order = np.argsort(((A - f) ** 2).mean(axis=(0, 2)), kind="stable")
    assert run.size == 4 and set(run.scores) == {"uniform", "Fibonacci", "geometric r=0.5", sw.OPTIMAL}
    for k in range(1, 5):
        w = np.zeros(4)
        w[order[:k]] = 1 / k
        np.testing.assert_allclose(run.scores["uniform"][k - 1].numpy(), _ensemble_mse(B, f, w), rtol=1e-12)
        g = np.zeros(4)
        g[order[:k]] = [0.5**i for i in range(k)]
        np.testing.assert_allclose(
            run.scores["geometric r=0.5"][k - 1].numpy(), _ensemble_mse(B, f, g / g.sum()), rtol=1e-12
        )
    t = run.table
    assert len(t) == 4 * 4 and math.isnan(t[t.k == 1].step.iloc[0])
    step = run.scores["uniform"][2] - run.scores["uniform"][1]
    assert run.steps("uniform", [3])[0].estimate == pytest.approx(float(step.mean()))
    assert run.versus("Fibonacci", "uniform", 2).estimate == pytest.approx(0.0, abs=1e-15)  # two heads: the same
    assert run.mse_table().shape == (4, 4)


def test_step_pattern_reads_holm_over_the_steps():
    import pandas as pd

    t = pd.DataFrame(
        dict(scheme="s", k=[1, 2, 3, 4], step=[math.nan, -5.0, 5.0, 0.1], step_se=[math.nan, 0.5, 0.5, 1.0])
    )
    assert sw.step_pattern(t, "s") == {"helps": [2], "hurts": [3]}


def test_rates_of_exact_power_laws():
    assert sw.empirical_rate(2.0, 0.1, 2.0 * 4**-0.8, 0.0, math.log(4)) == pytest.approx((0.8, 0.05 / math.log(4)))
    base = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    lr, se = sw.log_ratio(3 * base, base)
    assert lr == pytest.approx(math.log(3)) and se == pytest.approx(0.0, abs=1e-15)
    # S falls as n^-0.9, R as n^-0.5 (per replicate, proportional): the rate difference is 0.4, exactly
    c = sw.rate_difference(base, base * 4**-0.9, 2 * base, 2 * base * 4**-0.5, math.log(4))
    assert c.estimate == pytest.approx(0.4) and c.se == pytest.approx(0.0, abs=1e-12)


def test_consistent_heads_study_rates_are_the_tables_log_slopes():
    s = tiny()
    r1 = sw.consistent_heads_study(s, generator=torch.Generator().manual_seed(4))
    r2 = sw.consistent_heads_study(s, generator=torch.Generator().manual_seed(4))
    assert r1.head_rates.equals(r2.head_rates) and r1.table.equals(r2.table)  # same seed, same numbers
    assert list(r1.nested) == ["consistent heads, n = 32", "consistent heads, n = 64"]
    np.testing.assert_allclose(r1.head_rates.theory, [4 / 5, 4 / 6, 4 / 7])
    for h in range(3):
        lo, hi = (r1.heads[(r1.heads.n == n_r) & (r1.heads.h == h)].mse.iloc[0] for n_r in (32, 64))
        assert r1.head_rates.empirical[h] == pytest.approx(-math.log(hi / lo) / math.log(2))
        torch.testing.assert_close(r1.fits[64].head_rep[h].mean(), torch.tensor(hi, dtype=torch.float64))
    assert len(r1.rate_steps) == 2 and set(r1.scheme_rates.columns) == {
        "rate",
        "rate_se",
        "minus_uniform",
        "minus_uniform_se",
    }
    assert r1.scheme_rates.loc["uniform", "minus_uniform"] == pytest.approx(0.0, abs=1e-12)


def test_attention_least_squares_weights_and_zero_predictor_against_numpy(study):
    fit, att = study.attention.fits[1.0], study.attention
    kept, _, _ = _rerun(study.settings, "attention", 1.0)  # the point's batches, from its seed
    assert torch.equal(kept.scores[sw.LEAST_SQUARES], fit.scores[sw.LEAST_SQUARES])
    A, f = kept.batch_a.numpy(), att.target.numpy()
    X = A.transpose(0, 2, 1).reshape(-1, 3)  # (R m, H)
    w_ls = np.linalg.lstsq(X, np.tile(f, 4), rcond=None)[0]
    np.testing.assert_allclose(fit.weights[sw.LEAST_SQUARES].numpy(), w_ls, rtol=1e-8)
    assert float(fit.ls_sum.estimate) == pytest.approx(w_ls.sum(), rel=1e-8)
    # the target is f at the LayerNorm'd evaluation points, and the zero predictor's MSE is its mean square
    x = study.design.eval_points.numpy()
    t = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(f, np.sin(2 * t[:, 0]) + t[:, 0] / 2, rtol=1e-6, atol=1e-6)
    assert att.table.zero_mse.iloc[0] == pytest.approx(np.mean(f**2), rel=1e-9)
    row = att.table[(att.table.kappa == 1.0) & (att.table.scheme == "uniform")].iloc[0]
    assert row.removed == pytest.approx(1 - row.mse / np.mean(f**2))
    assert fit.temperature in tiny().temperatures and set(att.tuning) == {0.0, 1.0}
    assert "temperature τ (tuning batch)" in sw.zero_predictor_table(att).index


def test_layer_norm_tokens_and_cosine_head_inputs_against_formulas(dtype, device, tol):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 5, generator=g, dtype=dtype).to(device)
    t = sw.layer_norm_tokens(x)
    ref = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, correction=0, keepdim=True) + 1e-5)
    torch.testing.assert_close(t, ref, **tol)
    W = torch.randn(2, 5, generator=g, dtype=dtype).to(device)
    got = sw.cosine_head_inputs(t, W, key_bias=0.7, scale=3.0)
    assert got.shape == (3, 2, 7, 2)
    for h in range(2):
        torch.testing.assert_close(got[:, h, :, 0], 3.0 * t @ W[h], **tol)
    torch.testing.assert_close(got[..., 1], torch.full_like(got[..., 1], 2.1), **tol)


def test_cosine_heads_against_an_explicit_softmax_loop():
    g = torch.Generator().manual_seed(6)
    task = sw.make_task("single_index", 4, noise_sd=0.3)
    tokens, y = sw.draw_token_data(task, 20, 3, generator=g)
    assert tokens.dtype == sw.SIM_DTYPE and y.shape == (3, 20)
    tokens, y = tokens.double(), y.double()
    z = sw.layer_norm_tokens(torch.randn(6, 4, generator=g, dtype=torch.float64))
    W = sw.relevance_projections(torch.tensor([0.2, 0.9, 1.3], dtype=torch.float64))[:, :, 0]
    got = sw.cosine_heads(tokens, y, z, W, temperature=0.05, key_bias=1.5, key_scale=2.0, value_leak=0.25, chunk=2)
    ref = np.empty((3, 3, 6))
    T, Y, Z, Wn = tokens.numpy(), y.numpy(), z.numpy(), W.numpy()
    for r in range(3):
        for h in range(3):
            k = np.stack([2.0 * T[r] @ Wn[h], np.full(20, 3.0)], 1)
            q = np.stack([Z @ Wn[h] / 2.0, np.full(6, 0.75)], 1)
            cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (k / np.linalg.norm(k, axis=1, keepdims=True)).T
            a = np.exp(cos / 0.05 - (cos / 0.05).max(1, keepdims=True))
            ref[r, h] = (a / a.sum(1, keepdims=True)) @ (Y[r] + 0.25 * T[r, :, h + 1])
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)


def test_choose_temperature_is_the_argmin_of_a_brute_force_validation_curve():
    task = sw.make_task("single_index", 4, noise_sd=0.3)
    W = sw.relevance_projections(torch.tensor([0.2, 0.9, 1.3], dtype=torch.float64))[:, :, 0].float()
    val = torch.randn(9, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grid, kw = [0.01, 0.1, 1.0, 10.0], dict(key_bias=1.0, key_scale=2.0, value_leak=0.25)
    tau, curve = sw.choose_temperature(
        task, W, val, n=30, replicates=4, generator=torch.Generator().manual_seed(2), temperatures=grid, **kw
    )
    g = torch.Generator().manual_seed(2)
    tokens, y = sw.draw_token_data(task, 30, 4, generator=g)
    vt = sw.layer_norm_tokens(val.float())
    y_val = task.f(vt) + 0.3 * torch.randn(4, 9, generator=g)
    brute = [
        float(((sw.cosine_heads(tokens, y, vt, W, temperature=t_, **kw) - y_val[:, None]) ** 2).double().mean())
        for t_ in grid
    ]
    np.testing.assert_allclose(curve, brute, rtol=1e-6)
    assert tau == grid[int(np.argmin(brute))] and curve[-1] > min(curve)  # a huge τ averages everything


def test_quality_spread_and_attributes_against_scipy_and_holm():
    from scipy import stats

    g = torch.Generator().manual_seed(8)
    errors = torch.rand(4, 30, generator=g, dtype=torch.float64) + torch.tensor([0.0, 0.05, 0.3, 1.0])[:, None]
    order = torch.tensor([1, 0, 2, 3])  # batch A's ranking, best first
    c = sw.quality_spread(errors, order, 3)  # the third best (head 2) minus the best (head 1), paired
    diff = (errors[2] - errors[1]).numpy()
    assert c.estimate == pytest.approx(diff.mean()) and c.se == pytest.approx(stats.sem(diff))
    assert sw.quality_spread(errors, order).estimate == pytest.approx(float((errors[3] - errors[1]).mean()))
    # Holm over the table, one-sided: the p-values of scipy's one-sample t test, stepped down by hand
    spreads = {"big": sw.quality_spread(errors, order), "small": sw.quality_spread(errors, order, 2)}
    p = sorted(
        (stats.ttest_1samp((errors[order[k - 1]] - errors[order[0]]).numpy(), 0, alternative="greater").pvalue, name)
        for name, k in (("big", 4), ("small", 2))
    )
    adjusted = {p[0][1]: min(1, 2 * p[0][0]), p[1][1]: max(min(1, 2 * p[0][0]), p[1][0])}
    expected = {k: "heterogeneous" if adjusted[k] <= 0.05 else "homogeneous" for k in spreads}
    assert sw.quality_attributes(spreads) == expected and expected["big"] == "heterogeneous"
    # equal quality: the spread's mean is zero whichever heads A picked
    same = torch.rand(3, 400, generator=g, dtype=torch.float64)
    assert sw.quality_attributes({"eq": sw.quality_spread(same, torch.tensor([2, 0, 1]))}) == {"eq": "homogeneous"}
    assert sw.estimator_attribute({"uniform": 0.9, "best head only": 1.2}, 1.0) == "smooths"
    assert sw.estimator_attribute({"uniform": 1.1, "best head only": 1.2}, 1.0) == "fails"
    assert sw.zero_predictor_mse(torch.tensor([3.0, 4.0])) == pytest.approx(12.5)


def test_part_4_bounds_hold_with_the_condition_and_fail_without_it():
    g = torch.Generator().manual_seed(7)
    for _ in range(50):  # with M ⪰ c diag(M): c Σ α² M_hh <= α'Mα <= (Σ |α| √M_hh)²
        L = torch.randn(4, 4, generator=g, dtype=torch.float64)
        M, a = L @ L.T + 0.05 * torch.eye(4, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
        d = M.diagonal()
        c = sw.no_cancellation_constant(M)
        corr = M.numpy() / np.sqrt(np.outer(d.numpy(), d.numpy()))
        assert c == pytest.approx(np.linalg.eigvalsh(corr).min(), rel=1e-10)
        assert c * float((a**2 * d).sum()) <= float(a @ M @ a) * (1 + 1e-12) <= float(a.abs() @ d.sqrt()) ** 2 * 1.01
    ns = [1e10, 1e12, 1e14, 1e16]
    # uncorrelated heads of rates 0.8 and 0.5: every positive fixed scheme converges at the slow rate (asymptotically)
    diag = torch.stack([torch.diag(torch.tensor([n_**-0.8, n_**-0.5], dtype=torch.float64)) for n_ in [1e20, 1e30]])
    assert sw.scheme_rate(diag, [1e20, 1e30], torch.tensor([0.9, 0.1], dtype=torch.float64)) == pytest.approx(
        0.5, abs=0.01
    )
    # the counterexample: each head at rate 0.5, their average at 0.8, and c -> 0
    M_c = sw.cancelling_heads(ns, fast=0.8, slow=0.5)
    e = torch.eye(2, dtype=torch.float64)
    assert all(sw.scheme_rate(M_c, ns, e[h]) == pytest.approx(0.5, abs=0.01) for h in range(2))
    assert sw.scheme_rate(M_c, ns, torch.tensor([0.5, 0.5], dtype=torch.float64)) == pytest.approx(0.8, abs=1e-9)
    cs = [sw.no_cancellation_constant(M) for M in M_c]
    assert all(b < a for a, b in zip(cs, cs[1:], strict=False)) and cs[-1] < 1e-4
    # brute force: M(n) is the second-moment matrix of e = (+s + w1, -s + w2) with the stated scales
    n_ = 1e3
    s_, w_ = n_**-0.25, n_**-0.4
    expected = np.array([[s_**2 + w_**2, -(s_**2)], [-(s_**2), s_**2 + w_**2]])
    np.testing.assert_allclose(sw.cancelling_heads([n_], fast=0.8, slow=0.5)[0].numpy(), expected, rtol=1e-12)


# --- the study and what the chapter quotes ----------------------------------------------------


QUOTED = {
    "exact": {
        "kappa_max",
        "e1_fib_first_win",
        "e1_best_structured_k1",
        "fit_rfit_min",
        "fit_repeats",
        "nest_e2_fib_worse",
        "nest_e2_fib_worst_k",
        "nest_e2_fib_better_from",
        "nest_e2_joining_bandwidths",
        "nest_e2_unif_last_help",
        "rate_n_lo",
        "rate_n_hi",
        "rate_d_max",
        "rate_num_heads",
        "rate_theory_slowest",
        "rate_steps_significant",
        "rate_half_size",
        "key_scale",
        "value_leak",
        "key_bias",
        "att_zero_mse",
    },
    "mc": {
        "e1_unif_k1",
        "e1_fib_gain_k1",
        "e2_min_negative_weight",
        "nest_rate_hi_opt_H",
        "e1_second_gap",
        "rate_head_fast",
        "rate_halves",
        "rate_fib_minus_unif",
    },
    "info": {
        "e1_oracle_k1",
        "e1_fib_change_k0",
        "val_e1k1_fib_gain",
        "val_e1k0_opt_loss",
        "nest_e2_fib_worst",
        "e2_lead_spread",
        "rate_head_fast_se",
        "att_fib_change_k0",
        "att_ls_gain_k0_se",
        "att_tau_k1",
        # the attention arm's values are conditional on the selected temperature: information
        "att_ls_sum_k0",
        "att_unif_removed_k1",
    },
}


def _quoted(study):
    parts = [
        f(study)
        for f in (sw.reading1_numbers, sw.validation_numbers, sw.nested_numbers, sw.rate_numbers, sw.attention_numbers)
    ]
    return {cls: {k: v for p in parts for k, v in getattr(p, cls).items()} for cls in ("exact", "mc", "info")}


def test_quoted_numbers_have_their_classes_and_the_explicit_values(study):
    q = _quoted(study)
    for cls, keys in QUOTED.items():
        assert keys <= set(q[cls]), (cls, keys - set(q[cls]))
    assert not set(q["exact"]) & set(q["mc"]) and not set(q["mc"]) & set(q["info"])
    assert all(isinstance(c, Comparison) and c.se >= 0 for c in q["mc"].values())
    # independent recomputation: the point's batches from nwlib.simulate with its seed (A at the evaluation
    # and validation points, then B), uniform and Fibonacci on batch B, ranking of batch A
    fit, design, f = study.relevance.fits[1.0], study.design, study.design.target.numpy()
    g, _ = _point_generators(study.settings, "relevance", 1.0)
    W = sw.relevance_projections(torch.tensor([20.0, 50.0, 80.0], dtype=torch.float64).deg2rad()).float()
    both = simulate(
        design.task, W, torch.cat([design.eval_points, design.val_points]).float(), n=32, replicates=4, generator=g
    )
    B = simulate(design.task, W, design.eval_points.float(), n=32, replicates=4, generator=g).double().numpy()
    order = np.argsort(((both[..., :16].double().numpy() - f) ** 2).mean(axis=(0, 2)), kind="stable")
    w_fib = np.empty(3)
    w_fib[order] = fibonacci_weights(3, dtype=torch.float64).numpy()
    unif, fib = _ensemble_mse(B, f, np.full(3, 1 / 3)), _ensemble_mse(B, f, w_fib)
    np.testing.assert_allclose(fit.scores["uniform"].numpy(), unif, rtol=1e-12)  # per replicate, through JSON
    assert q["mc"]["e1_unif_k1"].estimate == pytest.approx(unif.mean(), rel=1e-12)
    assert q["mc"]["e1_unif_k1"].se == pytest.approx(unif.std(ddof=1) / 2, rel=1e-9)
    assert q["mc"]["e1_fib_gain_k1"].estimate == pytest.approx(100 * (unif.mean() - fib.mean()) / unif.mean(), rel=1e-9)
    assert q["exact"]["kappa_max"] == 1.0 and q["exact"]["rate_theory_slowest"] == 4 / 7
    assert q["exact"]["fit_repeats"] == 2 and q["exact"]["rate_half_size"] == 1


def test_run_study_is_deterministic_and_the_seed_draws_the_training_sets(study):
    again = sw.run_study(tiny(), seed=3)
    a, b = _quoted(study), _quoted(again)
    for cls in ("exact", "mc", "info"):  # NaN (a first win that never came) equals itself here
        assert repr(a[cls]) == repr(b[cls]), cls
    design = sw.make_design(tiny(), seed=4)
    other = sw.surrogate_experiment(tiny(), design, "relevance", generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(design.eval_points, study.design.eval_points, rtol=0, atol=0)  # a fixed design
    assert sw.cell(other.table, 1.0, "uniform", "mse") != sw.cell(study.relevance.table, 1.0, "uniform", "mse")


def test_finding_evidence_verdict_and_tables(study):
    ev = sw.finding_evidence(study)
    assert list(ev.reading1) == ["e1", "e2", "att", "rate_n32", "rate_n64"]
    assert list(ev.equal) == ["e1", "e2", "att"] and list(ev.reading2) == ["e1", "rate_n32", "rate_n64"]
    assert all(H == 3 and len(cs) == 1 for _, H, cs in ev.reading2.values())  # k = 3..H
    assert len(ev["e2_negative_weight"]) == 3 and len(ev["rate_ranking"]) == 4
    assert ev.ratio_bound == pytest.approx(2 * (3 * 0.25) ** 2)  # Fibonacci (2, 1, 1)/4: the slowest head's weight
    assert 1 <= ev.k_worst <= 3 and 1 <= ev.k_star <= 3 and ev.half == 1
    # every finding holds: the claim's findings, and the equal-quality losses (so those cases fail)
    readings = sw.verdict_readings(ev, study, lambda name: True)
    assert [r.name for r in readings] == list(sw.READINGS) and [r.charitable for r in readings][0]
    assert len(readings[0].cases) == 5 + 3 and len(readings[3].cases) == 3 + 2
    assert [c.could_fail for c in readings[-1].cases] == [False]
    for r in readings:
        for c in r.cases:
            assert c.attributes["quality"] in ("heterogeneous", "homogeneous")
            assert c.attributes["estimator"] in ("smooths", "fails") and c.attributes["ranking"] == "by quality"
    eq_cases = [c for c in readings[1].cases if "κ = 0" in c.name]
    assert len(eq_cases) == 3 and not any(c.holds for c in eq_cases)  # eq_loss_* hold: Fibonacci loses there
    # the quality attribute is the library's criterion on every case's spread, Holm over the table
    kinds = sw.quality_attributes(sw.quality_spreads(study, ev))
    assert readings[1].cases[0].attributes["quality"] == kinds["e1"] and len(kinds) == 5 + 3 + 3 + 1
    assert list(sw.quality_table(sw.quality_spreads(study, ev)).columns) == ["spread", "quality"]
    verdict = judge_readings("C11", readings, reason=sw.verdict_reason(study, ev, readings))
    assert verdict.charitable.name == "existential" and verdict.label == verdict.readings[0].label
    assert verdict.readings[-1].label == "not reproduced as stated" and not verdict.readings[-1].decisive
    counts = sw.reading_counts(readings)
    assert set(counts) == {f"reading_{i}_{x}" for i in range(6) for x in ("ok", "total")} | {
        "cases_estimator_fails",
        "equal_homogeneous",
        "equal_total",
    }
    assert counts["equal_total"] == 3 and counts["cases_estimator_fails"] == 0
    q_num = sw.quality_numbers(study, ev)
    assert set(q_num.mc) == {"quality_e1_pct", "quality_eq_e1_pct", "quality_nest_e2_worst_pct"}
    table = sw.cases_table(readings)
    assert list(table.columns[:4]) == ["reading", "case", "holds", "inside the paper's conditions"] and len(
        table
    ) == sum(len(r.cases) for r in readings)
    # a case whose estimators all fail the zero predictor lies outside the conditions

    failing = Case("x", False, {**readings[0].cases[0].attributes, "estimator": "fails"})
    assert not within_conditions(failing, sw.CONDITIONS)
    assert sw.summary_table(study).shape[1] == 6 and len(sw.validation_table(study.validation)) == 3 * 3
    assert len(sw.rate_table(study)) == 3


def test_validation_study_counts_fits_and_has_nan_se_with_one_fit(study):
    v = study.validation
    assert v.fits.tolist() == [2, 2, 1] * 3  # min(fit_repeats, R // R_fit)
    one = v[v.fits == 1]
    assert one.fib_gain_se.isna().all() and one.kendall_tau_se.isna().all()
    fit = study.relevance.fits[1.0]
    row = v[(v.experiment == "e1") & (v.kappa == 1.0) & (v.R_fit == 1)].iloc[0]
    unif, fib = fit.scores["uniform"].mean(), fit.scores["Fibonacci"].mean()
    assert row.fib_oracle_gain == pytest.approx(100 * float(1 - fib / unif))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: tiny(fit_sizes=[8]), ValueError, "fit_sizes"),
        (lambda: tiny(num_heads=1), ValueError, "num_heads"),
        (lambda: tiny(rate_head_dims=[3, 1, 2]), ValueError, "rate_head_dims"),
        (lambda: tiny(kappas=[0.5]), ValueError, "kappas"),
        (lambda: tiny(ratios=[1.5]), ValueError, "ratios"),
        (lambda: tiny(replicates=2.5), TypeError, "replicates"),
        (lambda: sw.make_design(tiny(), seed=-1), ValueError, "seed"),
        (
            lambda: sw.surrogate_experiment(
                tiny(), sw.make_design(tiny(), seed=0), "depth", generator=torch.Generator()
            ),
            ValueError,
            "kind",
        ),
        (
            lambda: sw.surrogate_experiment(tiny(), sw.make_design(tiny(), seed=0), "relevance", generator=0),
            TypeError,
            "generator",
        ),
        (lambda: sw.relevance_projections(torch.zeros(2, 2)), ValueError, "angles"),
        (lambda: sw.break_even(np.full(3, 1 / 3)), ValueError, "weights"),
        (lambda: sw.independent_heads_model(1, [0.5]), ValueError, "num_heads"),
        (lambda: sw.adding_helps(0.0, 2.0, 5), ValueError, "ratio"),
        (lambda: sw.geometric_sequence(0, 0.5), ValueError, "num_heads"),
        (lambda: tiny(temperatures=[0.1, 0.0]), ValueError, "temperatures"),
        (lambda: tiny(key_bias=0.0), ValueError, "key_bias"),
        (lambda: tiny(tuning_replicates=0), ValueError, "tuning_replicates"),
        (lambda: sw.quality_attributes({}), ValueError, "spreads"),
        (lambda: sw.quality_spread(torch.zeros(2, 3), torch.tensor([0, 1]), 3), ValueError, "k"),
        (lambda: sw.estimator_attribute({}, 1.0), ValueError, "mse_a"),
        (lambda: sw.no_cancellation_constant(torch.zeros(2, 2)), ValueError, "second_moments"),
        (lambda: sw.cancelling_heads([10.0], fast=0.0, slow=0.5), ValueError, "fast"),
        (
            lambda: sw.cosine_head_inputs(torch.zeros(2, 3), torch.zeros(2, 4), key_bias=1.0),
            ValueError,
            "directions",
        ),
    ],
)
def test_bad_inputs_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_population_head_errors_draw_fresh_points_against_a_loop():
    task = sw.make_task("single_index", 4, noise_sd=0.5)
    W = sw.relevance_projections(torch.tensor([0.3, 0.3, 1.2], dtype=torch.float64))

    def predict(z, g):
        return sw.simulate_heads(task, W, z, n=20, replicates=1, generator=g)[0], task.f(z)

    g = torch.Generator().manual_seed(9)
    got = sw.population_head_errors(lambda z: predict(z, g), 4, replicates=5, points=7, generator=g)
    g2, ref = torch.Generator().manual_seed(9), []
    for _ in range(5):
        z = torch.randn(7, 4, generator=g2).double()
        pred, f_z = predict(z, g2)
        ref.append(np.mean((pred.numpy() - f_z.numpy()[None]) ** 2, axis=1))
    np.testing.assert_allclose(got.numpy(), np.stack(ref, 1), rtol=1e-12)
    assert got.shape == (3, 5)


def test_quality_batches_cover_every_setting_and_the_equal_heads_are_homogeneous(study):
    q = study.quality
    assert set(q) == {"e1", "e2", "att", "eq_e1", "eq_e2", "eq_att", "rate_n32", "rate_n64"}
    assert all(v.shape == (3, 4) and bool((v >= 0).all()) for v in q.values())
    # heads equal in distribution (κ = 0, angles equal): no spread on a large quality batch
    big = sw.Settings(**{**TINY, "quality_replicates": 120, "quality_points": 16})
    st = sw.Study(
        big,
        study.design,
        study.relevance,
        study.bandwidth,
        study.nested,
        study.validation,
        study.rates,
        study.attention,
    )
    qb = sw.quality_batches(st, generator=torch.Generator().manual_seed(11))
    spread = sw.quality_spread(qb["eq_e1"], study.relevance.fits[0.0].ranking.order)
    assert abs(spread.estimate) < 4 * spread.se  # mean zero under equal quality, within Monte Carlo error


# --- tables for reading ---------------------------------------------------------------------------------


def _plain(frame):
    """Cells with the book's typesetting undone (no-break spaces, minus signs)."""
    return frame.map(lambda c: c.replace("\u00a0", " ").replace("\u2212", "-"))


def test_mse_table_rounds_each_estimate_by_its_se_and_names_the_settings():
    import pandas as pd

    df = pd.DataFrame(
        {
            "scheme": ["uniform", "Fibonacci", "uniform", "Fibonacci"],
            "kappa": [0.0, 0.0, 0.5, 0.5],
            "mse": [0.173214, 0.184789, 0.39211, 0.27313],
            "se": [0.00042, 0.0011, 0.0023, 0.00018],
        }
    )
    shown = _plain(sw.mse_table(df))
    assert list(shown.columns) == ["κ = 0", "κ = 0.5"] and list(shown.index) == ["uniform", "Fibonacci"]
    # two significant digits of the SE fix the decimals: 0.00042 -> 5, 0.0011 -> 4, 0.0023 -> 4, 0.00018 -> 5
    assert shown.loc["uniform"].tolist() == ["0.17321 ± 0.00042", "0.3921 ± 0.0023"]
    assert shown.loc["Fibonacci"].tolist() == ["0.1848 ± 0.0011", "0.27313 ± 0.00018"]
    heads = pd.DataFrame({"d": [1, 1, 2, 2], "n": [256, 1024] * 2, "mse": [0.05, 0.02, 0.1, 0.06], "se": [0.01] * 4})
    by_n = _plain(sw.mse_table(heads, by="n", index="d"))
    assert list(by_n.columns) == ["n = 256", "n = 1024"] and by_n.index.name == "head dimension d_h"
    assert by_n.loc[2, "n = 1024"] == "0.060 ± 0.010"


def test_chapter_tables_are_the_book_style(study):
    summary = _plain(sw.summary_table(study))
    s, df = study.settings, study.relevance.table
    u_mse = sw.cell(df, s.k1, "uniform", "mse")
    gain, gain_se = (100 * sw.cell(df, s.k1, "Fibonacci", c) / u_mse for c in ("diff", "diff_se"))
    decimals = max(0, 1 - math.floor(math.log10(gain_se)))  # two significant digits of the SE
    expected = f"{round(gain, decimals) + 0.0:.{decimals}f} ± {gain_se:.{decimals}f}"
    assert summary.loc["Fibonacci", f"exp. 1, κ = {s.k1:g}"] == expected
    validation = _plain(sw.validation_table(study.validation))
    assert validation.columns[0] == "setting" and validation["setting"].iloc[0] == f"exp. 1, κ = {s.k0:g}"
    assert "Kendall τ" in validation.columns and "fits" in validation.columns
    rates = sw.rate_table(study)
    assert rates.iloc[-1, -1] == "–" and rates.iloc[0, 0] == "1"  # the last head has no next; d_h = 1
    assert rates["rate 4/(d_h + 4)"].tolist() == ["0.800", "0.667", "0.571"]  # 4/5, 4/6, 4/7
    zero = sw.zero_predictor_table(study.attention)
    assert list(zero.index[-2:]) == ["zero predictor (MSE)", "temperature τ (tuning batch)"]
    assert zero.iloc[-2, 0] == f"{study.attention.table.zero_mse.iloc[0]:.4f}"
    assert "% removed" in zero.iloc[0, 0] and list(zero.columns) == [f"κ = {k:g}" for k in s.kappas]


# --- the settings as independent sweep points -----------------------------------------------------------


def test_setting_points_carry_every_setting_and_the_costliest_come_first():
    s = tiny()
    points = sw.setting_points(s)
    assert [(p["experiment"], p["setting"]) for p in points] == [
        ("rates", 64),
        ("rates", 32),
        *[(kind, kp) for kind in ("relevance", "bandwidth", "attention") for kp in (0.0, 1.0)],
    ]
    assert all(sw.Settings(**p["settings"]) == s for p in points)  # self-contained
    assert json.loads(json.dumps(points)) == points  # JSON values only
    seeds = {point_seed(STUDY_SEED, p) for p in points}
    assert len(seeds) == len(points)  # every setting its own seed, from its coordinates


def test_each_setting_point_is_its_serial_building_block_with_the_points_seeds(study):
    # the sweep's fit (through JSON) against the same setting computed in this process from the point's seeds
    s = study.settings
    runs = {"relevance": study.relevance, "bandwidth": study.bandwidth, "attention": study.attention}
    for experiment, setting in [(e, kp) for e in runs for kp in (0.0, 1.0)] + [("rates", 32), ("rates", 64)]:
        got = study.rates.fits[setting] if experiment == "rates" else runs[experiment].fits[setting]
        kept, _, _ = _rerun(s, experiment, setting)
        for name in kept.scores:
            assert torch.equal(got.scores[name], kept.scores[name]), (experiment, setting, name)
            assert torch.equal(got.weights[name], kept.weights[name])
        assert torch.equal(got.ranking.order, kept.ranking.order) and got.se_a == kept.se_a
        assert got.mse_a == kept.mse_a and got.oracle_b == kept.oracle_b
    exp1_k1, _, _ = _rerun(s, "relevance", 1.0)
    got = study.relevance.fits[1.0]
    assert repr(got.validation_rows) == repr(exp1_k1.validation_rows)  # NaN SEs where one fit
    assert got.nested.table.equals(exp1_k1.nested.table)
    assert torch.equal(got.optimal_leave_out, exp1_k1.optimal_leave_out)
    assert torch.equal(got.error_products, exp1_k1.error_products)
    assert study.relevance.fits[0.5 if 0.5 in s.kappas else 0.0].nested is None  # κ max only


def test_a_points_quality_batch_continues_its_generator_after_batches_a_and_b(study):
    s = study.settings
    _, g, design = _rerun(s, "relevance", 1.0)  # g has drawn batches A and B
    W = sw.relevance_projections(torch.tensor([20.0, 50.0, 80.0], dtype=torch.float64).deg2rad()).float()
    ref = []
    for _ in range(s.quality_replicates):  # fresh points, then a training set, per replicate
        z = torch.randn(s.quality_points, s.embed_dim, generator=g)
        pred = simulate(design.task, W, z, n=s.n, replicates=1, generator=g)[0].double()
        ref.append(((pred - design.task.f(z.double())) ** 2).mean(-1))  # f in the analysis dtype
    torch.testing.assert_close(study.quality["e1"], torch.stack(ref, 1), rtol=1e-12, atol=0)
    assert study.quality["e1"].shape == (3, 4) and study.relevance.fits[1.0].quality is not None


def test_kept_summaries_equal_the_direct_computations_on_batch_a_and_b(study):
    s = study.settings
    kept, _, design = _rerun(s, "bandwidth", 1.0)
    A, B, f = kept.batch_a, kept.batch_b, design.target
    direct = grouped_jackknife(lambda b: sw.optimal_weights(sw.error_second_moments(b, f)), A, groups=s.jack_groups)
    blocked = kept.optimal_jackknife()
    torch.testing.assert_close(blocked.estimate, direct.estimate, rtol=1e-12, atol=0)
    torch.testing.assert_close(blocked.se, direct.se, rtol=1e-12, atol=0)

    def contrast(w):
        return torch.cat([w[-1:], w[-1] - w[:-1]])

    direct_c = grouped_jackknife(
        lambda b: contrast(sw.optimal_weights(sw.error_second_moments(b, f))), A, groups=s.jack_groups
    )
    torch.testing.assert_close(kept.optimal_jackknife(contrast).se, direct_c.se, rtol=1e-12, atol=0)
    E = (B - f).numpy()
    np.testing.assert_allclose(kept.error_products.numpy(), np.einsum("rhm,rgm->rhg", E, E) / E.shape[-1], rtol=1e-12)
    for h in range(3):
        w = np.eye(3)[h]
        np.testing.assert_allclose(kept.head_rep[h].numpy(), _ensemble_mse(B.numpy(), f.numpy(), w), rtol=1e-12)
    with pytest.raises(ValueError, match="leave-out"):
        sw.surrogate_setting(s, design, "bandwidth", 0.5, generator=torch.Generator())[1].optimal_jackknife()


def test_a_setting_fit_survives_a_sweep_file_exactly(study):
    # a sweep file writes its records with sorted keys: the encoding keeps every order and every bit
    for fit in (study.relevance.fits[1.0], study.attention.fits[0.0], study.rates.fits[64]):
        text = json.dumps(sw._fit_json(fit), sort_keys=True, allow_nan=True)
        back = sw._json_fit(json.loads(text), dtype=torch.float64, device=torch.device("cpu"))
        assert list(back.scores) == list(fit.scores) and list(back.weights) == list(fit.weights)
        for name in fit.scores:
            assert torch.equal(back.scores[name], fit.scores[name]) and torch.equal(
                back.weights[name], fit.weights[name]
            )
        for field in ("second_moments", "head_rep", "head_mse", "optimal_leave_out", "error_products", "quality"):
            a, b = getattr(fit, field), getattr(back, field)
            assert (a is None and b is None) or torch.equal(a, b), field
        assert repr(back.validation_rows) == repr(fit.validation_rows) and back.mse_a == fit.mse_a
        if fit.nested is not None:
            assert back.nested.table.equals(fit.nested.table)
            assert all(torch.equal(back.nested.scores[k], v) for k, v in fit.nested.scores.items())


def test_run_settings_resumes_from_its_file_with_the_same_numbers(tmp_path, study):
    s, design = tiny(), sw.make_design(tiny(), seed=STUDY_SEED)
    path = tmp_path / "ch04.jsonl"
    first = sw.run_settings(s, design, seed=STUDY_SEED, path=path)
    again = sw.run_settings(s, design, seed=STUDY_SEED, path=path)  # every point read back from the file
    assert len(path.read_text().splitlines()) == len(first.points) == 8
    for a, b in ((first, again), (first, study)):
        for name in ("relevance", "bandwidth", "attention"):
            assert getattr(a, name).table.equals(getattr(b, name).table), name
        assert a.rates.table.equals(b.rates.table) and a.rates.scheme_rates.equals(b.rates.scheme_rates)
    assert all(torch.equal(first.quality[k], again.quality[k]) for k in study.quality)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda p: p.pop("setting"), ValueError, "coordinate"),
        (lambda p: p.update(experiment="depth"), ValueError, "experiment"),
        (lambda p: p.update(setting=0.25), ValueError, "setting"),
        (lambda p: p.update(settings=[1, 2]), TypeError, "settings"),
        (lambda p: p["settings"].update(fit_sizes=[99]), ValueError, "fit_sizes"),
    ],
)
def test_bad_setting_points_are_named(change, error, match):
    point = json.loads(json.dumps(_point(tiny(), "relevance", 1.0)))
    change(point)
    with pytest.raises(error, match=match):
        sw.setting_point(point, seed=0)
