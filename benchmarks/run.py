"""Time and memory of :func:`nwlib.nadaraya_watson` against the alternatives.

    python -m benchmarks.run                  # full run, writes benchmarks/results/latest.json
    python -m benchmarks.run --quick          # smoke run (small sizes), prints only
    python -m benchmarks.run --device cuda    # the GPU path; skipped when CUDA is absent

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
  robust to drifting load).
* The machine's matmul throughput: a large GEMM of the configuration's dtype
  is one more participant in the rounds, so it is measured under the same load.
  ``nadaraya_watson``'s achieved rate counts 4·R·H·m·n·w flops (two products of
  width w = max(d, p), the width its fused kernel works at) and ignores the exps.
* Peak memory: one fresh process per case (:mod:`benchmarks._memprobe` explains
  the measure), including the Monte Carlo engine ``nwlib.simulate`` against its
  chunk size and the number of replicates, next to the bound it states.

Targets (CPU, float32, R=64, H=8, m=256, n=2048, d=8, scalar responses): at
least 5x faster than the materialised softmax and 4x faster than the NumPy loop,
as ratios of medians in one run; and at m = n = 16384, one head, a peak memory
under 1 GiB for ``nadaraya_watson`` (and for the Monte Carlo engine when present).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

import numpy as np
import torch

from nwlib import nadaraya_watson

from benchmarks.references import (
    from_model_layout,
    identity_mha,
    materialised_softmax,
    numpy_loop,
    statsmodels_nw,
    to_model_layout,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "latest.json"
SCHEMA = 1
GIB = 2**30

METHODS = {
    "nw": "nwlib.nadaraya_watson",
    "materialised": "torch softmax(Q Kᵀ/√d) V, weights formed",
    "numpy_loop": "NumPy loop over replicates and heads",
    "mha": "nn.MultiheadAttention, identity projections, need_weights=False",
    "mha_need_weights": "nn.MultiheadAttention, identity projections, default call (need_weights=True)",
    "statsmodels": "statsmodels KernelReg (reg_type='lc', fixed bw, Gaussian)",
    "gemm": "reference GEMM (machine throughput)",
}
TARGETS = {"materialised": 5.0, "numpy_loop": 4.0}
CONTROL = "control"
# Agreement required between every implementation and nadaraya_watson before timing.
AGREEMENT = {torch.float32: 1e-4, torch.float64: 1e-10}


@dataclass
class Config:
    name: str
    group: str  # "grid" (the target size), "scaling" (time against n), "statsmodels"
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


def _callables(cfg: Config, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Callable]:
    """Each implementation as a zero-argument callable returning (R, H, m[, p]) as torch or numpy."""
    scale = cfg.d**-0.5
    nw_kwargs = {} if cfg.kernel == "exp" else {"kernel": cfg.kernel, "bandwidth": cfg.bandwidth}
    calls: dict[str, Callable] = {"nw": lambda: nadaraya_watson(q, k, v, **nw_kwargs)}
    for method in cfg.methods:
        if method == "materialised":
            calls[method] = lambda: materialised_softmax(q, k, v, scale)
        elif method == "numpy_loop":
            qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
            calls[method] = lambda qn=qn, kn=kn, vn=vn: numpy_loop(qn, kn, vn, scale)
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
            bw = cfg.bandwidth
            calls[method] = lambda: statsmodels_nw(qn, kn, vn, bw)[None, None]
        elif method == "gemm":
            size = 8192 if q.device.type == "cuda" else 2048
            gen = torch.Generator(device=q.device).manual_seed(0)
            a = torch.randn(size, size, generator=gen, dtype=q.dtype, device=q.device)
            b = torch.randn(size, size, generator=gen, dtype=q.dtype, device=q.device)
            calls[method] = lambda: a @ b
            cfg.results["gemm_flops"] = 2.0 * size**3
        elif method != "nw":
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
    q, k, v = _inputs(cfg)
    calls = _callables(cfg, q, k, v)
    reference = calls["nw"]()
    if "statsmodels" in calls:
        reference = reference[:1, :1]
    agreement = {}
    for name, call in calls.items():  # doubles as the warm-up
        _sync(device)
        out = call()
        _sync(device)
        if name in ("nw", "gemm"):
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
        if name not in ("nw", "gemm"):
            entry["ratio_to_nw"] = med / nw_med
            entry["paired_ratio_median"] = statistics.median(t / s for t, s in zip(ts, samples["nw"]))
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
    cfg.results["nw_gflops"] = cfg.nw_flops / nw_med / 1e9
    if "gemm" in samples:
        gemm = cfg.results["gemm_flops"] / statistics.median(samples["gemm"]) / 1e9
        cfg.results["gemm_gflops"] = gemm
        cfg.results["nw_fraction_of_gemm"] = cfg.results["nw_gflops"] / gemm


def measure_memory(spec: dict, timeout: float = 600.0) -> dict:
    """Run :mod:`benchmarks._memprobe` on ``spec`` in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._memprobe", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        return {"spec": spec, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_configs(device: str, quick: bool) -> list[Config]:
    R, H, m, n, d = (8, 8, 128, 512, 8) if quick else (64, 8, 256, 2048, 8)
    on_cpu = device == "cpu"
    configs = []
    for dtype in ("float32", "float64"):
        for p in (None, d):
            methods = ["materialised"] + (["numpy_loop"] if on_cpu else [])
            if p == d:  # MHA's heads return vectors of the head dimension
                methods += ["mha", "mha_need_weights"]
            configs.append(
                Config(
                    name=f"{device}-{dtype}-{'scalar' if p is None else 'vector'}",
                    group="grid", device=device, dtype=dtype, R=R, H=H, m=m, n=n, d=d, p=p,
                    methods=methods + ["gemm"],
                    control=on_cpu and dtype == "float32" and p is None,
                )
            )
    scaling_R, scaling_ns = (2, (256, 1024)) if quick else (8, (512, 2048, 8192))
    for n_s in scaling_ns:
        configs.append(
            Config(
                name=f"{device}-scaling-n{n_s}", group="scaling", device=device, dtype="float32",
                R=scaling_R, H=8, m=256, n=n_s, d=d, p=None,
                methods=["materialised"] + (["numpy_loop"] if on_cpu else []),
            )
        )
    if on_cpu:
        for m_s, n_s in ((32, 256),) if quick else ((64, 512), (256, 2048)):
            configs.append(
                Config(
                    name=f"cpu-statsmodels-m{m_s}-n{n_s}", group="statsmodels", device=device,
                    dtype="float64", R=1, H=1, m=m_s, n=n_s, d=d, p=None, methods=["statsmodels"],
                    kernel="gaussian", bandwidth=1.0,
                )
            )
    return configs


