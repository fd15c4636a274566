"""Tests of nwlib.experiments.one_principle (chapter 7): the four ensembles, the law, the nested heads, the floor.

Small sizes throughout; the references are explicit formulas and brute-force loops in NumPy
(variances, covariances, NW weights, delete-one jackknives), scikit-learn's own forest
predictions, statsmodels' Holm correction, counting subsets, and torch's raw draws for the
order in which the generator is consumed.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import combinations

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t
from statsmodels.stats.multitest import multipletests

from nwlib import make_task
from nwlib.evidence import Comparison
from nwlib.experiments.one_principle import (
    DP_HEADS,
    ENSEMBLES,
    FIXED_HEADS,
    SHORT,
    Design,
    FloorData,
    OnePrincipleConfig,
    OnePrincipleResult,
    batch_a_contrasts,
    batch_b_contrasts,
    chapter_numbers,
    dot_product_heads,
    dot_product_projections,
    ensemble_batch,
    format_floor_table,
    format_heads_table,
    format_law_detail_table,
    format_law_table,
    format_mse_table,
    format_temperature_table,
    format_terms_table,
    jackknife_comparisons,
    jackknife_groups,
    make_design,
    member_weights,
    nested_deviations,
    one_principle_experiment,
    rsm_target_fraction,
    run_ensembles,
    select_temperature,
)

SMALL = dict(
    embed_dim=4, signal_dim=2, n=40, m=6, replicates=4, max_members=4, subset_dim=2, floor_replicates=4, head_draws=2
)


def small(**changes) -> OnePrincipleConfig:
    return OnePrincipleConfig(**{**SMALL, **changes})


@pytest.fixture(scope="module")
def experiment() -> OnePrincipleResult:
    return one_principle_experiment(small(), seed=0)


# --- brute-force references (NumPy, float64) ---------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _number(cell: str) -> float:
    """A table cell as a number (the book's tables typeset a minus sign, −, for the hyphen)."""
    return float(cell.replace("\u2212", "-"))


def _shows(cell: str, value: float, se: float) -> None:
    """``cell`` reads "estimate ± SE": the SE to two significant digits, the estimate rounded to the same place."""
    est, err = (part.strip().replace("\u2212", "-") for part in cell.replace("\u00a0", " ").split(" ± "))
    decimals = len(err.partition(".")[2])
    half = 0.5 * 10.0**-decimals * (1 + 1e-9)
    assert abs(float(est) - value) <= half and abs(float(err) - se) <= half, (cell, value, se)
    assert 10 <= round(float(err) * 10**decimals) <= 100, cell  # two significant digits (100: rounded up)


def _rounds(cell: str, value: float) -> None:
    """``cell`` is ``value`` rounded to the cell's decimal places."""
    decimals = len(cell.partition(".")[2])
    assert abs(_number(cell) - value) <= 0.5 * 10.0**-decimals * (1 + 1e-9), (cell, value)


def _nw(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, bandwidth: float) -> np.ndarray:
    """Gaussian NW, one query at a time."""
    out = np.empty(len(queries))
    for j, q in enumerate(queries):
        k = np.exp(-((keys - q) ** 2).sum(-1) / (2 * bandwidth**2))
        out[j] = (k * values).sum() / k.sum()
    return out


def _layer_norm(a: np.ndarray) -> np.ndarray:
    """torch.nn.functional.layer_norm over the last axis, no affine: (a - mean) / sqrt(biased var + 1e-5)."""
    centred = a - a.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)


def _dp_head(z: np.ndarray, x: np.ndarray, y: np.ndarray, wq: np.ndarray, wk: np.ndarray, tau: float) -> np.ndarray:
    """One dot-product head with QK-norm on LayerNorm'd tokens, one query at a time (explicit softmax)."""
    keys = _layer_norm(x) @ wk
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    out = np.empty(len(z))
    for j, t in enumerate(_layer_norm(z)):
        q = t @ wq
        logits = keys @ (q / np.linalg.norm(q)) / tau
        a = np.exp(logits - logits.max())
        out[j] = (a * y).sum() / a.sum()
    return out


def _cov_summary(p: np.ndarray) -> tuple[float, float]:
    """(V̄, C̄): mean member variance and mean covariance over ordered pairs, R − 1 denominators, point by point."""
    r, b, m = p.shape
    cov = np.stack([np.cov(p[:, :, j], rowvar=False, ddof=1).reshape(b, b) for j in range(m)])  # (m, B, B)
    off = ~np.eye(b, dtype=bool)
    return float(np.mean([np.diag(c).mean() for c in cov])), float(np.mean([c[off].mean() for c in cov]))


def _ensemble_variance(p: np.ndarray) -> float:
    """Integrated variance (R − 1) of the members' uniform average."""
    return float(p.mean(1).var(0, ddof=1).mean())


def _jackknife_se(statistic, p: np.ndarray) -> float:
    r = p.shape[0]
    loo = np.array([statistic(np.delete(p, i, axis=0)) for i in range(r)])
    return float(math.sqrt((r - 1) / r * ((loo - loo.mean()) ** 2).sum()))


def _unbiased_bias_sq(p: np.ndarray, target: np.ndarray) -> float:
    avg = p.mean(1)  # (R, m)
    return float(((avg.mean(0) - target) ** 2 - avg.var(0, ddof=1) / p.shape[0]).mean())


