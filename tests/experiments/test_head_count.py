"""Tests of nwlib.experiments.head_count: targets, heads on coordinate blocks, floors, the grid point, the sweep and its tables."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from nwlib import replicate_mse, simulate
from nwlib.experiments.head_count import (
    COMBINATIONS,
    DEFAULT_TEMPERATURES,
    KERNEL_NAMES,
    KERNELS,
    OUTPUT_WEIGHTS,
    QUERY_SCALE,
    approximation_error,
    architecture_fits,
    best_at,
    best_head_dims,
    best_summary,
    block_conditional_mean,
    block_projections,
    cluster_bootstrap_slope,
    collect_sweep,
    comparison_head_dims,
    cosine_heads,
    deduplicated,
    divisor_head_dims,
    dot_product_effective_size,
    floor_table,
    format_attention_best,
    format_best_summary,
    format_best_table,
    format_census,
    format_floor_table,
    format_mse_table,
    growth_fit,
    head_count_census,
    head_count_grid,
    head_count_point,
    head_count_task,
    many_heads_tests,
    nearest_head_dim,
    own_dimension_optimum,
    published_architectures,
    run_head_count_sweep,
    target_variance,
)
from nwlib.sweep import point_seed

S2 = (1 - math.exp(-8)) / 2  # E sin^2(2x), x ~ N(0, 1)


def _draws(count, dim, seed=0):
    return torch.randn(count, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# --- targets ----------------------------------------------------------------------------


def test_local_target_is_the_cyclic_sum_of_neighbour_products():
    x = _draws(5, 6)
    expected = torch.tensor(
        [
            math.sqrt(2 / 6) * sum(math.sin(2 * row[j]) * math.sin(2 * row[(j + 1) % 6]) for j in range(6))
            for row in x.tolist()
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(head_count_task("local", 6).f(x), expected)


def test_global_target_is_a_centred_function_of_the_norm():
    dim = 8
    x = _draws(4, dim)
    u = (x.pow(2).sum(-1) - dim) / math.sqrt(2 * dim)
    f = head_count_task("global", dim).f(x)
    # the centring constant is E sin(2u) for u a standardised chi-square: check it by Monte Carlo
    big = _draws(400_000, dim, seed=1)
    mean_mc = float(torch.sin(2 * (big.pow(2).sum(-1) - dim) / math.sqrt(2 * dim)).mean())
    shift = torch.sin(2 * u) - f
    assert float(shift.std()) < 1e-12
    assert abs(float(shift[0]) - mean_mc) < 4 * math.sqrt(0.5 / 400_000)


def test_additive_target_is_the_isotropic_task():
    task = head_count_task("additive", 5, noise_sd=0.3)
    assert task.name == "isotropic" and task.noise_sd == 0.3


@pytest.mark.parametrize("name", ["additive", "local", "global"])
def test_target_variance_matches_monte_carlo(name):
    dim = 6
    f = head_count_task(name, dim).f(_draws(400_000, dim, seed=2))
    se = float(f.pow(2).std() / math.sqrt(f.numel()))
    assert abs(float(f.var()) - target_variance(name, dim)) < 4 * se


def test_variances_have_the_stated_closed_forms():
    assert math.isclose(target_variance("additive", 9), S2, rel_tol=1e-12)
    assert math.isclose(target_variance("local", 9), 2 * S2**2, rel_tol=1e-12)


# --- heads on blocks ---------------------------------------------------------------------


def test_divisor_head_dims_by_brute_force():
    for dim in range(1, 40):
        assert divisor_head_dims(dim) == [k for k in range(1, dim + 1) if dim % k == 0]


def test_block_projections_are_disjoint_coordinate_blocks(dtype, device):
    w = block_projections(3, 12, dtype=dtype, device=device)
    assert w.shape == (4, 12, 3) and w.dtype == dtype and w.device.type == device.type
    for h in range(4):
        expected = torch.zeros(12, 3, dtype=dtype, device=device)
        for j in range(3):
            expected[3 * h + j, j] = 1
        torch.testing.assert_close(w[h], expected)
    with pytest.raises(ValueError, match="head_dim"):
        block_projections(5, 12)


@pytest.mark.parametrize(
    ("name", "head_dim"),
    [("additive", 2), ("local", 2), ("local", 3), ("local", 6), ("global", 1), ("global", 3), ("global", 6)],
)
def test_block_conditional_mean_against_nested_monte_carlo(name, head_dim):
    dim, outer, inner = 6, 4, 100_000
    x = _draws(outer, dim, seed=3)
    f = head_count_task(name, dim).f
    got = block_conditional_mean(name, x, head_dim)
    gen = torch.Generator().manual_seed(4)
    for b in range(dim // head_dim):
        block = slice(b * head_dim, (b + 1) * head_dim)
        for i in range(outer):
            # E[f | x_b]: average f over fresh draws of every coordinate outside the block
            z = torch.randn(inner, dim, dtype=torch.float64, generator=gen)
            z[:, block] = x[i, block]
            values = f(z)
            se = float(values.std() / math.sqrt(inner))
            assert abs(float(values.mean()) - float(got[i, b])) < 5 * se + 1e-12, (name, head_dim, b, i)


def test_block_conditional_mean_dtype_and_device(dtype, device, tol):
    x = _draws(7, 6).to(device=device, dtype=dtype)
    for name in ("additive", "local", "global"):
        got = block_conditional_mean(name, x, 3)
        assert got.shape == (7, 2) and got.dtype == dtype and got.device.type == device.type
        ref = block_conditional_mean(name, x.double().cpu(), 3)
        torch.testing.assert_close(got.double().cpu(), ref, **tol)


@pytest.mark.parametrize("name", ["additive", "local", "global"])
@pytest.mark.parametrize("combination", ["sum", "mean"])
def test_approximation_error_matches_monte_carlo(name, combination):
    dim = 6
    x = _draws(400_000, dim, seed=5)
    f = head_count_task(name, dim).f(x)
    for k in divisor_head_dims(dim):
        g = block_conditional_mean(name, x, k)
        combined = g.sum(-1) if combination == "sum" else g.mean(-1)
        sq = (f - combined).pow(2)
        se = float(sq.std() / math.sqrt(sq.numel()))
        assert abs(float(sq.mean()) - approximation_error(name, k, dim, combination=combination)) < 4 * se + 1e-12


def test_approximation_error_closed_forms():
    dim = 12
    for k, heads in ((1, 12), (2, 6), (3, 4), (4, 3), (6, 2)):
        assert approximation_error("additive", k, dim) == pytest.approx(0.0, abs=1e-15)
        assert approximation_error("additive", k, dim, combination="mean") == pytest.approx(S2 * (1 - 1 / heads) ** 2)
        assert approximation_error("local", k, dim) == pytest.approx(2 * S2**2 / k)
    assert approximation_error("local", 12, dim) == pytest.approx(0.0, abs=1e-15)
    assert approximation_error("global", 12, dim) == pytest.approx(0.0, abs=1e-12)
    # the global target's floor barely falls until one head sees every coordinate
    floors = [approximation_error("global", k, dim) for k in divisor_head_dims(dim)]
    assert all(a > b for a, b in itertools.pairwise(floors)) and floors[-2] > 0.5 * floors[0]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: approximation_error("cubic", 1, 4), ValueError, "name"),
        (lambda: approximation_error("local", 1, 4, combination="max"), ValueError, "combination"),
        (lambda: approximation_error("local", 3, 4), ValueError, "head_dim"),
        (lambda: head_count_task("local", 2), ValueError, "embed_dim"),
        (lambda: block_conditional_mean("local", torch.zeros(2, 4), 3), ValueError, "head_dim"),
        (lambda: block_conditional_mean("local", torch.zeros(2, 4, dtype=torch.long), 2), TypeError, "x"),
        (lambda: target_variance("global", 0), ValueError, "embed_dim"),
    ],
)
def test_bad_inputs_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- one grid point -----------------------------------------------------------------------

POINT = {
    "target": "local",
    "kernel": "gaussian",
    "n": 64,
    "embed_dim": 6,
    "replicates": 4,
    "replicates_fit": 2,
    "m": 16,
    "noise_sd": 0.5,
}


@pytest.mark.parametrize("kernel", ["gaussian", "exp"])
def test_head_count_point_shapes_and_determinism(kernel):
    point = {**POINT, "kernel": kernel}
    out = head_count_point(point, seed=11)
    again = head_count_point(point, seed=11)
    other = head_count_point(point, seed=12)
    assert out == again or np.allclose(np.asarray(out["mse_fitted"]), np.asarray(again["mse_fitted"]), equal_nan=True)
    assert out["mse_fitted"] != other["mse_fitted"]
    assert out["head_dims"] == [1, 2, 3, 6] and out["num_heads"] == [6, 3, 2, 1]
    assert [len(r) for r in out["mse_uniform"]] == [4] * 4
    assert [len(w) for w in out["weights_fitted"]] == [6, 3, 2, 1]
    assert math.isnan(out["mean_correlation"][-1])
    # the floor on the evaluation points: a local target has no main effects, so 1-D heads learn nothing
    assert out["floor_sum"][0] == pytest.approx(out["mse_zero"], rel=1e-12)
    assert out["floor_sum"][-1] == pytest.approx(0.0, abs=1e-12)


def test_dot_product_heads_have_unit_temperature():
    # Rebuild the one-head (d_k = D) case by another route: W_Q = W_K = I with the kernel exp(<q, k>/h^2)
    # at h = 1 must give the same errors as the point's W_Q = sqrt(d_k) W_K under attention's 1/sqrt(d_k).
    point = {**POINT, "kernel": "exp", "embed_dim": 4, "replicates": 3}
    out = head_count_point(point, seed=3)
    gen = torch.Generator().manual_seed(3)  # the point's documented order of draws
    torch.randn(16, 4, generator=gen, dtype=torch.float64)  # fitting points
    z_eval = torch.randn(16, 4, generator=gen, dtype=torch.float64)
    torch.randn(2, 16, generator=gen, dtype=torch.float64)  # fitting noise
    _, seed_eval = torch.randint(0, 2**62, (2,), generator=gen).tolist()
    task = head_count_task("local", 4)
    pred = simulate(
        task,
        torch.eye(4, dtype=torch.float64)[None],
        z_eval,
        n=64,
        replicates=3,
        generator=torch.Generator().manual_seed(seed_eval),
        kernel="exp",
        bandwidth=1.0,
    )
    expected = replicate_mse(pred, task.f(z_eval), torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(
        torch.tensor(out["mse_uniform"][-1], dtype=torch.float64), expected, rtol=1e-9, atol=1e-12
    )


def test_eval_seed_shares_the_evaluation_points_across_n_and_kernels():
    a = head_count_point({**POINT, "eval_seed": 5}, seed=1)
    b = head_count_point({**POINT, "eval_seed": 5, "n": 128, "kernel": "exp"}, seed=2)
    c = head_count_point({**POINT, "eval_seed": 6}, seed=1)
    assert a["mse_zero"] == b["mse_zero"] and a["floor_sum"] == b["floor_sum"]
    assert a["mse_zero"] != c["mse_zero"]


def test_head_count_point_names_bad_coordinates():
    with pytest.raises(ValueError, match="lacks"):
        head_count_point({"target": "local"}, seed=0)
    with pytest.raises(ValueError, match="kernel"):
        head_count_point({**POINT, "kernel": "laplace"}, seed=0)
    with pytest.raises(ValueError, match="replicates"):
        head_count_point({**POINT, "replicates": 2}, seed=0)
    with pytest.raises(ValueError, match="seed"):
        head_count_point(POINT, seed=-1)


# --- the chapter's grid, sweep and tables -------------------------------------------------
# Synthetic sweeps (hand-made point results) test the tables against explicit loops, scipy and
# statsmodels; one tiny real sweep checks run_head_count_sweep against direct calls of the point function.

SMALL = dict(embed_dim=6, sample_sizes=[32, 64], replicates=3, replicates_fit=2, num_eval_points=8, noise_sd=0.5)
TINY = dict(embed_dim=4, sample_sizes=[32], replicates=3, replicates_fit=2, num_eval_points=8, noise_sd=0.5)  # computed


def _fake_results(points, replicates=5, seed=0, head_dims=(1, 2, 3, 6)):
    """Point results of head_count_point's shape, with random errors (and a known best head dimension per point)."""
    rng = np.random.default_rng(seed)
    results = []
    for p in points:
        dim = p["embed_dim"]
        results.append(
            {
                "head_dims": list(head_dims),
                "num_heads": [dim // k for k in head_dims],
                "mse_fitted": rng.uniform(0.1, 1.0, (len(head_dims), replicates)).tolist(),
                "mse_uniform": rng.uniform(0.1, 1.0, (len(head_dims), replicates)).tolist(),
                "mean_correlation": [*rng.uniform(0, 0.5, len(head_dims) - 1).tolist(), float("nan")],
                "floor_sum": rng.uniform(0, 0.5, len(head_dims)).tolist(),
                "floor_mean": rng.uniform(0, 0.5, len(head_dims)).tolist(),
                "mse_zero": float(rng.uniform(1.0, 2.0)),
            }
        )
    return results


@pytest.fixture(scope="module")
def fake_sweep():
    points = head_count_grid(**SMALL, seed=0)
    return collect_sweep(points, _fake_results(points))


@pytest.fixture(scope="module")
def small_sweep():
    return run_head_count_sweep(**TINY, seed=3)


def test_output_weights_and_combinations_are_distinct_names():
    # one name, one meaning: how the sweep weights its heads vs. how approximation_error combines the floors
    assert OUTPUT_WEIGHTS == ("fitted", "uniform") and COMBINATIONS == ("sum", "mean")
    assert not set(OUTPUT_WEIGHTS) & set(COMBINATIONS)
    assert set(KERNEL_NAMES) == set(KERNELS)


@pytest.mark.parametrize(
    ("dim", "expected"), [(12, (2, 3, 6, 12)), (16, (2, 4, 8, 16)), (30, (2, 5, 15, 30)), (8, (2, 2, 4, 8))]
)
def test_comparison_head_dims_known_answers(dim, expected):
    assert tuple(comparison_head_dims(dim)) == expected
    small, middle, half, largest = comparison_head_dims(dim)
    assert (small, middle, half, largest) == expected


@pytest.mark.parametrize("dim", [1, 4, 7, 9, 49])
def test_comparison_head_dims_needs_four_divisors(dim):
    with pytest.raises(ValueError, match="embed_dim"):
        comparison_head_dims(dim)


def test_floor_table_closed_forms():
    table = floor_table(12)
    assert table.index.tolist() == [1, 2, 3, 4, 6, 12] and table.shape == (6, 6)
    assert set(table.columns) == {(t, c) for t in ("additive", "local", "global") for c in ("sum", "mean")}
    for k in table.index:
        heads = 12 // k
        assert table.loc[k, ("additive", "sum")] == pytest.approx(0.0, abs=1e-15)
        assert table.loc[k, ("additive", "mean")] == pytest.approx(S2 * (1 - 1 / heads) ** 2)
        assert table.loc[k, ("local", "sum")] == pytest.approx(0.0 if k == 12 else 2 * S2**2 / k, abs=1e-15)
    assert table.loc[1, ("local", "mean")] == pytest.approx(2 * S2**2)  # 1-D heads see no neighbour pair
    assert table.loc[12, ("global", "sum")] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="embed_dim"):
        floor_table(2)


