"""Execute the book's notebooks with papermill under one parameter profile.

The committed notebooks in ``notebooks/`` carry no outputs. This script stages
the book sources under ``--stage`` (default ``_build/stage``) and writes the
executed notebooks there, so that Jupyter Book builds from executed copies and
the working tree stays clean.

    python tools/run_notebooks.py --profile quick
    python tools/run_notebooks.py --profile standard notebooks/ch01_attention_is_nw.ipynb
    python tools/run_notebooks.py --profile full --device cuda --timeout 3600
    python tools/run_notebooks.py --profile full --executor process:8

Parameters for notebook ``notebooks/<stem>.ipynb`` under profile ``P`` come
from ``profiles/P/<stem>.yaml`` (a file papermill can read with ``-f``); the
name of the profile is injected as the parameter ``profile``.

Each notebook runs in a process of its own, under two limits: ``--cell-timeout``
seconds for any one cell (papermill's ``execution_timeout``) and ``--timeout``
seconds for the whole notebook, after which the process and its kernel are
killed. Whatever goes wrong with one notebook (an exception in a cell, a cell or
notebook timeout, a dead kernel, a missing parameter file) is reported and the
run goes on with the next; a table at the end lists every notebook with its time
and status, and the exit status is 1 if any notebook failed. The kernel's own
console output goes to a log file per notebook (``<stage>-logs/<stem>.log``),
whose tail is printed when the notebook fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("quick", "standard", "full")
BOOK_SOURCES = ("_config.yml", "_toc.yml", "references.bib", "book")
# Default limit per notebook, in seconds (the quick profile's notebooks take well under a minute each
# on 2 CPU cores, the standard ones a few minutes; full is meant for a GPU).
DEFAULT_TIMEOUT = {"quick": 600, "standard": 1800, "full": 4 * 3600}
LOG_TAIL_LINES = 25
# The build's own record (environment, per-notebook times) reads the others' timings: it runs last.
RUNS_LAST = "appendix_environment"
TIMINGS_FILE = "_timings.json"


@dataclass
class Result:
    notebook: str
    profile: str
    seconds: float
    status: str  # "ok", "FAILED" or "TIMEOUT"
    detail: str = ""
    cached: bool = False  # reused from the cache (tools/nbcache.py): seconds are the original run's

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def stage_sources(stage: Path) -> None:
    """Copy the book's prose and configuration (not the notebooks) into ``stage``."""
    stage.mkdir(parents=True, exist_ok=True)
    for name in BOOK_SOURCES:
        src, dst = ROOT / name, stage / name
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    import yaml  # (imported here like in load_parameters: the child processes do not need it)

    # The repository URL has one home, repository.url; pages quote it as {{ repo_url }}.
    config_path = stage / "_config.yml"
    config = yaml.safe_load(config_path.read_text())
    parse = config.setdefault("parse", {})
    from repo_url import site_url  # tools/, this script's folder

    url = str(config["repository"]["url"]).rstrip("/")
    site = site_url(url)
    subs = parse.setdefault("myst_substitutions", {})
    subs.update(repo_url=url, site_url=site)
    subs["pdf_link"] = f"[PDF]({site}/nwlib-companion.pdf)"  # the Pages workflow publishes it there
    config_path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def parameter_file(profile: str, notebook: Path) -> Path:
    return ROOT / "profiles" / profile / f"{notebook.stem}.yaml"


