"""The control room's side of the metrics explorer and the record inspector: `m` opens the explorer on
the selected run (or the marked runs, overlaid in their comparison colours), `i` the inspector at the
selected run's newest step; and the charts pinned from the explorer (`p` there) drawn on the main screen.

Pins are kept per run, by its name, in the `[pins]` table of tui.toml (carl_tui/config.py); a watch-only
session keeps them for the session. The pinned charts sit in a row under the Rewards pane, and take the
place of the Trajectories/Agents row while both of those panes are empty. Their series are read off
the UI thread (carl_tui/reads.py) and extended as the run grows.

A mixin of the control room (its actions are the app's); `self` is the ControlRoom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import Horizontal

from engine.store import Series, StoreReader
from engine.text import visible_line
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane
from widgets.chart import Chart

from .explorer_data import MAX_POINTS
from .explorer_model import ShownRun, short_value
from .panes import set_subtitle, set_title

if TYPE_CHECKING:
    from .app import ControlRoom

PIN_WIDTH = 26  # a pinned chart's least width: as many show side by side as fit


class PinsRow(Horizontal):
    """The pinned charts, side by side: as many as fit its width (again at each resize), the last
    saying how many more there are."""

    def fit(self) -> None:
        charts = list(self.query(Chart))
        fit = max(1, self.size.width // PIN_WIDTH) if self.size.width else len(charts)
        more = len(charts) - fit
        for index, chart in enumerate(charts):
            chart.display = index < fit
            set_subtitle(chart, f"+{more} more · m" if index == fit - 1 and more > 0 else None)

    def on_resize(self) -> None:
        self.fit()


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


class ExplorerKeys:
    # The pinned charts' state: the run their series belong to, the series, and whether a read is out.
    pins_run: int | None = None
    pins_series: dict[str, Series] | None = None
    pins_reading = False
    pins_again = False

    # -- `m` and `i` -----------------------------------------------------------------------------------

    def shown_runs(self: ControlRoom) -> list[ShownRun]:
        """The marked runs in their colours, the selected one first, while comparing;
        else the selected run."""
        names = {run.id: run.name for run in self.runs}
        marks = self.comparison.marks
        if self.comparison.comparing:
            order = sorted(marks, key=lambda run_id: run_id != self.selected)
            return [ShownRun(i, visible_line(names.get(i) or marks[i].label), marks[i].color) for i in order]
        if self.selected is None or self.selected not in names:
            return []
        return [ShownRun(self.selected, visible_line(names[self.selected]))]

    def action_explore(self: ControlRoom) -> None:
        runs = self.shown_runs()
        if not runs:
            self.notify("no run to explore yet", title="metrics")
            return
        from .explorer import ExplorerScreen  # loaded on first use, not at start-up

        name = next(run.name for run in self.runs if run.id == runs[0].id)
        self.push_screen(
            ExplorerScreen(
                self.db_path,
                runs,
                pinned=self.config.pinned(name),
                pin=lambda key: self.toggle_pin(name, key),
                inspect=self.open_inspector,
                chart_mode=self.config.chart_mode,
                refresh_s=1.0 / self.refresh_hz,
            )
        )

    def action_inspect(self: ControlRoom) -> None:
        if self.selected is None:
            self.notify("no run to inspect yet", title="record")
            return
        self.open_inspector(self.selected, None)

    def open_inspector(self: ControlRoom, run_id: int, step: int | None) -> None:
        from .inspector import InspectorScreen

        self.push_screen(InspectorScreen(self.db_path, run_id, step))

    # -- pins ------------------------------------------------------------------------------------------

    def toggle_pin(self: ControlRoom, run_name: str, key: str) -> list[str]:
        """Pin the key for the run, or unpin it; kept in tui.toml (not by a watch-only session)."""
        self.config = self.config.toggle_pin(run_name, key)
        self.save_config()
        self.draw_pins()
        pinned = self.config.pinned(run_name)
        where = "pinned to" if key in pinned else "unpinned from"
        session = " for this session (read-only)" if self.readonly else ""
        self.notify(f"{visible_line(key)} {where} the main screen{session}", title="pins", markup=False)
        return pinned

    def pins_row(self: ControlRoom) -> PinsRow | None:
        rows = self.main.query(PinsRow)
        return rows.first(PinsRow) if rows else None

    def draw_pins(self: ControlRoom) -> None:
        """The selected run's pinned charts (mounted on first use), and a read of their series."""
        if self.view is None or self.widgets_gone():
            return
        run = self.view.run
        keys = self.config.pinned(run.name)
        row = self.pins_row()
        if not keys:
            if row is not None:
                row.display = False
                self.place_pins()
            return
        if row is None:
            row = PinsRow(id="pins")
            self.main.query_one("#main").mount(row, before="#activity")
        row.display = True
        charts = list(row.query(Chart))
        for extra in charts[len(keys) :]:
            extra.remove()
        if len(charts) < len(keys):
            new = [
                Chart(mode=self.config.chart_mode, empty_text="reading…", classes="pane pin-chart")
                for _ in range(len(keys) - len(charts))
            ]
            row.mount(*new)
            charts += new
        if self.pins_run != run.id:
            self.pins_run, self.pins_series = run.id, {}
        self.show_pins(charts[: len(keys)], keys)
        row.fit()
        self.place_pins()
        self.read_pins()

    def show_pins(self: ControlRoom, charts: list[Chart], keys: list[str]) -> None:
        series = self.pins_series or {}
        for chart, key in zip(charts, keys, strict=True):
            data = series.get(key)
            if data is not None:
                chart.empty_text = "no finite values"
                if chart.lines[:1] != (data,):
                    chart.set_series(data)
            latest = f" {short_value(data.latest)}" if data is not None and len(data) else ""
            set_title(chart, visible_line(key) + latest)

    def read_pins(self: ControlRoom) -> None:
        """Read (or extend) the pinned series off the UI thread; one read at a time."""
        if self.pins_reading:
            self.pins_again = True
            return
        run_id = self.pins_run
        keys = self.config.pinned(self.view.run.name) if self.view is not None else []
        if run_id is None or not keys:
            return
        old = dict(self.pins_series or {})
        self.pins_reading, self.pins_again = True, False
        self.reads.read(
            lambda reader: (run_id, read_pins(reader, run_id, keys, old)), self.pins_read, title="pins"
        )

    def pins_read(self: ControlRoom, result: tuple[int, dict[str, Series]] | None) -> None:
        self.pins_reading = False
        if result is not None and result[0] == self.pins_run:
            self.pins_series = {**(self.pins_series or {}), **result[1]}
            row = self.pins_row()
            if row is not None and self.view is not None:
                keys = self.config.pinned(self.view.run.name)
                charts = list(row.query(Chart))
                if len(charts) == len(keys):
                    self.show_pins(charts, keys)
        if self.pins_again:
            self.read_pins()

    def place_pins(self: ControlRoom) -> None:
        """The pinned charts take the Trajectories/Agents row's place while both of its panes are empty."""
        row = self.pins_row()
        pinned = row is not None and bool(row.display)
        empty = self.main.query_one(TrajectoriesPane).has_class("-empty") and self.main.query_one(
            AgentsPane
        ).has_class("-empty")
        self.main.query_one("#main").set_class(pinned and empty, "-pins-only")
