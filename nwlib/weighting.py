"""Structured weights for an ensemble of heads, and the best linear weights (Theorem 7.1).

An ensemble of H heads predicts ``Σ_h α_h f̂_h(x)``. When the weights sum to
one the ensemble error is ``Σ_h α_h (f̂_h − f)``, so its integrated mean
squared error is the quadratic form ``αᵀ M α`` in the heads' error
second-moment matrix

    M_hh' = E ∫ (f̂_h(x) − f(x)) (f̂_h'(x) − f(x)) dμ(x),

bias included. Structured schemes fix the *shape* of α in advance and only need
an ordering of the heads from best to worst:

- uniform: ``α_h = 1/H``;
- geometric: ``α_h ∝ r^(h−1)``, 0 < r <= 1;
- Fibonacci: ``α ∝ (F_H, …, F_2, F_1)`` with ``F_1 = F_2 = 1``;

whereas the optimal weights ``M⁻¹1 / (1ᵀM⁻¹1)`` need all of M (Bates and
Granger's combination of forecasts). Multi-head attention constrains neither:
its output projection adds the heads with free weights, whose analogue here is
:func:`least_squares_weights` (no sum-to-one constraint). Every weight vector here lists the
best-ranked head first; :func:`assign_by_rank` puts it back into head order.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ._validation import (
    require_device,
    require_dtype,
    require_positive_int,
    require_predictions_responses,
    require_predictions_target,
    require_real,
    require_same_dtype_device,
    require_tensor,
)
from .decomposition import ensemble_error

__all__ = [
    "uniform_weights",
    "geometric_weights",
    "fibonacci_weights",
    "optimal_weights",
    "combination_mse",
    "error_second_moments",
    "rank_heads",
    "HeadRanking",
    "assign_by_rank",
    "replicate_mse",
    "least_squares_weights",
]


def _factory(dtype: object, device: object) -> tuple[torch.dtype, torch.device]:
    return require_dtype(dtype), require_device(device)


def _normalised(values: list[float] | Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Normalise in float64 before casting, so float32 weights are the rounded exact ones.
    w = torch.as_tensor(values, dtype=torch.float64)
    return (w / w.sum()).to(device=device, dtype=dtype)


def uniform_weights(
    num_heads: int, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """Equal weights ``1/H``: the plain average of the heads.

    Parameters
    ----------
    num_heads : int
        Number of heads H (>= 1).
    dtype : torch.dtype, optional
        Floating dtype of the result (default: torch's default dtype).
    device : torch.device or str, optional
        Device of the result (default: CPU).

    Returns
    -------
    Tensor, shape (H,)
        ``torch.full((H,), 1/H)``.
    """
    H = require_positive_int(num_heads, "num_heads")
    dtype, device = _factory(dtype, device)
    return _normalised([1.0] * H, dtype, device)


def _check_ratio(ratio: object) -> float:
    # r > 1 would favour the worst-ranked head, contradicting the best-first convention.
    return require_real(ratio, "ratio", minimum=0.0, maximum=1.0, strict_minimum=True)


def geometric_weights(
    num_heads: int,
    ratio: float,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Geometrically decaying weights :math:`\alpha_h \propto r^{h-1}`, best head first.

    Parameters
    ----------
    num_heads : int
        Number of heads H (>= 1).
    ratio : float
        The common ratio ``r`` with ``0 < r <= 1``; ``r = 1`` gives uniform
        weights, ``r -> 0`` puts all weight on the first (best) head.
    dtype, device : optional
        As in :func:`uniform_weights`.

    Returns
    -------
    Tensor, shape (H,)
        :math:`r^{h-1} (1 - r) / (1 - r^H)` for ``h = 1..H`` (``1/H`` when ``r = 1``).

    Raises
    ------
    TypeError
        If ``num_heads`` is not an int, ``ratio`` not a real number, or ``dtype`` not floating.
    ValueError
        If ``num_heads < 1`` or ``ratio`` is outside (0, 1].
    """
    H = require_positive_int(num_heads, "num_heads")
    ratio = _check_ratio(ratio)
    dtype, device = _factory(dtype, device)
    powers = torch.full((H,), ratio, dtype=torch.float64).pow(torch.arange(H, dtype=torch.float64))
    return _normalised(powers, dtype, device)


def fibonacci_weights(
    num_heads: int, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    r"""Fibonacci weights :math:`\alpha \propto (F_H, \dots, F_2, F_1)`, best head first.

    With :math:`F_1 = F_2 = 1`, so ``H = 5`` gives weights proportional to
    ``(5, 3, 2, 1, 1)``; the normaliser is :math:`\sum_{k \le H} F_k = F_{H+2} - 1`.
    Consecutive weights decay by a factor tending to :math:`1/\varphi \approx 0.618`,
    so for large H these are close to :func:`geometric_weights` with that ratio,
    except that the last two weights are equal.

    Parameters
    ----------
    num_heads : int
        Number of heads H (>= 1).
    dtype, device : optional
        As in :func:`uniform_weights`.

    Returns
    -------
    Tensor, shape (H,)

    Examples
    --------
    >>> import torch
    >>> from nwlib import fibonacci_weights
    >>> (fibonacci_weights(5, dtype=torch.float64) * 12).tolist()
    [5.0, 3.0, 2.0, 1.0, 1.0]
    """
    H = require_positive_int(num_heads, "num_heads")
    dtype, device = _factory(dtype, device)
    fib = [1, 1]
    while len(fib) < H:
        fib.append(fib[-1] + fib[-2])
    fib = fib[:H][::-1]
    total = sum(fib)
    # Exact integers, then Python's correctly rounded int division: no overflow for large H.
    return torch.tensor([f / total for f in fib], dtype=torch.float64).to(device=device, dtype=dtype)


def _symmetry_tolerance(dtype: torch.dtype) -> float:
    # Monte Carlo estimates of M are symmetric only up to rounding in their reductions.
    return 1e3 * torch.finfo(dtype).eps


def _check_second_moment(M: object, name: str = "M") -> Tensor:
    M = require_tensor(M, name, min_dim=2)
    if M.shape[-1] != M.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dimensions, got shape {tuple(M.shape)}")
    if M.shape[-1] == 0:
        raise ValueError(f"{name} must be at least 1 x 1, got shape {tuple(M.shape)}")
    if not bool(torch.isfinite(M).all()):
        raise ValueError(f"{name} must be finite")
    scale = M.abs().amax(dim=(-2, -1), keepdim=True)
    asym = (M - M.mT).abs()
    if bool((asym > _symmetry_tolerance(M.dtype) * scale).any()):
        raise ValueError(
            f"{name} must be symmetric (largest |M - M^T| = {float(asym.max()):.3g}, "
            f"largest |M| = {float(scale.max()):.3g})"
        )
    return M


def _check_ridge(ridge: object) -> float:
    return require_real(ridge, "ridge", minimum=0.0)


def optimal_weights(M: Tensor, *, ridge: float = 0.0) -> Tensor:
    r"""The weights summing to one that minimise :math:`\alpha^\top M \alpha`.

    By a Lagrange multiplier, the minimiser of :math:`\alpha^\top M \alpha`
    subject to :math:`\mathbf 1^\top \alpha = 1` is

    .. math:: \alpha^* = \frac{M^{-1}\mathbf 1}{\mathbf 1^\top M^{-1}\mathbf 1},
              \qquad \alpha^{*\top} M \alpha^* = \frac{1}{\mathbf 1^\top M^{-1}\mathbf 1}.

    With M the heads' error second-moment matrix (see
    :func:`error_second_moments`) this is the best linear combination of the
    heads, and the smallest ensemble MSE any weighting can reach. The weights
    are not constrained to be non-negative: strongly correlated heads can get
    negative weights.

    Parameters
    ----------
    M : Tensor, shape (..., H, H)
        Symmetric positive definite matrices (a batch of them is allowed).
        Symmetry is checked to a relative tolerance of ``1000 * eps`` of the
        dtype, and M is then symmetrised.
    ridge : float, default 0.0
        Non-negative shrinkage ``λ``: the weights are computed for
        :math:`M + \lambda\,\bar m\, I` with :math:`\bar m = \operatorname{tr}(M)/H`
        the mean diagonal entry, so ``λ`` is scale free. ``λ > 0`` regularises a
        singular or noisy M (for example two identical heads); as
        ``λ -> ∞`` the weights tend to uniform.

    Returns
    -------
    Tensor, shape (..., H)
        Weights summing to one along the last dimension, in the order of M's
        rows (not sorted); dtype and device of ``M``.

    Raises
    ------
    TypeError
        If ``M`` is not a floating tensor or ``ridge`` not a real number.
    ValueError
        If ``M`` is not square, is empty, is not finite, not symmetric, or
        (after the ridge) not positive definite; if ``ridge`` is negative.
    """
    M = _check_second_moment(M)
    ridge = _check_ridge(ridge)
    M = 0.5 * (M + M.mT)
    H = M.shape[-1]
    if ridge > 0:
        mean_diag = M.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None]
        M = M + ridge * mean_diag * torch.eye(H, dtype=M.dtype, device=M.device)
    L, info = torch.linalg.cholesky_ex(M)
    if bool((info > 0).any()):
        raise ValueError(
            "M must be symmetric positive definite (its Cholesky factorisation failed); "
            "identical or perfectly correlated heads make M singular: pass ridge > 0"
        )
    ones = torch.ones(*M.shape[:-1], 1, dtype=M.dtype, device=M.device)
    z = torch.cholesky_solve(ones, L).squeeze(-1)
    return z / z.sum(-1, keepdim=True)


def combination_mse(weights: Tensor, M: Tensor) -> Tensor:
    r"""The quadratic form :math:`\alpha^\top M \alpha`.

    For weights summing to one and M from :func:`error_second_moments`, this is
    the ensemble's integrated MSE (bias, variances and covariances together).
    For weights that do not sum to one it is *not* the MSE, because the error
    then contains :math:`(\mathbf 1^\top\alpha - 1) f`.

    Parameters
    ----------
    weights : Tensor, shape (..., H)
    M : Tensor, shape (..., H, H)
        Symmetric; batch dimensions broadcast against those of ``weights``.

    Returns
    -------
    Tensor, shape (...)
    """
    weights = require_tensor(weights, "weights", min_dim=1)
    M = _check_second_moment(M)
    require_same_dtype_device(M, "M", weights=weights)
    if weights.shape[-1] != M.shape[-1]:
        raise ValueError(
            f"weights must have one entry per row of M: weights {tuple(weights.shape)}, M {tuple(M.shape)}"
        )
    return torch.einsum("...h,...hg,...g->...", weights, M, weights)


def error_second_moments(predictions: Tensor, target: Tensor) -> Tensor:
    r"""Monte Carlo estimate of the heads' error second-moment matrix M.

    :math:`\hat M_{hh'} = \frac{1}{Rm}\sum_{r,j} e_{rhj} e_{rh'j}` with
    :math:`e_{rhj} = \hat f_h^{(r)}(x_j) - f(x_j)`: the point-averaged
    :math:`\E[(\hat f_h - f)(\hat f_{h'} - f)]`, so that
    ``combination_mse(alpha, M)`` estimates the integrated MSE of the
    ensemble for any ``alpha`` summing to one. The diagonal holds the heads'
    own integrated MSEs.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        Head predictions of R Monte Carlo replicates at m evaluation points
        (the output of :func:`nwlib.simulate`).
    target : Tensor, shape (m,)
        The true regression function at the evaluation points.

    Returns
    -------
    Tensor, shape (H, H)
        Symmetric positive semi-definite; dtype and device of ``predictions``.
    """
    predictions, target = require_predictions_target(predictions, target)
    R, H, m = predictions.shape
    eye = torch.eye(H, dtype=predictions.dtype, device=predictions.device)
    flat = ensemble_error(predictions, target, eye).reshape(H, R * m)  # each head's own errors
    M = flat @ flat.mT / (R * m)
    return 0.5 * (M + M.mT)


class HeadRanking(NamedTuple):
    """Heads ordered by estimated integrated MSE (see :func:`rank_heads`)."""

    order: Tensor
    """(H,) int64: head indices, best (smallest MSE) first."""
    head_mse: Tensor
    """(H,) integrated MSE of each head, in head order."""
    head_mse_se: Tensor
    """(H,) Monte Carlo standard error of ``head_mse`` (across replicates)."""


def rank_heads(predictions: Tensor, target: Tensor) -> HeadRanking:
    """Rank heads by their estimated integrated MSE, best first.

    A head's quality is its integrated MSE
    :math:`\\frac{1}{m}\\sum_j \\E(\\hat f_h(x_j) - f(x_j))^2`, estimated from
    the replicates; its standard error is the standard deviation across
    replicates of the per-replicate point average, over :math:`\\sqrt R`.
    Ties keep head order (stable sort).

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
    target : Tensor, shape (m,)
        As in :func:`error_second_moments`.

    Returns
    -------
    HeadRanking
        ``order`` (H,) int64 on the device of ``predictions``, ``head_mse`` (H,)
        and ``head_mse_se`` (H,) (zero when R = 1).
    """
    predictions, target = require_predictions_target(predictions, target)
    eye = torch.eye(predictions.shape[1], dtype=predictions.dtype, device=predictions.device)
    per_rep = ensemble_error(predictions, target, eye).pow(2).mean(-1).mT  # (R, H): each head's own error
    R = per_rep.shape[0]
    head_mse = per_rep.mean(0)
    if R > 1:
        se = per_rep.std(0, correction=1) / math.sqrt(R)
    else:
        se = torch.zeros_like(head_mse)
    order = torch.sort(head_mse, stable=True).indices
    return HeadRanking(order=order, head_mse=head_mse, head_mse_se=se)


def assign_by_rank(weights: Tensor, order: Tensor) -> Tensor:
    """Put rank-ordered weights back into head order.

    Head ``order[i]`` receives ``weights[..., i]``, so
    ``assign_by_rank(fibonacci_weights(H), rank_heads(p, f).order)`` gives the
    largest Fibonacci weight to the best head.

    Parameters
    ----------
    weights : Tensor, shape (..., H)
        Weights listed best-ranked first.
    order : Tensor, shape (H,), integer
        A permutation of ``0..H-1``, best head first (``HeadRanking.order``).

    Returns
    -------
    Tensor, shape (..., H)
        The same weights indexed by head.
    """
    weights = require_tensor(weights, "weights", min_dim=1)
    order = require_tensor(order, "order", min_dim=1, floating=False)
    if order.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"order must have an integer dtype, got {order.dtype}")
    if order.device != weights.device:
        raise ValueError(f"order is on {order.device} but weights is on {weights.device}; move them to one device")
    H = weights.shape[-1]
    if order.dim() != 1 or order.shape[0] != H:
        raise ValueError(
            f"order must have shape ({H},) to match weights {tuple(weights.shape)}, got {tuple(order.shape)}"
        )
    order = order.long()
    if not torch.equal(torch.sort(order).values, torch.arange(H, device=order.device)):
        raise ValueError(f"order must be a permutation of 0..{H - 1}, got {order.tolist()}")
    out = torch.empty_like(weights)
    out[..., order] = weights
    return out


