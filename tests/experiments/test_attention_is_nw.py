"""Tests of nwlib.experiments.attention_is_nw: chapter 1's checks against PyTorch, the equal-norm kernel, the MISE study.

References: explicit formulas written out here with loops (multi-head attention head by head, NW weights,
leave-one-out scores, the delete-a-group jackknife), scipy's softmax, statsmodels' KernelReg (local constant,
Gaussian) and torch.nn.MultiheadAttention for the sympy construction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nwlib import MultiHeadNW, nadaraya_watson
from nwlib.evidence import Comparison
from nwlib.experiments.attention_is_nw import (
    DTYPES,
    MISE_PARTS,
    TOLERANCES,
    Agreement,
    MiseStudy,
    bias_form,
    circle_weights,
    cv_point,
    cv_study,
    float64_device,
    format_mise_table,
    fraction_removed,
    head_estimates,
    mha_agreement,
    mha_bias_check,
    mise_comparisons,
    mise_point,
    mise_study,
    mise_table,
    null_space_change,
    qk_norm_smoothing,
    qk_point,
    random_attention,
    scalar_weights_check,
    sine_target,
    smoother_demo,
    symbolic_multihead,
    torch_agreement,
    xspace_gaussian_gap,
)

# --- small helpers (references) -------------------------------------------------------------


def _gaussian_weights_np(x0: float, x: np.ndarray, h: float) -> np.ndarray:
    """NW weights of one query with the Gaussian kernel, float64, written out."""
    k = np.exp(-((x - x0) ** 2) / (2 * h**2))
    return k / k.sum()


def _mha_by_hand(mha: torch.nn.MultiheadAttention, query, key, value) -> torch.Tensor:
    """y = b_O + sum_h softmax(Q_h K_h^T / sqrt(dh)) V_h W_O[:, block_h]^T, head by head, batch by batch."""
    e, heads = mha.embed_dim, mha.num_heads
    dh = e // heads
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    w_o, b_o = mha.out_proj.weight, mha.out_proj.bias
    out = torch.empty(query.shape[0], query.shape[1], e, dtype=query.dtype)
    for n in range(query.shape[1]):
        total = b_o.expand(query.shape[0], e).clone()
        for hh in range(heads):
            rows = slice(hh * dh, (hh + 1) * dh)
            q = query[:, n] @ w_q[rows].T + b_q[rows]
            k = key[:, n] @ w_k[rows].T + b_k[rows]
            v = value[:, n] @ w_v[rows].T + b_v[rows]
            total = total + torch.softmax(q @ k.T / math.sqrt(dh), dim=-1) @ v @ w_o[:, rows].T
        out[:, n] = total
    return out


SMALL = dict(n_train=40, noise_sd=0.3, bandwidths=[0.03, 0.08, 0.2], grid=21, replicates=20, jk_groups=10)


@pytest.fixture(scope="module")
def study() -> MiseStudy:
    return mise_study(**SMALL, seed=3)


# --- C1 against PyTorch ---------------------------------------------------------------------


def test_torch_agreement_is_rounding_and_deterministic(device):
    a = torch_agreement(2, 2, 5, 7, 4, seed=11, device=device)
    assert list(a.differences) == [
        f"{c}_{t}" for t in ("f32", "f64") for c in ("nw_vs_sdpa", "nw_vs_formula", "sdpa_vs_formula")
    ]
    assert a.within_tolerance
    for key, value in a.differences.items():
        assert 0.0 <= value <= TOLERANCES[key[-3:]]
    # float32 against a float64 formula cannot be exact: the check can see a difference
    assert a.differences["nw_vs_formula_f32"] > 1e-9
    assert torch_agreement(2, 2, 5, 7, 4, seed=11, device=device) == a
    assert torch_agreement(2, 2, 5, 7, 4, seed=12, device=device) != a


def test_agreement_flags_a_difference_above_its_dtype_tolerance():
    assert Agreement({"x_f64": 1e-13, "y_f32": 9e-6}).within_tolerance
    assert not Agreement({"x_f64": 1e-11}).within_tolerance
    assert not Agreement({"y_f32": 2e-5}).within_tolerance
    assert DTYPES == {"f32": torch.float32, "f64": torch.float64}


@pytest.mark.parametrize("name, value", [("batch", 0), ("head_dim", 2.5), ("seed", "0")])
def test_torch_agreement_rejects_bad_sizes(name, value):
    kwargs = dict(batch=1, num_heads=1, queries=2, keys=3, head_dim=2, seed=0)
    kwargs[name] = value
    with pytest.raises((TypeError, ValueError), match=name):
        torch_agreement(**kwargs)


# --- C2 against PyTorch ---------------------------------------------------------------------


def test_random_attention_draws_its_documented_stream(dtype, device):
    case = random_attention(8, 2, seed=5, dtype=dtype, device=device, target_len=3, source_len=4, batch=2)
    assert not case.mha.training
    assert case.query.shape == (3, 2, 8) and case.key.shape == (4, 2, 8) and case.value.shape == (4, 2, 8)
    assert case.query.dtype == dtype and case.mha.in_proj_weight.dtype == dtype
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(5)
    for p in case.mha.parameters():  # every parameter, in order: N(0, 1) / sqrt(E), drawn in float64
        expected = torch.randn(*p.shape, generator=gen, device=dev, dtype=torch.float64).to(dtype) / math.sqrt(8)
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=0)
    assert float(case.mha.out_proj.bias.detach().abs().min()) > 0
    expected_query = torch.randn(3, 2, 8, generator=gen, device=dev, dtype=torch.float64).to(dtype)
    torch.testing.assert_close(case.query, expected_query, rtol=0, atol=0)
    again = random_attention(8, 2, seed=5, dtype=dtype, device=device, target_len=3, source_len=4, batch=2)
    torch.testing.assert_close(again.value, case.value, rtol=0, atol=0)


def test_seeded_attention_is_the_sum_of_its_heads_written_out():
    case = random_attention(12, 3, seed=2, dtype=torch.float64, target_len=4, source_len=6, batch=2)
    with torch.no_grad():
        torch_out = case.mha(case.query, case.key, case.value, need_weights=False)[0]
        by_hand = _mha_by_hand(case.mha, case.query, case.key, case.value)
    torch.testing.assert_close(by_hand, torch_out, rtol=1e-12, atol=1e-12)


def test_mha_agreement_is_rounding_and_deterministic(device):
    a = mha_agreement(8, 2, seed=4, device=device)
    assert list(a.differences) == [
        "mha_vs_torch_f32",
        "ensemble_vs_torch_f32",
        "mha_vs_torch_f64",
        "ensemble_vs_torch_f64",
    ]
    assert a.within_tolerance
    assert mha_agreement(8, 2, seed=4, device=device) == a


def test_mha_agreement_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="num_heads"):
        mha_agreement(6, 4, seed=0)
    with pytest.raises(ValueError, match="embed_dim"):
        random_attention(0, 1, seed=0)


@pytest.mark.parametrize("head", [0, 2])
def test_null_space_move_leaves_only_its_head_unchanged(head):
    case = random_attention(12, 3, seed=1, dtype=torch.float64, target_len=4, source_len=5, batch=2)
    model = MultiHeadNW.from_torch(case.mha)
    change = null_space_change(model, case.query, case.key, case.value, seed=9, head=head)
    assert change.shape == (3,)
    assert float(change[head]) <= 1e-12
    others = [c for i, c in enumerate(change.tolist()) if i != head]
    assert min(others) > 1e-3
    # the same seed moves the keys the same way
    again = null_space_change(model, case.query, case.key, case.value, seed=9, head=head)
    torch.testing.assert_close(again, change, rtol=0, atol=0)


def test_null_space_change_rejects_bad_input():
    case = random_attention(4, 2, seed=0, dtype=torch.float64, target_len=2, source_len=3, batch=1)
    model = MultiHeadNW.from_torch(case.mha)
    with pytest.raises(TypeError, match="model"):
        null_space_change(case.mha, case.query, case.key, case.value, seed=0)
    with pytest.raises(ValueError, match="head"):
        null_space_change(model, case.query, case.key, case.value, seed=0, head=2)
    with pytest.raises(ValueError, match="scale"):
        null_space_change(model, case.query, case.key, case.value, seed=0, scale=0.0)
    with pytest.raises(ValueError, match="key"):
        null_space_change(model, case.query, case.key[:, 0], case.value, seed=0)


# --- C2 in sympy ----------------------------------------------------------------------------


@pytest.mark.parametrize("biases", [True, False])
def test_symbolic_multihead_evaluates_to_torch_multihead_attention(biases):
    sp = pytest.importorskip("sympy")
    e, heads, s = 4, 2, 2
    c2 = symbolic_multihead(e, heads, s, biases=biases)
    rng = np.random.default_rng(0)
    mha = torch.nn.MultiheadAttention(e, heads, dtype=torch.float64)
    w_q, w_k, w_v, w_o = (rng.normal(size=(e, e)) / 2 for _ in range(4))  # W_Q != W_K
    b_o, x, keys, vals = rng.normal(size=e), rng.normal(size=(1, e)), rng.normal(size=(s, e)), rng.normal(size=(s, e))
    b_in = rng.normal(size=3 * e) if biases else np.zeros(3 * e)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([w_q, w_k, w_v])))
        mha.in_proj_bias.copy_(torch.from_numpy(b_in))
        mha.out_proj.weight.copy_(torch.from_numpy(w_o))
        mha.out_proj.bias.copy_(torch.from_numpy(b_o))
        expected = mha(*(torch.from_numpy(t)[:, None] for t in (x, keys, vals)), need_weights=False)[0][0, 0]
    matrices = [c2.query, c2.keys, c2.values, *c2.weights, c2.out_bias, *c2.in_biases]
    given = [x, keys, vals, w_q, w_k, w_v, w_o, b_o[None]] + ([b[None] for b in np.split(b_in, 3)] if biases else [])
    symbols, numbers = [], []
    for matrix, value in zip(matrices, given, strict=True):
        symbols += list(matrix)  # row-major, like numpy's ravel
        numbers += value.ravel().tolist()
    sides = [c2.mha, c2.ensemble, c2.without_query_bias, c2.without_value_constant]
    evaluate = sp.lambdify([*symbols, *c2.alphas], [list(side) for side in sides], "math")
    for alphas in ((0.5, 2.0), (1.0, 1.0)):  # the ensemble holds for any positive head weights
        mha_side, ensemble, no_bq, no_bv = (torch.tensor(v, dtype=torch.float64) for v in evaluate(*numbers, *alphas))
        torch.testing.assert_close(mha_side, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ensemble, expected, rtol=1e-12, atol=1e-12)
        if biases:  # dropping b_Q from the kernel, or the constant sum_h W_O^h b_V^h, changes the output
            assert (no_bq - expected).abs().max() > 1e-3
            constant = torch.from_numpy(np.split(b_in, 3)[2] @ w_o.T)
            torch.testing.assert_close(expected - no_bv, constant, rtol=1e-12, atol=1e-12)
    b_k_symbols = set(c2.in_biases[1]) if biases else set()
    assert not (b_k_symbols & c2.ensemble.free_symbols)  # the proposition has no key bias
    assert len(c2.mha.free_symbols | c2.ensemble.free_symbols) == (102 if biases else 90)


def test_symbolic_multihead_rejects_heads_that_do_not_divide_the_width():
    pytest.importorskip("sympy")
    with pytest.raises(ValueError, match="num_heads"):
        symbolic_multihead(3, 2, 1)


# --- C2 with every bias, the scalar-weights reading, the x-space reading of C1 ---------------


def _biased_attention(dtype, device, seed=7):
    case = random_attention(12, 3, seed=seed, dtype=dtype, device=device, target_len=5, source_len=7, batch=2)
    _, b_k, b_v = case.mha.in_proj_bias.chunk(3)
    w_q, w_k, _ = case.mha.in_proj_weight.chunk(3)
    assert float(b_k.detach().abs().min()) > 0 and float(case.mha.out_proj.bias.detach().abs().min()) > 0
    assert not torch.allclose(w_q, w_k)
    return case


def test_bias_form_is_torch_multihead_attention_and_needs_both_bias_terms(dtype, device, tol):
    case = _biased_attention(dtype, device)
    args = (case.mha, case.query, case.key, case.value)
    with torch.no_grad():
        expected = case.mha(*args[1:], need_weights=False)[0]
        by_hand = _mha_by_hand(case.mha.cpu().double(), *(t.cpu().double() for t in args[1:]))
        case.mha.to(device=device, dtype=dtype)
        torch.testing.assert_close(expected.cpu().double(), by_hand, **tol)
        torch.testing.assert_close(bias_form(*args), expected, **tol)  # the proposition, without b_K
        torch.testing.assert_close(bias_form(*args, key_bias=True), expected, **tol)
        # dropping b_Q from the kernel is a different function: b_Q tilts the weights key by key
        assert (bias_form(*args, query_bias=False) - expected).abs().max() > 1e-2
        # dropping the value bias's constant misses exactly sum_h W_O^h b_V^h
        b_v = case.mha.in_proj_bias.chunk(3)[2]
        missing = expected - bias_form(*args, value_constant=False)
        torch.testing.assert_close(missing, (case.mha.out_proj.weight @ b_v).expand_as(missing), **tol)
        # the key bias cancels: torch's own output does not move when b_K does
        case.mha.in_proj_bias[12:24].mul_(-3.0)
        torch.testing.assert_close(case.mha(*args[1:], need_weights=False)[0], expected, **tol)


def test_head_estimates_are_softmax_heads_written_out():
    case = _biased_attention(torch.float64, "cpu")
    w_q, w_k, w_v = case.mha.in_proj_weight.detach().chunk(3)
    b_q = case.mha.in_proj_bias.detach().chunk(3)[0]
    est = head_estimates(case.mha, case.query, case.key, case.value)
    assert est.shape == (2, 3, 5, 4)
    for n in range(2):
        for hh in range(3):
            rows = slice(4 * hh, 4 * hh + 4)
            for li in range(5):
                q = case.query[li, n] @ w_q[rows].T + b_q[rows]
                logits = np.array([float(q @ (case.key[i, n] @ w_k[rows].T)) for i in range(7)]) / 2.0
                w = np.exp(logits - logits.max())
                w /= w.sum()
                ref = sum(w[i] * (case.value[i, n] @ w_v[rows].T).numpy() for i in range(7))
                np.testing.assert_allclose(est[n, hh, li].numpy(), ref, rtol=1e-12, atol=1e-13)


def test_head_estimates_reject_bad_input():
    case = _biased_attention(torch.float64, "cpu")
    with pytest.raises(TypeError, match="mha"):
        head_estimates(MultiHeadNW.from_torch(case.mha), case.query, case.key, case.value)
    with pytest.raises(ValueError, match="key"):
        head_estimates(case.mha, case.query, case.key[..., :5], case.value)
    with pytest.raises(TypeError, match="query_bias"):
        head_estimates(case.mha, case.query, case.key, case.value, query_bias=1)
    with pytest.raises(TypeError, match="value_constant"):
        bias_form(case.mha, case.query, case.key, case.value, value_constant=None)
    other = torch.nn.MultiheadAttention(12, 3, kdim=5, dtype=torch.float64)
    with pytest.raises(ValueError, match="mha"):
        head_estimates(other, case.query, case.key, case.value)


def test_mha_bias_check_reports_the_proposition_and_the_dropped_terms(device):
    out = mha_bias_check(16, 4, seed=2, device=device)
    assert list(out) == [
        "bias_form_vs_torch",
        "key_bias_vs_torch",
        "without_query_bias",
        "without_value_constant",
        "value_constant_size",
    ]
    assert out["bias_form_vs_torch"] <= 1e-12 and out["key_bias_vs_torch"] <= 1e-12
    assert out["without_query_bias"] > 1e-2
    assert out["without_value_constant"] == pytest.approx(out["value_constant_size"], rel=1e-10)
    assert mha_bias_check(16, 4, seed=2, device=device) == out


def _best_scalar_form_share(mha, query, key, value, iterations=200):
    """Alternating least squares for min over (c, alpha, P) of the output residual: a numpy reference."""
    e, heads = mha.embed_dim, mha.num_heads
    dh = e // heads
    with torch.no_grad():
        y = mha(query, key, value, need_weights=False)[0].reshape(-1, e).numpy()
        b_v = mha.in_proj_bias.chunk(3)[2].numpy()
        own = head_estimates(mha, query, key, value).numpy() + b_v.reshape(heads, 1, dh)
    g = own.transpose(2, 0, 1, 3).reshape(-1, heads, dh)  # (m, H, dh), query-major as y
    yc, gc = y - y.mean(0), g - g.mean(0)
    alpha = np.ones(heads)
    for _ in range(iterations):
        z = np.einsum("h,mhd->md", alpha, gc)
        p = np.linalg.lstsq(z, yc, rcond=None)[0].T  # (E, dh)
        design = np.einsum("mhd,ed->mhe", gc, p).transpose(0, 2, 1).reshape(-1, heads)
        alpha = np.linalg.lstsq(design, yc.reshape(-1), rcond=None)[0]
    resid = yc - np.einsum("h,mhd->md", alpha, gc) @ p.T
    return (resid**2).sum() / (yc**2).sum()


def test_scalar_weights_check_exact_cases_and_a_lower_bound_that_holds():
    sw = scalar_weights_check(8, 2, seed=1)
    assert sw.width_one_gap <= 1e-12 and sw.proportional_gap <= 1e-12
    assert 0 < sw.excluded_share <= sw.rank_one_share <= 1
    case = random_attention(8, 2, seed=2, dtype=torch.float64, target_len=64)  # the third case's draw
    achieved = _best_scalar_form_share(case.mha, case.query, case.key, case.value)
    assert sw.excluded_share <= achieved + 1e-9  # no scalar form beats the bound
    assert achieved <= sw.rank_one_share + 1e-9  # and the best one does at least as well as rank-one blocks
    assert achieved > 1e-3
    with pytest.raises(ValueError, match="num_heads"):
        scalar_weights_check(6, 4, seed=0)


def test_xspace_gaussian_gap_against_explicit_weights():
    special = pytest.importorskip("scipy.special")
    gap = xspace_gaussian_gap(6, 2, 9, 4, [0.5, 2.0], seed=3)
    assert gap.bandwidths == (0.5, 2.0, 2**-0.5, 2**0.25)
    gen = torch.Generator().manual_seed(3)  # the documented stream: keys, queries, W_Q, W_K
    draw = [
        torch.randn(*shape, generator=gen, dtype=torch.float64).numpy() for shape in ((9, 6), (4, 6), (6, 2), (6, 2))
    ]
    keys, queries = ((t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5) for t in draw[:2])
    w_q, w_k = draw[2] / np.sqrt(6), draw[3] / np.sqrt(6)
    att = special.softmax((queries @ w_q) @ (keys @ w_k).T / np.sqrt(2), axis=-1)
    sq = ((queries[:, None] - keys[None]) ** 2).sum(-1)
    for b, s in enumerate(gap.bandwidths):
        tv = 0.5 * np.abs(att - special.softmax(-sq / (2 * s**2), axis=-1)).sum(-1).mean()
        assert gap.distance[b].item() == pytest.approx(tv, rel=1e-9)
    assert gap.best == pytest.approx(gap.distance.min().item()) and gap.at_inverse_root == gap.distance[2].item()
    assert gap.best > 1e-3 and gap.identity_gap <= 1e-14
    with pytest.raises(ValueError, match="bandwidths"):
        xspace_gaussian_gap(6, 2, 9, 4, [0.0], seed=3)
    with pytest.raises(ValueError, match="head_dim"):
        xspace_gaussian_gap(6, 0, 9, 4, [1.0], seed=3)


QK = dict(n_train=30, n_eval=11, embed_dim=6, head_dim=3, temperatures=[1.0, 0.05, 0.2], replicates=3, noise_sd=0.3)


def test_qk_norm_smoothing_against_the_explicit_softmax():
    special = pytest.importorskip("scipy.special")
    qk = qk_norm_smoothing(**QK, seed=4)
    assert qk.temperatures == (0.05, 0.2, 1.0)
    assert qk.val_loss.shape == qk.test_ise.shape == (3, 3) and qk.selected_ise.shape == qk.zero_mse.shape == (3,)
    gen = torch.Generator().manual_seed(4)  # the documented stream
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).numpy()  # noqa: E731
    w_k = rnd(6, 3) / np.sqrt(6)
    w_q = w_k + 0.3 * rnd(6, 3) / np.sqrt(6)
    a = rnd(3)
    a /= np.linalg.norm(a)

    def ln(t):
        return (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5)

    def unit(t):
        return t / np.linalg.norm(t, axis=-1, keepdims=True)

    x_tr, x_val, x_te = ln(rnd(3, 30, 6)), ln(rnd(3, 11, 6)), ln(rnd(3, 11, 6))
    f = lambda x: np.sin(np.pi * unit(x @ w_k) @ a)  # noqa: E731
    y_tr, y_val = f(x_tr) + 0.3 * rnd(3, 30), f(x_val) + 0.3 * rnd(3, 11)
    for r in range(3):
        for t, tau in enumerate(qk.temperatures):

            def fit(x, r=r, tau=tau):
                w = special.softmax(unit(x[r] @ w_q) @ unit(x_tr[r] @ w_k).T / tau, axis=-1)
                return w @ y_tr[r]

            assert qk.val_loss[r, t].item() == pytest.approx(((fit(x_val) - y_val[r]) ** 2).mean(), rel=1e-9)
            assert qk.test_ise[r, t].item() == pytest.approx(((fit(x_te) - f(x_te[r])) ** 2).mean(), rel=1e-9)
        assert qk.zero_mse[r].item() == pytest.approx((f(x_te[r]) ** 2).mean(), rel=1e-12)
    assert torch.equal(qk.selected, qk.val_loss.argmin(-1))
    assert qk.gaussian_gap <= 1e-12
    again = qk_norm_smoothing(**QK, seed=4)
    torch.testing.assert_close(again.test_ise, qk.test_ise, rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, name",
    [({"temperatures": [0.1, -1.0]}, "temperatures"), ({"replicates": 1}, "replicates"), ({"noise_sd": -1.0}, "noise_sd"),
     ({"temperatures": "0.1"}, "temperatures"), ({"n_train": 0}, "n_train")],
)  # fmt: skip
def test_qk_norm_smoothing_rejects_bad_input(change, name):
    with pytest.raises((TypeError, ValueError), match=name):
        qk_norm_smoothing(**(QK | change), seed=0)


# --- one head in one dimension --------------------------------------------------------------


def test_sine_target_known_values():
    x = torch.tensor([0.0, 0.25, 0.5, 0.75], dtype=torch.float64)
    torch.testing.assert_close(sine_target(x), torch.tensor([0.0, 1.0, 0.0, -1.0], dtype=torch.float64))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # statsmodels internals
def test_smoother_demo_matches_statsmodels_and_explicit_weights():
    statsmodels = pytest.importorskip("statsmodels.nonparametric.kernel_regression")
    bws = [0.02, 0.1, 0.3]
    demo = smoother_demo(60, 0.3, bws, seed=7, plot_points=11)
    assert demo.fits.shape == (3, 11) and demo.weights.shape == (3, 60) and demo.n_eff.shape == (3,)
    assert demo.n_eff.dtype == torch.float64
    gen = torch.Generator().manual_seed(7)  # the documented stream: x, then the noise
    x_ref = torch.rand(60, 1, generator=gen)
    torch.testing.assert_close(demo.x, x_ref, rtol=0, atol=0)
    torch.testing.assert_close(demo.y, sine_target(x_ref[:, 0]) + 0.3 * torch.randn(60, generator=gen), rtol=0, atol=0)
    x, y = demo.x[:, 0].double().numpy(), demo.y.double().numpy()
    for b, h in enumerate(bws):
        w = _gaussian_weights_np(demo.query, x, h)
        np.testing.assert_allclose(demo.n_eff[b].item(), 1 / (w**2).sum(), rtol=1e-10)
        np.testing.assert_allclose(demo.weights[b].double().numpy(), w, atol=1e-5)
        np.testing.assert_allclose(demo.fit_at_query[b].item(), w @ y, atol=1e-5)
        if h >= 0.1:  # float32 fits; statsmodels' local-constant Gaussian regression is exactly NW
            reg = statsmodels.KernelReg(y, x, "c", reg_type="lc", bw=np.array([h]), ckertype="gaussian")
            fit_ref = reg.fit(demo.x_plot[:, 0].double().numpy())[0]
            np.testing.assert_allclose(demo.fits[b].double().numpy(), fit_ref, atol=1e-5)


def test_smoother_demo_effective_numbers_reach_their_limits():
    demo = smoother_demo(50, 0.3, [1e-4, 1e3], seed=0)
    assert demo.n_eff[0].item() == pytest.approx(1.0, abs=1e-6)  # a tiny bandwidth: the nearest point only
    assert demo.n_eff[1].item() == pytest.approx(50.0, rel=1e-6)  # a huge one: every point alike


def test_smoother_demo_rejects_bad_input():
    with pytest.raises(ValueError, match="bandwidths"):
        smoother_demo(10, 0.3, [0.1, -1.0], seed=0)
    with pytest.raises(TypeError, match="bandwidths"):
        smoother_demo(10, 0.3, "0.1", seed=0)
    with pytest.raises(ValueError, match="noise_sd"):
        smoother_demo(10, -0.3, [0.1], seed=0)
    with pytest.raises(ValueError, match="n_train"):
        smoother_demo(0, 0.3, [0.1], seed=0)


def test_circle_weights_against_scipy_softmax_and_gaussian_formula():
    special = pytest.importorskip("scipy.special")
    circle = circle_weights(30, seed=2, radius=1.7)
    q = circle.query[0].numpy()
    assert circle.sigma == 2**0.25
    assert bool((circle.angles.diff() >= 0).all()) and 0 <= circle.angles.min() and circle.angles.max() < 2 * math.pi
    equal, unequal = circle.cases["equal norms"], circle.cases["unequal norms"]
    np.testing.assert_allclose(equal.keys.norm(dim=-1).numpy(), 1.7, rtol=1e-14)
    norms = unequal.keys.norm(dim=-1).numpy()
    assert norms.min() >= 0.6 * 1.7 and norms.max() <= 1.4 * 1.7
    for c in (equal, unequal):
        k = c.keys.numpy()
        np.testing.assert_allclose(c.attention.numpy(), special.softmax(k @ q / math.sqrt(2)), rtol=1e-12)
        g = np.exp(-((k - q) ** 2).sum(-1) / (2 * circle.sigma**2))
        np.testing.assert_allclose(c.gaussian.numpy(), g / g.sum(), rtol=1e-12)
    assert equal.gap <= 1e-14 and unequal.gap > 1e-3  # the C1 statement and its limit
    assert equal.prior_gap <= 1e-14 and unequal.prior_gap <= 1e-14
    assert circle.max_logit == pytest.approx(1.7 * 1.4 * 1.7 / math.sqrt(2))
    again = circle_weights(30, seed=2, radius=1.7)
    torch.testing.assert_close(again.cases["unequal norms"].keys, unequal.keys, rtol=0, atol=0)


def test_circle_weights_rejects_bad_input():
    with pytest.raises(ValueError, match="radius"):
        circle_weights(5, seed=0, radius=0.0)
    with pytest.raises(ValueError, match="n_keys"):
        circle_weights(0, seed=0)


def test_float64_device_falls_back_to_the_cpu_for_mps():
    assert float64_device("cpu") == torch.device("cpu")
    assert float64_device("mps") == torch.device("cpu")
    assert float64_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


# --- the Monte Carlo study ------------------------------------------------------------------


def _parts_np(f0: np.ndarray, e: np.ndarray, f: np.ndarray) -> dict[str, np.ndarray]:
    """The split of the MISE from (R, B, m) signal and noise fits, written out in numpy."""
    r = f0.shape[0]
    design = f0.var(0, ddof=1).mean(-1)
    sq_bias = ((f0.mean(0) - f) ** 2).mean(-1) - design / r
    mise = ((f0 + e - f) ** 2).mean(-1).mean(0)
    noise = (e**2).mean(-1).mean(0)
    cross = (2 * (f0 - f) * e).mean(-1).mean(0)
    total = noise + design
    return {"mise": mise, "sq_bias": sq_bias, "noise_var": noise, "design_var": design, "cross": cross,
            "cross_share": cross / mise, "variance_step": np.concatenate([[0.0], np.diff(total)])}  # fmt: skip


def _fits_np(study: MiseStudy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signal and noise fits (R, B, m) of every replicate with explicit float64 Gaussian weights."""
    x = study.x[..., 0].double().numpy()
    signal = np.sin(2 * np.pi * x)
    noise = study.y.double().numpy() - signal
    z = study.x_eval[:, 0].double().numpy()
    f0 = np.empty((x.shape[0], len(study.bandwidths), z.size))
    e = np.empty_like(f0)
    for b, h in enumerate(study.bandwidths):
        k = np.exp(-((z[None, :, None] - x[:, None, :]) ** 2) / (2 * h**2))  # (R, m, n)
        w = k / k.sum(-1, keepdims=True)
        f0[:, b] = np.einsum("rmn,rn->rm", w, signal)
        e[:, b] = np.einsum("rmn,rn->rm", w, noise)
    return f0, e, study.f_eval.numpy()