def test_head_count_grid_order_and_coordinates():
    points = head_count_grid(**SMALL, seed=4)
    assert len(points) == 3 * 3 * 2
    kernels = ("gaussian", "exp", "cosine")
    expected = [(t, k, n) for t in ("additive", "local", "global") for k in kernels for n in (32, 64)]
    assert [(p["target"], p["kernel"], p["n"]) for p in points] == expected
    for p in points:
        assert p["m"] == 8 and p["eval_seed"] == 4 and p["embed_dim"] == 6
        assert p["replicates"] == 3 and p["replicates_fit"] == 2 and p["noise_sd"] == 0.5
        # only the cosine points carry the temperatures: the other points (and so their seeds) do not depend on them
        assert ("temperatures" in p) == (p["kernel"] == "cosine")
    assert points[4]["temperatures"] == list(DEFAULT_TEMPERATURES)
    other = head_count_grid(**SMALL, seed=4, temperatures=[0.5])
    assert [p for p in other if p["kernel"] != "cosine"] == [p for p in points if p["kernel"] != "cosine"]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(replicates=2), ValueError, "replicates"),
        (dict(num_eval_points=0), ValueError, "num_eval_points"),
        (dict(sample_sizes="64"), TypeError, "sample_sizes"),
        (dict(sample_sizes=[64, 0]), ValueError, "sample_sizes"),
        (dict(noise_sd=-1.0), ValueError, "noise_sd"),
        (dict(embed_dim=0), ValueError, "embed_dim"),
    ],
)
def test_head_count_grid_names_bad_sizes(change, error, match):
    with pytest.raises(error, match=match):
        head_count_grid(**{**SMALL, **change}, seed=0)
    with pytest.raises(ValueError, match="seed"):
        head_count_grid(**SMALL, seed=-1)


