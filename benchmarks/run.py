"""Time and memory of :func:`nwlib.nadaraya_watson` and :func:`nwlib.simulate` against the alternatives.

    python -m benchmarks.run                  # full run, writes benchmarks/results/latest.json
    python -m benchmarks.run --quick          # smoke run (small sizes), prints only
    python -m benchmarks.run --device cuda    # the GPU path; skipped when CUDA is absent
    python -m benchmarks.run --quick --only 'float32-scalar|engine'   # a subset (regex on names)

What is measured
----------------
* Time: every configuration builds its inputs once, checks that every
  implementation agrees with ``nadaraya_watson`` on them, runs each once to warm
  up, then runs ``--rounds`` rounds; each round calls every implementation once,
  in a freshly shuffled order (seeded), so that a change in the machine's load
  hits all of them alike, with ``--pause`` seconds of idle before each call (worker
  threads of the previous call's library keep spinning for a while and would
  otherwise be timed with the next call). A control in the target configuration's
  rounds times ``nadaraya_watson`` right after the NumPy loop without the pause.
  Reported: the median and quartiles per implementation, the ratio of medians to
  ``nadaraya_watson``, and the median of the per-round ratios (a paired estimate,
  robust to drifting load). Both kernels are timed: the exponential (attention)
  kernel and the Gaussian one the book's experiments use.
* The Monte Carlo engine end to end: ``simulate`` (Gaussian kernel, shared data,
  H = 8, the engine's own chunk size) is a participant of a configuration whose
  ``nadaraya_watson`` does the same kernel work on precomputed keys; reported in
  replicates per second.
* The machine's attainable rates, measured in the same rounds (so under the same
  load): a large GEMM (flop/s) and ``torch.exp`` over a cache-sized buffer
  (exps/s) of the configuration's dtype. ``nadaraya_watson`` does 4·R·H·m·n·w flops
  (two products of width w = max(d, p), the width its fused kernel works at) and
  R·H·m·n exponentials; the attainable time for that work is
  max(flops / GEMM rate, exps / exp rate), and the roofline fraction is attainable
  time over measured time.
* The limit, in the same rounds: the best vectorised exponential torch has, looped over a 16 KiB
  buffer per thread, resident in L1, on every thread at once: ATen's
  ``Vectorized<float>::exp_u20`` (``exp_l1``) and nwlib's own ``exp2`` (``exp_l1_exp2``, the
  one its fused kernel uses in float32, whose logits are in base 2), the faster of the two;
  beside them Sleef's 1-ulp exp in the same loop and ``torch.exp(out=)`` on 16 KiB and 512 KiB
  buffers (all from the fused extension, skipped where it cannot be built). One call needs
  R·H·m·n exponentials and 2·R·H·m·n·(d + p) flops (the fused kernel's products): at least
  max(exps / exp rate, flops / GEMM rate) if the two overlap perfectly, their sum if they cannot
  overlap. ``mix_l1`` measures which: the kernel's arithmetic itself (one exp2 and d + p
  independent multiply-adds per element of an L1-resident buffer, every thread), scaled to the
  call's exponentials; that measured limit is the one the target is judged on
  (``results["limit"]``, with the fractions of all three for nadaraya_watson and every peer).
* Peers beside the estimators at the target configuration: SDPA with padded values (what
  ``nadaraya_watson`` runs where its fused kernel does not apply), KeOps (``pykeops``, the
  ``bench`` extra; compiled into a fresh build folder on its first call), and the compiled
  candidates ``flex_attention`` and the materialised softmax under ``torch.compile``. The
  warm-up call's time is recorded as ``first_call_s`` (compiles included) and never timed in the
  rounds; an optional peer that is absent or fails to compile is skipped, saying why
  (``results["skipped"]``). A quick run leaves out KeOps and the compiled candidates.
* Peak memory: one fresh process per case, as the peak of live tensor bytes during
  the call (:mod:`benchmarks._memprobe` explains the measure and how it is checked
  against known allocations, recorded with the results), with the rise of the
  resident set as a secondary column; for the Monte Carlo engine next to the bound
  the engine states for itself (``nwlib.montecarlo.memory_estimate``).

Targets (CPU, float32, R=64, H=8, m=256, n=2048, d=8, scalar responses, exp
kernel): at least 5x faster than the materialised softmax and 4x faster than the
NumPy loop, as ratios of medians in one run; at m = n = 16384, one head, a peak
memory under 1 GiB for ``nadaraya_watson`` (and for the Monte Carlo engine); and
for every engine case a live peak within the bound the engine states; at the target
configuration, at least 70 % of the same-run limit, and faster than every peer timed there.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

import numpy as np
import torch

from benchmarks.references import (
    compiled_flex_attention,
    compiled_softmax,
    from_model_layout,
    identity_mha,
    keops_nw,
    materialised_gaussian,
    materialised_softmax,
    numpy_loop,
    numpy_loop_gaussian,
    sdpa_padded,
    sdpa_unpadded,
    statsmodels_nw,
    to_model_layout,
)
from nwlib import nadaraya_watson, scott_bandwidth

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "latest.json"
SCHEMA = 2
GIB, MIB = 2**30, 2**20

METHODS = {
    "nw": "nwlib.nadaraya_watson",
    "materialised": "torch softmax(Q Kᵀ/√d) V, weights formed",
    "numpy_loop": "NumPy loop over replicates and heads",
    "sdpa_unpadded": "scaled_dot_product_attention with values of width 1 (no padding)",
    "mha": "nn.MultiheadAttention, identity projections, need_weights=False",
    "mha_need_weights": "nn.MultiheadAttention, identity projections, default call (need_weights=True)",
    "statsmodels": "statsmodels KernelReg (reg_type='lc', fixed bw, Gaussian)",
    "simulate": "nwlib.simulate end to end (data drawn, projected, estimated)",
    "gemm": "reference GEMM (machine throughput)",
    "exp": "reference torch.exp over a 4 MiB buffer (machine throughput, the old roofline)",
    "sdpa": "scaled_dot_product_attention, values padded to the key width (nadaraya_watson's SDPA path)",
    "keops": "KeOps LazyTensor sumsoftmaxweight (pykeops)",
    "flex": "flex_attention under torch.compile",
    "inductor": "materialised softmax under torch.compile (inductor)",
    "exp_l1": "ATen Vectorized<float>::exp_u20 loop, a 16 KiB buffer per thread (the limit's exp rate)",
    "exp_l1_sleef": "ATen Vectorized<float>::exp (Sleef, 1 ulp) loop, a 16 KiB buffer per thread",
    "exp_l1_exp2": "nwlib's exp2 (the fused kernel's float32 exponential, 2 ulp) loop, a 16 KiB buffer per thread",
    "mix_l1": "the fused kernel's arithmetic, one exp2 and d + p multiply-adds per pair, 16 KiB per thread",
    "exp_torch_l1": "torch.exp(out=) over a 16 KiB buffer (L1), repeated",
    "exp_torch_l2": "torch.exp(out=) over a 512 KiB buffer (L2), repeated",
}
GAUSSIAN_METHODS = {
    "materialised": "softmax(-cdist(Q, K)²/(2h²)) V, weights formed",
    "numpy_loop": "NumPy loop over replicates and heads, Gaussian kernel",
}
TARGETS = {"materialised": 5.0, "numpy_loop": 4.0}
TARGET_CONFIG = "cpu-float32-scalar"
CONTROL = "control"
# Participants that compute no NW estimate (machine rates) or not on the same data (simulate).
RATES = ("gemm", "exp", "exp_l1", "exp_l1_sleef", "exp_l1_exp2", "mix_l1", "exp_torch_l1", "exp_torch_l2")
# The L1 exp loops the limit takes the faster of (the best exponential available to torch).
LIMIT_EXP_LOOPS = ("exp_l1", "exp_l1_exp2")
NOT_COMPARED = (*RATES, "simulate")
# Peers that may be missing (not installed, no compiler, a failed compile): skipped, saying why.
OPTIONAL = ("keops", "flex", "inductor", "exp_l1", "exp_l1_sleef", "exp_l1_exp2", "mix_l1")
PEERS = ("materialised", "numpy_loop", "sdpa", "sdpa_unpadded", "mha", "mha_need_weights", "keops", "flex", "inductor")
LIMIT_TARGET = 0.7  # nadaraya_watson at >= 70 % of the same-run limit at TARGET_CONFIG
# Agreement required between every implementation and nadaraya_watson before timing.
AGREEMENT = {torch.float32: 1e-4, torch.float64: 1e-10}
EXP_NUMEL, EXP_REPEATS = 2**20, 64  # 4 MiB of float32 in, 4 out: cache-resident on a server CPU
# The limit's exp rates: 16 KiB in + 16 KiB out per thread fits a 32 KiB+ L1d; 512 KiB an L2.
L1_NUMEL, L2_NUMEL, LIMIT_EXPS = 4096, 2**17, 2**27
_KEOPS_FOLDER: list[str] = []  # the run's KeOps build folder, made on first use
_INDUCTOR_CACHE: list[str] = []  # the run's torch.compile cache folder, made on first use


def _fresh_inductor_cache(cfg: Config) -> None:
    """Point torch.compile at a cache folder of this run's own, made on first use, and say so in ``cfg``.

    So that a compiled candidate's first call is its compile, not a cache hit, and because
    torch 2.13's FX graph cache does not key on the vector ISA: a graph cached natively on an
    AVX-512 CPU and loaded under ``ATEN_CPU_CAPABILITY=avx2`` gave wrong results (NaN, or off by
    0.7 at the target configuration), where a fresh cache gave the right ones.
    """
    if not _INDUCTOR_CACHE:
        import tempfile

        _INDUCTOR_CACHE.append(tempfile.mkdtemp(prefix="nwlib-bench-inductor-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE[0]
    cfg.results["inductor_cache"] = "fresh (first call compiles)"


@dataclass
class Config:
    name: str
    group: str  # "grid" (target size, both kernels), "scaling" (time against n), "statsmodels", "engine"
    device: str
    dtype: str
    R: int
    H: int
    m: int
    n: int
    d: int
    p: int | None  # None: scalar responses
    methods: list[str]
    kernel: str = "exp"
    bandwidth: float | None = None
    D: int | None = None  # engine: input dimension (keys are x W_h with W_h of shape (D, d))
    # Also time nadaraya_watson right after the NumPy loop without the pause (a control).
    control: bool = False
    results: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def response(self) -> str:
        return "scalar" if self.p is None else f"vector (p={self.p})"

    @property
    def nw_flops(self) -> float:
        width = max(self.d, self.p or 1)
        return 4.0 * self.R * self.H * self.m * self.n * width

    @property
    def fused_flops(self) -> float:
        """The products nwlib's fused kernel does: 2·d per logit and 2·p per weighted value (no padding)."""
        return 2.0 * self.R * self.H * self.m * self.n * (self.d + (self.p or 1))

    @property
    def nw_exps(self) -> float:
        return float(self.R * self.H * self.m * self.n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = torch.device(cfg.device)
    gen = torch.Generator(device=device).manual_seed(0)
    kw = dict(generator=gen, dtype=cfg.torch_dtype, device=device)
    q = torch.randn(cfg.R, cfg.H, cfg.m, cfg.d, **kw)
    k = torch.randn(cfg.R, cfg.H, cfg.n, cfg.d, **kw)
    vshape = (cfg.R, cfg.H, cfg.n) if cfg.p is None else (cfg.R, cfg.H, cfg.n, cfg.p)
    v = torch.randn(*vshape, **kw)
    return q, k, v


def _engine_callables(cfg: Config) -> dict[str, Callable]:
    """``simulate`` end to end, and ``nadaraya_watson`` on the same shapes with the data precomputed.

    As in the book's engine benchmark: task "isotropic" in D dimensions, W_h of
    shape (D, d) with N(0, 1/16) entries, m evaluation points, scalar responses,
    the Gaussian kernel with the engine's default bandwidth, shared data.
    """
    from nwlib import make_task, simulate

    device, dtype = torch.device(cfg.device), cfg.torch_dtype
    gen = torch.Generator(device=device).manual_seed(0)
    task = make_task("isotropic", cfg.D)
    W = torch.randn(cfg.H, cfg.D, cfg.d, generator=gen, dtype=dtype, device=device) / 4
    z = torch.randn(cfg.m, cfg.D, generator=gen, dtype=dtype, device=device)
    x, y = task.sample((cfg.R,), cfg.n, generator=gen, dtype=dtype)
    keys = x.unsqueeze(1) @ W  # (R, H, n, d)
    values = y.unsqueeze(1)  # (R, 1, n): shared by the heads
    queries = z @ W  # (H, m, d)
    sigma = (W.pow(2).sum(dim=(-2, -1)) / cfg.d).sqrt()  # the engine's default bandwidth per head
    bw = sigma * cfg.n ** (-1.0 / (cfg.d + 4))
    cfg.results["bandwidth_per_head"] = [float(b) for b in bw]

    def run_simulate():
        return simulate(task, W, z, n=cfg.n, replicates=cfg.R, generator=torch.Generator(device=device).manual_seed(1))

    return {
        "nw": lambda: nadaraya_watson(queries, keys, values, kernel="gaussian", bandwidth=bw),
        "simulate": run_simulate,
    }


def _callables(cfg: Config) -> dict[str, Callable]:
    """Each implementation as a zero-argument callable returning (R, H, m[, p]) as torch or numpy."""
    device, dtype = torch.device(cfg.device), cfg.torch_dtype
    if cfg.group == "engine":
        calls = _engine_callables(cfg)
    else:
        q, k, v = _inputs(cfg)
        scale = cfg.d**-0.5
        h = cfg.bandwidth
        gaussian = cfg.kernel == "gaussian"
        nw_kwargs = {"kernel": "gaussian", "bandwidth": h} if gaussian else {}
        calls = {"nw": lambda: nadaraya_watson(q, k, v, **nw_kwargs)}
    for method in cfg.methods:
        if method in calls:
            continue
        if method == "materialised":
            calls[method] = (
                (lambda: materialised_gaussian(q, k, v, h))
                if gaussian
                else (lambda: materialised_softmax(q, k, v, scale))
            )
        elif method == "numpy_loop":
            qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
            if gaussian:
                calls[method] = lambda qn=qn, kn=kn, vn=vn: numpy_loop_gaussian(qn, kn, vn, h)
            else:
                calls[method] = lambda qn=qn, kn=kn, vn=vn: numpy_loop(qn, kn, vn, scale)
        elif method == "sdpa":
            calls[method] = lambda: sdpa_padded(q, k, v, scale)
        elif method == "keops":
            try:
                import pykeops
            except ImportError as exc:
                cfg.results.setdefault("skipped", {})[method] = f"pykeops not installed ({exc}); pip install '.[bench]'"
                continue
            if not _KEOPS_FOLDER:
                # A fresh build folder, so that the first call's time is KeOps' compile, not a cache hit.
                import tempfile

                _KEOPS_FOLDER.append(tempfile.mkdtemp(prefix="nwlib-bench-keops-"))
                pykeops.set_build_folder(_KEOPS_FOLDER[0])
            cfg.results["keops_build_folder"] = "fresh (first call compiles)"
            calls[method] = lambda: keops_nw(q, k, v, scale)
        elif method == "flex":
            _fresh_inductor_cache(cfg)
            flex = compiled_flex_attention()
            calls[method] = lambda flex=flex: flex(q, k, v, scale)
        elif method == "inductor":
            _fresh_inductor_cache(cfg)
            ind = compiled_softmax()
            calls[method] = lambda ind=ind: ind(q, k, v, scale)
        elif method in ("exp_l1", "exp_l1_sleef", "exp_l1_exp2", "mix_l1"):
            from nwlib import _fused

            mod = _fused.module()
            if mod is None:
                cfg.results.setdefault("skipped", {})[method] = f"no fused extension: {_fused.STATE['error']}"
                continue
            threads = torch.get_num_threads()
            gen = torch.Generator().manual_seed(0)
            xl1 = torch.rand(threads, L1_NUMEL, generator=gen).mul_(-20.0)
            reps = LIMIT_EXPS // (threads * L1_NUMEL)
            if method == "mix_l1":  # as many multiply-adds per exponential as the fused kernel does
                fmas = cfg.d + (cfg.p or 1)
                calls[method] = lambda xl1=xl1, reps=reps, fmas=fmas, mod=mod: mod.mix_rate(xl1, reps, fmas)
                cfg.results["mix_l1_fmas"] = fmas
            else:
                which = {"exp_l1_sleef": 0, "exp_l1": 1, "exp_l1_exp2": 2}[method]
                calls[method] = lambda xl1=xl1, reps=reps, which=which, mod=mod: mod.exp_rate(xl1, reps, which)
            cfg.results[f"{method}_count"] = float(reps * threads * L1_NUMEL)
            cfg.results[f"{method}_threads"] = threads
        elif method in ("exp_torch_l1", "exp_torch_l2"):
            numel = L1_NUMEL if method == "exp_torch_l1" else L2_NUMEL
            gen = torch.Generator().manual_seed(0)
            xb = torch.rand(numel, generator=gen, dtype=torch.float32).mul_(-20.0)
            yb = torch.empty_like(xb)
            reps = max(1, LIMIT_EXPS // 8 // numel)

            def torch_exp(xb=xb, yb=yb, reps=reps):
                for _ in range(reps):
                    torch.exp(xb, out=yb)
                return yb

            calls[method] = torch_exp
            cfg.results[f"{method}_count"] = float(reps * numel)
        elif method == "sdpa_unpadded":
            if gaussian or cfg.p is not None:
                raise ValueError("sdpa_unpadded compares the exp kernel with scalar responses")
            calls[method] = lambda: sdpa_unpadded(q, k, v)
        elif method in ("mha", "mha_need_weights"):
            mha = identity_mha(cfg.H, cfg.d, dtype=q.dtype, device=q.device)
            qm, km, vm = to_model_layout(q), to_model_layout(k), to_model_layout(v)
            need = method == "mha_need_weights"

            def call(mha=mha, qm=qm, km=km, vm=vm, need=need):
                with torch.no_grad():
                    return from_model_layout(mha(qm, km, vm, need_weights=need)[0], cfg.H)

            calls[method] = call
        elif method == "statsmodels":
            qn, kn, vn = q[0, 0].numpy(), k[0, 0].numpy(), v[0, 0].numpy()
            calls[method] = lambda qn=qn, kn=kn, vn=vn: statsmodels_nw(qn, kn, vn, h)[None, None]
        elif method == "gemm":
            size = 8192 if device.type == "cuda" else 2048
            gen = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(size, size, generator=gen, dtype=dtype, device=device)
            b = torch.randn(size, size, generator=gen, dtype=dtype, device=device)
            calls[method] = lambda a=a, b=b: a @ b
            cfg.results["gemm_flops"] = 2.0 * size**3
            cfg.results["gemm_size"] = size
        elif method == "exp":
            numel = EXP_NUMEL * (4 if device.type == "cuda" else 1)
            gen = torch.Generator(device=device).manual_seed(0)
            # Arguments in [-20, 0], as after the max-subtraction of a softmax.
            x = torch.rand(numel, generator=gen, dtype=dtype, device=device).mul_(-20.0)
            y = torch.empty_like(x)

            def exp_call(x=x, y=y):
                for _ in range(EXP_REPEATS):
                    torch.exp(x, out=y)
                return y

            calls[method] = exp_call
            cfg.results["exp_count"] = float(numel * EXP_REPEATS)
            cfg.results["exp_buffer_bytes"] = numel * x.element_size()
        else:
            raise ValueError(f"unknown method {method!r}")
    return calls


def _max_abs_diff(result: object, reference: torch.Tensor) -> float:
    ref = reference.detach().cpu().to(torch.float64).numpy()
    got = result.detach().cpu().to(torch.float64).numpy() if isinstance(result, torch.Tensor) else result
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - ref)))


