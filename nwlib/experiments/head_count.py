r"""How many heads for a fixed width: the experiment of chapter 6 (Theorem 6.1, claims C9 and C10).

Serves ``notebooks/ch06_head_count.ipynb`` (the page ``book/ch06_head_count.md``): the targets,
heads on coordinate blocks and their approximation floors, one grid point of the sweep, and the
tables and summaries the chapter reads off the sweep (best head dimensions with bootstrap
intervals, gains against the zero predictor, the census of one head against many, the growth
fits of :math:`d_k^*` and the fits to published architectures).

Under a budget :math:`D = H d_k` the heads of the experiments here are *disjoint
coordinate blocks*: head h sees coordinates :math:`h d_k, \dots, (h+1) d_k - 1` of
:math:`x \sim N(0, I_D)` (:func:`block_projections`). Three targets differ in how their
interactions fall across the blocks (:func:`head_count_task`), all with
:math:`\operatorname{Var} f \approx 0.5` like the library's tasks; with
:math:`s^2 = \E \sin^2(2x_1) = (1 - e^{-8})/2`:

* ``"additive"``: :math:`f(x) = D^{-1/2}\sum_j \sin(2x_j)` (the library's ``"isotropic"``
  task): no interactions; :math:`\operatorname{Var} f = s^2`.
* ``"local"``: :math:`f(x) = \sqrt{2/D}\,\sum_j \sin(2x_j)\sin(2x_{j+1})`, indices mod D:
  interactions between neighbouring coordinates only; :math:`\operatorname{Var} f = 2s^4`.
* ``"global"``: :math:`f(x) = \sin(2u) - \E\sin(2u)` with
  :math:`u = (\lVert x\rVert^2 - D)/\sqrt{2D}`: a function of the norm, an interaction of
  all coordinates at once.

A head that sees block b can at best learn :math:`g_b = \E[f \mid x_b]`. The blocks are
independent, so the :math:`g_b - \E f` are orthogonal and the best the heads can do
together is fixed by :func:`approximation_error`: with output weights that add the heads
up (``combination="sum"``, the analogue of :math:`W_O`) the error is
:math:`\operatorname{Var} f - \sum_b \operatorname{Var} g_b`; averaged with weights
:math:`1/H` (``combination="mean"``, the paper's weighted average) it is
:math:`\operatorname{Var} f - (2 - 1/H)\operatorname{Var} g_b` for heads with equal
:math:`\operatorname{Var} g_b`.

:func:`head_count_point` is one grid point of the chapter's sweep (run through
:func:`nwlib.sweep.run_sweep` by :func:`run_head_count_sweep`): the Monte Carlo test error of
every divisor pair :math:`(H, d_k)` at one sample size, for one target and one kernel, with
two choices of output weights (:data:`OUTPUT_WEIGHTS`: fitted by least squares, or uniform
:math:`1/H`). :class:`HeadCountSweep` holds the sweep's per-replicate errors;
:func:`best_head_dims`, :func:`head_count_census` and :func:`growth_fit` summarise them, and
:func:`architecture_fits` fits the published architectures' head counts against their width.
Tables are :mod:`pandas` DataFrames (pandas and scipy are imported where they are used: they
come with the ``book`` extra).
"""

from __future__ import annotations

import cmath
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._seeds import require_seed
from .._validation import (
    require_choice,
    require_device,
    require_dtype,
    require_positive_int,
    require_real,
    require_tensor,
)
from ..decomposition import decompose
from ..device import resolve_device
from ..evidence import Comparison, mean, paired, significant
from ..kernels import cosine_attention
from ..montecarlo import simulate
from ..sweep import grid, point_seed, require_point, run_sweep
from ..tasks import RegressionTask, make_task
from ..weighting import least_squares_weights, replicate_mse, uniform_weights

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COMBINATIONS",
    "HEAD_COUNT_TARGETS",
    "KERNELS",
    "KERNEL_NAMES",
    "OUTPUT_WEIGHTS",
    "ArchitectureFits",
    "ClusterSlope",
    "cluster_bootstrap_slope",
    "deduplicated",
    "ComparisonHeadDims",
    "GrowthFit",
    "HeadCountSweep",
    "ManyHeadsTests",
    "DEFAULT_TEMPERATURES",
    "HALVES",
    "QUERY_SCALE",
    "cosine_heads",
    "dot_product_effective_size",
    "many_heads_tests",
    "own_dimension_optimum",
    "approximation_error",
    "architecture_fits",
    "best_at",
    "best_head_dims",
    "best_summary",
    "block_conditional_mean",
    "block_projections",
    "collect_sweep",
    "comparison_head_dims",
    "divisor_head_dims",
    "floor_table",
    "format_attention_best",
    "format_best_summary",
    "format_best_table",
    "format_census",
    "format_floor_table",
    "format_mse_table",
    "growth_fit",
    "head_count_census",
    "head_count_grid",
    "head_count_point",
    "head_count_task",
    "nearest_head_dim",
    "published_architectures",
    "run_head_count_sweep",
    "target_variance",
]

HEAD_COUNT_TARGETS: tuple[str, ...] = ("additive", "local", "global")
"""Targets accepted by :func:`head_count_task` and :func:`approximation_error`."""

COMBINATIONS: tuple[str, ...] = ("sum", "mean")
"""How the heads are combined in :func:`approximation_error`: added up (W_O) or averaged (1/H)."""

KERNELS: tuple[str, ...] = ("gaussian", "exp", "cosine")
"""Kernels of :func:`head_count_point`: the Gaussian NW surrogate, attention's dot-product kernel on raw
Gaussian inputs, and QK-normalised attention on LayerNorm'd tokens (:func:`cosine_heads`)."""

KERNEL_NAMES: dict[str, str] = {"gaussian": "Gaussian", "exp": "dot-product", "cosine": "cosine (QK-norm)"}
"""How the chapter's prose names each of :data:`KERNELS`."""

DEFAULT_TEMPERATURES: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
"""The temperatures τ swept for the ``"cosine"`` kernel (chosen per head dimension on the fitting batch)."""

QUERY_SCALE = 2.0
"""W_Q^h = QUERY_SCALE · W_K^h for the cosine heads: a matrix other than W_K^h that, after the QK
normalisation, still centres the head's kernel on the query (any positive multiple does)."""

HALVES: tuple[str, ...] = ("select", "test")
"""The two halves of the evaluation batch: replicates [0, R//2) select a head dimension, [R//2, R) test it."""

OUTPUT_WEIGHTS: tuple[str, ...] = ("fitted", "uniform")
"""Output weights of the sweep's heads: least squares on a fitting batch (the analogue of W_O), or 1/H.

Fitted weights can add the heads up; their floor is :func:`approximation_error` with ``"sum"``,
that of uniform weights the one with ``"mean"``.
"""

_ERROR_FIELDS = {"fitted": "mse_fitted", "uniform": "mse_uniform"}  # output weights -> head_count_point field
_FLOOR_FIELDS = {"fitted": "floor_sum", "uniform": "floor_mean"}

_S2 = (1.0 - math.exp(-8.0)) / 2.0  # E sin^2(2 x) for x ~ N(0, 1); E sin(2x) = 0


def _local(x: Tensor) -> Tensor:
    s = torch.sin(2 * x)
    return (s * torch.roll(s, shifts=-1, dims=-1)).sum(-1).mul_(math.sqrt(2.0 / x.shape[-1]))


def _chi2_cf(t: float, k: int) -> complex:
    """E exp(i t χ²_k)."""
    return complex((1 - 2j * t) ** (-k / 2))


def _global_constants(dim: int) -> tuple[float, float]:
    """ω and E sin(2u) for the global target in D = dim dimensions."""
    omega = math.sqrt(2.0 / dim)
    mean = (cmath.exp(-1j * omega * dim) * _chi2_cf(omega, dim)).imag
    return omega, mean


def _global(dim: int) -> Callable[[Tensor], Tensor]:
    omega, mean = _global_constants(dim)

    def f(x: Tensor) -> Tensor:
        return torch.sin(omega * (x.pow(2).sum(-1) - dim)).sub_(mean)

    return f


def head_count_task(name: str, embed_dim: int, *, noise_sd: float = 0.5) -> RegressionTask:
    r"""One of the chapter's three targets as a :class:`~nwlib.tasks.RegressionTask`.

    Parameters
    ----------
    name : {"additive", "local", "global"}
        See the module docstring.
    embed_dim : int
        D (>= 3 for ``"local"``, so that the D neighbour pairs are distinct).
    noise_sd : float, default 0.5
        σ (finite, >= 0).

    Returns
    -------
    RegressionTask
        Design N(0, I_D), responses f(x) + σε. ``"additive"`` is ``make_task("isotropic", D)``;
        the other two carry their own name (outside :data:`nwlib.tasks.TASKS`).

    Raises
    ------
    TypeError, ValueError
        On an unknown ``name`` or out-of-range sizes.

    Examples
    --------
    >>> import torch
    >>> task = head_count_task("local", 4)
    >>> x = torch.tensor([[0.3, -0.2, 1.1, 0.5]], dtype=torch.float64)
    >>> s = torch.sin(2 * x[0])
    >>> expected = (2 / 4) ** 0.5 * (s[0] * s[1] + s[1] * s[2] + s[2] * s[3] + s[3] * s[0])
    >>> bool(torch.isclose(task.f(x)[0], expected))
    True
    """
    name = require_choice(name, "name", HEAD_COUNT_TARGETS)
    dim = require_positive_int(embed_dim, "embed_dim")
    noise_sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    if name == "additive":
        return make_task("isotropic", dim, noise_sd=noise_sd)
    if name == "local":
        if dim < 3:
            raise ValueError(f"embed_dim must be >= 3 for the local target, got {dim}")
        return RegressionTask(name="local", embed_dim=dim, noise_sd=noise_sd, signal_dim=dim, _fn=_local)
    return RegressionTask(name="global", embed_dim=dim, noise_sd=noise_sd, signal_dim=dim, _fn=_global(dim))


def divisor_head_dims(embed_dim: int) -> list[int]:
    """Every head dimension d_k that divides D, ascending (so H = D / d_k heads fill the width).

    Parameters
    ----------
    embed_dim : int
        D (>= 1).

    Returns
    -------
    list of int

    Examples
    --------
    >>> divisor_head_dims(12)
    [1, 2, 3, 4, 6, 12]
    """
    dim = require_positive_int(embed_dim, "embed_dim")
    return [k for k in range(1, dim + 1) if dim % k == 0]


