"""Book tooling: handing computed numbers, equations and figures from a notebook to the book.

Not part of the library's numerical API (and not in ``nwlib.__all__``): the
notebooks import these with ``from nwlib.book import glue, glue_figure, glue_math``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import _provenance

__all__ = ["glue", "glue_code", "glue_figure", "glue_math", "setup"]


_CLASSES = "se=<its Monte Carlo standard error>, exact=True, tol=<a floating-point tolerance> or verify=False"


def setup(*, profile: str, seed: int, device: Any, dtype: Any) -> None:
    """Declare the run's parameters once, at the top of a notebook, for every manifest entry.

    Entries record the profile and the seed given here, and the device and dtype given here
    unless the glued value is a tensor (then its own) or :func:`glue` names others (``dtype=``,
    ``device=``: a value computed in float32 in a float64 notebook, say).

    Parameters
    ----------
    profile : str
    seed : int
    device : torch.device, str or None
        None for a notebook that computes nothing on a device (an appendix reading result files).
    dtype : torch.dtype, str or None
        The notebook's main dtype; None where it has none.
    """
    _provenance.set_run(profile=profile, seed=seed, device=device, dtype=dtype)


def glue(
    name: str,
    value: Any,
    display: bool = False,
    *,
    se: float | None = None,
    exact: bool | None = None,
    tol: float | None = None,
    verify: bool = True,
    dtype: Any = None,
    device: Any = None,
) -> None:
    """Store ``value`` under ``name`` for the book (myst-nb glue), and record where it came from.

    The book quotes numbers only through glue, so every notebook calls this, and
    every call appends an entry to the results manifest (see
    :mod:`nwlib._provenance`): value, its class (below), notebook, cell, profile, seed,
    device, dtype, commit, whether the working tree was dirty, versions and time. Where
    myst-nb is absent (Colab, a plain Jupyter install) the glue itself is a no-op, so that
    the notebooks still run there.

    Every real number names its class, which says how a rerun (another seed, another machine)
    is compared with the reference (``make verify``, ``make robustness``); a float without one is
    refused:

    * ``se=``: a Monte Carlo estimate and its standard error (compared within the family-wise
      number of combined standard errors, :func:`nwlib.evidence.family_threshold`);
    * ``exact=True``: exact by construction, the same on every machine and seed (a size from the
      profile, a rational from sympy);
    * ``tol=``: deterministic given the seed, up to floating-point rounding
      (:func:`nwlib.evidence.fp_tolerance` derives it from the dtype and the conditioning);
    * ``verify=False``: informational (timings, a seed-dependent value with no standard error,
      text carrying rounding-level numbers): recorded, not compared.

    Integers, strings and booleans are exact unless ``verify=False``.

    Parameters
    ----------
    name : str
        Key referenced from the book as ``{glue:text}`path/to/notebook.ipynb::name```.
    value : object
        Anything IPython can display: a number, a string, a matplotlib figure,
        a sympy expression, a table.
    display : bool, default False
        Whether to also display the value in the notebook itself.
    se, exact, tol, verify
        The value's class (above).
    dtype, device : optional
        What the value was computed in, when it is not a tensor and differs from
        :func:`setup`'s.

    Raises
    ------
    TypeError
        If ``name`` is not a non-empty string, or a real number has no class or more than one.
    ValueError
        If ``se`` or ``tol`` is negative or not finite.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty string")
    cls = _value_class(name, value, se=se, exact=exact, tol=tol, verify=verify)
    _provenance.record(name, value, cls=cls, se=se, tol=tol, dtype=dtype, device=device)
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # the notebook runs outside the book toolchain
        if display:
            print(f"{name} = {value!r}")
        return
    _myst_glue(name, value, display=display)


def _value_class(name: str, value: Any, *, se: Any, exact: bool | None, tol: Any, verify: bool) -> str:
    """The value's class for reruns: 'mc', 'exact', 'fp', 'info' or (not a number) 'other'."""
    for arg, given in (("se", se), ("tol", tol)):
        if given is not None:
            given = float(given)
            if not math.isfinite(given) or given < 0:
                raise ValueError(f"{arg} of {name!r} must be finite and non-negative, got {given}")
    chosen = [
        c
        for c, on in (
            ("mc", se is not None),
            ("exact", exact is True),
            ("fp", tol is not None),
            ("info", verify is False),
        )
        if on
    ]
    if len(chosen) > 1:
        raise TypeError(f"glue({name!r}): give one class of {_CLASSES}, got {' and '.join(chosen)}")
    kind = _provenance.kind_of(value)
    if chosen:
        if chosen[0] in ("mc", "fp") and kind not in ("float", "int"):
            raise TypeError(f"glue({name!r}): se= and tol= are for numbers, got {type(value).__name__}")
        return chosen[0]
    if kind == "float":
        raise TypeError(f"glue({name!r}): a real number needs its class: {_CLASSES}")
    return "exact" if kind in ("int", "str", "bool") else "other"