def run_config(cfg: Config, rounds: int, rng: random.Random, pause: float = 0.0) -> None:
    """Check agreement, then time the implementations in interleaved, shuffled rounds.

    ``pause`` seconds pass before every timed call: a library's worker threads keep
    spinning for a while after a call (OpenBLAS's after the NumPy loop, OpenMP's after
    torch), and on a small machine they take the cores from whichever call comes next.
    """
    device = torch.device(cfg.device)
    calls = _callables(cfg)
    reference = calls["nw"]()
    if "statsmodels" in calls:
        reference = reference[:1, :1]
    agreement = {}
    first_call = cfg.results.setdefault("first_call_s", {})
    for name, call in list(calls.items()):  # doubles as the warm-up (and the compile of compiled peers)
        _sync(device)
        t0 = time.perf_counter()
        try:
            out = call()
        except Exception as exc:
            if name not in OPTIONAL:
                raise
            cfg.results.setdefault("skipped", {})[name] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            del calls[name]
            continue
        _sync(device)
        first_call[name] = time.perf_counter() - t0
        if name == "simulate":
            if tuple(out.shape) != (cfg.R, cfg.H, cfg.m) or not bool(torch.isfinite(out).all()):
                raise RuntimeError(f"{cfg.name}: simulate returned shape {tuple(out.shape)} or non-finite values")
        if name == "nw" or name in NOT_COMPARED:
            continue
        err = _max_abs_diff(out, reference)
        tol = AGREEMENT[cfg.torch_dtype] * max(1.0, float(reference.abs().max()))
        if not err <= tol:
            raise RuntimeError(f"{cfg.name}: {name} differs from nadaraya_watson by {err:.3g} (> {tol:.3g})")
        agreement[name] = err
        del out
    del reference
    samples: dict[str, list[float]] = {name: [] for name in calls}
    control = cfg.control and "numpy_loop" in calls
    participants = list(calls) + ([CONTROL] if control else [])
    control_samples: list[float] = []
    for _ in range(rounds):
        order = list(participants)
        rng.shuffle(order)
        for name in order:
            _sync(device)
            time.sleep(pause)
            if name == CONTROL:
                calls["numpy_loop"]()  # untimed, and no pause before the timed call
            start = time.perf_counter()
            out = calls["nw" if name == CONTROL else name]()
            _sync(device)
            (control_samples if name == CONTROL else samples[name]).append(time.perf_counter() - start)
            del out
    nw_med = statistics.median(samples["nw"])
    methods = {}
    for name, ts in samples.items():
        q1, med, q3 = (float(x) for x in np.quantile(ts, [0.25, 0.5, 0.75]))
        entry = {"median_s": med, "q1_s": q1, "q3_s": q3, "samples_s": ts}
        if name != "nw" and name not in RATES:
            entry["ratio_to_nw"] = med / nw_med
            entry["paired_ratio_median"] = statistics.median(t / s for t, s in zip(ts, samples["nw"], strict=True))
            if name in agreement:
                entry["max_abs_diff_vs_nw"] = agreement[name]
        methods[name] = entry
    cfg.results["methods"] = methods
    if control:
        cfg.results["control"] = {
            "description": "nadaraya_watson timed right after an untimed NumPy loop, without the pause",
            "samples_s": control_samples,
            "median_s": statistics.median(control_samples),
            "nw_median_s": nw_med,
        }
    r = cfg.results
    r["nw_flops"], r["nw_exps"] = cfg.nw_flops, cfg.nw_exps
    r["nw_gflops"] = cfg.nw_flops / nw_med / 1e9
    if "gemm" in samples:
        r["gemm_gflops"] = r["gemm_flops"] / statistics.median(samples["gemm"]) / 1e9
        r["nw_fraction_of_gemm"] = r["nw_gflops"] / r["gemm_gflops"]
    if "exp" in samples:
        r["exp_gexps"] = r["exp_count"] / statistics.median(samples["exp"]) / 1e9
    if "gemm" in samples and "exp" in samples:
        gemm_s = cfg.nw_flops / (r["gemm_gflops"] * 1e9)
        exp_s = cfg.nw_exps / (r["exp_gexps"] * 1e9)
        # Paired: each round's attainable time (from that round's GEMM and exp) over its nw time.
        paired = [
            max(cfg.nw_flops * tg / r["gemm_flops"], cfg.nw_exps * te / r["exp_count"]) / tn
            for tg, te, tn in zip(samples["gemm"], samples["exp"], samples["nw"], strict=True)
        ]
        r["roofline"] = {
            "gemm_time_s": gemm_s,
            "exp_time_s": exp_s,
            "attainable_s": max(gemm_s, exp_s),
            "limited_by": "exp" if exp_s >= gemm_s else "gemm",
            "measured_s": nw_med,
            "fraction": max(gemm_s, exp_s) / nw_med,
            "fraction_paired_median": statistics.median(paired),
        }
    for rate in ("exp_l1", "exp_l1_sleef", "exp_l1_exp2", "mix_l1", "exp_torch_l1", "exp_torch_l2"):
        if rate in samples:
            r[f"{rate}_gexps"] = r[f"{rate}_count"] / statistics.median(samples[rate]) / 1e9
    if "gemm" in samples and any(loop in samples for loop in LIMIT_EXP_LOOPS):
        r["limit"] = _limit(cfg, samples)
    if "simulate" in samples:
        sim_med = statistics.median(samples["simulate"])
        r["replicates_per_s"] = cfg.R / sim_med
        r["simulate_size"] = {
            "R": cfg.R,
            "H": cfg.H,
            "D": cfg.D,
            "d_k": cfg.d,
            "n": cfg.n,
            "m": cfg.m,
            "dtype": cfg.dtype,
            "kernel": cfg.kernel,
            "head_data": "shared",
        }
        if "roofline" in r:
            r["roofline"]["simulate_measured_s"] = sim_med
            r["roofline"]["simulate_fraction"] = r["roofline"]["attainable_s"] / sim_med
        try:
            from benchmarks._memprobe import engine_bound

            r["chunk_size_used"] = engine_bound(
                dict(
                    device=cfg.device,
                    dtype=cfg.dtype,
                    R=cfg.R,
                    H=cfg.H,
                    D=cfg.D,
                    d=cfg.d,
                    m=cfg.m,
                    n=cfg.n,
                    chunk_size=None,
                    kernel=cfg.kernel,
                )
            )["chunk_size_used"]
        except Exception as exc:  # an nwlib without a stated memory model
            r["chunk_size_used"] = None
            r["chunk_size_note"] = f"{type(exc).__name__}: {exc}"


