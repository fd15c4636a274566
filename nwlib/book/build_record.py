"""The build's own record: environment, notebook timings, reruns, citation blocks and provenance.

Serves ``notebooks/appendix_environment.ipynb``, the book's *This build* page
(``book/build.md``), the table of reruns with other seeds and CPUs on ``book/reproducing.md``
and the *Cite this chapter* block of every chapter. Everything here reads what the build left
behind (the runner's ``_timings.json``, the committed ``verify/robustness-quick.json`` and
``verify/portable-quick.json``, the results manifests beside the executed notebooks, the staged
``_config.yml``) or asks the machine (git, ``/proc/cpuinfo``, torch's versions and threads).

No torch at import time: :func:`environment` imports it when called, so that tools reading
the record start quickly; pandas is imported by the functions that build tables.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._provenance import git_output, read_manifests

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "COMPANION",
    "MANIFEST_COLUMNS",
    "TIMINGS_COLUMNS",
    "Robustness",
    "book_urls",
    "citations",
    "cpu_model",
    "environment",
    "environment_table",
    "git",
    "provenance",
    "robustness",
    "robustness_rows",
    "software_entry",
    "timings",
    "timings_values",
]

COMPANION = "Multi-head attention as ensemble Nadaraya-Watson estimation: a claim-checking companion (nwlib)"
"""The companion's title in its citation block."""
TIMINGS_COLUMNS = ("notebook", "profile", "seconds", "status")
"""The fields of one notebook's entry in the runner's ``_timings.json`` (``tools/run_notebooks.py``)."""
MANIFEST_COLUMNS = (
    "notebook",
    "key",
    "value",
    "execution_count",
    "profile",
    "seed",
    "device",
    "dtype",
    "cls",
    "se",
    "tol",
    "verify",
)
"""The fields of a manifest entry shown in the provenance table (``execution_count`` as ``cell``)."""
_NO_ROBUSTNESS: dict[str, Any] = {"date": "never", "commit": "none", "machine": {}}


def _require_path(value: object, name: str) -> Path:
    if not isinstance(value, str | Path):
        raise TypeError(f"{name} must be a str or Path, got {type(value).__name__}")
    return Path(value)


def git(repo: str | Path, *args: str) -> str:
    """A git answer about the checkout at ``repo`` (stripped stdout), or ``"unknown"`` outside one.

    Parameters
    ----------
    repo : str or Path
        The working directory for git.
    *args : str
        git's arguments, e.g. ``"rev-parse", "HEAD"``.

    Examples
    --------
    >>> git("/", "rev-parse", "--is-inside-work-tree")
    'unknown'
    """
    folder = _require_path(repo, "repo")
    if not all(isinstance(a, str) for a in args):
        raise TypeError("args must be strings")
    answer = git_output(folder, *args)
    return "unknown" if answer is None else answer


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name from ``cpuinfo`` (Linux), else what :mod:`platform` says."""
    try:
        for line in _require_path(cpuinfo, "cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(
    profile: str,
    device: Any,
    repo: str | Path,
    *,
    now: dt.datetime | None = None,
    cpuinfo: str | Path = "/proc/cpuinfo",
) -> dict[str, str]:
    """The software and machine of this build, as the *This build* page lists them.

    Parameters
    ----------
    profile : str
        The build's parameter profile.
    device : torch.device
        The device the notebooks ran on (a CUDA device is named).
    repo : str or Path
        The checkout nwlib was imported from (its commit, and whether it had uncommitted changes).
    now : datetime, optional
        The build's time (default: now, UTC).
    cpuinfo : str or Path
        Where :func:`cpu_model` reads the CPU's name.

    Returns
    -------
    dict
        ``profile``, ``built (UTC)`` (``YYYY-MM-DD HH:MM``), ``git commit`` (12 hex digits, with
        "(with uncommitted changes)" when tracked files differ from it), ``nwlib``, ``Python``,
        ``torch``, ``numpy``, ``platform``, ``CPU`` (model, instruction set torch dispatches to,
        threads) and ``device``.
    """
    import numpy as np
    import torch

    from .. import __version__

    if not isinstance(profile, str):
        raise TypeError(f"profile must be a string, got {type(profile).__name__}")
    dev = torch.device(device)
    built = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M")
    commit = git(repo, "rev-parse", "HEAD")
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    threads = f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
    return {
        "profile": profile,
        "built (UTC)": built,
        "git commit": commit[:12] + (" (with uncommitted changes)" if dirty not in ("", "unknown") else ""),
        "nwlib": __version__,
        "Python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "CPU": f"{cpu_model(cpuinfo)} ({threads})",
        "device": str(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""),
    }


def environment_table(env: Mapping[str, str]) -> pd.DataFrame:
    """:func:`environment` as a one-column table (``value``), indexed by the fields, in the book's table style."""
    import pandas as pd

    from .tables import table

    return table(pd.DataFrame({"value": dict(env)}))


