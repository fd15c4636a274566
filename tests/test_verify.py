"""The results manifest (nwlib.book._provenance via nwlib.book.glue) and `make verify` (tools/verify.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from nwlib.book import _provenance, glue, setup
from nwlib.evidence import ALPHA

ROOT = Path(__file__).resolve().parent.parent
VERIFY = ROOT / "tools" / "verify.py"


def _glue_a_run(
    tmp_path: Path,
    monkeypatch,
    *,
    mse: float = 0.25,
    label: str = "reproduced",
    gap: float = 1.5e-3,
    n_points: int = 128,
    finding: bool = True,
    mse_df: float | None = None,
) -> Path:
    """Glue like a notebook under the runner: NWLIB_NOTEBOOK set, the notebook's folder as cwd."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    monkeypatch.setenv(_provenance.ENV_NOTEBOOK, "ch99_test")
    _provenance._started.discard("ch99_test")  # a new run of the notebook
    setup(profile="quick", seed=0, device=torch.device("cpu"), dtype=torch.float64)
    glue("mse", mse, se=0.01, df=mse_df)
    glue("gap", torch.tensor(gap, dtype=torch.float32), tol=1e-6)  # a 0-dim tensor: a number, its own dtype
    glue("n_points", np.int64(n_points))
    glue("verdict_C99_short", label)
    glue("finding_gain", finding)
    glue("seconds", 12.3, verify=False)
    glue("half", 0.5, exact=True, dtype=torch.float32)
    glue("table", {"a": 1})  # not a number: recorded with a digest, never compared
    return folder


def _verify(folder: Path, reference: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(VERIFY), str(folder), "--reference", str(reference), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _failing(proc: subprocess.CompletedProcess) -> set[str]:
    return {line.split()[0] for line in proc.stdout.splitlines() if " FAIL" in line}


def test_glue_records_every_value_with_its_class_and_context(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    lines = (folder / "ch99_test.provenance.jsonl").read_text().splitlines()
    entries = {e["key"]: e for e in map(json.loads, lines)}
    assert list(entries) == ["mse", "gap", "n_points", "verdict_C99_short", "finding_gain", "seconds", "half", "table"]
    classes = {k: e["cls"] for k, e in entries.items()}
    assert classes == {
        "mse": "mc",
        "gap": "fp",
        "n_points": "exact",
        "verdict_C99_short": "exact",
        "finding_gain": "exact",
        "seconds": "info",
        "half": "exact",
        "table": "other",
    }
    assert entries["mse"]["value"] == 0.25 and entries["mse"]["se"] == 0.01
    assert entries["gap"]["kind"] == "float" and entries["gap"]["tol"] == 1e-6
    assert entries["gap"]["value"] == pytest.approx(1.5e-3, rel=1e-6)
    # dtype and device: the tensor's own, then glue's argument, then setup's
    assert (entries["gap"]["dtype"], entries["half"]["dtype"], entries["mse"]["dtype"]) == (
        "float32",
        "float32",
        "float64",
    )
    assert entries["mse"]["device"] == "cpu" and entries["mse"]["seed"] == 0 and entries["mse"]["profile"] == "quick"
    assert not entries["seconds"]["verify"] and not entries["table"]["verify"]
    for e in entries.values():
        assert e["notebook"] == "ch99_test" and e["nwlib"] and e["torch"] == torch.__version__ and e["time"]
        assert e["dirty"] in (True, False, None)
    # A rerun starts the manifest afresh instead of appending to the old run.
    _glue_a_run(tmp_path, monkeypatch)
    assert len((folder / "ch99_test.provenance.jsonl").read_text().splitlines()) == 8


def test_glue_refuses_a_float_without_one_class(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="needs its class"):
        glue("x", 1.0)
    with pytest.raises(TypeError, match="needs its class"):
        glue("x", torch.tensor(1.0))
    with pytest.raises(TypeError, match="one class"):
        glue("x", 1.0, se=0.1, exact=True)
    with pytest.raises(TypeError, match="one class"):
        glue("x", 1.0, tol=1e-9, verify=False)
    with pytest.raises(ValueError, match="se"):
        glue("x", 1.0, se=-1.0)
    with pytest.raises(TypeError, match="numbers"):
        glue("x", "text", se=0.1)


def test_digests_follow_the_content_not_the_object(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame({"a": [1.0, 2.0]})
    assert _provenance.digest(df) == _provenance.digest(df.copy())
    assert _provenance.digest(df) != _provenance.digest(df + 1)
    assert _provenance.digest(df.style.format("{:.2f}")) == _provenance.digest(df.copy().style.format("{:.2f}"))
    assert _provenance.digest(df.style.format("{:.2f}")) != _provenance.digest((df + 1).style.format("{:.2f}"))
    empty, drawn = plt.figure(), plt.figure()
    drawn.add_subplot().plot([0, 1], [1, 0])
    assert _provenance.digest(empty) != _provenance.digest(drawn)
    plt.close("all")


def test_glue_outside_a_book_build_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(_provenance.ENV_NOTEBOOK, raising=False)
    glue("x", 1.0, se=0.1)
    assert not list(tmp_path.iterdir())


def test_a_rerun_agrees_with_its_reference(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    assert _verify(folder, reference, "--update").returncode == 0
    proc = _verify(folder, reference)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 values agree" in proc.stdout


@pytest.mark.parametrize("shift_se, ok", [(2.0, True), (3.5, False)])
def test_a_monte_carlo_value_is_compared_within_the_family_threshold(tmp_path, monkeypatch, shift_se, ok):
    # One Monte Carlo value: the threshold is the two-sided normal quantile at ALPHA, times the
    # combined standard error sqrt(0.01^2 + 0.01^2).
    allowed = stats.norm.ppf(1 - ALPHA / 2) * math.hypot(0.01, 0.01)
    assert (shift_se * 0.01 <= allowed) == ok
    reference = tmp_path / "quick.json"
    _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25), reference, "--update")
    proc = _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25 + shift_se * 0.01), reference)
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    assert _failing(proc) == (set() if ok else {"ch99_test::mse"})


