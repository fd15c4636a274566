"""A cache of executed notebooks, keyed on everything a notebook's results depend on.

``tools/run_notebooks.py`` asks :func:`lookup` before executing a notebook and calls :func:`store`
after a successful run. The key (:func:`cache_key`) is a SHA-256 over

* the notebook file itself (cells, metadata) and the parameters injected into it (the profile's
  file plus ``--device``, ``--seed``, ``--executor``);
* every source file of ``nwlib`` and ``benchmarks`` (jupyter-cache keys on cell source alone and
  would miss a change in the library the cells call);
* the data a notebook reads: ``book/data``, ``benchmarks/results`` and ``verify``;
* the environment that can change numbers: the pinned versions (``constraints.txt``), the
  installed versions of torch, numpy, scipy, sympy, pandas and matplotlib, the Python version,
  the machine's architecture, and the variables that select kernels and threads
  (``ATEN_CPU_CAPABILITY``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``).

Not in the key: the commit and the prose. A prose-only edit (a page under ``book/``, a commit)
reuses every executed notebook, and the provenance manifest that comes with it still names the
commit, date and machine of the run that produced each number. A notebook that reads the other
notebooks' results (the build record, ``appendix_environment``) is never cached.

An entry is a folder ``<cache>/<stem>/<key>/`` holding the executed notebook, its provenance
manifest, every other file the run wrote into the notebooks' folder (figures, sweep files) and
``entry.json`` (the seconds the run took, its files); the newest :data:`KEEP_PER_NOTEBOOK`
entries of a notebook are kept. ``make clean`` removes the cache; ``--no-cache``
(``make book NOCACHE=1``) ignores it for one run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE_TREES = ("nwlib", "benchmarks")
DATA_TREES = ("book/data", "benchmarks/results", "verify")
PINS = ("constraints.txt", "pyproject.toml")
PACKAGES = ("torch", "numpy", "scipy", "sympy", "pandas", "matplotlib", "papermill", "myst-nb")
ENV_VARS = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
NEVER_CACHED = frozenset({"appendix_environment"})
SCHEMA = 1
KEEP_PER_NOTEBOOK = 8


def _files(root: Path, trees: Iterable[str]) -> list[Path]:
    found = []
    for tree in trees:
        base = root / tree
        if base.is_file():
            found.append(base)
        elif base.is_dir():
            found += [
                p
                for p in base.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
            ]
    return sorted(found)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What of the machine and the installation enters the key (no package is imported)."""
    env = os.environ if env is None else env
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.system(),
        "packages": {p: _version(p) for p in PACKAGES},
        "env": {v: env.get(v) for v in ENV_VARS},
    }


def cache_key(
    notebook: Path,
    parameters: Mapping[str, Any],
    *,
    root: Path = ROOT,
    env: Mapping[str, Any] | None = None,
) -> str:
    """The SHA-256 (hex) of everything ``notebook``'s results depend on (see the module docstring).

    Parameters
    ----------
    notebook : Path
        The committed notebook (its bytes enter the key).
    parameters : Mapping
        The parameters papermill injects (JSON values).
    root : Path
        The repository root whose sources and data enter the key.
    env : Mapping, optional
        :func:`environment`'s result; default: this process's.
    """
    digest = hashlib.sha256()

    def feed(label: str, payload: bytes) -> None:
        digest.update(f"{label}\0{len(payload)}\0".encode())
        digest.update(payload)

    feed("schema", str(SCHEMA).encode())
    feed("notebook", Path(notebook).read_bytes())
    feed("parameters", json.dumps(dict(parameters), sort_keys=True, default=str).encode())
    for path in _files(root, SOURCE_TREES + DATA_TREES + PINS):
        feed(f"file:{path.relative_to(root).as_posix()}", path.read_bytes())
    feed("environment", json.dumps(environment() if env is None else dict(env), sort_keys=True).encode())
    return digest.hexdigest()


def _entry(cache: Path, stem: str, key: str) -> Path:
    return cache / stem / key


def lookup(cache: Path, stem: str, key: str, out_dir: Path) -> dict[str, Any] | None:
    """Copy a cached run of ``stem`` into ``out_dir`` and return its record, or None on a miss."""
    if stem in NEVER_CACHED:
        return None
    entry = _entry(cache, stem, key)
    record_path = entry / "entry.json"
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("schema") != SCHEMA or record.get("key") != key:
        return None
    files = record.get("files", [])
    if not all((entry / "files" / name).is_file() for name in files):
        return None  # an entry cut short: run again
    for name in files:
        target = out_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(entry / "files" / name, target)
    return record


def snapshot(out_dir: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under ``out_dir``: what a run changed is the difference."""
    return {
        p.relative_to(out_dir).as_posix(): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in out_dir.rglob("*")
        if p.is_file()
    }


def store(
    cache: Path,
    stem: str,
    key: str,
    out_dir: Path,
    before: Mapping[str, tuple[int, int]],
    *,
    seconds: float,
) -> Path | None:
    """Keep the files the run of ``stem`` wrote into ``out_dir`` (new or changed since ``before``).

    Returns the entry's folder, or None for a notebook that is never cached. The entry is written
    under a temporary name and renamed into place, so a crash leaves no half entry.
    """
    if stem in NEVER_CACHED:
        return None
    after = snapshot(out_dir)
    written = sorted(name for name, stat in after.items() if before.get(name) != stat)
    entry = _entry(cache, stem, key)
    tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for name in written:
        target = tmp / "files" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out_dir / name, target)
    tmp.mkdir(parents=True, exist_ok=True)
    record = {"schema": SCHEMA, "key": key, "notebook": stem, "seconds": round(seconds, 1), "files": written}
    (tmp / "entry.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(entry, ignore_errors=True)
    tmp.rename(entry)
    # a few entries per notebook (the book's seed, the robustness seeds, a portable run), newest kept
    entries = sorted(
        (p for p in (cache / stem).iterdir() if p.is_dir() and ".tmp" not in p.name),
        key=lambda p: p.stat().st_mtime_ns,
        reverse=True,
    )
    for old in entries[KEEP_PER_NOTEBOOK:]:
        shutil.rmtree(old, ignore_errors=True)
    return entry


if __name__ == "__main__":  # print the key of a notebook under a profile, for debugging
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_notebooks import load_parameters

    nb = Path(sys.argv[1]).resolve()
    print(cache_key(nb, load_parameters(sys.argv[2] if len(sys.argv) > 2 else "quick", nb)))
