"""What the full profile costs on this machine, measured at two reduced sizes and extrapolated.

    python tools/full_profile.py                       # every notebook, both fractions
    python tools/full_profile.py notebooks/ch01_attention_is_nw.ipynb
    python tools/full_profile.py --report              # print the committed table, run nothing

``profiles/full-reduced.yaml`` lists, per notebook, the parameters of the full profile that count
independent units of work (replicates, resamples, seeds) and two fractions f. A reduced run is the
full profile with those parameters multiplied by f (:func:`reduced_parameters`); everything else keeps
its full value. Each notebook is executed (``tools/run_notebooks.py --profile full --fraction f``) at
both fractions, one after the other, on an otherwise idle machine, and its time is fitted by
t(f) = a + b f through the two points (:func:`extrapolate`): a is the part that does not scale, run
at full size both times, and t(1) = a + b the full profile's time. A notebook with nothing to scale
(the appendices: their full profile is their standard one) is simply run under full and measured.

The result goes to ``benchmarks/results/full-profile.json`` (machine, date, commit, per notebook the
fractions, the parameters run, the two times, a, b and t(1)); the Performance appendix and the
Reproducing page show it as a table, the README quotes it (``tests/test_full_profile.py`` checks
that the README agrees with the file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "profiles" / "full-reduced.yaml"
RESULT = ROOT / "benchmarks" / "results" / "full-profile.json"


def load_spec(path: Path = SPEC) -> dict[str, dict[str, Any]]:
    """The reduced-profile specification: ``{notebook: {"fractions": [f1, f2], "scale": {name: multiple}}}``."""
    import yaml

    spec = yaml.safe_load(path.read_text()) or {}
    for name, entry in spec.items():
        fractions = entry.get("fractions")
        if not (isinstance(fractions, list) and len(fractions) == 2 and 0 < fractions[0] < fractions[1] < 1):
            raise ValueError(f"{name}: fractions must be two numbers 0 < f1 < f2 < 1, got {fractions!r}")
        if not isinstance(entry.get("scale"), dict) or not entry["scale"]:
            raise ValueError(f"{name}: scale must map parameter names to rounding multiples")
    return spec


def _scaled_count(value: int, fraction: float, multiple: int) -> int:
    """``fraction * value`` rounded to a multiple of ``multiple`` (at least ``multiple``, at most ``value``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"a scaled parameter must be a positive integer, got {value!r}")
    scaled = multiple * max(1, round(fraction * value / multiple))
    return min(scaled, value)


def reduced_parameters(full: dict[str, Any], scale: dict[str, int], fraction: float) -> dict[str, Any]:
    """The full profile's parameters with those in ``scale`` multiplied by ``fraction``.

    Parameters
    ----------
    full : dict
        A notebook's parameters under the full profile.
    scale : dict
        Parameter name to rounding multiple. An integer becomes ``fraction * value`` rounded to that
        multiple (at least the multiple, at most the value); a list of integers is scaled element by
        element (at least 1), duplicates dropped, order kept.
    fraction : float
        In (0, 1].

    Returns
    -------
    dict
        A new mapping; ``full`` is not modified.

    Examples
    --------
    >>> reduced_parameters({"replicates": 1000, "n": 64, "sizes": [1, 2, 50, 1000]},
    ...                    {"replicates": 20, "sizes": 1}, 0.06)
    {'replicates': 60, 'n': 64, 'sizes': [1, 3, 60]}
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    out = dict(full)
    for name, multiple in scale.items():
        if name not in full:
            raise ValueError(f"parameter {name!r} is not in the full profile")
        value = full[name]
        if isinstance(value, list):
            seen: list[int] = []
            for v in value:
                s = _scaled_count(v, fraction, 1)
                if s not in seen:
                    seen.append(s)
            out[name] = seen
        else:
            out[name] = _scaled_count(value, fraction, int(multiple))
    return out


def extrapolate(fractions: tuple[float, float], seconds: tuple[float, float]) -> dict[str, float]:
    """The line t(f) = a + b f through two measured points, and its value at f = 1.

    A fit with b < 0 (the larger run was faster: noise on a notebook whose scaled part is negligible)
    is replaced by the flat line through the longer of the two times, a conservative t(1).

    Examples
    --------
    >>> extrapolate((0.1, 0.2), (30.0, 50.0))
    {'intercept_s': 10.0, 'slope_s': 200.0, 'full_s': 210.0}
    """
    (f1, f2), (t1, t2) = fractions, seconds
    if not 0 < f1 < f2 <= 1:
        raise ValueError(f"fractions must satisfy 0 < f1 < f2 <= 1, got {fractions!r}")
    if min(t1, t2) < 0 or not all(map(math.isfinite, (t1, t2))):
        raise ValueError(f"seconds must be finite and non-negative, got {seconds!r}")
    slope = (t2 - t1) / (f2 - f1)
    if slope < 0:
        return {"intercept_s": round(max(t1, t2), 1), "slope_s": 0.0, "full_s": round(max(t1, t2), 1)}
    intercept = max(t1 - slope * f1, 0.0)
    return {"intercept_s": round(intercept, 1), "slope_s": round(slope, 1), "full_s": round(intercept + slope, 1)}


FINDINGS_FAILED = "do not hold under profile"
"""What ``Findings.check`` raises with, in the notebook's last cell (``run.finish()``)."""


