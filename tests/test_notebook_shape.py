"""Notebooks read like a methods section: short cells, no experiment logic, library names.

Measured over the committed notebooks (code lines without blanks and comments), as in the
issue that set the targets: a median code cell of at most 10 lines, no cell over 30 lines
except figure cells (at most 40), and at most three functions per notebook, figure helpers
only. The ``parameters`` cell, a list of settings that papermill overrides, is not counted.
Experiments live in :mod:`nwlib.experiments`, tested in ``tests/experiments``.
"""

from __future__ import annotations

import ast
import json
import statistics
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MEDIAN_LINES, MAX_LINES, MAX_FIGURE_LINES, MAX_FUNCTIONS = 10, 30, 40, 3
# A figure cell draws: it creates a figure and hands it to the book.
FIGURE_MARKERS = ("glue_figure(", "plt.subplots(", "plt.figure(")
# Library names (torch's where torch has one) that notebook parameters and profiles must use.
RETIRED_PARAMETERS = {
    "dim": "embed_dim",
    "heads": "num_heads",
    "max_heads": "num_heads (a list, or max_num_heads)",
    "n_heads": "num_heads",
    "d_model": "embed_dim",
    "dk": "head_dim",
    "d_k": "head_dim",
}


def _code_cells(path: Path, *, parameters: bool = True) -> list[str]:
    """The code cells' sources; without the ``parameters`` cell if asked (a list of settings, not logic)."""
    cells = json.loads(path.read_text())["cells"]
    return [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and (parameters or "parameters" not in c.get("metadata", {}).get("tags", []))
    ]


def _lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))


def _is_figure(source: str) -> bool:
    return any(marker in source for marker in FIGURE_MARKERS)


def _parameters(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return [
                t.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            ]
    return []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_are_short(path):
    cells = _code_cells(path, parameters=False)
    lengths = [_lines(src) for src in cells]
    median = statistics.median(lengths)
    long_cells = [
        (i, n)
        for i, (src, n) in enumerate(zip(cells, lengths, strict=True))
        if n > (MAX_FIGURE_LINES if _is_figure(src) else MAX_LINES)
    ]
    print(f"{path.stem}: {len(cells)} code cells, median {median} lines, longest {max(lengths)}")
    assert median <= MEDIAN_LINES, f"{path.stem}: median code cell {median} lines > {MEDIAN_LINES}"
    assert not long_cells, f"{path.stem}: code cells over the limit (index among code cells, lines): {long_cells}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_functions_are_figure_helpers_only(path):
    defined, outside_figures = [], []
    for src in _code_cells(path):
        try:
            tree = ast.parse(src)
        except SyntaxError:  # IPython magics; none of the book's notebooks define functions there
            continue
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        defined += names
        if names and not _is_figure(src):
            outside_figures += names
    assert len(defined) <= MAX_FUNCTIONS, f"{path.stem} defines {len(defined)} functions: {defined}"
    assert not outside_figures, f"{path.stem}: functions outside figure cells belong in nwlib: {outside_figures}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_use_the_library_names(path):
    names = set(_parameters(path))
    for profile in ("quick", "standard", "full"):
        file = ROOT / "profiles" / profile / f"{path.stem}.yaml"
        if file.is_file():
            names |= set(yaml.safe_load(file.read_text()) or {})
    offenders = {n: RETIRED_PARAMETERS[n] for n in names if n in RETIRED_PARAMETERS}
    assert not offenders, f"{path.stem}: parameters with retired names (use the library's): {offenders}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_profiles_set_only_parameters_the_notebook_has(path):
    declared = set(_parameters(path)) | {"profile"}
    for profile in ("quick", "standard", "full"):
        file = ROOT / "profiles" / profile / f"{path.stem}.yaml"
        if file.is_file():
            unknown = set(yaml.safe_load(file.read_text()) or {}) - declared
            assert not unknown, f"profiles/{profile}/{path.stem}.yaml sets parameters the notebook lacks: {unknown}"
