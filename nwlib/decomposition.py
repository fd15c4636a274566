r"""The bias–variance–covariance decomposition of a weighted ensemble (Theorem 3.1).

For head estimates :math:`\hat f_1, \dots, \hat f_H` at a point x, weights
:math:`\alpha_h` and target f(x), the ensemble :math:`\hat f = \sum_h \alpha_h \hat f_h`
has

.. math::
    \E(\hat f - f)^2 = \Big(\sum_h \alpha_h \E \hat f_h - f\Big)^2
        + \sum_h \alpha_h^2 V_h + \sum_{h \ne h'} \alpha_h \alpha_{h'} C_{hh'},

with :math:`V_h = \Var \hat f_h` and :math:`C_{hh'} = \Cov(\hat f_h, \hat f_{h'})`.
The terms are estimated from R Monte Carlo replicates without bias:
variances and covariances with the R − 1 denominator, and the squared bias as
:math:`(\bar f - f)^2 - \widehat{\Var}(\hat f)/R`, because the squared
replicate mean :math:`(\bar f - f)^2` overshoots :math:`(\E\hat f - f)^2`
by the Monte Carlo variance of the mean, :math:`\Var(\hat f)/R`. With these
estimators the identity still holds exactly: their sum is
:math:`(\bar f - f)^2 + \frac{R-1}{R}\widehat{\Var}(\hat f)`, the mean over the
replicates of :math:`(\hat f - f)^2`, so the terms add up to the directly
computed MSE to rounding. The unbiased squared bias can be slightly negative
when the bias is small against :math:`\sqrt{\Var(\hat f)/R}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._jackknife import jackknife_se
from ._validation import require_predictions_target, require_real, require_same_dtype_device, require_tensor

__all__ = ["decompose", "Decomposition", "IntegratedDecomposition", "noise_covariance"]


@dataclass(frozen=True)
class IntegratedDecomposition:
    """Point-averaged decomposition with Monte Carlo standard errors.

    Each value is the mean over the m evaluation points of the per-point term
    (a uniform quadrature of the integral over the design when the points are
    drawn from it), so ``mse == bias_sq + variance + covariance`` to rounding.

    Attributes
    ----------
    mse, bias_sq, variance, covariance : float
        Integrated terms.
    mse_se, bias_sq_se, variance_se, covariance_se : float
        Monte Carlo standard errors over replicates: for ``mse`` the standard
        error of the mean of the R per-replicate integrated squared errors
        (sample standard deviation / √R); for the other terms the delete-one
        jackknife, which for ``mse`` gives the same number.
    mean_correlation : float
        Mean of ``head_correlation`` over pairs h ≠ h' and points (NaN for
        H = 1; pairs with a zero-variance head are skipped).
    mean_head_variance : float
        Mean of ``head_variance`` over heads and points (V̄).
    mean_head_covariance : float
        Mean of ``head_covariance`` over pairs h ≠ h' and points (C̄; NaN for
        H = 1). With uniform weights variance + covariance equals
        V̄/H + (1 − 1/H) C̄ exactly, i.e. V̄ (ρ + (1 − ρ)/H) with ρ = C̄/V̄.
    replicates : int
        Number R of Monte Carlo replicates.
    """

    mse: float
    bias_sq: float
    variance: float
    covariance: float
    mse_se: float
    bias_sq_se: float
    variance_se: float
    covariance_se: float
    mean_correlation: float
    mean_head_variance: float = math.nan
    mean_head_covariance: float = math.nan
    replicates: int = 0

    def as_dict(self) -> dict[str, float]:
        """The fields as a plain dict (for tables and glue)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, eq=False)
