"""nwlib.book.table: the book's one table style, checked against hand-written expected cells."""

import math

import pandas as pd
import pytest

from nwlib.book import table, with_se
from nwlib.book.tables import header


def plain(frame):
    """The cells with the typesetting undone (no-break spaces, minus signs), to compare digits."""
    return frame.map(lambda c: c.replace("\u00a0", " ").replace("\u2212", "-"))


def test_numeric_cells_are_typeset_and_text_is_not():
    frame = pd.DataFrame({"d": [-0.5], "d SE": [0.1], "x": [-2.5e-5], "note": ["a - b ± c"]})
    shown = table(frame, index=False)
    assert shown.iloc[0].tolist() == ["\u22120.50\u00a0±\u00a00.10", "\u22122.50e\u221205", "a - b ± c"]


def test_estimate_and_se_share_a_cell_rounded_by_the_error():
    frame = pd.DataFrame({"MSE": [0.1012313, 13.412574], "MSE SE": [0.0031, 0.42]})
    shown = plain(table(frame, index=False))
    assert list(shown.columns) == ["MSE"]
    assert list(shown["MSE"]) == ["0.1012 ± 0.0031", "13.41 ± 0.42"]


@pytest.mark.parametrize("spelling", ["{c}_se", "SE ({c})", "{c} SE"])
def test_se_columns_are_found_in_every_spelling(spelling):
    frame = pd.DataFrame({"gain": [0.5], spelling.format(c="gain"): [0.25]})
    assert plain(table(frame, index=False)).iloc[0, 0] == "0.50 ± 0.25"


def test_a_bare_se_column_pairs_with_the_column_before_it():
    frame = pd.DataFrame({"theta": [10.0], "estimate": [2.0], "SE": [0.5]})
    shown = plain(table(frame, index=False))
    assert list(shown.columns) == ["θ", "estimate"]
    assert shown.iloc[0].tolist() == ["10", "2.00 ± 0.50"]


def test_explicit_pairs_override_and_are_checked():
    frame = pd.DataFrame({"a": [1.0], "b": [0.1]})
    assert plain(table(frame, se={"a": "b"}, index=False)).iloc[0, 0] == "1.00 ± 0.10"
    with pytest.raises(ValueError, match="se names the column 'c'"):
        table(frame, se={"c": "b"})


def test_columns_share_decimals_set_by_their_largest_value_and_no_negative_zero():
    frame = pd.DataFrame({"x": [12.3456, 0.00012, -0.00001]})
    # 3 significant digits of 12.3: one decimal, for every row; -0.00001 rounds to 0.0, not -0.0
    assert plain(table(frame, index=False))["x"].tolist() == ["12.3", "0.0", "0.0"]


def test_small_and_large_magnitudes_are_scientific():
    frame = pd.DataFrame({"tiny": [2.5e-5, 1e-6], "huge": [3.2e7, 1.0e6 + 0.5]})
    shown = plain(table(frame, index=False))
    assert shown["tiny"].tolist() == ["2.50e-05", "1.00e-06"]
    assert shown["huge"].tolist() == ["3.20e+07", "1.00e+06"]


def test_integers_booleans_missing_and_text():
    frame = pd.DataFrame({"n": [64, 128], "ok": [True, False], "v": [math.nan, 1.5], "name": ["a", "b"]})
    shown = plain(table(frame, index=False))
    assert shown["n"].tolist() == ["64", "128"]
    assert shown["ok"].tolist() == ["yes", "no"]
    assert shown["v"].tolist() == ["–", "1.50"]
    assert shown["name"].tolist() == ["a", "b"]


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("bias^2", "bias²"),
        ("bias_sq", "bias²"),
        ("theta (deg)", "θ (°)"),
        ("mse_validation", "MSE validation"),
        ("zero MSE", "zero MSE"),
        ("d_k", "d_k"),
        ("hdi_se", "HDI SE"),
    ],
)
def test_headers_read_as_words(raw, words):
    assert header(raw) == words


def test_explicit_headers_and_index_names():
    frame = pd.DataFrame({"mse": [1.0]}, index=pd.Index(["x"], name="num_heads"))
    shown = table(frame, headers={"mse": "mean squared error"})
    assert list(shown.columns) == ["mean squared error"] and shown.index.name == "heads H"


def test_the_cells_are_what_with_se_gives():
    frame = pd.DataFrame({"m": [0.123456], "m_se": [0.0042]})
    assert plain(table(frame, index=False)).iloc[0, 0] == with_se(0.123456, 0.0042) == "0.1235 ± 0.0042"


def test_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="frame"):
        table([[1.0]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="digits"):
        table(pd.DataFrame({"a": [1.0]}), digits=0)
    with pytest.raises(TypeError, match="headers"):
        table(pd.DataFrame({"a": [1.0]}), headers=["a"])  # type: ignore[arg-type]


def test_a_float_index_keeps_its_name():
    frame = pd.DataFrame({"mse": [1.0, 2.0]}, index=pd.Index([0.25, 0.5], name="theta"))
    shown = table(frame)
    assert shown.index.name == "θ" and list(shown.index) == ["0.25", "0.5"]


def test_headers_may_name_the_index():
    frame = pd.DataFrame({"mse": [1.0]}, index=pd.Index(["x"], name="setting"))
    assert table(frame, headers={"setting": "target and kernel"}).index.name == "target and kernel"


def test_a_rounding_level_error_is_no_error():
    frame = pd.DataFrame({"c": [0.0, 0.25], "c SE": [8e-17, 0.01]})
    assert plain(table(frame, index=False))["c"].tolist() == ["0", "0.250 ± 0.010"]
