"""Execute the book's notebooks with papermill under one parameter profile.

The committed notebooks in ``notebooks/`` carry no outputs. This script stages
the book sources under ``--stage`` (default ``_build/stage``) and writes the
executed notebooks there, so that Jupyter Book builds from executed copies and
the working tree stays clean.

    python tools/run_notebooks.py --profile quick
    python tools/run_notebooks.py --profile standard notebooks/ch01_attention_is_nw.ipynb

Parameters for notebook ``notebooks/<stem>.ipynb`` under profile ``P`` come
from ``profiles/P/<stem>.yaml`` (a file papermill can read with ``-f``); the
name of the profile is injected as the parameter ``profile``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import papermill
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("quick", "standard", "full")
BOOK_SOURCES = ("_config.yml", "_toc.yml", "references.bib", "book")


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


def load_parameters(profile: str, notebook: Path) -> dict:
    path = ROOT / "profiles" / profile / f"{notebook.stem}.yaml"
    if not path.is_file():
        raise SystemExit(f"missing parameter file {path.relative_to(ROOT)} for {notebook.name}")
    params = yaml.safe_load(path.read_text()) or {}
    params["profile"] = profile
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=PROFILES, default="standard")
    parser.add_argument("--stage", type=Path, default=ROOT / "_build" / "stage")
    parser.add_argument("--device", default=None, help="override the notebooks' device parameter")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    args = parser.parse_args(argv)

    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise SystemExit("no notebooks found")
    stage_sources(args.stage)
    out_dir = args.stage / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    timings = []
    for nb in notebooks:
        params = load_parameters(args.profile, nb)
        if args.device is not None:
            params["device"] = args.device
        start = time.perf_counter()
        print(f"[{args.profile}] executing {nb.relative_to(ROOT)}", flush=True)
        try:
            papermill.execute_notebook(
                str(nb),
                str(out_dir / nb.name),
                parameters=params,
                kernel_name="python3",
                cwd=str(out_dir),
                progress_bar=False,
            )
            status = "ok"
        except papermill.PapermillExecutionError as err:
            # Keep going so that one run reports every failing notebook.
            status = f"FAILED: {err.ename}: {err.evalue}"
        timings.append((nb.name, time.perf_counter() - start, status))
    for name, seconds, status in timings:
        print(f"  {seconds:7.1f} s  {name}  {status}")
    print(f"  {sum(t[1] for t in timings):7.1f} s  total (profile {args.profile})")
    failed = [name for name, _, status in timings if status != "ok"]
    if failed:
        print(f"{len(failed)} notebook(s) raised: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
