"""The benchmark result file, read for the Performance appendix: summaries, tables and sentences.

Serves ``notebooks/appendix_performance.ipynb`` and its page ``book/performance.md`` (the speed
and memory targets of ``nadaraya_watson`` and of the Monte Carlo engine). It turns a result file
written by :mod:`benchmarks.run` (``benchmarks/results/latest.json``, schema :data:`SCHEMA`)
into the appendix's tables and glued values, recomputing every median, quartile, ratio, rate and
attainable time from the raw per-round timings and checking each against the summary the
benchmark stored (:class:`ResultFileError` when they disagree). It never runs a benchmark, and
reading a file imports neither torch nor nwlib (the tests against the target, in
:func:`machines_values`, use :mod:`nwlib.evidence`).

The parsed file (:func:`load`) is a dictionary with, among others, ``configs`` (timed
configurations: ``name``, ``group`` in ``"grid"``, ``"scaling"``, ``"statsmodels"``,
``"engine"``, the sizes ``R, H, m, n, d, p``, ``kernel`` and ``results["methods"][method]
["samples_s"]``, one time per round), ``memory`` (one record per memory case, measured in a
process of its own) and ``targets`` (the verdicts the benchmark stored).

Each section of the appendix comes as :class:`Values`: ``exact`` (settings, sizes, labels and
sentences, compared by ``make verify``) and ``measured`` (times, rates, peaks and facts of the
benchmark's machine: recorded, not compared).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "COLORS",
    "FULL_PROFILE_FILE",
    "FULL_PROFILE_TEXT_KEYS",
    "GAUSSIAN_CONFIG",
    "GIB",
    "LABELS",
    "MIB",
    "NOT_MEASURED",
    "RESULTS",
    "SCHEMA",
    "TARGET_CONFIG",
    "THRESHOLDS",
    "VECTOR_CONFIG",
    "EngineMemory",
    "ResultFileError",
    "Roofline",
    "Summary",
    "Values",
    "config_label",
    "configs_by_name",
    "context_values",
    "engine_memory",
    "engine_speed_values",
    "gauss_values",
    "load",
    "locate",
    "machine_values",
    "memory_record",
    "memory_table",
    "memory_values",
    "message_table",
    "other_machines",
    "peak_mib",
    "rates_table",
    "roofline",
    "roofline_table",
    "roofline_values",
    "ALL_RATES",
    "EXP_RATES",
    "LIMIT_TARGET",
    "Limit",
    "limit",
    "limit_table",
    "limit_values",
    "machine_runs",
    "machines_table",
    "machines_values",
    "exp_rates_table",
    "peers_table",
    "statsmodels_table",
    "statsmodels_values",
    "styled",
    "time_profile",
    "time_profile_table",
    "styled_time_profile",
    "full_profile",
    "full_profile_table",
    "full_profile_values",
    "summary",
    "target_values",
    "targets_table",
    "timings",
    "times_table",
]

SCHEMA = 2
"""The result-file schema :mod:`benchmarks.run` writes, the only one read here."""
MIB, GIB = 2**20, 2**30
RESULTS = Path(__file__).resolve().parent / "results"
"""Where ``make bench`` writes its result file and the other machines' observations are kept."""
NOT_MEASURED = "not measured in this result file"
TARGET_CONFIG = "cpu-float32-scalar"
"""The configuration of the speed targets (float32, scalar responses, exponential kernel, CPU)."""
GAUSSIAN_CONFIG = "cpu-float32-scalar-gaussian"
VECTOR_CONFIG = "cpu-float32-vector"
THRESHOLDS: dict[str, float] = {"materialised": 5.0, "numpy_loop": 4.0}
"""Speed targets at :data:`TARGET_CONFIG`: nadaraya_watson at least this many times faster."""
LABELS: dict[str, str] = {
    "nw": "nadaraya_watson",
    "materialised": "materialised softmax",
    "numpy_loop": "NumPy loop",
    "sdpa_unpadded": "SDPA, values of width 1 (unpadded)",
    "sdpa": "SDPA, values padded (nadaraya_watson's fallback)",
    "keops": "KeOps (pykeops)",
    "flex": "flex_attention, torch.compile",
    "inductor": "materialised softmax, torch.compile",
    "mha": "MultiheadAttention (need_weights=False)",
    "mha_need_weights": "MultiheadAttention (default call)",
    "statsmodels": "statsmodels KernelReg",
    "simulate": "nwlib.simulate (end to end)",
}
"""The implementations' names in tables, sentences and the figure."""
COLORS: dict[str, str] = {
    "nw": "C0",
    "materialised": "C1",
    "numpy_loop": "C2",
    "mha": "C3",
    "mha_need_weights": "C4",
    "statsmodels": "C5",
    "sdpa_unpadded": "C6",
    # the book's palette has seven colours (nwlib.book.FIGURE_COLOURS): the other peers in greys
    "sdpa": "#56B4E9",
    "keops": "0.35",
    "flex": "0.6",
    "inductor": "0.8",
}
"""The implementations' colours in the figure (also its order of bars)."""
RATES = ("gemm", "exp")  # the old roofline's machine rates (both needed for it)
# every machine-rate participant of a configuration: not implementations
ALL_RATES = ("gemm", "exp", "exp_l1", "exp_l1_sleef", "exp_l1_exp2", "mix_l1", "exp_torch_l1", "exp_torch_l2")
LIMIT_EXP_LOOPS = ("exp_l1", "exp_l1_exp2")
"""The L1 exp loops the limit takes the faster of: ATen's exp_u20 and nwlib's exp2 (``benchmarks/run.py``)."""
LIMIT_TARGET = 0.7
"""nadaraya_watson's target at :data:`TARGET_CONFIG`: at least this fraction of the same-run limit."""
INTERVAL_LEVEL = 0.95
"""Coverage of :func:`fraction_interval`: two-sided at ``nwlib.evidence.ALPHA`` (this module imports no
nwlib; ``tests/test_benchmarks_report.py`` keeps the two equal)."""
EXP_RATES: dict[str, str] = {
    "exp_l1": "ATen exp_u20 loop, 16 KiB per thread (L1)",
    "exp_l1_exp2": "nwlib exp2 loop (the fused kernel's), 16 KiB per thread (L1)",
    "mix_l1": "the kernel's arithmetic (exp2 and d + p multiply-adds), 16 KiB per thread",
    "exp_l1_sleef": "ATen exp (Sleef, 1 ulp) loop, 16 KiB per thread (L1)",
    "exp_torch_l1": "torch.exp(out=), 16 KiB (L1), one call at a time",
    "exp_torch_l2": "torch.exp(out=), 512 KiB (L2)",
    "exp": "torch.exp(out=), 4 MiB (the old roofline's rate)",
}
_REQUIRED = ("date", "quick", "rounds", "pause_s", "devices", "machine", "configs", "memory", "targets")
# Styler formats of the glued tables (column -> format).
_FORMATS: dict[str, dict[str, str]] = {
    "times": {"median (ms)": "{:.1f}", "ratio": "{:.2f}×", "paired": "{:.2f}×", "peak memory (MiB)": "{:.1f}"},
    "roofline": {
        "GEMM (GFLOP/s)": "{:.1f}",
        "exp (10⁹/s)": "{:.2f}",
        "GFLOP": "{:.2f}",
        "exps (10⁹)": "{:.3f}",
        "attainable (ms)": "{:.1f}",
        "measured (ms)": "{:.1f}",
        "fraction of attainable": "{:.0%}",
    },
    "rates": {"GEMM (GFLOP/s)": "{:.1f}", "nadaraya_watson (GFLOP/s)": "{:.1f}", "fraction of GEMM": "{:.1%}"},
    "memory": {"live peak (MiB)": "{:.1f}", "RSS rise (MiB)": "{:.1f}"},
    "statsmodels": {"nadaraya_watson (ms)": "{:.2f}", "statsmodels (ms)": "{:.1f}", "ratio": "{:.0f}×"},
    "limit": {
        "exp per core (10⁹/s)": "{:.2f}",
        "GEMM (GFLOP/s)": "{:.0f}",
        "GFLOP": "{:.2f}",
        "limit (ms)": "{:.1f}",
        "exp + flop time (ms)": "{:.1f}",
        "measured together (ms)": "{:.1f}",
        "nadaraya_watson (ms)": "{:.1f}",
        "fraction of limit": "{:.0%}",
        "fraction of the sum": "{:.0%}",
        "fraction of measured": "{:.0%}",
    },
    "exp_rates": {"10⁹ exps/s": "{:.2f}", "per thread (10⁹/s)": "{:.2f}"},
    "machines": {
        "load": "{:.2f}",
        "time (ms)": "{:.1f}",
        "limit (ms)": "{:.1f}",
        "fraction of limit": "{:.0%}",
        "SDPA ratio": "{:.2f}×",
        "KeOps ratio": "{:.1f}×",
    },
    "peers": {
        "median (ms)": "{:.1f}",
        "ratio": "{:.2f}×",
        "paired": "{:.2f}×",
        "fraction of limit": "{:.0%}",
        "first call (s)": "{:.1f}",
    },
}


class ResultFileError(ValueError):
    """The result file is not one :mod:`benchmarks.run` writes, or contradicts its own summaries."""


class Summary(NamedTuple):
    """One implementation's times in one configuration, recomputed from the per-round samples.

    Attributes
    ----------
    median_s, q1_s, q3_s : float
        Median and quartiles of the per-round times, seconds.
    ratio : float
        Median time over nadaraya_watson's median time in the same configuration.
    paired : float
        Median over rounds of the ratio of the two times taken in the same round.
    """

    median_s: float
    q1_s: float
    q3_s: float
    ratio: float
    paired: float


class Roofline(NamedTuple):
    """The attainable time of one nadaraya_watson call at the rates measured in the same rounds.

    Attributes
    ----------
    gemm, exp : float
        Machine rates: GEMM flop/s and torch.exp exponentials per second (medians over rounds).
    flops, exps : float
        The call's work: flops of its two matrix products and its exponentials.
    attainable_s : float
        ``max(flops / gemm, exps / exp)``, seconds.
    nw_s : float
        nadaraya_watson's median time, seconds.
    fraction : float
        ``attainable_s / nw_s``.
    limited_by : str
        ``"exponentials"`` or ``"matrix products"``, whichever bound is larger.
    simulate_s : float or None
        nwlib.simulate's median time where the configuration timed it.
    """

    gemm: float
    exp: float
    flops: float
    exps: float
    attainable_s: float
    nw_s: float
    fraction: float
    limited_by: str
    simulate_s: float | None


