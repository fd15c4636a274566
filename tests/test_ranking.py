"""Tests of nwlib.ranking: nested ensembles, validation rankings and Kendall's tau."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats
import torch

from nwlib import error_second_moments, optimal_weights
from nwlib.ranking import NESTED_SCHEMES, kendall_tau, nested_weights, validation_ranking


def _random_spd(H, generator, dtype, device):
    A = torch.randn(H, H, generator=generator, dtype=torch.float64, device=device)
    return (A @ A.mT / H + 0.5 * torch.eye(H, dtype=torch.float64, device=device)).to(dtype)


def _fib_desc(k):
    fib = [1, 1]
    while len(fib) < k:
        fib.append(fib[-1] + fib[-2])
    return fib[:k][::-1]


def _reference_rows(scheme, order, ratio, M):
    """Brute force in numpy float64: each ensemble of the k best heads from its definition."""
    H = len(order)
    out = np.zeros((H, H))
    for k in range(1, H + 1):
        top = list(order[:k])
        if scheme == "uniform":
            w = np.full(k, 1.0 / k)
        elif scheme == "fibonacci":
            w = np.array(_fib_desc(k), dtype=float)
        elif scheme == "geometric":
            w = np.array([ratio**i for i in range(k)])
        else:
            sub = M[np.ix_(top, top)]
            z = np.linalg.solve(sub, np.ones(k))  # M^{-1} 1 / (1' M^{-1} 1)
            w = z
        out[k - 1, top] = w / w.sum()
    return out


@pytest.mark.parametrize("scheme", NESTED_SCHEMES)
def test_nested_weights_match_brute_force(scheme, dtype, device, tol, generator):
    H = 6
    order = torch.randperm(H, generator=generator, device=device)
    M = _random_spd(H, generator, dtype, device)
    kwargs = {}
    if scheme == "geometric":
        kwargs["ratio"] = 0.6
    if scheme == "optimal":
        kwargs["second_moments"] = M
    else:
        kwargs["dtype"] = dtype
    W = nested_weights(scheme, order, **kwargs)
    assert W.shape == (H, H) and W.dtype == dtype and W.device.type == device.type
    ref = _reference_rows(scheme, order.cpu().tolist(), 0.6, M.cpu().double().numpy())
    torch.testing.assert_close(W, torch.as_tensor(ref).to(device=device, dtype=dtype), **tol)
    # the k-th ensemble uses exactly the k best heads, and every row sums to one
    support = (W != 0).cpu().numpy()
    for k in range(1, H + 1):
        assert set(np.flatnonzero(support[k - 1])) <= set(order[:k].cpu().tolist())
    torch.testing.assert_close(W.sum(-1), torch.ones(H, dtype=dtype, device=device), **tol)


def test_nested_optimal_never_worse_as_heads_are_added(generator):
    # in-sample, the best weights over a larger set of heads cannot do worse
    M = _random_spd(7, generator, torch.float64, "cpu")
    order = torch.randperm(7, generator=generator)
    W = nested_weights("optimal", order, second_moments=M)
    risk = torch.einsum("kh,hg,kg->k", W, M, W)
    assert bool((risk[1:] <= risk[:-1] + 1e-12).all())


def test_nested_uniform_last_row_is_the_plain_average():
    W = nested_weights("uniform", torch.tensor([3, 1, 0, 2]), dtype=torch.float64)
    assert W[-1].tolist() == [0.25] * 4
    assert W[0].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_nested_weights_bad_inputs():
    order = torch.tensor([1, 0, 2])
    with pytest.raises(ValueError, match="scheme"):
        nested_weights("harmonic", order)
    with pytest.raises(ValueError, match="order"):
        nested_weights("uniform", torch.tensor([0, 0, 2]))
    with pytest.raises(TypeError, match="order"):
        nested_weights("uniform", torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="ratio"):
        nested_weights("geometric", order)
    with pytest.raises(ValueError, match="ratio"):
        nested_weights("geometric", order, ratio=1.5)
    with pytest.raises(ValueError, match="ratio"):
        nested_weights("uniform", order, ratio=0.5)
    with pytest.raises(ValueError, match="second_moments"):
        nested_weights("optimal", order)
    with pytest.raises(ValueError, match="second_moments"):
        nested_weights("optimal", order, second_moments=torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="second_moments"):
        nested_weights("fibonacci", order, second_moments=torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="dtype"):
        nested_weights("optimal", order, second_moments=torch.eye(3, dtype=torch.float64), dtype=torch.float32)
    with pytest.raises(ValueError, match="ridge"):
        nested_weights("optimal", order, second_moments=torch.eye(3, dtype=torch.float64), ridge=-1.0)


def test_validation_ranking_matches_loops(dtype, device, tol, generator):
    R, H, m = 3, 4, 11
    preds = torch.randn(R, H, m, generator=generator, dtype=torch.float64, device=device).to(dtype)
    y = torch.randn(R, m, generator=generator, dtype=torch.float64, device=device).to(dtype)
    out = validation_ranking(preds, y)
    p, t = preds.cpu().double().numpy(), y.cpu().double().numpy()
    ref = np.zeros((H, H))
    for r, h, g, j in itertools.product(range(R), range(H), range(H), range(m)):
        ref[h, g] += (p[r, h, j] - t[r, j]) * (p[r, g, j] - t[r, j]) / (R * m)
    torch.testing.assert_close(out.second_moments, torch.as_tensor(ref).to(device=device, dtype=dtype), **tol)
    torch.testing.assert_close(
        out.head_error, torch.as_tensor(np.diag(ref).copy()).to(device=device, dtype=dtype), **tol
    )
    assert out.order.cpu().tolist() == list(np.argsort(np.diag(ref), kind="stable"))


def test_validation_ranking_shared_responses_equal_error_second_moments():
    # with noise-free responses equal to f, the validation matrix is error_second_moments
    g = torch.Generator().manual_seed(3)
    preds = torch.randn(5, 3, 7, generator=g, dtype=torch.float64)
    f = torch.randn(7, generator=g, dtype=torch.float64)
    torch.testing.assert_close(validation_ranking(preds, f).second_moments, error_second_moments(preds, f))


def test_validation_ranking_noise_adds_sigma2_to_every_entry_on_average():
    # E[M_hat] = M + sigma^2 11^T when the noise is independent of the heads: a test that could fail
    g = torch.Generator().manual_seed(5)
    R, H, m, sigma = 4000, 3, 50, 0.7
    f = torch.randn(m, generator=g, dtype=torch.float64)
    preds = f + torch.randn(R, H, m, generator=g, dtype=torch.float64) * torch.tensor([0.2, 0.5, 0.9])[:, None]
    y = f + sigma * torch.randn(R, m, generator=g, dtype=torch.float64)
    gap = validation_ranking(preds, y).second_moments - error_second_moments(preds, f)
    torch.testing.assert_close(gap, torch.full((H, H), sigma**2, dtype=torch.float64), atol=0.01, rtol=0)
    assert validation_ranking(preds, y).order.tolist() == [0, 1, 2]
    w_val = optimal_weights(validation_ranking(preds, y).second_moments)
    w_true = optimal_weights(error_second_moments(preds, f))
    torch.testing.assert_close(w_val, w_true, atol=0.02, rtol=0)


def test_validation_ranking_bad_inputs():
    preds = torch.zeros(2, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="predictions"):
        validation_ranking(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="responses"):
        validation_ranking(preds, torch.zeros(5, dtype=torch.float64))
    with pytest.raises(TypeError, match="responses"):
        validation_ranking(preds, torch.zeros(4, dtype=torch.float32))
    with pytest.raises(TypeError, match="predictions"):
        validation_ranking(preds.long(), torch.zeros(4))


def test_kendall_tau_matches_scipy(device, generator):
    H = 8
    orders = torch.stack([torch.randperm(H, generator=generator, device=device) for _ in range(20)])
    ref = torch.randperm(H, generator=generator, device=device)
    tau = kendall_tau(orders, ref)
    assert tau.shape == (20,) and tau.dtype == torch.float64

    def positions(o):
        pos = np.empty(H, dtype=int)
        pos[np.asarray(o)] = np.arange(H)
        return pos

    expected = [
        scipy.stats.kendalltau(positions(o), positions(ref.cpu().numpy())).statistic for o in orders.cpu().numpy()
    ]
    torch.testing.assert_close(tau.cpu(), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_kendall_tau_extremes():
    o = torch.tensor([2, 0, 3, 1])
    assert float(kendall_tau(o, o)) == 1.0
    assert float(kendall_tau(o, o.flip(0))) == -1.0


def test_kendall_tau_bad_inputs():
    with pytest.raises(ValueError, match="reference"):
        kendall_tau(torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="order"):
        kendall_tau(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="two heads"):
        kendall_tau(torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(TypeError, match="reference"):
        kendall_tau(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
