"""Shared test fixtures: devices and dtypes to parametrise over, with per-dtype tolerances."""

from __future__ import annotations

import pytest
import torch

DEVICES = [pytest.param("cpu", id="cpu")]
DEVICES.append(
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
    )
)
DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]

# Tolerances for comparing with an independent float64 reference.
TOLERANCES = {torch.float32: {"rtol": 1e-4, "atol": 1e-5}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}


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