def load_parameters(profile: str, notebook: Path) -> dict:
    """The profile's parameters for ``notebook``, plus ``profile`` itself."""
    import yaml

    path = parameter_file(profile, notebook)
    if not path.is_file():
        raise FileNotFoundError(f"missing parameter file {_rel(path)} for {notebook.name}")
    params = yaml.safe_load(path.read_text()) or {}
    if not isinstance(params, dict):
        raise ValueError(f"{_rel(path)} must hold a mapping of parameter names to values")
    params["profile"] = profile
    return params


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The kernel's debugger warns about frozen modules on every start; the warning is noise here.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _kill_tree(proc: subprocess.Popen) -> None:
    """Stop the notebook's process and its kernel (which jupyter_client starts in a session of its own)."""
    descendants = []
    try:
        import psutil

        descendants = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # psutil missing, or the process already gone
        pass
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for child in descendants:
            try:
                child.send_signal(sig)
            except Exception:
                pass
        try:
            proc.wait(timeout=grace)
            if sig == signal.SIGTERM:
                for child in descendants:
                    try:
                        child.wait(timeout=grace)
                    except Exception:
                        pass
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run_one(nb: Path, args: argparse.Namespace, out_dir: Path, log_dir: Path) -> Result:
    """Execute one notebook in a child process under the notebook and cell limits."""
    start = time.perf_counter()

    def result(status: str, detail: str = "") -> Result:
        return Result(nb.stem, args.profile, time.perf_counter() - start, status, detail)

    if not nb.is_file():
        return result("FAILED", f"no such notebook {_rel(nb)}")
    try:
        params = load_parameters(args.profile, nb)
    except Exception as err:  # missing or malformed parameter file
        return result("FAILED", f"{type(err).__name__}: {err}")
    fraction = getattr(args, "fraction", None)
    if fraction is not None:  # the full profile at a fraction of its work (tools/full_profile.py)
        import full_profile  # tools/, this script's folder

        spec = full_profile.load_spec()
        if nb.stem in spec:
            params = full_profile.reduced_parameters(params, spec[nb.stem]["scale"], fraction)
    if args.device is not None:
        params["device"] = args.device
    if args.seed is not None:
        params["seed"] = args.seed
    if args.executor is not None and "executor" in params:  # only notebooks whose grid runs through run_sweep
        params["executor"] = args.executor
    overridden = [name for name in ("device", "seed") if getattr(args, name) is not None]

    import nbcache  # tools/, this script's folder

    key = nbcache.cache_key(nb, params)
    if not (args.no_cache or args.time_profile):  # a profile needs a run
        hit = nbcache.lookup(args.cache_dir, nb.stem, key, out_dir)
        if hit is not None:
            return Result(nb.stem, args.profile, float(hit["seconds"]), "ok", "cached", cached=True)
    before = nbcache.snapshot(out_dir)

    log = log_dir / f"{nb.stem}.log"
    spec_path = log_dir / f"{nb.stem}.spec.json"
    result_path = log_dir / f"{nb.stem}.result.json"
    result_path.unlink(missing_ok=True)
    spec_path.write_text(
        json.dumps(
            {
                "input": str(nb),
                "output": str(out_dir / nb.name),
                "cwd": str(out_dir),
                "parameters": params,
                "cell_timeout": args.cell_timeout or None,
                "result": str(result_path),
                "profile": args.profile,
                "parameter_path": _rel(parameter_file(args.profile, nb))
                + "".join(f", {name}={params[name]!r} from the command line" for name in overridden)
                + (f", at fraction {fraction:g} of its work (profiles/full-reduced.yaml)" if fraction else ""),
            }
        )
    )
    timeout = args.timeout or None
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--execute-one", str(spec_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # The kernel inherits the name: nwlib.book.glue writes <stem>.provenance.jsonl beside it.
            env={
                **_child_env(),
                "NWLIB_NOTEBOOK": nb.stem,
                **({"NWLIB_TIME_PROFILE": str(args.time_profile.resolve())} if args.time_profile else {}),
            },
            cwd=str(out_dir),
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            return result("TIMEOUT", f"notebook exceeded --timeout {args.timeout:g} s and was stopped")
        except BaseException:  # Ctrl-C: take the kernel down with us
            _kill_tree(proc)
            raise
    try:
        reported = json.loads(result_path.read_text())
    except (OSError, ValueError):
        reported = {"status": "FAILED", "detail": f"runner process exited with code {rc} before reporting"}
    res = result(reported["status"], reported.get("detail", ""))
    if res.ok:
        nbcache.store(args.cache_dir, nb.stem, key, out_dir, before, seconds=res.seconds)
    return res


