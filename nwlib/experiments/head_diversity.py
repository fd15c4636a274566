r"""The Head Diversity Index (Theorem 4.2): head families, their Monte Carlo runs and the chapter's contrasts.

Serves chapter 3, *The Head Diversity Index* (``book/ch03_head_diversity.md``), claims C5 (the index
built from cross-Gram matrices), C6 (Theorem 4.2: the integrated MSE does not increase with the HDI)
and C7 (Theorem 5.1: the MSE is smallest for orthogonal key subspaces), computed in
``notebooks/ch03_head_diversity.ipynb``.

What is here:

* **geometry**: pairs of subspaces with prescribed principal angles and the accuracy of the angles
  (:func:`pair_with_angles`, :func:`angle_accuracy`), Xavier-initialised key heads
  (:func:`xavier_key_heads`), the expected HDI of random subspaces as a sweep of independent grid
  points (:func:`random_hdi_point`, :func:`random_hdi_check`) and the signal mass of random pairwise
  orthogonal families (:func:`orthogonal_signal_mass`);
* **closed forms** of the ``single_index`` task :math:`g(t) = \sin 2t + t/2`: what a head that sees
  the share :math:`c^2` of the signal direction can learn (:func:`head_signal_variance`,
  :func:`additive_residual`) and the first-order noise covariance term (:func:`first_order_noise_cov`);
* **the Monte Carlo machinery**: a :class:`Design` (task, evaluation points, fitting batch, fresh
  points), :func:`run_family` (uniform and least-squares output weights), :func:`evaluate` and
  :func:`ensemble_contributions` (per replicate and per point), and :func:`contrast`, a paired
  contrast whose standard error also covers the evaluation points and (for least-squares weights) a
  delete-a-group jackknife over the fitting batch; :func:`steps`, :func:`relative_change` and
  :func:`count_moves` build on it;
* **sweep points**: one family on a design drawn again from its seed (:func:`family_point`,
  :func:`family_points`, :func:`run_families`, :func:`design_spec`) and one random placement
  (:func:`placement_point`);
* **the studies**: paths of equiangular families (:func:`summarise_path`), the two-angle surface
  (:func:`two_angle_surface`), pairwise orthogonal families against their bounds
  (:func:`orthogonal_study`), the best-of-each-side contest on fresh data (:func:`best_family_contest`),
  and attention's own heads (:func:`attention_heads`);
* **tables for reading** in the book's one style (:func:`nwlib.book.table`): a path's terms ``± SE``
  (:func:`path_table`), the angles' accuracy (:func:`accuracy_table`) and the orthogonal families against
  their bounds (:func:`orthogonal_table`).

Common random numbers: every family of the chapter is simulated on the same training sets (one
generator seed), the same evaluation points and the same fitting batch, so that differences between
families are paired. The studies still run through :func:`nwlib.sweep.run_sweep`, on any executor:
a point names its design by sizes and seed (:func:`design_spec`) and draws it again where it runs, so
every family of a design sees the same draws and gives the numbers it gives in a serial loop, bit for
bit. The points are single families (:func:`family_point`, :func:`run_families`: the paths, the surface,
the orthogonal families, the contests), single placements (:func:`placement_point`) and the settings of
the random-subspace check (:func:`random_hdi_point`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jackknife import jackknife_se
from .._validation import (
    require_choice,
    require_dtype,
    require_generator,
    require_positive_finite,
    require_positive_int,
    require_real,
    require_tensor,
)
from ..angles import multiangle_heads, noise_covariance_factor, orthogonal_heads, signal_mass
from ..decomposition import decompose
from ..device import resolve_device
from ..evidence import Comparison, estimate, mean, significant, welch_df
from ..evidence import fp_tolerance as _fp_tolerance
from ..kernels import cosine_attention
from ..montecarlo import simulate
from ..subspaces import equiangular_heads, hdi, principal_angles, random_subspaces
from ..sweep import canonical_key, require_point, run_sweep
from ..tasks import RegressionTask, make_task
from ..weighting import least_squares_weights, replicate_mse

__all__ = [
    "paths_grid",
    "PATH_COLUMNS",
    "GROUPS",
    "QUANTITIES",
    "RIDGE",
    "TEMPERATURES",
    "AttentionHeads",
    "Contest",
    "first_least",
    "CosineHeads",
    "Design",
    "Evaluation",
    "FamilyRun",
    "OrthogonalStudy",
    "PathSummary",
    "Placements",
    "RandomHdiCheck",
    "SignalMass",
    "Surface",
    "additive_bound",
    "additive_residual",
    "accuracy_table",
    "angle_accuracy",
    "angle_grid",
    "attention_heads",
    "best_family_contest",
    "contrast",
    "cosine_heads",
    "cosine_predictions",
    "design_spec",
    "count_moves",
    "ensemble_contributions",
    "evaluate",
    "family_point",
    "family_points",
    "first_order_noise_cov",
    "head_signal_variance",
    "keep_signal_overlap",
    "keeps_signal",
    "make_design",
    "non_orthogonal_pool",
    "orthogonal_signal_mass",
    "orthogonal_study",
    "orthogonal_table",
    "pair_with_angles",
    "placement_point",
    "path_table",
    "random_hdi_check",
    "random_hdi_point",
    "random_placement_study",
    "random_rotation",
    "relative_change",
    "run_families",
    "run_family",
    "signal_splits",
    "steps",
    "summarise_path",
    "two_angle_surface",
    "wide_design",
    "xavier_key_heads",
    "zero_evaluation",
]

GROUPS = 10
"""Groups of the fitting batch's training sets in the delete-a-group jackknife of fitted weights."""

RIDGE = 1e-9
"""Ridge of the least-squares output weights (identical heads make the Gram matrix singular)."""

QUANTITIES: tuple[str, ...] = ("err", "cov", "bias", "spread")
"""The integrated quantities of an :class:`Evaluation`: squared error, covariance term, squared bias and
the spread of the ensemble (variance + covariance terms), so that ``err = bias + spread``."""

# Offsets of the chapter's generator seeds from the notebook's seed (kept from the notebook, so that a
# seed gives the numbers it always gave).
_SEED_EVAL_POINTS = 3  # the evaluation points
_SEED_MAIN = 4  # the main runs' training sets
_SEED_FIT = 5  # the fitting batch's training sets
_SEED_FIT_POINTS = 6  # the fitting points
_SEED_FIT_NOISE = 7  # the noise of the fitting responses
_SEED_FRESH_POINTS = 8  # the confirmatory runs' points
_SEED_FRESH = 9  # the confirmatory runs' training sets
_SHORT_NAMES = {"mse": "MSE", "cov": "covariance", "bias": "bias^2", "var": "variance"}
_F64 = torch.float64
_CPU = torch.device("cpu")


def _require_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return seed


# --- geometry ----------------------------------------------------------------------------------


def pair_with_angles(
    angles: Sequence[float], embed_dim: int, *, generator: torch.Generator, dtype: torch.dtype = _F64
) -> tuple[Tensor, Tensor]:
    r"""Two k-dimensional subspaces of :math:`\mathbb{R}^D` with prescribed principal angles, randomly placed.

    In coordinates, :math:`A = [e_1, \dots, e_k]` and column i of B is
    :math:`\cos t_i\, e_i + \sin t_i\, e_{k+i}`; both are rotated by one Haar orthogonal matrix and A is
    given a random (Gaussian) change of basis, so that neither range is aligned with the coordinates and
    A's columns are not orthonormal.

    Parameters
    ----------
    angles : sequence of float
        The k principal angles :math:`t_i`, in radians.
    embed_dim : int
        D >= 2k.
    generator : torch.Generator
        On the CPU; draws the rotation, then the change of basis.
    dtype : torch.dtype, default float64

    Returns
    -------
    (Tensor, Tensor), each of shape (D, k)
        Bases of the two subspaces.

    Raises
    ------
    TypeError, ValueError
        If ``angles`` is empty or not real, ``embed_dim`` < 2k, or ``generator`` is not a CPU generator.
    """
    if isinstance(angles, (str, bytes)) or not isinstance(angles, Sequence) or not angles:
        raise TypeError("angles must be a non-empty sequence of real numbers")
    values = [require_real(t, f"angles[{i}]") for i, t in enumerate(angles)]
    k = len(values)
    D = require_positive_int(embed_dim, "embed_dim")
    if D < 2 * k:
        raise ValueError(f"embed_dim must be >= 2 * len(angles) = {2 * k}, got {D}")
    require_generator(generator, _CPU)
    dtype = require_dtype(dtype)
    A = torch.zeros(D, k, dtype=dtype)
    B = torch.zeros(D, k, dtype=dtype)
    for i, t in enumerate(values):
        A[i, i] = 1.0
        B[i, i], B[k + i, i] = math.cos(t), math.sin(t)
    rotation = random_subspaces(1, D, D, generator=generator, dtype=dtype)[0]
    change_of_basis = torch.randn(k, k, generator=generator, dtype=dtype)
    return rotation @ A @ change_of_basis, rotation @ B


def angle_accuracy(
    tiny_angles: Sequence[float] = (1e-3, 1e-5, 1e-7, 1e-9),
    *,
    generator: torch.Generator,
    large_angle: float = 1.2,
    embed_dim: int = 6,
) -> Any:
    r"""Relative errors of a tiny principal angle by three methods, for pairs with one tiny and one large angle.

    For each tiny angle t a pair of 2-dimensional subspaces with angles (t, ``large_angle``)
    (:func:`pair_with_angles`) is measured with :func:`nwlib.principal_angles` (atan2 of sines and
    cosines), with ``arccos`` of the cosines of those angles (what the cosine alone can tell), and with
    ``scipy.linalg.subspace_angles``.

    Parameters
    ----------
    tiny_angles : sequence of float, default (1e-3, 1e-5, 1e-7, 1e-9)
    generator : torch.Generator
        CPU generator, consumed by one :func:`pair_with_angles` per tiny angle, in order.
    large_angle : float, default 1.2
    embed_dim : int, default 6

    Returns
    -------
    pandas.DataFrame
        Indexed by ``t``; columns ``principal_angles``, ``arccos``, ``scipy``: :math:`|\hat t - t|/t`.
    """
    import pandas as pd
    import scipy.linalg

    rows = []
    for t in tiny_angles:
        A, B = pair_with_angles((t, large_angle), embed_dim, generator=generator)
        ours = principal_angles(A, B)
        via_arccos = np.sort(torch.arccos(torch.cos(ours)).numpy())
        via_scipy = np.sort(scipy.linalg.subspace_angles(A.numpy(), B.numpy()))
        tiny = float(ours[0])
        rows.append(
            {
                "t": t,
                "principal_angles": abs(tiny - t) / t,
                "arccos": abs(float(via_arccos[0]) - t) / t,
                "scipy": abs(float(via_scipy[0]) - t) / t,
            }
        )
    return pd.DataFrame(rows).set_index("t")


def xavier_key_heads(
    embed_dim: int = 64, num_heads: int = 8, *, generator: torch.Generator, dtype: torch.dtype = _F64
) -> Tensor:
    r"""The key heads of a Xavier-initialised ``torch.nn.MultiheadAttention`` input projection.

    The (3E) × E input projection is drawn with ``torch.nn.init.xavier_uniform_`` (entries of variance
    2/(E + 3E) = 1/(2E)); its key rows are ``E:2E`` and head h uses rows ``h*dh:(h+1)*dh`` of them,
    dh = E/H.

    Parameters
    ----------
    embed_dim : int, default 64
        E, a multiple of ``num_heads``.
    num_heads : int, default 8
    generator : torch.Generator
        CPU generator of the draw (``MultiheadAttention`` after ``torch.manual_seed(s)`` draws the same
        weights as a generator seeded with s).
    dtype : torch.dtype, default float64

    Returns
    -------
    Tensor, shape (H, E, dh)
        :math:`W_K^h`, one (E × dh) block per head.
    """
    E = require_positive_int(embed_dim, "embed_dim")
    H = require_positive_int(num_heads, "num_heads")
    if E % H:
        raise ValueError(f"num_heads must divide embed_dim, got embed_dim={E}, num_heads={H}")
    require_generator(generator, _CPU)
    dh = E // H
    in_proj = torch.empty(3 * E, E, dtype=require_dtype(dtype))
    torch.nn.init.xavier_uniform_(in_proj, generator=generator)
    W_k = in_proj[E : 2 * E]
    return torch.stack([W_k[h * dh : (h + 1) * dh].T for h in range(H)])


_RANDOM_HDI_KEYS = ("embed_dim", "head_dim", "num_heads", "families")


