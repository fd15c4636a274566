"""Sphinx extension: the pages with interactive figures load Vega from the book itself, offline.

``nwlib.book.glue_chart`` pastes a Vega-Lite chart as a ``<div class="nwlib-chart">`` and a short
script that calls ``vegaEmbed``. This extension writes the Vega, Vega-Lite and Vega-Embed bundle
(``vl_convert.javascript_bundle()``: no network, no CDN) into the build's static files once per
build, and adds it to the pages whose body holds such a chart, so that the figures work without a
kernel and without a network (the browser check serves nothing from outside the book).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

BUNDLE = "vega-bundle.js"


def _write_bundle(app: Sphinx) -> None:
    if app.builder.format != "html":
        return
    import vl_convert

    folder = Path(app.outdir).parent / "nwlib-static"
    folder.mkdir(parents=True, exist_ok=True)
    # the bundle declares top-level names (const _ ...) that clash with the theme's scripts: wrap it
    # in a function scope; it publishes window.vegaEmbed, window.vega and window.vegaLite itself
    bundle = "(function () {\n" + vl_convert.javascript_bundle() + "\n})();\n"
    (folder / BUNDLE).write_text(bundle, encoding="utf-8")
    app.config.html_static_path.append(str(folder))


def _add_to_pages_with_charts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if 'class="nwlib-chart"' in context.get("body", ""):
        app.add_js_file(BUNDLE, priority=100)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", _write_bundle)
    app.connect("html-page-context", _add_to_pages_with_charts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