# --- configuration and design -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "error", "name"),
    [
        (dict(max_members=6), ValueError, "max_members"),
        (dict(max_members=2), ValueError, "max_members"),
        (dict(floor_replicates=5), ValueError, "floor_replicates"),
        (dict(subset_dim=5), ValueError, "subset_dim"),
        (dict(signal_dim=5), ValueError, "signal_dim"),
        (dict(attention_kernel="cosine"), ValueError, "attention_kernel"),
        (dict(tasks=("isotropic",)), ValueError, "tasks"),
        (dict(tasks=("subspace", "subspace")), ValueError, "tasks"),
        (dict(tasks="subspace"), TypeError, "tasks"),
        (dict(n=40.0), TypeError, "n"),
        (dict(replicates=2, floor_replicates=2), ValueError, "replicates"),
        (dict(head_draws=0), ValueError, "head_draws"),
        (dict(forest_jobs=0), ValueError, "forest_jobs"),
        (dict(noise_sd=-0.1), ValueError, "noise_sd"),
        (dict(design_seed=-1), ValueError, "design_seed"),
        (dict(temperatures=(0.1, 0.0)), ValueError, "temperatures"),
        (dict(temperatures=()), TypeError, "temperatures"),
        (dict(validation_replicates=0), ValueError, "validation_replicates"),
    ],
)
def test_config_rejects_bad_parameters_by_name(changes, error, name):
    with pytest.raises(error, match=name):
        small(**changes)


def test_config_derived_values_follow_their_formulas():
    cfg = small(n=300, embed_dim=6, max_members=32)
    assert cfg.member_counts == [1, 2, 4, 8, 16, 32]
    assert cfg.bandwidth_full == 300 ** (-1 / 10) and cfg.bandwidth_sub == 300 ** (-1 / 6)  # Scott's rule
    assert cfg.bandwidth_heads == cfg.bandwidth_sub and small(attention_kernel="exp").bandwidth_heads is None
    assert [small(embed_dim=d, signal_dim=1, subset_dim=1).max_features for d in (1, 2, 3, 7)] == [1, 1, 1, 2]
    assert cfg.task("subspace").signal_dim == 2 and cfg.task("interaction").name == "interaction"