def random_hdi_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One grid point of the random-subspace check: the mean HDI of random families against :math:`1 - d_k/D`.

    Draws ``families`` independent families of ``num_heads`` Haar-random ``head_dim``-dimensional
    subspaces of :math:`\mathbb{R}^D` (:func:`nwlib.random_subspaces`) and compares their mean invariant
    HDI with the law :math:`\E\,\mathrm{HDI} = 1 - d_k/D`.

    Parameters
    ----------
    point : Mapping
        ``embed_dim`` (D), ``head_dim`` (d_k <= D), ``num_heads`` (>= 2) and ``families`` (>= 2).
    seed : int
        Seeds the draw (from :func:`nwlib.sweep.point_seed`).
    device : str, default "cpu"
        ``"auto"`` picks the worker's accelerator. Float64 (float32 on MPS).

    Returns
    -------
    dict
        ``embed_dim``, ``head_dim``, ``mean`` (the mean HDI), ``law`` (:math:`(D - d_k)/D`), ``gap`` and
        ``se`` (the mean of HDI − law over the families and its standard error), ``df`` (families − 1)
        and ``device``.
    """
    require_point(point, _RANDOM_HDI_KEYS)
    D = require_positive_int(point["embed_dim"], "embed_dim")
    k = require_positive_int(point["head_dim"], "head_dim")
    H = require_positive_int(point["num_heads"], "num_heads", minimum=2)
    families = require_positive_int(point["families"], "families", minimum=2)
    if k > D:
        raise ValueError(f"head_dim must be <= embed_dim, got head_dim={k}, embed_dim={D}")
    seed = _require_seed(seed)
    dev = resolve_device(device)
    dtype = torch.float32 if dev.type == "mps" else _F64
    gen = torch.Generator(device=dev).manual_seed(seed)
    values = hdi(random_subspaces(H, k, D, generator=gen, batch_shape=(families,), dtype=dtype, device=dev))
    values = values.double().cpu()
    law = (D - k) / D
    gap = mean(values - law)
    return {
        "embed_dim": D,
        "head_dim": k,
        "mean": float(values.mean()),
        "law": law,
        "gap": gap.estimate,
        "se": gap.se,
        "df": gap.df,
        "device": str(dev),
    }


class RandomHdiCheck(NamedTuple):
    """The random-subspace check (:func:`random_hdi_check`)."""

    table: Any
    """pandas.DataFrame: D, d_k, mean HDI, SE, 1 - d_k/D, z; one row per (D, d_k)."""
    gaps: list[Comparison]
    """Mean HDI minus the law, with its standard error, per (D, d_k)."""
    device: str
    """Where the points ran."""


def random_hdi_check(
    dims: Sequence[Sequence[int]],
    *,
    num_heads: int,
    families: int,
    seed: int,
    executor: str = "serial",
    device: str = "cpu",
) -> RandomHdiCheck:
    r"""The expected HDI of random heads, :math:`1 - d_k/D`, checked by simulation at several (D, d_k).

    Each (D, d_k) is an independent grid point (:func:`random_hdi_point`), run by
    :func:`nwlib.sweep.run_sweep` on ``executor`` with per-point seeds from ``seed``.

    Parameters
    ----------
    dims : sequence of [D, d_k] pairs
    num_heads : int
        Heads per family (>= 2).
    families : int
        Families per pair (>= 2).
    seed : int
        The sweep's seed.
    executor : str, default "serial"
        See :func:`nwlib.sweep.open_executor`.
    device : str, default "cpu"

    Returns
    -------
    RandomHdiCheck
    """
    import pandas as pd

    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not dims:
        raise TypeError("dims must be a non-empty sequence of [embed_dim, head_dim] pairs")
    points = []
    for i, pair in enumerate(dims):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"dims[{i}] must be an [embed_dim, head_dim] pair, got {pair!r}")
        points.append({"embed_dim": pair[0], "head_dim": pair[1], "num_heads": num_heads, "families": families})
    results = run_sweep(
        random_hdi_point, points, seed=seed, executor=executor, device=device, progress=False, desc="random HDI"
    )
    gaps = [estimate(r["gap"], r["se"], r["df"]) for r in results]
    table = pd.DataFrame(
        [
            {
                "D": r["embed_dim"],
                "d_k": r["head_dim"],
                "mean HDI": r["mean"],
                "SE": g.se,
                "1 - d_k/D": r["law"],
                "z": g.z,
            }
            for r, g in zip(results, gaps, strict=True)
        ]
    )
    return RandomHdiCheck(table, gaps, results[0]["device"])


class SignalMass(NamedTuple):
    """Random pairwise orthogonal families and the signal they see (:func:`orthogonal_signal_mass`)."""

    heads: Tensor
    """Shape (N, H, D, d_k): orthonormal, pairwise orthogonal heads (blocks of one Haar frame)."""
    mass_sums: Tensor
    r"""Shape (N,): :math:`\sum_h \lVert P_h e_1\rVert^2` per family (at most 1, Bessel)."""


def orthogonal_signal_mass(
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    *,
    families: int,
    generator: torch.Generator,
    dtype: torch.dtype = _F64,
) -> SignalMass:
    r"""Random pairwise orthogonal families: the columns of Haar orthogonal matrices, split into heads.

    For each family the first :math:`H d_k` columns of a Haar-random orthogonal D × D matrix are cut into
    H heads of :math:`d_k` columns, and the signal shares :math:`c_h^2 = \lVert P_h e_1\rVert^2`
    (:func:`nwlib.signal_mass`) are summed. Their mean is :math:`H d_k / D`.

    Parameters
    ----------
    num_heads, head_dim, embed_dim : int
        H, d_k and D with :math:`H d_k \le D`.
    families : int
        N >= 1.
    generator : torch.Generator
        On the CPU.
    dtype : torch.dtype, default float64

    Returns
    -------
    SignalMass
    """
    H = require_positive_int(num_heads, "num_heads")
    k = require_positive_int(head_dim, "head_dim")
    D = require_positive_int(embed_dim, "embed_dim")
    N = require_positive_int(families, "families")
    if H * k > D:
        raise ValueError(f"num_heads * head_dim must be <= embed_dim, got {H} * {k} > {D}")
    frames = random_subspaces(1, D, D, generator=generator, batch_shape=(N,), dtype=dtype)[:, 0]
    heads = frames[..., : H * k].unflatten(-1, (H, k)).permute(0, 2, 1, 3)
    return SignalMass(heads, signal_mass(heads).sum(-1))


# --- closed forms of the single-index task ------------------------------------------------------


def head_signal_variance(c: float) -> float:
    r"""What a head that sees the share :math:`c^2` of :math:`e_1` can learn of :math:`g(t) = \sin 2t + t/2`.

    :math:`v(c) = \operatorname{Var} m(c\,t)` with :math:`m_c(s) = e^{-2(1-c^2)}\sin 2s + s/2`, the
    conditional mean of :math:`g(x_1)` given the head's projection :math:`c\,t` (t ~ N(0, 1)):

    .. math:: v(c) = c^2\Big(\frac14 + 2e^{-2}\Big) + e^{-4}\sinh(4c^2),

    and :math:`v(1) = \operatorname{Var} g(x_1)`. (The chapter derives it with sympy; this is the same
    expression, evaluated in the same order.)

    Parameters
    ----------
    c : float
        In [0, 1].

    Returns
    -------
    float

    Examples
    --------
    >>> head_signal_variance(0.0)
    0.0
    """
    c = require_real(c, "c", minimum=0.0, maximum=1.0)
    return c**2 * (1 / 4 + 2 * math.exp(-2)) + math.exp(-4) * math.sinh(4 * c**2)


def additive_bound(coefficients: Sequence[float], masses: Sequence[float]) -> float:
    r"""What no sum of functions of pairwise orthogonal heads can explain of :math:`g(x_1)`.

    For :math:`g = \sum_{k\ge1} a_k \mathrm{He}_k/\sqrt{k!}` (a constant term does not matter) and pairwise
    orthogonal heads with signal shares :math:`c_h^2` (``masses``), every
    :math:`F(x) = \sum_h \varphi_h(Q_h^\top x)` has
    :math:`\int (f - F)^2\,d\mu \ge \sum_k a_k^2 \big(1 - \sum_h c_h^{2k}\big)`, with equality for the best
    additive F (the chapter's proposition ``prop-orth-signal`` (b)). The bound is 0 exactly when some
    :math:`c_h = 1`, or when :math:`a_k = 0` for every k >= 2 and (:math:`a_1 = 0` or :math:`\sum_h c_h^2 = 1`).

    Parameters
    ----------
    coefficients : sequence of float
        :math:`a_1, a_2, \dots` (:math:`a_k` multiplies the normalised Hermite polynomial of degree k).
    masses : sequence of float
        :math:`c_h^2 \in [0, 1]` with :math:`\sum_h c_h^2 \le 1` (Bessel's inequality for orthogonal heads).

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        If a coefficient or mass is not real, a mass lies outside [0, 1], or the masses sum to more than 1.

    Examples
    --------
    >>> additive_bound([1.0], [0.5, 0.5])  # linear g, e_1 in the sum of the heads: nothing left
    0.0
    >>> round(additive_bound([1.0], [0.3, 0.3]), 12)  # linear g, e_1 partly outside: 1 - 0.6
    0.4
    >>> additive_bound([0.0, 1.0], [0.5, 0.5])  # He_2, e_1 in the sum but in no single head
    0.5
    """
    if isinstance(coefficients, (str, bytes)) or not isinstance(coefficients, Sequence) or not coefficients:
        raise TypeError("coefficients must be a non-empty sequence of real numbers")
    if isinstance(masses, (str, bytes)) or not isinstance(masses, Sequence) or not masses:
        raise TypeError("masses must be a non-empty sequence of real numbers")
    a = [require_real(x, f"coefficients[{i}]") for i, x in enumerate(coefficients)]
    c2 = [require_real(x, f"masses[{i}]", minimum=0.0, maximum=1.0) for i, x in enumerate(masses)]
    if sum(c2) > 1 + 1e-12:
        raise ValueError(f"masses must sum to at most 1 (Bessel), got {sum(c2)}")
    return float(sum(ak**2 * (1 - sum(m**k for m in c2)) for k, ak in enumerate(a, start=1)))


def keep_signal_overlap(head_dim: int, signal_dim: int) -> tuple[float, float]:
    r"""The refined optimum's overlap: heads that all keep s signal directions, the rest pairwise orthogonal.

    Then :math:`Q_h^\top Q_{h'}` has s unit and :math:`d_k - s` zero singular values for every pair, so the
    normalised cross-Gram term is :math:`\lVert Q_h^\top Q_{h'}\rVert_F^2/d_k = s/d_k` and the invariant
    HDI is :math:`(d_k - s)/d_k`.

    Parameters
    ----------
    head_dim : int
        d_k.
    signal_dim : int
        s, 0 <= s <= d_k.

    Returns
    -------
    (float, float)
        The normalised cross-Gram term and the HDI.

    Examples
    --------
    >>> keep_signal_overlap(64, 3)
    (0.046875, 0.953125)
    """
    k = require_positive_int(head_dim, "head_dim")
    if isinstance(signal_dim, bool) or not isinstance(signal_dim, int) or not 0 <= signal_dim <= k:
        raise ValueError(f"signal_dim must be an int in [0, head_dim={k}], got {signal_dim!r}")
    return signal_dim / k, (k - signal_dim) / k


def additive_residual(task: RegressionTask, key_projections: Tensor, points: Tensor, weight: float = 1.0) -> Tensor:
    r"""f minus ``weight`` times the sum of what each head can at best learn, at the given points.

    Head h sees :math:`Q_h^\top x`; of :math:`f(x) = g(x_1)` it can at best learn
    :math:`m_h = e^{-2(1 - c_h^2)}\sin(2 s_h) + s_h/2` with :math:`s_h = (P_h e_1)^\top x` and
    :math:`c_h^2 = \lVert P_h e_1\rVert^2`. For pairwise orthogonal heads :math:`\sum_h m_h` is the best
    additive function of the heads (weight 1) and :math:`\frac1H\sum_h m_h` the uniform average of their
    limits (weight 1/H).

    Parameters
    ----------
    task : RegressionTask
        The ``single_index`` task.
    key_projections : Tensor, shape (H, D, d_k)
        Orthonormal columns.
    points : Tensor, shape (m, D)
    weight : float, default 1.0

    Returns
    -------
    Tensor, shape (m,)
        Float64 on the CPU.
    """
    if not isinstance(task, RegressionTask) or task.name != "single_index":
        raise ValueError("task must be the single_index task (make_task('single_index', D))")
    Q = require_tensor(key_projections, "key_projections", min_dim=3).double().cpu()
    x = require_tensor(points, "points", min_dim=2).double().cpu()
    if Q.dim() != 3 or Q.shape[1] != x.shape[1]:
        raise ValueError(f"key_projections must have shape (H, D, d_k) with D = {x.shape[1]}, got {tuple(Q.shape)}")
    weight = require_real(weight, "weight")
    signal_part = (Q @ Q.mT)[:, :, 0] @ x.T  # (H, m): (P_h e_1)^T x = c_h t_h
    mass = signal_mass(Q)[:, None]
    best = (torch.exp(-2 * (1 - mass)) * torch.sin(2 * signal_part) + signal_part / 2).sum(0)
    return task.f(x) - weight * best


def first_order_noise_cov(
    angles: Sequence[float], *, num_heads: int, noise_sd: float, n_train: int, bandwidth: float
) -> float:
    r"""The first-order noise part of the uniform ensemble's covariance term for heads that keep :math:`e_1`.

    Every pair of heads has a zero angle (the shared signal direction) and ``angles``; the pair's noise
    covariance is :math:`\sigma^2/n \cdot \prod_j \phi_\beta(\theta_j)` (:func:`nwlib.noise_covariance_factor`)
    and the covariance term of weights 1/H is (H − 1)/H times it.

    Parameters
    ----------
    angles : sequence of float
        The pair's principal angles besides the shared zero one.
    num_heads : int
    noise_sd : float
        σ.
    n_train : int
    bandwidth : float
        The heads' Gaussian bandwidth (in design units).

    Returns
    -------
    float
    """
    H = require_positive_int(num_heads, "num_heads")
    sigma = require_real(noise_sd, "noise_sd", minimum=0.0)
    n = require_positive_int(n_train, "n_train")
    b = require_positive_finite(bandwidth, "bandwidth")
    nc = noise_covariance_factor(torch.tensor([0.0, *angles], dtype=_F64), b)
    return (H - 1) / H * sigma**2 / n * float(nc)


# --- the Monte Carlo machinery ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Evaluation:
    """One weighting of one family's Monte Carlo run (:func:`evaluate`).

    Attributes
    ----------
    row : dict of str to float
        ``MSE``, ``bias^2``, ``variance``, ``covariance`` (integrated, :func:`nwlib.decompose`), their
        SEs over the training sets (``"MSE SE"`` and so on) and ``mean corr``.
    se : dict of str to float
        Standard errors over the training sets *and* the evaluation points (and, for fitted weights, the
        fitting batch): how far a rerun with another seed may move a level. For fitted weights only
        ``MSE`` and ``covariance``.
    per_replicate : dict of str to Tensor
        Each of :data:`QUANTITIES` per replicate (averaged over the points), shape (R,), float64 CPU.
    per_point : dict of str to Tensor
        Each of :data:`QUANTITIES` per point (averaged over the replicates), shape (m,), float64 CPU.
    leave_out : dict of str to Tensor
        For fitted weights: ``err`` and ``cov`` with the weights refitted without each of the
        :data:`GROUPS` groups of the fitting batch, shape (G,); empty for fixed weights.
    dtype : torch.dtype
        Of the simulation.
    condition : float
        Condition number of the fitted weights' Gram matrix (1 for fixed weights).
    """

    row: dict[str, float]
    se: dict[str, float]
    per_replicate: dict[str, Tensor] = field(repr=False)
    per_point: dict[str, Tensor] = field(repr=False)
    leave_out: dict[str, Tensor] = field(repr=False)
    dtype: torch.dtype = torch.float32
    condition: float = 1.0

    def level(self, column: str = "MSE") -> Comparison:
        """A level (``MSE``, ``covariance``, ...) with its standard error over everything a seed draws."""
        return estimate(self.row[column], self.se[column])

    def levels(self) -> dict[str, Comparison]:
        """The levels with a standard error, by short name: ``mse``, ``cov`` and (fixed weights) ``bias``, ``var``."""
        return {short: self.level(column) for short, column in _SHORT_NAMES.items() if column in self.se}

    def values(self) -> dict[str, float]:
        """``mse``, ``cov``, ``bias`` and ``var``: the integrated terms, by short name."""
        return {short: self.row[column] for short, column in _SHORT_NAMES.items()}

    def tolerance(self) -> float:
        """Rounding tolerance of a level that is deterministic given the seed (the simulation's dtype,
        the scale of the MSE, the condition of the fitted weights)."""
        return _fp_tolerance(self.dtype, scale=self.row["MSE"], condition=self.condition)


@dataclass(frozen=True, eq=False)
class FamilyRun:
    """One family of heads simulated with uniform weights and, if fitted, least-squares output weights.

    ``run["uniform"]`` and ``run["ls"]`` are the :class:`Evaluation` of each weighting; ``"ls" in run``
    says whether the weights were fitted.
    """

    hdi: float
    """The invariant HDI of the key ranges."""
    uniform: Evaluation
    ls: Evaluation | None = None
    weights: Tensor | None = field(default=None, repr=False)
    """The fitted output weights, shape (H,), float64 CPU."""
    temperature: dict[str, float] = field(default_factory=dict)
    """For :class:`CosineHeads`: the temperature each weighting chose on the fitting batch."""

    def __getitem__(self, key: str) -> Evaluation:
        part = {"uniform": self.uniform, "ls": self.ls}.get(key)
        if part is None:
            raise KeyError(key)
        return part

    def __contains__(self, key: object) -> bool:
        return key == "uniform" or (key == "ls" and self.ls is not None)


@dataclass(frozen=True, eq=False)
class AttentionHeads:
    r"""Attention's own heads for given key ranges (:func:`attention_heads`).

    Keys :math:`W_K^h = c_h Q_h`, queries :math:`W_Q^h = W_K^h R_h`, values
    :math:`v_{hi} = \langle w_{V,h}, (x_i, y_i)\rangle`, the exponential kernel.
    """

    key_scales: Tensor
    """:math:`c_h`, shape (H,), float64."""
    rotations: Tensor
    """:math:`R_h`, shape (H, d_k, d_k), float64, orthogonal."""
    value_projections: Tensor
    """:math:`w_{V,h}`, shape (H, D + 1), float64."""

    def projections(
        self, key_ranges: Tensor, *, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, dict[str, Any]]:
        """Key projections and the keyword arguments of :func:`nwlib.simulate` for heads on ``key_ranges``."""
        Q = require_tensor(key_ranges, "key_ranges", min_dim=3)
        if Q.shape[0] != self.key_scales.shape[0] or Q.shape[-1] != self.rotations.shape[-1]:
            raise ValueError(
                f"key_ranges must have shape (H, D, d_k) = ({self.key_scales.shape[0]}, D, "
                f"{self.rotations.shape[-1]}), got {tuple(Q.shape)}"
            )
        W_K = self.key_scales.to(Q.device)[:, None, None] * Q.double()
        extra = {
            "kernel": "exp",
            "query_projections": (W_K @ self.rotations.to(Q.device)).to(dtype=dtype, device=device),
            "value_projections": self.value_projections.to(dtype=dtype, device=device),
        }
        return W_K.to(dtype=dtype, device=device), extra


def random_rotation(k: int, angle: float, generator: torch.Generator) -> Tensor:
    r"""A rotation of :math:`\mathbb{R}^k` by ``angle`` t about a random axis: :math:`\exp(t S/\lVert S\rVert_2)`.

    S is a random skew-symmetric matrix (Gaussian entries, antisymmetrised); for k = 3 the result turns
    by exactly ``angle`` about the axis of S.

    Parameters
    ----------
    k : int
    angle : float
        Radians.
    generator : torch.Generator
        On the CPU.

    Returns
    -------
    Tensor, shape (k, k), float64
    """
    k = require_positive_int(k, "k", minimum=2)
    angle = require_real(angle, "angle")
    require_generator(generator, _CPU)
    skew = torch.randn(k, k, generator=generator, dtype=_F64)
    skew = skew - skew.T
    return torch.linalg.matrix_exp(angle * skew / torch.linalg.matrix_norm(skew, ord=2))


def attention_heads(
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    *,
    generator: torch.Generator,
    rotation_angle: float = math.pi / 8,
    key_scales: tuple[float, float] = (0.8, 1.2),
) -> AttentionHeads:
    r"""The chapter's heads of multi-head attention (our choices, fixed before the run).

    Key scales :math:`c_h` evenly from ``key_scales[0]`` to ``key_scales[1]``; per head a query rotation
    :math:`R_h` by ``rotation_angle`` about a random axis (:func:`random_rotation`); values
    :math:`\gamma_h y_i + \delta_h^\top x_i` with :math:`\gamma_h` uniform on [0.5, 1.5] and a small leak
    :math:`\delta_h \sim N(0, 0.01 I_D / D)`. The generator draws the rotations, then the γ, then the δ.

    Parameters
    ----------
    num_heads, head_dim, embed_dim : int
    generator : torch.Generator
        On the CPU.
    rotation_angle : float, default π/8
    key_scales : (float, float), default (0.8, 1.2)

    Returns
    -------
    AttentionHeads
    """
    H = require_positive_int(num_heads, "num_heads")
    k = require_positive_int(head_dim, "head_dim", minimum=2)
    D = require_positive_int(embed_dim, "embed_dim")
    require_generator(generator, _CPU)
    low, high = (require_positive_finite(s, "key_scales") for s in key_scales)
    scales = torch.linspace(low, high, H, dtype=_F64)
    rotations = torch.stack([random_rotation(k, rotation_angle, generator) for _ in range(H)])
    values = torch.zeros(H, D + 1, dtype=_F64)
    values[:, -1] = 0.5 + torch.rand(H, generator=generator, dtype=_F64)
    values[:, :-1] = 0.1 / math.sqrt(D) * torch.randn(H, D, generator=generator, dtype=_F64)
    return AttentionHeads(scales, rotations, values)


TEMPERATURES: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""The temperatures τ that QK-normalised heads choose from on the fitting batch (bandwidths √τ from 0.14 to 1.4
radians on the sphere of directions): from a few neighbours to almost a global average."""

_COSINE_CHUNK = 16  # replicates drawn and processed at a time (fixed: the data do not depend on memory)


@dataclass(frozen=True, eq=False)
class CosineHeads:
    r"""Heads of QK-normalised attention on LayerNorm'd tokens (:func:`cosine_heads`).

    Tokens :math:`\tilde x = \mathrm{LayerNorm}(x)` (no affine part); head h has keys
    :math:`k_i = Q_h^\top\tilde x_i`, queries :math:`q = R_h^\top Q_h^\top\tilde z` (so
    :math:`W_Q^h = W_K^h R_h \ne W_K^h`, the same range), values
    :math:`v_{hi} = \gamma_h y_i + \delta_h^\top\tilde x_i` and weights
    :math:`\mathrm{softmax}(\langle\hat q, \hat k_i\rangle/\tau_h)` (:func:`nwlib.cosine_attention`), with the
    temperature chosen from :attr:`temperatures` on the fitting batch, never on the points a finding is
    checked on.
    """

    rotations: Tensor
    """:math:`R_h`, shape (H, d_k, d_k), float64, orthogonal."""
    value_projections: Tensor
    r""":math:`(\delta_h, \gamma_h)`, shape (H, D + 1), float64."""
    temperatures: tuple[float, ...] = TEMPERATURES
    """The candidate temperatures."""
    homogeneous: bool = False
    """Whether every head is the same estimator in its own coordinates (one R, γ = 1, δ = 0)."""


def cosine_heads(
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    *,
    generator: torch.Generator,
    rotation_angle: float = math.pi / 16,
    homogeneous: bool = False,
    temperatures: Sequence[float] = TEMPERATURES,
) -> CosineHeads:
    r"""The chapter's QK-normalised attention heads (our choices, fixed before the run).

    Heterogeneous (default): per head a query rotation :math:`R_h` by ``rotation_angle`` about a random axis
    (:func:`random_rotation`), values :math:`\gamma_h y + \delta_h^\top\tilde x` with :math:`\gamma_h`
    uniform on [0.5, 1.5] and :math:`\delta_h \sim N(0, 0.01 I_D/D)`; the generator draws the rotations, then
    the γ, then the δ (as :func:`attention_heads`). Homogeneous: one rotation for all heads, :math:`\gamma = 1`,
    :math:`\delta = 0`, so that along the chapter's coordinate-block paths every head is the same estimator
    in its own coordinates (a permutation of coordinates maps one head onto another and commutes with
    LayerNorm).

    Parameters
    ----------
    num_heads, head_dim, embed_dim : int
    generator : torch.Generator
        On the CPU.
    rotation_angle : float, default π/16
    homogeneous : bool, default False
    temperatures : sequence of float, default :data:`TEMPERATURES`

    Returns
    -------
    CosineHeads
    """
    H = require_positive_int(num_heads, "num_heads")
    k = require_positive_int(head_dim, "head_dim", minimum=2)
    D = require_positive_int(embed_dim, "embed_dim")
    require_generator(generator, _CPU)
    if not isinstance(homogeneous, bool):
        raise TypeError(f"homogeneous must be a bool, got {type(homogeneous).__name__}")
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Sequence) or not temperatures:
        raise TypeError("temperatures must be a non-empty sequence of positive numbers")
    taus = tuple(require_positive_finite(t, "temperatures") for t in temperatures)
    values = torch.zeros(H, D + 1, dtype=_F64)
    if homogeneous:
        rotations = random_rotation(k, rotation_angle, generator).expand(H, k, k).clone()
        values[:, -1] = 1.0
    else:
        rotations = torch.stack([random_rotation(k, rotation_angle, generator) for _ in range(H)])
        values[:, -1] = 0.5 + torch.rand(H, generator=generator, dtype=_F64)
        values[:, :-1] = 0.1 / math.sqrt(D) * torch.randn(H, D, generator=generator, dtype=_F64)
    return CosineHeads(rotations, values, taus, homogeneous)


def cosine_predictions(
    task: RegressionTask,
    key_ranges: Tensor,
    heads: CosineHeads,
    points: Tensor,
    *,
    n: int,
    replicates: int,
    generator: torch.Generator,
    temperatures: Sequence[float],
) -> Tensor:
    r"""Predictions of QK-normalised attention heads on LayerNorm'd tokens over R training sets, per temperature.

    Replicates are drawn in chunks of 16 (``task.sample``, inputs then noise, float64 then cast), so the data
    depend only on the generator. For training set r, head h and temperature τ the prediction at point z is
    :func:`nwlib.cosine_attention` with queries :math:`R_h^\top Q_h^\top\tilde z`, keys
    :math:`Q_h^\top\tilde x_i` and values :math:`\gamma_h y_i + \delta_h^\top\tilde x_i`,
    :math:`\tilde x = \mathrm{LayerNorm}(x)` (``torch.nn.functional.layer_norm(x, (D,))``).

    Parameters
    ----------
    task : RegressionTask
    key_ranges : Tensor, shape (H, D, d_k)
        Orthonormal bases of the key ranges; dtype and device of the simulation.
    heads : CosineHeads
    points : Tensor, shape (m, D)
    n, replicates : int
    generator : torch.Generator
        On the device of ``points``.
    temperatures : sequence of float
        τ > 0, one slice of the result each.

    Returns
    -------
    Tensor, shape (T, R, H, m)
    """
    if not isinstance(heads, CosineHeads):
        raise TypeError(f"heads must be CosineHeads (cosine_heads), got {type(heads).__name__}")
    Q = require_tensor(key_ranges, "key_ranges", min_dim=3)
    z = require_tensor(points, "points", min_dim=2)
    H, D, k = Q.shape
    if heads.rotations.shape != (H, k, k) or z.shape[-1] != D or task.embed_dim != D:
        raise ValueError(
            f"key_ranges (H, D, d_k) = {tuple(Q.shape)} must match the heads' rotations "
            f"{tuple(heads.rotations.shape)}, the points' D = {z.shape[-1]} and the task's D = {task.embed_dim}"
        )
    n = require_positive_int(n, "n")
    R = require_positive_int(replicates, "replicates")
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Sequence) or not temperatures:
        raise TypeError("temperatures must be a non-empty sequence of positive numbers")
    taus = [require_positive_finite(t, "temperatures") for t in temperatures]
    dtype, dev = z.dtype, z.device
    W_q = Q @ heads.rotations.to(dtype=dtype, device=dev)
    w_v = heads.value_projections.to(dtype=dtype, device=dev)
    queries = torch.nn.functional.layer_norm(z, (D,)) @ W_q  # (H, m, d_k)
    out = torch.empty(len(taus), R, H, z.shape[0], dtype=dtype, device=dev)
    with torch.no_grad():
        for start in range(0, R, _COSINE_CHUNK):
            stop = min(start + _COSINE_CHUNK, R)
            x, y = task.sample((stop - start,), n, generator=generator, dtype=dtype, device=dev)
            xt = torch.nn.functional.layer_norm(x, (D,))
            keys = torch.einsum("rnd,hdk->rhnk", xt, Q)
            values = w_v[None, :, -1, None] * y[:, None, :] + torch.einsum("rnd,hd->rhn", xt, w_v[:, :-1])
            for t, tau in enumerate(taus):
                out[t, start:stop] = cosine_attention(queries, keys, values, temperature=tau)
    return out


