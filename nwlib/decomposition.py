r"""The bias–variance–covariance decomposition of a weighted ensemble (Theorem 3.1).

For head estimates :math:`\hat f_1, \dots, \hat f_H` at a point x, weights
:math:`\alpha_h` and target f(x), the ensemble :math:`\hat f = \sum_h \alpha_h \hat f_h`
has

.. math::
    \E(\hat f - f)^2 = \Big(\sum_h \alpha_h \E \hat f_h - f\Big)^2
        + \sum_h \alpha_h^2 V_h + \sum_{h \ne h'} \alpha_h \alpha_{h'} C_{hh'},

with :math:`V_h = \Var \hat f_h` and :math:`C_{hh'} = \Cov(\hat f_h, \hat f_{h'})`.
The identity is algebraic: it holds for any distribution of the estimates, in
particular for the empirical distribution of R Monte Carlo replicates, i.e.
with population (1/R) moments. :func:`decompose` uses those moments, so its
terms add up to its directly computed MSE to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._validation import require_predictions_target, require_same_dtype_device, require_tensor

__all__ = ["decompose", "Decomposition", "IntegratedDecomposition"]


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

    Built by :func:`decompose`. All moments are population (1/R) moments over
    the R replicates.

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
        :math:`(\sum_h \alpha_h \bar f_h - f)^2`.
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
        They have closed forms, so no (R, H, m) copy is made: with
        :math:`d_r = \hat f^{(r)} - \bar f` the centred ensemble prediction and
        :math:`S` a population variance over R replicates, deleting replicate r
        gives :math:`S_{(-r)} = \frac{R}{R-1}\big(S - \frac{d_r^2}{R-1}\big)` and
        :math:`\bar f_{(-r)} = \bar f - d_r/(R-1)`. The delete-one values and
        standard errors are computed in float64.
        """
        p = self.predictions
        r_count = p.shape[0]
        alpha = self.weights
        centred = p - p.mean(dim=0)
        ensemble = torch.einsum("rhm,h->rm", p, alpha)
        d = ensemble - self.ensemble_mean  # (R, m)
        err = self.ensemble_mean - self.target  # (m,)

        sq_err = (ensemble - self.target).pow(2).mean(dim=-1).double()  # (R,) integrated SE
        mse_se = float(sq_err.std(correction=1) / math.sqrt(r_count)) if r_count > 1 else math.nan

        bias = float(self.bias_sq.double().mean())
        var = float(self.variance.double().mean())
        ens_var = float(self.ensemble_variance.double().mean())
        if r_count > 1:
            k = r_count - 1
            d_sq = d.pow(2).mean(dim=-1).double()  # (R,)
            head_sq = torch.einsum("rhm,h->r", centred.pow(2), alpha.pow(2)).double() / p.shape[-1]
            cross = (d * err).mean(dim=-1).double()
            bias_loo = bias - 2.0 * cross / k + d_sq / k**2
            var_loo = (r_count / k) * (var - head_sq / k)
            ens_var_loo = (r_count / k) * (ens_var - d_sq / k)
            cov_loo = ens_var_loo - var_loo
            bias_se, var_se, cov_se = (_jackknife_se(t) for t in (bias_loo, var_loo, cov_loo))
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


def _jackknife_se(leave_one_out: Tensor) -> float:
    r = leave_one_out.shape[0]
    spread = leave_one_out - leave_one_out.mean()
    return float(((r - 1) / r * spread.pow(2).sum()).sqrt())


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
    head_cov = torch.einsum("rhm,rgm->hgm", centred, centred) / r_count
    head_var = torch.diagonal(head_cov, dim1=0, dim2=1).mT.contiguous()  # (H, m)
    sd = head_var.sqrt()
    denom = sd[:, None, :] * sd[None, :, :]
    head_corr = torch.where(denom > 0, head_cov / denom, torch.full_like(head_cov, math.nan))

    ensemble_mean = weights @ head_mean
    ensemble = torch.einsum("rhm,h->rm", predictions, weights)
    mse = (ensemble - target).pow(2).mean(dim=0)
    bias_sq = (ensemble_mean - target).pow(2)
    variance = weights.pow(2) @ head_var
    # Summing the off-diagonal terms directly (not total minus diagonal) keeps a small
    # covariance accurate when the variances are large.
    off = ~torch.eye(heads, dtype=torch.bool, device=predictions.device)
    off_cov = head_cov * off[:, :, None]
    covariance = torch.einsum("h,hgm,g->m", weights, off_cov, weights)
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