@dataclass(frozen=True)
class Values:
    """Glue values of one section of the appendix, by class.

    Attributes
    ----------
    exact : dict
        Settings, sizes, labels and sentences derived from the file (``make verify`` compares them).
    measured : dict
        Measurements and facts of the benchmark's machine (recorded with the build, not compared).
    """

    exact: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineMemory:
    """The Monte Carlo engine's memory cases against the bound it states (:func:`engine_memory`).

    Attributes
    ----------
    table : pandas.DataFrame
        One row per engine case that ran: sweep, kernel, H, R, ``m = n``, chunk, who chose it,
        live peak, RSS rise, bound and its parts (MiB), ``peak / bound``, ``within bound``.
    sweep : pandas.DataFrame
        The replicate sweep: rows of ``table`` at one caller-chosen chunk size (Gaussian kernel,
        one head), one per R, in increasing R.
    chunk : int
        That chunk size (0 where there is no such sweep).
    per_replicate_mib : float
        One replicate's training data, n × D float32 values, in MiB (NaN without engine cases).
    values : Values
    """

    table: pd.DataFrame
    sweep: pd.DataFrame
    chunk: int
    per_replicate_mib: float
    values: Values


# ------------------------------------------------------------------------------------------------------ the file


def locate(path: str | Path = "", name: str = "latest.json", *, results: str | Path | None = None) -> Path:
    """The result file to read: ``path`` if given, else ``results / name``.

    Parameters
    ----------
    path : str or Path, default ""
        An explicit file (the notebook parameter ``results_path``); "" for the default.
    name : str, default "latest.json"
        The file's name in ``results``.
    results : str or Path, optional
        The folder of result files; default :data:`RESULTS` (``benchmarks/results`` of this checkout).

    Returns
    -------
    Path

    Raises
    ------
    TypeError
        If ``path`` or ``name`` is not a string or path.
    FileNotFoundError
        If the file does not exist.
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty file name, got {name!r}")
    file = Path(path) if str(path) else Path(RESULTS if results is None else results) / name
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: run `make bench`, or set results_path")
    return file


def load(path: str | Path) -> dict[str, Any]:
    """Read and check a result file of schema :data:`SCHEMA`.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        The parsed file.

    Raises
    ------
    ResultFileError
        If the file has another schema, lacks a top-level field the appendix reads, or has no
        timed configuration of the group ``"grid"``.
    """
    report = json.loads(Path(path).read_text())
    if not isinstance(report, dict):
        raise ResultFileError(f"{path}: a result file is a JSON object, got {type(report).__name__}")
    if report.get("schema") != SCHEMA:
        raise ResultFileError(
            f"{path}: result-file schema {report.get('schema')!r}, but only schema {SCHEMA} is read "
            "(rerun make bench with this checkout)"
        )
    missing = [key for key in _REQUIRED if key not in report]
    if missing:
        raise ResultFileError(f"{path}: the result file lacks {', '.join(missing)}")
    if not any(c["group"] == "grid" for c in report["configs"]):
        raise ResultFileError(f"{path}: the result file has no configuration of the main grid")
    return report


def other_machines(path: str | Path = "") -> list[dict[str, Any]]:
    """The recorded observations of other machines (``other_machines.json``); [] if there is no file."""
    try:
        return list(json.loads(locate(path, "other_machines.json").read_text())["observations"])
    except FileNotFoundError:
        return []


def configs_by_name(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The timed configurations by name."""
    return {c["name"]: c for c in report["configs"]}


def _kernel(cfg: Mapping[str, Any]) -> str:
    return str(cfg["kernel"])


def _responses(p: int | None) -> str:
    return "scalar" if p is None else f"vector (p={p})"


def config_label(cfg: Mapping[str, Any], *, short: bool = False) -> str:
    """A configuration's name in tables (``short``: in the figure's tick labels).

    Examples
    --------
    >>> cfg = {"group": "grid", "dtype": "float32", "p": None, "kernel": "exp"}
    >>> config_label(cfg), config_label(cfg, short=True)
    ('float32, scalar, exp', 'f32 scalar\\nexp')
    """
    if cfg["group"] == "engine":
        if short:
            return f"engine H={cfg['H']}"
        return f"engine shapes (H = {cfg['H']}, d_k = {cfg['d']}, n = {cfg['n']}, m = {cfg['m']})"
    responses = "scalar" if cfg["p"] is None else "vector"
    if short:
        return f"{cfg['dtype'].replace('float', 'f')} {responses}\n{_kernel(cfg)}"
    return f"{cfg['dtype']}, {responses}, {_kernel(cfg)}"


# --------------------------------------------------------------------------------------------------------- times


def summary(cfg: Mapping[str, Any], method: str) -> Summary:
    """Median, quartiles and ratios to nadaraya_watson of one implementation in one configuration.

    Parameters
    ----------
    cfg : dict
        A configuration of the result file; ``cfg["results"]["methods"]`` holds ``"nw"`` and
        ``method``, each with ``samples_s`` (one time per round, rounds aligned).
    method : str
        The implementation (``"nw"``, ``"materialised"``, ``"numpy_loop"``, ...).

    Returns
    -------
    Summary

    Raises
    ------
    KeyError
        If the configuration did not time ``method``.
    ResultFileError
        If the recomputed median, ratio or paired ratio differs from the one the file stored.
    """
    methods = cfg["results"]["methods"]
    if method not in methods:
        raise KeyError(f"configuration {cfg['name']!r} did not time method {method!r}")
    entry = methods[method]
    ts = np.asarray(entry["samples_s"], dtype=float)
    nw = np.asarray(methods["nw"]["samples_s"], dtype=float)
    if ts.shape != nw.shape or ts.ndim != 1 or not len(ts):
        raise ResultFileError(f"{cfg['name']}/{method}: samples_s must align with nadaraya_watson's rounds")
    q1, med, q3 = (float(q) for q in np.quantile(ts, [0.25, 0.5, 0.75]))
    out = Summary(med, q1, q3, med / float(np.median(nw)), float(np.median(ts / nw)))
    stored = [(med, entry["median_s"], "median")]
    if "ratio_to_nw" in entry:
        stored += [(out.ratio, entry["ratio_to_nw"], "ratio"), (out.paired, entry["paired_ratio_median"], "paired")]
    for got, want, what in stored:
        if not np.isclose(got, want):
            raise ResultFileError(f"{cfg['name']}/{method}: recomputed {what} {got:.6g} but the file stores {want:.6g}")
    return out


def _timed(report: Mapping[str, Any], group: str | None) -> Iterator[tuple[dict[str, Any], str, Summary]]:
    for cfg in report["configs"]:
        if group is None or cfg["group"] == group:
            for method in cfg["results"]["methods"]:
                if method not in ALL_RATES:
                    yield cfg, method, summary(cfg, method)


def timings(report: Mapping[str, Any], group: str | None = None) -> pd.DataFrame:
    """Every timed implementation of every configuration (of ``group``), recomputed from the rounds.

    Returns
    -------
    pandas.DataFrame
        One row per (configuration, implementation), machine rates excluded, in file order:
        ``config``, ``group``, ``device``, ``kernel``, ``dtype``, ``p``, ``R``, ``H``, ``m``, ``n``,
        ``d``, ``method`` and the fields of :class:`Summary`.
    """
    sizes = ("device", "kernel", "dtype", "p", "R", "H", "m", "n", "d")
    rows = [
        {"config": cfg["name"], "group": cfg["group"], **{k: cfg[k] for k in sizes}, "method": method, **s._asdict()}
        for cfg, method, s in _timed(report, group)
    ]
    table = pd.DataFrame(rows, columns=["config", "group", *sizes, "method", *Summary._fields])
    table["p"] = pd.Series([r["p"] for r in rows], dtype=object)  # None for scalar responses, not NaN
    return table


def times_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """The appendix's table of the main grid: medians, quartiles, ratios and one call's peak memory."""
    rows = [
        {
            "device": cfg["device"],
            "kernel": cfg["kernel"],
            "dtype": cfg["dtype"],
            "responses": _responses(cfg["p"]),
            "implementation": LABELS[method],
            "median (ms)": s.median_s * 1e3,
            "IQR (ms)": f"{s.q1_s * 1e3:.1f} – {s.q3_s * 1e3:.1f}",
            "ratio": s.ratio,
            "paired": s.paired,
            "peak memory (MiB)": peak_mib(
                report, "grid", method, device=cfg["device"], dtype=cfg["dtype"], p=cfg["p"], kernel=cfg["kernel"]
            ),
        }
        for cfg, method, s in _timed(report, "grid")
    ]
    return pd.DataFrame(rows)


def _grid0(report: Mapping[str, Any]) -> dict[str, Any]:
    return next(c for c in report["configs"] if c["group"] == "grid")


def machine_values(report: Mapping[str, Any]) -> Values:
    """The run and the machine that measured it (the appendix's first paragraph)."""
    machine = report["machine"]
    results = configs_by_name(report).get(TARGET_CONFIG, {}).get("results", {})
    control = results.get("control")  # nadaraya_watson timed right after the NumPy loop, without the pause
    kind = "a quick smoke run at small sizes (rerun make bench before quoting it)" if report["quick"] else "a full run"
    if report.get("only"):
        kind += f", restricted to the cases matching {report['only']!r}"
    grid0 = _grid0(report)
    exact = {
        "bench_rounds": str(report["rounds"]),
        "bench_pause": float(report["pause_s"]),  # a setting of the run
        "bench_kind": kind,
        "grid_size": f"R = {grid0['R']} replicates × H = {grid0['H']} heads, m = {grid0['m']}, "
        f"n = {grid0['n']}, d = {grid0['d']}",
    }
    measured = {
        "bench_date": report["date"].replace("T", " ")[:16] + " UTC",
        "bench_cpu_model": machine["cpu_model"],
        "bench_cpu_flags": ", ".join(machine["cpu_flags"]) or "none of AVX2/FMA/AVX-512/AMX",
        "bench_cpu_capability": machine["cpu_capability"] or "not recorded in this result file",
        "bench_cpus": str(machine["usable_cpus"]),
        "bench_threads": str(machine["torch_threads"]),
        "bench_memory_gib": machine["memory_bytes"] / GIB if machine["memory_bytes"] else math.nan,
        "bench_torch": machine["torch"],
        "bench_numpy": machine["numpy"],
        "bench_numpy_blas": machine["numpy_blas"] or "not recorded",
        "bench_statsmodels": str(machine["statsmodels"]),
        "bench_python": machine["python"],
        "control_back_to_back_ms": 1e3 * float(np.median(control["samples_s"])) if control else math.nan,
        "control_after_pause_ms": 1e3 * float(np.median(results["methods"]["nw"]["samples_s"]))
        if control
        else math.nan,
        "bench_load_before": float(report["load_average_before"][0]),
        "bench_load_after": float(report["load_average_after"][0]),
        "bench_wall_min": report["wall_time_s"] / 60,
        "bench_devices": ", ".join(report["devices"]),
        "bench_cuda": machine.get("cuda_device", "no CUDA device: the GPU path was skipped"),
    }
    return Values(exact, measured)