def test_a_floating_point_value_is_compared_within_its_tolerance(tmp_path, monkeypatch):
    reference = tmp_path / "quick.json"
    _verify(_glue_a_run(tmp_path, monkeypatch), reference, "--update")
    assert _verify(_glue_a_run(tmp_path, monkeypatch, gap=1.5e-3 + 5e-7), reference).returncode == 0
    proc = _verify(_glue_a_run(tmp_path, monkeypatch, gap=1.5e-3 + 5e-6), reference)
    assert _failing(proc) == {"ch99_test::gap"}


def test_a_perturbed_reference_fails_naming_the_value(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    _verify(folder, reference, "--update")
    data = json.loads(reference.read_text())
    data["entries"]["ch99_test::mse"]["value"] += 5 * 0.01  # beyond 1.96 combined standard errors
    data["entries"]["ch99_test::verdict_C99_short"]["value"] = "not reproduced as stated"
    reference.write_text(json.dumps(data))
    proc = _verify(folder, reference)
    assert proc.returncode == 1
    assert _failing(proc) == {"ch99_test::mse", "ch99_test::verdict_C99_short"}


def test_another_seed_compares_monte_carlo_values_findings_and_labels_only(tmp_path, monkeypatch):
    reference = tmp_path / "quick.json"
    _verify(_glue_a_run(tmp_path, monkeypatch), reference, "--update")
    # another seed: other sizes drawn, other rounding: not compared; an MC value within its noise passes
    folder = _glue_a_run(tmp_path, monkeypatch, mse=0.26, gap=0.2, n_points=64)
    assert _verify(folder, reference).returncode == 1
    proc = _verify(folder, reference, "--other-seed")
    assert proc.returncode == 0, proc.stdout
    assert "3 of 3 values agree" in proc.stdout  # the MC value, the finding and the label
    folder = _glue_a_run(tmp_path, monkeypatch, label="not reproduced as stated", finding=False, mse=0.4)
    proc = _verify(folder, reference, "--other-seed")
    assert _failing(proc) == {"ch99_test::mse", "ch99_test::verdict_C99_short", "ch99_test::finding_gain"}


def test_missing_and_new_values_fail(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    _verify(folder, reference, "--update")
    data = json.loads(reference.read_text())
    del data["entries"]["ch99_test::gap"]
    data["entries"]["ch99_test::gone"] = {"value": 1.0, "kind": "float", "cls": "fp", "se": None, "tol": 1e-9}
    reference.write_text(json.dumps(data))
    proc = _verify(folder, reference)
    assert proc.returncode == 1
    assert "ch99_test::gap" in proc.stdout and "not in the reference" in proc.stdout
    assert "ch99_test::gone" in proc.stdout and "not recorded by this run" in proc.stdout


@pytest.mark.parametrize("df, shift_se, ok", [(None, 3.0, False), (3, 3.0, True), (3, 4.0, False)])
def test_a_standard_error_with_few_degrees_of_freedom_is_trusted_less(tmp_path, monkeypatch, df, shift_se, ok):
    # Welch df of two SEs of 3 df each, equal: 6; Student's t at the one-comparison level
    allowed = (stats.t.ppf(1 - ALPHA / 2, 6) if df else stats.norm.ppf(1 - ALPHA / 2)) * math.hypot(0.01, 0.01)
    assert (shift_se * 0.01 <= allowed) == ok
    reference = tmp_path / "quick.json"
    _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25, mse_df=df), reference, "--update")
    proc = _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25 + shift_se * 0.01, mse_df=df), reference)
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