def timings(path: str | Path) -> pd.DataFrame:
    """The notebooks' execution times the runner hands to this notebook (``_timings.json``).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`TIMINGS_COLUMNS`, one row per notebook that ran before; empty where the
        file is absent (a notebook run by hand).
    """
    import pandas as pd

    file = _require_path(path, "path")
    runs = json.loads(file.read_text()) if file.is_file() else []
    return pd.DataFrame(runs, columns=list(TIMINGS_COLUMNS))


def timings_values(table: pd.DataFrame) -> dict[str, Any]:
    """``timings_total_s`` (seconds in all, NaN without notebooks) and ``timings_count`` of :func:`timings`."""
    total = float(table["seconds"].sum()) if len(table) else math.nan
    return {"timings_total_s": total, "timings_count": len(table)}


def robustness_rows(path: str | Path) -> list[dict[str, Any]]:
    """One row per seed of a committed robustness result (``tools/robustness.py``); [] without the file.

    Each row has ``run`` (variant), ``seed``, ``notebooks failed``, ``asserted held`` and
    ``reported held`` (``held/total``), ``labels`` (agree or differ), ``values agree``
    (``agreeing/compared``), ``z*``, ``result`` (ok or FAILED) and ``meta``, the whole file.
    """
    file = _require_path(path, "path")
    if not file.is_file():
        return []
    result = json.loads(file.read_text())
    rows = []
    for r in result["seeds"]:
        f = r["findings"]
        compared = r["values_compared"]
        rows.append({
            "run": r["variant"],
            "seed": r["seed"],
            "notebooks failed": len(r["notebooks_failed"]),
            "asserted held": f"{f['asserted_held']}/{f['asserted']}",
            "reported held": f"{f['reported_held']}/{f['reported']}",
            "labels": "agree" if r["labels_agree"] else "differ",
            "values agree": f"{(compared or 0) - len(r['values_failed'])}/{compared}",
            "z*": r["z_star"],
            "result": "ok" if r["ok"] else "FAILED",
            "meta": result,
        })  # fmt: skip
    return rows


@dataclass(frozen=True)
class Robustness:
    """The reruns of the quick profile with other seeds and CPUs (:func:`robustness`).

    Attributes
    ----------
    table : pandas.DataFrame
        One row per rerun (:func:`robustness_rows` without ``meta``).
    values : dict
        ``robustness_seeds`` (the native reruns' seeds), ``robustness_z`` (the largest z*),
        ``robustness_date``, ``robustness_commit`` and ``robustness_machine`` of the first file.
    """

    table: Any
    values: dict[str, Any] = field(default_factory=dict)


def robustness(paths: Iterable[str | Path]) -> Robustness:
    """The committed rerun results (``verify/robustness-quick.json``, ``verify/portable-quick.json``), together.

    Parameters
    ----------
    paths : iterable of str or Path
        Result files of ``tools/robustness.py``; absent ones are left out.

    Returns
    -------
    Robustness
    """
    import pandas as pd

    if isinstance(paths, str | Path):
        raise TypeError("paths must be an iterable of paths, not a single path")
    rows = [row for path in paths for row in robustness_rows(path)]
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "meta"} for r in rows])
    meta = rows[0]["meta"] if rows else _NO_ROBUSTNESS
    machine = meta.get("machine", {})
    values = {
        "robustness_seeds": ", ".join(str(r["seed"]) for r in rows if r["run"] == "native") or "none",
        "robustness_z": max([r["z*"] or 0.0 for r in rows] or [0.0]),
        "robustness_date": meta["date"],
        "robustness_commit": meta["commit"],
        "robustness_machine": f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu_capability', '?')}), "
        f"torch {machine.get('torch', '?')}",
    }
    return Robustness(table, values)