def targets_table(report: Mapping[str, Any], thresholds: Mapping[str, float] = THRESHOLDS) -> pd.DataFrame:
    """The speed targets at :data:`TARGET_CONFIG`: ratio, paired ratio, threshold and whether it holds.

    Returns
    -------
    pandas.DataFrame
        Indexed by method: ``implementation``, ``threshold``, ``ratio``, ``paired`` (NaN where not
        measured), ``holds`` (False where not measured) and ``measured``.

    Raises
    ------
    ResultFileError
        If a verdict recomputed from the rounds differs from the one the benchmark stored for the
        same threshold.
    """
    cfg = configs_by_name(report).get(TARGET_CONFIG)
    stored = {t["id"]: t for t in report["targets"]}
    rows = {}
    for method, threshold in thresholds.items():
        row = {
            "implementation": LABELS[method],
            "threshold": float(threshold),
            "ratio": math.nan,
            "paired": math.nan,
            "holds": False,
            "measured": False,
        }
        if cfg is not None and method in cfg["results"]["methods"]:
            s = summary(cfg, method)
            row.update(ratio=s.ratio, paired=s.paired, holds=bool(s.ratio >= threshold), measured=True)
            verdict = stored[f"speedup_vs_{method}"]
            if verdict["threshold"] == threshold and verdict["pass"] != row["holds"]:
                raise ResultFileError(f"target speedup_vs_{method}: the file's verdict differs from its timings")
        rows[method] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def target_values(report: Mapping[str, Any], thresholds: Mapping[str, float] = THRESHOLDS) -> Values:
    """The speed targets' thresholds, ratios and verdicts, the spreads and the size they were measured at."""
    table = targets_table(report, thresholds)
    exact: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for method, row in table.iterrows():
        exact[f"target_{method}_threshold"] = row["threshold"]
        measured[f"target_{method}_ratio"] = row["ratio"]
        measured[f"target_{method}_paired"] = row["paired"]
        verdict = ("holds" if row["holds"] else "does not hold") if row["measured"] else "was not measured"
        exact[f"target_{method}_verdict"] = verdict
    cfg = configs_by_name(report).get(TARGET_CONFIG)
    if cfg is not None:
        spread = {m: summary(cfg, m) for m in ("nw", *thresholds) if m in cfg["results"]["methods"]}
        exact["target_spread"] = ", ".join(
            f"{LABELS[m]} {100 * (x.q3_s - x.q1_s) / x.median_s:.0f}%" for m, x in spread.items()
        )
    else:
        exact["target_spread"] = "not measured"
    t = cfg or _grid0(report)
    exact["target_size"] = f"R = {t['R']}, H = {t['H']}, m = {t['m']}, n = {t['n']}, d_k = {t['d']}"
    exact["targets_verdict"] = "Both speed targets hold" if table["holds"].all() else "Not every speed target holds"
    return Values(exact, measured)


# ------------------------------------------------------------------------------------------------------ roofline


def roofline(cfg: Mapping[str, Any]) -> Roofline | None:
    """nadaraya_watson's attainable time in ``cfg`` at the GEMM and exp rates of the same rounds.

    Returns
    -------
    Roofline or None
        None where the configuration did not measure both machine rates.

    Raises
    ------
    ResultFileError
        If the recomputed fraction or attainable time differs from the one the file stored.
    """
    r = cfg["results"]
    if not set(RATES) <= set(r["methods"]):
        return None
    gemm = r["gemm_flops"] / float(np.median(r["methods"]["gemm"]["samples_s"]))
    exp = r["exp_count"] / float(np.median(r["methods"]["exp"]["samples_s"]))
    flops, exps = float(r["nw_flops"]), float(r["nw_exps"])
    attainable = max(flops / gemm, exps / exp)
    nw = summary(cfg, "nw").median_s
    limited = "exponentials" if exps / exp >= flops / gemm else "matrix products"
    simulate = summary(cfg, "simulate").median_s if "simulate" in r["methods"] else None
    out = Roofline(gemm, exp, flops, exps, attainable, nw, attainable / nw, limited, simulate)
    stored = r["roofline"]
    if not (np.isclose(out.fraction, stored["fraction"]) and np.isclose(attainable, stored["attainable_s"])):
        raise ResultFileError(f"{cfg['name']}: the recomputed roofline differs from the one the file stores")
    return out


def roofline_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """Measured against attainable time, one row per timed call (nadaraya_watson, simulate) and configuration.

    The column ``short`` is the figure's tick label; the glued table drops it.
    """
    rows = []
    for cfg in report["configs"]:
        rf = roofline(cfg)
        if rf is None:
            continue
        timed = [("nadaraya_watson", rf.nw_s)] + ([("simulate", rf.simulate_s)] if rf.simulate_s is not None else [])
        for who, seconds in timed:
            rows.append(
                {
                    "configuration": config_label(cfg),
                    "call": who,
                    "short": config_label(cfg, short=True),
                    "GEMM (GFLOP/s)": rf.gemm / 1e9,
                    "exp (10⁹/s)": rf.exp / 1e9,
                    "GFLOP": rf.flops / 1e9,
                    "exps (10⁹)": rf.exps / 1e9,
                    "attainable (ms)": rf.attainable_s * 1e3,
                    "limited by": rf.limited_by,
                    "measured (ms)": seconds * 1e3,
                    "fraction of attainable": rf.attainable_s / seconds,
                }
            )
    return pd.DataFrame(rows)


def rates_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """Flop rates: the GEMM's and nadaraya_watson's (products only), per configuration that measured them."""
    rows = [
        {
            "device": cfg["device"],
            "configuration": config_label(cfg),
            "GEMM (GFLOP/s)": cfg["results"]["gemm_gflops"],
            "nadaraya_watson (GFLOP/s)": cfg["results"]["nw_gflops"],
            "fraction of GEMM": cfg["results"]["nw_fraction_of_gemm"],
        }
        for cfg in report["configs"]
        if "gemm_gflops" in cfg["results"]
    ]
    return pd.DataFrame(rows)


def roofline_values(report: Mapping[str, Any]) -> Values:
    """The roofline sentence (exact) and the target configuration's flop rates (measured)."""
    cfgs = configs_by_name(report)
    target = roofline(cfgs[TARGET_CONFIG]) if TARGET_CONFIG in cfgs else None
    gauss = roofline(cfgs[GAUSSIAN_CONFIG]) if GAUSSIAN_CONFIG in cfgs else None
    if target:
        sentence = (
            f"At the target configuration the GEMM ran at {target.gemm / 1e9:.0f} GFLOP/s and torch.exp at "
            f"{target.exp / 1e9:.2f} billion exponentials per second. One call's "
            f"{target.flops / 1e9:.1f} GFLOP and {target.exps / 1e6:.0f} million exponentials therefore "
            f"need at least {target.attainable_s * 1e3:.0f} ms, bounded by the {target.limited_by}; "
            f"nadaraya_watson took {target.nw_s * 1e3:.0f} ms, {target.fraction:.0%} of the attainable rate"
        )
        if target.fraction > 1:
            sentence += " (above 100%: the GEMM or exp rate was measured while other work slowed it)"
        if gauss:
            sentence += f" ({gauss.fraction:.0%} with the Gaussian kernel, {gauss.nw_s * 1e3:.0f} ms)"
        sentence += "."
    else:
        sentence = f"The machine rates at the target configuration were {NOT_MEASURED}."
    r = cfgs[TARGET_CONFIG]["results"] if TARGET_CONFIG in cfgs else {}
    measured = {
        "gemm_gflops": r.get("gemm_gflops", math.nan),
        "nw_gflops": r.get("nw_gflops", math.nan),
        "nw_fraction_pct": 100 * r.get("nw_fraction_of_gemm", math.nan),
    }
    return Values({"roof_sentence": sentence}, measured)


# ------------------------------------------------------------------------------------------------ the limit


class Limit(NamedTuple):
    """The machine's limit for one nadaraya_watson call, at the rates measured in the same rounds.

    Attributes
    ----------
    exp_rate, exp_rate_per_core : float
        Exponentials per second of the faster L1 exp loop (:data:`LIMIT_EXP_LOOPS`) on every
        thread, and per thread (one thread per core here).
    exp_source : str
        Which loop that was (``"exp_l1"``: ATen's exp_u20; ``"exp_l1_exp2"``: nwlib's exp2).
    threads : int
    gemm : float
        A large GEMM's flop/s.
    exps, flops : float
        One call's exponentials (R·H·m·n) and the fused kernel's flops (2·R·H·m·n·(d + p)).
    exp_s, flop_s, limit_s, limit_sum_s : float
        ``exps / exp_rate``, ``flops / gemm``, their maximum (the bound if the two overlapped
        perfectly) and their sum (if they cannot overlap), seconds.
    mix_s : float
        The call's arithmetic measured together (``mix_l1``: one exp2 and d + p multiply-adds per
        exponential, L1-resident, every thread), scaled to the call; NaN where not measured.
    limited_by : str
        ``"exponentials"`` or ``"matrix products"`` (of the maximum).
    fractions, fractions_of_sum, fractions_of_mix : dict
        Implementation -> ``limit_s``, ``limit_sum_s`` and ``mix_s`` over its median time.
    """

    exp_rate: float
    exp_rate_per_core: float
    exp_source: str
    threads: int
    gemm: float
    exps: float
    flops: float
    exp_s: float
    flop_s: float
    limit_s: float
    limit_sum_s: float
    mix_s: float
    limited_by: str
    fractions: dict[str, float]
    fractions_of_sum: dict[str, float]
    fractions_of_mix: dict[str, float]

    @property
    def judged_s(self) -> float:
        """The limit the target is judged on: the measured one where there is one, else the maximum."""
        return self.limit_s if math.isnan(self.mix_s) else self.mix_s

    @property
    def judged(self) -> dict[str, float]:
        """The fractions of :attr:`judged_s`."""
        return self.fractions if math.isnan(self.mix_s) else self.fractions_of_mix


