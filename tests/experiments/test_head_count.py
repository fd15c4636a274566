"""Tests of nwlib.experiments.head_count: the head-count targets, heads on coordinate blocks, their floors, one grid point."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from nwlib import replicate_mse, simulate
from nwlib.experiments.head_count import (
    approximation_error,
    block_conditional_mean,
    block_projections,
    divisor_head_dims,
    head_count_point,
    head_count_task,
    target_variance,
)

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
