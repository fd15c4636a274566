"""Monte Carlo simulation of an ensemble of Nadaraya–Watson heads over training sets.

:func:`simulate` draws R independent training sets from a
:class:`~nwlib.tasks.RegressionTask`, fits every head on each, and evaluates
the heads at fixed points. The predictions, shape (R, H, m), are what
:func:`nwlib.decompose` turns into bias, variance and covariance terms.
:func:`memory_estimate` states, buffer by buffer, how many bytes a call holds
at most; :func:`simulate` picks its chunk size from it.

The work is split into named steps: :func:`_validated` checks the arguments,
:func:`_head_bandwidths` resolves the bandwidth, :func:`memory_estimate` picks the
chunk size, :class:`_DataBlocks` draws the training sets and :func:`_head_inputs`
projects them for the heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from ._validation import (
    require_choice,
    require_device,
    require_dtype,
    require_generator,
    require_positive_finite,
    require_positive_int,
    require_same_dtype_device,
    require_tensor,
)
from .bandwidth import scott_bandwidth
from .kernels import KERNELS, nadaraya_watson
from .tasks import DRAW_DTYPE, RegressionTask

__all__ = [
    "simulate",
    "memory_estimate",
    "MemoryEstimate",
    "fused_attention_available",
    "HEAD_DATA",
    "DEFAULT_MEMORY_BUDGET",
    "DATA_BLOCK",
    "KERNEL_WORKSPACE",
]

HEAD_DATA: tuple[str, ...] = ("shared", "independent")
"""Values accepted by the ``head_data`` argument of :func:`simulate`."""

DEFAULT_MEMORY_BUDGET: int = 256 * 2**20
"""Bytes that :func:`simulate` aims to stay under when ``chunk_size`` is None."""

DATA_BLOCK: int = 16
"""Replicates drawn per private generator seed in :func:`simulate` (fixes the random stream)."""

KERNEL_WORKSPACE: int = 16 * 2**20
"""Allowance, in bytes, for the fused attention kernel's internal buffers.

The CPU flash kernel keeps per-thread score tiles (a few hundred queries by a few
hundred keys per thread), independent of R, n and m; 16 MiB covers them with a wide
margin on machines with up to 64 threads. The benchmark checks the bound it is part of.
"""


def fused_attention_available(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether SDPA has a fused kernel (no (m, n) weight matrix) for this dtype and device.

    On the CPU the flash kernel takes float16, bfloat16, float32 and float64. On
    CUDA the fused kernels (flash, memory-efficient) take float16, bfloat16 and
    float32 but not float64, which falls back to the math path that forms the
    (m, n) weights. Other devices are assumed not to have one.

    Parameters
    ----------
    dtype : torch.dtype
    device : torch.device or str

    Returns
    -------
    bool

    Examples
    --------
    >>> import torch
    >>> fused_attention_available(torch.float64, "cpu"), fused_attention_available(torch.float64, "cuda")
    (True, False)
    """
    dtype = require_dtype(dtype)
    device = require_device(device)
    if device.type == "cpu":
        return dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if device.type == "cuda":
        return dtype in (torch.float16, torch.bfloat16, torch.float32)
    return False


@dataclass(frozen=True)
class MemoryEstimate:
    """Upper bound on the bytes :func:`simulate` holds at once, buffer by buffer.

    Attributes
    ----------
    parts : dict of str to int
        Bytes per buffer (see :func:`memory_estimate` for each name).
    chunk_size : int
        Replicates per batched call that the estimate is for.
    fused : bool
        Whether the fused attention kernel applies (otherwise the (m, n)
        weights of the math fallback are counted).
    """

    parts: dict[str, int]
    chunk_size: int
    fused: bool

    @property
    def total(self) -> int:
        """The bound: the sum of the parts, in bytes."""
        return sum(self.parts.values())