def test_run_head_count_sweep_equals_direct_point_calls(small_sweep):
    # independent route: call the point function with each point's documented seed, no run_sweep, no collect_sweep
    for p in head_count_grid(**TINY, seed=3):
        direct = head_count_point(p, seed=point_seed(3, p))
        for weights, field in (("fitted", "mse_fitted"), ("uniform", "mse_uniform")):
            got = small_sweep.errors[(p["target"], p["kernel"], p["n"], weights)]
            np.testing.assert_array_equal(got, np.asarray(direct[field]))
        assert small_sweep.zero_error[(p["target"], p["kernel"], p["n"])] == direct["mse_zero"]
    assert small_sweep.head_dims == [1, 2, 4] and small_sweep.sample_sizes == [32]
    assert small_sweep.embed_dim == 4 and small_sweep.seconds >= 0


def test_run_head_count_sweep_is_deterministic(small_sweep):
    again = run_head_count_sweep(**TINY, seed=3)
    other = run_head_count_sweep(**TINY, seed=4)
    for key, arr in small_sweep.errors.items():
        np.testing.assert_array_equal(arr, again.errors[key])
    assert any(not np.array_equal(arr, other.errors[key]) for key, arr in small_sweep.errors.items())


def test_run_head_count_sweep_on_a_device(device):
    sweep = run_head_count_sweep(**TINY, seed=1, device=str(device))
    assert all(r["device"].startswith(device.type) for r in sweep.results)
    assert all(arr.shape == (3, 3) and arr.dtype == np.float64 for arr in sweep.errors.values())


def test_collect_sweep_table_against_explicit_loops(fake_sweep):
    import statistics

    table = fake_sweep.table
    assert len(table) == 18 * 2 * 4
    assert table.temperature.isna().all()  # the fake results carry no temperatures
    assert list(table.columns) == [
        "target",
        "kernel",
        "n",
        "output_weights",
        "head_dim",
        "num_heads",
        "mse",
        "se",
        "mse_zero",
        "rho",
        "floor",
        "temperature",
    ]
    for p, r in zip(fake_sweep.points, fake_sweep.results, strict=True):
        for weights, field, floor in (("fitted", "mse_fitted", "floor_sum"), ("uniform", "mse_uniform", "floor_mean")):
            for i, k in enumerate(r["head_dims"]):
                row = fake_sweep.row(p["target"], p["kernel"], weights, k, p["n"])
                values = r[field][i]
                assert row.mse == pytest.approx(statistics.fmean(values), rel=1e-14)
                assert row.se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-12)
                assert row.num_heads == 6 // k and row.floor == r[floor][i] and row.mse_zero == r["mse_zero"]
                assert row.rho == r["mean_correlation"][i] or (math.isnan(row.rho) and k == 6)


