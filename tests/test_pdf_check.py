"""tools/pdf_check.py finds what a PDF reader should never see: LaTeX source, reprs, text past the margin."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import pdf_check  # noqa: E402


def test_raw_latex_and_object_reprs_are_found_with_their_page():
    pages = [
        "Typeset math: HDI(θ) = r sin²(θ)/d_k, fine.",
        "A glued equation as source: \\frac{r \\sin^{2}{\\left(\\theta \\right)}}{d_{k}}",
        "A table as its repr: <pandas.io.formats.style.Styler at 0x7fa973098690> and <Foo object at 0xdeadbeef12>",
    ]
    problems = pdf_check.text_problems(pages)
    assert [(p.page, p.kind) for p in problems] == [(2, "raw LaTeX"), (3, "object repr"), (3, "object repr")]
    assert "Styler at 0x7fa973098690" in problems[1].text


def test_prose_with_backslash_free_math_and_paths_passes():
    assert pdf_check.text_problems(["C:\\Users is not a command list; W_Q ≠ W_K; a\\b", "pandas at 0x12"]) == []


def test_words_in_the_outer_half_inch_are_over_the_margin():
    bbox = (
        '<doc><page width="612.0" height="792.0">'
        '<word xMin="72" yMin="80" xMax="540.0" yMax="90">inside</word>'
        '<word xMin="500" yMin="100" xMax="590.5" yMax="110">outside</word>'
        '</page><page width="612.0" height="792.0"><word xMin="72" yMin="80" xMax="100" yMax="90">ok</word></page></doc>'
    )
    problems = pdf_check.margin_problems(bbox.replace("xMax", "xmax"))
    assert [(p.page, p.text) for p in problems] == [(1, "outside")]


def test_overfull_boxes_above_the_threshold_sorted():
    log = (
        "Overfull \\hbox (3.2pt too wide) in paragraph\nOverfull \\hbox (45.0pt too wide) in alignment\n"
        "Overfull \\hbox (25.5pt too wide) detected"
    )
    assert [p for p, _ in pdf_check.overfull_boxes(log, 20.0)] == [45.0, 25.5]
