"""Check the book's PDF as a reader meets it: no raw LaTeX, no object reprs, nothing past the margin.

    python tools/pdf_check.py _build/test/book.pdf [--log _build/test/book.log]

Reads the PDF with poppler's ``pdftotext`` (text per page, and word boxes with ``-bbox``) and fails
(exit status 1) when a page shows

* LaTeX source instead of typeset math (``\\frac{``, ``\\sqrt``, ``\\mathrm`` ... in the text layer:
  typeset math never puts a backslash command into it);
* a Python object's repr (``<pandas.io.formats.style.Styler at 0x7f...>``) where a table should be;
* a word that reaches into the outer half inch of the paper: content over the right margin, cut
  or about to be (the text block of the book's LaTeX class ends about an inch from the edge).

With ``--log`` it also lists the LaTeX run's overfull boxes wider than ``--overfull-pt``
(informational: a box a few points over the line is invisible; the margin check above is the
gate).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

RAW_LATEX = re.compile(
    r"\\(?:frac|dfrac|sqrt|left|right|mathrm|mathbb|mathcal|mathbf|boldsymbol|operatorname|sum|prod|int|hat|"
    r"tilde|bar|begin|end|cdot|times|leq|geq|le|ge|neq|approx|sim|alpha|beta|gamma|delta|varepsilon|epsilon|"
    r"theta|sigma|rho|kappa|lambda|mu|nu|phi|varphi|pi|log|exp|top|infty|partial|text|quad|qquad|lVert|rVert|"
    r"langle|rangle|ldots|dots|to|in)(?![A-Za-z])"
)
OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]*(?: object)? at 0x[0-9a-fA-F]{6,}>")
MARGIN_PT = 36.0
"""A word whose right edge lies within this many points of the paper's right edge is over the margin."""


@dataclass(frozen=True)
class Problem:
    page: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"page {self.page}: {self.kind}: {self.text}"


def text_problems(pages: list[str]) -> list[Problem]:
    """Raw LaTeX and object reprs in the text of each page (1-based page numbers)."""
    out = []
    for number, page in enumerate(pages, start=1):
        for line in page.splitlines():
            for m in OBJECT_REPR.finditer(line):
                out.append(Problem(number, "object repr", m.group(0)))
            m = RAW_LATEX.search(line)
            if m:
                out.append(Problem(number, "raw LaTeX", line.strip()[:100]))
    return out


class _Boxes(HTMLParser):
    """Page sizes and word boxes from ``pdftotext -bbox`` output."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: list[tuple[float, list[tuple[float, str]]]] = []
        self._word: float | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "page":
            self.pages.append((float(a.get("width") or 0), []))
        elif tag == "word" and self.pages:
            self._word = float(a.get("xmax") or 0)

    def handle_data(self, data: str) -> None:
        if self._word is not None:
            self.pages[-1][1].append((self._word, data.strip()))
            self._word = None


def margin_problems(bbox_html: str, margin_pt: float = MARGIN_PT) -> list[Problem]:
    """Words whose right edge comes within ``margin_pt`` of the page's right edge."""
    parser = _Boxes()
    parser.feed(bbox_html)
    out = []
    for number, (width, words) in enumerate(parser.pages, start=1):
        over = [w for x, w in words if x > width - margin_pt]
        if over:
            out.append(Problem(number, "over the right margin", " ".join(over[:8])))
    return out


def overfull_boxes(log: str, threshold_pt: float) -> list[tuple[float, str]]:
    """The LaTeX log's overfull boxes wider than ``threshold_pt``: (points, the log line)."""
    found = []
    for m in re.finditer(r"Overfull \\hbox \((\d+(?:\.\d+)?)pt too wide\)[^\n]*", log):
        if float(m.group(1)) > threshold_pt:
            found.append((float(m.group(1)), m.group(0)))
    return sorted(found, reverse=True)


def _pdftotext(*args: str) -> str:
    return subprocess.run(["pdftotext", *args, "-"], capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pdf", type=Path)
    parser.add_argument("--log", type=Path, help="the LaTeX log of the run (overfull boxes, informational)")
    parser.add_argument("--overfull-pt", type=float, default=20.0)
    parser.add_argument("--margin-pt", type=float, default=MARGIN_PT)
    args = parser.parse_args(argv)
    if shutil.which("pdftotext") is None:
        print("pdf_check: needs poppler's pdftotext (Debian: poppler-utils)", file=sys.stderr)
        return 2
    if not args.pdf.is_file():
        print(f"pdf_check: no such PDF {args.pdf}", file=sys.stderr)
        return 2
    pages = _pdftotext("-layout", str(args.pdf)).split("\f")
    if pages and not pages[-1].strip():
        pages = pages[:-1]
    problems = text_problems(pages) + margin_problems(_pdftotext("-bbox", str(args.pdf)), args.margin_pt)
    problems.sort(key=lambda p: (p.page, p.kind))
    for p in problems:
        print(p)
    if args.log is not None and args.log.is_file():
        boxes = overfull_boxes(args.log.read_text(errors="replace"), args.overfull_pt)
        print(f"{len(boxes)} overfull boxes wider than {args.overfull_pt:g} pt (informational)")
        for points, line in boxes[:10]:
            print(f"  {points:6.1f} pt  {line[:100]}")
    print(f"pdf_check: {len(pages)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
