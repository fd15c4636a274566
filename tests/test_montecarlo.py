"""Tests of nwlib.montecarlo.simulate against explicit per-replicate, per-head references."""

from __future__ import annotations

import math

import pytest
import torch

from nwlib import decompose, make_task, nadaraya_watson_weights, simulate
from nwlib.montecarlo import DATA_BLOCK, bytes_per_replicate

D, H, DK, M, N, R = 5, 3, 2, 6, 40, 37  # R spans three data blocks


def _setup(dtype, device, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    task = make_task("subspace", D, signal_dim=2, noise_sd=0.3)
    w = torch.randn(H, D, DK, generator=g, dtype=dtype, device=device) / math.sqrt(D)
    z = torch.randn(M, D, generator=g, dtype=dtype, device=device)
    return task, w, z


def _reference(task, w_k, w_q, z, *, n, replicates, seed, kernel, bandwidth, head_data):
    """Redraw the documented data stream (seeded blocks) and apply explicit NW weight matrices head by head."""
    device, dtype = z.device, z.dtype
    blocks = -(-replicates // DATA_BLOCK)
    seeds = torch.randint(0, 2**62, (blocks,), generator=torch.Generator(device).manual_seed(seed),
                          device=device).tolist()
    draw = (w_k.shape[0],) if head_data == "independent" else ()
    xs, ys = [], []
    for b in range(blocks):
        size = min(DATA_BLOCK, replicates - b * DATA_BLOCK)
        x, y = task.sample((size, *draw), n, generator=torch.Generator(device).manual_seed(seeds[b]), dtype=dtype)
        xs.append(x)
        ys.append(y)
    x_all, y_all = torch.cat(xs), torch.cat(ys)
    out = torch.empty(replicates, w_k.shape[0], z.shape[0], dtype=torch.float64)
    for r in range(replicates):
        x, y = x_all[r], y_all[r]
        for h in range(w_k.shape[0]):
            xh, yh = (x[h], y[h]) if head_data == "independent" else (x, y)
            bw = bandwidth[h] if isinstance(bandwidth, torch.Tensor) else bandwidth
            bw = float(bw) if bw is not None else None
            weights = nadaraya_watson_weights(
                (z @ w_q[h]).double(), (xh @ w_k[h]).double(), kernel=kernel, bandwidth=bw
            )
            out[r, h] = (weights @ yh.double()).cpu()
    return out


@pytest.mark.parametrize("kernel, bandwidth", [("gaussian", 0.7), ("exp", None)])
@pytest.mark.parametrize("head_data", ["shared", "independent"])
def test_matches_explicit_reference(kernel, bandwidth, head_data, dtype, device, tol):
    task, w, z = _setup(dtype, device)
    out = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator(device).manual_seed(9),
                   kernel=kernel, bandwidth=bandwidth, head_data=head_data, chunk_size=3)
    assert out.shape == (R, H, M) and out.dtype == dtype and out.device == z.device
    ref = _reference(task, w, w, z, n=N, replicates=R, seed=9, kernel=kernel, bandwidth=bandwidth,
                     head_data=head_data)
    torch.testing.assert_close(out.cpu().double(), ref, **tol)


def test_query_projections_and_per_head_bandwidth(dtype, device, tol):
    task, w, z = _setup(dtype, device)
    w_q = torch.randn(H, D, DK, generator=torch.Generator(device).manual_seed(1), dtype=dtype, device=device)
    bw = torch.tensor([0.5, 0.8, 1.3], dtype=dtype, device=device)
    out = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator(device).manual_seed(2),
                   bandwidth=bw, query_projections=w_q)
    ref = _reference(task, w, w_q, z, n=N, replicates=R, seed=2, kernel="gaussian", bandwidth=bw,
                     head_data="shared")
    torch.testing.assert_close(out.cpu().double(), ref, **tol)


def test_default_gaussian_bandwidth_is_scott_rule_in_projected_space(dtype, device):
    task, w, z = _setup(dtype, device)
    sigma = torch.sqrt((w ** 2).sum(dim=(1, 2)) / DK)
    explicit = sigma * N ** (-1 / (DK + 4))
    kw = dict(n=N, replicates=R, kernel="gaussian")
    a = simulate(task, w, z, generator=torch.Generator(device).manual_seed(3), **kw)
    b = simulate(task, w, z, generator=torch.Generator(device).manual_seed(3), bandwidth=explicit, **kw)
    assert torch.equal(a, b)


def test_seeded_runs_reproduce_bit_for_bit_and_ignore_chunking(dtype):
    task, w, z = _setup(dtype, torch.device("cpu"))
    runs = [
        simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(4), chunk_size=c)
        for c in (None, None, 1, 5, 16, 21)
    ]
    assert torch.equal(runs[0], runs[1])
    # Data do not depend on the chunking; the arithmetic is batched differently, so
    # allow rounding only.
    for other in runs[2:]:
        torch.testing.assert_close(other, runs[0], rtol=0, atol=10 * torch.finfo(dtype).eps)
    tiny = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(4),
                    memory_budget=1)
    torch.testing.assert_close(tiny, runs[0], rtol=0, atol=10 * torch.finfo(dtype).eps)
    other_seed = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(5))
    assert not torch.allclose(other_seed, runs[0])


