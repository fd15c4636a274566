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
import sys
from functools import lru_cache
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from .._seeds import require_seed

ENV_NOTEBOOK = "NWLIB_NOTEBOOK"
SUFFIX = ".provenance.jsonl"

_started: set[str] = set()  # manifests truncated by this process


_run: dict[str, Any] = {}  # set by nwlib.book.setup


def set_run(*, profile: str, seed: int, device: Any, dtype: Any) -> None:
    """The run's profile, seed, device and dtype, recorded in every later entry of this process."""
    if not isinstance(profile, str) or not profile:
        raise TypeError(f"profile must be a non-empty string, got {profile!r}")
    _run.update(profile=profile, seed=require_seed(seed), device=_name(device), dtype=_name(dtype))


def _name(thing: Any) -> str | None:
    return None if thing is None else str(thing).removeprefix("torch.")


def _scalar(value: Any) -> Any:
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported: never import it here
    if torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0:
        return value.item()
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
        return value.item()
    return value


def kind_of(value: Any) -> str:
    """'bool', 'int', 'float', 'str' or 'other' (tables, figures, equations)."""
    value = _scalar(value)
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Integral):
        return "int"
    if isinstance(value, Real):
        return "float"
    if isinstance(value, str):
        return "str"
    return "other"


def digest(value: Any) -> str:
    """A digest of the content a reader sees: a table's cells, a figure's pixels, an equation's LaTeX.

    Never of ``repr`` alone where that is a memory address (a pandas Styler, a matplotlib figure).
    """
    data = getattr(value, "data", None)  # a pandas Styler holds its DataFrame as .data
    if hasattr(value, "to_csv"):
        payload = value.to_csv().encode()
    elif data is not None and hasattr(data, "to_csv") and hasattr(value, "to_string"):
        payload = value.to_string().encode()  # the formatted cells (to_html carries a random table id)
    elif hasattr(value, "savefig"):  # a matplotlib figure: its rendered pixels
        import io

        buffer = io.BytesIO()
        value.savefig(buffer, format="png", dpi=40, metadata={"Software": None})
        payload = buffer.getvalue()
    elif hasattr(value, "latex"):  # nwlib.book's glued math
        payload = str(value.latex).encode()
    elif hasattr(value, "text") and isinstance(value.text, str):  # glued code
        payload = value.text.encode()
    else:
        payload = repr(value).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def _plain(value: Any) -> tuple[Any, str]:
    """The value as JSON can hold it, and its kind."""
    value = _scalar(value)
    kind = kind_of(value)
    if kind == "bool":
        return value, kind
    if kind == "int":
        return int(value), kind
    if kind == "float":
        value = float(value)
        return (value if math.isfinite(value) else repr(value)), kind
    if kind == "str":
        return value, kind
    return f"<{type(value).__name__} {digest(value)}>", kind


@lru_cache(maxsize=1)
def git_output(repo: str | Path, *args: str) -> str | None:
    """git's stripped stdout for ``args`` run in ``repo``, or None (no git, or not a checkout)."""
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _run_facts() -> dict[str, Any]:
    """Facts fixed for the whole process: commit, whether the tree was dirty, versions."""
    repo = Path(__file__).resolve().parents[2]  # nwlib/book/ -> the checkout
    commit = git_output(repo, "rev-parse", "HEAD") or "unknown"
    status = git_output(repo, "status", "--porcelain", "--untracked-files=no")
    import torch

    from .. import __version__

    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "nwlib": __version__,
        "torch": torch.__version__,
    }


def _context() -> dict[str, Any]:
    """The cell, from the IPython kernel when there is one."""
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
    return out


def record(
    name: str,
    value: Any,
    *,
    cls: str,
    se: float | None = None,
    df: float | None = None,
    tol: float | None = None,
    dtype: Any = None,
    device: Any = None,
) -> dict[str, Any] | None:
    """Append one manifest entry for a glued value; return it (None outside a book build).

    ``cls`` is the value's class (see :func:`nwlib.book.glue`): 'mc', 'exact', 'fp', 'info' or
    'other'. The dtype and device are the tensor's own, else those given, else the run's
    (:func:`set_run`).
    """
    notebook = os.environ.get(ENV_NOTEBOOK)
    if not notebook:
        return None
    if getattr(value, "dtype", None) is not None and hasattr(value, "device") and hasattr(value, "dim"):
        dtype, device = value.dtype, value.device
    plain, kind = _plain(value)
    entry = {
        "key": name,
        "value": plain,
        "kind": kind,
        "cls": cls,
        "se": float(se) if se is not None else None,
        # the SE's degrees of freedom (None: not stated, taken as known); JSON has no inf
        "df": float(df) if df is not None and math.isfinite(df) else None,
        "tol": float(tol) if tol is not None else None,
        "exact": cls == "exact",
        "verify": cls in ("mc", "exact", "fp"),
        "notebook": notebook,
        **_context(),
        "profile": _run.get("profile"),
        "seed": _run.get("seed"),
        "device": _name(device) or _run.get("device"),
        "dtype": _name(dtype) or _run.get("dtype"),
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