class Decomposition:
    r"""Per-point bias–variance–covariance decomposition of a weighted ensemble.

    Built by :func:`decompose`. Every term is an unbiased estimate from the R
    replicates (see the module docstring).

    Attributes
    ----------
    weights : Tensor, shape (H,)
        The ensemble weights :math:`\alpha_h`.
    ensemble_mean : Tensor, shape (m,)
        :math:`\sum_h \alpha_h \bar f_h`, the replicate mean of the ensemble.
    mse : Tensor, shape (m,)
        Mean over replicates of :math:`(\sum_h \alpha_h \hat f_h - f)^2`,
        computed directly from the predictions.
    bias_sq : Tensor, shape (m,)
        :math:`(\sum_h \alpha_h \bar f_h - f)^2` minus the Monte Carlo variance
        of that mean, (variance + covariance)/R: unbiased for the squared bias.
    variance : Tensor, shape (m,)
        :math:`\sum_h \alpha_h^2 V_h`.
    covariance : Tensor, shape (m,)
        :math:`\sum_{h \ne h'} \alpha_h \alpha_{h'} C_{hh'}`.
    head_variance : Tensor, shape (H, m)
    head_covariance : Tensor, shape (H, H, m)
        Symmetric; its diagonal is ``head_variance``.
    head_correlation : Tensor, shape (H, H, m)
        :math:`C_{hh'} / \sqrt{V_h V_{h'}}`; NaN where a head has zero variance.
    predictions : Tensor, shape (R, H, m)
        The input, kept for :meth:`integrated`.
    target : Tensor, shape (m,)
    """

    weights: Tensor
    ensemble_mean: Tensor
    mse: Tensor
    bias_sq: Tensor
    variance: Tensor
    covariance: Tensor
    head_variance: Tensor
    head_covariance: Tensor
    head_correlation: Tensor
    predictions: Tensor = field(repr=False)
    target: Tensor = field(repr=False)

    @property
    def ensemble_variance(self) -> Tensor:
        """Variance of the ensemble, ``variance + covariance``, shape (m,)."""
        return self.variance + self.covariance

    def integrated(self) -> IntegratedDecomposition:
        r"""Average the terms over the evaluation points, with Monte Carlo standard errors.

        Returns
        -------
        IntegratedDecomposition

        Notes
        -----
        The jackknife needs the R delete-one estimates of each integrated term.
        They have closed forms, computed head by head, so this method makes no
        (R, H, m) copy (only (R, m) ones): with
        :math:`d_r = \hat f^{(r)} - \bar f` the centred ensemble prediction and
        :math:`S` a population variance over R replicates, deleting replicate r
        gives :math:`S_{(-r)} = \frac{R}{R-1}\big(S - \frac{d_r^2}{R-1}\big)` and
        :math:`\bar f_{(-r)} = \bar f - d_r/(R-1)`; the unbiased delete-one terms
        follow from these population ones as in the full sample (the jackknife
        therefore needs R >= 3). The delete-one values and standard errors are
        computed in float64.
        """
        p = self.predictions
        r_count = p.shape[0]
        alpha = self.weights
        head_mean = p.mean(dim=0)  # (H, m)
        errors = ensemble_error(p, self.target, alpha)  # (R, m)
        err = self.ensemble_mean - self.target  # (m,)
        d = errors - err  # (R, m): the centred ensemble prediction

        sq_err = errors.pow(2).mean(dim=-1).double()  # (R,) integrated squared errors
        mse_se = float(sq_err.std(correction=1) / math.sqrt(r_count)) if r_count > 1 else math.nan

        bias = float(self.bias_sq.double().mean())
        var = float(self.variance.double().mean())
        if r_count > 2:
            k = r_count - 1
            # Population (1/R) versions of the integrated terms, from the unbiased ones.
            var_pop = var * k / r_count
            ens_var_pop = float(self.ensemble_variance.double().mean()) * k / r_count
            bias_pop = float(err.double().pow(2).mean())
            d_sq = d.pow(2).mean(dim=-1).double()  # (R,)
            head_sq = torch.stack(
                [
                    (p[:, h] - head_mean[h]).pow(2).mean(dim=-1).double() * alpha[h].double().pow(2)
                    for h in range(p.shape[1])
                ]
            ).sum(dim=0)  # (R,), one head at a time: no (R, H, m) copy
            cross = (d * err).mean(dim=-1).double()
            # Delete-one population terms (R - 1 replicates left) ...
            bias_pop_loo = bias_pop - 2.0 * cross / k + d_sq / k**2
            var_pop_loo = (r_count / k) * (var_pop - head_sq / k)
            ens_var_pop_loo = (r_count / k) * (ens_var_pop - d_sq / k)
            # ... and the unbiased ones, as decompose would compute them on those replicates.
            var_loo = var_pop_loo * k / (k - 1)
            ens_var_loo = ens_var_pop_loo * k / (k - 1)
            cov_loo = ens_var_loo - var_loo
            bias_loo = bias_pop_loo - ens_var_loo / k
            bias_se, var_se, cov_se = (float(jackknife_se(t)) for t in (bias_loo, var_loo, cov_loo))
        else:
            bias_se = var_se = cov_se = math.nan

        heads = alpha.shape[0]
        off = ~torch.eye(heads, dtype=torch.bool, device=alpha.device)
        if heads > 1:
            corr = self.head_correlation[off]
            mean_corr = float(corr.double().nanmean())
            mean_cov = float(self.head_covariance[off].double().mean())
        else:
            mean_corr = mean_cov = math.nan
        return IntegratedDecomposition(
            mse=float(self.mse.double().mean()),
            bias_sq=bias,
            variance=var,
            covariance=float(self.covariance.double().mean()),
            mse_se=mse_se,
            bias_sq_se=bias_se,
            variance_se=var_se,
            covariance_se=cov_se,
            mean_correlation=mean_corr,
            mean_head_variance=float(self.head_variance.double().mean()),
            mean_head_covariance=mean_cov,
            replicates=r_count,
        )


