"""Book tooling: handing computed numbers, equations and figures from a notebook to the book.

Not part of the library's numerical API (and not in ``nwlib.__all__``). A notebook opens with
:func:`start` (device, dtype, threads, profile, seed, provenance, the findings family, the
sizes of the run) and closes with :meth:`Run.finish` (findings, elapsed time); in between it
glues what the book quotes with :func:`glue`, :func:`glue_values`, :func:`glue_verdict`,
:func:`glue_math` and :func:`glue_figure`. Nothing here imports torch at import time (the
device is resolved inside :func:`start`), so tools that read results start quickly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._seeds import require_seed
from ..evidence import Comparison, Findings
from . import _provenance, _timeprofile
from .tables import table

__all__ = [
    "FIGURE_COLOURS",
    "FIGURE_STYLE",
    "Run",
    "glue",
    "glue_chart",
    "glue_code",
    "glue_figure",
    "glue_math",
    "glue_values",
    "glue_verdict",
    "with_se",
    "setup",
    "start",
    "table",
]

FIGURE_STYLE: dict[str, Any] = {
    # Text legible at the page's width: a figure at most 9 in wide is shown about 720 px wide, so
    # 10 pt tick labels come out at 10 px or more (and larger on a phone, where figures scale down less).
    "font.size": 11,
    "axes.titlesize": 11,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.frameon": False,
    "figure.titlesize": 12,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    # opaque white: the PNGs stay readable on the book's dark theme
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.transparent": False,
}
"""The book's one figure style, applied by :func:`start` (matplotlib rc parameters)."""

FIGURE_COLOURS: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
"""The colour cycle: Okabe and Ito's colour-blind-safe palette, a few lines per panel told apart."""


