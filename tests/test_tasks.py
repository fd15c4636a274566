"""Tests of nwlib.tasks: the true functions, the design and the noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nwlib import TASKS, RegressionTask, make_task


def _numpy_f(name: str, x: np.ndarray, s: int) -> np.ndarray:
    if name == "single_index":
        return np.sin(2 * x[..., 0]) + 0.5 * x[..., 0]
    if name == "interaction":
        return np.sqrt(2) * np.sin(2 * x[..., 0]) * np.sin(2 * x[..., 1])
    return np.sin(2 * x[..., :s]).sum(-1) / np.sqrt(s)


@pytest.mark.parametrize(
    "name, kwargs, s",
    [("isotropic", {}, 5), ("subspace", {"signal_dim": 3}, 3), ("single_index", {}, 1), ("interaction", {}, 2)],
)
def test_f_matches_explicit_formula(name, kwargs, s, dtype, device, tol):
    task = make_task(name, 5, **kwargs)
    assert isinstance(task, RegressionTask) and task.name == name and task.signal_dim == s
    x = torch.randn(4, 7, 5, dtype=dtype, device=device, generator=torch.Generator(device).manual_seed(0))
    fx = task.f(x)
    assert fx.shape == (4, 7) and fx.dtype == dtype and fx.device == x.device
    expected = torch.from_numpy(_numpy_f(name, x.double().cpu().numpy(), s)).to(dtype)
    torch.testing.assert_close(fx.cpu(), expected, **tol)


@pytest.mark.parametrize("name", ["subspace", "single_index", "interaction"])
def test_f_ignores_nuisance_coordinates(name, device):
    task = make_task(name, 6)
    g = torch.Generator(device).manual_seed(1)
    x = torch.randn(50, 6, generator=g, device=device)
    y = x.clone()
    y[:, task.signal_dim :] = torch.randn(50, 6 - task.signal_dim, generator=g, device=device)
    assert torch.equal(task.f(x), task.f(y))
    y[:, 0] += 1.0
    assert not torch.allclose(task.f(x), task.f(y))


def test_isotropic_is_symmetric_in_coordinates(device):
    task = make_task("isotropic", 4)
    x = torch.randn(30, 4, generator=torch.Generator(device).manual_seed(2), device=device)
    torch.testing.assert_close(task.f(x), task.f(x[:, [2, 0, 3, 1]]))


def test_sample_shapes_dtype_device_and_reproducibility(dtype, device):
    task = make_task("subspace", 3, noise_sd=0.2)
    x, y = task.sample((2, 5), 11, generator=torch.Generator(device).manual_seed(3), dtype=dtype)
    assert x.shape == (2, 5, 11, 3) and y.shape == (2, 5, 11)
    assert x.dtype == y.dtype == dtype and x.device.type == device.type
    x2, y2 = task.sample((2, 5), 11, generator=torch.Generator(device).manual_seed(3), dtype=dtype)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = task.sample((2, 5), 11, generator=torch.Generator(device).manual_seed(4), dtype=dtype)
    assert not torch.equal(x, x3)


def test_float32_and_float64_draws_share_the_design(device):
    """One seed, two dtypes: the same data up to float32 rounding (draws are made in float64 and cast)."""
    task = make_task("isotropic", 4, noise_sd=0.3)
    x32, y32 = task.sample((3,), 50, generator=torch.Generator(device).manual_seed(11), dtype=torch.float32)
    x64, y64 = task.sample((3,), 50, generator=torch.Generator(device).manual_seed(11), dtype=torch.float64)
    assert torch.equal(x32, x64.float()) and torch.equal(y32, y64.float())
    # The stream is float64's: an explicit float64 draw from the same seed gives the design.
    g = torch.Generator(device).manual_seed(11)
    explicit = torch.randn(3, 50, 4, generator=g, dtype=torch.float64, device=device)
    assert torch.equal(x64, explicit)


def test_sample_distribution(device):
    """x ~ N(0, I) and y − f(x) ~ N(0, σ²), checked with the large-sample scale of each statistic."""
    task = make_task("isotropic", 3, noise_sd=0.5)
    n = 200_000
    x, y = task.sample((), n, generator=torch.Generator(device).manual_seed(5), dtype=torch.float64)
    cov = torch.cov(x.T).cpu()
    torch.testing.assert_close(cov, torch.eye(3, dtype=torch.float64), atol=5 * math.sqrt(2 / n), rtol=0)
    assert x.mean(0).abs().max() < 5 / math.sqrt(n)
    noise = y - task.f(x)
    assert abs(float(noise.std()) - 0.5) < 5 * 0.5 / math.sqrt(2 * n)
    assert abs(float(noise.mean())) < 5 * 0.5 / math.sqrt(n)
    # Independence of noise and design: no correlation with any coordinate.
    assert (x * noise[:, None]).mean(0).abs().max() < 5 * 0.5 / math.sqrt(n)


def test_signal_variance_does_not_depend_on_dim(device):
    for dim in (1, 4, 16):
        task = make_task("isotropic", dim)
        x, _ = task.sample((), 100_000, generator=torch.Generator(device).manual_seed(dim), dtype=torch.float64)
        assert abs(float(task.f(x).var()) - (1 - math.exp(-8)) / 2) < 0.02


def test_noise_free_task_returns_f(device):
    task = make_task("single_index", 2, noise_sd=0.0)
    x, y = task.sample((3,), 10, generator=torch.Generator(device).manual_seed(0), dtype=torch.float64)
    assert torch.equal(y, task.f(x))
    # In float32, y is f evaluated in float64 and then rounded: equal up to that rounding.
    x32, y32 = task.sample((3,), 10, generator=torch.Generator(device).manual_seed(0))
    torch.testing.assert_close(y32, task.f(x32), rtol=1e-6, atol=1e-6)


def test_task_names():
    assert set(TASKS) == {"isotropic", "subspace", "single_index", "interaction"}
    assert make_task("subspace", 4).signal_dim == 2


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: make_task("nope", 3), ValueError, "name"),
        (lambda: make_task("isotropic", 0), ValueError, "embed_dim"),
        (lambda: make_task("isotropic", 2.0), TypeError, "embed_dim"),
        (lambda: make_task("isotropic", 2, noise_sd=-1.0), ValueError, "noise_sd"),
        (lambda: make_task("isotropic", 2, noise_sd="a"), TypeError, "noise_sd"),
        (lambda: make_task("subspace", 2, signal_dim=3), ValueError, "signal_dim"),
        (lambda: make_task("subspace", 2, signal_dim=0), ValueError, "signal_dim"),
        (lambda: make_task("isotropic", 2, signal_dim=1), TypeError, "signal_dim"),
        (lambda: make_task("isotropic", 2).f(torch.zeros(4, 3)), ValueError, r"^x must"),
        (lambda: make_task("isotropic", 2).f(torch.zeros(4, 2, dtype=torch.int64)), TypeError, r"^x must"),
        (lambda: make_task("isotropic", 2).sample((), 0, generator=torch.Generator()), ValueError, r"^n must"),
        (lambda: make_task("isotropic", 2).sample((-1,), 3, generator=torch.Generator()), ValueError, "batch_shape"),
        (lambda: make_task("isotropic", 2).sample(3, 3, generator=torch.Generator()), TypeError, "batch_shape"),
        (lambda: make_task("isotropic", 2).sample((), 3, generator=0), TypeError, "generator"),
        (
            lambda: make_task("isotropic", 2).sample((), 3, generator=torch.Generator(), dtype=torch.int32),
            TypeError,
            "dtype",
        ),
    ],
)
def test_bad_input_is_rejected(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_interaction_task_has_no_additive_part(device):
    """E[f | x_0] = 0: a head that sees one coordinate only has nothing to learn (Var f ≈ 0.5 overall)."""
    task = make_task("interaction", 3)
    g = torch.Generator(device).manual_seed(9)
    x = torch.randn(200_000, 3, generator=g, dtype=torch.float64, device=device)
    fx = task.f(x)
    assert abs(float(fx.var()) - (1 - math.exp(-8)) ** 2 / 2) < 0.01
    bins = torch.bucketize(x[:, 0].contiguous(), torch.linspace(-2, 2, 9, dtype=torch.float64, device=device))
    for b in range(10):
        sel = fx[bins == b]
        assert abs(float(sel.mean())) < 5 * float(sel.std()) / math.sqrt(sel.numel())
    with pytest.raises(ValueError, match="embed_dim"):
        make_task("interaction", 1)
