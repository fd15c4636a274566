"""Principal angles, cross-Gram matrices, the HDI and head-family generators against independent references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwlib import cross_gram, equiangular_heads, hdi, orthonormal_basis, principal_angles, random_subspaces


def haar_orthogonal(n: int, generator: torch.Generator, device) -> torch.Tensor:
    """A float64 Haar orthogonal matrix, built here independently of the library."""
    G = torch.randn(n, n, generator=generator, device=device, dtype=torch.float64)
    Q, R = torch.linalg.qr(G)
    return Q * torch.sign(torch.diagonal(R))


def well_conditioned(k: int, generator: torch.Generator, device) -> torch.Tensor:
    """A random invertible k x k matrix with condition number <= 4: a change of basis."""
    scales = torch.linspace(0.5, 2.0, k, device=device, dtype=torch.float64)
    return haar_orthogonal(k, generator, device) @ torch.diag(scales) @ haar_orthogonal(k, generator, device)


def pair_with_angles(angles, D: int, generator, device, dtype):
    """Bases A, B (D x k) whose principal angles are exactly `angles` (up to rounding of the inputs).

    Range(A) = span(e_1..e_k), Range(B) = span(cos t_i e_i + sin t_i e_{k+i}), then a common
    random rotation of R^D and a random change of basis within each subspace.
    """
    k = len(angles)
    A = torch.zeros(D, k, dtype=torch.float64, device=device)
    B = torch.zeros(D, k, dtype=torch.float64, device=device)
    for i, t in enumerate(angles):
        A[i, i] = 1.0
        B[i, i], B[k + i, i] = math.cos(t), math.sin(t)
    O = haar_orthogonal(D, generator, device)
    A = O @ A @ well_conditioned(k, generator, device)
    B = O @ B @ well_conditioned(k, generator, device)
    return A.to(dtype), B.to(dtype)


def scipy_angles(A: torch.Tensor, B: torch.Tensor) -> np.ndarray:
    return np.sort(scipy.linalg.subspace_angles(A.double().cpu().numpy(), B.double().cpu().numpy()))


# --- principal angles ---------------------------------------------------------------------------


@pytest.mark.parametrize("angles", [(0.2, 0.6, 1.1), (0.05, 0.8, 1.45, 1.5), (0.3,)])
def test_principal_angles_match_scipy_well_separated(device, dtype, tol, generator, angles):
    A, B = pair_with_angles(angles, 11, generator, device, dtype)
    out = principal_angles(A, B)
    assert out.shape == (len(angles),) and out.dtype == dtype and out.device == A.device
    ref = torch.from_numpy(scipy_angles(A, B)).to(device=device, dtype=dtype)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(out, torch.tensor(angles, device=device, dtype=dtype), **tol)


def test_principal_angles_different_dimensions_match_scipy(device, dtype, tol, generator):
    A, B = pair_with_angles((0.25, 0.7, 1.2), 10, generator, device, dtype)
    B2 = B[:, :2]  # a 2-dimensional subspace of Range(B): two angles with Range(A)
    ref = torch.from_numpy(scipy_angles(A, B2)).to(device=device, dtype=dtype)
    torch.testing.assert_close(principal_angles(A, B2), ref, **tol)
    torch.testing.assert_close(principal_angles(B2, A), ref, **tol)


def test_tiny_and_large_angle_in_one_pair_float64(device, generator):
    angles = (1e-7, 0.9, math.pi / 2 - 1e-8)
    A, B = pair_with_angles(angles, 9, generator, device, torch.float64)
    out = principal_angles(A, B)
    expected = torch.tensor(angles, device=device, dtype=torch.float64)
    # Relative accuracy at both ends: 1e-7 to about 1e-6 relative; pi/2 - 1e-8 to ~1e-15 relative.
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0.0)
    # Near pi/2 what matters is the distance to pi/2, i.e. the cosine: check it relatively too.
    distance = torch.tensor(1e-8, dtype=torch.float64, device=device)
    torch.testing.assert_close(math.pi / 2 - out[-1], distance, rtol=1e-5, atol=0.0)


def test_tiny_angle_float32(device, generator):
    angles = (1e-3, 0.9, 1.5)
    A, B = pair_with_angles(angles, 9, generator, device, torch.float32)
    out = principal_angles(A, B)
    torch.testing.assert_close(out, torch.tensor(angles, device=device), rtol=2e-3, atol=0.0)


def test_arccos_alone_loses_a_tiny_angle_but_principal_angles_does_not(device):
    t = 1e-9
    A = torch.eye(3, dtype=torch.float64, device=device)[:, :1]
    B = torch.tensor([[math.cos(t)], [math.sin(t)], [0.0]], dtype=torch.float64, device=device)
    assert float(torch.arccos((A.mT @ B).squeeze())) == 0.0  # the failure this module avoids
    assert math.isclose(float(principal_angles(A, B)[0]), t, rel_tol=1e-12)


def test_principal_angles_basis_invariant_and_symmetric(device, dtype, tol, generator):
    A = torch.randn(8, 3, generator=generator, device=device, dtype=torch.float64)
    B = torch.randn(8, 3, generator=generator, device=device, dtype=torch.float64)
    base = principal_angles(A.to(dtype), B.to(dtype))
    A2 = (-2.5 * A @ well_conditioned(3, generator, device)).to(dtype)
    B2 = (0.1 * B @ well_conditioned(3, generator, device)).to(dtype)
    torch.testing.assert_close(principal_angles(A2, B2), base, **tol)
    torch.testing.assert_close(principal_angles(B.to(dtype), A.to(dtype)), base, **tol)


def test_principal_angles_batched_and_broadcast(device, dtype, tol, generator):
    A = torch.randn(4, 1, 7, 2, generator=generator, device=device, dtype=torch.float64).to(dtype)
    B = torch.randn(3, 7, 2, generator=generator, device=device, dtype=torch.float64).to(dtype)
    out = principal_angles(A, B)
    assert out.shape == (4, 3, 2)
    for i, j in itertools.product(range(4), range(3)):
        torch.testing.assert_close(out[i, j], principal_angles(A[i, 0], B[j]), **tol)


def test_identical_subspaces_have_zero_angles(device, dtype, generator):
    A = torch.randn(6, 3, generator=generator, device=device, dtype=torch.float64)
    B = A @ well_conditioned(3, generator, device)
    out = principal_angles(A.to(dtype), B.to(dtype))
    atol = 1e-3 if dtype == torch.float32 else 1e-7  # sines of order sqrt(eps) are not guaranteed
    torch.testing.assert_close(out, torch.zeros(3, device=device, dtype=dtype), rtol=0.0, atol=atol)


def test_orthonormal_basis(device, dtype, tol, generator):
    A = torch.randn(2, 9, 4, generator=generator, device=device, dtype=torch.float64).to(dtype)
    Q = orthonormal_basis(A)
    eye = torch.eye(4, device=device, dtype=dtype).expand(2, 4, 4)
    torch.testing.assert_close(Q.mT @ Q, eye, **tol)
    # Same range: projecting A onto Range(Q) leaves A unchanged.
    torch.testing.assert_close(Q @ (Q.mT @ A), A, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


# --- cross-Gram and HDI ---------------------------------------------------------------------------


def literal_hdi(heads: list[np.ndarray]) -> float:
    """The paper's formula, term by term, in float64 numpy."""
    H, d_k = len(heads), heads[0].shape[1]
    total = sum(np.sum((heads[a].T @ heads[b] / d_k) ** 2) for a, b in itertools.combinations(range(H), 2))
    return 1.0 - 2.0 / (H * (H - 1)) * total