def block_projections(
    head_dim: int,
    embed_dim: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Heads on disjoint, contiguous coordinate blocks: head h sees coordinates h·d_k to (h+1)·d_k − 1.

    Parameters
    ----------
    head_dim : int
        d_k, a divisor of D.
    embed_dim : int
        D.
    dtype, device : optional
        Of the result (defaults: torch's default dtype; the CPU).

    Returns
    -------
    Tensor, shape (H, D, d_k)
        ``out[h]`` has orthonormal columns :math:`e_{h d_k}, \\dots, e_{(h+1) d_k - 1}`;
        the heads' subspaces are mutually orthogonal (HDI = 1).

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``head_dim`` does not divide ``embed_dim``.

    Examples
    --------
    >>> block_projections(2, 4)[1].T
    tensor([[0., 0., 1., 0.],
            [0., 0., 0., 1.]])
    """
    k = require_positive_int(head_dim, "head_dim")
    dim = require_positive_int(embed_dim, "embed_dim")
    if dim % k:
        raise ValueError(f"head_dim must divide embed_dim, got head_dim={k}, embed_dim={dim}")
    dtype = require_dtype(dtype, default=torch.get_default_dtype())
    device = require_device(device, default=torch.device("cpu"))
    eye = torch.eye(dim, dtype=dtype, device=device)
    return eye.reshape(dim, dim // k, k).permute(1, 0, 2).contiguous()


def block_conditional_mean(name: str, x: Tensor, head_dim: int) -> Tensor:
    r"""What each head on a coordinate block can at best learn: :math:`g_b(x) = \E[f(x) \mid x_b]`, per block.

    Parameters
    ----------
    name : {"additive", "local", "global"}
        The target (see :func:`head_count_task`).
    x : Tensor, shape (..., D)
        Points (floating dtype).
    head_dim : int
        d_k, a divisor of D; block b holds coordinates b·d_k to (b+1)·d_k − 1.

    Returns
    -------
    Tensor, shape (..., H)
        :math:`g_b(x_b)` for each of the H = D/d_k blocks. Their sum is the best that output
        weights can make of the heads (its error is :func:`approximation_error` with ``"sum"``),
        their mean the best of the paper's average.

    Raises
    ------
    TypeError, ValueError
        On an unknown ``name``, a non-floating ``x``, or a ``head_dim`` that does not divide D.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = head_count_task("additive", 6).f(x)
    >>> bool(torch.allclose(block_conditional_mean("additive", x, 2).sum(-1), f))
    True
    """
    name = require_choice(name, "name", HEAD_COUNT_TARGETS)
    x = require_tensor(x, "x", min_dim=1)
    dim = x.shape[-1]
    k = require_positive_int(head_dim, "head_dim")
    if dim % k:
        raise ValueError(f"head_dim must divide the last dimension of x (D = {dim}), got {k}")
    if name == "local" and dim < 3:
        raise ValueError(f"x must have D >= 3 for the local target, got {dim}")
    blocks = x.unflatten(-1, (dim // k, k))  # (..., H, d_k)
    if name == "additive":
        return torch.sin(2 * blocks).sum(-1) / math.sqrt(dim)
    if name == "local":
        s = torch.sin(2 * blocks)
        inside = (s[..., :-1] * s[..., 1:]).sum(-1)
        if k == dim and dim > 1:  # one block holds the wrap-around pair too
            inside = inside + s[..., -1] * s[..., 0]
        return inside * math.sqrt(2.0 / dim)
    omega, mean = _global_constants(dim)
    c = cmath.exp(-1j * omega * dim) * _chi2_cf(omega, dim - k)
    return torch.sin(omega * blocks.pow(2).sum(-1) + cmath.phase(c)).mul_(abs(c)).sub_(mean)


def _block_variances(name: str, head_dim: int, dim: int) -> tuple[float, float]:
    """(Var f, Var E[f | x_b]) for one block of head_dim coordinates."""
    if name == "additive":
        return _S2, _S2 * head_dim / dim
    if name == "local":
        pairs_inside = head_dim if head_dim == dim else head_dim - 1
        return 2 * _S2**2, 2 * _S2**2 * pairs_inside / dim
    omega, mean = _global_constants(dim)
    # f + mean = Im exp(iω(‖x‖² − D)); E over the other D − d_k coordinates multiplies by φ_{D−d_k}(ω)
    second = (1 - (cmath.exp(-2j * omega * dim) * _chi2_cf(2 * omega, dim)).real) / 2
    c = cmath.exp(-1j * omega * dim) * _chi2_cf(omega, dim - head_dim)
    block_second = (abs(c) ** 2 - (c**2 * _chi2_cf(2 * omega, head_dim)).real) / 2
    return second - mean**2, block_second - mean**2


def target_variance(name: str, embed_dim: int) -> float:
    """Var f(x) under x ~ N(0, I_D) for one of the chapter's targets (closed form).

    Parameters
    ----------
    name : {"additive", "local", "global"}
    embed_dim : int
        D (>= 3 for ``"local"``).

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        On an unknown ``name`` or a bad ``embed_dim``.

    Examples
    --------
    >>> round(target_variance("additive", 12), 4), round(target_variance("local", 12), 4)
    (0.4998, 0.4997)
    """
    name = require_choice(name, "name", HEAD_COUNT_TARGETS)
    dim = require_positive_int(embed_dim, "embed_dim")
    if name == "local" and dim < 3:
        raise ValueError(f"embed_dim must be >= 3 for the local target, got {dim}")
    return _block_variances(name, dim, dim)[0]


def approximation_error(name: str, head_dim: int, embed_dim: int, *, combination: str = "sum") -> float:
    r"""The error that heads on disjoint coordinate blocks keep however much data they get.

    With g_b = E[f | x_b] the best a head on block b can learn, this is
    :math:`\E\big(f - \sum_b \alpha_b g_b\big)^2` for :math:`\alpha_b = 1`
    (``"sum"``: output weights that add the heads up, which is also the best choice of
    scalar weights here) or :math:`\alpha_b = 1/H` (``"mean"``: the paper's average).
    Closed forms: the blocks are independent, so the :math:`g_b - \E f` are orthogonal and
    :math:`\operatorname{Cov}(f, g_b) = \operatorname{Var} g_b`.

    Parameters
    ----------
    name : {"additive", "local", "global"}
        The target (see :func:`head_count_task`).
    head_dim : int
        d_k, a divisor of D.
    embed_dim : int
        D (>= 3 for ``"local"``).
    combination : {"sum", "mean"}, default "sum"

    Returns
    -------
    float
        The squared-error floor, in the units of Var f (about 0.5).

    Raises
    ------
    TypeError, ValueError
        On an unknown ``name`` or ``combination``, or sizes that do not fit.

    Examples
    --------
    >>> round(approximation_error("additive", 3, 12), 12), round(approximation_error("local", 3, 12), 4)
    (0.0, 0.1666)
    >>> round(approximation_error("additive", 3, 12, combination="mean") / 0.5, 3)  # (1 - 1/H)^2
    0.562
    """
    name = require_choice(name, "name", HEAD_COUNT_TARGETS)
    combination = require_choice(combination, "combination", COMBINATIONS)
    k = require_positive_int(head_dim, "head_dim")
    dim = require_positive_int(embed_dim, "embed_dim")
    if dim % k:
        raise ValueError(f"head_dim must divide embed_dim, got head_dim={k}, embed_dim={dim}")
    if name == "local" and dim < 3:
        raise ValueError(f"embed_dim must be >= 3 for the local target, got {dim}")
    heads = dim // k
    var_f, var_g = _block_variances(name, k, dim)
    if combination == "sum":
        return var_f - heads * var_g
    return var_f - (2 - 1 / heads) * var_g


def cosine_heads(
    x: Tensor, y: Tensor, queries: Tensor, head_dim: int, *, temperature: float, chunk: int = 16
) -> Tensor:
    r"""Predictions of H = D/d_k QK-normalised attention heads on LayerNorm'd tokens (attention where it can smooth).

    Tokens are normalised as a transformer's pre-norm layer does (``layer_norm`` over the D
    coordinates, no affine part); head h reads block h of the normalised token through
    :math:`W_K^h` (:func:`block_projections`) and :math:`W_Q^h` = :data:`QUERY_SCALE` ·
    :math:`W_K^h`, normalises queries and keys (QK-norm) and averages the responses with weights
    :math:`\operatorname{softmax}(\langle\hat q, \hat k\rangle/\tau)` (:func:`nwlib.cosine_attention`): on the
    sphere a Gaussian kernel of bandwidth :math:`\sqrt\tau`. The values are the responses (the
    head's :math:`W_V^h` reads the token's response).

    Parameters
    ----------
    x : Tensor, shape (R, n, D)
        Training inputs of R training sets (floating dtype).
    y : Tensor, shape (R, n)
        Their responses.
    queries : Tensor, shape (m, D)
        Evaluation points (normalised the same way).
    head_dim : int
        d_k, a divisor of D.
    temperature : float
        τ > 0.
    chunk : int, default 16
        Training sets per batched call (memory).

    Returns
    -------
    Tensor, shape (R, H, m)

    Raises
    ------
    TypeError, ValueError
        On bad shapes, a ``head_dim`` that does not divide D or a bad temperature.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(2, 50, 4, generator=g, dtype=torch.float64)
    >>> z = torch.randn(3, 4, generator=g, dtype=torch.float64)
    >>> cosine_heads(x, x[..., 0], z, 2, temperature=0.1).shape
    torch.Size([2, 2, 3])
    """
    x = require_tensor(x, "x", min_dim=3)
    y = require_tensor(y, "y", min_dim=2)
    queries = require_tensor(queries, "queries", min_dim=2)
    if x.dim() != 3 or y.shape != x.shape[:2] or queries.dim() != 2 or queries.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"x, y and queries must have shapes (R, n, D), (R, n) and (m, D), got {tuple(x.shape)}, "
            f"{tuple(y.shape)} and {tuple(queries.shape)}"
        )
    dim = x.shape[-1]
    step = require_positive_int(chunk, "chunk")
    w_k = block_projections(head_dim, dim, dtype=x.dtype, device=x.device)  # checks head_dim
    heads = w_k.shape[0]
    q = torch.nn.functional.layer_norm(queries, (dim,)) @ (QUERY_SCALE * w_k)  # (H, m, d_k)
    out = torch.empty(x.shape[0], heads, queries.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[0], step):
        stop = min(start + step, x.shape[0])
        keys = torch.nn.functional.layer_norm(x[start:stop], (dim,)).unsqueeze(1) @ w_k  # (r, H, n, d_k)
        values = y[start:stop, None, :].expand(-1, heads, -1)
        out[start:stop] = cosine_attention(q, keys, values, temperature=temperature)
    return out


def _cosine_predictions(
    x_fit: Tensor,
    y_fit_train: Tensor,
    x_eval: Tensor,
    y_eval_train: Tensor,
    z_fit: Tensor,
    y_fit: Tensor,
    z_eval: Tensor,
    head_dim: int,
    temperatures: Sequence[float],
) -> tuple[Tensor, Tensor, Tensor, float, float]:
    """Cosine heads at the temperatures chosen on the fitting batch: (pred for 1/H, pred for W_O, W_O, τ_u, τ_f).

    τ for the average: the smallest validation error of the mean of the heads against the noisy
    responses at the fitting points. τ for fitted output weights: two-fold cross-validation over the
    fitting batch's training sets (weights fitted on one half, scored on the other). The evaluation
    batch is never used for the choice.
    """
    half = x_fit.shape[0] // 2
    scores_u, scores_f, preds = [], [], []
    for tau in temperatures:
        p = cosine_heads(x_fit, y_fit_train, z_fit, head_dim, temperature=tau)
        preds.append(p)
        scores_u.append(float((p.mean(1) - y_fit).pow(2).mean()))
        cv = 0.0
        for a, b in ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half))):
            w = least_squares_weights(p[a], y_fit[a])
            cv += float(((w[:, None] * p[b]).sum(1) - y_fit[b]).pow(2).mean())
        scores_f.append(cv)
    i_u, i_f = int(np.argmin(scores_u)), int(np.argmin(scores_f))
    w_fit = least_squares_weights(preds[i_f], y_fit)
    pred_u = cosine_heads(x_eval, y_eval_train, z_eval, head_dim, temperature=temperatures[i_u])
    pred_f = (
        pred_u if i_f == i_u else cosine_heads(x_eval, y_eval_train, z_eval, head_dim, temperature=temperatures[i_f])
    )
    return pred_u, pred_f, w_fit, float(temperatures[i_u]), float(temperatures[i_f])


_POINT_KEYS = ("target", "kernel", "n", "embed_dim", "replicates", "replicates_fit", "m", "noise_sd")


def head_count_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One grid point of the head-count sweep: every divisor pair (H, d_k) at one n, target and kernel.

    For each d_k dividing D, H = D/d_k heads on coordinate blocks (:func:`block_projections`)
    are simulated with :func:`nwlib.simulate` on two independent Monte Carlo batches that
    share nothing but the task:

    * a *fitting* batch of ``replicates_fit`` training sets, evaluated at m fresh points
      z ~ N(0, I_D) against fresh noisy responses there, on which the output weights
      (:func:`nwlib.least_squares_weights`, the analogue of W_O) are fitted;
    * an *evaluation* batch of ``replicates`` training sets, evaluated at m other points,
      where the integrated squared error against f of each choice of output weights
      (:data:`OUTPUT_WEIGHTS`: fitted, uniform) is recorded per replicate.

    Within a batch every d_k sees the same training sets (one generator seed per batch), so
    differences between head dimensions are paired. Kernels (our choices): ``"gaussian"`` is
    the NW surrogate with the engine's default bandwidth (Scott's rule,
    :math:`\propto n^{-1/(d_k+4)}`); ``"exp"`` is attention's dot-product kernel with
    :math:`W_K^h` the block, :math:`W_Q^h = \sqrt{d_k}\,W_K^h` (so that the logits are
    :math:`\langle W_K^{h\top} z, W_K^{h\top} x_i\rangle`: unit temperature after attention's
    :math:`1/\sqrt{d_k}`) and values :math:`W_V^h` reading the response of the token
    :math:`(x_i, y_i)`. ``"cosine"`` is attention where it can smooth (:func:`cosine_heads`): LayerNorm'd
    tokens, QK-normalised heads, a temperature per head dimension chosen from ``temperatures`` on the
    fitting batch only (:func:`_cosine_predictions`), the same training sets for every temperature and d_k.

    Parameters
    ----------
    point : Mapping
        ``target`` (see :data:`HEAD_COUNT_TARGETS`), ``kernel`` (see :data:`KERNELS`), ``n``,
        ``embed_dim``, ``replicates`` (>= 3), ``replicates_fit``, ``m`` and ``noise_sd``;
        optionally ``eval_seed`` (an int): then the evaluation and fitting points and the fitting
        noise come from :func:`nwlib.sweep.point_seed` of it and (target, D, m, replicates_fit),
        so that every n and kernel of a target is scored on the same points; for ``"cosine"``,
        optionally ``temperatures`` (default :data:`DEFAULT_TEMPERATURES`; ``replicates_fit`` >= 2).
    seed : int
        Seeds everything (the points, the noise and both batches), e.g. from
        :func:`nwlib.sweep.point_seed`.
    device : str, default "cpu"
        Where to compute (``"auto"``: CUDA, then MPS, then CPU). Float64, float32 on MPS.

    Returns
    -------
    dict
        Lists over the head dimensions (ascending): ``head_dims``, ``num_heads``,
        ``mse_uniform`` and ``mse_fitted`` (each a list of ``replicates`` per-replicate
        integrated squared errors), ``weights_fitted``, ``mean_correlation`` (between heads,
        NaN for one head), ``bias_sq_uniform``, ``bias_sq_fitted``, ``variance_fitted``
        (variance + covariance with the fitted output weights); ``floor_sum`` and ``floor_mean``, the
        approximation error on the evaluation points (:func:`block_conditional_mean` summed or
        averaged against f); ``mse_zero``, the integrated
        squared error of predicting 0 (the mean of f² over the evaluation points); ``device``; and for
        ``"cosine"`` the chosen ``temperature_uniform`` and ``temperature_fitted`` per head dimension.

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    require_point(point, _POINT_KEYS)
    kernel = require_choice(point["kernel"], "kernel", KERNELS)
    n = require_positive_int(point["n"], "n")
    dim = require_positive_int(point["embed_dim"], "embed_dim")
    reps = require_positive_int(point["replicates"], "replicates")
    reps_fit = require_positive_int(point["replicates_fit"], "replicates_fit")
    m = require_positive_int(point["m"], "m")
    if reps < 3:
        raise ValueError(f"replicates must be >= 3 (jackknife standard errors), got {reps}")
    task = head_count_task(point["target"], dim, noise_sd=point["noise_sd"])
    seed = require_seed(seed)
    dev = resolve_device(device)
    dtype = torch.float32 if dev.type == "mps" else torch.float64

    gen = torch.Generator(device=dev).manual_seed(seed)
    # Evaluation points and fitting noise: shared by every point with the same eval_seed, target and
    # sizes (so that errors compare across n and kernels on one quadrature), else from the point's seed.
    points_gen = gen
    if point.get("eval_seed") is not None:
        shared = {"target": point["target"], "embed_dim": dim, "m": m, "replicates_fit": reps_fit}
        points_gen = torch.Generator(device=dev).manual_seed(point_seed(point["eval_seed"], shared))
    z_fit = torch.randn(m, dim, generator=points_gen, dtype=torch.float64, device=dev).to(dtype)
    z_eval = torch.randn(m, dim, generator=points_gen, dtype=torch.float64, device=dev).to(dtype)
    noise = torch.randn(reps_fit, m, generator=points_gen, dtype=torch.float64, device=dev).to(dtype)
    y_fit = task.f(z_fit) + task.noise_sd * noise  # what a practitioner has to fit W_O on
    f_eval = task.f(z_eval)
    seed_fit, seed_eval = torch.randint(0, 2**62, (2,), generator=gen, device=dev).tolist()

    out: dict[str, Any] = {
        k: []
        for k in (
            "head_dims",
            "num_heads",
            "mse_uniform",
            "mse_fitted",
            "weights_fitted",
            "mean_correlation",
            "bias_sq_uniform",
            "bias_sq_fitted",
            "variance_fitted",
            "floor_sum",
            "floor_mean",
        )
    }
    temperatures: list[float] = []
    if kernel == "cosine":
        temps_in = point.get("temperatures", DEFAULT_TEMPERATURES)
        temperatures = [require_real(t, "temperatures", minimum=0.0, strict_minimum=True) for t in temps_in]
        if not temperatures or min(temperatures) <= 0:
            raise ValueError(f"temperatures must be a non-empty list of positive numbers, got {temperatures!r}")
        if reps_fit < 2:
            raise ValueError(
                f"replicates_fit must be >= 2 for the cosine kernel (two-fold choice of τ), got {reps_fit}"
            )
        x_fit, y_fit_train = task.sample(
            (reps_fit,), n, generator=torch.Generator(device=dev).manual_seed(seed_fit), dtype=dtype
        )
        x_ev, y_ev_train = task.sample(
            (reps,), n, generator=torch.Generator(device=dev).manual_seed(seed_eval), dtype=dtype
        )
        out["temperature_uniform"], out["temperature_fitted"] = [], []
    for k in divisor_head_dims(dim):
        w_k = block_projections(k, dim, dtype=dtype, device=dev)
        heads = w_k.shape[0]
        if kernel == "cosine":
            pred, pred_f, w_fit, tau_u, tau_f = _cosine_predictions(
                x_fit, y_fit_train, x_ev, y_ev_train, z_fit, y_fit, z_eval, k, temperatures
            )
            out["temperature_uniform"].append(tau_u)
            out["temperature_fitted"].append(tau_f)
        else:
            extra: dict[str, Any] = {"kernel": kernel}
            if kernel == "exp":
                values = torch.zeros(heads, dim + 1, dtype=dtype, device=dev)
                values[:, -1] = 1.0
                extra.update(query_projections=math.sqrt(k) * w_k, value_projections=values)
            fit = simulate(
                task,
                w_k,
                z_fit,
                n=n,
                replicates=reps_fit,
                generator=torch.Generator(device=dev).manual_seed(seed_fit),
                **extra,
            )
            pred = simulate(
                task,
                w_k,
                z_eval,
                n=n,
                replicates=reps,
                generator=torch.Generator(device=dev).manual_seed(seed_eval),
                **extra,
            )
            pred_f = pred
            w_fit = least_squares_weights(fit, y_fit)
        w_unif = uniform_weights(heads, dtype=dtype, device=dev)
        dec_u = decompose(pred, f_eval, w_unif).integrated()
        dec_f = decompose(pred_f, f_eval, w_fit).integrated()
        out["head_dims"].append(k)
        out["num_heads"].append(heads)
        out["mse_uniform"].append(replicate_mse(pred, f_eval, w_unif).double().cpu().tolist())
        out["mse_fitted"].append(replicate_mse(pred_f, f_eval, w_fit).double().cpu().tolist())
        out["weights_fitted"].append(w_fit.double().cpu().tolist())
        out["mean_correlation"].append(dec_u.mean_correlation)
        out["bias_sq_uniform"].append(dec_u.bias_sq)
        out["bias_sq_fitted"].append(dec_f.bias_sq)
        out["variance_fitted"].append(dec_f.variance + dec_f.covariance)
        g_b = block_conditional_mean(point["target"], z_eval, k)
        out["floor_sum"].append(float((f_eval - g_b.sum(-1)).double().pow(2).mean()))
        out["floor_mean"].append(float((f_eval - g_b.mean(-1)).double().pow(2).mean()))
    out["mse_zero"] = float(f_eval.double().pow(2).mean())
    out["device"] = str(dev)
    return out


# --- the sweep and its tables ------------------------------------------------------------


class ComparisonHeadDims(NamedTuple):
    """The head dimensions the chapter's statements compare, for one width D (ascending).

    Attributes
    ----------
    small : int
        The second divisor of D (``k_small``: 2 for D = 12).
    middle : int
        The largest divisor d with d² <= D (``k_mid``: 3 for D = 12).
    half : int
        The second largest divisor (``k_half``: D/2 for even D).
    largest : int
        D itself: one head of dimension D.
    """

    small: int
    middle: int
    half: int
    largest: int


def comparison_head_dims(embed_dim: int) -> ComparisonHeadDims:
    """The head dimensions the chapter compares: the second, central, second largest and largest divisors of D.

    Parameters
    ----------
    embed_dim : int
        D, with at least four divisors (1, two between, and D).

    Returns
    -------
    ComparisonHeadDims

    Raises
    ------
    TypeError, ValueError
        If ``embed_dim`` is not a positive int or has fewer than four divisors.

    Examples
    --------
    >>> comparison_head_dims(12)
    ComparisonHeadDims(small=2, middle=3, half=6, largest=12)
    """
    dims = divisor_head_dims(embed_dim)
    if len(dims) < 4:
        raise ValueError(f"embed_dim must have at least four divisors for the comparisons, got {embed_dim} ({dims})")
    middle = max(k for k in dims if k * k <= embed_dim)
    return ComparisonHeadDims(small=dims[1], middle=middle, half=dims[-2], largest=dims[-1])


def floor_table(embed_dim: int) -> pd.DataFrame:
    """The approximation floors A(d_k) of every target, both combinations and every divisor d_k of D.

    Parameters
    ----------
    embed_dim : int
        D (>= 3).

    Returns
    -------
    pandas.DataFrame, shape (number of divisors, 6)
        Index ``d_k`` (ascending divisors of D); columns ``(target, combination)`` for every target of
        :data:`HEAD_COUNT_TARGETS` and combination of :data:`COMBINATIONS`; entries
        :func:`approximation_error`.

    Raises
    ------
    TypeError, ValueError
        If ``embed_dim`` is not an int >= 3.

    Examples
    --------
    >>> table = floor_table(4)
    >>> table.index.tolist(), table[("local", "sum")].round(4).tolist(), table[("local", "mean")].round(4).tolist()
    ([1, 2, 4], [0.4997, 0.2498, 0.0], [0.4997, 0.3123, 0.0])
    """
    import pandas as pd

    dim = require_positive_int(embed_dim, "embed_dim", minimum=3)
    dims = divisor_head_dims(dim)
    columns = pd.MultiIndex.from_tuples(
        [(t, c) for t in HEAD_COUNT_TARGETS for c in COMBINATIONS], names=["target", "combination"]
    )
    data = {
        (t, c): [approximation_error(t, k, dim, combination=c) for k in dims]
        for t in HEAD_COUNT_TARGETS
        for c in COMBINATIONS
    }
    return pd.DataFrame(data, index=pd.Index(dims, name="d_k"), columns=columns)


def head_count_grid(
    *,
    embed_dim: int,
    sample_sizes: Sequence[int],
    replicates: int,
    replicates_fit: int,
    num_eval_points: int,
    noise_sd: float,
    seed: int,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
) -> list[dict[str, Any]]:
    """The chapter's grid of independent points: every target × kernel × n (see :func:`head_count_point`).

    Every point of a target shares its evaluation points (``eval_seed = seed``), so that errors compare
    across n and kernels on one quadrature; each point's own seed comes from its coordinates
    (:func:`nwlib.sweep.point_seed`).

    Parameters
    ----------
    embed_dim : int
        D.
    sample_sizes : sequence of int
        The training-set sizes n.
    replicates, replicates_fit : int
        Training sets of the evaluation batch (>= 3) and of the fitting batch.
    num_eval_points : int
        m, the number of evaluation (and fitting) points.
    noise_sd : float
        σ.
    seed : int
        The sweep's seed (>= 0), also the points' ``eval_seed``.
    temperatures : sequence of float, default :data:`DEFAULT_TEMPERATURES`
        The τ swept by the ``"cosine"`` points (a coordinate of those points only, so the other
        kernels' points, and their seeds, do not depend on it).

    Returns
    -------
    list of dict
        Targets vary slowest, then kernels, then n (ascending as given).

    Raises
    ------
    TypeError, ValueError
        On a bad size (named in the message).

    Examples
    --------
    >>> points = head_count_grid(embed_dim=12, sample_sizes=[128, 512], replicates=4, replicates_fit=2,
    ...                          num_eval_points=16, noise_sd=0.5, seed=0)
    >>> len(points), points[0]["target"], points[0]["kernel"], points[0]["n"], points[0]["m"]
    (18, 'additive', 'gaussian', 128, 16)
    >>> points[4]["kernel"], points[4]["temperatures"][:2]
    ('cosine', [0.01, 0.03])
    """
    dim = require_positive_int(embed_dim, "embed_dim")
    if isinstance(sample_sizes, (str, bytes)) or not isinstance(sample_sizes, Sequence) or not sample_sizes:
        raise TypeError("sample_sizes must be a non-empty sequence of ints")
    sizes = [require_positive_int(n, "sample_sizes") for n in sample_sizes]
    seed = require_seed(seed)
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Sequence) or not temperatures:
        raise TypeError("temperatures must be a non-empty sequence of positive numbers")
    temps = [require_real(t, "temperatures", minimum=0.0, strict_minimum=True) for t in temperatures]
    points = grid(
        target=list(HEAD_COUNT_TARGETS),
        kernel=list(KERNELS),
        n=sizes,
        embed_dim=[dim],
        replicates=[require_positive_int(replicates, "replicates", minimum=3)],
        replicates_fit=[require_positive_int(replicates_fit, "replicates_fit")],
        m=[require_positive_int(num_eval_points, "num_eval_points")],
        noise_sd=[require_real(noise_sd, "noise_sd", minimum=0.0)],
        eval_seed=[seed],
    )
    for p in points:
        if p["kernel"] == "cosine":
            p["temperatures"] = list(temps)
    return points


@dataclass(frozen=True, eq=False)
class HeadCountSweep:
    """The head-count sweep's results, arranged by configuration (from :func:`collect_sweep`).

    Attributes
    ----------
    points : list of dict
        The grid points (:func:`head_count_grid`).
    results : list of dict
        :func:`head_count_point`'s result for each point.
    head_dims : list of int
        The divisors d_k of D, ascending (the rows of every error array).
    errors : dict
        ``(target, kernel, n, output_weights) -> ndarray, shape (len(head_dims), R)``: the per-replicate
        integrated squared errors of the evaluation batch, every d_k on the same training sets.
    zero_error : dict
        ``(target, kernel, n) -> float``: the error of predicting 0 on the point's evaluation points.
    table : pandas.DataFrame
        One row per (target, kernel, n, output_weights, head_dim): ``num_heads``, ``mse`` (mean over
        replicates), ``se`` (its standard error), ``mse_zero``, ``rho`` (mean correlation between heads)
        and ``floor`` (the approximation error of these output weights on the evaluation points).
    seconds : float
        Wall-clock time of the sweep (informational; NaN where unknown).
    """

    points: list[dict[str, Any]]
    results: list[dict[str, Any]]
    head_dims: list[int]
    errors: dict[tuple[str, str, int, str], np.ndarray] = field(repr=False)
    zero_error: dict[tuple[str, str, int], float] = field(repr=False)
    table: pd.DataFrame = field(repr=False)
    seconds: float = math.nan

    @property
    def sample_sizes(self) -> list[int]:
        """The sweep's training-set sizes n, ascending."""
        return sorted({int(p["n"]) for p in self.points})

    @property
    def embed_dim(self) -> int:
        """D."""
        return int(self.points[0]["embed_dim"])

    def _n(self, n: int | None) -> int:
        if n is None:
            return self.sample_sizes[-1]
        if n not in self.sample_sizes:
            raise ValueError(f"n must be one of the sweep's sample sizes {self.sample_sizes}, got {n!r}")
        return int(n)

    def series(
        self,
        target: str,
        kernel: str,
        output_weights: str,
        head_dim: int,
        n: int | None = None,
        *,
        half: str | None = None,
    ) -> Tensor:
        """Per-replicate errors of one configuration, for :func:`nwlib.evidence.paired`.

        Parameters
        ----------
        target, kernel, output_weights : str
            See :data:`HEAD_COUNT_TARGETS`, :data:`KERNELS`, :data:`OUTPUT_WEIGHTS`.
        head_dim : int
            d_k, a divisor of D.
        n : int, optional
            One of the sweep's sample sizes (default: the largest).
        half : {"select", "test"}, optional
            Only the first R//2 replicates (``"select"``) or the others (``"test"``): two independent
            batches, one to choose a head dimension on, one to test the choice on (:data:`HALVES`).
            Default: all R.

        Returns
        -------
        Tensor, shape (R,)
            Float64; replicate r of every head dimension comes from the same training set.

        Raises
        ------
        ValueError
            On a configuration the sweep does not hold (the argument named).
        """
        key = (
            require_choice(target, "target", HEAD_COUNT_TARGETS),
            require_choice(kernel, "kernel", KERNELS),
            self._n(n),
            require_choice(output_weights, "output_weights", OUTPUT_WEIGHTS),
        )
        if head_dim not in self.head_dims:
            raise ValueError(f"head_dim must be one of {self.head_dims}, got {head_dim!r}")
        row = self.errors[key][self.head_dims.index(head_dim)]
        if half is not None:
            split = row.shape[0] // 2
            row = row[:split] if require_choice(half, "half", HALVES) == "select" else row[split:]
        return torch.from_numpy(np.ascontiguousarray(row))

    def by_head_dim(self, target: str, kernel: str, output_weights: str, n: int | None = None) -> dict[int, Tensor]:
        """:meth:`series` of every head dimension, keyed by d_k (arguments as for :meth:`series`)."""
        return {k: self.series(target, kernel, output_weights, k, n) for k in self.head_dims}

    def gain(
        self,
        target: str,
        kernel: str,
        output_weights: str,
        head_dim: int,
        n: int | None = None,
        *,
        half: str | None = None,
    ) -> Comparison:
        r"""The share (%) of the zero predictor's error that one configuration removes, with its SE.

        The mean over replicates of :math:`100\,(1 - e_r / e_0)`, with :math:`e_0` the error of
        predicting 0 on the same evaluation points (:func:`nwlib.evidence.mean`). Arguments as for
        :meth:`series`.
        """
        e = self.series(target, kernel, output_weights, head_dim, n, half=half)
        return mean(100 * (1 - e / self.zero_error[(target, kernel, self._n(n))]))

    def row(self, target: str, kernel: str, output_weights: str, head_dim: int, n: int | None = None) -> pd.Series:
        """One row of :attr:`table` (arguments as for :meth:`series`)."""
        self.series(target, kernel, output_weights, head_dim, n)  # validates the configuration
        t = self.table
        sel = t[
            (t.target == target)
            & (t.kernel == kernel)
            & (t.output_weights == output_weights)
            & (t.n == self._n(n))
            & (t.head_dim == head_dim)
        ]
        return sel.iloc[0]

    def correlation_range(self, kernel: str = "gaussian", n: int | None = None) -> tuple[float, float]:
        """Smallest and largest mean correlation between heads (H > 1) over the targets, at one n.

        Parameters
        ----------
        kernel : str, default "gaussian"
        n : int, optional
            Default: the largest sample size.

        Returns
        -------
        (float, float)
        """
        kernel = require_choice(kernel, "kernel", KERNELS)
        t = self.table
        sel = t[(t.kernel == kernel) & (t.output_weights == "uniform") & (t.num_heads > 1) & (t.n == self._n(n))]
        return float(sel.rho.min()), float(sel.rho.max())


def collect_sweep(
    points: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]], *, seconds: float = math.nan
) -> HeadCountSweep:
    """Arrange the results of the head-count grid points by configuration.

    Parameters
    ----------
    points : sequence of Mapping
        Grid points with ``target``, ``kernel``, ``n`` and ``embed_dim`` (:func:`head_count_grid`).
    results : sequence of Mapping
        :func:`head_count_point`'s result for each point, in the same order.
    seconds : float, optional
        The sweep's wall-clock time, kept as :attr:`HeadCountSweep.seconds`.

    Returns
    -------
    HeadCountSweep

    Raises
    ------
    TypeError, ValueError
        If the two sequences differ in length, are empty, or a result lacks a field or holds
        other head dimensions than the first.
    """
    import pandas as pd

    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
        raise TypeError("points must be a non-empty sequence of grid points")
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence) or len(results) != len(points):
        raise ValueError(f"results must hold one result per point ({len(points)}), got {len(results)}")
    fields = ("head_dims", "mse_zero", "mean_correlation", *_ERROR_FIELDS.values(), *_FLOOR_FIELDS.values())
    head_dims = [int(k) for k in results[0]["head_dims"]] if "head_dims" in results[0] else []
    errors: dict[tuple[str, str, int, str], np.ndarray] = {}
    zero_error: dict[tuple[str, str, int], float] = {}
    rows = []
    for p, r in zip(points, results, strict=True):
        missing = [f for f in fields if f not in r]
        if missing:
            raise ValueError(f"results: a result lacks the field(s) {missing}")
        if list(r["head_dims"]) != head_dims:
            raise ValueError(f"results must all hold the head dimensions {head_dims}, got {r['head_dims']}")
        dim = int(p["embed_dim"])
        zero_error[(p["target"], p["kernel"], p["n"])] = r["mse_zero"]
        for weights, key in _ERROR_FIELDS.items():
            arr = np.asarray(r[key])
            errors[(p["target"], p["kernel"], p["n"], weights)] = arr
            floors = r[_FLOOR_FIELDS[weights]]
            for i, k in enumerate(head_dims):
                rows.append(
                    dict(
                        target=p["target"],
                        kernel=p["kernel"],
                        n=p["n"],
                        output_weights=weights,
                        head_dim=k,
                        num_heads=dim // k,
                        mse=arr[i].mean(),
                        se=arr[i].std(ddof=1) / math.sqrt(arr.shape[1]),
                        mse_zero=r["mse_zero"],
                        rho=r["mean_correlation"][i],
                        floor=floors[i],
                        temperature=r.get(f"temperature_{weights}", [math.nan] * len(head_dims))[i],
                    )
                )
    return HeadCountSweep(
        points=[dict(p) for p in points],
        results=[dict(r) for r in results],
        head_dims=head_dims,
        errors=errors,
        zero_error=zero_error,
        table=pd.DataFrame(rows),
        seconds=float(seconds),
    )