def test_mise_study_shapes_and_stream(study):
    r, b, m = SMALL["replicates"], len(SMALL["bandwidths"]), SMALL["grid"]
    assert study.ise.shape == (r, b) and study.ise.dtype == torch.float64
    assert study.x.shape == (r, SMALL["n_train"], 1) and study.y.shape == (r, SMALL["n_train"])
    assert set(study.estimates) == set(study.ses) == set(MISE_PARTS)
    assert all(v.shape == (b,) for v in study.estimates.values())
    assert study.x_eval.shape == (m, 1) and study.f_eval.shape == (m,)
    gen = torch.Generator().manual_seed(3)  # the documented stream: designs, then noise
    x = torch.rand(r, SMALL["n_train"], 1, generator=gen)
    eps = 0.3 * torch.randn(r, SMALL["n_train"], generator=gen)
    torch.testing.assert_close(study.x, x, rtol=0, atol=0)
    torch.testing.assert_close(study.y, sine_target(x[..., 0]) + eps, rtol=0, atol=0)


def test_mise_study_is_deterministic(study):
    again = mise_study(**SMALL, seed=3)
    torch.testing.assert_close(again.ise, study.ise, rtol=0, atol=0)
    for name in MISE_PARTS:
        np.testing.assert_array_equal(again.ses[name], study.ses[name])
    other = mise_study(**SMALL, seed=4)
    assert not torch.equal(other.ise, study.ise)


