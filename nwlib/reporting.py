"""Handing computed numbers and figures from a notebook to the book."""

from __future__ import annotations

from typing import Any

__all__ = ["glue"]


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the book (myst-nb glue), or do nothing.

    The book quotes numbers only through glue, so every notebook calls this.
    Where myst-nb is absent (Colab, a plain Jupyter install) the call is a
    no-op, so that the notebooks still run there.

    Parameters
    ----------
    name : str
        Key referenced from the book as ``{glue:text}`path/to/notebook.ipynb::name```.
    value : object
        Anything IPython can display: a number, a string, a matplotlib figure,
        a sympy expression.
    display : bool, default False
        Whether to also display the value in the notebook itself.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty string")
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # the notebook runs outside the book toolchain
        if display:
            print(f"{name} = {value!r}")
        return
    _myst_glue(name, value, display=display)
