"""HeatStrip: histograms over steps as a heat strip, on the Line API. Knows nothing of the app.

One line per step, oldest at the top: the step at the left, then a cell per column of the value axis, its
colour and shade the density of the step's buckets there (counts per unit of value, re-binned to the columns
and scaled to the step's own densest column, as TensorBoard's distributions are drawn per step). The bottom
line is the value axis. `set_data(steps, histograms)` gives the data; with `fit` the steps are spread over
the lines there are (the first and the newest always shown), else every step has its line and the view
follows the cursor (`set_cursor`): only the lines on screen are ever rendered.

    HeatStrip > .heat-strip--axis { color: $foreground-muted; }
    HeatStrip > .heat-strip--cursor { background: $primary 30%; }
    HeatStrip > .heat-strip--empty { color: $foreground-muted; text-style: italic; }
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Protocol

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

# Density from low to high: a perceptual ramp (viridis' eight stops) that reads on dark and light themes,
# and shades that still tell the levels apart on a terminal without colour.
RAMP = ("#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725")
SHADES = "░░▒▒▓▓██"
MAX_GUTTER = 8


class HistogramLike(Protocol):
    """A histogram as the strip reads it: n + 1 bucket edges and n counts (engine/store/histograms.py)."""

    @property
    def edges(self) -> tuple[float, ...]: ...

    @property
    def counts(self) -> tuple[float, ...]: ...


def short_number(value: float) -> str:
    """A value in a few characters: 0.0123, -1.5, 2.3e+04."""
    if value == 0:
        return "0"
    return f"{value:.3g}"


def short_step(step: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if abs(step) >= 10 * size:
            return f"{step / size:.0f}{unit}"
    return str(step)


def value_range(histograms: Sequence[HistogramLike]) -> tuple[float, float]:
    """The lowest and highest edge of the histograms (a span of 1 around a single value)."""
    lows = [h.edges[0] for h in histograms if h.edges]
    highs = [h.edges[-1] for h in histograms if h.edges]
    if not lows:
        return 0.0, 1.0
    low, high = min(lows), max(highs)
    if not high > low:
        return low - 0.5, low + 0.5
    return low, high


def densities(histogram: HistogramLike, low: float, high: float, columns: int) -> list[float]:
    """The histogram's counts spread over `columns` equal columns of [low, high]: each bucket's count over the
    columns it covers, in proportion; a bucket of no width goes to the column of its edge."""
    out = [0.0] * columns
    if columns <= 0 or not high > low:
        return out
    scale = columns / (high - low)
    edges, counts = histogram.edges, histogram.counts
    for i, count in enumerate(counts):
        if count <= 0:
            continue
        left, right = (edges[i] - low) * scale, (edges[i + 1] - low) * scale
        if right <= left:
            out[min(max(int(left), 0), columns - 1)] += count
            continue
        per = count / (right - left)
        first, last = max(int(left), 0), min(int(math.ceil(right)), columns)
        for column in range(first, last):
            overlap = min(right, column + 1) - max(left, column)
            if overlap > 0:
                out[column] += per * overlap
    return out


def spread_rows(count: int, lines: int) -> list[int]:
    """Indexes of `lines` of `count` rows, evenly spread, the first and the last among them."""
    if count <= lines:
        return list(range(count))
    if lines <= 1:
        return [count - 1]
    return sorted({round(i * (count - 1) / (lines - 1)) for i in range(lines)})


class HeatStrip(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"heat-strip--axis", "heat-strip--cursor", "heat-strip--empty"}

    def __init__(
        self,
        *,
        fit: bool = True,
        empty_text: str = "no histograms yet",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.fit = fit
        self.empty_text = empty_text
        self.steps: list[int] = []
        self.histograms: list[HistogramLike] = []
        self.cursor: int | None = None  # the row (an index of `steps`) the cursor is on
        self.top = 0  # the first row on screen, when not fitting
        self.range = (0.0, 1.0)
        self._cache: dict[int, Strip] = {}  # rendered lines by row, for the data and size drawn
        self._cache_key: tuple[object, ...] | None = None
        self.render_count = 0  # rows rendered so far; lets tests see that only the lines on screen are

    # -- data ----------------------------------------------------------------------------------------------

    def set_data(self, steps: Sequence[int], histograms: Sequence[HistogramLike]) -> None:
        """The steps and their histograms, oldest first; the same lists again cost nothing."""
        same = len(histograms) == len(self.histograms) and list(steps) == self.steps
        if same and all(a is b for a, b in zip(histograms, self.histograms, strict=True)):
            return
        self.steps, self.histograms = list(steps), list(histograms)
        self.range = value_range(self.histograms)
        if self.cursor is not None and self.cursor >= len(self.steps):
            self.cursor = len(self.steps) - 1 if self.steps else None
        self._forget()

    def set_empty(self, text: str) -> None:
        self.empty_text = text
        self.steps, self.histograms, self.cursor = [], [], None
        self._forget()

    def set_cursor(self, row: int | None) -> None:
        """Put the cursor on a row (None: no cursor); the lines drawn keep it in view."""
        if row is not None:
            row = min(max(row, 0), len(self.steps) - 1) if self.steps else None
        if row != self.cursor:
            self.cursor = row
            self._forget()

    @property
    def plot_height(self) -> int:
        return max(self.size.height - 1, 0)

    def shown_rows(self) -> list[int]:
        """The rows (indexes of `steps`) on screen, top to bottom."""
        lines = self.plot_height
        if self.fit:
            rows = spread_rows(len(self.steps), lines)
            if self.cursor is not None and rows and self.cursor not in rows:  # the cursor's step among them
                nearest = min(range(len(rows)), key=lambda i: abs(rows[i] - (self.cursor or 0)))
                rows[nearest] = self.cursor
            return rows
        if self.cursor is None:  # no cursor: the newest steps, followed as they come
            top = max(len(self.steps) - lines, 0)
        else:  # the cursor in view, moving as little as possible
            top = min(max(self.top, self.cursor - lines + 1), self.cursor)
        self.top = min(max(top, 0), max(len(self.steps) - lines, 0))
        return list(range(self.top, min(self.top + lines, len(self.steps))))

    # -- drawing -------------------------------------------------------------------------------------------

    def _forget(self) -> None:
        self._cache.clear()
        self._cache_key = None
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache_key = None

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        key = (width, height, self.cursor, self.fit)
        if key != self._cache_key:
            self._cache.clear()
            self._cache_key = key
        base = self.rich_style
        if not self.steps or width < 8 or height < 2:
            if y == height // 2:
                style = base + self.get_component_rich_style("heat-strip--empty")
                return self._line([Segment(self.empty_text[:width], style)], width, base)
            return Strip.blank(width, base)
        gutter = self.label_width()
        if y == height - 1:
            return self._axis(width, gutter, base)
        rows = self.shown_rows()
        if y >= len(rows):
            return Strip.blank(width, base)
        row = rows[y]
        strip = self._cache.get(row)
        if strip is None:
            strip = self._row(row, width, gutter, base)
            self._cache[row] = strip
        return strip

    def label_width(self) -> int:
        """The step labels' columns at the left, with the axis line."""
        longest = max(len(short_step(self.steps[0])), len(short_step(self.steps[-1])))
        return min(longest, MAX_GUTTER - 1) + 1

    def _row(self, row: int, width: int, gutter: int, base: Style) -> Strip:
        self.render_count += 1
        axis = base + self.get_component_rich_style("heat-strip--axis")
        if row == self.cursor:
            base = base + self.get_component_rich_style("heat-strip--cursor")
            axis = axis + self.get_component_rich_style("heat-strip--cursor")
        label = short_step(self.steps[row])[: gutter - 1].rjust(gutter - 1) + "│"
        columns = width - gutter
        values = densities(self.histograms[row], *self.range, columns)
        top = max(values) if values else 0.0
        segments = [Segment(label, axis)]
        for value in values:
            if value <= 0 or top <= 0:
                segments.append(Segment(" ", base))
                continue
            level = min(int(value / top * len(RAMP)), len(RAMP) - 1)
            segments.append(Segment(SHADES[level], base + Style(color=RAMP[level])))
        return self._line(segments, width, base)

    def _axis(self, width: int, gutter: int, base: Style) -> Strip:
        style = base + self.get_component_rich_style("heat-strip--axis")
        columns = width - gutter
        low, high = self.range
        left, right = short_number(low), short_number(high)
        middle = short_number((low + high) / 2)
        text = left.ljust(columns - len(right)) + right
        at = columns // 2 - len(middle) // 2
        if at >= len(left) + 2 and at + len(middle) + 2 <= columns - len(right):
            text = text[:at] + middle + text[at + len(middle) :]
        return self._line([Segment(" " * (gutter - 1) + "└" + text[:columns], style)], width, base)

    @staticmethod
    def _line(segments: list[Segment], width: int, base: Style) -> Strip:
        return Strip(segments).adjust_cell_length(width, base)
