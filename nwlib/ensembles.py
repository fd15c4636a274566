r"""Randomised ensembles beside attention's heads: bagging, random subspaces, random forests.

Chapter 7 compares three recipes for decorrelating the members of an ensemble that all
learn from one training set: bootstrap resampling (bagging), random subsets of the input
coordinates (the random subspace method), and fixed projections (attention's heads). This
module builds the first two from Nadaraya–Watson members, reads the members of a fitted
scikit-learn random forest, and fits the equicorrelated law

.. math:: \Var\Big(\frac1B\sum_{b\le B}\hat f_b\Big) = \sigma^2\Big(\rho + \frac{1-\rho}{B}\Big)

to Monte Carlo predictions, with jackknife standard errors.

* :func:`draw_training_sets`: the training sets :func:`nwlib.simulate` draws, so that every
  ensemble can be fitted on the same data as the attention heads;
* :func:`bootstrap_indices`, :func:`feature_subsets`: the members' randomisation, one
  independent draw per replicate and member;
* :func:`resampled_nw`: NW members on bootstrap resamples and/or coordinate subsets, batched
  through :func:`nwlib.nadaraya_watson`;
* :func:`forest_member_predictions`, :func:`forest_weights`: a fitted
  ``RandomForestRegressor``'s trees as an (R, B, m) prediction tensor, and each tree as a
  weighted average of the training responses;
* the equicorrelated law itself is fitted by :func:`nwlib.equicorrelation` (in
  :mod:`nwlib.combination`, with Theorem 3.1's other tools): σ², the mean cross-member
  covariance, ρ and the curve, with delete-one jackknife standard errors.

scikit-learn is not a dependency of the library: the forest helpers only read the fitted
attributes (``estimators_``, ``apply``, ``estimators_samples_``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ._validation import (
    require_choice,
    require_dtype,
    require_generator,
    require_positive_int,
    require_same_dtype_device,
    require_tensor,
)
from .kernels import KERNELS, nadaraya_watson
from .montecarlo import _DataBlocks
from .tasks import RegressionTask

__all__ = [
    "bootstrap_indices",
    "draw_training_sets",
    "feature_subsets",
    "forest_member_predictions",
    "forest_weights",
    "resampled_nw",
]

DEFAULT_CHUNK_BYTES: int = 64 * 2**20
"""Bytes of gathered keys that :func:`resampled_nw` aims to hold per chunk of replicates."""


def draw_training_sets(
    task: RegressionTask,
    n: int,
    replicates: int,
    *,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """The R training sets that :func:`nwlib.simulate` draws from this generator state.

    :func:`nwlib.simulate` with ``head_data="shared"`` documents its stream: one seed per
    block of :data:`nwlib.montecarlo.DATA_BLOCK` replicates is drawn from ``generator``
    first, then block b comes from a private generator seeded with the b-th seed. This
    function draws the same blocks, so that an ensemble fitted on its output and
    ``simulate`` called with an identically seeded generator see the same data.

    Parameters
    ----------
    task : RegressionTask
    n : int
        Training-set size.
    replicates : int
        Number R of training sets.
    generator : torch.Generator
        Consumed exactly as :func:`nwlib.simulate` consumes it.
    dtype : torch.dtype, default torch.float32
        Data are drawn in float64 and cast, as in ``simulate``.

    Returns
    -------
    x : Tensor, shape (R, n, D)
    y : Tensor, shape (R, n)
        On the generator's device.

    Raises
    ------
    TypeError, ValueError
        On a wrong task, size, generator or dtype.

    Examples
    --------
    >>> import torch
    >>> from nwlib import make_task
    >>> x, y = draw_training_sets(make_task("subspace", 4), 50, 3, generator=torch.Generator().manual_seed(0))
    >>> x.shape, y.shape
    (torch.Size([3, 50, 4]), torch.Size([3, 50]))
    """
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    n = require_positive_int(n, "n")
    replicates = require_positive_int(replicates, "replicates")
    require_generator(generator)
    dtype = require_dtype(dtype)
    blocks = _DataBlocks(task, n, replicates, (), generator, dtype)
    return blocks.get(0, replicates)


def bootstrap_indices(
    replicates: int,
    num_members: int,
    n: int,
    *,
    generator: torch.Generator,
    sample_size: int | None = None,
) -> Tensor:
    """Bootstrap resamples of n training points: indices drawn uniformly with replacement.

    Parameters
    ----------
    replicates, num_members : int
        R training sets, B members per training set; every (replicate, member) pair gets
        an independent resample.
    n : int
        Training-set size (indices are in ``[0, n)``).
    generator : torch.Generator
        Source of randomness; the result is on its device.
    sample_size : int, optional
        Points per resample (default n, the classical bootstrap).

    Returns
    -------
    Tensor of int64, shape (R, B, sample_size)

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``generator`` is not a generator.

    Examples
    --------
    >>> import torch
    >>> idx = bootstrap_indices(2, 3, 10, generator=torch.Generator().manual_seed(0))
    >>> idx.shape, bool(((idx >= 0) & (idx < 10)).all())
    (torch.Size([2, 3, 10]), True)
    """
    R = require_positive_int(replicates, "replicates")
    B = require_positive_int(num_members, "num_members")
    n = require_positive_int(n, "n")
    size = n if sample_size is None else require_positive_int(sample_size, "sample_size")
    require_generator(generator)
    return torch.randint(0, n, (R, B, size), generator=generator, device=generator.device)


def feature_subsets(
    replicates: int,
    num_members: int,
    embed_dim: int,
    subset_dim: int,
    *,
    generator: torch.Generator,
) -> Tensor:
    """Random subsets of the input coordinates, as in the random subspace method (Ho, 1998).

    Each (replicate, member) pair gets ``subset_dim`` distinct coordinates of
    ``range(embed_dim)``, uniformly among all subsets of that size, in increasing order.

    Parameters
    ----------
    replicates, num_members : int
        R and B.
    embed_dim : int
        D, the number of coordinates.
    subset_dim : int
        k, coordinates per member (1 <= k <= D).
    generator : torch.Generator

    Returns
    -------
    Tensor of int64, shape (R, B, k)

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``subset_dim`` > ``embed_dim``.

    Examples
    --------
    >>> import torch
    >>> s = feature_subsets(1, 4, 6, 2, generator=torch.Generator().manual_seed(0))
    >>> s.shape, bool((s[..., 0] < s[..., 1]).all())
    (torch.Size([1, 4, 2]), True)
    """
    R = require_positive_int(replicates, "replicates")
    B = require_positive_int(num_members, "num_members")
    D = require_positive_int(embed_dim, "embed_dim")
    k = require_positive_int(subset_dim, "subset_dim")
    if k > D:
        raise ValueError(f"subset_dim must be <= embed_dim = {D}, got {k}")
    require_generator(generator)
    # The k smallest of D i.i.d. uniform keys form a uniformly random k-subset.
    keys = torch.rand(R, B, D, generator=generator, device=generator.device)
    return keys.argsort(dim=-1)[..., :k].sort(dim=-1).values


def _check_index(index: object, name: str, reference: Tensor, upper: int) -> Tensor:
    if not isinstance(index, Tensor) or index.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor, got {type(index).__name__}")
    if index.device != reference.device:
        raise ValueError(f"{name} is on {index.device} but x is on {reference.device}; move them to one device")
    if index.dim() != 3 or index.shape[0] != reference.shape[0] or min(index.shape) < 1:
        raise ValueError(
            f"{name} must have shape (R, B, ·) with R = {reference.shape[0]} and no empty dimension, "
            f"got {tuple(index.shape)}"
        )
    if index.device.type == "cpu" and not bool(((index >= 0) & (index < upper)).all()):
        raise ValueError(f"{name} must lie in [0, {upper})")
    return index


def resampled_nw(
    x: Tensor,
    y: Tensor,
    eval_points: Tensor,
    *,
    rows: Tensor | None = None,
    columns: Tensor | None = None,
    kernel: Literal["exp", "gaussian"] = "gaussian",
    bandwidth: float | Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""Predictions of NW members fitted on resamples and/or coordinate subsets of each training set.

    Member b of replicate r is the NW estimator whose training pairs are
    :math:`(x_{ri}[S_{rb}], y_{ri})` for :math:`i` in the resample :math:`I_{rb}`
    (``rows[r, b]``, repetitions counted) and whose queries are ``eval_points[:, S_rb]``,
    with :math:`S_{rb}` = ``columns[r, b]`` (all coordinates if ``columns`` is None).
    ``rows`` alone gives bagging, ``columns`` alone the random subspace method, both
    together an NW analogue of a random forest's recipe.

    Parameters
    ----------
    x : Tensor, shape (R, n, D)
        Training inputs, e.g. from :func:`draw_training_sets`.
    y : Tensor, shape (R, n)
        Training responses.
    eval_points : Tensor, shape (m, D)
    rows : Tensor of int64, shape (R, B, n'), optional
        Resampled indices into ``range(n)`` (:func:`bootstrap_indices`).
    columns : Tensor of int64, shape (R, B, k), optional
        Coordinates each member sees (:func:`feature_subsets`).
    kernel : {"exp", "gaussian"}, default "gaussian"
    bandwidth : float or Tensor, optional
        As in :func:`nwlib.nadaraya_watson` (required for ``"gaussian"``); a tensor must
        broadcast against (R, B).
    chunk_size : int, optional
        Replicates per batched call; default: as many as keep the gathered keys under
        :data:`DEFAULT_CHUNK_BYTES`. It changes the result only by rounding (the
        attention kernel's blocking depends on the batch size).

    Returns
    -------
    Tensor, shape (R, B, m)
        Dtype and device of ``x``.

    Raises
    ------
    TypeError, ValueError
        On wrong types, shapes, devices or indices out of range, if neither ``rows`` nor
        ``columns`` is given, or if they disagree on B.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y, z = torch.randn(2, 30, 3, generator=g), torch.randn(2, 30, generator=g), torch.randn(5, 3, generator=g)
    >>> rows = bootstrap_indices(2, 4, 30, generator=g)
    >>> resampled_nw(x, y, z, rows=rows, bandwidth=0.7).shape
    torch.Size([2, 4, 5])
    """
    x = require_tensor(x, "x")
    y = require_tensor(y, "y")
    eval_points = require_tensor(eval_points, "eval_points")
    require_same_dtype_device(x, "x", y=y, eval_points=eval_points)
    if x.dim() != 3 or y.shape != x.shape[:2] or min(x.shape) < 1:
        raise ValueError(f"x must have shape (R, n, D) and y (R, n), got {tuple(x.shape)} and {tuple(y.shape)}")
    R, n, D = x.shape
    if eval_points.dim() != 2 or eval_points.shape[1] != D or eval_points.shape[0] < 1:
        raise ValueError(f"eval_points must have shape (m, D) with D = {D}, got {tuple(eval_points.shape)}")
    if rows is None and columns is None:
        raise ValueError("rows or columns must be given (bootstrap_indices, feature_subsets)")
    if rows is not None:
        rows = _check_index(rows, "rows", x, n)
    if columns is not None:
        columns = _check_index(columns, "columns", x, D)
    if rows is not None and columns is not None and rows.shape[1] != columns.shape[1]:
        raise ValueError(f"rows and columns must agree on B, got {rows.shape[1]} and {columns.shape[1]}")
    require_choice(kernel, "kernel", KERNELS)
    B = (rows if rows is not None else columns).shape[1]  # type: ignore[union-attr]
    n_rows = n if rows is None else rows.shape[2]
    width = D if columns is None else columns.shape[2]
    if chunk_size is None:
        per_replicate = B * n_rows * (width + 2) * x.element_size()
        chunk_size = int(max(1, min(R, DEFAULT_CHUNK_BYTES // max(per_replicate, 1))))
    else:
        chunk_size = require_positive_int(chunk_size, "chunk_size")

    m = eval_points.shape[0]
    out = torch.empty(R, B, m, dtype=x.dtype, device=x.device)
    for start in range(0, R, chunk_size):
        stop = min(start + chunk_size, R)
        c = stop - start
        xc, yc = x[start:stop], y[start:stop]
        if rows is None:
            keys, values = xc[:, None], yc[:, None]  # (c, 1, n, D), (c, 1, n): shared by the members
        else:
            idx = rows[start:stop]
            keys = torch.gather(xc[:, None].expand(c, B, n, D), 2, idx[..., None].expand(c, B, n_rows, D))
            values = torch.gather(yc[:, None].expand(c, B, n), 2, idx)
        queries = eval_points
        if columns is not None:
            cols = columns[start:stop]
            keys = torch.gather(keys.expand(c, B, n_rows, D), 3, cols[:, :, None, :].expand(c, B, n_rows, width))
            queries = torch.gather(eval_points.expand(c, B, m, D), 3, cols[:, :, None, :].expand(c, B, m, width))
        bw = bandwidth
        if isinstance(bandwidth, Tensor) and bandwidth.dim() >= 1 and bandwidth.shape[0] == R:
            bw = bandwidth[start:stop]
        out[start:stop] = nadaraya_watson(queries, keys, values, kernel=kernel, bandwidth=bw)
    return out


def _fitted_forest(forest: object, name: str) -> Sequence[Any]:
    estimators = getattr(forest, "estimators_", None)
    if estimators is None or len(estimators) == 0:
        raise TypeError(
            f"{name} must be a fitted forest with estimators_ (e.g. RandomForestRegressor), got {type(forest).__name__}"
        )
    return estimators


def _eval_array(eval_points: object, forest: object, name: str) -> np.ndarray:
    eval_points = require_tensor(eval_points, "eval_points")
    if eval_points.dim() != 2 or eval_points.shape[0] < 1:
        raise ValueError(f"eval_points must have shape (m, D), got {tuple(eval_points.shape)}")
    features = getattr(forest, "n_features_in_", eval_points.shape[1])
    if eval_points.shape[1] != features:
        raise ValueError(
            f"eval_points must have D = {name}.n_features_in_ = {features} columns, got {tuple(eval_points.shape)}"
        )
    # Forests predict in float32 (sklearn's tree DTYPE); converting once here is what forest.predict does.
    return np.ascontiguousarray(eval_points.detach().cpu().numpy(), dtype=np.float32)


def forest_member_predictions(forests: Sequence[Any], eval_points: Tensor) -> Tensor:
    """The trees' individual predictions of R fitted forests, as an (R, B, m) tensor.

    Averaging over the trees gives ``forest.predict`` (up to float32 rounding), so
    :func:`nwlib.decompose` with uniform weights decomposes the forest's own MSE, and the
    first b trees of a forest of B are a forest of b trees (the trees are exchangeable).

    Parameters
    ----------
    forests : sequence of fitted forests, length R
        E.g. ``sklearn.ensemble.RandomForestRegressor`` objects, one per training set,
        all with the same number B of trees; anything with ``estimators_`` whose items
        have ``predict`` works.
    eval_points : Tensor, shape (m, D)
        The points; the result has their dtype and device.

    Returns
    -------
    Tensor, shape (R, B, m)

    Raises
    ------
    TypeError
        If ``forests`` is not a non-empty sequence of fitted forests.
    ValueError
        If the forests differ in their number of trees or ``eval_points`` has the wrong shape.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from sklearn.ensemble import RandomForestRegressor
    >>> X, y = np.random.default_rng(0).normal(size=(40, 2)), np.arange(40.0)
    >>> forests = [RandomForestRegressor(n_estimators=3, random_state=s).fit(X, y) for s in range(2)]
    >>> forest_member_predictions(forests, torch.zeros(5, 2, dtype=torch.float64)).shape
    torch.Size([2, 3, 5])
    """
    if isinstance(forests, (str, bytes)) or not isinstance(forests, Sequence) or len(forests) == 0:
        raise TypeError(f"forests must be a non-empty sequence of fitted forests, got {type(forests).__name__}")
    counts = {len(_fitted_forest(f, f"forests[{i}]")) for i, f in enumerate(forests)}
    if len(counts) != 1:
        raise ValueError(f"forests must all have the same number of trees, got {sorted(counts)}")
    points = _eval_array(eval_points, forests[0], "forests[0]")
    out = np.stack(
        [np.stack([tree.predict(points, check_input=False) for tree in forest.estimators_]) for forest in forests]
    )
    return torch.as_tensor(out).to(dtype=eval_points.dtype, device=eval_points.device)


def forest_weights(forest: Any, train_inputs: Tensor, eval_points: Tensor) -> Tensor:
    r"""Each tree of a fitted forest as a linear smoother of the training responses.

    A regression tree predicts the (sample-weighted) mean response of the training points
    in the query's leaf. With the bootstrap, scikit-learn fits tree b with the in-bag
    counts :math:`c_{bi}` as sample weights, so

    .. math:: \hat f_b(z) = \sum_i w^b_i(z)\, y_i,\qquad
              w^b_i(z) = \frac{c_{bi}\,[\ell_b(x_i) = \ell_b(z)]}{\sum_k c_{bk}\,[\ell_b(x_k) = \ell_b(z)]}.

    The weights depend on the responses through the splits, so
    :func:`nwlib.noise_covariance` of these weights is the noise covariance *given the
    trees' partitions*, not the unconditional one.

    Parameters
    ----------
    forest : fitted RandomForestRegressor
        Needs ``estimators_``, ``apply``, ``bootstrap`` and (with the bootstrap)
        ``estimators_samples_``.
    train_inputs : Tensor, shape (n, D)
        The inputs the forest was fitted on.
    eval_points : Tensor, shape (m, D)

    Returns
    -------
    Tensor, shape (B, m, n)
        Non-negative, each row summing to 1; dtype and device of ``eval_points``.

    Raises
    ------
    TypeError, ValueError
        On an unfitted forest, mismatched shapes, or a forest fitted on another number of
        points.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from sklearn.ensemble import RandomForestRegressor
    >>> X = np.random.default_rng(0).normal(size=(40, 2)); y = X[:, 0]
    >>> rf = RandomForestRegressor(n_estimators=3, random_state=0).fit(X, y)
    >>> w = forest_weights(rf, torch.as_tensor(X), torch.zeros(4, 2, dtype=torch.float64))
    >>> w.shape, bool(torch.allclose(w.sum(-1), torch.ones(3, 4, dtype=torch.float64)))
    (torch.Size([3, 4, 40]), True)
    """
    _fitted_forest(forest, "forest")
    train_inputs = require_tensor(train_inputs, "train_inputs")
    points = _eval_array(eval_points, forest, "forest")
    train = _eval_array(train_inputs, forest, "forest")
    n = train.shape[0]
    fitted_n = getattr(forest, "_n_samples", n)
    if fitted_n != n:
        raise ValueError(f"train_inputs must be the {fitted_n} points the forest was fitted on, got {n}")
    leaves_train = forest.apply(train)  # (n, B)
    leaves_eval = forest.apply(points)  # (m, B)
    trees = len(forest.estimators_)
    if getattr(forest, "bootstrap", False):
        counts = np.stack([np.bincount(s, minlength=n) for s in forest.estimators_samples_]).astype(np.float64)
    else:
        counts = np.ones((trees, n))
    same = leaves_eval.T[:, :, None] == leaves_train.T[:, None, :]  # (B, m, n)
    weights = same * counts[:, None, :]
    weights /= weights.sum(-1, keepdims=True)
    return torch.as_tensor(weights).to(dtype=eval_points.dtype, device=eval_points.device)