def memory_estimate(
    *,
    num_heads: int,
    n: int,
    m: int,
    embed_dim: int,
    head_dim: int,
    replicates: int,
    chunk_size: int,
    head_data: Literal["shared", "independent"] = "shared",
    kernel: Literal["exp", "gaussian"] = "gaussian",
    head_values: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> MemoryEstimate:
    r"""Bytes that one call of :func:`simulate` holds at most, counted buffer by buffer.

    With s the itemsize of ``dtype``, B = min(16, R) the data block,
    H_x = H for independent head data (else 1), c the chunk size and
    w = max(d_k, 1) the width the attention kernel works at, the parts are:

    ``predictions``
        the returned (R, H, m) tensor, s·R·H·m;
    ``queries``
        the projected evaluation points, s·H·m·d_k;
    ``data blocks``
        the block of training sets in use and the next one while it is drawn,
        2·s·B·H_x·n·(D + 1);
    ``draw (float64)``
        the transient float64 draw of a block (inputs, noise and f's
        intermediates), 8·B·H_x·n·(2D + 3);
    ``chunk data``
        a chunk's training sets when it spans two blocks, s·c·H_x·n·(D + 1);
    ``chunk work``
        per replicate of the chunk: keys as projected and in the kernel's layout
        (2·H·n·d_k), their centred copy and the Gaussian mask's intermediates
        (2·H·n·d_k + 2·H·n, Gaussian only), queries broadcast to the chunk
        (H·m·w), responses padded to width w (H_x·n·w), the kernel's output and
        log-normaliser (H·m·(w + 1)) and the sliced result (H·m), all times s·c;
        for independent head data also the broadcast projections (H·D·d_k); with
        head-specific values the tokens [x, y] (H_x·n·(D + 1)) and the values
        (H·n);
    ``kernel workspace``
        :data:`KERNEL_WORKSPACE`;
    ``attention weights (fallback)``
        only where no fused kernel applies (:func:`fused_attention_available`):
        the scores, their softmax and the mask, 3·s·c·H·m·n.

    Parameters
    ----------
    num_heads, n, m, embed_dim, head_dim, replicates, chunk_size : int
        H, the training-set size, the number of evaluation points, D, d_k, R and
        the chunk size c (all >= 1).
    head_data, kernel : str
        As in :func:`simulate`.
    head_values : bool, default False
        Whether ``simulate`` gets ``value_projections``.
    dtype : torch.dtype, default torch.float32
    device : torch.device or str, default "cpu"

    Returns
    -------
    MemoryEstimate
        ``.total`` is the bound in bytes, ``.parts`` its terms.

    Examples
    --------
    >>> est = memory_estimate(num_heads=8, n=2048, m=256, embed_dim=16, head_dim=2,
    ...                       replicates=1000, chunk_size=16)
    >>> est.total == sum(est.parts.values()), est.parts["predictions"] == 4 * 1000 * 8 * 256
    (True, True)
    """
    H = require_positive_int(num_heads, "num_heads")
    n = require_positive_int(n, "n")
    m = require_positive_int(m, "m")
    D = require_positive_int(embed_dim, "embed_dim")
    d_k = require_positive_int(head_dim, "head_dim")
    R = require_positive_int(replicates, "replicates")
    c = require_positive_int(chunk_size, "chunk_size")
    require_choice(head_data, "head_data", HEAD_DATA)
    require_choice(kernel, "kernel", KERNELS)
    if not isinstance(head_values, bool):
        raise TypeError(f"head_values must be a bool, got {type(head_values).__name__}")
    dtype = require_dtype(dtype)
    device = require_device(device)
    s = dtype.itemsize
    draw = DRAW_DTYPE.itemsize
    h_x = H if head_data == "independent" else 1
    block = min(DATA_BLOCK, R)
    width = max(d_k, 1)
    gaussian = kernel == "gaussian"
    per_replicate = (
        2 * H * n * d_k
        + (2 * H * n * d_k + 2 * H * n if gaussian else 0)
        + H * m * width
        + h_x * n * width
        + H * m * (width + 1)
        + H * m
        + (H * D * d_k if head_data == "independent" else 0)
        + (h_x * n * (D + 1) + H * n if head_values else 0)
    )
    fused = fused_attention_available(dtype, device)
    parts = {
        "predictions": s * R * H * m,
        "queries": s * H * m * d_k,
        "data blocks": 2 * s * block * h_x * n * (D + 1),
        "draw (float64)": draw * block * h_x * n * (2 * D + 3),
        "chunk data": s * c * h_x * n * (D + 1),
        "chunk work": s * c * per_replicate,
        "kernel workspace": KERNEL_WORKSPACE,
    }
    if not fused:
        parts["attention weights (fallback)"] = 3 * s * c * H * m * n
    return MemoryEstimate(parts=parts, chunk_size=c, fused=fused)


def _largest_chunk(budget: int, **sizes) -> int:
    """The largest chunk size in [1, R] whose :func:`memory_estimate` fits ``budget`` (1 if none does)."""
    replicates = sizes["replicates"]
    at_one = memory_estimate(chunk_size=1, **sizes).total
    per_replicate = memory_estimate(chunk_size=2, **sizes).total - at_one  # the bound is linear in c
    if at_one > budget:
        return 1
    return int(min(replicates, 1 + (budget - at_one) // max(per_replicate, 1)))


def _default_bandwidth(key_projections: Tensor, n: int) -> Tensor:
    # Under x ~ N(0, I_D) head h's keys are N(0, W_hᵀW_h); Scott's rule with the
    # average coordinate variance tr(W_hᵀW_h)/d_k needs no data, so every replicate
    # uses the same bandwidth and the heads stay comparable.
    d_k = key_projections.shape[-1]
    sigma = (key_projections.pow(2).sum(dim=(-2, -1)) / d_k).sqrt()
    return scott_bandwidth(n, d_k, sigma)  # type: ignore[return-value]


def _check_projections(name: str, w: object, reference: Tensor, dim: int) -> Tensor:
    w = require_tensor(w, name)
    require_same_dtype_device(reference, "eval_points", **{name: w})
    if w.dim() != 3:
        raise ValueError(f"{name} must have shape (H, D, d_k), got {tuple(w.shape)}")
    if w.shape[0] < 1 or w.shape[2] < 1:
        raise ValueError(f"{name} must have H >= 1 and d_k >= 1, got shape {tuple(w.shape)}")
    if w.shape[1] != dim:
        raise ValueError(f"{name} must have D = task.embed_dim = {dim} rows per head, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):  # once per call, before any work
        raise ValueError(f"{name} must be finite")
    return w


class _Inputs(NamedTuple):
    task: RegressionTask
    w_k: Tensor
    w_q: Tensor
    w_v: Tensor | None
    eval_points: Tensor
    n: int
    replicates: int


def _validated(
    task: object,
    key_projections: object,
    eval_points: object,
    query_projections: object,
    value_projections: object,
    n: object,
    replicates: object,
    generator: object,
    kernel: object,
    head_data: object,
) -> _Inputs:
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    eval_points = require_tensor(eval_points, "eval_points")
    if eval_points.dim() != 2 or eval_points.shape[1] != task.embed_dim:
        raise ValueError(
            f"eval_points must have shape (m, D) with D = task.embed_dim = {task.embed_dim}, "
            f"got {tuple(eval_points.shape)}"
        )
    if eval_points.shape[0] < 1:
        raise ValueError("eval_points must contain at least one point (m >= 1)")
    w_k = _check_projections("key_projections", key_projections, eval_points, task.embed_dim)
    w_q = w_k
    if query_projections is not None:
        w_q = _check_projections("query_projections", query_projections, eval_points, task.embed_dim)
        if w_q.shape != w_k.shape:
            raise ValueError(
                f"query_projections must have the shape of key_projections: {tuple(w_q.shape)} vs {tuple(w_k.shape)}"
            )
    w_v = None
    if value_projections is not None:
        w_v = require_tensor(value_projections, "value_projections")
        require_same_dtype_device(eval_points, "eval_points", value_projections=w_v)
        if w_v.shape != (w_k.shape[0], task.embed_dim + 1):
            raise ValueError(
                f"value_projections must have shape (H, D + 1) = ({w_k.shape[0]}, {task.embed_dim + 1}), "
                f"got {tuple(w_v.shape)}"
            )
    n = require_positive_int(n, "n")
    replicates = require_positive_int(replicates, "replicates")
    require_generator(generator, eval_points.device, device_name="eval_points' device")
    require_choice(kernel, "kernel", KERNELS)
    require_choice(head_data, "head_data", HEAD_DATA)
    return _Inputs(task, w_k, w_q, w_v, eval_points, n, replicates)


def _head_bandwidths(bandwidth: object, kernel: str, w_k: Tensor, n: int, reference: Tensor) -> float | Tensor | None:
    """The bandwidth passed to the kernel: a float, a 0-dim tensor or one per head, shape (H,)."""
    heads = w_k.shape[0]
    if bandwidth is None:
        return _default_bandwidth(w_k, n) if kernel == "gaussian" else None
    if isinstance(bandwidth, Tensor):
        require_tensor(bandwidth, "bandwidth")
        require_same_dtype_device(reference, "eval_points", bandwidth=bandwidth)
        if bandwidth.dim() != 0 and bandwidth.shape != (heads,):
            raise ValueError(
                f"bandwidth must be a float or a tensor of shape (H,) = ({heads},), got shape {tuple(bandwidth.shape)}"
            )
        return bandwidth
    return require_positive_finite(bandwidth, "bandwidth")


class _DataBlocks:
    """The training sets of replicates, drawn in fixed blocks of :data:`DATA_BLOCK`.

    One seed per block is drawn from the caller's generator up front; block b is
    then drawn from a private generator seeded with seeds[b]. The stream depends
    on the block size, a constant, but not on how the caller chunks the
    replicates, and drawing a block at a time keeps the many small tensor
    operations of per-replicate draws out of the loop. Only the block in use is
    kept.
    """

    def __init__(
        self,
        task: RegressionTask,
        n: int,
        replicates: int,
        draw_shape: tuple[int, ...],
        generator: torch.Generator,
        dtype: torch.dtype,
    ) -> None:
        self.task, self.n, self.replicates = task, n, replicates
        self.draw_shape, self.dtype = draw_shape, dtype
        count = -(-replicates // DATA_BLOCK)
        # One host transfer per call: the seeds seed CPU-side generator state.
        self.seeds = torch.randint(0, 2**62, (count,), generator=generator, device=generator.device).tolist()
        self.private = torch.Generator(device=generator.device)
        self.cached: tuple[int, Tensor, Tensor] | None = None

    def block(self, b: int) -> tuple[Tensor, Tensor]:
        if self.cached is None or self.cached[0] != b:
            self.cached = None  # release the previous block before drawing the next
            size = min(DATA_BLOCK, self.replicates - b * DATA_BLOCK)
            self.private.manual_seed(self.seeds[b])
            x, y = self.task.sample((size, *self.draw_shape), self.n, generator=self.private, dtype=self.dtype)
            self.cached = (b, x, y)
        return self.cached[1], self.cached[2]

    def get(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        first, last = start // DATA_BLOCK, (stop - 1) // DATA_BLOCK
        if first == last:
            x, y = self.block(first)
            offset = start - first * DATA_BLOCK
            return x[offset : offset + stop - start], y[offset : offset + stop - start]
        # A chunk across blocks: copy each block's share into one buffer, a block at a time.
        x0, y0 = self.block(first)
        x = x0.new_empty((stop - start, *x0.shape[1:]))
        y = y0.new_empty((stop - start, *y0.shape[1:]))
        for b in range(first, last + 1):
            lo, hi = max(start, b * DATA_BLOCK), min(stop, (b + 1) * DATA_BLOCK)
            xb, yb = self.block(b)
            x[lo - start : hi - start] = xb[lo - b * DATA_BLOCK : hi - b * DATA_BLOCK]
            y[lo - start : hi - start] = yb[lo - b * DATA_BLOCK : hi - b * DATA_BLOCK]
        return x, y


def _head_inputs(x: Tensor, y: Tensor, w_k: Tensor, w_v: Tensor | None, head_data: str) -> tuple[Tensor, Tensor]:
    """Keys (c, H, n, d_k) and values broadcastable to (c, H, n) for one chunk of training sets."""
    heads, dim, d_k = w_k.shape
    if head_data == "shared":
        # One GEMM against all heads' projections side by side; a broadcast matmul
        # (c, 1, n, D) @ (H, D, d_k) would first copy x once per head.
        flat = w_k.permute(1, 0, 2).reshape(dim, heads * d_k)
        keys = (x @ flat).unflatten(-1, (heads, d_k)).transpose(1, 2).contiguous()
        if w_v is None:
            return keys, y.unsqueeze(1)  # (c, 1, n): the responses broadcast over heads
        tokens = torch.cat([x, y.unsqueeze(-1)], dim=-1)  # (c, n, D + 1)
        return keys, (tokens @ w_v.mT).transpose(1, 2)  # (c, H, n)
    keys = x @ w_k  # (c, H, n, D) @ (H, D, d_k)
    if w_v is None:
        return keys, y
    tokens = torch.cat([x, y.unsqueeze(-1)], dim=-1)  # (c, H, n, D + 1)
    return keys, torch.einsum("chnd,hd->chn", tokens, w_v)


def simulate(
    task: RegressionTask,
    key_projections: Tensor,
    eval_points: Tensor,
    *,
    n: int,
    replicates: int,
    generator: torch.Generator,
    kernel: Literal["exp", "gaussian"] = "gaussian",
    bandwidth: float | Tensor | None = None,
    head_data: Literal["shared", "independent"] = "shared",
    chunk_size: int | None = None,
    progress: bool = False,
    query_projections: Tensor | None = None,
    value_projections: Tensor | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    r"""Predictions of H Nadaraya–Watson heads over R independent training sets.

    For replicate r a training set :math:`(x_i, y_i)_{i \le n}` is drawn from
    ``task``; head h is the NW estimator with keys :math:`W_h^\top x_i`,
    values :math:`y_i` and queries :math:`W_h^\top z_j` at the evaluation
    points :math:`z_j`:

    .. math:: \hat f_h^{(r)}(z_j) = \frac{\sum_i K(W_h^\top z_j, W_h^\top x_i)\, y_i}
              {\sum_i K(W_h^\top z_j, W_h^\top x_i)}.

    All heads and a chunk of replicates go through one batched call of
    :func:`nwlib.nadaraya_watson` (keys of shape (chunk, H, n, d_k)).

    Parameters
    ----------
    task : RegressionTask
        The data-generating process.
    key_projections : Tensor, shape (H, D, d_k)
        :math:`W_h`, one projection per head (queries use the same projection
        unless ``query_projections`` is given).
    eval_points : Tensor, shape (m, D)
        Fixed evaluation points. Their dtype and device are the simulation's.
    n : int
        Training-set size.
    replicates : int
        Number R of independent training sets.
    generator : torch.Generator
        Seeded source of randomness, on the device of ``eval_points``.
    kernel : {"exp", "gaussian"}, default "gaussian"
        As in :func:`nwlib.nadaraya_watson`.
    bandwidth : float or Tensor of shape () or (H,), optional
        One bandwidth for all heads, or one per head. Default for ``"exp"``:
        :math:`d_k^{1/4}` (attention's scaling). Default for ``"gaussian"``
        (our choice): Scott's rule in the projected space,
        :math:`h_h = \sigma_h n^{-1/(d_k+4)}` with
        :math:`\sigma_h^2 = \operatorname{tr}(W_h^\top W_h)/d_k`, the average
        variance of a projected coordinate under the N(0, I_D) design.
        :func:`nwlib.select_bandwidth` chooses one from data instead.
    head_data : {"shared", "independent"}, default "shared"
        ``"shared"``: all heads of a replicate see the same training set (as in
        multi-head attention). ``"independent"``: every head gets its own
        independent training set of size n.
    chunk_size : int, optional
        Replicates per batched call. Default: the largest chunk whose
        :func:`memory_estimate` fits in ``memory_budget``.
    progress : bool, default False
        Show a tqdm progress bar over replicates.
    query_projections : Tensor, shape (H, D, d_k), optional
        Separate query projections :math:`W_{Q,h}`: queries become
        :math:`W_{Q,h}^\top z_j`.
    value_projections : Tensor, shape (H, D + 1), optional
        Head-specific values, as attention's :math:`W_V^h` acting on the token
        :math:`(x_i, y_i)`: head h averages :math:`v_{hi} = \langle w_{V,h}, (x_i, y_i)\rangle`
        instead of :math:`y_i`. Default: every head averages :math:`y_i`
        (:math:`w_{V,h} = e_{D+1}`).
    memory_budget : int, default 256 MiB
        Bytes the call aims to stay under when choosing ``chunk_size``.

    Returns
    -------
    Tensor, shape (R, H, m)
        ``out[r, h, j]`` is head h's estimate at ``eval_points[j]`` from
        training set r; dtype and device of ``eval_points``.

    Raises
    ------
    TypeError
        On wrong argument types or mismatched dtypes.
    ValueError
        On shape mismatches, mixed devices, non-positive sizes, unknown
        ``kernel`` or ``head_data``, or a bad ``bandwidth``.

    Notes
    -----
    *Memory.* :func:`memory_estimate` bounds everything the call holds at once:
    the returned R·H·m values, the data block in use (and its float64 draw),
    the chunk's keys, queries, padded responses and kernel outputs, and the
    (m, n) weights where no fused attention kernel applies (float64 on CUDA).
    Apart from the returned predictions it does not grow with R. With
    ``chunk_size=None`` the chunk is the largest whose bound fits
    ``memory_budget`` (at least 1: the fixed parts alone may exceed a tiny
    budget). ``make bench`` measures the live bytes against the bound.

    *Determinism.* The replicates are drawn in blocks of :data:`DATA_BLOCK`
    (16): one seed per block is drawn from ``generator`` first, and block b
    then comes from a private generator seeded with the b-th seed, inputs first
    and noise second (``task.sample((block, *shape), n)``), always in float64
    and then cast. The data are therefore identical for every ``chunk_size``
    (and so do not depend on ``memory_budget``), identical up to rounding for
    float32 and float64 runs, and a seeded run reproduces bit for bit on the
    CPU. CPU and CUDA generators produce different streams.

    Examples
    --------
    >>> import torch
    >>> from nwlib import make_task, simulate
    >>> task = make_task("isotropic", 4)
    >>> W = torch.eye(4).expand(3, 4, 4)          # three identical heads
    >>> z = torch.zeros(5, 4)
    >>> out = simulate(task, W, z, n=200, replicates=10,
    ...                generator=torch.Generator().manual_seed(0), bandwidth=0.5)
    >>> out.shape
    torch.Size([10, 3, 5])
    """
    task, w_k, w_q, w_v, eval_points, n, replicates = _validated(
        task,
        key_projections,
        eval_points,
        query_projections,
        value_projections,
        n,
        replicates,
        generator,
        kernel,
        head_data,
    )
    bw = _head_bandwidths(bandwidth, kernel, w_k, n, eval_points)
    heads, dim, d_k = w_k.shape
    m = eval_points.shape[0]
    device, dtype = eval_points.device, eval_points.dtype
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    if chunk_size is None:
        chunk_size = _largest_chunk(
            memory_budget,
            num_heads=heads,
            n=n,
            m=m,
            embed_dim=dim,
            head_dim=d_k,
            replicates=replicates,
            head_data=head_data,
            kernel=kernel,
            head_values=w_v is not None,
            dtype=dtype,
            device=device,
        )
    else:
        chunk_size = require_positive_int(chunk_size, "chunk_size")

    draw_shape: tuple[int, ...] = (heads,) if head_data == "independent" else ()
    blocks = _DataBlocks(task, n, replicates, draw_shape, generator, dtype)
    queries = eval_points @ w_q  # (H, m, d_k)
    out = torch.empty(replicates, heads, m, dtype=dtype, device=device)

    from tqdm import tqdm  # plain text bar: tqdm.auto warns in notebooks without ipywidgets

    with torch.no_grad(), tqdm(total=replicates, disable=not progress, desc="simulate", unit="rep") as bar:
        for start in range(0, replicates, chunk_size):
            stop = min(start + chunk_size, replicates)
            x, y = blocks.get(start, stop)
            keys, values = _head_inputs(x, y, w_k, w_v, head_data)
            del x, y
            out[start:stop] = nadaraya_watson(queries, keys, values, kernel=kernel, bandwidth=bw)
            bar.update(stop - start)
    return out
