"""tools/run_notebooks.py: the executed notebook says which of its parameter cells ran."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from run_notebooks import label_parameter_cells  # noqa: E402


def _cell(kind, source, tags=()):
    return {"cell_type": kind, "id": source[:8] or "x", "metadata": {"tags": list(tags)}, "source": source}


def test_parameter_cells_are_labelled_in_order():
    nb = {
        "cells": [
            _cell("markdown", "# Title"),
            _cell("code", "seed = 0", ["parameters"]),
            _cell("code", "seed = 1", ["injected-parameters"]),
            _cell("code", "run = start()"),
        ]
    }
    out = label_parameter_cells(nb, "quick", "profiles/quick/ch99.yaml")["cells"]
    kinds = [(c["cell_type"], c["source"][:30]) for c in out]
    assert [k for k, _ in kinds] == ["markdown", "markdown", "code", "markdown", "code", "code"]
    assert "default parameters" in out[1]["source"] and "overrides them" in out[1]["source"]
    assert "profile `quick`" in out[3]["source"] and "profiles/quick/ch99.yaml" in out[3]["source"]
    assert out[2]["source"] == "seed = 0" and out[4]["source"] == "seed = 1"
    assert len({c["id"] for c in out}) == len(out)  # nbformat 4.5 needs unique cell ids


def test_notebook_without_parameters_is_unchanged():
    nb = {"cells": [_cell("code", "x = 1")]}
    assert label_parameter_cells(nb, "quick", "p.yaml")["cells"] == [_cell("code", "x = 1")]
