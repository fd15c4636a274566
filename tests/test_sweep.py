"""Tests of nwlib.sweep: seeded grid points on serial, process-pool and Dask executors, with resumable files."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nwlib.experiments.head_count import head_count_point
from nwlib.sweep import SerialExecutor, canonical_key, grid, load_sweep, open_executor, point_seed, run_sweep

ROOT = Path(__file__).resolve().parent.parent

# A real torch computation per point (two targets, both kernels, two sample sizes, every d_k of D = 4):
# each point takes a fraction of a second, and any dependence on the worker shows in the last bits.
SMALL_GRID = grid(
    target=["local", "global"],
    kernel=["gaussian", "exp"],
    n=[48, 96],
    embed_dim=[4],
    replicates=[3],
    replicates_fit=[2],
    m=[8],
    noise_sd=[0.5],
    eval_seed=[7],
)


def echo_point(point, *, seed, device):
    """A cheap point function that shows what it was given."""
    return {"x": point["x"], "seed": seed, "device": device, "square": point["x"] ** 2}


class Flaky:
    """A point function that raises after ``fail_after`` calls, and counts the points it computed."""

    def __init__(self, fail_after=None):
        self.fail_after = fail_after
        self.computed = []

    def __call__(self, point, *, seed, device):
        if self.fail_after is not None and len(self.computed) >= self.fail_after:
            raise RuntimeError("interrupted on purpose")
        self.computed.append(point["x"])
        return {"x": point["x"], "value": (seed % 1000) / 7.0}


# --- keys, seeds, grids ----------------------------------------------------------------


def test_canonical_key_ignores_insertion_order_and_rejects_nan():
    assert canonical_key({"b": 1, "a": [1, 2]}) == canonical_key({"a": (1, 2), "b": 1}) == '{"a":[1,2],"b":1}'
    with pytest.raises(ValueError, match="NaN"):
        canonical_key({"a": float("nan")})
    with pytest.raises(TypeError, match="point"):
        canonical_key({1: 2})
    with pytest.raises(TypeError, match="JSON"):
        canonical_key({"a": object()})


def test_point_seed_is_the_documented_hash():
    point = {"n": 512, "kernel": "exp"}
    digest = hashlib.sha256(b'3|{"kernel":"exp","n":512}').hexdigest()
    assert point_seed(3, point) == int(digest[:16], 16) % 2**63
    assert point_seed(3, point) != point_seed(4, point)
    assert point_seed(3, point) != point_seed(3, {"n": 513, "kernel": "exp"})
    with pytest.raises(ValueError, match="seed"):
        point_seed(-1, point)
    with pytest.raises(TypeError, match="seed"):
        point_seed(1.5, point)


def test_grid_is_the_cartesian_product_last_axis_fastest():
    points = grid(a=[1, 2], b=["x", "y", "z"])
    assert points == [{"a": a, "b": b} for a in (1, 2) for b in ("x", "y", "z")]
    with pytest.raises(ValueError, match="'b' must not be empty"):
        grid(a=[1], b=[])
    with pytest.raises(TypeError, match="'a'"):
        grid(a="abc")


def test_serial_executor_returns_finished_futures():
    with SerialExecutor() as ex:
        ok = ex.submit(divmod, 7, 2)
        bad = ex.submit(divmod, 1, 0)
    assert ok.done() and ok.result() == (3, 1)
    assert isinstance(bad.exception(), ZeroDivisionError)
    with pytest.raises(RuntimeError, match="shutdown"):
        ex.submit(divmod, 1, 1)


# --- running -----------------------------------------------------------------------------


def test_run_sweep_passes_the_point_seed_and_device_in_order():
    points = grid(x=[3, 1, 2])
    out = run_sweep(echo_point, points, seed=11, device="cpu", progress=False)
    assert [r["x"] for r in out] == [3, 1, 2]
    assert [r["seed"] for r in out] == [point_seed(11, p) for p in points]
    assert all(r["device"] == "cpu" for r in out)


def test_results_do_not_depend_on_the_order_of_the_points():
    points = grid(x=list(range(6)))
    forward = run_sweep(echo_point, points, seed=2, progress=False)
    backward = run_sweep(echo_point, points[::-1], seed=2, progress=False)
    assert forward == backward[::-1]


def test_process_pool_matches_serial_bit_for_bit():
    points = SMALL_GRID[:4]
    serial = run_sweep(head_count_point, points, seed=5, progress=False)
    pooled = run_sweep(head_count_point, points, seed=5, executor="process:2", progress=False)
    assert json.dumps(pooled) == json.dumps(serial)


def test_dask_local_cluster_matches_serial_bit_for_bit(tmp_path):
    import distributed  # a dependency of the test extra: a missing install must fail, not skip

    serial = run_sweep(head_count_point, SMALL_GRID, seed=5, progress=False)
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        executor = client.get_executor()
        assert isinstance(executor, cf.Executor)
        path = tmp_path / "dask.jsonl"
        on_dask = run_sweep(head_count_point, SMALL_GRID, seed=5, executor=executor, path=path, progress=False)
        workers = {r["device"] for r in on_dask}
    # identical to the last bit: every float goes through JSON, which round-trips doubles exactly
    assert json.dumps(on_dask) == json.dumps(serial)
    assert workers == {"cpu"}
    assert len(load_sweep(path)) == len(SMALL_GRID)


def test_open_executor_dask_address_form_connects(tmp_path):
    import distributed  # a dependency of the test extra: a missing install must fail, not skip

    with distributed.LocalCluster(
        n_workers=1, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        out = run_sweep(
            echo_point, grid(x=[1, 2]), seed=0, executor=f"dask:{cluster.scheduler_address}", progress=False
        )
    assert [r["square"] for r in out] == [1, 4]


# --- interruption and resumption -----------------------------------------------------------


def test_an_interrupted_sweep_resumes_without_recomputing(tmp_path):
    points = grid(x=list(range(7)))
    reference = run_sweep(Flaky(), points, seed=3, progress=False)
    path = tmp_path / "sweep.jsonl"
    first = Flaky(fail_after=4)
    with pytest.raises(RuntimeError, match="interrupted on purpose"):
        run_sweep(first, points, seed=3, path=path, progress=False)
    assert first.computed == [0, 1, 2, 3]
    assert sorted(r["point"]["x"] for r in load_sweep(path).values()) == [0, 1, 2, 3]
    second = Flaky()
    resumed = run_sweep(second, points, seed=3, path=path, progress=False)
    assert second.computed == [4, 5, 6]  # finished points are read back, not recomputed
    assert resumed == reference
    third = Flaky()
    assert run_sweep(third, points, seed=3, path=path, progress=False) == reference
    assert third.computed == []


def test_a_line_cut_short_is_dropped_and_the_file_stays_valid(tmp_path):
    points = grid(x=[1, 2, 3])
    path = tmp_path / "sweep.jsonl"
    reference = run_sweep(Flaky(), points, seed=0, path=path, progress=False)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # a crash in the middle of a write
    assert len(load_sweep(path)) == 2
    again = Flaky()
    assert run_sweep(again, points, seed=0, path=path, progress=False) == reference
    assert len(again.computed) == 1
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_file_of_another_sweep_is_refused(tmp_path):
    points = grid(x=[1, 2])
    path = tmp_path / "sweep.jsonl"
    run_sweep(Flaky(), points, seed=0, path=path, progress=False)
    with pytest.raises(ValueError, match="another sweep"):
        run_sweep(Flaky(), points, seed=1, path=path, progress=False)
    with pytest.raises(ValueError, match="another sweep"):
        run_sweep(echo_point, points, seed=0, path=path, progress=False)
    path.write_text('{"not": "a record"}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_sweep(path)


KILLED_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from nwlib.sweep import grid, run_sweep

    def slow_point(point, *, seed, device):
        with open(sys.argv[2], "a") as log:  # which points this process computed
            log.write(f"{point['x']}\\n")
        time.sleep(0.25)
        return {"x": point["x"], "value": seed % 997}

    run_sweep(slow_point, grid(x=list(range(8))), seed=9, path=sys.argv[1], progress=False)
    """
)


