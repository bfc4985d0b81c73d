"""Histogram: counts over equal bins as vertical bars in eighth-cell blocks, on the Line API.

`set_data(edges, counts)` draws them: bins are merged or widened to the plot's columns, the left axis gives
the tallest column's count, the bottom one the bins' range (with a unit). Lines are rebuilt only when the
data, the size or the theme changed. Knows nothing of the app.

    Histogram > .histogram--bar { color: $accent; }
    Histogram > .histogram--axis { color: $foreground-muted; }
    Histogram > .histogram--empty { color: $foreground-muted; text-style: italic; }
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
GUTTER = 6  # the left axis' width


def columns_of(counts: Sequence[int], width: int) -> list[float]:
    """The counts spread over `width` columns: each column sums the share of every bin it covers."""
    bins = len(counts)
    if not bins or width <= 0:
        return []
    out = []
    for c in range(width):
        lo, hi = c * bins / width, (c + 1) * bins / width
        total = 0.0
        for b in range(int(lo), min(bins, int(hi) + 1)):
            overlap = min(hi, b + 1) - max(lo, b)
            if overlap > 0:
                total += counts[b] * overlap
        out.append(total)
    return out


def short_count(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


class Histogram(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"histogram--bar", "histogram--axis", "histogram--empty"}

    def __init__(
        self,
        *,
        unit: str = "",
        empty_text: str = "no data",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.unit = unit
        self.empty_text = empty_text
        self.edges: list[float] = []
        self.counts: list[int] = []
        self._strips: list[Strip] = []
        self._built: tuple[int, int] | None = None

    def set_data(self, edges: Sequence[float], counts: Sequence[int]) -> None:
        if list(edges) == self.edges and list(counts) == self.counts:
            return
        self.edges, self.counts = list(edges), list(counts)
        self._built = None
        self.refresh()

    def set_empty(self, text: str) -> None:
        self.edges, self.counts, self.empty_text = [], [], text
        self._built = None
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._built = None

    def render_line(self, y: int) -> Strip:
        size = (self.size.width, self.size.height)
        if self._built != size:
            self._strips = [Strip(list(line.render(self.app.console)), size[0]) for line in self.lines(*size)]
            self._built = size
        return self._strips[y] if 0 <= y < len(self._strips) else Strip.blank(size[0], self.rich_style)

    def lines(self, width: int, height: int) -> list[Text]:
        """The drawn lines, as text: bars over an axis of the bins' range."""
        base = self.rich_style
        axis = base + self.get_component_rich_style("histogram--axis")
        if not self.counts or not any(self.counts) or height < 2 or width < GUTTER + 4:
            empty = base + self.get_component_rich_style("histogram--empty")
            lines = [Text(end="", style=base) for _ in range(height)]
            if lines:
                lines[height // 2] = Text(self.empty_text, style=empty, end="")
            return [self._fit(line, width) for line in lines]
        bar = base + self.get_component_rich_style("histogram--bar")
        plot_w, plot_h = width - GUTTER, height - 1
        columns = columns_of(self.counts, plot_w)
        top = max(columns) or 1.0
        lines = []
        for row in range(plot_h):
            level_from_bottom = plot_h - 1 - row
            text = Text(end="", style=base)
            label = short_count(top) if row == 0 else ("0" if row == plot_h - 1 else "")
            text.append(f"{label:>{GUTTER - 1}}┤" if label else " " * (GUTTER - 1) + "│", style=axis)
            cells = []
            for value in columns:
                eighths = round(value / top * plot_h * 8) - level_from_bottom * 8
                cells.append(BLOCKS[max(0, min(8, eighths))])
            text.append("".join(cells), style=bar)
            lines.append(self._fit(text, width))
        lines.append(self._fit(Text(" " * GUTTER + self.scale(plot_w), style=axis, end=""), width))
        return lines

    def scale(self, width: int) -> str:
        """The bins' range under the bars: low end, middle (when there is room), high end and unit."""
        low, high = self.edges[0], self.edges[-1]
        left, right = f"{low:.3g}", f"{high:.3g} {self.unit}".strip()
        middle = f"{(low + high) / 2:.3g}"
        at = width // 2 - len(middle) // 2
        if at >= len(left) + 2 and at + len(middle) + 2 <= width - len(right):
            left = left.ljust(at) + middle
        return left.ljust(width - len(right)) + right

    @staticmethod
    def _fit(text: Text, width: int) -> Text:
        text.truncate(width, overflow="ellipsis", pad=True)
        return text