def limit(cfg: Mapping[str, Any]) -> Limit | None:
    """The limit of ``cfg`` recomputed from the rounds (None where no L1 exp rate or no GEMM was timed).

    Raises
    ------
    ResultFileError
        If the recomputed limit or nadaraya_watson's fraction differs from what the file stored.
    """
    r = cfg["results"]
    loops = [loop for loop in LIMIT_EXP_LOOPS if loop in r["methods"]]
    if not loops or "gemm" not in r["methods"] or "limit" not in r:
        return None
    rates = {loop: r[f"{loop}_count"] / float(np.median(r["methods"][loop]["samples_s"])) for loop in loops}
    source = max(rates, key=rates.__getitem__)
    exp_rate = rates[source]
    gemm = r["gemm_flops"] / float(np.median(r["methods"]["gemm"]["samples_s"]))
    stored = r["limit"]
    exps, flops = float(stored["exps"]), float(stored["flops"])
    exp_s, flop_s = exps / exp_rate, flops / gemm
    lim = max(exp_s, flop_s)
    mix_s = math.nan
    if "mix_l1" in r["methods"]:
        mix_s = exps * float(np.median(r["methods"]["mix_l1"]["samples_s"])) / r["mix_l1_count"]
    fractions, of_sum, of_mix = {}, {}, {}
    for method in stored["fractions"]:
        med = float(np.median(r["methods"][method]["samples_s"]))
        fractions[method], of_sum[method], of_mix[method] = lim / med, (exp_s + flop_s) / med, mix_s / med
    nw_fraction = stored["fractions"]["nw"]["fraction"]
    consistent = np.isclose(lim, stored["limit_s"]) and np.isclose(fractions["nw"], nw_fraction)
    if "limit_mix_s" in stored:
        consistent = consistent and np.isclose(mix_s, stored["limit_mix_s"])
    if not consistent:
        raise ResultFileError(f"{cfg['name']}: the recomputed limit differs from the one the file stores")
    threads = int(stored["threads"])
    limited = "exponentials" if exp_s >= flop_s else "matrix products"
    return Limit(
        exp_rate, exp_rate / threads, source, threads, gemm, exps, flops, exp_s, flop_s, lim, exp_s + flop_s, mix_s,
        limited, fractions, of_sum, of_mix,
    )  # fmt: skip


def limit_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """One row per configuration that measured the limit: the rates, the work, the limit, nadaraya_watson's fraction.

    Twelve columns, the most a PDF page takes (``book/_ext/latex_glue.py``): the thread count and
    one call's exponentials, the same in every configuration, are in :func:`limit_values`' sentence.
    """
    rows = []
    for cfg in report["configs"]:
        lim = limit(cfg)
        if lim is None:
            continue
        rows.append(
            {
                "configuration": config_label(cfg),
                "exp per core (10⁹/s)": lim.exp_rate_per_core / 1e9,
                "GEMM (GFLOP/s)": lim.gemm / 1e9,
                "GFLOP": lim.flops / 1e9,
                "limit (ms)": lim.limit_s * 1e3,
                "limited by": lim.limited_by,
                "exp + flop time (ms)": lim.limit_sum_s * 1e3,
                "measured together (ms)": lim.mix_s * 1e3,
                "nadaraya_watson (ms)": summary(cfg, "nw").median_s * 1e3,
                "fraction of limit": lim.fractions["nw"],
                "fraction of the sum": lim.fractions_of_sum["nw"],
                "fraction of measured": lim.fractions_of_mix["nw"],
            }
        )
    return pd.DataFrame(rows)


def exp_rates_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """The exp rates timed at :data:`TARGET_CONFIG`, in exponentials per second (all threads, and per thread)."""
    cfg = configs_by_name(report).get(TARGET_CONFIG)
    rows = []
    if cfg is None:
        return pd.DataFrame(rows)
    r = cfg["results"]
    threads = int(r.get("exp_l1_threads", report["machine"]["torch_threads"]))
    for method, label in EXP_RATES.items():
        if method not in r["methods"]:
            continue
        count = r["exp_count"] if method == "exp" else r[f"{method}_count"]
        rate = count / float(np.median(r["methods"][method]["samples_s"]))
        # torch.exp splits buffers above ATen's grain (32768 elements) over the threads: L2 and 4 MiB
        on = 1 if method == "exp_torch_l1" else threads
        rows.append({"exp": label, "threads": on, "10⁹ exps/s": rate / 1e9, "per thread (10⁹/s)": rate / on / 1e9})
    return pd.DataFrame(rows)


def peers_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """Every implementation at :data:`TARGET_CONFIG`: time, ratio to nadaraya_watson, fraction of the limit,
    first call (compile included), and the peers the run skipped, saying why."""
    cfg = configs_by_name(report).get(TARGET_CONFIG)
    if cfg is None:
        return pd.DataFrame([])
    r = cfg["results"]
    lim = limit(cfg)
    rows = []
    for method in r["methods"]:
        if method in ALL_RATES:
            continue
        s = summary(cfg, method)
        rows.append(
            {
                "implementation": LABELS.get(method, method),
                "median (ms)": s.median_s * 1e3,
                "ratio": s.ratio,
                "paired": s.paired,
                "fraction of limit": lim.judged.get(method, math.nan) if lim else math.nan,
                "first call (s)": float(r.get("first_call_s", {}).get(method, math.nan)),
                "note": "",
            }
        )
    for method, why in r.get("skipped", {}).items():
        nan = math.nan
        row = {"median (ms)": nan, "ratio": nan, "paired": nan, "fraction of limit": nan, "first call (s)": nan}
        rows.append({"implementation": LABELS.get(method, method), **row, "note": f"skipped: {why}"})
    return pd.DataFrame(rows)


def limit_values(report: Mapping[str, Any]) -> Values:
    """The limit's sentence and verdict (exact, from the file) and its numbers (measured)."""
    cfgs = configs_by_name(report)
    cfg = cfgs.get(TARGET_CONFIG)
    lim = limit(cfg) if cfg else None
    machine = report["machine"]
    isa = machine.get("isa") or "not recorded"
    fused = machine.get("fused_kernel") or {}
    measured: dict[str, Any] = {
        "limit_isa": isa,
        "limit_fused_built": "built" if fused.get("built") else f"not built ({fused.get('error')})",
        "limit_load_before": float(report["load_average_before"][0]),
    }
    exact: dict[str, Any] = {"limit_target_pct": 100 * LIMIT_TARGET}
    if lim is None:
        exact["limit_sentence"] = f"The limit at the target configuration was {NOT_MEASURED}."
        exact["limit_verdict"] = "was not measured"
        return Values(exact, measured)
    nw = lim.judged["nw"]
    first = cfg["results"].get("first_call_s", {})
    exact["limit_verdict"] = "is met" if nw >= LIMIT_TARGET else "is not met"
    source = {"exp_l1": "ATen's exp_u20", "exp_l1_exp2": "nwlib's exp2, the fused kernel's own"}[lim.exp_source]
    sentence = (
        f"On this {isa} machine the best exp available to torch ({source}, on an L1-resident "
        f"buffer) ran at {lim.exp_rate_per_core / 1e9:.2f} billion exponentials per second per core, "
        f"{lim.exp_rate / 1e9:.2f} billion on {lim.threads} threads, and the GEMM at {lim.gemm / 1e9:.0f} GFLOP/s. "
        f"One call's {lim.exps / 1e6:.0f} million exponentials and {lim.flops / 1e9:.1f} GFLOP therefore need "
        f"at least {lim.limit_s * 1e3:.0f} ms if the two overlap perfectly (bounded by the {lim.limited_by}), "
        f"or {lim.limit_sum_s * 1e3:.0f} ms if they cannot overlap"
    )
    sdpa = f" (SDPA: {lim.judged['sdpa']:.0%})" if "sdpa" in lim.judged else ""
    took = f"nadaraya_watson took {summary(cfg, 'nw').median_s * 1e3:.0f} ms"
    if math.isnan(lim.mix_s):
        sentence += f"; {took}: {nw:.0%} of the limit and {lim.fractions_of_sum['nw']:.0%} of the sum{sdpa}."
    else:
        sentence += (
            f". Run together, as the kernel runs them (one exp2 and {cfg['results']['mix_l1_fmas']} multiply-adds "
            f"per exponential, data in L1, every thread), they took {lim.mix_s * 1e3:.0f} ms, "
            f"{lim.mix_s / lim.limit_sum_s:.0%} of the sum: the same-run limit. {took}: {nw:.0%} of that limit"
            f"{sdpa}, {lim.fractions['nw']:.0%} of the maximum and {lim.fractions_of_sum['nw']:.0%} of the sum."
        )
    exact["limit_sentence"] = sentence
    measured |= {
        "limit_exp_per_core": lim.exp_rate_per_core / 1e9,
        "limit_ms": lim.limit_s * 1e3,
        "limit_sum_ms": lim.limit_sum_s * 1e3,
        "limit_fraction_pct": 100 * nw,
        "limit_fraction_max_pct": 100 * lim.fractions["nw"],
        "limit_mix_ms": lim.mix_s * 1e3,
        "limit_mix_of_sum_pct": 100 * lim.mix_s / lim.limit_sum_s,
        "limit_fraction_sum_pct": 100 * lim.fractions_of_sum["nw"],
        "limit_gap_pct": 100 * (LIMIT_TARGET - nw),
        "limit_sdpa_fraction_pct": 100 * lim.judged.get("sdpa", math.nan),
        "limit_keops_first_call_s": float(first.get("keops", math.nan)),
        "limit_flex_first_call_s": float(first.get("flex", math.nan)),
        "limit_inductor_first_call_s": float(first.get("inductor", math.nan)),
        "limit_fused_build_s": float(fused.get("build_or_load_s") or math.nan),
    }
    for method in ("sdpa", "keops", "flex", "inductor"):
        measured[f"limit_{method}_ratio"] = (
            summary(cfg, method).ratio if method in cfg["results"]["methods"] else math.nan
        )
    return Values(exact, measured)


MACHINES_DIR = "machines"
"""The folder under :data:`RESULTS` of result files of the target configuration from other machines."""


