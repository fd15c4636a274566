r"""Bandwidth selection for Nadaraya–Watson regression by leave-one-out cross-validation.

The leave-one-out (LOO) least-squares score of a bandwidth h is

    CV(h) = (1/n) Σ_i ‖y_i − f̂_{−i}(x_i)‖²,   f̂_{−i}(x_i) = Σ_{j≠i} K_ij y_j / Σ_{j≠i} K_ij,

with K_ij = K(x_i, x_j). Removing point i from its own estimate looks like it needs
the (n, n) kernel matrix with its diagonal cut out. It does not: one attention call
with one extra key gives it.

In the form used by :mod:`nwlib.kernels` the log-weight of query q against key k_j is
s(q, k_j) = scale·(⟨q, k_j⟩ + offset_j). Append to every key a zero coordinate, add a
dummy key e (zero except for a 1 in that coordinate, offset 0), and give query i
the extra coordinate a_i = s_ii / scale, where s_ii = s(x_i, x_i) is its log-weight
against its own key. The real logits are unchanged and the dummy's logit is s_ii:
the dummy weighs exactly as much as the point itself. With responses [y_j, 0] for the
real keys and [0, 1] for the dummy, the outputs of query i are

    o_i = S_i / (Z_i + K_ii),   p_i = K_ii / (Z_i + K_ii),

with S_i = Σ_j K_ij y_j and Z_i = Σ_j K_ij (both including j = i). Then
(Z_i − K_ii)/(Z_i + K_ii) = 1 − 2p_i, and

    f̂_{−i}(x_i) = (o_i − p_i y_i) / (1 − 2p_i),   y_i − f̂_{−i}(x_i) = ((1 − p_i) y_i − o_i) / (1 − 2p_i).

Everything stays on SDPA's fused path: n + 1 keys, no (n, n) matrix. The offsets
(the Gaussian's −‖k_j‖²/2 term) are passed as one more coordinate (1 on the queries)
rather than as SDPA's attention mask, which SDPA differentiates only on its
materialising math path; so the score is differentiable with respect to a tensor
bandwidth (and the data) with the fused kernel doing the backward pass too.

Accuracy: 1 − 2p_i is the other points' share of the weight. The rounding of the
logits puts an error of up to about 5·eps·(1 + |s_ii|) on it (``eps``: the dtype's
machine epsilon; measured), so point i's residual carries a relative error of about
5·eps·(1 + |s_ii|)/(1 − 2p_i). That is negligible while every point has neighbours
within a few h, but a point far from the others (an outlier in x, or h well below
the spacing of the points) makes the score inaccurate in float32 (eps ≈ 1.2e-7) long
before float64 (eps ≈ 2.2e-16): score such data in float64. Where the share is not
distinguishable from its rounding error the leave-one-out estimate is undefined
and the score is +inf (see :func:`loo_cv_score`).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from ._validation import (
    broadcast_batch,
    require_choice,
    require_positive_int,
    require_same_dtype_device,
    require_tensor,
)
from .kernels import KERNELS, _attention, _check_values, _require_positive_finite_tensor, _scaled_inputs

__all__ = ["BandwidthSelection", "METHODS", "loo_cv_score", "select_bandwidth"]

METHODS: tuple[str, ...] = ("loo",)
"""Selection criteria accepted by :func:`select_bandwidth`."""

_UNDEFINED_SHARE = 8.0
"""1 − 2p_i ≤ this · eps · (1 + |s_ii|) counts as "no other point has weight".

