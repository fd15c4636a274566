r"""Chapter 1 (claims C1 and C2): softmax attention is a Nadaraya–Watson estimator.

The experiments behind ``notebooks/ch01_attention_is_nw.ipynb`` and its page
``book/ch01_attention_is_nw.md``. The sympy derivations and their ``assert``\ s stay in the
notebook; only the two sides of C2 are built here (:func:`symbolic_multihead`).

* C1, one head is NW with the exponential kernel :math:`\exp(\langle q,k\rangle/h^2)`,
  :math:`h = d_k^{1/4}`: :func:`torch_agreement` compares :func:`nwlib.nadaraya_watson` with
  ``torch.nn.functional.scaled_dot_product_attention`` and the explicit formula;
  :func:`circle_weights` checks that for keys of equal norm the attention weights are the
  Gaussian-kernel weights with :math:`\sigma = d_k^{1/4}` (and, for unequal norms, the Gaussian
  weights tilted by :math:`\exp(\lVert k\rVert^2/(2\sigma^2))`).
* C2, multi-head attention is :math:`b_O + \sum_h \alpha_h \hat f_h`: :func:`symbolic_multihead`
  builds both sides in sympy for the notebook's derivation; :func:`random_attention` and
  :func:`mha_agreement` compare :class:`nwlib.MultiHeadNW` and the explicit ensemble sum with
  ``torch.nn.MultiheadAttention``; :func:`null_space_change` moves the keys along the null space
  of one head's key projection.
* One head as a kernel smoother in one dimension, :math:`y = \sin(2\pi x) + \varepsilon`
  (:func:`sine_target`): :func:`smoother_demo` (fits, one query's weights, effective numbers of
  points) and the Monte Carlo bias–variance study :func:`mise_study` (MISE split exactly into
  squared bias, noise variance, design variance and a cross term, delete-a-group jackknife
  standard errors; :func:`mise_table`, :func:`mise_comparisons`), with the leave-one-out
  bandwidth on the same replicates, :func:`cv_study`.

Every function is a pure function of its sizes, a seed and a device. Float64 work runs on the
CPU when the device is Apple's MPS (which has no float64).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import require_device, require_positive_int, require_real, require_tensor
from ..bandwidth import select_bandwidth
from ..combination import grouped_jackknife
from ..device import resolve_device
from ..evidence import Comparison, estimate
from ..kernels import nadaraya_watson, nadaraya_watson_weights
from ..multihead import MultiHeadNW

__all__ = [
    "DTYPES",
    "MISE_PARTS",
    "TOLERANCES",
    "Agreement",
    "AttentionCase",
    "CircleCase",
    "CircleWeights",
    "CvStudy",
    "MiseStudy",
    "SmootherDemo",
    "SymbolicMultihead",
    "circle_weights",
    "cv_study",
    "float64_device",
    "mha_agreement",
    "mise_comparisons",
    "mise_study",
    "mise_table",
    "null_space_change",
    "random_attention",
    "sine_target",
    "smoother_demo",
    "symbolic_multihead",
    "torch_agreement",
]

DTYPES: dict[str, torch.dtype] = {"f32": torch.float32, "f64": torch.float64}
"""The dtypes of the comparisons with PyTorch, by the tag that ends their keys."""

TOLERANCES: dict[str, float] = {"f32": 1e-5, "f64": 1e-12}
"""Largest absolute difference accepted as rounding in the comparisons with PyTorch (outputs are O(1))."""

MISE_PARTS: tuple[str, ...] = (
    "mise",
    "sq_bias",
    "noise_var",
    "design_var",
    "cross",
    "cross_share",
    "noise_excess",
    "bias_excess",
    "design_over_noise",
    "design_share",
    "design_minus_noise",
    "variance_step",
)
"""The per-bandwidth quantities of :func:`mise_study`, in the order its jackknife computes them.

``mise``; its split ``sq_bias`` + ``noise_var`` + ``design_var`` + ``cross``; ``cross_share`` =
cross / MISE; ``noise_excess`` = noise − bias² − design; ``bias_excess`` = bias² − noise − design;
``design_over_noise``; ``design_share`` = design / MISE; ``design_minus_noise``; ``variance_step``,
the step of noise + design variance from the previous bandwidth (0 at the first).
"""


def float64_device(device: torch.device | str) -> torch.device:
    """Where float64 work runs: ``device`` itself, or the CPU for Apple's MPS (no float64 there).

    Examples
    --------
    >>> float64_device("cpu")
    device(type='cpu')
    """
    dev = require_device(device)
    return dev if dev.type != "mps" else torch.device("cpu")


def _device_for(dtype: torch.dtype, device: torch.device) -> torch.device:
    return float64_device(device) if dtype == torch.float64 else device


def _randn(*shape: int, dtype: torch.dtype, generator: torch.Generator) -> Tensor:
    """Standard normals drawn in float64 on the generator's device, then cast (one stream for every dtype)."""
    return torch.randn(*shape, generator=generator, device=generator.device, dtype=torch.float64).to(dtype)


