r"""Training multi-head attention, and optimising head subspaces, while watching their diversity.

Two experiments of the book's chapter on trained heads live here.

*Training an attention regressor.* :class:`InContextTask` draws prompts: n
context tokens :math:`(x_i, y_i)` with :math:`y_i = f(x_i) + \sigma\varepsilon_i`
and m query inputs :math:`x` without their response. :class:`AttentionRegressor`
is one :class:`nwlib.MultiHeadNW` layer whose queries are the query inputs,
whose keys are the context inputs and whose values are the context responses,
followed by a linear read-out: its prediction is
:math:`c + \sum_h \alpha_h \hat f_h(x)`, an ensemble of H exponential-kernel
Nadaraya–Watson heads, head h smoothing the responses in its own key subspace
:math:`\mathrm{Range}(W_K^h)`, with learned weights
:math:`\alpha_h = r^\top W_O^h w_V^h`. :func:`train_regressor` trains it with
Adam (seeded, deterministic on the CPU), optionally with an
:func:`orthogonality_penalty` on the key projections, and records the heads'
diversity and the test error along the way (:class:`TrainingHistory`).

*Optimising the subspaces directly.* :func:`ensemble_mse` is a differentiable
Monte Carlo estimate of the integrated MSE of H Gaussian-kernel NW heads
averaged with equal weights (the setting of chapter 3), and
:func:`optimise_subspaces` minimises it over orthonormal head bases
parametrised by the QR factor of free matrices, optionally with a block of
directions that every head must keep.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .._seeds import require_seed
from .._validation import (
    require_choice,
    require_dtype,
    require_generator,
    require_positive_finite,
    require_positive_int,
    require_real,
    require_same_dtype_device,
    require_tensor,
)
from ..kernels import nadaraya_watson
from ..multihead import MultiHeadNW, split_projection
from ..subspaces import hdi, pairwise_overlap, sign_fixed_qr
from ..tasks import DRAW_DTYPE, RegressionTask

__all__ = [
    "AttentionRegressor",
    "InContextTask",
    "OptimisationHistory",
    "PENALTIES",
    "VALUES",
    "Prompts",
    "TrainingHistory",
    "ensemble_mse",
    "head_correlation",
    "optimise_subspaces",
    "orthogonality_penalty",
    "orthonormal_heads",
    "train_regressor",
]

PENALTIES: tuple[str, ...] = ("subspace", "gram")
"""Kinds accepted by :func:`orthogonality_penalty`."""

VALUES: tuple[str, ...] = ("response", "token")
"""What an :class:`AttentionRegressor`'s values are: the responses :math:`y_i` alone, or the whole
token :math:`(x_i, y_i)` (token-dependent values :math:`W_V^\top (x_i, y_i)`, as in a transformer)."""


@dataclass(frozen=True)
class Prompts:
    """A batch of in-context regression prompts.

    Attributes
    ----------
    x_context : Tensor, shape (B, n, D)
    y_context : Tensor, shape (B, n)
        Noisy responses of the context inputs.
    x_query : Tensor, shape (B, m, D)
    y_query : Tensor, shape (B, m)
        Noisy responses at the queries (the training target).
    f_query : Tensor, shape (B, m)
        The true function at the queries (the test target).
    """

    x_context: Tensor
    y_context: Tensor
    x_query: Tensor
    y_query: Tensor
    f_query: Tensor


@dataclass(frozen=True)
class InContextTask:
    r"""Prompts of an in-context regression problem with :math:`x \sim N(0, I_D)`.

    The regression function is
    :math:`f(x) = s^{-1/2} \sum_{j < s} \sin(\omega x_j)`: additive over the first
    s = ``signal_dim`` coordinates, the others being nuisance directions.

    Attributes
    ----------
    embed_dim : int
        D.
    signal_dim : int
        s, with 1 <= s <= D.
    frequency : float, default 1.0
        :math:`\omega > 0`.
    noise_sd : float, default 0.5
        :math:`\sigma \ge 0`.
    """

    embed_dim: int
    signal_dim: int
    frequency: float = 1.0
    noise_sd: float = 0.5

    def __post_init__(self) -> None:
        require_positive_int(self.embed_dim, "embed_dim")
        require_positive_int(self.signal_dim, "signal_dim")
        if self.signal_dim > self.embed_dim:
            raise ValueError(f"signal_dim must be <= embed_dim = {self.embed_dim}, got {self.signal_dim}")
        require_positive_finite(self.frequency, "frequency")
        require_real(self.noise_sd, "noise_sd", minimum=0.0)

    def f(self, x: Tensor) -> Tensor:
        """The regression function at x of shape (..., D); returns shape (...)."""
        x = require_tensor(x, "x", min_dim=1)
        if x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must have last dimension D = {self.embed_dim}, got shape {tuple(x.shape)}")
        s = self.signal_dim
        return torch.sin(self.frequency * x[..., :s]).sum(-1) / math.sqrt(s)

    def sample(
        self,
        batch_size: int,
        context: int,
        queries: int,
        *,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
    ) -> Prompts:
        """Draw ``batch_size`` prompts of ``context`` tokens and ``queries`` queries.

        Inputs first, then noise, in float64 and then cast (as :meth:`nwlib.RegressionTask.sample`).

        Returns
        -------
        Prompts
            On the generator's device.
        """
        B = require_positive_int(batch_size, "batch_size")
        n = require_positive_int(context, "context")
        m = require_positive_int(queries, "queries")
        require_generator(generator)
        dtype = require_dtype(dtype)
        dev = generator.device
        x = torch.randn(B, n + m, self.embed_dim, generator=generator, dtype=DRAW_DTYPE, device=dev)
        eps = torch.randn(B, n + m, generator=generator, dtype=DRAW_DTYPE, device=dev)
        fx = self.f(x)
        y = fx + self.noise_sd * eps
        x, y, fx = x.to(dtype), y.to(dtype), fx.to(dtype)
        return Prompts(x[:, :n], y[:, :n], x[:, n:], y[:, n:], fx[:, n:])


class AttentionRegressor(nn.Module):
    r"""One multi-head attention layer that predicts a query's response from a context.

    Queries are the query inputs x (D features), keys the context inputs
    :math:`x_i`, values the context responses :math:`y_i` (one feature). With
    :math:`D = H d_k` every head has a :math:`D\times d_k` key projection. The
    prediction is ``readout(MultiHeadNW(x, X, y))``, i.e.

    .. math:: \hat y(x) = c + \sum_h \alpha_h \hat f_h(x),\qquad
              \hat f_h(x) = \frac{\sum_i e^{\langle q_h(x), k_h(x_i)\rangle/\sqrt{d_k}}\, y_i}
              {\sum_i e^{\langle q_h(x), k_h(x_i)\rangle/\sqrt{d_k}}},

    with :math:`q_h(x) = W_Q^{h\top} x + b_Q^h`, :math:`k_h(x_i) = W_K^{h\top} x_i + b_K^h` and
    :math:`\alpha_h = r^\top W_O^h w_V^h` (and the value bias folded into c).

    Parameters
    ----------
    embed_dim : int
        D.
    num_heads : int
        H, dividing D.
    generator : torch.Generator
        Seeds the initialisation: Xavier-uniform projections (as
        :class:`torch.nn.MultiheadAttention`), zero biases, a Xavier-uniform read-out.
    dtype : torch.dtype, default torch.float32
    device : optional
        Default: the generator's device.
    values : {"response", "token"}, default "response"
        ``"response"``: the values are the responses :math:`y_i` (``vdim = 1``), so that every
        head is an NW smoother of the responses. ``"token"``: the values are the whole tokens
        :math:`(x_i, y_i)` (``vdim = D + 1``), so that a head returns
        :math:`W_V^{h\top}` applied to the NW average of the tokens, as in a transformer layer.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        values: str = "response",
    ) -> None:
        super().__init__()
        require_generator(generator)
        self.values = require_choice(values, "values", VALUES)
        device = generator.device if device is None else torch.device(device)
        vdim = 1 if self.values == "response" else embed_dim + 1
        self.attention = MultiHeadNW(embed_dim, num_heads, vdim=vdim, batch_first=True, dtype=dtype, device=device)
        self.readout = nn.Linear(embed_dim, 1, dtype=dtype, device=device)
        with torch.no_grad():
            a = self.attention
            for w in (a.q_proj_weight, a.k_proj_weight, a.v_proj_weight, a.out_proj.weight, self.readout.weight):
                nn.init.xavier_uniform_(w, generator=generator)
            a.in_proj_bias.zero_()
            a.out_proj.bias.zero_()
            self.readout.bias.zero_()

    @property
    def key_projections(self) -> Tensor:
        """:math:`W_K^h`, shape (H, D, d_k)."""
        return self.attention.key_projections

    @property
    def query_projections(self) -> Tensor:
        """:math:`W_Q^h`, shape (H, D, d_k)."""
        a = self.attention
        return split_projection(a.q_proj_weight, a.num_heads)

    def head_weights(self) -> Tensor:
        r""":math:`\alpha_h = r^\top W_O^h w_V^h`, shape (H,): how much each head's NW estimate of y enters.

        With token values, :math:`w_V^h` is the column of :math:`W_V^h` that maps the response.
        """
        a = self.attention
        w_o = a.out_proj.weight.view(a.embed_dim, a.num_heads, a.head_dim)  # (D, H, d_k)
        w_v = a.v_proj_weight[:, -1].reshape(a.num_heads, a.head_dim)  # (H, d_k): the value map of y
        return torch.einsum("d,dhk,hk->h", self.readout.weight[0], w_o, w_v)

    def _value_inputs(self, x_context: Tensor, y_context: Tensor) -> Tensor:
        y = y_context.unsqueeze(-1)
        return y if self.values == "response" else torch.cat([x_context, y], dim=-1)

    def head_contributions(self, x_context: Tensor, y_context: Tensor, x_query: Tensor) -> Tensor:
        """Each head's term :math:`r^\\top W_O^h \\mathrm{head}_h(x)` of the prediction, shape (B, H, m).

        The prediction is their sum plus the constant ``readout(b_O) + readout.bias``.
        """
        a = self.attention
        heads = a.head_outputs(x_query, x_context, self._value_inputs(x_context, y_context))  # (B, H, m, d_k)
        w_o = a.out_proj.weight.view(a.embed_dim, a.num_heads, a.head_dim)
        return torch.einsum("bhmk,dhk,d->bhm", heads, w_o, self.readout.weight[0])

    def forward(self, x_context: Tensor, y_context: Tensor, x_query: Tensor) -> Tensor:
        """Predictions at the queries, shape (B, m)."""
        return self.readout(self.attention(x_query, x_context, self._value_inputs(x_context, y_context))).squeeze(-1)


