r"""The bias–variance–covariance decomposition of a head ensemble (Theorem 3.1): the chapter's experiments.

Serves chapter 2 (``book/ch02_bias_variance_covariance.md``) and its notebook
``notebooks/ch02_bias_variance_covariance.ipynb``: claim **C3** (the ensemble MSE is exactly
bias² + variance + covariance) and claim **C4** (variance reduction needs small cross-head
covariances). The pieces, in the notebook's order:

* symbolic bookkeeping for the derivations (:func:`expectation`, :func:`bvc_terms`,
  :func:`normal_mean`), with sympy imported when called;
* the Gaussian NW surrogate: a fixed design (:func:`surrogate_design`, :func:`head_frames`) of
  four families of heads (:data:`FAMILIES`), two independent Monte Carlo batches
  (:func:`gaussian_batch`), the equicorrelated law fitted on one and checked on the other
  (:func:`law_check`), the paired gains of more heads (:func:`gains_and_order`) and the
  per-family summary (:func:`family_summary`);
* the shared-data floor, predicted from materialised weights on a third batch
  (:func:`floor_comparison`);
* where the dot-product kernel puts its weight (:func:`dot_product_weights`) and the main
  experiment under attention's kernel, projections, values and least-squares output weights
  (:func:`attention_design`, :func:`attention_batch`, :func:`least_squares_study`,
  :func:`factorisation_gap`, :func:`signal_plane_gap`, :func:`bias_excess`,
  :func:`relative_gain_gaps`, :func:`rho_steps`);
* heads on disjoint coordinate blocks combined four ways (:data:`COMBINATIONS`), one target per
  grid point of :func:`nwlib.sweep.run_sweep` (:func:`combination_point`, read back with
  :func:`combination_results`);
* the speed of the engine (:func:`engine_benchmark`).

Random numbers: the *design* (evaluation points, attention's fixed matrices and value directions,
the block design's evaluation points) comes from fixed generator states (:data:`DESIGN_SEEDS`), the
same for every seed; the notebook's seed (plus a fixed offset per batch) draws the training sets,
the Monte Carlo part. Every generator is created where it is used, so no result depends on the
order of the calls. Standard errors are grouped jackknives over replicates (:func:`jackknife`,
built on :func:`nwlib.grouped_jackknife`) or paired differences (:func:`nwlib.evidence.paired`).
The analysis functions run on one CPU thread (many small tensor operations, where waiting for a
second thread costs more than the arithmetic); the simulations keep all threads.

Glue entries: :class:`GlueEntry` lists name the class of each value the chapter quotes (a Monte
Carlo estimate with its standard error, or a value fixed by construction up to rounding, and the
standard error itself as deterministic given the seed); the notebook glues them in one loop.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, NamedTuple

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
from ..combination import (
    Equicorrelation,
    conditional_moments,
    covariance_split,
    equicorrelation,
    grouped_jackknife,
)
from ..decomposition import decompose
from ..device import resolve_device
from ..evidence import Comparison, estimate, fp_tolerance, independent, paired
from ..evidence import mean as mean_se
from ..kernels import Kernel, cosine_attention, nadaraya_watson_weights
from ..montecarlo import simulate
from ..sweep import point_seed, require_point
from ..tasks import RegressionTask, make_task
from ..weighting import least_squares_weights, replicate_mse

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COMBINATIONS",
    "COMBINATION_KEYS",
    "COMBINATION_TASKS",
    "DESIGN_SEEDS",
    "FAMILIES",
    "FAMILY_KEYS",
    "HEADERS",
    "ROW_KEYS",
    "SHARED_FAMILIES",
    "WEIGHT_CONTRASTS",
    "AttentionDesign",
    "Benchmark",
    "CombinationResult",
    "CosineDesign",
    "FamilyFit",
    "FloorComparison",
    "Gains",
    "GlueEntry",
    "LawCheck",
    "LeastSquares",
    "SurrogateDesign",
    "TemperatureChoice",
    "WeightStudy",
    "attention_batch",
    "attention_design",
    "average_variance_bound",
    "beats_zero",
    "bias_excess",
    "bvc_terms",
    "centred_basis",
    "centred_target",
    "combination_bandwidths",
    "combination_entries",
    "combination_point",
    "combination_results",
    "combination_tables",
    "cosine_batch",
    "cosine_design",
    "dot_product_weights",
    "engine_benchmark",
    "estimate_entries",
    "expectation",
    "factorisation_gap",
    "family_entries",
    "family_summary",
    "format_pairs",
    "format_summary",
    "format_table",
    "format_terms",
    "format_weight_stats",
    "floor_comparison",
    "floor_entries",
    "gains_and_order",
    "gaussian_batch",
    "head_frames",
    "jackknife",
    "jackknife_each",
    "law_check",
    "layer_norm_tokens",
    "least_squares_study",
    "normal_mean",
    "per_replicate_gain",
    "relative_gain_gaps",
    "rho_steps",
    "select_temperature",
    "signal_plane_gap",
    "std_normal_pdf",
    "surrogate_design",
    "temperature_grid",
    "term_agreement",
    "variance_ratios",
    "variance_reduction_claim",
    "weight_entries",
    "zero_predictor_table",
]

FAMILIES: tuple[str, ...] = ("identical", "partly turned", "orthogonal nuisance", "independent data")
"""The four families of heads, from most to least correlated; the first three share their data."""

SHARED_FAMILIES: tuple[str, ...] = FAMILIES[:3]
"""The families whose heads see one shared training set per replicate, as in attention."""

FAMILY_KEYS: dict[str, str] = dict(zip(FAMILIES, ("ident", "partial", "orth", "indep"), strict=True))
"""Short names of the families in glue keys."""

COMBINATIONS: tuple[str, ...] = ("uniform average", "sum", "least-squares weights", "one full-dimensional head")
"""Ways to combine heads on disjoint coordinate blocks (see :func:`combination_point`)."""

COMBINATION_KEYS: dict[str, str] = dict(zip(COMBINATIONS, ("avg", "sum", "ls", "full"), strict=True))
"""Short names of the combinations in glue keys."""

COMBINATION_TASKS: dict[str, str] = {"single_index": "si", "isotropic": "iso", "interaction": "int"}
"""The targets of the block experiment (library tasks) and their short names in glue keys."""

DESIGN_SEEDS: dict[str, int] = {"eval_points": 0, "attention": 5, "blocks": 8, "cosine": 9}
"""Fixed generator states of the design, the same for every seed (see the module docstring)."""

WEIGHT_CONTRASTS: tuple[str, ...] = (
    "key norm, exp − gauss, h_att",
    "key norm, exp − gauss, h=0.5",
    "distance, exp − gauss, h=0.5",
    "n_eff/n, gauss − exp, h=0.5",
    "key norm (exp, h=0.5) − |q|",
)
"""The contrasts of :attr:`WeightStudy.contrasts`, in order."""

_WEIGHT_KEYS = 400  # keys drawn from the design N(0, I_2) in dot_product_weights
_WEIGHT_QUERY = (1.5, 0.5)
_WEIGHT_BANDWIDTHS = {"att": 2.0**0.25, "small": 0.5}  # attention's h = d_k^(1/4) for d_k = 2; a localising h
# "unit": the exp kernel on the keys scaled to one norm
_WEIGHT_KINDS: dict[str, Kernel] = {"gauss": "gaussian", "exp": "exp", "unit": "exp"}
_FRAME_DIM = 3  # every head of the surrogate sees e1, e2 and one nuisance direction
_BANDWIDTH_RANGE = (0.15, 2.0)  # the grid of the block experiment, log-spaced


# --- small helpers ---------------------------------------------------------------------


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _draw(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    # Like the engine: draw in float64 and cast, so float32 and float64 runs see the same numbers.
    return torch.randn(*shape, generator=generator, dtype=torch.float64, device=generator.device).to(dtype)


@contextlib.contextmanager
def _one_thread(device: torch.device) -> Iterator[None]:
    # The analysis is many small tensor operations: on a busy CPU host, waiting for a second
    # thread costs more than the arithmetic. The simulations keep all threads.
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if device.type == "cpu" else threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"{name} must be >= 0, got {seed}")
    return seed


def _families(batch: object, name: str) -> Mapping[str, Tensor]:
    if not isinstance(batch, Mapping):
        raise TypeError(f"{name} must map the families {list(FAMILIES)} to predictions, got {type(batch).__name__}")
    missing = [f for f in FAMILIES if f not in batch]
    if missing:
        raise ValueError(f"{name} lacks the families {missing}")
    for family in FAMILIES:
        require_tensor(batch[family], f"{name}[{family!r}]", min_dim=3)
    return batch


def _groups(groups: object, replicates: int, name: str = "groups") -> int:
    g = require_positive_int(groups, name, minimum=2)
    if replicates % g or g > replicates:
        raise ValueError(f"{name} must divide the number of replicates R = {replicates} and be <= R, got {g}")
    return g


def jackknife(statistic: Callable[..., Any], *arrays: Tensor, groups: int) -> Comparison:
    """The grouped jackknife of a scalar statistic of replicates, as a :class:`~nwlib.evidence.Comparison`.

    Parameters
    ----------
    statistic : callable
        ``statistic(*subsets)`` returns a scalar (float or 0-dim tensor).
    *arrays : Tensor, shape (R, ...)
        Replicates along dimension 0 (see :func:`nwlib.grouped_jackknife`).
    groups : int
        G, dividing R.

    Returns
    -------
    Comparison
        The statistic on all replicates and its delete-a-group jackknife standard error.

    Raises
    ------
    TypeError, ValueError
        As :func:`nwlib.grouped_jackknife`; ValueError if the statistic is not a scalar.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(10, dtype=torch.float64)
    >>> c = jackknife(lambda v: v.mean(), x, groups=10)
    >>> c.estimate, round(c.se, 6) == round(float(x.std() / 10**0.5), 6)
    (4.5, True)
    """
    est = grouped_jackknife(statistic, *arrays, groups=groups)
    if est.estimate.dim() != 0:
        raise ValueError(f"statistic must return a scalar, got shape {tuple(est.estimate.shape)}: use jackknife_each")
    return estimate(est.estimate, est.se)


def jackknife_each(statistic: Callable[..., Any], *arrays: Tensor, groups: int) -> list[Comparison]:
    """The grouped jackknife of a vector statistic, one :class:`~nwlib.evidence.Comparison` per entry.

    Parameters
    ----------
    statistic : callable
        ``statistic(*subsets)`` returns a 1-dimensional tensor of fixed length K.
    *arrays : Tensor, shape (R, ...)
    groups : int

    Returns
    -------
    list of Comparison, length K

    Raises
    ------
    TypeError, ValueError
        As :func:`nwlib.grouped_jackknife`; ValueError if the statistic is not a vector.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(8, dtype=torch.float64)
    >>> [c.estimate for c in jackknife_each(lambda v: torch.stack([v.mean(), v.max()]), x, groups=4)]
    [3.5, 7.0]
    """
    est = grouped_jackknife(statistic, *arrays, groups=groups)
    if est.estimate.dim() != 1:
        raise ValueError(f"statistic must return a vector, got shape {tuple(est.estimate.shape)}: use jackknife")
    return [estimate(e, s) for e, s in zip(est.estimate.tolist(), est.se.tolist(), strict=True)]


class GlueEntry(NamedTuple):
    """One value for the book: ``glue(entry.name, entry.value, **entry.options)``."""

    name: str
    """The glue key."""
    value: Any
    """The value (a float for every entry built here)."""
    options: dict[str, Any]
    """The value's class for :func:`nwlib.book.glue`: ``{"se": ...}``, ``{"tol": ...}`` or ``{"verify": False}``."""


def estimate_entries(
    key: str,
    value: Comparison,
    se_key: str,
    *,
    dtype: torch.dtype,
    replicates: int,
    exact_scale: float | None = None,
) -> list[GlueEntry]:
    """Glue entries of an estimate and of its standard error.

    The estimate is a Monte Carlo value (class ``se=``) unless ``exact_scale`` is given: then it is
    fixed by construction and only rounding moves it (identical heads have ρ = 1), class ``tol=``
    with :func:`nwlib.evidence.fp_tolerance` at that scale. The standard error is deterministic
    given the seed; its rounding scales with the terms it is computed from,
    ``exact_scale`` or ``|estimate| + se·√replicates``.

    Parameters
    ----------
    key, se_key : str
        Glue keys of the estimate and of its standard error.
    value : Comparison
    dtype : torch.dtype
        The notebook's dtype (sizes the tolerances).
    replicates : int
        Replicates per batch (sizes the standard error's tolerance).
    exact_scale : float, optional
        Magnitude of a value that is exact by construction.

    Returns
    -------
    list of GlueEntry
        Two entries: the estimate, then its standard error.

    Raises
    ------
    ValueError
        If a Monte Carlo estimate has a rounding-level standard error (it is no Monte Carlo value).

    Examples
    --------
    >>> import torch
    >>> from nwlib.evidence import estimate
    >>> a, b = estimate_entries("gain", estimate(0.5, 0.01), "gain_se", dtype=torch.float64, replicates=100)
    >>> a.options, round(b.options["tol"] / 2.0**10 / 2.0**-52, 6)
    ({'se': 0.01}, 0.6)
    """
    if not isinstance(value, Comparison):
        raise TypeError(f"value must be a Comparison, got {type(value).__name__}")
    dtype = require_dtype(dtype)
    replicates = require_positive_int(replicates, "replicates")
    if exact_scale is None:
        rounding = 16 * torch.finfo(dtype).eps * abs(value.estimate)
        if not value.se > rounding:
            raise ValueError(f"{key}: a rounding-level standard error is no Monte Carlo estimate")
        first = GlueEntry(key, value.estimate, {"se": value.se})
    else:
        first = GlueEntry(key, value.estimate, {"tol": fp_tolerance(dtype, scale=exact_scale)})
    se_scale = exact_scale or abs(value.estimate) + value.se * math.sqrt(replicates)
    return [first, GlueEntry(se_key, value.se, {"tol": fp_tolerance(dtype, scale=se_scale)})]


# --- symbolic bookkeeping --------------------------------------------------------------


