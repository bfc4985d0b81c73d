"""The machines in the control room: the System pane on the main screen (fed from the watcher's snapshot of
the box), its size, and the System screen (`S`, carl_tui/system_view.py, loaded on first use).

A mixin of the control room (its actions are the app's); `self` is the ControlRoom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.text import visible_line
from widgets.system_pane import BoxData, SystemPane

from .panes import set_title

if TYPE_CHECKING:
    from .app import ControlRoom
    from .model import BoxView

SHARE = 2  # the pane takes at most half the body's height (as tall as its lines: often fewer)
MIN_LINES = 3


class SystemPanes:
    box: BoxView | None = None

    @property
    def system_pane(self: ControlRoom) -> SystemPane:
        return self.main.query_one(SystemPane)

    def box_updated(self: ControlRoom, box: BoxView) -> None:
        self.box = box
        self.draw_system()

    def draw_system(self: ControlRoom) -> None:
        """Hand the pane what it shows now; it redraws only the lines that changed."""
        if self.widgets_gone():
            return
        box = self.box
        view = self.view
        ours = box is not None and box.run_id == self.selected
        data = BoxData(
            nodes=box.nodes if box else [],
            samples=box.samples if box else {},
            intervals=box.intervals if box else {},
            run_dir=box.run_dir if box and ours else None,
            home=str(self.home),
            perf=view.perf if view is not None and view.run.id == self.selected else {},
            processes=box.processes if box and ours else [],
            engine=self.engine_state,
        )
        pane = self.system_pane
        pane.show(data)
        title = "System"
        if box and len(box.nodes) == 1:
            title += f" · {visible_line(str(box.nodes[0].get('name') or ''))}"
        elif box and box.nodes:
            title += f" · {len(box.nodes)} nodes"
        set_title(pane, title)

    def size_system_pane(self: ControlRoom, height: int | None = None) -> None:
        """The pane's height from the screen's (`height`, or the app's): at most half the body, or all of it
        maximized."""
        if self.widgets_gone():
            return
        body = max(0, (height or self.size.height) - 2)  # the status line and the key bar
        wide = self.maximized == "system"
        lines = body - 2 if wide else max(MIN_LINES, body // SHARE - 2)
        self.system_pane.set_size(lines, wide)

    def action_system(self: ControlRoom) -> None:
        """The System screen: every node's series over wall time, aligned with the selected run's steps, and
        the run's processes (carl_tui/system_view.py, loaded on first use)."""
        from .system_model import SystemFeed
        from .system_view import SystemScreen

        run = self.view.run if self.view is not None else None
        feed = SystemFeed(self.db_path, run.id if run else None, period=1.0 / self.refresh_hz)
        self.push_screen(SystemScreen(feed, run, chart_mode=self.config.chart_mode))
