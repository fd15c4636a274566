"""The one check of a seed, shared by every function that takes one (torch-free)."""

from __future__ import annotations

from numbers import Integral


def require_seed(value: object, name: str = "seed") -> int:
    """``value`` as a non-negative int: TypeError if it is not an integer (bools included), ValueError if < 0.

    Examples
    --------
    >>> require_seed(3)
    3
    >>> require_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)