def expectation(expr: Any, eps: Sequence[Any], cov: Any) -> Any:
    r"""The expectation of a polynomial of degree <= 2 in zero-mean errors, from their moments.

    :math:`\E` is linear, so it maps every monomial: :math:`1 \mapsto 1`,
    :math:`\varepsilon_h \mapsto 0`, :math:`\varepsilon_h\varepsilon_{h'} \mapsto C_{hh'}`.

    Parameters
    ----------
    expr : sympy expression
        A polynomial in the symbols ``eps`` (coefficients may hold other symbols).
    eps : sequence of sympy.Symbol
        The zero-mean errors.
    cov : sympy.Matrix
        Their covariance matrix, ``cov[i, j] = E[eps_i eps_j]``.

    Returns
    -------
    sympy expression
        Expanded.

    Raises
    ------
    ValueError
        If ``expr`` has a monomial of degree > 2 in ``eps`` (its moment is not given).

    Examples
    --------
    >>> import sympy as sp
    >>> e1, e2, a = sp.symbols("e1 e2 a")
    >>> expectation((a + e1 + e2) ** 2, [e1, e2], sp.Matrix([[1, 0], [0, 2]]))
    a**2 + 3
    """
    import sympy as sp

    poly = sp.Poly(sp.expand(expr), *eps)
    total = sp.Integer(0)
    for powers, coeff in poly.terms():
        idx = [i for i, k in enumerate(powers) for _ in range(k)]
        if len(idx) == 0:
            total += coeff
        elif len(idx) == 2:
            total += coeff * cov[idx[0], idx[1]]
        elif len(idx) != 1:
            raise ValueError("expr must have no monomials of degree > 2 in eps")
    return sp.expand(total)


def bvc_terms(num_heads: int) -> tuple[Any, Any, Any, Any]:
    r"""Theorem 3.1 for H heads, symbolically: the expected square and its three terms.

    Head h's estimate is :math:`\mu_h + \varepsilon_h` with zero-mean errors of covariance
    :math:`C` (``V_h`` on the diagonal, ``C_hh'`` off it); the ensemble is
    :math:`\sum_h \alpha_h \hat f_h` and the target ``f``.

    Parameters
    ----------
    num_heads : int
        H >= 1.

    Returns
    -------
    (mse, bias_sq, variance, covariance) : sympy expressions
        ``mse`` = :func:`expectation` of :math:`(\sum_h\alpha_h\hat f_h - f)^2`;
        ``bias_sq`` = :math:`(\sum_h \alpha_h\mu_h - f)^2`; ``variance`` = :math:`\sum_h\alpha_h^2V_h`;
        ``covariance`` = :math:`\sum_{h\ne h'}\alpha_h\alpha_{h'}C_{hh'}`. Symbols: ``alpha_h``,
        ``mu_h``, ``f`` (real), ``V_h`` (positive), ``C_hh'`` (real, h < h').

    Examples
    --------
    >>> import sympy as sp
    >>> mse, b, v, c = bvc_terms(2)
    >>> sp.expand(mse - (b + v + c))
    0
    """
    import sympy as sp

    heads = require_positive_int(num_heads, "num_heads")
    alpha = sp.symbols(f"alpha_1:{heads + 1}", real=True)
    mu = sp.symbols(f"mu_1:{heads + 1}", real=True)
    eps = sp.symbols(f"varepsilon_1:{heads + 1}", real=True)
    f = sp.Symbol("f", real=True)
    var = sp.symbols(f"V_1:{heads + 1}", positive=True)
    cov = sp.Matrix(
        heads,
        heads,
        lambda i, j: var[i] if i == j else sp.Symbol(f"C_{min(i, j) + 1}{max(i, j) + 1}", real=True),
    )
    mse = expectation((sum(a * (m + e) for a, m, e in zip(alpha, mu, eps, strict=True)) - f) ** 2, eps, cov)
    bias_sq = (sum(a * m for a, m in zip(alpha, mu, strict=True)) - f) ** 2
    variance = sum(a**2 * v for a, v in zip(alpha, var, strict=True))
    covariance = sum(alpha[i] * alpha[j] * cov[i, j] for i in range(heads) for j in range(heads) if i != j)
    return mse, bias_sq, variance, covariance


def std_normal_pdf(u: Any) -> Any:
    r"""The standard normal density :math:`e^{-u^2/2}/\sqrt{2\pi}` as a sympy expression.

    Examples
    --------
    >>> import sympy as sp
    >>> std_normal_pdf(sp.Integer(0))
    sqrt(2)/(2*sqrt(pi))
    """
    import sympy as sp

    return sp.exp(-(u**2) / 2) / sp.sqrt(2 * sp.pi)


def normal_mean(expr: Any, variable: Any) -> Any:
    r""":math:`\E\,\mathrm{expr}` over ``variable`` ~ N(0, 1), integrated and simplified by sympy.

    Examples
    --------
    >>> import sympy as sp
    >>> s = sp.Symbol("s", real=True)
    >>> normal_mean(s**2, s)
    1
    """
    import sympy as sp

    return sp.simplify(sp.integrate(std_normal_pdf(variable) * expr, (variable, -sp.oo, sp.oo)))


# --- the Gaussian surrogate: design, batches, the law, the gains ------------------------


