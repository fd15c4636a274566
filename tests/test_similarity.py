"""RV coefficient and linear CKA of head projections against explicit D x D trace formulas."""

from __future__ import annotations

import pytest
import torch

from nwlib import hdi, principal_angles, random_subspaces
from nwlib.similarity import pairwise_rv, rv_coefficient, rv_diversity


def explicit_rv(A: torch.Tensor, B: torch.Tensor, centered: bool = False) -> float:
    """tr(S_A S_B) / sqrt(tr(S_A²) tr(S_B²)) with the D x D operators S = W Wᵀ (H S H when centered)."""
    A, B = A.double().cpu(), B.double().cpu()
    S_a, S_b = A @ A.T, B @ B.T
    if centered:
        D = A.shape[0]
        C = torch.eye(D, dtype=torch.float64) - torch.full((D, D), 1.0 / D, dtype=torch.float64)
        S_a, S_b = C @ S_a @ C, C @ S_b @ C
    return float(torch.trace(S_a @ S_b) / torch.sqrt(torch.trace(S_a @ S_a) * torch.trace(S_b @ S_b)))


@pytest.mark.parametrize("centered", [False, True])
def test_rv_matches_trace_formula(dtype, device, tol, centered):
    g = torch.Generator().manual_seed(1)
    A = torch.randn(3, 12, 4, generator=g, dtype=torch.float64)
    B = torch.randn(3, 12, 2, generator=g, dtype=torch.float64) * torch.tensor([3.0, 0.1], dtype=torch.float64)
    got = rv_coefficient(A.to(device, dtype), B.to(device, dtype), centered=centered).cpu().double()
    want = torch.tensor([explicit_rv(A[i], B[i], centered) for i in range(3)], dtype=torch.float64)
    torch.testing.assert_close(got, want, **tol)


def test_cka_is_kornblith_formula():
    # Linear CKA of representations X (D x p), Y (D x q): ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F).
    g = torch.Generator().manual_seed(2)
    X, Y = (
        torch.randn(20, 5, generator=g, dtype=torch.float64) + 3,
        torch.randn(20, 3, generator=g, dtype=torch.float64),
    )
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    want = (Yc.T @ Xc).pow(2).sum() / (torch.linalg.norm(Xc.T @ Xc) * torch.linalg.norm(Yc.T @ Yc))
    torch.testing.assert_close(rv_coefficient(X, Y, centered=True), want)
    assert not torch.isclose(rv_coefficient(X, Y), want)  # the uncentered RV differs for shifted rows


def test_flat_spectrum_gives_mean_squared_cosine_and_the_hdi():
    g = torch.Generator().manual_seed(3)
    Q = random_subspaces(4, 3, 10, generator=g, dtype=torch.float64)
    scales = torch.tensor([1.0, 2.0, 0.5, 7.0], dtype=torch.float64)[:, None, None]
    W = Q * scales
    cos2 = torch.cos(principal_angles(Q[0], Q[1])).pow(2).mean()
    torch.testing.assert_close(rv_coefficient(W[0], W[1]), cos2)
    torch.testing.assert_close(rv_diversity(W), hdi(Q))


def test_spectrum_matters_where_the_hdi_does_not():
    # Two heads sharing one strong direction and differing in a weak one: the HDI sees a half overlap,
    # RV sees the heads as nearly identical.
    e = torch.eye(4, dtype=torch.float64)
    A = torch.stack([e[:, 0] * 10, e[:, 1] * 0.1], dim=1)
    B = torch.stack([e[:, 0] * 10, e[:, 2] * 0.1], dim=1)
    assert abs(float(hdi([A, B])) - 0.5) < 1e-12
    assert float(rv_coefficient(A, B)) > 0.999


def test_invariances_and_range():
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randn(9, 3, generator=g, dtype=torch.float64)
    U = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64)).Q
    r = rv_coefficient(A, B)
    torch.testing.assert_close(rv_coefficient(5 * A @ U, 0.2 * B), r)
    torch.testing.assert_close(rv_coefficient(B, A), r)
    assert 0 <= float(r) <= 1
    assert float(rv_coefficient(A, A)) == pytest.approx(1.0, abs=1e-12)


def test_pairwise_matches_loop():
    g = torch.Generator().manual_seed(5)
    P = torch.randn(2, 4, 8, 2, generator=g, dtype=torch.float64)
    R = pairwise_rv(P)
    for b in range(2):
        for h in range(4):
            for k in range(4):
                assert float(R[b, h, k]) == pytest.approx(explicit_rv(P[b, h], P[b, k]), abs=1e-12)
    off = R[0][~torch.eye(4, dtype=torch.bool)].mean()
    torch.testing.assert_close(rv_diversity(P)[0], 1 - off)


def test_bad_inputs():
    with pytest.raises(ValueError, match="rows"):
        rv_coefficient(torch.randn(5, 2), torch.randn(6, 2))
    with pytest.raises(ValueError, match="zero"):
        rv_coefficient(torch.zeros(5, 2), torch.randn(5, 2))
    with pytest.raises(ValueError, match="zero after centering"):
        rv_coefficient(torch.ones(5, 2), torch.randn(5, 2), centered=True)
    with pytest.raises(TypeError, match="A"):
        rv_coefficient(torch.ones(5, 2, dtype=torch.int64), torch.randn(5, 2))
    with pytest.raises(ValueError, match="two heads"):
        pairwise_rv(torch.randn(1, 5, 2))
    with pytest.raises(TypeError, match="projections"):
        rv_diversity("heads")
    with pytest.raises(TypeError, match="centered"):
        rv_coefficient(torch.randn(5, 2), torch.randn(5, 2), centered=1)