def test_mise_study_parts_match_a_numpy_reference(study):
    f0, e, f = _fits_np(study)
    ref = _parts_np(f0, e, f)
    for name, value in ref.items():
        np.testing.assert_allclose(study.estimates[name], value, rtol=2e-4, atol=1e-8, err_msg=name)
    ise_ref = ((f0 + e - f) ** 2).mean(-1)
    np.testing.assert_allclose(study.ise.numpy(), ise_ref, rtol=2e-4, atol=1e-9)
    assert study.split_gap.max() <= 1e-9
    assert study.best == int(np.argmin(ref["mise"]))
    np.testing.assert_allclose(study.mise_se, ise_ref.std(0, ddof=1) / math.sqrt(ise_ref.shape[0]), rtol=1e-3)


def test_mise_study_standard_errors_are_the_delete_a_group_jackknife(study):
    f0, e, f = _fits_np(study)
    groups, size = SMALL["jk_groups"], SMALL["replicates"] // SMALL["jk_groups"]
    leave_out = []
    for g in range(groups):
        keep = np.ones(f0.shape[0], dtype=bool)
        keep[g * size : (g + 1) * size] = False
        leave_out.append(_parts_np(f0[keep], e[keep], f))
    for name in ("mise", "sq_bias", "design_var", "noise_var", "cross_share", "variance_step"):
        thetas = np.stack([lo[name] for lo in leave_out])
        se = np.sqrt((groups - 1) / groups * ((thetas - thetas.mean(0)) ** 2).sum(0))
        np.testing.assert_allclose(study.ses[name], se, rtol=2e-3, atol=1e-9, err_msg=name)
    ise = ((f0 + e - f) ** 2).mean(-1)
    ratios = []
    for g in range(groups):
        keep = np.ones(ise.shape[0], dtype=bool)
        keep[g * size : (g + 1) * size] = False
        ratios.append(ise[keep][:, [0, -1]].sum(0) / ise[keep][:, study.best].sum())
    ratios = np.stack(ratios)
    se = np.sqrt((groups - 1) / groups * ((ratios - ratios.mean(0)) ** 2).sum(0))
    for i, name in enumerate(("hmin", "hmax")):
        full = ise[:, [0, -1]].sum(0)[i] / ise[:, study.best].sum()
        assert study.ratios[name].estimate == pytest.approx(full, rel=2e-4)
        assert study.ratios[name].se == pytest.approx(se[i], rel=2e-3)


