"""Argument checks shared by the public functions.

Every check raises ``TypeError`` for a wrong kind of object and ``ValueError``
for a wrong value, and names the offending argument, so that a reader sees
``keys must have the same last dimension as queries`` instead of a deep torch
error or, worse, a silent broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import torch
from torch import Tensor

__all__: list[str] = []  # private module


def require_tensor(x: object, name: str, *, min_dim: int = 0, floating: bool = True) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}")
    return x


def require_same_dtype_device(reference: Tensor, reference_name: str, **others: Tensor) -> None:
    """Tensors never move or change dtype silently: mismatches are errors."""
    for name, t in others.items():
        if t.device != reference.device:
            raise ValueError(
                f"{name} is on {t.device} but {reference_name} is on {reference.device}; move them to one device"
            )
        if t.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {reference_name} has {reference.dtype}; cast them to one dtype"
            )


def require_real(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
) -> float:
    """A finite real number (not a bool, not a tensor) in ``[minimum, maximum]``, as a float.

    ``strict_minimum`` makes the lower end open (``> minimum``). This is the one
    check of Python numbers in the library; tensors are checked by the caller,
    because reading a tensor's value syncs with its device.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    low_ok = minimum is None or (value > minimum if strict_minimum else value >= minimum)
    high_ok = maximum is None or value <= maximum
    if not math.isfinite(value) or not low_ok or not high_ok:
        low = "" if minimum is None else f"{'>' if strict_minimum else '>='} {minimum:g}"
        high = "" if maximum is None else f"<= {maximum:g}"
        bounds = " and ".join(b for b in (low, high) if b)
        raise ValueError(f"{name} must be finite{' and ' + bounds if bounds else ''}, got {value}")
    return value


def require_positive_finite(value: object, name: str) -> float:
    """Shorthand for :func:`require_real` with ``> 0``."""
    return require_real(value, name, minimum=0.0, strict_minimum=True)


def require_dtype(dtype: object, name: str = "dtype", *, default: torch.dtype | None = None) -> torch.dtype:
    """A floating ``torch.dtype``; ``None`` gives ``default`` (torch's default dtype if not given)."""
    if dtype is None:
        return default if default is not None else torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def require_device(device: object, name: str = "device", *, default: torch.device | None = None) -> torch.device:
    """Parse a device given as ``torch.device`` or string; ``None`` gives ``default`` (CPU if not given).

    The one device parser of the library: it checks the form, not availability
    (see :func:`nwlib.resolve_device` for that).
    """
    if device is None:
        return default if default is not None else torch.device("cpu")
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"{name} {device!r} is not a valid device: {err}") from None
    raise TypeError(f"{name} must be a str or torch.device, got {type(device).__name__}")


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are the same, with ``cuda`` meaning the current ``cuda:i``."""
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


def require_positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def require_choice(value: object, name: str, choices: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, one of {list(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def broadcast_batch(shapes: dict[str, torch.Size]) -> torch.Size:
    """Broadcast leading (batch) shapes, naming the arguments when they clash."""
    try:
        return torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        described = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"batch dimensions do not broadcast: {described}") from None


def require_generator(
    generator: object, device: torch.device | str | None = None, *, device_name: str = "device"
) -> torch.Generator:
    """A ``torch.Generator``, on the device type of ``device`` when one is given."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if device is not None and not same_device(generator.device, require_device(device)):
        raise ValueError(f"generator is on {generator.device} but {device_name} is {device}")
    return generator


def require_predictions_target(
    predictions: object, target: object, *, min_replicates: int = 1
) -> tuple[Tensor, Tensor]:
    """Monte Carlo output of shape (R, H, m) and the target at the m points, shape (m,)."""
    predictions = require_tensor(predictions, "predictions")
    if predictions.dim() != 3:
        raise ValueError(f"predictions must have shape (R, H, m), got {tuple(predictions.shape)}")
    if predictions.shape[0] < min_replicates or min(predictions.shape[1:]) < 1:
        raise ValueError(
            f"predictions must have R >= {min_replicates} replicates and H, m >= 1, "
            f"got shape {tuple(predictions.shape)}"
        )
    target = require_tensor(target, "target")
    require_same_dtype_device(predictions, "predictions", target=target)
    if target.shape != predictions.shape[-1:]:
        raise ValueError(
            f"target must have shape (m,) = ({predictions.shape[-1]},) to match predictions "
            f"{tuple(predictions.shape)}, got {tuple(target.shape)}"
        )
    return predictions, target


def require_predictions_responses(
    predictions: object, responses: object, *, name: str = "responses"
) -> tuple[Tensor, Tensor]:
    """Head predictions (R, H, m) and what they are fitted to: one (m,) target or (R, m) responses."""
    predictions = require_tensor(predictions, "predictions")
    if predictions.dim() != 3 or min(predictions.shape) < 1:
        raise ValueError(f"predictions must have shape (R, H, m) with R, H, m >= 1, got {tuple(predictions.shape)}")
    responses = require_tensor(responses, name)
    require_same_dtype_device(predictions, "predictions", **{name: responses})
    R, _, m = predictions.shape
    if responses.shape not in ((m,), (R, m)):
        raise ValueError(f"{name} must have shape (m,) = ({m},) or (R, m) = ({R}, {m}), got {tuple(responses.shape)}")
    return predictions, responses
