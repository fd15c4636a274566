r"""One principle? Four ensembles on the same training sets (chapter 7, claim C12).

The experiment behind ``notebooks/ch07_one_principle.ipynb`` and ``book/ch07_one_principle.md``:
the testable part of claim C12 (the equicorrelated law
:math:`\Var\bar f_B = \sigma^2(\rho + (1-\rho)/B)`, theorem ``thm-equicorrelated`` of the chapter)
measured on four ensembles that learn from one training set each:

* ``"random forest"``: scikit-learn's ``RandomForestRegressor`` (members: its trees);
* ``"bagged NW"``: Gaussian Nadaraya–Watson (NW) members on bootstrap resamples, all D coordinates;
* ``"random-subspace NW"``: Gaussian NW members on random subsets of ``subset_dim`` coordinates;
* ``"NW heads (fixed subspaces)"``: NW heads on fixed random ``subset_dim``-dimensional projections
  with W_Q = W_K (:func:`nwlib.simulate`), the Gaussian surrogate or attention's own kernel;
* ``"dot-product heads (random init)"``: real dot-product attention heads on LayerNorm'd tokens,
  W_Q ≠ W_K drawn anew for every training set (random initialisation), queries and keys
  normalised (QK-norm, :func:`nwlib.cosine_attention`) at a temperature chosen on a validation
  batch (:func:`select_temperature`).

The drivers, in the order the notebook uses them (:func:`one_principle_experiment` runs them all):

* :func:`make_design`: evaluation points and the heads' projections from the fixed ``design_seed``,
  the same for every Monte Carlo seed, so that reruns with other seeds estimate the same quantities;
* :func:`ensemble_batch` and :func:`run_ensembles`: two independent batches (A and B) of training
  sets per task, every ensemble on the same sets;
* :func:`law_tables` and :func:`law_summary`: the curve fitted on batch A against the variances of
  the first b members measured on batch B, and the terms of the bias–variance–covariance
  decomposition;
* :func:`nested_deviations` and :func:`nested_heads_check`: the nested heads over several draws of
  the projections (part 3 of the theorem promises the law only on average over subsets);
* :func:`member_weights` and :func:`shared_data_floor`: every member as a linear smoother, its
  noise covariances and the averaging floor :math:`\sigma^2\lVert\bar w\rVert^2 \ge \sigma^2/n`;
* :func:`rho_variance_contrasts` and :func:`bias_contrasts`: differences between ensembles with
  delete-a-group jackknife standard errors over the shared training sets;
* :func:`chapter_numbers` and the table builders (:func:`format_law_table` and the others): what
  the chapter quotes.

The experiment is one stream of random numbers on purpose: the two tasks' batches and the
further draws of the heads' projections consume one generator in a fixed order, so that the
chapter's numbers are reproduced exactly from its seed (it is not a grid of independent points
for :func:`nwlib.sweep.run_sweep`). scikit-learn (the forests) and pandas (the tables) are
imported when first needed: neither is a dependency of the library.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from .._validation import (
    require_choice,
    require_dtype,
    require_generator,
    require_positive_int,
    require_real,
    require_tensor,
)
from ..bandwidth import scott_bandwidth
from ..combination import equicorrelation, grouped_jackknife
from ..decomposition import decompose, noise_covariance
from ..device import resolve_device
from ..ensembles import (
    bootstrap_indices,
    draw_training_sets,
    feature_subsets,
    forest_member_predictions,
    forest_weights,
    resampled_nw,
)
from ..evidence import Comparison, estimate, independent, mean, paired, significant
from ..kernels import nadaraya_watson, nadaraya_watson_weights
from ..montecarlo import simulate
from ..subspaces import random_subspaces
from ..tasks import RegressionTask, make_task
from ..weighting import replicate_mse, uniform_weights

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BAG_RHO_MARGIN",
    "FIXED_HEADS",
    "DP_HEADS",
    "CHAPTER_TASKS",
    "ENSEMBLES",
    "LAW_MARGIN",
    "SHORT",
    "ChapterNumbers",
    "Design",
    "EnsembleBatch",
    "FloorData",
    "HeadsCheck",
    "LawTables",
    "OnePrincipleConfig",
    "OnePrincipleResult",
    "SharedDataFloor",
    "TaskRun",
    "batch_a_contrasts",
    "batch_b_contrasts",
    "bias_contrasts",
    "chapter_numbers",
    "dot_product_heads",
    "dot_product_projections",
    "ensemble_batch",
    "format_floor_table",
    "format_heads_table",
    "format_law_detail_table",
    "format_law_table",
    "format_mse_table",
    "format_temperature_table",
    "format_terms_table",
    "jackknife_comparisons",
    "jackknife_groups",
    "law_summary",
    "law_tables",
    "make_design",
    "member_weights",
    "nested_deviations",
    "nested_heads_check",
    "one_principle_experiment",
    "per_replicate_mse",
    "rho_variance_contrasts",
    "rsm_target_fraction",
    "run_ensembles",
    "select_temperature",
    "shared_data_floor",
]

FIXED_HEADS = "NW heads (fixed subspaces)"
"""Gaussian (or exp) NW heads on fixed random subspaces with W_Q = W_K: the NW surrogate of attention heads."""

DP_HEADS = "dot-product heads (random init)"
"""Real dot-product attention heads: LayerNorm'd tokens, W_Q ≠ W_K drawn anew for every training set, QK-norm."""

ENSEMBLES: tuple[str, ...] = ("random forest", "bagged NW", "random-subspace NW", FIXED_HEADS, DP_HEADS)
"""The five ensembles, in the chapter's order (tables, figure); the first four enter the contrasts."""

SHORT: dict[str, str] = dict(zip(ENSEMBLES, ("forest", "bagged", "rsm", "heads", "dp"), strict=True))
"""Each ensemble's short name in the chapter's glue keys (``rho_subspace_forest``, ...)."""

CHAPTER_TASKS: tuple[str, ...] = ("subspace", "interaction")
"""The regression tasks of the chapter (:func:`nwlib.make_task`), for which the random-subspace
target fraction is derived (:func:`rsm_target_fraction`)."""

LAW_MARGIN: float = 0.20
""""The curve predicts the variance": within a fifth of the predicted value (fixed, not fitted)."""

BAG_RHO_MARGIN: float = 0.1
""""Close to the first-order value" of the bagged noise-part correlation, 1/(2 - 1/n): within 0.1."""

_RANDOMISED = ENSEMBLES[:3]


# --- parameters and design ------------------------------------------------------------------