def _apply_figure_style() -> None:
    try:
        import matplotlib as mpl
    except ImportError:  # a notebook without figures needs no matplotlib
        return
    from cycler import cycler  # a dependency of matplotlib

    for key, value in FIGURE_STYLE.items():
        mpl.rcParams[key] = value  # type: ignore[index]  # keys are checked by matplotlib at run time
    mpl.rcParams["axes.prop_cycle"] = cycler(color=list(FIGURE_COLOURS))


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
    df: float | None = None,
) -> None:
    """Store ``value`` under ``name`` for the book (myst-nb glue), and record where it came from.

    The book quotes numbers only through glue, so every notebook calls this, and
    every call appends an entry to the results manifest (see
    :mod:`nwlib.book._provenance`): value, its class (below), notebook, cell, profile, seed,
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
        a sympy expression, a table. A :class:`nwlib.evidence.Comparison` is glued as its
        estimate with its standard error (class ``se=``).
    display : bool, default False
        Whether to also display the value in the notebook itself.
    se, exact, tol, verify
        The value's class (above).
    df : float, optional
        The degrees of freedom of ``se`` (R − 1 for a mean of R replicates); unstated means known.
        A :class:`~nwlib.evidence.Comparison` carries its own.
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
    if isinstance(value, Comparison):  # a Monte Carlo estimate carries its own standard error
        if se is not None or df is not None:
            raise TypeError(f"glue({name!r}): a Comparison carries its se and df; do not give them as well")
        value, se, df = float(value.estimate), float(value.se), value.df
    if df is not None and se is None:
        raise TypeError(f"glue({name!r}): df= qualifies a standard error: give se= as well")
    cls = _value_class(name, value, se=se, exact=exact, tol=tol, verify=verify)
    _provenance.record(name, value, cls=cls, se=se, df=df, tol=tol, dtype=dtype, device=device)
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


_LEGIBILITY_STRICT = True  # tests may turn it off to look at an illegible figure


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

    Raises
    ------
    ValueError
        If the figure is not legible at the page's width (:func:`nwlib.book.figures.legibility_problems`:
        too wide, text too small, a legend on the data, too many lines in a panel).
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a non-empty file stem without '/', got {name!r}")
    if not hasattr(figure, "savefig"):
        raise TypeError(f"figure must be a matplotlib Figure, got {type(figure).__name__}")
    from .figures import legibility_problems

    problems = legibility_problems(figure)
    if problems:
        message = f"figure {name!r} is not legible in the book: " + "; ".join(problems)
        if not _LEGIBILITY_STRICT:
            import warnings

            warnings.warn(message, stacklevel=2)
        else:
            raise ValueError(message)
    path = Path(directory) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    glue(name, figure, display=True)
    return path


class _GluedChart:
    """An interactive Vega-Lite chart: rendered in the browser, no kernel needed.

    The book's HTML pages load the Vega, Vega-Lite and Vega-Embed bundle from their own static
    folder (``book/_ext/interactive.py`` writes it from ``vl_convert``, offline); a notebook
    elsewhere (Jupyter, Colab) loads the same libraries from jsDelivr when the page has none.
    """

    CDN = (
        "https://cdn.jsdelivr.net/npm/vega@6",
        "https://cdn.jsdelivr.net/npm/vega-lite@6",
        "https://cdn.jsdelivr.net/npm/vega-embed@7",
    )

    def __init__(self, name: str, spec: dict[str, Any], description: str) -> None:
        self.name, self.spec, self.description = name, spec, description

    def _repr_html_(self) -> str:
        import html
        import json

        element = f"nwlib-chart-{self.name}"
        spec = json.dumps(self.spec, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
        cdn = json.dumps(list(self.CDN))
        return (
            f'<div class="nwlib-chart" id="{element}" role="figure" aria-label="{html.escape(self.description)}">'
            f"</div>\n<script>(function () {{\n"
            f"  const spec = {spec};\n"
            f"  function draw() {{ window.vegaEmbed('#{element}', spec, {{actions: false, renderer: 'svg'}})"
            f".catch(console.error); }}\n"
            f"  if (window.vegaEmbed) {{ draw(); return; }}\n"
            f"  if (document.querySelector('script[data-nwlib-vega]')) {{\n"
            f"    document.addEventListener('nwlib-vega-ready', draw); return; }}\n"
            f"  const urls = {cdn};\n"
            f"  (function load(i) {{\n"
            f"    if (i === urls.length) {{ document.dispatchEvent(new Event('nwlib-vega-ready')); draw(); return; }}\n"
            f"    const s = document.createElement('script'); s.src = urls[i]; s.dataset.nwlibVega = '1';\n"
            f"    s.onload = () => load(i + 1); document.head.appendChild(s);\n"
            f"  }})(0);\n"
            f"}})();</script>"
        )

    def __repr__(self) -> str:
        return f"[interactive figure {self.name}: {self.description}]"


def glue_chart(name: str, chart: Any, description: str) -> None:
    """Glue an interactive figure (an Altair chart or a Vega-Lite spec) and show it.

    The chart is built in the notebook from a precomputed grid (its data travel inside the spec)
    and runs in the reader's browser: sliders and selections need no kernel. Chapter pages paste
    it inside ``{only} html`` with the ``{glue}`` directive; the PDF shows the chapter's static
    figure instead.

    Parameters
    ----------
    name : str
        Glue key (also the element's id on the page).
    chart : altair.Chart or dict
        The chart, or its Vega-Lite specification (``chart.to_dict()``).
    description : str
        One sentence for screen readers and for the text representation.

    Raises
    ------
    ValueError
        If ``name`` is not an identifier-like key or ``description`` is empty.
    TypeError
        If ``chart`` is neither an Altair chart nor a dict.
    """
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise ValueError(f"name must be a key of letters, digits, _ or -, got {name!r}")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("description must say what the figure shows")
    if isinstance(chart, dict):
        spec = chart
    elif hasattr(chart, "to_dict"):
        spec = chart.to_dict()
    else:
        raise TypeError(f"chart must be an Altair chart or a Vega-Lite dict, got {type(chart).__name__}")
    glue(name, _GluedChart(name, spec, description.strip()), display=True)


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


def glue_values(
    values: Mapping[str, Any],
    *,
    exact: bool | None = None,
    tol: float | None = None,
    verify: bool = True,
    dtype: Any = None,
    device: Any = None,
) -> None:
    """Glue every ``name: value`` of a mapping, all of one class (see :func:`glue`).

    Sizes of a run, a table row's numbers, a dictionary of estimates: one call instead of a
    column of :func:`glue` lines. :class:`nwlib.evidence.Comparison` values carry their own
    standard errors; integers, strings and booleans are exact unless ``verify=False``.

    Parameters
    ----------
    values : Mapping[str, object]
        Glue keys and their values, glued in the mapping's order.
    exact, tol, verify
        The class shared by every real number of the mapping that is not a Comparison
        (as for :func:`glue`).
    dtype, device : optional
        What the values were computed in, when it differs from :func:`start`'s (as for :func:`glue`).

    Raises
    ------
    TypeError
        If ``values`` is not a mapping, or a real number is left without a class.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"values must be a mapping of glue keys to values, got {type(values).__name__}")
    for name, value in values.items():
        where = {"dtype": dtype, "device": device}
        if isinstance(value, Comparison):
            glue(name, value, **where)
        elif _provenance.kind_of(value) in ("int", "str", "bool") or not isinstance(value, (int, float)):
            glue(name, value, verify=verify, **where)
        else:
            glue(name, value, exact=exact, tol=tol, verify=verify, **where)