def test_mise_study_without_noise_has_no_noise_variance_or_cross_term():
    quiet = mise_study(**(SMALL | {"noise_sd": 0.0}), seed=1)
    np.testing.assert_array_equal(quiet.estimates["noise_var"], 0.0)
    np.testing.assert_array_equal(quiet.estimates["cross"], 0.0)
    np.testing.assert_allclose(
        quiet.estimates["mise"], quiet.estimates["sq_bias"] + quiet.estimates["design_var"], rtol=1e-12
    )


@pytest.mark.parametrize(
    "change, name",
    [({"replicates": 25}, "replicates"), ({"bandwidths": [0.2, 0.1]}, "bandwidths"), ({"n_train": 0}, "n_train"),
     ({"grid": 1}, "grid"), ({"jk_groups": 1}, "jk_groups")],
)  # fmt: skip
def test_mise_study_rejects_bad_input(change, name):
    with pytest.raises(ValueError, match=name):
        mise_study(**(SMALL | change), seed=0)


def test_mise_comparisons_and_table(study):
    b = len(study.bandwidths)
    bias, var = np.full(b, 2.0), np.full(b, 4.0)
    c = mise_comparisons(study, bias, var)
    assert all(isinstance(v, Comparison) for v in c.values())
    k = study.best
    assert c["mise_opt"] == (study.estimates["mise"][k], study.mise_se[k])
    assert c["noise_ratio_opt"].estimate == pytest.approx(study.estimates["noise_var"][k] / 4.0)
    assert c["bias_ratio_opt"].se == pytest.approx(study.ses["sq_bias"][k] / 2.0)
    assert c["total_variance_step"] == (study.estimates["variance_step"][-1], study.ses["variance_step"][-1])
    with pytest.raises(ValueError, match="asymptotic_sq_bias"):
        mise_comparisons(study, bias[:-1], var)
    table = mise_table(study)
    assert list(table.index) == list(study.bandwidths) and len(table.columns) == 7
    np.testing.assert_array_equal(table["design var"].to_numpy(), study.estimates["design_var"])