def memory_specs(device: str, quick: bool) -> list[dict]:
    R, H, m, n, d = (8, 8, 128, 512, 8) if quick else (64, 8, 256, 2048, 8)
    on_cpu = device == "cpu"
    specs = []
    for p in (None,) if quick else (None, d):
        methods = ["nw", "materialised"] + (["numpy_loop"] if on_cpu else [])
        if p == d:
            methods += ["mha", "mha_need_weights"]
        for method in methods:
            specs.append(dict(case="grid", method=method, device=device, dtype="float32",
                              R=R, H=H, m=m, n=n, d=d, p=p))
    large = ["nw"] if quick else ["nw", "materialised"] + (["numpy_loop"] if on_cpu else [])
    for method in large:
        specs.append(dict(case="large", method=method, device=device, dtype="float32",
                          R=1, H=1, m=16384, n=16384, d=d, p=None))
    return specs


def engine_specs(device: str, quick: bool) -> list[dict]:
    """Peak memory of the Monte Carlo engine against its chunk size and the replicate count.

    One head, D = 16, d_k = 8, m = n = 16384 (quick: 4096). A chunk-size sweep at a
    fixed number of replicates (chunk None: the engine's own choice under its default
    memory budget), and a replicate sweep at a fixed chunk size: memory bounded by
    chunking must level off in R.
    """
    try:
        from nwlib import simulate  # noqa: F401
    except ImportError:
        return []
    if quick:
        size, runs = 4096, [("chunk", 8, 1), ("chunk", 8, 4), ("replicates", 32, 4)]
    else:
        size = 16384
        runs = [("chunk", 64, c) for c in (1, 4, 16, None)]
        runs += [("replicates", R, 4) for R in (16, 128)]
    return [
        dict(case="engine", sweep=sweep, method="simulate", device=device, dtype="float32", R=R, H=1,
             D=16, d=8, m=size, n=size, chunk_size=c)
        for sweep, R, c in runs
    ]


