"""Heads ranked by quality: nested ensembles, rankings from validation data, rank agreement.

Theorem 7.1 (chapter 4) compares weighting schemes for heads *ranked by quality*.
Two questions need more than :mod:`nwlib.weighting` offers:

- **Adding heads in order of quality.** With the heads sorted best first, the
  ensemble of the k best heads, k = 1, ..., H, weighted by one scheme:
  :func:`nested_weights` returns all H ensembles at once, one row each, so that
  :func:`nwlib.replicate_mse` scores them on the same training sets (paired).
- **A ranking a user can compute.** The true f is unknown in practice; what a
  user has is a validation set of noisy responses :math:`y = f(x) + \\varepsilon`.
  :func:`validation_ranking` ranks the heads by their validation error and
  returns the residual second-moment matrix, from which
  :func:`nwlib.optimal_weights` fits weights. Noise independent of the heads adds
  :math:`\\sigma^2` to every entry of that matrix, :math:`\\sigma^2\\mathbf 1\\mathbf 1^\\top`,
  which changes neither the expected ranking nor the expected optimal weights
  (for weights summing to one it adds the constant :math:`\\sigma^2` to every
  scheme's risk). :func:`kendall_tau` measures how far such a ranking is from a
  reference one.

Orderings follow :class:`nwlib.HeadRanking`: a permutation of head indices,
best head first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._validation import (
    require_choice,
    require_dtype,
    require_predictions_responses,
    require_real,
    require_tensor,
    same_device,
)
from .weighting import fibonacci_weights, geometric_weights, optimal_weights, uniform_weights

__all__ = ["NESTED_SCHEMES", "nested_weights", "ValidationRanking", "validation_ranking", "kendall_tau"]

NESTED_SCHEMES: tuple[str, ...] = ("uniform", "fibonacci", "geometric", "optimal")
"""Schemes accepted by :func:`nested_weights`."""


def _require_order(order: object, name: str = "order") -> Tensor:
    order = require_tensor(order, name, min_dim=1, floating=False)
    if order.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must have an integer dtype, got {order.dtype}")
    H = order.shape[-1]
    if H < 1:
        raise ValueError(f"{name} must list at least one head, got shape {tuple(order.shape)}")
    order = order.long()
    expected = torch.arange(H, device=order.device).expand_as(order)
    if not torch.equal(torch.sort(order, dim=-1).values, expected):
        raise ValueError(f"{name} must be a permutation of 0..{H - 1} along its last dimension")
    return order


def nested_weights(
    scheme: str,
    order: Tensor,
    *,
    ratio: float | None = None,
    second_moments: Tensor | None = None,
    ridge: float = 0.0,
    dtype: torch.dtype | None = None,
) -> Tensor:
    r"""Weights of the ensembles of the k best heads, k = 1, ..., H, for one scheme.

    Row ``k - 1`` holds the weights of the ensemble made of the heads
    ``order[:k]`` (the k best), weighted by ``scheme`` as if there were only
    those k heads, in head order and zero on the other heads:

    - ``"uniform"``: ``1/k`` each;
    - ``"fibonacci"``: :func:`nwlib.fibonacci_weights` of length k, the largest
      on the best head;
    - ``"geometric"``: :func:`nwlib.geometric_weights` of length k with ``ratio``;
    - ``"optimal"``: :func:`nwlib.optimal_weights` of the k x k block of
      ``second_moments`` that belongs to the k best heads.

    Every row sums to one, so ``combination_mse(rows, M)`` is each ensemble's MSE
    and :func:`nwlib.replicate_mse` scores all H ensembles on the same replicates.

    Parameters
    ----------
    scheme : {"uniform", "fibonacci", "geometric", "optimal"}
    order : Tensor, shape (H,), integer
        A permutation of ``0..H-1``, best head first (``HeadRanking.order``).
    ratio : float, optional
        The geometric ratio, ``0 < ratio <= 1``; required for ``"geometric"`` and
        not allowed otherwise.
    second_moments : Tensor, shape (H, H), optional
        The heads' error second-moment matrix M in head order (see
        :func:`nwlib.error_second_moments`); required for ``"optimal"`` and not
        allowed otherwise. It sets the dtype and device of the result.
    ridge : float, default 0.0
        Passed to :func:`nwlib.optimal_weights` (``"optimal"`` only).
    dtype : torch.dtype, optional
        Floating dtype of the result for the structured schemes (default: torch's
        default dtype); with ``"optimal"`` it must be None or M's dtype.

    Returns
    -------
    Tensor, shape (H, H)
        ``out[k - 1, h]``: weight of head h in the ensemble of the k best heads;
        on the device of ``order`` (of ``second_moments`` for ``"optimal"``).

    Raises
    ------
    TypeError
        If ``order`` is not an integer tensor, ``second_moments`` not a floating
        tensor, ``ratio`` not a real number or ``dtype`` not floating.
    ValueError
        If ``scheme`` is unknown, ``order`` is not a permutation, ``ratio`` or
        ``second_moments`` is missing where needed or given where not, shapes or
        devices do not match, or ``dtype`` contradicts ``second_moments``.

    Examples
    --------
    >>> import torch
    >>> from nwlib.ranking import nested_weights
    >>> nested_weights("uniform", torch.tensor([2, 0, 1]), dtype=torch.float64).tolist()
    [[0.0, 0.0, 1.0], [0.5, 0.0, 0.5], [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]]
    """
    scheme = require_choice(scheme, "scheme", NESTED_SCHEMES)
    order = _require_order(order)
    if order.dim() != 1:
        raise ValueError(f"order must have shape (H,), got {tuple(order.shape)}")
    H = order.shape[0]
    if scheme == "geometric":
        if ratio is None:
            raise ValueError("ratio is required for scheme='geometric'")
        ratio = require_real(ratio, "ratio", minimum=0.0, maximum=1.0, strict_minimum=True)
    elif ratio is not None:
        raise ValueError(f"ratio is only used by scheme='geometric', got scheme={scheme!r}")
    if scheme == "optimal":
        if second_moments is None:
            raise ValueError("second_moments is required for scheme='optimal'")
        M = require_tensor(second_moments, "second_moments", min_dim=2)
        if M.shape != (H, H):
            raise ValueError(f"second_moments must have shape (H, H) = ({H}, {H}), got {tuple(M.shape)}")
        if not same_device(M.device, order.device):
            raise ValueError(f"second_moments is on {M.device} but order is on {order.device}")
        if dtype is not None and require_dtype(dtype) != M.dtype:
            raise ValueError(f"dtype must be None or second_moments' dtype {M.dtype}, got {dtype}")
        out_dtype = M.dtype
    else:
        if second_moments is not None:
            raise ValueError(f"second_moments is only used by scheme='optimal', got scheme={scheme!r}")
        out_dtype = require_dtype(dtype, default=torch.get_default_dtype())
    require_real(ridge, "ridge", minimum=0.0)
    out = torch.zeros(H, H, dtype=out_dtype, device=order.device)
    for k in range(1, H + 1):
        top = order[:k]
        if scheme == "uniform":
            w = uniform_weights(k, dtype=out_dtype, device=order.device)
        elif scheme == "fibonacci":
            w = fibonacci_weights(k, dtype=out_dtype, device=order.device)
        elif scheme == "geometric":
            w = geometric_weights(k, ratio, dtype=out_dtype, device=order.device)  # type: ignore[arg-type]
        else:
            w = optimal_weights(M[top][:, top], ridge=ridge)
        out[k - 1, top] = w
    return out


class ValidationRanking(NamedTuple):
    """Heads ranked by their error on validation data (see :func:`validation_ranking`)."""

    order: Tensor
    """(H,) int64: head indices, smallest validation error first."""
    head_error: Tensor
    """(H,) mean squared validation residual of each head, in head order."""
    second_moments: Tensor
    """(H, H) residual second moments, in head order; its diagonal is ``head_error``."""


def validation_ranking(predictions: Tensor, responses: Tensor) -> ValidationRanking:
    r"""Rank heads by their squared error against noisy validation responses.

    With residuals :math:`u_{rhj} = \hat f^{(r)}_h(x_j) - y_{rj}` at m validation
    points and R training sets pooled,

    .. math:: \hat M_{hh'} = \frac{1}{Rm}\sum_{r,j} u_{rhj}\, u_{rh'j},

    and the heads are ordered by the diagonal, smallest first (ties keep head
    order). If :math:`y = f + \varepsilon` with noise of variance
    :math:`\sigma^2` independent of the heads, :math:`\E\hat M = M + \sigma^2\mathbf 1\mathbf 1^\top`:
    the expected ranking and the expected optimal weights are those of the
    error second-moment matrix M (see the module docstring). A user with one
    training set passes R = 1.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        Each head's predictions at the validation points, from R training sets.
    responses : Tensor, shape (m,) or (R, m)
        Noisy responses at those points: one set shared by the R training sets,
        or one per training set.

    Returns
    -------
    ValidationRanking
        ``order`` (H,), ``head_error`` (H,) and ``second_moments`` (H, H), on the
        device and (except ``order``) in the dtype of ``predictions``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor or the dtypes differ.
    ValueError
        On shape mismatches or mixed devices.

    Examples
    --------
    >>> import torch
    >>> from nwlib.ranking import validation_ranking
    >>> y = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    >>> heads = torch.stack([y + 0.3, y - 0.1, y + 1.0])[None]   # (R=1, H=3, m=3)
    >>> validation_ranking(heads, y).order.tolist()
    [1, 0, 2]
    """
    predictions, responses = require_predictions_responses(predictions, responses)
    R, H, m = predictions.shape
    residuals = (predictions - responses.expand(R, m).unsqueeze(1)).transpose(0, 1).reshape(H, R * m)
    M = residuals @ residuals.mT / (R * m)
    M = 0.5 * (M + M.mT)
    head_error = M.diagonal().clone()
    order = torch.sort(head_error, stable=True).indices
    return ValidationRanking(order=order, head_error=head_error, second_moments=M)


def kendall_tau(order: Tensor, reference: Tensor) -> Tensor:
    r"""Kendall's rank correlation between two orderings of the same heads.

    Both arguments list head indices best first. Over the :math:`H(H-1)/2` pairs
    of heads, :math:`\tau` = (pairs ordered alike − pairs ordered oppositely) /
    pairs: 1 for the same ranking, −1 for the reversed one. Orderings have no
    ties, so this is Kendall's :math:`\tau_a` (= :math:`\tau_b`).

    Parameters
    ----------
    order : Tensor, shape (..., H), integer
        Permutations of ``0..H-1`` along the last dimension (a batch is allowed).
    reference : Tensor, shape (H,) or (..., H), integer
        The ordering to compare with; broadcasts against ``order``.

    Returns
    -------
    Tensor, shape (...)
        float64 values in [−1, 1], on the device of ``order``.

    Raises
    ------
    TypeError
        If an argument is not an integer tensor.
    ValueError
        If an argument is not a permutation along its last dimension, H < 2, the
        lengths differ, or the devices differ.

    Examples
    --------
    >>> import torch
    >>> from nwlib.ranking import kendall_tau
    >>> float(kendall_tau(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 2, 3])))
    0.6666666666666666
    """
    order = _require_order(order)
    reference = _require_order(reference, "reference")
    H = order.shape[-1]
    if reference.shape[-1] != H:
        raise ValueError(f"reference must order the same H = {H} heads, got shape {tuple(reference.shape)}")
    if H < 2:
        raise ValueError("order must list at least two heads for a rank correlation")
    if not same_device(reference.device, order.device):
        raise ValueError(f"reference is on {reference.device} but order is on {order.device}")

    def positions(o: Tensor) -> Tensor:
        # position of each head in the ordering: the inverse permutation
        pos = torch.empty_like(o)
        pos.scatter_(-1, o, torch.arange(H, device=o.device).expand_as(o))
        return pos

    pa, pb = positions(order), positions(reference)
    da = torch.sign(pa.unsqueeze(-1) - pa.unsqueeze(-2))
    db = torch.sign(pb.unsqueeze(-1) - pb.unsqueeze(-2))
    # every unordered pair appears twice in the full (H, H) sign products
    return (da * db).sum(dim=(-2, -1)).to(torch.float64) / (H * (H - 1))
