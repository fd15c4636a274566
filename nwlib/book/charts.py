"""Interactive figures for the book: one builder over a precomputed grid, pasted by :func:`glue_chart`.

A chapter computes a grid in its notebook (bandwidths × points, head dimensions × sample sizes, ...)
as a long table and passes it to :func:`explorer`, which returns a Vega-Lite chart (Altair) with one
control per named column: a slider for a numeric column (it steps through the column's values in
order and prints the chosen one), a drop-down menu otherwise. The chart carries its data, so it
runs in the reader's browser with no kernel; :func:`nwlib.book.glue_chart` pastes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import FIGURE_COLOURS

__all__ = ["explorer"]


def _numeric(series: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series))


def explorer(
    frame: Any,
    *,
    x: str,
    y: str,
    controls: Mapping[str, str],
    color: str | None = None,
    se: str | None = None,
    x_title: str,
    y_title: str,
    mark: str = "line",
    log_x: bool = False,
    width: int = 520,
    height: int = 300,
) -> Any:
    """A line (or point) chart of ``y`` against ``x`` with a control for each column of ``controls``.

    Parameters
    ----------
    frame : pandas.DataFrame
        The grid in long form: one row per plotted point.
    x, y : str
        Columns of the axes.
    controls : mapping of str to str
        Column → label of its control (at least one). A numeric column gets a slider over its
        sorted distinct values (the value chosen is printed above the plot), any other a menu.
    color : str, optional
        A column whose values are drawn as separate lines in the book's colours.
    se : str, optional
        A column of standard errors: a band of ±2 SE around each line.
    x_title, y_title : str
        Axis titles, in words (and units).
    mark : {"line", "point"}, default "line"
    log_x : bool, default False
    width, height : int
        Size in pixels (the chart scales down on a phone).

    Returns
    -------
    altair.LayerChart

    Raises
    ------
    ValueError
        If a named column is missing, ``controls`` is empty or ``mark`` is unknown.
    """
    import altair as alt

    needed = [x, y, *controls, *(c for c in (color, se) if c)]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks the column(s) {missing}")
    if not controls:
        raise ValueError("controls must name at least one column")
    if mark not in ("line", "point"):
        raise ValueError(f"mark must be 'line' or 'point', got {mark!r}")
    data = frame.copy()
    filters, params, labels = [], [], []
    for column, label in controls.items():
        name = f"p_{''.join(ch if ch.isalnum() else '_' for ch in column)}"
        values = sorted(data[column].unique()) if _numeric(data[column]) else list(dict.fromkeys(data[column]))
        if _numeric(data[column]):
            step = f"{name}_step"
            data[step] = data[column].map({v: i for i, v in enumerate(values)})
            param = alt.param(
                name=name, value=0, bind=alt.binding_range(min=0, max=len(values) - 1, step=1, name=label)
            )
            filters.append(alt.datum[step] == param)
            labels.append((column, label, step, param))
        else:
            param = alt.param(name=name, value=values[0], bind=alt.binding_select(options=values, name=label))
            filters.append(alt.datum[column] == param)
        params.append(param)
    x_scale = alt.Scale(type="log") if log_x else alt.Undefined
    colour = (
        alt.Color(
            f"{color}:N", title=None, scale=alt.Scale(range=list(FIGURE_COLOURS)), legend=alt.Legend(orient="bottom")
        )
        if color
        else alt.Undefined
    )
    # the grid travels inside the spec as plain JSON values (NaN as null), whatever its size: Altair's
    # row limit guards notebooks against huge outputs, and these grids are small by construction
    values = json.loads(data.to_json(orient="records"))
    base = alt.Chart(alt.InlineData(values=values)).properties(width=width, height=height)
    for f in filters:
        base = base.transform_filter(f)
    enc = dict(x=alt.X(f"{x}:Q", title=x_title, scale=x_scale), y=alt.Y(f"{y}:Q", title=y_title), color=colour)
    drawn = base.mark_line(point=True) if mark == "line" else base.mark_point(filled=True)
    tips = [alt.Tooltip(f"{c}:{'Q' if _numeric(frame[c]) else 'N'}") for c in dict.fromkeys(needed)]
    layers = [drawn.encode(**enc, tooltip=tips)]
    if se:
        band = base.transform_calculate(lo=f"datum['{y}'] - 2 * datum['{se}']", hi=f"datum['{y}'] + 2 * datum['{se}']")
        layers.insert(0, band.mark_area(opacity=0.2).encode(x=enc["x"], y="lo:Q", y2="hi:Q", color=colour))
    for i, (column, label, _step, _param) in enumerate(labels):  # print the slider's value (it shows a step)
        text = base.transform_aggregate(v=f"min({column})").transform_calculate(
            t=f"'{label} = ' + format(datum.v, '.3~g')"
        )
        layers.append(text.mark_text(align="left", baseline="top", x=4, y=4 + 18 * i, fontSize=13).encode(text="t:N"))
    chart = alt.layer(*layers).add_params(*params)
    return chart.configure_axis(labelFontSize=12, titleFontSize=13).configure_legend(labelFontSize=12)
