"""The metrics explorer's grid of small charts, virtual: only the rows in view exist as charts. A slot is
one row on screen (a group heading and its charts); scrolling hands the slots other keys, so a chart outside
the viewport is neither read nor drawn, and a run with 200 keys costs as many charts as fit. A cell holds a
chart and a heat strip (for a key of histograms), one of them shown."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from widgets.chart import Chart
from widgets.heat_strip import HeatStrip

from .explorer_model import GridRow, rows_in_view

CELL_WIDTH = 38  # a small chart's least width, border and axis labels included
CHART_HEIGHT = 11  # a small chart's height: its border, 8 rows of plot and the step axis


class GridSlot(Vertical):
    """One row of the grid on screen: its group's heading (when the row starts a group) and its charts.
    The charts exist from construction, so keys can be handed to them before they are mounted."""

    def __init__(self, columns: int, mode: str) -> None:
        super().__init__(classes="explorer-slot")
        self.heading = Static("", classes="explorer-heading")
        self.charts = [
            Chart(mode=mode, empty_text="reading…", classes="explorer-cell") for _ in range(columns)
        ]
        self.heats = [HeatStrip(empty_text="reading…", classes="explorer-cell") for _ in range(columns)]
        for heat in self.heats:
            heat.display = False
        self.keys: tuple[str, ...] = ()
        self.group: str | None = None  # the heading shown

    def compose(self) -> ComposeResult:
        yield self.heading
        with Horizontal(classes="explorer-row"):
            for chart, heat in zip(self.charts, self.heats, strict=True):
                yield chart
                yield heat


class ChartGrid(Vertical):
    """Rows of small charts from `top`, as many as fit; `cells()` says which chart shows which key."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.slots: list[GridSlot] = []
        self.columns = 0
        self.mode = "braille"

    @staticmethod
    def columns_for(width: int) -> int:
        return max(1, width // CELL_WIDTH)

    def show(
        self,
        rows: Sequence[GridRow],
        top: int,
        columns: int,
        height: int,
        mode: str,
        histograms: Collection[str] = (),
    ) -> None:
        """Lay out the rows in view: slots are made only when more rows fit than ever did (or the
        column count changed), and those not needed are hidden. A key in `histograms` gets a heat strip."""
        if columns != self.columns or mode != self.mode:
            self.remove_children()
            self.slots = []
            self.columns, self.mode = columns, mode
        count = rows_in_view(rows, top, height, CHART_HEIGHT)
        if count > len(self.slots):
            new = [GridSlot(columns, mode) for _ in range(count - len(self.slots))]
            self.slots += new
            self.mount(*new)
        for index, slot in enumerate(self.slots):
            row = rows[top + index] if index < count else None
            slot.display = row is not None
            if row is None:
                slot.keys = ()
                continue
            slot.keys = row.keys
            slot.heading.display = row.group is not None
            if row.group is not None and row.group != slot.group:  # an update repaints: only on change
                slot.heading.update(Text(row.group))
                slot.group = row.group
            for column, (chart, heat) in enumerate(zip(slot.charts, slot.heats, strict=True)):
                heated = column < len(row.keys) and row.keys[column] in histograms
                chart.display, heat.display = not heated, heated
                chart.visible = column < len(row.keys)  # hidden, not removed: the row keeps its widths

    def cells(self) -> list[tuple[str, Chart]]:
        """(key, chart) of every chart in view (a key of histograms too: its chart is hidden)."""
        return [
            (key, slot.charts[column])
            for slot in self.slots
            if slot.display
            for column, key in enumerate(slot.keys)
        ]

    def heat_cells(self) -> list[tuple[str, HeatStrip]]:
        """(key, heat strip) of every key of histograms in view."""
        return [
            (key, slot.heats[column])
            for slot in self.slots
            if slot.display
            for column, key in enumerate(slot.keys)
            if slot.heats[column].display
        ]