def orthonormal_heads(free: Tensor, shared: Tensor | None = None) -> Tensor:
    r"""Orthonormal head bases from free matrices, smoothly (QR), optionally around a shared block.

    Parameters
    ----------
    free : Tensor, shape (H, D, r)
        Unconstrained parameters, of full column rank.
    shared : Tensor, shape (D, s), optional
        Orthonormal columns that every head contains. The free part is first
        projected onto their orthogonal complement.

    Returns
    -------
    Tensor, shape (H, D, s + r)
        :math:`Q_h = [S, \mathrm{qr}((I - SS^\top) A_h)]`, orthonormal; differentiable in ``free``.
        The QR factor's columns are sign-fixed (positive diagonal of R), so the map is smooth.
    """
    free = require_tensor(free, "free", min_dim=3)
    if free.dim() != 3:
        raise ValueError(f"free must have shape (H, D, r), got {tuple(free.shape)}")
    A = free
    if shared is not None:
        shared = require_tensor(shared, "shared", min_dim=2)
        require_same_dtype_device(free, "free", shared=shared)
        if shared.dim() != 2 or shared.shape[0] != free.shape[1]:
            raise ValueError(f"shared must have shape (D, s) with D = {free.shape[1]}, got {tuple(shared.shape)}")
        if shared.shape[1] + free.shape[2] > free.shape[1]:
            raise ValueError("shared and free columns together must not exceed D")
        A = A - shared @ (shared.mT @ A)
    Q = sign_fixed_qr(A)
    if shared is None:
        return Q
    return torch.cat([shared.expand(free.shape[0], -1, -1), Q], dim=-1)


