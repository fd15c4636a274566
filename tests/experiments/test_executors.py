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
