"""loo_cv_score and select_bandwidth against brute-force leave-one-out loops and statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nwlib.bandwidth import BandwidthSelection, loo_cv_score, select_bandwidth


def brute_force_loo(x: np.ndarray, y: np.ndarray, h: float, kernel: str = "gaussian") -> float:
    """(1/n) Σ_i ‖y_i − f̂_{−i}(x_i)‖² by an explicit loop over i, in float64 numpy.

    x: (n, d), y: (n,) or (n, p). Each f̂_{−i} is the textbook NW estimate from the
    other n − 1 points, with direct differences and a max-subtracted softmax.
    """
    y = y.reshape(len(y), -1)
    total = 0.0
    for i in range(len(x)):
        others = np.arange(len(x)) != i
        if kernel == "gaussian":
            logits = -((x[others] - x[i]) ** 2).sum(-1) / (2 * h * h)
        else:
            logits = x[others] @ x[i] / (h * h)
        w = np.exp(logits - logits.max())
        total += ((y[i] - (w / w.sum()) @ y[others]) ** 2).sum()
    return total / len(x)


def uniform_data(generator, device, batch, n, d, p):
    """x ~ U(-2, 2)^d (no isolated points, see the float32 note in nwlib.bandwidth), noisy smooth y."""
    x = 4 * torch.rand(*batch, n, d, generator=generator, device=device, dtype=torch.float64) - 2
    noise = torch.randn(*batch, n, p, generator=generator, device=device, dtype=torch.float64)
    y = torch.sin(2 * x[..., :1]) + x[..., -1:] ** 2 / 2 + 0.3 * noise
    return x, y


# float32: the leave-one-out step divides by the other points' weight share 1 − 2p_i,
# which amplifies the rounding of the logits (module docstring); on these data
# (share >= 0.05, |s_ii| <= 50) that bounds the relative error near 1e-4 per point.
SCORE_TOL = {torch.float32: {"rtol": 3e-4, "atol": 1e-6}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}


@pytest.mark.parametrize(
    "kernel,bandwidths", [("gaussian", [0.35, 0.6, 1.5]), ("exp", [0.9, 1.5, 3.0])], ids=["gaussian", "exp"]
)
@pytest.mark.parametrize("p", [None, 2], ids=["scalar", "vector"])
def test_score_matches_brute_force_loop(device, dtype, generator, kernel, bandwidths, p):
    x, y = uniform_data(generator, device, (3,), n=50, d=2, p=p or 1)
    y = y[..., 0] if p is None else y
    h = torch.tensor(bandwidths, device=device, dtype=dtype)  # one bandwidth per head
    score = loo_cv_score(x.to(dtype), y.to(dtype), h, kernel=kernel)
    ref = [brute_force_loo(x[b].cpu().numpy(), y[b].cpu().numpy(), bandwidths[b], kernel) for b in range(3)]
    assert score.shape == (3,) and score.dtype == dtype and score.device == x.device
    torch.testing.assert_close(score, torch.tensor(ref, device=device, dtype=dtype), **SCORE_TOL[dtype])


def test_float_and_tensor_bandwidths_agree_and_broadcast(device, dtype, generator):
    x, y = uniform_data(generator, device, (2,), n=40, d=1, p=1)
    x, y = x.to(dtype), y[..., 0].to(dtype)
    grid = torch.tensor([0.2, 0.5, 1.0, 3.0], device=device, dtype=dtype)
    scores = loo_cv_score(x, y, grid[:, None])  # (c, 1) against heads (2,): (c, 2)
    assert scores.shape == (4, 2)
    for i, h in enumerate(grid.tolist()):
        torch.testing.assert_close(scores[i], loo_cv_score(x, y, h), **SCORE_TOL[dtype])
        torch.testing.assert_close(scores[i], loo_cv_score(x, y, grid[i]), **SCORE_TOL[dtype])


def brute_force_loo_torch(x: torch.Tensor, y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Differentiable brute force: the (n, n) Gaussian logits with the diagonal removed."""
    logits = -((x[..., :, None, :] - x[..., None, :, :]) ** 2).sum(-1) / (2 * h[..., None, None] ** 2)
    eye = torch.eye(x.shape[-2], dtype=torch.bool, device=x.device)
    w = torch.softmax(logits.masked_fill(eye, -math.inf), dim=-1)
    return ((y - w @ y) ** 2).sum(-1).mean(-1)