def run_head_count_sweep(
    *,
    embed_dim: int,
    sample_sizes: Sequence[int],
    replicates: int,
    replicates_fit: int,
    num_eval_points: int,
    noise_sd: float,
    seed: int,
    executor: Any = "serial",
    path: str | Path | None = None,
    device: str = "cpu",
    progress: bool = False,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
) -> HeadCountSweep:
    """The chapter's sweep: :func:`head_count_grid` run through :func:`nwlib.sweep.run_sweep`, then collected.

    Parameters
    ----------
    embed_dim, sample_sizes, replicates, replicates_fit, num_eval_points, noise_sd, seed
        As for :func:`head_count_grid`.
    executor : str or concurrent.futures.Executor, default "serial"
        Where the points run (:func:`nwlib.sweep.open_executor`): ``"serial"``, ``"process:N"``,
        ``"dask:tcp://host:8786"``; the results do not depend on it.
    path : str or Path, optional
        JSON-lines file of finished points (a rerun resumes from it); default: in memory.
    device : str, default "cpu"
        Passed to every point unchanged (``"auto"``: each worker picks its accelerator).
    progress : bool, default False
        Show a progress bar.
    temperatures : sequence of float, default :data:`DEFAULT_TEMPERATURES`
        The τ swept by the cosine heads (:func:`head_count_grid`).

    Returns
    -------
    HeadCountSweep

    Raises
    ------
    TypeError, ValueError
        On a bad argument (named in the message).
    """
    points = head_count_grid(
        embed_dim=embed_dim,
        sample_sizes=sample_sizes,
        replicates=replicates,
        replicates_fit=replicates_fit,
        num_eval_points=num_eval_points,
        noise_sd=noise_sd,
        seed=seed,
        temperatures=temperatures,
    )
    started = time.perf_counter()
    results = run_sweep(
        head_count_point,
        points,
        seed=seed,
        executor=executor,
        path=path or None,
        device=device,
        progress=progress,
        desc="ch06 sweep",
    )
    return collect_sweep(points, results, seconds=time.perf_counter() - started)


