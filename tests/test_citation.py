"""CITATION.cff is valid (checked by cffconvert, the Citation File Format's own validator) and the
repository URL has one value everywhere it must be written out (tools/repo_url.py explains where)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.repo_url import repo_url  # noqa: E402


def _cffconvert() -> str:
    path = os.environ.get("NWLIB_CFFCONVERT") or shutil.which("cffconvert")
    if path and Path(path).exists():
        return path
    if os.environ.get("NWLIB_CFFCONVERT"):  # make test asked for it: missing is a failure
        pytest.fail(f"cffconvert not found at {os.environ['NWLIB_CFFCONVERT']}")
    pytest.skip("cffconvert not installed (make test installs it into .venv/cffconvert)")


def test_citation_file_is_valid_cff():
    proc = subprocess.run(
        [_cffconvert(), "--validate", "-i", str(ROOT / "CITATION.cff")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_validator_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "CITATION.cff"
    bad.write_text((ROOT / "CITATION.cff").read_text().replace("cff-version: 1.2.0", "cff-version: 1.2.0\nbogus: 1"))
    proc = subprocess.run([_cffconvert(), "--validate", "-i", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0


def test_citation_version_is_the_package_version():
    import nwlib

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert str(cff["version"]) == nwlib.__version__
    import importlib.metadata
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"], "the version has one source, nwlib.__version__"
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nwlib.__version__"}
    assert importlib.metadata.version("nwlib") == nwlib.__version__


def test_repository_url_has_one_value():
    url = repo_url()
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["repository-code"].rstrip("/") == url
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        first = json.loads(path.read_text())["cells"]
        code = next(c for c in first if c["cell_type"] == "code")
        source = "".join(code["source"])
        assert 'find_spec("nwlib")' in source and "pip" in source, (
            f"{path.name}: first code cell is not the install cell"
        )
        urls = re.findall(r"(https://github\.com/[^\"'\s@]+)", source)
        assert urls == [url], f"{path.name}: install cell points at {urls}, _config.yml at {url}"