def ensemble_error(predictions: Tensor, target: Tensor, weights: Tensor) -> Tensor:
    r"""The weighted ensemble's error, shape (..., R, m), for weights of shape (..., H).

    The one place where the library forms :math:`\sum_h \alpha_h \hat f_h - f`;
    identity weights give each head's own error. Arguments are checked by the callers.
    """
    return torch.einsum("...h,rhm->...rm", weights, predictions) - target


def decompose(predictions: Tensor, target: Tensor, weights: Tensor | None = None) -> Decomposition:
    r"""Decompose the MSE of the weighted ensemble of heads into bias², variance and covariance.

    Parameters
    ----------
    predictions : Tensor, shape (R, H, m)
        Head h's estimate at point j from replicate r (e.g. from
        :func:`nwlib.simulate`).
    target : Tensor, shape (m,)
        The value each estimate is compared with, usually f at the points.
    weights : Tensor, shape (H,), optional
        Ensemble weights :math:`\alpha_h`; default uniform 1/H. They need not
        sum to 1 (the bias is then that of :math:`\sum_h \alpha_h \hat f_h`).

    Returns
    -------
    Decomposition
        Per-point terms with ``mse = bias_sq + variance + covariance`` to
        rounding; :meth:`Decomposition.integrated` averages them over the
        points and adds Monte Carlo standard errors.

    Raises
    ------
    TypeError
        If an input is not a floating tensor or the dtypes differ.
    ValueError
        On wrong shapes, mixed devices, or non-finite ``weights``.

    Notes
    -----
    Memory: besides the (H, H, m) covariances, the call holds one centred
    (R, H, m) copy of ``predictions`` (for the covariances) and (R, m) ensemble
    errors; the returned object keeps a reference to ``predictions``.

    Examples
    --------
    >>> import torch
    >>> from nwlib import decompose
    >>> p = torch.randn(500, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> dec = decompose(p, torch.zeros(4, dtype=torch.float64))
    >>> bool(torch.allclose(dec.mse, dec.bias_sq + dec.variance + dec.covariance))
    True
    """
    # Variances, covariances and standard errors need at least two replicates.
    predictions, target = require_predictions_target(predictions, target, min_replicates=2)
    r_count, heads, m = predictions.shape
    if weights is None:
        weights = torch.full((heads,), 1.0 / heads, dtype=predictions.dtype, device=predictions.device)
    else:
        weights = require_tensor(weights, "weights")
        require_same_dtype_device(predictions, "predictions", weights=weights)
        if weights.shape != (heads,):
            raise ValueError(
                f"weights must have shape (H,) = ({heads},) to match predictions "
                f"{tuple(predictions.shape)}, got {tuple(weights.shape)}"
            )
        if not bool(torch.isfinite(weights).all()):
            raise ValueError("weights must be finite")

    head_mean = predictions.mean(dim=0)  # (H, m)
    centred = predictions - head_mean
    # One batched GEMM over the points, (m, H, R) @ (m, R, H): einsum's own path was ~100x slower here.
    by_point = centred.permute(2, 1, 0)
    head_cov = (by_point @ by_point.mT).permute(1, 2, 0) / (r_count - 1)
    head_var = torch.diagonal(head_cov, dim1=0, dim2=1).mT.contiguous()  # (H, m)
    sd = head_var.sqrt()
    denom = sd[:, None, :] * sd[None, :, :]
    head_corr = torch.where(denom > 0, head_cov / denom, torch.full_like(head_cov, math.nan))

    ensemble_mean = weights @ head_mean
    mse = ensemble_error(predictions, target, weights).pow(2).mean(dim=0)
    variance = weights.pow(2) @ head_var
    # Summing the off-diagonal terms directly (not total minus diagonal) keeps a small
    # covariance accurate when the variances are large.
    off = ~torch.eye(heads, dtype=torch.bool, device=predictions.device)
    off_cov = head_cov * off[:, :, None]
    covariance = torch.einsum("h,hgm,g->m", weights, off_cov, weights)
    # (mean - f)² overshoots the squared bias by the variance of the mean, Var/R.
    bias_sq = (ensemble_mean - target).pow(2) - (variance + covariance) / r_count
    return Decomposition(
        weights=weights,
        ensemble_mean=ensemble_mean,
        mse=mse,
        bias_sq=bias_sq,
        variance=variance,
        covariance=covariance,
        head_variance=head_var,
        head_covariance=head_cov,
        head_correlation=head_corr,
        predictions=predictions,
        target=target,
    )


