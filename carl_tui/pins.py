"""The charts pinned from the metrics explorer (`p` there), drawn on the main screen for the selected run.

Pins are kept per run, by its name, in the `[pins]` table of tui.toml (carl_tui/preferences.py); a watch-only
session keeps them for the session. The pinned charts sit in a row under the Rewards pane, and take the
place of the Trajectories/Agents row while both of those panes are empty (the main screen's to decide).
Their series are read off the UI thread (carl_tui/reads.py) and extended as the run grows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import Horizontal

from engine.store import RunRow, Series, StoreReader
from engine.text import visible_line
from widgets.chart import Chart

from .explorer_data import MAX_POINTS
from .explorer_model import short_value
from .panes import set_subtitle, set_title

if TYPE_CHECKING:
    from .room import Room, Shown

PIN_WIDTH = 26  # a pinned chart's least width: as many show side by side as fit


class PinsRow(Horizontal):
    """The pinned charts, side by side: as many as fit its width (again at each resize), the last
    saying how many more there are. It keeps their series (for one run at a time) and reads them,
    one read at a time."""

    def __init__(self, room: Room, shown: Shown, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.room = room
        self.shown = shown
        self.run_id: int | None = None  # the run the series belong to
        self.series: dict[str, Series] = {}
        self.reading = False  # a read is out
        self.again = False  # and another was asked for meanwhile

    def show(self, run: RunRow, keys: list[str]) -> None:
        """The run's pinned charts (one per key, mounted as needed), and a read of their series."""
        self.display = True
        charts = list(self.query(Chart))
        for extra in charts[len(keys) :]:
            extra.remove()
        if len(charts) < len(keys):
            new = [
                Chart(mode=self.room.config.chart_mode, empty_text="reading…", classes="pane pin-chart")
                for _ in range(len(keys) - len(charts))
            ]
            self.mount(*new)
            charts += new
        if self.run_id != run.id:
            self.run_id, self.series = run.id, {}
        self.draw(charts[: len(keys)], keys)
        self.fit()
        self.read()

    def draw(self, charts: list[Chart], keys: list[str]) -> None:
        for chart, key in zip(charts, keys, strict=True):
            data = self.series.get(key)
            if data is not None:
                chart.empty_text = "no finite values"
                if chart.lines[:1] != (data,):
                    chart.set_series(data)
            latest = f" {short_value(data.latest)}" if data is not None and len(data) else ""
            set_title(chart, visible_line(key) + latest)

    def fit(self) -> None:
        charts = list(self.query(Chart))
        fit = max(1, self.size.width // PIN_WIDTH) if self.size.width else len(charts)
        more = len(charts) - fit
        for index, chart in enumerate(charts):
            chart.display = index < fit
            set_subtitle(chart, f"+{more} more · m" if index == fit - 1 and more > 0 else None)

    def on_resize(self) -> None:
        self.fit()

    def keys(self) -> list[str]:
        """The keys pinned for the selected run now (they may move while a read is out)."""
        view = self.shown.view
        return self.room.config.pinned(view.run.name) if view is not None else []

    def read(self) -> None:
        """Read (or extend) the pinned series off the UI thread; one read at a time."""
        if self.reading:
            self.again = True
            return
        run_id = self.run_id
        keys = self.keys()
        if run_id is None or not keys:
            return
        old = dict(self.series)
        self.reading, self.again = True, False
        self.room.reads.read(
            lambda reader: (run_id, read_pins(reader, run_id, keys, old)), self.series_read, title="pins"
        )

    def series_read(self, result: tuple[int, dict[str, Series]] | None) -> None:
        self.reading = False
        if result is not None and result[0] == self.run_id:
            self.series = {**self.series, **result[1]}
            if self.shown.view is not None:
                keys = self.keys()
                charts = list(self.query(Chart))
                if len(charts) == len(keys):
                    self.draw(charts, keys)
        if self.again:
            self.read()


def read_pins(reader: StoreReader, run_id: int, keys: list[str], old: dict[str, Series]) -> dict[str, Series]:
    """The pinned keys' series: read, or extended with the rows past those already read."""
    fresh = {}
    for key in keys:
        before = old.get(key)
        if before is None:
            fresh[key] = reader.series(run_id, key, max_points=MAX_POINTS)
        else:
            fresh[key] = reader.extend_series(run_id, key, before, max_points=MAX_POINTS)
    return fresh
