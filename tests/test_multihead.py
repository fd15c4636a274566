"""MultiHeadNW against torch.nn.MultiheadAttention and its own ensemble definition."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nwlib import MultiHeadNW, nadaraya_watson


def make_mha(device, dtype, seed=0, **kwargs) -> nn.MultiheadAttention:
    torch.manual_seed(seed)  # nn.Module initialisation has no generator argument
    mha = nn.MultiheadAttention(device=device, dtype=dtype, **kwargs)
    with torch.no_grad():  # non-zero biases so that they are exercised
        for p in mha.parameters():
            if p.dim() == 1:
                p.normal_(generator=None)
    return mha.eval()


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kv_dims", [None, (3, 5)])
def test_reproduces_torch_multihead_attention(device, dtype, tol, generator, batch_first, kv_dims):
    kdim, vdim = kv_dims or (None, None)
    mha = make_mha(device, dtype, embed_dim=12, num_heads=3, kdim=kdim, vdim=vdim, batch_first=batch_first)
    model = MultiHeadNW.from_torch(mha)
    kd, vd = kdim or 12, vdim or 12
    n_batch, length, source = 4, 6, 9

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

    if batch_first:
        q, k, v = randn(n_batch, length, 12), randn(n_batch, source, kd), randn(n_batch, source, vd)
    else:
        q, k, v = randn(length, n_batch, 12), randn(source, n_batch, kd), randn(source, n_batch, vd)
    with torch.no_grad():
        expected = mha(q, k, v, need_weights=False)[0]
        torch.testing.assert_close(model(q, k, v), expected, **tol)
        # unbatched inputs
        q0, k0, v0 = (t[0] if batch_first else t[:, 0] for t in (q, k, v))
        torch.testing.assert_close(model(q0, k0, v0), mha(q0, k0, v0, need_weights=False)[0], **tol)


def test_train_mode_without_dropout_matches(device, dtype, tol, generator):
    mha = make_mha(device, dtype, embed_dim=8, num_heads=2, batch_first=True).train()
    x = torch.randn(2, 5, 8, generator=generator, device=device, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(MultiHeadNW.from_torch(mha)(x, x, x), mha(x, x, x)[0], **tol)


def test_heads_are_nw_estimators_in_their_own_projected_space(device, dtype, tol, generator):
    """head_outputs[h] is NW with keys K W_K^h, queries Q W_Q^h, values V W_V^h (C2)."""
    model = MultiHeadNW(8, 4, batch_first=True, device=device, dtype=dtype)
    q = torch.randn(3, 5, 8, generator=generator, device=device, dtype=dtype)
    kv = torch.randn(3, 7, 8, generator=generator, device=device, dtype=dtype)
    heads = model.head_outputs(q, kv, kv)
    assert heads.shape == (3, 4, 5, 2)
    w_q, w_k, w_v = model.q_proj_weight, model.k_proj_weight, model.v_proj_weight
    b_q, b_k, b_v = model.in_proj_bias.chunk(3)
    for h in range(4):
        rows = slice(2 * h, 2 * h + 2)
        qh = q @ w_q[rows].T + b_q[rows]
        kh = kv @ w_k[rows].T + b_k[rows]
        vh = kv @ w_v[rows].T + b_v[rows]
        ref = torch.softmax(qh @ kh.mT / 2**0.5, dim=-1) @ vh
        torch.testing.assert_close(heads[:, h], ref, **tol)
        # key_projections[h] is the map x -> x W_K^h (bias aside)
        torch.testing.assert_close(kv @ model.key_projections[h], kv @ w_k[rows].T, **tol)
    # forward is the output projection of the concatenated heads: the weighted sum of heads
    concat = heads.transpose(1, 2).reshape(3, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(q, kv, kv), model.out_proj(concat), **tol)


def test_parameters_follow_factory_arguments(device, dtype):
    model = MultiHeadNW(6, 3, bias=False, device=device, dtype=dtype)
    assert all(p.dtype == dtype and p.device.type == device.type for p in model.parameters())
    assert model.in_proj_bias is None and model.out_proj.bias is None
    assert model.key_projections.shape == (3, 6, 2)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"embed_dim": 10, "num_heads": 3}, ValueError, "num_heads"),
        ({"embed_dim": 0, "num_heads": 1}, ValueError, "embed_dim"),
        ({"embed_dim": 8.0, "num_heads": 2}, TypeError, "embed_dim"),
        ({"embed_dim": 8, "num_heads": 0}, ValueError, "num_heads"),
        ({"embed_dim": 8, "num_heads": 2, "kdim": -1}, ValueError, "kdim"),
    ],
)
def test_bad_constructor_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MultiHeadNW(**kwargs)


def test_bad_forward_inputs():
    model = MultiHeadNW(8, 2, kdim=4, batch_first=True)
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 4), torch.randn(2, 7, 8)
    with pytest.raises(ValueError, match="key"):
        model(q, torch.randn(2, 7, 8), v)
    with pytest.raises(ValueError, match="value"):
        model(q, k, v[:, :3])
    with pytest.raises(ValueError, match="key"):
        model(q, k[0], v)
    with pytest.raises(TypeError, match="query"):
        model(q.double(), k, v)
    with pytest.raises(TypeError, match="mha"):
        MultiHeadNW.from_torch(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadNW.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_head_outputs_use_nadaraya_watson_default_bandwidth(generator):
    """The per-head bandwidth is the attention one, d_h^(1/4)."""
    model = MultiHeadNW(4, 1, bias=False)
    with torch.no_grad():
        for w in (model.q_proj_weight, model.k_proj_weight, model.v_proj_weight):
            w.copy_(torch.eye(4))
    x = torch.randn(5, 4, generator=generator)
    torch.testing.assert_close(model.head_outputs(x, x, x)[0], nadaraya_watson(x, x, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_split_projection_gives_each_heads_features_as_multiheadattention_computes_them(dtype):
    from nwlib import split_projection

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(12, 3, bias=False, dtype=dtype)
    x = torch.randn(5, 12, dtype=dtype)
    w_q = mha.in_proj_weight[:12]
    # torch splits the projected features into heads with a reshape of the last dimension
    reference = torch.nn.functional.linear(x, w_q).reshape(5, 3, 4).transpose(0, 1)
    heads = split_projection(w_q, 3)
    assert heads.shape == (3, 12, 4) and heads.dtype == dtype
    torch.testing.assert_close(x @ heads, reference)
    with pytest.raises(ValueError, match="num_heads"):
        split_projection(w_q, 5)
    with pytest.raises(TypeError, match="weight"):
        split_projection(w_q.tolist(), 3)
