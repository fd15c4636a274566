"""Monte Carlo simulation of an ensemble of Nadaraya–Watson heads over training sets.

:func:`simulate` draws R independent training sets from a
:class:`~nwlib.tasks.RegressionTask`, fits every head on each, and evaluates
the heads at fixed points. The predictions, shape (R, H, m), are what
:func:`nwlib.decompose` turns into bias, variance and covariance terms.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ._validation import (
    require_generator,
    require_choice,
    require_positive_finite,
    require_positive_int,
    require_same_dtype_device,
    require_tensor,
)
from .kernels import KERNELS, nadaraya_watson
from .tasks import RegressionTask

__all__ = ["simulate", "bytes_per_replicate", "HEAD_DATA", "DEFAULT_MEMORY_BUDGET", "DATA_BLOCK"]

HEAD_DATA: tuple[str, ...] = ("shared", "independent")
"""Values accepted by the ``head_data`` argument of :func:`simulate`."""

DEFAULT_MEMORY_BUDGET: int = 256 * 2**20
"""Bytes of working memory per chunk that :func:`simulate` aims for when ``chunk_size`` is None."""


def bytes_per_replicate(
    heads: int, n: int, m: int, dim: int, head_dim: int, *, head_data: str, itemsize: int
) -> int:
    """Upper estimate of the working memory one replicate needs inside :func:`simulate`.

    Counts the drawn inputs (twice: drawn and stacked), and about eight
    (n + m) × d_k buffers per head for the projected keys, their centred and
    scaled copies, the padded values, the queries broadcast to the replicate and
    the head outputs, i.e.
    ``itemsize * (2 n D H_x + 8 H (n + m) max(d_k, 1))`` with H_x = H for
    ``head_data="independent"`` and 1 for ``"shared"``.
    """
    draws = heads if head_data == "independent" else 1
    return itemsize * (2 * n * dim * draws + 8 * heads * (n + m) * max(head_dim, 1))


def _default_bandwidth(key_projections: Tensor, n: int) -> Tensor:
    # Under x ~ N(0, I_D) head h's keys are N(0, W_hᵀW_h); Scott's rule with the
    # average coordinate variance tr(W_hᵀW_h)/d_k needs no data, so every replicate
    # uses the same bandwidth and the heads stay comparable.
    d_k = key_projections.shape[-1]
    sigma = (key_projections.pow(2).sum(dim=(-2, -1)) / d_k).sqrt()
    return sigma * n ** (-1.0 / (d_k + 4))


def _check_projections(name: str, w: Tensor, reference: Tensor, dim: int) -> Tensor:
    require_tensor(w, name)
    require_same_dtype_device(reference, "eval_points", **{name: w})
    if w.dim() != 3:
        raise ValueError(f"{name} must have shape (H, D, d_k), got {tuple(w.shape)}")
    if w.shape[0] < 1 or w.shape[2] < 1:
        raise ValueError(f"{name} must have H >= 1 and d_k >= 1, got shape {tuple(w.shape)}")
    if w.shape[1] != dim:
        raise ValueError(
            f"{name} must have D = task.dim = {dim} rows per head, got shape {tuple(w.shape)}"
        )
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name} must be finite")
    return w


DATA_BLOCK: int = 16
"""Replicates drawn per private generator seed in :func:`simulate` (fixes the random stream)."""


class _DataBlocks:
    """The training sets of replicates, drawn in fixed blocks of :data:`DATA_BLOCK`.

    One seed per block is drawn from the caller's generator up front; block b is
    then drawn from a private generator seeded with seeds[b]. The stream depends
    on the block size, a constant, but not on how the caller chunks the
    replicates, and drawing a block at a time keeps the many small tensor
    operations of per-replicate draws out of the loop.
    """

    def __init__(self, task, n, replicates, draw_shape, generator, dtype):
        self.task, self.n, self.replicates = task, n, replicates
        self.draw_shape, self.dtype = draw_shape, dtype
        count = -(-replicates // DATA_BLOCK)
        self.seeds = torch.randint(
            0, 2**62, (count,), generator=generator, device=generator.device
        ).tolist()
        self.private = torch.Generator(device=generator.device)
        self.cached: tuple[int, Tensor, Tensor] | None = None

    def block(self, b: int) -> tuple[Tensor, Tensor]:
        if self.cached is None or self.cached[0] != b:
            size = min(DATA_BLOCK, self.replicates - b * DATA_BLOCK)
            self.private.manual_seed(self.seeds[b])
            x, y = self.task.sample(
                (size, *self.draw_shape), self.n, generator=self.private, dtype=self.dtype
            )
            self.cached = (b, x, y)
        return self.cached[1], self.cached[2]

    def get(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        first, last = start // DATA_BLOCK, (stop - 1) // DATA_BLOCK
        parts = [self.block(b) for b in range(first, last + 1)]
        offset = start - first * DATA_BLOCK
        if len(parts) == 1:
            x, y = parts[0]
        else:
            x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return x[offset : offset + stop - start], y[offset : offset + stop - start]


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
    bandwidth : float or Tensor of shape (H,), optional
        One bandwidth for all heads, or one per head. Default for ``"exp"``:
        :math:`d_k^{1/4}` (attention's scaling). Default for ``"gaussian"``
        (our choice): Scott's rule in the projected space,
        :math:`h_h = \sigma_h n^{-1/(d_k+4)}` with
        :math:`\sigma_h^2 = \operatorname{tr}(W_h^\top W_h)/d_k`, the average
        variance of a projected coordinate under the N(0, I_D) design.
    head_data : {"shared", "independent"}, default "shared"
        ``"shared"``: all heads of a replicate see the same training set (as in
        multi-head attention). ``"independent"``: every head gets its own
        independent training set of size n.
    chunk_size : int, optional
        Replicates per batched call. Default: the largest chunk whose estimated
        working memory, ``chunk_size * bytes_per_replicate(...)``, fits in
        ``memory_budget``.
    progress : bool, default False
        Show a tqdm progress bar over replicates.
    query_projections : Tensor, shape (H, D, d_k), optional
        Separate query projections :math:`W_{Q,h}`: queries become
        :math:`W_{Q,h}^\top z_j`.
    memory_budget : int, default 256 MiB
        Bytes of working memory aimed for when choosing ``chunk_size``.

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
    *Memory.* Besides the returned R·H·m values, a chunk of c replicates holds
    about ``c * itemsize * (2 n D H_x + 8 H (n + m) max(d_k, 1))`` bytes
    (H_x = H for independent head data, else 1; see
    :func:`bytes_per_replicate`), plus the data of one block of
    :data:`DATA_BLOCK` replicates; the fused attention kernel never forms the
    (m, n) weight matrices. Memory is therefore bounded independently of R.

    *Determinism.* The replicates are drawn in blocks of :data:`DATA_BLOCK`
    (16): one seed per block is drawn from ``generator`` first, and block b
    then comes from a private generator seeded with the b-th seed, inputs first
    and noise second (``task.sample((block, *shape), n)``). The data are
    therefore identical for every ``chunk_size`` (and so do not depend on
    ``memory_budget``), and a seeded run reproduces bit for bit on the CPU.

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
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    eval_points = require_tensor(eval_points, "eval_points")
    if eval_points.dim() != 2 or eval_points.shape[1] != task.dim:
        raise ValueError(
            f"eval_points must have shape (m, D) with D = task.dim = {task.dim}, "
            f"got {tuple(eval_points.shape)}"
        )
    if eval_points.shape[0] < 1:
        raise ValueError("eval_points must contain at least one point (m >= 1)")
    w_k = _check_projections("key_projections", key_projections, eval_points, task.dim)
    w_q = w_k
    if query_projections is not None:
        w_q = _check_projections("query_projections", query_projections, eval_points, task.dim)
        if w_q.shape != w_k.shape:
            raise ValueError(
                "query_projections must have the shape of key_projections: "
                f"{tuple(w_q.shape)} vs {tuple(w_k.shape)}"
            )
    n = require_positive_int(n, "n")
    replicates = require_positive_int(replicates, "replicates")
    require_generator(generator, eval_points.device, device_name="eval_points' device")
    require_choice(kernel, "kernel", KERNELS)
    require_choice(head_data, "head_data", HEAD_DATA)
    heads, dim, d_k = w_k.shape
    m = eval_points.shape[0]

    if bandwidth is None:
        bw: float | Tensor | None = _default_bandwidth(w_k, n) if kernel == "gaussian" else None
    elif isinstance(bandwidth, Tensor):
        require_tensor(bandwidth, "bandwidth")
        require_same_dtype_device(eval_points, "eval_points", bandwidth=bandwidth)
        if bandwidth.dim() == 0:
            bw = bandwidth
        elif bandwidth.shape != (heads,):
            raise ValueError(
                f"bandwidth must be a float or a tensor of shape (H,) = ({heads},), "
                f"got shape {tuple(bandwidth.shape)}"
            )
        else:
            bw = bandwidth
    else:
        bw = require_positive_finite(bandwidth, "bandwidth")

    if not isinstance(memory_budget, int) or isinstance(memory_budget, bool) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    if chunk_size is None:
        per = bytes_per_replicate(
            heads, n, m, dim, d_k, head_data=head_data, itemsize=eval_points.element_size()
        )
        chunk_size = max(1, min(replicates, memory_budget // per))
    else:
        chunk_size = require_positive_int(chunk_size, "chunk_size")

    device, dtype = eval_points.device, eval_points.dtype
    draw_shape: tuple[int, ...] = (heads,) if head_data == "independent" else ()
    blocks = _DataBlocks(task, n, replicates, draw_shape, generator, dtype)
    queries = eval_points @ w_q  # (H, m, d_k)
    out = torch.empty(replicates, heads, m, dtype=dtype, device=device)

    from tqdm import tqdm  # plain text bar: tqdm.auto warns in notebooks without ipywidgets

    with torch.no_grad(), tqdm(
        total=replicates, disable=not progress, desc="simulate", unit="rep"
    ) as bar:
        for start in range(0, replicates, chunk_size):
            stop = min(start + chunk_size, replicates)
            x, y = blocks.get(start, stop)
            if head_data == "shared":
                keys = x.unsqueeze(1) @ w_k  # (c, 1, n, D) @ (H, D, d_k) -> (c, H, n, d_k)
                values = y.unsqueeze(1)  # (c, 1, n): broadcast over heads, never copied per head
            else:
                keys = x @ w_k  # (c, H, n, D) @ (H, D, d_k)
                values = y
            del x
            out[start:stop] = nadaraya_watson(queries, keys, values, kernel=kernel, bandwidth=bw)
            bar.update(stop - start)
    return out
