"""What makes a figure legible in the book, checked on the figure itself before it is glued.

:func:`nwlib.book.glue_figure` refuses a figure that a reader could not read at the page's width
(:func:`legibility_problems` lists why), so the one figure style holds for every figure of every
chapter rather than by review:

* at most :data:`MAX_WIDTH_IN` inches wide: the book's column shows a figure about 720 px wide, so
  the style's 10 pt tick labels stay at 10 px or more (on a phone the figure scrolls sideways at a
  legible width rather than shrinking, ``book/_ext/static/nwlib.css``);
* no text smaller than :data:`MIN_FONT_PT` points (an explicit ``fontsize=7`` in a notebook is
  what this catches);
* no legend on the data: no point of a line or marker of its axes falls inside the legend's box
  (lines are sampled between their points, so a line crossing the box counts), and no bar meets it;
* at most :data:`MAX_LINES` data lines per panel, so that each can be told apart (an error bar's caps
  are not lines of their own).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_LINES", "MAX_WIDTH_IN", "MIN_FONT_PT", "legibility_problems"]

MAX_WIDTH_IN = 9.0
"""Widest figure, in inches (about 720 px in the book's column at the style's font sizes)."""
MIN_FONT_PT = 9.0
"""Smallest text, in points."""
MAX_LINES = 6
"""Most data lines (three points or more) in one panel."""


def _line_points(line: Any, samples: int = 12) -> Any:
    """A line's vertices in display coordinates, with ``samples`` points between consecutive ones."""
    import numpy as np

    xy = line.get_transform().transform(np.column_stack([line.get_xdata(orig=False), line.get_ydata(orig=False)]))
    xy = xy[np.all(np.isfinite(xy), axis=1)]
    if len(xy) < 2 or line.get_linestyle() in ("None", "none", " ", ""):
        return xy
    t = np.linspace(0.0, 1.0, samples, endpoint=False)[:, None, None]
    between = xy[:-1][None] + t * (xy[1:] - xy[:-1])[None]
    return np.concatenate([between.reshape(-1, 2), xy[-1:]])


def _data_points(ax: Any) -> Any:
    """Every drawn data point of an axes in display coordinates (lines, markers, bars)."""
    import numpy as np
    from matplotlib.collections import PathCollection

    chunks = [np.empty((0, 2))]
    for line in ax.get_lines():
        if line.get_visible() and np.size(line.get_xdata(orig=False)) >= 1:
            chunks.append(_line_points(line))
    for collection in ax.collections:
        if isinstance(collection, PathCollection) and collection.get_visible():
            offsets = np.asarray(collection.get_offsets())
            if offsets.size:
                chunks.append(collection.get_offset_transform().transform(offsets))
    return np.concatenate(chunks)


def _bars(ax: Any) -> list[Any]:
    """The display boxes of an axes' bars (rectangles with an area), clipped to the axes.

    Clipping matters on a log axis, where a bar from 0 reaches down to -inf in display space.
    """
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import Bbox

    boxes = []
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_width() and patch.get_height():
            box = Bbox.intersection(patch.get_window_extent(), ax.bbox)
            if box is not None:
                boxes.append(box)
    return boxes


def legibility_problems(figure: Any) -> list[str]:
    """Why a matplotlib figure would be hard to read in the book; empty when it is fine.

    Parameters
    ----------
    figure : matplotlib.figure.Figure

    Returns
    -------
    list of str
        One sentence per problem: the width, each text below :data:`MIN_FONT_PT`, each legend over
        data (with its panel's title), each panel with more than :data:`MAX_LINES` lines.

    Raises
    ------
    TypeError
        If ``figure`` is not a matplotlib Figure.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots(figsize=(12, 3))
    >>> _ = ax.set_title("wide", fontsize=7)
    >>> legibility_problems(fig)  # doctest: +NORMALIZE_WHITESPACE
    ['12.0 in wide (at most 9.0 in)', "text 'wide' at 7.0 pt (at least 9.0 pt)"]
    >>> plt.close(fig)
    """
    import numpy as np
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    if not isinstance(figure, Figure):
        raise TypeError(f"figure must be a matplotlib Figure, got {type(figure).__name__}")
    problems = []
    width = float(figure.get_figwidth())
    if width > MAX_WIDTH_IN + 1e-9:
        problems.append(f"{width:.1f} in wide (at most {MAX_WIDTH_IN:.1f} in)")
    figure.canvas.draw()  # ticks, legends and their boxes exist only once drawn
    seen = set()
    for text in figure.findobj(Text):
        label = text.get_text().strip()
        if not label or not text.get_visible() or (label, float(text.get_fontsize())) in seen:
            continue
        size = float(text.get_fontsize())
        if size < MIN_FONT_PT - 1e-9:
            seen.add((label, size))
            problems.append(f"text {label[:40]!r} at {size:.1f} pt (at least {MIN_FONT_PT:.1f} pt)")
    for ax in figure.axes:
        name = ax.get_title() or f"panel {figure.axes.index(ax) + 1}"
        own = ax.get_legend()
        legends = [own] if own is not None else []
        legends += [lg for lg in figure.legends if lg.get_visible()]
        if legends:
            points = _data_points(ax)
            for legend in legends:
                box = legend.get_window_extent()
                inside = (
                    (points[:, 0] > box.x0)
                    & (points[:, 0] < box.x1)
                    & (points[:, 1] > box.y0)
                    & (points[:, 1] < box.y1)
                )
                bars = sum(box.overlaps(bar) for bar in _bars(ax))
                if inside.any() or bars:
                    where = "the figure's legend" if legend in figure.legends else "its legend"
                    what = f"{int(inside.sum())} sampled data points" + (f" and {bars} bars" if bars else "")
                    problems.append(f"{name!r}: {where} covers {what}")
        caps = {
            id(cap) for container in ax.containers if isinstance(container, ErrorbarContainer) for cap in container[1]
        }
        lines = [
            line
            for line in ax.get_lines()
            if line.get_visible() and id(line) not in caps and np.size(line.get_xdata(orig=False)) >= 3
        ]
        if len(lines) > MAX_LINES:
            problems.append(f"{name!r}: {len(lines)} data lines (at most {MAX_LINES} per panel)")
    return problems
