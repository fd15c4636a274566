"""tools/robustness.py: what a rerun with another seed counts, from the manifests it leaves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from nwlib.book import _provenance, setup
from nwlib.evidence import Findings, estimate

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("robustness_tool", ROOT / "tools" / "robustness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_findings_are_counted_as_asserted_or_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(_provenance.ENV_NOTEBOOK, "ch99_test")
    _provenance._started.discard("ch99_test")
    setup(profile="quick", seed=1, device="cpu", dtype=torch.float64)
    f = Findings("ch99_test", profile="quick")
    f.greater("held", "a clear effect", estimate(1.0, 0.1))
    f.greater("missed", "no effect at all", estimate(0.0, 0.1))
    f.greater("weak", "a weak effect, standard only", estimate(0.1, 0.1), profiles=("standard",))
    f.glue()
    counts = _tool()._findings(tmp_path)
    assert (counts["asserted"], counts["asserted_held"], counts["reported"], counts["reported_held"]) == (2, 1, 1, 0)
    assert counts["asserted_failed"] == ["ch99_test::finding_missed"]