def head_frames(
    theta: float,
    *,
    max_num_heads: int,
    embed_dim: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Orthonormal bases :math:`[e_1, e_2, u_h]` of the heads' subspaces.

    The nuisance direction is :math:`u_h = \cos\theta\,e_3 + \sin\theta\,e_{3+h}`.

    Parameters
    ----------
    theta : float
        The nuisance direction's angle from :math:`e_3` (0: identical heads; π/2: orthogonal nuisance).
    max_num_heads : int
        H, with D >= 3 + H so that every head has a nuisance direction of its own.
    embed_dim : int
        D.
    dtype, device : optional
        Of the result (defaults: torch's default dtype; the CPU).

    Returns
    -------
    Tensor, shape (H, D, 3)

    Raises
    ------
    TypeError, ValueError
        On bad sizes (named), or D < 3 + H.

    Examples
    --------
    >>> import math
    >>> w = head_frames(math.pi / 2, max_num_heads=2, embed_dim=5, dtype=torch.float64)
    >>> w[1].T.round(decimals=6).tolist()
    [[1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]]
    """
    theta = require_real(theta, "theta")
    heads = require_positive_int(max_num_heads, "max_num_heads")
    dim = require_positive_int(embed_dim, "embed_dim")
    if dim < 3 + heads:
        raise ValueError(
            f"embed_dim must be >= 3 + max_num_heads = {3 + heads} (a nuisance direction for every head), got {dim}"
        )
    dtype = require_dtype(dtype)
    device = require_device(device)
    eye = torch.eye(dim, dtype=dtype, device=device)
    w = torch.zeros(heads, dim, _FRAME_DIM, dtype=dtype, device=device)
    w[:, :, 0], w[:, :, 1] = eye[0], eye[1]
    for h in range(heads):
        w[h, :, 2] = math.cos(theta) * eye[2] + math.sin(theta) * eye[3 + h]
    return w


@dataclass(frozen=True, eq=False)
class SurrogateDesign:
    """The fixed part of the surrogate experiment (see :func:`surrogate_design`).

    Attributes
    ----------
    task : RegressionTask
        The ``subspace`` task, signal in the first two coordinates.
    eval_points : Tensor, shape (m, D)
        In the signal plane (nuisance coordinates 0), from :data:`DESIGN_SEEDS` ``["eval_points"]``.
    target : Tensor, shape (m,)
        f at the evaluation points.
    thetas : dict of str to float
        Nuisance angle of each shared-data family (:data:`SHARED_FAMILIES`).
    head_counts : tuple of int
        The ensembles' sizes 1, 2, 4, ..., H_max.
    """

    task: RegressionTask
    eval_points: Tensor
    target: Tensor
    thetas: dict[str, float]
    head_counts: tuple[int, ...]

    @property
    def max_num_heads(self) -> int:
        """H_max, the heads of every family."""
        return self.head_counts[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.eval_points.dtype

    @property
    def device(self) -> torch.device:
        return self.eval_points.device

    def frames(self, theta: float) -> Tensor:
        """(H_max, D, 3) :func:`head_frames` at angle ``theta``, in the design's dtype and device."""
        return head_frames(
            theta,
            max_num_heads=self.max_num_heads,
            embed_dim=self.task.embed_dim,
            dtype=self.dtype,
            device=self.device,
        )


def surrogate_design(
    *,
    embed_dim: int,
    max_num_heads: int,
    n_eval: int,
    noise_sd: float,
    partial_angle_deg: float,
    dtype: torch.dtype,
    device: torch.device | str,
) -> SurrogateDesign:
    r"""The design of the surrogate experiment, the same for every seed.

    Task :math:`y = s^{-1/2}\sum_{j\le 2}\sin(2x_j) + \sigma\varepsilon`, :math:`x \sim N(0, I_D)`;
    m evaluation points with standard normal signal coordinates and nuisance coordinates 0, so that
    the heads of a family are exchangeable; nuisance angles 0 (identical), ``partial_angle_deg``
    (partly turned) and 90° (orthogonal nuisance).

    Parameters
    ----------
    embed_dim : int
        D >= 3 + H_max.
    max_num_heads : int
        H_max, a power of 2 (>= 2): the ensembles have 1, 2, 4, ..., H_max heads.
    n_eval : int
        m.
    noise_sd : float
        σ.
    partial_angle_deg : float
        The partly turned family's angle, in degrees.
    dtype : torch.dtype
    device : torch.device or str

    Returns
    -------
    SurrogateDesign

    Raises
    ------
    TypeError, ValueError
        On bad sizes (named in the message).

    Examples
    --------
    >>> d = surrogate_design(embed_dim=7, max_num_heads=4, n_eval=3, noise_sd=1.0, partial_angle_deg=30.0,
    ...                      dtype=torch.float64, device="cpu")
    >>> d.head_counts, tuple(d.eval_points.shape), bool((d.eval_points[:, 2:] == 0).all())
    ((1, 2, 4), (3, 7), True)
    """
    heads = require_positive_int(max_num_heads, "max_num_heads", minimum=2)
    head_counts = tuple(2**k for k in range(int(math.log2(heads)) + 1))
    if head_counts[-1] != heads:
        raise ValueError(f"max_num_heads must be a power of 2, got {heads}")
    dim = require_positive_int(embed_dim, "embed_dim")
    if dim < 3 + heads:
        raise ValueError(f"embed_dim must be >= 3 + max_num_heads = {3 + heads}, got {dim}")
    m = require_positive_int(n_eval, "n_eval")
    angle = require_real(partial_angle_deg, "partial_angle_deg")
    dtype = require_dtype(dtype)
    dev = require_device(device)
    task = make_task("subspace", dim, signal_dim=2, noise_sd=noise_sd)
    z = torch.zeros(m, dim, dtype=dtype, device=dev)
    z[:, :2] = _draw((m, 2), _generator(DESIGN_SEEDS["eval_points"], dev), dtype)
    thetas = dict(zip(SHARED_FAMILIES, (0.0, math.radians(angle), math.pi / 2), strict=True))
    return SurrogateDesign(task=task, eval_points=z, target=task.f(z), thetas=thetas, head_counts=head_counts)


def gaussian_batch(
    design: SurrogateDesign, *, n_train: int, replicates: int, bandwidth: float, seed: int
) -> dict[str, Tensor]:
    """One Monte Carlo batch of the four families of Gaussian-kernel heads.

    The three shared-data families go through one :func:`nwlib.simulate` call (the same training
    sets: common random numbers); the independent-data family has identical projections and an
    independent training set per head, from a generator in the same state.

    Parameters
    ----------
    design : SurrogateDesign
    n_train : int
        n, the training-set size.
    replicates : int
        R.
    bandwidth : float
        The Gaussian kernel's bandwidth, the same for every head.
    seed : int
        Seeds the batch's training sets.

    Returns
    -------
    dict of str to Tensor
        Predictions of shape (R, H_max, m) for each of :data:`FAMILIES`.
    """
    seed = _seed(seed)
    dev = design.device
    shared_w = torch.cat([design.frames(t) for t in design.thetas.values()])
    kwargs: dict[str, Any] = dict(n=n_train, replicates=replicates, bandwidth=bandwidth)
    shared = simulate(design.task, shared_w, design.eval_points, generator=_generator(seed, dev), **kwargs)
    heads = design.max_num_heads
    out = {name: shared[:, i * heads : (i + 1) * heads] for i, name in enumerate(design.thetas)}
    out["independent data"] = simulate(
        design.task,
        design.frames(0.0),
        design.eval_points,
        generator=_generator(seed, dev),
        head_data="independent",
        **kwargs,
    )
    return out


def variance_ratios(predictions: Tensor, head_counts: Sequence[int]) -> Tensor:
    r"""Variance of the average of the first H heads over the mean variance of those heads, for H >= 2.

    The equicorrelated law says :math:`\rho + (1-\rho)/H`. Variances over replicates (R − 1
    denominator), averaged over the points.

    Parameters
    ----------
    predictions : Tensor, shape (R, H_max, m)
    head_counts : sequence of int
        Ensemble sizes; the first (1, where both sides are 1) is skipped.

    Returns
    -------
    Tensor, shape (len(head_counts) - 1,)

    Examples
    --------
    >>> p = torch.randn(2000, 2, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> round(float(variance_ratios(p, [1, 2])[0]), 1)  # independent heads: 1/2
    0.5
    """
    p = require_tensor(predictions, "predictions", min_dim=3)
    if len(head_counts) < 2:
        raise ValueError(f"head_counts must hold at least two ensemble sizes, got {list(head_counts)}")
    return torch.stack([p[:, :h].mean(1).var(0).mean() / p[:, :h].var(0).mean() for h in head_counts[1:]])


def _fit_stats(p: Tensor, target: Tensor, head_counts: Sequence[int]) -> Tensor:
    # Batch-A quantities of the equicorrelated law: predicted MSE for every H, the floor b² + ρV̄, and ρ.
    fit = equicorrelation(p, target)
    return torch.tensor(
        [*(fit.mse(h) for h in head_counts), fit.bias_sq + fit.rho * fit.mean_variance, fit.rho],
        dtype=torch.float64,
    )


class FamilyFit(NamedTuple):
    """The equicorrelated law of one family: fitted on batch A, checked on batch B (see :func:`law_check`)."""

    fit: Equicorrelation
    """Fitted on A (all H_max heads)."""
    rho: Comparison
    """ρ on A, with its jackknife standard error."""
    floor: Comparison
    r"""The predicted floor :math:`b^2 + \rho\bar V` on A."""
    ratio_gap: list[Comparison]
    """For each H >= 2: variance ratio measured on B minus the one predicted from A's ρ (jointly jackknifed)."""
    rho_b: Comparison
    """ρ measured on B."""


class LawCheck(NamedTuple):
    """The equicorrelated law on held-out data, for every family (see :func:`law_check`)."""

    table: pd.DataFrame
    """One row per family and H: B's integrated terms, A's prediction, the variance ratios, z (shown only)."""
    fits: dict[str, FamilyFit]
    identity_gap: float
    """Largest relative gap between the MSE and bias² + variance + covariance, over families, H and points."""


def law_check(
    batch_fit: Mapping[str, Tensor],
    batch_test: Mapping[str, Tensor],
    target: Tensor,
    *,
    head_counts: Sequence[int],
    groups: int,
) -> LawCheck:
    r"""Fit the equicorrelated law on one batch and check it on an independent one, for every family.

    On ``batch_fit`` (A), :func:`nwlib.equicorrelation` measures :math:`b^2`, :math:`\bar V` and
    :math:`\rho` from all heads; its predictions get grouped-jackknife standard errors over A. On
    ``batch_test`` (B) every ensemble of the first H heads is decomposed directly
    (:func:`nwlib.decompose`). A and B are independent, so one jackknife over the pairs of
    replicate groups gives the standard error of the variance-ratio gap.

    Parameters
    ----------
    batch_fit, batch_test : dict of str to Tensor
        Predictions (R, H_max, m) of every family (:data:`FAMILIES`), R divisible by ``groups``.
    target : Tensor, shape (m,)
    head_counts : sequence of int
        The ensemble sizes, starting at 1 and ending at H_max.
    groups : int
        Jackknife groups.

    Returns
    -------
    LawCheck
        ``table`` (columns ``setting``, ``H``, the fields of
        :class:`nwlib.IntegratedDecomposition`, ``predicted``, ``predicted_se``, ``var_ratio``,
        ``var_ratio_pred``, ``ratio_gap``, ``ratio_gap_se``, ``z``), ``fits`` and ``identity_gap``.
    """
    import numpy as np
    import pandas as pd

    batch_fit, batch_test = _families(batch_fit, "batch_fit"), _families(batch_test, "batch_test")
    target = require_tensor(target, "target", min_dim=1)
    counts = [require_positive_int(h, "head_counts") for h in head_counts]
    if len(counts) < 2 or counts[0] != 1:
        raise ValueError(f"head_counts must start at 1 and hold at least two sizes, got {counts}")
    groups = _groups(groups, batch_fit[FAMILIES[0]].shape[0])
    rows, fits, gap = [], {}, 0.0
    ratio_heads = torch.tensor(counts[1:], dtype=torch.float64, device=target.device)
    with _one_thread(target.device):
        for name in FAMILIES:
            pa, pb = batch_fit[name], batch_test[name]
            fit = equicorrelation(pa, target)
            a = jackknife_each(lambda p: _fit_stats(p, target, counts), pa, groups=groups)
            ratio_gap = jackknife_each(
                lambda p, q: variance_ratios(q, counts) - equicorrelation(p, target).variance_ratio(ratio_heads),
                pa,
                pb,
                groups=groups,
            )
            rho_b = jackknife(lambda p: equicorrelation(p, target).rho, pb, groups=groups)
            fits[name] = FamilyFit(fit=fit, rho=a[-1], floor=a[-2], ratio_gap=ratio_gap, rho_b=rho_b)
            ratios_b = [1.0, *variance_ratios(pb, counts).tolist()]
            for i, h in enumerate(counts):
                dec = decompose(pb[:, :h], target)
                gap = max(
                    gap,
                    float((dec.mse - (dec.bias_sq + dec.variance + dec.covariance)).abs().max() / dec.mse.abs().max()),
                )
                it = dec.integrated()
                rows.append(
                    dict(
                        setting=name,
                        H=h,
                        **it.as_dict(),
                        predicted=a[i].estimate,
                        predicted_se=a[i].se,
                        var_ratio=ratios_b[i],
                        var_ratio_pred=fit.variance_ratio(h),
                        ratio_gap=ratio_gap[i - 1].estimate if h > 1 else math.nan,
                        ratio_gap_se=ratio_gap[i - 1].se if h > 1 else math.nan,
                    )
                )
    table = pd.DataFrame(rows)
    table["z"] = (table.mse - table.predicted) / np.hypot(table.mse_se, table.predicted_se)  # shown, not tested
    return LawCheck(table=table, fits=fits, identity_gap=gap)


def per_replicate_gain(predictions: Tensor, target: Tensor) -> Tensor:
    """Integrated squared error of head 1 minus that of the uniform average of all heads, per replicate.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
    target : Tensor, shape (m,)

    Returns
    -------
    Tensor, shape (R,)

    Examples
    --------
    >>> p = torch.tensor([[[1.0], [3.0]]], dtype=torch.float64)  # R = 1, H = 2, m = 1
    >>> per_replicate_gain(p, torch.zeros(1, dtype=torch.float64)).tolist()  # 1 - 2**2
    [-3.0]
    """
    p = require_tensor(predictions, "predictions", min_dim=3)
    one = replicate_mse(p[:, :1], target, torch.ones(1, dtype=p.dtype, device=p.device))
    many = replicate_mse(p, target, torch.full((p.shape[1],), 1.0 / p.shape[1], dtype=p.dtype, device=p.device))
    return one - many


class Gains(NamedTuple):
    """What more heads buy, family by family (see :func:`gains_and_order`)."""

    gains: dict[str, Comparison]
    """MSE of one head minus MSE of the average of H_max heads, per family (paired)."""
    steps: dict[str, Comparison]
    """Gain of the next, less correlated family minus this family's, keyed ``"lo → hi"`` (paired)."""
    claim: list[Comparison]
    """C4 as worded: each decorrelated shared-data family minus identical heads, then independent data minus each."""

    def step_table(self) -> pd.DataFrame:
        """The steps as a table: ``step``, ``diff``, ``se``, ``z``."""
        import pandas as pd

        return pd.DataFrame([dict(step=k, diff=c.estimate, se=c.se, z=c.z) for k, c in self.steps.items()])


def gains_and_order(batch: Mapping[str, Tensor], target: Tensor) -> Gains:
    """Paired gains of more heads and their order from the most to the least correlated family.

    Replicate r of every family comes from one generator state and the replicates are
    independent, so the paired standard errors are valid whether the families share their
    training sets or not.

    Parameters
    ----------
    batch : dict of str to Tensor
        Predictions (R, H_max, m) of every family.
    target : Tensor, shape (m,)

    Returns
    -------
    Gains
    """
    batch = _families(batch, "batch")
    target = require_tensor(target, "target", min_dim=1)
    with _one_thread(target.device):
        per_rep = {name: per_replicate_gain(batch[name], target) for name in FAMILIES}
        gains = {name: mean_se(per_rep[name]) for name in FAMILIES}
        steps = {f"{lo} → {hi}": paired(per_rep[hi], per_rep[lo]) for lo, hi in pairwise(FAMILIES)}
        claim = [paired(per_rep[n], per_rep["identical"]) for n in FAMILIES[1:-1]]
        claim += [paired(per_rep["independent data"], per_rep[n]) for n in FAMILIES[1:-1]]
    return Gains(gains=gains, steps=steps, claim=claim)


def rho_steps(batch: Mapping[str, Tensor], target: Tensor, *, groups: int) -> list[Comparison]:
    """ρ of each family minus ρ of the next, less correlated one, jointly jackknifed over the replicates.

    Parameters
    ----------
    batch : dict of str to Tensor
        Predictions (R, H_max, m) of every family, sharing their generator states.
    target : Tensor, shape (m,)
    groups : int

    Returns
    -------
    list of Comparison
        Three steps: identical − partly turned, partly turned − orthogonal nuisance, orthogonal
        nuisance − independent data.
    """
    batch = _families(batch, "batch")
    target = require_tensor(target, "target", min_dim=1)
    groups = _groups(groups, batch[FAMILIES[0]].shape[0])

    def step(p: Tensor, q: Tensor) -> float:
        return equicorrelation(p, target).rho - equicorrelation(q, target).rho

    with _one_thread(target.device):
        return [jackknife(step, batch[lo], batch[hi], groups=groups) for lo, hi in pairwise(FAMILIES)]


def family_summary(
    law: LawCheck,
    gains: Gains,
    *,
    max_num_heads: int,
    least_squares: LeastSquares | None = None,
) -> dict[str, dict[str, Comparison]]:
    """The per-family numbers the chapter quotes, as estimates with standard errors.

    Parameters
    ----------
    law : LawCheck
    gains : Gains
        Of the same batches.
    max_num_heads : int
        H_max.
    least_squares : LeastSquares, optional
        Given for attention's batches (then the output weights' numbers are added).

    Returns
    -------
    dict of str to dict of str to Comparison
        Per family. Without ``least_squares`` (the surrogate): ``rho``, ``rhoB``, ``mse1``,
        ``mseH``, ``predH``, ``gain``, ``floor``, ``bias``, ``var1``, ``cov``. With it (attention):
        ``rho``, ``mse1``, ``mseH``, ``bias``, ``var1``, ``gain``, ``lsH``, ``ls_diff``, ``ls_sum``.
        Here 1 and H are one head and H_max heads on batch B, ``bias`` and ``cov`` the terms at
        H_max, ``var1`` one head's variance.
    """
    heads = require_positive_int(max_num_heads, "max_num_heads")
    out: dict[str, dict[str, Comparison]] = {}
    for name in FAMILIES:
        t = law.table[law.table.setting == name].set_index("H")
        fit, one, top = law.fits[name], t.loc[1], t.loc[heads]
        mse1, mse_h = estimate(one.mse, one.mse_se), estimate(top.mse, top.mse_se)
        bias, var1 = estimate(top.bias_sq, top.bias_sq_se), estimate(one.variance, one.variance_se)
        if least_squares is None:
            out[name] = dict(
                rho=fit.rho,
                rhoB=fit.rho_b,
                mse1=mse1,
                mseH=mse_h,
                predH=estimate(top.predicted, top.predicted_se),
                gain=gains.gains[name],
                floor=fit.floor,
                bias=bias,
                var1=var1,
                cov=estimate(top.covariance, top.covariance_se),
            )
        else:
            u = least_squares.table[least_squares.table.setting == name].set_index("H").loc[heads]
            out[name] = dict(
                rho=fit.rho,
                mse1=mse1,
                mseH=mse_h,
                bias=bias,
                var1=var1,
                gain=gains.gains[name],
                lsH=estimate(u.mse_ls, u.mse_ls_se),
                ls_diff=estimate(u.ls_minus_uniform, u.ls_minus_uniform_se),
                ls_sum=least_squares.sums[name],
            )
    return out


def family_entries(
    summary: Mapping[str, Mapping[str, Comparison]], *, prefix: str = "", dtype: torch.dtype, replicates: int
) -> list[GlueEntry]:
    """Glue entries of :func:`family_summary`: ``<prefix><key>_<family>`` and ``<prefix><key>_se_<family>``.

    Identical heads have ρ = 1 (``rho``, ``rhoB``) and a gain of 0 by construction: those values
    are exact up to rounding (at the scale 1, and of one head's MSE); the rest are Monte Carlo
    estimates (see :func:`estimate_entries`).

    Parameters
    ----------
    summary : dict
        From :func:`family_summary`.
    prefix : str, default ""
        ``"att_"`` for attention's batches.
    dtype : torch.dtype
    replicates : int

    Returns
    -------
    list of GlueEntry
    """
    entries: list[GlueEntry] = []
    for name, values in summary.items():
        k = FAMILY_KEYS[name]
        for key, c in values.items():
            scale = None
            if name == "identical":
                scale = {"rho": 1.0, "rhoB": 1.0, "gain": values["mse1"].estimate}.get(key)
            entries += estimate_entries(
                f"{prefix}{key}_{k}", c, f"{prefix}{key}_se_{k}", dtype=dtype, replicates=replicates, exact_scale=scale
            )
    return entries


# --- the shared-data floor -------------------------------------------------------------


def _floor_parts(means: Tensor, noises: Tensor) -> Tensor:
    # ρ and its noise and design parts; the last entry tests "the noise part is more than half of ρ".
    total, noise, design = covariance_split(means, noises).rho()
    return torch.tensor([total, noise, design, noise - 0.5 * total], dtype=torch.float64)


class FloorComparison(NamedTuple):
    """ρ predicted from the designs' weight matrices against ρ measured (see :func:`floor_comparison`)."""

    parts: dict[str, dict[str, Comparison]]
    """Per shared-data family: ``rho_predicted_C``, ``noise_part``, ``design_part``, ``noise_excess``
    (noise part minus half of ρ) and ``diff`` (ρ measured on B minus ρ predicted from C)."""
    table: pd.DataFrame
    """One row per family: ``setting``, ``rho_measured_B``, ``rho_measured_se`` and every part but
    ``noise_excess`` with its ``_se``."""
    min_noise: float
    """The smallest noise covariance of any pair of heads, point and design (non-negative for NW weights)."""


def floor_comparison(
    design: SurrogateDesign,
    rho_measured: Mapping[str, Comparison],
    *,
    n_train: int,
    floor_designs: int,
    bandwidth: float,
    groups: int,
    seed: int,
    chunk: int = 10,
) -> FloorComparison:
    r"""Predict each shared-data family's ρ from a batch of designs, split into its noise and design parts.

    For each of G designs (training inputs) the heads' weight matrices are materialised
    (:func:`nwlib.nadaraya_watson_weights`); :func:`nwlib.conditional_moments` gives
    :math:`\E[\hat f_h \mid X]` and the noise covariance, and :func:`nwlib.covariance_split`
    averages over designs (law of total covariance). Standard errors: grouped jackknives over
    designs; the difference from the measured ρ (an independent batch) adds the two in quadrature.

    Parameters
    ----------
    design : SurrogateDesign
    rho_measured : dict of str to Comparison
        ρ measured on another batch, per shared-data family (:attr:`FamilyFit.rho_b`).
    n_train : int
        n.
    floor_designs : int
        G, divisible by ``groups``.
    bandwidth : float
    groups : int
    seed : int
        Seeds the designs (batch C).
    chunk : int, default 10
        Designs per materialised batch of weights (memory only).

    Returns
    -------
    FloorComparison
    """
    import pandas as pd

    seed = _seed(seed)
    designs = require_positive_int(floor_designs, "floor_designs", minimum=2)
    groups = _groups(groups, designs)
    chunk = require_positive_int(chunk, "chunk")
    bandwidth = require_real(bandwidth, "bandwidth", minimum=0.0, strict_minimum=True)
    dev = design.device
    x_all, _ = design.task.sample((designs,), n_train, generator=_generator(seed, dev), dtype=design.dtype)
    parts: dict[str, dict[str, Comparison]] = {}
    rows, min_noise = [], math.inf
    for name, theta in design.thetas.items():
        w_heads = design.frames(theta)
        with _one_thread(dev):
            means, noises = [], []
            queries = design.eval_points @ w_heads  # (H, m, 3)
            for start in range(0, designs, chunk):
                x = x_all[start : start + chunk]
                weights = nadaraya_watson_weights(queries, x[:, None] @ w_heads, kernel="gaussian", bandwidth=bandwidth)
                mean, noise = conditional_moments(weights, design.task.f(x), design.task.noise_sd)
                means.append(mean)
                noises.append(noise)
            mean_all, noise_all = torch.cat(means), torch.cat(noises)
            min_noise = min(min_noise, float(noise_all.min()))
            total, noise_part, design_part, noise_excess = jackknife_each(
                _floor_parts, mean_all, noise_all, groups=groups
            )
        rho_b = rho_measured[name]
        # B (replicates) and C (designs) are independent batches: the standard errors combine.
        parts[name] = dict(
            rho_predicted_C=total,
            noise_part=noise_part,
            design_part=design_part,
            noise_excess=noise_excess,
            diff=independent(rho_b, total),
        )
        row: dict[str, Any] = dict(setting=name, rho_measured_B=rho_b.estimate, rho_measured_se=rho_b.se)
        for col, c in parts[name].items():
            if col != "noise_excess":
                row[col], row[f"{col}_se"] = c.estimate, c.se
        rows.append(row)
    return FloorComparison(parts=parts, table=pd.DataFrame(rows), min_noise=min_noise)


_FLOOR_SE_KEYS = dict(
    rho_predicted_C="rho_predicted_se", noise_part="noise_part_se", design_part="design_part_se", diff="diff_se"
)


def floor_entries(floor: FloorComparison, *, dtype: torch.dtype, replicates: int) -> list[GlueEntry]:
    """Glue entries of :func:`floor_comparison`: ``floor_<part>_<family>`` and its ``floor_<part>_se_<family>``.

    Identical heads have ρ = 1 on both batches by construction, so their ``rho_predicted_C`` and
    ``diff`` are rounding only (exact up to rounding at the scale 1).

    Parameters
    ----------
    floor : FloorComparison
    dtype : torch.dtype
    replicates : int

    Returns
    -------
    list of GlueEntry
    """
    entries: list[GlueEntry] = []
    for name, parts in floor.parts.items():
        k = FAMILY_KEYS[name]
        for col, se_col in _FLOOR_SE_KEYS.items():
            scale = 1.0 if name == "identical" and col in ("rho_predicted_C", "diff") else None
            entries += estimate_entries(
                f"floor_{col}_{k}",
                parts[col],
                f"floor_{se_col}_{k}",
                dtype=dtype,
                replicates=replicates,
                exact_scale=scale,
            )
    return entries


# --- where the dot-product kernel puts its weight ----------------------------------------


def _weight_stats(keys: Tensor, query: Tensor, kernel: Kernel, bandwidth: float) -> tuple[Tensor, dict[str, Tensor]]:
    w = nadaraya_watson_weights(query, keys, kernel=kernel, bandwidth=bandwidth)[0]
    return w, dict(
        mean_distance=w @ (keys - query).norm(dim=1), mean_key_norm=w @ keys.norm(dim=1), n_eff=1 / w.pow(2).sum()
    )


def _weight_contrasts(keys: Tensor, query: Tensor) -> Tensor:
    # Exp minus Gaussian kernel: mean key norm at both bandwidths; at h = 0.5 also the mean distance from the
    # query, the share of effective keys (Gaussian minus exp) and the exp kernel's mean key norm minus |q|.
    st = {
        (row, kind): _weight_stats(keys, query, kernel, h)[1]
        for row, h in _WEIGHT_BANDWIDTHS.items()
        for kind, kernel in _WEIGHT_KINDS.items()
        if kind != "unit"
    }
    return torch.stack(
        [
            st[("att", "exp")]["mean_key_norm"] - st[("att", "gauss")]["mean_key_norm"],
            st[("small", "exp")]["mean_key_norm"] - st[("small", "gauss")]["mean_key_norm"],
            st[("small", "exp")]["mean_distance"] - st[("small", "gauss")]["mean_distance"],
            (st[("small", "gauss")]["n_eff"] - st[("small", "exp")]["n_eff"]) / keys.shape[0],
            st[("small", "exp")]["mean_key_norm"] - query.norm(),
        ]
    )


@dataclass(frozen=True, eq=False)
class WeightStudy:
    """The weights of one query under the Gaussian and the dot-product kernel (see :func:`dot_product_weights`).

    Attributes
    ----------
    keys : Tensor, shape (400, 2)
        Keys drawn from the design N(0, I_2), float64.
    unit_keys : Tensor, shape (400, 2)
        The same keys scaled to one norm, their median norm.
    query : Tensor, shape (1, 2)
        (1.5, 0.5).
    radius : float
        The median key norm.
    bandwidths : dict of str to float
        ``"att"``: attention's :math:`d_k^{1/4}` for d_k = 2; ``"small"``: 0.5.
    weights : dict of (str, str) to Tensor
        Per (bandwidth, kind) the (400,) weights; kinds ``"gauss"``, ``"exp"``, ``"unit"`` (exp kernel,
        normalised keys).
    stats : dict of (str, str) to dict of str to float
        ``mean_distance`` (from the query), ``mean_key_norm`` and ``n_eff`` (1/Σw²) of those weights.
    unit_gap : float
        Largest difference between Gaussian and exp weights on the normalised keys (rounding only).
    contrasts : list of Comparison
        :data:`WEIGHT_CONTRASTS`, with grouped-jackknife standard errors over the keys (a sample of the design).
    """

    keys: Tensor
    unit_keys: Tensor
    query: Tensor
    radius: float
    bandwidths: dict[str, float]
    weights: dict[tuple[str, str], Tensor]
    stats: dict[tuple[str, str], dict[str, float]]
    unit_gap: float
    contrasts: list[Comparison]

    def kind_keys(self, kind: str) -> Tensor:
        """The keys a kind of weights uses: the normalised keys for ``"unit"``, else the drawn ones."""
        return self.unit_keys if kind == "unit" else self.keys


def dot_product_weights(*, seed: int, groups: int, device: torch.device | str = "cpu") -> WeightStudy:
    r"""Where the exponential (dot-product) kernel puts a query's weight, against the Gaussian kernel.

    :math:`\exp(\langle q, k\rangle/h^2)` reweights every key of the Gaussian kernel by
    :math:`\exp(\lVert k\rVert^2/2h^2)`, favouring long keys; on keys of one norm the two kernels
    coincide. 400 keys from N(0, I_2), the query (1.5, 0.5), two bandwidths; float64.

    Parameters
    ----------
    seed : int
        Seeds the keys.
    groups : int
        Jackknife groups over the keys (dividing 400).
    device : torch.device or str, default "cpu"

    Returns
    -------
    WeightStudy
    """
    seed = _seed(seed)
    groups = _groups(groups, _WEIGHT_KEYS)
    dev = require_device(device)
    keys = torch.randn(_WEIGHT_KEYS, 2, generator=_generator(seed, dev), dtype=torch.float64, device=dev)
    query = torch.tensor([_WEIGHT_QUERY], dtype=torch.float64, device=dev)
    radius = float(keys.norm(dim=1).median())
    unit_keys = radius * keys / keys.norm(dim=1, keepdim=True)
    weights, stats = {}, {}
    for row, h in _WEIGHT_BANDWIDTHS.items():
        for kind, kernel in _WEIGHT_KINDS.items():
            kk = unit_keys if kind == "unit" else keys
            weights[(row, kind)], st = _weight_stats(kk, query, kernel, h)
            stats[(row, kind)] = {stat: float(v) for stat, v in st.items()}
    # Keys of one norm: the two kernels coincide (chapter 1's circle, here with the design's keys).
    unit_gap = max(
        float((_weight_stats(unit_keys, query, "gaussian", h)[0] - weights[(row, "unit")]).abs().max())
        for row, h in _WEIGHT_BANDWIDTHS.items()
    )
    contrasts = jackknife_each(lambda kk: _weight_contrasts(kk, query), keys, groups=groups)
    return WeightStudy(
        keys=keys,
        unit_keys=unit_keys,
        query=query,
        radius=radius,
        bandwidths=dict(_WEIGHT_BANDWIDTHS),
        weights=weights,
        stats=stats,
        unit_gap=unit_gap,
        contrasts=contrasts,
    )


def weight_entries(study: WeightStudy, *, dtype: torch.dtype) -> list[GlueEntry]:
    """Glue entries of :func:`dot_product_weights`: ``w_<stat>_<kind>_<bandwidth>``, ``w_query_norm``, ``w_radius``.

    Fixed keys and query: deterministic given the seed, up to rounding at the value's scale.

    Parameters
    ----------
    study : WeightStudy
    dtype : torch.dtype
        The notebook's dtype (sizes the tolerances).

    Returns
    -------
    list of GlueEntry
    """
    entries = [
        GlueEntry(f"w_{stat}_{kind}_{row}", v, {"tol": fp_tolerance(dtype, scale=v)})
        for (row, kind), st in study.stats.items()
        for stat, v in st.items()
    ]
    entries.append(GlueEntry("w_query_norm", float(study.query.norm()), {"tol": fp_tolerance(dtype, scale=2.0)}))
    entries.append(GlueEntry("w_radius", study.radius, {"tol": fp_tolerance(dtype, scale=study.radius)}))
    return entries


# --- attention's kernel, projections, values and output weights ---------------------------


@dataclass(frozen=True, eq=False)
class AttentionDesign:
    r"""Attention's heads for every family (see :func:`attention_design`).

    Attributes
    ----------
    mix : Tensor, shape (3, 3)
        A, the fixed random mixing of the keys.
    eval_points : Tensor, shape (m, D)
        Drawn from the design N(0, I_D).
    target : Tensor, shape (m,)
    heads : dict of str to (Tensor, Tensor, Tensor)
        Per family :math:`(W_K, W_Q, w_V)` of shapes (H, D, 3), (H, D, 3), (H, D + 1); the
        independent-data family has the identical heads.
    """

    mix: Tensor
    eval_points: Tensor
    target: Tensor
    heads: dict[str, tuple[Tensor, Tensor, Tensor]]


def attention_design(design: SurrogateDesign, *, value_mix: float) -> AttentionDesign:
    r"""Attention's heads on the surrogate's frames: keys, queries, values, and evaluation points.

    Keys :math:`W_K^h = Q_h A` with :math:`Q_h` the frames and A = I + 0.5·N(0, 1) a fixed random
    3 × 3 matrix; queries :math:`W_Q^h = \sqrt{d_k}\,Q_h A^{-\top}`, so that
    :math:`W_Q^h W_K^{h\top}/\sqrt{d_k} = Q_hQ_h^\top`; values :math:`w_V^h = (\tau\xi_h, 1)` with
    τ = ``value_mix`` and :math:`\xi_h` a random unit vector orthogonal to the head's subspace (the
    same for heads with the same frame). A, the evaluation points (from N(0, I_D)) and the ξ come
    from :data:`DESIGN_SEEDS` ``["attention"]``, in that order.

    Parameters
    ----------
    design : SurrogateDesign
    value_mix : float
        τ, the weight of the head-specific input part in the values.

    Returns
    -------
    AttentionDesign
    """
    tau = require_real(value_mix, "value_mix")
    dt, dev, heads, dim = design.dtype, design.device, design.max_num_heads, design.task.embed_dim
    g = _generator(DESIGN_SEEDS["attention"], dev)
    mix = torch.eye(_FRAME_DIM, dtype=dt, device=dev) + 0.5 * _draw((_FRAME_DIM, _FRAME_DIM), g, dt)
    z = _draw((design.eval_points.shape[0], dim), g, dt)
    raw = _draw((heads, dim), g, dt)

    def one_family(theta: float) -> tuple[Tensor, Tensor, Tensor]:
        q_frames = design.frames(theta)
        w_k = q_frames @ mix
        w_q = math.sqrt(_FRAME_DIM) * q_frames @ torch.linalg.inv(mix).mT
        xi = raw[:1].expand(heads, dim) if theta == 0.0 else raw  # identical frames, identical values
        xi = xi - torch.einsum("hdk,hk->hd", q_frames, torch.einsum("hdk,hd->hk", q_frames, xi))
        xi = xi / xi.norm(dim=1, keepdim=True)
        w_v = torch.cat([tau * xi, torch.ones(heads, 1, dtype=dt, device=dev)], dim=1)
        return w_k, w_q, w_v

    family_heads = {name: one_family(t) for name, t in design.thetas.items()}
    family_heads["independent data"] = family_heads["identical"]
    return AttentionDesign(mix=mix, eval_points=z, target=design.task.f(z), heads=family_heads)


def attention_batch(
    design: SurrogateDesign, att: AttentionDesign, *, n_train: int, replicates: int, seed: int
) -> dict[str, Tensor]:
    """One Monte Carlo batch of the four families of attention heads (``kernel="exp"``).

    As :func:`gaussian_batch`: the shared-data families in one call, the independent-data family
    (identical heads, a training set per head) from a generator in the same state.

    Parameters
    ----------
    design : SurrogateDesign
    att : AttentionDesign
    n_train : int
    replicates : int
    seed : int

    Returns
    -------
    dict of str to Tensor
        Predictions (R, H_max, m) at ``att.eval_points`` for each of :data:`FAMILIES`.
    """
    seed = _seed(seed)
    dev = design.device
    w_k, w_q, w_v = (torch.cat([att.heads[n][i] for n in design.thetas]) for i in range(3))
    kwargs: dict[str, Any] = dict(n=n_train, replicates=replicates, kernel="exp")
    shared = simulate(
        design.task,
        w_k,
        att.eval_points,
        generator=_generator(seed, dev),
        query_projections=w_q,
        value_projections=w_v,
        **kwargs,
    )
    heads = design.max_num_heads
    out = {name: shared[:, i * heads : (i + 1) * heads] for i, name in enumerate(design.thetas)}
    w_k, w_q, w_v = att.heads["independent data"]
    out["independent data"] = simulate(
        design.task,
        w_k,
        att.eval_points,
        generator=_generator(seed, dev),
        query_projections=w_q,
        value_projections=w_v,
        head_data="independent",
        **kwargs,
    )
    return out


def factorisation_gap(design: SurrogateDesign, att: AttentionDesign, *, n_train: int, seed: int) -> float:
    r"""Only :math:`W_Q W_K^\top` enters the kernel: attention's heads against their orthonormal factorisation.

    Simulates 4 replicates of the heads :math:`(Q_hA, \sqrt3\,Q_hA^{-\top})` and of
    :math:`(Q_h, \sqrt3\,Q_h)` from one generator state, with the same values.

    Parameters
    ----------
    design : SurrogateDesign
    att : AttentionDesign
    n_train : int
    seed : int

    Returns
    -------
    float
        The largest absolute difference of the predictions (rounding only).
    """
    seed = _seed(seed)
    w_k, w_q, w_v = att.heads["orthogonal nuisance"]
    frames = design.frames(math.pi / 2)
    check: dict[str, Any] = dict(n=n_train, replicates=4, kernel="exp", value_projections=w_v)
    p1 = simulate(
        design.task, w_k, att.eval_points, generator=_generator(seed, design.device), query_projections=w_q, **check
    )
    p2 = simulate(
        design.task,
        frames,
        att.eval_points,
        generator=_generator(seed, design.device),
        query_projections=math.sqrt(_FRAME_DIM) * frames,
        **check,
    )
    return float((p1 - p2).abs().max())


def signal_plane_gap(design: SurrogateDesign, *, n_train: int, seed: int) -> float:
    r"""At the surrogate's signal-plane points every frame gives the same dot-product weights.

    A key's nuisance coordinate enters :math:`\langle q, k\rangle` only through the query's, which
    is zero there. One training set (from ``seed``), the orthogonal-nuisance frames.

    Parameters
    ----------
    design : SurrogateDesign
    n_train : int
    seed : int

    Returns
    -------
    float
        The largest difference between any head's weights and head 1's (rounding only).
    """
    seed = _seed(seed)
    x_one, _ = design.task.sample((), n_train, generator=_generator(seed, design.device), dtype=design.dtype)
    frames = design.frames(math.pi / 2)
    w_plane = nadaraya_watson_weights(
        design.eval_points @ (math.sqrt(_FRAME_DIM) * frames), x_one @ frames, kernel="exp"
    )
    return float((w_plane - w_plane[:1]).abs().max())


class LeastSquares(NamedTuple):
    """Least-squares output weights fitted on batch A and evaluated on batch B (see :func:`least_squares_study`)."""

    table: pd.DataFrame
    """Per family and H: ``mse_ls``, ``mse_ls_se``, ``mse_uniform``, ``ls_minus_uniform`` (paired) and its ``_se``,
    ``weight_sum``."""
    diffs: dict[str, Tensor]
    """Per family, at H_max: per-replicate MSE of the output weights minus that of the uniform average, (R,)."""
    sums: dict[str, Comparison]
    """Per family: the sum of the H_max output weights, jackknifed over A's replicates."""
    sum_one: Comparison
    """The output weight of one (identical) head, jackknifed over A."""


def least_squares_study(
    batch_fit: Mapping[str, Tensor],
    batch_test: Mapping[str, Tensor],
    target: Tensor,
    *,
    head_counts: Sequence[int],
    groups: int,
    ridge: float | None = None,
) -> LeastSquares:
    """Output weights (:func:`nwlib.least_squares_weights`, not constrained to sum to 1) against the uniform average.

    Parameters
    ----------
    batch_fit, batch_test : dict of str to Tensor
        Predictions (R, H_max, m) per family; the weights are fitted on ``batch_fit`` (A) and
        evaluated on ``batch_test`` (B), so the MSE comparisons are paired on B.
    target : Tensor, shape (m,)
    head_counts : sequence of int
        Ensemble sizes (the first H heads), ending at H_max.
    groups : int
    ridge : float, optional
        Default ``max(1e-10, 1e3·eps)`` of the dtype: it only matters for identical heads, whose Gram
        matrix is singular.

    Returns
    -------
    LeastSquares
    """
    import pandas as pd

    batch_fit, batch_test = _families(batch_fit, "batch_fit"), _families(batch_test, "batch_test")
    target = require_tensor(target, "target", min_dim=1)
    dt, dev = target.dtype, target.device
    groups = _groups(groups, batch_fit[FAMILIES[0]].shape[0])
    ridge = max(1e-10, 1e3 * torch.finfo(dt).eps) if ridge is None else require_real(ridge, "ridge", minimum=0.0)
    counts = [require_positive_int(h, "head_counts") for h in head_counts]

    def weight_sum(p: Tensor) -> Tensor:
        return least_squares_weights(p, target, ridge=ridge).sum()

    rows, diffs = [], {}
    with _one_thread(dev):
        for name in FAMILIES:
            pa, pb = batch_fit[name], batch_test[name]
            for h in counts:
                alpha = least_squares_weights(pa[:, :h], target, ridge=ridge)
                ls = replicate_mse(pb[:, :h], target, alpha)
                uni = replicate_mse(pb[:, :h], target, torch.full((h,), 1.0 / h, dtype=dt, device=dev))
                m, d = mean_se(ls), paired(ls, uni)
                rows.append(
                    dict(
                        setting=name,
                        H=h,
                        mse_ls=m.estimate,
                        mse_ls_se=m.se,
                        mse_uniform=float(uni.mean()),
                        ls_minus_uniform=d.estimate,
                        ls_minus_uniform_se=d.se,
                        weight_sum=float(alpha.sum()),
                    )
                )
            diffs[name] = ls - uni  # per replicate, at H_max
        # The weights are fitted on batch A: their sums get a grouped jackknife over A's replicates.
        sums = {name: jackknife(weight_sum, batch_fit[name], groups=groups) for name in FAMILIES}
        sum_one = jackknife(lambda p: weight_sum(p[:, :1]), batch_fit["identical"], groups=groups)
    return LeastSquares(table=pd.DataFrame(rows), diffs=diffs, sums=sums, sum_one=sum_one)


def bias_excess(batch: Mapping[str, Tensor], target: Tensor, *, groups: int) -> list[Comparison]:
    """Squared bias minus half the MSE of the uniform average of all heads, per family (jackknifed).

    Parameters
    ----------
    batch : dict of str to Tensor
    target : Tensor, shape (m,)
    groups : int

    Returns
    -------
    list of Comparison
        In the order of :data:`FAMILIES`; positive where the squared bias is more than half the MSE.
    """
    batch = _families(batch, "batch")
    target = require_tensor(target, "target", min_dim=1)
    groups = _groups(groups, batch[FAMILIES[0]].shape[0])

    def excess(p: Tensor) -> Tensor:
        dec = decompose(p, target)
        return (dec.bias_sq - 0.5 * dec.mse).mean()

    with _one_thread(target.device):
        return [jackknife(excess, batch[n], groups=groups) for n in FAMILIES]


def _relative_gain(p: Tensor, target: Tensor) -> Tensor:
    one = torch.ones(1, dtype=p.dtype, device=p.device)
    return per_replicate_gain(p, target).mean() / replicate_mse(p[:, :1], target, one).mean()


def relative_gain_gaps(
    batch: Mapping[str, Tensor],
    target: Tensor,
    other: Mapping[str, Tensor],
    other_target: Tensor,
    *,
    groups: int,
) -> list[Comparison]:
    """Relative gain of the average (gain over one head's MSE) in one experiment minus in another, per family.

    The two batches are independent; one jackknife over pairs of replicate groups gives the
    standard error of the difference.

    Parameters
    ----------
    batch, other : dict of str to Tensor
        Predictions (R, H_max, m) per family (the same R), e.g. the surrogate's and attention's batch B.
    target, other_target : Tensor, shape (m,)
        Their targets.
    groups : int

    Returns
    -------
    list of Comparison
        ``batch``'s relative gain minus ``other``'s, for the families after the first (partly
        turned, orthogonal nuisance, independent data).
    """
    batch, other = _families(batch, "batch"), _families(other, "other")
    target = require_tensor(target, "target", min_dim=1)
    other_target = require_tensor(other_target, "other_target", min_dim=1)
    groups = _groups(groups, batch[FAMILIES[0]].shape[0])

    def gap(p: Tensor, q: Tensor) -> Tensor:
        return _relative_gain(p, target) - _relative_gain(q, other_target)

    with _one_thread(target.device):
        return [jackknife(gap, batch[n], other[n], groups=groups) for n in FAMILIES[1:]]


# --- attention where it can smooth: LayerNorm'd tokens, QK-normalised heads -----------------


def centred_basis(
    embed_dim: int, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    r"""An orthonormal basis of :math:`\mathbf 1^\perp \subset \mathbb R^D`, where LayerNorm'd tokens live.

    ``layer_norm(x, (D,))`` subtracts the mean of the coordinates, so every token is orthogonal to
    :math:`\mathbf 1`. The basis is the last D − 1 columns of the QR factor of
    :math:`[\mathbf 1, e_1, \dots, e_{D-1}]`: deterministic, no random numbers.

    Parameters
    ----------
    embed_dim : int
        D >= 2.
    dtype, device : optional

    Returns
    -------
    Tensor, shape (D, D − 1)

    Examples
    --------
    >>> c = centred_basis(4, dtype=torch.float64)
    >>> bool(torch.allclose(c.T @ c, torch.eye(3, dtype=torch.float64))), float(c.sum(0).abs().max()) < 1e-12
    (True, True)
    """
    dim = require_positive_int(embed_dim, "embed_dim", minimum=2)
    dtype, device = require_dtype(dtype), require_device(device)
    m = torch.eye(dim, dtype=torch.float64)
    m = torch.cat([torch.ones(dim, 1, dtype=torch.float64), m[:, : dim - 1]], dim=1)
    q, _ = torch.linalg.qr(m)
    return q[:, 1:].to(dtype=dtype, device=device)


def layer_norm_tokens(x: Tensor) -> Tensor:
    """Tokens as a transformer's attention sees them: ``torch.nn.functional.layer_norm(x, (D,))`` (no affine).

    Examples
    --------
    >>> t = layer_norm_tokens(torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64))
    >>> round(float(t.mean()), 12), round(float(t.pow(2).mean()), 4)  # variance 1 up to LayerNorm's eps = 1e-5
    (0.0, 1.0)
    """
    x = require_tensor(x, "x", min_dim=1)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],))