def label_parameter_cells(notebook: dict, profile: str, parameter_path: str) -> dict:
    """Say, in the executed notebook, which of its two parameter cells ran.

    papermill keeps the notebook's defaults (the cell tagged ``parameters``) and adds after it a
    cell tagged ``injected-parameters`` with the profile's values, which override them. A reader of
    the page would see two unlabelled cells; a short note before each says which is which.
    Returns the notebook (a dict in nbformat 4), changed in place.
    """
    notes = {
        "parameters": "*The notebook's default parameters; the next cell overrides them with the values that ran.*",
        "injected-parameters": (
            f"*The parameters that ran: profile `{profile}`, from `{parameter_path}` (injected by papermill).*"
        ),
    }
    cells = []
    for cell in notebook.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        for tag, text in notes.items():
            if tag in tags:
                cells.append({"cell_type": "markdown", "id": f"note-{tag}", "metadata": {}, "source": text})
        cells.append(cell)
    notebook["cells"] = cells
    return notebook


def execute_one(spec_path: Path) -> int:
    """Child process: run papermill on one notebook and write a one-line result file."""
    spec = json.loads(spec_path.read_text())
    status, detail = "ok", ""
    try:
        import papermill

        papermill.execute_notebook(
            spec["input"],
            spec["output"],
            parameters=spec["parameters"],
            kernel_name="python3",
            cwd=spec["cwd"],
            progress_bar=False,
            execution_timeout=spec["cell_timeout"],
        )
        out = Path(spec["output"])
        executed = label_parameter_cells(
            json.loads(out.read_text()), spec.get("profile", "?"), spec.get("parameter_path", "its profile")
        )
        out.write_text(json.dumps(executed, indent=1, ensure_ascii=False) + "\n")
    except BaseException as err:  # every kind of failure is reported, not only PapermillExecutionError
        status = "FAILED"
        if type(err).__name__ == "PapermillExecutionError":
            detail = f"cell [{err.exec_count}]: {err.ename}: {err.evalue}"  # type: ignore[attr-defined]
        elif isinstance(err, TimeoutError):  # nbclient's CellTimeoutError
            status = "TIMEOUT"
            detail = f"a cell exceeded --cell-timeout {spec['cell_timeout']} s"
        else:  # a dead kernel, a kernel that did not start, an unreadable notebook, ...
            detail = f"{type(err).__name__}: {err}"
        detail = " ".join(detail.split())[:500]
        import traceback

        traceback.print_exc()
    Path(spec["result"]).write_text(json.dumps({"status": status, "detail": detail}))
    return 0 if status == "ok" else 1


def print_summary(results: list[Result], total: float) -> None:
    width = max([len("notebook")] + [len(r.notebook) for r in results])
    print()
    print(f"{'notebook':<{width}}  {'profile':<8}  {'seconds':>8}  status")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 8}  {'-' * 6}")
    for r in results:
        status = (f"{r.status} (cached)" if r.cached else r.status) if r.ok else f"{r.status}: {r.detail}"
        if len(status) > 100:
            status = status[:97] + "..."
        print(f"{r.notebook:<{width}}  {r.profile:<8}  {r.seconds:8.1f}  {status}")
    failed = sum(not r.ok for r in results)
    print(f"{'total':<{width}}  {'':<8}  {total:8.1f}  {len(results) - failed} ok, {failed} failed")


def write_timings(path: Path, results: list[Result]) -> None:
    """Record what has run so far, for the build's environment page (read by its notebook)."""
    path.write_text(
        json.dumps(
            [
                {
                    "notebook": r.notebook,
                    "profile": r.profile,
                    "seconds": round(r.seconds, 1),
                    "status": r.status,
                    "cached": r.cached,
                }
                for r in results
            ],
            indent=1,
        )
    )