def machine_runs(path: str | Path = "") -> list[dict[str, Any]]:
    """The result files of other machines (``benchmarks/results/machines/*.json``), each read by :func:`load`.

    Each is what ``python -m benchmarks.run --only '^cpu-float32-scalar$' --no-memory --output ...``
    wrote on one machine (or under one ``ATEN_CPU_CAPABILITY``), committed as it came.

    Parameters
    ----------
    path : str or Path, default ""
        The folder; "" for :data:`RESULTS` / ``machines``. A folder that does not exist holds no runs.

    Returns
    -------
    list of dict
        The files, oldest first.

    Raises
    ------
    TypeError
        If ``path`` is not a string or path.
    ResultFileError
        If a file is not a result file (:func:`load`).
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    folder = Path(path) if str(path) else RESULTS / MACHINES_DIR
    if not folder.is_dir():
        return []
    return sorted((load(f) for f in sorted(folder.glob("*.json"))), key=lambda r: r["date"])


def _machine_label(machine: Mapping[str, Any]) -> str:
    """The CPU as a reader can look it up: model name, family and model numbers where recorded, AMX."""
    label = short_machine(machine["cpu_model"])
    if machine.get("cpu_family") is not None:
        label += f" (family {machine['cpu_family']}, model {machine['cpu_model_number']})"
    return label + (", AMX" if "amx_tile" in machine.get("cpu_flags", ()) else "")


def _kernel_isa(machine: Mapping[str, Any]) -> str:
    """The instruction set the fused kernel was built for; "(lowered)" where it is below the CPU's own
    (``ATEN_CPU_CAPABILITY`` set lower than the CPU's flags allow)."""
    fused = machine.get("fused_kernel") or {}
    built = {"AVX512": "AVX-512", "AVX2": "AVX2"}.get(fused.get("capability") or "", "none")
    lowered = built == "AVX2" and machine.get("isa") == "AVX-512"
    return f"{built} (lowered)" if lowered else built  # the word, not the setting: a PDF column breaks at spaces


def _table_runs(report: Mapping[str, Any], runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The result files :func:`machines_table` shows: those that measured the limit, one per ``date``."""
    out, seen = [], set()
    for rep in (report, *runs):
        cfg = configs_by_name(rep).get(TARGET_CONFIG)
        if cfg is None or limit(cfg) is None or rep["date"] in seen:
            continue
        seen.add(rep["date"])
        out.append(rep)
    return out


def _log_fractions(cfg: Mapping[str, Any], method: str = "nw") -> np.ndarray | None:
    """The logarithms of ``method``'s fraction of the limit, one per round (None: limit not measured together)."""
    r = cfg["results"]
    if "mix_l1" not in r["methods"] or "limit" not in r:
        return None
    mix = np.asarray(r["methods"]["mix_l1"]["samples_s"], dtype=float) * float(r["limit"]["exps"]) / r["mix_l1_count"]
    return np.log(mix / np.asarray(r["methods"][method]["samples_s"], dtype=float))


def fraction_interval(cfg: Mapping[str, Any], method: str = "nw") -> tuple[float, float, float]:
    """``method``'s fraction of the measured limit round by round: geometric mean and interval.

    In round i the arithmetic measured together (``mix_l1``, scaled to one call's exponentials) and
    ``method`` ran under the same conditions, in shuffled order; their ratio is the round's fraction.
    The interval is the mean of the log fractions ± Student's t quantile (``rounds - 1`` degrees of
    freedom, two-sided at :data:`INTERVAL_LEVEL`) times its standard error, exponentiated: how well
    the rounds pin the fraction down, which the ratio of medians (:func:`limit`) does not say.

    Returns
    -------
    (float, float, float)
        Geometric mean, lower and upper end; NaNs where the limit was not measured together.
    """
    logs = _log_fractions(cfg, method)
    if logs is None or not len(logs):
        return (math.nan, math.nan, math.nan)
    if len(logs) < 2:  # one round: no spread to estimate
        return (math.exp(float(logs[0])), math.nan, math.nan)
    from scipy.stats import t

    half = float(t.ppf(0.5 + INTERVAL_LEVEL / 2, len(logs) - 1)) * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
    centre = float(np.mean(logs))
    return (math.exp(centre), math.exp(centre - half), math.exp(centre + half))


def _against_target(logs: Sequence[np.ndarray]) -> tuple[list[bool], list[bool], float]:
    """Which runs lie below, and which above, :data:`LIMIT_TARGET`: one-sided t tests, Holm across the runs.

    Each run's rounds give the mean of their log fractions minus log(target) with its standard error
    (``rounds - 1`` degrees of freedom); :func:`nwlib.evidence.significant` decides at
    :data:`nwlib.evidence.ALPHA` with Holm's correction over the runs, the book's standard.
    """
    import torch  # here, not at the top: reading a result file needs neither torch nor nwlib

    from nwlib import evidence

    comps = [evidence.mean(torch.as_tensor(x - math.log(LIMIT_TARGET), dtype=torch.float64)) for x in logs]
    below = evidence.significant(comps, alternative="less")
    return below, evidence.significant(comps, alternative="greater"), evidence.ALPHA


def machines_table(report: Mapping[str, Any], runs: Iterable[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """The target configuration's limit on every machine measured: this result file first, then ``runs``.

    One row per result file that measured the same-run limit (:func:`limit`), recomputed from its
    rounds; a run with the same ``date`` as ``report`` is the same run and is not repeated.

    Parameters
    ----------
    report : dict
        The appendix's result file (``latest.json``).
    runs : iterable of dict
        Other machines' result files (:func:`machine_runs`).
    """
    rows = []
    for rep in _table_runs(report, runs):
        cfg = configs_by_name(rep)[TARGET_CONFIG]
        lim = limit(cfg)
        methods = cfg["results"]["methods"]
        machine = rep["machine"]
        rows.append(
            {
                "machine": f"{_machine_label(machine)}, {int(lim.threads)} threads",
                "kernel": _kernel_isa(machine),
                "date": rep["date"][:10],
                "load": float(rep["load_average_before"][0]),
                "time (ms)": summary(cfg, "nw").median_s * 1e3,
                "limit (ms)": lim.judged_s * 1e3,
                "fraction of limit": lim.judged["nw"],
                "rounds": len(methods["nw"]["samples_s"]),
                "per round, 95 %": _interval_text(fraction_interval(cfg)),
                "SDPA ratio": summary(cfg, "sdpa").ratio if "sdpa" in methods else math.nan,
                "KeOps ratio": summary(cfg, "keops").ratio if "keops" in methods else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _interval_text(interval: tuple[float, float, float]) -> str:
    """``"44–69%"`` for :func:`fraction_interval`'s ends, as the table writes fractions (a dash where not measured)."""
    _, lo, hi = interval
    return "–" if math.isnan(lo) else f"{100 * lo:.0f}–{100 * hi:.0f}%"


def machines_values(report: Mapping[str, Any], runs: Iterable[Mapping[str, Any]] = ()) -> Values:
    """The sentence under :func:`machines_table`: on how many of the runs the target is met, and the range."""
    table = machines_table(report, runs)
    if table.empty:
        return Values({"machines_sentence": f"The limit at the target configuration was {NOT_MEASURED}."})
    met = table[table["fraction of limit"] >= LIMIT_TARGET]
    lo, hi = table["fraction of limit"].min(), table["fraction of limit"].max()
    which = [f"{m}, kernel {k}" for m, k in zip(met["machine"], met["kernel"], strict=True)]
    sdpa = table["SDPA ratio"].dropna()
    sentence = (
        f"Over the {len(table)} runs in the table nadaraya_watson took {lo:.0%} to {hi:.0%} of its run's limit; "
        f"the target of {LIMIT_TARGET:.0%} is met in {len(met)} of them" + (f" ({'; '.join(which)})" if which else "")
    )
    logs = [_log_fractions(configs_by_name(rep)[TARGET_CONFIG]) for rep in _table_runs(report, runs)]
    logs = [x for x in logs if x is not None and len(x) > 1]
    if logs:
        below_runs, above_runs, alpha = _against_target(logs)
        below, above = sum(below_runs), sum(above_runs)
        sentence += (
            f". Tested run by run on its rounds (one-sided t tests on the logarithms of the rounds' fractions, "
            f"Holm across the {len(logs)} runs at {alpha:.0%}), the fraction lies below the target in {below} of "
            f"the {len(logs)} runs, above it in {above} and cannot be told from it in {len(logs) - below - above}"
        )
    if len(sdpa):
        sentence += f"; SDPA took {sdpa.min():.2f}× to {sdpa.max():.2f}× as long in the runs that timed it"
    sentence += "."
    return Values({"machines_sentence": sentence}, {"machines_runs": len(table)})


# --------------------------------------------------------------------------------- Gaussian kernel, engine speed


def gauss_values(report: Mapping[str, Any]) -> Values:
    """The sentence on the Gaussian kernel at the target size, against the exponential kernel and the references."""
    cfgs = configs_by_name(report)
    exp_cfg, gauss_cfg = cfgs.get(TARGET_CONFIG), cfgs.get(GAUSSIAN_CONFIG)
    if gauss_cfg is None:
        return Values({"gauss_sentence": f"The Gaussian kernel at the target size was {NOT_MEASURED}."})
    text = (
        f"With the Gaussian kernel (h = {gauss_cfg['bandwidth']:.3f}, float32, scalar responses, "
        f"the target size) nadaraya_watson took {summary(gauss_cfg, 'nw').median_s * 1e3:.0f} ms"
    )
    if exp_cfg:
        text += (
            f" against {summary(exp_cfg, 'nw').median_s * 1e3:.0f} ms with the exponential kernel "
            "(the Gaussian kernel adds one mask value per key, -|k|²/(2h²), to the same fused call)"
        )
    timed = [m for m in THRESHOLDS if m in gauss_cfg["results"]["methods"]]
    others = [f"{LABELS[m]} {summary(gauss_cfg, m).ratio:.1f}×" for m in timed]
    if others:
        others[0] = _took(others[0])
        text += "; the " + " and the ".join(others) + " as long"
    return Values({"gauss_sentence": text + "."})


def _took(item: str) -> str:
    """'materialised softmax 4.7×' -> 'materialised softmax took 4.7×' (before the ratio)."""
    name, ratio = item.rsplit(" ", 1)
    return f"{name} took {ratio}"


def engine_speed_values(report: Mapping[str, Any]) -> Values:
    """The engine end to end: simulate's replicates per second against nadaraya_watson on the same shapes."""
    e = next((c for c in report["configs"] if c["group"] == "engine"), None)
    if e is None:
        return Values(
            {
                "engine_speed_sentence": f"The engine end to end was {NOT_MEASURED}.",
                "engine_replicates_per_s": NOT_MEASURED,
            }
        )
    sim, nw_e = summary(e, "simulate"), summary(e, "nw")
    rps = e["R"] / sim.median_s
    if not np.isclose(rps, e["results"]["replicates_per_s"]):
        raise ResultFileError(f"{e['name']}: recomputed replicates per second differ from the stored ones")
    rf = roofline(e)
    chunk = e["results"].get("chunk_size_used")
    sentence = (
        f"simulate drew and evaluated R = {e['R']} training sets for H = {e['H']} heads (d_k = {e['d']}, "
        f"D = {e['D']}, n = {e['n']}, m = {e['m']}, {e['dtype']}, Gaussian kernel with the engine's default "
        f"bandwidth, shared data{f', chunks of {chunk} replicates chosen by the engine' if chunk else ''}) in "
        f"{sim.median_s * 1e3:.0f} ms: {rps:.0f} replicates per second. That is {sim.ratio:.2f}× the time of "
        f"nadaraya_watson on the same shapes with the data precomputed ({nw_e.median_s * 1e3:.0f} ms)"
    )
    if rf:
        sentence += f", and {rf.attainable_s / sim.median_s:.0%} of the attainable rate for the kernel's work"
    return Values({"engine_speed_sentence": sentence + ".", "engine_replicates_per_s": f"{rps:.0f}"})


# -------------------------------------------------------------------------------------------------------- memory


def memory_record(report: Mapping[str, Any], case: str, method: str, **match: Any) -> dict[str, Any] | None:
    """The first memory record of ``case`` and ``method`` whose spec matches ``match``; None if none.

    A spec without a ``kernel`` field is one of the exponential kernel.
    """
    for rec in report["memory"]:
        s = rec["spec"]
        if (
            s["case"] == case
            and s["method"] == method
            and all(s.get(k, "exp" if k == "kernel" else None) == v for k, v in match.items())
        ):
            return dict(rec)
    return None


def peak_mib(report: Mapping[str, Any], case: str, method: str, **match: Any) -> float:
    """The peak of live bytes of one call (:func:`memory_record`), MiB; NaN where not measured."""
    rec = memory_record(report, case, method, **match)
    return rec["peak_bytes"] / MIB if rec and "peak_bytes" in rec else math.nan


def _live(rec: Mapping[str, Any]) -> float:
    return rec.get("live_peak_bytes", math.nan) / MIB


def _rss(rec: Mapping[str, Any]) -> float:
    return rec.get("rss_peak_bytes", math.nan) / MIB


def _size(s: Mapping[str, Any]) -> str:
    return f"R={s['R']} H={s['H']} m={s['m']} n={s['n']}"


def memory_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """One call's peak memory per case and implementation (not the engine's, not the probes'), MiB."""
    rows = [
        {
            "case": s["case"],
            "device": s["device"],
            "dtype": s["dtype"],
            "responses": _responses(s.get("p")),
            "implementation": LABELS[s["method"]],
            "size": _size(s),
            "live peak (MiB)": _live(rec),
            "RSS rise (MiB)": _rss(rec),
        }
        for rec in report["memory"]
        if (s := rec["spec"])["method"] not in ("simulate", "known_allocation")
    ]
    return pd.DataFrame(rows)


def _probe_text(r: Mapping[str, Any]) -> str:
    text = f"{r['live_peak_bytes'] / MIB:.2f} MiB measured for a known peak of {r['expected_peak_bytes'] / MIB:.0f} MiB"
    if r["expected_peak_bytes"] == r["expected_end_bytes"]:
        return text + " (one tensor kept)"
    freed = (r["expected_peak_bytes"] - r["expected_end_bytes"]) / MIB
    return text + f" (a {r['expected_end_bytes'] / MIB:.0f} MiB tensor kept and a {freed:.0f} MiB temporary freed)"


def memory_values(report: Mapping[str, Any]) -> Values:
    """The large case (one head, m = n = 16384) against the 1 GiB target, and how memory was measured."""
    large = next((r["spec"] for r in report["memory"] if r["spec"]["case"] == "large"), {"m": 16384, "n": 16384})
    exact: dict[str, Any] = {
        "large_size": f"m = n = {large['m']}" if large["m"] == large["n"] else f"m = {large['m']}, n = {large['n']}",
        "large_weights_mib": large["m"] * large["n"] * 4 / MIB,  # a size, not a measurement
    }
    measured: dict[str, Any] = {}
    for method in ("nw", "materialised", "numpy_loop"):
        value = peak_mib(report, "large", method, device="cpu")
        measured[f"mem_large_{method}_mib"] = value
        exact[f"mem_large_{method}_text"] = f"{value:.0f} MiB" if np.isfinite(value) else "not measured in this run"
    nw = measured["mem_large_nw_mib"]
    verdict = "holds" if nw < GIB / MIB else "does not hold" if np.isfinite(nw) else "was not measured"
    exact["mem_large_nw_verdict"] = verdict
    probes = [r for r in report["memory"] if r["spec"]["method"] == "known_allocation" and "live_peak_bytes" in r]
    checks = "; ".join(_probe_text(r) for r in probes)
    exact["mem_measure_sentence"] = (
        "Memory is the peak of live tensor bytes during the call, above what was alive when it started"
        + (f"; the same probe, run on known allocations in this run, gave {checks}" if probes else "")
        + "."
    )
    exact["mem_measure_name"] = "live tensor bytes"
    return Values(exact, measured)


def engine_memory(report: Mapping[str, Any]) -> EngineMemory:
    """The Monte Carlo engine's live peaks against the bound it states (``nwlib.montecarlo.memory_estimate``).

    Returns
    -------
    EngineMemory
        Its ``values``: ``engine_size``, ``engine_verdict`` (every case under 1 GiB at
        m = n = 16384), ``engine_bound_verdict``, ``engine_bound_source``, ``engine_chunk_compared``,
        ``engine_r_peaks`` and ``engine_r_statement`` (whether the peak levels off as R grows at a
        fixed chunk size: past the first data blocks only the (R, H, m) predictions should grow),
        exact; ``engine_max_mib``, measured.
    """
    engine = [r for r in report["memory"] if r["spec"]["method"] == "simulate"]
    ok = [r for r in engine if "peak_bytes" in r]
    failed = len(engine) - len(ok)
    rows = []
    for r in ok:
        s = r["spec"]
        row = {
            "case": ", ".join(s["sweeps"]) or "–",
            "kernel": s["kernel"],
            "H": s["H"],
            "R": s["R"],
            "m = n": s["m"],
            "chunk": r["chunk_size_used"],
            "chosen by": "engine (default budget)" if s["chunk_size"] is None else "caller",
            "live peak (MiB)": _live(r),
            "RSS rise (MiB)": _rss(r),
            "bound (MiB)": r["bound_bytes"] / MIB,
            "peak / bound": r["live_peak_bytes"] / r["bound_bytes"],
            "within bound": "yes" if r["live_peak_bytes"] <= r["bound_bytes"] else "NO",
        }
        row.update({f"{part} (MiB)": nbytes / MIB for part, nbytes in r["bound_parts_bytes"].items()})
        rows.append(row)
    table = pd.DataFrame(rows)
    if not ok:
        text = "not measured (the result file has no engine measurements)"
        keys = (
            "engine_size",
            "engine_bound_verdict",
            "engine_verdict",
            "engine_r_statement",
            "engine_r_peaks",
            "engine_bound_source",
        )
        values = Values({**dict.fromkeys(keys, text), "engine_chunk_compared": "–"}, {"engine_max_mib": math.nan})
        return EngineMemory(table, table, 0, math.nan, values)
    spec0 = ok[0]["spec"]
    big = [r for r in ok if r["spec"]["m"] == r["spec"]["n"] == 16384]
    within = [r for r in ok if r["live_peak_bytes"] <= r["bound_bytes"]]
    worst = max(r["live_peak_bytes"] / r["bound_bytes"] for r in ok)
    if len(within) == len(ok) and not failed:
        verdict = (
            f"every one of the {len(ok)} engine cases stayed within the bound the engine states "
            f"(the highest live peak was {worst:.0%} of its bound)"
        )
    else:
        verdict = (
            f"{len(within)} of {len(engine)} engine cases stayed within the bound the engine states; the "
            f"highest live peak was {worst:.0%} of its bound"
            + (f", and {failed} case(s) failed to run" if failed else "")
        )
    fixed = table[(table["chosen by"] == "caller") & (table["kernel"] == "gaussian") & (table["H"] == 1)]
    counts = fixed.groupby("chunk")["R"].nunique()
    chunk = int(counts.idxmax()) if len(counts) else 0
    sweep = fixed[fixed["chunk"] == chunk].drop_duplicates("R").sort_values("R")
    per_replicate = spec0["n"] * spec0["D"] * 4 / MIB
    exact = {
        "engine_size": f"D = {spec0['D']}, d_k = {spec0['d']}, m = n = {spec0['m']}",
        "engine_verdict": ("holds" if max(r["peak_bytes"] for r in big) < GIB else "does not hold")
        if big
        else "was not measured at m = n = 16384 (a quick run)",
        "engine_bound_verdict": verdict,
        "engine_bound_source": ", ".join(sorted({r["bound_source"] for r in ok})),
        "engine_r_statement": _r_statement(sweep, spec0, per_replicate),
        "engine_chunk_compared": str(chunk),
        "engine_r_peaks": ", ".join(
            f"{p:.1f} MiB (R = {r})" for r, p in zip(sweep["R"], sweep["live peak (MiB)"], strict=True)
        ),
    }
    values = Values(exact, {"engine_max_mib": max(r["peak_bytes"] for r in ok) / MIB})
    return EngineMemory(table, sweep, chunk, per_replicate, values)


def _r_statement(sweep: pd.DataFrame, spec0: Mapping[str, Any], per_replicate: float) -> str:
    """Whether the peak keeps growing with R between the sweep's last two replicate counts."""
    if len(sweep) < 2:
        return "was not measured against R"
    r_lo, r_hi = sweep["R"].iloc[-2], sweep["R"].iloc[-1]
    peaks = sweep["live peak (MiB)"]
    slope = (peaks.iloc[-1] - peaks.iloc[-2]) / (r_hi - r_lo)
    predictions = spec0["H"] * spec0["m"] * 4 / MIB  # the (R, H, m) output grows by this per replicate
    grows = slope > predictions + 0.1 * per_replicate
    return (
        f"{'keeps growing' if grows else 'levels off'}: from R = {r_lo} to R = {r_hi} it changes by "
        f"{slope:.3f} MiB per added replicate, against {predictions:.3f} MiB of predictions and "
        f"{per_replicate:.1f} MiB of training data per replicate"
    )


# ------------------------------------------------------------------------------------------ statsmodels, context


def statsmodels_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """statsmodels' KernelReg against nadaraya_watson (Gaussian kernel, float64, one estimator)."""
    rows = []
    for cfg in report["configs"]:
        if cfg["group"] == "statsmodels":
            nw, sm = summary(cfg, "nw"), summary(cfg, "statsmodels")
            rows.append(
                {
                    "m": cfg["m"],
                    "n": cfg["n"],
                    "d": cfg["d"],
                    "nadaraya_watson (ms)": nw.median_s * 1e3,
                    "statsmodels (ms)": sm.median_s * 1e3,
                    "ratio": sm.ratio,
                }
            )
    return pd.DataFrame(rows, columns=["m", "n", "d", "nadaraya_watson (ms)", "statsmodels (ms)", "ratio"])


def statsmodels_values(report: Mapping[str, Any]) -> Values:
    """The range of statsmodels' ratios and MultiheadAttention's ratios at :data:`VECTOR_CONFIG` (measured)."""
    sm = statsmodels_table(report)
    measured = {
        "statsmodels_ratio_max": float(sm["ratio"].max()) if len(sm) else math.nan,
        "statsmodels_ratio_min": float(sm["ratio"].min()) if len(sm) else math.nan,
    }
    vec = configs_by_name(report).get(VECTOR_CONFIG)
    for method in ("mha", "mha_need_weights"):
        timed = vec is not None and method in vec["results"]["methods"]
        measured[f"{method}_ratio"] = summary(vec, method).ratio if timed and vec else math.nan
    return Values({}, measured)


def context_values(report: Mapping[str, Any], others: Iterable[Mapping[str, Any]] = ()) -> Values:
    """What the ratios depend on: instruction set (with other machines' observations), sizes, padding, load.

    Parameters
    ----------
    report : dict
    others : iterable of dict
        Observations of other machines (:func:`other_machines`); one from this very run (same
        ``result_date``) is not repeated.
    """
    machine = report["machine"]
    target = configs_by_name(report).get(TARGET_CONFIG)
    amx = ", with AMX" if "amx_tile" in machine["cpu_flags"] else ""
    flags = ", ".join(machine["cpu_flags"]) or "no AVX2/AVX-512/AMX flags"
    cap = machine["cpu_capability"]
    isa = f"PyTorch dispatching to {cap}{amx}" if cap else f"CPU flags {flags}"
    if target and "numpy_loop" in target["results"]["methods"]:
        here = (
            f"In this run ({machine['cpu_model']}; {isa}; {machine['torch_threads']} threads) the NumPy loop "
            f"took {summary(target, 'numpy_loop').ratio:.1f}× as long as nadaraya_watson at the target size"
        )
    else:
        here = "This result file has no NumPy-loop timing at the target size"
    elsewhere = [
        f"{o['ratio_numpy_loop']:.1f}× on {o['machine']} with {o['torch_threads']} threads "
        f"({'full run of ' + o['date'] if o.get('date') else 'timed by hand; no result file kept'})"
        for o in others
        if o.get("ratio_numpy_loop") and o.get("result_date") != report["date"]
    ]
    also = ("; the same comparison gave " + ", and ".join(elsewhere)) if elsewhere else ""
    exact = {"isa_sentence": here + also + "."}
    scaling = [c for c in report["configs"] if c["group"] == "scaling" and c["device"] == "cpu"]
    scaling.sort(key=lambda c: c["n"])
    pts = [(c["n"], summary(c, "numpy_loop").ratio) for c in scaling if "numpy_loop" in c["results"]["methods"]]
    if len(pts) >= 2:
        c0 = scaling[0]
        exact["size_sentence"] = (
            f"Against the number of keys (R = {c0['R']}, H = {c0['H']}, m = {c0['m']}, "
            f"d = {c0['d']}) the NumPy loop took " + ", ".join(f"{r:.1f}× as long at n = {n}" for n, r in pts) + "."
        )
    else:
        exact["size_sentence"] = "This result file has no timings against n."
    if target and "sdpa_unpadded" in target["results"]["methods"]:
        s = summary(target, "sdpa_unpadded")
        exact["padding_sentence"] = (
            f"Calling scaled_dot_product_attention directly with the scalar responses as values of width 1 took "
            f"{s.ratio:.1f}× as long as nadaraya_watson (paired {s.paired:.1f}×), which pads them to the key "
            f"width d = {target['d']} and so keeps the fused kernel."
        )
    else:
        exact["padding_sentence"] = f"The call with unpadded scalar responses was {NOT_MEASURED}."
    before, after = report["load_average_before"][0], report["load_average_after"][0]
    exact["load_sentence"] = (
        f"The one-minute load average was {before:.2f} when this run started and {after:.2f} when it ended, on "
        f"{machine['usable_cpus']} usable CPUs with {machine['torch_threads']} PyTorch threads."
    )
    return Values(exact)


# ------------------------------------------------------------------------------------------------------- display


def styled(table: pd.DataFrame, kind: str, *, drop: Sequence[str] = ()) -> Any:
    """The appendix's formatting of one of its tables, as a pandas Styler without the index.

    Parameters
    ----------
    table : pandas.DataFrame
    kind : {"times", "roofline", "rates", "memory", "statsmodels", "limit", "exp_rates", "machines", "peers", "engine"}
        Which table (its number formats).
    drop : sequence of str
        Columns left out (e.g. the figure's labels).
    """
    kinds = [*_FORMATS, "engine"]
    if kind not in kinds:
        raise ValueError(f"kind must be one of {kinds}, got {kind!r}")
    table = table.drop(columns=list(drop), errors="ignore")
    if kind == "engine":  # the bound's parts vary: every MiB column, and the peak as a share of the bound
        formats = {c: "{:.1f}" for c in table.columns if c.endswith("(MiB)")} | {"peak / bound": "{:.0%}"}
    else:
        formats = _FORMATS[kind]
    na = {"na_rep": "–"} if kind in ("times", "memory", "engine", "peers") else {}
    if kind == "machines":  # ten columns or more in a narrow page: cells break only between phrases
        table = table.map(_keep_phrases)
    style = table.style.format(formats, **na).hide(axis="index")
    if kind == "machines":  # dates and intervals kept whole (not broken at "-" or "–"), less padding
        whole = [c for c in ("date", "per round, 95 %") if c in table]
        style = style.set_properties(subset=whole, **{"white-space": "nowrap"})
        style = style.set_table_styles([{"selector": "td, th", "props": "padding: 0.25em 0.45em"}])
    return style


def _keep_phrases(cell: Any) -> Any:
    """A text cell whose spaces are no-break spaces except after a comma or semicolon and before "(".

    >>> _keep_phrases("AMD EPYC (family 25, model 17), 2 threads") == (
    ...     "AMD\u00a0EPYC (family\u00a025, model\u00a017), 2\u00a0threads")
    True
    """
    return re.sub(r"(?<![,;]) (?!\()", "\u00a0", cell) if isinstance(cell, str) else cell


def message_table(text: str) -> Any:
    """A one-cell table standing in for a glued table the result file cannot fill (the page pastes a table)."""
    return pd.DataFrame({"": [text]}).style.hide(axis="index")


# --- where the notebooks' time goes (make time-profile) -------------------------------------------

TIME_PARTS = (
    "nwlib estimators",
    "Monte Carlo engine and other nwlib",
    "training and models",
    "chapter experiments",
    "evidence and book tooling",
    "sympy",
    "plotting",
    "notebook and other",
    "kernel start and imports",
)


def time_profile(profile: str = "quick", *, results: str | Path | None = None) -> dict[str, Any] | None:
    """The summary ``make time-profile PROFILE=<profile>`` wrote, or None where it has not run.

    Parameters
    ----------
    profile : str
        The notebooks' parameter profile that was profiled.
    results : str or Path, optional
        The folder of result files; default :data:`RESULTS`.
    """
    if not isinstance(profile, str) or not profile:
        raise TypeError(f"profile must be a non-empty string, got {profile!r}")
    file = Path(RESULTS if results is None else results) / "time-profile" / profile / "summary.json"
    if not file.is_file():
        return None
    summary = json.loads(file.read_text())
    if not isinstance(summary, dict) or not isinstance(summary.get("notebooks"), list):
        raise ResultFileError(f"{file}: not a time-profile summary (no 'notebooks' list)")
    return summary


TIME_PART_LABELS = {
    "nwlib estimators": "estimators",
    "Monte Carlo engine and other nwlib": "engine",
    "training and models": "training",
    "chapter experiments": "experiments",
    "evidence and book tooling": "evidence",
    "sympy": "sympy",
    "plotting": "plotting",
    "notebook and other": "other",
    "kernel start and imports": "start",
}
"""The table's short column names for the parts of :data:`TIME_PARTS` (the page explains them)."""


def _short_notebook(stem: str) -> str:
    return stem.split("_", 1)[0] if stem[:2] == "ch" and stem[2:4].isdigit() else stem.removeprefix("appendix_")


def time_profile_table(summary: Mapping[str, Any]) -> pd.DataFrame:
    """Seconds per part of the code for every notebook, with the total and the largest part's share.

    Rows are notebooks (``ch01`` … ``ch07``, the appendices by name) plus "all"; columns the
    parts' short names (:data:`TIME_PART_LABELS`) in seconds, "total (s)" and "largest" (the
    largest part and its share of the total).

    Parameters
    ----------
    summary : Mapping
        From :func:`time_profile`.

    Raises
    ------
    ResultFileError
        If a notebook's parts do not add up to its total within 5 % (the profile lost time).
    """
    rows = []
    for entry in summary["notebooks"]:
        parts = {TIME_PART_LABELS[k]: float(entry["seconds"].get(k, 0.0)) for k in TIME_PARTS}
        total = float(entry["total_seconds"])
        if abs(sum(parts.values()) - total) > 0.05 * total + 0.5:
            raise ResultFileError(
                f"{entry['notebook']}: its parts add up to {sum(parts.values()):.1f} s, not its total {total:.1f} s"
            )
        rows.append({"notebook": _short_notebook(entry["notebook"]), **parts, "total (s)": total})
    table = pd.DataFrame(rows).set_index("notebook")
    table.loc["all"] = table.sum()
    labels = list(TIME_PART_LABELS.values())
    largest = table[labels].idxmax(axis=1)
    table["largest"] = [
        f"{part} {table.loc[nb, part] / table.loc[nb, 'total (s)']:.0%}" for nb, part in largest.items()
    ]
    return table


def styled_time_profile(table: pd.DataFrame) -> Any:
    """:func:`time_profile_table` formatted for the appendix: seconds to one decimal, "–" for 0."""
    seconds = [c for c in table.columns if c != "largest"]
    return table.style.format({c: (lambda v: "–" if v == 0 else f"{v:.1f}") for c in seconds}).set_table_attributes(
        'class="time-profile"'
    )


# --- what the full profile costs (tools/full_profile.py) --------------------------------------------

FULL_PROFILE_FILE = "full-profile.json"
FULL_PROFILE_TEXT_KEYS = (
    "full_profile_machine",
    "full_profile_longest",
    "full_profile_over",
    "full_profile_distributed",
    "full_profile_check",
)
"""The keys of :func:`full_profile_values` that are sentences (the other, ``full_profile_total_h``, is hours)."""


def full_profile(*, results: str | Path | None = None) -> dict[str, Any] | None:
    """The record ``tools/full_profile.py`` wrote, or None where it has not run.

    Parameters
    ----------
    results : str or Path, optional
        The folder of result files; default :data:`RESULTS`.
    """
    file = Path(RESULTS if results is None else results) / FULL_PROFILE_FILE
    if not file.is_file():
        return None
    record = json.loads(file.read_text())
    if not isinstance(record, dict) or not isinstance(record.get("notebooks"), list):
        raise ResultFileError(f"{file}: not a full-profile record (no 'notebooks' list)")
    return record


def _minutes(seconds: float) -> str:
    """A duration in words a reader compares at a glance: seconds under 2 min, minutes under 2 h, else hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def short_machine(model: str) -> str:
    """A CPU model as a reader names it: no trademark signs, no "CPU" or "Processor", no clock.

    Examples
    --------
    >>> short_machine("Intel(R) Xeon(R) Processor"), short_machine("AMD EPYC 7B13 64-Core Processor")
    ('Intel Xeon', 'AMD EPYC 7B13 64-Core')
    >>> short_machine("Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz")
    'Intel Core i7-8650U'
    """
    text = re.sub(r"\((R|TM|tm|r)\)", "", str(model))
    text = re.sub(r"@\s*[\d.]+\s*GHz", "", text)
    text = re.sub(r"\b(CPU|Processor)\b", "", text)
    return " ".join(text.split()) or str(model)


def _cores(entry: Mapping[str, Any]) -> str:
    cores = int(entry["cores"])
    return f"{cores} core{'s' if cores > 1 else ''}"


def _machine_of(entry: Mapping[str, Any], record: Mapping[str, Any]) -> str | None:
    """An entry's machine (short name); else the record's, where that names one machine (a record from
    before each row kept its own); else None."""
    own, header = entry.get("machine"), str(record.get("machine") or "")
    if own:
        return short_machine(own)
    return short_machine(header) if header and " and " not in header else None


def _row_machines(record: Mapping[str, Any]) -> list[str]:
    """The machines of the record's notebook rows, in order of appearance (short names)."""
    names = (_machine_of(e, record) for e in record["notebooks"])
    return list(dict.fromkeys(n for n in names if n))


def full_profile_table(record: Mapping[str, Any], *, sweep_minutes: float = 30.0) -> pd.DataFrame:
    """One row per notebook: how its full-profile time was found, the reduced runs, the time and the executor.

    Columns: "notebook", "full profile" (the time, :func:`_minutes`), "how" ("measured" or
    "extrapolated"), "ran on" (the machine, the CPUs a run could use, the mean load average during it
    and the commit, where the record has them: a load above the CPUs means the run shared them and its
    time is an upper bound),
    "reduced runs" (each fraction f and its time; a run whose only failure was an
    asserted finding not established at that size, in its last cell, is marked), "fixed part" (the intercept a
    of t(f) = a + b f: what does not scale), "seconds" (the time, for sorting and sums) and
    "grid" (whether the notebook's grid runs through ``run_sweep``: the executor it can spread it
    over; "–" for a notebook under ``sweep_minutes`` that has none). A last row "all" sums them.

    Parameters
    ----------
    record : Mapping
        From :func:`full_profile`.
    sweep_minutes : float
        The time above which a notebook must run its grid through ``run_sweep``.

    Raises
    ------
    ResultFileError
        If an extrapolated row's time is not a + b (the record contradicts itself) or a run failed.
    """
    rows = []
    for entry in record["notebooks"]:
        name = entry["notebook"]
        if entry.get("status") != "ok":
            raise ResultFileError(f"{name}: its run did not finish ({entry.get('status')!r})")
        seconds = float(entry["full_s"])
        if entry["how"] == "extrapolated":
            a, b = float(entry["intercept_s"]), float(entry["slope_s"])
            if abs(a + b - seconds) > 0.2:
                raise ResultFileError(f"{name}: full_s {seconds} is not intercept + slope = {a + b:.1f}")
            runs = "; ".join(
                f"f = {r['fraction']:g}: {_minutes(float(r['seconds']))}"
                + ("" if r.get("status", "ok") == "ok" else " (a finding not established)")
                for r in entry["runs"]
            )
            fixed = _minutes(a)
        else:
            runs, fixed = "–", "–"
        if entry.get("sweep"):
            grid = "run_sweep"
        else:
            grid = "serial only" if seconds > 60 * sweep_minutes else "–"
        if "cores" in entry:
            machine = _machine_of(entry, record)
            ran_on = f"{machine + ', ' if machine else ''}{_cores(entry)}"
            ran_on += f", load {float(entry['load']):.1f}"
            # the commit, because a row measured before a speed-up is an upper bound after it
            ran_on += f", at {entry['commit']}" if entry.get("commit") else ""
        else:
            ran_on = "–"
        rows.append(
            {
                "notebook": _short_notebook(name),
                "full profile": _minutes(seconds),
                "how": entry["how"],
                "ran on": ran_on,
                "reduced runs": runs,
                "fixed part": fixed,
                "grid": grid,
                "seconds": seconds,
            }
        )
    table = pd.DataFrame(rows)
    total = float(table["seconds"].sum())
    all_row = {"notebook": "all", "full profile": _minutes(total), "how": "sum", "ran on": "–", "reduced runs": "–"}
    table.loc[len(table)] = {**all_row, "fixed part": "–", "grid": "–", "seconds": total}
    return table


def styled_full_profile(table: pd.DataFrame) -> Any:
    """:func:`full_profile_table` for the appendix, without "seconds", its phrases kept on one line.

    The page's column is narrow, and a cell such as "Intel Xeon, 2 cores, load 1.0" would otherwise
    break after every word: each phrase ("Intel Xeon", "2 cores", "f = 0.03: 3 min") is joined by
    no-break spaces, so that a cell breaks only between phrases (after a comma or a semicolon, or
    before a parenthesis).

    Examples
    --------
    >>> row = {"notebook": "ch01", "full profile": "76 min", "ran on": "Intel Xeon, 2 cores, load 1.0",
    ...        "reduced runs": "f = 0.03: 3 min (a finding not established); f = 0.09: 7 min", "seconds": 1.0}
    >>> html = styled_full_profile(pd.DataFrame([row])).to_html()
    >>> "Intel\u00a0Xeon, 2\u00a0cores, load\u00a01.0" in html, "f\u00a0=\u00a00.03:\u00a03\u00a0min (a finding" in html
    (True, True)
    >>> "seconds" in html
    False
    """

    def phrases(cell: Any) -> Any:
        if not isinstance(cell, str):
            return cell
        parts = []
        for part in cell.split("; "):
            head, sep, note = part.partition(" (")
            parts.append(", ".join(p.replace(" ", "\u00a0") for p in head.split(", ")) + sep + note)
        return "; ".join(parts)

    shown = table.drop(columns=["seconds"], errors="ignore")
    return shown.map(phrases).style.hide(axis="index")


def full_profile_values(record: Mapping[str, Any], *, sweep_minutes: float = 30.0) -> dict[str, Any]:
    """What the pages quote from the full-profile record (informational: the machine's times).

    Keys: ``full_profile_machine`` (CPU, cores, date and commit), ``full_profile_total_h`` (all
    notebooks, hours), ``full_profile_longest`` (the longest notebook and its time),
    ``full_profile_over`` (the notebooks over ``sweep_minutes``, in words) and
    ``full_profile_distributed`` (the two-worker check, when the record has one).
    """
    table = full_profile_table(record, sweep_minutes=sweep_minutes).iloc[:-1]
    longest = table.loc[table["seconds"].idxmax()]
    over = table[table["seconds"] > 60 * sweep_minutes]
    machines = _row_machines(record) or ["?"]
    if len(machines) == 1:
        where = f"{machines[0]}, {record.get('cpus', '?')} CPU cores, {record.get('date', '?')}"
        where += f", commit {record.get('commit', '?')}"
    else:  # a partial rerun elsewhere: the table's "ran on" says which row ran where
        where = f"{' and '.join(machines)} ({record.get('cpus', '?')} CPU cores each; {record.get('date', '?')}; "
        where += f"commits {record.get('commit', '?')}; the table says which notebook ran where)"
    values: dict[str, Any] = {
        "full_profile_machine": where,
        "full_profile_total_h": float(table["seconds"].sum()) / 3600,
        "full_profile_longest": f"{longest['notebook']} ({longest['full profile']})",
        "full_profile_over": ", ".join(f"{r['notebook']} ({r['full profile']})" for _, r in over.iterrows()) or "none",
    }
    check = record.get("distributed")
    if check:
        values["full_profile_distributed"] = (
            f"{_short_notebook(check['notebook'])} at f = {check['fraction']:g} on {check['executor']}"
            + (f" ({short_machine(check['machine'])})" if check.get("machine") else "")
            + ": "
            f"{check['agree']} of {check['values']} verified values agree with the serial run, {check['identical']} "
            f"of them bit for bit ({_minutes(check['seconds'])} against {_minutes(check['serial_seconds'])} serially)"
        )
    else:
        values["full_profile_distributed"] = "not run"
    checks = []
    for c in record.get("checks", []):
        if c.get("status") != "ok":
            continue
        took, predicted = float(c["seconds"]), float(c["predicted_s"])
        checks.append(
            f"{_short_notebook(c['notebook'])} at f = {c['fraction']:g}"
            + (f" ({short_machine(c['machine'])}, {_cores(c)})" if c.get("machine") and "cores" in c else "")
            + f" took {_minutes(took)} against "
            f"{_minutes(predicted)} predicted by the line ({took / predicted - 1:+.0%})"
        )
    values["full_profile_check"] = "; ".join(checks) if checks else "no third fraction was run"
    return values
