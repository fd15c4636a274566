r"""Trained heads (chapter 5, claims C7 and C8): the experiments of ``notebooks/ch05_trained_heads.ipynb``.

The chapter tests whether the MSE is minimised by orthogonal key subspaces (C7, Theorem 5.1
of the paper) and whether training drives heads there (C8), in four parts; each function here
is one of them, a pure function of its parameters, a seed or a ``torch.Generator``, and a
device, returning tensors, floats, :class:`nwlib.evidence.Comparison` values or (for tables)
pandas DataFrames.

*The real model.* :func:`read_corpus` and :func:`encode_corpus` run a pretrained encoder
(:class:`nwlib.models.pretrained.NWBertEncoder`, all-MiniLM-L6-v2 in the book) on a corpus;
:func:`reference_laws` draws the reference families (Haar-random subspaces, Xavier-uniform and
:math:`N(0, \sigma^2)` key projections) and their indices; :func:`layer_geometry` gives the
per-layer invariant HDI, literal index and RV diversity of the query, key and value projections,
the data-aware key HDI and the distance of each layer from the random law; :func:`key_angles`
the principal angles between heads' key subspaces; :func:`head_statistics` and
:func:`work_table` the temperatures, attention entropies, effective numbers of keys and
correlations of the heads' contributions on the corpus.

*Training.* :func:`training_point` is one point of the training sweep (run through
:func:`nwlib.sweep.run_sweep`): one task and one replicate, trained without and with the
orthogonality penalty from the same seed (common random numbers: the two arms share the
initialisation, the training prompts and the test prompts, so the penalty's effect is a paired
difference). :func:`training_series` and :func:`training_comparisons` summarise the replicates.

*Optimisation.* :func:`optimisation_point` is one restart of the direct minimisation of the
Gaussian NW surrogate's integrated MSE over head subspaces (another sweep);
:func:`comparison_families` gives chapter 3's families, :func:`check_families` scores every
family on independent data, :func:`nuisance_hdi` and :func:`signal_overlap` describe a family,
:func:`optimisation_summary` summarises the restarts.

*The covariance formula.* :func:`covariance_inflation` is the large-n limit :math:`R(\theta)`
of the noise covariance of two Gaussian-kernel heads at principal angle :math:`\theta` (derived
with sympy in the notebook), :func:`covariance_exponent` the matrix :math:`B` of
:math:`\rho(z) \propto e^{-z^\top B z/2}`, and :func:`covariance_check` the simulation that
checks :math:`R`.

pandas is imported where a table is built (it belongs to the ``book`` extra).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor

from .._validation import (
    require_dtype,
    require_generator,
    require_positive_finite,
    require_positive_int,
    require_real,
    require_tensor,
)
from ..bandwidth import scott_bandwidth
from ..device import resolve_device
from ..evidence import Comparison, against, crossed, mean, paired
from ..kernels import nadaraya_watson_weights
from ..models.llama import NWLlamaDecoder
from ..models.pretrained import EncodedBatch, NWBertEncoder, encode
from ..models.training import InContextTask, optimise_subspaces, train_regressor
from ..montecarlo import simulate
from ..multihead import split_projection
from ..similarity import rv_diversity
from ..subspaces import equiangular_heads, hdi, orthonormal_basis, principal_angles, random_subspaces
from ..sweep import require_point
from ..tasks import RegressionTask, make_task

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COVARIANCE_ANGLES",
    "OPTIMISATION_KEYS",
    "REGIMES",
    "TRAINING_ARMS",
    "TRAINING_KEYS",
    "TRAINING_QUANTITIES",
    "CorpusStates",
    "CovarianceCheck",
    "FamilyCheck",
    "HeadStatistics",
    "KeyAngles",
    "ReferenceLaws",
    "causal_mean_keys",
    "check_families",
    "comparison_families",
    "covariance_check",
    "covariance_exponent",
    "covariance_inflation",
    "decode_corpus",
    "decoder_geometry",
    "decoder_head_statistics",
    "encode_corpus",
    "geometry_extremes",
    "gqa_key_hdi_bound",
    "head_statistics",
    "key_angles",
    "layer_geometry",
    "nuisance_hdi",
    "optimisation_point",
    "optimisation_summary",
    "bootstrap_table",
    "quantisation_effect",
    "quantised_state_dict",
    "read_corpus",
    "readable_table",
    "reference_laws",
    "signal_overlap",
    "training_comparisons",
    "training_point",
    "training_series",
    "training_table",
    "two_model_table",
    "work_extremes",
    "work_table",
]

_DEG = 180 / math.pi


# --- the real model on a corpus -----------------------------------------------------------


def read_corpus(path: str | Path) -> list[str]:
    """The texts of a corpus file: one per line, blank lines and lines starting with ``#`` left out.

    Parameters
    ----------
    path : str or Path
        A UTF-8 text file.

    Returns
    -------
    list of str
        The stripped lines.

    Raises
    ------
    TypeError
        If ``path`` is not a str or Path.
    FileNotFoundError
        If there is no such file.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or pathlib.Path, got {type(path).__name__}")
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@dataclass(frozen=True)
class CorpusStates:
    """A corpus run through an encoder.

    Attributes
    ----------
    texts : list of str
    batch : EncodedBatch
        Token ids and attention mask (N, T), on the CPU.
    mask : Tensor, shape (N, T), bool
        The real tokens (the attention mask), on the CPU.
    hidden : list of Tensor, each (N, T, D)
        The embedding layer's output and every layer's, on the encoder's device.
    """

    texts: list[str]
    batch: EncodedBatch
    mask: Tensor
    hidden: list[Tensor]

    @property
    def n_tokens(self) -> int:
        """Number of real tokens in the corpus."""
        return int(self.mask.sum())

    @property
    def longest(self) -> int:
        """Number of tokens of the longest text."""
        return int(self.mask.sum(1).max())

    @property
    def mean_keys(self) -> float:
        r"""Keys seen by the average query: :math:`\sum_i T_i^2 / \sum_i T_i` over texts of T_i tokens."""
        return float(self.mask.sum(1).double().pow(2).sum() / self.mask.sum())


def _model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's weights live (the encoder's or the decoder's): its inputs go there."""
    return next(model.parameters()).device


def encode_corpus(encoder: NWBertEncoder, tokenizer: Any, texts: Sequence[str]) -> CorpusStates:
    """Tokenise ``texts`` (padded to the longest) and run the encoder on them, without gradients.

    Parameters
    ----------
    encoder : NWBertEncoder
        On the device to compute on.
    tokenizer : tokenizers.Tokenizer
        From :func:`nwlib.models.pretrained.load_tokenizer`.
    texts : sequence of str
        At least one text.

    Returns
    -------
    CorpusStates
        With ``len(hidden) == num_hidden_layers + 1``.

    Raises
    ------
    TypeError
        If ``encoder`` is not an :class:`NWBertEncoder` or ``texts`` not a sequence of strings.
    """
    if not isinstance(encoder, NWBertEncoder):
        raise TypeError(f"encoder must be an NWBertEncoder, got {type(encoder).__name__}")
    texts = list(texts) if isinstance(texts, Sequence) and not isinstance(texts, str) else texts
    batch = encode(tokenizer, texts)  # checks texts
    dev = _model_device(encoder)
    with torch.no_grad():
        hidden = encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.token_type_ids.to(dev))
    return CorpusStates(list(texts), batch, batch.attention_mask.bool(), hidden)


@dataclass(frozen=True)
class ReferenceLaws:
    """Reference families of heads and their indices, by law.

    Attributes
    ----------
    families : dict of str to Tensor, each (F, H, D, d_k)
        ``"random"`` (Haar-random subspaces), ``"Xavier"`` (Xavier-uniform key blocks of a
        (H d_k) x D projection) and ``"N(0, s^2)"`` (i.i.d. normal entries of standard deviation s),
        split into heads by :func:`nwlib.split_projection`.
    values : dict of str to dict of str to Tensor, each (F,)
        Per law, per index (``"HDI"``: invariant, ``"paper"``: literal, ``"RV"``: RV diversity),
        the value of each family.
    """

    families: dict[str, Tensor]
    values: dict[str, dict[str, Tensor]]

    def summary(self) -> dict[str, dict[str, Comparison]]:
        """Per law and index, the mean over families with its standard error (:func:`nwlib.evidence.mean`)."""
        return {law: {index: mean(x) for index, x in by_index.items()} for law, by_index in self.values.items()}

    def table(self) -> pd.DataFrame:
        """The summary for reading (:func:`nwlib.book.table`): "mean ± SE" cells, columns the laws, rows the indices."""
        import pandas as pd

        from ..book import table

        summary = self.summary()
        frame = pd.DataFrame(
            {
                column: {index: getattr(c, part) for index, c in by_index.items()}
                for law, by_index in summary.items()
                for column, part in ((law, "estimate"), (f"{law} SE", "se"))
            }
        )
        return table(frame, se={law: f"{law} SE" for law in summary}, headers={law: law for law in summary})

    def against(self, values: Sequence[float], index: str, laws: Sequence[str] | None = None) -> list[Comparison]:
        """Each value against one new draw of each law (:func:`nwlib.evidence.against`).

        Parameters
        ----------
        values : sequence of float
            Observed values of the index (one per layer, say).
        index : {"HDI", "paper", "RV"}
        laws : sequence of str, optional
            Default: every law, in the order of :attr:`families`.

        Returns
        -------
        list of Comparison
            Value-major: all laws for the first value, then for the second, and so on.
        """
        laws = list(self.families) if laws is None else list(laws)
        for law in laws:
            if law not in self.values:
                raise ValueError(f"laws must name laws of {list(self.values)}, got {law!r}")
        if any(index not in self.values[law] for law in laws):
            raise ValueError(f"index must be one of {list(self.values[laws[0]])}, got {index!r}")
        return [against(float(x), self.values[law][index]) for x in values for law in laws]