def orthogonality_penalty(projections: Tensor, *, kind: str = "subspace") -> Tensor:
    r"""Sum over pairs of heads of their squared overlap, a differentiable regulariser.

    Parameters
    ----------
    projections : Tensor, shape (..., H, D, d_k)
        Head projections :math:`W_h`.
    kind : {"subspace", "gram"}, default "subspace"
        ``"subspace"``: :math:`\sum_{h<h'} \lVert Q_h^\top Q_{h'}\rVert_F^2` with
        :math:`Q_h` the orthonormal QR factor of :math:`W_h` (scale-invariant; 0
        exactly for pairwise orthogonal ranges; equals
        :math:`\binom H2 d_k (1 - \mathrm{HDI})`). ``"gram"``:
        :math:`\sum_{h<h'} \lVert W_h^\top W_{h'}\rVert_F^2` (the paper's
        :math:`d_k^2\lVert G_{hh'}\rVert_F^2`; it can also be lowered by shrinking the weights).

    Returns
    -------
    Tensor, shape (...)

    Raises
    ------
    TypeError, ValueError
        On a non-floating tensor, fewer than two heads, or an unknown ``kind``.
    """
    kind = require_choice(kind, "kind", PENALTIES)
    P = require_tensor(projections, "projections", min_dim=3)
    if P.shape[-3] < 2:
        raise ValueError(f"projections must hold at least two heads, got shape {tuple(P.shape)}")
    X = torch.linalg.qr(P).Q if kind == "subspace" else P
    overlap = pairwise_overlap(X)
    off = overlap.sum((-2, -1)) - overlap.diagonal(dim1=-2, dim2=-1).sum(-1)
    return off / 2


