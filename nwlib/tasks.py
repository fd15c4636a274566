"""Regression tasks for the Monte Carlo experiments: a true function, a design, a noise level.

Every task draws its design from the standard normal distribution x ~ N(0, I_D)
and its responses as y = f(x) + σ ε with ε ~ N(0, 1) independent of x. The
tasks differ in where the signal f lives:

* ``"isotropic"``: :math:`f(x) = D^{-1/2} \\sum_{j<D} \\sin(2 x_j)`, smooth and
  symmetric in all D coordinates; Var f(x) = (1 − e^{−8})/2 ≈ 0.5 for every D.
* ``"subspace"``: the same function of the first ``signal_dim`` coordinates
  only, :math:`f(x) = s^{-1/2} \\sum_{j<s} \\sin(2 x_j)`; the other D − s
  coordinates are nuisance directions.
* ``"single_index"``: :math:`f(x) = g(x_0)` with
  :math:`g(t) = \\sin(2t) + t/2`, signal along e_1 only.
* ``"interaction"``: :math:`f(x) = \\sqrt 2 \\sin(2 x_0) \\sin(2 x_1)`, a pure
  interaction of the first two coordinates (no additive part; Var f ≈ 0.5): a head
  that sees only one of them learns nothing about f.

Because the design is N(0, I_D), a projected input :math:`W^\\top x` has the
known distribution N(0, WᵀW), which is what lets :func:`nwlib.simulate` choose
a data-free default bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._validation import (
    require_choice,
    require_device,
    require_dtype,
    require_generator,
    require_positive_int,
    require_real,
    require_tensor,
    same_device,
)

__all__ = ["RegressionTask", "make_task", "TASKS"]

TASKS: tuple[str, ...] = ("isotropic", "subspace", "single_index", "interaction")

DRAW_DTYPE: torch.dtype = torch.float64
"""Precision of every random draw: data are drawn in float64 and cast, so the design
does not depend on the dtype a simulation runs in."""
"""Names accepted by :func:`make_task`."""


def _sine_sum(x: Tensor, s: int) -> Tensor:
    # In place after the one temporary: the engine's memory bound counts a single (..., s) buffer.
    return x[..., :s].mul(2).sin_().sum(-1).div_(math.sqrt(s))


def _interaction(x: Tensor) -> Tensor:
    return math.sqrt(2.0) * torch.sin(2 * x[..., 0]) * torch.sin(2 * x[..., 1])


def _single_index(x: Tensor) -> Tensor:
    t = x[..., 0]
    return torch.sin(2 * t) + 0.5 * t


@dataclass(frozen=True)
class RegressionTask:
    r"""A regression problem y = f(x) + σ ε with design x ~ N(0, I_D).

    Build one with :func:`make_task`.

    Attributes
    ----------
    name : str
        One of :data:`TASKS`.
    embed_dim : int
        Input dimension D.
    noise_sd : float
        Noise standard deviation σ (>= 0).
    signal_dim : int
        Number of leading coordinates f depends on (D for ``"isotropic"``,
        1 for ``"single_index"``, 2 for ``"interaction"``).
    """

    name: str
    embed_dim: int
    noise_sd: float
    signal_dim: int
    _fn: Callable[[Tensor], Tensor] = field(repr=False, compare=False)

    def f(self, x: Tensor) -> Tensor:
        """The true regression function E[y | x].

        Parameters
        ----------
        x : Tensor, shape (..., D)

        Returns
        -------
        Tensor, shape (...)
            Same dtype and device as ``x``.

        Raises
        ------
        TypeError
            If ``x`` is not a floating tensor.
        ValueError
            If the last dimension of ``x`` is not D.
        """
        require_tensor(x, "x", min_dim=1)
        if x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have last dimension D = {self.embed_dim} for task {self.name!r}, got shape {tuple(x.shape)}"
            )
        return self._fn(x)

    def sample(
        self,
        batch_shape: tuple[int, ...],
        n: int,
        *,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Draw independent training sets.

        The inputs are drawn first and the noise second, both from ``generator``
        and always in float64, then cast to ``dtype``: a seeded generator
        reproduces the data exactly, and runs in float32 and float64 with one
        seed see the same design up to rounding (they differ only in the
        precision of the arithmetic that follows).

        Parameters
        ----------
        batch_shape : tuple of int
            Leading shape: one training set per entry (``()`` for a single one).
        n : int
            Training-set size (>= 1).
        generator : torch.Generator
            Source of randomness; its device is where the data are drawn.
        dtype : torch.dtype, default torch.float32
            A floating dtype.
        device : torch.device or str, optional
            Defaults to the generator's device; must equal it if given.

        Returns
        -------
        x : Tensor, shape (*batch_shape, n, D)
            Inputs, x ~ N(0, I_D).
        y : Tensor, shape (*batch_shape, n)
            Responses f(x) + σ ε.

        Raises
        ------
        TypeError
            On a wrong type of ``batch_shape``, ``n``, ``generator`` or ``dtype``.
        ValueError
            On a negative entry of ``batch_shape``, ``n`` < 1, or a ``device``
            that differs from the generator's.
        """
        require_generator(generator)
        if not isinstance(batch_shape, (tuple, list, torch.Size)) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in batch_shape
        ):
            raise TypeError(f"batch_shape must be a tuple of ints, got {batch_shape!r}")
        if any(b < 0 for b in batch_shape):
            raise ValueError(f"batch_shape must have non-negative entries, got {tuple(batch_shape)}")
        require_positive_int(n, "n")
        dtype = require_dtype(dtype)
        device = require_device(device, default=generator.device)
        if not same_device(device, generator.device):
            raise ValueError(f"device {device} differs from the generator's device {generator.device}")
        shape = (*batch_shape, n)
        x = torch.randn(*shape, self.embed_dim, generator=generator, dtype=DRAW_DTYPE, device=generator.device)
        eps = torch.randn(*shape, generator=generator, dtype=DRAW_DTYPE, device=generator.device)
        y = self._fn(x).add_(eps, alpha=self.noise_sd)
        return x.to(dtype), y.to(dtype)