def stage_result(notebook: str, stage: Path) -> tuple[float, str]:
    """The seconds and status of the run staged in ``stage``.

    A run whose only failure is its findings check (an asserted finding not established at the
    reduced size, which the profiles are not sized for) is complete for timing, since the check
    is the notebook's last cell: its status is "ok, findings not established" and the finding
    is named in the run's log.
    """
    timings = json.loads((stage / "notebooks" / "_timings.json").read_text())
    row = next(r for r in timings if r["notebook"] == notebook)
    status = row["status"]
    log = stage.with_name(f"{stage.name}-logs") / f"{notebook}.log"
    if status == "FAILED" and log.is_file() and FINDINGS_FAILED in log.read_text(errors="replace"):
        status = "ok, findings not established"
    return float(row["seconds"]), status


def _ok(status: str) -> bool:
    return status.startswith("ok")


def _commit() -> str:
    """The checkout's short commit, with "+" where its tracked files differ from it.

    The record itself does not count: this script rewrites it between runs, and it changes nothing
    that a run executes.
    """
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    record = f":(exclude){RESULT.relative_to(ROOT)}"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", record], cwd=ROOT).returncode != 0
    return head.stdout.strip() + ("+" if dirty else "")


def _machine() -> str:
    """This machine's CPU model (:func:`nwlib.book.build_record.cpu_model`, which imports no torch)."""
    from nwlib.book.build_record import cpu_model

    return cpu_model()


def _conditions(stage: Path) -> Path:
    """Where a run's conditions (machine, date, cores, mean load, commit) are kept, beside its stage."""
    return stage.with_name(f"{stage.name}-conditions.json")