def angles_hdi(heads: list[np.ndarray]) -> float:
    """1 - mean over pairs of the mean squared cosine of their principal angles (scipy's angles)."""
    pairs = itertools.combinations(range(len(heads)), 2)
    cos2 = [np.mean(np.cos(scipy.linalg.subspace_angles(heads[a], heads[b])) ** 2) for a, b in pairs]
    return 1.0 - float(np.mean(cos2))


def test_hdi_is_one_minus_mean_squared_cosine(device, dtype, tol, generator):
    W = torch.randn(5, 10, 3, generator=generator, device=device, dtype=torch.float64)
    expected = angles_hdi([w.cpu().numpy() for w in W])
    out = hdi(W.to(dtype))
    assert out.shape == () and out.dtype == dtype and out.device == W.device
    torch.testing.assert_close(out, torch.tensor(expected, device=device, dtype=dtype), **tol)


def test_paper_normalization_is_the_literal_formula(device, dtype, tol, generator):
    W = torch.randn(4, 8, 2, generator=generator, device=device, dtype=torch.float64)
    expected = literal_hdi([w.cpu().numpy() for w in W])
    torch.testing.assert_close(
        hdi(W.to(dtype), normalization="paper"), torch.tensor(expected, device=device, dtype=dtype), **tol
    )


@pytest.mark.parametrize("c", [0.5, 1.0, 3.0])
def test_paper_normalization_is_not_scale_invariant(device, dtype, tol, generator, c):
    d_k = 4
    Q = haar_orthogonal(10, generator, device)[:, :d_k]
    heads = torch.stack([c * Q, c * Q]).to(dtype)
    torch.testing.assert_close(
        hdi(heads, normalization="paper"), torch.tensor(1 - c**4 / d_k, device=device, dtype=dtype), **tol
    )
    torch.testing.assert_close(hdi(heads), torch.tensor(0.0, device=device, dtype=dtype), **tol)


