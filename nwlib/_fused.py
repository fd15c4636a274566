"""The fused CPU kernel behind :func:`nwlib.nadaraya_watson`, built on first use.

``nwlib/csrc/nw_fused.cpp`` computes softmax(⟨q, k⟩·scale + bias) v in one pass over the keys,
on every thread of ATen's pool, with its logits in base 2 and its own vectorised exp2 in float32
(a degree-5 polynomial, within 2 ulp; Sleef's 1-ulp exp2 in float64; weights below 2^-64 of the
running maximum, 2^-256 in float64, are set to 0, so that small bandwidths cost no arithmetic on
subnormal numbers), a scale per batch element where the bandwidth is a tensor, specialised for the
book's shapes: small head dimensions and one or a few value columns, many replicates × heads. The
limits below were chosen by measuring an earlier, single-threaded build against SDPA (float32,
n = 2048, m = 256): 1.2-7× faster for d ≤ 8 with scalar values, 1.7-2.9× with p = d ≤ 8,
1.1-2× in float64; not faster above d = 8 in float32 and slower for p ≥ 16. The current build
is about three times faster again at the benchmark's target configuration (``benchmarks/run.py``,
the Performance appendix). ``torch.utils.cpp_extension.load_inline`` compiles it
once per machine and caches it (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``); a cached build loads in well under a second.

It is an optimisation only: :func:`fused_attention` returns None, and the caller uses SDPA,
whenever the kernel does not apply (not the CPU, not float32/float64, a head dimension above
:data:`MAX_HEAD_DIM` or more than :data:`MAX_VALUE_WIDTH` value columns, autograd or
``torch.func`` transforms, an instruction set below AVX2, including
``ATEN_CPU_CAPABILITY=default``) or cannot be had (no compiler or ninja, a failed
build: recorded in :data:`STATE`, never raised). ``NWLIB_FUSED=0`` turns it off.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

MAX_HEAD_DIM = 8
"""Largest head dimension d the kernel takes; above it SDPA was as fast or faster (``benchmarks/run.py``)."""
MAX_VALUE_WIDTH = 8
"""Largest value width p the kernel takes in float32: its accumulators live in registers up to 8 columns."""
MAX_VALUE_WIDTH_FLOAT64 = 4
"""In float64 (half the lanes per vector): at p = 8 SDPA was faster on two threads (1.0 s against 1.2 s)."""
SOURCE = Path(__file__).resolve().parent / "csrc" / "nw_fused.cpp"
_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma", "-mavx2", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2"],
}
STATE: dict[str, Any] = {"module": None, "tried": False, "error": None, "build_s": None, "capability": None}
"""What the last build attempt gave: the module, or the error that made :func:`fused_attention` fall back."""


def enabled() -> bool:
    """Whether the environment allows the fused kernel (``NWLIB_FUSED`` unset or not ``0``)."""
    return os.environ.get("NWLIB_FUSED", "1").strip().lower() not in ("0", "false", "no", "off")


def capability() -> str | None:
    """The instruction set the kernel would be built for ("AVX512", "AVX2"), or None (no fused kernel)."""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch without the query
        return None
    return cap if cap in _FLAGS else None


def module() -> Any | None:
    """The compiled extension, built (or loaded from the cache) on the first call; None if unavailable."""
    if STATE["tried"]:
        return STATE["module"]
    STATE["tried"] = True
    cap = capability()
    STATE["capability"] = cap
    if cap is None:
        STATE["error"] = f"CPU capability {torch.backends.cpu.get_cpu_capability()!r}: no AVX2 or AVX-512 build"
        return None
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load_inline

        STATE["module"] = load_inline(
            name=f"nwlib_nw_fused_{cap.lower()}",
            cpp_sources=SOURCE.read_text(),
            functions=["nw_forward", "exp_rate", "exp2_values", "mix_rate"],
            # -fopenmp: at::parallel_for is a header template over OpenMP in this build of torch;
            # without the flag its pragma is ignored and the kernel runs on one thread. The
            # runtime is torch's own (libgomp.so.1, already loaded by libtorch_cpu).
            extra_cflags=["-O3", "-fopenmp", f"-DCPU_CAPABILITY={cap}", *_FLAGS[cap]],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, a failed build: SDPA it is
        STATE["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    STATE["build_s"] = time.perf_counter() - start
    return STATE["module"]


def applicable(*tensors: Tensor) -> bool:
    """Whether the fused kernel can compute this call (before building it)."""
    t = tensors[0]
    if not enabled() or t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
        return False
    width = MAX_VALUE_WIDTH if t.dtype == torch.float32 else MAX_VALUE_WIDTH_FLOAT64
    if t.shape[-1] > MAX_HEAD_DIM or tensors[2].shape[-1] > width:
        return False
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
    wrapped = any(torch._C._functorch.is_functorch_wrapped_tensor(x) for x in tensors)
    return not grad and not wrapped and not torch.jit.is_scripting()


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: Tensor | None,
    batch: torch.Size,
    scale: float | Tensor,
    *,
    gaussian: bool = False,
) -> Tensor | None:
    """softmax(scale·(⟨q, k⟩ + offset(k))) v as (*batch, m, p), or None where SDPA must do it.

    ``q`` (*bq, m, d), ``k`` (*bk, n, d), ``v`` (*bv, n, p), ``offset`` (*bk, n) or None, as in
    ``nwlib.kernels._attention``. ``scale``: a number, or a tensor (*bs) broadcasting to
    ``batch`` (one scale per batch element, a bandwidth per head: 1/h²), which the kernel applies
    per (B, H) instead of rescaled copies of the inputs. ``gaussian``: the Gaussian kernel on the
    raw inputs, the kernel centring queries and keys on the keys' mean and forming the offset
    -‖k - c‖²/2 itself (``offset`` None, ``scale`` = 1/h²), which saves the tensor operations of
    ``nwlib.kernels._scaled_inputs``. They reach the kernel as (B, H, ...) views, broadcast batches
    as stride 0; the kernel lays out the keys, offsets and values of each distinct batch element
    once per thread (transposed, padded to the vector width) and folds the scale into the queries.
    """
    tensors = (q, k, v) if offset is None else (q, k, v, offset)
    if isinstance(scale, Tensor):
        tensors = (*tensors, scale)
    if not applicable(*tensors):
        return None
    mod = module()
    if mod is None:
        return None
    from .kernels import _sdpa_view as _batched  # the same broadcast layout as SDPA's inputs

    m, n, d, p = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    off = None if offset is None else _batched(offset.unsqueeze(-2), batch, 1, n)[:, :, 0]
    scales = _batched(scale[..., None, None], batch, 1, 1)[:, :, 0, 0] if isinstance(scale, Tensor) else None
    number = 1.0 if isinstance(scale, Tensor) else float(scale)
    out = mod.nw_forward(
        _batched(q, batch, m, d), _batched(k, batch, n, d), _batched(v, batch, n, p), off, number, scales, gaussian
    )
    return out.reshape(*batch, m, p)