def best_head_dims(sweep: HeadCountSweep, *, bootstrap: int, seed: int) -> pd.DataFrame:
    """The best head dimension of every configuration, with a bootstrap over the evaluation batch.

    For each (target, kernel, n, output weights), :math:`d_k^*` is the head dimension with the
    smallest mean error over the replicates. Each bootstrap resample draws R replicates with
    replacement, the same resample for every d_k (they share training sets), and recomputes
    :math:`d_k^*`. The resamples are ``numpy.random.default_rng(seed).integers(0, R, (bootstrap, R))``,
    shared by every configuration.

    Parameters
    ----------
    sweep : HeadCountSweep
    bootstrap : int
        Number of resamples (>= 1).
    seed : int
        Seed of numpy's generator.

    Returns
    -------
    pandas.DataFrame
        One row per configuration (in the order of :attr:`HeadCountSweep.errors`): ``target``,
        ``kernel``, ``n``, ``output_weights``, ``best_head_dim``, ``support`` (share of resamples
        that agree with it), ``lo`` and ``hi`` (the 2.5 % and 97.5 % quantiles of the resampled
        :math:`d_k^*`, inverted CDF), ``boot_mean`` and ``boot_sd`` (ddof 1).

    Raises
    ------
    TypeError, ValueError
        On a bad ``sweep``, ``bootstrap`` or ``seed``, or error arrays of different replicate counts.
    """
    import pandas as pd

    if not isinstance(sweep, HeadCountSweep):
        raise TypeError(f"sweep must be a HeadCountSweep, got {type(sweep).__name__}")
    count = require_positive_int(bootstrap, "bootstrap")
    seed = require_seed(seed)
    reps = {arr.shape[1] for arr in sweep.errors.values()}
    if len(reps) != 1:
        raise ValueError(f"sweep: every configuration must have the same number of replicates, got {sorted(reps)}")
    (replicates,) = reps
    resample = np.random.default_rng(seed).integers(0, replicates, size=(count, replicates))
    dims = np.asarray(sweep.head_dims)
    rows = []
    for (target, kernel, n, weights), arr in sweep.errors.items():
        point = dims[arr.mean(1).argmin()]
        boot = dims[arr[:, resample].mean(-1).argmin(0)]
        lo, hi = np.quantile(boot, [0.025, 0.975], method="inverted_cdf")
        rows.append(
            dict(
                target=target,
                kernel=kernel,
                n=n,
                output_weights=weights,
                best_head_dim=int(point),
                support=float((boot == point).mean()),
                lo=int(lo),
                hi=int(hi),
                boot_mean=float(boot.mean()),
                boot_sd=float(boot.std(ddof=1)) if count > 1 else math.nan,
            )
        )
    return pd.DataFrame(rows)


