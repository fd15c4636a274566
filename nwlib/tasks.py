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

Because the design is N(0, I_D), a projected input :math:`W^\\top x` has the
known distribution N(0, WᵀW), which is what lets :func:`nwlib.simulate` choose
a data-free default bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ._validation import require_choice, require_generator, require_positive_int, require_tensor

__all__ = ["RegressionTask", "make_task", "TASKS"]

TASKS: tuple[str, ...] = ("isotropic", "subspace", "single_index")
"""Names accepted by :func:`make_task`."""


def _sine_sum(x: Tensor, s: int) -> Tensor:
    return torch.sin(2 * x[..., :s]).sum(-1) / math.sqrt(s)


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
    dim : int
        Input dimension D.
    noise_sd : float
        Noise standard deviation σ (>= 0).
    signal_dim : int
        Number of leading coordinates f depends on (D for ``"isotropic"``,
        1 for ``"single_index"``).
    """

    name: str
    dim: int
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
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have last dimension D = {self.dim} for task {self.name!r}, "
                f"got shape {tuple(x.shape)}"
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

        The inputs are drawn first and the noise second, both from ``generator``,
        so a seeded generator reproduces the data exactly.

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
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        device = generator.device if device is None else torch.device(device)
        if device != generator.device and not (
            device.type == generator.device.type and device.index in (None, generator.device.index)
        ):
            raise ValueError(f"device {device} differs from the generator's device {generator.device}")
        shape = (*batch_shape, n)
        x = torch.randn(*shape, self.dim, generator=generator, dtype=dtype, device=generator.device)
        eps = torch.randn(*shape, generator=generator, dtype=dtype, device=generator.device)
        return x, self._fn(x) + self.noise_sd * eps


def make_task(name: str, dim: int, *, noise_sd: float = 0.5, **kwargs: int) -> RegressionTask:
    """Build one of the named regression tasks (see the module docstring for each f).

    Parameters
    ----------
    name : {"isotropic", "subspace", "single_index"}
    dim : int
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
    require_positive_int(dim, "dim")
    if isinstance(noise_sd, bool) or not isinstance(noise_sd, (int, float)):
        raise TypeError(f"noise_sd must be a real number, got {type(noise_sd).__name__}")
    noise_sd = float(noise_sd)
    if not math.isfinite(noise_sd) or noise_sd < 0:
        raise ValueError(f"noise_sd must be finite and >= 0, got {noise_sd}")
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
            raise ValueError(f"signal_dim must be <= dim = {dim}, got {s}")
        fn = lambda x: _sine_sum(x, s)  # noqa: E731
    else:
        s = 1
        fn = _single_index
    return RegressionTask(name=name, dim=dim, noise_sd=noise_sd, signal_dim=s, _fn=fn)