def zero_evaluation(target: Tensor, replicates: int) -> Evaluation:
    r"""The zero predictor as an :class:`Evaluation` on the same points, for :func:`contrast`.

    Its squared error at point j is :math:`f(z_j)^2` in every replicate (its integrated MSE is
    :math:`\int f^2 d\mu` on the points), with no covariance and no spread, so that
    ``contrast((1, zero, "err"), (-1, part, "err"))`` is how much of it an estimator removes, with the
    standard error over the training sets and the points.

    Parameters
    ----------
    target : Tensor, shape (m,)
        f at the points.
    replicates : int
        R of the runs it is compared with.

    Returns
    -------
    Evaluation
    """
    f = require_tensor(target, "target", min_dim=1).double().cpu()
    R = require_positive_int(replicates, "replicates", minimum=2)
    if f.dim() != 1 or f.numel() < 2:
        raise ValueError(f"target must have shape (m,) with m >= 2, got {tuple(f.shape)}")
    sq = f**2
    level = float(sq.mean())
    se = float(sq.std()) / math.sqrt(f.numel())
    zeros_r, zeros_m = torch.zeros(R, dtype=_F64), torch.zeros_like(sq)
    row = {"MSE": level, "MSE SE": 0.0, "bias^2": level, "bias^2 SE": 0.0, "variance": 0.0}
    row |= {"variance SE": 0.0, "covariance": 0.0, "covariance SE": 0.0, "mean corr": float("nan")}
    per_replicate = {
        "err": torch.full((R,), level, dtype=_F64),
        "cov": zeros_r,
        "bias": torch.full((R,), level, dtype=_F64),
        "spread": zeros_r,
    }
    per_point = {"err": sq, "cov": zeros_m, "bias": sq, "spread": zeros_m}
    return Evaluation(row, {"MSE": se, "bias^2": se}, per_replicate, per_point, {}, target.dtype)