def centred_target(tokens: Tensor, basis: Tensor) -> Tensor:
    r""":math:`f(t) = 2^{-1/2}(\sin 2\langle c_1, t\rangle + \sin 2\langle c_2, t\rangle)` on LayerNorm'd tokens.

    ``basis`` is :func:`centred_basis`; :math:`c_1, c_2` are its first two columns.

    Examples
    --------
    >>> c = centred_basis(3, dtype=torch.float64)
    >>> float(centred_target(torch.zeros(1, 3, dtype=torch.float64), c)[0])
    0.0
    """
    tokens = require_tensor(tokens, "tokens", min_dim=1)
    basis = require_tensor(basis, "basis", min_dim=2)
    return (torch.sin(2 * tokens @ basis[:, 0]) + torch.sin(2 * tokens @ basis[:, 1])) / math.sqrt(2.0)


@dataclass(frozen=True, eq=False)
class CosineDesign:
    r"""QK-normalised attention heads on LayerNorm'd tokens (see :func:`cosine_design`).

    Attributes
    ----------
    basis : Tensor, shape (D, D − 1)
        :func:`centred_basis`: signal directions :math:`c_1, c_2`, nuisance directions :math:`c_3, \dots`.
    eval_points : Tensor, shape (m, D)
        LayerNorm'd draws from N(0, I_D), from :data:`DESIGN_SEEDS` ``["cosine"]``.
    target : Tensor, shape (m,)
        :func:`centred_target` at the evaluation points.
    mix : Tensor, shape (3, 3)
        A = I + 0.1·N(0, 1): keys :math:`W_K^h = Q_hA`, queries :math:`W_Q^h = Q_hA^{-\top}` (so W_Q ≠ W_K).
    heads : dict of str to (Tensor, Tensor, Tensor)
        Per family :math:`(W_K, W_Q, \xi)` of shapes (H, D, 3), (H, D, 3), (H, D); the values are
        :math:`v^h_i = y_i + \tau\langle\xi_h, t_i\rangle`. The independent-data family has the identical heads.
    noise_sd, value_mix : float
    """

    basis: Tensor
    eval_points: Tensor
    target: Tensor
    mix: Tensor
    heads: dict[str, tuple[Tensor, Tensor, Tensor]]
    noise_sd: float
    value_mix: float

    @property
    def max_num_heads(self) -> int:
        return int(self.heads[FAMILIES[0]][0].shape[0])

    @property
    def zero_mse(self) -> float:
        """The zero predictor's integrated MSE, the mean of f² at the evaluation points."""
        return float(self.target.pow(2).mean())


