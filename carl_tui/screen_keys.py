"""Keys that change what the screen shows, not what the store holds: help (the keys in force), the
run filter, a maximised pane, the theme and the chart mode (both remembered in tui.toml, except by
a watch-only session).

A mixin of the control room (its actions are the app's); `self` is the ControlRoom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.theme import Theme

from themes import THEME_NAMES
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane
from widgets.chart import Chart
from widgets.status_bar import StatusBar, StatusInfo

from .config import config_path, save_config
from .keymap import bindings_of, key_display, keys_in_force
from .panes import draw_run

if TYPE_CHECKING:
    from textual.widgets import Input

    from .app import ControlRoom

PANES = ("phi", "rewards", "trajectories", "agents", "system")


class ScreenKeys:
    def action_help(self: ControlRoom) -> None:
        """Keys from the same binding tables that drive the footer, as the keymap maps them: the
        control room's own first, then those of the widget that has focus, then the two that work
        everywhere. Textual's generic bindings (cursor, scroll, copy, the palette's own) have no id: they are
        not the control room's keys and are left out."""
        active = self.screen.active_bindings
        own = bindings_of(type(self))
        rows: list[tuple[str, str]] = [("", "Control room")]
        rows += [(keys_in_force(b, self.keymap), b.description) for b in own if b.description]
        seen = {d for _, d in rows}
        here: list[tuple[str, str]] = []
        for entry in active.values():
            b = entry.binding
            # Ours have ids; Textual's generic widget keys (cursor, scroll, copy) have none.
            if b.description and b.id and b.description not in seen and entry.node is not self:
                seen.add(b.description)
                here.append((self.get_key_display(b), b.tooltip or b.description))  # the longer one
        if here:
            rows += [("", "Here"), *here]
        rows += [
            ("", "Everywhere"),
            ("ctrl+p", "Command palette: themes, chart mode, observe, engine, panes"),
            ("tab", "Next pane"),
        ]
        close = key_display(self.keymap.get("help.close", "escape")).split(" / ")[0]
        extra = f"{close} closes this · Store: {self.db_path}\nConfig: {config_path(self.home)}"
        from .screens import HelpScreen  # modal screens load on first use, not at start-up

        self.push_screen(HelpScreen(rows, extra))

    def filter_box(self: ControlRoom) -> Input | None:
        boxes = self.main.query("#run-filter")
        return boxes.first() if boxes else None  # type: ignore[return-value]

    def action_filter(self: ControlRoom) -> None:
        box = self.filter_box()
        if box is None:
            from textual.widgets import Input  # mounted on first use: one widget less at start-up

            box = Input(placeholder="filter (regex)", id="run-filter")
            self.main.query_one("#runs-pane").mount(box, before=0)
        box.display = True
        box.focus()

    def on_input_changed(self: ControlRoom, event: Input.Changed) -> None:
        if event.input.id == "run-filter":
            self.filter_text = event.value
            self.fill_run_list()

    def on_input_submitted(self: ControlRoom, event: Input.Submitted) -> None:
        if event.input.id == "run-filter":
            self.run_list.focus()

    def action_escape(self: ControlRoom) -> None:
        box = self.filter_box()
        if box is not None and box.display:
            box.value = ""
            box.display = False
            self.run_list.focus()
        elif self.maximized:
            self.action_maximize(self.maximized)

    def action_maximize(self: ControlRoom, pane: str) -> None:
        """Toggle one pane filling the main area (LEET's digit keys)."""
        main = self.main.query_one("#main")
        body = self.main.query_one("#body")  # the System pane sits in the left column: it fills the body
        for name in PANES:
            main.remove_class(f"-max-{name}")
        body.remove_class("-max-system")
        self.maximized = None if self.maximized == pane else pane
        self.size_system_pane()
        if self.maximized == "system":
            body.add_class("-max-system")
        elif self.maximized:
            main.add_class(f"-max-{pane}")
            lists = {"trajectories": TrajectoriesPane, "agents": AgentsPane}
            if pane in lists:  # its keys work at once (the pane that had focus may be hidden now)
                self.main.query_one(lists[pane]).focus()

    def action_next_theme(self: ControlRoom) -> None:
        names = list(THEME_NAMES)
        index = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(index + 1) % len(names)]

    def theme_changed(self: ControlRoom, theme: Theme) -> None:
        if theme.name in THEME_NAMES and theme.name != self.config.theme:
            self.config = self.config.replace(theme=theme.name)
            self.save_config()
        if self.view is not None:
            draw_run(self.main, self.view, comparing=self.comparison.comparing)  # bar colours: the theme's
        if self.comparison.marks:
            self.fill_run_list()  # so are the marks' colours
            self.draw_compare()
        self.main.query_one(AgentsPane).redraw()
        self.main.query_one(StatusBar).info = StatusInfo()  # force the status line to recolour
        self.update_status()

    def action_toggle_chart_mode(self: ControlRoom) -> None:
        mode = "block" if self.config.chart_mode == "braille" else "braille"
        self.config = self.config.replace(chart_mode=mode)
        self.save_config()
        self.apply_chart_mode()

    def save_config(self: ControlRoom) -> None:
        if self.config_error:
            return  # never overwrite a file the user has to fix by hand
        if self.readonly:
            return  # a watch-only session writes nothing: the theme and chart mode hold for this session
        try:
            save_config(self.home, self.config)
        except OSError as exc:
            self.notify(f"cannot save {config_path(self.home)}: {exc}", severity="warning", markup=False)

    def apply_chart_mode(self: ControlRoom) -> None:
        for chart in self.main.query(Chart):
            chart.mode = self.config.chart_mode
