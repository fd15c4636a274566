"""Bad input across the whole public API: the exception type and the argument it names.

One table, so that a reader (and issue 6) can see at a glance what every public function
rejects. Mismatched devices are exercised without a GPU by putting one input on PyTorch's
``meta`` device, which is a different device from the CPU for every check that compares them.
"""

from __future__ import annotations

import pytest
import torch

import nwlib as nw

CPU = torch.float64


def t(*shape, dtype=CPU, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype).to(device)


def meta(*shape):
    return torch.empty(*shape, dtype=CPU, device="meta")


TASK = nw.make_task("isotropic", 4)
GEN = torch.Generator().manual_seed(0)
W = t(3, 4, 2)  # three heads, D = 4, d_k = 2
Z = t(5, 4)  # evaluation points
PRED = t(10, 3, 5)  # (R, H, m)
TARGET = t(5)
SPD = torch.eye(3, dtype=CPU) + 0.1

CASES = [
    # nadaraya_watson / nadaraya_watson_weights
    ("nw: queries not a tensor", lambda: nw.nadaraya_watson([[1.0]], t(3, 1), t(3)), TypeError, "queries"),
    (
        "nw: integer keys",
        lambda: nw.nadaraya_watson(t(2, 2), torch.ones(3, 2, dtype=torch.long), t(3)),
        TypeError,
        "keys",
    ),
    ("nw: feature dims differ", lambda: nw.nadaraya_watson(t(2, 2), t(3, 4), t(3)), ValueError, "keys"),
    ("nw: keys/values lengths differ", lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(4, 1)), ValueError, "values"),
    ("nw: values rank", lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(1, 1, 3, 1)), ValueError, "values"),
    ("nw: dtype mismatch", lambda: nw.nadaraya_watson(t(2, 2), t(3, 2, dtype=torch.float32), t(3)), TypeError, "keys"),
    ("nw: device mismatch", lambda: nw.nadaraya_watson(t(2, 2), meta(3, 2), t(3)), ValueError, "keys"),
    (
        "nw: unknown kernel",
        lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(3), kernel="epanechnikov"),
        ValueError,
        "kernel",
    ),
    (
        "nw: gaussian needs bandwidth",
        lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(3), kernel="gaussian"),
        ValueError,
        "bandwidth",
    ),
    (
        "nw: negative bandwidth",
        lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(3), bandwidth=-1.0),
        ValueError,
        "bandwidth",
    ),
    (
        "nw: infinite bandwidth",
        lambda: nw.nadaraya_watson(t(2, 2), t(3, 2), t(3), bandwidth=float("inf")),
        ValueError,
        "bandwidth",
    ),
    (
        "nw: bandwidth batch clash",
        lambda: nw.nadaraya_watson(t(4, 2, 2), t(4, 3, 2), t(4, 3), bandwidth=torch.ones(3, dtype=CPU)),
        ValueError,
        "bandwidth",
    ),
    ("weights: batch clash", lambda: nw.nadaraya_watson_weights(t(4, 2, 2), t(3, 3, 2)), ValueError, "batch"),
    # MultiHeadNW
    ("mha: heads do not divide", lambda: nw.MultiHeadNW(10, 4), ValueError, "num_heads"),
    ("mha: from_torch type", lambda: nw.MultiHeadNW.from_torch(torch.nn.Linear(2, 2)), TypeError, "mha"),
    ("mha: key features", lambda: nw.MultiHeadNW(4, 2, dtype=CPU)(t(3, 4), t(5, 3), t(5, 4)), ValueError, "key"),
    # resolve_device
    ("device: nonsense", lambda: nw.resolve_device("tpu9"), ValueError, "device"),
    ("device: wrong type", lambda: nw.resolve_device(0), TypeError, "device"),
    # tasks and simulate
    ("task: unknown name", lambda: nw.make_task("spiral", 4), ValueError, "name"),
    ("task: bad embed_dim", lambda: nw.make_task("isotropic", 0), ValueError, "embed_dim"),
    (
        "simulate: projection rank",
        lambda: nw.simulate(TASK, t(4, 2), Z, n=8, replicates=2, generator=GEN, bandwidth=1.0),
        ValueError,
        "key_projections",
    ),
    (
        "simulate: ambient dim",
        lambda: nw.simulate(TASK, t(3, 5, 2), Z, n=8, replicates=2, generator=GEN, bandwidth=1.0),
        ValueError,
        "key_projections",
    ),
    (
        "simulate: eval dim",
        lambda: nw.simulate(TASK, W, t(5, 3), n=8, replicates=2, generator=GEN, bandwidth=1.0),
        ValueError,
        "eval_points",
    ),
    ("simulate: n", lambda: nw.simulate(TASK, W, Z, n=0, replicates=2, generator=GEN, bandwidth=1.0), ValueError, "n"),
    (
        "simulate: replicates",
        lambda: nw.simulate(TASK, W, Z, n=8, replicates=0, generator=GEN, bandwidth=1.0),
        ValueError,
        "replicates",
    ),
    (
        "simulate: generator",
        lambda: nw.simulate(TASK, W, Z, n=8, replicates=2, generator=0, bandwidth=1.0),
        TypeError,
        "generator",
    ),
    (
        "simulate: head_data",
        lambda: nw.simulate(TASK, W, Z, n=8, replicates=2, generator=GEN, bandwidth=1.0, head_data="some"),
        ValueError,
        "head_data",
    ),
    (
        "simulate: bandwidth per head",
        lambda: nw.simulate(TASK, W, Z, n=8, replicates=2, generator=GEN, bandwidth=torch.ones(2, dtype=CPU)),
        ValueError,
        "bandwidth",
    ),
    (
        "simulate: device mismatch",
        lambda: nw.simulate(TASK, W, meta(5, 4), n=8, replicates=2, generator=GEN, bandwidth=1.0),
        ValueError,
        "eval_points|key_projections",
    ),
    # decompose
    ("decompose: predictions rank", lambda: nw.decompose(t(10, 5), TARGET), ValueError, "predictions"),
    ("decompose: target length", lambda: nw.decompose(PRED, t(4)), ValueError, "target"),
    ("decompose: weights length", lambda: nw.decompose(PRED, TARGET, t(2)), ValueError, "weights"),
    ("decompose: one replicate", lambda: nw.decompose(PRED[:1], TARGET), ValueError, "predictions|replicates"),
    ("decompose: device mismatch", lambda: nw.decompose(PRED, meta(5)), ValueError, "target"),
    # subspaces
    ("angles: ambient dims differ", lambda: nw.principal_angles(t(5, 2), t(4, 2)), ValueError, "B|A"),
    ("hdi: one head", lambda: nw.hdi(t(1, 4, 2)), ValueError, "projections"),
    ("hdi: different ambient dims", lambda: nw.hdi([t(4, 2), t(5, 2)]), ValueError, "projections"),
    ("hdi: normalization", lambda: nw.hdi(W, normalization="unit"), ValueError, "normalization"),
    ("cross_gram: not a tensor", lambda: nw.cross_gram([[1.0]], t(4, 2)), TypeError, "A"),
    ("random_subspaces: too wide", lambda: nw.random_subspaces(2, 5, 4, generator=GEN), ValueError, "head_dim"),
    # weighting
    ("uniform: num_heads", lambda: nw.uniform_weights(0), ValueError, "num_heads"),
    ("geometric: ratio", lambda: nw.geometric_weights(3, 0.0), ValueError, "ratio"),
    ("fibonacci: num_heads type", lambda: nw.fibonacci_weights(2.5), TypeError, "num_heads"),
    ("optimal: not square", lambda: nw.optimal_weights(t(3, 2)), ValueError, "M"),
    (
        "optimal: not symmetric",
        lambda: nw.optimal_weights(SPD + torch.triu(torch.ones(3, 3, dtype=CPU), 1)),
        ValueError,
        "M",
    ),
    ("optimal: not positive definite", lambda: nw.optimal_weights(-SPD), ValueError, "M"),
    ("optimal: ridge", lambda: nw.optimal_weights(SPD, ridge=-1.0), ValueError, "ridge"),
    ("combination_mse: size", lambda: nw.combination_mse(t(2), SPD), ValueError, "weights|M"),
    ("rank_heads: target", lambda: nw.rank_heads(PRED, t(3)), ValueError, "target"),
]


@pytest.mark.parametrize("call,exc,argument", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_and_names_the_argument(call, exc, argument):
    with pytest.raises(exc, match=argument):
        call()