def best_at(best: pd.DataFrame, target: str, kernel: str, output_weights: str, n: int | None = None) -> Any:
    """The rows of :func:`best_head_dims` for one configuration: over n (sorted), or the row at one n.

    Parameters
    ----------
    best : pandas.DataFrame
        From :func:`best_head_dims`.
    target, kernel, output_weights : str
    n : int, optional
        One sample size: return its row (a Series); default: every n (a DataFrame, ascending n).

    Raises
    ------
    ValueError
        If the table holds no such configuration.
    """
    sel = best[(best.target == target) & (best.kernel == kernel) & (best.output_weights == output_weights)]
    if n is not None:
        sel = sel[sel.n == n]
    if sel.empty:
        raise ValueError(
            f"best holds no row for target={target!r}, kernel={kernel!r}, output_weights={output_weights!r}, n={n!r}"
        )
    return sel.sort_values("n") if n is None else sel.iloc[0]


def best_summary(best: pd.DataFrame, kernel: str = "gaussian") -> pd.DataFrame:
    """The best head dimension of every (target, output weights) at the largest and at the smallest n.

    Parameters
    ----------
    best : pandas.DataFrame
        From :func:`best_head_dims`.
    kernel : str, default "gaussian"

    Returns
    -------
    pandas.DataFrame
        Index (``target``, ``output_weights``) in the order of :data:`HEAD_COUNT_TARGETS` ×
        :data:`OUTPUT_WEIGHTS`; columns ``best_head_dim`` (at the largest n), ``support`` (its
        bootstrap support in %), ``interval`` (the text ``"[lo, hi]"`` of its 95 % bootstrap
        interval) and ``best_head_dim_nmin`` (:math:`d_k^*` at the smallest n).

    Raises
    ------
    ValueError
        If ``best`` lacks a configuration.
    """
    import pandas as pd

    kernel = require_choice(kernel, "kernel", KERNELS)
    rows = {}
    for target in HEAD_COUNT_TARGETS:
        for weights in OUTPUT_WEIGHTS:
            over_n = best_at(best, target, kernel, weights)
            last, first = over_n.iloc[-1], over_n.iloc[0]
            rows[(target, weights)] = dict(
                best_head_dim=int(last.best_head_dim),
                support=float(100 * last.support),
                interval=f"[{last.lo}, {last.hi}]",
                best_head_dim_nmin=int(first.best_head_dim),
            )
    index = pd.MultiIndex.from_tuples(list(rows), names=["target", "output_weights"])
    return pd.DataFrame(list(rows.values()), index=index)


