"""Head families with prescribed angles or signal shares, and the first-order noise covariance, against references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from nwlib import equiangular_heads, hdi, nadaraya_watson_weights, noise_covariance, principal_angles
from nwlib.angles import multiangle_heads, noise_covariance_factor, orthogonal_heads, signal_mass


def explicit_mass(W: torch.Tensor, u: torch.Tensor) -> float:
    """uᵀ P u with the projector P = W (WᵀW)⁻¹ Wᵀ written out, in float64 (independent of the library)."""
    W = W.double().cpu()
    u = u.double().cpu() / u.double().norm()
    P = W @ torch.linalg.inv(W.mT @ W) @ W.mT
    return float(u @ P @ u)


# --- multiangle_heads ---------------------------------------------------------------------------


@pytest.mark.parametrize("angles,shared", [((0.3, 1.1), 1), ((0.2, 0.7, 1.4), 0), ((math.pi / 2, 0.5), 2)])
def test_multiangle_pairs_have_the_prescribed_angles(device, dtype, tol, angles, shared):
    Q = multiangle_heads(
        angles, num_heads=3, embed_dim=shared + 4 * len(angles) + 1, shared_dim=shared, dtype=dtype, device=device
    )
    k = shared + len(angles)
    assert Q.shape == (3, shared + 4 * len(angles) + 1, k) and Q.dtype == dtype and Q.device.type == device.type
    eye = torch.eye(k, dtype=dtype, device=device)
    torch.testing.assert_close(Q.mT @ Q, eye.expand(3, k, k), **tol)
    expected = np.sort(np.array([0.0] * shared + list(angles)))
    for a, b in ((0, 1), (0, 2), (1, 2)):
        # scipy (descending, arccos/arcsin based) is an independent reference for well-separated angles
        ref = np.sort(scipy.linalg.subspace_angles(Q[a].double().cpu().numpy(), Q[b].double().cpu().numpy()))
        np.testing.assert_allclose(ref, expected, atol=1e-6)
        ours = principal_angles(Q[a], Q[b]).double().cpu().numpy()
        np.testing.assert_allclose(ours, expected, atol=1e-6 if dtype == torch.float64 else 2e-3)
    hdi_expected = sum(math.sin(t) ** 2 for t in angles) / k
    assert abs(float(hdi(Q)) - hdi_expected) < (1e-12 if dtype == torch.float64 else 1e-5)


def test_multiangle_with_equal_angles_is_equiangular(device, dtype):
    for theta in (0.0, 0.4, math.pi / 2):
        Q = multiangle_heads([theta] * 2, num_heads=4, embed_dim=16, shared_dim=1, dtype=dtype, device=device)
        ref = equiangular_heads(theta, num_heads=4, head_dim=3, embed_dim=16, shared_dim=1, dtype=dtype, device=device)
        torch.testing.assert_close(Q, ref, rtol=0, atol=4 * torch.finfo(dtype).eps)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"angles": [0.3, 1.7], "num_heads": 2, "embed_dim": 10}, ValueError, "angles"),
        ({"angles": [-0.1], "num_heads": 2, "embed_dim": 10}, ValueError, "angles"),
        ({"angles": [], "num_heads": 2, "embed_dim": 10}, ValueError, "angles"),
        ({"angles": "ab", "num_heads": 2, "embed_dim": 10}, TypeError, "angles"),
        ({"angles": [0.3, 0.4], "num_heads": 3, "embed_dim": 8, "shared_dim": 1}, ValueError, "embed_dim"),
        ({"angles": [0.3], "num_heads": 1, "embed_dim": 10}, ValueError, "num_heads"),
        ({"angles": [0.3], "num_heads": 2, "embed_dim": 10, "shared_dim": -1}, ValueError, "shared_dim"),
    ],
)
def test_multiangle_bad_inputs(kwargs, error, match):
    with pytest.raises(error, match=match):
        multiangle_heads(**kwargs)


# --- orthogonal_heads and signal_mass -----------------------------------------------------------


@pytest.mark.parametrize(
    "masses",
    [(1.0, 0.0, 0.0, 0.0), (0.25, 0.25, 0.25, 0.25), (0.5, 0.5, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), (0.1, 0.6, 0.2, 0.0)],
)
def test_orthogonal_heads_are_orthogonal_with_the_prescribed_masses(device, dtype, tol, masses):
    Q = orthogonal_heads(masses, head_dim=3, embed_dim=16, dtype=dtype, device=device)
    assert Q.shape == (4, 16, 3) and Q.dtype == dtype
    gram = torch.einsum("hdi,gdj->hgij", Q, Q)
    for h in range(4):
        for g in range(4):
            expected = (
                torch.eye(3, dtype=dtype, device=device) if h == g else torch.zeros(3, 3, dtype=dtype, device=device)
            )
            torch.testing.assert_close(gram[h, g], expected, **tol)
    e1 = torch.zeros(16, dtype=torch.float64)
    e1[0] = 1.0
    for h in range(4):
        assert abs(explicit_mass(Q[h], e1) - masses[h]) < (1e-12 if dtype == torch.float64 else 1e-6)
    torch.testing.assert_close(signal_mass(Q), torch.tensor(masses, dtype=dtype, device=device), **tol)
    assert abs(float(hdi(Q)) - 1.0) < 1e-6


@pytest.mark.parametrize(
    "masses,kwargs,error,match",
    [
        ((0.7, 0.6), {"head_dim": 2, "embed_dim": 10}, ValueError, "masses"),
        ((-0.1, 0.6), {"head_dim": 2, "embed_dim": 10}, ValueError, "masses"),
        ((), {"head_dim": 2, "embed_dim": 10}, ValueError, "masses"),
        ((0.5, 0.5), {"head_dim": 3, "embed_dim": 6}, ValueError, "embed_dim"),
        ((0.5, 0.5), {"head_dim": 0, "embed_dim": 10}, ValueError, "head_dim"),
    ],
)
def test_orthogonal_heads_bad_inputs(masses, kwargs, error, match):
    with pytest.raises(error, match=match):
        orthogonal_heads(masses, **kwargs)


def test_signal_mass_matches_the_explicit_projector_for_any_basis_and_scale(device, dtype, tol, generator):
    W = torch.randn(2, 3, 9, 2, generator=generator, device=device, dtype=torch.float64)
    u = torch.randn(9, generator=generator, device=device, dtype=torch.float64)
    out = signal_mass(W.to(dtype), u.to(dtype))
    assert out.shape == (2, 3)
    ref = torch.tensor([[explicit_mass(W[a, h], u) for h in range(3)] for a in range(2)], dtype=dtype)
    torch.testing.assert_close(out.cpu(), ref, **tol)
    # a change of basis and scale within each head leaves the share unchanged
    B = torch.randn(2, 2, generator=generator, device=device, dtype=torch.float64) + 3 * torch.eye(
        2, device=device, dtype=torch.float64
    )
    torch.testing.assert_close(signal_mass((5.0 * W @ B).to(dtype), u.to(dtype)), out, **tol)


def test_bessel_for_random_orthogonal_families(device, generator):
    # split the columns of a Haar orthogonal matrix into heads: pairwise orthogonal subspaces
    for D, H, k in ((12, 3, 4), (12, 4, 2), (7, 3, 2)):
        G = torch.randn(D, D, generator=generator, device=device, dtype=torch.float64)
        O = torch.linalg.qr(G)[0]
        Q = O[:, : H * k].reshape(D, H, k).permute(1, 0, 2)
        total = float(signal_mass(Q).sum())
        assert total <= 1 + 1e-12
        if H * k == D:  # the heads span R^D: Parseval, equality
            assert abs(total - 1) < 1e-12
        else:
            assert total < 1 - 1e-6  # a random vector is almost surely not inside the span


def test_signal_mass_bad_inputs():
    W = torch.randn(2, 5, 2)
    with pytest.raises(ValueError, match="direction"):
        signal_mass(W, torch.zeros(5))
    with pytest.raises(ValueError, match="direction"):
        signal_mass(W, torch.ones(4))
    with pytest.raises(TypeError, match="key_projections"):
        signal_mass(W.numpy())
    with pytest.raises(ValueError, match="key_projections"):
        signal_mass(torch.zeros(2, 5, 2))


# --- noise_covariance_factor --------------------------------------------------------------------


def plane_factor_by_quadrature(theta: float, b: float, nodes: int = 48) -> float:
    """E_x[E_x'[K K'] / (E_x' K E_x' K')] in one principal plane, by Gauss-Hermite quadrature (numpy)."""
    t, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / math.sqrt(2 * math.pi)
    X1, X2 = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([X1.ravel(), X2.ravel()], 1)  # (N^2, 2)
    wts = np.outer(w, w).ravel()
    u, v = np.array([1.0, 0.0]), np.array([math.cos(theta), math.sin(theta)])
    diff = pts[:, None, :] - pts[None, :, :]  # query minus training point
    K = np.exp(-((diff @ u) ** 2) / (2 * b * b))
    Kp = np.exp(-((diff @ v) ** 2) / (2 * b * b))
    ratio = (K * Kp) @ wts / ((K @ wts) * (Kp @ wts))
    return float(ratio @ wts)


@pytest.mark.parametrize("b", [0.8, 1.0, 1.5])
def test_noise_factor_matches_quadrature_in_one_plane(device, dtype, b):
    thetas = [0.0, 0.3, math.pi / 4, 1.2, math.pi / 2]
    out = noise_covariance_factor(torch.tensor(thetas, dtype=dtype, device=device)[:, None], b)
    assert out.shape == (5,) and out.dtype == dtype and out.device.type == device.type
    ref = [plane_factor_by_quadrature(t, b) for t in thetas]
    np.testing.assert_allclose(out.double().cpu().numpy(), ref, rtol=1e-6 if dtype == torch.float64 else 1e-5)


def test_noise_factor_is_a_product_falling_to_one(dtype):
    grid = torch.linspace(0, math.pi / 2, 50, dtype=dtype)
    phi = noise_covariance_factor(grid[:, None], 0.5)
    assert bool((phi[1:] < phi[:-1]).all())  # strictly decreasing in the angle
    assert abs(float(phi[-1]) - 1.0) < 1e-6
    beta = 4.0
    assert abs(float(phi[0]) - math.sqrt((1 + beta) ** 3 / (1 + 3 * beta))) < 1e-5
    pair = torch.tensor([[0.2, 0.9, 1.3]], dtype=dtype)
    single = noise_covariance_factor(pair[0][:, None], 0.5)
    torch.testing.assert_close(noise_covariance_factor(pair, 0.5)[0], single.prod())


def test_noise_factor_matches_a_brute_force_simulation_at_large_n():
    # Two 1-d heads in R^2 at angle theta: n * mean_x sum_i w_i w'_i over designs, against the limit.
    g = torch.Generator().manual_seed(7)
    b, theta, n, designs, m = 0.7, 0.6, 4000, 40, 256
    u = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    v = torch.tensor([[math.cos(theta)], [math.sin(theta)]], dtype=torch.float64)
    x = torch.randn(designs, n, 2, generator=g, dtype=torch.float64)
    z = torch.randn(m, 2, generator=g, dtype=torch.float64)
    keys = torch.stack([x @ u, x @ v], 1)  # (designs, 2, n, 1)
    queries = torch.stack([z @ u, z @ v], 0)  # (2, m, 1)
    w = nadaraya_watson_weights(queries, keys, kernel="gaussian", bandwidth=b)  # (designs, 2, m, n)
    cov = noise_covariance(w, 1.0)[:, 0, 1]  # (designs, m)
    measured = n * float(cov.mean())
    expected = float(noise_covariance_factor(torch.tensor([theta], dtype=torch.float64), b))
    # 256 random queries and a finite n leave a few per cent of Monte Carlo error (measured: 2.2 %)
    assert abs(measured / expected - 1) < 0.05, (measured, expected)


def test_noise_factor_bad_inputs():
    with pytest.raises(ValueError, match="bandwidth"):
        noise_covariance_factor(torch.zeros(3), 0.0)
    with pytest.raises(TypeError, match="angles"):
        noise_covariance_factor(torch.zeros(3, dtype=torch.int64), 1.0)
    with pytest.raises(ValueError, match="angles"):
        noise_covariance_factor(torch.tensor(0.3), 1.0)