def reference_laws(
    num_heads: int,
    head_dim: int,
    embed_dim: int,
    *,
    families: int,
    init_sd: float,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float64,
) -> ReferenceLaws:
    r"""Draw ``families`` families of H key blocks under each reference law, and index them.

    The generator is consumed in this order: Haar-random subspaces
    (:func:`nwlib.random_subspaces`), then ``families`` Xavier-uniform (H d_k) x D weights
    (``torch.nn.init.xavier_uniform_``, one after the other), then the normal weights.

    Parameters
    ----------
    num_heads, head_dim, embed_dim : int
        H, d_k and D (d_k <= D).
    families : int
        F >= 2 families per law.
    init_sd : float
        The normal law's standard deviation (BERT's ``initializer_range``, 0.02), > 0.
    generator : torch.Generator
        Where the families' device comes from.
    dtype : torch.dtype, default torch.float64

    Returns
    -------
    ReferenceLaws
        Laws ``"random"``, ``"Xavier"`` and ``f"N(0, {init_sd:g}^2)"``.

    Raises
    ------
    TypeError, ValueError
        On a bad size, standard deviation, generator or dtype (named in the message).
    """
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    k = require_positive_int(head_dim, "head_dim")
    D = require_positive_int(embed_dim, "embed_dim")
    F = require_positive_int(families, "families", minimum=2)
    sd = require_positive_finite(init_sd, "init_sd")
    require_generator(generator)
    dtype = require_dtype(dtype)
    if k > D:
        raise ValueError(f"head_dim must be <= embed_dim, got head_dim={k}, embed_dim={D}")
    dev = generator.device
    fams = {"random": random_subspaces(H, k, D, generator=generator, batch_shape=(F,), dtype=dtype)}
    xavier = torch.empty(F, H * k, D, dtype=dtype, device=dev)
    for w in xavier:
        torch.nn.init.xavier_uniform_(w, generator=generator)
    fams["Xavier"] = torch.stack([split_projection(w, H) for w in xavier])
    normal = sd * torch.randn(F, H * k, D, generator=generator, dtype=dtype, device=dev)
    fams[f"N(0, {sd:g}^2)"] = torch.stack([split_projection(w, H) for w in normal])
    values = {
        name: {"HDI": hdi(fam), "paper": hdi(fam, normalization="paper"), "RV": rv_diversity(fam)}
        for name, fam in fams.items()
    }
    return ReferenceLaws(fams, values)


def layer_geometry(encoder: NWBertEncoder, states: CorpusStates, random_law: Mapping[str, Tensor]) -> pd.DataFrame:
    r"""Per layer: the diversity of the query, key and value subspaces, on the weights and on the data.

    Columns ``"HDI Q"``, ``"HDI K"``, ``"HDI V"`` (invariant HDI), ``"paper Q"``, ... (the
    literal index), ``"RV Q"``, ... (RV diversity), ``"HDI K, data"`` (the invariant HDI of the
    heads' key features :math:`X_l W_K^h` as vectors over the corpus tokens, the tokens entering
    layer l centred within each text: softmax ignores a key component common to a text),
    ``"key scale"`` (mean squared singular value of the key blocks, 1 at Xavier initialisation of
    a square projection), and ``"z HDI K"``, ``"z RV K"``: the layer's distance from the random
    law in standard deviations of one new draw (:func:`nwlib.evidence.against`). Computed in
    float64 on the CPU from the encoder's weights.

    Parameters
    ----------
    encoder : NWBertEncoder
    states : CorpusStates
        From :func:`encode_corpus` with this encoder.
    random_law : mapping of str to Tensor
        ``{"HDI": draws, "RV": draws}`` of the random law (``ReferenceLaws.values["random"]``).

    Returns
    -------
    pandas.DataFrame
        One row per layer (index ``"layer"``).
    """
    import pandas as pd

    if not isinstance(encoder, NWBertEncoder):
        raise TypeError(f"encoder must be an NWBertEncoder, got {type(encoder).__name__}")
    if not isinstance(states, CorpusStates):
        raise TypeError(f"states must be CorpusStates, got {type(states).__name__}")
    missing = {"HDI", "RV"} - set(random_law)
    if missing:
        raise ValueError(f"random_law must hold draws of {sorted(missing)}")
    cfg = encoder.config
    H, d_k = cfg.num_attention_heads, cfg.head_dim
    dev = _model_device(encoder)
    hidden, mask = states.hidden, states.mask
    rows = []
    for layer in range(cfg.num_hidden_layers):
        p = encoder.projections(layer)
        x_in = (
            torch.cat(
                [
                    hidden[layer][i, mask[i].to(dev)] - hidden[layer][i, mask[i].to(dev)].mean(0)
                    for i in range(len(states.texts))
                ]
            )
            .double()
            .cpu()
        )
        row: dict[str, Any] = {"layer": layer}
        for name, w in (("Q", p.w_q), ("K", p.w_k), ("V", p.w_v)):
            w = w.double().cpu()
            row[f"HDI {name}"] = float(hdi(w))
            row[f"paper {name}"] = float(hdi(w, normalization="paper"))
            row[f"RV {name}"] = float(rv_diversity(w))
        row["HDI K, data"] = float(hdi(x_in @ p.w_k.double().cpu()))
        row["key scale"] = float(p.w_k.double().pow(2).sum() / (H * d_k))
        row["z HDI K"] = against(row["HDI K"], random_law["HDI"]).z
        row["z RV K"] = against(row["RV K"], random_law["RV"]).z
        rows.append(row)
    return pd.DataFrame(rows).set_index("layer")


@dataclass(frozen=True)
class KeyAngles:
    """Principal angles between the key subspaces of every pair of heads (radians).

    Attributes
    ----------
    trained : dict of int to numpy.ndarray
        Per layer, the angles of all pairs of heads, shape (pairs * d_k,).
    random_by_family : Tensor, shape (F, pairs * d_k)
        The same for F random families.
    """

    trained: dict[int, np.ndarray]
    random_by_family: Tensor

    @property
    def random(self) -> np.ndarray:
        """All random angles, flattened."""
        return self.random_by_family.flatten().numpy()

    @property
    def median_trained_deg(self) -> float:
        """The median over every layer's angles, in degrees."""
        return float(np.median(np.concatenate(list(self.trained.values())))) * _DEG

    @property
    def family_medians_deg(self) -> Tensor:
        """One median angle per random family, in degrees, shape (F,)."""
        return self.random_by_family.quantile(0.5, dim=1) * _DEG


def key_angles(encoder: NWBertEncoder, random_heads: Tensor, *, families: int) -> KeyAngles:
    """Principal angles between the key subspaces of every pair of heads, trained and random.

    Parameters
    ----------
    encoder : NWBertEncoder
    random_heads : Tensor, shape (F, H, D, d_k)
        Random families (``ReferenceLaws.families["random"]``) of the encoder's sizes.
    families : int
        How many of them to use (the first ``families``; each costs a few ms per pair of heads).

    Returns
    -------
    KeyAngles
        float64, on the CPU.
    """
    if not isinstance(encoder, NWBertEncoder):
        raise TypeError(f"encoder must be an NWBertEncoder, got {type(encoder).__name__}")
    random_heads = require_tensor(random_heads, "random_heads", min_dim=4)
    F = require_positive_int(families, "families")
    H = encoder.config.num_attention_heads
    if random_heads.shape[1] != H:
        raise ValueError(f"random_heads must have H = {H} heads, got shape {tuple(random_heads.shape)}")
    pairs = torch.tensor([(a, b) for a in range(H) for b in range(a + 1, H)])
    trained = {}
    for layer in range(encoder.config.num_hidden_layers):
        w = encoder.projections(layer).w_k.double().cpu()
        trained[layer] = principal_angles(w[pairs[:, 0]], w[pairs[:, 1]]).flatten().numpy()
    fam = random_heads[:F]
    by_family = principal_angles(fam[:, pairs[:, 0]], fam[:, pairs[:, 1]]).flatten(1)
    return KeyAngles(trained, by_family)


@dataclass(frozen=True)
class HeadStatistics:
    r"""One layer's heads at work on a corpus.

    Attributes
    ----------
    temperature : Tensor, shape (H,)
        :meth:`HeadProjections.effective_temperature`.
    entropy : Tensor, shape (H,)
        Mean over the corpus's queries of the attention weights' entropy (nats).
    eff_keys : Tensor, shape (H,)
        Mean over queries of the effective number of keys :math:`1/\sum_i w_i^2`.
    mean_corr, max_abs_corr : float
        Mean and largest absolute pairwise correlation of the heads' contributions
        :math:`\hat f_h W_O^h` over tokens.
    cov_share : float
        The covariance term's share of the variance of the attention output over tokens.
    text_sums : Tensor, shape (texts, H, D)
        Per text, the sum over its tokens of each head's contribution minus its corpus mean.
    text_products : Tensor, shape (texts, H, H)
        Per text, :math:`\sum_t \langle c_h(x_t) - \bar c_h, c_g(x_t) - \bar c_g\rangle`.
    text_tokens : Tensor, shape (texts,)
        Per text, its number of real tokens. These three are what :func:`work_bootstrap`
        resamples: the statistics above are functions of their sums over texts.
    text_entropy, text_eff_keys : Tensor, shape (texts, H)
        Per text and head, the sums over its queries of the entropy and of the effective number
        of keys (so that ``entropy == text_entropy.sum(0) / text_tokens.sum()``).
    """

    temperature: Tensor
    entropy: Tensor
    eff_keys: Tensor
    mean_corr: float
    max_abs_corr: float
    cov_share: float
    text_sums: Tensor | None = None
    text_products: Tensor | None = None
    text_tokens: Tensor | None = None
    text_entropy: Tensor | None = None
    text_eff_keys: Tensor | None = None


