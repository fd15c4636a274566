r"""Combining heads: held-out checks, paired comparisons and the shared-data covariance split.

Tools for the chapter on Theorem 3.1 that the Monte Carlo engine lacks:

* :func:`paired_difference` compares two combinations evaluated on the same replicates (the same
  training sets), where the standard error of the difference is much smaller than the two
  standard errors combined;
* :func:`grouped_jackknife` gives a standard error for any statistic of Monte Carlo replicates
  (a ratio of covariances, a prediction made from one batch) by deleting groups of replicates;
* :func:`equicorrelation` summarises one batch of H heads (or of any ensemble's members) by the
  numbers of the equicorrelated model, :math:`b^2`, :math:`\bar V` and :math:`\rho = \bar C/\bar V`,
  with delete-one jackknife standard errors, and predicts the variance and MSE of the uniform
  average of any number of such members, :math:`b^2 + \bar V(\rho + (1-\rho)/H)`, to be checked
  on another batch;
* :func:`conditional_moments` and :func:`covariance_split` split the heads' covariance by the law
  of total covariance into a *noise part* :math:`\E_X[\sigma^2\sum_i w^h_i w^{h'}_i]` (the shared-data
  floor, non-negative for Nadaraya–Watson weights) and a *design part*
  :math:`\operatorname{Cov}_X(\E[\hat f_h \mid X], \E[\hat f_{h'} \mid X])`, from the weight matrices
  of a sample of designs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from ._jackknife import jackknife_se
from ._validation import (
    require_positive_int,
    require_predictions_target,
    require_same_dtype_device,
    require_tensor,
)
from .decomposition import decompose, noise_covariance

__all__ = [
    "CovarianceSplit",
    "Equicorrelation",
    "JackknifeEstimate",
    "PairedDifference",
    "conditional_moments",
    "covariance_split",
    "equicorrelation",
    "grouped_jackknife",
    "paired_difference",
]


class PairedDifference(NamedTuple):
    """Mean of per-replicate differences and its standard error (see :func:`paired_difference`)."""

    mean: Tensor
    """(...) mean over replicates of ``a - b``."""
    se: Tensor
    """(...) standard deviation of ``a - b`` over replicates (R − 1 denominator), over √R."""


def paired_difference(a: Tensor, b: Tensor) -> PairedDifference:
    r"""Compare two quantities measured on the same Monte Carlo replicates.

    When two combinations of heads (or two settings) are evaluated on the same training sets,
    their per-replicate errors are correlated, and the standard error of the difference of their
    means is that of the per-replicate differences, not the two standard errors combined.

    Parameters
    ----------
    a, b : Tensor, shape (..., R)
        Per-replicate values (e.g. from :func:`nwlib.replicate_mse`), replicate r of ``a`` and of
        ``b`` computed from the same training set; R >= 2.

    Returns
    -------
    PairedDifference
        ``mean`` and ``se``, shape (...).

    Raises
    ------
    TypeError
        If an input is not a floating tensor or the dtypes differ.
    ValueError
        If the shapes differ, R < 2, or the devices differ.

    Examples
    --------
    >>> import torch
    >>> a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    >>> d = paired_difference(a, a - torch.tensor([0.5, 0.7, 0.5, 0.3], dtype=torch.float64))
    >>> round(float(d.mean), 6), round(float(d.se), 6)
    (0.5, 0.08165)
    """
    a = require_tensor(a, "a", min_dim=1)
    b = require_tensor(b, "b", min_dim=1)
    require_same_dtype_device(a, "a", b=b)
    if a.shape != b.shape:
        raise ValueError(f"b must have the shape of a, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.shape[-1] < 2:
        raise ValueError(f"a must have R >= 2 replicates in its last dimension, got shape {tuple(a.shape)}")
    d = a - b
    return PairedDifference(mean=d.mean(-1), se=d.std(-1, correction=1) / math.sqrt(d.shape[-1]))


class JackknifeEstimate(NamedTuple):
    """A statistic of all replicates and its delete-a-group jackknife standard error."""

    estimate: Tensor
    """The statistic computed from all replicates."""
    se: Tensor
    """Its jackknife standard error, same shape."""


def grouped_jackknife(statistic: Callable[..., Tensor], *arrays: Tensor, groups: int = 20) -> JackknifeEstimate:
    r"""Delete-a-group jackknife standard error of a statistic of Monte Carlo replicates.

    The R replicates (the leading dimension of every array) are split into G consecutive groups
    of equal size (R must be a multiple of G). With :math:`\theta_{(g)}` the statistic without
    group g and :math:`\bar\theta_{(\cdot)}` their mean, the standard error is
    :math:`\sqrt{\tfrac{G-1}{G}\sum_g (\theta_{(g)} - \bar\theta_{(\cdot)})^2}`. With G = R this is
    the delete-one jackknife, which for the mean of the replicates reproduces the usual
    standard deviation over √R exactly.

    Parameters
    ----------
    statistic : callable
        ``statistic(*subsets)`` returns a float or a tensor (of fixed shape), where each subset is
        an input array restricted to some replicates (along dimension 0).
    *arrays : Tensor, shape (R, ...)
        One or more arrays with the same number R of replicates in dimension 0.
    groups : int, default 20
        G, the number of groups (2 <= G <= R, G dividing R).

    Returns
    -------
    JackknifeEstimate
        ``estimate`` (the statistic on all replicates) and ``se``, as float64 tensors on the
        arrays' device.

    Raises
    ------
    TypeError
        If ``statistic`` is not callable, an array is not a tensor, or ``groups`` is not an int.
    ValueError
        If no array is given, the arrays disagree in R, or ``groups`` does not divide R or lies
        outside [2, R].

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(10, dtype=torch.float64)
    >>> est = grouped_jackknife(lambda v: v.mean(), x, groups=10)   # delete-one: std / sqrt(R)
    >>> round(float(est.se), 6) == round(float(x.std() / 10**0.5), 6)
    True
    """
    if not callable(statistic):
        raise TypeError(f"statistic must be callable, got {type(statistic).__name__}")
    if not arrays:
        raise ValueError("arrays must contain at least one tensor with replicates in dimension 0")
    checked = [require_tensor(x, f"arrays[{i}]", min_dim=1, floating=False) for i, x in enumerate(arrays)]
    r_count = checked[0].shape[0]
    for i, x in enumerate(checked[1:], start=1):
        if x.shape[0] != r_count:
            raise ValueError(f"arrays[{i}] has {x.shape[0]} replicates in dimension 0, arrays[0] has {r_count}")
    groups = require_positive_int(groups, "groups", minimum=2)
    if groups > r_count or r_count % groups:
        raise ValueError(f"groups must divide the number of replicates R = {r_count} and be <= R, got {groups}")

    def value(*subsets: Tensor) -> Tensor:
        return torch.as_tensor(statistic(*subsets), dtype=torch.float64, device=checked[0].device)

    full = value(*checked)
    size = r_count // groups
    keep = torch.ones(r_count, dtype=torch.bool, device=checked[0].device)
    leave_out = []
    for g in range(groups):
        keep[:] = True
        keep[g * size : (g + 1) * size] = False
        leave_out.append(value(*(x[keep] for x in checked)))
    return JackknifeEstimate(estimate=full, se=jackknife_se(torch.stack(leave_out)))


@dataclass(frozen=True)
class Equicorrelation:
    r"""The equicorrelated summary of an ensemble's Monte Carlo predictions, with jackknife SEs.

    Built by :func:`equicorrelation`. With :math:`V_b(x)` and :math:`C_{bb'}(x)` the
    members' variances and covariances over the training sets, integrated over the
    evaluation points (uniform average):

    Attributes
    ----------
    mean_variance : float
        :math:`\sigma^2 = \bar V`, the mean member variance.
    mean_covariance : float
        :math:`\bar C`, the mean over ordered pairs b ≠ b' (NaN for B = 1).
    rho : float
        :math:`\rho = \bar C/\bar V`: with it,
        :math:`\Var(\frac1B\sum_b\hat f_b) = \sigma^2(\rho + (1-\rho)/B)` exactly.
    ensemble_variance : float
        The integrated variance of the uniform average of the B members.
    mean_variance_se, mean_covariance_se, rho_se, ensemble_variance_se : float
        Delete-one jackknife standard errors over the R replicates.
    num_members : int
        B.
    replicates : int
        R.
    bias_sq : float
        :math:`b^2`, the unbiased integrated squared bias of the members' uniform average
        (:func:`nwlib.decompose`), when :func:`equicorrelation` was given the target; else NaN.
    """

    mean_variance: float
    mean_covariance: float
    rho: float
    ensemble_variance: float
    mean_variance_se: float
    mean_covariance_se: float
    rho_se: float
    ensemble_variance_se: float
    num_members: int
    replicates: int
    leave_one_out: Tensor = field(repr=False)
    """(R, 2) float64: the delete-one values of (σ², C̄)."""
    bias_sq: float = math.nan

    def variance_ratio(self, num_members: int | Tensor) -> float | Tensor:
        r"""Predicted variance of the uniform average of b members over one member's: :math:`\rho + (1-\rho)/b`.

        Parameters
        ----------
        num_members : int or Tensor
            b (a tensor gives the curve at every entry).
        """
        self._require_pairs()
        return self.rho + (1.0 - self.rho) / num_members

    def mse(self, num_members: int | Tensor) -> float | Tensor:
        r"""Predicted integrated MSE of the uniform average of b members: :math:`b^2 + \bar V(\rho + (1-\rho)/b)`.

        Needs the squared bias: fit with ``equicorrelation(predictions, target)``.

        Parameters
        ----------
        num_members : int or Tensor
        """
        if math.isnan(self.bias_sq):
            raise ValueError("mse needs the squared bias: call equicorrelation(predictions, target)")
        return self.bias_sq + self.mean_variance * self.variance_ratio(num_members)

    def predicted_variance(self, num_members: int) -> float:
        r"""The equicorrelated curve :math:`\bar C + (\bar V - \bar C)/b = \sigma^2(\rho + (1-\rho)/b)`.

        Parameters
        ----------
        num_members : int
            b >= 1.

        Returns
        -------
        float
        """
        b = require_positive_int(num_members, "num_members")
        self._require_pairs()
        return self.mean_covariance + (self.mean_variance - self.mean_covariance) / b

    def predicted_variance_se(self, num_members: int) -> float:
        """Jackknife standard error of :meth:`predicted_variance` (same replicates, same delete-one sets).

        Parameters
        ----------
        num_members : int

        Returns
        -------
        float
        """
        b = require_positive_int(num_members, "num_members")
        self._require_pairs()
        v, c = self.leave_one_out[:, 0], self.leave_one_out[:, 1]
        return float(jackknife_se(c + (v - c) / b))

    def _require_pairs(self) -> None:
        if self.num_members < 2:
            raise ValueError("the equicorrelated curve needs a mean covariance: num_members must be >= 2")


def _loo_integrated_variance(centred: Tensor) -> tuple[Tensor, Tensor]:
    """Unbiased variance over dim 0, averaged over the other dims, and its R delete-one values.

    Deleting replicate r from a sum of squares S about the mean removes R/(R-1)·d_r²
    (d_r the deviation from the full mean); the R - 2 denominator makes it unbiased.
    """
    r = centred.shape[0]
    sq = centred.pow(2)
    total = sq.sum(0).mean()  # mean over the other dims of S
    per = sq.flatten(1).mean(1)  # (R,) mean over the other dims of d_r²
    full = total / (r - 1)
    loo = (total - r / (r - 1) * per) / (r - 2)
    return full, loo


def equicorrelation(predictions: Tensor, target: Tensor | None = None) -> Equicorrelation:
    r"""Fit the equicorrelated law to an ensemble's Monte Carlo predictions.

    From R replicates of B members at m points: the mean member variance
    :math:`\sigma^2`, the mean cross-member covariance :math:`\bar C`, their ratio
    :math:`\rho`, the variance of the members' uniform average, and delete-one jackknife
    standard errors for all of them (closed forms, no refitting). Variances and
    covariances use the R − 1 denominator, as in :func:`nwlib.decompose`, whose
    ``mean_head_variance`` and ``mean_head_covariance`` these equal.

    Parameters
    ----------
    predictions : Tensor, shape (R, B, m)
        R >= 3 replicates (the jackknife of an unbiased variance needs R - 1 >= 2) of B members
        (heads, trees, bagged estimators) at m points.
    target : Tensor, shape (m,), optional
        The true function at the points: then ``bias_sq`` and :meth:`~Equicorrelation.mse` too.

    Returns
    -------
    Equicorrelation
        Its :meth:`~Equicorrelation.predicted_variance` gives the curve at any b; with the
        target, :meth:`~Equicorrelation.mse` the predicted MSE (fit on one batch, check on another:
        at b = B the prediction equals the batch's own MSE by construction).

    Raises
    ------
    TypeError, ValueError
        If ``predictions`` is not a floating tensor of shape (R, B, m) with R >= 3.

    Notes
    -----
    The mean covariance comes from the variance U of the members' average: the
    sample covariances are bilinear, so :math:`B^2 U = B\bar V + B(B-1)\bar C` holds
    exactly for the estimates, and :math:`\bar C = (BU - \bar V)/(B-1)`, also for every
    delete-one set. Computed in float64.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> common = torch.randn(4000, 1, 1, generator=g, dtype=torch.float64)
    >>> own = torch.randn(4000, 5, 1, generator=g, dtype=torch.float64)
    >>> fit = equicorrelation(common + own)          # sigma^2 = 2, rho = 1/2
    >>> round(fit.rho, 1), round(fit.predicted_variance(5), 1)
    (0.5, 1.2)
    """
    predictions = require_tensor(predictions, "predictions")
    if predictions.dim() != 3 or predictions.shape[0] < 3 or min(predictions.shape[1:]) < 1:
        raise ValueError(
            f"predictions must have shape (R, B, m) with R >= 3 and B, m >= 1, got {tuple(predictions.shape)}"
        )
    bias_sq = math.nan
    if target is not None:
        predictions, target = require_predictions_target(predictions, target, min_replicates=3)
        bias_sq = float(decompose(predictions, target).bias_sq.double().mean())
    p = predictions.double()
    r, b, _ = p.shape
    centred = p - p.mean(0)
    v_full, v_loo = _loo_integrated_variance(centred)
    u_full, u_loo = _loo_integrated_variance(centred.mean(1))
    if b > 1 and not v_full > 0:
        raise ValueError("predictions must have members with positive variance to define rho")
    if b > 1:
        c_full = (b * u_full - v_full) / (b - 1)
        c_loo = (b * u_loo - v_loo) / (b - 1)
        rho_full, rho_loo = c_full / v_full, c_loo / v_loo
        c_val, rho_val = float(c_full), float(rho_full)
        c_se, rho_se = float(jackknife_se(c_loo)), float(jackknife_se(rho_loo))
    else:
        c_loo = torch.full_like(v_loo, math.nan)
        c_val = rho_val = c_se = rho_se = math.nan
    return Equicorrelation(
        mean_variance=float(v_full),
        mean_covariance=c_val,
        rho=rho_val,
        ensemble_variance=float(u_full),
        mean_variance_se=float(jackknife_se(v_loo)),
        mean_covariance_se=c_se,
        rho_se=rho_se,
        ensemble_variance_se=float(jackknife_se(u_loo)),
        num_members=b,
        replicates=r,
        leave_one_out=torch.stack([v_loo, c_loo], dim=1).cpu(),
        bias_sq=bias_sq,
    )


def conditional_moments(weights: Tensor, f_values: Tensor, noise_sd: float | Tensor) -> tuple[Tensor, Tensor]:
    r"""Conditional mean and noise covariance of linear smoothers, design by design.

    For a design X (the n training inputs) and linear smoothers
    :math:`\hat f_h(x) = \sum_i w^h_i(x)\, y_i` with :math:`y_i = f(x_i) + \sigma\varepsilon_i`:

    .. math:: \E[\hat f_h(x) \mid X] = \sum_i w^h_i(x) f(x_i), \qquad
              \operatorname{Cov}(\hat f_h(x), \hat f_{h'}(x) \mid X) = \sigma^2 \sum_i w^h_i(x) w^{h'}_i(x).

    Parameters
    ----------
    weights : Tensor, shape (G, H, m, n)
        Each head's weight matrix at the m points, for G designs (e.g. from
        :func:`nwlib.nadaraya_watson_weights`).
    f_values : Tensor, shape (G, n)
        The true function at each design's training inputs.
    noise_sd : float or Tensor
        σ, as in :func:`nwlib.noise_covariance`.

    Returns
    -------
    conditional_mean : Tensor, shape (G, H, m)
    noise_cov : Tensor, shape (G, H, H, m)

    Raises
    ------
    TypeError, ValueError
        On non-floating tensors, mismatched dtypes or devices, wrong shapes, or a bad ``noise_sd``.

    Examples
    --------
    >>> import torch
    >>> w = torch.tensor([[[[0.5, 0.5, 0.0]], [[0.0, 0.5, 0.5]]]])   # G = 1, H = 2, m = 1, n = 3
    >>> mean, cov = conditional_moments(w, torch.tensor([[1.0, 2.0, 4.0]]), 1.0)
    >>> mean[0, :, 0].tolist(), cov[0, :, :, 0].tolist()
    ([1.5, 3.0], [[0.5, 0.25], [0.25, 0.5]])
    """
    weights = require_tensor(weights, "weights")
    if weights.dim() != 4:
        raise ValueError(f"weights must have shape (G, H, m, n), got {tuple(weights.shape)}")
    f_values = require_tensor(f_values, "f_values")
    require_same_dtype_device(weights, "weights", f_values=f_values)
    if f_values.shape != (weights.shape[0], weights.shape[3]):
        raise ValueError(
            f"f_values must have shape (G, n) = ({weights.shape[0]}, {weights.shape[3]}) to match weights "
            f"{tuple(weights.shape)}, got {tuple(f_values.shape)}"
        )
    mean = torch.einsum("ghmn,gn->ghm", weights, f_values)
    return mean, noise_covariance(weights, noise_sd)


class CovarianceSplit(NamedTuple):
    r"""The heads' covariance split by the law of total covariance (see :func:`covariance_split`)."""

    noise: Tensor
    r"""(H, H, m) :math:`\E_X[\sigma^2 \sum_i w^h_i w^{h'}_i]`, the noise part (mean over designs)."""
    design: Tensor
    r"""(H, H, m) :math:`\operatorname{Cov}_X(\E[\hat f_h|X], \E[\hat f_{h'}|X])` (G − 1 denominator)."""

    @property
    def total(self) -> Tensor:
        """(H, H, m) the predicted covariance of the heads, noise + design."""
        return self.noise + self.design

    def rho(self) -> tuple[float, float, float]:
        r"""Pooled correlation of the total and the shares of its two parts.

        Each is the mean over pairs h ≠ h' and points of a part's off-diagonal entries, divided by
        the mean over heads and points of the total variance :math:`\bar V`:
        ``(rho_total, rho_noise, rho_design)``, with ``rho_total = rho_noise + rho_design``.
        """
        heads = self.noise.shape[0]
        if heads < 2:
            raise ValueError("rho needs H >= 2 heads")
        off = ~torch.eye(heads, dtype=torch.bool, device=self.noise.device)
        vbar = float(torch.diagonal(self.total, dim1=0, dim2=1).double().mean())
        parts = [float(t[off].double().mean()) / vbar for t in (self.total, self.noise, self.design)]
        return parts[0], parts[1], parts[2]


def covariance_split(conditional_mean: Tensor, noise_cov: Tensor) -> CovarianceSplit:
    r"""Predict the heads' covariance over random designs from per-design conditional moments.

    By the law of total covariance,
    :math:`\operatorname{Cov}(\hat f_h, \hat f_{h'}) = \E_X \operatorname{Cov}(\hat f_h, \hat f_{h'} \mid X)
    + \operatorname{Cov}_X(\E[\hat f_h \mid X], \E[\hat f_{h'} \mid X])`. Given G independent designs,
    the first term is estimated by the mean of ``noise_cov`` and the second by the sample
    covariance (G − 1 denominator) of ``conditional_mean``; both estimates are unbiased.

    Parameters
    ----------
    conditional_mean : Tensor, shape (G, H, m)
        :math:`\E[\hat f_h(x_j) \mid X_g]`, from :func:`conditional_moments`; G >= 2.
    noise_cov : Tensor, shape (G, H, H, m)
        :math:`\operatorname{Cov}(\hat f_h(x_j), \hat f_{h'}(x_j) \mid X_g)`.

    Returns
    -------
    CovarianceSplit
        ``noise`` and ``design`` parts, shape (H, H, m); ``total`` and ``rho()`` summarise them.

    Raises
    ------
    TypeError, ValueError
        On non-floating tensors, mismatched dtypes or devices, G < 2, or inconsistent shapes.

    Examples
    --------
    >>> import torch
    >>> mean = torch.tensor([[[1.0], [0.0]], [[3.0], [2.0]]])        # G = 2, H = 2, m = 1
    >>> noise = torch.eye(2).reshape(1, 2, 2, 1).expand(2, 2, 2, 1)
    >>> split = covariance_split(mean, noise)
    >>> split.design[:, :, 0].tolist(), split.total[:, :, 0].tolist()
    ([[2.0, 2.0], [2.0, 2.0]], [[3.0, 2.0], [2.0, 3.0]])
    """
    conditional_mean = require_tensor(conditional_mean, "conditional_mean")
    noise_cov = require_tensor(noise_cov, "noise_cov")
    require_same_dtype_device(conditional_mean, "conditional_mean", noise_cov=noise_cov)
    if conditional_mean.dim() != 3 or conditional_mean.shape[0] < 2:
        raise ValueError(f"conditional_mean must have shape (G, H, m) with G >= 2, got {tuple(conditional_mean.shape)}")
    g, h, m = conditional_mean.shape
    if noise_cov.shape != (g, h, h, m):
        raise ValueError(f"noise_cov must have shape (G, H, H, m) = ({g}, {h}, {h}, {m}), got {tuple(noise_cov.shape)}")
    centred = conditional_mean - conditional_mean.mean(0)
    design = torch.einsum("ghm,gkm->hkm", centred, centred) / (g - 1)
    return CovarianceSplit(noise=noise_cov.mean(0), design=design)