def test_format_mise_table_reads_as_words_with_standard_errors(study):
    shown = format_mise_table(study)
    headers = ["MISE", "bias²", "noise variance", "design variance", "cross term / MISE"]
    assert list(shown.columns) == headers and shown.index.name == "bandwidth h"
    assert list(shown.index) == [f"{h:.3g}" for h in study.bandwidths]

    def pm(value: float, se: float) -> str:  # the SE to two significant digits, the estimate to its decimals
        d = 1 - math.floor(math.log10(se))
        text = f"{round(value, d):.{d}f} ± {se:.{d}f}"
        return text.replace(" ± ", "\u00a0±\u00a0").replace("-", "\u2212")  # as the book typesets it

    e, k = study.estimates, len(study.bandwidths) - 1
    assert shown["MISE"].iloc[k] == pm(e["mise"][k], study.mise_se[k])
    assert shown["cross term / MISE"].iloc[0] == pm(e["cross_share"][0], study.ses["cross_share"][0])
    for column, key in (("bias²", "sq_bias"), ("design variance", "design_var")):  # three significant digits each
        assert shown[column].tolist() == [f"{float(f'{v:.3g}'):g}".replace("-", "\u2212") for v in e[key]]
    with pytest.raises(TypeError, match="study"):
        format_mise_table(None)