def machine_info(devices: list[str]) -> dict:
    cpu_model, flags = platform.processor() or "unknown", []
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and cpu_model in ("unknown", platform.processor()):
                cpu_model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in present]
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
    info = {
        "cpu_model": cpu_model,
        "cpu_flags": flags,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": mem_total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "statsmodels": sm_version,
        "git_commit": commit or None,
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ},
    }
    if "cuda" in devices:
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def evaluate_targets(configs: list[Config], memory: list[dict]) -> list[dict]:
    targets = []
    grid = {c.name: c for c in configs if c.group == "grid"}
    target_cfg = grid.get("cpu-float32-scalar")
    if target_cfg is not None:
        for method, threshold in TARGETS.items():
            entry = target_cfg.results["methods"].get(method)
            if entry is None:
                continue
            targets.append({
                "id": f"speedup_vs_{method}",
                "description": f"nadaraya_watson at least {threshold:g}x faster than {METHODS[method]}",
                "config": target_cfg.name,
                "threshold": threshold,
                "ratio": entry["ratio_to_nw"],
                "paired_ratio": entry["paired_ratio_median"],
                "pass": entry["ratio_to_nw"] >= threshold,
            })
    for rec in memory:
        spec = rec["spec"]
        if spec["case"] == "large" and spec["method"] == "nw" and "peak_bytes" in rec:
            targets.append({
                "id": f"memory_nw_{spec['device']}",
                "description": "nadaraya_watson, m = n = 16384, one head: peak memory of the call under 1 GiB",
                "limit_bytes": GIB,
                "peak_bytes": rec["peak_bytes"],
                "pass": rec["peak_bytes"] < GIB,
            })
    engine = [r for r in memory if r["spec"]["case"] == "engine" and "peak_bytes" in r
              and r["spec"]["m"] == r["spec"]["n"] == 16384]
    if engine:
        worst = max(r["peak_bytes"] for r in engine)
        targets.append({
            "id": "memory_engine",
            "description": "Monte Carlo engine, m = n = 16384, one head: peak memory under 1 GiB at every chunk size tried",
            "limit_bytes": GIB,
            "peak_bytes": worst,
            "pass": worst < GIB,
        })
    return targets


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:9.1f} ms" if s < 10 else f"{s:9.2f} s "


def print_report(report: dict) -> None:
    print(f"\nnwlib benchmarks  ({report['machine']['cpu_model']}, {report['machine']['usable_cpus']} CPUs, "
          f"torch {report['machine']['torch']}, {report['date']}{', quick' if report['quick'] else ''})")
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
            print(f"  nw {r['nw_gflops']:.1f} GFLOP/s = {100 * r['nw_fraction_of_gemm']:.1f}% of GEMM "
                  f"{r['gemm_gflops']:.1f} GFLOP/s")
    if report["memory"]:
        print("\npeak memory of one call (fresh process each)")
        for rec in report["memory"]:
            s = rec["spec"]
            label = f"{s['case']:<7}{s['method']:<18}R={s['R']} H={s['H']} m={s['m']} n={s['n']}"
            if s["method"] == "simulate":
                label += f" chunk={rec.get('chunk_size_used', s['chunk_size'])}"
            value = f"{rec['peak_bytes'] / 2**20:10.1f} MiB" if "peak_bytes" in rec else f"  error: {rec.get('error')}"
            if "engine_bound_bytes" in rec:
                value += f"  (stated bound {rec['engine_bound_bytes'] / 2**20:.1f} MiB)"
            print(f"  {label:<62}{value}")
    print("\ntargets" + (" (quick run: small sizes, not the target configuration)" if report["quick"] else ""))
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "FAIL"
        if "ratio" in t:
            print(f"  {verdict}  {t['description']}: {t['ratio']:.2f}x (paired {t['paired_ratio']:.2f}x)")
        else:
            print(f"  {verdict}  {t['description']}: {t['peak_bytes'] / 2**20:.1f} MiB")
    if not report["quick"] and not any(t["id"] == "memory_engine" for t in report["targets"]):
        print("  (Monte Carlo engine not present: its memory bound was not measured)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the CPU, plus CUDA when available (default); cuda: CUDA only, skipped if absent")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per configuration (default 7; quick 3)")
    parser.add_argument("--pause", type=float, default=None,
                        help="seconds of idle before each timed call, so that one library's spinning "
                             "worker threads do not slow the next call (default 0.5; quick 0.25)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of calls within rounds")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"JSON result file (default {DEFAULT_OUTPUT.relative_to(ROOT)}; quick runs write none unless given)")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA requested but not available: GPU benchmarks skipped.")
        return 0
    devices = {"auto": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"], "cuda": ["cuda"]}[args.device]
    rounds = args.rounds or (3 if args.quick else 7)
    pause = args.pause if args.pause is not None else (0.25 if args.quick else 0.5)
    output = args.output if args.output is not None else (None if args.quick else DEFAULT_OUTPUT)
    rng = random.Random(args.seed)

    started = time.perf_counter()
    load_before = os.getloadavg()
    configs: list[Config] = []
    for device in devices:
        for cfg in build_configs(device, args.quick):
            print(f"timing {cfg.name} ...", flush=True)
            run_config(cfg, rounds, rng, pause)
            configs.append(cfg)
    memory = []
    if not args.no_memory:
        for device in devices:
            for spec in memory_specs(device, args.quick) + engine_specs(device, args.quick):
                print(f"memory {spec['case']} {spec['method']} {device} ...", flush=True)
                memory.append(measure_memory(spec))
    report = {
        "schema": SCHEMA,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.run"] + (argv if argv is not None else sys.argv[1:])),
        "quick": args.quick,
        "rounds": rounds,
        "pause_s": pause,
        "devices": devices,
        "machine": machine_info(devices),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "wall_time_s": time.perf_counter() - started,
        "methods": METHODS,
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
