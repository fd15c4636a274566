r"""Head families with prescribed principal angles, the signal each head sees, and a first-order covariance.

Chapter 3 separates what the Head Diversity Index measures (how much the head
subspaces overlap) from what the risk of the ensemble depends on (what each head
sees of the regression function, and how strongly the heads' errors covary).
Three tools:

* :func:`multiangle_heads`: H heads that share s coordinate directions and whose
  every pair has the *same prescribed* principal angles
  :math:`\theta_1, \dots, \theta_r` in the other :math:`r = d_k - s` directions
  (:func:`nwlib.equiangular_heads` is the case of r equal angles);
* :func:`orthogonal_heads` and :func:`signal_mass`: pairwise orthogonal heads
  with a prescribed share :math:`\lVert P_h e_1\rVert^2` of the signal
  direction :math:`e_1`, and that share measured for any heads. By Bessel's
  inequality the shares of pairwise orthogonal heads add up to at most 1;
* :func:`noise_covariance_factor`: the first-order (large n, fixed bandwidth)
  noise covariance of two Gaussian-kernel Nadaraya–Watson heads that share a
  training set, as a product over their principal angles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ._validation import (
    require_device,
    require_dtype,
    require_positive_finite,
    require_positive_int,
    require_real,
    require_tensor,
)
from .subspaces import orthonormal_basis

__all__ = ["multiangle_heads", "orthogonal_heads", "signal_mass", "noise_covariance_factor"]


def _real_sequence(values: object, name: str) -> list[float]:
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(values.shape)}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of real numbers, got {type(values).__name__}")
    return [require_real(v, f"{name}[{i}]") for i, v in enumerate(values)]


def multiangle_heads(
    angles: Sequence[float] | Tensor,
    *,
    num_heads: int,
    embed_dim: int,
    shared_dim: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""H heads whose every pair has s zero principal angles and the prescribed angles :math:`\theta_j`.

    Head h has orthonormal columns: the first s coordinate vectors (shared by all
    heads), then for j = 1..r the column :math:`\cos\varphi_j\, b_{0j} +
    \sin\varphi_j\, b_{hj}` with :math:`\cos^2\varphi_j = \cos\theta_j`, where
    :math:`b_{0j}` and :math:`b_{hj}` are coordinate vectors of disjoint blocks
    :math:`B_0, B_1, \dots, B_H` (the layout of :func:`nwlib.equiangular_heads`).
    Then :math:`Q_h^\top Q_{h'} = \mathrm{diag}(I_s, \cos\theta_1, \dots,
    \cos\theta_r)` for every pair h != h', so each pair's principal angles are
    s zeros and :math:`\theta_1, \dots, \theta_r`, and the invariant HDI is
    :math:`\frac{1}{d_k}\sum_j \sin^2\theta_j`.

    Parameters
    ----------
    angles : sequence of float or Tensor of shape (r,)
        The angles :math:`\theta_j \in [0, \pi/2]` in radians, r >= 1.
    num_heads : int
        H >= 2.
    embed_dim : int
        D, at least :math:`s + (H + 1) r`.
    shared_dim : int, default 0
        s >= 0, the number of leading coordinate directions every head contains.
    dtype, device : optional
        Of the result (defaults: torch's default dtype, CPU).

    Returns
    -------
    Tensor, shape (H, D, s + r)
        Orthonormal bases, one per head.

    Raises
    ------
    TypeError, ValueError
        If an angle is not a real number in :math:`[0, \pi/2]`, a size is not a
        positive int (``shared_dim`` >= 0), or D is too small.

    Examples
    --------
    >>> import math, torch
    >>> from nwlib import hdi, principal_angles
    >>> Q = multiangle_heads([math.pi / 2, math.pi / 6], num_heads=3, embed_dim=9, shared_dim=1,
    ...                      dtype=torch.float64)
    >>> Q.shape, [round(float(a), 6) for a in principal_angles(Q[0], Q[2])]
    (torch.Size([3, 9, 3]), [0.0, 0.523599, 1.570796])
    >>> round(float(hdi(Q)), 6)  # (sin^2(pi/2) + sin^2(pi/6)) / 3
    0.416667
    """
    thetas = _real_sequence(angles, "angles")
    if not thetas:
        raise ValueError("angles must hold at least one angle (r >= 1)")
    for i, t in enumerate(thetas):
        require_real(t, f"angles[{i}]", minimum=0.0, maximum=math.pi / 2)
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    D = require_positive_int(embed_dim, "embed_dim")
    s = require_positive_int(shared_dim, "shared_dim", minimum=0)
    r = len(thetas)
    needed = s + (H + 1) * r
    if D < needed:
        raise ValueError(f"embed_dim must be >= shared_dim + (num_heads + 1) * len(angles) = {needed}, got {D}")
    dtype, device = require_dtype(dtype), require_device(device)
    Q = torch.zeros(H, D, s + r, dtype=torch.float64)
    Q[:, :s, :s] = torch.eye(s, dtype=torch.float64)
    for j, t in enumerate(thetas):
        # cos φ = sqrt(cos θ): the B_0 parts of two heads then have inner product cos²φ = cos θ.
        c = math.sqrt(max(math.cos(t), 0.0))
        sn = math.sqrt(max(1.0 - c * c, 0.0))
        Q[:, s + j, s + j] = c
        for h in range(H):
            Q[h, s + (h + 1) * r + j, s + j] = sn
    return Q.to(dtype=dtype, device=device)