def _loo_score_np(x: np.ndarray, y: np.ndarray, h: float) -> float:
    k = np.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * h**2))
    np.fill_diagonal(k, 0.0)
    return float(((k @ y / k.sum(1) - y) ** 2).mean())


def test_cv_study_picks_the_leave_one_out_minimiser(study):
    cv = cv_study(study)
    r = SMALL["replicates"]
    assert cv.bandwidth.shape == cv.ise_cv.shape == cv.ise_opt.shape == (r,)
    # brute force on two replicates: no bandwidth of a fine grid scores better than the chosen one
    grid = np.geomspace(0.01, 1.0, 400)
    for rep in (0, 7):
        x, y = study.x[rep, :, 0].double().numpy(), study.y[rep].double().numpy()
        chosen = _loo_score_np(x, y, float(cv.bandwidth[rep]))
        assert chosen <= min(_loo_score_np(x, y, h) for h in grid) * (1 + 1e-3)
    # linearity: the fit of y at the oracle bandwidth is the study's signal + noise fit
    torch.testing.assert_close(cv.ise_opt, study.ise[:, study.best], rtol=1e-3, atol=1e-8)
    assert cv.ratio.estimate == pytest.approx(float(cv.ise_cv.sum() / cv.ise_opt.sum()), rel=1e-12)
    np.testing.assert_allclose(cv.quartiles, np.quantile(cv.bandwidth.numpy(), [0.25, 0.5, 0.75]))
    with pytest.raises(TypeError, match="study"):
        cv_study("study")