@dataclass(frozen=True, eq=False)
class Design:
    """The chapter's regression task and its fixed draws (:func:`make_design`).

    Attributes
    ----------
    task : RegressionTask
        ``single_index``: :math:`y = \\sin 2x_1 + x_1/2 + \\sigma\\varepsilon`, x ~ N(0, I_D).
    num_heads, head_dim, n_train, replicates, replicates_fit, replicates_confirm, seed : int
    eval_points : Tensor, shape (m, D)
        Where every family is scored (seed + 3).
    fit_points : Tensor, shape (m, D)
        Where the output weights are fitted (seed + 6).
    fit_responses : Tensor, shape (replicates_fit, m)
        Noisy responses there (seed + 7).
    fresh_points : Tensor, shape (m, D)
        The confirmatory runs' points (seed + 8), used for nothing else.
    """

    task: RegressionTask
    num_heads: int
    head_dim: int
    n_train: int
    replicates: int
    replicates_fit: int
    replicates_confirm: int
    seed: int
    eval_points: Tensor = field(repr=False)
    fit_points: Tensor = field(repr=False)
    fit_responses: Tensor = field(repr=False)
    fresh_points: Tensor = field(repr=False)

    @property
    def embed_dim(self) -> int:
        return self.task.embed_dim

    @property
    def n_eval(self) -> int:
        return self.eval_points.shape[0]

    @property
    def device(self) -> torch.device:
        return self.eval_points.device

    @property
    def dtype(self) -> torch.dtype:
        return self.eval_points.dtype

    def path_heads(self, theta: float, shared_dim: int) -> Tensor:
        """The family of :func:`nwlib.equiangular_heads` at angle ``theta`` with ``shared_dim`` shared directions."""
        return equiangular_heads(
            theta,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            embed_dim=self.embed_dim,
            shared_dim=shared_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def two_angle_heads(self, angles: Sequence[float]) -> Tensor:
        """Heads that keep e_1 and make the given angles with each other (:func:`nwlib.multiangle_heads`)."""
        return multiangle_heads(
            list(angles),
            num_heads=self.num_heads,
            embed_dim=self.embed_dim,
            shared_dim=1,
            dtype=self.dtype,
            device=self.device,
        )

    def orthogonal_heads(self, masses: Sequence[float]) -> Tensor:
        """Pairwise orthogonal heads with signal shares ``masses`` (:func:`nwlib.orthogonal_heads`)."""
        return orthogonal_heads(
            list(masses), head_dim=self.head_dim, embed_dim=self.embed_dim, dtype=self.dtype, device=self.device
        )


def make_design(
    *,
    embed_dim: int,
    num_heads: int,
    head_dim: int,
    noise_sd: float,
    n_train: int,
    n_eval: int,
    replicates: int,
    replicates_fit: int,
    replicates_confirm: int,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Design:
    """The task and the fixed draws of the chapter's Monte Carlo study.

    Parameters
    ----------
    embed_dim, num_heads, head_dim : int
        D, H, d_k.
    noise_sd : float
        σ of the responses.
    n_train : int
        Training-set size.
    n_eval : int
        m, the number of evaluation (and fitting, and fresh) points.
    replicates : int
        Training sets of the main runs (>= 3).
    replicates_fit : int
        Training sets of the fitting batch, a multiple of :data:`GROUPS`.
    replicates_confirm : int
        Training sets of the confirmatory runs on fresh data (>= 3).
    seed : int
        The notebook's seed; the draws use seed + 3 (evaluation points), + 6 (fitting points), + 7 (their
        noise) and + 8 (fresh points), and :func:`run_family` seed + 4, + 5 and + 9.
    device : torch.device or str, default "cpu"
        ``"auto"`` picks an accelerator (:func:`nwlib.resolve_device`).
    dtype : torch.dtype, default float32
        Of the simulation.

    Returns
    -------
    Design
    """
    D = require_positive_int(embed_dim, "embed_dim")
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    k = require_positive_int(head_dim, "head_dim")
    n = require_positive_int(n_train, "n_train")
    m = require_positive_int(n_eval, "n_eval", minimum=2)
    reps = require_positive_int(replicates, "replicates", minimum=3)
    reps_fit = require_positive_int(replicates_fit, "replicates_fit", minimum=GROUPS)
    if reps_fit % GROUPS:
        raise ValueError(f"replicates_fit must be a multiple of {GROUPS} (the jackknife's groups), got {reps_fit}")
    reps_confirm = require_positive_int(replicates_confirm, "replicates_confirm", minimum=3)
    seed = _require_seed(seed)
    dev = resolve_device(device)
    dtype = require_dtype(dtype)
    task = make_task("single_index", D, noise_sd=noise_sd)

    def draw(offset: int) -> Tensor:
        g = torch.Generator(device=dev).manual_seed(seed + offset)
        return torch.randn(m, D, generator=g, device=dev, dtype=dtype)

    eval_points = draw(_SEED_EVAL_POINTS)
    fit_points = draw(_SEED_FIT_POINTS)
    g_noise = torch.Generator(device=dev).manual_seed(seed + _SEED_FIT_NOISE)
    noise = torch.randn(reps_fit, m, generator=g_noise, device=dev, dtype=dtype)
    fit_responses = task.f(fit_points) + task.noise_sd * noise
    fresh_points = draw(_SEED_FRESH_POINTS)
    return Design(
        task, H, k, n, reps, reps_fit, reps_confirm, seed, eval_points, fit_points, fit_responses, fresh_points
    )


def wide_design(head_dim: int, *, num_heads: int, **sizes: Any) -> Design:
    """A :func:`make_design` for path (i) with wider heads: the smallest D that :func:`nwlib.equiangular_heads` allows.

    Path (i) keeps one shared direction and turns :math:`d_k - 1` others apart, which needs
    :math:`D = 1 + (H + 1)(d_k - 1)` coordinates (36 for d_k = 8 and H = 4, 76 for d_k = 16).

    Parameters
    ----------
    head_dim : int
        d_k >= 2.
    num_heads : int
    **sizes
        The other keyword arguments of :func:`make_design` (not ``embed_dim``).

    Returns
    -------
    Design
    """
    k = require_positive_int(head_dim, "head_dim", minimum=2)
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    if "embed_dim" in sizes:
        raise TypeError("wide_design chooses embed_dim itself; do not pass it")
    return make_design(embed_dim=1 + (H + 1) * (k - 1), num_heads=H, head_dim=k, **sizes)


class Placements(NamedTuple):
    """Random placements of one path of families (:func:`random_placement_study`)."""

    mse: Tensor
    """Shape (N, T): the integrated MSE (weights 1/H) of placement j at angle t, float64."""
    hdi: list[float]
    """The HDI at each angle (a rotation of all heads together does not change it)."""


def random_placement_study(
    thetas: Sequence[float],
    *,
    placements: int,
    shared_dim: int = 0,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    executor: str | cf.Executor = "serial",
    **sizes: Any,
) -> Placements:
    r"""The MSE along a path of families in expectation over where the family sits: one Haar rotation per draw.

    Placement j draws a Haar-random orthogonal O of :math:`\mathbb{R}^D` and a design of its own (training sets,
    evaluation and fitting points: :func:`make_design` with seed ``seed + 100 + 10 j``), and runs the families
    :math:`O Q_h(\theta)` of :meth:`Design.path_heads` at every angle on it (Gaussian surrogate, weights 1/H). A
    rotation of all heads together keeps every principal angle, hence the HDI, but moves the signal direction
    relative to the heads, so the N placements are independent draws of (placement, training sets, points) and
    their spread is the standard error of the expected MSE at a given HDI. Each placement is one point of a
    sweep (:func:`placement_point`) run by :func:`nwlib.sweep.run_sweep` on ``executor``; its draws come from its
    own seed, so the numbers do not depend on where it runs.

    Parameters
    ----------
    thetas : sequence of float
        The angles of the path.
    placements : int
        N >= 2.
    shared_dim : int, default 0
        As :meth:`Design.path_heads`.
    seed : int
    device, dtype
        Of the simulation.
    executor : str or concurrent.futures.Executor, default "serial"
        See :func:`nwlib.sweep.open_executor`.
    **sizes
        The other keyword arguments of :func:`make_design`.

    Returns
    -------
    Placements
    """
    N = require_positive_int(placements, "placements", minimum=2)
    seed = _require_seed(seed)
    if isinstance(thetas, (str, bytes)) or not isinstance(thetas, Sequence) or not thetas:
        raise TypeError("thetas must be a non-empty sequence of angles")
    angles = [require_real(t, f"thetas[{i}]") for i, t in enumerate(thetas)]
    if isinstance(shared_dim, bool) or not isinstance(shared_dim, int) or shared_dim < 0:
        raise ValueError(f"shared_dim must be an int >= 0, got {shared_dim!r}")
    first = make_design(**sizes, seed=seed + 100, device=device, dtype=dtype)  # checks the sizes here
    spec = design_spec(first)
    points = [
        {"design": spec | {"seed": seed + 100 + 10 * j}, "thetas": angles, "shared_dim": shared_dim} for j in range(N)
    ]
    results = run_sweep(
        placement_point,
        points,
        seed=seed,
        executor=executor,
        device=str(first.device),
        progress=False,
        desc="random placements",
    )
    mse = torch.tensor([r["mse"] for r in results], dtype=_F64)
    return Placements(mse, results[0]["hdi"])


def ensemble_contributions(predictions: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    r"""Per replicate, the covariance term and the spread of a weighted ensemble, averaged over the points.

    With :math:`d_{rh} = \hat f_h^{(r)} - \bar f_h` the centred head predictions, replicate r contributes
    :math:`\frac{R}{R-1}\sum_{h \ne h'}\alpha_h\alpha_{h'} d_{rh}d_{rh'}` to the covariance term and
    :math:`\frac{R}{R-1}(\sum_h \alpha_h d_{rh})^2` to the spread (variance + covariance terms); their
    means over the replicates are :func:`nwlib.decompose`'s covariance term and its variance + covariance,
    integrated over the points.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        R >= 2.
    weights : Tensor, shape (H,)

    Returns
    -------
    (Tensor, Tensor), each of shape (R,)
        The covariance and spread contributions, float64 on the CPU.
    """
    pred = require_tensor(predictions, "predictions", min_dim=3)
    w = require_tensor(weights, "weights", min_dim=1)
    if pred.dim() != 3 or pred.shape[0] < 2 or w.shape != pred.shape[1:2]:
        raise ValueError(
            f"predictions must have shape (R, H, m) with R >= 2 and weights shape (H,), got {tuple(pred.shape)} "
            f"and {tuple(w.shape)}"
        )
    d = pred - pred.mean(0)
    ens = torch.einsum("h,rhm->rm", w, d)
    own = torch.einsum("h,rhm->rm", w**2, d**2)
    scale = pred.shape[0] / (pred.shape[0] - 1)
    return ((ens**2 - own).mean(-1) * scale).double().cpu(), ((ens**2).mean(-1) * scale).double().cpu()


def evaluate(predictions: Tensor, weights: Tensor, target: Tensor) -> Evaluation:
    """Decompose one weighting of a family's predictions, per replicate and per point.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        R >= 3 (the decomposition's jackknife).
    weights : Tensor, shape (H,)
    target : Tensor, shape (m,)
        f at the points.

    Returns
    -------
    Evaluation
        With fixed-weight standard errors: over the training sets and the points together.
    """
    dec = decompose(predictions, target, weights)
    whole = dec.integrated()
    err = replicate_mse(predictions, target, weights).double().cpu()
    cov_r, spread_r = ensemble_contributions(predictions, weights)
    row = {
        "MSE": whole.mse,
        "MSE SE": whole.mse_se,
        "bias^2": whole.bias_sq,
        "bias^2 SE": whole.bias_sq_se,
        "variance": whole.variance,
        "variance SE": whole.variance_se,
        "covariance": whole.covariance,
        "covariance SE": whole.covariance_se,
        "mean corr": whole.mean_correlation,
    }
    per_point_terms = {"MSE": dec.mse, "bias^2": dec.bias_sq, "variance": dec.variance, "covariance": dec.covariance}
    m = target.shape[-1]
    se = {k: math.hypot(row[f"{k} SE"], float(v.double().std()) / math.sqrt(m)) for k, v in per_point_terms.items()}
    per_point = {
        q: v.double().cpu()
        for q, v in (
            ("err", dec.mse),
            ("cov", dec.covariance),
            ("bias", dec.bias_sq),
            ("spread", dec.ensemble_variance),
        )
    }
    per_replicate = {"err": err, "cov": cov_r, "bias": err - spread_r, "spread": spread_r}
    return Evaluation(row, se, per_replicate, per_point, {}, predictions.dtype)


def run_family(
    design: Design,
    key_projections: Tensor,
    *,
    attention: AttentionHeads | CosineHeads | None = None,
    fit: bool = False,
    fresh: bool = False,
    bandwidth: float | None = None,
    head_data: str = "shared",
) -> FamilyRun:
    """Simulate one family of heads on the design's training sets and score it.

    The main runs use the design's evaluation points and seed + 4 (``replicates`` training sets), the
    confirmatory runs (``fresh=True``) the fresh points and seed + 9 (``replicates_confirm``): every
    family of a kind sees the same training sets. With ``fit`` the least-squares output weights
    (:func:`nwlib.least_squares_weights`, float64, ridge :data:`RIDGE`) are fitted on the fitting batch
    (seed + 5, ``replicates_fit`` training sets at the fitting points, against their noisy responses),
    and refitted without each of :data:`GROUPS` groups of its training sets for a jackknife.

    Parameters
    ----------
    design : Design
    key_projections : Tensor, shape (H, D, d_k)
        The key ranges (for ``attention``, the ranges that the keys scale).
    attention : AttentionHeads or CosineHeads, optional
        Attention's heads: :class:`AttentionHeads` (the unnormalised exponential kernel on raw inputs, own
        queries and values) or :class:`CosineHeads` (QK-normalised attention on LayerNorm'd tokens, each
        weighting at the temperature that does best on the fitting batch: the uniform average's validation
        error, or the least-squares fit's error there; the jackknife of the fitted weights keeps that
        temperature); default the Gaussian surrogate with the engine's default bandwidth.
    fit : bool, default False
    fresh : bool, default False
    bandwidth : float, optional
        Passed to :func:`nwlib.simulate` (default: the engine's, Scott's rule for the Gaussian surrogate).
    head_data : {"shared", "independent"}, default "shared"
        Passed to :func:`nwlib.simulate`: whether the heads of a replicate share its training set.

    Returns
    -------
    FamilyRun
    """
    if not isinstance(design, Design):
        raise TypeError(f"design must be a Design (make_design), got {type(design).__name__}")
    Q = require_tensor(key_projections, "key_projections", min_dim=3)
    if Q.dim() != 3 or Q.shape[1] != design.embed_dim:
        raise ValueError(f"key_projections must have shape (H, D={design.embed_dim}, d_k), got {tuple(Q.shape)}")
    if isinstance(attention, CosineHeads):
        if bandwidth is not None or head_data != "shared":
            raise ValueError("bandwidth and head_data apply to the engine's heads, not to CosineHeads")
        return _run_cosine_family(design, Q, attention, fit=fit, fresh=fresh)
    task, dev, dtype = design.task, design.device, design.dtype
    W, extra = (Q, {}) if attention is None else attention.projections(Q, dtype=dtype, device=dev)
    extra = {
        **extra,
        "bandwidth": bandwidth,
        "head_data": require_choice(head_data, "head_data", ("shared", "independent")),
    }
    points = design.fresh_points if fresh else design.eval_points
    offset = _SEED_FRESH if fresh else _SEED_MAIN
    reps = design.replicates_confirm if fresh else design.replicates
    pred = simulate(
        task,
        W,
        points,
        n=design.n_train,
        replicates=reps,
        generator=torch.Generator(device=dev).manual_seed(design.seed + offset),
        **extra,
    )
    heads = Q.shape[0]
    target = task.f(points)
    uniform = torch.full((heads,), 1 / heads, dtype=dtype, device=dev)
    index = float(hdi(Q.double()))
    uniform_part = evaluate(pred, uniform, target)
    if not fit:
        return FamilyRun(index, uniform_part)
    pred_fit = simulate(
        task,
        W,
        design.fit_points,
        n=design.n_train,
        replicates=design.replicates_fit,
        generator=torch.Generator(device=dev).manual_seed(design.seed + _SEED_FIT),
        **extra,
    ).double()
    ls, alpha = _least_squares_part(pred, target, pred_fit, design.fit_responses.double())
    return FamilyRun(index, uniform_part, ls, alpha)


def _least_squares_part(pred: Tensor, target: Tensor, pred_fit: Tensor, y_fit: Tensor) -> tuple[Evaluation, Tensor]:
    """Least-squares output weights fitted on the fitting batch, scored on ``pred``, with the batch's jackknife."""
    dtype, dev = pred.dtype, pred.device
    heads, reps_fit = pred.shape[1], pred_fit.shape[0]
    alpha = least_squares_weights(pred_fit, y_fit, ridge=RIDGE).to(dtype)
    ls = evaluate(pred, alpha, target)
    group = torch.arange(reps_fit, device=dev) // (reps_fit // GROUPS)
    leave_out = {q: torch.zeros(GROUPS, dtype=_F64) for q in ("err", "cov")}
    for g in range(GROUPS):
        alpha_g = least_squares_weights(pred_fit[group != g], y_fit[group != g], ridge=RIDGE).to(dtype)
        leave_out["err"][g] = float(replicate_mse(pred, target, alpha_g).double().mean())
        leave_out["cov"][g] = float(ensemble_contributions(pred, alpha_g)[0].mean())
    se = {
        c: math.hypot(ls.se[c], float(jackknife_se(leave_out[q]))) for q, c in (("err", "MSE"), ("cov", "covariance"))
    }
    # how much rounding in the heads can move the weights (the Gram matrix's condition, with the ridge)
    gram = torch.einsum("rhm,rgm->hg", pred_fit, pred_fit)
    ridge = RIDGE * gram.diagonal().mean() * torch.eye(heads, dtype=_F64, device=gram.device)
    condition = float(torch.linalg.cond(gram + ridge))
    ls = dataclasses.replace(ls, se=se, leave_out=leave_out, condition=condition)
    return ls, alpha.double().cpu()


def _run_cosine_family(design: Design, Q: Tensor, heads: CosineHeads, *, fit: bool, fresh: bool) -> FamilyRun:
    """:func:`run_family` for QK-normalised heads: temperatures chosen on the fitting batch, then scored."""
    task, dev, dtype = design.task, design.device, design.dtype
    Q = Q.to(dtype=dtype, device=dev)
    taus = list(heads.temperatures)
    n = design.n_train
    pred_fit = cosine_predictions(
        task,
        Q,
        heads,
        design.fit_points,
        n=n,
        replicates=design.replicates_fit,
        generator=torch.Generator(device=dev).manual_seed(design.seed + _SEED_FIT),
        temperatures=taus,
    ).double()
    y_fit = design.fit_responses.double()
    chosen = {"uniform": taus[int(((pred_fit.mean(2) - y_fit) ** 2).mean((1, 2)).argmin())]}
    if fit:
        errors = []
        for p in pred_fit:
            a = least_squares_weights(p, y_fit, ridge=RIDGE)
            errors.append(float((torch.einsum("h,rhm->rm", a, p) - y_fit).pow(2).mean()))
        chosen["ls"] = taus[int(np.argmin(errors))]
    main = sorted(set(chosen.values()))
    points = design.fresh_points if fresh else design.eval_points
    pred_all = cosine_predictions(
        task,
        Q,
        heads,
        points,
        n=n,
        replicates=design.replicates_confirm if fresh else design.replicates,
        generator=torch.Generator(device=dev).manual_seed(design.seed + (_SEED_FRESH if fresh else _SEED_MAIN)),
        temperatures=main,
    )
    target = task.f(points)
    H = Q.shape[0]
    uniform = torch.full((H,), 1 / H, dtype=dtype, device=dev)
    index = float(hdi(Q.double()))
    uniform_part = evaluate(pred_all[main.index(chosen["uniform"])], uniform, target)
    if not fit:
        return FamilyRun(index, uniform_part, temperature=chosen)
    pred = pred_all[main.index(chosen["ls"])]
    ls, alpha = _least_squares_part(pred, target, pred_fit[taus.index(chosen["ls"])], y_fit)
    return FamilyRun(index, uniform_part, ls, alpha, temperature=chosen)


# --- the families as sweep points ----------------------------------------------------------------

_DESIGN_KEYS = (
    "embed_dim",
    "num_heads",
    "head_dim",
    "noise_sd",
    "n_train",
    "n_eval",
    "replicates",
    "replicates_fit",
    "replicates_confirm",
    "seed",
    "dtype",
)
_FAMILY_KEYS = ("design", "key_ranges", "key_dtype", "attention", "fit", "fresh", "bandwidth", "head_data")
_PLACEMENT_KEYS = ("design", "thetas", "shared_dim")


@contextlib.contextmanager
def _one_thread(device: torch.device) -> Iterator[None]:
    # A point is thousands of small tensor operations, as the notebook runs them (one CPU thread); a pool
    # of N workers then uses N cores without oversubscribing them.
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: object, what: str) -> torch.dtype:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be the name of a torch dtype, e.g. 'float32', got {type(name).__name__}")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{what} must name a floating-point torch dtype, got {name!r}")
    return dtype


def _require_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def design_spec(design: Design) -> dict[str, Any]:
    """What :func:`make_design` needs to draw ``design`` again: its sizes, seed and dtype, as JSON values.

    A sweep point (:func:`family_point`) carries this instead of the design's tensors and draws the
    design again where it runs, so that every point sees the same evaluation points, fitting batch and
    (through :func:`run_family`'s seeds) training sets as the design it was made from.

    Parameters
    ----------
    design : Design
        Made by :func:`make_design` (or :func:`wide_design`).

    Returns
    -------
    dict
        The keyword arguments of :func:`make_design` but ``device``, with ``dtype`` as a name (``"float32"``).

    Raises
    ------
    TypeError
        If ``design`` is not a :class:`Design`.
    ValueError
        If ``make_design`` does not draw the same design from them (one built or changed by hand).
    """
    if not isinstance(design, Design):
        raise TypeError(f"design must be a Design (make_design), got {type(design).__name__}")
    spec: dict[str, Any] = {
        "embed_dim": design.embed_dim,
        "num_heads": design.num_heads,
        "head_dim": design.head_dim,
        "noise_sd": design.task.noise_sd,
        "n_train": design.n_train,
        "n_eval": design.n_eval,
        "replicates": design.replicates,
        "replicates_fit": design.replicates_fit,
        "replicates_confirm": design.replicates_confirm,
        "seed": design.seed,
        "dtype": _dtype_name(design.dtype),
    }
    again = None if design.task.name != "single_index" else _design_from_spec(spec, design.device)
    drawn = ("eval_points", "fit_points", "fit_responses", "fresh_points")
    if again is None or not all(torch.equal(getattr(design, a), getattr(again, a)) for a in drawn):
        raise ValueError("design must be drawn by make_design from its sizes and seed (not built or changed by hand)")
    return spec


def _design_from_spec(spec: object, device: torch.device) -> Design:
    if not isinstance(spec, Mapping):
        raise TypeError(f"the point's design must be a mapping (design_spec), got {type(spec).__name__}")
    absent = [k for k in _DESIGN_KEYS if k not in spec]
    if absent:
        raise ValueError(f"the point's design lacks {absent}")
    sizes = {k: spec[k] for k in _DESIGN_KEYS if k != "dtype"}
    return make_design(**sizes, device=device, dtype=_dtype_from_name(spec["dtype"], "the design's dtype"))


def _heads_to_json(attention: object) -> dict[str, Any] | None:
    if attention is None:
        return None
    if isinstance(attention, CosineHeads):
        return {
            "kind": "cosine",
            "rotations": attention.rotations.double().cpu().tolist(),
            "value_projections": attention.value_projections.double().cpu().tolist(),
            "temperatures": [float(t) for t in attention.temperatures],
            "homogeneous": attention.homogeneous,
        }
    if isinstance(attention, AttentionHeads):
        return {
            "kind": "exp",
            "key_scales": attention.key_scales.double().cpu().tolist(),
            "rotations": attention.rotations.double().cpu().tolist(),
            "value_projections": attention.value_projections.double().cpu().tolist(),
        }
    raise TypeError(f"attention must be AttentionHeads, CosineHeads or None, got {type(attention).__name__}")


def _heads_from_json(spec: object) -> AttentionHeads | CosineHeads | None:
    if spec is None:
        return None
    fields: dict[str, tuple[str, ...]] = {
        "cosine": ("rotations", "value_projections", "temperatures", "homogeneous"),
        "exp": ("key_scales", "rotations", "value_projections"),
    }
    kind = spec.get("kind") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or kind not in fields:
        raise ValueError("the point's attention must be None or a mapping of kind 'cosine' or 'exp'")
    absent = [k for k in fields[kind] if k not in spec]
    if absent:
        raise ValueError(f"the point's attention ({kind}) lacks {absent}")
    tensors = {
        k: torch.tensor(spec[k], dtype=_F64) for k in ("key_scales", "rotations", "value_projections") if k in spec
    }
    if kind == "cosine":
        taus = tuple(require_positive_finite(t, "temperatures") for t in spec["temperatures"])
        homogeneous = _require_flag(spec["homogeneous"], "homogeneous")
        return CosineHeads(tensors["rotations"], tensors["value_projections"], taus, homogeneous)
    return AttentionHeads(tensors["key_scales"], tensors["rotations"], tensors["value_projections"])


def _evaluation_to_json(part: Evaluation) -> dict[str, Any]:
    def lists(values: Mapping[str, Tensor]) -> dict[str, list[float]]:
        return {q: v.double().cpu().tolist() for q, v in values.items()}

    return {
        "row": {k: float(v) for k, v in part.row.items()},
        "se": {k: float(v) for k, v in part.se.items()},
        "per_replicate": lists(part.per_replicate),
        "per_point": lists(part.per_point),
        "leave_out": lists(part.leave_out),
        "dtype": _dtype_name(part.dtype),
        "condition": float(part.condition),
    }


def _evaluation_from_json(data: Mapping[str, Any]) -> Evaluation:
    def tensors(values: Mapping[str, list[float]]) -> dict[str, Tensor]:
        return {q: torch.tensor(v, dtype=_F64) for q, v in values.items()}

    return Evaluation(
        dict(data["row"]),
        dict(data["se"]),
        tensors(data["per_replicate"]),
        tensors(data["per_point"]),
        tensors(data["leave_out"]),
        _dtype_from_name(data["dtype"], "dtype"),
        data["condition"],
    )


def _run_to_json(run: FamilyRun) -> dict[str, Any]:
    return {
        "hdi": run.hdi,
        "uniform": _evaluation_to_json(run.uniform),
        "ls": None if run.ls is None else _evaluation_to_json(run.ls),
        "weights": None if run.weights is None else run.weights.double().cpu().tolist(),
        "temperature": {k: float(v) for k, v in run.temperature.items()},
    }


def _run_from_json(data: Mapping[str, Any]) -> FamilyRun:
    ls = None if data["ls"] is None else _evaluation_from_json(data["ls"])
    weights = None if data["weights"] is None else torch.tensor(data["weights"], dtype=_F64)
    return FamilyRun(data["hdi"], _evaluation_from_json(data["uniform"]), ls, weights, dict(data["temperature"]))


def family_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One family of heads as a sweep point: :func:`run_family` on a design drawn again from its seed.

    The point names everything the run depends on: the design (:func:`design_spec`: the sizes and the
    seed whose offsets draw the evaluation points, the fitting batch and the training sets), the key
    ranges (their values), attention's heads (their tensors, or None for the Gaussian surrogate) and
    :func:`run_family`'s options. Families of one design therefore see the same draws wherever they
    run (common random numbers), and a point gives the same numbers as :func:`run_family` in the caller.

    Parameters
    ----------
    point : Mapping
        ``design`` (:func:`design_spec`), ``key_ranges`` (nested lists, shape (H, D, d_k)), ``key_dtype``
        (their dtype's name), ``attention`` (None, or the tensors of :class:`CosineHeads` or
        :class:`AttentionHeads` as nested lists with ``kind`` ``"cosine"`` or ``"exp"``), ``fit`` and
        ``fresh`` (bools), ``bandwidth`` (None or a float) and ``head_data``; :func:`run_families` builds it.
    seed : int
        Not used: every draw comes from the design's seed (so that the families share them).
    device : str, default "cpu"
        Where to simulate (``"auto"``: the worker's accelerator); one thread on the CPU.

    Returns
    -------
    dict
        The :class:`FamilyRun` as JSON values: ``hdi``, ``uniform`` and ``ls`` (each :class:`Evaluation`'s
        ``row``, ``se``, ``per_replicate``, ``per_point`` and ``leave_out`` as lists, its ``dtype`` and
        ``condition``; ``ls`` None without ``fit``), ``weights`` and ``temperature``.

    Raises
    ------
    TypeError, ValueError
        If the point lacks a coordinate or holds a bad value (named in the message).
    """
    require_point(point, _FAMILY_KEYS)
    _require_seed(seed)
    dev = resolve_device(device)
    design = _design_from_spec(point["design"], dev)
    key_dtype = _dtype_from_name(point["key_dtype"], "key_dtype")
    try:
        Q = torch.tensor(point["key_ranges"], dtype=key_dtype, device=dev)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"key_ranges must be nested lists of numbers of shape (H, D, d_k): {err}") from None
    attention = _heads_from_json(point["attention"])
    fit = _require_flag(point["fit"], "fit")
    fresh = _require_flag(point["fresh"], "fresh")
    bandwidth = None if point["bandwidth"] is None else require_positive_finite(point["bandwidth"], "bandwidth")
    with _one_thread(dev):
        run = run_family(
            design, Q, attention=attention, fit=fit, fresh=fresh, bandwidth=bandwidth, head_data=point["head_data"]
        )
    return _run_to_json(run)


def family_points(
    design: Design,
    key_ranges: Sequence[Tensor],
    *,
    attention: AttentionHeads | CosineHeads | None = None,
    fit: bool = False,
    fresh: bool = False,
    bandwidth: float | None = None,
    head_data: str = "shared",
) -> list[dict[str, Any]]:
    """The sweep points of :func:`family_point` for the families of ``key_ranges`` on ``design``, in order.

    Parameters
    ----------
    design : Design
        From :func:`make_design` or :func:`wide_design` (:func:`design_spec`).
    key_ranges : sequence of Tensor, each of shape (H, D, d_k)
        The families; their values and dtype go into the points.
    attention, fit, fresh, bandwidth, head_data
        As :func:`run_family`, the same for every family.

    Returns
    -------
    list of dict
        One point per family (JSON values), for :func:`nwlib.sweep.run_sweep` with :func:`family_point`.

    Raises
    ------
    TypeError, ValueError
        On a bad argument (named in the message), e.g. a design not drawn by :func:`make_design`.
    """
    spec = design_spec(design)
    if isinstance(key_ranges, (str, bytes, Tensor)) or not isinstance(key_ranges, Sequence) or not key_ranges:
        raise TypeError("key_ranges must be a non-empty sequence of (H, D, d_k) tensors")
    options = {
        "attention": _heads_to_json(attention),
        "fit": _require_flag(fit, "fit"),
        "fresh": _require_flag(fresh, "fresh"),
        "bandwidth": None if bandwidth is None else require_positive_finite(bandwidth, "bandwidth"),
        "head_data": require_choice(head_data, "head_data", ("shared", "independent")),
    }
    points = []
    for i, Q in enumerate(key_ranges):
        Q = require_tensor(Q, f"key_ranges[{i}]", min_dim=3)
        if Q.dim() != 3 or Q.shape[1] != design.embed_dim:
            raise ValueError(f"key_ranges[{i}] must have shape (H, D={design.embed_dim}, d_k), got {tuple(Q.shape)}")
        points.append({"design": spec, "key_ranges": Q.tolist(), "key_dtype": _dtype_name(Q.dtype), **options})
    return points


def run_families(
    design: Design,
    key_ranges: Sequence[Tensor],
    *,
    attention: AttentionHeads | CosineHeads | None = None,
    fit: bool = False,
    fresh: bool = False,
    bandwidth: float | None = None,
    head_data: str = "shared",
    executor: str | cf.Executor = "serial",
    desc: str = "families",
) -> list[FamilyRun]:
    """:func:`run_family` for every family of ``key_ranges``, each one point of a sweep run on ``executor``.

    The families become points of :func:`family_point` (:func:`family_points`), run by
    :func:`nwlib.sweep.run_sweep`; each draws the design again from its seed (:func:`design_spec`), so that
    all of them see the same training sets, evaluation points and fitting batch, as
    ``[run_family(design, Q, ...) for Q in key_ranges]`` does, and give its numbers bit for bit (results
    pass through JSON exactly: float64 values and their names). Identical families are run once.

    Parameters
    ----------
    design : Design
        From :func:`make_design` or :func:`wide_design`.
    key_ranges : sequence of Tensor, each of shape (H, D, d_k)
        The families.
    attention, fit, fresh, bandwidth, head_data
        As :func:`run_family`, the same for every family.
    executor : str or concurrent.futures.Executor, default "serial"
        See :func:`nwlib.sweep.open_executor` (``"process:N"``, ``"dask:ADDRESS"``, ...).
    desc : str, default "families"
        The sweep's label.

    Returns
    -------
    list of FamilyRun
        In the order of ``key_ranges`` (float64 CPU tensors, as :func:`run_family` returns them).

    Raises
    ------
    TypeError, ValueError
        On a bad argument (named in the message), e.g. a design not drawn by :func:`make_design`.
    """
    points = family_points(
        design, key_ranges, attention=attention, fit=fit, fresh=fresh, bandwidth=bandwidth, head_data=head_data
    )
    distinct = {canonical_key(p): p for p in points}
    results = run_sweep(
        family_point,
        list(distinct.values()),
        seed=design.seed,
        executor=executor,
        device=str(design.device),
        progress=False,
        desc=desc,
    )
    by_key = dict(zip(distinct, results, strict=True))
    return [_run_from_json(by_key[canonical_key(p)]) for p in points]


def placement_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One placement of :func:`random_placement_study`: a Haar rotation, a design of its own, the path on it.

    Draws the design again from ``point["design"]`` (:func:`design_spec`) and a Haar-random orthogonal O of
    :math:`\mathbb{R}^D` from a CPU generator seeded with the design's seed, and runs the families
    :math:`O Q_h(\theta)` of :meth:`Design.path_heads` at every angle (Gaussian surrogate, weights 1/H).

    Parameters
    ----------
    point : Mapping
        ``design`` (:func:`design_spec`), ``thetas`` (a list of angles) and ``shared_dim`` (an int).
    seed : int
        Not used: the placement's draws come from its design's seed.
    device : str, default "cpu"
        Where to simulate; one thread on the CPU.

    Returns
    -------
    dict
        ``mse``: the integrated MSE at each angle; ``hdi``: the HDI at each angle.

    Raises
    ------
    TypeError, ValueError
        If the point lacks a coordinate or holds a bad value (named in the message).
    """
    require_point(point, _PLACEMENT_KEYS)
    _require_seed(seed)
    thetas = point["thetas"]
    if isinstance(thetas, (str, bytes)) or not isinstance(thetas, Sequence) or not thetas:
        raise TypeError("thetas must be a non-empty sequence of angles")
    angles = [require_real(t, f"thetas[{i}]") for i, t in enumerate(thetas)]
    shared_dim = point["shared_dim"]
    if isinstance(shared_dim, bool) or not isinstance(shared_dim, int) or shared_dim < 0:
        raise ValueError(f"shared_dim must be an int >= 0, got {shared_dim!r}")
    dev = resolve_device(device)
    design = _design_from_spec(point["design"], dev)
    mse: list[float] = []
    index: list[float] = []
    with _one_thread(dev):
        rotation = random_subspaces(
            1, design.embed_dim, design.embed_dim, generator=torch.Generator().manual_seed(design.seed)
        )
        rotation = rotation[0].to(dtype=design.dtype, device=design.device)
        for theta in angles:
            run = run_family(design, rotation @ design.path_heads(theta, shared_dim))
            mse.append(float(run.uniform.per_replicate["err"].mean()))
            index.append(run.hdi)
    return {"mse": mse, "hdi": index}


# --- contrasts -----------------------------------------------------------------------------------


def _check_terms(terms: Sequence[tuple[float, Evaluation, str]]) -> None:
    if not terms:
        raise ValueError("terms must hold at least one (weight, evaluation, quantity) triple")
    for i, term in enumerate(terms):
        if not (isinstance(term, tuple) and len(term) == 3):
            raise TypeError(f"terms[{i}] must be a (weight, evaluation, quantity) triple, got {term!r}")
        w, part, q = term
        require_real(w, f"terms[{i}] weight")
        if not isinstance(part, Evaluation):
            raise TypeError(f"terms[{i}] evaluation must be an Evaluation, got {type(part).__name__}")
        require_choice(q, f"terms[{i}] quantity", QUANTITIES)


def _combine(terms: Sequence[tuple[float, Evaluation, str]], value: Callable[[Evaluation, str], Tensor]) -> Tensor:
    """sum_k w_k value(part_k, q_k), in the order of the terms."""
    (w, part, q), *rest = terms
    total = w * value(part, q)
    for w, part, q in rest:
        total = total + w * value(part, q)
    return total


def contrast(*terms: tuple[float, Evaluation, str]) -> Comparison:
    r"""A linear contrast :math:`\sum_k w_k q_k` of integrated quantities of runs on the same draws.

    Each term is ``(w_k, evaluation_k, q_k)`` with :math:`q_k` one of :data:`QUANTITIES`. The runs must
    share training sets and points (common random numbers): the estimate is the mean over the replicates
    of the per-replicate contrast. Its variance adds what a rerun with another seed draws anew:

    * over the training sets, that of the mean of the per-replicate contrast (:func:`nwlib.evidence.mean`);
    * over the evaluation points, var(per-point contrast)/m;
    * for fitted weights, the delete-a-group jackknife over the fitting batch (:func:`nwlib.grouped_jackknife`'s
      formula) of the contrast recomputed with each group's refitted weights (a term without fitted weights
      contributes its mean, a constant).

    The standard error's degrees of freedom combine those of the parts (R − 1, m − 1 and G − 1) by
    Welch–Satterthwaite (:func:`nwlib.evidence.welch_df`), so that the findings' Student t is as wide as
    the fewest draws make it.

    Parameters
    ----------
    *terms : (float, Evaluation, str)

    Returns
    -------
    Comparison
    """
    _check_terms(terms)
    shapes = {tuple(part.per_replicate[q].shape) for _, part, q in terms}
    if len(shapes) != 1 or len({tuple(part.per_point[q].shape) for _, part, q in terms}) != 1:
        raise ValueError("terms must come from runs on the same training sets and points (common random numbers)")
    series = _combine(terms, lambda part, q: part.per_replicate[q])
    points = _combine(terms, lambda part, q: part.per_point[q])
    over_sets = mean(series)
    parts = [(over_sets.se**2, over_sets.df), (float(points.var()) / points.numel(), points.numel() - 1)]
    if any(q in part.leave_out for _, part, q in terms):
        # a term without fitted weights contributes its mean, the same in every group
        theta = _combine(
            terms, lambda part, q: part.leave_out[q] if q in part.leave_out else part.per_replicate[q].mean()
        )
        parts.append((float(jackknife_se(theta)) ** 2, theta.numel() - 1))
    var = sum(v for v, _ in parts)
    return estimate(over_sets.estimate, math.sqrt(var), welch_df(*parts))


def steps(parts: Sequence[Evaluation], quantity: str = "err") -> list[Comparison]:
    """Consecutive families along a path: ``contrast`` of each later one minus the one before."""
    return [contrast((1, b, quantity), (-1, a, quantity)) for a, b in zip(parts[:-1], parts[1:], strict=True)]


def relative_change(a: Evaluation, b: Evaluation, quantity: str = "err") -> Comparison:
    r"""mean(a) / mean(b) − 1 of one quantity of two runs on the same draws, with a delta-method SE.

    The SE is that of the contrast :math:`a - r\,b` (r the ratio) divided by mean(b).
    """
    ratio = float(a.per_replicate[quantity].mean() / b.per_replicate[quantity].mean())
    c = contrast((1, a, quantity), (-ratio, b, quantity))
    return estimate(ratio - 1, c.se / float(b.per_replicate[quantity].mean()), c.df)


def count_moves(comparisons: Sequence[Comparison]) -> tuple[int, int]:
    """How many comparisons are significant increases and how many decreases (Holm within them, two-sided).

    Examples
    --------
    >>> count_moves([estimate(5.0, 1.0), estimate(-6.0, 1.0), estimate(0.1, 1.0)])
    (1, 1)
    """
    moved = significant(list(comparisons))
    up = sum(bool(s) and c.estimate > 0 for s, c in zip(moved, comparisons, strict=True))
    down = sum(bool(s) and c.estimate < 0 for s, c in zip(moved, comparisons, strict=True))
    return int(up), int(down)


# --- the studies ----------------------------------------------------------------------------------


def angle_grid(count: int) -> list[float]:
    """``count`` angles evenly from 0 to π/2 (both included).

    Examples
    --------
    >>> [round(t, 4) for t in angle_grid(3)]
    [0.0, 0.7854, 1.5708]
    """
    count = require_positive_int(count, "count", minimum=2)
    return [math.pi / 2 * j / (count - 1) for j in range(count)]


class PathSummary(NamedTuple):
    """One path of families under one weighting (:func:`summarise_path`)."""

    table: Any
    """pandas.DataFrame: theta, HDI and the row of each family."""
    mse_steps: list[Comparison]
    """Paired steps of the MSE between consecutive families."""
    cov_steps: list[Comparison]
    """The same for the covariance term."""
    rho: float
    """Spearman's rank correlation of HDI and MSE along the path."""


def summarise_path(runs: Sequence[FamilyRun], thetas: Sequence[float], weights: str = "uniform") -> PathSummary:
    """The table, the paired steps and the rank correlation of a path of families.

    Parameters
    ----------
    runs : sequence of FamilyRun
        Along the path, on the same draws.
    thetas : sequence of float
        Their angles.
    weights : {"uniform", "ls"}, default "uniform"

    Returns
    -------
    PathSummary
    """
    import pandas as pd
    from scipy.stats import spearmanr

    weights = require_choice(weights, "weights", ("uniform", "ls"))
    if len(runs) != len(thetas) or len(runs) < 2:
        raise ValueError(f"runs and thetas must have the same length >= 2, got {len(runs)} and {len(thetas)}")
    table = pd.DataFrame([{"theta": t, "HDI": r.hdi, **r[weights].row} for t, r in zip(thetas, runs, strict=True)])
    parts = [r[weights] for r in runs]
    rho = float(spearmanr(table["HDI"], table["MSE"]).statistic)
    return PathSummary(table, steps(parts), steps(parts, "cov"), rho)


@dataclass(frozen=True, eq=False)
class Surface:
    """The two-angle surface (:func:`two_angle_surface`): families that keep e_1 at angles (θ_1, θ_2)."""

    angles: list[float]
    """The angles of each axis."""
    runs: dict[tuple[int, int], FamilyRun] = field(repr=False)
    """By grid index (i, j); (i, j) and (j, i) are the same run (the angles play symmetric roles)."""
    steps: dict[str, list[Comparison]] = field(repr=False)
    """``"covariance"`` and ``"MSE"``: every step that increases one angle, the other fixed (uniform weights)."""

    def grid(self, column: str) -> np.ndarray:
        """A column of the uniform-weight rows (``MSE``, ``covariance``, ...) as an (n, n) array."""
        n = len(self.angles)
        return np.array([[self.runs[i, j].uniform.row[column] for j in range(n)] for i in range(n)])

    @property
    def distinct(self) -> list[tuple[int, int]]:
        """The grid indices (i, j) with i <= j, in the order they were run."""
        return [(i, j) for i, j in self.runs if i <= j]


def two_angle_surface(design: Design, n_surface: int, *, executor: str | cf.Executor = "serial") -> Surface:
    r"""Families whose heads keep e_1 and make angles (θ_1, θ_2) with each other, over a grid of both.

    Each axis holds ``n_surface`` angles from 0 to π/2; the family at (θ_1, θ_2) is
    :meth:`Design.two_angle_heads` (d_k = 3), run with uniform weights on the main draws. The steps
    compare (i + 1, j) with (i, j) for every j: by symmetry one axis covers both. The distinct families are
    the points of one sweep (:func:`run_families`).

    Parameters
    ----------
    design : Design
    n_surface : int
        >= 2.
    executor : str or concurrent.futures.Executor, default "serial"
        See :func:`nwlib.sweep.open_executor`.

    Returns
    -------
    Surface
    """
    angles = angle_grid(n_surface)
    cells = [(i, j) for i in range(n_surface) for j in range(i, n_surface)]
    families = [design.two_angle_heads([angles[i], angles[j]]) for i, j in cells]
    runs: dict[tuple[int, int], FamilyRun] = {}
    for (i, j), run in zip(cells, run_families(design, families, executor=executor, desc="surface"), strict=True):
        runs[i, j] = runs[j, i] = run
    surface_steps: dict[str, list[Comparison]] = {"covariance": [], "MSE": []}
    for j in range(n_surface):
        for i in range(n_surface - 1):
            lo, hi = runs[i, j].uniform, runs[i + 1, j].uniform
            surface_steps["covariance"].append(contrast((1, hi, "cov"), (-1, lo, "cov")))
            surface_steps["MSE"].append(contrast((1, hi, "err"), (-1, lo, "err")))
    return Surface(angles, runs, surface_steps)


def signal_splits(num_heads: int) -> dict[str, list[float]]:
    """The signal shares of the chapter's pairwise orthogonal families: in one head, two, all, or none."""
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    return {
        "one head": [1.0] + [0.0] * (H - 1),
        "two heads": [0.5, 0.5] + [0.0] * (H - 2),
        "all heads": [1 / H] * H,
        "no head": [0.0] * H,
    }


class OrthogonalStudy(NamedTuple):
    """Pairwise orthogonal families against their bounds (:func:`orthogonal_study`)."""

    runs: dict[str, FamilyRun]
    """By split name, with uniform and least-squares weights."""
    table: Any
    """pandas.DataFrame indexed by ``signal in``: MSEs and SEs of both weightings, the uniform-weight limit (c),
    the bound (b) for any weights, and both as quadratures on the evaluation points."""
    law_gaps: list[Comparison]
    """The bound (b) in closed form against a large design sample: residual² minus closed form (families whose
    heads do not contain e_1 entirely)."""
    limit_gaps: list[Comparison]
    """Uniform weights: MSE minus the limit (c) on the same points."""
    bound_gaps: list[Comparison]
    """MSE minus the bound (b) on the same points: uniform and least squares, per family."""


def orthogonal_study(
    design: Design,
    splits: Mapping[str, Sequence[float]],
    *,
    var_f: float,
    generator: torch.Generator,
    design_sample: int = 100_000,
    executor: str | cf.Executor = "serial",
) -> OrthogonalStudy:
    r"""Pairwise orthogonal families with prescribed signal shares, against what any weights can reach.

    For masses :math:`c_h^2`, with :math:`S = \sum_h v(c_h)` (:func:`head_signal_variance`): the bound
    (b) :math:`\operatorname{Var} f - S` for any output weights and the uniform-weight limit (c)
    :math:`\operatorname{Var} f - \frac{2H-1}{H^2} S`. Each family is run with both weightings
    (:func:`run_family` with ``fit=True``; the families are the points of one sweep, :func:`run_families`);
    the bound is checked in closed form against ``design_sample`` design points, and both are compared
    with the MSE as quadratures on the evaluation points (SEs over training sets and points).

    Parameters
    ----------
    design : Design
    splits : Mapping of str to sequence of float
        Family name to the H signal shares (:func:`signal_splits`).
    var_f : float
        Var f (the chapter's sympy value).
    generator : torch.Generator
        CPU generator of the design sample.
    design_sample : int, default 100_000
    executor : str or concurrent.futures.Executor, default "serial"
        See :func:`nwlib.sweep.open_executor`.

    Returns
    -------
    OrthogonalStudy
    """
    import pandas as pd

    var_f = require_positive_finite(var_f, "var_f")
    require_generator(generator, _CPU)
    size = require_positive_int(design_sample, "design_sample", minimum=2)
    H = design.num_heads
    x_big = torch.randn(size, design.embed_dim, generator=generator, dtype=_F64)
    runs: dict[str, FamilyRun] = {}
    rows: list[dict[str, Any]] = []
    law_gaps: list[Comparison] = []
    limit_gaps: list[Comparison] = []
    bound_gaps: list[Comparison] = []
    heads = {name: design.orthogonal_heads(masses) for name, masses in splits.items()}
    done = run_families(design, list(heads.values()), fit=True, executor=executor, desc="orthogonal families")
    for (name, masses), run in zip(splits.items(), done, strict=True):
        Q = heads[name]
        runs[name] = run
        ls = run["ls"]
        sum_v = sum(head_signal_variance(math.sqrt(m)) for m in masses)
        row: dict[str, Any] = {
            "signal in": name,
            "MSE (uniform)": run.uniform.row["MSE"],
            "SE (uniform)": run.uniform.row["MSE SE"],
            "limit (uniform)": var_f - (2 * H - 1) / H**2 * sum_v,
            "MSE (least squares)": ls.row["MSE"],
            "SE (least squares)": ls.row["MSE SE"],
            "bound (any weights)": var_f - sum_v,
        }
        if max(masses) < 1:  # (a head that contains e_1 learns f itself: no residual)
            r2_big = additive_residual(design.task, Q, x_big).pow(2)
            law_gaps.append(mean(r2_big - (var_f - sum_v)))
        for part, weight, gaps, column in (
            (run.uniform, 1 / H, limit_gaps, "limit, these points"),
            (run.uniform, 1.0, bound_gaps, "bound, these points"),
            (ls, 1.0, bound_gaps, None),
        ):
            r2 = additive_residual(design.task, Q, design.eval_points, weight).pow(2)
            gap = part.per_point["err"] - r2
            parts = [(part.row["MSE SE"] ** 2, part.per_replicate["err"].numel() - 1)]
            parts.append((float(gap.var()) / design.n_eval, design.n_eval - 1))
            se = math.sqrt(sum(v for v, _ in parts))
            gaps.append(estimate(float(gap.mean()), se, welch_df(*parts)))
            if column:
                row[column] = float(r2.mean())
        rows.append(row)
    return OrthogonalStudy(runs, pd.DataFrame(rows).set_index("signal in"), law_gaps, limit_gaps, bound_gaps)


def keeps_signal(key_projections: Tensor) -> bool:
    """Whether every head contains the signal direction e_1 (to 1e-6)."""
    return float(signal_mass(key_projections.double()).min()) > 1 - 1e-6


def non_orthogonal_pool(
    design: Design,
    thetas: Sequence[float],
    runs_i: Sequence[FamilyRun],
    runs_ii: Sequence[FamilyRun],
    surface: Surface | None = None,
) -> dict[str, tuple[Tensor, FamilyRun]]:
    """The families of HDI < 1 that the chapter ran, by label, with their key ranges.

    Path (i) at every angle, path (ii) without its last (orthogonal) family, and the distinct families
    of the two-angle surface when given. Labels: ``"path (i), θ = 0.79"``,
    ``"two angles (0.00, 1.57)"``.
    """
    pool = {f"path (i), θ = {t:.2f}": (design.path_heads(t, 1), r) for t, r in zip(thetas, runs_i, strict=True)}
    pool.update(
        {f"path (ii), θ = {t:.2f}": (design.path_heads(t, 0), r) for t, r in zip(thetas[:-1], runs_ii, strict=False)}
    )
    if surface is not None:
        a = surface.angles
        pool.update(
            {
                f"two angles ({a[i]:.2f}, {a[j]:.2f})": (design.two_angle_heads([a[i], a[j]]), surface.runs[i, j])
                for i, j in surface.distinct
            }
        )
    return pool


@dataclass(frozen=True, eq=False)
class Contest:
    """The best pairwise orthogonal family against the best other one (:func:`best_family_contest`)."""

    orthogonal: str
    """The best orthogonal family's name (chosen on the main runs)."""
    other: str
    """The best other family's name."""
    run_orth: Evaluation
    """The orthogonal winner on fresh data."""
    run_other: Evaluation
    """The other winner on fresh data."""
    gap: Comparison
    """Fresh data: MSE of the orthogonal winner minus that of the other (paired)."""
    vs_losing: list[Comparison]
    """Main runs: the other winner's MSE minus that of every pool family whose heads do not all keep e_1."""
    hdi_other: float
    """The HDI of the other winner."""


def first_least(values: Mapping[str, float], dtype: torch.dtype) -> str:
    """The first key, in order, whose value is the least up to floating-point rounding.

    One head configuration can be reached by two parametrisations of the pool (for example a path's
    end point and a point of the two-angle surface): their MSEs are equal in exact arithmetic and
    differ by rounding, which another instruction set or kernel can reverse. Values within
    :func:`nwlib.evidence.fp_tolerance` of the least count as tied, and the first of them is taken,
    so the name chosen does not depend on the machine.

    Parameters
    ----------
    values : Mapping of str to float
        Name → value (an MSE), in the order ties are broken.
    dtype : torch.dtype
        The dtype the values were computed in.

    Returns
    -------
    str
    """
    if not values:
        raise ValueError("values must hold at least one entry")
    low = min(values.values())
    tol = _fp_tolerance(dtype, scale=abs(low))
    return next(k for k, v in values.items() if v <= low + tol)


def best_family_contest(
    design: Design,
    orthogonal: Mapping[str, tuple[Tensor, FamilyRun]],
    pool: Mapping[str, tuple[Tensor, FamilyRun]],
    weights: str,
    attention: AttentionHeads | CosineHeads | None = None,
    *,
    executor: str | cf.Executor = "serial",
) -> Contest:
    """The best of each side of HDI = 1, chosen on the main runs, compared again on fresh data.

    The fresh runs (:func:`run_family` with ``fresh=True``) use points and training sets used for
    nothing else, so that the selection does not favour either side.

    Parameters
    ----------
    design : Design
    orthogonal, pool : Mapping of str to (key ranges, FamilyRun)
        The pairwise orthogonal families and the others, from the main runs.
    weights : {"uniform", "ls"}
    attention : AttentionHeads, optional
        The heads the families were run with (default the Gaussian surrogate).
    executor : str or concurrent.futures.Executor, default "serial"
        Where the two fresh runs go (:func:`run_families`).

    Returns
    -------
    Contest
    """
    weights = require_choice(weights, "weights", ("uniform", "ls"))
    if not orthogonal or not pool:
        raise ValueError("orthogonal and pool must each hold at least one family")
    best_o = first_least({k: float(v[1][weights].row["MSE"]) for k, v in orthogonal.items()}, design.dtype)
    best_n = first_least({k: float(v[1][weights].row["MSE"]) for k, v in pool.items()}, design.dtype)
    run_o, run_n = (
        r[weights]
        for r in run_families(
            design,
            [orthogonal[best_o][0], pool[best_n][0]],
            attention=attention,
            fit=weights == "ls",
            fresh=True,
            executor=executor,
            desc="contest",
        )
    )
    winner = pool[best_n][1][weights]
    vs_losing = [contrast((1, winner, "err"), (-1, r[weights], "err")) for Q, r in pool.values() if not keeps_signal(Q)]
    gap = contrast((1, run_o, "err"), (-1, run_n, "err"))
    return Contest(best_o, best_n, run_o, run_n, gap, vs_losing, pool[best_n][1].hdi)


def paths_grid(runs: Mapping[str, Mapping[str, Any]]) -> Any:
    """The decomposition along the paths, per estimator, as one long table for the interactive figure.

    Parameters
    ----------
    runs : mapping of str to mapping of str to path result
        Estimator label → path label → a path result with a ``table`` (columns ``HDI`` and, for each
        term, ``<term>`` and ``<term> SE``), as :func:`run_path` and the attention runs return.

    Returns
    -------
    pandas.DataFrame
        Columns ``estimator``, ``path``, ``HDI``, ``term`` (MSE, squared bias, variance, covariance),
        ``value`` and ``se``; one row per (estimator, path, step, term).
    """
    import pandas as pd

    terms = {"MSE": "MSE", "bias^2": "squared bias", "variance": "variance", "covariance": "covariance"}
    if not isinstance(runs, Mapping) or not runs:
        raise TypeError("runs must be a non-empty mapping of estimator label to paths")
    rows = []
    for estimator, paths in runs.items():
        for path, result in paths.items():
            table = result.table
            for column, term in terms.items():
                rows.append(
                    pd.DataFrame(
                        {
                            "estimator": estimator,
                            "path": path,
                            "HDI": table["HDI"].to_numpy(),
                            "term": term,
                            "value": table[column].to_numpy(),
                            "se": table[f"{column} SE"].to_numpy(),
                        }
                    )  # fmt: skip
                )
    return pd.concat(rows, ignore_index=True)


# --- tables for reading (the book's one style, :func:`nwlib.book.table`) -----------------------------

PATH_COLUMNS: tuple[str, ...] = ("theta", "HDI", "MSE", "bias^2", "variance", "covariance", "mean corr")
"""The columns of a path's table, in the order the chapter shows them (each with its SE where it has one)."""

_PATH_HEADERS = {
    "theta": "θ (rad)",
    "mean corr": "mean error correlation",
    "zero MSE": "zero predictor's MSE",
    "removed": "share of it removed",
}


def path_table(frame: Any, columns: Sequence[str] = PATH_COLUMNS, *, zero_mse: float | None = None) -> Any:
    """A path's table (:attr:`PathSummary.table`) for reading: each term as ``estimate ± SE``, headers in words.

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per family: ``theta``, ``HDI``, the :class:`Evaluation` row (``MSE``, ``MSE SE``,
        ``bias^2``, ...); any further columns named in ``columns`` (e.g. ``d_k``).
    columns : sequence of str, default :data:`PATH_COLUMNS`
        The estimates to show, in order; a column ``"<c> SE"`` of the frame joins its estimate.
    zero_mse : float, optional
        The zero predictor's MSE on the same points: adds it and the share of it each family removes,
        ``1 - MSE / zero_mse``.

    Returns
    -------
    pandas.DataFrame
        Strings (:func:`nwlib.book.table`), one row per family.

    Raises
    ------
    ValueError
        If ``columns`` names a column the frame lacks.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"theta": [0.0, 1.5708], "HDI": [0.0, 0.6667], "MSE": [0.1112, 0.0903],
    ...                       "MSE SE": [0.0021, 0.0019]})
    >>> shown = path_table(frame, ["theta", "HDI", "MSE"])
    >>> list(shown.columns), shown["HDI"].tolist(), shown["MSE"][1].split()
    (['θ (rad)', 'HDI', 'MSE'], ['0.000', '0.667'], ['0.0903', '±', '0.0019'])
    """
    from ..book import table

    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"columns names {missing}, which the frame does not have")
    picked = [name for c in columns for name in (c, f"{c} SE") if name in frame.columns]
    shown = frame[picked]
    if zero_mse is not None:
        zero = require_positive_finite(zero_mse, "zero_mse")
        shown = shown.assign(**{"zero MSE": zero, "removed": 1 - frame["MSE"] / zero})
    return table(shown, index=False, headers=_PATH_HEADERS)


def accuracy_table(accuracy: Any) -> Any:
    """:func:`angle_accuracy`'s relative errors for reading: two significant digits in scientific notation.

    Parameters
    ----------
    accuracy : pandas.DataFrame
        Indexed by ``t``; columns ``principal_angles``, ``arccos``, ``scipy``.

    Returns
    -------
    pandas.DataFrame
        Strings, indexed by the tiny angle t.

    Examples
    --------
    >>> import pandas as pd
    >>> errors = pd.DataFrame({"t": [1e-3, 1e-7], "principal_angles": [2.1e-13, 0.0],
    ...                        "arccos": [3.3e-10, 0.97], "scipy": [1.2e-13, 4.5e-9]}).set_index("t")
    >>> shown = accuracy_table(errors)
    >>> shown.index.tolist(), shown["arccos of the cosines"].str.replace("\u2212", "-").tolist()
    (['1e-03', '1e-07'], ['3.3e-10', '9.7e-01'])
    """
    from ..book import table

    headers = {
        "principal_angles": "nwlib.principal_angles",
        "arccos": "arccos of the cosines",
        "scipy": "scipy subspace_angles",
    }
    import pandas as pd

    shown = accuracy.map(lambda v: f"{v:.1e}")
    shown.index = pd.Index([f"{t:.0e}" for t in accuracy.index], name="t")
    return table(shown, headers=headers)


def orthogonal_table(frame: Any) -> Any:
    """:attr:`OrthogonalStudy.table` for reading: each weighting's MSE ``± SE`` beside its limit and bound.

    Parameters
    ----------
    frame : pandas.DataFrame
        Indexed by ``signal in``; ``MSE (uniform)``, ``SE (uniform)``, ``MSE (least squares)``,
        ``SE (least squares)`` and the closed-form columns.

    Returns
    -------
    pandas.DataFrame
        Strings, one row per family.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"signal in": ["one head"], "MSE (uniform)": [0.6651], "SE (uniform)": [0.0012],
    ...                       "limit (uniform)": [0.5731], "MSE (least squares)": [0.1041],
    ...                       "SE (least squares)": [0.0015], "bound (any weights)": [0.0]}).set_index("signal in")
    >>> [cell.split() for cell in orthogonal_table(frame).iloc[0]]
    [['0.6651', '±', '0.0012'], ['0.5731'], ['0.1041', '±', '0.0015'], ['0']]
    """
    from ..book import table

    pairs = {"MSE (uniform)": "SE (uniform)", "MSE (least squares)": "SE (least squares)"}
    # four significant digits: the closed forms are compared with MSEs shown to their SE's precision
    return table(frame, se={k: v for k, v in pairs.items() if k in frame.columns}, digits=4)