_COSINE_MIX = 0.1  # A = I + 0.1 N(0, 1): W_Q != W_K, and the normalised kernel still peaks near the query


def cosine_design(
    *,
    embed_dim: int,
    max_num_heads: int,
    n_eval: int,
    noise_sd: float,
    partial_angle_deg: float,
    value_mix: float,
    dtype: torch.dtype,
    device: torch.device | str,
) -> CosineDesign:
    r"""The four families of QK-normalised heads, on LayerNorm'd tokens; the same for every seed.

    Head h's frame is :math:`Q_h = [c_1, c_2, u_h]` with :math:`u_h = \cos\theta\,c_3 + \sin\theta\,c_{3+h}`
    (:func:`centred_basis`; θ = 0, ``partial_angle_deg`` and 90° for the shared-data families).
    Keys :math:`W_K^h = Q_hA`, queries :math:`W_Q^h = Q_hA^{-\top}` with A = I + 0.1·N(0, 1)
    fixed; values :math:`v^h_i = y_i + \tau\langle\xi_h, t_i\rangle` with :math:`\xi_h` a random unit
    vector orthogonal to :math:`\mathbf 1`, to :math:`c_1, c_2` and to the head's frame (the same for heads
    with the same frame). Reflecting the token across :math:`\xi_h^\perp` changes neither the
    LayerNorm, nor the keys, nor f, so :math:`\langle\xi_h, t\rangle` has mean zero given all a head sees:
    the values are head-specific and every head still estimates what it would from :math:`y`.

    Parameters
    ----------
    embed_dim : int
        D >= 4 + max_num_heads.
    max_num_heads : int
    n_eval : int
    noise_sd : float
        σ > 0 of the responses.
    partial_angle_deg : float
    value_mix : float
        τ.
    dtype, device

    Returns
    -------
    CosineDesign

    Raises
    ------
    TypeError, ValueError
        On bad sizes (named).
    """
    heads = require_positive_int(max_num_heads, "max_num_heads")
    dim = require_positive_int(embed_dim, "embed_dim")
    if dim < 4 + heads:
        raise ValueError(f"embed_dim must be >= 4 + max_num_heads = {4 + heads} (1 is not a direction), got {dim}")
    m = require_positive_int(n_eval, "n_eval")
    sigma = require_real(noise_sd, "noise_sd", minimum=0.0)
    tau = require_real(value_mix, "value_mix")
    angle = math.radians(require_real(partial_angle_deg, "partial_angle_deg"))
    dt, dev = require_dtype(dtype), require_device(device)
    basis = centred_basis(dim, dtype=dt, device=dev)
    g = _generator(DESIGN_SEEDS["cosine"], dev)
    z = layer_norm_tokens(_draw((m, dim), g, dt))
    mix = torch.eye(_FRAME_DIM, dtype=dt, device=dev) + _COSINE_MIX * _draw((_FRAME_DIM, _FRAME_DIM), g, dt)
    raw = _draw((heads, dim), g, dt)
    thetas = dict(zip(SHARED_FAMILIES, (0.0, angle, math.pi / 2), strict=True))

    def one_family(theta: float) -> tuple[Tensor, Tensor, Tensor]:
        frames = torch.zeros(heads, dim, _FRAME_DIM, dtype=dt, device=dev)
        frames[:, :, 0], frames[:, :, 1] = basis[:, 0], basis[:, 1]
        for h in range(heads):
            frames[h, :, 2] = math.cos(theta) * basis[:, 2] + math.sin(theta) * basis[:, 3 + h]
        xi = raw[:1].expand(heads, dim) if theta == 0.0 else raw
        xi = xi - xi.mean(1, keepdim=True)  # orthogonal to 1
        xi = xi - torch.einsum("hdk,hk->hd", frames, torch.einsum("hdk,hd->hk", frames, xi))
        xi = xi / xi.norm(dim=1, keepdim=True)
        return frames @ mix, frames @ torch.linalg.inv(mix).mT, xi

    family_heads = {name: one_family(t) for name, t in thetas.items()}
    family_heads["independent data"] = family_heads["identical"]
    return CosineDesign(basis, z, centred_target(z, basis), mix, family_heads, sigma, tau)