def make_task(name: str, embed_dim: int, *, noise_sd: float = 0.5, **kwargs: int) -> RegressionTask:
    """Build one of the named regression tasks (see the module docstring for each f).

    Parameters
    ----------
    name : {"isotropic", "subspace", "single_index", "interaction"}
    embed_dim : int
        Input dimension D (>= 1).
    noise_sd : float, default 0.5
        Noise standard deviation σ (finite, >= 0).
    signal_dim : int, default 2
        Only for ``"subspace"``: f depends on the first ``signal_dim``
        coordinates (1 <= signal_dim <= D).

    Returns
    -------
    RegressionTask

    Raises
    ------
    TypeError
        On wrong argument types or an unexpected keyword argument.
    ValueError
        On an unknown ``name`` or out-of-range values.

    Examples
    --------
    >>> import torch
    >>> from nwlib import make_task
    >>> task = make_task("subspace", 8, signal_dim=2)
    >>> x, y = task.sample((3,), 100, generator=torch.Generator().manual_seed(0))
    >>> x.shape, y.shape
    (torch.Size([3, 100, 8]), torch.Size([3, 100]))
    """
    name = require_choice(name, "name", TASKS)
    dim = require_positive_int(embed_dim, "embed_dim")
    noise_sd = require_real(noise_sd, "noise_sd", minimum=0.0)
    allowed = {"signal_dim"} if name == "subspace" else set()
    unexpected = sorted(set(kwargs) - allowed)
    if unexpected:
        raise TypeError(f"make_task({name!r}) got unexpected keyword argument(s) {unexpected}")
    if name == "isotropic":
        s = dim
        fn: Callable[[Tensor], Tensor] = lambda x: _sine_sum(x, dim)  # noqa: E731
    elif name == "subspace":
        s = require_positive_int(kwargs.get("signal_dim", 2), "signal_dim")
        if s > dim:
            raise ValueError(f"signal_dim must be <= embed_dim = {dim}, got {s}")
        fn = lambda x: _sine_sum(x, s)  # noqa: E731
    elif name == "interaction":
        if dim < 2:
            raise ValueError(f"embed_dim must be >= 2 for the interaction task, got {dim}")
        s = 2
        fn = _interaction
    else:
        s = 1
        fn = _single_index
    return RegressionTask(name=name, embed_dim=dim, noise_sd=noise_sd, signal_dim=s, _fn=fn)
