"""Shared test fixtures: devices and dtypes to parametrise over, with per-dtype tolerances.

CUDA: the ``cuda`` device parameter carries ``pytest.mark.cuda``, and so should any other test
that needs a CUDA device. On a machine without CUDA those tests are deselected (one line in the
summary says how many), not skipped one by one; ``pytest -m cuda`` runs exactly them on a GPU
(``make gpu-check``).

Hypothesis: the profile ``ci`` (derandomised, with a deadline, printing the blob that reproduces a
failure) is loaded when the environment variable ``CI`` is set, or by name with
``HYPOTHESIS_PROFILE=ci`` (or ``dev``, or ``default``).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
from hypothesis import settings

CUDA_AVAILABLE = torch.cuda.is_available()
# Tests that still use a skipif with exactly this reason are treated as cuda-marked too.
NO_CUDA_REASON = "no CUDA device on this machine"

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]

# Tolerances for comparing with an independent float64 reference.
TOLERANCES = {torch.float32: {"rtol": 1e-4, "atol": 1e-5}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}

# Hypothesis profiles. Tests that set their own deadline (deadline=None) keep it.
settings.register_profile("ci", derandomize=True, deadline=timedelta(seconds=5), print_blob=True)
settings.register_profile("dev", deadline=timedelta(seconds=2), print_blob=True)
_profile = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else None)
if _profile:
    settings.load_profile(_profile)


def _needs_cuda(item: pytest.Item) -> bool:
    if item.get_closest_marker("cuda") is not None:
        return True
    return any(mark.kwargs.get("reason") == NO_CUDA_REASON for mark in item.iter_markers("skipif"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    if CUDA_AVAILABLE:
        cuda = f"CUDA: {torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    else:
        cuda = f"CUDA: none (torch {torch.__version__}); tests marked cuda are deselected"
    return [cuda, f"hypothesis profile: {settings.get_current_profile_name()}"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("cuda") is None and _needs_cuda(item):
            item.add_marker(pytest.mark.cuda)
    if CUDA_AVAILABLE:
        return
    deselected = [item for item in items if item.get_closest_marker("cuda") is not None]
    if deselected:
        items[:] = [item for item in items if item.get_closest_marker("cuda") is None]
        config.hook.pytest_deselected(items=deselected)
    config.stash[_CUDA_DESELECTED] = len(deselected)


_CUDA_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    n = config.stash.get(_CUDA_DESELECTED, 0)
    if n:
        terminalreporter.write_line(f"{n} CUDA tests deselected: no CUDA device")


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=DTYPES)
def dtype(request) -> torch.dtype:
    return request.param


@pytest.fixture
def tol(dtype) -> dict:
    return TOLERANCES[dtype]


@pytest.fixture
def generator(device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(1234)