def _cosine_heads(design: CosineDesign, t: Tensor, y: Tensor, family: str, temperature: float) -> Tensor:
    # t (R, G, n, D) with G = 1 (shared) or H (a training set per head); y (R, G, n). Returns (R, H, m).
    w_k, w_q, xi = design.heads[family]
    keys = torch.einsum("rgnd,hdk->rhnk", t, w_k) if t.shape[1] == 1 else torch.einsum("rhnd,hdk->rhnk", t, w_k)
    values = y + design.value_mix * (
        torch.einsum("rgnd,hd->rhn", t, xi) if t.shape[1] == 1 else (t * xi[:, None]).sum(-1)
    )
    queries = torch.einsum("md,hdk->hmk", design.eval_points, w_q).expand(t.shape[0], -1, -1, -1)
    return cosine_attention(queries, keys, values, temperature=temperature)


def cosine_batch(
    design: CosineDesign,
    *,
    n_train: int,
    replicates: int,
    temperature: float,
    seed: int,
    families: Sequence[str] = FAMILIES,
    chunk: int = 16,
) -> dict[str, Tensor]:
    r"""One Monte Carlo batch of QK-normalised heads (:func:`nwlib.cosine_attention`) on LayerNorm'd tokens.

    Replicate r draws :math:`x_i \sim N(0, I_D)`, the tokens :math:`t_i` = ``layer_norm(x_i)`` and
    :math:`y_i = f(t_i) + \sigma\varepsilon_i` (:func:`centred_target`). The shared-data families see
    that one training set; the independent-data family gives head 1 the same set and heads
    2..H fresh ones from the same generator, so replicate r of every family shares its random numbers.

    Parameters
    ----------
    design : CosineDesign
    n_train, replicates : int
    temperature : float
        τ > 0 of the softmax over :math:`\langle\hat q, \hat k\rangle/\tau`.
    seed : int
    families : sequence of str, default all of :data:`FAMILIES`
    chunk : int, default 16
        Replicates per batched call (memory only; the random numbers are drawn per block of ``chunk``).

    Returns
    -------
    dict of str to Tensor
        Predictions (R, H, m) at ``design.eval_points`` for each requested family.
    """
    n = require_positive_int(n_train, "n_train")
    reps = require_positive_int(replicates, "replicates")
    tau = require_real(temperature, "temperature")
    if not tau > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    seed, step = _seed(seed), require_positive_int(chunk, "chunk")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"families must be a non-empty subset of {list(FAMILIES)}, got {list(families)}")
    dt, dev, dim, heads = (
        design.eval_points.dtype,
        design.eval_points.device,
        design.basis.shape[0],
        design.max_num_heads,
    )
    g = _generator(seed, dev)
    out: dict[str, list[Tensor]] = {f: [] for f in families}
    for start in range(0, reps, step):
        r = min(step, reps - start)
        t = layer_norm_tokens(_draw((r, heads, n, dim), g, dt))
        y = centred_target(t, design.basis) + design.noise_sd * _draw((r, heads, n), g, dt)
        for fam in families:
            if fam == "independent data":
                out[fam].append(_cosine_heads(design, t, y, fam, tau))
            else:
                out[fam].append(_cosine_heads(design, t[:, :1], y[:, :1], fam, tau))
    return {f: torch.cat(v) for f, v in out.items()}


class TemperatureChoice(NamedTuple):
    """The temperature chosen on a validation batch (see :func:`select_temperature`)."""

    temperature: float
    grid: list[float]
    mse: list[float]
    """One head's integrated MSE on the validation batch at each grid temperature."""


def temperature_grid(count: int) -> list[float]:
    """``count`` temperatures log-spaced from 0.01 to 0.5 (bandwidths √τ from 0.1 to 0.71 on the sphere).

    Examples
    --------
    >>> [round(t, 3) for t in temperature_grid(3)]
    [0.01, 0.071, 0.5]
    """
    k = require_positive_int(count, "count", minimum=2)
    return [0.01 * 50.0 ** (i / (k - 1)) for i in range(k)]


def select_temperature(
    design: CosineDesign, *, grid: Sequence[float], n_train: int, replicates: int, seed: int
) -> TemperatureChoice:
    """Choose τ by one head's integrated MSE on a validation batch, never on the batches checked later.

    One head (head 1 of the identical family, the same estimator as any single head up to its
    frame) on ``replicates`` training sets from ``seed``, at every τ of ``grid``, on common random
    numbers; the smallest MSE wins.

    Parameters
    ----------
    design : CosineDesign
    grid : sequence of float
        Temperatures > 0.
    n_train, replicates, seed : int

    Returns
    -------
    TemperatureChoice
    """
    taus = [require_real(t, "grid") for t in grid]
    if not taus or min(taus) <= 0:
        raise ValueError(f"grid must hold temperatures > 0, got {list(grid)}")
    mses = []
    for tau in taus:
        p = cosine_batch(
            design, n_train=n_train, replicates=replicates, temperature=tau, seed=seed, families=FAMILIES[:1]
        )
        mses.append(float((p[FAMILIES[0]][:, 0] - design.target).pow(2).mean()))
    best = min(range(len(taus)), key=mses.__getitem__)
    return TemperatureChoice(taus[best], taus, mses)


def zero_predictor_table(table: pd.DataFrame, zero_mse: float) -> pd.DataFrame:
    """Beside every MSE of a :class:`LawCheck` table: the zero predictor's MSE and the fraction of it removed.

    Parameters
    ----------
    table : pandas.DataFrame
        With columns ``setting``, ``H``, ``mse``, ``mse_se`` (:attr:`LawCheck.table`).
    zero_mse : float
        The mean of f² at the evaluation points (> 0).

    Returns
    -------
    pandas.DataFrame
        ``setting``, ``H``, ``mse``, ``mse_se``, ``zero_mse``, ``removed`` = 1 − mse/zero_mse, ``removed_se``.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame(dict(setting=["a"], H=[1], mse=[0.25], mse_se=[0.01]))
    >>> zero_predictor_table(t, 0.5).removed.tolist()
    [0.5]
    """
    zero = require_real(zero_mse, "zero_mse")
    if not zero > 0:
        raise ValueError(f"zero_mse must be > 0, got {zero_mse!r}")
    out = table[["setting", "H", "mse", "mse_se"]].copy()
    out["zero_mse"] = zero
    out["removed"] = 1.0 - out.mse / zero
    out["removed_se"] = out.mse_se / zero
    return out


def beats_zero(batch: Mapping[str, Tensor], target: Tensor) -> Comparison:
    """One head's integrated squared error minus the zero predictor's, mean over replicates (negative: it smooths).

    Head 1 of the identical family; the zero predictor's error is the mean of f² at the points, fixed.

    Examples
    --------
    >>> p = {n: torch.zeros(3, 1, 2, dtype=torch.float64) + torch.arange(3.0, dtype=torch.float64)[:, None, None]
    ...      for n in FAMILIES}
    >>> round(beats_zero(p, torch.ones(2, dtype=torch.float64)).estimate, 6)  # errors 1, 0, 1 minus 1
    -0.333333
    """
    batch = _families(batch, "batch")
    target = require_tensor(target, "target", min_dim=1)
    ise = (batch[FAMILIES[0]][:, 0] - target).pow(2).mean(-1)
    return mean_se(ise - target.pow(2).mean())


def _variance_reduction(p: Tensor) -> Tensor:
    # one head's variance minus the variance of the uniform average of all heads, integrated over the points
    return p[:, 0].var(0).mean() - p.mean(1).var(0).mean()


