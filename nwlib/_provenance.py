"""The results manifest: where every glued value came from.

:func:`nwlib.book.glue` calls :func:`record` for every value it glues, so no
number reaches the book without an entry. Entries are appended, one JSON object
per line, to ``<notebook>.provenance.jsonl`` in the notebook's working directory
(beside the executed notebook). The book's runner names the notebook through the
environment variable ``NWLIB_NOTEBOOK``; outside a book build (no such variable)
nothing is written.

An entry holds the value (numbers and strings as themselves; tables, figures and
equations as a type name and a digest), the key, the notebook, the cell (its id
and execution count), the run's parameters read from the notebook's namespace
(``profile``, ``seed``, ``device`` (or the resolved ``dev``), ``dtype``), the git
commit, the nwlib and torch versions, and the time; plus what ``make verify``
needs: the value's Monte Carlo standard error (``se``), whether it must match
exactly (``exact``), and whether it is compared at all (``verify``: not for
timings and other measurements of the machine).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import subprocess
from functools import lru_cache
from numbers import Integral, Real
from pathlib import Path
from typing import Any

ENV_NOTEBOOK = "NWLIB_NOTEBOOK"
SUFFIX = ".provenance.jsonl"

_started: set[str] = set()  # manifests truncated by this process


def _plain(value: Any) -> tuple[Any, str]:
    """The value as JSON can hold it, and its kind: number, string, bool or other."""
    try:
        import torch

        if isinstance(value, torch.Tensor) and value.dim() == 0:
            value = value.item()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
        value = value.item()
    if isinstance(value, bool):
        return value, "bool"
    if isinstance(value, Integral):
        return int(value), "int"
    if isinstance(value, Real):
        value = float(value)
        return (value if math.isfinite(value) else repr(value)), "float"
    if isinstance(value, str):
        return value, "str"
    digest = hashlib.sha256(repr(value).encode()).hexdigest()[:16]
    return f"<{type(value).__name__} {digest}>", "other"


@lru_cache(maxsize=1)
def _run_facts() -> dict[str, str]:
    """Facts fixed for the whole process: commit, versions."""
    repo = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import torch

    from . import __version__

    return {"commit": commit, "nwlib": __version__, "torch": torch.__version__}


def _context() -> dict[str, Any]:
    """The cell and the run's parameters, from the IPython kernel when there is one."""
    out: dict[str, Any] = {"cell_id": None, "execution_count": None}
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:
        return out
    out["execution_count"] = shell.execution_count
    kernel = getattr(shell, "kernel", None)
    if kernel is not None and hasattr(kernel, "get_parent"):
        out["cell_id"] = (kernel.get_parent() or {}).get("metadata", {}).get("cellId")
    ns = shell.user_ns
    device = ns.get("dev", ns.get("device"))
    dtype = ns.get("dtype")
    out.update(
        profile=ns.get("profile"),
        seed=ns.get("seed"),
        device=str(device) if device is not None else None,
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
    )
    return out


def record(name: str, value: Any, *, se: float | None, exact: bool | None, verify: bool) -> dict[str, Any] | None:
    """Append one manifest entry for a glued value; return it (None outside a book build)."""
    notebook = os.environ.get(ENV_NOTEBOOK)
    if not notebook:
        return None
    plain, kind = _plain(value)
    if se is not None:
        se = float(se)
    entry = {
        "key": name,
        "value": plain,
        "kind": kind,
        "se": se if se is None or math.isfinite(se) else None,
        "exact": bool(exact) if exact is not None else kind in ("str", "int", "bool"),
        "verify": bool(verify) and kind != "other",
        "notebook": notebook,
        **_context(),
        **_run_facts(),
        "time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    path = Path.cwd() / f"{notebook}{SUFFIX}"
    mode = "a" if notebook in _started else "w"  # a rerun of the notebook starts a new manifest
    _started.add(notebook)
    with path.open(mode) as fh:
        fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return entry


def read_manifests(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(notebook, key): entry}`` from every manifest in ``folder``; a key glued twice keeps its last value."""
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(Path(folder).glob(f"*{SUFFIX}")):
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                entries[(entry["notebook"], entry["key"])] = entry
    return entries
