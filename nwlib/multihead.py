"""Multi-head attention written as an explicit ensemble of Nadaraya–Watson heads."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ._validation import require_positive_int, require_same_dtype_device, require_tensor
from .kernels import nadaraya_watson

__all__ = ["MultiHeadNW", "split_projection"]


def split_projection(weight: Tensor, num_heads: int) -> Tensor:
    r"""Split a projection's weight into per-head projections :math:`W^h`.

    A linear layer's weight of shape (num_heads · head_dim, in_features), as
    ``nn.Linear`` and ``nn.MultiheadAttention`` store it, produces head h's features
    with its rows h·head_dim … (h+1)·head_dim − 1. Head h's features of an input x are
    ``x @ split_projection(weight, num_heads)[h]``.

    Parameters
    ----------
    weight : Tensor, shape (num_heads * head_dim, in_features)
    num_heads : int
        H, which must divide the number of rows.

    Returns
    -------
    Tensor, shape (num_heads, in_features, head_dim)
        A view of ``weight`` (no copy), of its dtype and device.

    Examples
    --------
    >>> import torch
    >>> w = torch.arange(12.0).reshape(4, 3)  # 2 heads of dimension 2, 3 input features
    >>> split_projection(w, 2)[1].T  # rows 2 and 3
    tensor([[ 6.,  7.,  8.],
            [ 9., 10., 11.]])
    """
    weight = require_tensor(weight, "weight", min_dim=2)
    num_heads = require_positive_int(num_heads, "num_heads")
    if weight.dim() != 2 or weight.shape[0] % num_heads:
        raise ValueError(
            f"weight must have shape (num_heads * head_dim, in_features) with num_heads = {num_heads} dividing "
            f"its rows, got {tuple(weight.shape)}"
        )
    return weight.reshape(num_heads, weight.shape[0] // num_heads, weight.shape[1]).transpose(1, 2)


class MultiHeadNW(nn.Module):
    r"""H Nadaraya–Watson heads, each in its own projected space, combined linearly.

    Head h projects queries, keys and values with its own blocks
    :math:`W_Q^h, W_K^h, W_V^h` (``head_dim = embed_dim // num_heads`` columns
    each) and forms the exponential-kernel NW estimate
    :math:`\hat f_h(q) = \mathrm{softmax}(q W_Q^h (K W_K^h)^\top/\sqrt{d_h})\, V W_V^h`.
    The output is :math:`b_O + \sum_h \hat f_h(q)\, (W_O^h)^\top`, where
    :math:`W_O^h` are the columns of the output projection that belong to head
    h: the ensemble view of multi-head attention. With the weights of a
    :class:`torch.nn.MultiheadAttention` (see :meth:`from_torch`) the output
    equals that module's (dropout aside).

    Parameters
    ----------
    embed_dim : int
        Model dimension E; queries have E features.
    num_heads : int
        Number of heads H; must divide ``embed_dim``.
    bias : bool, default True
        (This and the following options are keyword-only: torch's third
        positional argument is ``dropout``, which this module does not have.)
        Whether the input and output projections have biases.
    kdim, vdim : int, optional
        Feature sizes of keys and values (default ``embed_dim``).
    batch_first : bool, default False
        As in :class:`torch.nn.MultiheadAttention`: batched inputs are (N, L, E)
        if True, (L, N, E) otherwise.
    device, dtype : optional
        Where and in which dtype to create the parameters.

    Notes
    -----
    Unlike :class:`torch.nn.MultiheadAttention`, :meth:`forward` returns only
    the output tensor (per-head estimates come from :meth:`head_outputs`), and
    there is no dropout, masking, ``bias_k``/``bias_v`` or ``add_zero_attn``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        require_positive_int(embed_dim, "embed_dim")
        require_positive_int(num_heads, "num_heads")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads must divide embed_dim: embed_dim={embed_dim}, num_heads={num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else require_positive_int(kdim, "kdim")
        self.vdim = embed_dim if vdim is None else require_positive_int(vdim, "vdim")
        self.batch_first = bool(batch_first)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
        self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
        self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
        if bias:
            self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as :class:`torch.nn.MultiheadAttention` does (Xavier-uniform, zero biases)."""
        for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadNW:
        """Build the ensemble with the weights of a :class:`torch.nn.MultiheadAttention`.

        Parameters
        ----------
        mha : torch.nn.MultiheadAttention
            Without ``add_bias_kv`` and ``add_zero_attn``. Its ``batch_first``,
            device and dtype are kept.

        Returns
        -------
        MultiHeadNW
            A module whose :meth:`forward` equals ``mha(q, k, v, need_weights=False)[0]``
            (in eval mode, or with ``dropout=0``) to floating-point tolerance.

        Raises
        ------
        TypeError
            If ``mha`` is not a :class:`torch.nn.MultiheadAttention`.
        ValueError
            If ``mha`` uses ``add_bias_kv`` or ``add_zero_attn``.

        Examples
        --------
        >>> import torch
        >>> from nwlib import MultiHeadNW
        >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
        >>> x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
        >>> torch.allclose(MultiHeadNW.from_torch(mha)(x, x, x), mha(x, x, x)[0], atol=1e-5)
        True
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.bias_k is not None or mha.bias_v is not None or mha.add_zero_attn:
            raise ValueError("mha with add_bias_kv or add_zero_attn has no NW-ensemble form here")
        weight = mha.out_proj.weight
        new = cls(
            mha.embed_dim,
            mha.num_heads,
            bias=mha.in_proj_bias is not None,
            kdim=mha.kdim,
            vdim=mha.vdim,
            batch_first=mha.batch_first,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            if mha.in_proj_weight is not None:
                w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
            else:
                w_q, w_k, w_v = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            new.q_proj_weight.copy_(w_q)
            new.k_proj_weight.copy_(w_k)
            new.v_proj_weight.copy_(w_v)
            if mha.in_proj_bias is not None:
                new.in_proj_bias.copy_(mha.in_proj_bias)
            new.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.out_proj.bias is not None:
                new.out_proj.bias.copy_(mha.out_proj.bias)
        return new

    @property
    def key_projections(self) -> Tensor:
        """Per-head key projections :math:`W_K^h`, shape (H, kdim, head_dim).

        Column block h of :math:`W_K^\\top`: head h's keys are ``key @ key_projections[h]``.
        """
        return split_projection(self.k_proj_weight, self.num_heads)

    def _to_batch_first(self, x: Tensor, name: str, features: int, batched: bool) -> Tensor:
        require_tensor(x, name, min_dim=2)
        if x.dim() != (3 if batched else 2):
            raise ValueError(
                f"{name} must be (L, {features}) unbatched or 3-D batched, and of the same rank "
                f"as query; got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != features:
            raise ValueError(f"{name} must have {features} features, got shape {tuple(x.shape)}")
        if batched and not self.batch_first:
            x = x.transpose(0, 1)
        return x if batched else x.unsqueeze(0)

    def _split_heads(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """(N, L, features) -> (N, H, L, head_dim)."""
        projected = torch.nn.functional.linear(x, weight, bias)
        n, length, _ = projected.shape
        return projected.view(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def head_outputs(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Each head's Nadaraya–Watson estimate, before the output projection.

        Parameters
        ----------
        query : Tensor, shape (L, E), or (N, L, E) / (L, N, E) by ``batch_first``
        key : Tensor, shape (S, kdim), or batched like ``query``
        value : Tensor, shape (S, vdim), or batched like ``query``

        Returns
        -------
        Tensor, shape (N, H, L, head_dim), or (H, L, head_dim) for unbatched input
            Head h's estimate :math:`\\hat f_h` at every query, always batch first.

        Raises
        ------
        TypeError, ValueError
            For non-tensors, wrong ranks or feature sizes, mismatched sequence
            lengths of ``key`` and ``value``, or mixed dtypes/devices.
        """
        require_tensor(query, "query", min_dim=2)
        batched = query.dim() == 3
        q = self._to_batch_first(query, "query", self.embed_dim, batched)
        k = self._to_batch_first(key, "key", self.kdim, batched)
        v = self._to_batch_first(value, "value", self.vdim, batched)
        require_same_dtype_device(self.q_proj_weight, "the module's parameters", query=q, key=k, value=v)
        if k.shape[:2] != v.shape[:2]:
            raise ValueError(
                f"key and value must have the same batch size and length, got {tuple(key.shape)} "
                f"and {tuple(value.shape)}"
            )
        if q.shape[0] != k.shape[0]:
            raise ValueError(
                f"query and key must have the same batch size, got {tuple(query.shape)} and {tuple(key.shape)}"
            )
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        heads = nadaraya_watson(
            self._split_heads(q, self.q_proj_weight, b_q),
            self._split_heads(k, self.k_proj_weight, b_k),
            self._split_heads(v, self.v_proj_weight, b_v),
            kernel="exp",
            bandwidth=math.sqrt(math.sqrt(self.head_dim)),
        )
        return heads if batched else heads.squeeze(0)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """The weighted sum of the heads' estimates through the output projection.

        Parameters
        ----------
        query, key, value : Tensor
            As in :meth:`head_outputs`.

        Returns
        -------
        Tensor, shape like ``query`` (same ``batch_first`` layout)
            :math:`b_O + \\sum_h \\hat f_h W_O^{h\\top}`.
        """
        heads = self.head_outputs(query, key, value)  # (N, H, L, dh) or (H, L, dh)
        w_o = self.out_proj.weight.view(self.embed_dim, self.num_heads, self.head_dim)
        out = torch.einsum("...hld,ehd->...le", heads, w_o)
        if self.out_proj.bias is not None:
            out = out + self.out_proj.bias
        if query.dim() == 3 and not self.batch_first:
            out = out.transpose(0, 1)
        return out