def head_count_census(sweep: HeadCountSweep, n: int | None = None) -> pd.DataFrame:
    """D heads of dimension 1 against one head of dimension D, in every (target, kernel, output weights).

    A descriptive table: each row is the paired difference of the errors (d_k = 1 minus d_k = D, same
    training sets, :func:`nwlib.evidence.paired`) at one n, and ``significant`` marks the rows that
    differ from 0 two-sided with Holm within the table (:func:`nwlib.evidence.significant`).

    Parameters
    ----------
    sweep : HeadCountSweep
    n : int, optional
        Default: the largest sample size.

    Returns
    -------
    pandas.DataFrame
        Rows in the order target × kernel × output weights; columns ``target``, ``kernel``,
        ``output_weights``, ``small_minus_large``, ``se``, ``significant``.
    """
    import pandas as pd

    if not isinstance(sweep, HeadCountSweep):
        raise TypeError(f"sweep must be a HeadCountSweep, got {type(sweep).__name__}")
    small, large = sweep.head_dims[0], sweep.head_dims[-1]
    cases = [(t, k, w) for t in HEAD_COUNT_TARGETS for k in KERNELS for w in OUTPUT_WEIGHTS]
    comparisons = [paired(sweep.series(*case, small, n), sweep.series(*case, large, n)) for case in cases]
    decided = significant(comparisons)
    return pd.DataFrame(
        [
            dict(target=t, kernel=k, output_weights=w, small_minus_large=c.estimate, se=c.se, significant=s)
            for (t, k, w), c, s in zip(cases, comparisons, decided, strict=True)
        ]
    )


class ManyHeadsTests(NamedTuple):
    """The comparisons behind the readings of C10 for one (target, kernel, output weights) at one n.

    Every comparison is paired (the head dimensions of a replicate share its training set); the
    selections use the first half of the evaluation batch and the comparisons that test them the
    second half (:data:`HALVES`), so that no head dimension is chosen on the data it is tested on.

    Attributes
    ----------
    target, kernel, output_weights : str
    n : int
    extreme : Comparison
        err(one head of dimension D) − err(D heads of dimension 1), all replicates: > 0 when the
        D heads of dimension 1 win.
    selected : int
        Among d_k < D (more than one head), the head dimension with the smallest mean error on the
        selection half.
    optimum_many : Comparison
        err(d_k = D) − err(d_k = ``selected``) on the test half: > 0 when the selected multi-head
        configuration beats one head, i.e. the optimum has more than one head.
    monotone : list of Comparison
        err(k_{i+1}) − err(k_i) for consecutive divisors k_i < k_{i+1}, all replicates: all > 0 when
        the error falls at every step towards d_k = 1 (more heads better all the way down).
    one_head_vs_each : list of Comparison
        err(d_k = D) − err(d_k = k) for every k < D, all replicates: all < 0 when one head beats every
        multi-head configuration (a counterexample to "the optimum has more than one head").
    selected_above_one : int
        Among d_k > 1, the head dimension with the smallest mean error on the selection half.
    one_vs_selected : Comparison
        err(d_k = 1) − err(d_k = ``selected_above_one``) on the test half: > 0 when fewer, larger heads
        beat the D heads of dimension 1 (a counterexample to "more heads all the way down").
    best : int
        The head dimension (any) with the smallest mean error on the selection half.
    beats_zero : Comparison
        The share (%) of the zero predictor's error that ``best`` removes on the test half: > 0
        when the estimator smooths at all (otherwise the case is an estimator failure).
    """

    target: str
    kernel: str
    output_weights: str
    n: int
    extreme: Comparison
    selected: int
    optimum_many: Comparison
    monotone: list[Comparison]
    one_head_vs_each: list[Comparison]
    selected_above_one: int
    one_vs_selected: Comparison
    best: int
    beats_zero: Comparison


def many_heads_tests(
    sweep: HeadCountSweep, target: str, kernel: str, output_weights: str, n: int | None = None
) -> ManyHeadsTests:
    """The comparisons of the C10 readings for one configuration (see :class:`ManyHeadsTests`).

    Parameters
    ----------
    sweep : HeadCountSweep
        With at least 4 replicates per configuration (two per half).
    target, kernel, output_weights : str
    n : int, optional
        Default: the largest sample size.

    Returns
    -------
    ManyHeadsTests

    Raises
    ------
    TypeError, ValueError
        On a bad sweep or configuration, or fewer than 4 replicates.
    """
    if not isinstance(sweep, HeadCountSweep):
        raise TypeError(f"sweep must be a HeadCountSweep, got {type(sweep).__name__}")
    dims = sweep.head_dims
    n = sweep._n(n)
    if sweep.series(target, kernel, output_weights, dims[0], n).shape[0] < 4:
        raise ValueError("sweep must hold at least 4 replicates per configuration (two per half)")
    full = sweep.by_head_dim(target, kernel, output_weights, n)
    sel = {k: float(sweep.series(target, kernel, output_weights, k, n, half="select").mean()) for k in dims}
    test = {k: sweep.series(target, kernel, output_weights, k, n, half="test") for k in dims}
    largest = dims[-1]
    selected = min(dims[:-1], key=lambda k: sel[k])
    above_one = min(dims[1:], key=lambda k: sel[k])
    best = min(dims, key=lambda k: sel[k])
    return ManyHeadsTests(
        target=target,
        kernel=kernel,
        output_weights=output_weights,
        n=n,
        extreme=paired(full[largest], full[dims[0]]),
        selected=int(selected),
        optimum_many=paired(test[largest], test[selected]),
        monotone=[paired(full[b], full[a]) for a, b in zip(dims[:-1], dims[1:], strict=True)],
        one_head_vs_each=[paired(full[largest], full[k]) for k in dims[:-1]],
        selected_above_one=int(above_one),
        one_vs_selected=paired(test[dims[0]], test[above_one]),
        best=int(best),
        beats_zero=sweep.gain(target, kernel, output_weights, best, n, half="test"),
    )


def own_dimension_optimum(log_n: float, *, b: float = 1.0, c: float = 1.0, upper: float = 1e6) -> float:
    r"""The minimiser over real :math:`d_k \ge 1` of the paper's-bandwidth risk with the head's own dimension.

    With :math:`h = d_k^{-1/2}` and a head smoothing in its own :math:`d_k` dimensions, the squared bias
    is :math:`b h^4 = b d_k^{-2}` and the variance :math:`c\,h^{-d_k}/n = c\,d_k^{d_k/2}/n`:
    :math:`R(d_k) = b d_k^{-2} + c\,d_k^{d_k/2}/n`. Minimised on the log scale (so that n may be
    astronomically large) by :func:`scipy.optimize.minimize_scalar` on ``[1, upper]``.

    Parameters
    ----------
    log_n : float
        log n (> 0).
    b, c : float, default 1
        The constants (> 0).
    upper : float, default 1e6
        Upper end of the search.

    Returns
    -------
    float

    Examples
    --------
    >>> round(own_dimension_optimum(100.0), 2)
    46.11
    """
    from scipy.optimize import minimize_scalar

    log_n = require_real(log_n, "log_n", minimum=0.0, strict_minimum=True)
    b = require_real(b, "b", minimum=0.0, strict_minimum=True)
    c = require_real(c, "c", minimum=0.0, strict_minimum=True)
    upper = require_real(upper, "upper", minimum=1.0, strict_minimum=True)

    def log_risk(k: float) -> float:
        return float(np.logaddexp(math.log(b) - 2 * math.log(k), math.log(c) + k / 2 * math.log(k) - log_n))

    res = minimize_scalar(log_risk, bounds=(1.0, upper), method="bounded", options={"xatol": 1e-10})
    return float(res.x)


def dot_product_effective_size(queries: Tensor, keys: Tensor, *, temperature: float = 1.0) -> Tensor:
    r"""Kish's effective sample size of the dot-product kernel's weights at each query.

    With weights :math:`w_i = \exp(t\langle z, x_i\rangle)`, :math:`n_{\mathrm{eff}}(z) =
    (\sum_i w_i)^2/\sum_i w_i^2`: the number of equally weighted points that would give the same
    variance of a weighted mean of i.i.d. responses. For :math:`x_i \sim N(0, I)` it tends to
    :math:`n\,e^{-t^2\lVert z\rVert^2}` (chapter 6, reading 3).

    Parameters
    ----------
    queries : Tensor, shape (m, d)
    keys : Tensor, shape (n, d)
    temperature : float, default 1
        t > 0 (the logits are :math:`t\langle z, x\rangle`).

    Returns
    -------
    Tensor, shape (m,)

    Examples
    --------
    >>> import torch
    >>> dot_product_effective_size(torch.zeros(1, 2), torch.randn(10, 2)).tolist()  # all weights equal
    [10.0]
    """
    queries = require_tensor(queries, "queries", min_dim=2)
    keys = require_tensor(keys, "keys", min_dim=2)
    if queries.dim() != 2 or keys.dim() != 2 or queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have shapes (m, d) and (n, d), got {tuple(queries.shape)}, {tuple(keys.shape)}"
        )
    t = require_real(temperature, "temperature", minimum=0.0, strict_minimum=True)
    logits = t * queries @ keys.T
    return torch.exp(2 * torch.logsumexp(logits, -1) - torch.logsumexp(2 * logits, -1))


