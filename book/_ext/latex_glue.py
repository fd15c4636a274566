"""Sphinx extension: glued equations and tables in the PDF as math and as tables.

myst-nb resolves a cross-page ``{glue}`` reference from a subset of mime types only: plain text,
HTML and images. For the LaTeX builder that leaves a glued equation (text/latex) printed as its
LaTeX source in a code box, and a glued table (text/html) as the object's repr. This
post-transform runs before myst-nb's (priority 5) in LaTeX builds only and replaces such
references itself:

* an output with ``text/latex`` becomes a displayed equation (a ``math_block``);
* an output whose ``text/html`` holds a ``<table>`` (a pandas DataFrame or Styler) becomes a
  docutils table built from that HTML's cells, so the LaTeX writer typesets, escapes and sizes it
  like any other table of the book.

HTML builds are left to myst-nb (they render text/html and MathJax already).

A second transform keeps notebook code out of the reading PDF: the inputs of code cells are
removed from LaTeX builds (their outputs, the findings tables and printed verdicts, stay), and a
note at the top of each notebook page says where the code is. The HTML book and the notebooks
keep every line.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

_DELIMITERS = re.compile(r"^\s*(\$\$|\\\[|\$)(.*?)(\$\$|\\\]|\$)\s*$", re.S)


def strip_math_delimiters(latex: str) -> str:
    """The LaTeX between ``$$...$$``, ``\\[...\\]`` or ``$...$`` (the text itself without them)."""
    m = _DELIMITERS.match(latex)
    return (m.group(2) if m else latex).strip()


class _TableParser(HTMLParser):
    """The rows of the first ``<table>`` of an HTML fragment: (is_header, [cell text, ...])."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[tuple[bool, list[str]]] = []
        self._depth = 0
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._header_row = False
        self._in_head = False
        self._skip = 0  # inside <style> or <script>

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("style", "script"):
            self._skip += 1
        elif tag == "table":
            self._depth += 1
        elif self._depth == 1:
            if tag == "thead":
                self._in_head = True
            elif tag == "tr":
                self._row, self._header_row = [], self._in_head
            elif tag in ("td", "th") and self._row is not None:
                self._cell = []
            elif tag == "br" and self._cell is not None:
                self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script"):
            self._skip = max(0, self._skip - 1)
        elif tag == "table":
            self._depth -= 1
        elif self._depth == 1:
            if tag == "thead":
                self._in_head = False
            elif tag in ("td", "th") and self._cell is not None and self._row is not None:
                # every whitespace collapsed, the no-break spaces of phrases the HTML keeps whole
                # ("0.2764 ± 0.0013") included: kept, they overflow into the next column of the
                # book's wider tables (measured: 1977 overfull boxes against 590), so the PDF breaks them
                self._row.append(" ".join("".join(self._cell).split()))
                self._cell = None
            elif tag == "tr" and self._row is not None:
                self.rows.append((self._header_row, self._row))
                self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._skip:
            self._cell.append(data)


def table_rows(fragment: str) -> list[tuple[bool, list[str]]]:
    """Header flag and cell texts of each row of the first table in ``fragment`` (empty if none)."""
    parser = _TableParser()
    parser.feed(fragment)
    rows = [(head, cells) for head, cells in parser.rows if cells]
    if not rows:
        return []
    width = max(len(cells) for _, cells in rows)
    return [(head, cells + [""] * (width - len(cells))) for head, cells in rows]


MAX_COLUMNS = 12
"""Columns a table may have in the PDF; a wider one (a notebook's raw data frame) is left to the HTML book."""


def pdf_table(rows: list[tuple[bool, list[str]]]) -> nodes.Element:
    """The table for the PDF, or a one-line note where it is too wide for a page."""
    width = len(rows[0][1])
    if width > MAX_COLUMNS:
        text = f"(A table of {width} columns and {len(rows)} rows: too wide for the page; see the HTML book.)"
        return nodes.paragraph(text, "", nodes.emphasis(text, text))
    return table_node(rows)


MAX_COLWIDTH = 30
"""The widest column, relative to the others (a long text column wraps within it)."""


