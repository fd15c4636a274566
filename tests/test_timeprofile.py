"""nwlib.book._timeprofile: a notebook's time attributed to the parts of the code that spent it."""

from __future__ import annotations

import json

import pytest

from nwlib.book import _timeprofile as tp

CELL = ("/tmp/ipykernel_1/123.py", 1, "<cell>")
NW = ("/site/nwlib/kernels.py", 10, "nadaraya_watson")
EXP = ("~", 0, "<built-in method torch.exp>")
WRAP = ("/site/torch/functional.py", 5, "softmax")
PLOT = ("/site/matplotlib/axes.py", 3, "plot")


def test_builtins_are_charged_to_their_callers_in_proportion():
    stats = {
        CELL: (1, 1, 0.2, 4.0, {}),
        NW: (1, 1, 0.5, 2.0, {CELL: (1, 1, 0.5, 2.0)}),
        EXP: (2, 2, 1.5, 1.5, {NW: (1, 1, 1.0, 1.0), CELL: (1, 1, 0.5, 0.5)}),
        # an uncategorised Python wrapper called from the plotting code: its time is plotting's
        WRAP: (1, 1, 0.4, 0.4, {PLOT: (1, 1, 0.4, 0.4)}),
        PLOT: (1, 1, 0.3, 0.7, {CELL: (1, 1, 0.3, 0.7)}),
    }
    seconds = tp.attribute(stats)
    assert seconds["nwlib estimators"] == pytest.approx(0.5 + 1.0)
    assert seconds["plotting"] == pytest.approx(0.3 + 0.4)
    assert seconds[tp.OTHER] == pytest.approx(0.2 + 0.5)
    assert sum(seconds.values()) == pytest.approx(sum(v[2] for v in stats.values()))


def test_categories_follow_the_layers():
    assert tp.category_of("/a/nwlib/multihead.py") == "nwlib estimators"
    assert tp.category_of("/a/nwlib/models/training.py") == "training and models"
    assert tp.category_of("/a/nwlib/experiments/head_count.py") == "chapter experiments"
    assert tp.category_of("/a/nwlib/evidence.py") == "evidence and book tooling"
    assert tp.category_of("/a/nwlib/montecarlo.py") == "Monte Carlo engine and other nwlib"
    assert tp.category_of("/a/sympy/core/add.py") == "sympy"
    assert tp.category_of("/a/torch/nn/functional.py") is None


def test_a_profiled_run_writes_its_record(tmp_path, monkeypatch):
    import sympy

    monkeypatch.setenv(tp.ENV_VAR, str(tmp_path))
    tp.begin()
    sympy.simplify(sympy.sin(sympy.Symbol("x")) ** 2 + sympy.cos(sympy.Symbol("x")) ** 2)
    out = tp.end("nb_test")
    record = json.loads(out.read_text())
    assert record["notebook"] == "nb_test" and record["seconds"]["sympy"] > 0
    assert sum(record["seconds"].values()) <= record["wall_seconds"] + 0.05


def test_no_profile_without_the_variable(monkeypatch):
    monkeypatch.delenv(tp.ENV_VAR, raising=False)
    tp.begin()
    assert tp.end("nb_test") is None


def test_the_runner_adds_the_kernel_start_and_writes_a_summary_the_appendix_reads(tmp_path):
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    try:
        spec = importlib.util.spec_from_file_location("run_notebooks_t", root / "tools" / "run_notebooks.py")
        rn = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = rn  # dataclasses look their module up
        spec.loader.exec_module(rn)
    finally:
        sys.path.remove(str(root / "tools"))
    parts = dict.fromkeys(tp.NAMES, 0.0) | {"sympy": 1.0, "nwlib estimators": 2.0}
    (tmp_path / "ch98.json").write_text(json.dumps({"notebook": "ch98", "wall_seconds": 7.5, "seconds": parts}))
    out = rn.write_time_profile(
        tmp_path, [rn.Result("ch98", "quick", 10.0, "ok"), rn.Result("ch99", "quick", 3.0, "ok")]
    )
    summary = json.loads(out.read_text())
    (row,) = summary["notebooks"]  # ch99 wrote no profile: left out
    assert row["seconds"]["kernel start and imports"] == 2.5 and row["total_seconds"] == 10.0

    from benchmarks import report

    (tmp_path / "time-profile" / "quick").mkdir(parents=True)
    (tmp_path / "time-profile" / "quick" / "summary.json").write_text(out.read_text())
    with pytest.raises(report.ResultFileError, match="add up"):  # 3.0 + 2.5 of 10 s: the profile lost time
        report.time_profile_table(report.time_profile("quick", results=tmp_path))