def head_correlation(contributions: Tensor) -> Tensor:
    """Mean correlation over pairs of heads of their contributions across all queries.

    Parameters
    ----------
    contributions : Tensor, shape (B, H, m)
        As from :meth:`AttentionRegressor.head_contributions`.

    Returns
    -------
    Tensor, shape ()
        The mean of the off-diagonal entries of the H x H correlation matrix of the
        flattened (B·m) contributions; NaN if a head's contribution is constant.
    """
    c = require_tensor(contributions, "contributions", min_dim=3)
    H = c.shape[1]
    if H < 2:
        raise ValueError("contributions must hold at least two heads")
    flat = c.transpose(0, 1).reshape(H, -1)
    corr = torch.corrcoef(flat)
    return (corr.sum() - corr.diagonal().sum()) / (H * (H - 1))


@dataclass
class TrainingHistory:
    """What :func:`train_regressor` records at every evaluation step (one entry per evaluation).

    Attributes
    ----------
    step : list of int
        Optimiser steps done (0 = the initialisation).
    train_loss : list of float
        Mean training loss (squared error on noisy responses, penalty excluded) since
        the previous evaluation (NaN at step 0).
    test_mse : list of float
        Mean squared error against the true f on a fixed test set of prompts drawn
        from a generator of its own (never trained on).
    hdi_key, hdi_query : list of float
        Invariant HDI of the key and query projections.
    head_correlation : list of float
        Mean pairwise correlation of the heads' contributions on the test set.
    head_weights : list of list of float
        :meth:`AttentionRegressor.head_weights` at each evaluation.
    val_mse : list of float
        Mean squared error against the noisy responses on a fixed validation set of prompts
        (a generator of its own, neither trained nor tested on): what early stopping watches.
    best_index : int
        The evaluation whose model :func:`train_regressor` returns: the one with the lowest
        validation MSE under early stopping, the last one without it.
    """

    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_mse: list[float] = field(default_factory=list)
    hdi_key: list[float] = field(default_factory=list)
    hdi_query: list[float] = field(default_factory=list)
    head_correlation: list[float] = field(default_factory=list)
    head_weights: list[list[float]] = field(default_factory=list)
    val_mse: list[float] = field(default_factory=list)
    best_index: int = -1


