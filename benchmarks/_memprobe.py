"""Peak memory of one call, measured in a fresh process.

The call is one of the implementations of :mod:`benchmarks.references`,
``nadaraya_watson``, one run of the Monte Carlo engine ``nwlib.simulate``
(``method="simulate"``, for which the engine's own stated bound is recorded
too), or a known allocation that checks the probe itself
(``method="known_allocation"``).

Usage (by :mod:`benchmarks.run`): ``python -m benchmarks._memprobe '<json spec>'``;
prints one JSON line.

The primary measure: live bytes
-------------------------------
``peak_bytes`` (= ``live_peak_bytes``) is the largest number of bytes of
tensors alive at any moment of the call beyond those alive when it started:
what the call itself allocates, its output included, independent of what the
C library's allocator keeps or returns to the system.

* CPU, PyTorch code: the call runs under ``torch.profiler.profile(activities=[CPU],
  profile_memory=True)``; every allocation and free of the CPU allocator is a
  ``[memory]`` event with a signed byte count (``kineto_results.events()``,
  ``nbytes()``). Summed in time order they give the live bytes over the call;
  the peak is their maximum prefix sum (never below 0). The profiler reports the
  allocations of the calling thread: PyTorch's CPU attention kernel allocates its
  per-thread buffers there, before its parallel loop, and ``nwlib`` starts no
  threads of its own. Not seen: memory that a library takes from ``malloc`` or
  ``mmap`` directly instead of PyTorch's allocator (oneDNN/MKL scratch buffers,
  the profiler's own event records); the RSS column bounds those.
* CPU, NumPy code (the NumPy loop): NumPy reports its data buffers to
  ``tracemalloc``, whose peak (after ``reset_peak``) is the measure.
* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``,
  minus ``memory_allocated`` before the call.

``live_end_bytes`` is what is still alive after the call (the output, plus
anything the call cached), and ``expected_*`` fields of a known allocation let
the result file check the probe itself.

The secondary measure: resident set (CPU)
-----------------------------------------
``rss_peak_bytes`` is the rise of the process's resident set during the same
call: the kernel's high-water mark (``VmHWM``, reset by writing ``5`` to
``/proc/self/clear_refs``, Linux >= 4.0) minus ``VmRSS`` before. It includes
freed memory that the allocator kept, the first touch of thread stacks and
library scratch space, and the profiler's event buffers; it is what ``top``
would show, not what the code holds. Where ``clear_refs`` cannot be written,
``getrusage``'s ``ru_maxrss`` (not resettable) is used and the result says so.

The warm-up (one call at a tiny size, under the profiler) loads libraries,
thread pools, kernels and the profiler itself first, so that none of their
one-off allocations lands in the measured call. A fresh process per case keeps
one case's retained heap out of the next one's resident set.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import tracemalloc
from collections.abc import Callable

import torch

from nwlib import nadaraya_watson

from .references import (
    identity_mha,
    materialised_gaussian,
    materialised_softmax,
    numpy_loop,
    numpy_loop_gaussian,
    to_model_layout,
)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
NUMPY_METHODS = ("numpy_loop",)
LIVE_MEASURE_CPU = "torch.profiler [memory] events: peak of live bytes above the start"
LIVE_MEASURE_NUMPY = "tracemalloc peak (NumPy data buffers)"
LIVE_MEASURE_CUDA = "torch.cuda.max_memory_allocated minus memory_allocated before"


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


def live_bytes_trace(call: Callable[[], object]) -> tuple[object, dict]:
    """Run ``call()`` under the profiler; return its output and the live-byte summary.

    The summary has ``peak`` (maximum prefix sum of the CPU allocator's signed
    byte counts, in time order, clipped at 0), ``end`` (their total: bytes still
    alive after the call that were allocated during it, minus pre-existing bytes
    freed) and ``events`` (how many allocator events were seen).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = call()
    events = [
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(prof.profiler.kineto_results.events())
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort()  # time order; ties keep the recorded order
    live = peak = 0
    for _, _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return out, {"peak": int(peak), "end": int(live), "events": len(events)}


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
        return _simulate_builder(spec, R, m, n)
    if method == "known_allocation":
        keep, temp = int(spec["numel"]), int(spec.get("temp_numel", 0))
        kw = dict(dtype=_DTYPES[spec["dtype"]], device=torch.device(spec["device"]))

        def allocate() -> object:
            x = torch.empty(keep, **kw).fill_(1.0)  # kept: the output
            if temp:
                t = torch.empty(temp, **kw).fill_(2.0)  # a temporary, freed before returning
                del t
            return x

        return allocate
    q, k, v = _inputs(spec, R, H, m, n)
    kernel, h = spec.get("kernel", "exp"), spec.get("bandwidth")
    scale = spec["d"] ** -0.5
    if method == "nw":
        kw = {} if kernel == "exp" else {"kernel": kernel, "bandwidth": h}
        return lambda: nadaraya_watson(q, k, v, **kw)
    if method == "materialised":
        if kernel == "gaussian":
            return lambda: materialised_gaussian(q, k, v, h)
        return lambda: materialised_softmax(q, k, v, scale)
    if method == "numpy_loop":
        qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
        if kernel == "gaussian":
            return lambda: numpy_loop_gaussian(qn, kn, vn, h)
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


def _simulate_builder(spec: dict, R: int, m: int, n: int) -> Callable[[], object]:
    from nwlib import make_task, simulate

    device, dtype = torch.device(spec["device"]), _DTYPES[spec["dtype"]]
    gen = torch.Generator(device=device).manual_seed(spec.get("seed", 0))
    D, H, d = spec["D"], spec["H"], spec["d"]
    task = make_task(spec.get("task", "isotropic"), D)
    W = torch.linalg.qr(torch.randn(H, D, d, generator=gen, dtype=dtype, device=device)).Q
    eval_points = torch.randn(m, D, generator=gen, dtype=dtype, device=device)
    kwargs = {"chunk_size": spec.get("chunk_size"), "kernel": spec.get("kernel", "gaussian")}
    if spec.get("head_data"):
        kwargs["head_data"] = spec["head_data"]

    def call() -> object:
        return simulate(
            task,
            W,
            eval_points,
            n=n,
            replicates=R,
            generator=torch.Generator(device=device).manual_seed(spec.get("seed", 0)),
            **kwargs,
        )

    return call


def engine_bound(spec: dict) -> dict:
    """The chunk size ``simulate`` uses for ``spec`` and the bound it states, in bytes.

    With ``nwlib.montecarlo.memory_estimate`` (the engine's own statement: an
    upper bound on the live bytes of the call, predictions included) the bound
    is its ``.total`` for the chunk used, and ``.parts`` its breakdown; with
    ``chunk_size=None`` the chunk is the largest whose ``.total`` fits the
    default memory budget, as ``simulate`` chooses it.
    """
    import nwlib.montecarlo as mc

    dtype = _DTYPES[spec["dtype"]]
    R, H, m, n = spec["R"], spec["H"], spec["m"], spec["n"]
    head_data = spec.get("head_data") or "shared"
    kernel = spec.get("kernel", "gaussian")
    budget = mc.DEFAULT_MEMORY_BUDGET

    def estimate(chunk: int):
        return mc.memory_estimate(
            num_heads=H,
            n=n,
            m=m,
            embed_dim=spec["D"],
            head_dim=spec["d"],
            replicates=R,
            chunk_size=chunk,
            head_data=head_data,
            kernel=kernel,
            dtype=dtype,
            device=spec["device"],
        )

    chunk = spec.get("chunk_size")
    if chunk is None:
        chunk = next((c for c in range(R, 0, -1) if estimate(c).total <= budget), 1)
    est = estimate(chunk)
    return {
        "chunk_size_used": int(chunk),
        "bound_bytes": int(est.total),
        "bound_parts_bytes": {str(k): int(v) for k, v in dict(est.parts).items()},
        "bound_source": "nwlib.montecarlo.memory_estimate",
        "memory_budget_bytes": int(budget),
    }


def _observe_chunk(result: dict) -> Callable[[], None]:
    """Record the batch shape of the engine's first kernel call (its chunk); returns an undo."""
    import nwlib.montecarlo as mc

    original = mc.nadaraya_watson

    def spy(queries, keys, values, **kw):
        result.setdefault("engine_first_call_keys_shape", list(keys.shape))
        return original(queries, keys, values, **kw)

    mc.nadaraya_watson = spy

    def undo() -> None:
        mc.nadaraya_watson = original

    return undo


def measure(spec: dict) -> dict:
    """Peak memory of one call of ``spec['method']``; see the module docstring."""
    device = torch.device(spec["device"])
    R, H, m, n = spec["R"], spec["H"], spec["m"], spec["n"]
    method = spec["method"]
    # Warm-up at a tiny size, under the profiler, so that one-off allocations
    # (libraries, thread pools, the profiler itself) happen before the measurement.
    small_spec = {**spec, "R": 1}
    if method == "known_allocation":
        small_spec.update(numel=1, temp_numel=1)
    small = _builder(small_spec, 1, 1 if method != "simulate" else H, 8, 16)
    if device.type == "cpu" and method not in NUMPY_METHODS:
        live_bytes_trace(small)
    else:
        small()
    call = _builder(spec, R, H, m, n)
    gc.collect()
    result: dict = {"spec": spec}
    if method == "simulate":
        result.update(engine_bound(spec))
        result["engine_bound_bytes"] = result["bound_bytes"]  # the name of schema 1
    if method == "known_allocation":
        itemsize = _DTYPES[spec["dtype"]].itemsize
        result["expected_peak_bytes"] = itemsize * (int(spec["numel"]) + int(spec.get("temp_numel", 0)))
        result["expected_end_bytes"] = itemsize * int(spec["numel"])
    undo = _observe_chunk(result) if method == "simulate" else (lambda: None)
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            out = call()
            torch.cuda.synchronize(device)
            peak = int(torch.cuda.max_memory_allocated(device) - before)
            result.update(
                measure=LIVE_MEASURE_CUDA,
                live_measure=LIVE_MEASURE_CUDA,
                peak_bytes=peak,
                live_peak_bytes=peak,
                live_end_bytes=int(torch.cuda.memory_allocated(device) - before),
                baseline_bytes=int(before),
            )
            if method == "simulate":
                result["within_bound"] = bool(peak <= result["bound_bytes"])
            del out
            return result
        baseline_kib = _status_kib("VmRSS")
        hwm_reset = _reset_high_water_mark()
        if method in NUMPY_METHODS:
            out = call()
            live = None
        else:
            out, live = live_bytes_trace(call)
        peak_kib = _status_kib("VmHWM") if hwm_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        undo()
    del out
    result.update(
        rss_measure="VmHWM after clear_refs, minus VmRSS before"
        if hwm_reset
        else "ru_maxrss minus VmRSS before (may understate)",
        rss_peak_bytes=max(0, peak_kib - baseline_kib) * 1024,
        baseline_rss_bytes=baseline_kib * 1024,
        process_peak_rss_bytes=peak_kib * 1024,
    )
    if method in NUMPY_METHODS:
        gc.collect()
        tracemalloc.start()
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        out = call()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del out
        result.update(
            live_measure=LIVE_MEASURE_NUMPY,
            live_peak_bytes=int(peak - start),
            live_end_bytes=int(current - start),
            tracemalloc_peak_bytes=int(peak - start),
        )
    else:
        result.update(
            live_measure=LIVE_MEASURE_CPU,
            live_peak_bytes=live["peak"],
            live_end_bytes=live["end"],
            allocator_events=live["events"],
        )
    result["measure"] = result["live_measure"]
    result["peak_bytes"] = result["live_peak_bytes"]
    if method == "simulate":
        result["within_bound"] = bool(result["live_peak_bytes"] <= result["bound_bytes"])
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    print(json.dumps(measure(spec)))


if __name__ == "__main__":
    main()