def test_collect_sweep_names_bad_results(fake_sweep):
    points, results = fake_sweep.points, fake_sweep.results
    with pytest.raises(ValueError, match="results"):
        collect_sweep(points, results[:-1])
    broken = [dict(r) for r in results]
    del broken[3]["floor_mean"]
    with pytest.raises(ValueError, match="floor_mean"):
        collect_sweep(points, broken)
    other = [dict(r) for r in results]
    other[2] = {**other[2], "head_dims": [1, 2, 3]}
    with pytest.raises(ValueError, match="head dimensions"):
        collect_sweep(points, other)
    with pytest.raises(TypeError, match="points"):
        collect_sweep([], [])


def test_series_and_gain_against_the_formula(fake_sweep):
    import statistics

    index = [(p["target"], p["kernel"], p["n"]) for p in fake_sweep.points]
    r = fake_sweep.results[index.index(("global", "exp", 64))]
    e = fake_sweep.series("global", "exp", "uniform", 3)
    assert e.dtype == torch.float64 and e.shape == (5,)
    assert e.tolist() == r["mse_uniform"][2]
    assert fake_sweep.by_head_dim("global", "exp", "uniform")[3].tolist() == e.tolist()
    gains = [100 * (1 - x / r["mse_zero"]) for x in r["mse_uniform"][2]]
    got = fake_sweep.gain("global", "exp", "uniform", 3)
    assert got.estimate == pytest.approx(statistics.fmean(gains), rel=1e-12)
    assert got.se == pytest.approx(statistics.stdev(gains) / math.sqrt(5), rel=1e-12)
    # the default n is the largest; n = 32 is another point
    at_32 = fake_sweep.results[index.index(("global", "exp", 32))]
    assert fake_sweep.series("global", "exp", "uniform", 3, 32).tolist() == at_32["mse_uniform"][2]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("cubic", "exp", "fitted", 1), "target"),
        (("local", "laplace", "fitted", 1), "kernel"),
        (("local", "exp", "sum", 1), "output_weights"),
        (("local", "exp", "fitted", 4), "head_dim"),
        (("local", "exp", "fitted", 1, 100), "n"),
    ],
)
def test_series_names_bad_configurations(fake_sweep, args, match):
    with pytest.raises(ValueError, match=match):
        fake_sweep.series(*args)


def test_correlation_range_by_a_loop(fake_sweep):
    rhos = [
        rho
        for p, r in zip(fake_sweep.points, fake_sweep.results, strict=True)
        if p["kernel"] == "gaussian" and p["n"] == 64
        for rho, heads in zip(r["mean_correlation"], r["num_heads"], strict=True)
        if heads > 1
    ]
    assert fake_sweep.correlation_range("gaussian") == (min(rhos), max(rhos))


def _bootstrap_reference(arr, head_dims, bootstrap, seed):
    """Best head dimension and its bootstrap by explicit loops (the resamples as best_head_dims documents them)."""
    import statistics

    dims_count, reps = arr.shape
    resample = np.random.default_rng(seed).integers(0, reps, size=(bootstrap, reps))
    means = [statistics.fmean(arr[i]) for i in range(dims_count)]
    point = head_dims[min(range(dims_count), key=means.__getitem__)]
    boot = []
    for draw in resample:
        boot_means = [sum(arr[i, j] for j in draw) / reps for i in range(dims_count)]
        boot.append(head_dims[min(range(dims_count), key=boot_means.__getitem__)])
    ordered = sorted(boot)
    lo, hi = ordered[math.ceil(0.025 * bootstrap) - 1], ordered[math.ceil(0.975 * bootstrap) - 1]  # inverted CDF
    return point, sum(b == point for b in boot) / bootstrap, lo, hi, statistics.fmean(boot), statistics.stdev(boot)


def test_best_head_dims_against_a_bootstrap_loop(fake_sweep):
    best = best_head_dims(fake_sweep, bootstrap=200, seed=7)
    assert len(best) == 36
    for row in best.itertuples():
        arr = fake_sweep.errors[(row.target, row.kernel, row.n, row.output_weights)]
        point, support, lo, hi, boot_mean, boot_sd = _bootstrap_reference(arr, fake_sweep.head_dims, 200, 7)
        assert (row.best_head_dim, row.lo, row.hi) == (point, lo, hi)
        assert row.support == pytest.approx(support) and row.boot_mean == pytest.approx(boot_mean)
        assert row.boot_sd == pytest.approx(boot_sd)
    again = best_head_dims(fake_sweep, bootstrap=200, seed=7)
    assert best.equals(again)
    assert not best.equals(best_head_dims(fake_sweep, bootstrap=200, seed=8))


def test_best_head_dims_known_case():
    # one head dimension better in every replicate: every resample agrees with it
    points = head_count_grid(**{**SMALL, "sample_sizes": [32]}, seed=0)
    results = _fake_results(points, replicates=4)
    for r in results:
        r["mse_fitted"][2] = [0.01] * 4  # d_k = 3 wins everywhere
    best = best_head_dims(collect_sweep(points, results), bootstrap=50, seed=0)
    fitted = best[best.output_weights == "fitted"]
    assert (fitted.best_head_dim == 3).all() and (fitted.support == 1.0).all()
    assert (fitted.lo == 3).all() and (fitted.hi == 3).all() and (fitted.boot_sd == 0).all()
    with pytest.raises(ValueError, match="bootstrap"):
        best_head_dims(collect_sweep(points, results), bootstrap=0, seed=0)
    with pytest.raises(TypeError, match="sweep"):
        best_head_dims(best, bootstrap=10, seed=0)


def test_best_at_and_best_summary(fake_sweep):
    best = best_head_dims(fake_sweep, bootstrap=50, seed=1)
    over_n = best_at(best, "local", "exp", "uniform")
    assert over_n.n.tolist() == [32, 64] and (over_n.target == "local").all()
    at_64 = best_at(best, "local", "exp", "uniform", 64)
    assert at_64.n == 64 and at_64.best_head_dim == over_n.best_head_dim.iloc[-1]
    with pytest.raises(ValueError, match="no row"):
        best_at(best, "local", "exp", "uniform", 100)
    summary = best_summary(best, kernel="exp")
    assert summary.index.tolist() == [(t, w) for t in ("additive", "local", "global") for w in ("fitted", "uniform")]
    row = summary.to_dict("index")[("local", "uniform")]
    assert row == {
        "best_head_dim": int(at_64.best_head_dim),
        "support": pytest.approx(100 * at_64.support),
        "interval": f"[{at_64.lo}, {at_64.hi}]",
        "best_head_dim_nmin": int(over_n.best_head_dim.iloc[0]),
    }
    assert type(row["best_head_dim"]) is int and type(row["support"]) is float  # glue needs Python numbers


