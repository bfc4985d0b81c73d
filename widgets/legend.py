"""Legend: which colour is which line when a chart overlays several runs.

One row per line: a swatch and the label in the line's colour, then a few value columns (the
latest Φ, the latest reward) under a dim header. When the widget is too narrow for every
column, the leftmost ones go first (whole labels matter more): callers put the most important
column last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.cells import cell_len, set_cell_size
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from engine.text import visible_line

SWATCH = "━ "


@dataclass(frozen=True)
class LegendRow:
    label: str
    style: Style  # the line's style (its colour)
    values: tuple[str, ...] = ()


class Legend(Widget):
    """Rows of swatch, label and values; redrawn only when the rows change."""

    COMPONENT_CLASSES = {"legend--header"}

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.rows: list[LegendRow] = []
        self.header: tuple[str, ...] = ()

    def set_rows(self, rows: list[LegendRow], header: tuple[str, ...] = ()) -> None:
        # A label is a run's name: stored text, written out on one line before any width is measured.
        rows = [replace(r, label=visible_line(r.label)) for r in rows]
        if rows == self.rows and header == self.header:
            return
        before = (len(self.rows), bool(self.header), self.width_wanted())
        self.rows, self.header = rows, header
        self.refresh(layout=before != (len(rows), bool(header), self.width_wanted()))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self.rows) + (1 if self.header else 0))

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return self.width_wanted()

    def width_wanted(self) -> int:
        """Every column and the whole label: what `width: auto` asks for (capped by max-width)."""
        label_w = max((cell_len(r.label) for r in self.rows), default=0)
        return cell_len(SWATCH) + label_w + sum(self._widths())

    def _widths(self) -> list[int]:
        """Each value column's width: its widest cell or header, and a space before it."""
        columns = max((len(r.values) for r in self.rows), default=0)
        widths = []
        for i in range(columns):
            cells = [r.values[i] for r in self.rows if i < len(r.values)]
            head = self.header[i] if i < len(self.header) else ""
            widths.append(max(map(cell_len, [*cells, head])) + 1)
        return widths

    def render(self) -> Text:
        width = self.size.width
        widths = self._widths()
        columns = len(widths)
        label_w = max((cell_len(r.label) for r in self.rows), default=0)
        first = 0  # the first value column shown: drop from the left until whole labels fit
        while first < columns - 1 and cell_len(SWATCH) + label_w + sum(widths[first:]) > width:
            first += 1
        label_w = max(1, min(label_w, width - cell_len(SWATCH) - sum(widths[first:])))
        out = Text(no_wrap=True, overflow="crop")
        if self.header:
            line = " " * (cell_len(SWATCH) + label_w)
            line += "".join(f"{h:>{w}}" for h, w in zip(self.header[first:], widths[first:], strict=False))
            out.append(line, self.get_component_rich_style("legend--header"))
        for row in self.rows:
            if out:
                out.append("\n")
            label = (
                row.label if cell_len(row.label) <= label_w else set_cell_size(row.label, label_w - 1) + "…"
            )
            out.append(SWATCH + set_cell_size(label, label_w), row.style)
            out.append("".join(f"{v:>{w}}" for v, w in zip(row.values[first:], widths[first:], strict=False)))
        return out