def _share_and_corr(sums: Tensor, products: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Covariance share and mean pairwise correlation from (weighted) sums over texts; batched."""
    N = tokens[..., None, None]
    m = sums / N  # (..., H, D)
    cross = products / N - torch.einsum("...hd,...gd->...hg", m, m)
    H = cross.shape[-1]
    off = ~torch.eye(H, dtype=torch.bool)
    own = cross.diagonal(dim1=-2, dim2=-1)
    corr = cross / torch.sqrt(own[..., :, None] * own[..., None, :])
    share = cross[..., off].sum(-1) / cross.sum((-2, -1))
    return share, corr[..., off].mean(-1)


def head_statistics(encoder: NWBertEncoder, states: CorpusStates, layer: int) -> HeadStatistics:
    r"""Temperatures, attention entropies, effective keys and contribution correlations of one layer.

    Each text attends over its own real tokens. With :math:`c_h(x_t) = \hat f_h(x_t) W_O^h` the
    contribution of head h at token t and :math:`\bar c_h` its mean over the corpus's tokens,
    the cross terms are :math:`C_{hg} = \operatorname{mean}_t\langle c_h - \bar c_h, c_g - \bar c_g\rangle`;
    the correlations are :math:`C_{hg}/\sqrt{C_{hh}C_{gg}}` and the covariance share is
    :math:`\sum_{h \ne g} C_{hg} / \sum_{h, g} C_{hg}` (Theorem 3.1's split of the output's
    variance over tokens). Statistics in float64 on the CPU.

    Parameters
    ----------
    encoder : NWBertEncoder
    states : CorpusStates
        From :func:`encode_corpus` with this encoder.
    layer : int
        0 <= layer < num_hidden_layers.

    Returns
    -------
    HeadStatistics
    """
    if not isinstance(encoder, NWBertEncoder):
        raise TypeError(f"encoder must be an NWBertEncoder, got {type(encoder).__name__}")
    if not isinstance(states, CorpusStates):
        raise TypeError(f"states must be CorpusStates, got {type(states).__name__}")
    layer = require_positive_int(layer, "layer", minimum=0)
    if layer >= encoder.config.num_hidden_layers:
        raise ValueError(f"layer must be < num_hidden_layers = {encoder.config.num_hidden_layers}, got {layer}")
    dev = _model_device(encoder)
    H = encoder.config.num_attention_heads
    p = encoder.projections(layer)
    x_all, mask, attention_mask = states.hidden[layer], states.mask, states.batch.attention_mask
    ent, eff, contribs = [], [], []
    with torch.no_grad():
        for i in range(len(states.texts)):
            x = x_all[i, mask[i].to(dev)]
            q = torch.einsum("td,hdk->htk", x, p.w_q) + p.b_q[:, None]
            k = torch.einsum("td,hdk->htk", x, p.w_k) + p.b_k[:, None]
            w = nadaraya_watson_weights(q, k).double()  # (H, T, T): softmax(q k^T / sqrt(d_k))
            ent.append(-(w * torch.log(w.clamp_min(1e-300))).sum(-1))
            eff.append(1 / w.pow(2).sum(-1))
            heads = encoder.attention_heads(layer, x_all[i : i + 1], attention_mask[i : i + 1].to(dev))[0]
            contribs.append(torch.einsum("htk,hkd->htd", heads[:, mask[i].to(dev)], p.w_o).double().cpu())
        c = torch.cat(contribs, dim=1)  # (H, tokens, D)
        # per-text sums around the corpus mean (a shift leaves every covariance unchanged and keeps the
        # bootstrap's raw moments free of cancellation)
        centre = c.mean(1, keepdim=True)
        sums = torch.stack([(ci - centre).sum(1) for ci in contribs])  # (texts, H, D)
        products = torch.stack([torch.einsum("htd,gtd->hg", ci - centre, ci - centre) for ci in contribs])
        tokens = torch.tensor([ci.shape[1] for ci in contribs], dtype=torch.float64)
        c = c - c.mean(1, keepdim=True)
        cross = torch.einsum("htd,gtd->hg", c, c) / c.shape[1]  # tr Cov(c_h, c_g)
        own = cross.diagonal()
        corr = cross / torch.sqrt(own[:, None] * own[None, :])
        off = ~torch.eye(H, dtype=torch.bool)
        return HeadStatistics(
            temperature=p.effective_temperature().double().cpu(),
            entropy=torch.cat(ent, dim=1).cpu().mean(1),
            eff_keys=torch.cat(eff, dim=1).cpu().mean(1),
            mean_corr=float(corr[off].mean()),
            max_abs_corr=float(corr[off].abs().max()),
            cov_share=float(cross[off].sum() / cross.sum()),
            text_sums=sums,
            text_products=products,
            text_tokens=tokens,
            text_entropy=torch.stack([e.sum(1) for e in ent]).cpu(),
            text_eff_keys=torch.stack([e.sum(1) for e in eff]).cpu(),
        )


def work_bootstrap(
    stats: Sequence[HeadStatistics], *, replicates: int, generator: torch.Generator
) -> dict[str, list[Comparison]]:
    r"""Bootstrap over texts of each layer's covariance share and mean contribution correlation.

    The corpus's texts are the sampling units (Efron and Tibshirani, 1993): each replicate draws
    as many texts as the corpus has, with replacement (the same draw for every layer, from
    ``generator``), and recomputes the statistics of :func:`head_statistics` from the drawn
    texts' sums. The estimate is the full corpus's value, its standard error the replicates'
    standard deviation, with df = texts − 1.

    Parameters
    ----------
    stats : sequence of HeadStatistics
        One per layer, from one corpus.
    replicates : int
        Bootstrap replicates, >= 2.
    generator : torch.Generator
        On the CPU.

    Returns
    -------
    dict
        ``"covariance share"`` and ``"mean corr"``: one Comparison per layer; with the per-text
        sums of entropies and effective keys (:attr:`HeadStatistics.text_entropy`), also
        ``"entropy"`` and ``"effective keys"``: the mean over heads and queries, per layer.
    """
    stats = list(stats)
    if not stats or not all(isinstance(x, HeadStatistics) for x in stats):
        raise TypeError("stats must be a non-empty sequence of HeadStatistics")
    per_text = [(x.text_sums, x.text_products, x.text_tokens) for x in stats]
    if any(t is None for triple in per_text for t in triple):
        raise ValueError("stats must carry the per-text sums of head_statistics")
    B = require_positive_int(replicates, "replicates", minimum=2)
    require_generator(generator, "cpu")
    T = len(stats[0].text_tokens)  # type: ignore[arg-type]
    draws = torch.randint(T, (B, T), generator=generator)
    counts = torch.zeros(B, T, dtype=torch.float64).scatter_add_(1, draws, torch.ones(B, T, dtype=torch.float64))
    out: dict[str, list[Comparison]] = {"covariance share": [], "mean corr": []}
    for x_sums, x_products, x_tokens in per_text:
        assert x_sums is not None and x_products is not None and x_tokens is not None  # checked above
        sums = torch.einsum("bt,thd->bhd", counts, x_sums)
        products = torch.einsum("bt,thg->bhg", counts, x_products)
        share, corr = _share_and_corr(sums, products, counts @ x_tokens)
        full_share, full_corr = _share_and_corr(x_sums.sum(0), x_products.sum(0), x_tokens.sum())
        for key, full, boot in (("covariance share", full_share, share), ("mean corr", full_corr, corr)):
            out[key].append(Comparison(float(full), float(boot.std(correction=1)), T - 1))
    if all(x.text_entropy is not None and x.text_eff_keys is not None for x in stats):
        out |= {"entropy": [], "effective keys": []}
        for x in stats:
            tokens = cast(Tensor, x.text_tokens)
            for key, by_text in (("entropy", x.text_entropy), ("effective keys", x.text_eff_keys)):
                totals = cast(Tensor, by_text).sum(1)  # (texts,): summed over heads
                heads = cast(Tensor, by_text).shape[1]
                full = totals.sum() / (tokens.sum() * heads)
                boot = (counts @ totals) / ((counts @ tokens) * heads)
                out[key].append(Comparison(float(full), float(boot.std(correction=1)), T - 1))
    return out


# --- the second model: a decoder with grouped-query attention ---------------------------------


def decode_corpus(decoder: NWLlamaDecoder, tokenizer: Any, texts: Sequence[str]) -> CorpusStates:
    """Tokenise ``texts`` (right-padded to the longest) and run the decoder on them, without gradients.

    Parameters
    ----------
    decoder : NWLlamaDecoder
        On the device to compute on.
    tokenizer : tokenizers.Tokenizer
        From :func:`nwlib.models.llama.load_tokenizer`.
    texts : sequence of str

    Returns
    -------
    CorpusStates
        ``hidden`` holds the embeddings and every layer's output (``num_hidden_layers + 1``).
    """
    if not isinstance(decoder, NWLlamaDecoder):
        raise TypeError(f"decoder must be an NWLlamaDecoder, got {type(decoder).__name__}")
    texts = list(texts) if isinstance(texts, Sequence) and not isinstance(texts, str) else texts
    batch = encode(tokenizer, texts)  # checks texts
    dev = _model_device(decoder)
    with torch.no_grad():
        hidden = decoder(batch.input_ids.to(dev), batch.attention_mask.to(dev))
    return CorpusStates(list(texts), batch, batch.attention_mask.bool(), hidden)


def gqa_key_hdi_bound(num_heads: int, num_kv_heads: int) -> float:
    r"""The largest invariant key HDI over H query heads that share H_kv key blocks in groups of G = H/H_kv.

    Pairs within a group have identical keys (overlap 1); with the between-group pairs at the
    kv-heads' index :math:`\mathrm{HDI}_{kv}`, the index over query heads is
    :math:`\mathrm{HDI}_{kv}\,(H - G)/(H - 1)`, at most :math:`(H - G)/(H - 1)` (kv heads orthogonal).

    Examples
    --------
    >>> gqa_key_hdi_bound(9, 3)
    0.75
    """
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    K = require_positive_int(num_kv_heads, "num_kv_heads")
    if H % K:
        raise ValueError(f"num_kv_heads must divide num_heads, got {H} and {K}")
    return (H - H // K) / (H - 1)


def decoder_geometry(
    decoder: NWLlamaDecoder,
    states: CorpusStates,
    random_query: Mapping[str, Tensor],
    random_kv: Mapping[str, Tensor],
) -> pd.DataFrame:
    r"""Per layer, the diversity of a GQA decoder's query, key and value subspaces (as :func:`layer_geometry`).

    Columns ``"HDI Q"``, ``"paper Q"``, ``"RV Q"`` over the H query heads; ``"HDI K"``, ``"HDI V"``,
    ``"paper K"``, ``"paper V"``, ``"RV K"``, ``"RV V"`` over the H_kv key/value heads; ``"HDI K,
    per query head"`` (the key index over the H query heads, each with its group's key block:
    identical within a group); ``"HDI K, data"`` (the kv heads' key features on the corpus
    tokens entering the layer after its RMSNorm, centred within each text, before RoPE);
    ``"key scale"`` (mean squared singular value of the key blocks); ``"z HDI Q"``, ``"z HDI K"``
    (distance from one new draw of the random law of H, resp. H_kv, heads). Float64 on the CPU.

    Parameters
    ----------
    decoder : NWLlamaDecoder
    states : CorpusStates
        From :func:`decode_corpus`.
    random_query, random_kv : mapping of str to Tensor
        ``{"HDI": draws, ...}`` of the random law with H heads and with H_kv heads.

    Returns
    -------
    pandas.DataFrame
        One row per layer (index ``"layer"``).
    """
    import pandas as pd

    from ..models.llama import rms_norm

    if not isinstance(decoder, NWLlamaDecoder):
        raise TypeError(f"decoder must be an NWLlamaDecoder, got {type(decoder).__name__}")
    if not isinstance(states, CorpusStates):
        raise TypeError(f"states must be CorpusStates, got {type(states).__name__}")
    for name, law in (("random_query", random_query), ("random_kv", random_kv)):
        if "HDI" not in law:
            raise ValueError(f"{name} must hold draws of 'HDI'")
    cfg, dev = decoder.config, _model_device(decoder)
    rows = []
    for layer in range(cfg.num_hidden_layers):
        p = decoder.projections(layer)
        normed = rms_norm(states.hidden[layer], decoder.layer(layer).attn_norm, cfg.rms_norm_eps)
        x_in = torch.cat(
            [
                normed[i, states.mask[i].to(dev)] - normed[i, states.mask[i].to(dev)].mean(0)
                for i in range(len(states.texts))
            ]
        )
        x_in = x_in.detach().double().cpu()
        row: dict[str, Any] = {"layer": layer}
        for name, w in (("Q", p.w_q), ("K", p.w_k), ("V", p.w_v)):
            w = w.double().cpu()
            row[f"HDI {name}"] = float(hdi(w))
            row[f"paper {name}"] = float(hdi(w, normalization="paper"))
            row[f"RV {name}"] = float(rv_diversity(w))
        row["HDI K, per query head"] = float(hdi(p.keys_per_query_head().double().cpu()))
        row["HDI K, data"] = float(hdi(x_in @ p.w_k.double().cpu()))
        row["key scale"] = float(p.w_k.double().pow(2).sum() / (p.num_kv_heads * p.head_dim))
        row["z HDI Q"] = against(row["HDI Q"], random_query["HDI"]).z
        row["z HDI K"] = against(row["HDI K"], random_kv["HDI"]).z
        rows.append(row)
    return pd.DataFrame(rows).set_index("layer")


def decoder_head_statistics(decoder: NWLlamaDecoder, states: CorpusStates, layer: int) -> HeadStatistics:
    r"""Temperatures, causal attention entropies, effective keys and contribution correlations of one layer.

    As :func:`head_statistics`, per query head: query t of a text attends over its positions
    0..t (RoPE-rotated queries and keys of :meth:`NWLlamaDecoder.qkv`), so its effective number
    of keys is at most t + 1; the temperature is :meth:`GQAProjections.effective_temperature`.

    Parameters
    ----------
    decoder : NWLlamaDecoder
    states : CorpusStates
        From :func:`decode_corpus`.
    layer : int

    Returns
    -------
    HeadStatistics
    """
    if not isinstance(decoder, NWLlamaDecoder):
        raise TypeError(f"decoder must be an NWLlamaDecoder, got {type(decoder).__name__}")
    if not isinstance(states, CorpusStates):
        raise TypeError(f"states must be CorpusStates, got {type(states).__name__}")
    layer = require_positive_int(layer, "layer", minimum=0)
    if layer >= decoder.config.num_hidden_layers:
        raise ValueError(f"layer must be < num_hidden_layers = {decoder.config.num_hidden_layers}, got {layer}")
    dev, H = _model_device(decoder), decoder.config.num_attention_heads
    p = decoder.projections(layer)
    ent, eff, contribs = [], [], []
    G = decoder.config.group_size
    with torch.no_grad():
        q_all, k_all, v_all = decoder.qkv(layer, states.hidden[layer])
        for i in range(len(states.texts)):
            T = int(states.mask[i].sum())
            q = q_all[i, :, :, :T].flatten(0, 1)  # (H, T, d)
            k = k_all[i, :, :, :T].expand(-1, G, -1, -1).flatten(0, 1)  # each group's keys, for its query heads
            v = v_all[i, :, :, :T].expand(-1, G, -1, -1).flatten(0, 1)
            logits = (q @ k.mT / math.sqrt(p.head_dim)).double()
            causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
            w = torch.softmax(logits.masked_fill(~causal, -math.inf), dim=-1)  # the causal NW weights
            ent.append(-(w * torch.log(w.clamp_min(1e-300))).sum(-1))
            eff.append(1 / w.pow(2).sum(-1))
            heads = w @ v.double()  # (H, T, d): each head's causal NW estimate
            contribs.append(torch.einsum("htk,hkd->htd", heads, p.w_o.double()).cpu())
    return _statistics_from(p.effective_temperature().double().cpu(), ent, eff, contribs, H)


def _statistics_from(
    temperature: Tensor, ent: list[Tensor], eff: list[Tensor], contribs: list[Tensor], H: int
) -> HeadStatistics:
    """HeadStatistics from per-text entropies, effective keys (H, T_i) and contributions (H, T_i, D)."""
    c = torch.cat(contribs, dim=1)  # (H, tokens, D)
    centre = c.mean(1, keepdim=True)
    sums = torch.stack([(ci - centre).sum(1) for ci in contribs])
    products = torch.stack([torch.einsum("htd,gtd->hg", ci - centre, ci - centre) for ci in contribs])
    tokens = torch.tensor([ci.shape[1] for ci in contribs], dtype=torch.float64)
    c = c - centre
    cross = torch.einsum("htd,gtd->hg", c, c) / c.shape[1]
    own = cross.diagonal()
    corr = cross / torch.sqrt(own[:, None] * own[None, :])
    off = ~torch.eye(H, dtype=torch.bool)
    return HeadStatistics(
        temperature=temperature,
        entropy=torch.cat(ent, dim=1).cpu().mean(1),
        eff_keys=torch.cat(eff, dim=1).cpu().mean(1),
        mean_corr=float(corr[off].mean()),
        max_abs_corr=float(corr[off].abs().max()),
        cov_share=float(cross[off].sum() / cross.sum()),
        text_sums=sums,
        text_products=products,
        text_tokens=tokens,
        text_entropy=torch.stack([e.sum(1) for e in ent]).cpu(),
        text_eff_keys=torch.stack([e.sum(1) for e in eff]).cpu(),
    )


def causal_mean_keys(states: CorpusStates) -> float:
    r"""Keys seen by the average query of a causal model: :math:`\sum_i T_i(T_i + 1)/2 / \sum_i T_i`."""
    T = states.mask.sum(1).double()
    return float((T * (T + 1) / 2).sum() / T.sum())


# --- the quantisation control -------------------------------------------------------------------


def quantised_state_dict(
    state_dict: Mapping[str, Tensor], *, kind: str = "Q4_1", prefix: str = "encoder.layer."
) -> dict[str, Tensor]:
    """A copy of a state dict with every matrix under ``prefix`` round-tripped through GGUF quantisation.

    What llama.cpp's Q4_1 files do to a model's layers (:func:`nwlib.models.llama.quantize_round_trip`,
    blocks of 32 along each row, i.e. along a Linear layer's inputs); vectors (biases, norms) and
    the embeddings are kept, as such files keep norms in float32 and embeddings at 8 bits.

    Parameters
    ----------
    state_dict : mapping of str to Tensor
    kind : str, default "Q4_1"
    prefix : str, default ``"encoder.layer."``

    Returns
    -------
    dict of str to Tensor
    """
    from ..models.llama import quantize_round_trip

    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    return {
        k: quantize_round_trip(v, kind) if k.startswith(prefix) and v.dim() == 2 else v for k, v in state_dict.items()
    }


def quantisation_effect(before: pd.DataFrame, after: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Per column, the largest change over layers between two per-layer tables (after - before).

    Returns
    -------
    pandas.DataFrame
        Index the columns; ``"max |change|"``, ``"largest value"`` (of ``before``) and
        ``"relative"`` (their ratio).
    """
    import pandas as pd

    missing = [c for c in columns if c not in before.columns or c not in after.columns]
    if missing or before.shape[0] != after.shape[0]:
        raise ValueError(f"before and after must be per-layer tables with the columns {list(columns)}")
    rows = {}
    for col in columns:
        change = float((after[col] - before[col]).abs().max())
        scale = float(before[col].abs().max())
        rows[col] = {"max |change|": change, "largest value": scale, "relative": change / scale if scale else 0.0}
    return pd.DataFrame(rows).T.rename_axis("statistic")


# --- both models side by side ---------------------------------------------------------------------


def two_model_table(models: Mapping[str, tuple[pd.DataFrame, pd.DataFrame, float]]) -> pd.DataFrame:
    """One row per model: the per-layer geometry and work statistics summarised over layers.

    Parameters
    ----------
    models : mapping of str to (geometry, work, random HDI)
        Per model, its :func:`layer_geometry` or :func:`decoder_geometry` table, its
        :func:`work_table` and its random-subspace HDI 1 - d_k/D.

    Returns
    -------
    pandas.DataFrame
        Index the model names; columns "layers", "random HDI", "HDI K min", "HDI K max", "HDI Q min",
        "HDI Q max", "HDI V max", "RV K min", "RV K max", "paper K min", "entropy (mean)",
        "effective keys (mean)", "temperature (median)".
    """
    import pandas as pd

    rows = {}
    for name, (geometry, work, random_hdi) in models.items():
        rows[name] = {
            "layers": len(geometry),
            "random HDI": random_hdi,
            "HDI K min": geometry["HDI K"].min(),
            "HDI K max": geometry["HDI K"].max(),
            "HDI Q min": geometry["HDI Q"].min(),
            "HDI Q max": geometry["HDI Q"].max(),
            "HDI V max": geometry["HDI V"].max(),
            "RV K min": geometry["RV K"].min(),
            "RV K max": geometry["RV K"].max(),
            "paper K min": geometry["paper K"].min(),
            "entropy (mean)": work["entropy (mean)"].mean(),
            "effective keys (mean)": work["effective keys (mean)"].mean(),
            "temperature (median)": work["temperature (median)"].median(),
        }
    return pd.DataFrame(rows).T.rename_axis("model")


def work_table(stats: Sequence[HeadStatistics]) -> pd.DataFrame:
    """Per layer: median and largest temperature, mean entropy, mean and smallest effective keys, correlation, share.

    Parameters
    ----------
    stats : sequence of HeadStatistics
        One per layer, in layer order.

    Returns
    -------
    pandas.DataFrame
        Index ``"layer"``.
    """
    import pandas as pd

    stats = list(stats)
    if not stats or not all(isinstance(s, HeadStatistics) for s in stats):
        raise TypeError("stats must be a non-empty sequence of HeadStatistics")
    return pd.DataFrame(
        {
            "temperature (median)": [float(s.temperature.median()) for s in stats],
            "temperature (max)": [float(s.temperature.max()) for s in stats],
            "entropy (mean)": [float(s.entropy.mean()) for s in stats],
            "effective keys (mean)": [float(s.eff_keys.mean()) for s in stats],
            "effective keys (min head)": [float(s.eff_keys.min()) for s in stats],
            "mean corr": [s.mean_corr for s in stats],
            "covariance share": [s.cov_share for s in stats],
        },
        index=pd.Index(range(len(stats)), name="layer"),
    )


_GEOMETRY_EXTREMES = (
    ("hdi_k_min", "HDI K", "min"),
    ("hdi_k_max", "HDI K", "max"),
    ("hdi_q_min", "HDI Q", "min"),
    ("hdi_v_max", "HDI V", "max"),
    ("hdi_k_data_min", "HDI K, data", "min"),
    ("hdi_k_data_max", "HDI K, data", "max"),
    ("paper_k_min", "paper K", "min"),
    ("paper_k_max", "paper K", "max"),
    ("rv_k_min", "RV K", "min"),
    ("rv_k_max", "RV K", "max"),
    ("key_scale_min", "key scale", "min"),
    ("key_scale_max", "key scale", "max"),
)


def geometry_extremes(geometry: pd.DataFrame) -> dict[str, float]:
    """The extremes over layers of :func:`layer_geometry` that chapter 5 quotes, by their glue keys.

    Parameters
    ----------
    geometry : pandas.DataFrame
        From :func:`layer_geometry`.

    Returns
    -------
    dict of str to float
        ``hdi_k_min``, ``hdi_k_max``, ``hdi_q_min``, ``hdi_v_max``, ``hdi_k_data_min``,
        ``hdi_k_data_max``, ``paper_k_min``, ``paper_k_max``, ``rv_k_min``, ``rv_k_max``,
        ``key_scale_min``, ``key_scale_max``: the smallest or largest value of a column.
    """
    missing = sorted({col for _, col, _ in _GEOMETRY_EXTREMES} - set(geometry.columns))
    if missing:
        raise ValueError(f"geometry must have the columns of layer_geometry; missing {missing}")
    return {key: float(getattr(geometry[col], pick)()) for key, col, pick in _GEOMETRY_EXTREMES}


def work_extremes(stats: Sequence[HeadStatistics], work: pd.DataFrame) -> dict[str, float]:
    """The numbers about the heads at work that chapter 5 quotes, by their glue keys.

    Parameters
    ----------
    stats : sequence of HeadStatistics
        One per layer.
    work : pandas.DataFrame
        :func:`work_table` of ``stats``.

    Returns
    -------
    dict of str to float
        ``temp_median`` and ``temp_max`` (over every head of every layer), ``eff_keys_min`` (the
        most selective head), ``eff_keys_mean_min`` and ``eff_keys_mean_max`` (over layers of the
        mean over heads), ``corr_min``, ``corr_max``, ``cov_share_min`` and ``cov_share_max`` (over layers).
    """
    temps = torch.cat([s.temperature for s in stats])
    return {
        "temp_median": float(temps.median()),
        "temp_max": float(temps.max()),
        "eff_keys_min": float(work["effective keys (min head)"].min()),
        "eff_keys_mean_min": float(work["effective keys (mean)"].min()),
        "eff_keys_mean_max": float(work["effective keys (mean)"].max()),
        "corr_min": float(work["mean corr"].min()),
        "corr_max": float(work["mean corr"].max()),
        "cov_share_min": float(work["covariance share"].min()),
        "cov_share_max": float(work["covariance share"].max()),
    }


# --- training an attention regressor -------------------------------------------------------

TRAINING_KEYS: tuple[str, ...] = (
    "embed_dim",
    "num_heads",
    "signal_dim",
    "frequency",
    "noise_sd",
    "context",
    "queries",
    "batch_size",
    "steps",
    "lr",
    "penalty",
    "eval_every",
    "test_prompts",
)
"""The coordinates a point of :func:`training_point` must hold (besides any that tell replicates apart)."""

TRAINING_ARMS: tuple[str, ...] = ("no_penalty", "penalty")
"""The two arms of a training point: without and with the orthogonality penalty."""

_HISTORY_FIELDS = (
    "step",
    "train_loss",
    "test_mse",
    "hdi_key",
    "hdi_query",
    "head_correlation",
    "head_weights",
    "val_mse",
)


def zero_predictor_mse(frequency: float) -> float:
    r"""The zero predictor's MSE :math:`\E f(x)^2` for the in-context task, whatever s.

    For :math:`f(x) = s^{-1/2}\sum_{j<s}\sin(\omega x_j)` with independent :math:`x_j \sim N(0, 1)`,
    the terms are centred and independent, so :math:`\E f^2 = \E\sin^2(\omega x) =
    (1 - e^{-2\omega^2})/2` (from :math:`\E\cos(2\omega x) = e^{-2\omega^2}`).

    Parameters
    ----------
    frequency : float
        :math:`\omega > 0`.

    Returns
    -------
    float

    Examples
    --------
    >>> round(zero_predictor_mse(1.0), 6)
    0.432332
    """
    w = require_positive_finite(frequency, "frequency")
    return (1 - math.exp(-2 * w * w)) / 2


def signal_overlap(bases: Tensor, signal_dim: int) -> float:
    r"""How much of the signal subspace (the first s coordinates) the heads hold, on average.

    :math:`\operatorname{mean}_h \lVert S^\top Q_h\rVert_F^2 / s` for orthonormal bases
    :math:`Q_h` and :math:`S = [e_1, \dots, e_s]`: 1 when every head contains S, 0 when every
    head is orthogonal to it, :math:`d_k/D` on average for random heads.

    Parameters
    ----------
    bases : Tensor, shape (H, D, d_k)
        Orthonormal columns per head (:func:`nwlib.orthonormal_basis`).
    signal_dim : int
        s, 1 <= s <= D.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> I = torch.eye(4, dtype=torch.float64)
    >>> signal_overlap(torch.stack([I[:, :2], I[:, 2:]]), 1)
    0.5
    """
    bases = require_tensor(bases, "bases", min_dim=3)
    s = require_positive_int(signal_dim, "signal_dim")
    if s > bases.shape[-2]:
        raise ValueError(f"signal_dim must be <= D = {bases.shape[-2]}, got {s}")
    return float(bases[..., :s, :].pow(2).sum((-2, -1)).mean() / s)


def training_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One point of the training sweep: one task, one replicate, trained without and with the penalty.

    Both arms call :func:`nwlib.models.training.train_regressor` with the same ``seed``, so
    they share the initialisation, the training prompts and the test prompts (common random
    numbers: the penalty's effect is a paired difference over replicates); this is why the two
    arms are one point, not two. The task is :class:`~nwlib.models.training.InContextTask`
    with ``embed_dim``, ``signal_dim``, ``frequency`` and ``noise_sd``; the regressor has
    ``num_heads`` heads of d_k = D/H and is trained in float32. Two optional coordinates:
    ``patience`` (early stopping on the validation prompts, at most ``steps`` steps; absent or
    None: all ``steps`` steps) and ``values`` (``"response"``, the default, or ``"token"``).

    Parameters
    ----------
    point : Mapping
        The coordinates of :data:`TRAINING_KEYS` (``batch_size`` prompts per step of ``context``
        pairs and ``queries`` queries, ``steps`` Adam steps at learning rate ``lr``, the
        penalty's weight ``penalty``, an evaluation every ``eval_every`` steps on
        ``test_prompts`` prompts); others (a ``replicate`` number) only tell points apart.
    seed : int
        The run's seed (from :func:`nwlib.sweep.point_seed`).
    device : str, default "cpu"
        Where to train (``"auto"``: CUDA, then MPS, then CPU).

    Returns
    -------
    dict
        For each arm of :data:`TRAINING_ARMS`, the fields of
        :class:`~nwlib.models.training.TrainingHistory` (lists over the evaluations, and
        ``best_index``, the evaluation of the returned model) and ``signal_overlap``, the
        returned keys' :func:`signal_overlap`.

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    point = require_point(point, TRAINING_KEYS)
    task = InContextTask(
        point["embed_dim"], point["signal_dim"], frequency=point["frequency"], noise_sd=point["noise_sd"]
    )
    penalty = require_real(point["penalty"], "penalty", minimum=0.0)
    dev = resolve_device(device)
    out: dict[str, Any] = {}
    for arm, weight in zip(TRAINING_ARMS, (0.0, penalty), strict=True):
        model, history = train_regressor(
            task,
            num_heads=point["num_heads"],
            steps=point["steps"],
            batch_size=point["batch_size"],
            context=point["context"],
            queries=point["queries"],
            lr=point["lr"],
            penalty=weight,
            seed=seed,
            eval_every=point["eval_every"],
            test_prompts=point["test_prompts"],
            patience=point.get("patience"),
            values=point.get("values", "response"),
            device=dev,
        )
        bases = orthonormal_basis(model.key_projections.detach().double().cpu())
        out[arm] = {**dataclasses.asdict(history), "signal_overlap": signal_overlap(bases, task.signal_dim)}
    return out


def training_series(results: Sequence[Mapping[str, Any]], arm: str, key: str) -> Tensor:
    """One recorded quantity of one arm over the replicates of a task.

    Parameters
    ----------
    results : sequence of dict
        :func:`training_point` results, one per replicate.
    arm : {"no_penalty", "penalty"}
    key : str
        A :class:`~nwlib.models.training.TrainingHistory` field of one number per evaluation
        (``"test_mse"``, ``"hdi_key"``, ``"hdi_query"``, ``"head_correlation"``, ...).

    Returns
    -------
    Tensor, shape (replicates, evaluations), float64
        Runs stopped early are padded with NaN after their last evaluation.
    """
    if arm not in TRAINING_ARMS:
        raise ValueError(f"arm must be one of {list(TRAINING_ARMS)}, got {arm!r}")
    if key not in _HISTORY_FIELDS or key == "head_weights":
        raise ValueError(f"key must be a per-evaluation number of the history, got {key!r}")
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence) or not results:
        raise TypeError("results must be a non-empty sequence of training_point results")
    rows = [list(r[arm][key]) for r in results]
    width = max(len(row) for row in rows)
    return torch.tensor([row + [math.nan] * (width - len(row)) for row in rows], dtype=torch.float64)


def _returned(results: Sequence[Mapping[str, Any]], arm: str, key: str) -> Tensor:
    """A quantity at each run's returned model (its ``best_index``), shape (replicates,)."""
    series = training_series(results, arm, key)
    index = torch.tensor([r[arm].get("best_index", -1) for r in results])
    index = torch.where(index < 0, torch.tensor([len(r[arm]["step"]) for r in results]) + index, index)
    return series[torch.arange(len(results)), index]


TRAINING_QUANTITIES: dict[str, str] = {
    "MSE, no penalty": "mse0",
    "MSE, penalty": "mse1",
    "MSE change (paired)": "dmse",
    "HDI K at init": "hdi_init",
    "HDI K trained": "hdi_end",
    "HDI K change": "dhdi",
    "HDI Q trained": "hdiq_end",
    "head corr at init": "corr_init",
    "head corr, no penalty": "corr0",
    "head corr, penalty": "corr1",
    "corr change, no penalty": "dcorr0",
    "corr change, penalty": "dcorr1",
    "signal overlap": "overlap",
    "MSE removed, no penalty": "removed0",
    "MSE removed, penalty": "removed1",
    "steps, no penalty": "steps0",
    "steps, penalty": "steps1",
}
"""The quantities of :func:`training_comparisons` that chapter 5 glues, and the short names it glues them under."""


def training_comparisons(results: Sequence[Mapping[str, Any]], zero_mse: float | None = None) -> dict[str, Comparison]:
    """The chapter's quantities for one task, each over the replicates (paired where two share a seed).

    Trained values are those of the model each run returns (the best evaluation under early
    stopping, else the last); "at init" of the first (step 0). Means
    are :func:`nwlib.evidence.mean`, changes :func:`nwlib.evidence.paired` (the penalty's arm
    against the other on the same seeds, a trained value against the same run's initial one).

    Parameters
    ----------
    results : sequence of dict
        :func:`training_point` results, one per replicate (at least two).
    zero_mse : float, optional
        The zero predictor's MSE (:func:`zero_predictor_mse`); with it, the fractions of it that
        each arm removes, ``"MSE removed, no penalty"`` and ``"MSE removed, penalty"``.

    Returns
    -------
    dict of str to Comparison
        ``"MSE, no penalty"``, ``"MSE, penalty"``, ``"MSE change (paired)"``, ``"HDI K at init"``,
        ``"HDI K trained"``, ``"HDI K change"``, ``"HDI Q trained"``, ``"HDI K trained, penalty"``,
        ``"head corr at init"``, ``"head corr, no penalty"``, ``"head corr, penalty"``,
        ``"corr change, no penalty"``, ``"corr change, penalty"``, ``"signal overlap"`` (no penalty),
        ``"steps, no penalty"`` and ``"steps, penalty"`` (the step of the returned model).
    """
    if len(results) < 2:
        raise ValueError(f"results must hold at least two replicates, got {len(results)}")
    mse0 = _returned(results, "no_penalty", "test_mse")
    mse1 = _returned(results, "penalty", "test_mse")
    hdi0, hdi_end = training_series(results, "no_penalty", "hdi_key")[:, 0], _returned(results, "no_penalty", "hdi_key")
    corr_init = training_series(results, "no_penalty", "head_correlation")[:, 0]
    corr0 = _returned(results, "no_penalty", "head_correlation")
    corr1 = _returned(results, "penalty", "head_correlation")
    overlap = torch.tensor([r["no_penalty"]["signal_overlap"] for r in results], dtype=torch.float64)
    out = {
        "MSE, no penalty": mean(mse0),
        "MSE, penalty": mean(mse1),
        "MSE change (paired)": paired(mse1, mse0),
        "HDI K at init": mean(hdi0),
        "HDI K trained": mean(hdi_end),
        "HDI K change": paired(hdi_end, hdi0),
        "HDI Q trained": mean(_returned(results, "no_penalty", "hdi_query")),
        "HDI K trained, penalty": mean(_returned(results, "penalty", "hdi_key")),
        "head corr at init": mean(corr_init),
        "head corr, no penalty": mean(corr0),
        "head corr, penalty": mean(corr1),
        "corr change, no penalty": paired(corr0, corr_init),
        "corr change, penalty": paired(corr1, corr_init),
        "signal overlap": mean(overlap),
        "steps, no penalty": mean(_returned(results, "no_penalty", "step")),
        "steps, penalty": mean(_returned(results, "penalty", "step")),
    }
    if zero_mse is not None:
        zero = require_positive_finite(zero_mse, "zero_mse")
        out["MSE removed, no penalty"] = mean(1 - mse0 / zero)
        out["MSE removed, penalty"] = mean(1 - mse1 / zero)
    return out


# --- minimising the MSE over head subspaces --------------------------------------------------

OPTIMISATION_KEYS: tuple[str, ...] = (
    "task",
    "embed_dim",
    "noise_sd",
    "num_heads",
    "head_dim",
    "n",
    "steps",
    "replicates",
    "eval_size",
    "lr",
    "regime",
    "record_every",
)
"""The coordinates a point of :func:`optimisation_point` must hold (besides any that tell restarts apart)."""

REGIMES: tuple[str, ...] = ("i", "ii")
"""Regime (i): every head keeps the signal directions; (ii): all directions are free."""


def _signal_directions(task: RegressionTask, dtype: torch.dtype = torch.float64) -> Tensor:
    return torch.eye(task.embed_dim, dtype=dtype)[:, : task.signal_dim]


def optimisation_point(point: Mapping[str, Any], *, seed: int, device: str = "cpu") -> dict[str, Any]:
    r"""One restart of the direct minimisation of the integrated MSE over head subspaces.

    :func:`nwlib.models.training.optimise_subspaces` on the task ``make_task(task, embed_dim,
    noise_sd=noise_sd)`` with H = ``num_heads`` Gaussian-kernel heads of d_k = ``head_dim``,
    training sets of size ``n`` and Scott's bandwidth :math:`n^{-1/(d_k+4)}`
    (:func:`nwlib.scott_bandwidth`); ``replicates`` training sets and ``eval_size`` points per
    step, ``steps`` Adam steps at learning rate ``lr``, recorded every ``record_every`` steps.
    Regime ``"i"`` keeps the task's signal directions :math:`e_1, \dots, e_s` in every head,
    ``"ii"`` moves all columns. Restarts are independent (each its own seed).

    Parameters
    ----------
    point : Mapping
        The coordinates of :data:`OPTIMISATION_KEYS`; others (a ``restart`` number) only tell
        points apart.
    seed : int
        The restart's seed (from :func:`nwlib.sweep.point_seed`): the start and every step's data.
    device : str, default "cpu"
        Accepted for :func:`nwlib.sweep.run_sweep`; the optimisation runs on the CPU in float64
        (``optimise_subspaces`` takes no device).

    Returns
    -------
    dict
        ``bases`` (the final orthonormal bases, nested lists of shape (H, D, d_k)) and the
        fields of :class:`~nwlib.models.training.OptimisationHistory` (``step``, ``objective``,
        ``hdi``, ``signal_overlap``).

    Raises
    ------
    TypeError, ValueError
        If ``point`` lacks a coordinate or holds a bad value (named in the message).
    """
    point = require_point(point, OPTIMISATION_KEYS)
    if point["regime"] not in REGIMES:
        raise ValueError(f"regime must be one of {list(REGIMES)}, got {point['regime']!r}")
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu', got {type(device).__name__}")
    task = make_task(point["task"], point["embed_dim"], noise_sd=point["noise_sd"])
    bases, history = optimise_subspaces(
        task,
        num_heads=point["num_heads"],
        head_dim=point["head_dim"],
        n=point["n"],
        steps=point["steps"],
        replicates=point["replicates"],
        eval_size=point["eval_size"],
        bandwidth=float(scott_bandwidth(point["n"], point["head_dim"])),
        shared=_signal_directions(task) if point["regime"] == "i" else None,
        lr=point["lr"],
        seed=seed,
        record_every=point["record_every"],
    )
    return {"bases": bases.tolist(), **dataclasses.asdict(history)}


def comparison_families(
    num_heads: int, head_dim: int, embed_dim: int, *, dtype: torch.dtype = torch.float64
) -> dict[str, Tensor]:
    """Chapter 3's fixed families (:func:`nwlib.equiangular_heads`), on the CPU.

    Parameters
    ----------
    num_heads, head_dim, embed_dim : int
        H, d_k and D, with (H + 1) d_k <= D.
    dtype : torch.dtype, default torch.float64

    Returns
    -------
    dict of str to Tensor, each (H, D, d_k)
        ``"identical heads"`` (HDI 0), ``"share e1, others orthogonal"`` (HDI (d_k - 1)/d_k) and
        ``"pairwise orthogonal"`` (HDI 1).
    """
    H, k, D = num_heads, head_dim, embed_dim
    return {
        "identical heads": equiangular_heads(0.0, num_heads=H, head_dim=k, embed_dim=D, dtype=dtype),
        "share e1, others orthogonal": equiangular_heads(
            math.pi / 2, num_heads=H, head_dim=k, embed_dim=D, shared_dim=1, dtype=dtype
        ),
        "pairwise orthogonal": equiangular_heads(math.pi / 2, num_heads=H, head_dim=k, embed_dim=D, dtype=dtype),
    }


def nuisance_hdi(bases: Tensor, shared: Tensor) -> float:
    r"""The invariant HDI of the heads' parts orthogonal to the shared directions.

    Head h's nuisance part is spanned by the leading :math:`d_k - s` left singular vectors of
    :math:`(I - SS^\top) Q_h`: for a head that contains S exactly its other directions.

    Parameters
    ----------
    bases : Tensor, shape (H, D, d_k)
        Orthonormal bases.
    shared : Tensor, shape (D, s)
        Orthonormal shared directions, s < d_k.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> I = torch.eye(5, dtype=torch.float64)
    >>> heads = torch.stack([I[:, [0, 1]], I[:, [0, 2]]])  # share e1, orthogonal elsewhere
    >>> nuisance_hdi(heads, I[:, :1])
    1.0
    """
    bases = require_tensor(bases, "bases", min_dim=3)
    shared = require_tensor(shared, "shared", min_dim=2)
    if bases.dim() != 3 or shared.dim() != 2 or shared.shape[0] != bases.shape[1]:
        raise ValueError(
            f"bases must have shape (H, D, d_k) and shared (D, s), got {tuple(bases.shape)} and {tuple(shared.shape)}"
        )
    k, s = bases.shape[-1], shared.shape[-1]
    if s >= k:
        raise ValueError(f"shared must have fewer columns than the heads (s < d_k = {k}), got s = {s}")
    parts = []
    for q in bases:
        u, _, _ = torch.linalg.svd(q - shared @ (shared.T @ q), full_matrices=False)
        parts.append(u[:, : k - s])
    return float(hdi(torch.stack(parts)))


@dataclass(frozen=True)
class FamilyCheck:
    """Families of heads scored on independent data (see :func:`check_families`).

    Attributes
    ----------
    errors : dict of str to Tensor, each (R, m)
        Squared error of the equally weighted ensemble per training set and evaluation point.
    best : str
        The candidate with the lowest mean error.
    mse : dict of str to Comparison
        Mean error with a standard error over training sets and points (:func:`nwlib.evidence.crossed`).
    vs_best : dict of str to Comparison
        Paired difference from the best candidate, same sets and points (0 ± 0 for the best).
    table : pandas.DataFrame
        Per family (index ``"family"``): ``HDI``, ``nuisance HDI``, ``signal overlap``, ``MSE``,
        ``SE``, ``vs best optimised``, ``paired SE``.
    """

    errors: dict[str, Tensor]
    best: str
    mse: dict[str, Comparison]
    vs_best: dict[str, Comparison]
    table: pd.DataFrame


def check_families(
    task: RegressionTask,
    families: Mapping[str, Tensor],
    *,
    n: int,
    replicates: int,
    points: int,
    bandwidth: float,
    seed: int,
    candidates: Sequence[str] | None = None,
) -> FamilyCheck:
    """Score head families on independent data, all on the same training sets and points (paired).

    The ``points`` evaluation points come from a generator seeded with ``seed`` (drawn in
    float64, used in float32), the ``replicates`` training sets of size ``n`` from one seeded
    with ``seed + 1`` anew for every family (so every family sees the same sets); the ensembles
    are simulated in float32 by :func:`nwlib.simulate` with the Gaussian kernel's ``bandwidth``,
    on the CPU.

    Parameters
    ----------
    task : RegressionTask
    families : mapping of str to Tensor, each (H, D, d_k)
        Orthonormal bases.
    n, replicates, points : int
        Training-set size, number of training sets (>= 2) and evaluation points (>= 2).
    bandwidth : float
        > 0.
    seed : int
    candidates : sequence of str, optional
        The families the best is picked from (default: all).

    Returns
    -------
    FamilyCheck
    """
    import pandas as pd

    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask, got {type(task).__name__}")
    if not isinstance(families, Mapping) or not families:
        raise TypeError("families must be a non-empty mapping of names to (H, D, d_k) bases")
    n = require_positive_int(n, "n")
    replicates = require_positive_int(replicates, "replicates", minimum=2)
    points = require_positive_int(points, "points", minimum=2)
    bandwidth = require_positive_finite(bandwidth, "bandwidth")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    candidates = list(families) if candidates is None else list(candidates)
    unknown = [c for c in candidates if c not in families]
    if unknown or not candidates:
        raise ValueError(f"candidates must name families, got {unknown or candidates}")
    z = torch.randn(points, task.embed_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    z = z.float()
    target = task.f(z)
    errors = {}
    for name, bases in families.items():
        pred = simulate(
            task,
            require_tensor(bases, f"families[{name!r}]", min_dim=3).float(),
            z,
            n=n,
            replicates=replicates,
            generator=torch.Generator().manual_seed(seed + 1),
            bandwidth=bandwidth,
        )
        errors[name] = (pred.mean(1) - target).pow(2).double()  # (training sets, points)
    best = min(candidates, key=lambda k: float(errors[k].mean()))
    mse = {name: crossed(e) for name, e in errors.items()}
    vs_best = {name: crossed(e, errors[best]) for name, e in errors.items()}
    shared = _signal_directions(task)
    table = pd.DataFrame(
        [
            {
                "family": name,
                "HDI": float(hdi(Q)),
                "nuisance HDI": nuisance_hdi(Q.double(), shared),
                "signal overlap": signal_overlap(Q, task.signal_dim),
                "MSE": mse[name].estimate,
                "SE": mse[name].se,
                "vs best optimised": vs_best[name].estimate,
                "paired SE": vs_best[name].se,
            }
            for name, Q in families.items()
        ]
    ).set_index("family")
    return FamilyCheck(errors, best, mse, vs_best, table)


def optimisation_summary(runs: Sequence[Mapping[str, Any]], nuisance: Sequence[float]) -> dict[str, Comparison]:
    """The restarts of one regime: where the HDI and the signal overlap start and end.

    Parameters
    ----------
    runs : sequence of dict
        :func:`optimisation_point` results, one per restart (at least two).
    nuisance : sequence of float
        The final bases' :func:`nuisance_hdi`, one per restart.

    Returns
    -------
    dict of str to Comparison
        ``"hdi start"``, ``"hdi end"``, ``"overlap start"``, ``"overlap end"``, ``"nuisance hdi"``
        (means over restarts) and ``"hdi change"`` (end minus start, paired by restart).
    """
    if len(runs) < 2 or len(nuisance) != len(runs):
        raise ValueError(
            f"runs must hold at least two restarts and nuisance one value per run, got {len(runs)} and {len(nuisance)}"
        )

    def at(key: str, index: int) -> Tensor:
        return torch.tensor([r[key][index] for r in runs], dtype=torch.float64)

    return {
        "hdi start": mean(at("hdi", 0)),
        "hdi end": mean(at("hdi", -1)),
        "overlap start": mean(at("signal_overlap", 0)),
        "overlap end": mean(at("signal_overlap", -1)),
        "nuisance hdi": mean(torch.tensor(list(nuisance), dtype=torch.float64)),
        "hdi change": paired(at("hdi", -1), at("hdi", 0)),
    }


# --- the large-n covariance formula ------------------------------------------------------

COVARIANCE_ANGLES: tuple[float, ...] = (0.0, math.pi / 8, math.pi / 4, 3 * math.pi / 8, math.pi / 2)
"""The principal angles (radians) at which :func:`covariance_check` simulates by default."""


def covariance_inflation(a: float, cos_theta: float) -> float:
    r"""The large-n noise covariance factor :math:`R(\theta)` of two one-dimensional Gaussian heads.

    .. math::
        R = \frac{(1+a)^2}{\sqrt{\big((1+a)^2 - a^2c^2\big)^2 - a^2c^2}},\qquad c = \cos\theta,\ a = 1/b^2,

    the limit of :math:`n\sum_i w^h_i(z)w^{h'}_i(z)` integrated over :math:`z \sim N(0, I)`
    for :math:`x, z \sim N(0, I)`; 1 at :math:`\theta = \pi/2`, :math:`(1+a)^{3/2}/\sqrt{1+3a}`
    at :math:`\theta = 0`.

    Parameters
    ----------
    a : float
        1/b², > 0.
    cos_theta : float
        In [0, 1].

    Returns
    -------
    float

    Examples
    --------
    >>> covariance_inflation(1.0, 0.0)
    1.0
    """
    a = require_positive_finite(a, "a")
    c = require_real(cos_theta, "cos_theta", minimum=0.0, maximum=1.0)
    return (1 + a) ** 2 / math.sqrt(((1 + a) ** 2 - a**2 * c**2) ** 2 - a**2 * c**2)


def covariance_exponent(a: float, cos_theta: float) -> np.ndarray:
    r"""The matrix B with :math:`\rho(z) \propto e^{-z^\top B z/2}`, for two unit directions at angle θ in R².

    With :math:`u = e_1`, :math:`w = (c, \sqrt{1-c^2})` and :math:`M = a(uu^\top + ww^\top)`,
    :math:`B = M(I+M)^{-1} - \frac{a}{1+a}(uu^\top + ww^\top)`. :math:`\rho(z)` has a finite
    second moment under :math:`z \sim N(0, I)` exactly when :math:`I + 2B` is positive definite.

    Parameters
    ----------
    a : float
        1/b², > 0.
    cos_theta : float
        In [0, 1].

    Returns
    -------
    numpy.ndarray, shape (2, 2), float64
    """
    a = require_positive_finite(a, "a")
    c = require_real(cos_theta, "cos_theta", minimum=0.0, maximum=1.0)
    u, w = np.array([1.0, 0.0]), np.array([c, math.sqrt(1 - c * c)])
    P = np.outer(u, u) + np.outer(w, w)
    M = a * P
    return M @ np.linalg.inv(np.eye(2) + M) - a / (1 + a) * P


@dataclass(frozen=True)
class CovarianceCheck:
    """The simulation of :func:`covariance_check`.

    Attributes
    ----------
    table : pandas.DataFrame
        Per angle: ``"theta (deg)"``, ``"simulated"``, ``"SE"`` (over designs), ``"R(theta)"``,
        ``"rel. error"`` (simulated / R − 1) and ``"finite variance"`` (``"yes"``/``"no"``).
    finite : list of Comparison
        The relative errors (mean over designs, SE) at the angles with finite variance.
    """

    table: pd.DataFrame
    finite: list[Comparison]


def covariance_check(
    bandwidth: float,
    *,
    n: int,
    points: int,
    designs: int,
    generator: torch.Generator,
    angles: Sequence[float] = COVARIANCE_ANGLES,
) -> CovarianceCheck:
    r"""Simulate :math:`n\sum_i w^h_i(z)w^{h'}_i(z)` for two one-dimensional Gaussian heads in R².

    For each angle θ and each of ``designs`` designs: n points :math:`x \sim N(0, I_2)`, then
    ``points`` points :math:`z \sim N(0, I_2)` (drawn in this order from ``generator``, in
    float64), NW weights of the heads :math:`e_1` and :math:`(\cos\theta, \sin\theta)` with the
    Gaussian kernel of ``bandwidth`` (:func:`nwlib.nadaraya_watson_weights`), and the mean over
    z; against :func:`covariance_inflation`. The variance over z is finite where
    :math:`I + 2B` (:func:`covariance_exponent`) is positive definite.

    Parameters
    ----------
    bandwidth : float
        b > 0.
    n, points : int
    designs : int
        >= 2 (the standard error is over designs).
    generator : torch.Generator
        On the CPU.
    angles : sequence of float, default :data:`COVARIANCE_ANGLES`
        In [0, π/2].

    Returns
    -------
    CovarianceCheck
    """
    import pandas as pd

    b = require_positive_finite(bandwidth, "bandwidth")
    n = require_positive_int(n, "n")
    points = require_positive_int(points, "points")
    designs = require_positive_int(designs, "designs", minimum=2)
    require_generator(generator, "cpu")
    a = 1 / b**2
    rows, finite = [], []
    for theta in angles:
        theta = require_real(theta, "angles", minimum=0.0, maximum=math.pi / 2)
        dirs = torch.tensor([[1.0, 0.0], [math.cos(theta), math.sin(theta)]], dtype=torch.float64)  # (2 heads, 2)
        by_design = []
        for _ in range(designs):
            x = torch.randn(n, 2, generator=generator, dtype=torch.float64)
            z = torch.randn(points, 2, generator=generator, dtype=torch.float64)
            w = nadaraya_watson_weights(
                (z @ dirs.T).T[..., None], (x @ dirs.T).T[..., None], kernel="gaussian", bandwidth=b
            )  # (2, m, n)
            by_design.append(float((n * (w[0] * w[1]).sum(-1)).mean()))
        c = min(max(math.cos(theta), 0.0), 1.0)
        limit = covariance_inflation(a, c)
        is_finite = bool(np.linalg.eigvalsh(covariance_exponent(a, c)).min() > -0.5)
        sims = torch.tensor(by_design, dtype=torch.float64)
        sim, rel = mean(sims), mean(sims / limit - 1)
        if is_finite:
            finite.append(rel)
        rows.append(
            {
                "theta (deg)": theta * 180 / math.pi,
                "simulated": sim.estimate,
                "SE": sim.se,
                "R(theta)": limit,
                "rel. error": rel.estimate,
                "finite variance": "yes" if is_finite else "no",
            }
        )
    return CovarianceCheck(pd.DataFrame(rows), finite)


def large_head_summary(runs: Mapping[int, Sequence[Mapping[str, Any]]], *, num_heads: int) -> pd.DataFrame:
    r"""The direct optimisation at several head sizes, against the predicted and the random HDI.

    Parameters
    ----------
    runs : mapping of int to sequence of dict
        For each head size d_k, the :func:`optimisation_point` results of its restarts (regime
        ``"ii"``, one signal direction, in :math:`D = (H + 1)d_k` dimensions).
    num_heads : int
        H.

    Returns
    -------
    pandas.DataFrame
        Index ``"d_k"``; columns ``"D"``, ``"random HDI"`` (:math:`1 - d_k/D`), ``"predicted HDI"``
        (:math:`(d_k - 1)/d_k`, :prf:ref:`prop-training-direction` with s = 1), and the means over
        restarts of ``"HDI start"``, ``"HDI lowest"`` (the lowest recorded), ``"HDI end"``,
        ``"overlap end"`` (:func:`signal_overlap` of e1), with ``"SE HDI end"``.
    """
    import pandas as pd

    H = require_positive_int(num_heads, "num_heads", minimum=2)
    if not isinstance(runs, Mapping) or not runs:
        raise TypeError("runs must be a non-empty mapping of head size to optimisation results")
    rows = []
    for k, results in runs.items():
        k = require_positive_int(k, "runs' head sizes", minimum=2)
        if len(results) < 2:
            raise ValueError(f"runs must hold at least two restarts per head size, got {len(results)} for d_k = {k}")
        D = (H + 1) * k
        end = mean(torch.tensor([r["hdi"][-1] for r in results], dtype=torch.float64))
        rows.append(
            {
                "d_k": k,
                "D": D,
                "random HDI": 1 - k / D,
                "predicted HDI": (k - 1) / k,
                "HDI start": float(np.mean([r["hdi"][0] for r in results])),
                "HDI lowest": float(np.mean([min(r["hdi"]) for r in results])),
                "HDI end": end.estimate,
                "SE HDI end": end.se,
                "overlap end": float(np.mean([r["signal_overlap"][-1] for r in results])),
            }
        )
    return pd.DataFrame(rows).set_index("d_k")


# --- tables for reading ---------------------------------------------------------------------------


def readable_table(frame: pd.DataFrame, *, digits: int = 3) -> pd.DataFrame:
    """:func:`nwlib.book.table` of a per-layer (or per-model) table whose columns may span magnitudes.

    :func:`~nwlib.book.table` gives every column the decimals that keep ``digits`` significant
    digits of its largest entry. A column whose nonzero magnitudes span more than a factor 10 (the
    decoder's literal index runs from −312 to 0.03) would lose its small entries that way: it keeps
    instead the decimals that give its smallest nonzero entry ``digits`` significant digits, at most
    ``digits`` decimals.

    Parameters
    ----------
    frame : pandas.DataFrame
        Numbers (and any other columns :func:`nwlib.book.table` accepts).
    digits : int, default 3

    Returns
    -------
    pandas.DataFrame
        Strings, the headers of :func:`nwlib.book.table`.
    """
    import pandas as pd
    from pandas.api import types

    from ..book import table

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    shown = table(frame, digits=digits)
    for position, column in enumerate(frame.columns):
        values = frame[column]
        if not types.is_float_dtype(values) or types.is_bool_dtype(values):
            continue
        sizes = [abs(float(v)) for v in values if math.isfinite(float(v)) and v != 0]
        if not sizes or max(sizes) < 10 * min(sizes) or max(sizes) >= 1e6:
            continue
        places = min(digits, max(0, digits - 1 - math.floor(math.log10(min(sizes)))))
        own_digits = places + 1 + math.floor(math.log10(max(sizes)))  # what table() needs for those decimals
        shown.iloc[:, position] = table(frame[[column]], digits=own_digits).iloc[:, 0].to_numpy()
    return shown


def bootstrap_table(boots: Mapping[str, Mapping[str, Sequence[Comparison]]]) -> pd.DataFrame:
    """Per model and statistic, the smallest and largest layer value and the largest SE, for reading.

    Parameters
    ----------
    boots : mapping of str to mapping of str to sequence of Comparison
        Per model, :func:`work_bootstrap`'s result (per statistic, one Comparison per layer).

    Returns
    -------
    pandas.DataFrame
        Index (model, statistic); columns ``"smallest"``, ``"largest"``, ``"largest SE"``, strings
        from :func:`nwlib.book.table`, each statistic with the decimals of its own magnitude (the
        two models share them).
    """
    import pandas as pd

    from ..book import table

    if not isinstance(boots, Mapping) or not boots:
        raise TypeError("boots must be a non-empty mapping of model names to work_bootstrap results")
    rows = {
        (model, key): {
            "smallest": min(c.estimate for c in cs),
            "largest": max(c.estimate for c in cs),
            "largest SE": max(c.se for c in cs),
        }
        for model, by_key in boots.items()
        for key, cs in by_key.items()
    }
    frame = pd.DataFrame(rows).T.rename_axis(["model", "statistic"])
    keys = list(dict.fromkeys(frame.index.get_level_values("statistic")))
    parts = [table(frame.xs(key, level="statistic", drop_level=False), se={}) for key in keys]  # no pairing
    return pd.concat(parts).reindex(frame.index)


def training_table(comparisons: Mapping[str, Mapping[str, Comparison]]) -> pd.DataFrame:
    """The training experiment for reading: rows the quantities, columns the tasks, "estimate ± SE" cells.

    Parameters
    ----------
    comparisons : mapping of str to mapping of str to Comparison
        Per task, :func:`training_comparisons`'s result.

    Returns
    -------
    pandas.DataFrame
        Strings from :func:`nwlib.book.table` (each estimate rounded by its own SE).
    """
    import pandas as pd

    from ..book import table

    if not isinstance(comparisons, Mapping) or not comparisons:
        raise TypeError("comparisons must be a non-empty mapping of task names to training_comparisons results")
    quantities = list(next(iter(comparisons.values())))
    frame = pd.DataFrame(
        {
            column: {task: getattr(by_quantity[q], part) for task, by_quantity in comparisons.items()}
            for q in quantities
            for column, part in ((q, "estimate"), (f"{q} SE", "se"))
        }
    )
    shown = table(frame, se={q: f"{q} SE" for q in quantities}, headers={q: q for q in quantities})
    return shown.T