def write_time_profile(folder: Path, results: list[Result]) -> Path:
    """Merge the per-notebook profiles with the notebooks' total times into ``<folder>/summary.json``.

    A notebook's total (the runner's clock) minus its profiled part (from ``start`` to ``finish``)
    is the kernel's start and the imports.
    """
    rows = []
    for r in results:
        path = folder / f"{r.notebook}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        seconds = dict(record["seconds"])
        seconds["kernel start and imports"] = round(max(r.seconds - record["wall_seconds"], 0.0), 2)
        rows.append(
            {"notebook": r.notebook, "profile": r.profile, "total_seconds": round(r.seconds, 2), "seconds": seconds}
        )
    from nwlib.book.build_record import cpu_model  # imports no torch

    summary = {
        "machine": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "variant": {v: os.environ.get(v) for v in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")},
        "date": time.strftime("%Y-%m-%d"),
        "notebooks": rows,
    }
    out = folder / "summary.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"time profile of {len(rows)} notebook(s): {_rel(out)}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--execute-one"]:
        return execute_one(Path(argv[1]))

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=PROFILES, default="standard")
    parser.add_argument("--stage", type=Path, default=ROOT / "_build" / "stage")
    parser.add_argument("--device", default=None, help="override the notebooks' device parameter")
    parser.add_argument("--seed", type=int, default=None, help="override the notebooks' seed parameter")
    parser.add_argument(
        "--executor",
        default=None,
        help="where the notebooks' sweeps run (nwlib.sweep.run_sweep): serial, process, process:N, dask:<address>",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds allowed per notebook, 0 for no limit (default by profile: "
        + ", ".join(f"{name} {seconds}" for name, seconds in DEFAULT_TIMEOUT.items())
        + ")",
    )
    parser.add_argument(
        "--cell-timeout",
        type=int,
        default=None,
        help="seconds allowed per cell (papermill's execution_timeout), 0 for no limit (default: --timeout)",
    )
    parser.add_argument(
        "--time-profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile each notebook (nwlib.book._timeprofile) into DIR/<notebook>.json; implies --no-cache",
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="with --profile full: scale the parameters profiles/full-reduced.yaml lists by this fraction "
        "(tools/full_profile.py); implies --no-cache",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="execute every notebook even where the cache holds its run"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=ROOT / "_build" / "cache",
        help="executed notebooks keyed on every input (tools/nbcache.py); default _build/cache",
    )
    parser.add_argument(
        "--sources-only", action="store_true", help="refresh the staged prose and configuration, execute nothing"
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    args = parser.parse_args(argv)
    if args.fraction is not None:
        if args.profile != "full" or not 0 < args.fraction <= 1:
            parser.error("--fraction takes a number in (0, 1] and --profile full")
        args.no_cache = True  # a reduced run is not the profile's run
    if args.sources_only:
        stage_sources(args.stage.resolve())
        print(f"staged the book's sources into {_rel(args.stage)}")
        return 0
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT[args.profile]
    if args.cell_timeout is None:
        args.cell_timeout = int(args.timeout)

    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    notebooks.sort(key=lambda p: p.stem == RUNS_LAST)  # stable: the others keep their order
    if not notebooks:
        print("no notebooks found", file=sys.stderr)
        return 1
    stage = args.stage.resolve()
    stage_sources(stage)
    out_dir = stage / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = stage.parent / f"{stage.name}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    limits = f"limits: {args.timeout:g} s per notebook, {args.cell_timeout} s per cell (0 = none)"
    print(f"executing {len(notebooks)} notebook(s), profile {args.profile}, into {_rel(out_dir)}; {limits}")
    print(f"kernel output: {_rel(log_dir)}/<notebook>.log", flush=True)

    results: list[Result] = []
    started = time.perf_counter()
    for i, nb in enumerate(notebooks, 1):
        tag = f"[{i}/{len(notebooks)}] {nb.stem} ({args.profile})"
        print(f"{tag} ...", flush=True)
        res = run_one(nb, args, out_dir, log_dir)
        results.append(res)
        write_timings(out_dir / TIMINGS_FILE, results)
        elapsed = time.perf_counter() - started
        how = "from the cache (a run of" if res.cached else "in"
        print(
            f"{tag} {res.status} {how} {res.seconds:.1f} s{')' if res.cached else ''} (elapsed {elapsed:.1f} s)",
            flush=True,
        )
        if not res.ok:
            print(f"    {res.detail}", flush=True)
            tail = _log_tail(log_dir / f"{nb.stem}.log")
            if tail:
                print(f"    --- last lines of {_rel(log_dir / (nb.stem + '.log'))} ---")
                print("    " + tail.replace("\n", "\n    "), flush=True)
    print_summary(results, time.perf_counter() - started)
    if args.time_profile:
        write_time_profile(args.time_profile, results)
    failed = [r.notebook for r in results if not r.ok]
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