def test_score_is_differentiable_in_the_bandwidth(device, generator):
    x, y = uniform_data(generator, device, (2,), n=12, d=2, p=2)
    h = torch.tensor([0.5, 0.9], device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: loo_cv_score(x, y, h), (h,))
    (grad,) = torch.autograd.grad(loo_cv_score(x, y, h).sum(), h)
    (ref,) = torch.autograd.grad(brute_force_loo_torch(x, y, h).sum(), h)
    torch.testing.assert_close(grad, ref, rtol=1e-8, atol=1e-12)
    h0 = torch.tensor(0.7, device=device, dtype=torch.float64, requires_grad=True)  # 0-dim too
    assert torch.autograd.gradcheck(lambda h: loo_cv_score(x[0], y[0], h), (h0,))


def test_isolated_point_gives_inf_score_and_finite_gradient(device, dtype):
    # The point at 10 has no neighbour with weight at h = 0.05: its leave-one-out
    # estimate is undefined, so the score is +inf (documented); the other bandwidth is fine.
    x = torch.tensor([[0.0], [0.1], [0.2], [10.0]], device=device, dtype=dtype)
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device, dtype=dtype)
    h = torch.tensor([0.05, 20.0], device=device, dtype=dtype, requires_grad=True)
    score = loo_cv_score(x, y, h)
    assert math.isinf(score[0].item()) and score[0] > 0
    ref = brute_force_loo(x.double().cpu().numpy(), y.double().cpu().numpy(), 20.0)
    torch.testing.assert_close(score[1].double().cpu(), torch.tensor(ref, dtype=torch.float64), **SCORE_TOL[dtype])
    score[1].backward()
    assert torch.isfinite(h.grad).all()


def test_selection_matches_statsmodels_cv_ls(dtype):
    """statsmodels' least-squares CV of the local-constant Gaussian KernelReg (h = the kernel's SD)."""
    from statsmodels.nonparametric.kernel_regression import KernelReg

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, 300)
    y = np.sin(2 * x) + 0.3 * rng.normal(size=300)
    h_sm = float(KernelReg(endog=y, exog=x, var_type="c", reg_type="lc", ckertype="gaussian", bw="cv_ls").bw[0])
    sel = select_bandwidth(torch.from_numpy(x[:, None]).to(dtype), torch.from_numpy(y).to(dtype))
    h_nw = sel.bandwidth.item()
    # The curve is flat at its minimum (±15 % in h moves the score by about 0.1 %), so two
    # optimisers legitimately differ in h; 5 % is well inside that plateau.
    assert h_nw == pytest.approx(h_sm, rel=0.05)
    # What must hold is the score: ours is no worse than statsmodels' (brute force at both).
    score_nw = brute_force_loo(x[:, None], y, h_nw)
    score_sm = brute_force_loo(x[:, None], y, h_sm)
    assert score_nw <= score_sm * (1 + 64 * torch.finfo(dtype).eps)
    torch.testing.assert_close(sel.score.double(), torch.tensor(score_nw, dtype=torch.float64), **SCORE_TOL[dtype])