class _GluedMath:
    """Displays as LaTeX in a notebook and as MathJax-ready HTML on another book page.

    myst-nb's cross-page ``{glue}`` renders text/html but not text/latex, so the HTML
    form carries the ``math`` class that the book's MathJax configuration typesets.
    """

    def __init__(self, latex: str) -> None:
        self.latex = latex

    def _repr_latex_(self) -> str:
        return f"$$\n{self.latex}\n$$"

    def _repr_html_(self) -> str:
        escaped = self.latex.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return f'<div class="math notranslate nohighlight glued-math">\\[{escaped}\\]</div>'

    def __repr__(self) -> str:
        return self.latex


def glue_math(name: str, expression: Any, display: bool = True) -> None:
    """Glue a displayed equation: a sympy object (or a LaTeX string) shown as math.

    Quote it from a chapter page with the ``{glue}`` directive and its ``:doc:`` option
    (``{glue:math}`` does not reach across pages)::

        ```{glue} key
        :doc: ../notebooks/chNN_name.ipynb
        ```

    Parameters
    ----------
    name : str
        The glue key.
    expression : sympy.Basic or str
        A sympy expression or relation (``sympy.Eq``), typeset with ``sympy.latex``,
        or a LaTeX string used as is.
    display : bool, default True
        Whether to also display the equation in the notebook.
    """
    if isinstance(expression, str):
        latex = expression
    else:
        import sympy

        latex = sympy.latex(expression)
    glue(name, _GluedMath(latex), display=display)


def glue_figure(name: str, figure: Any, directory: str | Path = "figures", dpi: int = 150) -> Path:
    """Show a matplotlib figure in the notebook, glue it, and save it as ``<directory>/<name>.png``.

    Chapter pages include the saved file with the ``{figure}`` directive
    (``../notebooks/figures/<name>.png``): myst-nb pastes images across pages
    without registering them with Sphinx, so a cross-page ``{glue}`` figure is
    never copied into the built site. The book's notebooks run in
    ``_build/stage/notebooks``, so the file lands beside the executed notebook.

    Parameters
    ----------
    name : str
        Glue key and file stem.
    figure : matplotlib.figure.Figure
    directory : str or Path, default "figures"
        Relative to the notebook's working directory.
    dpi : int, default 150

    Returns
    -------
    Path
        Where the PNG was written.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a non-empty file stem without '/', got {name!r}")
    if not hasattr(figure, "savefig"):
        raise TypeError(f"figure must be a matplotlib Figure, got {type(figure).__name__}")
    path = Path(directory) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    glue(name, figure, display=True)
    return path


class _GluedCode:
    """A code block: plain text in a notebook, a highlighted ``<pre>`` on another book page."""

    def __init__(self, text: str, language: str) -> None:
        self.text, self.language = text, language

    def _repr_html_(self) -> str:
        escaped = self.text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return (
            f'<div class="glued-code highlight-{self.language} notranslate">'
            f'<div class="highlight"><pre>{escaped}</pre></div></div>'
        )

    def __repr__(self) -> str:
        return self.text


def glue_code(name: str, text: str, language: str = "text", display: bool = True) -> None:
    """Glue a block of code or text computed by the notebook (a BibTeX entry, a command line).

    Quote it from a chapter page with the ``{glue}`` directive and its ``:doc:`` option, as
    for :func:`glue_math`. A fenced code block on a page cannot show computed text: MyST does
    not substitute inside code.

    Parameters
    ----------
    name : str
        The glue key.
    text : str
        The block's content, shown verbatim.
    language : str, default "text"
        Pygments language name, used as a CSS class (``highlight-<language>``).
    display : bool, default True
        Whether to also display the block in the notebook.

    Examples
    --------
    >>> from nwlib.book import _GluedCode
    >>> _GluedCode("a < b", "text")._repr_html_()
    '<div class="glued-code highlight-text notranslate"><div class="highlight"><pre>a &lt; b</pre></div></div>'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    if not isinstance(language, str) or not language.isidentifier():
        raise ValueError(f"language must be a Pygments name such as 'bibtex', got {language!r}")
    glue(name, _GluedCode(text, language), display=display)
