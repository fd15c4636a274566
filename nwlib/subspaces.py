r"""Principal angles between head subspaces and the Head Diversity Index.

Head h of multi-head attention compares queries and keys inside
:math:`\mathrm{Range}(W_K^h) \subset \mathbb{R}^D`. How much two heads overlap
is measured by the principal angles :math:`0 \le \theta_1 \le \dots \le
\theta_k \le \pi/2` between their subspaces: for orthonormal bases
:math:`Q_h, Q_{h'}` the singular values of :math:`Q_h^\top Q_{h'}` are
:math:`\cos\theta_i`, so :math:`\lVert Q_h^\top Q_{h'}\rVert_F^2 = \sum_i
\cos^2\theta_i`.

The paper's Head Diversity Index (HDI) is
:math:`1 - \frac{2}{H(H-1)} \sum_{h<h'} \lVert G_{hh'}\rVert_F^2` with
:math:`G_{hh'} = (W_K^h)^\top W_K^{h'} / d_k`. Taken literally this depends on
the scale of the weights (for :math:`W = cQ` an identical pair contributes
:math:`c^4/d_k`, not 1). :func:`hdi` therefore defaults to the basis-invariant
version :math:`1 - \operatorname{mean}_{h<h'} \lVert Q_h^\top Q_{h'}\rVert_F^2
/ d_k`, the mean over pairs of one minus the mean squared cosine of their
principal angles, and offers the literal formula as ``normalization="paper"``.

Accuracy: an angle from ``arccos`` of a cosine near 1 loses about half the
digits (a 1e-8 rad angle in float64 is lost entirely). :func:`principal_angles`
takes the cosines from the singular values of :math:`Q_A^\top Q_B` and the
sines from those of the residual :math:`Q_B - Q_A Q_A^\top Q_B`, and combines
them with ``atan2``, which is accurate at both ends (Björck & Golub 1973;
Knyazev & Argentati 2002).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ._validation import (
    broadcast_batch,
    require_choice,
    require_device,
    require_dtype,
    require_generator,
    require_positive_int,
    require_real,
    require_same_dtype_device,
    require_tensor,
    same_device,
)

__all__ = [
    "NORMALIZATIONS",
    "orthonormal_basis",
    "principal_angles",
    "cross_gram",
    "hdi",
    "equiangular_heads",
    "random_subspaces",
]

NORMALIZATIONS: tuple[str, ...] = ("orthonormal", "paper")
"""Normalisations accepted by :func:`cross_gram` and :func:`hdi`."""

Normalization = Literal["orthonormal", "paper"]


def _check_matrix(x: object, name: str) -> Tensor:
    x = require_tensor(x, name, min_dim=2)
    d, k = x.shape[-2], x.shape[-1]
    if k == 0 or d == 0:
        raise ValueError(f"{name} must have at least one row and one column, got shape {tuple(x.shape)}")
    if k > d:
        raise ValueError(
            f"{name} must have no more columns (subspace dimension k) than rows (ambient dimension D): "
            f"got shape {tuple(x.shape)}"
        )
    return x


def orthonormal_basis(A: Tensor, *, name: str = "A") -> Tensor:
    r"""An orthonormal basis of the column space of ``A``.

    Parameters
    ----------
    A : Tensor, shape (..., D, k)
        Spanning columns, k <= D, of full column rank.
    name : str, default "A"
        How error messages refer to ``A``.

    Returns
    -------
    Tensor, shape (..., D, k)
        :math:`Q` with :math:`Q^\top Q = I_k` and :math:`\mathrm{Range}(Q) =
        \mathrm{Range}(A)`; dtype and device of ``A``.

    Raises
    ------
    TypeError
        If ``A`` is not a floating tensor.
    ValueError
        If ``A`` has fewer than two dimensions, more columns than rows, or
        (numerically) deficient column rank: the singular values must satisfy
        :math:`\sigma_{\min} > \max(D, k)\,\varepsilon\,\sigma_{\max}`.
    """
    A = _check_matrix(A, name)
    if not bool(torch.isfinite(A).all()):
        raise ValueError(f"{name} must be finite (it contains inf or nan)")
    # The left singular vectors, rather than a QR factor, come with the singular
    # values that tell whether the columns really span a k-dimensional space.
    U, S, _ = torch.linalg.svd(A, full_matrices=False)
    d, k = A.shape[-2], A.shape[-1]
    tol = max(d, k) * torch.finfo(A.dtype).eps
    smax = S[..., :1]
    deficient = ~(S[..., -1:] > tol * smax)
    if bool(deficient.any()):
        ratio = float((S[..., -1] / S[..., 0].clamp_min(torch.finfo(A.dtype).tiny)).min())
        raise ValueError(
            f"{name} must have full column rank k={k}: its smallest singular value is "
            f"{ratio:.3g} times its largest (tolerance {tol:.3g})"
        )
    return U


def principal_angles(A: Tensor, B: Tensor) -> Tensor:
    r"""Principal angles between :math:`\mathrm{Range}(A)` and :math:`\mathrm{Range}(B)`.

    Parameters
    ----------
    A : Tensor, shape (..., D, k_A)
        Columns spanning the first subspace (full column rank).
    B : Tensor, shape (..., D, k_B)
        Columns spanning the second subspace, same ambient dimension D. The
        batch dimensions ``...`` of ``A`` and ``B`` broadcast.

    Returns
    -------
    Tensor, shape (..., min(k_A, k_B))
        The angles in radians, ascending, in :math:`[0, \pi/2]`. They depend
        only on the two subspaces, not on the bases, and are symmetric in
        ``A`` and ``B``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor or the dtypes differ.
    ValueError
        If the ambient dimensions differ, the batch shapes do not broadcast, the
        devices differ, or an input is not of full column rank.

    Notes
    -----
    With :math:`Q_A^\top Q_B = U \Sigma V^\top` the cosines are the singular
    values :math:`\Sigma` and the sines are the singular values of
    :math:`Q_B - Q_A (Q_A^\top Q_B)` (for :math:`k_B \le k_A`). Both are
    computed to absolute accuracy of order :math:`\varepsilon`; pairing them in
    order and taking ``atan2(sin, cos)`` keeps small angles (where the cosine
    carries no information) and angles near :math:`\pi/2` (where the sine
    carries none) accurate to high relative precision.

    Examples
    --------
    >>> import math, torch
    >>> from nwlib import principal_angles
    >>> A = torch.eye(3, dtype=torch.float64)[:, :1]
    >>> B = torch.tensor([[math.cos(1e-9)], [math.sin(1e-9)], [0.0]], dtype=torch.float64)
    >>> float(principal_angles(A, B)[0])  # arccos(cos(1e-9)) would give 0.0
    1e-09
    """
    A = _check_matrix(A, "A")
    B = _check_matrix(B, "B")
    require_same_dtype_device(A, "A", B=B)
    if A.shape[-2] != B.shape[-2]:
        raise ValueError(
            f"B must have the same ambient dimension D (number of rows) as A: A {tuple(A.shape)}, B {tuple(B.shape)}"
        )
    batch = broadcast_batch({"A": A.shape[:-2], "B": B.shape[:-2]})
    QA, QB = orthonormal_basis(A, name="A"), orthonormal_basis(B, name="B")
    if QB.shape[-1] > QA.shape[-1]:
        QA, QB = QB, QA  # the angles are symmetric; the residual needs k_B <= k_A
    QA = QA.expand(*batch, *QA.shape[-2:])
    QB = QB.expand(*batch, *QB.shape[-2:])
    M = QA.mT @ QB
    cos = torch.linalg.svdvals(M).clamp(max=1.0)  # descending
    residual = QB - QA @ M
    sin = torch.linalg.svdvals(residual).clamp(max=1.0).flip(-1)  # ascending
    return torch.atan2(sin, cos)


def cross_gram(A: Tensor, B: Tensor, *, normalization: Normalization = "orthonormal") -> Tensor:
    r"""The cross-Gram matrix of two heads, the building block of the HDI.

    Parameters
    ----------
    A, B : Tensor, shape (..., D, d_k)
        Key projections of two heads with the same D and d_k (batch dimensions
        broadcast).
    normalization : {"orthonormal", "paper"}, default "orthonormal"
        ``"orthonormal"``: :math:`G = Q_A^\top Q_B / \sqrt{d_k}` with
        :math:`Q_A, Q_B` orthonormal bases of the ranges, so that
        :math:`\lVert G\rVert_F^2 = \frac{1}{d_k}\sum_i \cos^2\theta_i` is the
        mean squared cosine of the principal angles: 1 for identical
        subspaces, 0 for orthogonal ones, whatever the scale or basis of A and B.
        ``"paper"``: the literal :math:`G = A^\top B / d_k`, which depends on the
        scale of the weights (no rank condition is imposed).

    Returns
    -------
    Tensor, shape (..., d_k, d_k)
        dtype and device of the inputs. With ``"orthonormal"`` the matrix itself
        depends on the chosen bases; its singular values (and so its Frobenius
        norm) do not.

    Raises
    ------
    TypeError, ValueError
        On non-floating inputs, mismatched dtype/device, different D or d_k,
        non-broadcasting batches, an unknown ``normalization``, or (for
        ``"orthonormal"``) an input without full column rank.
    """
    normalization = require_choice(normalization, "normalization", NORMALIZATIONS)  # type: ignore[assignment]
    A = _check_matrix(A, "A")
    B = _check_matrix(B, "B")
    require_same_dtype_device(A, "A", B=B)
    if A.shape[-2:] != B.shape[-2:]:
        raise ValueError(
            "B must have the same ambient dimension D and head dimension d_k as A: "
            f"A {tuple(A.shape)}, B {tuple(B.shape)}"
        )
    broadcast_batch({"A": A.shape[:-2], "B": B.shape[:-2]})
    d_k = A.shape[-1]
    if normalization == "paper":
        return A.mT @ B / d_k
    QA, QB = orthonormal_basis(A, name="A"), orthonormal_basis(B, name="B")
    return QA.mT @ QB / math.sqrt(d_k)


def _stack_heads(projections: object) -> Tensor:
    if isinstance(projections, Tensor):
        P = require_tensor(projections, "projections", min_dim=3)
        return P
    if not isinstance(projections, Sequence) or isinstance(projections, (str, bytes)):
        raise TypeError(
            "projections must be a tensor of shape (..., H, D, d_k) or a sequence of (D, d_k) tensors, "
            f"got {type(projections).__name__}"
        )
    heads = [require_tensor(p, f"projections[{i}]", min_dim=2) for i, p in enumerate(projections)]
    if len(heads) < 2:
        raise ValueError(f"projections must hold at least two heads (H >= 2), got {len(heads)}")
    for i, p in enumerate(heads):
        if p.dim() != 2:
            raise ValueError(f"projections[{i}] must have shape (D, d_k), got {tuple(p.shape)}")
        require_same_dtype_device(heads[0], "projections[0]", **{f"projections[{i}]": p})
        if p.shape[0] != heads[0].shape[0]:
            raise ValueError(
                "projections must share the ambient dimension D: "
                f"projections[0] has D={heads[0].shape[0]}, projections[{i}] has D={p.shape[0]}"
            )
        if p.shape[1] != heads[0].shape[1]:
            raise ValueError(
                "projections must share the head dimension d_k: "
                f"projections[0] has d_k={heads[0].shape[1]}, projections[{i}] has d_k={p.shape[1]}"
            )
    return torch.stack(heads)


def hdi(projections: Tensor | Sequence[Tensor], *, normalization: Normalization = "orthonormal") -> Tensor:
    r"""The Head Diversity Index of a family of H >= 2 heads.

    .. math::
        \mathrm{HDI} = 1 - \frac{2}{H(H-1)} \sum_{h<h'} \lVert G_{hh'}\rVert_F^2,

    with :math:`G_{hh'}` = :func:`cross_gram` of heads h and h'.

    Parameters
    ----------
    projections : Tensor of shape (..., H, D, d_k), or a sequence of H tensors (D, d_k)
        The key projections :math:`W_K^h`, one per head.
    normalization : {"orthonormal", "paper"}, default "orthonormal"
        ``"orthonormal"`` (our choice, basis- and scale-invariant):
        :math:`1 - \operatorname{mean}_{h<h'} \lVert Q_h^\top Q_{h'}\rVert_F^2 / d_k`,
        i.e. one minus the mean over pairs and over principal angles of
        :math:`\cos^2\theta`; it lies in [0, 1], is 0 exactly when all ranges
        coincide and 1 exactly when they are pairwise orthogonal.
        ``"paper"``: the literal formula with :math:`G = (W_K^h)^\top W_K^{h'} / d_k`;
        it agrees with the invariant index when every
        :math:`(W_K^h)^\top W_K^h = \sqrt{d_k}\, I`, and in general is neither
        bounded below by 0 nor 0 for identical heads.

    Returns
    -------
    Tensor, shape (...)
        dtype and device of the projections.

    Raises
    ------
    TypeError
        If ``projections`` is neither a tensor nor a sequence of tensors, or is
        not floating, or the heads differ in dtype.
    ValueError
        With fewer than two heads, heads of different ambient dimension D or head
        dimension d_k, d_k > D, or (for ``"orthonormal"``) a head without full
        column rank.

    Examples
    --------
    >>> import torch
    >>> from nwlib import hdi
    >>> I = torch.eye(4)
    >>> float(hdi([I[:, :2], I[:, 2:]])), float(hdi([I[:, :2], 3 * I[:, [1, 0]]]))
    (1.0, 0.0)
    """
    normalization = require_choice(normalization, "normalization", NORMALIZATIONS)  # type: ignore[assignment]
    P = _stack_heads(projections)
    H, D, d_k = P.shape[-3], P.shape[-2], P.shape[-1]
    if H < 2:
        raise ValueError(f"projections must hold at least two heads (H >= 2), got H={H}")
    if d_k == 0 or d_k > D:
        raise ValueError(f"projections must have 1 <= d_k <= D (columns no more than rows), got D={D}, d_k={d_k}")
    if normalization == "paper":
        X, scale = P, d_k * d_k
    else:
        X, scale = orthonormal_basis(P, name="projections"), d_k
    # ‖X_hᵀ X_g‖_F² for all pairs at once, shape (..., H, H).
    overlap = pairwise_overlap(X) / scale
    off_diagonal = overlap.sum((-1, -2)) - overlap.diagonal(dim1=-2, dim2=-1).sum(-1)
    return 1 - off_diagonal / (H * (H - 1))


def _haar_orthonormal(
    shape: tuple[int, ...], D: int, k: int, generator: torch.Generator, dtype: torch.dtype, device
) -> Tensor:
    """Haar-distributed D x k orthonormal frames: QR of a Gaussian matrix with the sign of diag(R) fixed."""
    G = torch.randn(*shape, D, k, generator=generator, dtype=dtype, device=device)
    # Without the sign fix QR's convention biases the frame; with it the law is Haar.
    return sign_fixed_qr(G)


def sign_fixed_qr(A: Tensor) -> Tensor:
    """The orthonormal QR factor of ``A`` (..., D, k) with the signs that make diag(R) positive.

    Unique for full column rank and smooth in ``A`` (a zero diagonal entry keeps its sign +1).
    Used for Haar frames (:func:`random_subspaces`) and for the differentiable Stiefel
    parametrisation of :func:`nwlib.models.training.optimise_subspaces`.
    """
    Q, R = torch.linalg.qr(A)
    signs = torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return Q * signs.unsqueeze(-2)


def pairwise_overlap(X: Tensor) -> Tensor:
    """``‖X_hᵀ X_g‖_F²`` for every pair of heads at once: (..., H, D, k) -> (..., H, H).

    With orthonormal frames it is the sum of squared cosines of the principal angles between
    heads h and g (:func:`principal_angles`); the HDI and the orthogonality penalty of
    :mod:`nwlib.models.training` are its off-diagonal mean and sum.
    """
    return torch.einsum("...hdi,...gdj->...hgij", X, X).pow(2).sum((-1, -2))


def equiangular_heads(
    angle: float | Tensor,
    *,
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    shared_dim: int = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""A head family whose pairwise principal angles are prescribed: a path from identical to orthogonal.

    Let :math:`e_1, \dots, e_D` be the coordinate basis, s = ``shared_dim`` and
    r = ``head_dim - shared_dim``. Every head contains the shared block
    :math:`E_0 = [e_1, \dots, e_s]`; its other r columns are
    :math:`\cos\varphi\, B_0 + \sin\varphi\, B_h`, where :math:`B_0, B_1, \dots,
    B_H` are the next :math:`(H+1)` disjoint blocks of r coordinate vectors and
    :math:`\cos^2\varphi = \cos\theta`. Then :math:`Q_h^\top Q_{h'} =
    \mathrm{diag}(I_s, \cos\theta\, I_r)` for every pair h != h': each pair of
    heads has s zero principal angles and r angles equal to :math:`\theta` =
    ``angle``, and the invariant HDI is :math:`(r/d_k)\sin^2\theta`. At
    :math:`\theta = 0` all heads coincide, at :math:`\pi/2` their
    non-shared parts are pairwise orthogonal.

    Parameters
    ----------
    angle : float or Tensor of shape (...)
        The common principal angle :math:`\theta \in [0, \pi/2]` in radians; a
        tensor gives a batch of families (it must have the requested dtype and device).
    num_heads : int
        H >= 2.
    head_dim : int
        d_k >= 1.
    embed_dim : int
        Ambient dimension D; needs :math:`D \ge s + (H + 1) r`.
    shared_dim : int, default 0
        s, the number of leading coordinate directions all heads contain
        (0 <= s <= d_k).
    generator : torch.Generator, optional
        If given, each head's basis is replaced by :math:`Q_h R_h` with
        :math:`R_h` a Haar-random :math:`d_k \times d_k` orthogonal matrix:
        same subspaces, scrambled bases. Without it the bases are the
        coordinate-aligned ones above (deterministic).
    dtype, device : optional
        Of the result (defaults: torch's default dtype, CPU; a tensor ``angle``
        fixes both).

    Returns
    -------
    Tensor, shape (..., H, D, d_k)
        Orthonormal bases, one per head.

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int, ``shared_dim`` is outside [0, d_k], D is
        too small, an angle is outside :math:`[0, \pi/2]` or not finite, or the
        generator's device does not match.
    """
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    k = require_positive_int(head_dim, "head_dim")
    D = require_positive_int(embed_dim, "embed_dim")
    if isinstance(shared_dim, bool) or not isinstance(shared_dim, int):
        raise TypeError(f"shared_dim must be an int, got {type(shared_dim).__name__}")
    if not 0 <= shared_dim <= k:
        raise ValueError(f"shared_dim must be in [0, head_dim={k}], got {shared_dim}")
    s, r = shared_dim, k - shared_dim
    needed = s + (H + 1) * r
    if D < needed:
        raise ValueError(
            f"embed_dim must be >= shared_dim + (num_heads + 1) * (head_dim - shared_dim) = {needed}, got {D}"
        )
    if isinstance(angle, Tensor):
        theta = require_tensor(angle, "angle")
        if dtype is not None and theta.dtype != dtype:
            raise TypeError(f"angle has dtype {theta.dtype} but dtype={dtype} was requested")
        if device is not None and not same_device(theta.device, require_device(device)):
            raise ValueError(f"angle is on {theta.device} but device={device} was requested")
        # pi/2 rounded to float32 exceeds the true pi/2 by about 4e-8: allow a few ulps.
        upper = math.pi / 2 + 4 * torch.finfo(theta.dtype).eps
        if not bool(torch.isfinite(theta).all()) or bool((theta < 0).any()) or bool((theta > upper).any()):
            raise ValueError("angle must be finite and in [0, pi/2] (radians)")
    else:
        if isinstance(angle, bool) or not isinstance(angle, (int, float)):
            raise TypeError(f"angle must be a float or a tensor, got {type(angle).__name__}")
        value = require_real(angle, "angle", minimum=0.0, maximum=math.pi / 2)
        theta = torch.tensor(value, dtype=require_dtype(dtype), device=require_device(device))
    dtype, device = theta.dtype, theta.device
    # cos φ = sqrt(cos θ) makes (cos φ B0 + sin φ B_h)ᵀ(cos φ B0 + sin φ B_g) = cos²φ I = cos θ I.
    c = torch.sqrt(torch.cos(theta).clamp(min=0.0))
    sn = torch.sqrt((1 - c * c).clamp(min=0.0))
    batch = theta.shape
    Q = torch.zeros(*batch, H, D, k, dtype=dtype, device=device)
    eye_s = torch.eye(s, dtype=dtype, device=device)
    eye_r = torch.eye(r, dtype=dtype, device=device)
    Q[..., :s, :s] = eye_s
    for h in range(H):
        Q[..., h, s : s + r, s:] = c[..., None, None] * eye_r
        start = s + (h + 1) * r
        Q[..., h, start : start + r, s:] = sn[..., None, None] * eye_r
    if generator is not None:
        require_generator(generator, device)
        R = _haar_orthonormal((*batch, H), k, k, generator, dtype, device)
        Q = Q @ R
    return Q