def nearest_head_dim(values: Any, head_dims: Sequence[int]) -> np.ndarray:
    """For each value, the head dimension of the grid nearest to it on the log scale.

    Parameters
    ----------
    values : array_like, shape (k,)
        Positive values (clipped at 1e-9 below).
    head_dims : sequence of int
        The grid.

    Returns
    -------
    ndarray of int, shape (k,)

    Examples
    --------
    >>> nearest_head_dim([1.3, 1.5, 2.9, 100.0], [1, 2, 4, 12]).tolist()
    [1, 2, 4, 12]
    """
    dims = np.asarray(head_dims)
    if dims.ndim != 1 or dims.size == 0 or np.any(dims <= 0):
        raise ValueError(f"head_dims must be a non-empty sequence of positive ints, got {head_dims!r}")
    v = np.asarray(values, dtype=float)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-dimensional, got shape {v.shape}")
    return dims[np.abs(np.log(np.maximum(v, 1e-9))[:, None] - np.log(dims)[None, :]).argmin(1)]


@dataclass(frozen=True)
class GrowthFit:
    r"""A logarithmic law :math:`a + c\log n` and a power law :math:`C n^\gamma` fitted to :math:`d_k^*` over n.

    Attributes
    ----------
    sample_sizes : ndarray, shape (k,)
        The n of the fit, ascending.
    best_head_dims : list of int
        :math:`d_k^*` at each n.
    log_intercept, log_slope : float
        a and c (least squares of the bootstrap means on log n).
    gamma, log_scale : float
        γ and log C (least squares of log bootstrap means on log n).
    max_gap : float
        Largest difference of the two laws on ``grid_n``.
    spread : float
        The median bootstrap standard deviation of :math:`d_k^*` over n.
    same_choice : bool
        Whether the two laws pick the same head dimension of the grid (:func:`nearest_head_dim`) at
        every simulated n.
    grid_n, fit_log, fit_pow : ndarray
        The two laws on a log-spaced grid of n, for figures.
    """

    sample_sizes: np.ndarray
    best_head_dims: list[int]
    log_intercept: float
    log_slope: float
    gamma: float
    log_scale: float
    max_gap: float
    spread: float
    same_choice: bool
    grid_n: np.ndarray = field(repr=False)
    fit_log: np.ndarray = field(repr=False)
    fit_pow: np.ndarray = field(repr=False)

    def summary(self) -> dict[str, Any]:
        """The readings the chapter quotes: slope, exponent, gap, spread, first and last d_k*, same choice."""
        return dict(
            log_slope=self.log_slope,
            gamma=self.gamma,
            max_gap=self.max_gap,
            spread=self.spread,
            first=self.best_head_dims[0],
            last=self.best_head_dims[-1],
            same_choice="the same" if self.same_choice else "different",
        )


def growth_fit(rows: pd.DataFrame, head_dims: Sequence[int], *, grid_points: int = 200) -> GrowthFit:
    r"""Fit a logarithmic and a power law to the bootstrap means of :math:`d_k^*` over n.

    Parameters
    ----------
    rows : pandas.DataFrame
        One configuration's rows of :func:`best_head_dims` (:func:`best_at` without n): at least two
        distinct n, with ``n``, ``boot_mean`` (> 0), ``boot_sd`` and ``best_head_dim``.
    head_dims : sequence of int
        The grid of head dimensions (for ``same_choice``).
    grid_points : int, default 200
        Points of the log-spaced grid of n between the smallest and largest n.

    Returns
    -------
    GrowthFit

    Raises
    ------
    ValueError
        With fewer than two sample sizes or a non-positive bootstrap mean.
    """
    count = require_positive_int(grid_points, "grid_points", minimum=2)
    sel = rows.sort_values("n")
    if sel.n.nunique() < 2:
        raise ValueError("rows must hold at least two sample sizes n")
    log_n, y = np.log(sel.n.to_numpy(float)), sel.boot_mean.to_numpy()
    if np.any(y <= 0):
        raise ValueError("rows: boot_mean must be positive for the power law")
    grid_n = np.exp(np.linspace(log_n[0], log_n[-1], count))
    c_log, a_log = np.polyfit(log_n, y, 1)
    gamma, log_c = np.polyfit(log_n, np.log(y), 1)
    fit_log, fit_pow = a_log + c_log * np.log(grid_n), np.exp(log_c) * grid_n**gamma
    same = np.all(
        nearest_head_dim(a_log + c_log * log_n, head_dims) == nearest_head_dim(np.exp(log_c + gamma * log_n), head_dims)
    )
    return GrowthFit(
        sample_sizes=sel.n.to_numpy(),
        best_head_dims=[int(k) for k in sel.best_head_dim],
        log_intercept=float(a_log),
        log_slope=float(c_log),
        gamma=float(gamma),
        log_scale=float(log_c),
        max_gap=float(np.max(np.abs(fit_log - fit_pow))),
        spread=float(np.median(sel.boot_sd)),
        same_choice=bool(same),
        grid_n=grid_n,
        fit_log=fit_log,
        fit_pow=fit_pow,
    )


# --- published architectures --------------------------------------------------------------


def published_architectures(path: str | Path) -> pd.DataFrame:
    """Read the table of published architectures and mark the configurations with H·d_k = D.

    Parameters
    ----------
    path : str or Path
        A CSV with columns ``family``, ``d_model``, ``n_heads`` and ``d_head`` (the book's
        ``book/data/published-architectures.csv``); optional ``lineage`` (the group of related
        families, default the family) and ``n_kv_heads`` (key/value heads, default ``n_heads``).

    Returns
    -------
    pandas.DataFrame
        The table with a boolean column ``consistent`` (``n_heads * d_head == d_model``) and the
        columns ``lineage`` and ``n_kv_heads`` filled in where absent.

    Raises
    ------
    ValueError
        If a column is missing.
    """
    import pandas as pd

    arch = pd.read_csv(path)
    missing = [c for c in ("family", "d_model", "n_heads", "d_head") if c not in arch.columns]
    if missing:
        raise ValueError(f"path: the table lacks the column(s) {missing}")
    if "lineage" not in arch.columns:
        arch["lineage"] = arch.family
    if "n_kv_heads" not in arch.columns:
        arch["n_kv_heads"] = arch.n_heads
    arch["consistent"] = arch.n_heads * arch.d_head == arch.d_model
    return arch


def deduplicated(arch: pd.DataFrame, column: str) -> pd.DataFrame:
    """The consistent configurations, one per (lineage, D, ``column``): repeated designs counted once.

    Two releases of one lineage with the same width and the same value of ``column`` (LLaMA-7B and
    Llama-2-7B, T5-Base and t5.1.1.base) are one design decision, not two observations.

    Parameters
    ----------
    arch : pandas.DataFrame
        From :func:`published_architectures`.
    column : str
        ``"n_heads"``, ``"d_head"`` or ``"n_kv_heads"``.

    Returns
    -------
    pandas.DataFrame
        The first row of each group, in the table's order.
    """
    if column not in ("n_heads", "d_head", "n_kv_heads"):
        raise ValueError(f"column must be 'n_heads', 'd_head' or 'n_kv_heads', got {column!r}")
    missing = [c for c in ("lineage", "d_model", column, "consistent") if c not in arch.columns]
    if missing:
        raise ValueError(f"arch lacks the column(s) {missing}")
    return arch[arch.consistent].drop_duplicates(subset=["lineage", "d_model", column])


class ClusterSlope(NamedTuple):
    """A log-log least-squares slope with a cluster-bootstrap standard error.

    Attributes
    ----------
    slope, intercept : float
        Of log y = intercept + slope · log D over every row.
    se : float
        Standard deviation (ddof 1) of the slope over resamples of whole clusters.
    se_iid : float
        The textbook OLS standard error, which treats the rows as independent.
    df : float
        Degrees of freedom of ``se``: clusters − 1.
    rows, clusters : int
    """

    slope: float
    intercept: float
    se: float
    se_iid: float
    df: float
    rows: int
    clusters: int


def cluster_bootstrap_slope(x: Any, y: Any, clusters: Any, *, bootstrap: int, seed: int) -> ClusterSlope:
    """The OLS slope of y on x with a bootstrap over clusters (whole clusters resampled with replacement).

    Designs within a family are not independent observations (a family picks d_k once and scales H
    with D), so the standard error resamples families, not rows (Efron and Tibshirani 1993, the
    cluster bootstrap). Resamples in which x takes fewer than two distinct values are redrawn.

    Parameters
    ----------
    x, y : array_like, shape (k,)
    clusters : array_like, shape (k,)
        A label per row; at least two clusters.
    bootstrap : int
        Resamples (>= 2).
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    ClusterSlope
    """
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    labels = np.asarray(clusters)
    if x.ndim != 1 or x.shape != y.shape or labels.shape != x.shape:
        raise ValueError("x, y and clusters must be 1-dimensional of one length")
    count = require_positive_int(bootstrap, "bootstrap", minimum=2)
    rng = np.random.default_rng(require_seed(seed))
    names = list(dict.fromkeys(labels.tolist()))
    if len(names) < 2:
        raise ValueError("clusters must hold at least two clusters")
    members = [np.flatnonzero(labels == c) for c in names]
    fit = stats.linregress(x, y)
    slopes: list[float] = []
    while len(slopes) < count:
        rows = np.concatenate([members[i] for i in rng.integers(0, len(names), len(names))])
        if np.unique(x[rows]).size < 2:
            continue
        xr, yr = x[rows], y[rows]
        xc = xr - xr.mean()
        slopes.append(float((xc * (yr - yr.mean())).sum() / (xc * xc).sum()))
    return ClusterSlope(
        slope=float(fit.slope),
        intercept=float(fit.intercept),
        se=float(np.std(slopes, ddof=1)),
        se_iid=float(fit.stderr),
        df=float(len(names) - 1),
        rows=int(x.size),
        clusters=len(names),
    )


