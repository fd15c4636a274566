"""The results manifest (nwlib._provenance via nwlib.book.glue) and `make verify` (tools/verify.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from nwlib import _provenance
from nwlib.book import glue

ROOT = Path(__file__).resolve().parent.parent
VERIFY = ROOT / "tools" / "verify.py"


def _glue_a_run(tmp_path: Path, monkeypatch, *, mse: float = 0.25, label: str = "reproduced") -> Path:
    """Glue like a notebook under the runner: NWLIB_NOTEBOOK set, the notebook's folder as cwd."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    monkeypatch.setenv(_provenance.ENV_NOTEBOOK, "ch99_test")
    _provenance._started.discard("ch99_test")  # a new run of the notebook
    glue("mse", mse, se=0.01)
    glue("gap", torch.tensor(1.5e-3, dtype=torch.float64))  # a 0-dim tensor is recorded as a number
    glue("n_points", np.int64(128))
    glue("verdict_C99_short", label)
    glue("seconds", 12.3, verify=False)
    glue("table", {"a": 1})  # not a number: recorded with a digest, never compared
    return folder


def _verify(folder: Path, reference: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VERIFY), str(folder), "--reference", str(reference), *extra],
                          capture_output=True, text=True, cwd=ROOT)


def test_glue_records_every_value_with_its_context(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    lines = (folder / "ch99_test.provenance.jsonl").read_text().splitlines()
    entries = {e["key"]: e for e in map(json.loads, lines)}
    assert list(entries) == ["mse", "gap", "n_points", "verdict_C99_short", "seconds", "table"]
    assert entries["mse"]["value"] == 0.25 and entries["mse"]["se"] == 0.01 and not entries["mse"]["exact"]
    assert entries["gap"]["value"] == 1.5e-3 and entries["gap"]["kind"] == "float"
    assert entries["n_points"]["value"] == 128 and entries["n_points"]["exact"]
    assert not entries["seconds"]["verify"] and not entries["table"]["verify"]
    for e in entries.values():
        assert e["notebook"] == "ch99_test" and e["nwlib"] and e["torch"] == torch.__version__ and e["time"]
    # A rerun starts the manifest afresh instead of appending to the old run.
    _glue_a_run(tmp_path, monkeypatch)
    assert len((folder / "ch99_test.provenance.jsonl").read_text().splitlines()) == 6


def test_glue_outside_a_book_build_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(_provenance.ENV_NOTEBOOK, raising=False)
    glue("x", 1.0)
    assert not list(tmp_path.iterdir())


def test_a_rerun_agrees_with_its_reference(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    assert _verify(folder, reference, "--update").returncode == 0
    proc = _verify(folder, reference)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 of 4 values agree" in proc.stdout


def test_a_value_within_its_monte_carlo_tolerance_passes(tmp_path, monkeypatch):
    reference = tmp_path / "quick.json"
    _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25), reference, "--update")
    proc = _verify(_glue_a_run(tmp_path, monkeypatch, mse=0.25 + 3 * 0.01), reference)  # 3 SE < 4 SE
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_perturbed_reference_fails_naming_the_value(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    _verify(folder, reference, "--update")
    data = json.loads(reference.read_text())
    data["entries"]["ch99_test::mse"]["value"] += 5 * 0.01  # beyond 4 standard errors
    data["entries"]["ch99_test::verdict_C99_short"]["value"] = "not reproduced as stated"
    reference.write_text(json.dumps(data))
    proc = _verify(folder, reference)
    assert proc.returncode == 1
    failing = {line.split()[0] for line in proc.stdout.splitlines() if line.rstrip().endswith("FAIL")}
    assert failing == {"ch99_test::mse", "ch99_test::verdict_C99_short"}


def test_missing_and_new_values_fail(tmp_path, monkeypatch):
    folder = _glue_a_run(tmp_path, monkeypatch)
    reference = tmp_path / "quick.json"
    _verify(folder, reference, "--update")
    data = json.loads(reference.read_text())
    del data["entries"]["ch99_test::gap"]
    data["entries"]["ch99_test::gone"] = {"value": 1.0, "kind": "float", "se": None, "exact": False}
    reference.write_text(json.dumps(data))
    proc = _verify(folder, reference)
    assert proc.returncode == 1
    assert "ch99_test::gap" in proc.stdout and "not in the reference" in proc.stdout
    assert "ch99_test::gone" in proc.stdout and "not recorded by this run" in proc.stdout