def _run(
    notebook: str,
    fraction: float | None,
    stage: Path,
    timeout: float,
    executor: str | None = None,
    execute: bool = True,
    cores: str | None = None,
) -> tuple[float, str, dict[str, Any]]:
    """Execute one notebook under full (at ``fraction`` of its work, or all of it).

    Returns its seconds, its status and the conditions it ran under: ``machine`` (the CPU model),
    ``date``, ``cores`` (how many CPUs it could use), ``load`` (the 1-minute load average, sampled
    every 10 s during the run and averaged: above ``cores`` the run shared its CPUs and its time is
    an upper bound) and ``commit``. With
    ``cores`` (a CPU list such as "0" or "0,1") the run is pinned to those CPUs (``taskset``) with
    that many intra-op threads. With ``execute=False`` the run already staged in ``stage`` is read
    back (``--from-stages``).
    """
    cmd = [sys.executable, str(ROOT / "tools" / "run_notebooks.py"), "--profile", "full", "--no-cache"]
    cmd += ["--stage", str(stage), "--timeout", str(timeout)]
    if executor is not None:
        cmd += ["--executor", executor]
    if fraction is not None:
        cmd += ["--fraction", str(fraction)]
    cmd.append(str(ROOT / "notebooks" / f"{notebook}.ipynb"))
    if execute:
        env = dict(os.environ)
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if cores is not None:
            count = len(cores.split(","))
            cmd = ["taskset", "-c", cores, *cmd]
            env |= {"OMP_NUM_THREADS": str(count), "MKL_NUM_THREADS": str(count)}
        print("$", " ".join(cmd), flush=True)
        loads = []
        with subprocess.Popen(cmd, cwd=ROOT, env=env) as proc:
            while True:
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    loads.append(os.getloadavg()[0])
        conditions = {
            "machine": _machine(),
            "date": time.strftime("%Y-%m-%d"),
            "cores": count,
            "load": round(sum(loads) / max(len(loads), 1), 2),
            "commit": _commit(),
        }
        _conditions(stage).write_text(json.dumps(conditions) + "\n")
    file = _conditions(stage)
    conditions = json.loads(file.read_text()) if file.is_file() else {}
    return (*stage_result(notebook, stage), conditions)