def train_regressor(
    task: InContextTask,
    *,
    num_heads: int,
    steps: int,
    batch_size: int = 32,
    context: int = 64,
    queries: int = 16,
    lr: float = 1e-2,
    penalty: float = 0.0,
    penalty_kind: str = "subspace",
    seed: int = 0,
    eval_every: int = 50,
    test_prompts: int = 256,
    patience: int | None = None,
    values: str = "response",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[AttentionRegressor, TrainingHistory]:
    r"""Train an :class:`AttentionRegressor` with Adam on fresh prompts at every step.

    The loss is the mean squared error against the noisy query responses plus
    ``penalty`` times :func:`orthogonality_penalty` of the key projections.
    Four generators derived from ``seed`` keep initialisation, training draws,
    the test set and the validation set apart: ``seed`` initialises the model,
    ``seed + 1`` draws the training prompts, ``seed + 2`` the test prompts and
    ``seed + 3`` the validation prompts, so runs that differ only in ``penalty``
    see the same initialisation and the same data (paired comparisons), and the
    test set is independent of the training and validation data.

    *Early stopping* (Prechelt, 1998): with ``patience`` set, training stops when the
    validation MSE has not improved for ``patience`` evaluations in a row (or at
    ``steps``), and the model of the best evaluation is restored and returned
    (``history.best_index``); the test set plays no part in the choice.

    Parameters
    ----------
    task : InContextTask
    num_heads : int
        H; must divide ``task.embed_dim``.
    steps : int
        Optimiser steps (>= 1); the most that are taken under early stopping.
    batch_size, context, queries : int
        Prompts per step, context tokens and queries per prompt.
    lr : float, default 1e-2
        Adam's learning rate.
    penalty : float, default 0.0
        Weight of the orthogonality penalty (>= 0).
    penalty_kind : {"subspace", "gram"}, default "subspace"
    seed : int, default 0
    eval_every : int, default 50
        Evaluate at step 0, every ``eval_every`` steps and at the end.
    test_prompts : int, default 256
        Size of the fixed test set, and of the validation set.
    patience : int, optional
        Early stopping's patience in evaluations (>= 1); None trains for ``steps`` steps and
        returns the last model.
    values : {"response", "token"}, default "response"
        :class:`AttentionRegressor`'s values.
    dtype : torch.dtype, default torch.float32
    device : torch.device or str, default "cpu"

    Returns
    -------
    model : AttentionRegressor
        The trained model (eval mode).
    history : TrainingHistory

    Raises
    ------
    TypeError, ValueError
        On invalid arguments (each names the argument).

    Notes
    -----
    On the CPU two calls with the same arguments give identical histories (the
    attention kernel, Adam and the draws are deterministic there).
    """
    if not isinstance(task, InContextTask):
        raise TypeError(f"task must be an InContextTask, got {type(task).__name__}")
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    if task.embed_dim % H:
        raise ValueError(f"num_heads must divide task.embed_dim = {task.embed_dim}, got {H}")
    steps = require_positive_int(steps, "steps")
    eval_every = require_positive_int(eval_every, "eval_every")
    require_positive_int(test_prompts, "test_prompts")
    lr = require_positive_finite(lr, "lr")
    penalty = require_real(penalty, "penalty", minimum=0.0)
    require_choice(penalty_kind, "penalty_kind", PENALTIES)
    if patience is not None:
        patience = require_positive_int(patience, "patience")
    seed = require_seed(seed)
    dtype = require_dtype(dtype)
    device = torch.device(device)
    model = AttentionRegressor(
        task.embed_dim, H, generator=torch.Generator(device=device).manual_seed(seed), dtype=dtype, values=values
    )
    g_train = torch.Generator(device=device).manual_seed(seed + 1)

    def fixed_set(offset: int) -> Prompts:
        g = torch.Generator(device=device).manual_seed(seed + offset)
        return task.sample(test_prompts, context, queries, generator=g, dtype=dtype)

    test, val = fixed_set(2), fixed_set(3)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = TrainingHistory()
    running: list[float] = []

    def evaluate(step: int) -> None:
        with torch.no_grad():
            pred = model(test.x_context, test.y_context, test.x_query)
            contrib = model.head_contributions(test.x_context, test.y_context, test.x_query)
            history.step.append(step)
            history.train_loss.append(sum(running) / len(running) if running else math.nan)
            history.test_mse.append(float((pred - test.f_query).pow(2).mean()))
            history.hdi_key.append(float(hdi(model.key_projections.double())))
            history.hdi_query.append(float(hdi(model.query_projections.double())))
            history.head_correlation.append(float(head_correlation(contrib.double())))
            history.head_weights.append(model.head_weights().double().tolist())
            v = model(val.x_context, val.y_context, val.x_query)
            history.val_mse.append(float((v - val.y_query).pow(2).mean()))
        running.clear()

    evaluate(0)
    best = (history.val_mse[0], 0, copy.deepcopy(model.state_dict()))
    model.train()
    for step in range(1, steps + 1):
        batch = task.sample(batch_size, context, queries, generator=g_train, dtype=dtype)
        pred = model(batch.x_context, batch.y_context, batch.x_query)
        loss = (pred - batch.y_query).pow(2).mean()
        total = loss + penalty * orthogonality_penalty(model.key_projections, kind=penalty_kind) if penalty else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        running.append(float(loss.detach()))
        if step % eval_every == 0 or step == steps:
            evaluate(step)
            if patience is None:
                continue
            if history.val_mse[-1] < best[0]:
                best = (history.val_mse[-1], len(history.step) - 1, copy.deepcopy(model.state_dict()))
            elif len(history.step) - 1 - best[1] >= patience:
                break
    if patience is None:
        history.best_index = len(history.step) - 1
    else:
        history.best_index = best[1]
        model.load_state_dict(best[2])
    return model.eval(), history


def ensemble_mse(
    key_projections: Tensor,
    task: RegressionTask,
    x: Tensor,
    y: Tensor,
    eval_points: Tensor,
    *,
    bandwidth: float | Tensor,
) -> Tensor:
    r"""Differentiable Monte Carlo estimate of the integrated MSE of equally weighted Gaussian NW heads.

    Head h regresses y on :math:`Q_h^\top x` with a Gaussian kernel of bandwidth h;
    the ensemble is the mean over heads, and the estimate is the mean over
    training sets and evaluation points of :math:`(\bar f(z) - f(z))^2`, the
    quantity :func:`nwlib.simulate` and :func:`nwlib.decompose` estimate without
    gradients.

    Parameters
    ----------
    key_projections : Tensor, shape (H, D, d_k)
    task : RegressionTask
        Supplies f.
    x : Tensor, shape (R, n, D)
        Training inputs of R training sets (shared by the heads).
    y : Tensor, shape (R, n)
    eval_points : Tensor, shape (m, D)
    bandwidth : float or Tensor of shape () or (H,)

    Returns
    -------
    Tensor, shape ()
        Differentiable in ``key_projections`` (and in a tensor ``bandwidth``).
    """
    W = require_tensor(key_projections, "key_projections", min_dim=3)
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask, got {type(task).__name__}")
    x = require_tensor(x, "x", min_dim=3)
    y = require_tensor(y, "y", min_dim=2)
    z = require_tensor(eval_points, "eval_points", min_dim=2)
    require_same_dtype_device(W, "key_projections", x=x, y=y, eval_points=z)
    if W.dim() != 3 or x.dim() != 3 or y.shape != x.shape[:2] or z.dim() != 2:
        raise ValueError(
            "shapes must be key_projections (H, D, d_k), x (R, n, D), y (R, n), eval_points (m, D); got "
            f"{tuple(W.shape)}, {tuple(x.shape)}, {tuple(y.shape)}, {tuple(z.shape)}"
        )
    if not (W.shape[1] == x.shape[2] == z.shape[1] == task.embed_dim):
        raise ValueError(f"key_projections, x and eval_points must all have D = task.embed_dim = {task.embed_dim}")
    keys = torch.einsum("rnd,hdk->rhnk", x, W)
    queries = torch.einsum("md,hdk->hmk", z, W)
    # A bandwidth of shape (H,) broadcasts over the trailing batch dimension, the heads.
    pred = nadaraya_watson(queries, keys, y.unsqueeze(1), kernel="gaussian", bandwidth=bandwidth)  # (R, H, m)
    return (pred.mean(1) - task.f(z)).pow(2).mean()


@dataclass
class OptimisationHistory:
    """What :func:`optimise_subspaces` records (one entry per recorded step).

    Attributes
    ----------
    step : list of int
    objective : list of float
        The Monte Carlo objective of the step (fresh data at every step, so noisy).
    hdi : list of float
        Invariant HDI of the current bases.
    signal_overlap : list of float
        Mean over heads of :math:`\\lVert Q_h^\\top S\\rVert_F^2 / s`, how much of the
        signal subspace S (the task's first ``signal_dim`` coordinates) each head contains.
    """

    step: list[int] = field(default_factory=list)
    objective: list[float] = field(default_factory=list)
    hdi: list[float] = field(default_factory=list)
    signal_overlap: list[float] = field(default_factory=list)


def optimise_subspaces(
    task: RegressionTask,
    *,
    num_heads: int,
    head_dim: int,
    n: int,
    steps: int,
    replicates: int = 16,
    eval_size: int = 64,
    bandwidth: float,
    shared: Tensor | None = None,
    init: Tensor | None = None,
    lr: float = 0.05,
    seed: int = 0,
    record_every: int = 10,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, OptimisationHistory]:
    r"""Minimise :func:`ensemble_mse` over orthonormal head bases with Adam.

    Each step draws ``replicates`` fresh training sets of size ``n`` and
    ``eval_size`` fresh evaluation points from the design (stochastic
    optimisation of the integrated MSE), with a generator seeded by ``seed``.

    Parameters
    ----------
    task : RegressionTask
    num_heads, head_dim : int
        H and d_k.
    n : int
        Training-set size.
    steps : int
    replicates, eval_size : int
        Monte Carlo sizes per step.
    bandwidth : float
        The Gaussian kernel's bandwidth (fixed).
    shared : Tensor, shape (D, s), optional
        Orthonormal directions that every head keeps (see :func:`orthonormal_heads`);
        the optimisation then moves only the other d_k - s columns.
    init : Tensor, shape (H, D, d_k - s), optional
        Starting free parameters (default: Gaussian, from the generator).
    lr : float, default 0.05
    seed : int, default 0
    record_every : int, default 10
    dtype : torch.dtype, default torch.float64

    Returns
    -------
    bases : Tensor, shape (H, D, d_k)
        The final orthonormal bases (detached).
    history : OptimisationHistory
    """
    if not isinstance(task, RegressionTask):
        raise TypeError(f"task must be a RegressionTask, got {type(task).__name__}")
    H = require_positive_int(num_heads, "num_heads", minimum=2)
    k = require_positive_int(head_dim, "head_dim")
    n = require_positive_int(n, "n")
    steps = require_positive_int(steps, "steps")
    R = require_positive_int(replicates, "replicates")
    m = require_positive_int(eval_size, "eval_size")
    record_every = require_positive_int(record_every, "record_every")
    bandwidth = require_positive_finite(bandwidth, "bandwidth")
    lr = require_positive_finite(lr, "lr")
    dtype = require_dtype(dtype)
    D = task.embed_dim
    s = 0 if shared is None else shared.shape[-1]
    if k - s < 1 or k > D:
        raise ValueError(f"head_dim must satisfy shared columns < head_dim <= D, got head_dim={k}, s={s}, D={D}")
    gen = torch.Generator().manual_seed(seed)
    if init is None:
        free = torch.randn(H, D, k - s, generator=gen, dtype=dtype)
    else:
        free = require_tensor(init, "init").detach().clone().to(dtype)
        if free.shape != (H, D, k - s):
            raise ValueError(f"init must have shape (H, D, d_k - s) = {(H, D, k - s)}, got {tuple(free.shape)}")
    free.requires_grad_(True)
    signal = torch.eye(D, dtype=dtype)[:, : task.signal_dim]
    opt = torch.optim.Adam([free], lr=lr)
    history = OptimisationHistory()
    for step in range(steps + 1):
        Q = orthonormal_heads(free, shared)
        x, y = task.sample((R,), n, generator=gen, dtype=dtype)
        z = torch.randn(m, D, generator=gen, dtype=DRAW_DTYPE).to(dtype)
        loss = ensemble_mse(Q, task, x, y, z, bandwidth=bandwidth)
        if step % record_every == 0 or step == steps:
            with torch.no_grad():
                history.step.append(step)
                history.objective.append(float(loss))
                history.hdi.append(float(hdi(Q)))
                history.signal_overlap.append(float((Q.mT @ signal).pow(2).sum((-2, -1)).mean() / task.signal_dim))
        if step == steps:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return orthonormal_heads(free, shared).detach(), history
