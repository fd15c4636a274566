"""Where a notebook's time goes: a cProfile of its run, attributed to the parts of the book's code.

Enabled by the environment variable ``NWLIB_TIME_PROFILE`` (a folder): :func:`nwlib.book.start`
starts a :class:`cProfile.Profile` and :meth:`nwlib.book.Run.finish` writes
``<folder>/<notebook>.json``. ``tools/run_notebooks.py --time-profile DIR`` sets it for every
notebook; ``make time-profile`` collects the table the performance appendix shows.

Attribution. cProfile records, per function, its own time (``tottime``) and which callers it was
called from with how much of that time. A function in one of the :data:`CATEGORIES` keeps its own
time there; any other function (a torch operator implemented in C, a torch or pandas Python
wrapper) hands its own time to its callers in proportion to the time each caller spent in it,
recursively, until a categorised function or a root (notebook code, the kernel) is reached. So a
torch operator called by ``nwlib.kernels`` counts as estimator time, and the same operator called
from a notebook cell counts as "notebook and other".

cProfile adds a constant cost per Python call, so pure-Python work (sympy) is inflated relative to
compiled kernels: the shares are a guide to where to aim, not a benchmark.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV_VAR = "NWLIB_TIME_PROFILE"
OTHER = "notebook and other"
# (category, predicate on the function's file path, with '/' separators); the first match wins.
CATEGORIES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("nwlib estimators", lambda f: any(f.endswith(f"/nwlib/{m}.py") for m in ("kernels", "multihead", "bandwidth"))),
    ("training and models", lambda f: "/nwlib/models/" in f),
    ("chapter experiments", lambda f: "/nwlib/experiments/" in f),
    ("evidence and book tooling", lambda f: "/nwlib/book/" in f or f.endswith("/nwlib/evidence.py")),
    ("Monte Carlo engine and other nwlib", lambda f: "/nwlib/" in f),
    ("sympy", lambda f: "/sympy/" in f),
    ("plotting", lambda f: "/matplotlib/" in f),
)
NAMES = tuple(name for name, _ in CATEGORIES) + (OTHER,)

_profile: cProfile.Profile | None = None
_started: float = 0.0


def category_of(filename: str) -> str | None:
    """The category of a function defined in ``filename``, or None (its time goes to its callers)."""
    path = filename.replace(os.sep, "/")
    for name, matches in CATEGORIES:
        if matches(path):
            return name
    return None


def attribute(stats: Mapping[Any, tuple]) -> dict[str, float]:
    """Seconds per category from ``pstats.Stats(...).stats`` (see the module docstring).

    ``stats`` maps ``(file, line, name)`` to ``(cc, nc, tottime, cumtime, callers)`` with
    ``callers`` mapping a caller's key to ``(cc, nc, tottime, cumtime)`` of the calls it made.
    """
    totals = dict.fromkeys(NAMES, 0.0)
    memo: dict[Any, dict[str, float]] = {}

    def shares(key: Any, depth: int) -> dict[str, float]:
        """How one second of ``key``'s own time splits over the categories."""
        if key in memo:
            return memo[key]
        cat = category_of(str(key[0]))
        if cat is not None:
            result = {cat: 1.0}
        else:
            callers = stats[key][4] if key in stats else {}
            weights = {c: float(v[3]) for c, v in callers.items() if c != key}  # cumtime from that caller
            total = sum(weights.values())
            if depth > 50 or not weights or total <= 0:
                result = {OTHER: 1.0}  # a root: notebook code, the kernel, or a call cycle
            else:
                memo[key] = {OTHER: 1.0}  # provisional, in case of a cycle
                result = {}
                for caller, w in weights.items():
                    for c, s in shares(caller, depth + 1).items():
                        result[c] = result.get(c, 0.0) + s * w / total
        memo[key] = result
        return result

    for key, (_, _, tottime, _, _) in stats.items():
        for cat, share in shares(key, 0).items():
            totals[cat] += share * float(tottime)
    return totals


def begin() -> None:
    """Start profiling this process if ``NWLIB_TIME_PROFILE`` is set (called by :func:`nwlib.book.start`)."""
    global _profile, _started
    if not os.environ.get(ENV_VAR) or _profile is not None:
        return
    _started = time.perf_counter()
    _profile = cProfile.Profile()
    _profile.enable()


def end(notebook: str) -> Path | None:
    """Stop profiling and write ``<NWLIB_TIME_PROFILE>/<notebook>.json``; None if not profiling."""
    global _profile
    folder = os.environ.get(ENV_VAR)
    if _profile is None or not folder:
        return None
    _profile.disable()
    wall = time.perf_counter() - _started
    seconds = attribute(pstats.Stats(_profile).stats)  # type: ignore[attr-defined]
    _profile = None
    out = Path(folder) / f"{notebook}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "notebook": notebook,
        "wall_seconds": round(wall, 2),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    return out
