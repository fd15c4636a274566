"""tools/nbcache.py: the key changes with every input of a notebook's results and with nothing else."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("nbcache", ROOT / "tools" / "nbcache.py")
nbcache = importlib.util.module_from_spec(spec)
sys.modules["nbcache"] = nbcache
spec.loader.exec_module(nbcache)

ENV = {"python": "3.11", "packages": {"torch": "2.13.0"}, "env": {"ATEN_CPU_CAPABILITY": None}}


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for rel, text in {
        "notebooks/ch09_x.ipynb": '{"cells": []}',
        "nwlib/__init__.py": "x = 1\n",
        "nwlib/experiments/x.py": "y = 2\n",
        "benchmarks/run.py": "z = 3\n",
        "book/data/corpus.txt": "a text\n",
        "book/ch09_x.md": "# prose\n",
        "verify/quick.json": "{}\n",
        "constraints.txt": "torch==2.13.0\n",
        "pyproject.toml": "[project]\n",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def key(root, params=None, env=ENV):
    return nbcache.cache_key(
        root / "notebooks/ch09_x.ipynb", params or {"profile": "quick", "seed": 0}, root=root, env=env
    )


@pytest.mark.parametrize(
    "change",
    [
        "notebooks/ch09_x.ipynb",
        "nwlib/experiments/x.py",
        "benchmarks/run.py",
        "book/data/corpus.txt",
        "verify/quick.json",
        "constraints.txt",
        "nwlib/new_module.py",
    ],
)
def test_key_changes_with_every_input(repo, change):
    before = key(repo)
    path = repo / change
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "# edited\n")
    assert key(repo) != before


def test_key_changes_with_parameters_and_environment(repo):
    base = key(repo)
    assert key(repo, {"profile": "quick", "seed": 1}) != base
    assert key(repo, {"profile": "standard", "seed": 0}) != base
    assert key(repo, env={**ENV, "env": {"ATEN_CPU_CAPABILITY": "default"}}) != base
    assert key(repo, env={**ENV, "packages": {"torch": "2.14.0"}}) != base
    assert key(repo, {"seed": 0, "profile": "quick"}) == base  # the order of parameters does not matter


def test_prose_and_bytecode_do_not_enter_the_key(repo):
    base = key(repo)
    (repo / "book/ch09_x.md").write_text("# other prose\n")
    (repo / "nwlib/__pycache__").mkdir()
    (repo / "nwlib/__pycache__/x.cpython-311.pyc").write_bytes(b"\0")
    assert key(repo) == base


def test_store_then_lookup_restores_what_the_run_wrote(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    (out / "other.ipynb").write_text("not ours")
    before = nbcache.snapshot(out)
    (out / "ch09_x.ipynb").write_text("executed")
    (out / "figures").mkdir()
    (out / "figures/fig_a.png").write_bytes(b"png")
    entry = nbcache.store(cache, "ch09_x", "k1", out, before, seconds=12.34)
    record = json.loads((entry / "entry.json").read_text())
    assert record["files"] == ["ch09_x.ipynb", "figures/fig_a.png"] and record["seconds"] == 12.3
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert nbcache.lookup(cache, "ch09_x", "k2", fresh) is None  # another key: a miss
    assert nbcache.lookup(cache, "ch09_x", "k1", fresh)["seconds"] == 12.3
    assert (fresh / "figures/fig_a.png").read_bytes() == b"png" and not (fresh / "other.ipynb").exists()
    # other keys (other seeds) are kept beside it, up to KEEP_PER_NOTEBOOK, the oldest going first
    import os
    import time

    for i in range(nbcache.KEEP_PER_NOTEBOOK + 2):
        entry = nbcache.store(cache, "ch09_x", f"s{i}", out, before, seconds=1.0)
        os.utime(entry, ns=(time.time_ns() - (100 - i) * 10**9,) * 2)  # older than the next store
    kept = {p.name for p in (cache / "ch09_x").iterdir()}
    assert len(kept) == nbcache.KEEP_PER_NOTEBOOK and "s0" not in kept and f"s{nbcache.KEEP_PER_NOTEBOOK + 1}" in kept


def test_a_damaged_entry_is_a_miss_and_the_build_record_is_never_cached(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    before = nbcache.snapshot(out)
    (out / "ch09_x.ipynb").write_text("executed")
    entry = nbcache.store(cache, "ch09_x", "k1", out, before, seconds=1.0)
    (entry / "files/ch09_x.ipynb").unlink()
    assert nbcache.lookup(cache, "ch09_x", "k1", tmp_path) is None
    assert nbcache.store(cache, "appendix_environment", "k1", out, before, seconds=1.0) is None
    assert nbcache.lookup(cache, "appendix_environment", "k1", out) is None
