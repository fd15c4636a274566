"""The jackknife standard error from leave-out values, the one formula every estimator here uses."""

from __future__ import annotations

from torch import Tensor


def jackknife_se(leave_out: Tensor) -> Tensor:
    r"""Jackknife standard error from G leave-out values along dimension 0.

    :math:`\sqrt{\tfrac{G-1}{G}\sum_g (\theta_{(g)} - \bar\theta_{(\cdot)})^2}`, elementwise over the
    other dimensions: delete-one with G = R, delete-a-group otherwise
    (:func:`nwlib.grouped_jackknife`).

    Examples
    --------
    >>> import math, torch
    >>> x = torch.arange(5, dtype=torch.float64)
    >>> loo = (x.sum() - x) / 4  # the mean without each replicate
    >>> # equal in exact arithmetic (the jackknife SE of a mean is s / sqrt(R)); in float64 the two
    >>> # roundings may differ by an ulp or two, which depends on the CPU's kernels
    >>> math.isclose(float(jackknife_se(loo)), float(x.std() / 5**0.5), rel_tol=1e-14)
    True
    """
    g = leave_out.shape[0]
    return ((g - 1) / g * (leave_out - leave_out.mean(0)).pow(2).sum(0)).sqrt()
