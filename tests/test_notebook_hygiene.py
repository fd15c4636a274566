"""Committed notebooks are stripped, use the python3 kernel and are parameterised for every profile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("quick", "standard", "full")


def tracked_notebooks() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.split()]


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks under notebooks/"
    assert set(tracked_notebooks()) <= set(NOTEBOOKS) | set(), "notebooks outside notebooks/ are tracked"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stripped_and_python3(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} has execution counts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_and_profiles(path):
    import yaml

    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"
    source = "".join(tagged[0]["source"])
    names = {
        line.split("=")[0].strip() for line in source.splitlines() if "=" in line and not line.lstrip().startswith("#")
    }
    assert {"profile", "device", "seed"} <= names, f"{path.name} parameters lack profile/device/seed"
    for profile in PROFILES:
        params_file = ROOT / "profiles" / profile / f"{path.stem}.yaml"
        assert params_file.is_file(), f"missing {params_file.relative_to(ROOT)}"
        params = yaml.safe_load(params_file.read_text()) or {}
        unknown = set(params) - names
        assert not unknown, f"{params_file.name} ({profile}) sets unknown parameters {unknown}"
        assert "profile" not in params, "the runner injects 'profile'"


def test_every_notebook_and_chapter_is_in_the_toc():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = set()

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.add(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    files.add(toc["root"])
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.stem}" in files, f"{nb.name} is not in _toc.yml"
    for entry in files:
        assert (ROOT / f"{entry}.md").exists() or (ROOT / f"{entry}.ipynb").exists(), f"{entry} in _toc.yml has no file"


def parameter_defaults(path: Path) -> dict:
    """Names and literal default values of the notebook's `parameters` cell."""
    import ast

    nb = json.loads(path.read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    defaults = {}
    for node in ast.parse("".join(cell["source"])).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            defaults[node.targets[0].id] = ast.literal_eval(node.value)
    return defaults


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_profile_values_have_the_parameters_types(path):
    """A profile value has the type of the notebook's default (an int may stand for a float)."""
    import yaml

    defaults = parameter_defaults(path)
    for profile in PROFILES:
        params = yaml.safe_load((ROOT / "profiles" / profile / f"{path.stem}.yaml").read_text()) or {}
        for name, value in params.items():
            default = defaults[name]
            ok = isinstance(value, type(default)) or (isinstance(default, float) and isinstance(value, int))
            assert ok, f"{profile}/{path.stem}.yaml: {name} = {value!r}, but the notebook's default is {default!r}"
            if name == "dtype":
                assert value in ("float32", "float64"), f"{profile}/{path.stem}.yaml: unknown dtype {value!r}"
            if name == "device":
                assert value in ("auto", "cpu", "cuda", "mps"), f"{profile}/{path.stem}.yaml: device {value!r}"


def test_pre_commit_runs_the_pinned_ruff_and_strips_notebooks():
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    repos = {r["repo"].rsplit("/", 1)[-1]: r for r in config["repos"]}
    pinned = next(
        line.split("==")[1].strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.startswith("ruff==")
    )
    assert repos["ruff-pre-commit"]["rev"] == f"v{pinned}", "pre-commit's ruff must be the ruff of constraints.txt"
    assert {h["id"] for h in repos["ruff-pre-commit"]["hooks"]} == {"ruff-check", "ruff-format"}
    assert [h["id"] for h in repos["nbstripout"]["hooks"]] == ["nbstripout"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(path):
    """papermill's own reading of the cell (``papermill --help-notebook``, its check for unknown
    parameters) finds every name the cell assigns: it skips, with a warning, any line with a second
    ``=``, a comment's included."""
    from papermill.translators import PythonTranslator

    nb = json.loads(path.read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    seen = {p.name for p in PythonTranslator.inspect(nbformat_cell(cell))}
    missing = set(parameter_defaults(path)) - seen
    assert not missing, (
        f"{path.name}: papermill does not read the parameter(s) {sorted(missing)} (an '=' in a comment?)"
    )


def nbformat_cell(cell: dict):
    import nbformat

    return nbformat.from_dict({**cell, "source": "".join(cell["source"])})
