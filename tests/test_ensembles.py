"""Tests of nwlib.ensembles against explicit loops, scikit-learn's own predictions and brute-force jackknives."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from nwlib import make_task, nadaraya_watson, simulate
from nwlib.ensembles import (
    bootstrap_indices,
    draw_training_sets,
    feature_subsets,
    forest_member_predictions,
    forest_weights,
    resampled_nw,
)

D, N, M, R = 5, 40, 7, 21  # R spans two data blocks of simulate


# ---------------------------------------------------------------- the training sets of simulate


def test_draw_training_sets_are_simulates(dtype, device):
    task = make_task("subspace", D, signal_dim=2, noise_sd=0.3)
    z = torch.randn(M, D, generator=torch.Generator(device).manual_seed(5), dtype=dtype, device=device)
    eye = torch.eye(D, dtype=dtype, device=device)[None]  # one head that sees every coordinate
    h = 0.6
    sim = simulate(task, eye, z, n=N, replicates=R, generator=torch.Generator(device).manual_seed(3), bandwidth=h)
    x, y = draw_training_sets(task, N, R, generator=torch.Generator(device).manual_seed(3), dtype=dtype)
    assert x.shape == (R, N, D) and y.shape == (R, N) and x.dtype == dtype and x.device.type == device.type
    mine = nadaraya_watson(z, x, y, kernel="gaussian", bandwidth=h)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(mine, sim[:, 0], rtol=rtol, atol=rtol)
    # Another seed gives other data, so the agreement above is not a coincidence.
    other = nadaraya_watson(
        z,
        *draw_training_sets(task, N, R, generator=torch.Generator(device).manual_seed(4), dtype=dtype),
        kernel="gaussian",
        bandwidth=h,
    )
    assert (other - sim[:, 0]).abs().max() > 0.1


def test_draw_training_sets_bad_inputs():
    g = torch.Generator().manual_seed(0)
    task = make_task("subspace", 3)
    with pytest.raises(TypeError, match="task"):
        draw_training_sets("subspace", 10, 2, generator=g)
    with pytest.raises(ValueError, match="replicates"):
        draw_training_sets(task, 10, 0, generator=g)
    with pytest.raises(TypeError, match="generator"):
        draw_training_sets(task, 10, 2, generator=0)


# ---------------------------------------------------------------- randomisation of the members


def test_bootstrap_indices_range_and_frequencies():
    idx = bootstrap_indices(50, 40, 10, generator=torch.Generator().manual_seed(0))
    assert idx.shape == (50, 40, 10) and idx.dtype == torch.int64
    assert int(idx.min()) >= 0 and int(idx.max()) <= 9
    # Each index has probability 1/10 per draw: 20000 draws, binomial SE about 0.0021.
    freq = torch.bincount(idx.flatten(), minlength=10).double() / idx.numel()
    assert float((freq - 0.1).abs().max()) < 5 * math.sqrt(0.1 * 0.9 / idx.numel())
    # A bootstrap resample of n points has about 1 - (1 - 1/n)^n distinct points.
    distinct = np.mean([len(set(row.tolist())) for row in idx.reshape(-1, 10)]) / 10
    assert abs(distinct - (1 - 0.9**10)) < 0.02
    assert bootstrap_indices(2, 3, 10, generator=torch.Generator().manual_seed(0), sample_size=4).shape == (2, 3, 4)


def test_feature_subsets_are_uniform_subsets():
    s = feature_subsets(400, 50, 5, 2, generator=torch.Generator().manual_seed(1))
    assert s.shape == (400, 50, 2) and s.dtype == torch.int64
    assert bool((s[..., 0] < s[..., 1]).all()) and int(s.min()) >= 0 and int(s.max()) <= 4
    # All C(5, 2) = 10 subsets equally likely: chi-square with 9 degrees of freedom.
    codes = (s[..., 0] * 5 + s[..., 1]).flatten()
    counts = torch.bincount(codes, minlength=25).double()
    expected = codes.numel() / 10
    observed = torch.stack([counts[a * 5 + b] for a, b in itertools.combinations(range(5), 2)])
    assert float(observed.sum()) == codes.numel()
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # the 0.999 quantile of chi-square(9)


def test_randomisation_bad_inputs():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="subset_dim"):
        feature_subsets(1, 2, 3, 4, generator=g)
    with pytest.raises(TypeError, match="num_members"):
        bootstrap_indices(1, 2.0, 3, generator=g)
    with pytest.raises(ValueError, match="sample_size"):
        bootstrap_indices(1, 2, 3, generator=g, sample_size=0)


# ---------------------------------------------------------------- NW members on resamples


def _reference_nw(x, y, z, rows, columns, kernel, h):
    """Explicit loops, float64, with the bootstrap as multiplicity weights (not as repeated keys)."""
    x, y, z = x.double().cpu(), y.double().cpu(), z.double().cpu()
    r_count, n, dim = x.shape
    members = (rows if rows is not None else columns).shape[1]
    out = torch.empty(r_count, members, z.shape[0], dtype=torch.float64)
    for r in range(r_count):
        for b in range(members):
            counts = torch.ones(n, dtype=torch.float64)
            if rows is not None:
                counts = torch.bincount(rows[r, b].cpu(), minlength=n).double()
            cols = columns[r, b].cpu() if columns is not None else torch.arange(dim)
            keys, queries = x[r][:, cols], z[:, cols]
            for j in range(z.shape[0]):
                if kernel == "gaussian":
                    logk = -((queries[j] - keys) ** 2).sum(-1) / (2 * h * h)
                else:
                    logk = (keys @ queries[j]) / (h * h)
                kern = counts * torch.exp(logk - logk.max())
                out[r, b, j] = (kern * y[r]).sum() / kern.sum()
    return out


@pytest.mark.parametrize("mode", ["rows", "columns", "both"])
@pytest.mark.parametrize("kernel", ["gaussian", "exp"])
def test_resampled_nw_matches_explicit_loops(mode, kernel, dtype, device, tol):
    g = torch.Generator(device).manual_seed(7)
    x = torch.randn(4, N, D, generator=g, dtype=dtype, device=device)
    y = torch.randn(4, N, generator=g, dtype=dtype, device=device)
    z = torch.randn(M, D, generator=g, dtype=dtype, device=device)
    rows = bootstrap_indices(4, 3, N, generator=g) if mode in ("rows", "both") else None
    columns = feature_subsets(4, 3, D, 2, generator=g) if mode in ("columns", "both") else None
    h = 0.8 if kernel == "gaussian" else 1.3
    got = resampled_nw(x, y, z, rows=rows, columns=columns, kernel=kernel, bandwidth=h)
    assert got.shape == (4, 3, M) and got.dtype == dtype and got.device.type == device.type
    ref = _reference_nw(x, y, z, rows, columns, kernel, h)
    torch.testing.assert_close(got.double().cpu(), ref, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)
    # Chunking changes nothing but rounding.
    again = resampled_nw(x, y, z, rows=rows, columns=columns, kernel=kernel, bandwidth=h, chunk_size=1)
    torch.testing.assert_close(again, got, **tol)


def test_resampled_nw_members_differ_only_through_their_resamples():
    g = torch.Generator().manual_seed(2)
    x, y, z = torch.randn(2, N, D, generator=g), torch.randn(2, N, generator=g), torch.randn(M, D, generator=g)
    same = torch.arange(N).expand(2, 3, N).contiguous()  # every member sees every point once
    out = resampled_nw(x, y, z, rows=same, bandwidth=0.9)
    plain = nadaraya_watson(z, x, y, kernel="gaussian", bandwidth=0.9)
    torch.testing.assert_close(out, plain[:, None].expand(2, 3, M), rtol=1e-5, atol=1e-6)


def test_resampled_nw_bad_inputs():
    g = torch.Generator().manual_seed(0)
    x, y, z = torch.randn(2, N, D, generator=g), torch.randn(2, N, generator=g), torch.randn(M, D, generator=g)
    rows = bootstrap_indices(2, 3, N, generator=g)
    with pytest.raises(ValueError, match="rows or columns"):
        resampled_nw(x, y, z, bandwidth=1.0)
    with pytest.raises(ValueError, match="rows"):
        resampled_nw(x, y, z, rows=rows + N, bandwidth=1.0)
    with pytest.raises(TypeError, match="rows"):
        resampled_nw(x, y, z, rows=rows.float(), bandwidth=1.0)
    with pytest.raises(ValueError, match="rows and columns"):
        resampled_nw(x, y, z, rows=rows, columns=feature_subsets(2, 4, D, 2, generator=g), bandwidth=1.0)
    with pytest.raises(ValueError, match="columns"):
        resampled_nw(x, y, z, columns=feature_subsets(3, 4, D, 2, generator=g), bandwidth=1.0)
    with pytest.raises(ValueError, match="eval_points"):
        resampled_nw(x, y, z[:, :2], rows=rows, bandwidth=1.0)
    with pytest.raises(TypeError, match="eval_points"):
        resampled_nw(x, y, z.double(), rows=rows, bandwidth=1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        resampled_nw(x, y, z, rows=rows)


# ---------------------------------------------------------------- random forests


def _forests(bootstrap=True, max_samples=None, count=3, trees=6):
    ensemble = pytest.importorskip("sklearn.ensemble")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=60)
    forests = [
        ensemble.RandomForestRegressor(
            n_estimators=trees,
            max_features=2,
            min_samples_leaf=3,
            bootstrap=bootstrap,
            max_samples=max_samples,
            random_state=s,
        ).fit(X, y)
        for s in range(count)
    ]
    return forests, X, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forest_member_predictions_average_to_the_forest(dtype):
    forests, X, _ = _forests()
    z = torch.as_tensor(np.random.default_rng(1).normal(size=(M, 3)), dtype=dtype)
    out = forest_member_predictions(forests, z)
    assert out.shape == (3, 6, M) and out.dtype == dtype
    for r, forest in enumerate(forests):
        expected = torch.as_tensor(forest.predict(z.numpy()), dtype=torch.float64)
        torch.testing.assert_close(out[r].double().mean(0), expected, rtol=1e-6, atol=1e-6)
        for b, tree in enumerate(forest.estimators_):  # member b is tree b
            torch.testing.assert_close(
                out[r, b].double(), torch.as_tensor(tree.predict(z.numpy().astype(np.float32))), rtol=1e-6, atol=1e-6
            )
    # Different forests (seeds) give different members.
    assert float((out[0] - out[1]).abs().max()) > 1e-3


def test_forest_member_predictions_bad_inputs():
    forests, _, _ = _forests(count=2)
    ensemble = pytest.importorskip("sklearn.ensemble")
    z = torch.zeros(M, 3)
    with pytest.raises(TypeError, match="forests"):
        forest_member_predictions([], z)
    with pytest.raises(TypeError, match="forests"):
        forest_member_predictions([ensemble.RandomForestRegressor()], z)
    small = ensemble.RandomForestRegressor(n_estimators=2).fit(np.zeros((5, 3)), np.arange(5.0))
    with pytest.raises(ValueError, match="forests"):
        forest_member_predictions([forests[0], small], z)
    with pytest.raises(ValueError, match="eval_points"):
        forest_member_predictions(forests, torch.zeros(M, 4))


@pytest.mark.parametrize("bootstrap, max_samples", [(True, None), (True, 0.5), (False, None)])
def test_forest_weights_reproduce_every_tree(bootstrap, max_samples):
    forests, X, y = _forests(bootstrap=bootstrap, max_samples=max_samples, count=1)
    forest = forests[0]
    z = torch.as_tensor(np.random.default_rng(2).normal(size=(M, 3)))
    w = forest_weights(forest, torch.as_tensor(X), z)
    assert w.shape == (6, M, 60)
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(6, M, dtype=torch.float64))
    pred = forest_member_predictions([forest], z)[0]
    torch.testing.assert_close(w @ torch.as_tensor(y), pred, rtol=1e-9, atol=1e-9)
    if bootstrap:  # out-of-bag points never carry weight
        for b, samples in enumerate(forest.estimators_samples_):
            out_of_bag = np.setdiff1d(np.arange(60), samples)
            assert float(w[b][:, out_of_bag].abs().max()) == 0.0


def test_forest_weights_bad_inputs():
    forests, X, _ = _forests(count=1)
    with pytest.raises(ValueError, match="train_inputs"):
        forest_weights(forests[0], torch.as_tensor(X[:30]), torch.zeros(M, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="forest"):
        forest_weights(object(), torch.as_tensor(X), torch.zeros(M, 3, dtype=torch.float64))
