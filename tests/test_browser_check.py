"""The browser check itself: it must pass a good page and fail each kind of broken page.

A tiny book (tests/browser_fixture) is built without -W, so that its deliberately
broken pages (a missing glued value, a TeX error) still produce HTML; a broken image
is made by deleting the pasted figure after the build, and unrendered math by
withholding MathJax, as happens offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
browser_check = pytest.importorskip("browser_check")

pytestmark = pytest.mark.browser


def _require_chromium():
    try:
        browser_check.find_chromium()
    except RuntimeError as err:
        pytest.fail(f"{err} (the browser check is part of the suite; .ci/run installs it)")


@pytest.fixture(scope="module")
def fixture_book(tmp_path_factory) -> Path:
    _require_chromium()
    import nbformat
    from nbclient import NotebookClient

    src = tmp_path_factory.mktemp("book") / "src"
    shutil.copytree(ROOT / "tests" / "browser_fixture", src)
    (src / "notebooks").mkdir(exist_ok=True)  # git keeps no empty folder
    config = src / "_config.yml"
    config.write_text(config.read_text().replace("@BOOK_EXT@", str(ROOT / "book" / "_ext")))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Source notebook"),
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nimport sympy as sp\n"
            "from nwlib.book import glue, glue_figure, glue_math\n"
            "glue('answer', 42.0, exact=True)\n"
            "for name in ('figure', 'second'):\n"
            "    fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, 1], [1, 0]); glue_figure(name, fig); plt.close(fig)\n"
            "x = sp.Symbol('x'); glue_math('equation', sp.Eq(sp.Function('f')(x), sp.sqrt(x) / 2))"
        ),
        nbformat.v4.new_code_cell(
            "import altair as alt, pandas as pd\n"
            "from nwlib.book import glue_chart\n"
            "grid = pd.DataFrame([dict(h=h, x=x, y=x ** h) for h in (1, 2, 3) for x in (0, 0.5, 1)])\n"
            "h = alt.param(value=1, bind=alt.binding_range(min=1, max=3, step=1, name='h'))\n"
            "line = alt.Chart(grid).mark_line().encode(x='x:Q', y='y:Q').add_params(h).transform_filter(alt.datum.h == h)\n"
            "glue_chart('chart', line, 'y = x^h for the chosen h')\n"
            "glue_chart('static_chart', alt.Chart(grid).mark_point().encode(x='x:Q', y='y:Q'), 'every point')"
        ),
    ]
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(src / "notebooks")}}
    ).execute()
    nbformat.write(nb, src / "notebooks" / "source.ipynb")
    out = src.parent
    subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--path-output", str(out)],
        check=True,
        capture_output=True,
    )
    html = out / "_build" / "html"
    # Break one image after the build: the page still references it.
    (html / "_images" / "second.png").unlink()
    return html


def problems(html: Path, page: str, **kwargs) -> list[str]:
    (report,) = browser_check.check_pages(html, [page], **kwargs)
    return report.problems


def test_good_page_passes(fixture_book):
    (report,) = browser_check.check_pages(fixture_book, ["good.html"])
    assert report.ok, report.problems
    assert report.math_elements >= 3  # inline, display and the glued equation
    assert report.charts == 1  # rendered, and its slider redrew it


def test_fails_on_chart_without_control_or_without_vega(fixture_book):
    found = problems(fixture_book, "broken_chart.html")
    assert any("has no control" in p for p in found), found
    # without the book's bundle the page falls back to the CDN, which the check never reaches
    bundle = fixture_book / "_static" / "vega-bundle.js"
    saved = bundle.read_bytes()
    bundle.unlink()
    try:
        found = problems(fixture_book, "good.html")
    finally:
        bundle.write_bytes(saved)
    assert any("did not render" in p for p in found), found


def test_fails_on_unrendered_math(fixture_book):
    found = problems(fixture_book, "good.html", mathjax_dir=None)
    assert any("unrendered math" in p for p in found), found


def test_fails_on_missing_glued_value(fixture_book):
    found = problems(fixture_book, "broken_glue.html")
    assert any("missing glued value" in p for p in found), found


def test_fails_on_broken_image(fixture_book):
    found = problems(fixture_book, "broken_image.html")
    assert any("broken image" in p for p in found), found


def test_fails_on_tex_error(fixture_book):
    found = problems(fixture_book, "broken_math.html")
    assert any("MathJax error" in p for p in found), found


def built_book() -> Path:
    """The built book to check: $NWLIB_BOOK_DIR (relative to the repository root), else _build/html.

    `make test` builds into _build/test/html and points NWLIB_BOOK_DIR there, so that it checks the
    book it has just built, not the one `make book` left in _build/html.
    """
    folder = Path(os.environ.get("NWLIB_BOOK_DIR") or "_build/html")
    return folder if folder.is_absolute() else ROOT / folder


def test_built_book_renders_cleanly():
    book = built_book()
    if not (book / "index.html").is_file():
        # `make test` builds the book first and sets this, so there the check cannot be skipped.
        if os.environ.get("NWLIB_REQUIRE_BOOK"):
            pytest.fail(f"the book is not built in {book}")
        pytest.skip(f"the book is not built in {book} (make html, or set NWLIB_BOOK_DIR)")
    _require_chromium()
    reports = browser_check.check_pages(book)
    assert len(reports) >= 5
    bad = {r.page: r.problems for r in reports if not r.ok}
    assert not bad, json.dumps(bad, indent=1)
    chapters = [r for r in reports if r.page.startswith("book/ch")]
    assert chapters and all(r.math_elements > 0 for r in chapters), "chapters should show typeset math"