@dataclass(frozen=True)
class ArchitectureFits:
    """Counts of a table of published architectures and log-log fits of H, d_k and the key/value heads against D.

    The fits use the consistent configurations (H·d_k = D), each design once per lineage
    (:func:`deduplicated`), with cluster-bootstrap standard errors over lineages
    (:func:`cluster_bootstrap_slope`); the counts and the share of d_k in {64, 128} use all rows.

    Attributes
    ----------
    count, families, lineages, inconsistent : int
        Configurations, families, lineages (groups of related families), configurations with H·d_k ≠ D.
    grouped_query : int
        Configurations with fewer key/value heads than query heads (GQA or MQA).
    embed_dim_range, head_dim_range : (int, int)
        Smallest and largest D and d_k.
    num_heads, head_dim, kv_heads : ClusterSlope
        Fits of log H, log d_k and log H_kv (key/value heads) on log D.
    num_heads_intercept, num_heads_slope, num_heads_slope_se, head_dim_slope, head_dim_slope_se : float
        Shorthands: ``num_heads.intercept``, ``num_heads.slope``, ``num_heads.se``, ``head_dim.slope``,
        ``head_dim.se``.
    share_64_128 : float
        Share (0 to 1) of configurations with d_k = 64 or 128.
    """

    count: int
    families: int
    lineages: int
    inconsistent: int
    grouped_query: int
    embed_dim_range: tuple[int, int]
    head_dim_range: tuple[int, int]
    num_heads: ClusterSlope
    head_dim: ClusterSlope
    kv_heads: ClusterSlope
    share_64_128: float

    @property
    def num_heads_intercept(self) -> float:
        return self.num_heads.intercept

    @property
    def num_heads_slope(self) -> float:
        return self.num_heads.slope

    @property
    def num_heads_slope_se(self) -> float:
        return self.num_heads.se

    @property
    def head_dim_slope(self) -> float:
        return self.head_dim.slope

    @property
    def head_dim_slope_se(self) -> float:
        return self.head_dim.se


def architecture_fits(arch: pd.DataFrame, *, bootstrap: int = 2000, seed: int = 0) -> ArchitectureFits:
    """Counts and deduplicated, cluster-bootstrapped log-log fits of a table from :func:`published_architectures`.

    Parameters
    ----------
    arch : pandas.DataFrame
        With ``family``, ``lineage``, ``d_model``, ``n_heads``, ``d_head``, ``n_kv_heads`` and
        ``consistent``; at least three consistent designs with distinct ``d_model`` and two lineages.
    bootstrap : int, default 2000
        Cluster-bootstrap resamples.
    seed : int, default 0

    Returns
    -------
    ArchitectureFits

    Raises
    ------
    ValueError
        If a column is missing or too few rows are consistent.
    """
    needed = ("family", "lineage", "d_model", "n_heads", "d_head", "n_kv_heads", "consistent")
    missing = [c for c in needed if c not in arch.columns]
    if missing:
        raise ValueError(f"arch lacks the column(s) {missing}")
    if arch[arch.consistent].d_model.nunique() < 3:
        raise ValueError("arch needs at least three consistent rows with distinct d_model")
    fits = {}
    for column in ("n_heads", "d_head", "n_kv_heads"):
        rows = deduplicated(arch, column)
        fits[column] = cluster_bootstrap_slope(
            np.log(rows.d_model), np.log(rows[column]), rows.lineage, bootstrap=bootstrap, seed=seed
        )
    return ArchitectureFits(
        count=len(arch),
        families=int(arch.family.nunique()),
        lineages=int(arch.lineage.nunique()),
        inconsistent=int((~arch.consistent).sum()),
        grouped_query=int((arch.n_kv_heads < arch.n_heads).sum()),
        embed_dim_range=(int(arch.d_model.min()), int(arch.d_model.max())),
        head_dim_range=(int(arch.d_head.min()), int(arch.d_head.max())),
        num_heads=fits["n_heads"],
        head_dim=fits["d_head"],
        kv_heads=fits["n_kv_heads"],
        share_64_128=float(arch.d_head.isin([64, 128]).mean()),
    )


# --- the chapter's tables, for reading (nwlib.book.table) -----------------------------------------

_COMBINATION_WORDS = {"sum": "added (output weights)", "mean": "averaged (1/H)"}
_WEIGHT_WORDS = {"fitted": "fitted", "uniform": "average (1/H)"}


def _require_columns(frame: object, name: str, columns: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks the column(s) {missing}")
    return frame


def format_floor_table(floors: pd.DataFrame) -> pd.DataFrame:
    """:func:`floor_table` for reading: one column per target and combination, three significant digits.

    Floors below 1e-12 in absolute value (an exact 0 up to rounding: the additive target added up by
    output weights) are shown as 0.

    Parameters
    ----------
    floors : pandas.DataFrame
        From :func:`floor_table`.

    Returns
    -------
    pandas.DataFrame of str
        Index: the head dimension; columns ``"<target>: added (output weights)"`` and
        ``"<target>: averaged (1/H)"``.
    """
    import pandas as pd

    from ..book import table

    if not isinstance(floors, pd.DataFrame) or floors.columns.nlevels != 2:
        raise TypeError("floors must be the DataFrame of floor_table (columns (target, combination))")
    shown = floors.where(floors.abs() > 1e-12, 0.0)
    shown.columns = [f"{t}: {_COMBINATION_WORDS[c]}" for t, c in floors.columns]
    return table(shown.rename_axis("head_dim"))


def format_mse_table(sweep_table: pd.DataFrame) -> pd.DataFrame:
    """The sweep's test MSE ± SE, one row per (target, kernel, output weights, n), one column per d_k.

    Parameters
    ----------
    sweep_table : pandas.DataFrame
        :attr:`HeadCountSweep.table`.

    Returns
    -------
    pandas.DataFrame of str
        Columns ``"d_k = k"`` for every head dimension, cells ``"MSE ± SE"`` (:func:`nwlib.book.with_se`).
    """
    import pandas as pd

    from ..book import table

    frame = _require_columns(sweep_table, "sweep_table", ("target", "kernel", "output_weights", "n", "head_dim"))
    frame = frame.assign(kernel=frame.kernel.map(KERNEL_NAMES), output_weights=frame.output_weights.map(_WEIGHT_WORDS))
    index = ["target", "kernel", "output_weights", "n"]
    wide = frame.pivot_table(index=index, columns="head_dim", values=["mse", "se"], sort=False)
    dims = sorted(frame.head_dim.unique())
    columns = {}
    for k in dims:
        columns[f"d_k = {k}"] = wide[("mse", k)]
        columns[f"d_k = {k} SE"] = wide[("se", k)]
    return table(pd.DataFrame(columns, index=wide.index), headers={c: c for c in columns})


def format_best_table(best: pd.DataFrame) -> pd.DataFrame:
    """The best head dimension :math:`d_k^*` of every (target, kernel, output weights), one column per n.

    Parameters
    ----------
    best : pandas.DataFrame
        From :func:`best_head_dims`.

    Returns
    -------
    pandas.DataFrame of str
        Columns ``"n = <n>"``, ascending.
    """
    from ..book import table

    frame = _require_columns(best, "best", ("target", "kernel", "output_weights", "n", "best_head_dim"))
    frame = frame.assign(kernel=frame.kernel.map(KERNEL_NAMES), output_weights=frame.output_weights.map(_WEIGHT_WORDS))
    wide = frame.pivot(index=["target", "kernel", "output_weights"], columns="n", values="best_head_dim")
    wide = wide.reindex(frame[["target", "kernel", "output_weights"]].drop_duplicates().itertuples(index=False))
    wide.columns = [f"n = {n}" for n in wide.columns]
    return table(wide.astype(int).rename_axis(["target", "kernel", "output weights"]))


def format_best_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """:func:`best_summary` for reading: :math:`d_k^*` at the largest n, its bootstrap support and interval.

    Parameters
    ----------
    summary : pandas.DataFrame
        From :func:`best_summary`.

    Returns
    -------
    pandas.DataFrame of str, indexed like ``summary`` (output weights in words).
    """
    from ..book import table

    frame = _require_columns(summary, "summary", ("best_head_dim", "support", "interval", "best_head_dim_nmin"))
    index = [(t, _WEIGHT_WORDS.get(w, w)) for t, w in frame.index]
    headers = {
        "best_head_dim": "d_k* (largest n)",
        "support": "bootstrap support (%)",
        "interval": "95% bootstrap interval",
        "best_head_dim_nmin": "d_k* (smallest n)",
    }
    shown = frame.set_axis(frame.index.from_tuples(index, names=["target", "output weights"]), axis=0)
    return table(shown, headers=headers)


def format_census(census: pd.DataFrame) -> pd.DataFrame:
    """:func:`head_count_census` for reading: the paired difference ± SE and whether Holm marks it.

    Parameters
    ----------
    census : pandas.DataFrame
        From :func:`head_count_census`.

    Returns
    -------
    pandas.DataFrame of str
        Index (target, kernel, output weights); columns the difference (d_k = 1 minus d_k = D) and
        ``significant (Holm)``.
    """
    from ..book import table

    columns = ("target", "kernel", "output_weights", "small_minus_large", "se", "significant")
    frame = _require_columns(census, "census", columns)
    frame = frame.assign(kernel=frame.kernel.map(KERNEL_NAMES), output_weights=frame.output_weights.map(_WEIGHT_WORDS))
    frame = frame.set_index(["target", "kernel", "output_weights"]).rename_axis(["target", "kernel", "output weights"])
    headers = {
        "small_minus_large": "MSE of D heads of dim. 1 minus one head (paired)",
        "significant": "significant (Holm)",
    }
    return table(frame, se={"small_minus_large": "se"}, headers=headers)


def format_attention_best(best: pd.DataFrame) -> pd.DataFrame:
    """Attention's best configuration per (kernel, target, n) beside the zero predictor's error.

    Parameters
    ----------
    best : pandas.DataFrame
        Rows of :attr:`HeadCountSweep.table` (the notebook's best row per kernel, target and n), with a
        column ``removed_pct`` (the share of the zero predictor's error removed, in %).

    Returns
    -------
    pandas.DataFrame of str
        Index (kernel, target, n); columns output weights, d_k, τ (``–`` where the kernel has none),
        ``MSE ± SE``, the zero predictor's MSE and the share removed.
    """
    import pandas as pd

    from ..book import table

    columns = ("kernel", "target", "n", "output_weights", "head_dim", "temperature", "mse", "se", "mse_zero")
    frame = _require_columns(best, "best", (*columns, "removed_pct"))
    index = pd.MultiIndex.from_arrays(
        [frame.kernel.map(KERNEL_NAMES), frame.target, frame.n], names=["kernel", "target", "n"]
    )
    shown = table(
        pd.DataFrame(
            {
                "output weights": frame.output_weights.map(_WEIGHT_WORDS).to_numpy(),
                "head_dim": frame.head_dim.astype(int).to_numpy(),
                "MSE": frame.mse.to_numpy(),
                "MSE SE": frame.se.to_numpy(),
                "zero predictor's MSE": frame.mse_zero.to_numpy(),
                "share removed (%)": frame.removed_pct.to_numpy(),
            },
            index=index,
        ),
        headers={"head_dim": "d_k"},
    )
    taus = ["–" if pd.isna(t) else f"{float(t):g}" for t in frame.temperature]
    shown.insert(2, "τ", taus)
    return shown
