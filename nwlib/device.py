"""Choosing where computations run."""

from __future__ import annotations

import torch

from ._validation import require_device

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Resolve a device specification, with ``"auto"`` picking the best available.

    Parameters
    ----------
    device : str or torch.device, default "auto"
        ``"auto"`` resolves to CUDA if available, then Apple MPS, then CPU. Any
        other string (``"cpu"``, ``"cuda:1"``) or a ``torch.device`` is returned
        as a ``torch.device`` after checking that it is usable.

    Returns
    -------
    torch.device

    Raises
    ------
    TypeError
        If ``device`` is neither a string nor a ``torch.device``.
    ValueError
        If ``device`` names an unknown device type or one that is not available.

    Examples
    --------
    >>> from nwlib import resolve_device
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device is None:
        raise TypeError("device must be a str or torch.device, got NoneType")
    resolved = require_device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(resolved)!r} requested but CUDA is not available")
    if resolved.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device {str(resolved)!r} requested but MPS is not available")
    return resolved