def _per_round(cfg: Config) -> dict[str, float | None]:
    """nadaraya_watson's fraction of the measured limit round by round (:func:`benchmarks.report.fraction_interval`).

    The interval's ends are ``None`` (JSON ``null``, not NaN) after a single round: no spread to estimate.
    """
    from benchmarks.report import INTERVAL_LEVEL, fraction_interval

    centre, low, high = fraction_interval({"results": cfg.results})
    ends = {k: None if math.isnan(v) else v for k, v in (("low", low), ("high", high))}
    return {"geometric_mean": centre, **ends, "level": INTERVAL_LEVEL}


def _limit(cfg: Config, samples: dict[str, list[float]]) -> dict:
    """The machine's limit for one call, from the rates measured in the same rounds.

    One call needs R·H·m·n exponentials and :attr:`Config.fused_flops` flops. At the rate of the
    best exp torch has (the faster of ATen's ``exp_u20`` and nwlib's ``exp2`` over an
    L1-resident buffer on every thread) and of a large GEMM, it needs at least
    max(exps / exp rate, flops / GEMM rate) if the two overlap perfectly (``limit_s``), and their
    sum if they cannot overlap at all (``limit_sum_s``). Which one the cores allow is measured too:
    ``mix_l1`` runs the kernel's arithmetic itself, one exp2 and d + p independent multiply-adds
    per element of an L1-resident buffer, on every thread; scaled to the call's exponentials it
    is ``limit_mix_s``, the limit the target is judged against (where measured). The fractions
    are each limit over the measured time, of the medians (and per round, paired, for ``limit_s``).
    """
    r = cfg.results
    rates = {loop: r[f"{loop}_count"] / statistics.median(samples[loop]) for loop in LIMIT_EXP_LOOPS if loop in samples}
    best = max(rates, key=rates.__getitem__)
    exp_rate = rates[best]
    gemm_rate = r["gemm_flops"] / statistics.median(samples["gemm"])
    exp_s, flop_s = cfg.nw_exps / exp_rate, cfg.fused_flops / gemm_rate
    limit = {
        "exps": cfg.nw_exps,
        "flops": cfg.fused_flops,
        "exp_source": best,
        "exp_rate_per_s": exp_rate,
        "exp_rate_per_core_per_s": exp_rate / r[f"{best}_threads"],
        "threads": r[f"{best}_threads"],
        "gemm_rate_flops_per_s": gemm_rate,
        "exp_time_s": exp_s,
        "flop_time_s": flop_s,
        "limit_s": max(exp_s, flop_s),
        "limit_sum_s": exp_s + flop_s,
        "limited_by": "exp" if exp_s >= flop_s else "gemm",
        "fractions": {},
    }
    if "mix_l1" in samples:
        limit["limit_mix_s"] = cfg.nw_exps * statistics.median(samples["mix_l1"]) / r["mix_l1_count"]
        limit["mix_products_per_exp"] = r["mix_l1_fmas"]
    for name in ("nw", *PEERS):
        if name not in samples:
            continue
        paired = [
            max(cfg.nw_exps * te / r[f"{best}_count"], cfg.fused_flops * tg / r["gemm_flops"]) / t
            for te, tg, t in zip(samples[best], samples["gemm"], samples[name], strict=True)
        ]
        med = statistics.median(samples[name])
        limit["fractions"][name] = {
            "fraction": limit["limit_s"] / med,
            "fraction_paired_median": statistics.median(paired),
            "fraction_of_sum": limit["limit_sum_s"] / med,
        }
        if "limit_mix_s" in limit:
            limit["fractions"][name]["fraction_of_mix"] = limit["limit_mix_s"] / med
    return limit


