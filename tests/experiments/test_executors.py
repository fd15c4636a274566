"""Every chapter's grid gives the same numbers on a process pool and on a Dask cluster as serially.

The chapters' point functions (nwlib.experiments.*) seed everything from their point's seed, so
where a point runs cannot change what it computes: the full profiles can be spread with
``make book PROFILE=full EXECUTOR=process:N`` or ``EXECUTOR=dask:ADDRESS``.
"""

from __future__ import annotations

import pytest

from nwlib.experiments import head_diversity as hd
from nwlib.sweep import run_sweep


def test_random_subspace_check_is_the_same_on_two_processes():
    kwargs = dict(dims=[[6, 1], [6, 2], [8, 2]], num_heads=3, families=4, seed=5)
    serial = hd.random_hdi_check(**kwargs, executor="serial")
    pooled = hd.random_hdi_check(**kwargs, executor="process:2")
    assert serial.table.equals(pooled.table)


def test_a_chapter_sweep_is_the_same_on_a_two_worker_dask_cluster():
    pytest.importorskip("distributed")
    points = [{"embed_dim": 6, "head_dim": k, "num_heads": 3, "families": 4} for k in (1, 2, 3)]
    serial = run_sweep(hd.random_hdi_point, points, seed=2, executor="serial", progress=False)
    cluster = run_sweep(hd.random_hdi_point, points, seed=2, executor="dask:local:2", progress=False)
    assert serial == cluster


def test_ch03_head_diversity_families_and_placements_are_the_same_on_two_processes():
    import torch

    from nwlib.sweep import open_executor

    sizes = dict(embed_dim=6, num_heads=2, head_dim=2, noise_sd=0.5, n_train=30, n_eval=16, replicates=6)
    sizes |= dict(replicates_fit=10, replicates_confirm=4)
    design = hd.make_design(**sizes, seed=3)
    heads = hd.cosine_heads(2, 2, 6, generator=torch.Generator().manual_seed(4))
    families = [design.path_heads(t, 1) for t in (0.0, 0.5, 1.0)]
    points = hd.family_points(design, families, fit=True) + hd.family_points(
        design, families, attention=heads, fit=True
    )
    placements = [
        {"design": hd.design_spec(hd.make_design(**sizes, seed=100 + 10 * j)), "thetas": [0.0, 0.8], "shared_dim": 0}
        for j in range(2)
    ]
    with open_executor("process:2") as pool:  # one pool for the three sweeps
        for fn, grid in ((hd.family_point, points), (hd.placement_point, placements)):
            serial = run_sweep(fn, grid, seed=0, executor="serial", progress=False)
            assert serial == run_sweep(fn, grid, seed=0, executor=pool, progress=False)
        swept = hd.run_families(design, families, attention=heads, fit=True, executor=pool)
    direct = [hd.run_family(design, Q, attention=heads, fit=True) for Q in families]
    for a, b in zip(swept, direct, strict=True):
        assert a.ls.row == b.ls.row and torch.equal(a.uniform.per_replicate["err"], b.uniform.per_replicate["err"])


def test_ch01_attention_is_nw_blocks_are_the_same_on_two_processes():
    import numpy as np
    import torch

    from nwlib.experiments import attention_is_nw as ch01
    from nwlib.sweep import open_executor

    sizes = dict(n_train=30, noise_sd=0.3, bandwidths=[0.03, 0.1], grid=11, replicates=8, jk_groups=4)
    qk_sizes = dict(n_train=20, n_eval=7, embed_dim=6, head_dim=3, temperatures=[0.1, 1.0], replicates=4, noise_sd=0.3)
    serial = ch01.mise_study(**sizes, seed=3)
    serial_cv, serial_qk = ch01.cv_study(serial), ch01.qk_norm_smoothing(**qk_sizes, seed=5, blocks=2)
    with open_executor("process:2") as pool:  # one pool for the three sweeps
        pooled = ch01.mise_study(**sizes, seed=3, executor=pool)
        pooled_cv = ch01.cv_study(pooled, executor=pool)
        pooled_qk = ch01.qk_norm_smoothing(**qk_sizes, seed=5, blocks=2, executor=pool)
    assert len(pooled.points) == 4 and torch.equal(serial.ise, pooled.ise)
    for name in ch01.MISE_PARTS:
        np.testing.assert_array_equal(serial.estimates[name], pooled.estimates[name])
        np.testing.assert_array_equal(serial.ses[name], pooled.ses[name])
    assert torch.equal(serial_cv.bandwidth, pooled_cv.bandwidth) and serial_cv.ratio == pooled_cv.ratio
    assert torch.equal(serial_qk.test_ise, pooled_qk.test_ise) and serial_qk.gaussian_gap == pooled_qk.gaussian_gap


def test_ch04_structured_weights_settings_are_the_same_on_two_processes():
    import json

    from nwlib.experiments import structured_weights as sw

    s = sw.Settings(
        model_heads=3,
        num_heads=3,
        n=24,
        m=12,
        replicates=4,
        noise_sd=0.5,
        kappas=[0.0, 1.0],
        ratios=[0.5],
        theta_min_deg=20.0,
        theta_max_deg=80.0,
        bandwidth_span=4.0,
        fit_sizes=[1, 2],
        validation_points=6,
        fit_repeats=2,
        rate_head_dims=[1, 2, 3],
        rate_ns=[16, 32],
        key_scale=2.0,
        value_leak=0.25,
        temperatures=[0.1, 1.0],
        tuning_replicates=2,
        quality_replicates=3,
        quality_points=4,
    )
    points = sw.setting_points(s)
    serial = run_sweep(sw.setting_point, points, seed=4, executor="serial", progress=False)
    pooled = run_sweep(sw.setting_point, points, seed=4, executor="process:2", progress=False)
    assert json.dumps(serial) == json.dumps(pooled)  # bit for bit (and NaN where a single fit has no SE)