def test_paper_agrees_with_invariant_when_gram_is_sqrt_dk(device, dtype, tol, generator):
    d_k = 3
    Q = equiangular_heads(
        0.7, num_heads=3, head_dim=d_k, embed_dim=12, generator=generator, dtype=torch.float64, device=device
    )
    W = (d_k**0.25 * Q).to(dtype)  # W^T W = sqrt(d_k) I
    torch.testing.assert_close(hdi(W, normalization="paper"), hdi(W), **tol)


def test_cross_gram(device, dtype, tol, generator):
    A, B = pair_with_angles((0.3, 1.0), 7, generator, device, torch.float64)
    G = cross_gram(A.to(dtype), B.to(dtype))
    expected = (math.cos(0.3) ** 2 + math.cos(1.0) ** 2) / 2
    torch.testing.assert_close(G.pow(2).sum(), torch.tensor(expected, device=device, dtype=dtype), **tol)
    literal = cross_gram(A.to(dtype), B.to(dtype), normalization="paper")
    torch.testing.assert_close(literal, (A.mT @ B / 2).to(dtype), **tol)


def test_hdi_ends_identical_and_orthogonal(device, dtype, tol, generator):
    O = haar_orthogonal(9, generator, device)
    base = O[:, :3]
    identical = torch.stack([base @ well_conditioned(3, generator, device) * s for s in (1.0, 0.2, 7.0)]).to(dtype)
    blocks = [O[:, 3 * h : 3 * h + 3] @ well_conditioned(3, generator, device) for h in range(3)]
    orthogonal = torch.stack(blocks).to(dtype)
    zero, one = torch.tensor(0.0, device=device, dtype=dtype), torch.tensor(1.0, device=device, dtype=dtype)
    torch.testing.assert_close(hdi(identical), zero, **tol)
    torch.testing.assert_close(hdi(orthogonal), one, **tol)
    torch.testing.assert_close(hdi(list(orthogonal)), one, **tol)  # the sequence form


def test_hdi_batched(device, dtype, tol, generator):
    W = torch.randn(3, 2, 4, 9, 2, generator=generator, device=device, dtype=torch.float64).to(dtype)
    out = hdi(W)
    assert out.shape == (3, 2)
    for i, j in itertools.product(range(3), range(2)):
        torch.testing.assert_close(out[i, j], hdi(W[i, j]), **tol)


# --- generators ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_dim", [0, 1, 2])
@pytest.mark.parametrize("theta", [0.0, 0.4, 1.1, math.pi / 2])
def test_equiangular_heads_have_the_prescribed_angles(device, dtype, tol, generator, shared_dim, theta):
    H, k, D = 4, 3, 16
    Q = equiangular_heads(
        theta,
        num_heads=H,
        head_dim=k,
        embed_dim=D,
        shared_dim=shared_dim,
        generator=generator,
        dtype=dtype,
        device=device,
    )
    assert Q.shape == (H, D, k) and Q.dtype == dtype and Q.device.type == device.type
    torch.testing.assert_close(Q.mT @ Q, torch.eye(k, device=device, dtype=dtype).expand(H, k, k), **tol)
    r = k - shared_dim
    expected = torch.tensor([0.0] * shared_dim + [theta] * r, device=device, dtype=dtype)
    atol = 1e-3 if dtype == torch.float32 else 1e-7  # zero angles are resolved to about sqrt(eps)
    for a, b in itertools.combinations(range(H), 2):
        torch.testing.assert_close(principal_angles(Q[a], Q[b]), expected, rtol=tol["rtol"], atol=atol)
    torch.testing.assert_close(hdi(Q), torch.tensor(r / k * math.sin(theta) ** 2, device=device, dtype=dtype), **tol)


def test_equiangular_heads_batched_angles(device, dtype, tol):
    theta = torch.linspace(0, math.pi / 2, 5, device=device, dtype=dtype)
    Q = equiangular_heads(theta, num_heads=3, head_dim=2, embed_dim=8)
    assert Q.shape == (5, 3, 8, 2)
    torch.testing.assert_close(hdi(Q), torch.sin(theta) ** 2, **tol)


def test_random_subspaces_expected_overlap(device, generator):
    D, k, R = 12, 3, 4000
    Q = random_subspaces(2, k, D, generator=generator, batch_shape=(R,), dtype=torch.float64)
    assert Q.shape == (R, 2, D, k) and Q.device.type == device.type
    torch.testing.assert_close(Q.mT @ Q, torch.eye(k, dtype=torch.float64, device=device).expand(R, 2, k, k))
    overlap = (Q[:, 0].mT @ Q[:, 1]).pow(2).sum((-1, -2))
    se = float(overlap.std()) / math.sqrt(R)
    assert abs(float(overlap.mean()) - k * k / D) < 4 * se  # E||Q1^T Q2||_F^2 = d_k^2 / D
    h = hdi(Q)
    assert abs(float(h.mean()) - (1 - k / D)) < 4 * float(h.std()) / math.sqrt(R)