@dataclass(frozen=True)
class OnePrincipleConfig:
    """The chapter's parameters (the notebook's, under the same names), checked once.

    Attributes
    ----------
    tasks : tuple of str
        Distinct names among :data:`CHAPTER_TASKS`.
    embed_dim : int
        D, the input dimension (x ~ N(0, I_D)).
    signal_dim : int
        Coordinates the ``"subspace"`` task depends on (1 <= signal_dim <= D).
    noise_sd : float
        σ of the responses' noise (>= 0).
    n : int
        Training-set size (>= 2).
    m : int
        Evaluation points of the design.
    replicates : int
        Training sets per batch (>= 3, for jackknife standard errors).
    max_members : int
        B, the largest ensemble: a power of two >= 4 (members b = 1, 2, 4, ..., B are measured).
    subset_dim : int
        k, coordinates per random-subspace member and dimension of each head (k <= D).
    attention_kernel : {"gaussian", "exp"}
        The heads' kernel: the NW surrogate, with the random-subspace members' bandwidth, or
        attention's dot-product kernel with its 1/sqrt(d_k) scaling.
    forest_min_samples_leaf : int
        The forests' ``min_samples_leaf``.
    forest_jobs : int
        The forests' ``n_jobs`` (-1: every core); it does not change the result.
    floor_replicates : int
        Training sets of batch B whose members' weights are formed explicitly
        (2 <= floor_replicates <= replicates).
    head_draws : int
        Draws of the heads' projections for the nested-heads check (>= 1; the first is the design's).
    design_seed : int
        Seed of the evaluation points and of the heads' projections (>= 0).
    temperatures : tuple of float
        The grid of temperatures τ > 0 from which :func:`select_temperature` picks the dot-product
        heads' on a validation batch.
    validation_replicates : int
        Training sets of the validation batch (>= 1), independent of batches A and B.
    """

    tasks: tuple[str, ...] = CHAPTER_TASKS
    embed_dim: int = 6
    signal_dim: int = 2
    noise_sd: float = 0.5
    n: int = 300
    m: int = 100
    replicates: int = 24
    max_members: int = 32
    subset_dim: int = 2
    attention_kernel: str = "gaussian"
    forest_min_samples_leaf: int = 5
    forest_jobs: int = 1
    floor_replicates: int = 4
    head_draws: int = 4
    design_seed: int = 0
    temperatures: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
    validation_replicates: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.tasks, (str, bytes)) or not isinstance(self.tasks, Sequence) or not self.tasks:
            raise TypeError(f"tasks must be a non-empty sequence of task names, got {self.tasks!r}")
        tasks = tuple(require_choice(t, "tasks", CHAPTER_TASKS) for t in self.tasks)
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks must be distinct, got {list(tasks)}")
        object.__setattr__(self, "tasks", tasks)
        dim = require_positive_int(self.embed_dim, "embed_dim")
        if require_positive_int(self.signal_dim, "signal_dim") > dim:
            raise ValueError(f"signal_dim must be <= embed_dim = {dim}, got {self.signal_dim}")
        object.__setattr__(self, "noise_sd", require_real(self.noise_sd, "noise_sd", minimum=0.0))
        require_positive_int(self.n, "n", minimum=2)
        require_positive_int(self.m, "m")
        reps = require_positive_int(self.replicates, "replicates", minimum=3)
        members = require_positive_int(self.max_members, "max_members", minimum=4)
        if members & (members - 1):
            raise ValueError(f"max_members must be a power of two >= 4, got {members}")
        if require_positive_int(self.subset_dim, "subset_dim") > dim:
            raise ValueError(f"subset_dim must be <= embed_dim = {dim}, got {self.subset_dim}")
        require_choice(self.attention_kernel, "attention_kernel", ("gaussian", "exp"))
        require_positive_int(self.forest_min_samples_leaf, "forest_min_samples_leaf")
        jobs = self.forest_jobs
        if isinstance(jobs, bool) or not isinstance(jobs, int):
            raise TypeError(f"forest_jobs must be an int, got {type(jobs).__name__}")
        if jobs == 0:
            raise ValueError("forest_jobs must be a positive number of jobs or -1 (every core), got 0")
        if require_positive_int(self.floor_replicates, "floor_replicates", minimum=2) > reps:
            raise ValueError(f"floor_replicates must be <= replicates = {reps}, got {self.floor_replicates}")
        require_positive_int(self.head_draws, "head_draws")
        require_positive_int(self.design_seed, "design_seed", minimum=0)
        temps = self.temperatures
        if isinstance(temps, (str, bytes)) or not isinstance(temps, Sequence) or not temps:
            raise TypeError(f"temperatures must be a non-empty sequence of numbers, got {temps!r}")
        temps = tuple(require_real(t, "temperatures") for t in temps)
        if not all(math.isfinite(t) and t > 0 for t in temps):
            raise ValueError(f"temperatures must be finite and > 0, got {list(temps)}")
        object.__setattr__(self, "temperatures", temps)
        require_positive_int(self.validation_replicates, "validation_replicates")

    @property
    def member_counts(self) -> list[int]:
        """The measured ensemble sizes b = 1, 2, 4, ..., ``max_members``."""
        return [2**i for i in range(int(math.log2(self.max_members)) + 1)]

    @property
    def bandwidth_full(self) -> float:
        """Scott's rule n^(-1/(D+4)) for unit-variance coordinates, all D of them (bagged NW)."""
        return float(scott_bandwidth(self.n, self.embed_dim))

    @property
    def bandwidth_sub(self) -> float:
        """Scott's rule n^(-1/(k+4)) in k = ``subset_dim`` coordinates (random-subspace NW, Gaussian heads)."""
        return float(scott_bandwidth(self.n, self.subset_dim))

    @property
    def bandwidth_heads(self) -> float | None:
        """The heads' bandwidth: :attr:`bandwidth_sub` for ``"gaussian"``, None (1/sqrt(d_k)) for ``"exp"``."""
        return self.bandwidth_sub if self.attention_kernel == "gaussian" else None

    @property
    def max_features(self) -> int:
        """The forests' ``max_features``: Breiman's p/3 for regression, at least 1."""
        return max(1, self.embed_dim // 3)

    def task(self, name: str) -> RegressionTask:
        """The regression task ``name`` with this configuration's D, σ (and signal_dim for ``"subspace"``)."""
        name = require_choice(name, "name", CHAPTER_TASKS)
        extra = {"signal_dim": self.signal_dim} if name == "subspace" else {}
        return make_task(name, self.embed_dim, noise_sd=self.noise_sd, **extra)


class Design(NamedTuple):
    """What every Monte Carlo seed shares: the evaluation points and the heads' projections."""

    eval_points: Tensor
    """(m, D): drawn from N(0, I_D)."""
    projections: Tensor
    """(B, D, k): uniformly random k-dimensional subspaces (orthonormal bases), one per head."""


def make_design(
    config: OnePrincipleConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
) -> Design:
    """The fixed design: m evaluation points, then B head projections, from ``config.design_seed``.

    Parameters
    ----------
    config : OnePrincipleConfig
    device : torch.device or str, default "cpu"
        Resolved with :func:`nwlib.resolve_device` (``"auto"`` picks an accelerator).
    dtype : torch.dtype, default torch.float64
        The points are drawn in float64 and cast, so float32 and float64 runs share them.

    Returns
    -------
    Design
        ``eval_points`` (m, D) and ``projections`` (B, D, k).

    Examples
    --------
    >>> design = make_design(OnePrincipleConfig(m=5, max_members=4))
    >>> tuple(design.eval_points.shape), tuple(design.projections.shape)
    ((5, 6), (4, 6, 2))
    """
    config = _require_config(config)
    dev = resolve_device(device)
    dtype = require_dtype(dtype)
    gen = torch.Generator(device=dev).manual_seed(config.design_seed)
    z = torch.randn(config.m, config.embed_dim, generator=gen, dtype=torch.float64, device=dev).to(dtype)
    w = random_subspaces(
        config.max_members, config.subset_dim, config.embed_dim, generator=gen, dtype=dtype, device=dev
    )
    return Design(z, w)


# --- real dot-product heads ----------------------------------------------------------------


def dot_product_projections(
    replicates: int,
    num_heads: int,
    embed_dim: int,
    head_dim: int,
    *,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """Random initialisations of the heads' query and key projections, one per training set and head.

    Entries are i.i.d. N(0, 1/D) (the variance of a Xavier-normal init of a D × (H·d_k) layer is
    of this order), W_Q first, then W_K, drawn independently: W_Q ≠ W_K.

    Parameters
    ----------
    replicates, num_heads, embed_dim, head_dim : int
        R, H, D and d_k.
    generator : torch.Generator
        Its device is the result's.
    dtype : torch.dtype, default torch.float64
        Drawn in float64 and cast.

    Returns
    -------
    (Tensor, Tensor)
        W_Q and W_K, each of shape (R, H, D, d_k).

    Examples
    --------
    >>> wq, wk = dot_product_projections(2, 3, 6, 2, generator=torch.Generator().manual_seed(0))
    >>> tuple(wq.shape), bool((wq != wk).any())
    ((2, 3, 6, 2), True)
    """
    shape = tuple(
        require_positive_int(v, name)
        for v, name in (
            (replicates, "replicates"),
            (num_heads, "num_heads"),
            (embed_dim, "embed_dim"),
            (head_dim, "head_dim"),
        )
    )
    dtype = require_dtype(dtype)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    dev = generator.device
    root = math.sqrt(shape[2])
    wq = torch.randn(shape, generator=generator, dtype=torch.float64, device=dev) / root
    wk = torch.randn(shape, generator=generator, dtype=torch.float64, device=dev) / root
    return wq.to(dtype), wk.to(dtype)


def _dp_queries_keys(
    x: Tensor, eval_points: Tensor, query_weights: Tensor, key_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """Normalised queries (R, H, m, d_k) and keys (R, H, n, d_k) of LayerNorm'd tokens."""
    dim = eval_points.shape[-1]
    tz = torch.nn.functional.layer_norm(eval_points, (dim,))
    tx = torch.nn.functional.layer_norm(x, (dim,))
    q = torch.einsum("md,rhdk->rhmk", tz, query_weights)
    k = torch.einsum("rnd,rhdk->rhnk", tx, key_weights)
    return torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)


def dot_product_heads(
    x: Tensor,
    y: Tensor,
    eval_points: Tensor,
    query_weights: Tensor,
    key_weights: Tensor,
    *,
    temperature: float,
) -> Tensor:
    r"""Dot-product attention heads on LayerNorm'd tokens with normalised queries and keys.

    Head h of training set r: tokens :math:`t = \mathrm{LN}(x)` (``layer_norm(x, (D,))``, no
    affine), query :math:`q = t_z W_Q^{rh}`, keys :math:`k_i = t_{x_i} W_K^{rh}`, both scaled to
    the unit sphere (QK-norm), and the estimate
    :math:`\mathrm{softmax}_i(\langle\hat q, \hat k_i\rangle/\tau)\,y_i`
    (:func:`nwlib.cosine_attention`). The values are the responses and the heads are averaged with
    equal weights (the chapter's Assumption 1): W_V and W_O are not random here.

    Parameters
    ----------
    x : Tensor, shape (R, n, D)
    y : Tensor, shape (R, n)
    eval_points : Tensor, shape (m, D)
    query_weights, key_weights : Tensor, shape (R, H, D, d_k)
        From :func:`dot_product_projections`.
    temperature : float
        τ > 0.

    Returns
    -------
    Tensor, shape (R, H, m)

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y, z = torch.randn(2, 50, 4, generator=g), torch.randn(2, 50, generator=g), torch.randn(7, 4, generator=g)
    >>> wq, wk = dot_product_projections(2, 3, 4, 2, generator=g, dtype=torch.float32)
    >>> tuple(dot_product_heads(x, y, z, wq, wk, temperature=0.1).shape)
    (2, 3, 7)
    """
    from ..kernels import cosine_attention

    x = require_tensor(x, "x")
    y = require_tensor(y, "y")
    z = require_tensor(eval_points, "eval_points")
    wq = require_tensor(query_weights, "query_weights")
    wk = require_tensor(key_weights, "key_weights")
    if x.dim() != 3 or y.shape != x.shape[:2] or z.dim() != 2 or z.shape[1] != x.shape[2]:
        raise ValueError(
            f"x must be (R, n, D), y (R, n) and eval_points (m, D), got {tuple(x.shape)}, {tuple(y.shape)} "
            f"and {tuple(z.shape)}"
        )
    if wq.dim() != 4 or wq.shape != wk.shape or wq.shape[0] != x.shape[0] or wq.shape[2] != x.shape[2]:
        raise ValueError(
            f"query_weights and key_weights must both be (R, H, D, d_k) with R = {x.shape[0]} and D = {x.shape[2]}, "
            f"got {tuple(wq.shape)} and {tuple(wk.shape)}"
        )
    tau = require_real(temperature, "temperature", minimum=0.0, strict_minimum=True)
    reps, heads, _, head_dim = wq.shape
    out = torch.empty(reps, heads, z.shape[0], dtype=z.dtype, device=z.device)
    for start in range(0, reps, 16):  # a block of training sets at a time
        stop = min(start + 16, reps)
        q, k = _dp_queries_keys(x[start:stop], z, wq[start:stop], wk[start:stop])
        # the responses as the first of head_dim value columns (zeros elsewhere): the fused CPU kernel needs
        # values as wide as the queries, and a width-1 value takes a slow path (see verified facts)
        values = torch.zeros(stop - start, heads, x.shape[1], head_dim, dtype=z.dtype, device=z.device)
        values[..., 0] = y[start:stop, None, :]
        out[start:stop] = cosine_attention(q, k, values, temperature=tau)[..., 0]
    return out


def select_temperature(
    task: RegressionTask,
    config: OnePrincipleConfig,
    design: Design,
    *,
    data_seed: int,
    generator: torch.Generator,
) -> tuple[float, dict[float, float]]:
    """The dot-product heads' temperature: the grid value with the lowest MSE on a validation batch.

    ``config.validation_replicates`` training sets from a generator seeded with ``data_seed`` (the
    stream of :func:`nwlib.ensembles.draw_training_sets`) and fresh head initialisations from
    ``generator``; for every τ of ``config.temperatures`` the same sets and initialisations (common
    random numbers) give the integrated squared error of the average of all B heads. The batches
    A and B on which the chapter checks its findings never enter.

    Parameters
    ----------
    task : RegressionTask
    config : OnePrincipleConfig
    design : Design
    data_seed : int
    generator : torch.Generator
        On the design's device.

    Returns
    -------
    (float, dict of float to float)
        The chosen τ (the first of equal minima) and the validation MSE for every τ.
    """
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    config = _require_config(config)
    z, _ = _require_design(design, config)
    if isinstance(data_seed, bool) or not isinstance(data_seed, int) or data_seed < 0:
        raise ValueError(f"data_seed must be a non-negative int, got {data_seed!r}")
    require_generator(generator, z.device, device_name="the design's device")
    reps = config.validation_replicates
    x, y = draw_training_sets(
        task, config.n, reps, generator=torch.Generator(z.device).manual_seed(data_seed), dtype=z.dtype
    )
    wq, wk = dot_product_projections(
        reps, config.max_members, config.embed_dim, config.subset_dim, generator=generator, dtype=z.dtype
    )
    target = task.f(z)
    scores = {}
    for tau in config.temperatures:
        ens = dot_product_heads(x, y, z, wq, wk, temperature=tau).mean(1)
        scores[tau] = float((ens - target).pow(2).mean())
    best = min(config.temperatures, key=lambda t: scores[t])
    return best, scores


# --- the ensembles on one batch of training sets -------------------------------------------


class FloorData(NamedTuple):
    """What :func:`member_weights` needs for the first F training sets of a batch."""

    x: Tensor
    """(F, n, D) training inputs."""
    y: Tensor
    """(F, n) training responses."""
    rows: Tensor
    """(F, B, n) int64: the bagged members' bootstrap resamples."""
    columns: Tensor
    """(F, B, k) int64: the random-subspace members' coordinates."""
    forests: tuple[Any, ...]
    """F fitted ``RandomForestRegressor`` objects."""
    query_weights: Tensor | None = None
    """(F, B, D, k): the dot-product heads' W_Q."""
    key_weights: Tensor | None = None
    """(F, B, D, k): the dot-product heads' W_K."""
    temperature: float | None = None
    """The dot-product heads' τ."""


class EnsembleBatch(NamedTuple):
    """The four ensembles' member predictions on one batch of training sets."""

    predictions: dict[str, Tensor]
    """Ensemble name (:data:`ENSEMBLES`) to predictions of shape (R, B, m)."""
    floor_data: FloorData
    """The first ``floor_replicates`` training sets and their members' randomisation."""


def _close(a: Tensor, b: Tensor) -> bool:
    """Agreement of two computations of one prediction (looser in single precision)."""
    rtol, atol = (1e-6, 1e-8) if a.dtype == torch.float64 else (1e-4, 1e-5)
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def ensemble_batch(
    task: RegressionTask,
    config: OnePrincipleConfig,
    design: Design,
    *,
    data_seed: int,
    generator: torch.Generator,
    temperature: float = 0.1,
) -> EnsembleBatch:
    """The five ensembles fitted on one batch of R training sets, the same sets for all of them.

    The training sets come from a generator seeded with ``data_seed``: :func:`nwlib.simulate`
    draws them for the heads and :func:`nwlib.ensembles.draw_training_sets` returns the same sets
    for the other ensembles (checked). The members' randomisation comes from ``generator``, in
    this order: bootstrap resamples (R, B, n), coordinate subsets (R, B, k), one forest seed per
    training set, then the dot-product heads' W_Q and W_K (:func:`dot_product_projections`).

    Parameters
    ----------
    task : RegressionTask
        The regression task (``config.task(name)``).
    config : OnePrincipleConfig
    design : Design
        From :func:`make_design`; its dtype and device are the computation's.
    data_seed : int
        Seed of the training sets (>= 0).
    generator : torch.Generator
        The members' randomisation, on the design's device; consumed as described above.
    temperature : float, default 0.1
        The dot-product heads' τ (:func:`select_temperature`).

    Returns
    -------
    EnsembleBatch
        Predictions of shape (R, B, m) for each of :data:`ENSEMBLES`, and the first
        ``config.floor_replicates`` training sets with their randomisation and forests.

    Raises
    ------
    TypeError, ValueError
        On a wrong argument (named in the message).
    RuntimeError
        If ``simulate`` and ``draw_training_sets`` disagree on the training sets, or the trees
        do not average to the forest's prediction.
    """
    from sklearn.ensemble import RandomForestRegressor

    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    config = _require_config(config)
    z, w = _require_design(design, config)
    if isinstance(data_seed, bool) or not isinstance(data_seed, int) or data_seed < 0:
        raise ValueError(f"data_seed must be a non-negative int, got {data_seed!r}")
    require_generator(generator, z.device, device_name="the design's device")
    dev, dtype = z.device, z.dtype
    n, reps, members, kernel = config.n, config.replicates, config.max_members, config.attention_kernel
    h_heads = config.bandwidth_heads
    x, y = draw_training_sets(task, n, reps, generator=torch.Generator(dev).manual_seed(data_seed), dtype=dtype)
    heads = simulate(
        task,
        w,
        z,
        n=n,
        replicates=reps,
        generator=torch.Generator(dev).manual_seed(data_seed),
        kernel=kernel,  # type: ignore[arg-type]
        bandwidth=h_heads,
    )
    check = nadaraya_watson(z @ w[0], x @ w[0], y, kernel=kernel, bandwidth=h_heads)  # type: ignore[arg-type]
    if not _close(check, heads[:, 0]):
        raise RuntimeError("simulate drew other training sets than draw_training_sets")
    rows = bootstrap_indices(reps, members, n, generator=generator)
    cols = feature_subsets(reps, members, config.embed_dim, config.subset_dim, generator=generator)
    forest_seeds = torch.randint(0, 2**31 - 1, (reps,), generator=generator, device=dev).tolist()
    x_np, y_np = x.cpu().numpy(), y.cpu().numpy()
    forests = [
        RandomForestRegressor(
            n_estimators=members,
            max_features=config.max_features,
            min_samples_leaf=config.forest_min_samples_leaf,
            random_state=s,
            n_jobs=config.forest_jobs,
        ).fit(x_np[r], y_np[r])
        for r, s in enumerate(forest_seeds)
    ]
    preds = {
        "random forest": forest_member_predictions(forests, z),
        "bagged NW": resampled_nw(x, y, z, rows=rows, bandwidth=config.bandwidth_full),
        "random-subspace NW": resampled_nw(x, y, z, columns=cols, bandwidth=config.bandwidth_sub),
        FIXED_HEADS: heads,
    }
    wq, wk = dot_product_projections(
        reps, members, config.embed_dim, config.subset_dim, generator=generator, dtype=dtype
    )
    preds[DP_HEADS] = dot_product_heads(x, y, z, wq, wk, temperature=temperature)
    forest_mean = torch.as_tensor(forests[0].predict(z.cpu().numpy()), dtype=dtype, device=dev)
    if not bool(torch.allclose(preds["random forest"][0].mean(0), forest_mean, atol=1e-5)):
        raise RuntimeError("the trees do not average to the forest's prediction")
    keep = slice(0, config.floor_replicates)
    floor = FloorData(x[keep], y[keep], rows[keep], cols[keep], tuple(forests[keep]), wq[keep], wk[keep], temperature)
    return EnsembleBatch(preds, floor)


@dataclass(frozen=True)
class TaskRun:
    """One task's two batches."""

    task: RegressionTask
    target: Tensor
    """(m,): f at the evaluation points."""
    a: dict[str, Tensor]
    """Batch A: ensemble name to predictions (R, B, m); fits the curve."""
    b: dict[str, Tensor]
    """Batch B: independent training sets and randomisations; measures the curve's points."""
    floor_data: FloorData = field(repr=False)
    """Batch B's first ``floor_replicates`` training sets (:func:`shared_data_floor`)."""
    temperature: float = 0.1
    """The dot-product heads' τ, chosen on the validation batch."""
    validation: dict[float, float] = field(default_factory=dict)
    """The validation MSE of the dot-product heads' average for every τ of the grid."""


def run_ensembles(config: OnePrincipleConfig, design: Design, *, generator: torch.Generator) -> dict[str, TaskRun]:
    """Every task's validation batch and batches A and B: three data seeds from ``generator``, then the three batches.

    Parameters
    ----------
    config : OnePrincipleConfig
    design : Design
    generator : torch.Generator
        The experiment's generator, consumed task by task in ``config.tasks`` order: three data
        seeds in [0, 2^62), then :func:`select_temperature` on the first, :func:`ensemble_batch`
        for A and for B.

    Returns
    -------
    dict of str to TaskRun
        In ``config.tasks`` order.
    """
    config = _require_config(config)
    z, _ = _require_design(design, config)
    require_generator(generator, z.device, device_name="the design's device")
    runs = {}
    for name in config.tasks:
        task = config.task(name)
        seed_v, seed_a, seed_b = torch.randint(0, 2**62, (3,), generator=generator, device=z.device).tolist()
        tau, scores = select_temperature(task, config, design, data_seed=seed_v, generator=generator)
        batch_a = ensemble_batch(task, config, design, data_seed=seed_a, generator=generator, temperature=tau)
        batch_b = ensemble_batch(task, config, design, data_seed=seed_b, generator=generator, temperature=tau)
        runs[name] = TaskRun(task, task.f(z), batch_a.predictions, batch_b.predictions, batch_b.floor_data, tau, scores)
    return runs


# --- the law, measured ----------------------------------------------------------------------


class LawTables(NamedTuple):
    """The law and the decomposition, one row per (task, ensemble, b)."""

    law: pd.DataFrame
    """Measured (batch B, first b members) and predicted (batch A's curve) variances, their
    deviation ``dev`` ± ``dev_se``, relative deviation ``rel`` ± ``rel_se``, ``z`` and
    ``significant`` (Holm over the rows), and σ², ρ of batch A and ρ of batch B with SEs."""
    terms: pd.DataFrame
    """Batch B's integrated bias², variance, covariance and MSE of the first b members, with SEs."""


def law_tables(runs: Mapping[str, TaskRun], member_counts: Sequence[int]) -> LawTables:
    r"""The curve fitted on batch A against the variance of the first b members measured on batch B.

    For each task and ensemble, :func:`nwlib.equicorrelation` of batch A gives σ² and
    ρ, hence the curve :math:`\sigma^2(\rho + (1-\rho)/b)`, and of the first b members of batch
    B the measured variance. The batches are independent, so the deviation's standard error is
    the root sum of squares, and that of the relative deviation (measured / predicted − 1)
    follows by the delta method. A deviation is ``significant`` when it differs from 0 at 5 %
    after Holm's correction over all rows (:func:`nwlib.evidence.significant`).

    Parameters
    ----------
    runs : Mapping of str to TaskRun
        From :func:`run_ensembles`.
    member_counts : sequence of int
        The b to measure (each between 1 and B).

    Returns
    -------
    LawTables
    """
    import pandas as pd

    runs = _require_runs(runs)
    counts = [require_positive_int(b, "member_counts") for b in member_counts]
    law_rows, term_rows = [], []
    for name, run in runs.items():
        for ens in ENSEMBLES:
            fit_a, fit_b_all = equicorrelation(run.a[ens]), equicorrelation(run.b[ens])
            if max(counts) > run.b[ens].shape[1]:
                raise ValueError(f"member_counts must be <= the ensembles' {run.b[ens].shape[1]} members")
            for b in counts:
                sub = run.b[ens][:, :b]
                measured = equicorrelation(sub)  # for b = 1: the first member's own variance
                mv, mv_se = measured.ensemble_variance, measured.ensemble_variance_se
                pred, pred_se = fit_a.predicted_variance(b), fit_a.predicted_variance_se(b)
                # delete-one jackknife SEs over each batch's R training sets: R - 1 degrees of freedom each
                reps = run.b[ens].shape[0]
                dev = independent(estimate(mv, mv_se, reps - 1), estimate(pred, pred_se, run.a[ens].shape[0] - 1))
                law_rows.append(
                    dict(
                        task=name,
                        ensemble=ens,
                        b=b,
                        measured=mv,
                        measured_se=mv_se,
                        predicted=pred,
                        predicted_se=pred_se,
                        sigma2_a=fit_a.mean_variance,
                        sigma2_a_se=fit_a.mean_variance_se,
                        rho_a=fit_a.rho,
                        rho_a_se=fit_a.rho_se,
                        rho_b=fit_b_all.rho,
                        rho_b_se=fit_b_all.rho_se,
                        dev=mv - pred,
                        dev_se=math.hypot(mv_se, pred_se),
                        dev_df=dev.df,
                        rel=mv / pred - 1,
                        rel_se=math.hypot(mv_se / pred, mv * pred_se / pred**2),
                        rel_df=dev.df,
                    )
                )
                dec = decompose(sub, run.target).integrated()
                term_rows.append(
                    dict(
                        task=name,
                        ensemble=ens,
                        b=b,
                        bias_sq=dec.bias_sq,
                        bias_sq_se=dec.bias_sq_se,
                        variance=dec.variance,
                        variance_se=dec.variance_se,
                        covariance=dec.covariance,
                        covariance_se=dec.covariance_se,
                        mse=dec.mse,
                        mse_se=dec.mse_se,
                    )
                )
    law = pd.DataFrame(law_rows)
    terms = pd.DataFrame(term_rows)
    deviations = [estimate(r.dev, r.dev_se, r.dev_df) for r in law.itertuples()]
    law["z"] = [c.z for c in deviations]
    law["significant"] = significant(deviations)  # Holm over the table's rows
    return LawTables(law, terms)


def law_summary(law: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, ensemble) of :attr:`LawTables.law`: ρ, σ², the largest deviations, how many significant.

    Parameters
    ----------
    law : DataFrame
        :attr:`LawTables.law`.

    Returns
    -------
    DataFrame
        Indexed by (task, ensemble) in the table's order; columns ``rho_a``, ``rho_a_se``,
        ``rho_b``, ``rho_b_se``, ``sigma2``, ``sigma2_se``, ``max_abs_z``, ``max_rel_dev``,
        ``significant``.
    """
    return law.groupby(["task", "ensemble"], sort=False).agg(
        rho_a=("rho_a", "first"),
        rho_a_se=("rho_a_se", "first"),
        rho_b=("rho_b", "first"),
        rho_b_se=("rho_b_se", "first"),
        sigma2=("sigma2_a", "first"),
        sigma2_se=("sigma2_a_se", "first"),
        max_abs_z=("z", lambda s: s.abs().max()),
        max_rel_dev=("rel", lambda s: s.abs().max()),
        significant=("significant", "sum"),
    )


# --- the nested heads -----------------------------------------------------------------------


def nested_deviations(
    task: RegressionTask,
    projections: Tensor,
    config: OnePrincipleConfig,
    design: Design,
    *,
    generator: torch.Generator,
) -> list[Comparison]:
    """The first b heads (batch B) minus the curve fitted on an independent batch A, for every b.

    Two data seeds in [0, 2^62) are drawn from ``generator``; each seeds one batch of R training
    sets for :func:`nwlib.simulate` with these projections, the design's points and
    ``config``'s kernel. The standard error is the root sum of the two jackknife SEs.

    Parameters
    ----------
    task : RegressionTask
    projections : Tensor, shape (B, D, k)
        The heads' projections.
    config : OnePrincipleConfig
    design : Design
        Its evaluation points are used.
    generator : torch.Generator

    Returns
    -------
    list of Comparison
        One per b of ``config.member_counts``.
    """
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask (see make_task), got {type(task).__name__}")
    config = _require_config(config)
    z, _ = _require_design(design, config)
    projections = require_tensor(projections, "projections")
    if projections.dim() != 3 or projections.shape[0] < 2:
        raise ValueError(f"projections must have shape (B, D, k) with B >= 2, got {tuple(projections.shape)}")
    require_generator(generator, z.device, device_name="the design's device")
    seeds = torch.randint(0, 2**62, (2,), generator=generator, device=z.device).tolist()
    batch_a, batch_b = (
        simulate(
            task,
            projections,
            z,
            n=config.n,
            replicates=config.replicates,
            kernel=config.attention_kernel,  # type: ignore[arg-type]
            bandwidth=config.bandwidth_heads,
            generator=torch.Generator(z.device).manual_seed(s),
        )
        for s in seeds
    )
    fit_a = equicorrelation(batch_a)
    out = []
    for b in config.member_counts:
        fit_b = equicorrelation(batch_b[:, :b])
        df = config.replicates - 1  # delete-one jackknife over each batch's training sets
        out.append(
            independent(
                estimate(fit_b.ensemble_variance, fit_b.ensemble_variance_se, df),
                estimate(fit_a.predicted_variance(b), fit_a.predicted_variance_se(b), df),
            )
        )
    return out


class HeadsCheck(NamedTuple):
    """The nested-heads check over ``head_draws`` draws of the projections."""

    comparisons: pd.DataFrame
    """One row per (draw, task, b): ``abs_z``, ``deviation`` (a Comparison), ``significant``
    (Holm over every comparison of the check)."""
    pairs: pd.DataFrame
    """One row per (draw, task): ``max_abs_z`` and ``deviates`` (any significant b)."""
    table: pd.DataFrame
    """``pairs``' largest |z|, draws by tasks, rounded to 2 digits (the chapter's table)."""


def nested_heads_check(
    runs: Mapping[str, TaskRun],
    law: pd.DataFrame,
    config: OnePrincipleConfig,
    design: Design,
    *,
    generator: torch.Generator,
) -> HeadsCheck:
    """Whether the first b heads follow the curve, for several independent draws of the projections.

    Draw 0 is the main experiment (its rows of ``law``); each further draw takes new projections
    from ``generator`` (:func:`nwlib.random_subspaces`) and, task by task, two fresh batches
    (:func:`nested_deviations`). A draw-task pair deviates if any of its b deviates significantly,
    with Holm's correction over all the comparisons of the check.

    Parameters
    ----------
    runs : Mapping of str to TaskRun
        The main experiment (its tasks).
    law : DataFrame
        :attr:`LawTables.law` of the main experiment.
    config : OnePrincipleConfig
    design : Design
    generator : torch.Generator
        Consumed after the main experiment, draw by draw.

    Returns
    -------
    HeadsCheck
    """
    import pandas as pd

    runs = _require_runs(runs)
    config = _require_config(config)
    z, w = _require_design(design, config)
    require_generator(generator, z.device, device_name="the design's device")
    counts = config.member_counts
    head_rows = []
    for draw in range(config.head_draws):
        w_draw = (
            w
            if draw == 0
            else random_subspaces(
                config.max_members,
                config.subset_dim,
                config.embed_dim,
                generator=generator,
                dtype=z.dtype,
                device=z.device,
            )
        )
        for name in runs:
            if draw == 0:
                main = law[(law.task == name) & (law.ensemble == FIXED_HEADS)]
                devs = [estimate(r.dev, r.dev_se, r.dev_df) for r in main.itertuples()]
            else:
                devs = nested_deviations(runs[name].task, w_draw, config, design, generator=generator)
            head_rows += [
                dict(draw=draw, task=name, b=b, abs_z=abs(c.z), deviation=c) for b, c in zip(counts, devs, strict=True)
            ]
    long = pd.DataFrame(head_rows)
    long["significant"] = significant(list(long.deviation))  # Holm over every comparison of this check
    pairs = (
        long.groupby(["draw", "task"], sort=False)
        .agg(max_abs_z=("abs_z", "max"), deviates=("significant", "any"))
        .reset_index()
    )
    table = pairs.pivot(index="draw", columns="task", values="max_abs_z").round(2)
    table.columns.name = "largest |z| of the nested heads"
    return HeadsCheck(long, pairs, table)


# --- MSE at the largest ensemble ------------------------------------------------------------


def per_replicate_mse(runs: Mapping[str, TaskRun]) -> dict[tuple[str, str], Tensor]:
    """Each ensemble's integrated squared error per training set of batch B, all B members averaged.

    Within a batch the ensembles share their training sets, so differences are paired
    (:func:`nwlib.evidence.paired`).

    Parameters
    ----------
    runs : Mapping of str to TaskRun

    Returns
    -------
    dict of (task, ensemble) to Tensor of shape (R,)
    """
    runs = _require_runs(runs)
    out = {}
    for name, run in runs.items():
        for ens in ENSEMBLES:
            p = run.b[ens]
            out[(name, ens)] = replicate_mse(p, run.target, uniform_weights(p.shape[1], dtype=p.dtype, device=p.device))
    return out


# --- the shared-data floor ------------------------------------------------------------------


def member_weights(ensemble: str, floor_data: FloorData, r: int, config: OnePrincipleConfig, design: Design) -> Tensor:
    """The weight of training point i in member b's prediction at point j, for one training set.

    NW members are linear smoothers of the responses; a bagged member's weights over its
    resample are scattered back onto the original points (repetitions add up); a tree's are its
    leaf weights given its partition (:func:`nwlib.ensembles.forest_weights`).

    Parameters
    ----------
    ensemble : str
        One of :data:`ENSEMBLES`.
    floor_data : FloorData
        From :func:`ensemble_batch`.
    r : int
        The training set, 0 <= r < F.
    config : OnePrincipleConfig
    design : Design

    Returns
    -------
    Tensor, shape (B, m, n)
        Non-negative, each (b, j) row summing to one; ``weights @ y`` gives the predictions.
    """
    ensemble = require_choice(ensemble, "ensemble", ENSEMBLES)
    config = _require_config(config)
    z, w = _require_design(design, config)
    if not isinstance(floor_data, FloorData):
        raise TypeError(f"floor_data must be a FloorData (from ensemble_batch), got {type(floor_data).__name__}")
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < floor_data.x.shape[0]:
        raise ValueError(f"r must be an int in [0, {floor_data.x.shape[0]}), got {r!r}")
    x, rows, cols = floor_data.x[r], floor_data.rows[r], floor_data.columns[r]
    members, m, dim = rows.shape[0], z.shape[0], z.shape[1]
    n = x.shape[0]
    if ensemble == "random forest":
        return forest_weights(floor_data.forests[r], x, z)
    if ensemble == "bagged NW":
        wts = nadaraya_watson_weights(z, x[rows], kernel="gaussian", bandwidth=config.bandwidth_full)  # (B, m, n)
        zeros = torch.zeros(members, m, n, dtype=z.dtype, device=z.device)
        return zeros.scatter_add_(2, rows[:, None, :].expand(-1, m, -1), wts)
    if ensemble == "random-subspace NW":
        zc = torch.gather(z.expand(members, m, dim), 2, cols[:, None, :].expand(-1, m, -1))
        xc = torch.gather(x.expand(members, n, dim), 2, cols[:, None, :].expand(-1, n, -1))
        return nadaraya_watson_weights(zc, xc, kernel="gaussian", bandwidth=config.bandwidth_sub)
    if ensemble == DP_HEADS:
        if floor_data.query_weights is None or floor_data.key_weights is None or floor_data.temperature is None:
            raise ValueError("floor_data must hold the dot-product heads' projections and temperature")
        q, k = _dp_queries_keys(x[None], z, floor_data.query_weights[r : r + 1], floor_data.key_weights[r : r + 1])
        return nadaraya_watson_weights(q[0], k[0], kernel="exp", bandwidth=math.sqrt(floor_data.temperature))
    return nadaraya_watson_weights(
        z @ w,
        x @ w,
        kernel=config.attention_kernel,  # type: ignore[arg-type]
        bandwidth=config.bandwidth_heads,
    )


class SharedDataFloor(NamedTuple):
    """The noise part of the members' covariances, per training set and on average."""

    replicates: dict[tuple[str, str], dict[str, Tensor]]
    """(task, ensemble) to per-training-set float64 series (F,): ``member`` (mean noise variance
    σ²‖wᵇ‖² of a member), ``rho_noise`` (mean off-diagonal over mean diagonal noise covariance),
    ``floor`` (σ²‖w̄‖² of the average of all members), ``floor_inf`` (mean noise covariance
    between members: what remains as b → ∞), ``n_floor_min`` (min over points of n‖w̄‖²) and, for
    bagged NW, ``plain`` (the unbagged smoother's noise variance)."""
    table: pd.DataFrame
    """Means over the training sets (``n_floor_min``: the minimum), indexed by (task, ensemble);
    ``plain`` is NaN except for bagged NW."""


def shared_data_floor(runs: Mapping[str, TaskRun], config: OnePrincipleConfig, design: Design) -> SharedDataFloor:
    r"""Every member's weights for batch B's first training sets, and what they imply for the noise.

    Given the inputs and the randomisation the noise part of :math:`\operatorname{Cov}(\hat f_b,
    \hat f_{b'})` is :math:`\sigma^2\sum_i w^b_i w^{b'}_i` (:func:`nwlib.noise_covariance`), and
    that of the average of all members :math:`\sigma^2\lVert\bar w\rVert^2 \ge \sigma^2/n`.

    Parameters
    ----------
    runs : Mapping of str to TaskRun
    config : OnePrincipleConfig
    design : Design

    Returns
    -------
    SharedDataFloor

    Raises
    ------
    RuntimeError
        If a set of weights does not reproduce the member predictions it stands for.
    """
    import pandas as pd

    runs = _require_runs(runs)
    config = _require_config(config)
    z, _ = _require_design(design, config)
    members, n, sd = config.max_members, config.n, config.noise_sd
    off = ~torch.eye(members, dtype=torch.bool, device=z.device)
    reps_by: dict[tuple[str, str], dict[str, Tensor]] = {}
    rows = []
    for name, run in runs.items():
        data = run.floor_data
        for ens in ENSEMBLES:
            acc: dict[str, list[float]] = dict(
                member=[], rho_noise=[], floor=[], floor_inf=[], n_floor_min=[], plain=[]
            )
            for r in range(data.x.shape[0]):
                w = member_weights(ens, data, r, config, design)
                if not _close(w @ data.y[r], run.b[ens][r]):
                    raise RuntimeError(f"the weights of {ens!r} do not reproduce its predictions ({name}, r = {r})")
                cov = noise_covariance(w, sd)  # (B, B, m)
                diag = cov.diagonal(dim1=0, dim2=1)  # (m, B)
                acc["member"].append(float(diag.mean()))
                acc["rho_noise"].append(float(cov[off].mean() / diag.mean()))
                acc["floor_inf"].append(float(cov[off].mean()))  # what is left of the noise part as B grows
                w_bar = w.mean(0)
                acc["floor"].append(float(sd**2 * w_bar.pow(2).sum(-1).mean()))
                acc["n_floor_min"].append(float(n * w_bar.pow(2).sum(-1).min()))
                if ens == "bagged NW":
                    plain = nadaraya_watson_weights(z, data.x[r], kernel="gaussian", bandwidth=config.bandwidth_full)
                    acc["plain"].append(float(sd**2 * plain.pow(2).sum(-1).mean()))
            reps = reps_by[(name, ens)] = {k: torch.tensor(v, dtype=torch.float64) for k, v in acc.items() if v}
            rows.append(
                {
                    "task": name,
                    "ensemble": ens,
                    "plain": float("nan"),
                    **{k: float(v.mean()) for k, v in reps.items()},
                    "n_floor_min": float(reps["n_floor_min"].min()),
                }
            )
    return SharedDataFloor(reps_by, pd.DataFrame(rows).set_index(["task", "ensemble"]))


# --- contrasts between ensembles, with jackknife standard errors -----------------------------


def jackknife_groups(replicates: int) -> int:
    """Groups of the delete-a-group jackknife: the largest divisor of R up to 20 (delete-one when none exists).

    Examples
    --------
    >>> jackknife_groups(24), jackknife_groups(100), jackknife_groups(23)
    (12, 20, 23)
    """
    reps = require_positive_int(replicates, "replicates", minimum=2)
    return max([g for g in range(2, 21) if reps % g == 0] or [reps])


def jackknife_comparisons(statistic: Callable[..., Any], *arrays: Tensor, groups: int) -> list[Comparison]:
    """``statistic(*arrays)`` (a vector) with delete-a-group jackknife SEs over the replicates, as Comparisons.

    Parameters
    ----------
    statistic : callable
        Of subsets of ``arrays`` along dimension 0; returns a float, a list of floats or a tensor.
    *arrays : Tensor, shape (R, ...)
    groups : int
        As in :func:`nwlib.grouped_jackknife`.

    Returns
    -------
    list of Comparison
        One per entry of the flattened statistic, with ``groups - 1`` degrees of freedom.
    """
    fit = grouped_jackknife(statistic, *arrays, groups=groups)
    df = groups - 1  # a delete-a-group jackknife of G groups: G - 1 degrees of freedom
    values, ses = fit.estimate.reshape(-1).tolist(), fit.se.reshape(-1).tolist()
    return [estimate(v, s, df) for v, s in zip(values, ses, strict=True)]


def batch_a_contrasts(forest: Tensor, bagged: Tensor, rsm: Tensor, heads: Tensor) -> list[float]:
    """Bagged NW's ρ minus each other's, then the trees' σ² minus each other's (batch A).

    Parameters
    ----------
    forest, bagged, rsm, heads : Tensor, shape (R, B, m)
        The four ensembles' predictions on the same training sets.

    Returns
    -------
    list of float
        ``[ρ_bag − ρ_forest, ρ_bag − ρ_rsm, ρ_bag − ρ_heads, σ²_forest − σ²_bag, σ²_forest − σ²_rsm,
        σ²_forest − σ²_heads]``.
    """
    fits = [equicorrelation(p) for p in (forest, bagged, rsm, heads)]
    rho, s2 = [f.rho for f in fits], [f.mean_variance for f in fits]
    return [rho[1] - rho[0], rho[1] - rho[2], rho[1] - rho[3], s2[0] - s2[1], s2[0] - s2[2], s2[0] - s2[3]]


def batch_b_contrasts(target: Tensor, forest: Tensor, rsm: Tensor, heads: Tensor) -> list[float]:
    """At the largest ensemble (batch B): heads' bias² minus 10 × their variance part; rsm's bias² minus the forest's.

    Parameters
    ----------
    target : Tensor, shape (m,)
    forest, rsm, heads : Tensor, shape (R, B, m)

    Returns
    -------
    list of float
        ``[bias²_heads − 10 (variance + covariance)_heads, bias²_rsm − bias²_forest]`` of the
        uniform averages of all B members (:func:`nwlib.decompose`).
    """
    f, r, h = (decompose(p, target).integrated() for p in (forest, rsm, heads))
    return [h.bias_sq - 10 * (h.variance + h.covariance), r.bias_sq - f.bias_sq]


def rho_variance_contrasts(run: TaskRun, *, groups: int) -> list[Comparison]:
    """:func:`batch_a_contrasts` of one task's batch A, with jackknife SEs over its training sets."""
    return jackknife_comparisons(batch_a_contrasts, *(run.a[e] for e in ENSEMBLES[:4]), groups=groups)


def bias_contrasts(run: TaskRun, *, groups: int) -> list[Comparison]:
    """:func:`batch_b_contrasts` of one task's batch B, with jackknife SEs over its training sets."""
    statistic = functools.partial(batch_b_contrasts, run.target)
    members = (run.b[e] for e in ("random forest", "random-subspace NW", FIXED_HEADS))
    return jackknife_comparisons(statistic, *members, groups=groups)


# --- the random-subspace target --------------------------------------------------------------


def rsm_target_fraction(task: str, embed_dim: int, subset_dim: int) -> float:
    """The fraction of f that an infinite random-subspace ensemble targets.

    A member on the coordinates S learns E[f | x_S]. For ``"subspace"`` (additive) each term
    survives with probability P(j ∈ S) = k/D; for ``"interaction"`` (a product of two
    coordinates' functions) only subsets holding both count, with probability k(k−1)/(D(D−1)).

    Parameters
    ----------
    task : {"subspace", "interaction"}
    embed_dim : int
        D.
    subset_dim : int
        k <= D.

    Returns
    -------
    float

    Examples
    --------
    >>> rsm_target_fraction("subspace", 6, 2), rsm_target_fraction("interaction", 6, 2)
    (0.3333333333333333, 0.06666666666666667)
    """
    task = require_choice(task, "task", CHAPTER_TASKS)
    dim = require_positive_int(embed_dim, "embed_dim")
    k = require_positive_int(subset_dim, "subset_dim")
    if k > dim:
        raise ValueError(f"subset_dim must be <= embed_dim = {dim}, got {k}")
    if task == "subspace":
        return k / dim
    return k * (k - 1) / (dim * (dim - 1)) if dim > 1 else 0.0


# --- the whole experiment --------------------------------------------------------------------


@dataclass(frozen=True)
class OnePrincipleResult:
    """Everything the chapter reads from one run of :func:`one_principle_experiment`."""

    config: OnePrincipleConfig
    design: Design = field(repr=False)
    runs: dict[str, TaskRun] = field(repr=False)
    law: pd.DataFrame = field(repr=False)
    """:attr:`LawTables.law`."""
    terms: pd.DataFrame = field(repr=False)
    """:attr:`LawTables.terms`."""
    summary: pd.DataFrame = field(repr=False)
    """:func:`law_summary` of ``law``."""
    heads: HeadsCheck = field(repr=False)
    floor: SharedDataFloor = field(repr=False)
    mse_replicates: dict[tuple[str, str], Tensor] = field(repr=False)
    """:func:`per_replicate_mse`."""
    contrast_a: dict[str, list[Comparison]] = field(repr=False)
    """Task to :func:`rho_variance_contrasts`."""
    contrast_b: dict[str, list[Comparison]] = field(repr=False)
    """Task to :func:`bias_contrasts`."""
    rsm_bias_target: dict[str, float] = field(repr=False)
    """Task to the squared bias of the random-subspace target alone, (1 − fraction)² mean f²."""

    @property
    def zero_mse(self) -> dict[str, float]:
        """Task to the zero predictor's integrated MSE, mean f² over the design's evaluation points."""
        return {name: float(run.target.pow(2).mean()) for name, run in self.runs.items()}

    @property
    def temperatures(self) -> dict[str, float]:
        """Task to the dot-product heads' temperature chosen on the validation batch."""
        return {name: run.temperature for name, run in self.runs.items()}

    def gain_over_zero(self, task: str, ensemble: str) -> Comparison:
        """The zero predictor's MSE minus the ensemble's at the largest ensemble (batch B; > 0: it smooths)."""
        mse = self.mse_replicates[(task, ensemble)]
        return paired(torch.full_like(mse, self.zero_mse[task]), mse)

    def variance_reduction(self, task: str, ensemble: str) -> Comparison:
        """A member's variance σ² (batch A) minus the variance of the average of all B members (batch B).

        The batches are independent, so the SEs add in quadrature (:func:`nwlib.evidence.independent`),
        each with the R − 1 degrees of freedom of a delete-one jackknife.
        """
        s = self.summary.loc[(task, ensemble)]
        law = self.law
        row = law[(law.task == task) & (law.ensemble == ensemble) & (law.b == self.config.max_members)].iloc[0]
        df = self.config.replicates - 1
        return independent(
            estimate(float(s.sigma2), float(s.sigma2_se), df), estimate(float(row.measured), float(row.measured_se), df)
        )

    def mse_difference(self, task: str, ensemble: str, other: str) -> Comparison:
        """MSE of ``ensemble`` minus that of ``other`` at the largest ensemble, paired over batch B."""
        return paired(self.mse_replicates[(task, ensemble)], self.mse_replicates[(task, other)])


def one_principle_experiment(
    config: OnePrincipleConfig,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
) -> OnePrincipleResult:
    """The chapter's experiment: design, both batches of every task, the law, the nested heads, the floor.

    One generator seeded with ``seed`` drives it all, in this order: :func:`run_ensembles`, then
    :func:`nested_heads_check`; the design has a seed of its own (``config.design_seed``).

    Parameters
    ----------
    config : OnePrincipleConfig
    seed : int
        The Monte Carlo seed (>= 0).
    device : torch.device or str, default "cpu"
    dtype : torch.dtype, default torch.float64

    Returns
    -------
    OnePrincipleResult
    """
    config = _require_config(config)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    dev = resolve_device(device)
    design = make_design(config, device=dev, dtype=dtype)
    gen = torch.Generator(device=dev).manual_seed(seed)
    runs = run_ensembles(config, design, generator=gen)
    law, terms = law_tables(runs, config.member_counts)
    heads = nested_heads_check(runs, law, config, design, generator=gen)
    groups = jackknife_groups(config.replicates)
    rsm_bias = {}
    for name, run in runs.items():
        fraction = rsm_target_fraction(name, config.embed_dim, config.subset_dim)
        rsm_bias[name] = (1 - fraction) ** 2 * float(run.target.pow(2).mean())
    return OnePrincipleResult(
        config=config,
        design=design,
        runs=runs,
        law=law,
        terms=terms,
        summary=law_summary(law),
        heads=heads,
        floor=shared_data_floor(runs, config, design),
        mse_replicates=per_replicate_mse(runs),
        contrast_a={name: rho_variance_contrasts(run, groups=groups) for name, run in runs.items()},
        contrast_b={name: bias_contrasts(run, groups=groups) for name, run in runs.items()},
        rsm_bias_target=rsm_bias,
    )


# --- what the chapter quotes -----------------------------------------------------------------


class ChapterNumbers(NamedTuple):
    """The chapter's numbers by class (see :func:`nwlib.book.glue`)."""

    estimates: dict[str, Comparison]
    """Monte Carlo estimates with their standard errors (glued ``se=``)."""
    counts: dict[str, int]
    """Counts, exact given the seed."""
    info: dict[str, float]
    """Standard errors quoted on their own and extremes over several estimates: informational."""


def chapter_numbers(result: OnePrincipleResult) -> ChapterNumbers:
    """The glue keys of the chapter's experiment and their values.

    Per task and ensemble (``key = f"{task}_{SHORT[ensemble]}"``): ``rho_<key>`` and
    ``sigma2_<key>`` (batch A), ``mse_<key>``, ``bias_sq_<key>``, ``var_cov_<key>`` and
    ``removed_<key>`` (batch B, all members; the share of the zero predictor's MSE removed),
    ``rho_noise_<key>`` and ``floor_<key>`` (the floor's means), with ``rho_se_<key>``,
    ``mse_se_<key>`` and ``removed_se_<key>`` as information. Per task: ``bag_floor_over_plain_<task>``,
    ``dmse_rsm_bag_<task>`` and ``dmse_<short>_forest_<task>`` (paired), their SEs as
    information. Per ensemble: ``law_significant_<short>`` and the extremes over b
    ``max_abs_z_<short>``, ``max_rel_dev_<short>``, ``max_rel_se_<short>`` (in %). Overall:
    ``law_rows_per_ensemble``, ``head_pairs``, ``head_pairs_deviating``, ``head_comparisons``,
    ``n_floor_min``, ``rho_nw_max_other``, ``rho_bag_min``.

    Parameters
    ----------
    result : OnePrincipleResult

    Returns
    -------
    ChapterNumbers
    """
    if not isinstance(result, OnePrincipleResult):
        raise TypeError(f"result must be a OnePrincipleResult, got {type(result).__name__}")
    cfg, law, terms, summary = result.config, result.law, result.terms, result.summary
    floor_reps, floor = result.floor.replicates, result.floor.table
    est: dict[str, Comparison] = {}
    info: dict[str, float] = {}
    counts: dict[str, int] = {}
    df = cfg.replicates - 1  # delete-one jackknife over the R training sets of a batch
    zero = result.zero_mse
    for name in cfg.tasks:
        for ens in ENSEMBLES:
            key = f"{name}_{SHORT[ens]}"
            s, reps = summary.loc[(name, ens)], floor_reps[(name, ens)]
            t = terms[(terms.task == name) & (terms.ensemble == ens) & (terms.b == cfg.max_members)].iloc[0]
            v = law[(law.task == name) & (law.ensemble == ens) & (law.b == cfg.max_members)].iloc[0]
            est[f"rho_{key}"] = estimate(float(s.rho_a), float(s.rho_a_se), df)
            info[f"rho_se_{key}"] = float(s.rho_a_se)
            est[f"sigma2_{key}"] = estimate(float(s.sigma2), float(s.sigma2_se), df)
            est[f"mse_{key}"] = estimate(float(t.mse), float(t.mse_se), df)
            info[f"mse_se_{key}"] = float(t.mse_se)
            est[f"bias_sq_{key}"] = estimate(float(t.bias_sq), float(t.bias_sq_se), df)
            # variance + covariance of all members = the measured variance: its SE is the law table's
            est[f"var_cov_{key}"] = estimate(float(t.variance + t.covariance), float(v.measured_se), df)
            # the share of the zero predictor's MSE (mean f^2 on the design's points) that the ensemble removes
            est[f"removed_{key}"] = estimate(1 - float(t.mse) / zero[name], float(t.mse_se) / zero[name], df)
            info[f"removed_se_{key}"] = float(t.mse_se) / zero[name]
            for quantity in ("rho_noise", "floor"):  # means over the floor's training sets
                est[f"{quantity}_{key}"] = mean(reps[quantity])
    # The dot-product heads' estimands depend on the temperature their validation batch selects, and that choice
    # moves with the seed (their validation curve is flat: they do not smooth), so across seeds these are not one
    # quantity: they are information, quoted with their SEs but not compared by make verify.
    for k in [k for k in est if k.endswith(f"_{SHORT[DP_HEADS]}")]:
        info[k] = float(est.pop(k).estimate)
    counts["law_rows_per_ensemble"] = len(cfg.member_counts) * len(cfg.tasks)
    for ens in ENSEMBLES:
        rows = law[law.ensemble == ens]
        info[f"max_abs_z_{SHORT[ens]}"] = float(rows.z.abs().max())  # extremes over b: information
        info[f"max_rel_dev_{SHORT[ens]}"] = 100 * float(rows.rel.abs().max())
        info[f"max_rel_se_{SHORT[ens]}"] = 100 * float(rows.rel_se.max())
        counts[f"law_significant_{SHORT[ens]}"] = int(rows.significant.sum())
    info["n_floor_min"] = float(floor.n_floor_min.min())
    for name in cfg.tasks:
        bag = floor_reps[(name, "bagged NW")]
        est[f"bag_floor_over_plain_{name}"] = mean(bag["floor_inf"] / bag["plain"])
        diff = result.mse_difference(name, "random-subspace NW", "bagged NW")
        est[f"dmse_rsm_bag_{name}"] = diff
        info[f"dmse_rsm_bag_se_{name}"] = diff.se
        for ens in ENSEMBLES[1:]:
            diff = result.mse_difference(name, ens, "random forest")
            est[f"dmse_{SHORT[ens]}_forest_{name}"] = diff
            info[f"dmse_{SHORT[ens]}_forest_se_{name}"] = diff.se
    rho_a = summary.rho_a[[e in ENSEMBLES[:4] for _, e in summary.index]]  # the four of the rho contrasts
    others = [e != "bagged NW" for _, e in rho_a.index]
    info["rho_nw_max_other"] = float(rho_a[others].max())
    info["rho_bag_min"] = float(rho_a[[not o for o in others]].min())
    pairs = result.heads.pairs
    counts["head_pairs"] = len(pairs)
    counts["head_pairs_deviating"] = int(pairs.deviates.sum())
    counts["head_comparisons"] = len(result.heads.comparisons)
    return ChapterNumbers(est, counts, info)


def format_law_table(summary: pd.DataFrame, num_counts: int) -> pd.DataFrame:
    """The chapter's law table: ρ (batch A and B), σ², largest |z| and deviation, significant deviations.

    Estimates and their jackknife standard errors share a cell (:func:`nwlib.book.table`).

    Parameters
    ----------
    summary : DataFrame
        :func:`law_summary`.
    num_counts : int
        Member counts per (task, ensemble), for "k of num_counts".

    Returns
    -------
    DataFrame of str, indexed like ``summary``.
    """
    import pandas as pd

    from ..book import table

    frame = pd.DataFrame(
        {
            "ρ (batch A)": summary.rho_a,
            "ρ (batch A) SE": summary.rho_a_se,
            "ρ (batch B)": summary.rho_b,
            "ρ (batch B) SE": summary.rho_b_se,
            "σ² (batch A)": summary.sigma2,
            "σ² (batch A) SE": summary.sigma2_se,
            "largest |z| over b": summary.max_abs_z,
            "largest |deviation| (%)": 100 * summary.max_rel_dev,
            "significant (Holm)": [f"{k} of {num_counts}" for k in summary.significant],
        },
        index=summary.index,
    )
    return table(frame)


def format_law_detail_table(law: pd.DataFrame) -> pd.DataFrame:
    """Every row of :attr:`LawTables.law`: measured and predicted variance, the relative deviation, its z.

    Parameters
    ----------
    law : DataFrame
        :attr:`LawTables.law`.

    Returns
    -------
    DataFrame of str, indexed by (task, ensemble, b).
    """
    import pandas as pd

    from ..book import table

    frame = pd.DataFrame(
        {
            "measured (batch B)": law.measured.to_numpy(),
            "measured SE": law.measured_se.to_numpy(),
            "predicted (batch A)": law.predicted.to_numpy(),
            "predicted SE": law.predicted_se.to_numpy(),
            "measured / predicted − 1": law.rel.to_numpy(),
            "relative SE": law.rel_se.to_numpy(),
            "z": law.z.to_numpy(),
            "significant (Holm)": law.significant.to_numpy(dtype=bool),
        },
        index=pd.MultiIndex.from_frame(law[["task", "ensemble", "b"]]),
    )
    se = {"measured (batch B)": "measured SE", "predicted (batch A)": "predicted SE"}
    return table(frame, se=se | {"measured / predicted − 1": "relative SE"})


def format_heads_table(heads: HeadsCheck) -> pd.DataFrame:
    """The nested heads' largest |z| per draw of the projections (rows) and task (columns).

    Parameters
    ----------
    heads : HeadsCheck
        :func:`nested_heads_check`.

    Returns
    -------
    DataFrame of str, indexed by draw.
    """
    from ..book import table

    if not isinstance(heads, HeadsCheck):
        raise TypeError(f"heads must be a HeadsCheck (from nested_heads_check), got {type(heads).__name__}")
    tasks = list(dict.fromkeys(heads.pairs.task))  # the experiment's order, not the pivot's
    frame = heads.table[tasks].rename(columns=lambda task: f"largest |z|, task {task!r}")
    return table(frame.rename_axis(index="draw", columns=None))


def format_terms_table(terms: pd.DataFrame, member_counts: Sequence[int]) -> pd.DataFrame:
    """The decomposition's terms (value ± SE) for the given member counts, indexed by (task, ensemble, b).

    A covariance of 0 up to rounding (one member: no pairs) is shown as ``0``.

    Parameters
    ----------
    terms : DataFrame
        :attr:`LawTables.terms`.
    member_counts : sequence of int
        The b to show.

    Returns
    -------
    DataFrame of str
    """
    import pandas as pd

    from ..book import table

    shown = terms[terms.b.isin(list(member_counts))]
    columns = ["bias_sq", "bias_sq_se", "variance", "variance_se", "covariance", "covariance_se", "mse", "mse_se"]
    frame = shown[columns].set_axis(pd.MultiIndex.from_frame(shown[["task", "ensemble", "b"]]), axis=0)
    # one member has no pairs: its covariance is 0 up to rounding, shown as 0 rather than to twenty decimals
    exact_zero = (frame.covariance.abs() < 1e-12) & (frame.covariance_se < 1e-12)
    frame.loc[exact_zero, ["covariance", "covariance_se"]] = 0.0
    return table(frame, headers={"mse": "MSE"})


def format_mse_table(result: OnePrincipleResult) -> pd.DataFrame:
    """MSE at the largest ensemble (± SE) beside the zero predictor's; paired differences to forest and bagged NW."""
    import pandas as pd

    from ..book import table

    terms, zero = result.terms, result.zero_mse
    mse = terms[terms.b == result.config.max_members].set_index(["task", "ensemble"])[["mse", "mse_se"]]
    to_forest = [result.mse_difference(t, e, "random forest") for t, e in mse.index]
    to_bagged = [result.mse_difference(t, e, "bagged NW") for t, e in mse.index]
    frame = pd.DataFrame(
        {
            "MSE": mse.mse,
            "MSE SE": mse.mse_se,
            "zero predictor's MSE (mean f²)": [zero[t] for t, _ in mse.index],
            "share of it removed (%)": [100 * (1 - r.mse / zero[r.Index[0]]) for r in mse.itertuples()],
            "minus forest (paired)": [c.estimate for c in to_forest],
            "minus forest (paired) SE": [c.se for c in to_forest],
            "minus bagged NW (paired)": [c.estimate for c in to_bagged],
            "minus bagged NW (paired) SE": [c.se for c in to_bagged],
        },
        index=mse.index,
    )
    return table(frame)


def format_temperature_table(result: OnePrincipleResult) -> pd.DataFrame:
    """The dot-product heads' validation MSE for every temperature, the chosen one, and the zero predictor's MSE.

    Parameters
    ----------
    result : OnePrincipleResult

    Returns
    -------
    DataFrame of str, one row per task.
    """
    import pandas as pd

    from ..book import table

    if not isinstance(result, OnePrincipleResult):
        raise TypeError(f"result must be a OnePrincipleResult, got {type(result).__name__}")
    rows = {}
    for name, run in result.runs.items():
        row: dict[str, float] = {f"τ = {tau:g}": mse for tau, mse in run.validation.items()}
        row["chosen τ"] = run.temperature
        row["zero predictor (mean f²)"] = result.zero_mse[name]
        rows[name] = row
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("validation MSE of the heads' average")
    shown = table(frame.drop(columns="chosen τ"), digits=4)  # close values: the curve over τ is flat
    shown.insert(len(shown.columns) - 1, "chosen τ", [f"{tau:g}" for tau in frame["chosen τ"]])
    return shown


def format_floor_table(floor: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The floor's table: member noise variance, noise and total ρ, the average's noise part, its b → ∞ limit.

    Parameters
    ----------
    floor : DataFrame
        :attr:`SharedDataFloor.table`.
    summary : DataFrame
        :func:`law_summary` (for ρ of batch B, the total correlation).

    Returns
    -------
    DataFrame of str, indexed like ``floor``.
    """
    import pandas as pd

    from ..book import table

    frame = pd.DataFrame(
        {
            "member noise variance σ²‖wᵇ‖²": floor.member,
            "ρ noise part": floor.rho_noise,
            "ρ total (batch B)": summary.rho_b.reindex(floor.index),
            "noise part of the average σ²‖w̄‖²": floor.floor,
            "mean noise covariance (b → ∞)": floor.floor_inf,
            "min over points of n‖w̄‖²": floor.n_floor_min,
        },
        index=floor.index,
    )
    return table(frame)


# --- argument checks ------------------------------------------------------------------------


def _require_config(config: object) -> OnePrincipleConfig:
    if not isinstance(config, OnePrincipleConfig):
        raise TypeError(f"config must be a OnePrincipleConfig, got {type(config).__name__}")
    return config


def _require_design(design: object, config: OnePrincipleConfig) -> tuple[Tensor, Tensor]:
    if not isinstance(design, Design):
        raise TypeError(f"design must be a Design (from make_design), got {type(design).__name__}")
    z = require_tensor(design.eval_points, "design.eval_points")
    w = require_tensor(design.projections, "design.projections")
    expected = (config.max_members, config.embed_dim, config.subset_dim)
    if z.shape != (config.m, config.embed_dim) or tuple(w.shape) != expected:
        raise ValueError(
            f"design must match config: eval_points ({config.m}, {config.embed_dim}) and projections {expected}, "
            f"got {tuple(z.shape)} and {tuple(w.shape)}"
        )
    return z, w


def _require_runs(runs: object) -> dict[str, TaskRun]:
    if not isinstance(runs, Mapping) or not runs or not all(isinstance(r, TaskRun) for r in runs.values()):
        raise TypeError("runs must be a non-empty mapping of task names to TaskRun (from run_ensembles)")
    return dict(runs)