def test_two_dimensional_common_bandwidth_matches_brute_force_grid(device, dtype, generator):
    x, y = uniform_data(generator, device, (), n=150, d=2, p=1)
    sel = select_bandwidth(x.to(dtype), y[:, 0].to(dtype))
    xn, yn = x.cpu().numpy(), y[:, 0].cpu().numpy()
    grid = np.geomspace(0.1, 1.5, 161)  # spacing 1.7 % in h
    scores = np.array([brute_force_loo(xn, yn, h) for h in grid])
    best = scores.argmin()
    assert 0 < best < len(grid) - 1, "the brute-force minimum must be inside the grid"
    # A refined minimiser lies within one grid spacing of the grid's best point.
    spacing = math.log(grid[1] / grid[0])
    assert abs(math.log(sel.bandwidth.item() / grid[best])) <= 1.01 * spacing
    assert brute_force_loo(xn, yn, sel.bandwidth.item()) <= scores[best] * (1 + 64 * torch.finfo(dtype).eps)


def test_heads_give_the_same_results_as_a_loop(device, dtype, generator):
    x, y = uniform_data(generator, device, (3,), n=60, d=2, p=1)
    x, y = x.to(dtype), y[..., 0].to(dtype)
    sel = select_bandwidth(x, y)
    assert isinstance(sel, BandwidthSelection)
    assert sel.bandwidth.shape == (3,) and sel.score.shape == (3,)
    assert sel.candidates.shape == (3, 25) and sel.scores.shape == (3, 25)
    for b in range(3):
        one = select_bandwidth(x[b], y[b])
        for field in ("bandwidth", "score", "candidates", "scores"):
            torch.testing.assert_close(getattr(sel, field)[b], getattr(one, field), **SCORE_TOL[dtype])


def test_default_grid_is_documented_multiple_of_scott(device, dtype, generator):
    x, y = uniform_data(generator, device, (2,), n=80, d=3, p=1)
    sel = select_bandwidth(x.to(dtype), y[..., 0].to(dtype), num_candidates=7, refine_steps=0)
    xn = x.cpu().numpy()
    sigma = np.sqrt(xn.var(axis=-2, ddof=1).mean(-1))
    scott = sigma * 80 ** (-1 / (3 + 4))
    ref = scott[:, None] * np.geomspace(0.05, 5, 7)
    torch.testing.assert_close(sel.candidates, torch.tensor(ref, device=device, dtype=dtype), **SCORE_TOL[dtype])
    torch.testing.assert_close(sel.scores, loo_cv_score(x.to(dtype), y[..., 0].to(dtype), sel.candidates.mT).mT)
    # Without refinement the selection is the grid's best point.
    best = sel.scores.argmin(-1, keepdim=True)
    torch.testing.assert_close(sel.bandwidth, sel.candidates.gather(-1, best)[..., 0])


def test_refinement_and_chunking(device, generator):
    x, y = uniform_data(generator, device, (2,), n=60, d=1, p=1)
    y = y[..., 0]
    coarse = select_bandwidth(x, y, refine_steps=0)
    fine = select_bandwidth(x, y)
    assert torch.all(fine.score <= coarse.score)
    assert torch.all(fine.score < coarse.score), "refinement should improve on a 25-point grid"
    # A budget that fits one candidate per call scores the grid chunk by chunk: same results.
    chunked = select_bandwidth(x, y, memory_budget=1)
    for field in ("bandwidth", "score", "scores"):
        torch.testing.assert_close(getattr(chunked, field), getattr(fine, field), rtol=1e-12, atol=1e-14)


