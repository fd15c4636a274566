"""Parameter sweeps as independent, seeded grid points, run on any ``concurrent.futures`` executor.

A sweep is a list of grid points (plain dicts of JSON values) and a point function
``fn(point, *, seed, device) -> dict``. :func:`run_sweep` hands the points to an
executor through the standard :class:`concurrent.futures.Executor` interface:

* ``"serial"`` (the default): :class:`SerialExecutor`, in this process, one point at a time;
* ``"process"`` or ``"process:N"``: a local :class:`~concurrent.futures.ProcessPoolExecutor`
  (started with ``spawn``);
* ``"dask:ADDRESS"`` (e.g. ``"dask:tcp://host:8786"``): the executor of a
  ``distributed.Client`` connected to a running Dask scheduler; ``"dask:local"`` or
  ``"dask:local:N"`` starts a ``LocalCluster`` of N single-threaded worker processes;
* any :class:`~concurrent.futures.Executor` instance.

Three properties make the result independent of where and in which order the points ran:

* **Seeds come from coordinates.** Each point's seed is a hash (SHA-256) of the sweep
  seed and the point's canonical JSON (:func:`point_seed`), never a counter, so a point
  gets the same seed whichever worker runs it and whenever.
* **Partial results are durable.** With a ``path``, each finished point is appended to
  a JSON-lines file as one line (key, point, seed, function, result), flushed and
  synced at once. A rerun with the same path skips the points already there, so an
  interrupted sweep resumes where it stopped; a line cut short by a crash is dropped.
* **Results are normalised through JSON**, so a result computed now and one read back
  from the file are the same Python objects (lists, floats, ints, strings).

On the CPU a point function that seeds all its randomness from ``seed`` therefore gives
bit-for-bit the same results serially, in a process pool and on a Dask cluster. A point
function gets ``device`` as given (``"auto"`` is resolved by the point function on the
worker, so GPU workers use their GPU); results computed on different kinds of device
differ in the last digits (their random streams and kernels differ).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._seeds import require_seed

__all__ = [
    "require_point",
    "SerialExecutor",
    "canonical_key",
    "grid",
    "load_sweep",
    "open_executor",
    "point_seed",
    "run_sweep",
]

_SEED_BITS = 63


def require_point(point: object, keys: Sequence[str]) -> Mapping[str, Any]:
    """``point`` itself, checked as a point function's argument: a mapping holding every one of ``keys``.

    Raises TypeError for a non-mapping and ValueError naming the coordinates it lacks, so every
    chapter's point function reports a bad grid point the same way.

    Examples
    --------
    >>> require_point({"n": 8, "m": 4}, ("n",))
    {'n': 8, 'm': 4}
    >>> require_point({"n": 8}, ("n", "m"))
    Traceback (most recent call last):
    ...
    ValueError: point lacks the coordinate(s) ['m']
    """
    if not isinstance(point, Mapping):
        raise TypeError(f"point must be a mapping, got {type(point).__name__}")
    absent = [k for k in keys if k not in point]
    if absent:
        raise ValueError(f"point lacks the coordinate(s) {absent}")
    return point


def canonical_key(point: Mapping[str, Any]) -> str:
    """The canonical JSON text of a grid point: sorted keys, no spaces, no NaN.

    Two points with the same coordinates have the same key, whatever the order in
    which their dicts were built. Tuples become lists, as in JSON.

    Parameters
    ----------
    point : Mapping of str to JSON values
        The point's coordinates (numbers, strings, booleans, None, lists, dicts).

    Returns
    -------
    str

    Raises
    ------
    TypeError
        If ``point`` is not a mapping with string keys or holds a value JSON cannot store.
    ValueError
        If ``point`` holds a NaN or infinite float (they have no canonical JSON form).

    Examples
    --------
    >>> canonical_key({"n": 256, "kernel": "exp"}) == canonical_key({"kernel": "exp", "n": 256})
    True
    >>> canonical_key({"n": 256, "kernel": "exp"})
    '{"kernel":"exp","n":256}'
    """
    if not isinstance(point, Mapping) or not all(isinstance(k, str) for k in point):
        raise TypeError(f"point must be a mapping with string keys, got {type(point).__name__}")
    try:
        return json.dumps(point, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as err:
        raise ValueError(f"point must not contain NaN or infinite floats: {err}") from None
    except TypeError as err:
        raise TypeError(f"point must hold JSON values only: {err}") from None


def point_seed(seed: int, point: Mapping[str, Any]) -> int:
    """The seed of one grid point: a hash of the sweep seed and the point's coordinates.

    ``int(sha256(f"{seed}|{canonical_key(point)}")[:16 hex digits]) mod 2**63``: it
    depends on nothing else (not on the order of the points, the executor or the
    machine), and distinct points get seeds that look independent.

    Parameters
    ----------
    seed : int
        The sweep's seed (>= 0).
    point : Mapping
        The point (see :func:`canonical_key`).

    Returns
    -------
    int
        In ``[0, 2**63)``, usable by ``torch.Generator.manual_seed``.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` is not a non-negative int, or ``point`` is not a valid point.

    Examples
    --------
    >>> point_seed(0, {"n": 256}) == point_seed(0, {"n": 256})
    True
    >>> point_seed(0, {"n": 256}) != point_seed(1, {"n": 256})
    True
    """
    seed = require_seed(seed)
    digest = hashlib.sha256(f"{seed}|{canonical_key(point)}".encode()).hexdigest()
    return int(digest[:16], 16) % 2**_SEED_BITS


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """All combinations of the given axes, as a list of points, the last axis varying fastest.

    Parameters
    ----------
    **axes : sequence of JSON values
        One non-empty sequence of values per coordinate.

    Returns
    -------
    list of dict

    Raises
    ------
    TypeError
        If an axis is a string or not a sequence.
    ValueError
        If there is no axis or an axis is empty.

    Examples
    --------
    >>> grid(kernel=["exp", "gaussian"], n=[128])
    [{'kernel': 'exp', 'n': 128}, {'kernel': 'gaussian', 'n': 128}]
    """
    if not axes:
        raise ValueError("grid needs at least one axis")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"axis {name!r} must be a sequence of values, got {type(values).__name__}")
        if len(values) == 0:
            raise ValueError(f"axis {name!r} must not be empty")
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes.values())]


class SerialExecutor(cf.Executor):
    """A minimal executor that runs each call in this process, at submission.

    The default of :func:`run_sweep`: no processes, no pickling, and tracebacks
    point at the caller's code. :meth:`submit` returns an already finished
    :class:`~concurrent.futures.Future` (holding the result or the exception).

    Examples
    --------
    >>> with SerialExecutor() as ex:
    ...     ex.submit(pow, 2, 5).result()
    32
    """

    def __init__(self) -> None:
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Run ``fn(*args, **kwargs)`` now and return its finished future."""
        if self._shutdown:
            raise RuntimeError("cannot submit to a SerialExecutor after shutdown")
        future: cf.Future = cf.Future()
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # handed to the future, as a pool would (Ctrl-C is not caught)
            future.set_exception(err)
        else:
            future.set_result(result)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse further submissions (nothing is ever pending)."""
        self._shutdown = True


@contextlib.contextmanager
def open_executor(spec: str | cf.Executor = "serial") -> Iterator[cf.Executor]:
    """An executor for a specification string, closed (with what it started) on exit.

    Parameters
    ----------
    spec : str or concurrent.futures.Executor, default "serial"
        ``"serial"``; ``"process"`` (one worker per CPU) or ``"process:N"``;
        ``"dask:ADDRESS"`` for a running Dask scheduler (e.g. ``"dask:tcp://host:8786"``),
        ``"dask:local"`` or ``"dask:local:N"`` for a ``distributed.LocalCluster`` of N
        worker processes with one thread each. An Executor instance is yielded as is
        and not shut down.

    Yields
    ------
    concurrent.futures.Executor

    Raises
    ------
    TypeError
        If ``spec`` is neither a string nor an Executor.
    ValueError
        If ``spec`` is not one of the forms above.
    ImportError
        For ``"dask:..."`` when ``distributed`` is not installed.

    Examples
    --------
    >>> with open_executor("serial") as ex:
    ...     type(ex).__name__
    'SerialExecutor'
    """
    if isinstance(spec, cf.Executor):
        yield spec
        return
    if not isinstance(spec, str):
        raise TypeError(f"executor must be a string or a concurrent.futures.Executor, got {type(spec).__name__}")
    kind, _, rest = spec.partition(":")
    if kind == "serial" and not rest:
        with SerialExecutor() as ex:
            yield ex
    elif kind == "process":
        workers = _worker_count(rest, spec) if rest else None
        # spawn, not fork: a forked child of a process whose torch thread pool is running can hang
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            yield ex
    elif kind == "dask" and rest:
        from distributed import Client, LocalCluster

        if rest == "local" or rest.startswith("local:"):
            count = _worker_count(rest[len("local:") :], spec) if rest != "local" else None
            with (
                LocalCluster(n_workers=count, threads_per_worker=1, processes=True) as cluster,
                Client(cluster) as client,
            ):
                yield client.get_executor()
        else:
            with Client(rest) as client:
                yield client.get_executor()
    else:
        raise ValueError(
            "executor must be 'serial', 'process', 'process:N', 'dask:ADDRESS', 'dask:local' or "
            f"'dask:local:N', got {spec!r}"
        )


def load_sweep(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The finished points recorded in a sweep file, by key.

    A last line without its newline (a write cut short by a crash) is ignored;
    :func:`run_sweep` removes it before appending.

    Parameters
    ----------
    path : str or os.PathLike
        A JSON-lines file written by :func:`run_sweep` (a missing file counts as empty).

    Returns
    -------
    dict of str to dict
        ``{key: record}``, each record with ``key``, ``point``, ``seed``, ``fn`` and ``result``.

    Raises
    ------
    ValueError
        If a complete line is not a JSON record of a sweep (the message names the path
        and the line), or one key appears twice with different records.
    """
    records, _ = _read_records(Path(path))
    return records


def run_sweep(
    fn: Callable[..., Any],
    points: Sequence[Mapping[str, Any]],
    *,
    seed: int,
    executor: str | cf.Executor = "serial",
    path: str | os.PathLike | None = None,
    device: str = "cpu",
    progress: bool = True,
    desc: str = "sweep",
) -> list[Any]:
    """Run ``fn`` at every grid point on an executor, resuming from and appending to ``path``.

    Each point is computed as ``fn(dict(point), seed=point_seed(seed, point), device=device)``.
    The results are returned in the order of ``points``.

    Parameters
    ----------
    fn : callable
        The point function, ``fn(point, *, seed, device)``, returning JSON values (a dict
        of numbers and lists, say). For ``"process"`` and Dask executors it must be
        importable by the workers (a module-level function of an installed package).
    points : sequence of Mapping
        The grid points (see :func:`grid`); their keys (:func:`canonical_key`) must be distinct.
    seed : int
        The sweep's seed (>= 0); each point's seed is :func:`point_seed` of it.
    executor : str or concurrent.futures.Executor, default "serial"
        See :func:`open_executor`.
    path : str or os.PathLike, optional
        JSON-lines file of finished points. Points already recorded there (same key, same
        seed, same function) are not recomputed; each newly finished point is appended at
        once (flushed and synced). Default: keep results in memory only.
    device : str, default "cpu"
        Passed to ``fn`` unchanged (``"auto"`` lets each worker pick its own accelerator).
    progress : bool, default True
        Show a tqdm bar of finished points with the estimated time left.
    desc : str, default "sweep"
        The bar's label.

    Returns
    -------
    list
        ``fn``'s result for each point, in the order of ``points``, passed through JSON.

    Raises
    ------
    TypeError, ValueError
        On a bad argument (named in the message), duplicate points, or a ``path`` that holds
        one of these points with another seed or function (a file of another sweep).
    Exception
        Whatever ``fn`` raised: the points finished before it stay recorded in ``path``,
        and the points not yet started are cancelled.

    Examples
    --------
    >>> def square(point, *, seed, device):
    ...     return {"y": point["x"] ** 2}
    >>> run_sweep(square, grid(x=[1, 2, 3]), seed=0, progress=False)
    [{'y': 1}, {'y': 4}, {'y': 9}]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    seed = require_seed(seed)
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence):
        raise TypeError(f"points must be a sequence of mappings, got {type(points).__name__}")
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda' or 'auto', got {type(device).__name__}")
    keys = [canonical_key(p) for p in points]
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"points must be distinct, got duplicates {dupes}")
    name = _function_name(fn)
    seeds = {k: point_seed(seed, p) for k, p in zip(keys, points, strict=True)}
    results: dict[str, Any] = {}
    file: Path | None = None
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        file = Path(path)
        records, complete_bytes = _read_records(file)
        if file.exists() and file.stat().st_size != complete_bytes:
            with file.open("r+b") as handle:  # drop a line cut short, so that appends stay valid
                handle.truncate(complete_bytes)
        for key in keys:
            record = records.get(key)
            if record is None:
                continue
            if record["seed"] != seeds[key] or record["fn"] != name:
                raise ValueError(
                    f"path {str(file)!r} records point {key} with seed {record['seed']} and function "
                    f"{record['fn']!r}, but this sweep uses seed {seeds[key]} and {name!r}: "
                    "it belongs to another sweep; pass another path"
                )
            results[key] = record["result"]
    todo = [(k, dict(p)) for k, p in zip(keys, points, strict=True) if k not in results]

    from tqdm import tqdm  # plain text bar: tqdm.auto warns in notebooks without ipywidgets

    with (
        open_executor(executor) as ex,
        tqdm(total=len(keys), initial=len(keys) - len(todo), disable=not progress, desc=desc, unit="pt") as bar,
    ):
        # A serial executor computes at submission: submit one point at a time so that each
        # is recorded before the next starts. Pools get every point at once.
        window = 1 if isinstance(ex, SerialExecutor) else max(len(todo), 1)
        queue = iter(todo)
        pending: dict[cf.Future, tuple[str, dict[str, Any]]] = {}

        def refill() -> None:
            for key, point in itertools.islice(queue, window - len(pending)):
                pending[ex.submit(fn, point, seed=seeds[key], device=device)] = (key, point)

        refill()
        try:
            while pending:
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    key, point = pending.pop(future)
                    result = _json_roundtrip(future.result(), key)
                    results[key] = result
                    if file is not None:
                        _append(file, {"key": key, "point": point, "seed": seeds[key], "fn": name, "result": result})
                    bar.update(1)
                refill()
        finally:
            for future in pending:
                future.cancel()
    return [results[k] for k in keys]


# --- helpers ---------------------------------------------------------------------------


def _worker_count(text: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"executor {spec!r}: the number of workers must be a positive integer, got {text!r}")
    return int(text)


def _function_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}:{qualname}"


def _json_roundtrip(result: Any, key: str) -> Any:
    try:
        return json.loads(json.dumps(result, allow_nan=True))
    except (TypeError, ValueError) as err:
        raise TypeError(f"the point function's result at {key} is not JSON-serialisable: {err}") from None


def _append(file: Path, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True, allow_nan=True) + "\n"
    with file.open("a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _read_records(file: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of the complete lines and the byte length of those lines."""
    if not file.exists():
        return {}, 0
    data = file.read_bytes()
    complete = data.rfind(b"\n") + 1  # a last line without its newline was cut short
    records: dict[str, dict[str, Any]] = {}
    for number, raw in enumerate(data[:complete].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"path {str(file)!r}, line {number}: not a JSON record ({err})") from None
        if not isinstance(record, dict) or not {"key", "point", "seed", "fn", "result"} <= set(record):
            raise ValueError(f"path {str(file)!r}, line {number}: not a sweep record")
        previous = records.setdefault(record["key"], record)
        if previous is not record and previous != record:
            raise ValueError(f"path {str(file)!r}, line {number}: point {record['key']} recorded twice, differently")
    return records, complete
