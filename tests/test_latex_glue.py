"""book/_ext/latex_glue.py: glued tables and equations become real tables and math in the PDF."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))

import latex_glue  # noqa: E402


@pytest.mark.parametrize("styled", [False, True])
def test_table_rows_read_a_dataframe_and_a_styler_as_displayed(styled):
    df = pd.DataFrame({"MSE": [0.1012313, 13.412574], "bias^2": [1e-3, 2e-3]}, index=["one head", "ensemble"])
    shown = df.style.format("{:.3f}") if styled else df
    rows = latex_glue.table_rows(shown.to_html())
    heads = [cells for head, cells in rows if head]
    body = [cells for head, cells in rows if not head]
    assert heads and heads[0][-2:] == ["MSE", "bias^2"]
    if styled:  # the Styler's formatting is what the PDF shows, not the raw floats
        assert body == [["one head", "0.101", "0.001"], ["ensemble", "13.413", "0.002"]]
    else:
        assert body[0][0] == "one head" and body[0][1].startswith("0.1012")
    assert len({len(cells) for _, cells in rows}) == 1  # every row as wide as the table


def test_table_node_has_given_widths_and_header():
    node = latex_glue.table_node([(True, ["a", "long column"]), (False, ["1", "x" * 100])])
    assert "colwidths-given" in node["classes"]
    widths = [c["colwidth"] for c in node.findall(latex_glue.nodes.colspec)]
    assert widths == [6, latex_glue.MAX_COLWIDTH]  # bounded below (a word and its padding) and above
    assert node.astext().split()[:2] == ["a", "long"]


def test_a_narrow_column_keeps_room_for_its_longest_word():
    long = "a finding stated in a whole sentence that wraps over several lines " * 2
    rows = [(True, ["finding", "Holm p", "power"]), (False, [long, "< 0.0001", "1.000"])]
    widths = [c["colwidth"] for c in latex_glue.table_node(rows).findall(latex_glue.nodes.colspec)]
    assert widths == [latex_glue.MAX_COLWIDTH, len("0.0001") + 5, len("power") + 5]


def test_math_delimiters_and_output_wrapping():
    assert latex_glue.strip_math_delimiters("$$\n\\frac{a}{b}\n$$") == "\\frac{a}{b}"
    assert latex_glue.strip_math_delimiters("\\[x^2\\]") == "x^2"
    assert latex_glue.strip_math_delimiters("x + y") == "x + y"
    wrapped = latex_glue.wrap_lines("short\n" + "word " * 60, width=40)
    assert all(len(line) <= 40 for line in wrapped.splitlines()) and wrapped.startswith("short\n")
    assert wrapped.splitlines()[2].startswith("  ")  # continuation lines are indented


def test_a_table_too_wide_for_the_page_becomes_a_note():
    wide = [(True, [f"c{i}" for i in range(20)]), (False, [str(i) for i in range(20)])]
    node = latex_glue.pdf_table(wide)
    assert isinstance(node, latex_glue.nodes.paragraph) and "20 columns" in node.astext()
    assert isinstance(latex_glue.pdf_table(wide[:1] + [(False, ["1"] * 20)]), latex_glue.nodes.paragraph)
    narrow = [(True, ["a", "b"]), (False, ["1", "2"])]
    assert isinstance(latex_glue.pdf_table(narrow), latex_glue.nodes.table)