def test_fraction_removed_is_a_ratio_with_its_leave_one_out_jackknife():
    e = torch.tensor([0.2, 0.3, 0.25, 0.4], dtype=torch.float64)
    z = torch.tensor([0.5, 0.6, 0.45, 0.7], dtype=torch.float64)
    c = fraction_removed(e, z)
    assert c.estimate == pytest.approx(1 - e.mean().item() / z.mean().item())
    loo = [1 - np.delete(e.numpy(), k).mean() / np.delete(z.numpy(), k).mean() for k in range(4)]
    assert c.se == pytest.approx(np.sqrt(3 / 4 * ((np.array(loo) - np.mean(loo)) ** 2).sum()))
    assert c.df == 3
    with pytest.raises(ValueError, match="zero_errors"):
        fraction_removed(e, z[:3])
    with pytest.raises(ValueError, match="errors"):
        fraction_removed(e[:1], z[:1])


def test_weights_grid_is_the_demos_weights_sorted_by_x():
    import nwlib.experiments.attention_is_nw as ch01

    demo = ch01.smoother_demo(30, 0.3, [0.05, 0.2], seed=3)
    grid = ch01.weights_grid(demo)
    assert list(grid.columns) == ["h", "x", "weight", "n_eff"] and len(grid) == 60
    for b, h in enumerate(demo.bandwidths):
        part = grid[grid.h == h]
        assert part.x.is_monotonic_increasing and abs(part.weight.sum() - 1) < 1e-5
        # row by row: the weight at the sorted training point, from the demo's own (B, n) weights
        by_x = dict(zip(demo.x[:, 0].tolist(), demo.weights[b].tolist(), strict=True))
        assert all(abs(by_x[x] - w) < 1e-7 for x, w in zip(part.x, part.weight, strict=True))
    with pytest.raises(TypeError, match="demo"):
        ch01.weights_grid("demo")