def test_census_against_statsmodels_holm(fake_sweep):
    import statistics

    from scipy.stats import t as student_t
    from statsmodels.stats.multitest import multipletests

    census = head_count_census(fake_sweep)
    assert len(census) == 18
    kernels = ("gaussian", "exp", "cosine")
    cases = [(t, k, w) for t in ("additive", "local", "global") for k in kernels for w in ("fitted", "uniform")]
    assert list(zip(census.target, census.kernel, census.output_weights, strict=True)) == cases
    z = []
    for row in census.itertuples():
        arr = fake_sweep.errors[(row.target, row.kernel, 64, row.output_weights)]
        diff = arr[0] - arr[-1]  # d_k = 1 minus d_k = D, replicate by replicate
        assert row.small_minus_large == pytest.approx(statistics.fmean(diff), rel=1e-12, abs=1e-15)
        assert row.se == pytest.approx(statistics.stdev(diff) / math.sqrt(len(diff)), rel=1e-12)
        z.append(row.small_minus_large / row.se)
    reject, *_ = multipletests(2 * student_t.sf(np.abs(z), df=4), alpha=0.05, method="holm")  # R - 1 = 4 df
    assert census.significant.tolist() == reject.tolist()


def test_census_finds_a_planted_difference():
    points = head_count_grid(**{**SMALL, "sample_sizes": [32]}, seed=0)
    results = _fake_results(points, replicates=8)
    results[3]["mse_fitted"][-1] = [x + 5.0 for x in results[3]["mse_fitted"][0]]  # local, gaussian: one head far worse
    census = head_count_census(collect_sweep(points, results))
    row = census[(census.target == "local") & (census.kernel == "gaussian") & (census.output_weights == "fitted")]
    assert row.small_minus_large.item() == pytest.approx(-5.0) and bool(row.significant.item())


# --- the tables for reading ------------------------------------------------------------------------


def _number(cell: str) -> float:
    return float(cell.replace("\u2212", "-"))  # the book's tables typeset a minus sign for the hyphen


def _rounds(cell: str, value: float) -> None:
    """``cell`` shows ``value`` rounded to the cell's own decimal places."""
    decimals = len(cell.partition(".")[2])
    assert abs(_number(cell) - value) <= 0.5 * 10.0**-decimals * (1 + 1e-9), (cell, value)


def _shows(cell: str, value: float, se: float) -> None:
    """``cell`` reads "estimate ± SE", the SE to two significant digits and the estimate to the same place."""
    est, err = cell.replace("\u00a0", " ").split(" ± ")
    _rounds(est, value)
    _rounds(err, se)
    assert len(err.partition(".")[2]) == len(est.partition(".")[2])
    assert 10 <= round(_number(err) * 10 ** len(err.partition(".")[2])) <= 100, cell  # two significant digits


def test_format_floor_table_against_the_closed_forms():
    shown = format_floor_table(floor_table(12))
    assert shown.index.tolist() == ["1", "2", "3", "4", "6", "12"] or shown.index.tolist() == [1, 2, 3, 4, 6, 12]
    assert len(shown.columns) == 6 and shown.columns[0] == "additive: added (output weights)"
    assert set(shown["additive: added (output weights)"]) == {"0"}  # an exact 0 up to rounding
    for position, k in enumerate([1, 2, 3, 4, 6, 12]):
        _rounds(shown["additive: averaged (1/H)"].iloc[position], S2 * (1 - k / 12) ** 2)
        _rounds(shown["local: added (output weights)"].iloc[position], 0.0 if k == 12 else 2 * S2**2 / k)
    with pytest.raises(TypeError, match="floors"):
        format_floor_table(floor_table(12).droplevel(1, axis=1))


def test_format_mse_and_best_tables(fake_sweep):
    table = fake_sweep.table
    shown = format_mse_table(table)
    assert list(shown.columns) == [f"d_k = {k}" for k in fake_sweep.head_dims]
    assert len(shown) == len(table) // len(fake_sweep.head_dims)
    row = table[(table.target == "local") & (table.kernel == "exp") & (table.n == 64) & (table.head_dim == 2)]
    row = row[row.output_weights == "uniform"].iloc[0]
    _shows(shown.loc[("local", KERNEL_NAMES["exp"], "average (1/H)", 64), "d_k = 2"], row.mse, row.se)
    best = best_head_dims(fake_sweep, bootstrap=50, seed=1)
    wide = format_best_table(best)
    assert list(wide.columns) == ["n = 32", "n = 64"] and len(wide) == 18
    at = best_at(best, "global", "cosine", "fitted")
    assert wide.loc[("global", KERNEL_NAMES["cosine"], "fitted")].tolist() == [str(k) for k in at.best_head_dim]
    summary = format_best_summary(best_summary(best, kernel="exp"))
    raw = best_summary(best, kernel="exp").loc[("local", "uniform")]
    shown_row = summary.loc[("local", "average (1/H)")]
    assert (
        shown_row["d_k* (largest n)"] == str(raw.best_head_dim) and shown_row["95% bootstrap interval"] == raw.interval
    )
    _rounds(shown_row["bootstrap support (%)"], raw.support)
    with pytest.raises(ValueError, match="best_head_dim"):
        format_best_table(best.drop(columns="best_head_dim"))


def test_format_census_and_attention_best(fake_sweep):
    census = head_count_census(fake_sweep)
    shown = format_census(census)
    assert len(shown) == 18 and list(shown.columns)[-1] == "significant (Holm)"
    for r, (_, cells) in zip(census.itertuples(), shown.iterrows(), strict=True):
        _shows(cells.iloc[0], r.small_minus_large, r.se)
        assert cells.iloc[1] == ("yes" if r.significant else "no")
    table = fake_sweep.table.assign(temperature=lambda t: np.where(t.kernel == "cosine", 0.3, np.nan))
    attn = table[table.kernel.isin(["exp", "cosine"])].assign(removed_pct=lambda t: 100 * (1 - t.mse / t.mse_zero))
    best = attn.loc[attn.groupby(["kernel", "target", "n"]).mse.idxmin()]
    shown = format_attention_best(best)
    assert list(shown.columns) == ["output weights", "d_k", "τ", "MSE", "zero predictor's MSE", "share removed (%)"]
    first = best.iloc[0]
    assert shown.iloc[0]["τ"] == ("0.3" if first.kernel == "cosine" else "–")
    _shows(shown.iloc[0]["MSE"], first.mse, first.se)
    assert set(shown.xs(KERNEL_NAMES["exp"], level="kernel")["τ"]) == {"–"}
    with pytest.raises(ValueError, match="removed_pct"):
        format_attention_best(best.drop(columns="removed_pct"))