def table_node(rows: list[tuple[bool, list[str]]]) -> nodes.table:
    """A docutils table of text cells: header rows first, then the body."""
    width = len(rows[0][1])
    group = nodes.tgroup(cols=width)
    # column widths in proportion to their longest text (bounded), given to the LaTeX writer so
    # that it makes wrapping paragraph columns that fit the text width, not columns as wide as a line;
    # a column is never narrower than its longest word (with room for the cell padding), which it
    # cannot wrap: "< 0.0001" beside two long text columns would otherwise be cut
    for column in range(width):
        longest = max(len(cells[column]) for _, cells in rows)
        word = max((len(w) for _, cells in rows for w in cells[column].split()), default=0)
        group += nodes.colspec(colwidth=max(min(max(longest, 4), MAX_COLWIDTH), min(word + 5, MAX_COLWIDTH)))
    head_rows = [cells for is_head, cells in rows if is_head]
    body_rows = [cells for is_head, cells in rows if not is_head]
    for part, part_rows in ((nodes.thead, head_rows), (nodes.tbody, body_rows)):
        if not part_rows:
            continue
        section = part()
        for cells in part_rows:
            row = nodes.row()
            for text in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text, html.unescape(text))
                row += entry
            section += row
        group += section
    table = nodes.table(classes=["glued-table", "colwidths-given"])
    table += group
    return table


class GlueForLatex(SphinxPostTransform):
    """Replace cross-page glue of equations and tables before myst-nb does (LaTeX only)."""

    default_priority = 4
    formats = ("latex",)

    def run(self, **kwargs: Any) -> None:
        from myst_nb.ext.glue.crossref import read_glue_cache
        from myst_nb.ext.glue.utils import PendingGlueReference

        folder = self.env.mystnb_config.output_folder  # type: ignore[attr-defined]
        for node in list(self.document.findall(PendingGlueReference)):
            if node.gtype == "text":
                continue
            output = read_glue_cache(folder, node.refdoc).get(node.key)
            if not output:
                continue  # myst-nb reports the missing key
            data = output.get("data", {})
            if "text/latex" in data:
                latex = strip_math_delimiters(data["text/latex"])
                node.replace_self(nodes.math_block(latex, latex, nowrap=False, number=None))
            elif "<table" in data.get("text/html", ""):
                rows = table_rows(data["text/html"])
                if rows:
                    node.replace_self(pdf_table(rows))


CODE_NOTE = (
    "The code of this notebook is left out of the PDF; it is in the HTML book and in the notebook "
    "itself (notebooks/ in the repository). The outputs below are those of the build."
)


WRAP = 96
"""Characters per line of a printed output in the PDF (a line of thousands overflows TeX's memory)."""


def wrap_lines(text: str, width: int = WRAP) -> str:
    """Each line of ``text`` wrapped at ``width`` characters (continuations indented by two spaces)."""
    import textwrap

    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
        else:
            out.extend(
                textwrap.wrap(
                    line,
                    width,
                    subsequent_indent="  ",
                    break_long_words=True,
                    break_on_hyphens=False,
                    drop_whitespace=True,
                )
                or [""]
            )
    return "\n".join(out)


class DropCodeForLatex(SphinxPostTransform):
    """Remove code-cell inputs from the LaTeX build, with one note per notebook page; wrap outputs."""

    default_priority = 6
    formats = ("latex",)

    def run(self, **kwargs: Any) -> None:
        # a notebook's own table outputs arrive as raw HTML (_config.yml ranks text/html above
        # text/plain for LaTeX, so a DataFrame is not printed as its repr): typeset them as tables
        for raw in list(self.document.findall(nodes.raw)):
            if "html" in raw.get("format", "").split() and "<table" in raw.astext():
                rows = table_rows(raw.astext())
                if rows:
                    raw.replace_self(pdf_table(rows))
        for block in list(self.document.findall(nodes.literal_block)):
            text = block.astext()
            if any(len(line) > WRAP for line in text.splitlines()):
                block.replace_self(nodes.literal_block(wrap_lines(text), wrap_lines(text), **block.attributes))
        inputs = [n for n in self.document.findall(nodes.container) if "cell_input" in n.get("classes", [])]
        if not inputs:
            return
        for node in inputs:
            node.parent.remove(node)
        section = next(iter(self.document.findall(nodes.section)), None)
        if section is not None:
            title = next((i for i, c in enumerate(section.children) if isinstance(c, nodes.title)), -1)
            section.insert(title + 1, nodes.paragraph(CODE_NOTE, "", nodes.emphasis(CODE_NOTE, CODE_NOTE)))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_post_transform(GlueForLatex)
    app.add_post_transform(DropCodeForLatex)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
