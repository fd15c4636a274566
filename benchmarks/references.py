"""The implementations :func:`nwlib.nadaraya_watson` is compared with.

Each is what a reader would plausibly write instead, and each computes the same
estimate, which :func:`benchmarks.run` checks on the benchmarked inputs themselves
and ``tests/test_benchmarks_smoke.py`` checks on small ones:

* :func:`materialised_softmax`: ``softmax(Q Kᵀ · scale) V`` in one batched torch
  expression, which forms the (R, H, m, n) weight tensor;
  :func:`materialised_gaussian` is the same with the Gaussian kernel,
  ``softmax(-cdist(Q, K)² / (2h²)) V``;
* :func:`numpy_loop`: a NumPy loop over replicates and heads, one (m, n) weight
  matrix at a time, with the usual max-subtraction for stability;
  :func:`numpy_loop_gaussian` is the same with the Gaussian kernel (squared
  distances through ``|q|² + |k|² - 2 q·k``);
* :func:`sdpa_unpadded`: ``scaled_dot_product_attention`` called directly with
  scalar responses as values of width 1, the call that takes PyTorch's slow CPU
  path (``nadaraya_watson`` pads the values to the key width instead);
* :func:`statsmodels_nw`: statsmodels' ``KernelReg`` with the local-constant
  (Nadaraya–Watson) estimator, a Gaussian product kernel and a fixed bandwidth;
* :func:`sdpa_padded`: ``scaled_dot_product_attention`` with the values padded to the key
  width, the path ``nadaraya_watson`` took before its fused kernel (and still takes under
  autograd, on accelerators, and where the kernel cannot be built);
* :func:`keops_nw`: KeOps' ``sumsoftmaxweight`` reduction (``pykeops``, the ``bench`` extra);
* :func:`compiled_flex_attention`, :func:`compiled_softmax`: ``flex_attention`` and the
  materialised softmax under ``torch.compile`` (inductor), the compiled candidates;
* :func:`identity_mha`: ``torch.nn.MultiheadAttention`` whose input and output
  projections are identities, so that its heads are the NW estimators on the
  given per-head queries, keys and values.

Shapes follow :func:`nwlib.nadaraya_watson`: queries (R, H, m, d), keys
(R, H, n, d), values (R, H, n) for scalar responses or (R, H, n, p) for vector ones.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "materialised_softmax",
    "materialised_gaussian",
    "numpy_loop",
    "numpy_loop_gaussian",
    "sdpa_unpadded",
    "statsmodels_nw",
    "identity_mha",
    "to_model_layout",
    "sdpa_padded",
    "keops_nw",
    "compiled_flex_attention",
    "compiled_softmax",
    "from_model_layout",
]


def materialised_softmax(queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """``softmax(queries @ keys.mT * scale) @ values`` with the weight tensor formed.

    Parameters
    ----------
    queries : Tensor, shape (..., m, d)
    keys : Tensor, shape (..., n, d)
    values : Tensor, shape (..., n) or (..., n, p)
    scale : float
        Multiplies the dot products; ``1/sqrt(d)`` is attention's scaling.

    Returns
    -------
    Tensor, shape (..., m) or (..., m, p)
    """
    scalar = values.dim() == keys.dim() - 1
    weights = torch.softmax(queries @ keys.mT * scale, dim=-1)
    if scalar:
        return (weights @ values.unsqueeze(-1)).squeeze(-1)
    return weights @ values


def materialised_gaussian(queries: Tensor, keys: Tensor, values: Tensor, bandwidth: float) -> Tensor:
    """Gaussian-kernel NW, ``softmax(-cdist(Q, K)² / (2h²)) V``, with the weight tensor formed.

    What a reader would write for ``nadaraya_watson(..., kernel="gaussian",
    bandwidth=h)`` with PyTorch alone. Shapes as in :func:`materialised_softmax`.
    """
    scalar = values.dim() == keys.dim() - 1
    logits = torch.cdist(queries, keys).pow(2).mul_(-0.5 / (bandwidth * bandwidth))
    weights = torch.softmax(logits, dim=-1)
    del logits
    if scalar:
        return (weights @ values.unsqueeze(-1)).squeeze(-1)
    return weights @ values


def numpy_loop(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """The NW/attention estimate with a Python loop over the leading (R, H) axes.

    Parameters
    ----------
    queries : ndarray, shape (R, H, m, d)
    keys : ndarray, shape (R, H, n, d)
    values : ndarray, shape (R, H, n) or (R, H, n, p)
    scale : float

    Returns
    -------
    ndarray, shape (R, H, m) or (R, H, m, p), dtype of ``queries``
    """
    R, H, m, _ = queries.shape
    out = np.empty((R, H, m) + values.shape[3:], dtype=queries.dtype)
    scale = queries.dtype.type(scale)  # a Python float would promote float32 to float64
    for r in range(R):
        for h in range(H):
            logits = queries[r, h] @ keys[r, h].T
            logits *= scale
            logits -= logits.max(axis=1, keepdims=True)
            np.exp(logits, out=logits)
            logits /= logits.sum(axis=1, keepdims=True)
            out[r, h] = logits @ values[r, h]
    return out


def numpy_loop_gaussian(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, bandwidth: float) -> np.ndarray:
    """Gaussian-kernel NW with a Python loop over the leading (R, H) axes.

    The logits are ``-(|q|² + |k|² - 2 q·k) / (2h²)`` for one (m, n) block at a
    time, then the same max-subtraction, exp and normalisation as
    :func:`numpy_loop`. Shapes as there; ``bandwidth`` is h.
    """
    R, H, m, _ = queries.shape
    out = np.empty((R, H, m) + values.shape[3:], dtype=queries.dtype)
    coef = queries.dtype.type(-0.5 / (bandwidth * bandwidth))
    two = queries.dtype.type(2.0)
    for r in range(R):
        for h in range(H):
            q, k = queries[r, h], keys[r, h]
            logits = q @ k.T
            logits *= -two
            logits += (q * q).sum(axis=1)[:, None]
            logits += (k * k).sum(axis=1)[None, :]
            logits *= coef
            logits -= logits.max(axis=1, keepdims=True)
            np.exp(logits, out=logits)
            logits /= logits.sum(axis=1, keepdims=True)
            out[r, h] = logits @ values[r, h]
    return out


def sdpa_unpadded(queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """``scaled_dot_product_attention(Q, K, v[..., None])[..., 0]`` for scalar responses.

    The direct call with values of width 1: on the CPU the fused kernel needs
    queries, keys and values of one width, so this takes a slower path. Shapes:
    queries (R, H, m, d), keys (R, H, n, d), values (R, H, n); returns (R, H, m).
    """
    out = torch.nn.functional.scaled_dot_product_attention(queries, keys, values.unsqueeze(-1))
    return out.squeeze(-1)


def statsmodels_nw(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, bandwidth: float) -> np.ndarray:
    """Gaussian-kernel NW estimate of one estimator by statsmodels' ``KernelReg``.

    ``reg_type='lc'`` (local constant) with a fixed ``bw`` is exactly NW with
    kernel ``exp(-||q - k||² / (2 h²))``; both must be passed, since the defaults
    are local-linear regression and a cross-validated bandwidth.

    Parameters
    ----------
    queries : ndarray, shape (m, d)
    keys : ndarray, shape (n, d)
    values : ndarray, shape (n,)
    bandwidth : float
        h, the same in every coordinate.

    Returns
    -------
    ndarray, shape (m,), float64
    """
    from statsmodels.nonparametric.kernel_regression import KernelReg

    d = keys.shape[1]
    model = KernelReg(
        endog=np.asarray(values, dtype=np.float64),
        exog=np.asarray(keys, dtype=np.float64),
        var_type="c" * d,
        reg_type="lc",
        bw=np.full(d, float(bandwidth)),
        ckertype="gaussian",
        rng=np.random.default_rng(0),  # unused with a fixed bw; silences a FutureWarning
    )
    mean, _ = model.fit(np.asarray(queries, dtype=np.float64))
    return np.asarray(mean)


def identity_mha(
    num_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device | str
) -> torch.nn.MultiheadAttention:
    """An eval-mode ``nn.MultiheadAttention`` whose projections are identities.

    Head h then attends with columns ``h*head_dim:(h+1)*head_dim`` of its inputs
    as queries, keys and values, and the output concatenates the heads, so it
    computes the NW estimators of :func:`nwlib.nadaraya_watson` (default kernel)
    plus the cost of four (unnecessary) projections, which is what the module
    costs a reader who uses it for this.

    Parameters
    ----------
    num_heads, head_dim : int
        H and d; the embedding dimension is ``num_heads * head_dim``.
    dtype : torch.dtype
    device : torch.device or str

    Returns
    -------
    torch.nn.MultiheadAttention
        With ``batch_first=True``; inputs of shape (R, m, H*d) (see :func:`to_model_layout`).
    """
    embed = num_heads * head_dim
    mha = torch.nn.MultiheadAttention(embed, num_heads, batch_first=True, dtype=dtype, device=device)
    with torch.no_grad():
        eye = torch.eye(embed, dtype=dtype, device=device)
        mha.in_proj_weight.copy_(torch.cat([eye, eye, eye]))
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(eye)
        mha.out_proj.bias.zero_()
    return mha.eval()


def to_model_layout(x: Tensor) -> Tensor:
    """(R, H, L, d) per-head tensors to the (R, L, H*d) layout of ``nn.MultiheadAttention``."""
    R, H, L, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(R, L, H * d).contiguous()


def from_model_layout(y: Tensor, num_heads: int) -> Tensor:
    """(R, L, H*d) back to (R, H, L, d); the inverse of :func:`to_model_layout`."""
    R, L, E = y.shape
    return y.reshape(R, L, num_heads, E // num_heads).permute(0, 2, 1, 3)


def _pad_values(keys: Tensor, values: Tensor) -> tuple[Tensor, int | None]:
    """Values as (..., n, w), w the key width (zero columns added); the true width, or None for scalars."""
    scalar = values.dim() == keys.dim() - 1
    v = values.unsqueeze(-1) if scalar else values
    p = v.shape[-1]
    width = max(keys.shape[-1], p)
    return torch.nn.functional.pad(v, (0, width - p)), (None if scalar else p)


def _unpad(out: Tensor, p: int | None) -> Tensor:
    return out[..., 0] if p is None else out[..., :p]


def sdpa_padded(queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """``scaled_dot_product_attention`` with the values zero-padded to the key width.

    What ``nadaraya_watson`` computed before its fused kernel, and what it still computes on
    accelerators, under autograd and where the kernel cannot be built: the exp kernel only.
    """
    v, p = _pad_values(keys, values)
    out = torch.nn.functional.scaled_dot_product_attention(queries, keys, v, scale=scale)
    return _unpad(out, p)


def keops_nw(queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """KeOps (``pykeops``): the softmax-weighted sum as a symbolic reduction, no (m, n) matrix formed.

    ``sumsoftmaxweight`` computes Σ_j exp(s_ij - max_j s_ij) v_j / Σ_j exp(s_ij - max_j s_ij) with
    s_ij = scale·⟨q_i, k_j⟩ over the batch dimensions; KeOps compiles the reduction with the
    system C++ compiler on its first call (cached in its build folder afterwards).
    """
    from pykeops.torch import LazyTensor

    scalar = values.dim() == keys.dim() - 1
    v = values.unsqueeze(-1) if scalar else values
    qi = LazyTensor(queries.unsqueeze(-2).contiguous())
    kj = LazyTensor(keys.unsqueeze(-3).contiguous())
    vj = LazyTensor(v.unsqueeze(-3).contiguous())
    out = ((qi | kj) * scale).sumsoftmaxweight(vj, axis=queries.dim() - 1)
    return out[..., 0] if scalar else out


def compiled_flex_attention():
    """``flex_attention`` under ``torch.compile`` (inductor's CPU template), as ``f(q, k, v, scale)``."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)

    def call(queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
        v, p = _pad_values(keys, values)
        return _unpad(flex(queries, keys, v, scale=scale), p)

    return call


def compiled_softmax():
    """The materialised softmax under ``torch.compile``: inductor fuses the softmax's passes (C++/OpenMP)."""

    def nw(queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
        return materialised_softmax(queries, keys, values, scale)

    return torch.compile(nw, dynamic=False)
