"""The benchmark's comparison code is correct: its references compute the NW estimate.

A speed-up is only meaningful if the slower implementations compute the same
thing, so every reference in ``benchmarks/references.py`` is checked against an
explicit float64 formula and against :func:`nwlib.nadaraya_watson`; the harness
must refuse to time an implementation that disagrees, and the memory probe must
measure allocations of known size exactly (live bytes) and see one it cannot
miss. A smoke run of ``python -m benchmarks.run --quick`` on a few cases checks
that the result file has the fields the Performance appendix reads, and that the
Monte Carlo engine's live peak stays within the bound it states. No timing is
asserted anywhere.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package

from benchmarks import _memprobe, references, run  # noqa: E402
from nwlib import nadaraya_watson  # noqa: E402

MIB = 2**20

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


def _explicit_gaussian(q, k, v, h):
    """exp(-|q - k|² / (2h²)) / sum with direct differences, in float64."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    sq = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)  # (..., m, n)
    logits = -sq / (2 * h * h)
    w = torch.exp(logits - logits.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    return (w @ v.unsqueeze(-1)).squeeze(-1) if v.dim() == k.dim() - 1 else w @ v


@pytest.mark.parametrize("p", [None, 3], ids=["scalar", "vector"])
def test_gaussian_references_are_gaussian_nw(dtype, tol, p):
    q, k, v = _data(dtype, "cpu", p)
    h = 0.7
    expected = _explicit_gaussian(q, k, v, h)
    mat = references.materialised_gaussian(q, k, v, h)
    loop = torch.from_numpy(references.numpy_loop_gaussian(q.numpy(), k.numpy(), v.numpy(), h))
    assert loop.dtype == q.dtype  # the float64 bandwidth must not promote float32 work
    for got in (mat, loop):
        torch.testing.assert_close(got.double(), expected, **tol)
        torch.testing.assert_close(got, nadaraya_watson(q, k, v, kernel="gaussian", bandwidth=h), **tol)


def test_sdpa_unpadded_is_nw(dtype, tol):
    q, k, v = _data(dtype, "cpu", None)
    got = references.sdpa_unpadded(q, k, v)
    torch.testing.assert_close(got.double(), _explicit(q, k, v, D**-0.5), **tol)


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


@pytest.mark.parametrize("p", [None, 3], ids=["scalar", "vector"])
def test_sdpa_padded_is_nw(dtype, tol, p):
    q, k, v = _data(dtype, "cpu", p)
    torch.testing.assert_close(references.sdpa_padded(q, k, v, D**-0.5).double(), _explicit(q, k, v, D**-0.5), **tol)


def test_keops_is_nw():
    pytest.importorskip("pykeops")
    q, k, v = _data(torch.float32, "cpu", None)
    got = references.keops_nw(q, k, v, D**-0.5)
    torch.testing.assert_close(got.double(), _explicit(q, k, v, D**-0.5), rtol=1e-4, atol=1e-5)


def _tiny(methods, **kw):
    base = dict(name="t", group="grid", device="cpu", dtype="float32", R=2, H=2, m=8, n=32, d=4, p=None)
    base.update(kw)
    return run.Config(methods=methods, **base)


@pytest.mark.parametrize("kernel", ["exp", "gaussian"])
def test_harness_records_agreement_ratios_and_roofline(kernel):
    extra = ["sdpa_unpadded"] if kernel == "exp" else []
    cfg = _tiny(
        ["materialised", "numpy_loop", *extra, "gemm", "exp"],
        control=True,
        kernel=kernel,
        bandwidth=0.9 if kernel == "gaussian" else None,
    )
    run.run_config(cfg, rounds=2, rng=random.Random(0))
    methods, r = cfg.results["methods"], cfg.results
    assert len(r["control"]["samples_s"]) == 2  # the control is a participant of every round
    assert set(methods) == {"nw", "materialised", "numpy_loop", *extra, "gemm", "exp"}
    for name in ("materialised", "numpy_loop", *extra):
        assert methods[name]["max_abs_diff_vs_nw"] < 1e-5
        assert len(methods[name]["samples_s"]) == 2
        assert methods[name]["ratio_to_nw"] == pytest.approx(methods[name]["median_s"] / methods["nw"]["median_s"])
    assert r["gemm_gflops"] > 0 and r["exp_gexps"] > 0
    # attainable = max(flops / GEMM rate, exps / exp rate), flops = 4 R H m n w, exps = R H m n
    assert r["nw_flops"] == 4 * 2 * 2 * 8 * 32 * 4 and r["nw_exps"] == 2 * 2 * 8 * 32
    gemm_s = r["nw_flops"] / (r["gemm_gflops"] * 1e9)
    exp_s = r["nw_exps"] / (r["exp_gexps"] * 1e9)
    roof = r["roofline"]
    assert roof["attainable_s"] == pytest.approx(max(gemm_s, exp_s))
    assert roof["fraction"] == pytest.approx(roof["attainable_s"] / methods["nw"]["median_s"])
    assert roof["limited_by"] == ("exp" if exp_s >= gemm_s else "gemm")


def test_harness_records_the_limit():
    from nwlib import _fused

    cfg = _tiny(["sdpa", "gemm", "exp", "exp_l1", "exp_l1_exp2", "mix_l1"])
    run.run_config(cfg, rounds=2, rng=random.Random(0))
    r = cfg.results
    if _fused.module() is None:  # no compiler here: the limit's exp rates are skipped, saying why
        assert {"exp_l1", "exp_l1_exp2", "mix_l1"} <= set(r["skipped"]) and "limit" not in r
        return
    lim, ts = r["limit"], r["methods"]
    # exps = R H m n, flops = 2 R H m n (d + 1) for scalar responses; the exp rate is the faster
    # loop's; the maximum and the sum of the two times; the mix loop does d + 1 products per exp
    assert lim["exps"] == 2 * 2 * 8 * 32 and lim["flops"] == 2 * 2 * 2 * 8 * 32 * (4 + 1)
    rates = {loop: r[f"{loop}_count"] / ts[loop]["median_s"] for loop in ("exp_l1", "exp_l1_exp2")}
    exp_rate = max(rates.values())
    assert lim["exp_source"] == max(rates, key=rates.__getitem__)
    gemm_rate = r["gemm_flops"] / ts["gemm"]["median_s"]
    assert lim["limit_s"] == pytest.approx(max(lim["exps"] / exp_rate, lim["flops"] / gemm_rate))
    assert lim["limit_sum_s"] == pytest.approx(lim["exps"] / exp_rate + lim["flops"] / gemm_rate)
    assert r["mix_l1_fmas"] == 4 + 1
    assert lim["limit_mix_s"] == pytest.approx(lim["exps"] * ts["mix_l1"]["median_s"] / r["mix_l1_count"])
    assert lim["fractions"]["nw"]["fraction"] == pytest.approx(lim["limit_s"] / ts["nw"]["median_s"])
    assert lim["fractions"]["sdpa"]["fraction"] == pytest.approx(lim["limit_s"] / ts["sdpa"]["median_s"])
    assert lim["fractions"]["nw"]["fraction_of_mix"] == pytest.approx(lim["limit_mix_s"] / ts["nw"]["median_s"])
    assert lim["threads"] == torch.get_num_threads() == r["exp_l1_threads"]


def test_optional_peer_that_fails_is_skipped_saying_why(monkeypatch):
    def broken(*args):
        raise RuntimeError("compile failed")

    monkeypatch.setattr(run, "keops_nw", broken)
    monkeypatch.setattr(run, "compiled_softmax", lambda: broken)
    cfg = _tiny(["materialised", "keops", "inductor"])
    run.run_config(cfg, rounds=1, rng=random.Random(0))
    assert set(cfg.results["methods"]) == {"nw", "materialised"}
    assert "compile failed" in cfg.results["skipped"]["inductor"]
    assert "keops" in cfg.results["skipped"]  # compile failed, or pykeops is not installed


def test_harness_refuses_a_wrong_reference(monkeypatch):
    # An implementation that computes something else must not produce a speed-up.
    monkeypatch.setattr(
        run, "materialised_softmax", lambda q, k, v, scale: references.materialised_softmax(q, k, v, 2 * scale)
    )
    with pytest.raises(RuntimeError, match="materialised differs"):
        run.run_config(_tiny(["materialised"]), rounds=1, rng=random.Random(0))


def test_live_bytes_probe_measures_known_allocations():
    # 2**20 float32 values, filled: 4 MiB alive at the end and at the peak.
    out, live = _memprobe.live_bytes_trace(lambda: torch.empty(2**20).fill_(1.0))
    assert out.numel() == 2**20
    assert live["peak"] == pytest.approx(4 * MIB, rel=0.01)
    assert live["end"] == pytest.approx(4 * MIB, rel=0.01)

    # A freed temporary raises the peak but not what is alive at the end, and
    # tensors alive before the call are not counted.
    before = torch.ones(2**21)

    def keep_one_free_one():
        kept = torch.empty(2**20).fill_(1.0)
        temp = torch.empty(2**21).fill_(2.0) + before  # two 8 MiB temporaries alive at once
        del temp
        return kept

    _, live = _memprobe.live_bytes_trace(keep_one_free_one)
    assert live["peak"] == pytest.approx(20 * MIB, rel=0.01)
    assert live["end"] == pytest.approx(4 * MIB, rel=0.01)


def test_memory_probe_sees_the_weight_matrix():
    # m = n = 2048 in float32: the materialised (m, n) weights alone are 16 MiB; NW never forms them.
    spec = dict(case="grid", device="cpu", dtype="float32", R=1, H=1, m=2048, n=2048, d=8, p=None)
    weights_bytes = 2048 * 2048 * 4
    mat = run.measure_memory({**spec, "method": "materialised"})
    nw = run.measure_memory({**spec, "method": "nw"})
    for rec in (mat, nw):
        assert "error" not in rec, rec
        assert rec["measure"] == rec["live_measure"] == _memprobe.LIVE_MEASURE_CPU
        assert rec["peak_bytes"] == rec["live_peak_bytes"]
        assert "rss_peak_bytes" in rec
    # the scores and their softmax: two (m, n) matrices alive at once
    assert 2 * weights_bytes <= mat["live_peak_bytes"] < 2.2 * weights_bytes
    assert nw["live_peak_bytes"] < weights_bytes / 4


SMOKE_CASES = r"^(cpu-float32-scalar(-gaussian)?|cpu-engine-gaussian-H8|probe-4MiB-kept-8MiB-freed|engine-gaussian-H1-R16-chunkauto)$"


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """``python -m benchmarks.run --quick`` on a few cases, one round, into a temporary file."""
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    assert run.main(["--quick", "--rounds", "1", "--pause", "0", "--only", SMOKE_CASES, "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_quick_run_records_the_machine_and_the_new_timings(quick_report):
    report = quick_report
    assert report["schema"] == run.SCHEMA == 2 and report["quick"]
    m = report["machine"]
    assert {"cpu_model", "cpu_flags", "cpu_capability", "torch_threads", "usable_cpus"} <= set(m)
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    configs = {c["name"]: c for c in report["configs"]}
    assert set(configs) == {"cpu-float32-scalar", "cpu-float32-scalar-gaussian", "cpu-engine-gaussian-H8"}
    assert configs["cpu-float32-scalar-gaussian"]["kernel"] == "gaussian"
    for cfg in configs.values():
        r = cfg["results"]
        assert r["gemm_gflops"] > 0 and r["exp_gexps"] > 0
        assert {"attainable_s", "fraction", "limited_by", "measured_s"} <= set(r["roofline"])
    assert "sdpa_unpadded" in configs["cpu-float32-scalar"]["results"]["methods"]
    assert m["isa"] in ("AVX-512", "AVX2", "neither AVX2 nor AVX-512") and "built" in m["fused_kernel"]
    target = configs["cpu-float32-scalar"]["results"]
    assert "sdpa" in target["methods"]
    if m["fused_kernel"]["built"]:
        assert target["limit"]["fractions"]["nw"]["fraction"] > 0
        assert {"fraction_of_limit", "ahead_of_every_peer"} <= {t["id"] for t in report["targets"]}
        (frac,) = [t for t in report["targets"] if t["id"] == "fraction_of_limit"]
        rounds = frac["fraction_of_mix_per_round"]  # the rounds' fractions, by hand: mix scaled over nw
        mix = np.array(target["methods"]["mix_l1"]["samples_s"]) * target["limit"]["exps"] / target["mix_l1_count"]
        logs = np.log(mix / np.array(target["methods"]["nw"]["samples_s"]))
        assert rounds["geometric_mean"] == pytest.approx(math.exp(logs.mean()))
        assert rounds["level"] == 0.95
        if len(logs) > 1:
            assert rounds["low"] <= rounds["geometric_mean"] <= rounds["high"]
        else:  # one round: no interval, and null rather than NaN in the JSON
            assert rounds["low"] is None and rounds["high"] is None
    engine = configs["cpu-engine-gaussian-H8"]
    assert engine["H"] == 8 and engine["results"]["replicates_per_s"] > 0
    assert engine["results"]["replicates_per_s"] == pytest.approx(
        engine["R"] / engine["results"]["methods"]["simulate"]["median_s"]
    )


def test_quick_run_checks_its_memory_probe(quick_report):
    # In a fresh process, as every case is measured: 4 MiB kept, an 8 MiB temporary freed.
    (rec,) = [r for r in quick_report["memory"] if r["spec"]["method"] == "known_allocation"]
    assert (rec["expected_peak_bytes"], rec["expected_end_bytes"]) == (12 * MIB, 4 * MIB)
    assert rec["live_peak_bytes"] == pytest.approx(12 * MIB, rel=0.01)
    assert rec["live_end_bytes"] == pytest.approx(4 * MIB, rel=0.01)


def test_quick_run_engine_peak_within_its_stated_bound(quick_report):
    import nwlib.montecarlo as mc

    (rec,) = [r for r in quick_report["memory"] if r["spec"]["method"] == "simulate"]
    assert "error" not in rec, rec.get("error")
    assert rec["bound_bytes"] == sum(rec["bound_parts_bytes"].values())
    # the chunk the engine chose is the one the bound was computed for
    assert rec["engine_first_call_keys_shape"][0] == rec["chunk_size_used"]
    (target,) = [t for t in quick_report["targets"] if t["id"] == "engine_within_bound"]
    assert target["cases"] == 1
    if not hasattr(mc, "memory_estimate"):
        pytest.skip("this nwlib states no memory_estimate: the legacy bound is recorded, not asserted")
    assert rec["bound_source"] == "nwlib.montecarlo.memory_estimate"
    assert rec["live_peak_bytes"] <= rec["bound_bytes"], (rec["live_peak_bytes"], rec["bound_parts_bytes"])
    assert rec["within_bound"] and target["pass"]