def test_given_candidates_are_sorted_and_shared_by_heads(device, generator):
    x, y = uniform_data(generator, device, (2,), n=40, d=1, p=1)
    y = y[..., 0]
    candidates = torch.tensor([0.8, 0.1, 0.4, 0.2], device=device, dtype=torch.float64, requires_grad=True)
    sel = select_bandwidth(x.requires_grad_(True), y, candidates=candidates, refine_steps=0)
    assert not any(t.requires_grad for t in sel), "the selection is documented as detached"
    assert sel.candidates.shape == (2, 4)
    torch.testing.assert_close(sel.candidates[0], candidates.sort().values)
    torch.testing.assert_close(sel.scores, torch.stack([loo_cv_score(x, y, h) for h in sel.candidates[0]], -1))


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda x, y: select_bandwidth(x, y, method="gcv"), ValueError, "method"),
        (lambda x, y: select_bandwidth(x, y, method=None), TypeError, "method"),
        (lambda x, y: select_bandwidth(x, y, kernel="laplace"), ValueError, "kernel"),
        (lambda x, y: loo_cv_score(x, y, 0.5, kernel="laplace"), ValueError, "kernel"),
        (lambda x, y: loo_cv_score(x, y, 0.0), ValueError, "bandwidth"),
        (lambda x, y: loo_cv_score(x, y, -1.0), ValueError, "bandwidth"),
        (lambda x, y: loo_cv_score(x, y, torch.tensor([0.5, 0.0])), ValueError, "bandwidth"),
        (lambda x, y: loo_cv_score(x, y, None), ValueError, "bandwidth"),
        (lambda x, y: loo_cv_score(x, y, torch.tensor(0.5, dtype=torch.float64)), TypeError, "bandwidth"),
        (lambda x, y: loo_cv_score(x, y, torch.tensor([0.5, 0.6, 0.7])), ValueError, "batch"),
        (lambda x, y: loo_cv_score(x[0], y, 0.5), ValueError, "keys"),
        (lambda x, y: loo_cv_score(x[:, :1], y[:, :1], 0.5), ValueError, "keys"),
        (lambda x, y: loo_cv_score(x, y[:, :-1], 0.5), ValueError, "values"),
        (lambda x, y: loo_cv_score(x, y.double(), 0.5), TypeError, "values"),
        (lambda x, y: loo_cv_score(x.numpy(), y, 0.5), TypeError, "keys"),
        (lambda x, y: select_bandwidth(x, y[..., None, None]), ValueError, "values"),
        (lambda x, y: select_bandwidth(x, y, candidates=torch.tensor([0.1, -0.2])), ValueError, "candidates"),
        (lambda x, y: select_bandwidth(x, y, candidates=torch.tensor([0.1])), ValueError, "candidates"),
        (lambda x, y: select_bandwidth(x, y, candidates=[0.1, 0.2]), TypeError, "candidates"),
        (lambda x, y: select_bandwidth(x, y, num_candidates=1), ValueError, "num_candidates"),
        (lambda x, y: select_bandwidth(x, y, refine_steps=-1), ValueError, "refine_steps"),
        (lambda x, y: select_bandwidth(x, y, memory_budget=0), ValueError, "memory_budget"),
    ],
)
def test_bad_input_names_the_argument(call, exc, match):
    x, y = torch.randn(2, 10, 3), torch.randn(2, 10)
    with pytest.raises(exc, match=match):
        call(x, y)


def test_scott_bandwidth_is_the_explicit_rule_and_the_engines_default():
    from nwlib import make_task, scott_bandwidth, simulate

    assert scott_bandwidth(1000, 3) == pytest.approx(1000 ** (-1 / 7))
    assert scott_bandwidth(1000, 3, 2.5) == pytest.approx(2.5 * 1000 ** (-1 / 7))
    sig = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert torch.allclose(scott_bandwidth(50, 2, sig), sig * 50 ** (-1 / 6))
    # simulate's Gaussian default with unit-norm one-dimensional heads is Scott's rule with sigma = 1
    task = make_task("isotropic", embed_dim=2, noise_sd=0.5)
    W = torch.eye(2, dtype=torch.float64).reshape(2, 2, 1).transpose(0, 1).contiguous()
    z = torch.zeros(4, 2, dtype=torch.float64)
    a = simulate(task, W, z, n=64, replicates=2, generator=torch.Generator().manual_seed(1))
    b = simulate(
        task, W, z, n=64, replicates=2, generator=torch.Generator().manual_seed(1), bandwidth=scott_bandwidth(64, 1)
    )
    assert torch.allclose(a, b)
    for bad, match in (((0, 1), "n"), ((10, 0), "d"), ((10, 1, "x"), "sigma")):
        with pytest.raises((ValueError, TypeError), match=match):
            scott_bandwidth(*bad)