def glue_verdict(verdict: Any, *, verify_text: bool = False) -> None:
    """Glue a claim's verdict as the ledger and the chapter pages read it, and print it.

    Keys: ``verdict_<claim>_short`` (the label, exact: ``tools/check_verdicts.py`` compares it
    with ``book/verdicts.yaml``), ``verdict_<claim>`` (label and reason),
    ``verdict_<claim>_possible`` (the labels the evidence could have produced, as a phrase:
    “reproduced” or “not reproduced as stated”) and ``verdict_<claim>_decisive`` ("yes" if the
    evidence could have produced another label, "no" if the label could not have come out
    otherwise). A verdict from :func:`nwlib.book.verdicts.judge_readings` also glues
    ``verdict_<claim>_readings`` (every reading tested with its label, the charitable one
    marked) and ``verdict_<claim>_charitable`` (the charitable reading's name); the ledger
    shows both.

    Parameters
    ----------
    verdict : nwlib.book.verdicts.Verdict
        From :func:`nwlib.book.verdicts.judge_readings` (or ``judge``/``decide``).
    verify_text : bool, default False
        Compare the text on reruns as well: only for a reason that quotes no computed number.

    Examples
    --------
    >>> from nwlib.book import _or_list
    >>> _or_list(["reproduced", "reproduced under the paper's conditions", "not reproduced as stated"])
    "“reproduced”, “reproduced under the paper's conditions” or “not reproduced as stated”"
    """
    for attribute in ("claim", "label", "possible", "text", "decisive"):
        if not hasattr(verdict, attribute):
            raise TypeError(f"verdict must be a Verdict from nwlib.book.verdicts, got {type(verdict).__name__}")
    glue(f"verdict_{verdict.claim}_short", verdict.label)
    glue(f"verdict_{verdict.claim}", verdict.text(), verify=verify_text)
    glue(f"verdict_{verdict.claim}_possible", _or_list(verdict.possible))
    glue(f"verdict_{verdict.claim}_decisive", "yes" if verdict.decisive else "no")
    readings = getattr(verdict, "readings", ())
    if readings:
        glue(f"verdict_{verdict.claim}_readings", "; ".join(r.text() for r in readings))
        glue(f"verdict_{verdict.claim}_charitable", verdict.charitable.name)
    print(f"{verdict.claim}: {verdict.text()}")
    for r in readings:
        print(f"  reading {r.text()}")


def with_se(value: float, se: float, *, digits: int = 2) -> str:
    """An estimate and its standard error, the estimate rounded where the error makes it uncertain.

    The standard error keeps ``digits`` significant digits and the estimate is rounded to the same
    decimal place, so a table shows no digit that the Monte Carlo error makes meaningless (and no
    "-0.000"). The book's tables use it for every Monte Carlo column.

    Parameters
    ----------
    value, se : float
        The estimate and its standard error (``se`` ≥ 0). An error of 0, NaN or at rounding level
        (below 1e-12 of max(|value|, 1)) prints the value alone, to 4 significant digits.
    digits : int, default 2
        Significant digits of the standard error.

    Examples
    --------
    >>> with_se(0.1012313, 0.0031)
    '0.1012 ± 0.0031'
    >>> with_se(13.412574, 0.42)
    '13.41 ± 0.42'
    >>> with_se(-0.00004, 0.0012)
    '0.0000 ± 0.0012'
    >>> with_se(1234.7, 56.0)
    '1235 ± 56'
    >>> with_se(-0.0, 0.0)  # no standard error: 4 significant digits, and no "-0"
    '0'
    """
    import math

    value, se = float(value), float(se)
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits must be a positive int, got {digits!r}")
    if math.isnan(value):
        return "–"
    if not math.isfinite(value):
        return "∞" if value > 0 else "−∞"
    if not math.isfinite(se) or se <= 1e-12 * max(abs(value), 1.0):  # none, or at rounding level
        return f"{value if value else 0.0:.4g}"  # -0.0 prints as 0
    decimals = max(0, digits - 1 - math.floor(math.log10(se)))
    shown = round(value, decimals)
    if shown == 0:
        shown = 0.0  # no "-0.000"
    return f"{shown:.{decimals}f} ± {se:.{decimals}f}"


