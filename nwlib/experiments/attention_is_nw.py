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
* C1's readings of "bandwidth 1/√d_k": :func:`xspace_gaussian_gap` (is the kernel an isotropic
  Gaussian kernel in the LayerNorm'd tokens? Not for W_Q ≠ W_K) and :func:`qk_norm_smoothing`
  (a QK-normalised head, where the kernel is Gaussian on the sphere, smoothing a regression
  function with its temperature chosen on validation data; :func:`fraction_removed` of the zero
  predictor's error).
* C2, multi-head attention is :math:`c + \sum_h W_O^h \hat f_h` with every bias
  (chapter 1, ``prop-mha-ensemble``): :func:`symbolic_multihead` builds both sides in sympy for the
  notebook's derivation, with the forms that drop the query bias or the value bias's constant;
  :func:`head_estimates` and :func:`bias_form` write the proposition out from a
  ``torch.nn.MultiheadAttention``'s weights and :func:`mha_bias_check` compares it with the module;
  :func:`random_attention` and :func:`mha_agreement` compare :class:`nwlib.MultiHeadNW` and the
  explicit ensemble sum with ``torch.nn.MultiheadAttention``; :func:`null_space_change` moves the
  keys along the null space of one head's key projection; :func:`scalar_weights_check` tests the
  reading with scalar head weights.
* One head as a kernel smoother in one dimension, :math:`y = \sin(2\pi x) + \varepsilon`
  (:func:`sine_target`): :func:`smoother_demo` (fits, one query's weights, effective numbers of
  points) and the Monte Carlo bias–variance study :func:`mise_study` (MISE split exactly into
  squared bias, noise variance, design variance and a cross term, delete-a-group jackknife
  standard errors; :func:`mise_table`, :func:`mise_comparisons`), with the leave-one-out
  bandwidth on the same replicates, :func:`cv_study`.

Every function is a pure function of its sizes, a seed and a device. Float64 work runs on the
CPU when the device is Apple's MPS (which has no float64). The Monte Carlo replicates of
:func:`mise_study`, :func:`cv_study` and :func:`qk_norm_smoothing` run in blocks, the grid points
of :func:`mise_point`, :func:`cv_point` and :func:`qk_point`, through :func:`nwlib.sweep.run_sweep`
on any executor (``executor="process:8"``, ``"dask:ADDRESS"``) with the same results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
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
from ..sweep import require_point, run_sweep

__all__ = [
    "DTYPES",
    "MISE_BLOCKS",
    "MISE_PARTS",
    "QK_BLOCKS",
    "TOLERANCES",
    "Agreement",
    "AttentionCase",
    "CircleCase",
    "CircleWeights",
    "CvStudy",
    "MiseStudy",
    "QkSmoothing",
    "ScalarWeights",
    "SmootherDemo",
    "SymbolicMultihead",
    "XSpaceGap",
    "bias_form",
    "circle_weights",
    "cv_point",
    "cv_study",
    "float64_device",
    "fraction_removed",
    "head_estimates",
    "mha_agreement",
    "mha_bias_check",
    "mise_comparisons",
    "mise_point",
    "mise_study",
    "MISE_HEADERS",
    "format_mise_table",
    "mise_table",
    "null_space_change",
    "qk_norm_smoothing",
    "qk_point",
    "random_attention",
    "scalar_weights_check",
    "sine_target",
    "smoother_demo",
    "weights_grid",
    "symbolic_multihead",
    "torch_agreement",
    "xspace_gaussian_gap",
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


# --- C2 with every bias, and the scalar-weights reading --------------------------------------


def _in_proj(mha: torch.nn.MultiheadAttention) -> tuple[Tensor, ...]:
    """W_Q, W_K, W_V (E, E) and b_Q, b_K, b_V (E,) of ``mha`` (zeros where it has no bias)."""
    if not isinstance(mha, torch.nn.MultiheadAttention):
        raise TypeError(f"mha must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.in_proj_weight is None or mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError("mha must use one input projection (kdim = vdim = embed_dim), no add_bias_kv or add_zero_attn")
    if mha.batch_first is not False:
        raise ValueError("mha must be sequence-first (batch_first=False)")
    w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
    bias = mha.in_proj_bias
    b_q, b_k, b_v = (bias.detach() if bias is not None else torch.zeros_like(mha.in_proj_weight[:, 0])).chunk(3)
    return w_q, w_k, w_v, b_q, b_k, b_v


def head_estimates(
    mha: torch.nn.MultiheadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    query_bias: bool = True,
    key_bias: bool = False,
) -> Tensor:
    r"""Each head's NW estimate :math:`\hat f_h(x) = \sum_i w_{hi}(x)\, W_V^{h\top} x_i'`, without the value bias.

    The weights are :math:`w_{hi}(x) = \operatorname{softmax}_i\big((W_Q^{h\top} x + b_Q^h)^\top
    (W_K^{h\top} x_i + b_K^h)/\sqrt{d_h}\big)`, written out from ``mha``'s weights (not through
    PyTorch's attention); ``query_bias=False`` drops :math:`b_Q^h`, ``key_bias=False`` (the
    default) drops :math:`b_K^h`, which changes nothing (chapter 1, ``prop-mha-ensemble``).

    Parameters
    ----------
    mha : torch.nn.MultiheadAttention
        Sequence-first, one input projection (no ``kdim``/``vdim``, ``add_bias_kv`` or ``add_zero_attn``).
    query : Tensor, shape (L, N, E)
    key, value : Tensor, shape (S, N, E)
    query_bias, key_bias : bool, default True, False

    Returns
    -------
    Tensor, shape (N, H, L, d_h)

    Raises
    ------
    TypeError, ValueError
        If ``mha`` is not such a module, or an input is not a (·, N, E) floating tensor.
    """
    w_q, w_k, w_v, b_q, b_k, b_v = _in_proj(mha)
    for name, t in {"query": query, "key": key, "value": value}.items():
        require_tensor(t, name)
        if t.dim() != 3 or t.shape[-1] != mha.embed_dim:
            raise ValueError(f"{name} must have shape (length, batch, {mha.embed_dim}), got {tuple(t.shape)}")
    for flag, name in ((query_bias, "query_bias"), (key_bias, "key_bias")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    heads, dh = mha.num_heads, mha.embed_dim // mha.num_heads

    def split(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:  # (len, N, E) -> (N, H, len, dh)
        y = x @ w.T + (b if b is not None else 0)
        return y.reshape(x.shape[0], x.shape[1], heads, dh).permute(1, 2, 0, 3)

    q = split(query, w_q, b_q if query_bias else None)
    k = split(key, w_k, b_k if key_bias else None)
    v = split(value, w_v, None)
    return torch.softmax(q @ k.mT / math.sqrt(dh), dim=-1) @ v


def bias_form(
    mha: torch.nn.MultiheadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    query_bias: bool = True,
    key_bias: bool = False,
    value_constant: bool = True,
) -> Tensor:
    r"""The right-hand side of chapter 1's ``prop-mha-ensemble``: :math:`c + \sum_h W_O^h \hat f_h(x)`.

    :math:`c = b_O + \sum_h W_O^h b_V^h` and :math:`\hat f_h` from :func:`head_estimates`. With the
    defaults this equals ``mha(query, key, value)`` (eval mode); ``query_bias=False`` or
    ``value_constant=False`` give the forms that drop a bias term, which differ from it.

    Parameters
    ----------
    mha, query, key, value, query_bias, key_bias
        As :func:`head_estimates`.
    value_constant : bool, default True
        Add :math:`\sum_h W_O^h b_V^h`.

    Returns
    -------
    Tensor, shape (L, N, E)
        Sequence-first, as ``mha`` returns it.

    Raises
    ------
    TypeError, ValueError
        As :func:`head_estimates`, or if ``value_constant`` is not a bool.
    """
    if not isinstance(value_constant, bool):
        raise TypeError(f"value_constant must be a bool, got {type(value_constant).__name__}")
    f_h = head_estimates(mha, query, key, value, query_bias=query_bias, key_bias=key_bias)  # (N, H, L, dh)
    _, _, _, _, _, b_v = _in_proj(mha)
    heads, dh = mha.num_heads, mha.embed_dim // mha.num_heads
    w_o, b_o = mha.out_proj.weight.detach(), mha.out_proj.bias
    out = (b_o.detach() if b_o is not None else torch.zeros_like(w_o[:, 0])).expand(f_h.shape[0], f_h.shape[2], -1)
    for hh in range(heads):
        block = w_o[:, hh * dh : (hh + 1) * dh]
        out = out + f_h[:, hh] @ block.T
        if value_constant:
            out = out + b_v[hh * dh : (hh + 1) * dh] @ block.T
    return out.transpose(0, 1)


def mha_bias_check(
    embed_dim: int, num_heads: int, *, seed: int, device: torch.device | str = "cpu"
) -> dict[str, float]:
    r"""The corrected C2 proposition against ``torch.nn.MultiheadAttention`` with every bias non-zero, in float64.

    :func:`random_attention` with ``seed`` (non-zero ``in_proj_bias`` and ``out_proj.bias``,
    independent W_Q and W_K), then :func:`bias_form` with each bias term kept or dropped.

    Parameters
    ----------
    embed_dim, num_heads : int
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    dict of str to float
        Largest absolute differences from ``mha``'s output: ``bias_form_vs_torch`` (the
        proposition), ``key_bias_vs_torch`` (with b_K in the kernel as well), ``without_query_bias``
        (b_Q dropped from the kernel) and ``without_value_constant`` (the constant dropped); and
        ``value_constant_size``, the largest entry of :math:`\lvert\sum_h W_O^h b_V^h\rvert`.

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``num_heads`` does not divide ``embed_dim``.
    """
    _check_heads(embed_dim, num_heads)
    case = random_attention(embed_dim, num_heads, seed=seed, dtype=torch.float64, device=device)
    args = (case.mha, case.query, case.key, case.value)
    with torch.no_grad():
        torch_out = case.mha(*args[1:], need_weights=False)[0]
        forms = {
            "bias_form_vs_torch": bias_form(*args),
            "key_bias_vs_torch": bias_form(*args, key_bias=True),
            "without_query_bias": bias_form(*args, query_bias=False),
            "without_value_constant": bias_form(*args, value_constant=False),
        }
        out = {name: _max_abs(form, torch_out) for name, form in forms.items()}
        _, _, _, _, _, b_v = _in_proj(case.mha)
        out["value_constant_size"] = float((case.mha.out_proj.weight.detach() @ b_v).abs().max())
    return out


@dataclass(frozen=True)
class ScalarWeights:
    r"""The reading of C2 with scalar head weights, :math:`\mathrm{MHA}(x) = c + \sum_h \alpha_h \hat f_h(x)`.

    :math:`\hat f_h` is head h's own NW estimate (its values, then one read-out map common to
    all heads): :func:`scalar_weights_check`.
    """

    width_one_gap: float
    r"""Heads of width 1 read out by one vector u: max |u·MHA(x) − u·b_O − Σ_h α_h \hat f_h(x)|, α_h = u·W_O^h."""
    proportional_gap: float
    r"""Output blocks W_O^h = α_h P: max |MHA(x) − b_O − Σ_h α_h P \hat f_h(x)| (value bias included)."""
    excluded_share: float
    r"""PyTorch's MHA with random W_O: a lower bound on the share of the output's variance no scalar form reproduces."""
    rank_one_share: float
    """The share the closest scalar form (rank-one blocks, best constant) leaves unexplained: an upper bound."""
    cov_condition: float
    """The condition number of Cov g in the third case: how much rounding in the bound is amplified."""


def scalar_weights_check(
    embed_dim: int, num_heads: int, *, seed: int, device: torch.device | str = "cpu"
) -> ScalarWeights:
    r"""When is multi-head attention a sum of its heads' own estimates with *scalar* weights?

    Write :math:`g_h(x) = \hat f_h(x) + b_V^h` (head h's output) and :math:`g = [g_1; \dots; g_H]`.
    Then :math:`\mathrm{MHA}(x) = b_O + W_O g(x)`, and a scalar form
    :math:`c' + P\sum_h \alpha_h g_h(x)` (one read-out map P for all heads) has output blocks
    :math:`\alpha_h P`. Three cases, each from :func:`random_attention` (float64) with its own seed
    offset: heads of width 1 (E = H) read out by a vector u, where :math:`\alpha_h = u^\top W_O^h`
    is a scalar and the form is exact; blocks set to :math:`\alpha_h P`, exact again; and
    PyTorch's MHA with random :math:`W_O`, where for any scalar form the mean squared residual over
    the queries is at least :math:`\lambda_{\min}(\operatorname{Cov} g)\sum_{k\ge 2}\sigma_k^2`,
    :math:`\sigma_k` the singular values of the H × (E·d_h) matrix whose rows are the
    :math:`\operatorname{vec} W_O^h` (the distance of the blocks from rank-one ones).

    Parameters
    ----------
    embed_dim, num_heads : int
        E and H of the second and third cases (H dividing E, d_h = E/H ≥ 1); the first has E = H.
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    ScalarWeights

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive int or ``num_heads`` does not divide ``embed_dim``.
    """
    _check_heads(embed_dim, num_heads)
    _seed(seed)
    e, heads = embed_dim, num_heads
    dh = e // heads
    with torch.no_grad():
        # 1. heads of width 1 and a scalar read-out u
        c1 = random_attention(heads, heads, seed=seed, device=device)
        gen = torch.Generator(device=c1.query.device).manual_seed(seed)
        u = _randn(heads, dtype=torch.float64, generator=gen)
        _, _, _, _, _, b_v1 = _in_proj(c1.mha)
        own = head_estimates(c1.mha, c1.query, c1.key, c1.value)[..., 0] + b_v1[None, :, None]  # (N, H, L)
        alpha = u @ c1.mha.out_proj.weight  # (H,) scalars
        form = u @ c1.mha.out_proj.bias + torch.einsum("h,nhl->ln", alpha, own)
        width_one_gap = _max_abs(c1.mha(c1.query, c1.key, c1.value, need_weights=False)[0] @ u, form)
        # 2. proportional output blocks alpha_h P
        c2 = random_attention(e, heads, seed=seed + 1, device=device)
        alpha = _randn(heads, dtype=torch.float64, generator=gen)
        p = _randn(e, dh, dtype=torch.float64, generator=gen) / math.sqrt(dh)
        c2.mha.out_proj.weight.copy_(torch.cat([a * p for a in alpha], dim=1))
        _, _, _, _, _, b_v2 = _in_proj(c2.mha)
        own = head_estimates(c2.mha, c2.query, c2.key, c2.value) + b_v2.reshape(heads, 1, dh)  # (N, H, L, dh)
        form = c2.mha.out_proj.bias + torch.einsum("h,nhld->nld", alpha, own) @ p.T
        proportional_gap = _max_abs(c2.mha(c2.query, c2.key, c2.value, need_weights=False)[0], form.transpose(0, 1))
        # 3. PyTorch's MHA with random W_O: the distance from every scalar form
        c3 = random_attention(e, heads, seed=seed + 2, device=device, target_len=8 * e)
        torch_out = c3.mha(c3.query, c3.key, c3.value, need_weights=False)[0].reshape(-1, e)  # (L·N, E)
        _, _, _, _, _, b_v3 = _in_proj(c3.mha)
        own = head_estimates(c3.mha, c3.query, c3.key, c3.value) + b_v3.reshape(heads, 1, dh)
        g = own.permute(2, 0, 1, 3).reshape(-1, e)  # (L·N, E): the concatenated heads, query-major
        w_o = c3.mha.out_proj.weight
        blocks = torch.stack([w_o[:, hh * dh : (hh + 1) * dh].reshape(-1) for hh in range(heads)])  # (H, E·dh)
        sv = torch.linalg.svdvals(blocks)
        cov_g = torch.cov(g.T, correction=0)
        total = torch.cov(torch_out.T, correction=0).trace()
        eig = torch.linalg.eigvalsh(cov_g)
        excluded = eig[0].clamp(min=0) * sv[1:].pow(2).sum() / total
        uu, ss, vv = torch.linalg.svd(blocks, full_matrices=False)
        rank_one = (ss[0] * uu[:, :1] @ vv[:1]).reshape(heads, e, dh)
        w_one = torch.cat(list(rank_one), dim=1)  # (E, E): blocks alpha_h P
        resid = torch_out - g @ w_one.T
        rank_one_share = torch.cov(resid.T, correction=0).trace() / total
    condition = float(eig[-1] / eig[0]) if eig[0] > 0 else math.inf
    return ScalarWeights(width_one_gap, proportional_gap, float(excluded), float(rank_one_share), condition)


# --- C1: in what sense 1/sqrt(d_k) is a bandwidth --------------------------------------------


@dataclass(frozen=True)
class XSpaceGap:
    """Attention weights against isotropic Gaussian-kernel weights in the token space (:func:`xspace_gaussian_gap`)."""

    bandwidths: tuple[float, ...]
    """The Gaussian bandwidths σ tried (the grid, then 1/√d_k and d_k^(1/4))."""
    distance: Tensor
    """(B,) float64: mean over queries of the total-variation distance between the two weight vectors."""
    best: float
    """The smallest distance over the bandwidths."""
    at_inverse_root: float
    """The distance at σ = 1/√d_k."""
    identity_gap: float
    """W_Q = W_K = I (d_k = D), tokens scaled to norm exactly √D: max |attention − Gaussian weights, σ = D^(1/4)|."""


def xspace_gaussian_gap(
    embed_dim: int,
    head_dim: int,
    n_keys: int,
    n_queries: int,
    bandwidths: Sequence[float],
    *,
    seed: int,
    device: torch.device | str = "cpu",
) -> XSpaceGap:
    r"""Is a head's kernel a Gaussian kernel in the token space x, with bandwidth set by 1/√d_k?

    Tokens as transformers see them: :math:`x = \mathrm{LayerNorm}(z)` (no affine part),
    :math:`z \sim N(0, I_D)`, so :math:`\lVert x\rVert = \sqrt D` for every token. One generator
    seeded with ``seed`` draws, in float64: the key tokens, the query tokens, then
    :math:`W_Q` and :math:`W_K` (independent, D × d_k, entries N(0, 1/D)). The head's weights
    :math:`\operatorname{softmax}_i(\langle W_Q^\top x, W_K^\top x_i\rangle/\sqrt{d_k})` are compared
    with the Gaussian weights :math:`\operatorname{softmax}_i(-\lVert x - x_i\rVert^2/(2\sigma^2))`
    for each σ of ``bandwidths`` and for :math:`\sigma = 1/\sqrt{d_k}` and :math:`d_k^{1/4}`.
    With :math:`W_Q = W_K = I` and the tokens scaled to norm exactly :math:`\sqrt D` (LayerNorm's
    ε makes the norms differ by about ε), the two coincide at :math:`\sigma = D^{1/4}`: the special
    case reported as :attr:`XSpaceGap.identity_gap`.

    Parameters
    ----------
    embed_dim, head_dim : int
        D and d_k.
    n_keys, n_queries : int
    bandwidths : sequence of float
        The grid of σ (finite, > 0).
    seed : int
    device : torch.device or str, default "cpu"

    Returns
    -------
    XSpaceGap

    Raises
    ------
    TypeError, ValueError
        On a bad size, bandwidth or seed.
    """
    sizes = {"embed_dim": embed_dim, "head_dim": head_dim, "n_keys": n_keys, "n_queries": n_queries}
    for name, value in sizes.items():
        require_positive_int(value, name)
    bws = _bandwidths(bandwidths) + [head_dim**-0.5, head_dim**0.25]
    _, dev64 = _devices(device)
    gen = torch.Generator(device=dev64).manual_seed(_seed(seed))
    d = embed_dim

    def tokens(n: int) -> Tensor:
        return F.layer_norm(_randn(n, d, dtype=torch.float64, generator=gen), (d,))

    keys, queries = tokens(n_keys), tokens(n_queries)
    w_q, w_k = (_randn(d, head_dim, dtype=torch.float64, generator=gen) / math.sqrt(d) for _ in range(2))
    attention = torch.softmax((queries @ w_q) @ (keys @ w_k).T / math.sqrt(head_dim), dim=-1)
    sq_dist = torch.cdist(queries, keys).pow(2)
    distance = torch.stack(
        [0.5 * (attention - torch.softmax(-sq_dist / (2 * s**2), dim=-1)).abs().sum(-1).mean() for s in bws]
    )
    # W_Q = W_K = I on tokens of norm exactly sqrt(D) (LayerNorm without its epsilon): a Gaussian kernel in x
    q_eq, k_eq = (math.sqrt(d) * F.normalize(t, dim=-1) for t in (queries, keys))
    identity = torch.softmax(q_eq @ k_eq.T / math.sqrt(d), dim=-1)
    gauss_identity = torch.softmax(-torch.cdist(q_eq, k_eq).pow(2) / (2 * math.sqrt(d)), dim=-1)
    return XSpaceGap(
        tuple(bws), distance, float(distance.min()), float(distance[-2]), _max_abs(identity, gauss_identity)
    )


@dataclass(frozen=True)
class QkSmoothing:
    """A QK-normalised head as a smoother of a regression function (:func:`qk_norm_smoothing`), float64."""

    temperatures: tuple[float, ...]
    """(T,) the temperatures τ of the sweep, ascending."""
    val_loss: Tensor
    """(R, T) mean squared error against the noisy validation responses (what a user can compute)."""
    test_ise: Tensor
    """(R, T) mean of (estimate − f)² over the test queries."""
    selected: Tensor
    """(R,) the index of τ with the smallest validation loss, per replicate."""
    selected_ise: Tensor
    """(R,) the test error at each replicate's selected τ."""
    zero_mse: Tensor
    """(R,) mean of f² over the test queries: the zero predictor's error."""
    gaussian_gap: float
    """max |cosine_attention − Gaussian-kernel NW with σ = √τ on the normalised queries and keys| (float64)."""


QK_BLOCKS: int = 8
"""The most blocks of replicates :func:`qk_norm_smoothing` uses by default (the number of its sweep's points)."""

_QK_KEYS = (
    "n_train",
    "n_eval",
    "embed_dim",
    "head_dim",
    "temperatures",
    "replicates",
    "noise_sd",
    "query_shift",
    "blocks",
    "block",
    "data_seed",
)


def _qk_sizes(
    n_train: object,
    n_eval: object,
    embed_dim: object,
    head_dim: object,
    temperatures: object,
    replicates: object,
    noise_sd: object,
    query_shift: object,
) -> tuple[int, int, int, int, list[float], int, float, float]:
    """The checked sizes of :func:`qk_norm_smoothing`, the temperatures sorted ascending."""
    sizes = {"n_train": n_train, "n_eval": n_eval, "embed_dim": embed_dim, "head_dim": head_dim}
    n_tr, n_ev, d, dk = (require_positive_int(value, name) for name, value in sizes.items())
    reps = require_positive_int(replicates, "replicates", minimum=2)
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, (Sequence, np.ndarray)):
        raise TypeError(f"temperatures must be a sequence of numbers, got {type(temperatures).__name__}")
    taus = sorted(require_real(t, "temperatures", minimum=0.0, strict_minimum=True) for t in temperatures)
    if not taus:
        raise ValueError("temperatures must not be empty")
    sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    shift = require_real(query_shift, "query_shift", minimum=0.0)
    return n_tr, n_ev, d, dk, taus, reps, sd, shift


def qk_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One block of :func:`qk_norm_smoothing`'s replicates: validation and test errors at every temperature.

    One generator seeded with ``data_seed`` on the float64 device draws everything of the
    experiment, as :func:`qk_norm_smoothing` documents (the head, then all R replicates' tokens and
    noise); the block fits replicates :math:`[bR/K, (b+1)R/K)` with ``cosine_attention`` at every
    temperature.

    Parameters
    ----------
    point : Mapping
        ``n_train``, ``n_eval``, ``embed_dim``, ``head_dim``, ``temperatures`` (ascending),
        ``replicates`` (R), ``noise_sd``, ``query_shift``, ``blocks`` (K <= R), ``block`` (in
        [0, K)) and ``data_seed``.
    seed : int
        Not used (everything comes from ``data_seed``).
    device : str, default "cpu"
        Float64 work, on the CPU for MPS.

    Returns
    -------
    dict
        ``val_loss`` and ``test_ise`` (R/K, T) lists, ``zero_mse`` (R/K,), and ``gaussian_gap``,
        the largest gap of the block between cosine attention and the Gaussian-kernel NW at the
        middle temperature.

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    from ..kernels import cosine_attention

    p = require_point(point, _QK_KEYS)
    args = (p["n_train"], p["n_eval"], p["embed_dim"], p["head_dim"], p["temperatures"], p["replicates"])
    n_train, n_eval, d, head_dim, taus, reps, noise_sd, query_shift = _qk_sizes(*args, p["noise_sd"], p["query_shift"])
    lo, hi = _block_range(p["block"], p["blocks"], reps)
    _, dev64 = _devices(device)
    gen = torch.Generator(device=dev64).manual_seed(_seed(p["data_seed"], "data_seed"))
    w_k = _randn(d, head_dim, dtype=torch.float64, generator=gen) / math.sqrt(d)
    w_q = w_k + query_shift * _randn(d, head_dim, dtype=torch.float64, generator=gen) / math.sqrt(d)
    a = F.normalize(_randn(head_dim, dtype=torch.float64, generator=gen), dim=0)

    def target(x: Tensor) -> Tensor:
        return torch.sin(math.pi * F.normalize(x @ w_k, dim=-1) @ a)

    # Every replicate is drawn (the one stream) and projected; the block's rows are then kept.
    x_tr, x_val, x_te = (
        F.layer_norm(_randn(reps, n, d, dtype=torch.float64, generator=gen), (d,)) for n in (n_train, n_eval, n_eval)
    )
    y_tr = target(x_tr) + noise_sd * _randn(reps, n_train, dtype=torch.float64, generator=gen)
    y_val = target(x_val) + noise_sd * _randn(reps, n_eval, dtype=torch.float64, generator=gen)
    f_te = target(x_te)[lo:hi]
    keys, q_val, q_te = (x_tr @ w_k)[lo:hi], (x_val @ w_q)[lo:hi], (x_te @ w_q)[lo:hi]
    y_tr, y_val = y_tr[lo:hi], y_val[lo:hi]
    val_loss, test_ise = [], []
    for tau in taus:
        val_loss.append((cosine_attention(q_val, keys, y_tr, temperature=tau) - y_val).pow(2).mean(-1))
        test_ise.append((cosine_attention(q_te, keys, y_tr, temperature=tau) - f_te).pow(2).mean(-1))
    tau = taus[len(taus) // 2]
    gauss = nadaraya_watson(
        F.normalize(q_te, dim=-1), F.normalize(keys, dim=-1), y_tr, kernel="gaussian", bandwidth=math.sqrt(tau)
    )
    return {
        "val_loss": torch.stack(val_loss, -1).tolist(),
        "test_ise": torch.stack(test_ise, -1).tolist(),
        "zero_mse": f_te.pow(2).mean(-1).tolist(),
        "gaussian_gap": _max_abs(cosine_attention(q_te, keys, y_tr, temperature=tau), gauss),
    }


def qk_norm_smoothing(
    n_train: int,
    n_eval: int,
    embed_dim: int,
    head_dim: int,
    temperatures: Sequence[float],
    replicates: int,
    noise_sd: float,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    query_shift: float = 0.3,
    blocks: int | None = None,
    executor: str | Executor = "serial",
    progress: bool = False,
) -> QkSmoothing:
    r"""One attention head where its kernel can smooth: QK-normalised, on LayerNorm'd tokens.

    Tokens :math:`x = \mathrm{LayerNorm}(z)`, :math:`z \sim N(0, I_D)`; one head with
    :math:`W_K` (D × d_k, entries N(0, 1/D)) and :math:`W_Q = W_K + s\,G` (``query_shift`` s, G
    independent with entries N(0, 1/D), so :math:`W_Q \ne W_K`); responses
    :math:`y = f(x) + \sigma_\varepsilon \varepsilon` with :math:`f(x) = \sin(\pi\langle a, \hat k(x)\rangle)`,
    :math:`\hat k(x) = W_K^\top x/\lVert W_K^\top x\rVert` and a in the unit sphere of
    :math:`\mathbb R^{d_k}` (our choice: a function of what the head sees). Each replicate draws
    training, validation and test tokens and noise; the estimate is
    ``cosine_attention(W_Q^T x, W_K^T x_i, y_i, temperature=τ)`` for every τ (common random
    numbers across τ). τ is selected per replicate on the validation responses, and scored on the
    test queries against f. One generator seeded with ``seed`` on the float64 device draws, in
    float64: W_K, G and a, then per replicate the training, validation and test z, then the
    training noise, then the validation noise.

    The replicates are fitted in K blocks, the points of a sweep of :func:`qk_point` run by
    :func:`nwlib.sweep.run_sweep` on ``executor``; each block draws the whole stream and keeps its
    rows, and every replicate is computed on its own, so the results depend neither on K nor on the
    executor.

    Parameters
    ----------
    n_train, n_eval : int
        Training points, and queries in each of the validation and test sets.
    embed_dim, head_dim : int
        D and d_k.
    temperatures : sequence of float
        The sweep (finite, > 0), sorted ascending here.
    replicates : int
        R (>= 2).
    noise_sd : float
        σ_ε (finite, >= 0).
    seed : int
    device : torch.device or str, default "cpu"
    query_shift : float, default 0.3
        s (finite, >= 0).
    blocks : int, optional
        K, at most R. Default: ``min(R, QK_BLOCKS)``.
    executor : str or concurrent.futures.Executor, default "serial"
        Where the blocks run (:func:`nwlib.sweep.open_executor`).
    progress : bool, default False
        Show a progress bar of the blocks.

    Returns
    -------
    QkSmoothing

    Raises
    ------
    TypeError, ValueError
        On a bad size, temperature, noise level, shift or block count (named in the message).
    """
    n_tr, n_ev, d, dk, taus, reps, sd, shift = _qk_sizes(
        n_train, n_eval, embed_dim, head_dim, temperatures, replicates, noise_sd, query_shift
    )
    k = min(reps, QK_BLOCKS) if blocks is None else require_positive_int(blocks, "blocks")
    _block_range(0, k, reps)  # K <= R
    _, dev64 = _devices(device)
    common = dict(n_train=n_tr, n_eval=n_ev, embed_dim=d, head_dim=dk, temperatures=taus, replicates=reps)
    common |= dict(noise_sd=sd, query_shift=shift, blocks=k, data_seed=_seed(seed))
    points = [common | {"block": b} for b in range(k)]
    results = run_sweep(
        qk_point, points, seed=0, executor=executor, device=str(dev64), progress=progress, desc="ch01 QK"
    )
    f64: dict[str, Any] = {"dtype": torch.float64, "device": dev64}
    val, test = (torch.tensor([row for r in results for row in r[key]], **f64) for key in ("val_loss", "test_ise"))
    zero = torch.tensor([v for r in results for v in r["zero_mse"]], **f64)
    selected = val.argmin(-1)
    gap = max(r["gaussian_gap"] for r in results)
    return QkSmoothing(tuple(taus), val, test, selected, test.gather(-1, selected[:, None])[:, 0], zero, gap)


# --- C2 in sympy ----------------------------------------------------------------------------


class SymbolicMultihead(NamedTuple):
    """Both sides of C2 with every weight, bias and input a sympy symbol (row-vector layout, as PyTorch's)."""

    mha: Any
    """sympy Matrix (1, E): ``concat_h softmax(Q_h K_h^T / sqrt(d_h)) V_h @ W_O.T + b_O``, every bias included."""
    ensemble: Any
    r"""sympy Matrix (1, E): :math:`c + \sum_h \alpha_h \hat f_h(x)` (:func:`symbolic_multihead`), no ``b_K``."""
    query: Any
    """(1, E) symbols ``x_1j``."""
    keys: Any
    """(S, E) symbols ``k_ij``."""
    values: Any
    """(S, E) symbols ``v_ij``."""
    weights: tuple[Any, Any, Any, Any]
    """W_Q, W_K, W_V, W_O, each (E, E) in PyTorch's orientation (head h: rows h·d_h … of the first three)."""
    out_bias: Any
    """(1, E) symbols ``b_1j``: b_O."""
    alphas: tuple[Any, ...]
    """The H positive head weights α_h."""
    in_biases: tuple[Any, ...] = ()
    """b_Q, b_K, b_V, each (1, E) (PyTorch's ``in_proj_bias`` in three chunks); empty without biases."""
    without_query_bias: Any = None
    """sympy Matrix (1, E): the ensemble with ``b_Q`` dropped from the kernel (the old statement's kernel)."""
    without_value_constant: Any = None
    r"""sympy Matrix (1, E): the ensemble without the constant :math:`\sum_h W_O^h b_V^h`."""


def symbolic_multihead(
    embed_dim: int = 4, num_heads: int = 2, source_len: int = 2, *, biases: bool = True
) -> SymbolicMultihead:
    r"""Multi-head attention and the ensemble of NW heads, both written out in sympy (claim C2).

    Multi-head attention as PyTorch defines it, with every bias: head h (rows
    :math:`h d_h, \dots, (h+1) d_h - 1` of each input projection) has
    :math:`q = x W_Q^{h\top} + b_Q^h`, :math:`k_i = x_i W_K^{h\top} + b_K^h`,
    :math:`v_i = x_i' W_V^{h\top} + b_V^h`, and the heads are concatenated and projected,
    :math:`\mathrm{MHA}(x) = [\mathrm{head}_1, \dots]\, W_O^\top + b_O`. The ensemble side is
    the corrected proposition: :math:`c + \sum_h \alpha_h \hat f_h(x)` with the constant
    :math:`c = b_O + \sum_h b_V^h W_O^{h\top}`, and :math:`\hat f_h` the NW estimator with kernel
    :math:`K_h(x, x_i) = \exp\big((x W_Q^{h\top} + b_Q^h)\, W_K^h x_i^\top/\sqrt{d_h}\big)` (the
    key bias does not appear: it multiplies every key's kernel by one factor of the query) and
    responses :math:`x_i' W_V^{h\top} W_O^{h\top}/\alpha_h` (:math:`W_O^h` the column block of
    :math:`W_O`). The notebook asserts that the two sides simplify to the same matrix and that
    the two variants that drop a bias term (:attr:`SymbolicMultihead.without_query_bias`,
    :attr:`SymbolicMultihead.without_value_constant`) do not.

    Parameters
    ----------
    embed_dim, num_heads, source_len : int, default 4, 2, 2
        E, H (dividing E) and the number S of keys. The expressions grow quickly: keep them small.
    biases : bool, default True
        Include the biases b_Q, b_K, b_V of the input projections (b_O always is).

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
    >>> c2.mha.shape, len(c2.alphas), len(c2.in_biases)
    ((1, 2), 1, 3)
    """
    import sympy as sp

    _check_heads(embed_dim, num_heads)
    require_positive_int(source_len, "source_len")
    if not isinstance(biases, bool):
        raise TypeError(f"biases must be a bool, got {type(biases).__name__}")
    dh = embed_dim // num_heads

    def symbol_matrix(name: str, rows: int, cols: int) -> Any:
        return sp.Matrix(rows, cols, lambda a, b: sp.Symbol(f"{name}_{a + 1}{b + 1}", real=True))

    x_row = symbol_matrix("x", 1, embed_dim)  # one query
    x_keys = symbol_matrix("k", source_len, embed_dim)  # key inputs
    x_vals = symbol_matrix("v", source_len, embed_dim)  # value inputs
    w_q, w_k, w_v, w_o = (symbol_matrix(name, embed_dim, embed_dim) for name in ("Q", "K", "V", "O"))
    b_o = symbol_matrix("b", 1, embed_dim)
    if biases:
        b_q, b_k, b_v = (symbol_matrix(name, 1, embed_dim) for name in ("bQ", "bK", "bV"))
    else:
        b_q = b_k = b_v = sp.zeros(1, embed_dim)
    alphas = sp.symbols(f"alpha1:{num_heads + 1}", positive=True)

    def softmax_row(z: Any) -> Any:
        e = z.applyfunc(sp.exp)
        return e / sum(e)

    def ones(rows: int) -> Any:
        return sp.ones(rows, 1)

    # Multi-head attention as PyTorch defines it: concatenate the heads, then project.
    heads = []
    for hh in range(num_heads):
        rows = slice(hh * dh, (hh + 1) * dh)
        q_h = x_row * w_q[rows, :].T + b_q[:, rows]
        k_h = x_keys * w_k[rows, :].T + ones(source_len) * b_k[:, rows]
        v_h = x_vals * w_v[rows, :].T + ones(source_len) * b_v[:, rows]
        heads.append(softmax_row((q_h * k_h.T / sp.sqrt(dh)).applyfunc(sp.expand)) * v_h)
    mha = sp.Matrix.hstack(*heads) * w_o.T + b_o

    def nw_estimate(query: Any, keys: Any, responses: Any, kern: Callable[[Any, Any], Any]) -> Any:
        weights = [kern(query, keys[a, :]) for a in range(keys.rows)]
        total = sum((w * responses[a, :] for a, w in enumerate(weights)), sp.zeros(1, responses.cols))
        return total / sum(weights)

    def ensemble_side(query_bias: bool, value_constant: bool) -> Any:
        """c + sum_h alpha_h NW_h, each head with its own kernel and responses."""
        out = b_o
        for hh in range(num_heads):
            rows = slice(hh * dh, (hh + 1) * dh)
            bias = b_q[:, rows] if query_bias else sp.zeros(1, dh)

            def head_kernel(u: Any, w: Any, rows: slice = rows, bias: Any = bias) -> Any:
                return sp.exp(sp.expand(((u * w_q[rows, :].T + bias) * w_k[rows, :] * w.T)[0, 0] / sp.sqrt(dh)))

            responses = x_vals * w_v[rows, :].T * w_o[:, rows].T / alphas[hh]
            out = out + alphas[hh] * nw_estimate(x_row, x_keys, responses, head_kernel)
            if value_constant:
                out = out + b_v[:, rows] * w_o[:, rows].T
        return out

    in_biases = (b_q, b_k, b_v) if biases else ()
    return SymbolicMultihead(
        mha,
        ensemble_side(True, True),
        x_row,
        x_keys,
        x_vals,
        (w_q, w_k, w_v, w_o),
        b_o,
        tuple(alphas),
        in_biases,
        ensemble_side(False, True),
        ensemble_side(True, False),
    )


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
    points: tuple[dict[str, Any], ...]
    """The study's sweep: one :func:`mise_point` grid point per block of replicates (also :func:`cv_study`'s blocks)."""
    device: str
    """The device the blocks ran on."""

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


MISE_BLOCKS: int = 20
"""The most blocks of replicates :func:`mise_study` and :func:`cv_study` use by default: the largest
divisor of the jackknife's groups up to this (20 for 100 groups) is the number of their sweeps' points."""

_MISE_KEYS = ("n_train", "noise_sd", "bandwidths", "grid", "replicates", "jk_groups", "blocks", "block", "data_seed")
_CV_KEYS = ("n_train", "noise_sd", "grid", "replicates", "blocks", "block", "data_seed", "bandwidth")


def _mise_sizes(
    n_train: object, noise_sd: object, bandwidths: object, grid: object, replicates: object, jk_groups: object
) -> tuple[int, float, list[float], int, int, int]:
    """The checked sizes of a MISE study: n, σ_ε, the ascending bandwidths, m, R and G (G dividing R)."""
    n = require_positive_int(n_train, "n_train")
    sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    bws = _bandwidths(bandwidths)
    if len(bws) < 2 or any(b >= a for a, b in zip(bws[1:], bws[:-1], strict=True)):
        raise ValueError(f"bandwidths must be at least two, ascending, got {bws}")
    m = require_positive_int(grid, "grid", minimum=2)
    reps = require_positive_int(replicates, "replicates", minimum=2)
    groups = require_positive_int(jk_groups, "jk_groups", minimum=2)
    if reps % groups:
        raise ValueError(f"replicates must be a multiple of jk_groups = {groups}, got {reps}")
    return n, sd, bws, m, reps, groups


def _mise_blocks(blocks: object, groups: int) -> int:
    """K, checked: a divisor of the G jackknife groups; None gives the largest one up to :data:`MISE_BLOCKS`."""
    if blocks is None:
        return max(k for k in range(1, min(groups, MISE_BLOCKS) + 1) if groups % k == 0)
    k = require_positive_int(blocks, "blocks")
    if groups % k:
        raise ValueError(f"blocks must divide jk_groups = {groups} (whole jackknife groups per block), got {k}")
    return k


def _block_range(block: object, blocks: object, replicates: int) -> tuple[int, int]:
    """Replicates [lo, hi) of block ``block`` of K: [block R // K, (block + 1) R // K)."""
    k = require_positive_int(blocks, "blocks")
    if k > replicates:
        raise ValueError(f"blocks must be at most the {replicates} replicates, got {k}")
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < k:
        raise ValueError(f"block must be an int in [0, {k}), got {block!r}")
    return block * replicates // k, (block + 1) * replicates // k


def _replicate_data(
    n: int, noise_sd: float, replicates: int, data_seed: int, dev: torch.device
) -> tuple[Tensor, Tensor]:
    """All R replicate designs (R, n, 1) and their noise (R, n), from a generator seeded ``data_seed`` on ``dev``."""
    gen = torch.Generator(device=dev).manual_seed(data_seed)
    return _sine_data(n, noise_sd, gen, dev, replicates)


def _mise_block(
    x_mc: Tensor, eps_mc: Tensor, bandwidths: Sequence[float], grid: int, groups: int, dev: torch.device
) -> tuple[Tensor, ...]:
    """One block's fits at every bandwidth reduced to the centre, group sums and per-replicate ISE (float64)."""
    dev64 = float64_device(dev)
    reps, n = x_mc.shape[0], x_mc.shape[1]
    x_eval = torch.linspace(0.1, 0.9, grid, device=dev)[:, None]
    # Two response columns, fitted in one call: the noise-free signal and the pure noise.
    columns = torch.stack([sine_target(x_mc[..., 0]), eps_mc], dim=-1)  # (R, n, 2)
    f_eval64 = sine_target(x_eval[:, 0]).to(dev64, torch.float64)
    # Replicates go in chunks so that a backend which materialises the (chunk, m, n) weights
    # (non-fused attention paths) stays within about 2e8 elements.
    chunk = max(1, int(2e8 // (grid * n)))
    ise_rows, centres, sums = [], [], []
    for bw in bandwidths:
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
    s1, s2, series = (torch.stack(x, dim=1) for x in zip(*sums, strict=True))  # (groups, bandwidths, ...)
    return torch.stack(centres), s1, s2, series, torch.stack(ise_rows, dim=-1)


def mise_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One block of :func:`mise_study`'s replicates: the sums its MISE split and its jackknife need.

    A generator seeded with ``data_seed`` on ``device`` draws all R designs and their noise, the
    stream of :func:`mise_study`, and the block keeps replicates
    :math:`[bR/K, (b+1)R/K)`: G/K whole groups of the jackknife. Every bandwidth is fitted on them in
    float32 (two response columns, signal and noise, in one call) and the fits are reduced in
    float64 to what :func:`mise_study` merges: the block's mean signal fit, group sums of the signal
    fit centred at it and of its square, and per-replicate series.

    Parameters
    ----------
    point : Mapping
        ``n_train``, ``noise_sd``, ``bandwidths`` (B >= 2, ascending), ``grid`` (m), ``replicates``
        (R, a multiple of ``jk_groups``), ``jk_groups`` (G), ``blocks`` (K, dividing G), ``block``
        (b, in [0, K)) and ``data_seed`` (the study's seed).
    seed : int
        Not used: every block draws from the one stream seeded ``data_seed`` (the argument is
        :func:`nwlib.sweep.run_sweep`'s).
    device : str, default "cpu"
        Where the fits run (float64 statistics on the CPU for MPS).

    Returns
    -------
    dict
        Nested lists of floats: ``centre`` (B, m), the block's mean signal fit at each bandwidth;
        ``s1`` and ``s2`` (G/K, B, m), each group's sums of the signal fit minus ``centre`` and of its
        square; ``series`` (G/K, B, 3), each group's sums of the ISE, the noise fit's energy and the
        cross term; ``ise`` (R/K, B), the ISE of each replicate of the block.

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    FloatingPointError
        On non-finite fits.
    """
    p = require_point(point, _MISE_KEYS)
    n, noise_sd, bws, m, reps, groups = _mise_sizes(
        p["n_train"], p["noise_sd"], p["bandwidths"], p["grid"], p["replicates"], p["jk_groups"]
    )
    blocks = _mise_blocks(p["blocks"], groups)
    lo, hi = _block_range(p["block"], blocks, reps)
    dev = resolve_device(device)
    x_mc, eps_mc = _replicate_data(n, noise_sd, reps, _seed(p["data_seed"], "data_seed"), dev)
    parts = _mise_block(x_mc[lo:hi], eps_mc[lo:hi], bws, m, groups // blocks, dev)
    return dict(zip(("centre", "s1", "s2", "series", "ise"), (t.tolist() for t in parts), strict=True))


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
    blocks: int | None = None,
    executor: str | Executor = "serial",
    progress: bool = False,
) -> MiseStudy:
    r"""The MISE of one Gaussian-kernel NW head on :math:`[0.1, 0.9]`, split into bias² and two variances.

    A generator seeded with ``seed`` on ``device`` draws the R replicate designs
    :math:`x \sim U(0,1)` (R, n, 1), then their noise :math:`\sigma_\varepsilon\varepsilon` (R, n),
    in float32. Every bandwidth is fitted on all replicates (common random numbers: the
    bandwidths share the draws on purpose and are one computation). The estimator is
    linear in the responses, so one ``nadaraya_watson`` call with the two columns
    :math:`[f(x_i), \varepsilon_i]` gives the noise-free fit :math:`\hat f_0` and the noise fit
    :math:`\hat e`; their statistics are taken in float64. Then, per bandwidth,
    MISE = bias² + noise variance + design variance + cross term, with
    bias² :math:`= |I|^{-1}\int_I(\mathbb E\hat f_0 - f)^2` (unbiased for the Monte Carlo noise of
    the mean fit), noise variance :math:`|I|^{-1}\int_I \mathbb E\hat e^2`, design variance
    :math:`|I|^{-1}\int_I \operatorname{Var}\hat f_0` and the cross term
    :math:`2|I|^{-1}\int_I(\hat f_0 - f)\hat e` (expectation 0). The parts are not means over
    replicates: their standard errors come from the delete-a-group jackknife.

    The replicates are fitted in K blocks of G/K whole jackknife groups, the points of a sweep of
    :func:`mise_point` run by :func:`nwlib.sweep.run_sweep` on ``executor``. Each block returns its
    mean signal fit and group sums centred at it; the sums are moved exactly to the mean of the
    block means (:math:`\sum (f - c) = \sum (f - c_b) + s (c_b - c)` and likewise for the squares,
    s replicates per group) and the jackknife deletes the same G groups as without blocks. The
    results depend on K only through rounding (with K = 1 they are those of one pass over all
    replicates) and not at all on the executor.

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
    blocks : int, optional
        K, dividing G. Default: the largest divisor of G up to :data:`MISE_BLOCKS`, whatever the
        executor, so that a run is reproduced on any executor.
    executor : str or concurrent.futures.Executor, default "serial"
        Where the blocks run (:func:`nwlib.sweep.open_executor`): ``"serial"``, ``"process:N"``,
        ``"dask:ADDRESS"``.
    progress : bool, default False
        Show a progress bar of the blocks.

    Returns
    -------
    MiseStudy

    Raises
    ------
    TypeError, ValueError
        On a bad size or bandwidth, ``replicates`` not a multiple of ``jk_groups``, or ``blocks``
        not dividing it.
    """
    n, noise_sd, bws, m, reps, groups = _mise_sizes(n_train, noise_sd, bandwidths, grid, replicates, jk_groups)
    k = _mise_blocks(blocks, groups)
    dev, dev64 = _devices(device)
    common = dict(n_train=n, noise_sd=noise_sd, bandwidths=bws, grid=m, replicates=reps, jk_groups=groups)
    points = tuple(common | {"blocks": k, "block": b, "data_seed": _seed(seed)} for b in range(k))
    started = time.perf_counter()
    # The points carry their data seed: run_sweep's per-point seeds are not used.
    results = run_sweep(
        mise_point, points, seed=0, executor=executor, device=str(dev), progress=progress, desc="ch01 MISE"
    )
    f64: dict[str, Any] = {"dtype": torch.float64, "device": dev64}
    centres = torch.tensor([r["centre"] for r in results], **f64)  # (K, B, m)
    centre_all = centres.mean(0)  # the blocks are of one size
    shift = (centres - centre_all)[:, None]  # (K, 1, B, m): zero for K = 1
    size = reps // groups
    raw1, raw2 = (torch.tensor([r[key] for r in results], **f64) for key in ("s1", "s2"))  # (K, G/K, B, m)
    s1 = (raw1 + size * shift).flatten(0, 1)  # (G, B, m), centred at centre_all
    s2 = (raw2 + 2 * shift * raw1 + size * shift.pow(2)).flatten(0, 1)
    series = torch.tensor([r["series"] for r in results], **f64).flatten(0, 1)  # (G, B, 3)
    ise = torch.tensor([row for r in results for row in r["ise"]], **f64)  # (R, B)
    x_eval = torch.linspace(0.1, 0.9, m, device=dev)[:, None]
    f_eval64 = sine_target(x_eval[:, 0]).to(dev64, torch.float64)
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
    x_mc, eps_mc = _replicate_data(n, noise_sd, reps, _seed(seed), dev)  # the blocks' draws, for cv_study
    return MiseStudy(
        bandwidths=np.asarray(bws, dtype=np.float64),
        ise=ise,
        estimates=est,
        ses=se,
        mise_se=(ise.std(0) / math.sqrt(reps)).cpu().numpy(),
        best=best,
        ratios=ratios,
        x=x_mc,
        y=torch.stack([sine_target(x_mc[..., 0]), eps_mc], dim=-1).sum(-1),  # the responses: signal + noise
        x_eval=x_eval,
        f_eval=f_eval64,
        jk_groups=groups,
        seconds=seconds,
        points=points,
        device=str(dev),
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


MISE_HEADERS: dict[str, str] = {
    "noise var": "noise variance",
    "design var": "design variance",
    "cross/MISE": "cross term / MISE",
}
"""Words for the columns of :func:`mise_table` in :func:`format_mise_table`."""


def format_mise_table(study: MiseStudy) -> Any:
    """:func:`mise_table` for reading (:func:`nwlib.book.table`): ``estimate ± SE`` cells, headers in words.

    The MISE and the cross term's share carry their standard errors; the bandwidths and the three
    parts of the MISE span several decades, so each of their cells keeps three significant digits
    of its own (``2.78e-07``, ``0.0297``) rather than the decimals of its column.

    Parameters
    ----------
    study : MiseStudy

    Returns
    -------
    pandas.DataFrame of str
        Index ``bandwidth h`` (three significant digits); columns ``MISE``, ``bias²``,
        ``noise variance``, ``design variance``, ``cross term / MISE``.

    Raises
    ------
    TypeError
        If ``study`` is not a MiseStudy.
    """
    import pandas as pd

    from ..book import table

    frame = mise_table(study)
    parts = ["bias^2", "noise var", "design var"]
    frame[parts] = frame[parts].astype(object)  # a cell of an object column keeps its own significant digits
    frame.index = pd.Index([f"{h:.3g}" for h in frame.index], name="bandwidth h")  # as text: kept as it is
    return table(frame, headers=MISE_HEADERS)


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


def cv_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    """One block of :func:`cv_study`: the leave-one-out bandwidth and both fits' errors on its replicates.

    The block's replicates are drawn as in :func:`mise_point` (all R from a generator seeded
    ``data_seed`` on ``device``, then rows :math:`[bR/K, (b+1)R/K)`). ``nwlib.select_bandwidth``
    (Gaussian kernel, leave-one-out least squares, scored in float64) picks h on each; the fits at
    that h and at ``bandwidth`` are float32 on ``device``, their errors on the grid float64.

    Parameters
    ----------
    point : Mapping
        ``n_train``, ``noise_sd``, ``grid`` (m), ``replicates`` (R), ``blocks`` (K <= R),
        ``block`` (in [0, K)), ``data_seed`` and ``bandwidth`` (the grid's Monte Carlo minimiser, > 0).
    seed : int
        Not used (the replicates come from ``data_seed``).
    device : str, default "cpu"

    Returns
    -------
    dict
        Lists over the block's replicates: ``bandwidth`` (the LOO-CV h, float32 values), ``ise_cv``
        and ``ise_opt`` (the ISE of the fit at it and at ``bandwidth``).

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    p = require_point(point, _CV_KEYS)
    n = require_positive_int(p["n_train"], "n_train")
    noise_sd = require_real(p["noise_sd"], "noise_sd", minimum=0.0)
    m = require_positive_int(p["grid"], "grid", minimum=2)
    reps = require_positive_int(p["replicates"], "replicates", minimum=2)
    lo, hi = _block_range(p["block"], p["blocks"], reps)
    h_opt = require_real(p["bandwidth"], "bandwidth", minimum=0.0, strict_minimum=True)
    dev, dev64 = _devices(device)
    x_mc, eps_mc = _replicate_data(n, noise_sd, reps, _seed(p["data_seed"], "data_seed"), dev)
    x = x_mc[lo:hi]
    y = torch.stack([sine_target(x[..., 0]), eps_mc[lo:hi]], dim=-1).sum(-1)  # signal + noise, as MiseStudy.y
    x_eval = torch.linspace(0.1, 0.9, m, device=dev)[:, None]
    f_eval = sine_target(x_eval[:, 0]).to(dev64, torch.float64)
    selection = select_bandwidth(x.to(dev64, torch.float64), y.to(dev64, torch.float64), kernel="gaussian")
    h_cv = selection.bandwidth.to(dev, torch.float32)  # one bandwidth per replicate
    fit_cv = nadaraya_watson(x_eval, x, y, kernel="gaussian", bandwidth=h_cv)  # (R/K, m)
    fit_opt = nadaraya_watson(x_eval, x, y, kernel="gaussian", bandwidth=h_opt)
    ise_cv = (fit_cv.to(dev64, torch.float64) - f_eval).pow(2).mean(-1)
    ise_opt = (fit_opt.to(dev64, torch.float64) - f_eval).pow(2).mean(-1)
    return {"bandwidth": h_cv.tolist(), "ise_cv": ise_cv.tolist(), "ise_opt": ise_opt.tolist()}


def cv_study(study: MiseStudy, *, executor: str | Executor = "serial", progress: bool = False) -> CvStudy:
    """The fit at each replicate's leave-one-out bandwidth against the fit at the grid's minimiser.

    ``nwlib.select_bandwidth`` (Gaussian kernel, leave-one-out least squares, scored in float64)
    picks h on each replicate of ``study``; both fits are float32 on the study's device, their
    errors float64. The replicates are the study's, so the comparison is paired. They are
    processed in the study's blocks, a sweep of :func:`cv_point` run by
    :func:`nwlib.sweep.run_sweep` on ``executor``; every replicate is computed on its own, so the
    results depend neither on the blocks nor on the executor.

    Parameters
    ----------
    study : MiseStudy
    executor : str or concurrent.futures.Executor, default "serial"
        Where the blocks run (:func:`nwlib.sweep.open_executor`).
    progress : bool, default False
        Show a progress bar of the blocks.

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
    h_opt = float(study.bandwidths[study.best])
    points = [{k: v for k, v in p.items() if k in _CV_KEYS} | {"bandwidth": h_opt} for p in study.points]
    results = run_sweep(
        cv_point, points, seed=0, executor=executor, device=study.device, progress=progress, desc="ch01 CV"
    )
    dev64 = study.f_eval.device

    def joined(key: str, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.tensor([v for r in results for v in r[key]], dtype=dtype, device=device)

    h_cv = joined("bandwidth", torch.float32, study.x.device)  # (R,)
    ise_cv, ise_opt = joined("ise_cv", torch.float64, dev64), joined("ise_opt", torch.float64, dev64)
    g = study.jk_groups
    ratio = grouped_jackknife(lambda a, b: a.sum() / b.sum(), _group_sums(ise_cv, g), _group_sums(ise_opt, g), groups=g)
    q1, med, q3 = (float(v) for v in np.quantile(h_cv.cpu().numpy(), [0.25, 0.5, 0.75]))
    return CvStudy(h_cv, ise_cv, ise_opt, estimate(ratio.estimate, ratio.se), (q1, med, q3))


# --- checks ---------------------------------------------------------------------------------


def _seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
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


def fraction_removed(errors: Tensor, zero_errors: Tensor) -> Comparison:
    r"""The share of the zero predictor's error an estimator removes, :math:`1 - \bar e/\bar z`, with a jackknife SE.

    Parameters
    ----------
    errors, zero_errors : Tensor, shape (R,)
        Per-replicate errors of the estimator and of the zero predictor on the same evaluation
        points (R >= 2).

    Returns
    -------
    Comparison
        The ratio estimate with the leave-one-out jackknife standard error, df = R − 1.

    Raises
    ------
    TypeError, ValueError
        If the inputs are not two 1-D tensors of one length R >= 2.

    Examples
    --------
    >>> import torch
    >>> round(fraction_removed(torch.tensor([1.0, 1.0]), torch.tensor([4.0, 4.0])).estimate, 3)
    0.75
    """
    for name, t in (("errors", errors), ("zero_errors", zero_errors)):
        require_tensor(t, name)
        if t.dim() != 1 or t.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D tensor of R >= 2 replicates, got shape {tuple(t.shape)}")
    if errors.shape != zero_errors.shape:
        raise ValueError(
            f"errors and zero_errors must have one length, got {errors.shape[0]} and {zero_errors.shape[0]}"
        )
    e, z = errors.double().cpu(), zero_errors.double().cpu()
    r = e.shape[0]
    full = 1 - e.mean() / z.mean()
    loo = 1 - (e.sum() - e) / (z.sum() - z)
    se = math.sqrt((r - 1) / r * float((loo - loo.mean()).pow(2).sum()))
    return estimate(float(full), se, df=r - 1)


def weights_grid(demo: SmootherDemo) -> Any:
    """The query's weights at every bandwidth of ``demo`` as a long table, for the interactive figure.

    Parameters
    ----------
    demo : SmootherDemo
        From :func:`smoother_demo` (usually at a finer grid of bandwidths than the static figure).

    Returns
    -------
    pandas.DataFrame
        Columns ``h`` (bandwidth), ``x`` (training point, sorted), ``weight`` (w_i(x_0), summing to 1
        over ``x`` for each ``h``) and ``n_eff``; one row per (bandwidth, training point).
    """
    import pandas as pd

    if not isinstance(demo, SmootherDemo):
        raise TypeError(f"demo must be a SmootherDemo, got {type(demo).__name__}")
    order = torch.argsort(demo.x[:, 0])
    x = demo.x[order, 0].double().cpu().numpy()
    rows = []
    for b, h in enumerate(demo.bandwidths):
        w = demo.weights[b, order].double().cpu().numpy()
        rows.append(pd.DataFrame({"h": h, "x": x, "weight": w, "n_eff": float(demo.n_eff[b])}))
    return pd.concat(rows, ignore_index=True)
