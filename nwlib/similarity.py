r"""Spectrum-aware similarity of head projections: the RV coefficient and linear CKA.

The Head Diversity Index (:func:`nwlib.hdi`) compares the *subspaces*
:math:`\mathrm{Range}(W_h)`: it orthonormalises each head first, so a direction
that head h barely uses (a tiny singular value of :math:`W_h`) counts as much
as its dominant one. The RV coefficient of Escoufier compares the operators
:math:`W_h W_h^\top` instead,

.. math::
    \mathrm{RV}(W_h, W_{h'}) = \frac{\langle W_h W_h^\top, W_{h'} W_{h'}^\top\rangle_F}
    {\lVert W_h W_h^\top\rVert_F\, \lVert W_{h'} W_{h'}^\top\rVert_F}
    = \frac{\lVert W_h^\top W_{h'}\rVert_F^2}{\lVert W_h^\top W_h\rVert_F\, \lVert W_{h'}^\top W_{h'}\rVert_F},

which weights every direction by its squared singular value. It lies in [0, 1],
is invariant to the scale of each head and to a change of orthonormal basis
:math:`W_h \to W_h U` (U orthogonal), is 1 exactly when :math:`W_h W_h^\top
\propto W_{h'} W_{h'}^\top` and 0 exactly when the ranges are orthogonal. For
heads with flat spectra (:math:`W_h^\top W_h = c_h^2 I`) it equals the mean
squared cosine of the principal angles, so :math:`1 - \operatorname{mean}_{h<h'}
\mathrm{RV}` is then the invariant HDI.

Centering the D rows first (:math:`W \to (I - \mathbf 1\mathbf 1^\top/D) W`)
turns RV into linear CKA (Kornblith et al. 2019), the similarity index of
representations; ``centered=True`` computes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._validation import require_same_dtype_device, require_tensor

__all__ = ["rv_coefficient", "pairwise_rv", "rv_diversity"]


def _center(A: Tensor) -> Tensor:
    return A - A.mean(dim=-2, keepdim=True)


def _check_pair(A: object, B: object) -> tuple[Tensor, Tensor]:
    A = require_tensor(A, "A", min_dim=2)
    B = require_tensor(B, "B", min_dim=2)
    require_same_dtype_device(A, "A", B=B)
    if A.shape[-2] != B.shape[-2]:
        raise ValueError(f"B must have as many rows (D) as A: A {tuple(A.shape)}, B {tuple(B.shape)}")
    try:
        torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch dimensions do not broadcast: A {tuple(A.shape)}, B {tuple(B.shape)}") from None
    return A, B


def _rv(A: Tensor, B: Tensor) -> Tensor:
    # ‖AᵀB‖_F² / (‖AᵀA‖_F ‖BᵀB‖_F): (p x q) products instead of the D x D operators.
    cross = (A.mT @ B).pow(2).sum((-2, -1))
    norm_a = torch.linalg.matrix_norm(A.mT @ A)
    norm_b = torch.linalg.matrix_norm(B.mT @ B)
    return cross / (norm_a * norm_b)


def rv_coefficient(A: Tensor, B: Tensor, *, centered: bool = False) -> Tensor:
    r"""The RV coefficient of :math:`AA^\top` and :math:`BB^\top` (linear CKA with ``centered=True``).

    Parameters
    ----------
    A : Tensor, shape (..., D, p)
    B : Tensor, shape (..., D, q)
        Same D; batch dimensions broadcast. Neither may be zero.
    centered : bool, default False
        Subtract each column's mean over the D rows first (linear CKA).

    Returns
    -------
    Tensor, shape (...)
        In [0, 1]; dtype and device of the inputs.

    Raises
    ------
    TypeError
        If an input is not a floating tensor or the dtypes differ.
    ValueError
        If the row counts differ, the batches do not broadcast, or an input is zero
        (after centering).

    Examples
    --------
    >>> import torch
    >>> from nwlib.similarity import rv_coefficient
    >>> I = torch.eye(4, dtype=torch.float64)
    >>> round(float(rv_coefficient(I[:, :2], 5 * I[:, [1, 0]])), 12), float(rv_coefficient(I[:, :2], I[:, 2:]))
    (1.0, 0.0)
    """
    A, B = _check_pair(A, B)
    if not isinstance(centered, bool):
        raise TypeError(f"centered must be a bool, got {type(centered).__name__}")
    if centered:
        A, B = _center(A), _center(B)
    for name, X in (("A", A), ("B", B)):
        if bool((X.abs().amax(dim=(-2, -1)) == 0).any()):
            raise ValueError(f"{name} must not be zero{' after centering' if centered else ''}")
    return _rv(A, B)


def _stack(projections: object) -> Tensor:
    if isinstance(projections, Tensor):
        P = require_tensor(projections, "projections", min_dim=3)
    elif isinstance(projections, Sequence) and not isinstance(projections, (str, bytes)):
        heads = [require_tensor(p, f"projections[{i}]", min_dim=2) for i, p in enumerate(projections)]
        if not heads or any(h.shape != heads[0].shape for h in heads):
            raise ValueError("projections must be a non-empty sequence of (D, d_k) tensors of one shape")
        for i, h in enumerate(heads):
            require_same_dtype_device(heads[0], "projections[0]", **{f"projections[{i}]": h})
        P = torch.stack(heads)
    else:
        raise TypeError(
            f"projections must be a tensor (..., H, D, d_k) or a sequence of tensors, got {type(projections).__name__}"
        )
    if P.shape[-3] < 2:
        raise ValueError(f"projections must hold at least two heads (H >= 2), got shape {tuple(P.shape)}")
    return P


def pairwise_rv(projections: Tensor | Sequence[Tensor], *, centered: bool = False) -> Tensor:
    """RV coefficients of all pairs of heads.

    Parameters
    ----------
    projections : Tensor of shape (..., H, D, d_k), or a sequence of H tensors (D, d_k)
    centered : bool, default False
        Linear CKA instead of RV.

    Returns
    -------
    Tensor, shape (..., H, H)
        Symmetric, with ones on the diagonal.

    Raises
    ------
    TypeError, ValueError
        As :func:`rv_coefficient`, and for fewer than two heads.
    """
    P = _stack(projections)
    if not isinstance(centered, bool):
        raise TypeError(f"centered must be a bool, got {type(centered).__name__}")
    if centered:
        P = _center(P)
    if bool((P.abs().amax(dim=(-2, -1)) == 0).any()):
        raise ValueError("projections must not contain a zero head")
    gram = P.mT @ P  # (..., H, k, k)
    norms = torch.linalg.matrix_norm(gram)  # (..., H)
    cross = torch.einsum("...hdi,...gdj->...hgij", P, P).pow(2).sum((-2, -1))
    return cross / (norms[..., :, None] * norms[..., None, :])


def rv_diversity(projections: Tensor | Sequence[Tensor], *, centered: bool = False) -> Tensor:
    r"""One minus the mean RV coefficient over pairs of heads: a spectrum-aware diversity index.

    Equals the invariant HDI (:func:`nwlib.hdi`) when every head has a flat
    spectrum (:math:`W_h^\top W_h \propto I`).

    Parameters
    ----------
    projections : Tensor of shape (..., H, D, d_k), or a sequence of H tensors (D, d_k)
    centered : bool, default False
        Use linear CKA instead of RV.

    Returns
    -------
    Tensor, shape (...)
        In [0, 1]: 0 when all heads have proportional operators :math:`W_hW_h^\top`,
        1 when their ranges are pairwise orthogonal.
    """
    R = pairwise_rv(projections, centered=centered)
    H = R.shape[-1]
    off = R.sum((-2, -1)) - R.diagonal(dim1=-2, dim2=-1).sum(-1)
    return 1 - off / (H * (H - 1))