def test_design_comes_from_its_own_seed(dtype, device):
    cfg = small(design_seed=3)
    design = make_design(cfg, device=device, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(3)
    expected = torch.randn(cfg.m, cfg.embed_dim, generator=gen, dtype=torch.float64, device=device)
    assert torch.equal(design.eval_points, expected.to(dtype)) and design.eval_points.device.type == device.type
    w = design.projections
    assert w.shape == (cfg.max_members, cfg.embed_dim, cfg.subset_dim) and w.dtype == dtype
    eye = torch.eye(cfg.subset_dim, dtype=dtype, device=device).expand(cfg.max_members, -1, -1)
    torch.testing.assert_close(w.transpose(1, 2) @ w, eye, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)
    assert torch.equal(make_design(cfg, device=device, dtype=dtype).projections, w)  # deterministic


# --- one batch of the four ensembles ------------------------------------------------------------


def test_ensemble_batch_against_brute_force(dtype, device):
    cfg = small()
    design = make_design(cfg, device=device, dtype=dtype)
    task = cfg.task("subspace")
    gen = torch.Generator(device=device).manual_seed(5)
    batch = ensemble_batch(task, cfg, design, data_seed=11, generator=gen)
    R, B, n, m = cfg.replicates, cfg.max_members, cfg.n, cfg.m
    # the generator is consumed in the documented order: resamples, coordinate keys, forest seeds
    ref = torch.Generator(device=device).manual_seed(5)
    rows = torch.randint(0, n, (R, B, n), generator=ref, device=device)
    torch.rand(R, B, cfg.embed_dim, generator=ref, device=device)
    seeds = torch.randint(0, 2**31 - 1, (R,), generator=ref, device=device).tolist()
    shape = (R, B, cfg.embed_dim, cfg.subset_dim)  # then W_Q and W_K of the dot-product heads, N(0, 1/D)
    wq = torch.randn(shape, generator=ref, dtype=torch.float64, device=device) / math.sqrt(cfg.embed_dim)
    wk = torch.randn(shape, generator=ref, dtype=torch.float64, device=device) / math.sqrt(cfg.embed_dim)
    assert torch.equal(gen.get_state(), ref.get_state())
    data = batch.floor_data
    assert torch.equal(data.rows, rows) and [f.random_state for f in data.forests] == seeds
    z, w = _np(design.eval_points), _np(design.projections)
    x, y, cols = _np(data.x), _np(data.y), data.columns.cpu().numpy()
    preds = {e: _np(p) for e, p in batch.predictions.items()}
    assert all(p.shape == (R, B, m) for p in preds.values())
    rtol = 1e-4 if dtype == torch.float32 else 1e-10
    for r in range(R):
        for b in range(B):
            idx, c = rows[r, b].cpu().numpy(), cols[r, b]
            bag = _nw(z, x[r][idx], y[r][idx], cfg.bandwidth_full)
            rsm = _nw(z[:, c], x[r][:, c], y[r], cfg.bandwidth_sub)
            head = _nw(z @ w[b], x[r] @ w[b], y[r], cfg.bandwidth_sub)  # the heads saw these training sets
            np.testing.assert_allclose(preds["bagged NW"][r, b], bag, rtol=rtol, atol=rtol)
            np.testing.assert_allclose(preds["random-subspace NW"][r, b], rsm, rtol=rtol, atol=rtol)
            np.testing.assert_allclose(preds[FIXED_HEADS][r, b], head, rtol=rtol, atol=rtol)
            dp = _dp_head(z, x[r], y[r], _np(wq[r, b]), _np(wk[r, b]), 0.1)  # the default temperature
            np.testing.assert_allclose(preds[DP_HEADS][r, b], dp, rtol=rtol, atol=rtol)
        trees = np.stack([t.predict(z.astype(np.float32)) for t in data.forests[r].estimators_])
        np.testing.assert_allclose(preds["random forest"][r], trees, rtol=1e-6)
        np.testing.assert_allclose(trees.mean(0), data.forests[r].predict(z), rtol=1e-5, atol=1e-6)  # sklearn's forest


def test_ensemble_batch_is_deterministic_and_batches_differ():
    cfg = small()
    design = make_design(cfg)
    task = cfg.task("interaction")
    one, two = (
        ensemble_batch(task, cfg, design, data_seed=1, generator=torch.Generator().manual_seed(2)) for _ in range(2)
    )
    assert all(torch.equal(one.predictions[e], two.predictions[e]) for e in ENSEMBLES)
    other = ensemble_batch(task, cfg, design, data_seed=3, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(one.floor_data.x, other.floor_data.x)
    assert torch.equal(one.floor_data.rows, other.floor_data.rows)  # the randomisation comes from the generator


def test_run_ensembles_draws_three_data_seeds_per_task_then_the_batches():
    cfg = small(tasks=("interaction",))
    design = make_design(cfg)
    runs = run_ensembles(cfg, design, generator=torch.Generator().manual_seed(4))
    ref = torch.Generator().manual_seed(4)
    seed_v, seed_a, seed_b = torch.randint(0, 2**62, (3,), generator=ref).tolist()
    task = make_task("interaction", cfg.embed_dim, noise_sd=cfg.noise_sd)
    tau, scores = select_temperature(task, cfg, design, data_seed=seed_v, generator=ref)
    a = ensemble_batch(task, cfg, design, data_seed=seed_a, generator=ref, temperature=tau)
    b = ensemble_batch(task, cfg, design, data_seed=seed_b, generator=ref, temperature=tau)
    run = runs["interaction"]
    assert run.temperature == tau and run.validation == scores
    assert all(torch.equal(run.a[e], a.predictions[e]) and torch.equal(run.b[e], b.predictions[e]) for e in ENSEMBLES)
    z = _np(design.eval_points)
    np.testing.assert_allclose(_np(run.target), math.sqrt(2) * np.sin(2 * z[:, 0]) * np.sin(2 * z[:, 1]), rtol=1e-12)


# --- the law, measured --------------------------------------------------------------------------


def test_law_tables_against_brute_force(experiment):
    law, terms, cfg = experiment.law, experiment.terms, experiment.config
    assert len(law) == len(terms) == len(cfg.tasks) * len(ENSEMBLES) * len(cfg.member_counts)
    for name in cfg.tasks:
        run = experiment.runs[name]
        target = _np(run.target)
        for ens in ENSEMBLES:
            pa, pb = _np(run.a[ens]), _np(run.b[ens])
            v_a, c_a = _cov_summary(pa)
            for b in cfg.member_counts:
                row = law[(law.task == name) & (law.ensemble == ens) & (law.b == b)].iloc[0]
                measured, predicted = _ensemble_variance(pb[:, :b]), c_a + (v_a - c_a) / b
                assert math.isclose(row.measured, measured, rel_tol=1e-9)
                assert math.isclose(row.predicted, predicted, rel_tol=1e-9)
                assert math.isclose(row.rho_a, c_a / v_a, rel_tol=1e-9) and math.isclose(
                    row.sigma2_a, v_a, rel_tol=1e-9
                )
                assert math.isclose(row.measured_se, _jackknife_se(lambda q, b=b: _ensemble_variance(q[:, :b]), pb))
                assert math.isclose(row.rel, measured / predicted - 1, rel_tol=1e-9, abs_tol=1e-12)
                assert math.isclose(row.dev_se, math.hypot(row.measured_se, row.predicted_se), rel_tol=1e-12)
                t = terms[(terms.task == name) & (terms.ensemble == ens) & (terms.b == b)].iloc[0]
                sub = pb[:, :b]
                mse = float(((sub.mean(1) - target) ** 2).mean())
                assert math.isclose(t.mse, mse, rel_tol=1e-9)
                assert math.isclose(t.bias_sq, _unbiased_bias_sq(sub, target), rel_tol=1e-8, abs_tol=1e-12)
                assert math.isclose(t.variance + t.covariance, measured, rel_tol=1e-8)
    # Student t with Welch–Satterthwaite df: two delete-one jackknife SEs of R - 1 df each
    a, b = law.measured_se**2, law.predicted_se**2
    np.testing.assert_allclose(law.dev_df, (a + b) ** 2 / ((a**2 + b**2) / (experiment.config.replicates - 1)))
    p = 2 * student_t.sf(np.abs(law.dev / law.dev_se), law.dev_df)
    assert list(law.significant) == list(multipletests(p, alpha=0.05, method="holm")[0])


def test_law_summary_and_law_table(experiment):
    summary, law = experiment.summary, experiment.law
    assert list(summary.index) == [(t, e) for t in experiment.config.tasks for e in ENSEMBLES]
    for (t, e), row in summary.iterrows():
        rows = law[(law.task == t) & (law.ensemble == e)]
        assert row.max_abs_z == rows.z.abs().max() and row.significant == rows.significant.sum()
        v_b, c_b = _cov_summary(_np(experiment.runs[t].b[e]))
        assert math.isclose(row.rho_b, c_b / v_b, rel_tol=1e-9)
    table = format_law_table(summary, 3)
    first = next(summary.itertuples())
    _shows(table.iloc[0]["ρ (batch A)"], first.rho_a, first.rho_a_se)
    _shows(table.iloc[0]["σ² (batch A)"], first.sigma2, first.sigma2_se)
    _rounds(table.iloc[0]["largest |deviation| (%)"], 100 * first.max_rel_dev)
    assert table.iloc[0]["significant (Holm)"] == f"{first.significant} of 3"


# --- the nested heads ---------------------------------------------------------------------------


def test_nested_deviations_against_brute_force():
    from nwlib import simulate

    cfg = small()
    design = make_design(cfg)
    task = cfg.task("subspace")
    got = nested_deviations(task, design.projections, cfg, design, generator=torch.Generator().manual_seed(9))
    ref = torch.Generator().manual_seed(9)
    batches = [
        _np(
            simulate(task, design.projections, design.eval_points, n=cfg.n, replicates=cfg.replicates,
                     bandwidth=cfg.bandwidth_sub, generator=torch.Generator().manual_seed(s))
        )
        for s in torch.randint(0, 2**62, (2,), generator=ref).tolist()
    ]  # fmt: skip

    def predicted(p, b):
        v, c = _cov_summary(p)
        return c + (v - c) / b

    for b, cmp in zip(cfg.member_counts, got, strict=True):
        expected = _ensemble_variance(batches[1][:, :b]) - predicted(batches[0], b)
        se = math.hypot(
            _jackknife_se(lambda q, b=b: _ensemble_variance(q[:, :b]), batches[1]),
            _jackknife_se(lambda q, b=b: predicted(q, b), batches[0]),
        )
        assert math.isclose(cmp.estimate, expected, rel_tol=1e-8, abs_tol=1e-14)
        assert math.isclose(cmp.se, se, rel_tol=1e-8)


def test_nested_heads_check_structure(experiment):
    heads, law, cfg = experiment.heads, experiment.law, experiment.config
    long, pairs = heads.comparisons, heads.pairs
    assert len(long) == cfg.head_draws * len(cfg.tasks) * len(cfg.member_counts)
    assert len(pairs) == cfg.head_draws * len(cfg.tasks) and heads.table.shape == (cfg.head_draws, len(cfg.tasks))
    main = law[law.ensemble == FIXED_HEADS]
    draw0 = long[long.draw == 0]
    assert [c.estimate for c in draw0.deviation] == list(main.dev)  # draw 0 is the main experiment
    p = [2 * student_t.sf(abs(c.estimate / c.se), c.df) for c in long.deviation]
    assert list(long.significant) == list(multipletests(p, alpha=0.05, method="holm")[0])
    for row in pairs.itertuples():
        sel = long[(long.draw == row.draw) & (long.task == row.task)]
        assert row.deviates == sel.significant.any() and row.max_abs_z == sel.abs_z.max()


# --- MSE and the shared-data floor ----------------------------------------------------------------


def test_per_replicate_mse_against_formula(experiment):
    for (name, ens), series in experiment.mse_replicates.items():
        p, target = _np(experiment.runs[name].b[ens]), _np(experiment.runs[name].target)
        np.testing.assert_allclose(_np(series), ((p.mean(1) - target) ** 2).mean(-1), rtol=1e-10)
    diff = experiment.mse_difference("subspace", "bagged NW", "random forest")
    d = _np(
        experiment.mse_replicates[("subspace", "bagged NW")] - experiment.mse_replicates[("subspace", "random forest")]
    )
    assert math.isclose(diff.estimate, d.mean(), rel_tol=1e-12)
    assert math.isclose(diff.se, d.std(ddof=1) / math.sqrt(len(d)), rel_tol=1e-10)


def _explicit_weights(ens, data: FloorData, r: int, cfg: OnePrincipleConfig, design: Design) -> np.ndarray:
    z, w, x = _np(design.eval_points), _np(design.projections), _np(data.x[r])
    out = np.zeros((cfg.max_members, cfg.m, cfg.n))
    for b in range(cfg.max_members):
        for j in range(cfg.m):
            if ens == "bagged NW":  # kernel weights over the resample, added up onto the original points
                idx = data.rows[r, b].numpy()
                k = np.exp(-((x[idx] - z[j]) ** 2).sum(-1) / (2 * cfg.bandwidth_full**2))
                np.add.at(out[b, j], idx, k / k.sum())
            else:
                q, keys = (z[j, data.columns[r, b].numpy()], x[:, data.columns[r, b].numpy()])
                if ens == FIXED_HEADS:
                    q, keys = z[j] @ w[b], x @ w[b]
                if ens == DP_HEADS:  # the head as a smoother: its weights on the responses (one-hot values)
                    wq, wk = _np(data.query_weights[r, b]), _np(data.key_weights[r, b])
                    out[b, j] = [_dp_head(z[j : j + 1], x, e, wq, wk, data.temperature)[0] for e in np.eye(cfg.n)]
                    continue
                k = np.exp(-((keys - q) ** 2).sum(-1) / (2 * cfg.bandwidth_sub**2))
                out[b, j] = k / k.sum()
    return out


@pytest.mark.parametrize("ens", ENSEMBLES)
def test_member_weights_are_the_members_smoothers(experiment, ens):
    cfg, design = experiment.config, experiment.design
    run = experiment.runs["subspace"]
    data = run.floor_data
    for r in range(2):
        w = _np(member_weights(ens, data, r, cfg, design))
        assert w.shape == (cfg.max_members, cfg.m, cfg.n) and (w >= 0).all()
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(w @ _np(data.y[r]), _np(run.b[ens][r]), rtol=1e-6, atol=1e-9)
        if ens != "random forest":
            np.testing.assert_allclose(w, _explicit_weights(ens, data, r, cfg, design), rtol=1e-9, atol=1e-15)


def test_shared_data_floor_against_brute_force(experiment):
    cfg, design = experiment.config, experiment.design
    sd2, n = cfg.noise_sd**2, cfg.n
    for name in cfg.tasks:
        data = experiment.runs[name].floor_data
        for ens in ENSEMBLES:
            reps = experiment.floor.replicates[(name, ens)]
            for r in range(cfg.floor_replicates):
                w = _np(member_weights(ens, data, r, cfg, design))
                cov = sd2 * np.einsum("bjn,cjn->bcj", w, w)  # σ² Σ_i w^b_i w^c_i at each point
                off = ~np.eye(cfg.max_members, dtype=bool)
                diag, cross = np.mean([np.diag(cov[:, :, j]) for j in range(cfg.m)]), cov[off].mean()
                w_bar = w.mean(0)
                assert math.isclose(reps["member"][r], diag, rel_tol=1e-10)
                assert math.isclose(reps["rho_noise"][r], cross / diag, rel_tol=1e-10)
                assert math.isclose(reps["floor_inf"][r], cross, rel_tol=1e-10)
                assert math.isclose(reps["floor"][r], sd2 * (w_bar**2).sum(-1).mean(), rel_tol=1e-10)
                assert reps["n_floor_min"][r] >= 1 - 1e-9  # the theorem: n ||w_bar||^2 >= 1
                if ens == "bagged NW":
                    z, x = _np(design.eval_points), _np(data.x[r])
                    k = np.exp(-((x[None] - z[:, None]) ** 2).sum(-1) / (2 * cfg.bandwidth_full**2))
                    plain = k / k.sum(-1, keepdims=True)
                    assert math.isclose(reps["plain"][r], sd2 * (plain**2).sum(-1).mean(), rel_tol=1e-10)
            row = experiment.floor.table.loc[(name, ens)]
            assert math.isclose(row.floor, float(reps["floor"].mean())) and row.n_floor_min == float(
                reps["n_floor_min"].min()
            )
            assert math.isnan(row.plain) == (ens != "bagged NW")
    assert experiment.floor.table.floor.min() >= sd2 / n * (1 - 1e-9)


def test_identical_heads_have_noise_correlation_one():
    # a known limit: heads on one and the same projection have identical weights, so rho_noise = 1
    cfg = small()
    design = make_design(cfg)
    same = Design(design.eval_points, design.projections[:1].expand(cfg.max_members, -1, -1).contiguous())
    task = cfg.task("subspace")
    batch = ensemble_batch(task, cfg, same, data_seed=0, generator=torch.Generator().manual_seed(0))
    w = member_weights(FIXED_HEADS, batch.floor_data, 0, cfg, same)
    cov = torch.einsum("bjn,cjn->bcj", w, w)
    torch.testing.assert_close(cov, cov[:1, :1].expand_as(cov))
    p = batch.predictions[FIXED_HEADS]
    torch.testing.assert_close(p, p[:, :1].expand_as(p))


# --- contrasts and jackknife ----------------------------------------------------------------------


def test_jackknife_groups_by_brute_force():
    for reps in range(2, 200):
        divisors = [g for g in range(2, 21) if reps % g == 0]
        assert jackknife_groups(reps) == (max(divisors) if divisors else reps)
    with pytest.raises(ValueError, match="replicates"):
        jackknife_groups(1)


def test_jackknife_comparisons_of_a_mean_give_its_standard_error():
    x = torch.arange(12, dtype=torch.float64).pow(1.5)
    (c,) = jackknife_comparisons(lambda v: v.mean(), x, groups=12)  # delete-one: std / sqrt(R)
    assert isinstance(c, Comparison)
    assert math.isclose(c.estimate, float(x.mean())) and math.isclose(c.se, float(x.std() / math.sqrt(12)))


def test_batch_contrasts_against_brute_force(experiment):
    cfg = experiment.config
    for name in cfg.tasks:
        run = experiment.runs[name]
        fits = [_cov_summary(_np(run.a[e])) for e in ENSEMBLES[:4]]
        rho, s2 = [c / v for v, c in fits], [v for v, _ in fits]
        expected_a = [rho[1] - rho[0], rho[1] - rho[2], rho[1] - rho[3], s2[0] - s2[1], s2[0] - s2[2], s2[0] - s2[3]]
        got_a = batch_a_contrasts(*(run.a[e] for e in ENSEMBLES[:4]))
        np.testing.assert_allclose(got_a, expected_a, rtol=1e-8, atol=1e-14)
        np.testing.assert_allclose([c.estimate for c in experiment.contrast_a[name]], expected_a, rtol=1e-8, atol=1e-14)
        target = _np(run.target)
        f, r, h = (_np(run.b[e]) for e in ("random forest", "random-subspace NW", FIXED_HEADS))
        expected_b = [
            _unbiased_bias_sq(h, target) - 10 * _ensemble_variance(h),
            _unbiased_bias_sq(r, target) - _unbiased_bias_sq(f, target),
        ]
        got_b = batch_b_contrasts(run.target, *(run.b[e] for e in ("random forest", "random-subspace NW", FIXED_HEADS)))
        np.testing.assert_allclose(got_b, expected_b, rtol=1e-7, atol=1e-12)
        # delete-a-group jackknife, groups of one replicate here (R = 4): brute force over the deleted replicate
        se = _jackknife_se(lambda q, t=target: _unbiased_bias_sq(q, t) - 10 * _ensemble_variance(q), h)
        assert math.isclose(experiment.contrast_b[name][0].se, se, rel_tol=1e-7)


# --- the random-subspace target and the chapter's numbers ---------------------------------------


def test_rsm_target_fraction_by_counting_subsets():
    for dim in range(1, 9):
        for k in range(1, dim + 1):
            subsets = list(combinations(range(dim), k))
            assert math.isclose(rsm_target_fraction("subspace", dim, k), sum(0 in s for s in subsets) / len(subsets))
            both = sum({0, 1} <= set(s) for s in subsets) / len(subsets)
            assert math.isclose(rsm_target_fraction("interaction", dim, k), both, abs_tol=1e-15)
    with pytest.raises(ValueError, match="subset_dim"):
        rsm_target_fraction("subspace", 3, 4)
    with pytest.raises(ValueError, match="task"):
        rsm_target_fraction("isotropic", 3, 2)


def test_rsm_bias_target_is_the_targets_squared_bias(experiment):
    z = _np(experiment.design.eval_points)
    f = {"subspace": (np.sin(2 * z[:, 0]) + np.sin(2 * z[:, 1])) / math.sqrt(2),
         "interaction": math.sqrt(2) * np.sin(2 * z[:, 0]) * np.sin(2 * z[:, 1])}  # fmt: skip
    fraction = {"subspace": 2 / 4, "interaction": 2 / 12}  # k/D and k(k-1)/(D(D-1)) for D = 4, k = 2
    for name, value in experiment.rsm_bias_target.items():
        assert math.isclose(value, (1 - fraction[name]) ** 2 * (f[name] ** 2).mean(), rel_tol=1e-12)


def test_chapter_numbers_cover_the_page_and_agree_with_the_tables(experiment):
    numbers = chapter_numbers(experiment)
    keys = set(numbers.estimates) | set(numbers.counts) | set(numbers.info)
    assert len(keys) == len(numbers.estimates) + len(numbers.counts) + len(numbers.info)  # no key twice
    for name in experiment.config.tasks:
        for ens in ENSEMBLES:
            key = f"{name}_{SHORT[ens]}"
            prefixes = ("rho", "sigma2", "mse", "bias_sq", "var_cov", "rho_noise", "floor", "removed")
            zero = float((_np(experiment.runs[name].target) ** 2).mean())
            if ens == DP_HEADS:  # their estimands move with the temperature each seed selects: information
                assert all(type(numbers.info[f"{p}_{key}"]) is float for p in prefixes)
                assert not any(f"{p}_{key}" in numbers.estimates for p in prefixes)
                removed_info = numbers.info[f"removed_{key}"]
                assert math.isclose(removed_info, 1 - numbers.info[f"mse_{key}"] / zero, rel_tol=1e-12)
                continue
            for prefix in prefixes:
                assert isinstance(numbers.estimates[f"{prefix}_{key}"], Comparison)
            # the share of the zero predictor's MSE removed, and the jackknife's R - 1 degrees of freedom
            removed = numbers.estimates[f"removed_{key}"]
            assert math.isclose(removed.estimate, 1 - numbers.estimates[f"mse_{key}"].estimate / zero, rel_tol=1e-12)
            assert removed.df == numbers.estimates[f"rho_{key}"].df == experiment.config.replicates - 1
            assert {f"rho_se_{key}", f"mse_se_{key}"} <= set(numbers.info)
            # variance + covariance of all members (decompose) is the measured variance (equicorrelation)
            law = experiment.law
            row = law[(law.task == name) & (law.ensemble == ens) & (law.b == experiment.config.max_members)].iloc[0]
            assert math.isclose(numbers.estimates[f"var_cov_{key}"].estimate, row.measured, rel_tol=1e-8)
        for short in ("bagged", "rsm", "heads", "dp"):
            assert (
                f"dmse_{short}_forest_{name}" in numbers.estimates and f"dmse_{short}_forest_se_{name}" in numbers.info
            )
        assert {f"bag_floor_over_plain_{name}", f"dmse_rsm_bag_{name}"} <= set(numbers.estimates)
    cfg = experiment.config
    assert numbers.counts["law_rows_per_ensemble"] == len(cfg.member_counts) * len(cfg.tasks)
    assert numbers.counts["head_comparisons"] == len(experiment.heads.comparisons)
    assert numbers.counts["head_pairs_deviating"] == int(experiment.heads.pairs.deviates.sum())
    assert all(type(v) is int for v in numbers.counts.values()) and all(type(v) is float for v in numbers.info.values())
    rho = experiment.summary.rho_a
    assert numbers.info["rho_bag_min"] == min(rho[(t, "bagged NW")] for t in cfg.tasks)
    others = [rho[(t, e)] for t in cfg.tasks for e in ENSEMBLES[:4] if e != "bagged NW"]  # the four, not the dp heads
    assert numbers.info["rho_nw_max_other"] == max(others)
    with pytest.raises(TypeError, match="result"):
        chapter_numbers(experiment.law)


def test_table_builders(experiment):
    mse = format_mse_table(experiment)
    assert list(mse.index) == [(t, e) for t in experiment.config.tasks for e in ENSEMBLES]
    assert mse.loc[("subspace", "random forest"), "minus forest (paired)"] == "0"  # a paired difference with itself
    zero = float((_np(experiment.runs["subspace"].target) ** 2).mean())
    _rounds(mse.loc[("subspace", DP_HEADS), "zero predictor's MSE (mean f²)"], zero)
    big = experiment.terms[experiment.terms.b == experiment.config.max_members].set_index(["task", "ensemble"])
    row = big.loc[("interaction", "bagged NW")]
    _shows(mse.loc[("interaction", "bagged NW"), "MSE"], row.mse, row.mse_se)
    removed = 100 * (1 - row.mse / float((_np(experiment.runs["interaction"].target) ** 2).mean()))
    _rounds(mse.loc[("interaction", "bagged NW"), "share of it removed (%)"], removed)
    temps = format_temperature_table(experiment)
    assert list(temps.index) == list(experiment.config.tasks)
    assert temps.loc["subspace", "chosen τ"] == f"{experiment.runs['subspace'].temperature:g}"
    assert list(temps.columns)[-2:] == ["chosen τ", "zero predictor (mean f²)"]
    for tau, value in experiment.runs["subspace"].validation.items():
        _rounds(temps.loc["subspace", f"τ = {tau:g}"], value)
    floor = format_floor_table(experiment.floor.table, experiment.summary)
    rho_b = experiment.summary.rho_b[("interaction", "bagged NW")]
    _rounds(floor.loc[("interaction", "bagged NW"), "ρ total (batch B)"], rho_b)
    terms = format_terms_table(experiment.terms, [1, 4])
    assert sorted(set(terms.index.get_level_values("b"))) == [1, 4] and len(terms) == 2 * len(ENSEMBLES) * 2
    assert list(terms.columns) == ["bias²", "variance", "covariance", "MSE"]
    first = experiment.terms[experiment.terms.b == 1].iloc[0]
    _shows(terms.iloc[0]["bias²"], first.bias_sq, first.bias_sq_se)
    _shows(terms.iloc[0]["MSE"], first.mse, first.mse_se)


def test_law_detail_and_heads_tables(experiment):
    law = experiment.law
    detail = format_law_detail_table(law)
    assert list(detail.index) == list(zip(law.task, law.ensemble, law.b, strict=True))
    assert "measured SE" not in detail.columns and "relative SE" not in detail.columns  # paired into their cells
    last = law.iloc[-1]
    _shows(detail.iloc[-1]["measured (batch B)"], last.measured, last.measured_se)
    _shows(detail.iloc[-1]["measured / predicted − 1"], last.rel, last.rel_se)
    assert detail.iloc[-1]["significant (Holm)"] == ("yes" if last.significant else "no")
    heads = format_heads_table(experiment.heads)
    pairs = experiment.heads.pairs
    assert list(heads.index) == sorted(set(pairs.draw))
    for r in pairs.itertuples():
        cell = heads.loc[r.draw, f"largest |z|, task {r.task!r}"]  # HeadsCheck.table holds |z| to 2 decimals
        assert abs(_number(cell) - r.max_abs_z) <= 0.5 * 10.0 ** -len(cell.partition(".")[2]) + 0.005, cell
    with pytest.raises(TypeError, match="heads"):
        format_heads_table(pairs)


# --- the whole experiment -------------------------------------------------------------------------


def test_experiment_is_deterministic_with_a_fixed_design(experiment):
    again = one_principle_experiment(small(), seed=0)
    assert chapter_numbers(again) == chapter_numbers(experiment)
    other = one_principle_experiment(small(), seed=1)
    assert torch.equal(other.design.eval_points, experiment.design.eval_points)  # the design has its own seed
    assert torch.equal(other.design.projections, experiment.design.projections)
    assert (
        chapter_numbers(other).estimates["rho_subspace_bagged"]
        != chapter_numbers(experiment).estimates["rho_subspace_bagged"]
    )


def test_bad_arguments_are_named():
    cfg = small()
    design = make_design(cfg)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match="task"):
        ensemble_batch("subspace", cfg, design, data_seed=0, generator=gen)
    with pytest.raises(ValueError, match="design"):
        ensemble_batch(cfg.task("subspace"), dataclasses.replace(cfg, m=7), design, data_seed=0, generator=gen)
    with pytest.raises(ValueError, match="data_seed"):
        ensemble_batch(cfg.task("subspace"), cfg, design, data_seed=-1, generator=gen)
    with pytest.raises(TypeError, match="generator"):
        run_ensembles(cfg, design, generator=0)
    with pytest.raises(TypeError, match="config"):
        make_design(SMALL)
    with pytest.raises(ValueError, match="seed"):
        one_principle_experiment(cfg, seed=-1)
    with pytest.raises(ValueError, match="ensemble"):
        member_weights("boosting", FloorData(*([None] * 5)), 0, cfg, design)


# --- the dot-product heads --------------------------------------------------------------------------


def test_dot_product_projections_are_independent_normal_draws():
    gen = torch.Generator().manual_seed(3)
    wq, wk = dot_product_projections(3, 4, 6, 2, generator=gen)
    ref = torch.Generator().manual_seed(3)
    assert torch.equal(wq, torch.randn(3, 4, 6, 2, generator=ref, dtype=torch.float64) / math.sqrt(6))
    assert torch.equal(wk, torch.randn(3, 4, 6, 2, generator=ref, dtype=torch.float64) / math.sqrt(6))
    assert not torch.equal(wq, wk)  # W_Q != W_K
    big, _ = dot_product_projections(200, 10, 6, 2, generator=gen)
    assert math.isclose(float(big.var()), 1 / 6, rel_tol=0.05)  # 24000 draws: the variance within 5 %
    with pytest.raises(ValueError, match="head_dim"):
        dot_product_projections(3, 4, 6, 0, generator=gen)
    with pytest.raises(TypeError, match="generator"):
        dot_product_projections(3, 4, 6, 2, generator=0)


def test_dot_product_heads_against_brute_force(dtype, device):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(3, 30, 5, generator=gen, device=device, dtype=dtype)
    y = torch.randn(3, 30, generator=gen, device=device, dtype=dtype)
    z = torch.randn(7, 5, generator=gen, device=device, dtype=dtype)
    wq, wk = dot_product_projections(3, 20, 5, 2, generator=gen, dtype=dtype)  # 3 x 20 > one block of 16 heads
    rtol = 1e-4 if dtype == torch.float32 else 1e-10
    for tau in (0.05, 1.0):
        got = _np(dot_product_heads(x, y, z, wq, wk, temperature=tau))
        for r in range(3):
            for h in range(20):
                ref = _dp_head(_np(z), _np(x[r]), _np(y[r]), _np(wq[r, h]), _np(wk[r, h]), tau)
                np.testing.assert_allclose(got[r, h], ref, rtol=rtol, atol=rtol)
    with pytest.raises(ValueError, match="temperature"):
        dot_product_heads(x, y, z, wq, wk, temperature=0.0)
    with pytest.raises(ValueError, match="key_weights"):
        dot_product_heads(x, y, z, wq, wk[:2], temperature=0.1)
    with pytest.raises(ValueError, match="eval_points"):
        dot_product_heads(x, y, z[:, :4], wq, wk, temperature=0.1)


def test_select_temperature_is_the_validation_argmin():
    cfg = small(temperatures=(0.02, 0.2, 2.0), validation_replicates=3)
    design = make_design(cfg)
    task = cfg.task("subspace")
    tau, scores = select_temperature(task, cfg, design, data_seed=9, generator=torch.Generator().manual_seed(1))
    # brute force: the same training sets (draw_training_sets' stream) and initialisations, explicit heads
    from nwlib.ensembles import draw_training_sets

    x, y = draw_training_sets(task, cfg.n, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    wq, wk = dot_product_projections(
        3, cfg.max_members, cfg.embed_dim, cfg.subset_dim, generator=torch.Generator().manual_seed(1)
    )
    z, f = _np(design.eval_points), _np(task.f(design.eval_points))
    expected = {}
    for t in cfg.temperatures:
        heads = np.stack(
            [[_dp_head(z, _np(x[r]), _np(y[r]), _np(wq[r, h]), _np(wk[r, h]), t) for h in range(4)] for r in range(3)]
        )
        expected[t] = float(((heads.mean(1) - f) ** 2).mean())
    assert scores.keys() == expected.keys()
    np.testing.assert_allclose(list(scores.values()), list(expected.values()), rtol=1e-10)
    assert tau == min(expected, key=expected.get)
    with pytest.raises(ValueError, match="data_seed"):
        select_temperature(task, cfg, design, data_seed=-1, generator=torch.Generator())


def test_gain_over_zero_and_variance_reduction_against_formulas(experiment):
    cfg = experiment.config
    for name in cfg.tasks:
        run = experiment.runs[name]
        zero = float((_np(run.target) ** 2).mean())
        for ens in ENSEMBLES:
            p = _np(run.b[ens])
            mse = ((p.mean(1) - _np(run.target)) ** 2).mean(-1)
            gain = experiment.gain_over_zero(name, ens)
            assert math.isclose(gain.estimate, zero - mse.mean(), rel_tol=1e-10, abs_tol=1e-14)
            assert math.isclose(gain.se, mse.std(ddof=1) / math.sqrt(len(mse)), rel_tol=1e-8)
            red = experiment.variance_reduction(name, ens)
            v_a, _ = _cov_summary(_np(run.a[ens]))
            assert math.isclose(red.estimate, v_a - _ensemble_variance(p), rel_tol=1e-8, abs_tol=1e-14)
            s = experiment.summary.loc[(name, ens)]
            row = experiment.law[(experiment.law.task == name) & (experiment.law.ensemble == ens)].iloc[-1]
            assert math.isclose(red.se, math.hypot(s.sigma2_se, row.measured_se), rel_tol=1e-12)
            assert red.df <= 2 * (cfg.replicates - 1)  # Welch: at most the two batches' degrees of freedom


# --- thm-equicorrelated: each part as stated, on random instances (could fail if a part were wrong) ---------------


def test_theorem_part1_law_and_its_lower_bound_on_rho():
    rng = np.random.default_rng(0)
    for b in range(1, 9):
        sigma2, rho = rng.uniform(0.1, 2.0), rng.uniform(-1 / max(b - 1, 1), 1.0)
        cov = sigma2 * ((1 - rho) * np.eye(b) + rho * np.ones((b, b)))
        assert math.isclose(cov.sum() / b**2, sigma2 * (rho + (1 - rho) / b), rel_tol=1e-12)
    for b in range(2, 9):  # below -1/(B-1) the equicorrelation matrix is not a covariance matrix
        bad = (1 + 1 / (b - 1) + 1e-3) * np.eye(b) - (1 / (b - 1) + 1e-3) * np.ones((b, b))
        assert np.linalg.eigvalsh(bad).min() < 0


def test_theorem_part2_randomised_members_by_monte_carlo():
    # g(D, Θ) = μ(D) + ε(Θ): Var μ = 0.5, E Var(g | D) = 2; so ρ = 0.2 and Var f̄_B = 0.5 + 2/B
    rng = np.random.default_rng(1)
    mu = rng.normal(0, math.sqrt(0.5), size=(200_000, 1))
    members = mu + rng.normal(0, math.sqrt(2.0), size=(200_000, 8))
    for b in (1, 2, 8):
        assert math.isclose(members[:, :b].mean(1).var(), 0.5 + 2.0 / b, rel_tol=0.02)
    cov = np.cov(members, rowvar=False)
    assert math.isclose(cov[~np.eye(8, dtype=bool)].mean() / np.diag(cov).mean(), 0.2, abs_tol=0.01)


def test_theorem_part3_subset_average_by_enumeration():
    rng = np.random.default_rng(2)
    h = 6
    a = rng.normal(size=(h, h + 2))
    cov = a @ a.T  # any covariance matrix of H fixed members
    v_bar, c_bar = np.diag(cov).mean(), cov[~np.eye(h, dtype=bool)].mean()
    rho = c_bar / v_bar
    for b in range(1, h + 1):
        subsets = list(combinations(range(h), b))
        mean_var = np.mean([cov[np.ix_(s, s)].sum() / b**2 for s in subsets])
        assert math.isclose(mean_var, v_bar * (rho + (1 - rho) / b), rel_tol=1e-12)
    first = cov[:2, :2].sum() / 4  # one particular subset need not follow the law
    assert not math.isclose(first, v_bar * (rho + (1 - rho) / 2), rel_tol=1e-3)


def test_theorem_part4_floor_for_any_nonnegative_weights():
    rng = np.random.default_rng(3)
    for n in (2, 5, 40):
        w = rng.dirichlet(np.full(n, 0.3), size=7)  # 7 members' weights at one point, rows on the simplex
        sigma2 = 0.25
        cov = sigma2 * w @ w.T  # noise covariances σ² Σ_i w_i^b w_i^b'
        assert (cov >= 0).all()
        w_bar = w.mean(0)
        assert math.isclose(cov.sum() / 49, sigma2 * (w_bar**2).sum(), rel_tol=1e-12)
        assert sigma2 * (w_bar**2).sum() >= sigma2 / n - 1e-15