def random_subspaces(
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    *,
    generator: torch.Generator,
    batch_shape: tuple[int, ...] = (),
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Independent, uniformly (Haar) distributed d_k-dimensional subspaces of :math:`\mathbb{R}^D`.

    Parameters
    ----------
    num_heads : int
        H >= 1 heads per family.
    head_dim : int
        d_k, with 1 <= d_k <= D.
    embed_dim : int
        Ambient dimension D.
    generator : torch.Generator
        Source of randomness (on ``device``).
    batch_shape : tuple of int, default ()
        Leading shape for independent families.
    dtype, device : optional
        Of the result (defaults: torch's default dtype; the generator's device).

    Returns
    -------
    Tensor, shape (*batch_shape, H, D, d_k)
        Orthonormal bases whose ranges are independent and uniform on the
        Grassmannian; for them :math:`\E \lVert Q_1^\top Q_2\rVert_F^2 = d_k^2/D`
        and so :math:`\E\,\mathrm{HDI} = 1 - d_k/D`.

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int, d_k > D, or the generator does not match ``device``.
    """
    H = require_positive_int(num_heads, "num_heads")
    k = require_positive_int(head_dim, "head_dim")
    D = require_positive_int(embed_dim, "embed_dim")
    if k > D:
        raise ValueError(f"head_dim must be <= embed_dim, got head_dim={k}, embed_dim={D}")
    require_generator(generator)
    device = require_device(device, default=generator.device)
    require_generator(generator, device)
    if not isinstance(batch_shape, tuple) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in batch_shape
    ):
        raise TypeError(f"batch_shape must be a tuple of non-negative ints, got {batch_shape!r}")
    return _haar_orthonormal((*batch_shape, H), D, k, generator, require_dtype(dtype), device)
