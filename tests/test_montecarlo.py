"""Tests of nwlib.montecarlo.simulate against explicit per-replicate, per-head references."""

from __future__ import annotations

import math

import pytest
import torch

from nwlib import decompose, make_task, nadaraya_watson_weights, simulate
from nwlib.montecarlo import DATA_BLOCK, KERNEL_WORKSPACE, fused_attention_available, memory_estimate

D, H, DK, M, N, R = 5, 3, 2, 6, 40, 37  # R spans three data blocks


def _setup(dtype, device, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    task = make_task("subspace", D, signal_dim=2, noise_sd=0.3)
    w = torch.randn(H, D, DK, generator=g, dtype=dtype, device=device) / math.sqrt(D)
    z = torch.randn(M, D, generator=g, dtype=dtype, device=device)
    return task, w, z


def _reference(task, w_k, w_q, z, *, n, replicates, seed, kernel, bandwidth, head_data, w_v=None):
    """Redraw the documented data stream (seeded blocks) and apply explicit NW weight matrices head by head."""
    device, dtype = z.device, z.dtype
    blocks = -(-replicates // DATA_BLOCK)
    seeds = torch.randint(
        0, 2**62, (blocks,), generator=torch.Generator(device).manual_seed(seed), device=device
    ).tolist()
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
            vh = yh.double() if w_v is None else torch.cat([xh, yh[:, None]], -1).double() @ w_v[h].double()
            out[r, h] = (weights @ vh).cpu()
    return out


@pytest.mark.parametrize("kernel, bandwidth", [("gaussian", 0.7), ("exp", None)])
@pytest.mark.parametrize("head_data", ["shared", "independent"])
def test_matches_explicit_reference(kernel, bandwidth, head_data, dtype, device, tol):
    task, w, z = _setup(dtype, device)
    out = simulate(
        task,
        w,
        z,
        n=N,
        replicates=R,
        generator=torch.Generator(device).manual_seed(9),
        kernel=kernel,
        bandwidth=bandwidth,
        head_data=head_data,
        chunk_size=3,
    )
    assert out.shape == (R, H, M) and out.dtype == dtype and out.device == z.device
    ref = _reference(task, w, w, z, n=N, replicates=R, seed=9, kernel=kernel, bandwidth=bandwidth, head_data=head_data)
    torch.testing.assert_close(out.cpu().double(), ref, **tol)


def test_query_projections_and_per_head_bandwidth(dtype, device, tol):
    task, w, z = _setup(dtype, device)
    w_q = torch.randn(H, D, DK, generator=torch.Generator(device).manual_seed(1), dtype=dtype, device=device)
    bw = torch.tensor([0.5, 0.8, 1.3], dtype=dtype, device=device)
    out = simulate(
        task,
        w,
        z,
        n=N,
        replicates=R,
        generator=torch.Generator(device).manual_seed(2),
        bandwidth=bw,
        query_projections=w_q,
    )
    ref = _reference(task, w, w_q, z, n=N, replicates=R, seed=2, kernel="gaussian", bandwidth=bw, head_data="shared")
    torch.testing.assert_close(out.cpu().double(), ref, **tol)


@pytest.mark.parametrize("head_data", ["shared", "independent"])
def test_attention_model_head_specific_values_and_dot_product_kernel(head_data, dtype, device, tol):
    """Attention's own model: exp kernel, W_Q != W_K, unnormalised keys, values W_V^h (x, y)."""
    task, w, z = _setup(dtype, device)
    g = torch.Generator(device).manual_seed(12)
    w_k = 1.7 * w  # unnormalised: the dot-product kernel sees the key norms
    w_q = torch.randn(H, D, DK, generator=g, dtype=dtype, device=device) / math.sqrt(D)
    w_v = torch.randn(H, D + 1, generator=g, dtype=dtype, device=device)
    out = simulate(
        task,
        w_k,
        z,
        n=N,
        replicates=R,
        generator=torch.Generator(device).manual_seed(13),
        kernel="exp",
        query_projections=w_q,
        value_projections=w_v,
        head_data=head_data,
        chunk_size=7,
    )
    ref = _reference(
        task, w_k, w_q, z, n=N, replicates=R, seed=13, kernel="exp", bandwidth=None, head_data=head_data, w_v=w_v
    )
    torch.testing.assert_close(out.cpu().double(), ref, **tol)
    with pytest.raises(ValueError, match="value_projections"):
        simulate(
            task,
            w_k,
            z,
            n=N,
            replicates=2,
            generator=torch.Generator(device).manual_seed(0),
            value_projections=w_v[:, :D],
        )


def test_default_gaussian_bandwidth_is_scott_rule_in_projected_space(dtype, device):
    task, w, z = _setup(dtype, device)
    sigma = torch.sqrt((w**2).sum(dim=(1, 2)) / DK)
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
    tiny = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(4), memory_budget=1)
    torch.testing.assert_close(tiny, runs[0], rtol=0, atol=10 * torch.finfo(dtype).eps)
    other_seed = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(5))
    assert not torch.allclose(other_seed, runs[0])


