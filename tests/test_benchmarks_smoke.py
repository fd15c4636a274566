"""The benchmark's comparison code is correct: its references compute the NW estimate.

A speed-up is only meaningful if the slower implementations compute the same
thing, so every reference in ``benchmarks/references.py`` is checked against an
explicit float64 formula and against :func:`nwlib.nadaraya_watson`; the harness
must refuse to time an implementation that disagrees, and the memory probe must
see an allocation it cannot miss. No timing is asserted anywhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package

from benchmarks import references, run  # noqa: E402
from nwlib import nadaraya_watson  # noqa: E402

R, H, M, N, D = 2, 3, 5, 17, 4


def _data(dtype, device, p):
    g = torch.Generator(device=device).manual_seed(7)
    q = torch.randn(R, H, M, D, generator=g, dtype=dtype, device=device)
    k = torch.randn(R, H, N, D, generator=g, dtype=dtype, device=device)
    vshape = (R, H, N) if p is None else (R, H, N, p)
    return q, k, torch.randn(*vshape, generator=g, dtype=dtype, device=device)


def _explicit(q, k, v, scale):
    """exp(<q, k> scale) / sum, one weight at a time in float64: no softmax, no batching tricks."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    scalar = v.ndim == 3
    out = np.zeros(q.shape[:3] + (() if scalar else v.shape[3:]))
    for r in range(q.shape[0]):
        for h in range(q.shape[1]):
            for j in range(q.shape[2]):
                w = np.array([np.exp(q[r, h, j] @ k[r, h, i] * scale) for i in range(k.shape[2])])
                out[r, h, j] = np.tensordot(w / w.sum(), v[r, h], axes=1)
    return torch.from_numpy(out)


@pytest.mark.parametrize("p", [None, 3], ids=["scalar", "vector"])
def test_materialised_softmax_is_nw(dtype, device, tol, p):
    q, k, v = _data(dtype, device, p)
    got = references.materialised_softmax(q, k, v, D**-0.5)
    assert got.shape == nadaraya_watson(q, k, v).shape and got.device == q.device
    torch.testing.assert_close(got.cpu().double(), _explicit(q, k, v, D**-0.5), **tol)
    torch.testing.assert_close(got, nadaraya_watson(q, k, v), **tol)


@pytest.mark.parametrize("p", [None, 3], ids=["scalar", "vector"])
def test_numpy_loop_is_nw(dtype, tol, p):
    q, k, v = _data(dtype, "cpu", p)
    got = references.numpy_loop(q.numpy(), k.numpy(), v.numpy(), D**-0.5)
    assert got.dtype == q.numpy().dtype  # a float64 scale must not promote float32 work
    torch.testing.assert_close(torch.from_numpy(got).double(), _explicit(q, k, v, D**-0.5), **tol)


def test_identity_mha_is_nw(dtype, device, tol):
    q, k, v = _data(dtype, device, D)
    mha = references.identity_mha(H, D, dtype=dtype, device=device)
    qm, km, vm = (references.to_model_layout(t) for t in (q, k, v))
    torch.testing.assert_close(references.from_model_layout(qm, H), q, rtol=0, atol=0)
    for need_weights in (False, True):
        with torch.no_grad():
            out, _ = mha(qm, km, vm, need_weights=need_weights)
        got = references.from_model_layout(out, H)
        torch.testing.assert_close(got, nadaraya_watson(q, k, v), **tol)


def test_statsmodels_is_gaussian_nw():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randn(40, generator=g, dtype=torch.float64)
    z = torch.randn(6, 3, generator=g, dtype=torch.float64)
    h = 0.8
    got = references.statsmodels_nw(z.numpy(), x.numpy(), y.numpy(), h)
    w = torch.exp(-torch.cdist(z, x).pow(2) / (2 * h * h))
    explicit = (w @ y) / w.sum(-1)
    torch.testing.assert_close(torch.from_numpy(got), explicit, rtol=1e-10, atol=1e-12)
    nw = nadaraya_watson(z, x, y, kernel="gaussian", bandwidth=h)
    torch.testing.assert_close(torch.from_numpy(got), nw, rtol=1e-10, atol=1e-12)


def _tiny(methods, **kw):
    base = dict(name="t", group="grid", device="cpu", dtype="float32", R=2, H=2, m=8, n=32, d=4, p=None)
    base.update(kw)
    return run.Config(methods=methods, **base)


def test_harness_records_agreement_and_ratios():
    cfg = _tiny(["materialised", "numpy_loop", "gemm"], control=True)
    run.run_config(cfg, rounds=2, rng=random.Random(0))
    methods = cfg.results["methods"]
    assert len(cfg.results["control"]["samples_s"]) == 2  # the control is a participant of every round
    assert set(methods) == {"nw", "materialised", "numpy_loop", "gemm"}
    for name in ("materialised", "numpy_loop"):
        assert methods[name]["max_abs_diff_vs_nw"] < 1e-5
        assert len(methods[name]["samples_s"]) == 2
        assert methods[name]["ratio_to_nw"] == pytest.approx(methods[name]["median_s"] / methods["nw"]["median_s"])
    assert cfg.results["gemm_gflops"] > 0


def test_harness_refuses_a_wrong_reference(monkeypatch):
    # An implementation that computes something else must not produce a speed-up.
    monkeypatch.setattr(run, "materialised_softmax", lambda q, k, v, scale: references.materialised_softmax(q, k, v, 2 * scale))
    with pytest.raises(RuntimeError, match="materialised differs"):
        run.run_config(_tiny(["materialised"]), rounds=1, rng=random.Random(0))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc high-water-mark reset")
def test_memory_probe_sees_the_weight_matrix():
    # m = n = 2048 in float32: the materialised (m, n) weights alone are 16 MiB; NW never forms them.
    spec = dict(case="grid", device="cpu", dtype="float32", R=1, H=1, m=2048, n=2048, d=8, p=None)
    weights_bytes = 2048 * 2048 * 4
    mat = run.measure_memory({**spec, "method": "materialised"})
    nw = run.measure_memory({**spec, "method": "nw"})
    assert mat["measure"].startswith("VmHWM") and nw["measure"].startswith("VmHWM")
    assert mat["peak_bytes"] >= weights_bytes
    assert nw["peak_bytes"] < weights_bytes