def _or_list(labels: Any) -> str:
    quoted = [f"“{label}”" for label in labels]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass
class Run:
    """A notebook's run, as :func:`start` set it up; :meth:`finish` closes it.

    Attributes
    ----------
    notebook : str
        The notebook's stem (``"ch06_head_count"``), also the findings family's name.
    profile : str
    seed : int
    device : torch.device or None
    dtype : torch.dtype or None
    findings : nwlib.evidence.Findings
        The notebook's family of findings, decided together in :meth:`finish`.
    started : float
        ``time.perf_counter()`` when :func:`start` returned.
    """

    notebook: str
    profile: str
    seed: int
    device: Any
    dtype: Any
    findings: Findings = field(repr=False)
    started: float = field(repr=False)

    def elapsed(self) -> float:
        """Seconds since :func:`start`."""
        return time.perf_counter() - self.started

    def finish(self) -> None:
        """The epilogue: glue and show the findings, stop on an asserted one that fails, glue the time.

        Glues ``elapsed_s`` (informational); under ``NWLIB_TIME_PROFILE`` also writes where the
        time went (:mod:`nwlib.book._timeprofile`). Raises :class:`AssertionError` (from
        :meth:`nwlib.evidence.Findings.check`) if a finding asserted under this profile does not
        hold: then the prose must change, not the experiment.
        """
        if len(self.findings):  # an appendix that states no finding glues no findings table
            self.findings.glue()  # also displays the findings table
        glue("elapsed_s", self.elapsed(), verify=False)
        print(f"{self.notebook}: profile {self.profile}, seed {self.seed}, {self.elapsed():.1f} s")
        _timeprofile.end(self.notebook)  # where the time went, if NWLIB_TIME_PROFILE asks for it
        self.findings.check()


def start(
    notebook: str,
    *,
    profile: str,
    seed: int,
    device: Any = "auto",
    dtype: Any = "float64",
    threads: int | None = None,
    sizes: Mapping[str, Any] | None = None,
) -> Run:
    """The prologue of a notebook: device, dtype, threads, provenance, findings, the run's sizes.

    Resolves ``device`` (:func:`nwlib.resolve_device`), declares the run for every manifest
    entry (:func:`setup`), opens the notebook's family of findings, glues ``profile`` and
    ``device`` and every entry of ``sizes`` (exact: sizes come from the profile), and prints a
    one-line summary.

    Parameters
    ----------
    notebook : str
        The notebook's stem, e.g. ``"ch06_head_count"``; names the findings family.
    profile : str
        The parameter profile (``"quick"``, ``"standard"``, ``"full"``).
    seed : int
        The notebook's seed.
    device : str, torch.device or None, default "auto"
        None for a notebook that computes nothing on a device (an appendix reading result files).
    dtype : str, torch.dtype or None, default "float64"
        The notebook's main dtype. float64 becomes float32 on Apple's MPS, which has no float64.
    threads : int, optional
        Number of CPU threads for torch (``torch.set_num_threads``), applied on CPU only; None
        leaves torch's default.
    sizes : Mapping[str, object], optional
        Sizes and settings of the run (from the profile) to glue, exact.

    Returns
    -------
    Run
    """
    if not isinstance(notebook, str) or not notebook:
        raise TypeError("notebook must be the notebook's stem, a non-empty string")
    _timeprofile.begin()  # a no-op unless NWLIB_TIME_PROFILE names a folder
    seed = require_seed(seed)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    dev = None
    if device is not None or dtype is not None:
        import torch  # here, not at import time: the book tooling starts without torch

        from ..device import resolve_device

        if device is not None:
            dev = resolve_device(device)
        if isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype must name a torch dtype such as 'float64', got {dtype!r}")
            dtype = getattr(torch, dtype)
        if dtype == torch.float64 and dev is not None and dev.type == "mps":
            dtype = torch.float32
        if threads is not None and (dev is None or dev.type == "cpu"):
            torch.set_num_threads(threads)
    setup(profile=profile, seed=seed, device=dev, dtype=dtype)
    _apply_figure_style()
    run = Run(notebook, profile, seed, dev, dtype, Findings(notebook, profile=profile), time.perf_counter())
    glue("profile", profile)
    glue("device", str(dev), verify=False)
    if sizes:
        glue_values(sizes, exact=True)
    print(f"{notebook}: profile {profile}, seed {seed}, device {dev}, dtype {dtype}")
    return run