def orthogonal_heads(
    masses: Sequence[float] | Tensor,
    *,
    head_dim: int,
    embed_dim: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Pairwise orthogonal heads in which head h sees the share ``masses[h]`` of the direction :math:`e_1`.

    With :math:`a = (\sqrt{m_1}, \dots, \sqrt{m_H}, \sqrt{1 - \sum_h m_h})`, a unit
    vector of :math:`\mathbb{R}^{H+1}`, let U be the Householder reflection that
    maps the first coordinate vector to a (so a is U's first row and column).
    Head h's first column is column h of U, placed in the coordinates
    :math:`1, \dots, H + 1` of :math:`\mathbb{R}^D`; its other :math:`d_k - 1`
    columns are coordinate vectors of a block of its own. The heads are pairwise
    orthogonal and :math:`\lVert P_h e_1\rVert^2 = m_h`, P_h the orthogonal
    projector onto head h's subspace.

    Parameters
    ----------
    masses : sequence of float or Tensor of shape (H,)
        The signal shares :math:`m_h \ge 0`, H >= 1, with :math:`\sum_h m_h \le 1`
        (Bessel's inequality: no other values are possible for orthogonal heads).
    head_dim : int
        d_k >= 1.
    embed_dim : int
        D, at least :math:`H d_k + 1`.
    dtype, device : optional
        Of the result (defaults: torch's default dtype, CPU).

    Returns
    -------
    Tensor, shape (H, D, d_k)
        Orthonormal bases with :math:`Q_h^\top Q_{h'} = 0` for h != h'.

    Raises
    ------
    TypeError, ValueError
        If a mass is negative or not a real number, the masses add up to more
        than 1 (beyond rounding, 1e-12), a size is not a positive int, or D is
        too small.

    Examples
    --------
    >>> import torch
    >>> Q = orthogonal_heads([0.5, 0.5, 0.0], head_dim=2, embed_dim=7, dtype=torch.float64)
    >>> [round(float(m), 12) for m in signal_mass(Q)]
    [0.5, 0.5, 0.0]
    """
    m = _real_sequence(masses, "masses")
    if not m:
        raise ValueError("masses must hold one value per head (H >= 1)")
    if any(v < 0 for v in m):
        raise ValueError(f"masses must be >= 0, got {m}")
    total = sum(m)
    if total > 1 + 1e-12:
        raise ValueError(f"masses must add up to at most 1 (Bessel's inequality), got {total}")
    k = require_positive_int(head_dim, "head_dim")
    D = require_positive_int(embed_dim, "embed_dim")
    H = len(m)
    if D < H * k + 1:
        raise ValueError(f"embed_dim must be >= num_heads * head_dim + 1 = {H * k + 1}, got {D}")
    dtype, device = require_dtype(dtype), require_device(device)
    a = torch.tensor([math.sqrt(v) for v in m] + [math.sqrt(max(1.0 - total, 0.0))], dtype=torch.float64)
    a = a / a.norm()
    w = -a
    w[0] += 1.0
    U = torch.eye(H + 1, dtype=torch.float64)
    if float(w.norm()) > 1e-15:  # a == e_1 needs no reflection
        U = U - 2.0 * torch.outer(w, w) / w.dot(w)
    Q = torch.zeros(H, D, k, dtype=torch.float64)
    for h in range(H):
        Q[h, : H + 1, 0] = U[:, h]
        start = H + 1 + h * (k - 1)
        Q[h, start : start + k - 1, 1:] = torch.eye(k - 1, dtype=torch.float64)
    return Q.to(dtype=dtype, device=device)


def signal_mass(key_projections: Tensor, direction: Tensor | None = None) -> Tensor:
    r"""The share :math:`\lVert P_h u\rVert^2` of a unit direction u that each head's subspace contains.

    Parameters
    ----------
    key_projections : Tensor, shape (..., H, D, d_k)
        The heads' projections :math:`W_K^h` (any basis and scale, full column rank).
    direction : Tensor, shape (D,), optional
        The direction u (normalised here); default :math:`e_1`, the signal
        direction of the ``single_index`` task.

    Returns
    -------
    Tensor, shape (..., H)
        :math:`\lVert Q_h^\top u\rVert^2 = \cos^2` of the angle between u and
        Range(W_K^h), in [0, 1]; dtype and device of ``key_projections``.

    Raises
    ------
    TypeError, ValueError
        If an input is not a floating tensor, the shapes or dtypes do not match,
        ``direction`` is zero, or a head lacks full column rank.

    Examples
    --------
    >>> import torch
    >>> W = torch.tensor([[[2.0], [0.0]], [[1.0], [1.0]]], dtype=torch.float64)  # two heads in R^2
    >>> signal_mass(W).round(decimals=12).tolist()
    [1.0, 0.5]
    """
    W = require_tensor(key_projections, "key_projections", min_dim=3)
    Q = orthonormal_basis(W, name="key_projections")
    if direction is None:
        u = torch.zeros(W.shape[-2], dtype=W.dtype, device=W.device)
        u[0] = 1.0
    else:
        u = require_tensor(direction, "direction")
        if u.shape != (W.shape[-2],):
            raise ValueError(f"direction must have shape (D,) = ({W.shape[-2]},), got {tuple(u.shape)}")
        if u.dtype != W.dtype or u.device != W.device:
            raise TypeError("direction must have the dtype and device of key_projections")
        norm = u.norm()
        if not bool(norm > 0):
            raise ValueError("direction must be a non-zero vector")
        u = u / norm
    return (Q.mT @ u).pow(2).sum(-1)


def noise_covariance_factor(angles: Tensor, bandwidth: float) -> Tensor:
    r"""First-order noise covariance of two Gaussian-kernel heads sharing a training set, over its principal angles.

    Heads h, h' are Nadaraya–Watson estimators with the Gaussian kernel of
    bandwidth b on orthonormal projections :math:`Q_h^\top x`, fitted on one
    training set :math:`x_i \sim N(0, I_D)`, :math:`y_i = f(x_i) + \sigma\varepsilon_i`.
    Given the inputs, the noise alone makes them covary by
    :math:`\sigma^2 \sum_i w^h_i(x) w^{h'}_i(x)` (:func:`nwlib.noise_covariance`).
    As :math:`n \to \infty` at fixed b, n times this, averaged over the training
    inputs and over queries :math:`x \sim N(0, I_D)`, tends to
    :math:`\sigma^2 \prod_{j} \phi_\beta(\theta_j)` with :math:`\beta = 1/b^2` and

    .. math:: \phi_\beta(\theta) = \frac{(1+\beta)^2}
              {\sqrt{(1 + 2\beta + \beta^2\sin^2\theta)^2 - \beta^2\cos^2\theta}},

    the product running over the principal angles of the two subspaces (a zero
    angle for each shared direction). :math:`\phi_\beta` falls strictly from
    :math:`\phi_\beta(0) = \sqrt{(1+\beta)^3/(1+3\beta)}` to
    :math:`\phi_\beta(\pi/2) = 1`; the noise variance of one head is the case of
    d_k zero angles.

    Parameters
    ----------
    angles : Tensor, shape (..., k)
        The principal angles, in radians.
    bandwidth : float
        b > 0, in units of the design's standard deviation.

    Returns
    -------
    Tensor, shape (...)
        :math:`\prod_j \phi_\beta(\theta_j)`; dtype and device of ``angles``.

    Raises
    ------
    TypeError, ValueError
        If ``angles`` is not a floating tensor with at least one dimension, or
        ``bandwidth`` is not a positive finite number.

    Notes
    -----
    In the principal-angle basis everything factorises over the orthogonal planes
    spanned by pairs of principal vectors. In one plane with kernel matrices
    :math:`A_h = \beta uu^\top`, :math:`A_{h'} = \beta vv^\top`,
    :math:`A = A_h + A_{h'}`, the Gaussian integral
    :math:`\E_{x'}\exp(-(x-x')^\top A (x-x')/2) = \det(I+A)^{-1/2}
    \exp(-x^\top A(I+A)^{-1}x/2)` gives the ratio
    :math:`\E[K_hK_{h'}]/(\E K_h\,\E K_{h'})` at the query x, and averaging over
    :math:`x \sim N(0, I)` gives :math:`\phi_\beta`.

    Examples
    --------
    >>> import math, torch
    >>> a = torch.tensor([[0.0, 0.0, math.pi / 2], [0.0, math.pi / 4, math.pi / 4]], dtype=torch.float64)
    >>> noise_covariance_factor(a, 1.0).round(decimals=4).tolist()  # equal HDI, different covariance
    [2.0, 1.9257]
    """
    theta = require_tensor(angles, "angles", min_dim=1)
    b = require_positive_finite(bandwidth, "bandwidth")
    beta = 1.0 / (b * b)
    s2 = torch.sin(theta).pow(2)
    c2 = torch.cos(theta).pow(2)
    denominator = ((1 + 2 * beta + beta**2 * s2).pow(2) - beta**2 * c2).sqrt()
    return ((1 + beta) ** 2 / denominator).prod(-1)