def _max_abs(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


# --- C1 and C2 against PyTorch --------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """Largest absolute differences between implementations, by ``<comparison>_<dtype tag>``.

    Attributes
    ----------
    differences : dict of str to float
        E.g. ``{"nw_vs_sdpa_f32": 2e-7, ...}``; the tag (``f32``/``f64``) is a key of :data:`DTYPES`.
    """

    differences: dict[str, float]

    @property
    def within_tolerance(self) -> bool:
        """Whether every difference is at most :data:`TOLERANCES` of its dtype."""
        return all(value <= TOLERANCES[key[-3:]] for key, value in self.differences.items())


def torch_agreement(
    batch: int,
    num_heads: int,
    queries: int,
    keys: int,
    head_dim: int,
    *,
    seed: int,
    device: torch.device | str = "cpu",
) -> Agreement:
    r"""C1 numerically: ``nadaraya_watson`` against ``scaled_dot_product_attention`` and the formula.

    Queries, keys and values are standard normals drawn in float64 (a generator seeded with
    ``seed`` on the float64 device: q, then k, then v), cast to each dtype of :data:`DTYPES`. The
    formula is :math:`\operatorname{softmax}(q k^\top/\sqrt{d}) v`, written out as the normalised
    exponential kernel with :math:`h^2 = \sqrt d`, in float64.

    Parameters
    ----------
    batch, num_heads, queries, keys, head_dim : int
        The shapes: q is (batch, num_heads, queries, head_dim), k and v are
        (batch, num_heads, keys, head_dim).
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    Agreement
        Keys ``nw_vs_sdpa``, ``nw_vs_formula`` and ``sdpa_vs_formula``, each with ``_f32`` and
        ``_f64`` (in that order: every comparison of float32, then of float64).

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int, or ``seed`` is not an int.
    """
    sizes = {"batch": batch, "num_heads": num_heads, "queries": queries, "keys": keys, "head_dim": head_dim}
    for name, value in sizes.items():
        require_positive_int(value, name)
    dev, dev64 = _devices(device)
    gen = torch.Generator(device=dev64).manual_seed(_seed(seed))
    shape_q, shape_k = (batch, num_heads, queries, head_dim), (batch, num_heads, keys, head_dim)
    q64 = _randn(*shape_q, dtype=torch.float64, generator=gen)
    k64 = _randn(*shape_k, dtype=torch.float64, generator=gen)
    v64 = _randn(*shape_k, dtype=torch.float64, generator=gen)
    kern = torch.exp(q64 @ k64.mT / math.sqrt(head_dim))
    reference = (kern / kern.sum(-1, keepdim=True)) @ v64
    diffs: dict[str, float] = {}
    for tag, dtype in DTYPES.items():
        d_ = _device_for(dtype, dev)
        q_, k_, v_ = (t.to(device=d_, dtype=dtype) for t in (q64, k64, v64))
        ours = nadaraya_watson(q_, k_, v_)
        sdpa = F.scaled_dot_product_attention(q_, k_, v_, dropout_p=0.0)
        diffs[f"nw_vs_sdpa_{tag}"] = _max_abs(ours, sdpa)
        diffs[f"nw_vs_formula_{tag}"] = _max_abs(ours.to(dev64, torch.float64), reference)
        diffs[f"sdpa_vs_formula_{tag}"] = _max_abs(sdpa.to(dev64, torch.float64), reference)
    return Agreement(diffs)


class AttentionCase(NamedTuple):
    """A seeded ``torch.nn.MultiheadAttention`` (eval mode) and sequence-first inputs for it."""

    mha: torch.nn.MultiheadAttention
    """Every parameter (biases included) a standard normal over ``sqrt(embed_dim)``."""
    query: Tensor
    """(target_len, batch, embed_dim)."""
    key: Tensor
    """(source_len, batch, embed_dim)."""
    value: Tensor
    """(source_len, batch, embed_dim): drawn separately from ``key``."""


def random_attention(
    embed_dim: int,
    num_heads: int,
    *,
    seed: int,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    target_len: int = 10,
    source_len: int = 24,
    batch: int = 3,
) -> AttentionCase:
    """A ``torch.nn.MultiheadAttention`` with seeded weights and non-zero biases, and inputs for it.

    One generator seeded with ``seed`` (on the dtype's device, see :func:`float64_device`)
    draws, in float64 and then cast: every parameter in the order of ``mha.parameters()``
    (divided by ``sqrt(embed_dim)``), then the query, the key and the value inputs.

    Parameters
    ----------
    embed_dim, num_heads : int
        E and H (H dividing E).
    seed : int
    dtype : torch.dtype, default torch.float64
    device : torch.device or str, default "cpu"
    target_len, source_len, batch : int, default 10, 24, 3
        Query length L, key/value length S and batch size N.

    Returns
    -------
    AttentionCase

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int, ``num_heads`` does not divide ``embed_dim``, or ``dtype``
        is not a floating dtype.
    """
    _check_heads(embed_dim, num_heads)
    for name, size in {"target_len": target_len, "source_len": source_len, "batch": batch}.items():
        require_positive_int(size, name)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    d_ = _device_for(dtype, resolve_device(device))
    gen = torch.Generator(device=d_).manual_seed(_seed(seed))
    mha = torch.nn.MultiheadAttention(embed_dim, num_heads, device=d_, dtype=dtype)
    with torch.no_grad():  # seeded weights, and non-zero biases so that they are tested too
        for p in mha.parameters():
            p.copy_(_randn(*p.shape, dtype=dtype, generator=gen) / math.sqrt(embed_dim))
    mha.eval()
    query = _randn(target_len, batch, embed_dim, dtype=dtype, generator=gen)
    key = _randn(source_len, batch, embed_dim, dtype=dtype, generator=gen)
    value = _randn(source_len, batch, embed_dim, dtype=dtype, generator=gen)
    return AttentionCase(mha, query, key, value)


def _ensemble_sum(model: MultiHeadNW, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """b_O + sum_h head_h @ W_O[:, block_h].T, sequence-first (L, N, E)."""
    per_head = model.head_outputs(query, key, value)  # (N, H, L, dh)
    dh = model.embed_dim // model.num_heads
    w_o = model.out_proj.weight
    ensemble = model.out_proj.bias + sum(
        per_head[:, hh] @ w_o[:, hh * dh : (hh + 1) * dh].T for hh in range(model.num_heads)
    )
    return ensemble.transpose(0, 1)


def mha_agreement(embed_dim: int, num_heads: int, *, seed: int, device: torch.device | str = "cpu") -> Agreement:
    r"""C2 numerically: ``MultiHeadNW.from_torch(mha)`` and :math:`b_O + \sum_h W_O^h \hat f_h` against ``mha``.

    For each dtype of :data:`DTYPES`, :func:`random_attention` with ``seed`` (eval mode, non-zero
    biases, separate key and value inputs); the ensemble sum is built from
    :meth:`nwlib.MultiHeadNW.head_outputs` and the column blocks of the output projection.

    Parameters
    ----------
    embed_dim, num_heads : int
        E and H (H dividing E).
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    Agreement
        Keys ``mha_vs_torch`` and ``ensemble_vs_torch``, each with ``_f32`` and ``_f64``.

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``num_heads`` does not divide ``embed_dim``.
    """
    _check_heads(embed_dim, num_heads)
    dev = resolve_device(device)
    diffs: dict[str, float] = {}
    for tag, dtype in DTYPES.items():
        case = random_attention(embed_dim, num_heads, seed=seed, dtype=dtype, device=dev)
        model = MultiHeadNW.from_torch(case.mha)
        with torch.no_grad():
            torch_out = case.mha(case.query, case.key, case.value, need_weights=False)[0]
            ours = model(case.query, case.key, case.value)
            ensemble = _ensemble_sum(model, case.query, case.key, case.value)
        diffs[f"mha_vs_torch_{tag}"] = _max_abs(ours, torch_out)
        diffs[f"ensemble_vs_torch_{tag}"] = _max_abs(ensemble, torch_out)
    return Agreement(diffs)


def null_space_change(
    model: MultiHeadNW,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    seed: int,
    head: int = 0,
    scale: float = 3.0,
) -> Tensor:
    r"""How much each head's estimate moves when the keys move along the null space of one head's key projection.

    The null space of :math:`W_K^{h}` (``model.key_projections[head]``, shape (kdim, d_h)) is
    spanned by the last kdim − d_h right singular vectors of its transpose. Every key input moves
    by ``scale`` times a standard normal combination of them (drawn in float64 from a generator
    seeded with ``seed`` on the key's device); values stay.

    Parameters
    ----------
    model : MultiHeadNW
    query : Tensor, shape (L, N, E)
    key : Tensor, shape (S, N, kdim)
    value : Tensor, shape (S, N, vdim)
        Sequence-first, as ``torch.nn.MultiheadAttention`` takes them; one floating dtype.
    seed : int
    head : int, default 0
        The head whose key null space is used.
    scale : float, default 3.0
        Size of the move (finite, > 0).

    Returns
    -------
    Tensor, shape (H,)
        The largest absolute change of each head's output (over batch, queries and width):
        rounding for ``head``, of order one for the others.

    Raises
    ------
    TypeError, ValueError
        If ``model`` is not a MultiHeadNW, an input is not a (S, N, ·) floating tensor, or ``head``
        or ``scale`` is out of range.
    """
    if not isinstance(model, MultiHeadNW):
        raise TypeError(f"model must be a MultiHeadNW, got {type(model).__name__}")
    for name, t in {"query": query, "key": key, "value": value}.items():
        require_tensor(t, name)
        if t.dim() != 3:
            raise ValueError(f"{name} must be sequence-first (length, batch, features), got shape {tuple(t.shape)}")
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < model.num_heads:
        raise ValueError(f"head must be an int in [0, {model.num_heads}), got {head!r}")
    scale = require_real(scale, "scale", minimum=0.0, strict_minimum=True)
    with torch.no_grad():
        proj = model.key_projections[head]  # (kdim, dh): head h's keys are key @ proj (+ bias)
        _, _, vh = torch.linalg.svd(proj.T)
        null_basis = vh[proj.shape[1] :]  # rows span {u : u @ proj = 0}
        gen = torch.Generator(device=key.device).manual_seed(_seed(seed))
        draws = torch.randn(
            key.shape[0], key.shape[1], null_basis.shape[0], generator=gen, device=key.device, dtype=torch.float64
        )
        shift = draws.to(key.dtype) @ null_basis
        before = model.head_outputs(query, key, value)
        after = model.head_outputs(query, key + scale * shift, value)
    return (after - before).abs().amax(dim=(0, 2, 3))


# --- C2 in sympy ----------------------------------------------------------------------------


class SymbolicMultihead(NamedTuple):
    """Both sides of C2 with every weight and input a sympy symbol (row-vector layout, as PyTorch's)."""

    mha: Any
    """sympy Matrix (1, E): ``concat_h softmax(Q_h K_h^T / sqrt(d_h)) V_h @ W_O.T + b_O``."""
    ensemble: Any
    r"""sympy Matrix (1, E): :math:`b_O + \sum_h \alpha_h \hat f_h(x)`, NW with kernel and responses of head h."""
    query: Any
    """(1, E) symbols ``x_1j``."""
    keys: Any
    """(S, E) symbols ``k_ij``."""
    values: Any
    """(S, E) symbols ``v_ij``."""
    weights: tuple[Any, Any, Any, Any]
    """W_Q, W_K, W_V, W_O, each (E, E) in PyTorch's orientation (head h: rows h·d_h … of the first three)."""
    out_bias: Any
    """(1, E) symbols ``b_1j``."""
    alphas: tuple[Any, ...]
    """The H positive head weights α_h."""


def symbolic_multihead(embed_dim: int = 4, num_heads: int = 2, source_len: int = 2) -> SymbolicMultihead:
    r"""Multi-head attention and the ensemble of NW heads, both written out in sympy (claim C2).

    Head h (rows :math:`h d_h, \dots, (h+1) d_h - 1` of each input projection) is an NW estimator
    with the kernel :math:`K_h(u, w) = \exp(u W_Q^{h\top} W_K^h w^\top/\sqrt{d_h})` and the
    responses :math:`v_i W_V^{h\top} W_O^{h\top}/\alpha_h` (:math:`W_O^h` the column block of
    :math:`W_O`); the biases of the input projections are left out. The notebook asserts that
    the two sides simplify to the same matrix.

    Parameters
    ----------
    embed_dim, num_heads, source_len : int, default 4, 2, 2
        E, H (dividing E) and the number S of keys. The expressions grow quickly: keep them small.

    Returns
    -------
    SymbolicMultihead

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``num_heads`` does not divide ``embed_dim``.

    Examples
    --------
    >>> import sympy as sp
    >>> c2 = symbolic_multihead(2, 1, 1)
    >>> c2.mha.shape, len(c2.alphas)
    ((1, 2), 1)
    """
    import sympy as sp

    _check_heads(embed_dim, num_heads)
    require_positive_int(source_len, "source_len")
    dh = embed_dim // num_heads

    def symbol_matrix(name: str, rows: int, cols: int) -> Any:
        return sp.Matrix(rows, cols, lambda a, b: sp.Symbol(f"{name}_{a + 1}{b + 1}", real=True))

    x_row = symbol_matrix("x", 1, embed_dim)  # one query
    x_keys = symbol_matrix("k", source_len, embed_dim)  # key inputs
    x_vals = symbol_matrix("v", source_len, embed_dim)  # value inputs
    w_q, w_k, w_v, w_o = (symbol_matrix(name, embed_dim, embed_dim) for name in ("Q", "K", "V", "O"))
    b_o = symbol_matrix("b", 1, embed_dim)
    alphas = sp.symbols(f"alpha1:{num_heads + 1}", positive=True)

    def softmax_row(z: Any) -> Any:
        e = z.applyfunc(sp.exp)
        return e / sum(e)

    # Multi-head attention as PyTorch defines it: concatenate the heads, then project.
    heads = []
    for hh in range(num_heads):
        rows = slice(hh * dh, (hh + 1) * dh)
        q_h, k_h, v_h = x_row * w_q[rows, :].T, x_keys * w_k[rows, :].T, x_vals * w_v[rows, :].T
        heads.append(softmax_row((q_h * k_h.T / sp.sqrt(dh)).applyfunc(sp.expand)) * v_h)
    mha = sp.Matrix.hstack(*heads) * w_o.T + b_o

    def nw_estimate(query: Any, keys: Any, responses: Any, kern: Callable[[Any, Any], Any]) -> Any:
        weights = [kern(query, keys[a, :]) for a in range(keys.rows)]
        total = sum((w * responses[a, :] for a, w in enumerate(weights)), sp.zeros(1, responses.cols))
        return total / sum(weights)

    # The ensemble: b_O + sum_h alpha_h * NW_h, each head with its own kernel and responses.
    ensemble = b_o
    for hh in range(num_heads):
        rows = slice(hh * dh, (hh + 1) * dh)

        def head_kernel(u: Any, w: Any, rows: slice = rows) -> Any:
            return sp.exp(sp.expand((u * w_q[rows, :].T * w_k[rows, :] * w.T)[0, 0] / sp.sqrt(dh)))

        responses = x_vals * w_v[rows, :].T * w_o[:, rows].T / alphas[hh]
        ensemble = ensemble + alphas[hh] * nw_estimate(x_row, x_keys, responses, head_kernel)
    return SymbolicMultihead(mha, ensemble, x_row, x_keys, x_vals, (w_q, w_k, w_v, w_o), b_o, tuple(alphas))


# --- one head in one dimension --------------------------------------------------------------


def sine_target(x: Tensor) -> Tensor:
    r"""The chapter's regression function :math:`f(x) = \sin(2\pi x)`.

    Examples
    --------
    >>> import torch
    >>> sine_target(torch.tensor([0.25])).item()
    1.0
    """
    return torch.sin(2 * math.pi * x)


def _sine_data(n: int, noise_sd: float, gen: torch.Generator, dev: torch.device, *lead: int) -> tuple[Tensor, Tensor]:
    """x ~ U(0, 1) of shape (*lead, n, 1), then the noise N(0, noise_sd²) of shape (*lead, n), float32."""
    x = torch.rand(*lead, n, 1, generator=gen, device=dev)
    eps = noise_sd * torch.randn(*lead, n, generator=gen, device=dev)
    return x, eps


@dataclass(frozen=True)
class SmootherDemo:
    """One data set smoothed at a few bandwidths (:func:`smoother_demo`); float32 unless said."""

    bandwidths: tuple[float, ...]
    """(B,) the bandwidths, as given."""
    x: Tensor
    """(n, 1) design points, U(0, 1)."""
    y: Tensor
    """(n,) responses sin(2πx) + ε."""
    x_plot: Tensor
    """(P, 1) the plotting grid on [0, 1]."""
    fits: Tensor
    """(B, P) the Gaussian-kernel NW fit on the grid."""
    query: float
    """x_0, the query whose weights are shown."""
    weights: Tensor
    """(B, n) the weights w_i(x_0)."""
    fit_at_query: Tensor
    """(B,) the fit at x_0 (``nadaraya_watson``), equal to ``weights @ y``."""
    n_eff: Tensor
    """(B,) float64: 1 / Σ w_i(x_0)², from float64 weights of the same data."""


def smoother_demo(
    n_train: int,
    noise_sd: float,
    bandwidths: Sequence[float],
    *,
    seed: int,
    device: torch.device | str = "cpu",
    query: float = 0.5,
    plot_points: int = 401,
) -> SmootherDemo:
    r"""One head as a Gaussian-kernel smoother of :math:`y = \sin(2\pi x) + \varepsilon` at several bandwidths.

    A generator seeded with ``seed`` on ``device`` draws :math:`x_i \sim U(0,1)`, then
    :math:`\varepsilon_i \sim N(0, \sigma_\varepsilon^2)`, in float32. The effective number of
    points :math:`n_{\mathrm{eff}} = 1/\sum_i w_i(x_0)^2` is computed from float64 weights of the
    same data (the float32 logits :math:`|x - x_0|^2/(2h^2)` lose digits for small h).

    Parameters
    ----------
    n_train : int
        n (>= 1).
    noise_sd : float
        σ_ε (finite, >= 0).
    bandwidths : sequence of float
        The bandwidths (finite, > 0).
    seed : int
    device : torch.device or str, default "cpu"
    query : float, default 0.5
        x_0.
    plot_points : int, default 401
        Points of the plotting grid on [0, 1].

    Returns
    -------
    SmootherDemo

    Raises
    ------
    TypeError, ValueError
        On a bad size, noise level, bandwidth or query (named in the message).
    """
    n = require_positive_int(n_train, "n_train")
    noise_sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    bws = _bandwidths(bandwidths)
    query = require_real(query, "query")
    require_positive_int(plot_points, "plot_points", minimum=2)
    dev, dev64 = _devices(device)
    gen = torch.Generator(device=dev).manual_seed(_seed(seed))
    x = torch.rand(n, 1, generator=gen, device=dev)
    y = sine_target(x[:, 0]) + noise_sd * torch.randn(n, generator=gen, device=dev)
    x_plot = torch.linspace(0, 1, plot_points, device=dev)[:, None]
    x0 = torch.tensor([[query]], device=dev)
    fits, weights, at_query, n_eff = [], [], [], []
    for bw in bws:
        fits.append(nadaraya_watson(x_plot, x, y, kernel="gaussian", bandwidth=bw))
        weights.append(nadaraya_watson_weights(x0, x, kernel="gaussian", bandwidth=bw)[0])
        at_query.append(nadaraya_watson(x0, x, y, kernel="gaussian", bandwidth=bw)[0])
        x0_64, x_64 = x0.to(dev64, torch.float64), x.to(dev64, torch.float64)
        w64 = nadaraya_watson_weights(x0_64, x_64, kernel="gaussian", bandwidth=bw)[0]
        n_eff.append(1.0 / w64.pow(2).sum())
    stack = torch.stack
    return SmootherDemo(tuple(bws), x, y, x_plot, stack(fits), query, stack(weights), stack(at_query), stack(n_eff))


@dataclass(frozen=True)
class CircleCase:
    """One query's weights over one set of keys (:func:`circle_weights`), float64."""

    keys: Tensor
    """(n, 2) the keys."""
    attention: Tensor
    """(n,) softmax(<q, k_i> / sqrt(2)): the exponential kernel with h = d_k^(1/4)."""
    gaussian: Tensor
    """(n,) Gaussian-kernel weights with σ = d_k^(1/4)."""
    gap: float
    """max_i |attention − gaussian|."""
    prior_gap: float
    """max_i |attention − the Gaussian weights times exp(|k_i|² / (2σ²)), renormalised|."""


@dataclass(frozen=True)
class CircleWeights:
    """The equal-norm check in d_k = 2 (:func:`circle_weights`)."""

    angles: Tensor
    """(n,) the keys' angles, ascending (float64)."""
    query: Tensor
    """(1, 2) the query, at angle ``query_angle`` on the circle of radius ``radius``."""
    radius: float
    sigma: float
    """σ = d_k^(1/4) = 2^(1/4)."""
    cases: dict[str, CircleCase]
    """``"equal norms"`` (keys on the circle) and ``"unequal norms"`` (norms spread over [0.6r, 1.4r])."""
    max_logit: float
    """The largest possible |<q, k>| / sqrt(d_k), r · 1.4r / sqrt(2): the conditioning of the weights."""


def circle_weights(
    n_keys: int,
    *,
    seed: int,
    radius: float = 2.5,
    query_angle: float = 1.0,
    device: torch.device | str = "cpu",
) -> CircleWeights:
    r"""Attention weights against Gaussian-kernel weights for keys in two dimensions (C1's equal-norm form).

    A generator seeded with ``seed`` on the float64 device draws the key angles
    (:math:`2\pi U(0,1)`, sorted) and then the norm factors :math:`0.6 + 0.8\,U(0,1)` of the
    unequal-norm keys, in float64. For keys of norm r, :math:`\exp(\langle q,k\rangle/\sqrt{d_k})`
    is a constant (per query) times the Gaussian kernel with :math:`\sigma = d_k^{1/4}`, so the
    normalised weights agree to rounding; for other norms they agree after the Gaussian weights
    are multiplied by :math:`\exp(\lVert k\rVert^2/(2\sigma^2))` and renormalised.

    Parameters
    ----------
    n_keys : int
        n (>= 1).
    seed : int
    radius : float, default 2.5
        r (finite, > 0).
    query_angle : float, default 1.0
        The query's angle; it lies on the circle of radius r.
    device : torch.device or str, default "cpu"

    Returns
    -------
    CircleWeights

    Raises
    ------
    TypeError, ValueError
        On a bad ``n_keys``, ``radius`` or ``query_angle``.
    """
    n = require_positive_int(n_keys, "n_keys")
    radius = require_real(radius, "radius", minimum=0.0, strict_minimum=True)
    query_angle = require_real(query_angle, "query_angle")
    _, dev64 = _devices(device)
    d_k = 2
    sigma = d_k**0.25
    gen = torch.Generator(device=dev64).manual_seed(_seed(seed))
    f64 = torch.float64
    angles = torch.sort(2 * math.pi * torch.rand(n, generator=gen, device=dev64, dtype=f64)).values
    unit = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
    q = radius * torch.tensor([[math.cos(query_angle), math.sin(query_angle)]], device=dev64, dtype=f64)
    norms = radius * (0.6 + 0.8 * torch.rand(n, generator=gen, device=dev64, dtype=f64))
    cases = {}
    for label, keys in (("equal norms", radius * unit), ("unequal norms", norms[:, None] * unit)):
        w_att = nadaraya_watson_weights(q, keys)[0]  # default h = d^(1/4): attention
        w_gau = nadaraya_watson_weights(q, keys, kernel="gaussian", bandwidth=sigma)[0]
        # Gaussian weights times the prior exp(||k||^2 / (2 sigma^2)), renormalised, give attention.
        tilted = w_gau * torch.exp(keys.pow(2).sum(-1) / (2 * sigma**2))
        cases[label] = CircleCase(keys, w_att, w_gau, _max_abs(w_att, w_gau), _max_abs(w_att, tilted / tilted.sum()))
    return CircleWeights(angles, q, radius, sigma, cases, radius * 1.4 * radius / math.sqrt(d_k))


# --- the Monte Carlo study ------------------------------------------------------------------


@dataclass(frozen=True)
class MiseStudy:
    """The bias–variance study of one Gaussian-kernel head (:func:`mise_study`).

    Every bandwidth is fitted on the same R replicate data sets (common random numbers), so
    differences between bandwidths are paired.
    """

    bandwidths: np.ndarray
    """(B,) the bandwidths, ascending."""
    ise: Tensor
    """(R, B) float64: the integrated squared error of each replicate's fit at each bandwidth."""
    estimates: dict[str, np.ndarray]
    """:data:`MISE_PARTS` name -> (B,) estimate (float64)."""
    ses: dict[str, np.ndarray]
    """:data:`MISE_PARTS` name -> (B,) delete-a-group jackknife standard error."""
    mise_se: np.ndarray
    """(B,) the usual standard error of the MISE, std(ISE) / sqrt(R)."""
    best: int
    """Index of the grid's Monte Carlo minimiser of the MISE."""
    ratios: dict[str, Comparison]
    """``"hmin"``, ``"hmax"``: MISE at the smallest and at the largest bandwidth over the minimum (jackknife)."""
    x: Tensor
    """(R, n, 1) float32 design points of the replicates."""
    y: Tensor
    """(R, n) float32 responses f(x) + ε of the replicates."""
    x_eval: Tensor
    """(m, 1) float32 evaluation grid on [0.1, 0.9]."""
    f_eval: Tensor
    """(m,) float64 the truth on the grid."""
    jk_groups: int
    """G, the groups of the delete-a-group jackknife."""
    seconds: float
    """Wall time of the fits and their reduction."""

    @property
    def split_gap(self) -> np.ndarray:
        """(B,) |MISE − (bias² + noise var + design var + cross)| / MISE: rounding by construction."""
        e = self.estimates
        return np.abs(e["mise"] - (e["sq_bias"] + e["noise_var"] + e["design_var"] + e["cross"])) / e["mise"]

    def part(self, name: str, index: int) -> Comparison:
        """One entry of :attr:`estimates` with its jackknife standard error, as a Comparison."""
        if name not in self.estimates:
            raise ValueError(f"name must be one of {list(self.estimates)}, got {name!r}")
        return estimate(self.estimates[name][index], self.ses[name][index])


def _group_sums(x: Tensor, groups: int) -> Tensor:
    """Sums over ``groups`` consecutive groups of replicates: (R, ...) -> (groups, ...)."""
    return x.reshape(groups, -1, *x.shape[1:]).sum(1)


def _moments(signal: Tensor, noise: Tensor, f_eval: Tensor, groups: int) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One bandwidth's (R, m) fits reduced to group sums, whose rows the jackknife deletes.

    The signal fit centred at its mean and its square; per replicate the ISE, the noise fit's energy
    and the cross term 2<signal - f, noise> (expectation 0, because E[noise fit | design] = 0).
    """
    centre = signal.mean(0)
    centred = signal - centre
    series = torch.stack(
        [
            (signal + noise - f_eval).pow(2).mean(-1),
            noise.pow(2).mean(-1),
            2 * ((signal - f_eval) * noise).mean(-1),
        ],
        dim=-1,
    )
    return centre, (_group_sums(centred, groups), _group_sums(centred.pow(2), groups), _group_sums(series, groups))


def _parts(centre: Tensor, f_eval: Tensor, group_size: int, s1: Tensor, s2: Tensor, series: Tensor) -> Tensor:
    """The split of the MISE at every bandwidth (columns), from the group sums of the replicates kept."""
    count = s1.shape[0] * group_size
    design = ((s2.sum(0) - s1.sum(0).pow(2) / count) / (count - 1)).mean(-1)
    # The replicate mean of the signal fit carries Monte Carlo noise of variance design / count;
    # subtracting it makes the squared-bias estimate unbiased.
    sq_bias = (centre + s1.sum(0) / count - f_eval).pow(2).mean(-1) - design / count
    mise, noise_var, cross = (series.sum(0) / count).unbind(-1)
    variance = noise_var + design  # its step from the previous bandwidth is the last row
    return torch.stack(
        [
            mise,
            sq_bias,
            noise_var,
            design,
            cross,
            cross / mise,
            noise_var - sq_bias - design,
            sq_bias - noise_var - design,
            design / noise_var,
            design / mise,
            design - noise_var,
            torch.cat([torch.zeros_like(variance[:1]), variance.diff()]),
        ]
    )


def mise_study(
    n_train: int,
    noise_sd: float,
    bandwidths: Sequence[float] | np.ndarray,
    grid: int,
    replicates: int,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    jk_groups: int = 100,
) -> MiseStudy:
    r"""The MISE of one Gaussian-kernel NW head on :math:`[0.1, 0.9]`, split into bias² and two variances.

    A generator seeded with ``seed`` on ``device`` draws the R replicate designs
    :math:`x \sim U(0,1)` (R, n, 1), then their noise :math:`\sigma_\varepsilon\varepsilon` (R, n),
    in float32. Every bandwidth is fitted on all replicates (common random numbers: the
    bandwidths share the draws on purpose and are one computation, not a sweep). The estimator is
    linear in the responses, so one ``nadaraya_watson`` call with the two columns
    :math:`[f(x_i), \varepsilon_i]` gives the noise-free fit :math:`\hat f_0` and the noise fit
    :math:`\hat e`; their statistics are taken in float64. Then, per bandwidth,
    MISE = bias² + noise variance + design variance + cross term, with
    bias² :math:`= |I|^{-1}\int_I(\mathbb E\hat f_0 - f)^2` (unbiased for the Monte Carlo noise of
    the mean fit), noise variance :math:`|I|^{-1}\int_I \mathbb E\hat e^2`, design variance
    :math:`|I|^{-1}\int_I \operatorname{Var}\hat f_0` and the cross term
    :math:`2|I|^{-1}\int_I(\hat f_0 - f)\hat e` (expectation 0). The parts are not means over
    replicates: their standard errors come from the delete-a-group jackknife.

    Parameters
    ----------
    n_train : int
        n, points per data set (>= 1).
    noise_sd : float
        σ_ε (finite, >= 0).
    bandwidths : sequence of float or ndarray, shape (B,)
        B >= 2 bandwidths (finite, > 0), ascending.
    grid : int
        m, the evaluation points on [0.1, 0.9] (>= 2).
    replicates : int
        R, a multiple of ``jk_groups``.
    seed : int
    device : torch.device or str, default "cpu"
    jk_groups : int, default 100
        G, groups of the delete-a-group jackknife (>= 2).

    Returns
    -------
    MiseStudy

    Raises
    ------
    TypeError, ValueError
        On a bad size or bandwidth, or ``replicates`` not a multiple of ``jk_groups``.
    """
    n = require_positive_int(n_train, "n_train")
    noise_sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    bws = _bandwidths(bandwidths)
    if len(bws) < 2 or any(b >= a for a, b in zip(bws[1:], bws[:-1], strict=True)):
        raise ValueError(f"bandwidths must be at least two, ascending, got {bws}")
    m = require_positive_int(grid, "grid", minimum=2)
    reps = require_positive_int(replicates, "replicates", minimum=2)
    groups = require_positive_int(jk_groups, "jk_groups", minimum=2)
    if reps % groups:
        raise ValueError(f"replicates must be a multiple of jk_groups = {groups}, got {reps}")
    dev, dev64 = _devices(device)
    bw_arr = np.asarray(bws, dtype=np.float64)
    x_eval = torch.linspace(0.1, 0.9, m, device=dev)[:, None]
    gen = torch.Generator(device=dev).manual_seed(_seed(seed))
    x_mc, eps_mc = _sine_data(n, noise_sd, gen, dev, reps)
    # Two response columns, fitted in one call: the noise-free signal and the pure noise.
    columns = torch.stack([sine_target(x_mc[..., 0]), eps_mc], dim=-1)  # (R, n, 2)
    f_eval64 = sine_target(x_eval[:, 0]).to(dev64, torch.float64)
    # Replicates go in chunks so that a backend which materialises the (chunk, m, n) weights
    # (non-fused attention paths) stays within about 2e8 elements.
    chunk = max(1, int(2e8 // (m * n)))
    started = time.perf_counter()
    ise_rows, centres, sums = [], [], []
    for bw in bw_arr:
        fits = torch.cat(
            [
                nadaraya_watson(
                    x_eval, x_mc[r0 : r0 + chunk], columns[r0 : r0 + chunk], kernel="gaussian", bandwidth=float(bw)
                )
                for r0 in range(0, reps, chunk)
            ]
        )  # (R, m, 2)
        if not bool(torch.isfinite(fits).all()):
            raise FloatingPointError(f"non-finite fits at bandwidth {float(bw)}")
        signal, noise = fits.to(dev64, torch.float64).unbind(-1)  # statistics in float64
        ise_rows.append((signal + noise - f_eval64).pow(2).mean(-1))  # per replicate
        centre, group = _moments(signal, noise, f_eval64, groups)
        centres.append(centre)
        sums.append(group)
    ise = torch.stack(ise_rows, dim=-1)  # (R, bandwidths)
    centre_all = torch.stack(centres)  # (bandwidths, m)
    s1, s2, series = (torch.stack(x, dim=1) for x in zip(*sums, strict=True))  # (groups, bandwidths, ...)
    size = reps // groups
    jk = grouped_jackknife(lambda *s: _parts(centre_all, f_eval64, size, *s), s1, s2, series, groups=groups)
    est = dict(zip(MISE_PARTS, jk.estimate.cpu().numpy(), strict=True))
    se = dict(zip(MISE_PARTS, jk.se.cpu().numpy(), strict=True))
    seconds = time.perf_counter() - started
    best = int(np.argmin(est["mise"]))
    # MISE at the smallest and at the largest bandwidth over the MISE at the minimiser.
    ratio = grouped_jackknife(
        lambda s: s[:, [0, -1]].sum(0) / s[:, best].sum(0), _group_sums(ise, groups), groups=groups
    )
    ratios = {name: estimate(ratio.estimate[i], ratio.se[i]) for i, name in enumerate(("hmin", "hmax"))}
    return MiseStudy(
        bandwidths=bw_arr,
        ise=ise,
        estimates=est,
        ses=se,
        mise_se=(ise.std(0) / math.sqrt(reps)).cpu().numpy(),
        best=best,
        ratios=ratios,
        x=x_mc,
        y=columns.sum(-1),  # the responses a user sees: signal + noise
        x_eval=x_eval,
        f_eval=f_eval64,
        jk_groups=groups,
        seconds=seconds,
    )


def mise_comparisons(
    study: MiseStudy, asymptotic_sq_bias: np.ndarray, asymptotic_variance: np.ndarray
) -> dict[str, Comparison]:
    """The study's numbers that the chapter quotes, each with its standard error.

    Parameters
    ----------
    study : MiseStudy
    asymptotic_sq_bias, asymptotic_variance : ndarray, shape (B,)
        The first-order approximations of the squared bias and the noise variance at the
        study's bandwidths.

    Returns
    -------
    dict of str to Comparison
        ``mise_opt`` (the MISE at the minimiser, usual SE), ``mise_ratio_hmin``/``_hmax``,
        ``noise_ratio_hmin``/``_opt`` and ``bias_ratio_opt`` (measured over asymptotic),
        ``design_share_hmax``, ``design_over_noise_hmax`` and ``total_variance_step`` (at the
        largest bandwidth).

    Raises
    ------
    TypeError, ValueError
        If ``study`` is not a MiseStudy or an array is not of shape (B,).
    """
    if not isinstance(study, MiseStudy):
        raise TypeError(f"study must be a MiseStudy, got {type(study).__name__}")
    shape = study.bandwidths.shape
    for name, arr in (("asymptotic_sq_bias", asymptotic_sq_bias), ("asymptotic_variance", asymptotic_variance)):
        if np.shape(arr) != shape:
            raise ValueError(f"{name} must have shape {shape} (one value per bandwidth), got {np.shape(arr)}")
    e, s, k = study.estimates, study.ses, study.best

    def ratio(name: str, i: int, reference: np.ndarray) -> Comparison:
        return estimate(float(e[name][i] / reference[i]), float(s[name][i] / reference[i]))

    return {
        "mise_opt": estimate(float(e["mise"][k]), float(study.mise_se[k])),
        "mise_ratio_hmin": study.ratios["hmin"],
        "mise_ratio_hmax": study.ratios["hmax"],
        "noise_ratio_hmin": ratio("noise_var", 0, asymptotic_variance),
        "noise_ratio_opt": ratio("noise_var", k, asymptotic_variance),
        "bias_ratio_opt": ratio("sq_bias", k, asymptotic_sq_bias),
        "design_share_hmax": study.part("design_share", -1),
        "design_over_noise_hmax": study.part("design_over_noise", -1),
        "total_variance_step": study.part("variance_step", -1),
    }


def mise_table(study: MiseStudy) -> Any:
    """The study as a table: one row per bandwidth (pandas DataFrame).

    Columns ``MISE``, ``SE`` (the usual standard error), ``bias^2``, ``noise var``,
    ``design var``, ``cross/MISE`` and its jackknife ``cross/MISE SE``; the index is ``h``.
    """
    import pandas as pd

    if not isinstance(study, MiseStudy):
        raise TypeError(f"study must be a MiseStudy, got {type(study).__name__}")
    e = study.estimates
    columns = {"MISE": e["mise"], "SE": study.mise_se, "bias^2": e["sq_bias"], "noise var": e["noise_var"]}
    columns |= {
        "design var": e["design_var"],
        "cross/MISE": e["cross_share"],
        "cross/MISE SE": study.ses["cross_share"],
    }
    return pd.DataFrame(columns, index=pd.Index(study.bandwidths, name="h"))


@dataclass(frozen=True)
class CvStudy:
    """The leave-one-out bandwidth on each replicate of a :class:`MiseStudy` (:func:`cv_study`)."""

    bandwidth: Tensor
    """(R,) float32: the LOO-CV bandwidth of each replicate."""
    ise_cv: Tensor
    """(R,) float64: ISE of the fit at each replicate's own bandwidth."""
    ise_opt: Tensor
    """(R,) float64: ISE of the fit at the grid's Monte Carlo minimiser (the same replicates)."""
    ratio: Comparison
    """Σ ISE_cv / Σ ISE_opt with its delete-a-group jackknife standard error."""
    quartiles: tuple[float, float, float]
    """First quartile, median and third quartile of :attr:`bandwidth`."""


def cv_study(study: MiseStudy) -> CvStudy:
    """The fit at each replicate's leave-one-out bandwidth against the fit at the grid's minimiser.

    ``nwlib.select_bandwidth`` (Gaussian kernel, leave-one-out least squares, scored in float64)
    picks h on each replicate of ``study``; both fits are float32 on the study's device, their
    errors float64. The replicates are the study's, so the comparison is paired.

    Parameters
    ----------
    study : MiseStudy

    Returns
    -------
    CvStudy

    Raises
    ------
    TypeError
        If ``study`` is not a MiseStudy.
    """
    if not isinstance(study, MiseStudy):
        raise TypeError(f"study must be a MiseStudy, got {type(study).__name__}")
    dev64 = study.f_eval.device
    x, y, x_eval, f_eval = study.x, study.y, study.x_eval, study.f_eval
    selection = select_bandwidth(x.to(dev64, torch.float64), y.to(dev64, torch.float64), kernel="gaussian")
    h_cv = selection.bandwidth.to(x.device, torch.float32)  # (R,): one bandwidth per replicate
    fit_cv = nadaraya_watson(x_eval, x, y, kernel="gaussian", bandwidth=h_cv)  # (R, m)
    fit_opt = nadaraya_watson(x_eval, x, y, kernel="gaussian", bandwidth=float(study.bandwidths[study.best]))
    ise_cv = (fit_cv.to(dev64, torch.float64) - f_eval).pow(2).mean(-1)
    ise_opt = (fit_opt.to(dev64, torch.float64) - f_eval).pow(2).mean(-1)
    g = study.jk_groups
    ratio = grouped_jackknife(lambda a, b: a.sum() / b.sum(), _group_sums(ise_cv, g), _group_sums(ise_opt, g), groups=g)
    q1, med, q3 = (float(v) for v in np.quantile(h_cv.cpu().numpy(), [0.25, 0.5, 0.75]))
    return CvStudy(h_cv, ise_cv, ise_opt, estimate(ratio.estimate, ratio.se), (q1, med, q3))


# --- checks ---------------------------------------------------------------------------------


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return seed


def _devices(device: torch.device | str) -> tuple[torch.device, torch.device]:
    dev = resolve_device(device)
    return dev, float64_device(dev)


def _check_heads(embed_dim: object, num_heads: object) -> None:
    e = require_positive_int(embed_dim, "embed_dim")
    h = require_positive_int(num_heads, "num_heads")
    if e % h:
        raise ValueError(f"num_heads must divide embed_dim, got num_heads={h}, embed_dim={e}")


def _bandwidths(bandwidths: object) -> list[float]:
    if isinstance(bandwidths, (str, bytes)) or not isinstance(bandwidths, (Sequence, np.ndarray)):
        raise TypeError(f"bandwidths must be a sequence of numbers, got {type(bandwidths).__name__}")
    values = [require_real(b, "bandwidths") for b in bandwidths]
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"bandwidths must be a non-empty sequence of positive numbers, got {values}")
    return values