def replicate_mse(predictions: Tensor, target: Tensor, weights: Tensor) -> Tensor:
    r"""Integrated squared error of the weighted ensemble, one value per replicate.

    :math:`\frac1m \sum_j \big(\sum_h \alpha_h \hat f^{(r)}_h(x_j) - f(x_j)\big)^2`
    for each replicate r. The mean over replicates is the ensemble's
    integrated MSE and the standard deviation over :math:`\sqrt R` its
    standard error; two weightings evaluated on the same replicates can be
    compared by paired differences, which have much smaller standard errors.
    Unlike :func:`combination_mse` this is the actual error also when the
    weights do not sum to one.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
    target : Tensor, shape (m,)
    weights : Tensor, shape (..., H)
        One or a batch of weight vectors in head order.

    Returns
    -------
    Tensor, shape (..., R)
    """
    predictions, target = require_predictions_target(predictions, target)
    weights = require_tensor(weights, "weights", min_dim=1)
    require_same_dtype_device(predictions, "predictions", weights=weights)
    if weights.shape[-1] != predictions.shape[1]:
        raise ValueError(
            "weights must have one entry per head (H): "
            f"predictions {tuple(predictions.shape)}, weights {tuple(weights.shape)}"
        )
    return ensemble_error(predictions, target, weights).pow(2).mean(-1)