def book_urls(config_path: str | Path) -> tuple[str, str]:
    """The repository and site addresses of the staged book (``parse.myst_substitutions`` of ``_config.yml``).

    ``tools/run_notebooks.py`` derives both from ``repository.url`` when it stages the book;
    ``("unknown", "unknown")`` without a staged configuration.
    """
    import yaml

    file = _require_path(config_path, "config_path")
    config = yaml.safe_load(file.read_text()) if file.is_file() else {}
    substitutions = (config or {}).get("parse", {}).get("myst_substitutions", {})
    return substitutions.get("repo_url", "unknown"), substitutions.get("site_url", "unknown")


def software_entry(key: str, title: str, url: str, *, year: str, version: str, chapter: str = "") -> str:
    """A BibTeX ``@software`` entry for the companion or one of its chapters.

    Examples
    --------
    >>> print(software_entry("k", "T", "https://x", year="2026", version="0.2.0"))
    @software{k,
      title   = {T},
      author  = {{The nwlib companion contributors}},
      year    = {2026},
      version = {0.2.0},
      url     = {https://x},
      license = {MIT}
    }
    """
    for name, value in (("key", key), ("title", title), ("url", url)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    lines = [
        f"@software{{{key},",
        f"  title   = {{{title}}},",
        "  author  = {{The nwlib companion contributors}},",
        f"  year    = {{{year}}},",
        f"  version = {{{version}}},",
        f"  url     = {{{url}}},",
    ]
    if chapter:
        lines.append(f"  note    = {{Chapter of: {COMPANION}}},")
    return "\n".join([*lines, "  license = {MIT}", "}"])


def citations(book: str | Path, *, site: str, repo_url: str, year: str, version: str) -> dict[str, str]:
    """The citation blocks: ``cite_<chapter stem>`` for every ``chNN_*.md`` under ``book``, then ``cite_companion``.

    A chapter's title is its page's first line (a ``#`` heading); its address is
    ``<site>/book/<stem>.html``; the companion's is the repository.
    """
    folder = _require_path(book, "book")
    entries = {}
    for page in sorted(folder.glob("ch[0-9][0-9]_*.md")):
        title = page.read_text().splitlines()[0].lstrip("# ").strip()
        url = f"{site}/book/{page.stem}.html"
        entries[f"cite_{page.stem}"] = software_entry(
            f"nwlib_{page.stem}", title, url, year=year, version=version, chapter=page.stem
        )
    entries["cite_companion"] = software_entry("nwlib_companion", COMPANION, repo_url, year=year, version=version)
    return entries


def provenance(folder: str | Path, *, formatted: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every glued value recorded in the manifests under ``folder``, and a summary per notebook.

    Parameters
    ----------
    folder : str or Path
        The folder of executed notebooks and their ``<notebook>.provenance.jsonl`` manifests.
    formatted : bool, default True
        Format values for a page (floats to 6 significant digits, text cut to 60 characters);
        False keeps them as recorded (the downloadable manifest).

    Returns
    -------
    manifest : pandas.DataFrame
        One row per (notebook, key), columns :data:`MANIFEST_COLUMNS` with ``execution_count``
        named ``cell``; values formatted as ``formatted`` says.
    summary : pandas.DataFrame
        Indexed by notebook: ``values`` (how many) and ``compared`` (how many ``make verify`` compares).
    """
    import pandas as pd

    manifest = pd.DataFrame(list(read_manifests(_require_path(folder, "folder")).values()))
    columns = list(MANIFEST_COLUMNS)
    if not len(manifest):
        return pd.DataFrame(columns=columns), pd.DataFrame({"values": [], "compared": []})
    manifest = manifest[columns].rename(columns={"execution_count": "cell"})
    if formatted:
        manifest["value"] = manifest["value"].map(lambda v: f"{v:.6g}" if isinstance(v, float) else str(v)[:60])
    summary = manifest.groupby("notebook").agg(values=("key", "size"), compared=("verify", "sum"))
    return manifest, summary
