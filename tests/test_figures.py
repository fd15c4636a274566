"""nwlib.book.figures.legibility_problems, on figures built to be legible or not (matplotlib, Agg)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from nwlib.book import _apply_figure_style, glue_figure  # noqa: E402
from nwlib.book import figures as legible  # noqa: E402

X = np.linspace(0.0, 1.0, 40)


@pytest.fixture(autouse=True)
def style():
    _apply_figure_style()
    yield
    plt.close("all")


def test_a_figure_in_the_book_style_has_no_problem():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.plot(X, X**4, label="x⁴")
    a.legend(loc="upper left")  # the curve stays near 0 on the left: the legend is off it
    b.bar([0, 1], [1, 2])
    assert legible.legibility_problems(fig) == []


def test_width_small_text_and_many_lines_are_reported():
    fig, ax = plt.subplots(figsize=(14, 3))
    for k in range(legible.MAX_LINES + 2):
        ax.plot(X, k * X)
    ax.set_xlabel("θ", fontsize=7)
    problems = legible.legibility_problems(fig)
    assert problems[0] == "14.0 in wide (at most 9.0 in)"
    assert "text 'θ' at 7.0 pt (at least 9.0 pt)" in problems
    assert f"'panel 1': {legible.MAX_LINES + 2} data lines (at most {legible.MAX_LINES} per panel)" in problems


def test_a_legend_on_a_line_between_its_points_is_found():
    # two points only, far apart: the line crosses the legend's box between them
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0.0, 1.0], [1.0, 0.0], label="diagonal")
    ax.set_title("crossing")
    ax.legend(loc="center")
    (problem,) = legible.legibility_problems(fig)
    assert problem.startswith("'crossing': its legend covers")


def test_a_legend_on_markers_and_on_bars_is_found():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.scatter(np.full(5, 0.5), np.linspace(0.4, 0.6, 5), label="points")
    a.legend(loc="center")
    b.bar([0, 1, 2], [1.0, 1.0, 1.0], label="bars")
    b.legend(loc="lower center")
    assert len(legible.legibility_problems(fig)) == 2


def test_a_figure_legend_outside_the_panels_is_fine():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(X, X, label="x")
    fig.legend(loc="outside lower center")
    assert legible.legibility_problems(fig) == []


def test_bad_input():
    with pytest.raises(TypeError, match="figure"):
        legible.legibility_problems("not a figure")


def test_glue_figure_refuses_an_illegible_figure(tmp_path, monkeypatch):
    import nwlib.book as book

    monkeypatch.setattr(book, "_LEGIBILITY_STRICT", True)
    fig, ax = plt.subplots(figsize=(12, 3))
    ax.plot(X, X)
    with pytest.raises(ValueError, match=r"figure 'wide' is not legible in the book: 12.0 in wide"):
        glue_figure("wide", fig, directory=tmp_path)
    assert not (tmp_path / "wide.png").exists()


def test_error_bar_caps_are_not_counted_as_lines():
    fig, ax = plt.subplots(figsize=(6, 3))
    for k in range(legible.MAX_LINES):
        ax.errorbar(X[::8], k + X[::8], yerr=0.1, capsize=3)
    assert legible.legibility_problems(fig) == []


def test_a_legend_below_log_scale_bars_is_off_them():
    # bars from 0 on a log axis reach -inf in display space: only their visible part counts
    fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
    ax.bar([0, 1], [10.0, 100.0], label="bars")
    ax.set_yscale("log")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15))
    assert legible.legibility_problems(fig) == []