def variance_reduction_claim(batch: Mapping[str, Tensor], *, groups: int) -> list[Comparison]:
    r"""C4 on the variance: what averaging all heads removes from one head's variance, compared across families.

    The reduction of a family is :math:`\Var\hat f_1 - \Var(\frac1H\sum_h\hat f_h)`, integrated over
    the points (R − 1 denominators); the bias is left out, so heads that estimate different functions
    (and whose average is less biased) gain nothing here from that. The four families share their
    generator states, so one grouped jackknife over the replicates of all of them gives the standard errors.

    Parameters
    ----------
    batch : dict of str to Tensor
        Predictions (R, H, m) of every family.
    groups : int

    Returns
    -------
    list of Comparison
        Partly turned − identical, orthogonal nuisance − identical, independent data − partly turned,
        independent data − orthogonal nuisance (C4 as worded: identical heads remove nothing,
        decorrelated shared-data heads more, independent heads the most).
    """
    batch = _families(batch, "batch")
    groups = _groups(groups, batch[FAMILIES[0]].shape[0])

    def claim(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
        ident, part, orth, indep = (_variance_reduction(p) for p in (a, b, c, d))
        return torch.stack([part - ident, orth - ident, indep - part, indep - orth]).to(torch.float64)

    with _one_thread(batch[FAMILIES[0]].device):
        return jackknife_each(claim, *(batch[n] for n in FAMILIES), groups=groups)


# --- C3 on held-out data: the unbiased term estimates -------------------------------------


def _small_group_terms(p: Tensor, target: Tensor, size: int) -> Tensor:
    # (R/size, 3): bias², variance, covariance terms of the uniform average, from decompose on each group of `size`.
    rows = []
    for q in p.reshape(-1, size, *p.shape[1:]):
        dec = decompose(q, target)
        rows.append(torch.stack([dec.bias_sq.mean(), dec.variance.mean(), dec.covariance.mean()]))
    return torch.stack(rows).to(torch.float64)


def term_agreement(
    batch_fit: Mapping[str, Tensor],
    batch_test: Mapping[str, Tensor],
    target: Tensor,
    *,
    group_size: int,
    groups: int,
) -> dict[str, list[Comparison]]:
    r"""C3 on held-out data: the three terms estimated from small groups of A against the same terms on B.

    For every family, the uniform average of all its heads is decomposed (:func:`nwlib.decompose`)
    on each group of ``group_size`` consecutive replicates of A, and the terms are averaged over the
    groups; on B it is decomposed once, on all replicates. Each difference (A's small-group mean minus
    B's term) is divided by B's MSE. The estimators are unbiased at every sample size, so the
    differences have mean 0; a biased estimator (the plug-in squared bias :math:`(\bar f - f)^2`, say,
    whose bias is the ensemble variance over ``group_size``) would move them. A and B are
    independent: one jackknife over pairs of replicate groups gives the standard errors.

    Parameters
    ----------
    batch_fit, batch_test : dict of str to Tensor
        Predictions (R, H, m) of every family, the same R.
    target : Tensor, shape (m,)
    group_size : int
        >= 2; R/groups must be a multiple of it.
    groups : int
        Jackknife groups.

    Returns
    -------
    dict of str to list of Comparison
        Per family: bias², variance and covariance differences, in units of B's MSE, then their sum (A's
        small-group terms add up to A's MSE, B's to B's, so the sum is A's MSE minus B's over B's).
    """
    batch_fit, batch_test = _families(batch_fit, "batch_fit"), _families(batch_test, "batch_test")
    target = require_tensor(target, "target", min_dim=1)
    size = require_positive_int(group_size, "group_size", minimum=2)
    reps = batch_fit[FAMILIES[0]].shape[0]
    groups = _groups(groups, reps)
    if (reps // groups) % size:
        raise ValueError(f"group_size must divide R/groups = {reps // groups}, got {size}")
    out = {}
    with _one_thread(target.device):
        for name in FAMILIES:
            small = _small_group_terms(batch_fit[name], target, size)  # (R/size, 3)
            pb = batch_test[name].reshape(small.shape[0], size, *batch_test[name].shape[1:])

            def gap(s: Tensor, q: Tensor) -> Tensor:
                dec = decompose(q.reshape(-1, *q.shape[2:]), target)
                on_b = torch.stack([dec.bias_sq.mean(), dec.variance.mean(), dec.covariance.mean()]).to(torch.float64)
                diff = (s.mean(0) - on_b) / float(dec.mse.mean())
                return torch.cat([diff, diff.sum().reshape(1)])

            out[name] = jackknife_each(gap, small, pb, groups=groups)
    return out


def average_variance_bound(num_heads: int) -> tuple[Any, Any, Any]:
    r"""C4's necessity, symbolically: the variance of the average is the mean covariance plus (V̄ − C̄)/H.

    For H heads with errors of covariance C (``V_h`` on the diagonal, ``C_hh'`` off it), with
    :math:`\bar V` the mean variance and :math:`\bar C` the mean cross-head covariance,
    :math:`\Var(\frac1H\sum_h\hat f_h) = \bar C + (\bar V - \bar C)/H` and
    :math:`\E\sum_{h<h'}(\varepsilon_h - \varepsilon_{h'})^2 = H(H-1)(\bar V - \bar C) \ge 0`, so the
    variance of the average never falls below :math:`\bar C`, however many heads.

    Parameters
    ----------
    num_heads : int
        H >= 2.

    Returns
    -------
    (variance_of_average, mean_covariance, spread) : sympy expressions
        ``spread`` = :math:`\E\sum_{h<h'}(\varepsilon_h - \varepsilon_{h'})^2/(H(H-1))`, which equals
        :math:`\bar V - \bar C` and is an expectation of a square.

    Examples
    --------
    >>> import sympy as sp
    >>> var_avg, c_bar, spread = average_variance_bound(3)
    >>> sp.expand(var_avg - (c_bar + spread / 3))
    0
    """
    import sympy as sp

    heads = require_positive_int(num_heads, "num_heads", minimum=2)
    eps = sp.symbols(f"varepsilon_1:{heads + 1}", real=True)
    var = sp.symbols(f"V_1:{heads + 1}", positive=True)
    cov = sp.Matrix(
        heads, heads, lambda i, j: var[i] if i == j else sp.Symbol(f"C_{min(i, j) + 1}{max(i, j) + 1}", real=True)
    )
    var_avg = expectation((sum(eps) / heads) ** 2, eps, cov)
    c_bar = sp.expand(sum(cov[i, j] for i in range(heads) for j in range(heads) if i != j) / (heads * (heads - 1)))
    sq = sum((eps[i] - eps[j]) ** 2 for i in range(heads) for j in range(i + 1, heads))
    spread = sp.expand(expectation(sq, eps, cov) / (heads * (heads - 1)))
    return var_avg, c_bar, spread


# --- heads on disjoint blocks: one grid point per target ---------------------------------


def combination_bandwidths(count: int, *, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """The bandwidth grid of the block experiment: ``count`` values log-spaced from 0.15 to 2.

    Examples
    --------
    >>> combination_bandwidths(3, dtype=torch.float64).tolist()  # doctest: +ELLIPSIS
    [0.15..., 0.547..., 2.0...]
    """
    count = require_positive_int(count, "count", minimum=2)
    low, high = _BANDWIDTH_RANGE
    return torch.logspace(math.log10(low), math.log10(high), count, dtype=require_dtype(dtype), device=device)


_POINT_KEYS = ("task", "embed_dim", "num_heads", "n", "m", "replicates", "bandwidths", "noise_sd", "groups", "dtype")


def _pair(c: Comparison) -> list[float]:
    return [c.estimate, c.se]


def combination_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One target of the block experiment: heads on disjoint coordinate blocks, combined four ways.

    Head h sees the coordinate block :math:`B_h = \{h, h + H, h + 2H, \dots\}` of
    :math:`\mathbb{R}^D` (interleaved, so that :math:`x_1` and :math:`x_2` lie in different blocks).
    The combinations (:data:`COMBINATIONS`): the uniform average, the sum, least-squares output
    weights fitted on batch A, and one full-dimensional Gaussian head (:math:`W = I_D`). Each picks
    its bandwidth from the grid (:func:`combination_bandwidths`) by its MSE on A; all are
    evaluated on batch B, whose training sets are the same for every combination (one generator
    state per batch: every grid bandwidth is a "head" with its own bandwidth), so differences are
    paired. The evaluation points are part of the design (:data:`DESIGN_SEEDS` ``["blocks"]``).
    Runs through :func:`nwlib.sweep.run_sweep`: the targets are independent grid points.

    Parameters
    ----------
    point : Mapping
        ``task`` (one of :data:`COMBINATION_TASKS`), ``embed_dim`` (D), ``num_heads`` (H, dividing
        D), ``n``, ``m``, ``replicates`` (R, divisible by ``groups``), ``bandwidths`` (grid size),
        ``noise_sd``, ``groups`` (jackknife) and ``dtype`` ("float32" or "float64").
    seed : int
        Seeds batches A and B (through :func:`nwlib.sweep.point_seed`).
    device : str, default "cpu"

    Returns
    -------
    dict
        JSON values: ``task``, ``signal`` (mean f² at the evaluation points), ``combinations``
        (per combination: ``bandwidth``, ``mse`` and ``bias`` as [estimate, se], ``bias_sq`` and
        ``variance`` (variance + covariance) of the integrated decomposition), ``full_every_h``
        (the full head's MSE at every grid bandwidth), ``full_vs_ls_every_h`` (paired against the
        least-squares weights), ``pairs`` ([a, b, estimate, se] for every ordered pair, a − b),
        ``full_minus_ls_bias`` (bias² of the full head minus that of the output weights, refitting
        the weights, jackknifed over A and B together), ``sum_avg_gap`` ((MSE of the sum − MSE of
        the average)/MSE of the average, jackknifed) and ``lost`` (per combination, MSE minus 0.9
        mean f²), each [estimate, se].

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    require_point(point, _POINT_KEYS)
    task_name = require_choice(point["task"], "task", tuple(COMBINATION_TASKS))
    dim = require_positive_int(point["embed_dim"], "embed_dim")
    heads = require_positive_int(point["num_heads"], "num_heads")
    if dim % heads:
        raise ValueError(f"num_heads must divide embed_dim, got num_heads={heads}, embed_dim={dim}")
    n = require_positive_int(point["n"], "n")
    m = require_positive_int(point["m"], "m")
    reps = require_positive_int(point["replicates"], "replicates", minimum=3)
    count = require_positive_int(point["bandwidths"], "bandwidths", minimum=2)
    groups = _groups(point["groups"], reps)
    dtype_name = require_choice(point["dtype"], "dtype", ("float32", "float64"))
    seed = _seed(seed)
    dev = resolve_device(device)
    dt = getattr(torch, dtype_name)

    eye_d = torch.eye(dim, dtype=dt, device=dev)
    w_blocks = torch.stack([eye_d[:, h::heads] for h in range(heads)])  # (H, D, d_k)
    grid = combination_bandwidths(count, dtype=dt, device=dev)
    z = _draw((m, dim), _generator(DESIGN_SEEDS["blocks"], dev), dt)
    task = make_task(task_name, dim, noise_sd=point["noise_sd"])
    f_c, one = task.f(z), torch.ones(1, dtype=dt, device=dev)

    def block_runs(batch_seed: int) -> tuple[Tensor, Tensor]:
        # One call per kind of head, from one generator state: every grid bandwidth is a "head" of its own.
        small = simulate(
            task,
            w_blocks.repeat(count, 1, 1),
            z,
            n=n,
            replicates=reps,
            generator=_generator(batch_seed, dev),
            bandwidth=grid.repeat_interleave(heads),
        )
        full = simulate(
            task,
            eye_d.expand(count, dim, dim),
            z,
            n=n,
            replicates=reps,
            generator=_generator(batch_seed, dev),
            bandwidth=grid,
        )
        return small.unflatten(1, (count, heads)), full  # (R, K, H, m), (R, K, m)

    small_a, full_a = block_runs(point_seed(seed, {"batch": "A"}))
    small_b, full_b = block_runs(point_seed(seed, {"batch": "B"}))
    ones = torch.ones(heads, dtype=dt, device=dev)

    def weights(kind: str, heads_a: Tensor) -> Tensor:
        if kind == COMBINATIONS[0]:
            return ones / heads
        if kind == COMBINATIONS[1]:
            return ones
        return least_squares_weights(heads_a, f_c)

    per_rep, combos, chosen = {}, {}, {}
    with _one_thread(dev):
        for kind in COMBINATIONS:
            if kind == COMBINATIONS[3]:  # the full head: one weight 1, the bandwidth grid along dimension 1
                mse_a = [float(replicate_mse(full_a[:, k : k + 1], f_c, one).mean()) for k in range(count)]
                k_best = min(range(count), key=mse_a.__getitem__)  # the first minimum, as numpy's argmin
                heads_a, heads_b, alpha = full_a[:, k_best][:, None], full_b[:, k_best][:, None], one
            else:
                mse_a = [
                    float(replicate_mse(small_a[:, k], f_c, weights(kind, small_a[:, k])).mean()) for k in range(count)
                ]
                k_best = min(range(count), key=mse_a.__getitem__)
                heads_a, heads_b = small_a[:, k_best], small_b[:, k_best]
                alpha = weights(kind, heads_a)
            per_rep[kind] = replicate_mse(heads_b, f_c, alpha)
            detail = decompose(heads_b, f_c, alpha).integrated()
            chosen[kind] = (heads_a, heads_b)
            combos[kind] = dict(
                bandwidth=float(grid[k_best]),
                mse=_pair(mean_se(per_rep[kind])),
                bias=[detail.bias_sq, detail.bias_sq_se],
                bias_sq=detail.bias_sq,
                variance=detail.variance + detail.covariance,
            )
        full_every = [replicate_mse(full_b[:, k : k + 1], f_c, one) for k in range(count)]
        ls_kind, full_kind = COMBINATIONS[2], COMBINATIONS[3]
        sa, sb = chosen[ls_kind]
        # The bias² of the least-squares combination moves with the weights fitted on A (to first order, unlike
        # its MSE): its standard error refits them, jackknifing A and B together (paired replicate groups).
        combos[ls_kind]["bias"] = _pair(
            jackknife(
                lambda a, b: decompose(b, f_c, least_squares_weights(a, f_c)).bias_sq.mean(), sa, sb, groups=groups
            )
        )
        full_minus_ls = jackknife(
            lambda a, b, c: (
                decompose(c, f_c, one).bias_sq.mean() - decompose(b, f_c, least_squares_weights(a, f_c)).bias_sq.mean()
            ),
            sa,
            sb,
            chosen[full_kind][1],
            groups=groups,
        )
        sum_avg = jackknife(
            lambda a, b: (a.mean() - b.mean()) / b.mean(),
            per_rep[COMBINATIONS[1]],
            per_rep[COMBINATIONS[0]],
            groups=groups,
        )
        signal = float(f_c.pow(2).mean())
        return dict(
            task=task_name,
            signal=signal,
            combinations=combos,
            full_every_h=[_pair(mean_se(e)) for e in full_every],
            full_vs_ls_every_h=[_pair(paired(e, per_rep[ls_kind])) for e in full_every],
            pairs=[
                [a, b, *_pair(paired(per_rep[a], per_rep[b]))] for a in COMBINATIONS for b in COMBINATIONS if a != b
            ],
            full_minus_ls_bias=_pair(full_minus_ls),
            sum_avg_gap=_pair(sum_avg),
            lost={k: _pair(mean_se(per_rep[k] - 0.9 * signal)) for k in COMBINATIONS},
        )


@dataclass(frozen=True)
class CombinationResult:
    """One target of the block experiment, read back from :func:`combination_point`'s record.

    Attributes mirror the record's keys (see :func:`combination_point`), with every
    [estimate, se] as a :class:`~nwlib.evidence.Comparison` and ``pairs`` keyed by (a, b).
    """

    task: str
    signal: float
    bandwidth: dict[str, float]
    mse: dict[str, Comparison]
    bias: dict[str, Comparison]
    bias_sq: dict[str, float]
    variance: dict[str, float]
    full_every_h: list[Comparison]
    full_vs_ls_every_h: list[Comparison]
    pairs: dict[tuple[str, str], Comparison]
    full_minus_ls_bias: Comparison
    sum_avg_gap: Comparison
    lost: dict[str, Comparison]

    @property
    def full_min(self) -> Comparison:
        """The full head's MSE at its best grid bandwidth on batch B."""
        return min(self.full_every_h, key=lambda c: c.estimate)


def combination_results(records: Sequence[Mapping[str, Any]]) -> dict[str, CombinationResult]:
    """Read :func:`combination_point`'s records (as :func:`nwlib.sweep.run_sweep` returns them), by task.

    Parameters
    ----------
    records : sequence of Mapping

    Returns
    -------
    dict of str to CombinationResult
        Keyed by task, in the order of ``records``.

    Raises
    ------
    TypeError, ValueError
        If a record is not one of :func:`combination_point`.
    """
    out: dict[str, CombinationResult] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping) or "combinations" not in rec:
            raise ValueError(f"records[{i}] is not a record of combination_point")
        combos = rec["combinations"]

        def cmp(pair: Sequence[float]) -> Comparison:
            return estimate(pair[0], pair[1])

        out[rec["task"]] = CombinationResult(
            task=rec["task"],
            signal=float(rec["signal"]),
            bandwidth={k: float(combos[k]["bandwidth"]) for k in COMBINATIONS},
            mse={k: cmp(combos[k]["mse"]) for k in COMBINATIONS},
            bias={k: cmp(combos[k]["bias"]) for k in COMBINATIONS},
            bias_sq={k: float(combos[k]["bias_sq"]) for k in COMBINATIONS},
            variance={k: float(combos[k]["variance"]) for k in COMBINATIONS},
            full_every_h=[cmp(p) for p in rec["full_every_h"]],
            full_vs_ls_every_h=[cmp(p) for p in rec["full_vs_ls_every_h"]],
            pairs={(a, b): estimate(e, s) for a, b, e, s in rec["pairs"]},
            full_minus_ls_bias=cmp(rec["full_minus_ls_bias"]),
            sum_avg_gap=cmp(rec["sum_avg_gap"]),
            lost={k: cmp(rec["lost"][k]) for k in COMBINATIONS},
        )
    return out


def combination_tables(results: Mapping[str, CombinationResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The block experiment as two tables: per target and combination, and its paired differences.

    Returns
    -------
    combos : DataFrame
        ``task``, ``combination``, ``bandwidth``, ``mse``, ``mse_se``, ``bias_sq``, ``var``
        (variance + covariance), ``signal``, ``full_min_over_grid``.
    pairs : DataFrame
        ``task``, ``a``, ``b``, ``mean`` (of a − b), ``se``.
    """
    import pandas as pd

    combos = pd.DataFrame(
        [
            dict(
                task=name,
                combination=kind,
                bandwidth=res.bandwidth[kind],
                mse=res.mse[kind].estimate,
                mse_se=res.mse[kind].se,
                bias_sq=res.bias_sq[kind],
                var=res.variance[kind],
                signal=res.signal,
                full_min_over_grid=res.full_min.estimate,
            )
            for name, res in results.items()
            for kind in COMBINATIONS
        ]
    )
    pairs = pd.DataFrame(
        [
            dict(task=name, a=a, b=b, mean=c.estimate, se=c.se)
            for name, res in results.items()
            for (a, b), c in res.pairs.items()
        ]
    )
    return combos, pairs


def combination_entries(
    results: Mapping[str, CombinationResult], *, dtype: torch.dtype, replicates: int
) -> list[GlueEntry]:
    """Glue entries of the block experiment, ``cmb_..._<task>`` (task short names of :data:`COMBINATION_TASKS`).

    Per target: ``cmb_signal`` (mean f², fixed design: up to rounding), ``cmb_full_min`` (the full
    head at its best grid bandwidth on B); per combination ``cmb_<c>`` (MSE), ``cmb_<c>_h`` (the
    bandwidth chosen on A: an argmin, informational) and ``cmb_<c>_bias``; per ordered pair
    ``cmb_<a>_<b>`` (paired difference); every estimate with its ``_se`` (see :func:`estimate_entries`).

    Parameters
    ----------
    results : dict of str to CombinationResult
    dtype : torch.dtype
    replicates : int
        Sizes the standard errors' tolerances (the notebook's ``replicates``).

    Returns
    -------
    list of GlueEntry
    """
    entries: list[GlueEntry] = []

    def add(key: str, c: Comparison, se_key: str) -> None:
        entries.extend(estimate_entries(key, c, se_key, dtype=dtype, replicates=replicates))

    for name, res in results.items():
        ts = COMBINATION_TASKS[name]
        entries.append(GlueEntry(f"cmb_signal_{ts}", res.signal, {"tol": fp_tolerance(dtype, scale=res.signal)}))
        add(f"cmb_full_min_{ts}", res.full_min, f"cmb_full_min_se_{ts}")
        for kind, ks in COMBINATION_KEYS.items():
            add(f"cmb_{ks}_{ts}", res.mse[kind], f"cmb_{ks}_se_{ts}")
            entries.append(GlueEntry(f"cmb_{ks}_h_{ts}", res.bandwidth[kind], {"verify": False}))
            add(f"cmb_{ks}_bias_{ts}", res.bias[kind], f"cmb_{ks}_bias_se_{ts}")
        for (a, b), c in res.pairs.items():
            ka, kb = COMBINATION_KEYS[a], COMBINATION_KEYS[b]
            add(f"cmb_{ka}_{kb}_{ts}", c, f"cmb_{ka}_{kb}_se_{ts}")
    return entries


# --- the speed of the engine -----------------------------------------------------------


class Benchmark(NamedTuple):
    """One timed :func:`nwlib.simulate` call (see :func:`engine_benchmark`)."""

    seconds: float
    threads: int
    """torch's CPU threads during the call."""
    shape: tuple[int, ...]
    """Of the predictions: (R, 8, 256)."""
    finite: bool
    """Whether every prediction is finite."""


def engine_benchmark(*, replicates: int, seed: int, device: torch.device | str = "cpu") -> Benchmark:
    """Time the engine on the benchmark size: H = 8 heads (d_k = 4, D = 16), n = 2048, m = 256, float32.

    Random projections (N(0, 1)/4) and evaluation points from ``seed``, the ``isotropic`` task,
    scalar responses, the engine's default bandwidth.

    Parameters
    ----------
    replicates : int
        R.
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    Benchmark
    """
    reps = require_positive_int(replicates, "replicates")
    seed = _seed(seed)
    dev = require_device(device)
    task = make_task("isotropic", 16)
    g = _generator(seed, dev)
    w = torch.randn(8, 16, 4, generator=g, device=dev) / 4
    z = torch.randn(256, 16, generator=g, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = simulate(task, w, z, n=2048, replicates=reps, generator=g)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return Benchmark(seconds, torch.get_num_threads(), tuple(out.shape), bool(torch.isfinite(out).all()))


# --- the chapter's tables, for reading (nwlib.book.table) -----------------------------------------

HEADERS: dict[str, str] = {
    "setting": "family",
    "mse": "MSE",
    "predicted": "MSE predicted from A",
    "ratio_gap": "variance ratio, B − predicted",
    "bias_sq": "bias²",
    "variance": "Σ α²V",
    "covariance": "Σ αα′C",
    "step": "step",
    "diff": "gain difference (paired)",
    "rho_measured_B": "ρ measured (B)",
    "rho_predicted_C": "ρ predicted (C)",
    "noise_part": "noise part",
    "design_part": "design part",
    "mse_ls": "MSE, output weights",
    "mse_uniform": "MSE, average",
    "ls_minus_uniform": "output weights − average",
    "weight_sum": "sum of output weights",
    "zero_mse": "zero predictor's MSE",
    "removed": "share removed",
    "temperature": "temperature τ",
    "mse_validation": "MSE, one head (validation)",
    "task": "target",
    "combination": "combination",
    "bandwidth": "bandwidth h (from A)",
    "var": "variance + covariance",
    "signal": "mean f²",
    "full_min_over_grid": "full head, lowest MSE on the grid",
    "contrast": "contrast",
    "estimate": "estimate",
    "mean_distance": "mean ‖k − q‖",
    "mean_key_norm": "mean ‖k‖",
    "n_eff": "n_eff",
}
"""Words for the column names of the chapter's tables (:func:`format_table`)."""

ROW_KEYS: tuple[str, ...] = (
    "setting",
    "H",
    "step",
    "task",
    "combination",
    "contrast",
    "a",
    "b",
    "h",
    "kernel",
    "temperature",
)
"""Columns that name a row of the chapter's tables: :func:`format_table` shows the leading ones as the index."""

_ROW_KEYS = frozenset(ROW_KEYS)
_VALUE_WORDS = {"single_index": "single index"}
_KERNEL_WORDS = {"gauss": "Gaussian", "exp": "dot-product (exp)", "unit": "exp, keys normalised"}
_SUMMARY_ROWS = {
    "rho": "ρ (A)",
    "rhoB": "ρ (B)",
    "mse1": "MSE, H = 1",
    "mseH": "MSE, H_max",
    "predH": "MSE, H_max, predicted from A",
    "gain": "gain MSE₁ − MSE_Hmax",
    "floor": "floor b² + ρV̄",
    "bias": "bias², H_max",
    "var1": "variance, H = 1",
    "cov": "Σ αα′C, H_max",
    "lsH": "MSE, H_max, output weights",
    "ls_diff": "output weights − average, H_max",
    "ls_sum": "sum of output weights",
}
_TERM_NAMES = ("bias²", "variance", "covariance", "sum")


def _se_pairs(frame: pd.DataFrame) -> dict[str, str]:
    """Estimate → SE columns: ``c`` with ``c_se`` (``a_b`` with ``a_se``); a bare ``se`` with the column before it."""
    columns = [str(c) for c in frame.columns]
    pairs = {c: f"{c}_se" for c in columns if f"{c}_se" in columns}
    for c in columns:  # "rho_measured_B" with "rho_measured_se": the SE of the estimate without its batch
        stem = c.rsplit("_", 1)[0]
        if c not in pairs and "_" in c and f"{stem}_se" in columns and f"{stem}_se" not in pairs.values():
            pairs[c] = f"{stem}_se"
    for i, c in enumerate(columns):
        if c == "se" and i > 0:
            pairs[columns[i - 1]] = c
    return pairs


def _at_rounding(frame: pd.DataFrame, pairs: Mapping[str, str], rounding: float) -> pd.DataFrame:
    """Pairs whose SE is at rounding level (≤ ``rounding``) lose the SE, and their estimate too where it is 0."""
    frame = frame.copy()
    for est, err in pairs.items():
        tiny = frame[err].abs() <= rounding
        frame[est] = frame[est].astype(float).mask(tiny & (frame[est].abs() <= rounding), 0.0)
        frame[err] = frame[err].astype(float).mask(tiny, math.nan)
    return frame


def _no_nan(shown: pd.DataFrame) -> pd.DataFrame:
    return shown.replace("nan", "–")


def format_table(
    frame: pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    se: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    rounding: float = 0.0,
    digits: int = 3,
    index: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One of the chapter's tables for reading: :func:`nwlib.book.table` with the chapter's words.

    Every estimate column ``c`` with an SE column (``c_se``, or a bare ``se`` right after it, or as
    ``se`` says) is shown as ``estimate ± SE``; an SE at rounding level (≤ ``rounding``: identical
    heads, a value fixed by construction) is left out and such an estimate that is 0 to rounding
    shows as 0; a missing estimate (NaN) as "–". Headers come from :data:`HEADERS` (then ``headers``),
    and library task names read as words.

    Parameters
    ----------
    frame : pandas.DataFrame
        Any of the chapter's tables (:attr:`LawCheck.table`, :meth:`Gains.step_table`, ...).
    columns : sequence of str, optional
        The estimate columns to show, in order (their SE columns come along); default all.
    se : mapping of str to str, optional
        Estimate → SE columns, replacing the automatic pairing.
    headers : mapping of str to str, optional
        Headers beyond (or instead of) :data:`HEADERS`.
    rounding : float, default 0.0
        The largest SE taken as rounding (the notebook's ``rounding_bound``).
    digits : int, default 3
        Significant digits of the columns without an SE.
    index : sequence of str, optional
        The columns that name a row (family and H, say), shown as the table's index; default the
        leading columns of the frame among :data:`ROW_KEYS`.

    Returns
    -------
    pandas.DataFrame of str
        Indexed by ``index`` (a range index when there is none).

    Raises
    ------
    TypeError
        If ``frame`` is not a DataFrame.
    ValueError
        If ``columns``, ``se`` or ``index`` name a column the frame lacks, or ``rounding`` is negative.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame(dict(setting=["identical", "independent data"], mse=[0.16943, 0.04355],
    ...                       mse_se=[0.0032, 0.00056], ratio_gap=[-2e-16, 0.0022], ratio_gap_se=[5e-16, 0.0038]))
    >>> shown = format_table(t, rounding=1e-12)
    >>> list(shown.index), list(shown.columns)
    (['identical', 'independent data'], ['MSE', 'variance ratio, B − predicted'])
    >>> shown["variance ratio, B − predicted"].tolist()  # 0 to rounding: no SE of 5e-16 (± joined by no-break spaces)
    ['0', '0.0022\\xa0±\\xa00.0038']
    """
    import pandas as pd

    from ..book import table

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    bound = require_real(rounding, "rounding")
    if bound < 0:
        raise ValueError(f"rounding must be >= 0, got {rounding!r}")
    pairs = dict(se) if se is not None else _se_pairs(frame)
    if columns is not None:
        pairs = {c: s for c, s in pairs.items() if c in columns}
        keep = [c for c in columns if c not in pairs.values()]
        frame = frame[[*keep, *(s for c, s in pairs.items() if c in keep)]]
    for name in (*pairs, *pairs.values()):
        if name not in frame.columns:
            raise ValueError(f"se names the column {name!r}, which the frame does not have")
    frame = _at_rounding(frame, pairs, bound)
    for c in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[c]):
            frame[c] = frame[c].map(lambda v: _VALUE_WORDS.get(v, v) if isinstance(v, str) else v)
    if index is None:  # the leading columns that name a row
        leading: list[str] = []
        for c in frame.columns:
            if c not in _ROW_KEYS:
                break
            leading.append(c)
        index = leading
    missing = [c for c in index if c not in frame.columns]
    if missing:
        raise ValueError(f"index names the column(s) {missing}, which the frame does not have")
    words = {**HEADERS, **(headers or {})}
    if index:
        keys = frame[list(index)].map(_key)  # as text: the book's table keeps a text index as it is
        frame = frame.drop(columns=list(index))
        frame.index = pd.MultiIndex.from_frame(keys) if len(index) > 1 else pd.Index(keys.iloc[:, 0])
    shown = _no_nan(table(frame, se=pairs, digits=digits, headers=words, index=bool(index)))
    if index:
        shown.index = shown.index.set_names([words.get(c, c) for c in index])
    return shown


def _key(value: Any) -> str:
    """A row key as text: integers as they are, other numbers with three significant digits."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return str(int(value)) if isinstance(value, float) else str(value)


def format_summary(summary: Mapping[str, Mapping[str, Comparison]], *, rounding: float = 0.0) -> pd.DataFrame:
    """:func:`family_summary` for reading: one row per quantity, one column per family, ``estimate ± SE``.

    Parameters
    ----------
    summary : dict of str to dict of str to Comparison
        From :func:`family_summary`.
    rounding : float, default 0.0
        The largest SE taken as rounding (see :func:`format_table`).

    Returns
    -------
    pandas.DataFrame of str
        Index: the quantities in words; columns: the families.
    """
    import pandas as pd

    from ..book import table, with_se

    if not isinstance(summary, Mapping) or not summary:
        raise TypeError("summary must be the non-empty dict of family_summary")
    bound = require_real(rounding, "rounding")

    def cell(c: Comparison) -> str:
        if not math.isfinite(c.se) or c.se <= bound:
            return with_se(0.0 if abs(c.estimate) <= bound else c.estimate, math.nan)
        return with_se(c.estimate, c.se)

    keys = list(next(iter(summary.values())))
    rows = {family: [cell(values[k]) for k in keys] for family, values in summary.items()}
    return table(pd.DataFrame(rows, index=[_SUMMARY_ROWS.get(k, k) for k in keys]))


def format_terms(terms: Mapping[str, Sequence[Comparison]], *, rounding: float = 0.0) -> pd.DataFrame:
    """:func:`term_agreement` for reading: one row per family, a column per term (A − B, in B's MSE).

    Parameters
    ----------
    terms : dict of str to list of Comparison
        From :func:`term_agreement`: per family, bias², variance, covariance and their sum.
    rounding : float, default 0.0

    Returns
    -------
    pandas.DataFrame of str
        Columns ``family`` and one per term, cells ``difference ± SE``.
    """
    import pandas as pd

    if not isinstance(terms, Mapping):
        raise TypeError(f"terms must be the dict of term_agreement, got {type(terms).__name__}")
    columns: dict[str, list[Any]] = {"setting": list(terms)}
    for k, name in enumerate(_TERM_NAMES):
        columns[name] = [cs[k].estimate for cs in terms.values()]
        columns[f"{name}_se"] = [cs[k].se for cs in terms.values()]
    return format_table(pd.DataFrame(columns), headers={n: f"{n}, A − B" for n in _TERM_NAMES}, rounding=rounding)


def format_weight_stats(study: WeightStudy) -> pd.DataFrame:
    """:attr:`WeightStudy.stats` for reading: one row per bandwidth and kernel, the kernels in words.

    Returns
    -------
    pandas.DataFrame of str
        Columns ``bandwidth h``, ``kernel``, ``mean ‖k − q‖``, ``mean ‖k‖``, ``n_eff``.
    """
    import pandas as pd

    if not isinstance(study, WeightStudy):
        raise TypeError(f"study must be a WeightStudy, got {type(study).__name__}")
    rows = [
        dict(h=study.bandwidths[row], kernel=_KERNEL_WORDS.get(kind, kind), **stats)
        for (row, kind), stats in study.stats.items()
    ]
    return format_table(pd.DataFrame(rows), headers={"h": "bandwidth h", "kernel": "kernel"})


def format_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """The paired differences of :func:`combination_tables` for reading, each pair once.

    A pair is kept where ``a`` comes before ``b`` in :data:`COMBINATIONS`.

    The dropped rows are the same pairs the other way round (their negatives).

    Returns
    -------
    pandas.DataFrame of str
        Columns ``target``, ``a``, ``b``, ``MSE a − MSE b``.
    """
    import pandas as pd

    if not isinstance(pairs, pd.DataFrame):
        raise TypeError(f"pairs must be a pandas DataFrame, got {type(pairs).__name__}")
    order = {c: k for k, c in enumerate(COMBINATIONS)}
    once = pairs[[order[a] < order[b] for a, b in zip(pairs.a, pairs.b, strict=True)]]
    return format_table(once, headers={"a": "a", "b": "b", "mean": "MSE a − MSE b"})