def test_nearest_head_dim_by_brute_force():
    dims = [1, 2, 3, 4, 6, 12]
    values = np.random.default_rng(0).uniform(0.5, 20.0, 200)
    expected = [min(dims, key=lambda k, v=v: abs(math.log(v) - math.log(k))) for v in values]
    assert nearest_head_dim(values, dims).tolist() == expected
    assert nearest_head_dim([0.0, -1.0], dims).tolist() == [1, 1]
    with pytest.raises(ValueError, match="head_dims"):
        nearest_head_dim([1.0], [])
    with pytest.raises(ValueError, match="values"):
        nearest_head_dim([[1.0]], dims)


def _growth_rows(boot_mean, sizes=(128, 256, 512, 1024, 2048)):
    import pandas as pd

    return pd.DataFrame(
        dict(
            n=list(sizes),
            boot_mean=[boot_mean(n) for n in sizes],
            boot_sd=[0.1, 0.3, 0.2, 0.5, 0.4][: len(sizes)],
            best_head_dim=[1, 2, 2, 3, 4][: len(sizes)],
        )
    ).iloc[::-1]  # growth_fit sorts by n itself


def test_growth_fit_recovers_exact_laws():
    from scipy.stats import linregress

    dims = [1, 2, 3, 4, 6, 12]
    log_law = growth_fit(_growth_rows(lambda n: 1.0 + 0.5 * math.log(n)), dims)
    assert log_law.log_slope == pytest.approx(0.5) and log_law.log_intercept == pytest.approx(1.0)
    np.testing.assert_allclose(log_law.fit_log, 1.0 + 0.5 * np.log(log_law.grid_n), rtol=1e-12)
    power_law = growth_fit(_growth_rows(lambda n: 2.0 * n**0.1), dims)
    assert power_law.gamma == pytest.approx(0.1) and power_law.log_scale == pytest.approx(math.log(2.0))
    np.testing.assert_allclose(power_law.fit_pow, 2.0 * power_law.grid_n**0.1, rtol=1e-10)
    # the power fit of the log law: least squares on the log scale, as scipy's linregress computes it
    ref = linregress(
        np.log([128, 256, 512, 1024, 2048]), np.log([1.0 + 0.5 * math.log(n) for n in (128, 256, 512, 1024, 2048)])
    )
    assert log_law.gamma == pytest.approx(ref.slope) and log_law.log_scale == pytest.approx(ref.intercept)
    gap = np.max(np.abs(log_law.fit_log - np.exp(ref.intercept) * log_law.grid_n**ref.slope))
    assert log_law.max_gap == pytest.approx(gap, rel=1e-9)
    assert (
        log_law.grid_n[0] == pytest.approx(128)
        and log_law.grid_n[-1] == pytest.approx(2048)
        and len(log_law.grid_n) == 200
    )
    assert log_law.spread == pytest.approx(0.3) and log_law.best_head_dims == [1, 2, 2, 3, 4]
    summary = log_law.summary()
    assert (summary["first"], summary["last"]) == (1, 4) and summary["same_choice"] in ("the same", "different")


def test_growth_fit_same_choice_by_brute_force():
    dims = [1, 2, 3, 4, 6, 12]
    for boot_mean in (lambda n: 1.0 + 0.5 * math.log(n), lambda n: 0.2 * n**0.4, lambda n: 3.0 + 0.01 * math.log(n)):
        fit = growth_fit(_growth_rows(boot_mean), dims)
        log_n = np.log([128, 256, 512, 1024, 2048])

        def nearest(v):
            return min(dims, key=lambda k: abs(math.log(max(v, 1e-9)) - math.log(k)))

        picks_log = [nearest(fit.log_intercept + fit.log_slope * x) for x in log_n]
        picks_pow = [nearest(math.exp(fit.log_scale + fit.gamma * x)) for x in log_n]
        assert fit.same_choice == (picks_log == picks_pow)


def test_growth_fit_names_bad_rows():
    with pytest.raises(ValueError, match="two sample sizes"):
        growth_fit(_growth_rows(lambda n: 2.0, sizes=(128,)), [1, 2])
    with pytest.raises(ValueError, match="boot_mean"):
        growth_fit(_growth_rows(lambda n: -1.0), [1, 2])


