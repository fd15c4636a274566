"""Sphinx extension: every glued number in the HTML prose shows where it came from on hover.

``nwlib.book.glue`` writes, beside each executed notebook, a results manifest
(``<notebook>.provenance.jsonl``: notebook, cell, profile, seed, device, dtype,
commit, versions, time). Before myst-nb replaces a cross-page ``{glue:text}``
reference by its value, this post-transform wraps the reference in an
abbreviation node whose explanation is that entry; HTML renders it as
``<abbr title="...">``, so hovering a number shows its origin. The LaTeX writer
would print the explanation in the text, so the PDF is left as it is; the
Provenance appendix lists every entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

SUFFIX = ".provenance.jsonl"


def describe(entry: dict[str, Any]) -> str:
    """One line for a tooltip: where and how a glued value was computed."""
    cell = entry.get("execution_count")
    where = f"notebook {entry['notebook']}" + (f", cell [{cell}]" if cell is not None else "")
    run = ", ".join(
        f"{name} {entry[name]}" for name in ("profile", "seed", "device", "dtype") if entry.get(name) is not None
    )
    commit = str(entry.get("commit", "unknown"))[:10] + (" (dirty tree)" if entry.get("dirty") else "")
    cls = entry.get("cls")
    how = {
        "mc": f"Monte Carlo estimate, SE {entry.get('se'):.2g}" if entry.get("se") is not None else "Monte Carlo",
        "exact": "exact",
        "fp": f"deterministic, to within {entry.get('tol') or 0:.1g}",
        "info": "informational",
    }.get(cls or "", "")
    return (
        f"{entry['key']}: {where}; {run}"
        + (f"; {how}" if how else "")
        + f"; commit {commit}, nwlib {entry.get('nwlib')}, torch {entry.get('torch')}; {entry.get('time')}"
    )


class AnnotateGlueProvenance(SphinxPostTransform):
    """Wrap pending glue references in abbreviations carrying their manifest entry (HTML only)."""

    default_priority = 4  # before myst-nb's ReplacePendingGlueReferences (5) resolves them
    formats = ("html",)

    def run(self, **kwargs: Any) -> None:  # SphinxPostTransform.apply calls it for HTML builders only
        from myst_nb.ext.glue.utils import PendingGlueReference

        cache: dict[str, dict[str, dict[str, Any]]] = self.env.app.__dict__.setdefault("_nwlib_provenance", {})
        srcdir = Path(self.env.srcdir)
        for node in list(self.document.findall(PendingGlueReference)):
            if node.gtype != "text":
                continue
            doc = node.refdoc
            if doc not in cache:
                path = srcdir / f"{doc}{SUFFIX}"
                entries = (
                    [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                    if path.is_file()
                    else []
                )
                cache[doc] = {e["key"]: e for e in entries}
            entry = cache[doc].get(node.key)
            if entry is None:
                continue
            wrapper = nodes.abbreviation("", "", explanation=describe(entry), classes=["glue-provenance"])
            node.replace_self(wrapper)
            wrapper.append(node)


def _add_static(app: Sphinx) -> None:
    app.config.html_static_path.append(str(Path(__file__).parent / "static"))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_post_transform(AnnotateGlueProvenance)
    # the book's reading styles: glued numbers as plain text, wide content scrolls (static/nwlib.css)
    app.connect("builder-inited", _add_static)
    app.add_css_file("nwlib.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