def test_a_killed_process_resumes_where_it_stopped(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    path, log1, log2, ref, log_ref = (tmp_path / name for name in ("s.jsonl", "1.log", "2.log", "ref.jsonl", "r.log"))
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(log1)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {r["point"]["x"] for r in load_sweep(path).values()}
    assert 3 <= len(finished) < 8, "the process should have been killed part-way"
    subprocess.run([sys.executable, str(script), str(path), str(log2)], env=env, check=True)
    recomputed = {int(x) for x in log2.read_text().split()}
    assert recomputed == set(range(8)) - finished  # nothing finished is computed again
    subprocess.run([sys.executable, str(script), str(ref), str(log_ref)], env=env, check=True)
    assert load_sweep(path) == load_sweep(ref)  # the same records as an uninterrupted run


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"executor": "threads"}, ValueError, "executor"),
        ({"executor": "process:0"}, ValueError, "workers"),
        ({"executor": 3}, TypeError, "executor"),
        ({"seed": -2}, ValueError, "seed"),
        ({"device": None}, TypeError, "device"),
        ({"path": 3.5}, TypeError, "path"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    args = {"seed": 0, "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        run_sweep(echo_point, grid(x=[1]), **args)


def test_duplicate_points_and_bad_functions_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        run_sweep(echo_point, [{"x": 1}, {"x": 1}], seed=0, progress=False)
    with pytest.raises(TypeError, match="fn"):
        run_sweep(42, grid(x=[1]), seed=0, progress=False)
    with pytest.raises(TypeError, match="JSON"):
        run_sweep(lambda p, *, seed, device: {"x": object()}, grid(x=[1]), seed=0, progress=False)


def test_open_executor_yields_a_given_executor_unchanged():
    with SerialExecutor() as mine, open_executor(mine) as ex:
        assert ex is mine


def test_require_point_names_what_a_point_lacks():
    from nwlib.sweep import require_point

    point = {"n": 8, "m": 4}
    assert require_point(point, ("n", "m")) is point
    with pytest.raises(ValueError, match=r"lacks the coordinate\(s\) \['k'\]"):
        require_point(point, ("n", "k"))
    with pytest.raises(TypeError, match="point must be a mapping"):
        require_point([("n", 8)], ("n",))