def test_random_subspaces_reproducible(device):
    a = random_subspaces(3, 2, 6, generator=torch.Generator(device=device).manual_seed(7))
    b = random_subspaces(3, 2, 6, generator=torch.Generator(device=device).manual_seed(7))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- properties -----------------------------------------------------------------------------------------


@st.composite
def head_families(draw):
    H = draw(st.integers(2, 5))
    D = draw(st.integers(1, 8))
    k = draw(st.integers(1, D))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    return torch.randn(H, D, k, generator=g, dtype=torch.float64), seed


@settings(max_examples=60, deadline=None)
@given(family=head_families())
def test_hdi_in_unit_interval_and_symmetric_under_permutation(family):
    W, seed = family
    value = float(hdi(W))
    assert -1e-12 <= value <= 1 + 1e-12
    perm = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(seed))
    assert math.isclose(float(hdi(W[perm])), value, rel_tol=1e-10, abs_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(family=head_families(), scale=st.floats(0.01, 100.0))
def test_hdi_invariant_to_scale_and_basis(family, scale):
    W, seed = family
    g = torch.Generator().manual_seed(seed + 1)
    k = W.shape[-1]
    changed = torch.stack([scale * w @ well_conditioned(k, g, "cpu") for w in W])
    assert math.isclose(float(hdi(changed)), float(hdi(W)), rel_tol=1e-9, abs_tol=1e-10)


# --- bad input ---------------------------------------------------------------------------------------------


def test_rejects_different_ambient_dimension():
    with pytest.raises(ValueError, match="B must have the same ambient dimension"):
        principal_angles(torch.randn(5, 2), torch.randn(6, 2))
    with pytest.raises(ValueError, match=r"projections must share the ambient dimension D.*projections\[1\]"):
        hdi([torch.randn(5, 2), torch.randn(6, 2)])
    with pytest.raises(ValueError, match="B must have the same ambient dimension"):
        cross_gram(torch.randn(5, 2), torch.randn(6, 2))


def test_rejects_fewer_than_two_heads():
    with pytest.raises(ValueError, match="projections must hold at least two heads"):
        hdi(torch.randn(1, 5, 2))
    with pytest.raises(ValueError, match="projections must hold at least two heads"):
        hdi([torch.randn(5, 2)])


def test_rejects_wrong_rank():
    deficient = torch.randn(6, 1).expand(6, 2)  # two equal columns: rank 1
    with pytest.raises(ValueError, match="A must have full column rank"):
        principal_angles(deficient, torch.randn(6, 2))
    with pytest.raises(ValueError, match="projections must have full column rank"):
        hdi(torch.stack([deficient, torch.randn(6, 2)]))
    with pytest.raises(ValueError, match="B must have at least 2 dimension"):
        principal_angles(torch.randn(6, 2), torch.randn(6))
    with pytest.raises(ValueError, match="A must have no more columns"):
        principal_angles(torch.randn(3, 4), torch.randn(3, 2))
    with pytest.raises(ValueError, match="projections must have at least 3 dimension"):
        hdi(torch.randn(5, 2))


def test_rejects_bad_types_and_options():
    with pytest.raises(TypeError, match="A must have a floating-point dtype"):
        principal_angles(torch.ones(4, 2, dtype=torch.int64), torch.randn(4, 2))
    with pytest.raises(TypeError, match="B has dtype"):
        principal_angles(torch.randn(4, 2), torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="normalization must be one of"):
        hdi(torch.randn(2, 4, 2), normalization="frobenius")
    with pytest.raises(TypeError, match="projections must be a tensor"):
        hdi("heads")
    with pytest.raises(ValueError, match="A must be finite"):
        orthonormal_basis(torch.full((4, 2), float("nan")))


def test_generators_reject_bad_arguments():
    with pytest.raises(ValueError, match="angle must be finite and >= 0 and <= 1.5708"):
        equiangular_heads(2.0, num_heads=2, head_dim=1, embed_dim=3)
    with pytest.raises(ValueError, match="embed_dim must be >="):
        equiangular_heads(0.5, num_heads=3, head_dim=2, embed_dim=7)
    with pytest.raises(ValueError, match="num_heads must be >= 2"):
        equiangular_heads(0.5, num_heads=1, head_dim=2, embed_dim=8)
    with pytest.raises(ValueError, match="shared_dim must be in"):
        equiangular_heads(0.5, num_heads=2, head_dim=2, embed_dim=8, shared_dim=3)
    with pytest.raises(ValueError, match="head_dim must be <= embed_dim"):
        random_subspaces(2, 5, 4, generator=torch.Generator())
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        random_subspaces(2, 1, 4, generator=0)