def least_squares_weights(predictions: Tensor, target: Tensor, *, ridge: float = 0.0) -> Tensor:
    r"""Unconstrained least-squares weights for the heads: the analogue of the output projection W_O.

    Minimises :math:`\frac{1}{Rm}\sum_{r,j} \big(\sum_h \alpha_h \hat f^{(r)}_h(x_j) - y_{rj}\big)^2`
    over :math:`\alpha \in \mathbb{R}^H`, with no sum-to-one constraint: like
    multi-head attention's output projection, the weights may add the heads up,
    shrink them, or give some a negative weight. Fit them on data that the
    weights are not then evaluated on.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        Head predictions on the fitting data.
    target : Tensor, shape (m,) or (R, m)
        What the combination should reproduce: the true f at the points, or
        per-replicate noisy responses.
    ridge : float, default 0.0
        Adds ``ridge * mean(diag(G)) * I`` to the Gram matrix G of the heads
        (scale-free), for nearly collinear heads.

    Returns
    -------
    Tensor, shape (H,)
        The weights, dtype and device of ``predictions``.

    Raises
    ------
    TypeError, ValueError
        On wrong types, shapes, dtypes or devices, or a negative ``ridge``.

    Examples
    --------
    >>> import torch
    >>> from nwlib import least_squares_weights
    >>> g = torch.Generator().manual_seed(0)
    >>> heads = torch.randn(50, 2, 30, generator=g, dtype=torch.float64)
    >>> y = 2.0 * heads[:, 0] - 0.5 * heads[:, 1]
    >>> least_squares_weights(heads, y).round(decimals=6).tolist()
    [2.0, -0.5]
    """
    predictions, target = require_predictions_responses(predictions, target, name="target")
    R, H, m = predictions.shape
    ridge = _check_ridge(ridge)
    flat = predictions.permute(1, 0, 2).reshape(H, R * m)
    gram = flat @ flat.mT / (R * m)
    rhs = flat @ target.expand(R, m).reshape(R * m) / (R * m)
    if ridge > 0:
        gram = gram + ridge * gram.diagonal().mean() * torch.eye(H, dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram, rhs)
