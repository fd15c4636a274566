"""Peak memory of one call, measured in a fresh process.

The call is one of the implementations of :mod:`benchmarks.references`,
``nadaraya_watson``, or one run of the Monte Carlo engine ``nwlib.simulate``
(``method="simulate"``), for which the engine's own stated bound is recorded too.

Usage (by :mod:`benchmarks.run`): ``python -m benchmarks._memprobe '<json spec>'``;
prints one JSON line.

Method. Inputs are built, the method is run once at a tiny size (so that
libraries, thread pools and kernels are loaded), then the resident set is
read (``VmRSS``), the kernel's high-water mark is reset (writing ``5`` to
``/proc/self/clear_refs``, Linux >= 4.0), the method runs once at full size, and
the high-water mark (``VmHWM``) is read. The peak memory of the call is
``VmHWM - VmRSS`` before it: everything the call touched beyond what was already
resident (the inputs), including its output. A fresh process per case keeps one
case's freed-but-retained heap from hiding the next one's allocations.

Where ``clear_refs`` cannot be written, ``getrusage``'s ``ru_maxrss`` is used
instead; it cannot be reset, so an earlier, higher peak (importing torch) can
hide the call's: the result says which method was used. For NumPy methods the
``tracemalloc`` peak (NumPy reports its buffers to it) is recorded as well. On
CUDA the measure is ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, relative to the memory allocated before the call.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import tracemalloc
from typing import Callable

import numpy as np
import torch

from nwlib import nadaraya_watson

from .references import identity_mha, materialised_softmax, numpy_loop, to_model_layout

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _inputs(spec: dict, R: int, H: int, m: int, n: int) -> tuple[torch.Tensor, ...]:
    device, dtype = torch.device(spec["device"]), _DTYPES[spec["dtype"]]
    gen = torch.Generator(device=device).manual_seed(spec.get("seed", 0))
    d, p = spec["d"], spec.get("p")
    q = torch.randn(R, H, m, d, generator=gen, dtype=dtype, device=device)
    k = torch.randn(R, H, n, d, generator=gen, dtype=dtype, device=device)
    vshape = (R, H, n) if p is None else (R, H, n, p)
    v = torch.randn(*vshape, generator=gen, dtype=dtype, device=device)
    return q, k, v


def _builder(spec: dict, R: int, H: int, m: int, n: int) -> Callable[[], object]:
    """A zero-argument callable running ``spec['method']`` on inputs of the given sizes."""
    method = spec["method"]
    if method == "simulate":
        return _simulate_builder(spec, m, n)
    q, k, v = _inputs(spec, R, H, m, n)
    scale = spec["d"] ** -0.5
    if method == "nw":
        return lambda: nadaraya_watson(q, k, v)
    if method == "materialised":
        return lambda: materialised_softmax(q, k, v, scale)
    if method == "numpy_loop":
        qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
        return lambda: numpy_loop(qn, kn, vn, scale)
    if method in ("mha", "mha_need_weights"):
        mha = identity_mha(H, spec["d"], dtype=q.dtype, device=q.device)
        qm, km, vm = to_model_layout(q), to_model_layout(k), to_model_layout(v)
        need = method == "mha_need_weights"

        def call() -> object:
            with torch.no_grad():
                return mha(qm, km, vm, need_weights=need)

        return call
    raise ValueError(f"unknown method {method!r}")


def _simulate_builder(spec: dict, m: int, n: int) -> Callable[[], object]:
    from nwlib import make_task, simulate

    device, dtype = torch.device(spec["device"]), _DTYPES[spec["dtype"]]
    gen = torch.Generator(device=device).manual_seed(spec.get("seed", 0))
    D, H, d = spec["D"], spec["H"], spec["d"]
    task = make_task(spec.get("task", "isotropic"), D)
    W = torch.linalg.qr(torch.randn(H, D, d, generator=gen, dtype=dtype, device=device)).Q
    eval_points = torch.randn(m, D, generator=gen, dtype=dtype, device=device)

    def call() -> object:
        return simulate(
            task,
            W,
            eval_points,
            n=n,
            replicates=spec["R"],
            generator=torch.Generator(device=device).manual_seed(spec.get("seed", 0)),
            chunk_size=spec.get("chunk_size"),
        )

    return call


def engine_bound(spec: dict) -> tuple[int, int]:
    """The chunk size simulate uses and its stated bound on working memory, in bytes.

    The bound is ``chunk * bytes_per_replicate(...)`` (the engine's own estimate)
    plus the returned (R, H, m) predictions.
    """
    from nwlib.montecarlo import DEFAULT_MEMORY_BUDGET, bytes_per_replicate

    itemsize = _DTYPES[spec["dtype"]].itemsize
    per = bytes_per_replicate(
        spec["H"], spec["n"], spec["m"], spec["D"], spec["d"], head_data="shared", itemsize=itemsize
    )
    chunk = spec.get("chunk_size") or max(1, min(spec["R"], DEFAULT_MEMORY_BUDGET // per))
    return chunk, chunk * per + spec["R"] * spec["H"] * spec["m"] * itemsize


def measure(spec: dict) -> dict:
    """Peak memory of one call of ``spec['method']``; see the module docstring."""
    device = torch.device(spec["device"])
    R, H, m, n = spec["R"], spec["H"], spec["m"], spec["n"]
    small = _builder(spec, 1, 1, 8, 16) if spec["method"] != "simulate" else None
    if small is not None:
        small()
    else:
        # The engine's warm-up runs its own small problem (one replicate, small n and m).
        _builder({**spec, "R": 1}, 1, H, 8, 16)()
    call = _builder(spec, R, H, m, n)
    gc.collect()
    result: dict = {"spec": spec}
    if spec["method"] == "simulate":
        result["chunk_size_used"], result["engine_bound_bytes"] = engine_bound(spec)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = call()
        torch.cuda.synchronize(device)
        result.update(
            measure="torch.cuda.max_memory_allocated",
            peak_bytes=int(torch.cuda.max_memory_allocated(device) - before),
            baseline_bytes=int(before),
        )
        del out
        return result
    baseline_kib = _status_kib("VmRSS")
    if _reset_high_water_mark():
        out = call()
        peak_kib = _status_kib("VmHWM")
        result["measure"] = "VmHWM after clear_refs, minus VmRSS before"
    else:
        out = call()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result["measure"] = "ru_maxrss minus VmRSS before (may understate)"
    del out
    result.update(
        peak_bytes=max(0, peak_kib - baseline_kib) * 1024,
        baseline_bytes=baseline_kib * 1024,
        process_peak_bytes=peak_kib * 1024,
    )
    if spec["method"] == "numpy_loop":
        gc.collect()
        tracemalloc.start()
        out = call()
        result["tracemalloc_peak_bytes"] = int(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        del out
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    print(json.dumps(measure(spec)))


if __name__ == "__main__":
    main()
