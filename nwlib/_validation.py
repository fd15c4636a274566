"""Argument checks shared by the public functions.

Every check raises ``TypeError`` for a wrong kind of object and ``ValueError``
for a wrong value, and names the offending argument, so that a reader sees
``keys must have the same last dimension as queries`` instead of a deep torch
error or, worse, a silent broadcast.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Sequence

import torch
from torch import Tensor

__all__: list[str] = []  # private module


def require_tensor(x: object, name: str, *, min_dim: int = 0, floating: bool = True) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}"
        )
    return x


def require_same_dtype_device(reference: Tensor, reference_name: str, **others: Tensor) -> None:
    """Tensors never move or change dtype silently: mismatches are errors."""
    for name, t in others.items():
        if t.device != reference.device:
            raise ValueError(
                f"{name} is on {t.device} but {reference_name} is on {reference.device}; "
                "move them to one device"
            )
        if t.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {reference_name} has {reference.dtype}; "
                "cast them to one dtype"
            )


def require_positive_finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


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


def require_generator(generator: object, device: torch.device | None = None, *, device_name: str = "device") -> torch.Generator:
    """A ``torch.Generator``, on the device type of ``device`` when one is given."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if device is not None and generator.device.type != torch.device(device).type:
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
