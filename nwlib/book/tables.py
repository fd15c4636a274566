"""The book's one table style: estimates with their standard errors, digits the error allows, words for headers.

Every table a chapter shows or glues goes through :func:`table`, so that a reader meets one
style on every page (and in the PDF, where ``book/_ext/latex_glue.py`` typesets the same HTML):

* an estimate and its standard error share one cell, ``0.1012 ± 0.0031``, the estimate rounded
  where its error makes it uncertain (:func:`nwlib.book.with_se`);
* every other real column keeps ``digits`` significant digits of its largest entry, the same
  decimal places down the column so the numbers line up, and never prints ``-0.000``;
* headers are words or typeset symbols (``bias²``, ``θ (°)``, ``MSE``), not code spellings
  (``bias_sq``, ``theta (deg)``, ``mse``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported when a table is made: nwlib.book stays light at import
    import pandas as pd

__all__ = ["header", "table"]

# Whole-header spellings first, then tokens of snake_case headers.
_HEADERS = {
    "bias^2": "bias²",
    "bias_sq": "bias²",
    "theta": "θ",
    "theta (deg)": "θ (°)",
    "theta_deg": "θ (°)",
    "z": "z",
    "n": "n",
    "d_k": "d_k",
    "head_dim": "head dim. d_k",
    "num_heads": "heads H",
    "embed_dim": "embedding dim. D",
}
_TOKENS = {
    "mse": "MSE",
    "se": "SE",
    "hdi": "HDI",
    "rv": "RV",
    "sq": "²",
    "deg": "(°)",
    "nw": "NW",
    "mc": "MC",
    "ci": "CI",
    "iqr": "IQR",
    "sd": "SD",
    "theta": "θ",
    "sigma": "σ",
    "rho": "ρ",
    "tau": "τ",
    "kappa": "κ",
    "alpha": "α",
}
# the SE column of an estimate column ``c``, in the spellings the experiment modules use
_SE_PATTERNS = ("{c} SE", "{c}_se", "SE ({c})", "se ({c})", "{c} se", "SE {c}")


# a subscripted symbol (d_k, d_h, x_i, W_O) stays as it is
_SYMBOL = re.compile(r"^[A-Za-z]_[A-Za-z0-9]{1,2}$")


def header(name: object) -> str:
    """A column header in words: ``"bias_sq"`` → ``"bias²"``, ``"mse_validation"`` → ``"MSE validation"``.

    Headers that are already words (they contain a space, as in ``"d_k = 1"``) and subscripted
    symbols (``d_h``, ``W_O``) are kept; ``^2`` becomes ``²`` everywhere.

    Examples
    --------
    >>> header("bias_sq"), header("theta (deg)"), header("mse_validation"), header("zero MSE")
    ('bias²', 'θ (°)', 'MSE validation', 'zero MSE')
    """
    text = str(name)
    if text in _HEADERS:
        return _HEADERS[text]
    text = text.replace("^2", "²")
    if "_" in text and " " not in text and not _SYMBOL.match(text):
        words = [_TOKENS.get(token.lower(), token) for token in text.split("_") if token]
        text = " ".join(words).replace(" ²", "²")
    return text


def _decimals(values: Any, digits: int) -> int:
    """Decimal places that keep ``digits`` significant digits of the largest finite |value|."""
    finite = [abs(float(v)) for v in values if v is not None and math.isfinite(float(v))]
    largest = max(finite, default=0.0)
    if largest == 0.0:
        return 0 if all(float(v).is_integer() for v in values if math.isfinite(float(v))) else digits
    return max(0, min(8, digits - 1 - math.floor(math.log10(largest))))


def _real(value: Any, decimals: int, scientific: bool, digits: int) -> str:
    number = float(value)
    if math.isnan(number):
        return "–"
    if math.isinf(number):
        return "∞" if number > 0 else "−∞"
    if scientific:
        return f"{number:.{digits - 1}e}"
    shown = round(number, decimals)
    if shown == 0:
        shown = 0.0  # no "-0.000"
    return f"{shown:.{decimals}f}"


def _se_column(frame: pd.DataFrame, column: str) -> str | None:
    for pattern in _SE_PATTERNS:
        candidate = pattern.format(c=column)
        if candidate in frame.columns:
            return candidate
    return None


def table(
    frame: pd.DataFrame,
    *,
    se: Mapping[str, str] | None = None,
    digits: int = 3,
    headers: Mapping[str, str] | None = None,
    index: bool = True,
) -> pd.DataFrame:
    """A table for reading: ``estimate ± SE`` cells, significant digits per column, headers in words.

    Parameters
    ----------
    frame : pandas.DataFrame
        Any table of numbers, strings and booleans.
    se : mapping of str to str, optional
        Estimate column → its standard-error column. Without it, a column ``c`` is paired with
        ``"c SE"``, ``"c_se"`` or ``"SE (c)"`` when the frame has one, and a column named ``"SE"``
        with the column just before it. Paired SE columns are dropped; their estimates are shown
        as :func:`nwlib.book.with_se` gives them.
    digits : int, default 3
        Significant digits of every other real column, taken from its largest |value|, so that the
        column shares its decimal places; magnitudes below 1e-3 or above 1e6 print in scientific
        notation. Integers stay integers and booleans read ``yes``/``no``.
    headers : mapping of str to str, optional
        Explicit headers (applied after the pairing, to the original column names); every other
        header goes through :func:`header`. The index names are translated the same way (and
        ``headers`` may name them too).
    index : bool, default True
        Whether the index carries information; ``False`` drops a default range index.

    Returns
    -------
    pandas.DataFrame
        Strings only, ready to display or glue (its HTML is a plain table that the book's style
        sheet pads and aligns). Numeric cells are typeset: a minus sign (U+2212) for the hyphen and
        no-break spaces around ±, so that a narrow column never breaks inside a number.

    Raises
    ------
    TypeError
        If ``frame`` is not a DataFrame or ``se``/``headers`` is not a mapping.
    ValueError
        If ``digits`` is not a positive int, or ``se`` names a column the frame lacks.

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"theta (deg)": [0.0, 45.0], "MSE": [0.10123, 0.0817], "MSE SE": [0.0031, 0.0029],
    ...                       "bias_sq": [0.012345, -0.00001]})
    >>> shown = table(frame, index=False)
    >>> list(shown.columns), shown["bias²"].tolist()
    (['θ (°)', 'MSE', 'bias²'], ['0.0123', '0.0000'])
    >>> shown["MSE"][0] == "0.1012\u00a0±\u00a00.0031"  # no line break inside an estimate
    True
    """
    import pandas as pd
    from pandas.api import types

    from . import with_se

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
        raise ValueError(f"digits must be a positive int, got {digits!r}")
    for argument, mapping in (("se", se), ("headers", headers)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise TypeError(f"{argument} must be a mapping of column names, got {type(mapping).__name__}")
    columns = [str(c) for c in frame.columns]
    frame = frame.set_axis(columns, axis=1)
    pairs: dict[str, str] = {}
    if se is not None:
        for est, err in se.items():
            for name in (est, err):
                if name not in columns:
                    raise ValueError(f"se names the column {name!r}, which the frame does not have")
            pairs[est] = err
    else:
        for i, column in enumerate(columns):
            if column == "SE" and i > 0 and columns[i - 1] not in pairs:
                pairs[columns[i - 1]] = column
            elif (found := _se_column(frame, column)) is not None and column not in pairs.values():
                pairs[column] = found
    out = {}
    for column in columns:
        if column in pairs.values():
            continue
        values = frame[column]
        if column in pairs:
            out[column] = [with_se(v, s) for v, s in zip(values, frame[pairs[column]], strict=True)]
        elif types.is_bool_dtype(values):
            out[column] = ["yes" if v else "no" for v in values]
        elif types.is_integer_dtype(values):
            out[column] = [str(int(v)) for v in values]
        elif types.is_float_dtype(values):
            finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
            scientific = bool(finite) and (max(finite) < 1e-3 or max(finite) >= 1e6)
            if all(float(v).is_integer() for v in values if math.isfinite(v)):
                out[column] = [_real(v, 0, False, digits) for v in values]
            else:
                places = _decimals(values, digits)
                out[column] = [_real(v, places, scientific, digits) for v in values]
        else:
            out[column] = [_cell(v, digits) for v in values]
    out = {c: [_typeset(v) for v in values] for c, values in out.items()}
    names = {c: (headers or {}).get(c, header(c)) for c in out}
    shown = pd.DataFrame({names[c]: v for c, v in out.items()}, index=frame.index)
    if not index:
        shown = shown.reset_index(drop=True)
    else:
        shown.index = shown.index.set_names(
            [None if n is None else (headers or {}).get(str(n), header(n)) for n in shown.index.names]
        )
        if isinstance(shown.index, pd.MultiIndex) or not types.is_float_dtype(shown.index):
            return shown
        shown.index = pd.Index([_typeset(_cell(v, digits)) for v in shown.index], name=shown.index.name)
    return shown


_NUMBER = re.compile(r"^-?\d[\d.]*(e[+-]\d+)?( ± \d[\d.]*(e[+-]\d+)?)?$")


def _typeset(cell: str) -> str:
    """A numeric cell as typeset: a minus sign (−) for the hyphen, no line break around ±."""
    if not _NUMBER.match(cell):
        return cell
    return cell.replace(" ± ", "\u00a0±\u00a0").replace("-", "\u2212")


def _cell(value: Any, digits: int) -> str:
    """One cell of an object column: numbers with ``digits`` significant digits, the rest as text."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        shown = float(f"{value:.{digits}g}")
        return re.sub(r"^-0(\.0*)?$", lambda m: m.group(0)[1:], f"{shown:g}")
    return str(value)