def test_float32_and_float64_agree_within_monte_carlo_error():
    task, w64, z64 = _setup(torch.float64, torch.device("cpu"))
    results = {}
    for dtype in (torch.float32, torch.float64):
        w, z = w64.to(dtype), z64.to(dtype)
        p = simulate(task, w, z, n=200, replicates=400, generator=torch.Generator().manual_seed(6))
        results[dtype] = decompose(p, task.f(z)).integrated()
    a, b = results[torch.float32], results[torch.float64]
    for name in ("mse", "bias_sq", "variance", "covariance"):
        se = math.hypot(getattr(a, name + "_se"), getattr(b, name + "_se"))
        assert abs(getattr(a, name) - getattr(b, name)) < 4 * se, name


def test_identical_heads_shared_data_are_perfectly_correlated():
    task, w, z = _setup(torch.float64, torch.device("cpu"))
    same = w[:1].expand(H, D, DK).contiguous()
    p = simulate(task, same, z, n=N, replicates=50, generator=torch.Generator().manual_seed(7))
    assert torch.equal(p[:, 0], p[:, 1]) and torch.equal(p[:, 0], p[:, 2])
    integ = decompose(p, task.f(z)).integrated()
    assert math.isclose(integ.mean_correlation, 1.0, rel_tol=1e-9)


def test_independent_data_decorrelate_identical_heads():
    task, w, z = _setup(torch.float64, torch.device("cpu"))
    same = w[:1].expand(H, D, DK).contiguous()
    p = simulate(task, same, z, n=N, replicates=400, generator=torch.Generator().manual_seed(8),
                 head_data="independent")
    integ = decompose(p, task.f(z)).integrated()
    # Independent training sets: correlation 0 up to its sampling error of about 1/sqrt(R).
    assert abs(integ.mean_correlation) < 4 / math.sqrt(400)
    assert not torch.equal(p[:, 0], p[:, 1])


def test_shared_data_do_not_depend_on_number_of_heads(dtype):
    """Head h of an H-head run equals a one-head run with W_h: the replicates' data are shared."""
    task, w, z = _setup(dtype, torch.device("cpu"))
    full = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(10), bandwidth=0.6)
    one = simulate(task, w[1:2], z, n=N, replicates=R, generator=torch.Generator().manual_seed(10),
                   bandwidth=0.6)
    torch.testing.assert_close(one[:, 0], full[:, 1], rtol=0, atol=10 * torch.finfo(dtype).eps)


def test_progress_bar_runs(capsys):
    task, w, z = _setup(torch.float32, torch.device("cpu"))
    simulate(task, w, z, n=N, replicates=3, generator=torch.Generator().manual_seed(0), progress=True)
    assert "simulate" in capsys.readouterr().err


def test_bytes_per_replicate_formula():
    assert bytes_per_replicate(8, 2048, 256, 16, 4, head_data="shared", itemsize=4) == 4 * (
        2 * 2048 * 16 + 8 * 8 * (2048 + 256) * 4
    )
    shared = bytes_per_replicate(8, 100, 10, 16, 4, head_data="shared", itemsize=8)
    independent = bytes_per_replicate(8, 100, 10, 16, 4, head_data="independent", itemsize=8)
    assert independent - shared == 8 * 2 * 100 * 16 * 7


def _bad_cases():
    f32 = torch.float32
    return [
        ({"task": "isotropic"}, TypeError, "task"),
        ({"key_projections": torch.zeros(D, DK)}, ValueError, "key_projections"),
        ({"key_projections": torch.zeros(H, D + 1, DK)}, ValueError, "key_projections"),
        ({"key_projections": torch.zeros(H, D, DK, dtype=torch.float64)}, TypeError, "key_projections"),
        ({"key_projections": torch.full((H, D, DK), float("nan"))}, ValueError, "key_projections"),
        ({"eval_points": torch.zeros(M, D + 1)}, ValueError, "eval_points"),
        ({"eval_points": torch.zeros(M)}, ValueError, "eval_points"),
        ({"eval_points": torch.zeros(M, D, dtype=torch.int64)}, TypeError, "eval_points"),
        ({"query_projections": torch.zeros(H, D, DK + 1)}, ValueError, "query_projections"),
        ({"n": 0}, ValueError, r"^n must"),
        ({"replicates": 2.5}, TypeError, "replicates"),
        ({"generator": 3}, TypeError, "generator"),
        ({"kernel": "box"}, ValueError, "kernel"),
        ({"bandwidth": -1.0}, ValueError, "bandwidth"),
        ({"bandwidth": torch.ones(H + 1, dtype=f32)}, ValueError, "bandwidth"),
        ({"bandwidth": torch.ones(H, dtype=torch.float64)}, TypeError, "bandwidth"),
        ({"head_data": "per_head"}, ValueError, "head_data"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"memory_budget": 0}, ValueError, "memory_budget"),
    ]


@pytest.mark.parametrize("override, exc, match", _bad_cases())
def test_bad_input_is_rejected(override, exc, match):
    task, w, z = _setup(torch.float32, torch.device("cpu"))
    args = dict(task=task, key_projections=w, eval_points=z, n=N, replicates=R,
                generator=torch.Generator().manual_seed(0))
    args.update(override)
    with pytest.raises(exc, match=match):
        simulate(args.pop("task"), args.pop("key_projections"), args.pop("eval_points"), **args)
