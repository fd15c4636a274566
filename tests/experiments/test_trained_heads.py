"""Tests of nwlib.experiments.trained_heads (chapter 5): each driver against a brute-force or closed-form reference."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.linalg
import torch

from nwlib import random_subspaces, simulate
from nwlib.evidence import Comparison
from nwlib.experiments import trained_heads as th
from nwlib.models.llama import LlamaConfig, NWLlamaDecoder
from nwlib.models.pretrained import BertConfig, NWBertEncoder
from nwlib.models.training import optimise_subspaces, train_regressor
from nwlib.tasks import make_task

F64 = torch.float64


# --- a small random encoder and a whitespace tokenizer --------------------------------------

SMALL = BertConfig(
    hidden_size=12,
    num_attention_heads=3,
    num_hidden_layers=2,
    intermediate_size=16,
    vocab_size=40,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.2,
)
TEXTS = ["a b c d e", "f g h", "i j k l m n o", "p q"]


class WordTokenizer:
    """Whitespace tokens, ids from the letters, padded to the longest text (what encode needs)."""

    def encode_batch(self, texts):
        longest = max(len(t.split()) for t in texts)
        out = []
        for t in texts:
            words = t.split()
            pad = longest - len(words)
            ids = [1 + (sum(map(ord, w)) % (SMALL.vocab_size - 1)) for w in words] + [0] * pad
            out.append(
                SimpleNamespace(
                    ids=ids,
                    attention_mask=[1] * len(words) + [0] * pad,
                    type_ids=[0] * longest,
                    tokens=words + ["[PAD]"] * pad,
                )
            )
        return out


def small_encoder(dtype=F64, device="cpu"):
    with torch.random.fork_rng():  # nn.Linear initialises from the global generator; overwritten below
        encoder = NWBertEncoder(SMALL, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in encoder.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=F64).to(dtype))
    return encoder.eval().to(device)


@pytest.fixture(scope="module")
def encoded():
    encoder = small_encoder()
    return encoder, th.encode_corpus(encoder, WordTokenizer(), TEXTS)


def np_heads(weight, H):
    """(H*d_k, D) Linear weight -> list of H (D, d_k) numpy blocks, by row slices."""
    w = weight.detach().double().cpu().numpy()
    k = w.shape[0] // H
    return [w[h * k : (h + 1) * k].T for h in range(H)]


def np_hdi(blocks):
    qs = [np.linalg.qr(b)[0] for b in blocks]
    k = qs[0].shape[1]
    pairs = [(a, b) for a in range(len(qs)) for b in range(a + 1, len(qs))]
    return 1 - np.mean([np.sum((qs[a].T @ qs[b]) ** 2) / k for a, b in pairs])


def np_paper(blocks):
    k = blocks[0].shape[1]
    pairs = [(a, b) for a in range(len(blocks)) for b in range(a + 1, len(blocks))]
    return 1 - np.mean([np.sum((blocks[a].T @ blocks[b]) ** 2) / k**2 for a, b in pairs])


def np_rv_diversity(blocks):
    grams = [b @ b.T for b in blocks]
    pairs = [(a, b) for a in range(len(grams)) for b in range(a + 1, len(grams))]
    rv = [np.sum(grams[a] * grams[b]) / (np.linalg.norm(grams[a]) * np.linalg.norm(grams[b])) for a, b in pairs]
    return 1 - np.mean(rv)


def np_mean_se(x):
    x = np.asarray(x, dtype=float)
    return x.mean(), x.std(ddof=1) / math.sqrt(len(x))


# --- the real model on a corpus -------------------------------------------------------------


def test_read_corpus_skips_blank_and_comment_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("# a comment\nFirst text.  \n\n   \nSecond one\n# another\n  indented # not a comment\n")
    assert th.read_corpus(path) == ["First text.", "Second one", "indented # not a comment"]
    with pytest.raises(TypeError, match="path"):
        th.read_corpus(3)


def test_encode_corpus_runs_the_encoder_and_counts_tokens(device):
    encoder = small_encoder(device=device)
    corpus = th.encode_corpus(encoder, WordTokenizer(), TEXTS)
    lengths = [len(t.split()) for t in TEXTS]
    assert corpus.texts == TEXTS and corpus.n_tokens == sum(lengths) and corpus.longest == max(lengths)
    assert corpus.mean_keys == pytest.approx(sum(n * n for n in lengths) / sum(lengths), rel=1e-15)
    assert corpus.mask.device.type == "cpu" and corpus.mask.dtype == torch.bool
    with torch.no_grad():
        b = corpus.batch
        want = encoder(b.input_ids.to(device), b.attention_mask.to(device), b.token_type_ids.to(device))
    assert len(corpus.hidden) == SMALL.num_hidden_layers + 1
    for got, ref in zip(corpus.hidden, want, strict=True):
        assert got.device.type == torch.device(device).type
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_laws_follow_their_laws(dtype):
    H, k, D, F, sd = 3, 2, 6, 400, 0.3
    laws = th.reference_laws(H, k, D, families=F, init_sd=sd, generator=torch.Generator().manual_seed(0), dtype=dtype)
    again = th.reference_laws(H, k, D, families=F, init_sd=sd, generator=torch.Generator().manual_seed(0), dtype=dtype)
    assert list(laws.families) == ["random", "Xavier", "N(0, 0.3^2)"]
    for name, fam in laws.families.items():
        assert fam.shape == (F, H, D, k) and fam.dtype == dtype
        torch.testing.assert_close(fam, again.families[name], rtol=0, atol=0)  # same seed, same draws
        assert set(laws.values[name]) == {"HDI", "paper", "RV"}
    random = laws.families["random"].double().numpy()
    np.testing.assert_allclose(
        np.swapaxes(random, -1, -2) @ random, np.broadcast_to(np.eye(k), (F, H, k, k)), atol=1e-5
    )
    bound = math.sqrt(6 / (D + H * k))  # Xavier-uniform on an (H d_k) x D weight
    assert float(laws.families["Xavier"].abs().max()) <= bound
    assert float(laws.families["N(0, 0.3^2)"].std()) == pytest.approx(sd, rel=0.05)
    # known means: Haar subspaces 1 - d_k/D (invariant); i.i.d. entries of variance v: 1 - D v^2 (literal)
    for law, index, expected in (
        ("random", "HDI", 1 - k / D),
        ("N(0, 0.3^2)", "HDI", 1 - k / D),
        ("Xavier", "paper", 1 - D * (bound**2 / 3) ** 2),
        ("N(0, 0.3^2)", "paper", 1 - D * sd**4),
    ):
        m, se = np_mean_se(laws.values[law][index].double().numpy())
        assert abs(m - expected) < 4.5 * se, (law, index, m, expected, se)
    # the indices are those of each family, by a brute-force loop over pairs
    fam = laws.families["Xavier"][0].double().numpy()
    blocks = [fam[h] for h in range(H)]
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert float(laws.values["Xavier"]["HDI"][0]) == pytest.approx(np_hdi(blocks), abs=tol)
    assert float(laws.values["Xavier"]["paper"][0]) == pytest.approx(np_paper(blocks), abs=tol)
    assert float(laws.values["Xavier"]["RV"][0]) == pytest.approx(np_rv_diversity(blocks), abs=tol)


def test_reference_laws_split_rows_into_heads():
    laws = th.reference_laws(2, 2, 5, families=2, init_sd=1.0, generator=torch.Generator().manual_seed(1))
    # redraw the normal weights: the generator is consumed by the random subspaces, then the Xavier weights, then these
    g = torch.Generator().manual_seed(1)
    random_subspaces(2, 2, 5, generator=g, batch_shape=(2,), dtype=F64)
    xavier = torch.empty(2, 4, 5, dtype=F64)
    for w in xavier:
        torch.nn.init.xavier_uniform_(w, generator=g)
    normal = torch.randn(2, 4, 5, generator=g, dtype=F64)
    for f in range(2):
        for name, weight in (("Xavier", xavier), ("N(0, 1^2)", normal)):
            for h, block in enumerate(np_heads(weight[f], 2)):
                np.testing.assert_array_equal(laws.families[name][f, h].numpy(), block)


def test_against_is_the_prediction_interval_of_one_new_draw():
    laws = th.reference_laws(2, 1, 4, families=10, init_sd=0.5, generator=torch.Generator().manual_seed(2))
    values = [0.1, 0.7]
    got = laws.against(values, "HDI", laws=["random", "Xavier"])
    assert len(got) == 4  # value-major: (0.1, random), (0.1, Xavier), (0.7, random), (0.7, Xavier)
    for c, (x, law) in zip(got, [(x, law) for x in values for law in ("random", "Xavier")], strict=True):
        draws = laws.values[law]["HDI"].numpy()
        assert c.estimate == pytest.approx(x - draws.mean(), abs=1e-14)
        assert c.se == pytest.approx(draws.std(ddof=1) * math.sqrt(1 + 1 / 10), rel=1e-12)
    assert len(laws.against(values, "RV")) == 6
    with pytest.raises(ValueError, match="laws"):
        laws.against(values, "HDI", laws=["uniform"])
    with pytest.raises(ValueError, match="index"):
        laws.against(values, "CKA")


def test_layer_geometry_against_brute_force(encoded):
    encoder, corpus = encoded
    H = SMALL.num_attention_heads
    draws = {"HDI": torch.tensor([0.7, 0.8, 0.75, 0.72], dtype=F64), "RV": torch.tensor([0.5, 0.6, 0.55], dtype=F64)}
    geometry = th.layer_geometry(encoder, corpus, draws)
    assert list(geometry.index) == [0, 1] and geometry.index.name == "layer"
    mask = corpus.mask.numpy()
    for layer in range(SMALL.num_hidden_layers):
        attn = encoder.layer(layer).attention
        blocks = {n: np_heads(getattr(attn, f"{n.lower()}_proj_weight"), H) for n in ("Q", "K", "V")}
        row = geometry.loc[layer]
        for n, b in blocks.items():
            assert row[f"HDI {n}"] == pytest.approx(np_hdi(b), abs=1e-12)
            assert row[f"paper {n}"] == pytest.approx(np_paper(b), abs=1e-12)
            assert row[f"RV {n}"] == pytest.approx(np_rv_diversity(b), abs=1e-12)
        hidden = corpus.hidden[layer].numpy()
        x = np.concatenate([hidden[i, mask[i]] - hidden[i, mask[i]].mean(0) for i in range(len(TEXTS))])
        assert row["HDI K, data"] == pytest.approx(np_hdi([x @ b for b in blocks["K"]]), abs=1e-10)
        assert row["key scale"] == pytest.approx(sum(np.sum(b**2) for b in blocks["K"]) / (H * 4), rel=1e-12)
        for index, col in (("HDI", "HDI K"), ("RV", "RV K")):
            d = draws[index].numpy()
            z = (row[col] - d.mean()) / (d.std(ddof=1) * math.sqrt(1 + 1 / len(d)))
            assert row[f"z {col}"] == pytest.approx(z, rel=1e-12)
    with pytest.raises(ValueError, match="random_law"):
        th.layer_geometry(encoder, corpus, {"HDI": draws["HDI"]})


def test_geometry_extremes_are_the_quoted_minima_and_maxima(encoded):
    encoder, corpus = encoded
    draws = {"HDI": torch.tensor([0.7, 0.8], dtype=F64), "RV": torch.tensor([0.5, 0.6], dtype=F64)}
    geometry = th.layer_geometry(encoder, corpus, draws)
    got = th.geometry_extremes(geometry)
    assert got["hdi_k_min"] == min(geometry["HDI K"]) and got["hdi_v_max"] == max(geometry["HDI V"])
    assert got["key_scale_max"] == max(geometry["key scale"]) and got["hdi_k_data_min"] == min(geometry["HDI K, data"])
    assert len(got) == 12 and all(isinstance(v, float) for v in got.values())
    with pytest.raises(ValueError, match="columns"):
        th.geometry_extremes(geometry.drop(columns="RV K"))


def test_key_angles_against_scipy(encoded):
    encoder, _ = encoded
    H, k = SMALL.num_attention_heads, SMALL.head_dim
    random = random_subspaces(H, k, SMALL.hidden_size, generator=torch.Generator().manual_seed(4), batch_shape=(3,))
    angles = th.key_angles(encoder, random.double(), families=2)
    assert angles.random_by_family.shape == (2, 3 * k) and angles.random.shape == (2 * 3 * k,)
    pairs = [(a, b) for a in range(H) for b in range(a + 1, H)]
    for layer in range(SMALL.num_hidden_layers):
        blocks = np_heads(encoder.layer(layer).attention.k_proj_weight, H)
        want = np.concatenate([np.sort(scipy.linalg.subspace_angles(blocks[a], blocks[b])) for a, b in pairs])
        np.testing.assert_allclose(angles.trained[layer], want, atol=1e-9)
    fam = random.double().numpy()
    for f in range(2):
        want = np.concatenate([np.sort(scipy.linalg.subspace_angles(fam[f, a], fam[f, b])) for a, b in pairs])
        np.testing.assert_allclose(angles.random_by_family[f].numpy(), want, atol=1e-9)
        assert float(angles.family_medians_deg[f]) == pytest.approx(np.median(want) * 180 / math.pi, abs=1e-7)
    every = np.concatenate(list(angles.trained.values()))
    assert angles.median_trained_deg == pytest.approx(np.median(every) * 180 / math.pi, rel=1e-12)


def test_head_statistics_against_an_explicit_softmax(encoded):
    encoder, corpus = encoded
    H, k = SMALL.num_attention_heads, SMALL.head_dim
    mask = corpus.mask.numpy()
    for layer in range(SMALL.num_hidden_layers):
        stats = th.head_statistics(encoder, corpus, layer)
        attn = encoder.layer(layer).attention
        bq, bk, bv = (b.detach().numpy().reshape(H, k) for b in attn.in_proj_bias.chunk(3))
        wq, wk, wv = (np_heads(getattr(attn, f"{n}_proj_weight"), H) for n in ("q", "k", "v"))
        wo = attn.out_proj.weight.detach().numpy()  # (D, H*k): head h uses columns h*k:(h+1)*k
        ent, eff, contribs = [[] for _ in range(H)], [[] for _ in range(H)], [[] for _ in range(H)]
        for i in range(len(TEXTS)):
            x = corpus.hidden[layer][i].numpy()[mask[i]]
            for h in range(H):
                logits = (x @ wq[h] + bq[h]) @ (x @ wk[h] + bk[h]).T / math.sqrt(k)
                w = np.exp(logits - logits.max(1, keepdims=True))
                w /= w.sum(1, keepdims=True)
                ent[h] += list(-(w * np.log(w)).sum(1))
                eff[h] += list(1 / (w**2).sum(1))
                contribs[h].append((w @ (x @ wv[h] + bv[h])) @ wo[:, h * k : (h + 1) * k].T)
        c = [np.concatenate(cs) for cs in contribs]
        c = [ch - ch.mean(0) for ch in c]
        cross = np.array([[np.sum(c[a] * c[b]) / len(c[a]) for b in range(H)] for a in range(H)])
        off = ~np.eye(H, dtype=bool)
        corr = cross / np.sqrt(np.outer(np.diag(cross), np.diag(cross)))
        np.testing.assert_allclose(stats.entropy.numpy(), [np.mean(e) for e in ent], rtol=1e-10)
        np.testing.assert_allclose(stats.eff_keys.numpy(), [np.mean(e) for e in eff], rtol=1e-10)
        assert stats.mean_corr == pytest.approx(corr[off].mean(), abs=1e-10)
        assert stats.max_abs_corr == pytest.approx(np.abs(corr[off]).max(), abs=1e-10)
        assert stats.cov_share == pytest.approx(cross[off].sum() / cross.sum(), abs=1e-10)
        temps = [np.linalg.norm(wq[h] @ wk[h].T, 2) / math.sqrt(k) for h in range(H)]
        np.testing.assert_allclose(stats.temperature.numpy(), temps, rtol=1e-10)
    with pytest.raises(ValueError, match="layer"):
        th.head_statistics(encoder, corpus, SMALL.num_hidden_layers)


def test_work_bootstrap_against_a_resampling_loop(encoded):
    encoder, corpus = encoded
    stats = [th.head_statistics(encoder, corpus, layer) for layer in range(SMALL.num_hidden_layers)]
    # the full-corpus value is the statistic of head_statistics
    boot = th.work_bootstrap(stats, replicates=30, generator=torch.Generator().manual_seed(4))
    for layer, x in enumerate(stats):
        assert boot["covariance share"][layer].estimate == pytest.approx(x.cov_share, abs=1e-10)
        assert boot["mean corr"][layer].estimate == pytest.approx(x.mean_corr, abs=1e-10)
        assert boot["covariance share"][layer].df == len(TEXTS) - 1
    # reference: redraw the same texts (the same generator calls) and recompute from the tokens' contributions
    T = len(TEXTS)
    draws = torch.randint(T, (30, T), generator=torch.Generator().manual_seed(4)).numpy()
    layer = 0
    attn, H, k = encoder.layer(layer).attention, SMALL.num_attention_heads, SMALL.head_dim
    per_text = []
    with torch.no_grad():
        for i in range(T):
            heads = encoder.attention_heads(
                layer, corpus.hidden[layer][i : i + 1], corpus.batch.attention_mask[i : i + 1]
            )
            wo = attn.out_proj.weight.detach().double().numpy()
            h_out = heads[0][:, corpus.mask[i]].double().numpy()  # (H, t, k)
            per_text.append(np.stack([h_out[h] @ wo[:, h * k : (h + 1) * k].T for h in range(H)]))
    shares = []
    for row in draws:
        c = np.concatenate([per_text[i] for i in row], axis=1)
        c = c - c.mean(1, keepdims=True)
        cross = np.einsum("htd,gtd->hg", c, c) / c.shape[1]
        off = ~np.eye(H, dtype=bool)
        shares.append(cross[off].sum() / cross.sum())
    assert boot["covariance share"][layer].se == pytest.approx(np.std(shares, ddof=1), rel=1e-8)
    with pytest.raises(ValueError, match="replicates"):
        th.work_bootstrap(stats, replicates=1, generator=torch.Generator())
    bare = th.HeadStatistics(stats[0].temperature, stats[0].entropy, stats[0].eff_keys, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="per-text"):
        th.work_bootstrap([bare], replicates=2, generator=torch.Generator())


def test_work_table_and_its_extremes():
    stats = [
        th.HeadStatistics(torch.tensor(t, dtype=F64), torch.tensor(e, dtype=F64), torch.tensor(k, dtype=F64), m, a, s)
        for t, e, k, m, a, s in (
            ([1.0, 3.0, 2.0], [0.5, 0.7, 0.6], [1.05, 4.0, 2.0], 0.01, 0.2, 0.3),
            ([5.0, 4.0, 0.5], [0.1, 0.2, 0.3], [3.0, 6.0, 9.0], -0.02, 0.1, -0.4),
        )
    ]
    work = th.work_table(stats)
    assert list(work["temperature (median)"]) == [2.0, 4.0] and list(work["temperature (max)"]) == [3.0, 5.0]
    assert work["entropy (mean)"].tolist() == pytest.approx([0.6, 0.2])
    assert work["effective keys (mean)"].tolist() == pytest.approx([7.05 / 3, 6.0])
    assert list(work["effective keys (min head)"]) == [1.05, 3.0] and list(work["mean corr"]) == [0.01, -0.02]
    got = th.work_extremes(stats, work)
    assert got["temp_median"] == 2.0  # torch's median of six values is the lower middle one
    assert got["temp_max"] == 5.0 and got["eff_keys_min"] == 1.05
    assert got["eff_keys_mean_min"] == pytest.approx(7.05 / 3) and got["eff_keys_mean_max"] == 6.0
    assert (got["corr_min"], got["corr_max"], got["cov_share_min"], got["cov_share_max"]) == (-0.02, 0.01, -0.4, 0.3)
    with pytest.raises(TypeError, match="stats"):
        th.work_table([])


# --- training -----------------------------------------------------------------------------

TRAIN = dict(embed_dim=4, num_heads=2, signal_dim=1, frequency=1.0, noise_sd=0.5, context=8, queries=4, batch_size=4)
TRAIN |= dict(steps=3, lr=0.01, penalty=1.0, eval_every=2, test_prompts=8, replicate=0)


def test_training_point_trains_both_arms_from_one_seed(device):
    got = th.training_point(TRAIN, seed=5, device=device)
    assert set(got) == set(th.TRAINING_ARMS)
    for arm in th.TRAINING_ARMS:
        assert got[arm]["step"] == [0, 2, 3]
        for key in ("test_mse", "hdi_key", "hdi_query", "head_correlation"):
            assert len(got[arm][key]) == 3
        assert 0 <= got[arm]["signal_overlap"] <= 1
    # both arms start from the same initialisation and are scored on the same test prompts
    assert got["penalty"]["test_mse"][0] == got["no_penalty"]["test_mse"][0]
    assert got["penalty"]["hdi_key"][0] == got["no_penalty"]["hdi_key"][0]


def test_training_point_is_train_regressor_with_the_point_and_seed():
    got = th.training_point(TRAIN, seed=5)
    assert got == th.training_point(TRAIN, seed=5)  # deterministic on the CPU
    assert got != th.training_point(TRAIN, seed=6)
    from nwlib.models.training import InContextTask

    task = InContextTask(4, 1, frequency=1.0, noise_sd=0.5)
    sizes = dict(num_heads=2, steps=3, batch_size=4, context=8, queries=4, lr=0.01, eval_every=2, test_prompts=8)
    model, history = train_regressor(task, penalty=1.0, seed=5, **sizes)
    assert got["penalty"]["test_mse"] == history.test_mse and got["penalty"]["hdi_key"] == history.hdi_key
    # the signal overlap of the trained keys, by projecting e_1 onto each head's key subspace (least squares)
    w = model.key_projections.detach().double().numpy()
    e1 = np.eye(4)[:, 0]
    overlap = np.mean([np.sum((b @ np.linalg.lstsq(b, e1, rcond=None)[0]) ** 2) for b in w])
    assert got["penalty"]["signal_overlap"] == pytest.approx(overlap, abs=1e-10)
    # with no penalty the two arms are the same run
    same = th.training_point(TRAIN | {"penalty": 0.0}, seed=5)
    assert same["no_penalty"] == same["penalty"]


def test_signal_overlap_known_values():
    eye = torch.eye(6, dtype=F64)
    assert th.signal_overlap(torch.stack([eye[:, [0, 1]], eye[:, [0, 2]]]), 1) == 1.0
    assert th.signal_overlap(torch.stack([eye[:, [1, 2]], eye[:, [3, 4]]]), 1) == 0.0
    assert th.signal_overlap(torch.stack([eye[:, [0, 2]], eye[:, [1, 3]]]), 2) == 0.5
    # random heads hold d_k / D of the signal on average
    fams = random_subspaces(3, 2, 6, generator=torch.Generator().manual_seed(7), batch_shape=(2000,), dtype=F64)
    per = np.array([th.signal_overlap(f, 1) for f in fams[:400]])
    assert abs(per.mean() - 2 / 6) < 4 * per.std(ddof=1) / math.sqrt(len(per))
    with pytest.raises(ValueError, match="signal_dim"):
        th.signal_overlap(fams[0], 7)


def _fake_results(rng, replicates=5, evals=3):
    out = []
    for _ in range(replicates):
        keys = ("test_mse", "hdi_key", "hdi_query", "head_correlation")
        res = {arm: {key: list(rng.normal(size=evals)) for key in keys} for arm in th.TRAINING_ARMS}
        for arm in th.TRAINING_ARMS:
            res[arm]["step"] = list(range(evals))
        res["no_penalty"]["signal_overlap"] = float(rng.uniform())
        out.append(res)
    return out


def test_training_comparisons_use_the_returned_model_of_early_stopped_runs():
    # runs of different lengths (stopped early), each returning the model of its best evaluation
    rng = np.random.default_rng(3)
    results = _fake_results(rng, replicates=4, evals=5)
    for i, r in enumerate(results):
        for arm in th.TRAINING_ARMS:
            keep = 3 + i % 3  # 3, 4, 5, 3 evaluations
            r[arm] = {k: (v[:keep] if isinstance(v, list) else v) for k, v in r[arm].items()}
            r[arm]["best_index"] = keep - 2
    series = th.training_series(results, "no_penalty", "test_mse")
    assert series.shape == (4, 5) and bool(torch.isnan(series[0, 3:]).all()) and not bool(torch.isnan(series[2]).any())
    got = th.training_comparisons(results, zero_mse=2.0)

    def at_best(arm, key):
        return np.array([r[arm][key][r[arm]["best_index"]] for r in results])

    mse0, mse1 = at_best("no_penalty", "test_mse"), at_best("penalty", "test_mse")
    for name, values in {
        "MSE change (paired)": mse1 - mse0,
        "HDI K change": at_best("no_penalty", "hdi_key") - np.array([r["no_penalty"]["hdi_key"][0] for r in results]),
        "MSE removed, no penalty": 1 - mse0 / 2.0,
        "MSE removed, penalty": 1 - mse1 / 2.0,
        "steps, penalty": at_best("penalty", "step"),
    }.items():
        m, se = np_mean_se(values)
        assert got[name].estimate == pytest.approx(m, abs=1e-14) and got[name].se == pytest.approx(se, rel=1e-12)
        assert got[name].df == 3
    with pytest.raises(ValueError, match="zero_mse"):
        th.training_comparisons(results, zero_mse=0.0)


def test_zero_predictor_mse_against_quadrature():
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    for w in (0.5, 1.0, 2.0):
        assert th.zero_predictor_mse(w) == pytest.approx(float(np.sum(weights * np.sin(w * nodes) ** 2)), rel=1e-10)
    # the additive task has the same E f^2: Monte Carlo over the task's own draws
    from nwlib.models.training import InContextTask

    task = InContextTask(6, 6, frequency=1.0, noise_sd=0.0)
    x = torch.randn(200_000, 6, generator=torch.Generator().manual_seed(2), dtype=F64)
    f2 = task.f(x).pow(2)
    assert abs(float(f2.mean()) - th.zero_predictor_mse(1.0)) < 4 * float(f2.std()) / math.sqrt(len(f2))
    with pytest.raises(ValueError, match="frequency"):
        th.zero_predictor_mse(0.0)


def test_training_point_passes_patience_and_values():
    got = th.training_point(TRAIN | {"steps": 40, "patience": 1, "values": "token"}, seed=2)
    from nwlib.models.training import InContextTask

    task = InContextTask(4, 1, frequency=1.0, noise_sd=0.5)
    sizes = dict(num_heads=2, steps=40, batch_size=4, context=8, queries=4, lr=0.01, eval_every=2, test_prompts=8)
    _, history = train_regressor(task, penalty=1.0, seed=2, patience=1, values="token", **sizes)
    assert got["penalty"]["test_mse"] == history.test_mse and got["penalty"]["best_index"] == history.best_index


def test_large_head_summary_against_numpy():
    runs = {
        4: [
            {"hdi": [0.8, 0.7, 0.75], "signal_overlap": [0.1, 0.9, 0.99]},
            {"hdi": [0.82, 0.72, 0.7], "signal_overlap": [0.2, 0.8, 0.97]},
        ],
    }
    table = th.large_head_summary(runs, num_heads=3)
    row = table.loc[4]
    assert row["D"] == 16 and row["random HDI"] == 1 - 4 / 16 and row["predicted HDI"] == 3 / 4
    assert row["HDI start"] == pytest.approx(0.81) and row["HDI lowest"] == pytest.approx(0.70)
    m, se = np_mean_se(np.array([0.75, 0.7]))
    assert row["HDI end"] == pytest.approx(m) and row["SE HDI end"] == pytest.approx(se)
    assert row["overlap end"] == pytest.approx(0.98)
    with pytest.raises(ValueError, match="two restarts"):
        th.large_head_summary({4: runs[4][:1]}, num_heads=3)
    with pytest.raises(TypeError, match="runs"):
        th.large_head_summary({}, num_heads=3)


def test_training_comparisons_against_numpy():
    results = _fake_results(np.random.default_rng(0))
    got = th.training_comparisons(results)
    removed = {"MSE removed, no penalty", "MSE removed, penalty"}  # only with the zero predictor's MSE
    assert (set(th.TRAINING_QUANTITIES) - removed) | {"HDI K trained, penalty"} == set(got)
    assert set(th.training_comparisons(results, zero_mse=1.0)) == set(got) | removed

    def col(arm, key, i):
        return np.array([r[arm][key][i] for r in results])

    checks = {
        "MSE, no penalty": col("no_penalty", "test_mse", -1),
        "MSE change (paired)": col("penalty", "test_mse", -1) - col("no_penalty", "test_mse", -1),
        "HDI K at init": col("no_penalty", "hdi_key", 0),
        "HDI K change": col("no_penalty", "hdi_key", -1) - col("no_penalty", "hdi_key", 0),
        "HDI Q trained": col("no_penalty", "hdi_query", -1),
        "HDI K trained, penalty": col("penalty", "hdi_key", -1),
        "corr change, penalty": col("penalty", "head_correlation", -1) - col("no_penalty", "head_correlation", 0),
        "signal overlap": np.array([r["no_penalty"]["signal_overlap"] for r in results]),
    }
    for name, values in checks.items():
        m, se = np_mean_se(values)
        assert isinstance(got[name], Comparison)
        assert got[name].estimate == pytest.approx(m, abs=1e-14) and got[name].se == pytest.approx(se, rel=1e-12)
    series = th.training_series(results, "penalty", "hdi_key")
    assert series.shape == (5, 3) and series.dtype == F64
    with pytest.raises(ValueError, match="arm"):
        th.training_series(results, "both", "hdi_key")
    with pytest.raises(ValueError, match="key"):
        th.training_series(results, "penalty", "head_weights")
    with pytest.raises(ValueError, match="two replicates"):
        th.training_comparisons(results[:1])


# --- optimisation ---------------------------------------------------------------------------

OPT = dict(task="single_index", embed_dim=6, noise_sd=0.5, num_heads=2, head_dim=2, n=20, steps=3, replicates=2)
OPT |= dict(eval_size=8, lr=0.05, record_every=1, restart=0)


@pytest.mark.parametrize("regime", ["i", "ii"])
def test_optimisation_point_is_optimise_subspaces_with_scotts_bandwidth(regime):
    got = th.optimisation_point(OPT | {"regime": regime}, seed=11)
    assert got == th.optimisation_point(OPT | {"regime": regime}, seed=11)
    task = make_task("single_index", 6, noise_sd=0.5)
    shared = torch.eye(6, dtype=F64)[:, :1] if regime == "i" else None
    bases, history = optimise_subspaces(
        task,
        num_heads=2,
        head_dim=2,
        n=20,
        steps=3,
        replicates=2,
        eval_size=8,
        bandwidth=20 ** (-1 / 6),
        shared=shared,
        lr=0.05,
        seed=11,
        record_every=1,
    )
    np.testing.assert_array_equal(np.array(got["bases"]), bases.numpy())
    assert got["hdi"] == history.hdi and got["step"] == [0, 1, 2, 3]
    Q = np.array(got["bases"])
    np.testing.assert_allclose(np.swapaxes(Q, 1, 2) @ Q, np.broadcast_to(np.eye(2), (2, 2, 2)), atol=1e-12)
    if regime == "i":  # every head keeps e1
        np.testing.assert_allclose(np.sum(Q[:, 0, :] ** 2, axis=1), 1.0, atol=1e-12)
        assert got["signal_overlap"] == pytest.approx([1.0] * 4, abs=1e-12)


def test_comparison_families_have_their_hdi():
    fams = th.comparison_families(3, 3, 16)
    hdis = {name: np_hdi(list(Q.numpy())) for name, Q in fams.items()}
    assert hdis["identical heads"] == pytest.approx(0.0, abs=1e-12)
    assert hdis["share e1, others orthogonal"] == pytest.approx(2 / 3, abs=1e-12)
    assert hdis["pairwise orthogonal"] == pytest.approx(1.0, abs=1e-12)
    for Q in fams.values():
        assert Q.shape == (3, 16, 3) and Q.dtype == F64


def test_nuisance_hdi_known_values():
    fams = th.comparison_families(3, 3, 16)
    e1 = torch.eye(16, dtype=F64)[:, :1]
    assert th.nuisance_hdi(fams["share e1, others orthogonal"], e1) == pytest.approx(1.0, abs=1e-12)
    assert th.nuisance_hdi(fams["identical heads"], e1) == pytest.approx(0.0, abs=1e-12)
    # heads [e1, U_h] with random U_h in the complement of e1: the nuisance HDI is the HDI of the U_h
    U = random_subspaces(3, 2, 15, generator=torch.Generator().manual_seed(8), dtype=F64)
    heads = torch.cat([e1.expand(3, 16, 1), torch.cat([torch.zeros(3, 1, 2, dtype=F64), U], dim=1)], dim=2)
    rotated = heads @ torch.linalg.qr(torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(9), dtype=F64)).Q
    assert th.nuisance_hdi(rotated, e1) == pytest.approx(np_hdi(list(U.numpy())), abs=1e-10)
    with pytest.raises(ValueError, match="shared"):
        th.nuisance_hdi(heads, torch.eye(16, dtype=F64)[:, :3])


def test_check_families_is_paired_and_crossed():
    task = make_task("single_index", 8, noise_sd=0.5)
    fams = th.comparison_families(2, 2, 8)
    sizes = dict(n=30, replicates=4, points=6, bandwidth=0.7, seed=3)
    check = th.check_families(task, fams, candidates=["identical heads", "pairwise orthogonal"], **sizes)
    again = th.check_families(task, fams, candidates=["identical heads", "pairwise orthogonal"], **sizes)
    assert check.best in ("identical heads", "pairwise orthogonal")
    assert check.best == min(("identical heads", "pairwise orthogonal"), key=lambda k: float(check.errors[k].mean()))
    for name, e in check.errors.items():
        assert e.shape == (4, 6) and e.dtype == F64
        torch.testing.assert_close(e, again.errors[name], rtol=0, atol=0)
        a = e.numpy()
        se = math.sqrt(a.mean(1).var(ddof=1) / 4 + a.mean(0).var(ddof=1) / 6)
        assert check.mse[name].estimate == pytest.approx(a.mean(), rel=1e-12)
        assert check.mse[name].se == pytest.approx(se, rel=1e-10)
        d = a - check.errors[check.best].numpy()
        assert check.vs_best[name].estimate == pytest.approx(d.mean(), abs=1e-14)
    assert check.vs_best[check.best] == (0.0, 0.0)
    assert list(check.table.columns) == [
        "HDI",
        "nuisance HDI",
        "signal overlap",
        "MSE",
        "SE",
        "vs best optimised",
        "paired SE",
    ]
    assert check.table.loc["share e1, others orthogonal", "signal overlap"] == pytest.approx(1.0)
    # the errors are those of nwlib.simulate on points drawn from seed (float64, used in float32) and training sets
    # from seed + 1, the same for every family
    z = torch.randn(6, 8, generator=torch.Generator().manual_seed(3), dtype=F64).float()
    for name, Q in fams.items():
        pred = simulate(
            task, Q.float(), z, n=30, replicates=4, generator=torch.Generator().manual_seed(4), bandwidth=0.7
        )
        torch.testing.assert_close(check.errors[name], (pred.mean(1) - task.f(z)).pow(2).double(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="candidates"):
        th.check_families(task, fams, candidates=["optimised"], **sizes)


def test_optimisation_summary_against_numpy():
    rng = np.random.default_rng(1)
    runs = [{"hdi": list(rng.uniform(size=4)), "signal_overlap": list(rng.uniform(size=4))} for _ in range(3)]
    nuisance = list(rng.uniform(size=3))
    got = th.optimisation_summary(runs, nuisance)
    for name, values in (
        ("hdi start", [r["hdi"][0] for r in runs]),
        ("hdi end", [r["hdi"][-1] for r in runs]),
        ("overlap end", [r["signal_overlap"][-1] for r in runs]),
        ("nuisance hdi", nuisance),
        ("hdi change", [r["hdi"][-1] - r["hdi"][0] for r in runs]),
    ):
        m, se = np_mean_se(values)
        assert got[name].estimate == pytest.approx(m, abs=1e-14) and got[name].se == pytest.approx(se, rel=1e-12)
    with pytest.raises(ValueError, match="runs"):
        th.optimisation_summary(runs[:1], nuisance[:1])


# --- the covariance formula ---------------------------------------------------------------

NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(60)
WEIGHTS = WEIGHTS / WEIGHTS.sum()  # E over N(0, 1)


def _expect_x(fn):
    """E over x ~ N(0, I_2) of fn(x1, x2) (arrays of shape (60, 60)) by Gauss-Hermite quadrature."""
    x1, x2 = np.meshgrid(NODES, NODES, indexing="ij")
    return float(np.sum(np.outer(WEIGHTS, WEIGHTS) * fn(x1, x2)))


def _rho(a, c, z):
    u, w = np.array([1.0, 0.0]), np.array([c, math.sqrt(1 - c * c)])

    def kernel(d, x1, x2):
        return np.exp(-a * (d[0] * (z[0] - x1) + d[1] * (z[1] - x2)) ** 2 / 2)

    joint = _expect_x(lambda x1, x2: kernel(u, x1, x2) * kernel(w, x1, x2))
    return joint / (_expect_x(lambda x1, x2: kernel(u, x1, x2)) * _expect_x(lambda x1, x2: kernel(w, x1, x2)))


@pytest.mark.parametrize(("a", "c"), [(0.5, 0.3), (0.5, 0.8), (1.0, 0.6)])
def test_covariance_exponent_against_quadrature(a, c):
    B = th.covariance_exponent(a, c)
    np.testing.assert_allclose(B, B.T, atol=1e-15)
    base = math.log(_rho(a, c, np.zeros(2)))
    for z in (np.array([0.7, -0.2]), np.array([-0.4, 1.1]), np.array([1.0, 1.0])):
        assert math.log(_rho(a, c, z)) - base == pytest.approx(-z @ B @ z / 2, abs=1e-9)


@pytest.mark.parametrize(("a", "c"), [(0.5, 0.3), (0.5, 0.8), (1.0, 0.6)])
def test_covariance_inflation_is_the_integral_of_rho(a, c):
    # rho(z) = rho(0) exp(-z^T B z / 2) (checked above): integrate it over z ~ N(0, I) in closed form
    B = th.covariance_exponent(a, c)
    integral = _rho(a, c, np.zeros(2)) / math.sqrt(np.linalg.det(np.eye(2) + B))
    assert th.covariance_inflation(a, c) == pytest.approx(integral, rel=1e-9)


def test_covariance_inflation_limits():
    for a in (0.1, 1.0, 7.0):
        assert th.covariance_inflation(a, 0.0) == 1.0  # orthogonal directions: no inflation
        assert th.covariance_inflation(a, 1.0) == pytest.approx((1 + a) ** 1.5 / math.sqrt(1 + 3 * a), rel=1e-14)
        # identical directions: B = -2a^2 / ((1 + a)(1 + 2a)) along u, 0 across
        eig = np.linalg.eigvalsh(th.covariance_exponent(a, 1.0))
        np.testing.assert_allclose(eig, [-2 * a * a / ((1 + a) * (1 + 2 * a)), 0.0], atol=1e-14)
    with pytest.raises(ValueError, match="cos_theta"):
        th.covariance_inflation(1.0, 1.5)
    with pytest.raises(ValueError, match="a must"):
        th.covariance_exponent(-1.0, 0.5)


def test_covariance_check_simulates_the_limit():
    kw = dict(n=400, points=50, designs=3, angles=(0.0, math.pi / 3, math.pi / 2))
    check = th.covariance_check(1.0, generator=torch.Generator().manual_seed(5), **kw)
    again = th.covariance_check(1.0, generator=torch.Generator().manual_seed(5), **kw)
    assert check.table.equals(again.table)
    table = check.table
    assert list(table.columns) == ["theta (deg)", "simulated", "SE", "R(theta)", "rel. error", "finite variance"]
    assert table["theta (deg)"].tolist() == pytest.approx([0.0, 60.0, 90.0])
    assert table["R(theta)"].tolist() == pytest.approx(
        [th.covariance_inflation(1.0, math.cos(t)) for t in kw["angles"]]
    )
    # a = 1: the smallest eigenvalue of B is -1/3 at theta = 0, above -1/2: finite everywhere
    assert list(table["finite variance"]) == ["yes"] * 3 and len(check.finite) == 3
    assert abs(table["rel. error"]).max() < 0.15  # n = 400: the large-n limit to a few per cent
    np.testing.assert_allclose(table["rel. error"], table["simulated"] / table["R(theta)"] - 1, atol=1e-12)
    # a small bandwidth (a = 16) makes the variance infinite at theta = 0
    small = th.covariance_check(0.25, n=50, points=5, designs=2, generator=torch.Generator().manual_seed(5))
    assert small.table["finite variance"].iloc[0] == "no" and len(small.finite) < len(small.table)
    with pytest.raises(ValueError, match="designs"):
        th.covariance_check(1.0, n=10, points=5, designs=1, generator=torch.Generator())


# --- bad inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: th.reference_laws(2, 2, 4, families=1, init_sd=0.1, generator=torch.Generator()),
            ValueError,
            "families",
        ),
        (
            lambda: th.reference_laws(2, 5, 4, families=3, init_sd=0.1, generator=torch.Generator()),
            ValueError,
            "head_dim",
        ),
        (
            lambda: th.reference_laws(2, 2, 4, families=3, init_sd=0.0, generator=torch.Generator()),
            ValueError,
            "init_sd",
        ),
        (lambda: th.reference_laws(2, 2, 4, families=3, init_sd=0.1, generator=None), TypeError, "generator"),
        (lambda: th.training_point({"embed_dim": 4}, seed=0), ValueError, "lacks"),
        (lambda: th.training_point(TRAIN | {"penalty": -1.0}, seed=0), ValueError, "penalty"),
        (lambda: th.training_point(TRAIN | {"num_heads": 3}, seed=0), ValueError, "num_heads"),
        (lambda: th.training_point([1, 2], seed=0), TypeError, "point"),
        (lambda: th.optimisation_point(OPT | {"regime": "iii"}, seed=0), ValueError, "regime"),
        (lambda: th.optimisation_point(OPT | {"regime": "i"}, seed=0, device=0), TypeError, "device"),
        (lambda: th.encode_corpus("model", WordTokenizer(), TEXTS), TypeError, "encoder"),
        (
            lambda: th.covariance_check(0.0, n=10, points=5, designs=2, generator=torch.Generator()),
            ValueError,
            "bandwidth",
        ),
    ],
)
def test_bad_inputs_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- the GQA decoder, the quantisation control, both models side by side ----------------------

SMALL_DEC = LlamaConfig(
    hidden_size=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=24,
    vocab_size=40,
    max_position_embeddings=16,
    rope_theta=100.0,
    rms_norm_eps=1e-5,
)


@pytest.fixture(scope="module")
def decoded():
    with torch.random.fork_rng():
        decoder = NWLlamaDecoder(SMALL_DEC, dtype=F64)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in decoder.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=F64) + (1.0 if p.dim() == 1 else 0.0))
    decoder.eval()
    return decoder, th.decode_corpus(decoder, WordTokenizer(), TEXTS)


def test_decode_corpus_runs_the_decoder_text_by_text(decoded):
    # causal attention with right padding: each text's states equal those of the text alone
    decoder, corpus = decoded
    assert len(corpus.hidden) == SMALL_DEC.num_hidden_layers + 1 and corpus.n_tokens == 17
    for i in range(len(TEXTS)):
        n = int(corpus.mask[i].sum())
        with torch.no_grad():
            alone = decoder(corpus.batch.input_ids[i : i + 1, :n])
        torch.testing.assert_close(corpus.hidden[-1][i, :n], alone[-1][0], rtol=1e-12, atol=1e-12)
    # keys an average query sees, causally: sum T(T + 1)/2 over sum T
    assert th.causal_mean_keys(corpus) == pytest.approx((15 + 6 + 28 + 3) / 17)
    with pytest.raises(TypeError, match="decoder"):
        th.decode_corpus(small_encoder(), WordTokenizer(), TEXTS)


def test_decoder_geometry_against_brute_force(decoded):
    decoder, corpus = decoded
    laws_q = th.reference_laws(4, 4, 16, families=5, init_sd=0.02, generator=torch.Generator().manual_seed(1))
    laws_kv = th.reference_laws(2, 4, 16, families=5, init_sd=0.02, generator=torch.Generator().manual_seed(2))
    geo = th.decoder_geometry(decoder, corpus, laws_q.values["random"], laws_kv.values["random"])
    for layer in range(SMALL_DEC.num_hidden_layers):
        m = decoder.layer(layer)
        blocks = {n: np_heads(getattr(m, f"{n}_proj").weight, h) for n, h in (("q", 4), ("k", 2), ("v", 2))}
        for name, heads in blocks.items():  # invariant HDI from scipy's principal angles
            pairs = [(a, b) for a in range(len(heads)) for b in range(a + 1, len(heads))]
            cos2 = [np.cos(scipy.linalg.subspace_angles(heads[a], heads[b])) ** 2 for a, b in pairs]
            want = 1 - np.mean([c.sum() / 4 for c in cos2])
            assert geo.loc[layer, f"HDI {name.upper()}"] == pytest.approx(want, abs=1e-10)
        # per query head: (H - G)/(H - 1) times the kv heads' index, here 2/3
        assert geo.loc[layer, "HDI K, per query head"] == pytest.approx(geo.loc[layer, "HDI K"] * 2 / 3, abs=1e-12)
        # data-aware: RMSNorm of the tokens entering the layer, centred per text, times W_K
        x = corpus.hidden[layer].detach().numpy()
        w_norm = m.attn_norm.detach().numpy()
        rows = []
        for i in range(len(TEXTS)):
            t = x[i, corpus.mask[i].numpy()]
            t = t / np.sqrt((t**2).mean(1, keepdims=True) + SMALL_DEC.rms_norm_eps) * w_norm
            rows.append(t - t.mean(0))
        feats = [np.concatenate(rows) @ b for b in blocks["k"]]
        c2 = np.cos(scipy.linalg.subspace_angles(feats[0], feats[1])) ** 2
        assert geo.loc[layer, "HDI K, data"] == pytest.approx(1 - c2.sum() / 4, abs=1e-8)
    assert th.gqa_key_hdi_bound(9, 3) == 0.75 and th.gqa_key_hdi_bound(4, 1) == 0.0
    with pytest.raises(ValueError, match="num_kv_heads"):
        th.gqa_key_hdi_bound(9, 2)
    with pytest.raises(ValueError, match="random_kv"):
        th.decoder_geometry(decoder, corpus, laws_q.values["random"], {})


def test_decoder_head_statistics_against_an_explicit_causal_softmax(decoded):
    from nwlib.models.llama import apply_rope

    decoder, corpus = decoded
    layer, d = 1, SMALL_DEC.head_dim
    st = th.decoder_head_statistics(decoder, corpus, layer)
    m = decoder.layer(layer)
    ent, eff, contribs = [], [], []
    for i in range(len(TEXTS)):
        n = int(corpus.mask[i].sum())
        x = corpus.hidden[layer][i, :n].detach()
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + SMALL_DEC.rms_norm_eps) * m.attn_norm.detach()
        out = []
        for h in range(4):
            g = h // 2
            q = apply_rope(x @ m.q_proj.weight[h * d : (h + 1) * d].detach().T, torch.arange(n), 100.0)
            k = apply_rope(x @ m.k_proj.weight[g * d : (g + 1) * d].detach().T, torch.arange(n), 100.0)
            v = x @ m.v_proj.weight[g * d : (g + 1) * d].detach().T
            logits = (q @ k.T / math.sqrt(d)).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
            w = torch.softmax(logits, -1)
            ent.append(-(w * torch.log(w.clamp_min(1e-300))).sum(-1))
            eff.append(1 / w.pow(2).sum(-1))
            out.append(w @ v @ m.o_proj.weight[:, h * d : (h + 1) * d].detach().T)
        contribs.append(torch.stack(out))
    assert float(st.entropy.mean()) == pytest.approx(float(torch.cat(ent).mean()), rel=1e-10)  # every query once
    c = torch.cat(contribs, dim=1)
    c = c - c.mean(1, keepdim=True)
    cross = torch.einsum("htd,gtd->hg", c, c) / c.shape[1]
    off = ~torch.eye(4, dtype=torch.bool)
    assert st.cov_share == pytest.approx(float(cross[off].sum() / cross.sum()), abs=1e-10)
    # the causal first query sees one key: entropy 0, one effective key, in every text and head
    assert st.text_eff_keys is not None and st.text_entropy is not None
    assert float(st.text_eff_keys.sum()) == pytest.approx(float(sum(e.sum() for e in eff)), rel=1e-10)
    assert float(st.eff_keys.max()) <= max(int(t) for t in corpus.mask.sum(1))
    wq = decoder.projections(layer)
    M = (wq.w_q[3] @ wq.w_k[1].T).numpy()
    assert float(st.temperature[3]) == pytest.approx(np.linalg.svd(M, compute_uv=False)[0] / 2, rel=1e-10)


def test_work_bootstrap_of_entropies_and_keys(decoded):
    # reference: redraw the texts with the same generator calls, recompute the ratio of sums
    decoder, corpus = decoded
    stats = [th.decoder_head_statistics(decoder, corpus, layer) for layer in range(2)]
    boot = th.work_bootstrap(stats, replicates=25, generator=torch.Generator().manual_seed(6))
    T = len(TEXTS)
    draws = torch.randint(T, (25, T), generator=torch.Generator().manual_seed(6)).numpy()
    for layer, x in enumerate(stats):
        assert boot["entropy"][layer].estimate == pytest.approx(float(x.entropy.mean()), abs=1e-12)
        assert boot["effective keys"][layer].estimate == pytest.approx(float(x.eff_keys.mean()), abs=1e-12)
        tot, tok = x.text_eff_keys.sum(1).numpy(), x.text_tokens.numpy()
        reps = [tot[row].sum() / (tok[row].sum() * 4) for row in draws]
        assert boot["effective keys"][layer].se == pytest.approx(np.std(reps, ddof=1), rel=1e-10)


def test_quantised_state_dict_rounds_only_layer_matrices():
    pytest.importorskip("gguf")
    g = torch.Generator().manual_seed(7)
    sd = {
        "encoder.layer.0.attention.self.key.weight": torch.randn(8, 64, generator=g),
        "encoder.layer.0.attention.self.key.bias": torch.randn(8, generator=g),
        "embeddings.word_embeddings.weight": torch.randn(5, 64, generator=g),
    }
    q = th.quantised_state_dict(sd)
    w, wq = sd["encoder.layer.0.attention.self.key.weight"], q["encoder.layer.0.attention.self.key.weight"]
    assert not torch.equal(w, wq) and torch.equal(
        q["embeddings.word_embeddings.weight"], sd["embeddings.word_embeddings.weight"]
    )
    assert torch.equal(q["encoder.layer.0.attention.self.key.bias"], sd["encoder.layer.0.attention.self.key.bias"])
    # 16 levels per block of 32: at most 16 distinct values in each block
    assert all(len(set(block.tolist())) <= 16 for block in wq.reshape(-1, 32))
    step = (w.reshape(-1, 32).amax(1) - w.reshape(-1, 32).amin(1)) / 15
    assert bool(((w - wq).abs().reshape(-1, 32) <= step[:, None] / 2 + 1e-3).all())


def test_quantisation_effect_and_two_model_table():
    import pandas as pd

    before = pd.DataFrame({"HDI K": [0.8, 0.7], "RV K": [0.5, -0.9]})
    after = pd.DataFrame({"HDI K": [0.81, 0.68], "RV K": [0.5, -0.8]})
    eff = th.quantisation_effect(before, after, ["HDI K", "RV K"])
    assert eff.loc["HDI K", "max |change|"] == pytest.approx(0.02)
    assert eff.loc["RV K", "largest value"] == pytest.approx(0.9)
    assert eff.loc["RV K", "relative"] == pytest.approx(0.1 / 0.9)
    with pytest.raises(ValueError, match="columns"):
        th.quantisation_effect(before, after, ["HDI Q"])
    geo = pd.DataFrame(
        {"HDI K": [0.8, 0.7], "HDI Q": [0.6, 0.9], "HDI V": [0.5, 0.95], "RV K": [0.1, 0.2], "paper K": [0.3, -1.0]}
    )
    work = pd.DataFrame(
        {"entropy (mean)": [1.0, 2.0], "effective keys (mean)": [3.0, 5.0], "temperature (median)": [1.0, 9.0]}
    )
    t = th.two_model_table({"a": (geo, work, 0.9)})
    row = t.loc["a"]
    assert (row["layers"], row["HDI K min"], row["HDI Q max"], row["HDI V max"], row["paper K min"]) == (
        2,
        0.7,
        0.9,
        0.95,
        -1.0,
    )
    assert (row["entropy (mean)"], row["effective keys (mean)"], row["temperature (median)"]) == (1.5, 4.0, 5.0)


# --- tables for reading -----------------------------------------------------------------------------

NBSP, MINUS = "\u00a0", "\u2212"


def test_reference_laws_table_shows_mean_and_se_of_the_families():
    laws = th.reference_laws(2, 1, 4, families=5, init_sd=0.5, generator=torch.Generator().manual_seed(3))
    shown = laws.table()
    assert list(shown.columns) == ["random", "Xavier", "N(0, 0.5^2)"] and list(shown.index) == ["HDI", "paper", "RV"]
    x = laws.values["Xavier"]["HDI"].double().numpy()
    m, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))  # the mean over families and its SE, by hand
    estimate, error = shown.loc["HDI", "Xavier"].split(f"{NBSP}±{NBSP}")
    places = len(error.split(".")[1])  # the SE keeps two significant digits, the estimate its decimals
    assert float(error) == pytest.approx(float(f"{se:.2g}"))
    assert float(estimate.replace(MINUS, "-")) == pytest.approx(round(m, places))


def test_readable_table_keeps_the_small_entries_of_a_column_that_spans_magnitudes():
    import pandas as pd

    frame = pd.DataFrame(
        {"paper K": [-311.8895, 0.0859, -0.0316], "HDI K": [0.71, 0.84, 0.86], "temp": [132.66, 9.9, 4.317]}
    )
    shown = th.readable_table(frame)
    # a narrow column: three significant digits of its largest entry; a wide one: at most three decimals, enough for
    # three significant digits of its smallest entry (4.317 -> 2 decimals)
    assert shown["HDI K"].tolist() == ["0.710", "0.840", "0.860"]
    assert shown["paper K"].tolist() == [f"{MINUS}311.889", "0.086", f"{MINUS}0.032"]
    assert shown["temp"].tolist() == ["132.66", "9.90", "4.32"]
    with pytest.raises(TypeError, match="frame"):
        th.readable_table([1.0])


def test_bootstrap_table_is_the_extremes_over_layers_per_statistic():
    def c(x, se):
        return Comparison(estimate=x, se=se, df=9)

    boots = {
        "A": {"mean corr": [c(-0.0171, 0.001), c(0.0093, 0.0004)], "effective keys": [c(3.101, 0.1), c(8.489, 0.142)]},
        "B": {"mean corr": [c(0.058, 0.004), c(-0.044, 0.002)], "effective keys": [c(1.286, 0.083), c(5.1, 0.05)]},
    }
    shown = th.bootstrap_table(boots)
    assert list(shown.index) == [
        ("A", "mean corr"),
        ("A", "effective keys"),
        ("B", "mean corr"),
        ("B", "effective keys"),
    ]
    assert list(shown.columns) == ["smallest", "largest", "largest SE"]  # no "largest ± largest SE" pairing
    # each statistic its own decimals, three significant digits of the column's largest entry over the two models
    assert shown.loc[("A", "mean corr")].tolist() == [f"{MINUS}0.0171", "0.0093", "0.00100"]
    assert shown.loc[("B", "effective keys")].tolist() == ["1.29", "5.10", "0.083"]


def test_training_table_rounds_each_estimate_by_its_se():
    def c(x, se):
        return Comparison(estimate=x, se=se, df=9)

    icl = {"task a": {"MSE, no penalty": c(0.034312, 0.00121), "steps": c(427.083, 51.992)}}
    icl["task b"] = {"MSE, no penalty": c(0.0771, 0.0009), "steps": c(695.8, 99.8)}
    shown = th.training_table(icl)
    assert list(shown.index) == ["MSE, no penalty", "steps"] and list(shown.columns) == ["task a", "task b"]
    assert shown.loc["MSE, no penalty", "task a"] == f"0.0343{NBSP}±{NBSP}0.0012"
    assert shown.loc["steps", "task b"] == f"696{NBSP}±{NBSP}100"
