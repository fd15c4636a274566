r"""How many heads for a fixed width (Theorem 6.1): targets, heads on coordinate blocks, and one grid point.

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
:func:`nwlib.sweep.run_sweep`): the Monte Carlo test error of every divisor pair
:math:`(H, d_k)` at one sample size, for one target and one kernel.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

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
from ..montecarlo import simulate
from ..sweep import point_seed
from ..tasks import RegressionTask, make_task
from ..weighting import least_squares_weights, replicate_mse, uniform_weights

__all__ = [
    "HEAD_COUNT_TARGETS",
    "COMBINATIONS",
    "approximation_error",
    "block_conditional_mean",
    "block_projections",
    "divisor_head_dims",
    "head_count_point",
    "head_count_task",
    "target_variance",
]

HEAD_COUNT_TARGETS: tuple[str, ...] = ("additive", "local", "global")
"""Targets accepted by :func:`head_count_task` and :func:`approximation_error`."""

COMBINATIONS: tuple[str, ...] = ("sum", "mean")
"""How the heads are combined in :func:`approximation_error`: added up (W_O) or averaged (1/H)."""

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
      where each combination's integrated squared error against f is recorded per replicate.

    Within a batch every d_k sees the same training sets (one generator seed per batch), so
    differences between head dimensions are paired. Kernels (our choices): ``"gaussian"`` is
    the NW surrogate with the engine's default bandwidth (Scott's rule,
    :math:`\propto n^{-1/(d_k+4)}`); ``"exp"`` is attention's dot-product kernel with
    :math:`W_K^h` the block, :math:`W_Q^h = \sqrt{d_k}\,W_K^h` (so that the logits are
    :math:`\langle W_K^{h\top} z, W_K^{h\top} x_i\rangle`: unit temperature after attention's
    :math:`1/\sqrt{d_k}`) and values :math:`W_V^h` reading the response of the token
    :math:`(x_i, y_i)`.

    Parameters
    ----------
    point : Mapping
        ``target`` (see :data:`HEAD_COUNT_TARGETS`), ``kernel`` ("gaussian" or "exp"), ``n``,
        ``embed_dim``, ``replicates`` (>= 3), ``replicates_fit``, ``m`` and ``noise_sd``;
        optionally ``eval_seed`` (an int): then the evaluation and fitting points and the fitting
        noise come from :func:`nwlib.sweep.point_seed` of it and (target, D, m, replicates_fit),
        so that every n and kernel of a target is scored on the same points.
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
        (variance + covariance of the fitted combination); ``floor_sum`` and ``floor_mean``, the
        approximation error on the evaluation points (:func:`block_conditional_mean` summed or
        averaged against f); ``mse_zero``, the integrated
        squared error of predicting 0 (the mean of f² over the evaluation points); and ``device``.

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    if not isinstance(point, Mapping):
        raise TypeError(f"point must be a mapping, got {type(point).__name__}")
    missing = [k for k in _POINT_KEYS if k not in point]
    if missing:
        raise ValueError(f"point lacks the coordinate(s) {missing}")
    kernel = require_choice(point["kernel"], "kernel", ("gaussian", "exp"))
    n = require_positive_int(point["n"], "n")
    dim = require_positive_int(point["embed_dim"], "embed_dim")
    reps = require_positive_int(point["replicates"], "replicates")
    reps_fit = require_positive_int(point["replicates_fit"], "replicates_fit")
    m = require_positive_int(point["m"], "m")
    if reps < 3:
        raise ValueError(f"replicates must be >= 3 (jackknife standard errors), got {reps}")
    task = head_count_task(point["target"], dim, noise_sd=point["noise_sd"])
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
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
    for k in divisor_head_dims(dim):
        w_k = block_projections(k, dim, dtype=dtype, device=dev)
        heads = w_k.shape[0]
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
        w_fit = least_squares_weights(fit, y_fit)
        w_unif = uniform_weights(heads, dtype=dtype, device=dev)
        dec_u = decompose(pred, f_eval, w_unif).integrated()
        dec_f = decompose(pred, f_eval, w_fit).integrated()
        out["head_dims"].append(k)
        out["num_heads"].append(heads)
        out["mse_uniform"].append(replicate_mse(pred, f_eval, w_unif).double().cpu().tolist())
        out["mse_fitted"].append(replicate_mse(pred, f_eval, w_fit).double().cpu().tolist())
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