The rounding of the logits puts an absolute error of about eps·|s_ii| on 1 − 2p_i;
measured on Gaussian data (n = 200, d = 1, 2, 5, h from 0.003 to 1 times the data
scale) it stayed below 5·eps·(1 + |s_ii|) in float32 and float64. Below this threshold
the other points' share is not distinguishable from that error.
"""

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _check_keys_values(keys: object, values: object) -> tuple[Tensor, Tensor, bool]:
    """keys (..., n, d) with n >= 2 and values (..., n, p) or (..., n), as (..., n, p)."""
    keys = require_tensor(keys, "keys", min_dim=2)
    if keys.shape[-2] < 2:
        raise ValueError(f"keys must have at least 2 rows (n >= 2) to leave one out, got shape {tuple(keys.shape)}")
    if keys.shape[-1] < 1:
        raise ValueError(f"keys must have at least one feature (d >= 1), got shape {tuple(keys.shape)}")
    values, scalar = _check_values(keys, values)
    if values.shape[-1] < 1:
        raise ValueError(f"values must have at least one response column, got shape {tuple(values.shape)}")
    return keys, values, scalar


def _loo_scores(keys: Tensor, values: Tensor, bandwidth: float | Tensor | None, kernel: str) -> Tensor:
    """CV(h) for checked keys (..., n, d) and values (..., n, p); the bandwidth is checked here."""
    p = values.shape[-1]
    shapes = {"keys": keys.shape[:-2], "values": values.shape[:-2]}
    if isinstance(bandwidth, Tensor):
        shapes["bandwidth"] = bandwidth.shape
    batch = broadcast_batch(shapes)
    # The queries are the keys themselves: only the keys' scaled copy is needed.
    _, k, offset, scale = _scaled_inputs(keys[..., :1, :], keys, kernel, bandwidth)
    ones = k.new_ones(()).expand(*k.shape[:-1], 1)  # (..., n, 1)
    zeros = k.new_zeros(()).expand(*k.shape[:-1], 1)
    # a_i = s_ii / scale, query i's log-weight against its own key: the dummy's logit.
    a = k.pow(2).sum(-1, keepdim=True)
    if offset is not None:
        # The offsets ride in a coordinate (1 on the queries), not in SDPA's mask.
        a = a + offset.unsqueeze(-1)
        queries = torch.cat([k, ones, a], dim=-1)
        keys_aug = torch.cat([k, offset.unsqueeze(-1), zeros], dim=-1)
    else:
        queries = torch.cat([k, a], dim=-1)
        keys_aug = torch.cat([k, zeros], dim=-1)
    width = keys_aug.shape[-1]
    dummy = torch.nn.functional.one_hot(torch.tensor(width - 1, device=k.device), width).to(k.dtype)
    keys_aug = torch.cat([keys_aug, dummy.expand(*keys_aug.shape[:-2], 1, width)], dim=-2)
    # Responses [y_j, 0] for the real keys and the indicator [0, 1] for the dummy.
    indicator = torch.nn.functional.one_hot(torch.tensor(p, device=k.device), p + 1).to(k.dtype)
    values_aug = torch.cat(
        [
            torch.nn.functional.pad(values, (0, 1)),
            indicator.expand(*values.shape[:-2], 1, p + 1),
        ],
        dim=-2,
    )
    out = _attention(queries, keys_aug, values_aug, None, batch, scale)  # (*batch, n, p + 1)
    o, self_share = out[..., :p], out[..., p:]  # o_i and p_i
    others = 1.0 - 2.0 * self_share  # (Z_i − K_ii)/(Z_i + K_ii): the other points' share
    rounding = torch.finfo(k.dtype).eps * (1.0 + (scale * a).abs())
    undefined = (others <= _UNDEFINED_SHARE * rounding).squeeze(-1)
    # A safe denominator, not a division by ~0 masked afterwards, keeps NaN out of the gradient.
    safe = torch.where(undefined.unsqueeze(-1), torch.ones_like(others), others)
    residual = ((1.0 - self_share) * values - o) / safe  # y_i − f̂_{−i}(x_i)
    squared = residual.pow(2).sum(-1)
    squared = torch.where(undefined, torch.full_like(squared, math.inf), squared)
    return squared.mean(-1)


def loo_cv_score(
    keys: Tensor,
    values: Tensor,
    bandwidth: float | Tensor | None,
    *,
    kernel: Literal["exp", "gaussian"] = "gaussian",
) -> Tensor:
    r"""Leave-one-out least-squares cross-validation score of a Nadaraya–Watson bandwidth.

    Computes :math:`\mathrm{CV}(h) = \frac1n \sum_i \lVert y_i - \hat f_{-i}(x_i)\rVert^2`,
    where :math:`\hat f_{-i}` is the estimate of :func:`nwlib.nadaraya_watson` from all
    points but the i-th, with one fused attention call over n + 1 keys and no (n, n)
    matrix (derivation in the module docstring).

    Parameters
    ----------
    keys : Tensor, shape (..., n, d)
        Training inputs x_i, n >= 2.
    values : Tensor, shape (..., n, p) or (..., n)
        Training responses y_i; vector responses contribute their squared Euclidean norm.
    bandwidth : float or Tensor or None
        The bandwidth h, as in :func:`nwlib.nadaraya_watson` (``None`` only for
        ``"exp"``, meaning :math:`d^{1/4}`). A tensor broadcasts against the batch
        shape (for example shape (c, 1) scores c bandwidths for every head), and the
        score is differentiable with respect to it.
    kernel : {"gaussian", "exp"}, default "gaussian"
        As in :func:`nwlib.nadaraya_watson`.

    Returns
    -------
    Tensor, shape (...)
        The score per batch element, with the broadcast batch shape of ``keys``,
        ``values`` and ``bandwidth``; dtype and device of the inputs. It is ``+inf``
        where the leave-one-out estimate of some point is undefined in the working
        precision: the other points' share of its weight, 1 − 2p_i, is not above
        8·eps·(1 + |s_ii|), about the rounding error that the logits put on it
        (s_ii: the point's log-weight against itself, as in the module docstring;
        ``eps``: the dtype's machine epsilon). This happens only when h is far below
        the distance from some point to its neighbours, and keeps such bandwidths
        from being selected. Points almost that isolated make a float32 score
        inaccurate (module docstring): use float64 for such data.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, dtypes differ, or ``kernel`` is not a string.
    ValueError
        On n < 2, shape mismatches, non-broadcasting batch shapes, mixed devices, an
        unknown kernel, or a bandwidth that is missing (Gaussian), non-finite or not > 0
        (tensors: checked as in :func:`nwlib.nadaraya_watson`).

    Examples
    --------
    >>> import torch
    >>> from nwlib.bandwidth import loo_cv_score
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.linspace(-2, 2, 50, dtype=torch.float64)[:, None]
    >>> y = torch.sin(2 * x[:, 0]) + 0.3 * torch.randn(50, generator=g, dtype=torch.float64)
    >>> h = torch.tensor([0.02, 0.2, 2.0], dtype=torch.float64)
    >>> scores = loo_cv_score(x, y, h)  # three bandwidths at once: too small, good, too large
    >>> scores.shape, bool(scores[1] < scores[0]) and bool(scores[1] < scores[2])
    (torch.Size([3]), True)
    """
    kernel = require_choice(kernel, "kernel", KERNELS)  # type: ignore[assignment]
    keys, values, _ = _check_keys_values(keys, values)
    if isinstance(bandwidth, Tensor):
        require_tensor(bandwidth, "bandwidth")
        require_same_dtype_device(keys, "keys", bandwidth=bandwidth)
    return _loo_scores(keys, values, bandwidth, kernel)


class BandwidthSelection(NamedTuple):
    """The result of :func:`select_bandwidth`.

    Attributes
    ----------
    bandwidth : Tensor, shape (...)
        The selected bandwidth per batch element (for example per head).
    score : Tensor, shape (...)
        The criterion at ``bandwidth``.
    candidates : Tensor, shape (..., c)
        The grid of bandwidths that was scored, ascending.
    scores : Tensor, shape (..., c)
        The criterion at each candidate: the curve to plot.
    """

    bandwidth: Tensor
    score: Tensor
    candidates: Tensor
    scores: Tensor


def scott_bandwidth(n: int, d: int, sigma: float | Tensor = 1.0) -> float | Tensor:
    r"""Scott's rule for one common bandwidth in ``d`` dimensions: :math:`\sigma n^{-1/(d+4)}`.

    The rate-optimal order of a second-order kernel's bandwidth, with the scale ``sigma`` of a
    coordinate (Scott, *Multivariate Density Estimation*, 1992). nwlib's Gaussian-kernel default
    (:func:`nwlib.simulate`) uses it in each head's projected space, with the coordinate scale
    the design implies; the candidate grid of :func:`select_bandwidth` is centred on it.

    Parameters
    ----------
    n : int
        Sample size, n >= 1.
    d : int
        Dimension of the space smoothed in (a head's ``head_dim``), d >= 1.
    sigma : float or Tensor, default 1.0
        Coordinate scale (a tensor gives one bandwidth per entry, of its dtype and device).

    Returns
    -------
    float or Tensor
        Of ``sigma``'s type.

    Examples
    --------
    >>> round(scott_bandwidth(1024, 1), 6)  # 1024^(-1/5)
    0.25
    """
    n = require_positive_int(n, "n")
    d = require_positive_int(d, "d")
    if not isinstance(sigma, Tensor) and (isinstance(sigma, bool) or not isinstance(sigma, (int, float))):
        raise TypeError(f"sigma must be a real number or a tensor, got {type(sigma).__name__}")
    return sigma * n ** (-1.0 / (d + 4))


def _reference_bandwidth(keys: Tensor) -> Tensor:
    """Scott's rule for one common bandwidth, with σ̄² the keys' mean coordinate variance."""
    n, d = keys.shape[-2], keys.shape[-1]
    sigma = keys.var(dim=-2).mean(-1).sqrt()
    # Keys that are all equal have no scale (every bandwidth scores the same): use 1.
    sigma = torch.where(sigma > 0, sigma, torch.ones_like(sigma))
    return scott_bandwidth(n, d, sigma)  # type: ignore[return-value]


def select_bandwidth(
    keys: Tensor,
    values: Tensor,
    *,
    kernel: Literal["exp", "gaussian"] = "gaussian",
    method: Literal["loo"] = "loo",
    candidates: Tensor | None = None,
    num_candidates: int = 25,
    refine_steps: int = 24,
    memory_budget: int = 2**28,
) -> BandwidthSelection:
    r"""Select a Nadaraya–Watson bandwidth by minimising a cross-validation score.

    Scores a grid of candidate bandwidths with :func:`loo_cv_score`, all batch
    elements (for example heads) and as many candidates as ``memory_budget`` allows
    in one attention call, then refines the best grid point of every batch element
    by golden-section search on log h between its two neighbours.

    Parameters
    ----------
    keys : Tensor, shape (..., n, d)
        Training inputs, n >= 2.
    values : Tensor, shape (..., n, p) or (..., n)
        Training responses.
    kernel : {"gaussian", "exp"}, default "gaussian"
        As in :func:`nwlib.nadaraya_watson`.
    method : {"loo"}, default "loo"
        The criterion: leave-one-out least-squares cross-validation,
        :func:`loo_cv_score`.
    candidates : Tensor, shape (c,) or (..., c), optional
        Candidate bandwidths (finite, > 0, c >= 2), the same for every batch
        element or one grid per element; they are sorted. Default: ``num_candidates``
        log-spaced values from 0.05 to 5 times Scott's rule
        :math:`\bar\sigma\, n^{-1/(d+4)}` of each batch element, where
        :math:`\bar\sigma^2` is the mean over coordinates of the variance of the
        keys (1 if all keys are equal).
    num_candidates : int, default 25
        Size of the default grid (>= 2); ignored when ``candidates`` is given.
    refine_steps : int, default 24
        Golden-section steps after the grid search (0: return the best grid point).
        Each shrinks the bracket, two grid spacings wide, by 0.618 and costs one
        attention call for the whole batch.
    memory_budget : int, default 2**28
        Approximate bytes for the inputs of one attention call when scoring the
        grid; candidates are scored in chunks that fit.

    Returns
    -------
    BandwidthSelection
        ``bandwidth`` and ``score`` of shape (...), ``candidates`` and ``scores``
        of shape (..., c), where (...) is the broadcast batch shape of ``keys`` and
        ``values`` (and of ``candidates`` less its last dimension). The minimiser
        lies within the candidates' range: a bandwidth at either end of it means
        that the range should be widened. All are detached from autograd.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, dtypes differ, a string argument is
        not a string, or an int argument is not an int.
    ValueError
        On n < 2, shape mismatches, mixed devices, an unknown ``kernel`` or
        ``method``, candidates that are not finite and > 0 (on the CPU) or fewer
        than 2, or bad ``num_candidates``, ``refine_steps`` or ``memory_budget``.

    Examples
    --------
    >>> import torch
    >>> from nwlib.bandwidth import select_bandwidth
    >>> g = torch.Generator().manual_seed(0)
    >>> x = 4 * torch.rand(2, 200, 1, generator=g, dtype=torch.float64) - 2  # two heads
    >>> y = torch.sin(2 * x[..., 0]) + 0.3 * torch.randn(2, 200, generator=g, dtype=torch.float64)
    >>> sel = select_bandwidth(x, y)
    >>> sel.bandwidth.shape, sel.scores.shape
    (torch.Size([2]), torch.Size([2, 25]))
    >>> bool((sel.score <= sel.scores.min(-1).values).all())
    True
    """
    kernel = require_choice(kernel, "kernel", KERNELS)  # type: ignore[assignment]
    require_choice(method, "method", METHODS)
    keys, values, _ = _check_keys_values(keys, values)
    num_candidates = require_positive_int(num_candidates, "num_candidates", minimum=2)
    refine_steps = require_positive_int(refine_steps, "refine_steps", minimum=0)
    memory_budget = require_positive_int(memory_budget, "memory_budget")
    # A selection (an argmin) has no useful gradient: keep every result off the graph.
    keys, values = keys.detach(), values.detach()
    shapes = {"keys": keys.shape[:-2], "values": values.shape[:-2]}
    if candidates is None:
        reference = _reference_bandwidth(keys)
        factors = torch.logspace(
            math.log10(0.05), math.log10(5.0), num_candidates, dtype=keys.dtype, device=keys.device
        )
        grid = reference.unsqueeze(-1) * factors
    else:
        grid = require_tensor(candidates, "candidates", min_dim=1)
        require_same_dtype_device(keys, "keys", candidates=grid)
        if grid.shape[-1] < 2:
            raise ValueError(f"candidates must hold at least 2 bandwidths, got shape {tuple(grid.shape)}")
        _require_positive_finite_tensor(grid, "candidates")
        shapes["candidates"] = grid.shape[:-1]
        grid = grid.detach().sort(dim=-1).values
    batch = broadcast_batch(shapes)
    count = grid.shape[-1]
    grid = grid.expand(*batch, count)

    with torch.no_grad():
        # One candidate costs about 8 (n + 1) × width buffers per batch element
        # (augmented queries, keys and values, centred and scaled copies, output).
        n, d, p = keys.shape[-2], keys.shape[-1], values.shape[-1]
        per_candidate = 8 * (n + 1) * max(d + 2, p + 1) * keys.element_size() * max(batch.numel(), 1)
        chunk = max(1, min(count, memory_budget // per_candidate))
        by_candidate = grid.movedim(-1, 0)  # (c, *batch): the candidates lead the batch
        scores = torch.cat(
            [_loo_scores(keys, values, by_candidate[start : start + chunk], kernel) for start in range(0, count, chunk)]
        ).movedim(0, -1)
        best = scores.argmin(-1, keepdim=True)
        bandwidth = grid.gather(-1, best).squeeze(-1)
        score = scores.gather(-1, best).squeeze(-1)
        if refine_steps:
            bandwidth, score = _golden_section(keys, values, kernel, grid, best, bandwidth, score, refine_steps)
    return BandwidthSelection(bandwidth, score, grid, scores)


def _golden_section(
    keys: Tensor,
    values: Tensor,
    kernel: str,
    grid: Tensor,
    best: Tensor,
    bandwidth: Tensor,
    score: Tensor,
    steps: int,
) -> tuple[Tensor, Tensor]:
    """Golden-section search on log h between the best grid point's neighbours, batched.

    Every batch element has its own bracket; each step scores one new point per
    element in one call. No data-dependent branching, so no host synchronisation.
    """
    log_grid = grid.log()
    last = grid.shape[-1] - 1
    lo = log_grid.gather(-1, (best - 1).clamp(0, last)).squeeze(-1)
    hi = log_grid.gather(-1, (best + 1).clamp(0, last)).squeeze(-1)
    x1 = hi - _GOLDEN * (hi - lo)
    x2 = lo + _GOLDEN * (hi - lo)
    f1, f2 = _loo_scores(keys, values, torch.stack([x1, x2]).exp(), kernel)
    for _ in range(steps - 1):
        # Keep the side holding the smaller value; on ties (or NaN) keep the left.
        left = ~(f2 < f1)
        lo = torch.where(left, lo, x1)
        hi = torch.where(left, x2, hi)
        new = torch.where(left, hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo))
        f_new = _loo_scores(keys, values, new.exp(), kernel)
        x1, x2, f1, f2 = (
            torch.where(left, new, x2),
            torch.where(left, x1, new),
            torch.where(left, f_new, f2),
            torch.where(left, f1, f_new),
        )
    for x, f in ((x1, f1), (x2, f2)):
        better = f < score
        bandwidth = torch.where(better, x.exp(), bandwidth)
        score = torch.where(better, f, score)
    return bandwidth, score