def noise_covariance(weights: Tensor, noise_sd: float | Tensor) -> Tensor:
    r"""The part of the heads' covariance that the shared noise alone causes, given the design.

    For linear smoothers fitted on one training set, :math:`\hat f_h(x) = \sum_i
    w^h_i(x)\, y_i` with :math:`y_i = f(x_i) + \sigma\varepsilon_i`, so given the
    inputs :math:`\operatorname{Cov}(\hat f_h(x), \hat f_{h'}(x) \mid X) =
    \sigma^2 \sum_i w^h_i(x)\, w^{h'}_i(x)`. For Nadaraya–Watson weights, which are
    non-negative, this is >= 0 for every pair: heads that share their data cannot be
    decorrelated by their projections alone (the shared-data floor).

    Parameters
    ----------
    weights : Tensor, shape (..., H, m, n)
        Each head's weight matrix at the m points (e.g. from
        :func:`nwlib.nadaraya_watson_weights`; this materialises (m, n) per head).
    noise_sd : float or Tensor broadcastable to (...)
        σ.

    Returns
    -------
    Tensor, shape (..., H, H, m)
        :math:`\sigma^2 \sum_i w^h_i(x_j) w^{h'}_i(x_j)`; averaging it over designs
        gives the noise part of the covariance in Theorem 3.1.

    Raises
    ------
    TypeError, ValueError
        If ``weights`` is not a floating tensor with at least 3 dimensions, or
        ``noise_sd`` is negative or not finite.

    Examples
    --------
    >>> import torch
    >>> w = torch.tensor([[[0.5, 0.5, 0.0]], [[0.0, 0.5, 0.5]]])  # two heads, one point, n = 3
    >>> noise_covariance(w, 2.0)[:, :, 0]
    tensor([[2., 1.],
            [1., 2.]])
    """
    weights = require_tensor(weights, "weights", min_dim=3)
    var: Tensor | float
    if isinstance(noise_sd, Tensor):
        require_same_dtype_device(weights, "weights", noise_sd=noise_sd)
        var = noise_sd.pow(2)[..., None, None, None]
    else:
        var = require_real(noise_sd, "noise_sd", minimum=0.0) ** 2
    return var * torch.einsum("...hmn,...gmn->...hgm", weights, weights)
