"""nwlib.book.charts.explorer: a valid Vega-Lite spec (compiled by vl-convert) with one control per column."""

from __future__ import annotations

import pandas as pd
import pytest

charts = pytest.importorskip("nwlib.book.charts")
vlc = pytest.importorskip("vl_convert")


def _grid():
    return pd.DataFrame(
        [dict(h=h, x=x, y=x**h, se=0.01, arm=arm) for h in (0.5, 1.0, 2.0) for x in (0.1, 0.5, 1.0)
         for arm in ("surrogate", "attention")]
    )  # fmt: skip


def test_slider_for_a_numeric_column_and_menu_for_a_label():
    chart = charts.explorer(_grid(), x="x", y="y", controls={"h": "bandwidth h", "arm": "estimator"}, color="arm",
                            se="se", x_title="x", y_title="y")  # fmt: skip
    spec = chart.to_dict()
    binds = {p["name"]: p["bind"] for p in spec["params"]}
    assert binds["p_h"]["input"] == "range" and (binds["p_h"]["min"], binds["p_h"]["max"]) == (0, 2)
    assert binds["p_arm"]["input"] == "select" and binds["p_arm"]["options"] == ["surrogate", "attention"]
    svg = vlc.vegalite_to_svg(chart.to_json())  # the Vega-Lite compiler accepts it and draws
    assert "<svg" in svg and "bandwidth h = 0.5" in svg  # the slider's first value is printed


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="lacks"):
        charts.explorer(_grid(), x="x", y="nope", controls={"h": "h"}, x_title="x", y_title="y")
    with pytest.raises(ValueError, match="at least one"):
        charts.explorer(_grid(), x="x", y="y", controls={}, x_title="x", y_title="y")
    with pytest.raises(ValueError, match="mark"):
        charts.explorer(_grid(), x="x", y="y", controls={"h": "h"}, x_title="x", y_title="y", mark="bar")


def test_a_grid_above_altairs_row_limit_is_inlined():
    big = pd.DataFrame({"h": [0.1, 0.2] * 3000, "x": range(6000), "y": 1.0})
    spec = charts.explorer(big, x="x", y="y", controls={"h": "h"}, x_title="x", y_title="y").to_dict()
    assert [len(v) for v in spec["datasets"].values()] == [6000]  # one inline dataset, every row