def test_float32_and_float64_runs_are_paired():
    """One seed, two dtypes: the same training sets, so the runs differ by rounding only.

    Both the predictions and the decomposition agree far inside the Monte Carlo
    error (which an unpaired comparison would need as its tolerance).
    """
    task, w64, z64 = _setup(torch.float64, torch.device("cpu"))
    runs = {
        dtype: simulate(
            task, w64.to(dtype), z64.to(dtype), n=200, replicates=400, generator=torch.Generator().manual_seed(6)
        )
        for dtype in (torch.float32, torch.float64)
    }
    torch.testing.assert_close(runs[torch.float32].double(), runs[torch.float64], rtol=1e-4, atol=1e-4)
    target = task.f(z64)
    a = decompose(runs[torch.float32].double(), target).integrated()
    b = decompose(runs[torch.float64], target).integrated()
    for name in ("mse", "bias_sq", "variance", "covariance"):
        paired_gap = abs(getattr(a, name) - getattr(b, name))
        assert paired_gap < 1e-3 * getattr(b, name + "_se") + 1e-6, name


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
    p = simulate(
        task, same, z, n=N, replicates=400, generator=torch.Generator().manual_seed(8), head_data="independent"
    )
    integ = decompose(p, task.f(z)).integrated()
    # Independent training sets: correlation 0 up to its sampling error of about 1/sqrt(R).
    assert abs(integ.mean_correlation) < 4 / math.sqrt(400)
    assert not torch.equal(p[:, 0], p[:, 1])


def test_shared_data_do_not_depend_on_number_of_heads(dtype):
    """Head h of an H-head run equals a one-head run with W_h: the replicates' data are shared."""
    task, w, z = _setup(dtype, torch.device("cpu"))
    full = simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(10), bandwidth=0.6)
    one = simulate(task, w[1:2], z, n=N, replicates=R, generator=torch.Generator().manual_seed(10), bandwidth=0.6)
    torch.testing.assert_close(one[:, 0], full[:, 1], rtol=0, atol=10 * torch.finfo(dtype).eps)


def test_progress_bar_runs(capsys):
    task, w, z = _setup(torch.float32, torch.device("cpu"))
    simulate(task, w, z, n=N, replicates=3, generator=torch.Generator().manual_seed(0), progress=True)
    assert "simulate" in capsys.readouterr().err


def test_memory_estimate_parts():
    sizes = dict(num_heads=8, n=2048, m=256, embed_dim=16, head_dim=4, replicates=100)
    est = memory_estimate(chunk_size=4, **sizes)
    assert est.total == sum(est.parts.values()) and est.fused
    assert est.parts["predictions"] == 4 * 100 * 8 * 256
    assert est.parts["data blocks"] == 2 * 4 * 16 * 2048 * 17
    assert est.parts["draw (float64)"] == 8 * 16 * 2048 * (2 * 16 + 3)
    assert est.parts["kernel workspace"] == KERNEL_WORKSPACE
    # Linear in the chunk size, and only the predictions grow with R.
    step = memory_estimate(chunk_size=5, **sizes).total - est.total
    assert memory_estimate(chunk_size=9, **sizes).total - est.total == 5 * step
    more = memory_estimate(chunk_size=4, **{**sizes, "replicates": 1000})
    assert more.total - est.total == 4 * 900 * 8 * 256
    # Independent head data draw H training sets per replicate.
    indep = memory_estimate(chunk_size=4, head_data="independent", **sizes)
    assert indep.parts["data blocks"] == 8 * est.parts["data blocks"]


def test_memory_estimate_counts_the_fallback_where_no_fused_kernel_applies():
    assert fused_attention_available(torch.float32, "cuda") and not fused_attention_available(torch.float64, "cuda")
    sizes = dict(num_heads=2, n=100, m=50, embed_dim=4, head_dim=2, replicates=10, chunk_size=3)
    cuda64 = memory_estimate(dtype=torch.float64, device="cuda", **sizes)
    assert not cuda64.fused and cuda64.parts["attention weights (fallback)"] == 3 * 8 * 3 * 2 * 50 * 100
    assert "attention weights (fallback)" not in memory_estimate(dtype=torch.float64, **sizes).parts


def test_default_chunk_fits_the_budget():
    task, w, z = _setup(torch.float32, torch.device("cpu"))
    sizes = dict(num_heads=H, n=N, m=M, embed_dim=D, head_dim=DK, replicates=R)
    at = {c: memory_estimate(chunk_size=c, **sizes).total for c in (5, 6)}
    budget = (at[5] + at[6]) // 2  # room for 5 replicates per chunk, not 6
    calls = []
    import nwlib.montecarlo as mc

    original = mc.nadaraya_watson
    try:
        mc.nadaraya_watson = lambda q, k, v, **kw: calls.append(k.shape[0]) or original(q, k, v, **kw)
        simulate(task, w, z, n=N, replicates=R, generator=torch.Generator().manual_seed(0), memory_budget=budget)
    finally:
        mc.nadaraya_watson = original
    assert max(calls) == 5 and sum(calls) == R


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
    args = dict(
        task=task, key_projections=w, eval_points=z, n=N, replicates=R, generator=torch.Generator().manual_seed(0)
    )
    args.update(override)
    with pytest.raises(exc, match=match):
        simulate(args.pop("task"), args.pop("key_projections"), args.pop("eval_points"), **args)