def measure_memory(spec: dict, timeout: float = 600.0) -> dict:
    """Run :mod:`benchmarks._memprobe` on ``spec`` in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._memprobe", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"spec": spec, "error": err[-1] if err else "failed"}
    return json.loads(lines[-1])


def build_configs(device: str, quick: bool) -> list[Config]:
    R, H, m, n, d = (8, 8, 128, 512, 8) if quick else (64, 8, 256, 2048, 8)
    on_cpu = device == "cpu"
    configs = []
    for dtype in ("float32", "float64"):
        for p in (None, d):
            methods = ["materialised"] + (["numpy_loop"] if on_cpu else [])
            if p is None and dtype == "float32" and on_cpu:
                methods += ["sdpa_unpadded"]
            methods += ["sdpa"]  # nadaraya_watson's SDPA path, side by side with its fused kernel
            if dtype == "float32" and on_cpu and not quick:  # quick: no KeOps compile
                methods += ["keops"]
            if p is None and dtype == "float32" and on_cpu:
                # the compiled candidates (not in a quick run: a minute of compiling) and the
                # limit's exp rates, at the target configuration
                methods += ([] if quick else ["flex", "inductor"]) + ["exp_l1_sleef", "exp_torch_l1", "exp_torch_l2"]
                methods += ["mix_l1"]
            if on_cpu and dtype == "float32":  # the limit's exps are float32's (exp_u20, nwlib's exp2)
                methods += ["exp_l1", "exp_l1_exp2"]
            if p == d:  # MHA's heads return vectors of the head dimension
                methods += ["mha", "mha_need_weights"]
            configs.append(
                Config(
                    name=f"{device}-{dtype}-{'scalar' if p is None else 'vector'}",
                    group="grid",
                    device=device,
                    dtype=dtype,
                    R=R,
                    H=H,
                    m=m,
                    n=n,
                    d=d,
                    p=p,
                    methods=methods + ["gemm", "exp"],
                    control=on_cpu and dtype == "float32" and p is None,
                )
            )
    # The Gaussian kernel, as the experiments use it (scalar responses, Scott's bandwidth for
    # standard-normal keys). float32 only: the exp rows above show what float64 costs, and the
    # whole run has to stay within about ten minutes on two cores.
    configs.append(
        Config(
            name=f"{device}-float32-scalar-gaussian",
            group="grid",
            device=device,
            dtype="float32",
            R=R,
            H=H,
            m=m,
            n=n,
            d=d,
            p=None,
            methods=["materialised"]
            + (["numpy_loop"] if on_cpu else [])
            + ["gemm", "exp"]
            + (["exp_l1", "exp_l1_exp2"] if on_cpu else []),
            kernel="gaussian",
            bandwidth=scott_bandwidth(n, d),
        )
    )
    # The engine end to end: the book's engine benchmark size (H = 8, d_k = 4, D = 16, n = 2048, m = 256).
    eR, eH, eD, ed, em, en = (8, 8, 16, 4, 128, 512) if quick else (64, 8, 16, 4, 256, 2048)
    configs.append(
        Config(
            name=f"{device}-engine-gaussian-H{eH}",
            group="engine",
            device=device,
            dtype="float32",
            R=eR,
            H=eH,
            m=em,
            n=en,
            d=ed,
            p=None,
            D=eD,
            methods=["simulate", "gemm", "exp"] + (["exp_l1", "exp_l1_exp2"] if on_cpu else []),
            kernel="gaussian",
        )
    )
    scaling_R, scaling_ns = (2, (256, 1024)) if quick else (8, (512, 2048, 8192))
    for n_s in scaling_ns:
        configs.append(
            Config(
                name=f"{device}-scaling-n{n_s}",
                group="scaling",
                device=device,
                dtype="float32",
                R=scaling_R,
                H=8,
                m=256,
                n=n_s,
                d=d,
                p=None,
                methods=["materialised"] + (["numpy_loop"] if on_cpu else []),
            )
        )
    if on_cpu:
        for m_s, n_s in ((32, 256),) if quick else ((64, 512), (256, 2048)):
            configs.append(
                Config(
                    name=f"cpu-statsmodels-m{m_s}-n{n_s}",
                    group="statsmodels",
                    device=device,
                    dtype="float64",
                    R=1,
                    H=1,
                    m=m_s,
                    n=n_s,
                    d=d,
                    p=None,
                    methods=["statsmodels"],
                    kernel="gaussian",
                    bandwidth=1.0,
                )
            )
    return configs


def probe_specs(device: str) -> list[dict]:
    """Known allocations that check the memory probe itself (recorded with the results)."""
    base = dict(case="probe", method="known_allocation", device=device, dtype="float32", R=1, H=1, m=1, n=1)
    return [
        dict(base, name="probe-4MiB", numel=2**20),
        dict(base, name="probe-4MiB-kept-8MiB-freed", numel=2**20, temp_numel=2**21),
    ]


def memory_specs(device: str, quick: bool) -> list[dict]:
    R, H, m, n, d = (8, 8, 128, 512, 8) if quick else (64, 8, 256, 2048, 8)
    on_cpu = device == "cpu"
    specs = []
    for p in (None,) if quick else (None, d):
        methods = ["nw", "materialised"] + (["numpy_loop"] if on_cpu else [])
        if p == d:
            methods += ["mha", "mha_need_weights"]
        for method in methods:
            specs.append(
                dict(
                    case="grid",
                    name=f"grid-{method}-{'scalar' if p is None else 'vector'}",
                    method=method,
                    device=device,
                    dtype="float32",
                    R=R,
                    H=H,
                    m=m,
                    n=n,
                    d=d,
                    p=p,
                )
            )
    large = ["nw"] if quick else ["nw", "materialised"] + (["numpy_loop"] if on_cpu else [])
    for method in large:
        specs.append(
            dict(
                case="large",
                name=f"large-{method}",
                method=method,
                device=device,
                dtype="float32",
                R=1,
                H=1,
                m=16384,
                n=16384,
                d=d,
                p=None,
            )
        )
    return specs


def engine_specs(device: str, quick: bool) -> list[dict]:
    """Live peak of the Monte Carlo engine against its chunk size and the replicate count.

    One head, D = 16, d_k = 8, m = n = 16384 (quick: 4096), Gaussian kernel, shared
    data: a chunk-size sweep at a fixed number of replicates (chunk None: the
    engine's own choice under its default memory budget) and a replicate sweep at a
    fixed chunk size (memory bounded by chunking must not grow with R beyond the
    (R, H, m) predictions; every R is at least one data block of 16 replicates, so
    the step from the first block to the next is inside the sweep's first interval
    only); the case in both sweeps is measured once. Then one case with the
    exponential kernel and one with H = 8 heads sharing the data.
    """
    if quick:
        size, chunk_R, chunks, fixed, Rs, other_R = 4096, 16, (1, 4, None), 4, (16, 32, 64), 8
    else:
        size, chunk_R, chunks, fixed, Rs, other_R = 16384, 64, (1, 4, 16, None), 4, (16, 64, 128), 16
    base = dict(
        case="engine",
        method="simulate",
        device=device,
        dtype="float32",
        H=1,
        D=16,
        d=8,
        m=size,
        n=size,
        kernel="gaussian",
        head_data="shared",
    )
    runs: dict[tuple, dict] = {}
    for c in chunks:
        runs[(chunk_R, c, "gaussian", 1)] = dict(base, R=chunk_R, chunk_size=c, sweeps=["chunk"])
    for R in Rs:
        key = (R, fixed, "gaussian", 1)
        if key in runs:
            runs[key]["sweeps"].append("replicates")
        else:
            runs[key] = dict(base, R=R, chunk_size=fixed, sweeps=["replicates"])
    runs[(other_R, fixed, "exp", 1)] = dict(base, R=other_R, chunk_size=fixed, kernel="exp", sweeps=["kernel"])
    runs[(other_R // 2, None, "gaussian", 8)] = dict(base, R=other_R // 2, H=8, chunk_size=None, sweeps=["heads"])
    specs = []
    for spec in runs.values():
        chunk = "auto" if spec["chunk_size"] is None else spec["chunk_size"]
        spec["name"] = f"engine-{spec['kernel']}-H{spec['H']}-R{spec['R']}-chunk{chunk}"
        specs.append(spec)
    return specs


def machine_info(devices: list[str]) -> dict:
    cpu_model, vendor, flags = platform.processor() or "unknown", None, []
    family = model_number = None  # what identifies a CPU whose model name is generic ("AMD EPYC")
    wanted = (
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    )
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and cpu_model in ("unknown", platform.processor()):
                cpu_model = line.split(":", 1)[1].strip()
            if line.startswith("vendor_id") and vendor is None:
                vendor = line.split(":", 1)[1].strip()
            if line.startswith("cpu family") and family is None:
                family = int(line.split(":", 1)[1])
            if re.match(r"model\s*:", line) and model_number is None:
                model_number = int(line.split(":", 1)[1])
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                flags = [f for f in wanted if f in present]
                break
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import statsmodels

        sm_version = statsmodels.__version__
    except ImportError:
        sm_version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        capability = None
    parallel = torch.__config__.parallel_info().splitlines()
    backend = next(
        (line.split(":", 1)[1].strip() for line in parallel if line.startswith("ATen parallel backend")), None
    )
    numpy_blas = None
    try:
        numpy_blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name")
    except Exception:  # older NumPy: no dict mode
        pass
    info = {
        "cpu_model": cpu_model,
        "cpu_vendor": vendor,
        "cpu_family": family,
        "cpu_model_number": model_number,
        "cpu_flags": flags,
        "cpu_capability": capability,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_parallel_backend": backend,
        "torch_mkl": torch.backends.mkl.is_available(),
        "torch_mkldnn": torch.backends.mkldnn.is_available(),
        "numpy_blas": numpy_blas,
        "memory_bytes": mem_total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "statsmodels": sm_version,
        "git_commit": commit or None,
        "thread_env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY")
            if k in os.environ
        },
    }
    from nwlib import _fused

    mod = _fused.module()
    info["fused_kernel"] = {
        "built": mod is not None,
        "capability": _fused.STATE.get("capability"),
        "error": _fused.STATE.get("error"),
        "build_or_load_s": _fused.STATE.get("build_s"),
        "enabled": _fused.enabled(),
    }
    info["isa"] = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"
    if "cuda" in devices:
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def evaluate_targets(configs: list[Config], memory: list[dict]) -> list[dict]:
    targets = []
    grid = {c.name: c for c in configs if c.group == "grid"}
    target_cfg = grid.get(TARGET_CONFIG)
    if target_cfg is not None:
        for method, threshold in TARGETS.items():
            entry = target_cfg.results["methods"].get(method)
            if entry is None:
                continue
            targets.append(
                {
                    "id": f"speedup_vs_{method}",
                    "description": f"nadaraya_watson at least {threshold:g}x faster than {METHODS[method]}",
                    "config": target_cfg.name,
                    "threshold": threshold,
                    "ratio": entry["ratio_to_nw"],
                    "paired_ratio": entry["paired_ratio_median"],
                    "pass": entry["ratio_to_nw"] >= threshold,
                }
            )
    if target_cfg is not None and "limit" in target_cfg.results:
        lim = target_cfg.results["limit"]
        frac = lim["fractions"]["nw"]
        mix = "fraction_of_mix" in frac  # judged against the measured limit where there is one
        targets.append(
            {
                "id": "fraction_of_limit",
                "description": f"nadaraya_watson at least {LIMIT_TARGET:.0%} of the same-run limit "
                + (
                    "(the call's exponentials and multiply-adds run together on L1-resident data)"
                    if mix
                    else "(max of exps / L1 exp rate and flops / GEMM rate)"
                ),
                "config": target_cfg.name,
                "threshold": LIMIT_TARGET,
                "judged_on": "mix" if mix else "max",
                "fraction": frac["fraction"],
                "fraction_paired": frac["fraction_paired_median"],
                "fraction_of_sum": frac["fraction_of_sum"],
                "fraction_of_mix": frac.get("fraction_of_mix"),
                # round by round: geometric mean and 95 % interval of the rounds' fractions (None: no mix)
                "fraction_of_mix_per_round": _per_round(target_cfg) if mix else None,
                "limited_by": lim["limited_by"],
                "pass": (frac["fraction_of_mix"] if mix else frac["fraction"]) >= LIMIT_TARGET,
            }
        )
    if target_cfg is not None:
        peers = {k: v for k, v in target_cfg.results["methods"].items() if k in PEERS}
        if peers:
            slowest_margin = min(v["ratio_to_nw"] for v in peers.values())
            targets.append(
                {
                    "id": "ahead_of_every_peer",
                    "description": "nadaraya_watson faster than every peer timed at the target configuration",
                    "config": target_cfg.name,
                    "peers": sorted(peers),
                    "skipped": target_cfg.results.get("skipped", {}),
                    "closest_ratio": slowest_margin,
                    "closest_peer": min(peers, key=lambda k: peers[k]["ratio_to_nw"]),
                    "pass": slowest_margin > 1.0,
                }
            )
    for rec in memory:
        spec = rec["spec"]
        if spec["case"] == "large" and spec["method"] == "nw" and "peak_bytes" in rec:
            targets.append(
                {
                    "id": f"memory_nw_{spec['device']}",
                    "description": "nadaraya_watson, m = n = 16384, one head: peak memory of the call under 1 GiB",
                    "limit_bytes": GIB,
                    "peak_bytes": rec["peak_bytes"],
                    "measure": rec.get("measure"),
                    "pass": rec["peak_bytes"] < GIB,
                }
            )
    engine = [r for r in memory if r["spec"]["case"] == "engine"]
    large_engine = [r for r in engine if "peak_bytes" in r and r["spec"]["m"] == r["spec"]["n"] == 16384]
    if large_engine:
        worst = max(r["peak_bytes"] for r in large_engine)
        targets.append(
            {
                "id": "memory_engine",
                "description": "Monte Carlo engine, m = n = 16384: peak memory under 1 GiB in every case tried",
                "limit_bytes": GIB,
                "peak_bytes": worst,
                "measure": large_engine[0].get("measure"),
                "pass": worst < GIB,
            }
        )
    if engine:
        measured = [r for r in engine if "live_peak_bytes" in r and "bound_bytes" in r]
        failing = [r["spec"]["name"] for r in measured if r["live_peak_bytes"] > r["bound_bytes"]]
        errors = [r["spec"]["name"] for r in engine if r not in measured]
        sources = sorted({r["bound_source"] for r in measured})
        targets.append(
            {
                "id": "engine_within_bound",
                "description": "engine: live peak ≤ stated bound in every case",
                "cases": len(engine),
                "within": len(measured) - len(failing),
                "failing": failing,
                "not_measured": errors,
                "worst_peak_over_bound": max((r["live_peak_bytes"] / r["bound_bytes"] for r in measured), default=None),
                "bound_source": sources,
                "pass": bool(measured) and not failing and not errors,
            }
        )
    return targets


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:9.1f} ms" if s < 10 else f"{s:9.2f} s "


def _mib(x: float | None) -> str:
    return "–" if x is None else f"{x / MIB:.1f}"


def print_report(report: dict) -> None:
    mach = report["machine"]
    print(
        f"\nnwlib benchmarks  ({mach['cpu_model']}, {mach.get('cpu_capability')}, {mach['usable_cpus']} CPUs, "
        f"{mach['torch_threads']} threads, torch {mach['torch']}, {report['date']}"
        f"{', quick' if report['quick'] else ''})"
    )
    for cfg in report["configs"]:
        size = f"R={cfg['R']} H={cfg['H']} m={cfg['m']} n={cfg['n']} d={cfg['d']}"
        resp = "scalar" if cfg["p"] is None else f"p={cfg['p']}"
        print(f"\n[{cfg['name']}] {size} {resp} {cfg['dtype']} kernel={cfg['kernel']}")
        print(f"  {'method':<18}{'median':>12}{'IQR':>22}{'ratio':>9}{'paired':>9}")
        for name, e in cfg["results"]["methods"].items():
            ratio = f"{e['ratio_to_nw']:8.2f}x" if "ratio_to_nw" in e else " " * 9
            paired = f"{e['paired_ratio_median']:8.2f}x" if "paired_ratio_median" in e else ""
            iqr = f"{_fmt_time(e['q1_s']).strip()}–{_fmt_time(e['q3_s']).strip()}"
            print(f"  {name:<18}{_fmt_time(e['median_s']):>12}{iqr:>22}{ratio}{paired}")
        r = cfg["results"]
        if "control" in r:
            print(f"  control: nw right after the NumPy loop, no pause: {_fmt_time(r['control']['median_s']).strip()}")
        if "gemm_gflops" in r:
            print(
                f"  nw {r['nw_gflops']:.1f} GFLOP/s = {100 * r['nw_fraction_of_gemm']:.1f}% of GEMM "
                f"{r['gemm_gflops']:.1f} GFLOP/s; exp {r.get('exp_gexps', float('nan')):.2f} Gexp/s"
            )
        if "roofline" in r:
            rf = r["roofline"]
            print(
                f"  roofline: attainable {_fmt_time(rf['attainable_s']).strip()} (limited by {rf['limited_by']}), "
                f"measured {_fmt_time(rf['measured_s']).strip()}: {100 * rf['fraction']:.0f}% of attainable"
            )
        if "limit" in r:
            lim = r["limit"]
            fr = lim["fractions"]["nw"]
            mix = (
                f"; measured together {_fmt_time(lim['limit_mix_s']).strip()}, nw at {100 * fr['fraction_of_mix']:.0f}%"
                if "limit_mix_s" in lim
                else ""
            )
            print(
                f"  limit: {lim['exp_rate_per_core_per_s'] / 1e9:.2f} Gexp/s per core "
                f"({lim.get('exp_source', 'exp_l1')}) "
                f"x {lim['threads']}, "
                f"GEMM {lim['gemm_rate_flops_per_s'] / 1e9:.0f} GFLOP/s: {_fmt_time(lim['limit_s']).strip()} "
                f"(by {lim['limited_by']}; sum {_fmt_time(lim['limit_sum_s']).strip()}); nw at "
                f"{100 * fr['fraction']:.0f}% (paired {100 * fr['fraction_paired_median']:.0f}%, "
                f"of the sum {100 * fr['fraction_of_sum']:.0f}%){mix}"
            )
        for name, why in r.get("skipped", {}).items():
            print(f"  skipped {name}: {why}")
        if "replicates_per_s" in r:
            print(f"  simulate: {r['replicates_per_s']:.1f} replicates/s (chunk {r.get('chunk_size_used')})")
    if report["memory"]:
        print("\npeak memory of one call (fresh process each): live tensor bytes, and the rise of RSS")
        for rec in report["memory"]:
            s = rec["spec"]
            label = f"{s.get('name', s['case'] + '-' + s['method']):<40}"
            if "error" in rec:
                print(f"  {label}  error: {rec['error']}")
                continue
            line = (
                f"  {label}live {_mib(rec.get('live_peak_bytes')):>9} MiB"
                f"   RSS {_mib(rec.get('rss_peak_bytes')):>9} MiB"
            )
            if "expected_peak_bytes" in rec:
                line += f"   (expected {_mib(rec['expected_peak_bytes'])} MiB)"
            if "bound_bytes" in rec:
                verdict = "within" if rec["within_bound"] else "ABOVE"
                line += f"   chunk {rec['chunk_size_used']}, bound {_mib(rec['bound_bytes'])} MiB: {verdict}"
            print(line)
    print(f"\nwall time {report['wall_time_s']:.0f} s")
    print("\ntargets" + (" (quick run: small sizes, not the target configuration)" if report["quick"] else ""))
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "FAIL"
        if "ratio" in t:
            print(f"  {verdict}  {t['description']}: {t['ratio']:.2f}x (paired {t['paired_ratio']:.2f}x)")
        elif t["id"] == "fraction_of_limit":
            judged = t.get("fraction_of_mix") if t.get("judged_on") == "mix" else t["fraction"]
            rounds = t.get("fraction_of_mix_per_round")
            per_round = (
                f"; round by round {100 * rounds['geometric_mean']:.0f}%, 95% interval "
                f"{100 * rounds['low']:.0f}-{100 * rounds['high']:.0f}%"
                if rounds and rounds["low"] is not None
                else ""
            )
            print(
                f"  {verdict}  {t['description']}: {100 * judged:.0f}% "
                f"(of the max-bound {100 * t['fraction']:.0f}%, paired {100 * t['fraction_paired']:.0f}%; "
                f"of the sum {100 * t['fraction_of_sum']:.0f}%{per_round})"
            )
        elif t["id"] == "ahead_of_every_peer":
            print(f"  {verdict}  {t['description']}: closest {t['closest_peer']} at {t['closest_ratio']:.2f}x")
        elif t["id"] == "engine_within_bound":
            extra = f"; above: {', '.join(t['failing'])}" if t["failing"] else ""
            extra += f"; not measured: {', '.join(t['not_measured'])}" if t["not_measured"] else ""
            print(
                f"  {verdict}  {t['description']}: {t['within']} of {t['cases']} within "
                f"(bound: {', '.join(t['bound_source']) or 'none'}){extra}"
            )
        else:
            print(f"  {verdict}  {t['description']}: {t['peak_bytes'] / MIB:.1f} MiB")
    if not report["quick"] and not any(t["id"] == "memory_engine" for t in report["targets"]):
        print("  (Monte Carlo engine not measured at m = n = 16384)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the CPU, plus CUDA when available (default); cuda: CUDA only, skipped if absent",
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per configuration (default 7; quick 3)")
    parser.add_argument(
        "--pause",
        type=float,
        default=None,
        help="seconds of idle before each timed call, so that one library's spinning "
        "worker threads do not slow the next call (default 0.5; quick 0.25)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    parser.add_argument(
        "--only",
        default=None,
        metavar="REGEX",
        help="run only the configurations and memory cases whose names match (re.search)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of calls within rounds")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON result file (default {DEFAULT_OUTPUT.relative_to(ROOT)}; "
        "--quick and --only runs write none unless given)",
    )
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA requested but not available: GPU benchmarks skipped.")
        return 0
    auto = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    devices = {"auto": auto, "cpu": ["cpu"], "cuda": ["cuda"]}[args.device]
    rounds = args.rounds or (3 if args.quick else 7)
    pause = args.pause if args.pause is not None else (0.25 if args.quick else 0.5)
    output = args.output if args.output is not None else (None if args.quick or args.only else DEFAULT_OUTPUT)
    rng = random.Random(args.seed)
    selected = (lambda name: re.search(args.only, name) is not None) if args.only else (lambda name: True)

    started = time.perf_counter()
    load_before = os.getloadavg()
    configs: list[Config] = []
    for device in devices:
        for cfg in build_configs(device, args.quick):
            if not selected(cfg.name):
                continue
            print(f"timing {cfg.name} ...", flush=True)
            t0 = time.perf_counter()
            run_config(cfg, rounds, rng, pause)
            cfg.results["wall_s"] = time.perf_counter() - t0
            configs.append(cfg)
    memory = []
    if not args.no_memory:
        for device in devices:
            for spec in probe_specs(device) + memory_specs(device, args.quick) + engine_specs(device, args.quick):
                if not selected(spec["name"]):
                    continue
                print(f"memory {spec['name']} {device} ...", flush=True)
                t0 = time.perf_counter()
                rec = measure_memory(spec)
                rec["wall_s"] = time.perf_counter() - t0
                memory.append(rec)
    report = {
        "schema": SCHEMA,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.run"] + (argv if argv is not None else sys.argv[1:])),
        "quick": args.quick,
        "only": args.only,
        "rounds": rounds,
        "pause_s": pause,
        "devices": devices,
        "machine": machine_info(devices),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "wall_time_s": time.perf_counter() - started,
        "methods": METHODS,
        "gaussian_methods": GAUSSIAN_METHODS,
        "exp_reference": {"numel": EXP_NUMEL, "repeats": EXP_REPEATS, "argument_range": [-20.0, 0.0]},
        "configs": [asdict(c) for c in configs],
        "memory": memory,
        "targets": evaluate_targets(configs, memory),
    }
    print_report(report)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(output)
        print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