def measure(
    notebooks: list[str],
    spec: dict[str, dict[str, Any]],
    timeout: float,
    execute: bool = True,
    cores: str | None = None,
) -> list[dict[str, Any]]:
    """Run each notebook at its two fractions (or, with nothing to scale, once under full).

    Each row keeps its runs' conditions (:func:`_run`): ``machine`` and ``date`` (its last run's),
    ``cores``, ``load`` (the largest of its runs' mean loads) and ``commit``.
    """
    sys.path.insert(0, str(ROOT / "tools"))
    from run_notebooks import load_parameters  # noqa: E402  (tools/ is not a package)

    rows = []
    for name in notebooks:
        stage = ROOT / "_build" / "full-reduced" / name
        if name not in spec:
            seconds, status, conditions = _run(name, None, stage, timeout, execute=execute, cores=cores)
            full = load_parameters("full", ROOT / "notebooks" / f"{name}.ipynb")
            rows.append({"notebook": name, "how": "measured", "status": status, "full_s": seconds, **conditions})
            rows[-1]["sweep"] = "executor" in full
            continue
        entry = spec[name]
        full = load_parameters("full", ROOT / "notebooks" / f"{name}.ipynb")
        runs = []
        for f in entry["fractions"]:
            # a stage per run: chapter 6 resumes from the grid points its sweep file already holds
            run_stage = stage.with_name(f"{name}-f{f:g}")
            seconds, status, conditions = _run(name, f, run_stage, timeout, execute=execute, cores=cores)
            params = reduced_parameters(full, entry["scale"], f)
            scaled = {k: params[k] for k in entry["scale"]}
            runs.append({"fraction": f, "seconds": seconds, "status": status, "parameters": scaled, **conditions})
        row: dict[str, Any] = {"notebook": name, "how": "extrapolated", "runs": runs, "sweep": "executor" in full}
        if all("cores" in r for r in runs):
            row |= {"cores": max(r["cores"] for r in runs), "load": max(r["load"] for r in runs)}
            row |= {k: runs[-1][k] for k in ("machine", "date", "commit") if k in runs[-1]}
        row["status"] = "ok" if all(_ok(r["status"]) for r in runs) else "FAILED"
        if row["status"] == "ok":
            row.update(extrapolate(tuple(entry["fractions"]), tuple(r["seconds"] for r in runs)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summarise(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its header from its rows: ``machine``, ``cpus``, ``date`` and ``commit``.

    A partial rerun keeps the other notebooks' rows, which may come from another machine or day:
    each row (and each run, check and distributed run) keeps its own ``machine`` and ``date``, and
    the header lists every one that the notebooks' rows hold (" and " between machines, ", " between
    dates and commits). An entry without them (recorded before they were kept) takes the header's
    old values.

    Examples
    --------
    >>> old = {"machine": "AMD EPYC", "date": "2026-12-02", "notebooks": [{"notebook": "a", "commit": "c1"}]}
    >>> new = {"notebook": "b", "machine": "Intel Xeon", "date": "2026-12-03", "commit": "c2"}
    >>> out = summarise({**old, "notebooks": old["notebooks"] + [new]})
    >>> out["machine"], out["date"], out["commit"], out["notebooks"][0]["machine"]
    ('AMD EPYC and Intel Xeon', '2026-12-02, 2026-12-03', 'c1, c2', 'AMD EPYC')
    """
    fallback = {"machine": record.get("machine"), "date": record.get("date")}
    rows = list(record["notebooks"])
    entries = rows + list(record.get("checks", [])) + ([record["distributed"]] if record.get("distributed") else [])
    for entry in entries:
        for key, value in fallback.items():
            if value and key not in entry and " and " not in value and ", " not in value:
                entry[key] = value
            for run in entry.get("runs", []):
                if key in entry and key not in run:
                    run[key] = entry[key]

    def distinct(key: str) -> list[str]:
        return list(dict.fromkeys(str(e[key]) for e in rows if e.get(key)))

    header = {
        "machine": " and ".join(distinct("machine")) or _machine(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "date": ", ".join(sorted(distinct("date"))) or time.strftime("%Y-%m-%d"),
        "commit": ", ".join(sorted(distinct("commit"))) or _commit(),  # of the runs (each row keeps its own)
    }
    return header | {k: v for k, v in record.items() if k not in header}


def agreement(serial: Path, other: Path) -> dict[str, int]:
    """How many verifiable values two runs of the same notebooks recorded alike.

    ``values``: the keys both manifests hold; ``identical``: equal bit for bit; ``agree``: equal
    under ``tools/verify.py``'s rule (exact values equal, floating-point ones within their recorded
    tolerance, Monte Carlo ones within the family-wise threshold of their combined SEs);
    ``missing``: keys only one run recorded.
    """
    from nwlib.book._provenance import read_manifests
    from nwlib.evidence import ALPHA, family_threshold
    from verify import compare  # tools/

    a = {k: e for k, e in read_manifests(serial).items() if e["verify"]}
    b = {k: e for k, e in read_manifests(other).items() if e["verify"]}
    both = sorted(set(a) & set(b))
    n_mc = max(sum(a[k]["cls"] == "mc" for k in both), 1)
    z_star = family_threshold(n_mc, ALPHA)
    identical = sum(a[k]["value"] == b[k]["value"] for k in both)
    agree = sum(compare(b[k]["value"], b[k], a[k], z_star, n_mc)[0] for k in both)
    return {"values": len(both), "identical": identical, "agree": agree, "missing": len(set(a) ^ set(b))}


def distributed(notebook: str, spec: dict[str, dict[str, Any]], executor: str, timeout: float) -> dict[str, Any]:
    """Run ``notebook`` at its smaller fraction serially and on ``executor``, and compare the two runs' values.

    The serial run is the one :func:`measure` staged at that fraction where it finished (the full
    profile's executor is serial); otherwise it is run here.
    """
    sys.path.insert(0, str(ROOT / "tools"))
    fraction = spec[notebook]["fractions"][0]
    base = ROOT / "_build" / "full-reduced"
    serial = base / f"{notebook}-f{fraction:g}"
    reuse = (serial / "notebooks" / "_timings.json").is_file() and _ok(stage_result(notebook, serial)[1])
    if not reuse:
        serial = base / f"{notebook}-serial"
    serial_s, serial_status, _ = _run(notebook, fraction, serial, timeout, "serial", execute=not reuse)
    other_s, other_status, conditions = _run(notebook, fraction, base / f"{notebook}-distributed", timeout, executor)
    if not (_ok(serial_status) and _ok(other_status)):
        raise RuntimeError(f"{notebook}: serial run {serial_status}, {executor} run {other_status}")
    counts = agreement(serial / "notebooks", base / f"{notebook}-distributed" / "notebooks")
    return {
        "notebook": notebook,
        "fraction": fraction,
        "executor": executor,
        "seconds": other_s,
        "serial_seconds": serial_s,
        **counts,
        **conditions,
    }


def markdown_table(record: dict[str, Any]) -> str:
    """The record as the README's table (``benchmarks.report.full_profile_table``'s rows)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.report import full_profile_table

    table = full_profile_table(record)
    columns = ["notebook", "full profile", "how", "ran on", "reduced runs", "fixed part", "grid"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for _, row in table.iterrows()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per reduced run")
    parser.add_argument("--output", type=Path, default=RESULT)
    parser.add_argument(
        "--cores",
        metavar="LIST",
        default=None,
        help="pin each run to these CPUs (taskset -c LIST) with as many threads, e.g. 0 or 0,1; default: all",
    )
    parser.add_argument("--report", action="store_true", help="print the recorded table and run nothing")
    parser.add_argument(
        "--from-stages",
        action="store_true",
        help="rebuild the record from the runs already staged under _build/full-reduced/, execute nothing",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the recorded table as the README's Markdown table, run nothing"
    )
    parser.add_argument(
        "--distributed",
        metavar="EXECUTOR",
        default=None,
        help="instead: run the one notebook given at its smaller fraction serially and on EXECUTOR "
        "(e.g. dask:local:2) and record whether the two runs' values agree",
    )
    parser.add_argument(
        "--check",
        metavar="F",
        type=float,
        default=None,
        help="instead: run the one notebook given at a third fraction F and record its time beside the "
        "line's prediction (a check of t(f) = a + b f)",
    )
    args = parser.parse_args(argv)
    if args.report:
        print(json.dumps(json.loads(args.output.read_text()), indent=1))
        return 0
    if args.markdown:
        print(markdown_table(json.loads(args.output.read_text())))
        return 0
    spec = load_spec()
    if args.check is not None:
        if len(args.notebooks) != 1:
            parser.error("--check takes one notebook")
        name = args.notebooks[0].stem
        record = json.loads(args.output.read_text())
        row = next(r for r in record["notebooks"] if r["notebook"] == name)
        seconds, status, conditions = _run(
            name,
            args.check,
            ROOT / "_build" / "full-reduced" / f"{name}-f{args.check:g}",
            args.timeout,
            cores=args.cores,
        )
        predicted = row["intercept_s"] + row["slope_s"] * args.check
        check = {"notebook": name, "fraction": args.check, "seconds": seconds, "status": status, **conditions}
        check["predicted_s"] = round(predicted, 1)
        print(json.dumps(check), flush=True)
        record["checks"] = [c for c in record.get("checks", []) if c["notebook"] != name] + [check]
        args.output.write_text(json.dumps(summarise(record), indent=1) + "\n")
        return 0 if _ok(status) else 1
    if args.distributed:
        if len(args.notebooks) != 1 or args.notebooks[0].stem not in spec:
            parser.error("--distributed takes one notebook that profiles/full-reduced.yaml lists")
        check = distributed(args.notebooks[0].stem, spec, args.distributed, args.timeout)
        print(json.dumps(check), flush=True)
        record = json.loads(args.output.read_text())
        record["distributed"] = check
        args.output.write_text(json.dumps(summarise(record), indent=1) + "\n")
        return 0 if check["agree"] == check["values"] and not check["missing"] else 1
    names = [p.stem for p in args.notebooks] or sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    rows = measure(names, spec, args.timeout, execute=not args.from_stages, cores=args.cores)
    previous = json.loads(args.output.read_text()) if args.output.is_file() else {"notebooks": []}
    merged = {r["notebook"]: r for r in previous.get("notebooks", [])}  # a partial rerun keeps the others
    merged.update({r["notebook"]: r for r in rows})
    record = {k: previous[k] for k in ("machine", "date") if k in previous}  # the old rows' (summarise)
    record["notebooks"] = [merged[k] for k in sorted(merged)]
    for kept in ("distributed", "checks"):  # recorded by --distributed and --check
        if previous.get(kept):
            record[kept] = previous[kept]
    record = summarise(record)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    return 0 if all(_ok(r["status"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