def _ols_slope_se(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    sxx = ((x - x.mean()) ** 2).sum()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / sxx
    resid = y - y.mean() - slope * (x - x.mean())
    return slope, math.sqrt((resid**2).sum() / (len(x) - 2) / sxx)


def test_architecture_fits_against_closed_form_ols(tmp_path):
    import statsmodels.api as sm

    csv = tmp_path / "arch.csv"
    csv.write_text(
        "family,d_model,n_heads,d_head\n"
        "A,512,8,64\nA,768,12,64\nA,1024,16,64\nB,2048,16,128\nB,4096,32,128\nB,5120,40,128\nC,1024,32,128\n"
        "B,4096,32,128\n"
    )
    arch = published_architectures(csv)
    assert arch.consistent.tolist() == [True] * 6 + [False, True]
    assert arch.lineage.tolist() == arch.family.tolist() and arch.n_kv_heads.tolist() == arch.n_heads.tolist()
    fits = architecture_fits(arch, bootstrap=50, seed=0)
    assert (fits.count, fits.families, fits.lineages, fits.inconsistent, fits.grouped_query) == (8, 3, 3, 1, 0)
    assert fits.embed_dim_range == (512, 5120) and fits.head_dim_range == (64, 128)
    assert fits.share_64_128 == 1.0
    ok = arch[arch.consistent].iloc[:6]  # the repeated B design counts once
    assert fits.num_heads.rows == 6
    for col, fit in (("n_heads", fits.num_heads), ("d_head", fits.head_dim)):
        ref_slope, ref_se = _ols_slope_se(np.log(ok.d_model), np.log(ok[col]))
        assert fit.slope == pytest.approx(ref_slope, rel=1e-12) and fit.se_iid == pytest.approx(ref_se, rel=1e-10)
        model = sm.OLS(np.log(ok[col].to_numpy(float)), sm.add_constant(np.log(ok.d_model.to_numpy(float)))).fit()
        assert fit.intercept == pytest.approx(model.params[0], rel=1e-10) and fit.se_iid == pytest.approx(model.bse[1])
        assert fit.df == 1.0  # two lineages among the consistent rows
    assert fits.num_heads_slope == fits.num_heads.slope and fits.num_heads_slope_se == fits.num_heads.se


def test_architecture_fits_of_the_book_table():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "book" / "data" / "published-architectures.csv"
    arch = published_architectures(path)
    fits = architecture_fits(arch, bootstrap=200, seed=0)
    # 49 configurations of 11 families in 8 lineages; three T5 ones with H d_k != D; eight with GQA or MQA
    assert (fits.count, fits.families, fits.lineages, fits.inconsistent, fits.grouped_query) == (49, 11, 8, 3, 8)
    assert fits.families == len(set(arch.family)) and arch.source.notna().all() and arch.kv_source.notna().all()
    assert set(arch[arch.n_kv_heads < arch.n_heads].model) == {
        "Llama-2-70B",
        "Llama-3-8B",
        "Llama-3-70B",
        "Llama-3.1-405B",
        "Llama-3.2-1B",
        "Llama-3.2-3B",
        "Falcon-7B",
        "Mistral-7B-v0.1",
    }
    rows = list(zip(arch.n_heads, arch.d_head, arch.d_model, strict=True))
    assert fits.share_64_128 == sum(dk in (64, 128) for _, dk, _ in rows) / len(rows)
    assert fits.embed_dim_range == (min(d for *_, d in rows), max(d for *_, d in rows))
    assert fits.num_heads.rows == len(deduplicated(arch, "n_heads")) < int(arch.consistent.sum())


def test_architecture_inputs_are_named(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("family,d_model,n_heads\nA,512,8\n")
    with pytest.raises(ValueError, match="d_head"):
        published_architectures(bad)
    few = tmp_path / "few.csv"
    few.write_text("family,d_model,n_heads,d_head\nA,512,8,64\nA,768,12,64\n")
    with pytest.raises(ValueError, match="three consistent"):
        architecture_fits(published_architectures(few))


# --- the cosine (QK-normalised) heads on LayerNorm'd tokens ---------------------------------


@pytest.mark.parametrize("head_dim", [1, 2, 6])
def test_cosine_heads_against_an_explicit_loop(head_dim):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 20, 6, generator=g, dtype=torch.float64)
    y = torch.randn(3, 20, generator=g, dtype=torch.float64)
    z = torch.randn(4, 6, generator=g, dtype=torch.float64)
    tau = 0.2
    out = cosine_heads(x, y, z, head_dim, temperature=tau, chunk=2)
    assert out.shape == (3, 6 // head_dim, 4)

    def ln(v):  # LayerNorm without affine part, torch's eps
        return (v - v.mean()) / math.sqrt(v.var(unbiased=False) + 1e-5)

    for r in range(3):
        for h in range(6 // head_dim):
            block = slice(h * head_dim, (h + 1) * head_dim)
            for j in range(4):
                q = QUERY_SCALE * ln(z[j])[block]
                q = q / q.norm()
                logits = torch.stack([(q @ (ln(x[r, i])[block] / ln(x[r, i])[block].norm())) / tau for i in range(20)])
                w = torch.exp(logits - logits.max())
                expected = (w * y[r]).sum() / w.sum()
                torch.testing.assert_close(out[r, h, j], expected, rtol=1e-10, atol=1e-12)


def test_cosine_heads_names_bad_inputs():
    x, y, z = torch.randn(2, 5, 4), torch.randn(2, 5), torch.randn(3, 4)
    with pytest.raises(ValueError, match="head_dim"):
        cosine_heads(x, y, z, 3, temperature=0.1)
    with pytest.raises(ValueError, match="temperature"):
        cosine_heads(x, y, z, 2, temperature=0.0)
    with pytest.raises(ValueError, match="queries"):
        cosine_heads(x, y, torch.randn(3, 5), 2, temperature=0.1)


def test_head_count_point_cosine_chooses_temperatures_on_the_fitting_batch():
    point = {**POINT, "kernel": "cosine", "temperatures": [0.05, 0.5]}
    out = head_count_point(point, seed=11)
    assert out == head_count_point(point, seed=11)
    assert out["head_dims"] == [1, 2, 3, 6] and [len(r) for r in out["mse_fitted"]] == [4] * 4
    assert set(out["temperature_uniform"]) <= {0.05, 0.5} and set(out["temperature_fitted"]) <= {0.05, 0.5}
    # the evaluation points are the other kernels' (same eval_seed and sizes): the zero predictor's error agrees
    gauss = head_count_point({**POINT, "eval_seed": 2}, seed=1)
    cos = head_count_point({**point, "eval_seed": 2}, seed=9)
    assert gauss["mse_zero"] == cos["mse_zero"]
    # the averaged heads at the chosen temperature, recomputed from the documented draws
    gen = torch.Generator().manual_seed(11)
    z_fit = torch.randn(16, 6, generator=gen, dtype=torch.float64)
    z_eval = torch.randn(16, 6, generator=gen, dtype=torch.float64)
    noise = torch.randn(2, 16, generator=gen, dtype=torch.float64)
    seed_fit, seed_eval = torch.randint(0, 2**62, (2,), generator=gen).tolist()
    task = head_count_task("local", 6)
    x_fit, y_tr = task.sample((2,), 64, generator=torch.Generator().manual_seed(seed_fit), dtype=torch.float64)
    x_ev, y_ev = task.sample((4,), 64, generator=torch.Generator().manual_seed(seed_eval), dtype=torch.float64)
    y_fit = task.f(z_fit) + 0.5 * noise
    scores = [
        float((cosine_heads(x_fit, y_tr, z_fit, 2, temperature=t).mean(1) - y_fit).pow(2).mean()) for t in (0.05, 0.5)
    ]
    tau = (0.05, 0.5)[int(np.argmin(scores))]
    assert out["temperature_uniform"][1] == tau
    pred = cosine_heads(x_ev, y_ev, z_eval, 2, temperature=tau)
    expected = (pred.mean(1) - task.f(z_eval)).pow(2).mean(-1)
    torch.testing.assert_close(torch.tensor(out["mse_uniform"][1], dtype=torch.float64), expected)


def test_head_count_point_cosine_names_bad_temperatures():
    with pytest.raises(ValueError, match="temperatures"):
        head_count_point({**POINT, "kernel": "cosine", "temperatures": [0.1, -1.0]}, seed=0)
    with pytest.raises(ValueError, match="replicates_fit"):
        head_count_point({**POINT, "kernel": "cosine", "replicates_fit": 1}, seed=0)


# --- selection on one half, tests on the other ------------------------------------------------


def test_series_halves_split_the_replicates(fake_sweep):
    full = fake_sweep.series("local", "exp", "fitted", 2)
    first = fake_sweep.series("local", "exp", "fitted", 2, half="select")
    second = fake_sweep.series("local", "exp", "fitted", 2, half="test")
    assert first.shape[0] == full.shape[0] // 2
    torch.testing.assert_close(torch.cat([first, second]), full)
    with pytest.raises(ValueError, match="half"):
        fake_sweep.series("local", "exp", "fitted", 2, half="train")


def _mean_se(d):
    d = np.asarray(d, dtype=float)
    return d.mean(), d.std(ddof=1) / math.sqrt(d.size)


def test_many_heads_tests_against_explicit_loops(fake_sweep):
    case = ("additive", "cosine", "uniform")
    arr = fake_sweep.errors[(*case[:2], 64, case[2])]  # (head dims, R)
    dims, split = fake_sweep.head_dims, arr.shape[1] // 2
    r = many_heads_tests(fake_sweep, *case)
    sel_means = arr[:, :split].mean(1)
    assert r.selected == dims[int(np.argmin(sel_means[:-1]))]
    assert r.best == dims[int(np.argmin(sel_means))]
    assert r.selected_above_one == dims[1 + int(np.argmin(sel_means[1:]))]
    for got, diff in (
        (r.extreme, arr[-1] - arr[0]),
        (r.optimum_many, arr[-1, split:] - arr[dims.index(r.selected), split:]),
        (r.one_vs_selected, arr[0, split:] - arr[dims.index(r.selected_above_one), split:]),
    ):
        assert (got.estimate, got.se) == pytest.approx(_mean_se(diff), rel=1e-12)
    for got, a in zip(r.monotone, range(len(dims) - 1), strict=True):
        b = a + 1
        assert (got.estimate, got.se) == pytest.approx(_mean_se(arr[b] - arr[a]), rel=1e-12)
    assert [c.estimate for c in r.one_head_vs_each] == pytest.approx([(arr[-1] - arr[i]).mean() for i in range(3)])
    zero = fake_sweep.zero_error[(case[0], case[1], 64)]
    gain = 100 * (1 - arr[dims.index(r.best), split:] / zero)
    assert (r.beats_zero.estimate, r.beats_zero.se) == pytest.approx(_mean_se(gain), rel=1e-12)


# --- C9's reading with the head's own dimension, and the dot-product kernel's effective size ---


@pytest.mark.parametrize("log_n", [5.0, 20.0, 200.0])
def test_own_dimension_optimum_against_a_grid_and_the_first_order_condition(log_n):
    k = own_dimension_optimum(log_n, b=2.0, c=0.5)
    grid_k = np.linspace(1.0, 5 * max(k, 2.0), 200001)
    log_risk = np.logaddexp(math.log(2.0) - 2 * np.log(grid_k), math.log(0.5) + grid_k / 2 * np.log(grid_k) - log_n)
    assert k == pytest.approx(grid_k[np.argmin(log_risk)], abs=1e-3 * max(k, 1.0))
    # dR/dk = 0: log n = log(c/(4b)) + (k/2 + 3) log k + log(log k + 1)
    assert math.log(0.5 / 8.0) + (k / 2 + 3) * math.log(k) + math.log(math.log(k) + 1) == pytest.approx(log_n, rel=1e-6)


def test_own_dimension_optimum_grows_like_2_log_n_over_log_log_n():
    ratios = [own_dimension_optimum(ln) / (2 * ln / math.log(ln)) for ln in (1e2, 1e3, 1e4, 1e5)]
    assert all(0.9 < r < 1.3 for r in ratios)  # logarithmic order, the log log corrections still visible
    with pytest.raises(ValueError, match="log_n"):
        own_dimension_optimum(0.0)


def test_dot_product_effective_size_matches_kish_and_the_closed_form():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(200_000, 2, generator=g, dtype=torch.float64)
    z = torch.tensor([[0.5, 0.3], [0.0, 0.8]], dtype=torch.float64)
    ess = dot_product_effective_size(z, keys, temperature=1.0)
    w = torch.exp(z @ keys.T)
    torch.testing.assert_close(ess, w.sum(1) ** 2 / (w**2).sum(1))  # Kish's formula, directly
    expected = keys.shape[0] * torch.exp(-(z**2).sum(1))  # n e^(-t^2 |z|^2) on a Gaussian design
    torch.testing.assert_close(ess, expected, rtol=0.03, atol=0.0)
    # integrated over queries z ~ N(0, 1) at t^2 = 1/8: E n/n_eff = (1 - 2 t^2)^(-1/2) = (3/4)^(-1/2) (proposition,
    # part 3; at t^2 = 1/4 the Monte Carlo mean would have infinite variance)
    zq = torch.randn(2000, 1, generator=g, dtype=torch.float64)
    inv = 40_000 / dot_product_effective_size(zq, keys[:40_000, :1], temperature=math.sqrt(1 / 8))
    assert float(inv.mean()) == pytest.approx((3 / 4) ** -0.5, rel=0.03)


# --- published architectures: deduplication, lineages, cluster bootstrap ----------------------


def test_deduplicated_by_brute_force(tmp_path):
    csv = tmp_path / "arch.csv"
    csv.write_text(
        "family,lineage,d_model,n_heads,d_head,n_kv_heads\n"
        "A,L1,512,8,64,8\nA2,L1,512,8,64,8\nA2,L1,1024,16,64,4\nB,L2,512,8,64,8\nB,L2,1024,16,64,8\n"
    )
    arch = published_architectures(csv)
    rows = deduplicated(arch, "n_heads")
    seen, expected = set(), []
    for i, r in arch.iterrows():
        key = (r.lineage, r.d_model, r.n_heads)
        if key not in seen:
            seen.add(key)
            expected.append(i)
    assert rows.index.tolist() == expected == [0, 2, 3, 4]
    with pytest.raises(ValueError, match="column"):
        deduplicated(arch, "d_model")


def test_cluster_bootstrap_slope_against_a_loop():
    rng = np.random.default_rng(1)
    x = np.log(np.array([256, 512, 1024, 2048, 512, 1024, 4096, 8192, 768, 1536.0]))
    y = 0.7 * x + rng.normal(0, 0.2, x.size)
    clusters = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    fit = cluster_bootstrap_slope(x, y, clusters, bootstrap=300, seed=7)
    ref_rng, members, slopes = np.random.default_rng(7), {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7], "c": [8, 9]}, []
    while len(slopes) < 300:
        rows = [i for c in ref_rng.integers(0, 3, 3) for i in members["abc"[c]]]
        if len(set(x[rows])) < 2:
            continue
        slopes.append(np.polyfit(x[rows], y[rows], 1)[0])
    assert fit.se == pytest.approx(np.std(slopes, ddof=1), rel=1e-9)
    ref_slope, ref_se = _ols_slope_se(x, y)
    assert fit.slope == pytest.approx(ref_slope, rel=1e-12) and fit.se_iid == pytest.approx(ref_se, rel=1e-10)
    assert (fit.df, fit.rows, fit.clusters) == (2.0, 10, 3)
    with pytest.raises(ValueError, match="clusters"):
        cluster_bootstrap_slope(x, y, ["a"] * 10, bootstrap=10, seed=0)