# --- the blocks of the sweeps (mise_point, cv_point, qk_point) ----------------------------------


def _signal_fits(study: MiseStudy) -> torch.Tensor:
    """(R, B, m) float64 signal fits of every replicate in one unblocked pass (float32 fits, as the study)."""
    signal_y = sine_target(study.x[..., 0])
    fits = [
        nadaraya_watson(study.x_eval, study.x, signal_y, kernel="gaussian", bandwidth=float(h))
        for h in study.bandwidths
    ]
    return torch.stack(fits, dim=1).double()


@pytest.mark.parametrize("blocks", [1, 2, 5, 10])
def test_mise_study_blocks_merge_to_the_unblocked_design_variance_and_its_jackknife(study, blocks):
    blocked = mise_study(**SMALL, seed=3, blocks=blocks)
    torch.testing.assert_close(blocked.ise, study.ise, rtol=0, atol=0)  # per replicate: no blocking in it
    assert [p["block"] for p in blocked.points] == list(range(blocks))
    # the unblocked computation on the same random numbers: variance over all replicates, groups deleted
    f0 = _signal_fits(study)
    design = f0.var(0).mean(-1).numpy()
    np.testing.assert_allclose(blocked.estimates["design_var"], design, rtol=1e-9)
    groups, size = SMALL["jk_groups"], SMALL["replicates"] // SMALL["jk_groups"]
    thetas = np.stack(
        [torch.cat([f0[: g * size], f0[(g + 1) * size :]]).var(0).mean(-1).numpy() for g in range(groups)]
    )
    se = np.sqrt((groups - 1) / groups * ((thetas - thetas.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose(blocked.ses["design_var"], se, rtol=1e-7)
    for name in MISE_PARTS:  # the blocks change rounding only
        np.testing.assert_allclose(blocked.estimates[name], study.estimates[name], rtol=1e-10, atol=1e-15, err_msg=name)
        np.testing.assert_allclose(blocked.ses[name], study.ses[name], rtol=1e-8, atol=1e-15, err_msg=name)
    assert blocked.ratios == study.ratios  # from the per-replicate ISE


def test_mise_point_sums_are_the_blocks_centred_sums(study):
    point = dict(study.points[3])
    out = mise_point(point, seed=0)
    lo, hi = 3 * 2, 4 * 2  # 10 blocks of 2 replicates, one group each
    f0 = _signal_fits(study)[lo:hi]
    np.testing.assert_allclose(out["centre"], f0.mean(0).numpy(), rtol=1e-12)
    centred = f0 - f0.mean(0)
    np.testing.assert_allclose(out["s2"], centred.pow(2).sum(0, keepdim=True).numpy(), rtol=1e-9, atol=1e-18)
    np.testing.assert_allclose(out["s1"], 0.0, atol=1e-12)
    np.testing.assert_array_equal(out["ise"], study.ise[lo:hi].numpy())
    assert np.shape(out["series"]) == (1, len(SMALL["bandwidths"]), 3)


@pytest.mark.parametrize(
    "change, name",
    [({"blocks": 3}, "blocks"), ({"block": 10}, "block"), ({"data_seed": 1.5}, "data_seed"), ({"grid": 1}, "grid")],
)
def test_mise_point_rejects_bad_points(study, change, name):
    with pytest.raises((TypeError, ValueError), match=name):
        mise_point(dict(study.points[0]) | change, seed=0)
    with pytest.raises(ValueError, match="lacks"):
        mise_point({k: v for k, v in study.points[0].items() if k != "block"}, seed=0)


def test_mise_study_rejects_blocks_that_split_a_jackknife_group():
    with pytest.raises(ValueError, match="blocks"):
        mise_study(**SMALL, seed=0, blocks=4)  # 10 groups


def test_cv_study_blocks_are_one_unblocked_selection(study):
    from nwlib.bandwidth import select_bandwidth

    cv = cv_study(study)
    whole = select_bandwidth(study.x.double(), study.y.double(), kernel="gaussian").bandwidth.float()
    torch.testing.assert_close(cv.bandwidth, whole, rtol=0, atol=0)
    fit = nadaraya_watson(study.x_eval, study.x, study.y, kernel="gaussian", bandwidth=whole)
    torch.testing.assert_close(cv.ise_cv, (fit.double() - study.f_eval).pow(2).mean(-1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="bandwidth"):
        cv_point(
            {k: v for k, v in study.points[0].items() if k not in ("bandwidths", "jk_groups")} | {"bandwidth": 0.0},
            seed=0,
        )


def test_qk_norm_smoothing_does_not_depend_on_its_blocks():
    whole = qk_norm_smoothing(**QK, seed=4, blocks=1)
    for blocks in (2, 3):
        split = qk_norm_smoothing(**QK, seed=4, blocks=blocks)
        for name in ("val_loss", "test_ise", "selected", "selected_ise", "zero_mse"):
            torch.testing.assert_close(getattr(split, name), getattr(whole, name), rtol=0, atol=0)
        assert split.gaussian_gap == whole.gaussian_gap
    with pytest.raises(ValueError, match="blocks"):
        qk_norm_smoothing(**QK, seed=4, blocks=4)  # 3 replicates
    point = dict(n_train=30, n_eval=11, embed_dim=6, head_dim=3, temperatures=[0.05, 0.2, 1.0], replicates=3)
    point |= dict(noise_sd=0.3, query_shift=0.3, blocks=3, block=1, data_seed=4)
    out = qk_point(point, seed=0)
    np.testing.assert_array_equal(out["test_ise"], whole.test_ise[1:2].numpy())
    with pytest.raises(ValueError, match="lacks"):
        qk_point({k: v for k, v in point.items() if k != "query_shift"}, seed=0)
