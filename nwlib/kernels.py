"""Nadaraya–Watson regression computed as (scaled dot-product) attention.

The NW estimate at a query q with training pairs (k_i, v_i) is

    f̂(q) = Σ_i K(q, k_i) v_i / Σ_j K(q, k_j).

For the exponential kernel K(q, k) = exp(⟨q, k⟩ / h²) this is exactly
``softmax(q kᵀ / h²) v``, i.e. attention; with h = d^(1/4) it is the
``1/√d`` scaling of the Transformer. The Gaussian kernel
K(q, k) = exp(−‖q − k‖² / (2h²)) reduces to the same softmax because
−‖q − k‖²/(2h²) = ⟨q, k⟩/h² − ‖k‖²/(2h²) − ‖q‖²/(2h²) and the last term is
constant per query, so it cancels; the middle term becomes an additive mask.

Both kernels go through a fused softmax-attention kernel that never
materialises the (m, n) weight matrix and subtracts a running row maximum before
exponentiating, so small bandwidths and far queries stay finite in float32: on
the CPU without autograd, nwlib's own kernel for small head dimensions
(:mod:`nwlib._fused`, compiled on first use, measured in ``benchmarks/run.py``);
otherwise, or where it cannot be built,
:func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _fused
from ._validation import (
    broadcast_batch,
    require_choice,
    require_positive_finite,
    require_same_dtype_device,
    require_tensor,
)

__all__ = ["nadaraya_watson", "nadaraya_watson_weights", "cosine_attention", "KERNELS"]

KERNELS: tuple[str, ...] = ("exp", "gaussian")
"""Kernel names accepted by :func:`nadaraya_watson` and :func:`nadaraya_watson_weights`."""

Kernel = Literal["exp", "gaussian"]


def _check_qk(queries: object, keys: object) -> tuple[Tensor, Tensor]:
    queries = require_tensor(queries, "queries", min_dim=2)
    keys = require_tensor(keys, "keys", min_dim=2)
    require_same_dtype_device(queries, "queries", keys=keys)
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            "keys must have the same last (feature) dimension as queries: "
            f"queries {tuple(queries.shape)}, keys {tuple(keys.shape)}"
        )
    if keys.shape[-2] == 0:
        raise ValueError("keys must contain at least one key (n >= 1)")
    return queries, keys


def _values_checkable(t: Tensor) -> bool:
    """Whether reading ``t``'s values on the host is free: a plain CPU tensor.

    On an accelerator the read would wait for the device on every call, and under a
    ``torch.func`` transform (``vmap``, ``grad``) the values are not concrete at all.
    """
    return t.device.type == "cpu" and not torch._C._functorch.is_functorch_wrapped_tensor(t)


def _require_positive_finite_tensor(t: Tensor, name: str) -> None:
    """Raise unless every entry is finite and > 0; skipped where that needs a host sync."""
    if _values_checkable(t) and not bool((torch.isfinite(t) & (t > 0)).all()):
        raise ValueError(f"{name} must be finite and > 0 everywhere")


def _check_values(keys: Tensor, values: object) -> tuple[Tensor, bool]:
    """Values as (..., n, p), and whether they were scalar responses (..., n); keys already checked."""
    values = require_tensor(values, "values", min_dim=1)
    require_same_dtype_device(keys, "keys", values=values)
    scalar = values.dim() == keys.dim() - 1
    if not scalar and values.dim() != keys.dim():
        raise ValueError(
            "values must have shape (..., n, p) or (..., n) with the rank of keys or one less: "
            f"keys {tuple(keys.shape)}, values {tuple(values.shape)}"
        )
    if scalar:
        values = values.unsqueeze(-1)
    if values.shape[-2] != keys.shape[-2]:
        raise ValueError(
            f"values must have as many rows as keys (n): keys {tuple(keys.shape)}, values {tuple(values.shape)}"
        )
    return values, scalar


def _bandwidth(bandwidth: object, kernel: str, dim: int, reference: Tensor) -> float | Tensor:
    """Return h as a float, or as a tensor of shape (*batch, 1, 1) ready to broadcast.

    Every tensor, 0-dim ones included, stays a tensor, so that gradients with respect
    to it flow and ``torch.func.vmap`` can batch over it.
    """
    if bandwidth is None:
        if kernel == "gaussian":
            raise ValueError("bandwidth is required for kernel='gaussian' (finite and > 0)")
        return float(dim) ** 0.25
    if isinstance(bandwidth, Tensor):
        require_tensor(bandwidth, "bandwidth")
        require_same_dtype_device(reference, "queries", bandwidth=bandwidth)
        _require_positive_finite_tensor(bandwidth, "bandwidth")
        return bandwidth[..., None, None]
    return require_positive_finite(bandwidth, "bandwidth")


def _scaled_inputs(
    queries: Tensor, keys: Tensor, kernel: str, bandwidth: object
) -> tuple[Tensor, Tensor, Tensor | None, float]:
    """Inputs, key offsets and scale such that the log-weights are scale·(⟨q', k'⟩ + offset(k')).

    The offset has the shape of ``keys`` less its last dimension (None for ``"exp"``);
    SDPA takes it as the additive mask ``scale · offset``.
    """
    return _scaled_by(queries, keys, kernel, _bandwidth(bandwidth, kernel, queries.shape[-1], queries))


def _scaled_by(
    queries: Tensor, keys: Tensor, kernel: str, h: float | Tensor
) -> tuple[Tensor, Tensor, Tensor | None, float]:
    """:func:`_scaled_inputs` for a bandwidth already checked by :func:`_bandwidth`."""
    if kernel == "gaussian":
        # The Gaussian kernel is translation invariant; centring on the key mean keeps
        # ⟨q, k⟩ and ‖k‖² small, which is what float32 accuracy depends on.
        centre = keys.mean(dim=-2, keepdim=True)
        queries, keys = queries - centre, keys - centre
    if isinstance(h, float):
        # A scalar bandwidth goes to the kernel as its scale: no rescaled copies of the inputs.
        offset = -0.5 * keys.pow(2).sum(-1) if kernel == "gaussian" else None
        return queries, keys, offset, 1.0 / (h * h)
    # A tensor bandwidth cannot be SDPA's (float) scale: split 1/h² as (1/h)·(1/h) over
    # queries and keys, which balances their magnitudes.
    queries, keys = queries / h, keys / h
    offset = -0.5 * keys.pow(2).sum(-1) if kernel == "gaussian" else None
    return queries, keys, offset, 1.0


def nadaraya_watson(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    kernel: Kernel = "exp",
    bandwidth: float | Tensor | None = None,
) -> Tensor:
    r"""Nadaraya–Watson kernel regression evaluated at ``queries``.

    Computes :math:`\hat f(q_j) = \sum_i K(q_j, k_i) v_i / \sum_i K(q_j, k_i)`
    through a fused attention kernel, without forming the (m, n) weight matrix.

    Parameters
    ----------
    queries : Tensor, shape (..., m, d)
        Points where the estimate is evaluated.
    keys : Tensor, shape (..., n, d)
        Training inputs.
    values : Tensor, shape (..., n, p) or (..., n)
        Training responses: vector responses, or scalar ones when ``values``
        has one dimension fewer than ``keys``.
    kernel : {"exp", "gaussian"}, default "exp"
        ``"exp"``: :math:`K(q, k) = \exp(\langle q, k\rangle / h^2)`, the
        attention kernel. ``"gaussian"``:
        :math:`K(q, k) = \exp(-\lVert q - k\rVert^2 / (2h^2))`.
    bandwidth : float or Tensor, optional
        The bandwidth ``h`` (finite and > 0). A tensor must broadcast against
        the batch shape ``(...)`` (for example one bandwidth per head). For
        ``"exp"`` the default is :math:`h = d^{1/4}`, so that the result equals
        ``softmax(queries @ keys.mT / sqrt(d)) @ values``, i.e.
        ``scaled_dot_product_attention``. Required for ``"gaussian"``.

        A Python number is passed to the attention kernel as its scale. A tensor
        (0-dim included) stays a tensor, so the result is differentiable with
        respect to it and ``torch.func.vmap`` can batch over it: the fused CPU
        kernel takes it as one scale per batch element (no gradient needed), and
        otherwise the inputs are rescaled by it for SDPA. Its values are checked
        only where that is free, on a plain CPU tensor: on an accelerator (the
        check would wait for the device) and under ``torch.func`` transforms
        they are not checked, and an invalid
        bandwidth gives an invalid result instead of an error (NaN for zero;
        a negative h acts as its absolute value, since only h² enters the kernel).

    Returns
    -------
    Tensor, shape (..., m, p) or (..., m)
        The estimates, with the broadcast batch shape of the inputs; dtype and
        device are those of the inputs.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, dtypes differ, or ``kernel`` is not a string.
    ValueError
        On shape mismatches, non-broadcasting batch shapes, mixed devices, an unknown
        kernel, or a bandwidth that is missing (Gaussian), non-finite or not > 0
        (tensors: on the CPU and outside ``torch.func`` transforms only).

    Examples
    --------
    >>> import torch
    >>> from nwlib import nadaraya_watson
    >>> q, k, v = torch.randn(5, 4), torch.randn(20, 4), torch.randn(20, 3)
    >>> sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    >>> torch.allclose(nadaraya_watson(q, k, v), sdpa, atol=1e-6)
    True
    """
    kernel = require_choice(kernel, "kernel", KERNELS)  # type: ignore[assignment]
    queries, keys = _check_qk(queries, keys)
    values, scalar = _check_values(keys, values)
    shapes = {"queries": queries.shape[:-2], "keys": keys.shape[:-2], "values": values.shape[:-2]}
    if isinstance(bandwidth, Tensor):
        shapes["bandwidth"] = bandwidth.shape  # one bandwidth per batch element broadcasts too
    batch = broadcast_batch(shapes)
    h = _bandwidth(bandwidth, kernel, queries.shape[-1], queries)
    out = None
    if kernel == "gaussian" or isinstance(h, Tensor):
        # The fused kernel takes the raw inputs: it centres the keys and forms the Gaussian offset
        # while laying them out, and takes a bandwidth tensor as one scale per (batch, head), so
        # that no rescaled copies of the inputs are made. Where it does not apply, the inputs are
        # rescaled below for SDPA (and differentiated through there).
        scale = 1.0 / (h * h) if isinstance(h, float) else h[..., 0, 0].reciprocal().square()
        out = _fused.fused_attention(queries, keys, values, None, batch, scale, gaussian=kernel == "gaussian")
    if out is None:
        q, k, offset, scale = _scaled_by(queries, keys, kernel, h)
        out = _attention(q, k, values, offset, batch, scale)
    return out.squeeze(-1) if scalar else out


def _sdpa_view(t: Tensor, batch: torch.Size, rows: int, width: int) -> Tensor:
    """(*b, rows, width) broadcast to (*batch, rows, width), as SDPA's 4-D (B, H, rows, width).

    The last batch dimension becomes SDPA's head dimension and the others are merged into
    its batch dimension. Broadcasting is an expand (stride 0), and the CPU flash kernel
    reads strided inputs without copying them (checked with the profiler's memory events),
    so a tensor shared over the last batch dimension (the values of ``nwlib.simulate``,
    shared by the heads) or over all leading ones (its queries, shared by the
    replicates) reaches the kernel as a view. Merging the leading dimensions copies only
    when the tensor is shared over some but not all of two or more of them, and the
    heads are expanded after that merge, so even then nothing is copied per head.
    """
    if not batch:
        return t.reshape(1, 1, rows, width)
    own_heads = t.shape[-3] if t.dim() > 2 else 1  # 1 when shared by the heads
    lead = int(torch.Size(batch[:-1]).numel())
    merged = t.expand(*batch[:-1], own_heads, rows, width).reshape(lead, own_heads, rows, width)
    return merged.expand(lead, batch[-1], rows, width)


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: Tensor | None,
    batch: torch.Size,
    scale: float,
) -> Tensor:
    """softmax(scale·(⟨q, k⟩ + offset(k))) v, by nwlib's fused CPU kernel or SDPA.

    ``q`` (*bq, m, d), ``k`` (*bk, n, d), ``v`` (*bv, n, p), ``offset`` (*bk, n) or None;
    all batch shapes broadcast to ``batch``. Returns (*batch, m, p). The fused kernel
    (:mod:`nwlib._fused`) takes CPU calls without autograd where it is built; everything
    else (accelerators, gradients, ``torch.func``, no compiler) goes through SDPA.
    """
    fused = _fused.fused_attention(q, k, v, offset, batch, scale)
    if fused is not None:
        return fused
    if offset is not None and offset.requires_grad and torch.is_grad_enabled():
        # SDPA differentiates an attn_mask only on its math path, which materialises the
        # (m, n) weights; as one more coordinate (1 on the queries, the offset on the keys)
        # the offset stays on the fused path, forward and backward.
        q = torch.cat([q, q.new_ones(()).expand(*q.shape[:-1], 1)], dim=-1)
        k = torch.cat([k, offset.unsqueeze(-1)], dim=-1)
        offset = None
    m, n, d, p = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    # The CPU flash kernel needs q, k and v of one width; otherwise SDPA silently takes
    # a much slower path (about 8x for scalar responses). Zero padding changes no dot
    # product and no weighted average, so pad to a common width and slice afterwards.
    width = max(d, p)
    if d < width:
        q, k = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
    if p < width:
        v = F.pad(v, (0, width - p))
    mask = None
    if offset is not None:
        mask = _sdpa_view((offset * scale).unsqueeze(-2), batch, 1, n)
    out = F.scaled_dot_product_attention(
        _sdpa_view(q, batch, m, width),
        _sdpa_view(k, batch, n, width),
        _sdpa_view(v, batch, n, width),
        attn_mask=mask,
        dropout_p=0.0,
        scale=scale,
    )
    return out[..., :p].reshape(*batch, m, p)


def nadaraya_watson_weights(
    queries: Tensor,
    keys: Tensor,
    *,
    kernel: Kernel = "exp",
    bandwidth: float | Tensor | None = None,
) -> Tensor:
    r"""The explicit Nadaraya–Watson weight matrix.

    Row j holds :math:`w_{ji} = K(q_j, k_i) / \sum_l K(q_j, k_l)`. This
    materialises an (m, n) matrix per batch element: use it for figures and as
    a test reference, and :func:`nadaraya_watson` for estimates.

    Parameters
    ----------
    queries : Tensor, shape (..., m, d)
    keys : Tensor, shape (..., n, d)
    kernel : {"exp", "gaussian"}, default "exp"
    bandwidth : float or Tensor, optional
        As in :func:`nadaraya_watson`.

    Returns
    -------
    Tensor, shape (..., m, n)
        Non-negative weights whose rows sum to 1.

    Raises
    ------
    TypeError, ValueError
        As in :func:`nadaraya_watson`.
    """
    kernel = require_choice(kernel, "kernel", KERNELS)  # type: ignore[assignment]
    queries, keys = _check_qk(queries, keys)
    broadcast_batch({"queries": queries.shape[:-2], "keys": keys.shape[:-2]})
    h = _bandwidth(bandwidth, kernel, queries.shape[-1], queries)
    if kernel == "gaussian":
        # Direct differences, not the ‖q‖² − 2⟨q,k⟩ + ‖k‖² expansion: this is a reference.
        sq_dist = torch.cdist(queries, keys, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
        logits = -sq_dist / (2 * h * h)
    else:
        logits = (queries / h) @ (keys / h).mT
    return torch.softmax(logits, dim=-1)


def cosine_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    temperature: float | Tensor,
) -> Tensor:
    r"""Attention with normalised queries and keys: ``softmax(<q̂, k̂> / τ) v``.

    Queries and keys are scaled to the unit sphere (the QK normalisation of Henry et al. 2020,
    and the scaled cosine attention of recent vision transformers), so every key has the same
    norm and the exponential kernel *is* a Gaussian one:
    :math:`\exp(\langle\hat q, \hat k\rangle/\tau) \propto \exp(-\lVert\hat q-\hat k\rVert^2/(2\tau))`
    (chapter 1). This is attention in the regime where it can smooth: the temperature τ is
    the squared bandwidth, and a small τ localises the weights around the query's direction,
    where the unnormalised kernel would only tilt the design towards large keys.

    Parameters
    ----------
    queries : Tensor, shape (..., m, d)
    keys : Tensor, shape (..., n, d)
        Zero rows are not allowed (they have no direction).
    values : Tensor, shape (..., n, p) or (..., n)
    temperature : float or Tensor
        τ > 0; a tensor broadcasts against the batch shape (one temperature per head, say).

    Returns
    -------
    Tensor, shape (..., m, p) or (..., m)
        Dtype and device of the inputs.

    Raises
    ------
    TypeError, ValueError
        As :func:`nadaraya_watson`; ``ValueError`` also for a zero query or key row, or a
        temperature that is not finite and > 0.

    Examples
    --------
    >>> import torch
    >>> q, k, v = torch.randn(3, 4), torch.randn(10, 4), torch.randn(10)
    >>> qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    >>> ref = torch.softmax(qn @ kn.T / 0.1, dim=-1) @ v
    >>> torch.allclose(cosine_attention(q, k, v, temperature=0.1), ref, atol=1e-5)
    True
    """
    queries, keys = _check_qk(queries, keys)
    for name, t in (("queries", queries), ("keys", keys)):
        if t.numel() and _values_checkable(t) and bool((t.norm(dim=-1) == 0).any()):
            raise ValueError(f"{name} must have no zero rows: a zero vector has no direction")
    if isinstance(temperature, Tensor):
        bandwidth: float | Tensor = temperature.to(queries.dtype).sqrt()
    else:
        tau = float(temperature)
        if not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
        bandwidth = math.sqrt(tau)
    q = torch.nn.functional.normalize(queries, dim=-1)
    k = torch.nn.functional.normalize(keys, dim=-1)
    return nadaraya_watson(q, k, values, kernel="exp", bandwidth=bandwidth)
