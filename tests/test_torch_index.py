"""The Makefile's choice of torch build: a CPU machine gets PyTorch's CPU index, offline machines PyPI.

`make -n torch` prints the install command without running it; the index expression it carries is
evaluated here in a shell with a controlled PATH (a fake ``nvidia-smi`` or none) and a local HTTP
server standing in for PyTorch's CPU index, so nothing leaves the machine.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not sys.platform.startswith("linux"), reason="needs make on Linux"
)


def _index(tmp_path: Path, *, gpu: bool, **make_vars: str) -> str:
    """The ``--extra-index-url`` arguments the Makefile would pass to pip for torch."""
    args = [
        "make",
        "-n",
        "--no-print-directory",
        "torch",
        "PY=" + sys.executable,
        *(f"{k}={v}" for k, v in make_vars.items()),
    ]
    line = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    assignment = line.rsplit(f"; {sys.executable} -m pip", 1)[0]
    assert assignment.startswith('index="'), line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(
        ["bash", "-c", assignment + '; printf %s "$index"'], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout


@pytest.fixture
def local_index(tmp_path):
    """A local HTTP server with a ``torch/`` page, standing in for the CPU index."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver")
def test_cpu_machine_uses_the_cpu_index_when_it_answers(tmp_path, local_index):
    assert _index(tmp_path, gpu=False, TORCH_CPU_INDEX=local_index) == f"--extra-index-url {local_index}"


def test_gpu_machine_uses_pypi(tmp_path, local_index):
    assert _index(tmp_path, gpu=True, TORCH_CPU_INDEX=local_index) == ""


def test_unreachable_cpu_index_falls_back_to_pypi(tmp_path):
    assert _index(tmp_path, gpu=False, TORCH_CPU_INDEX="http://127.0.0.1:9") == ""


def test_explicit_index_and_empty_override(tmp_path):
    assert (
        _index(tmp_path, gpu=True, TORCH_INDEX_URL="https://example.org/whl")
        == "--extra-index-url https://example.org/whl"
    )
    assert _index(tmp_path, gpu=False, TORCH_INDEX_URL="") == ""
