"""Modal screens: help (generated from the live bindings) and the observe dialog."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static


def bindings_table(rows: list[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, description in rows:
        if key:
            table.add_row(key, description)
        else:  # a section header
            table.add_row(Text(description, style="bold underline"), "")
    return table


class HelpScreen(ModalScreen[None]):
    """Every binding active where `?` was pressed, from the same table that drives the footer."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close help")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 72; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, rows: list[tuple[str, str]], extra: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.extra = extra

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = "Keys"
            yield Static(bindings_table(self.rows))
            if self.extra:
                yield Static(Text(self.extra, style="dim"))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


@dataclass
class ObserveRequest:
    path: str
    follow: bool
    name: str | None


class ObserveScreen(ModalScreen[ObserveRequest | None]):
    """Ask for a path to observe: a Trackio db, a trainer_state.json or its directory, a JSONL."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ObserveScreen { align: center middle; }
    ObserveScreen > Vertical {
        width: 76; max-width: 100%; height: auto; border: round $primary; background: $surface; padding: 0 1;
    }
    ObserveScreen Input { margin: 0 0 1 0; }
    ObserveScreen #observe-error { color: $error; height: auto; }
    ObserveScreen Horizontal { height: auto; }
    """

    def __init__(self, validate: callable | None = None) -> None:  # type: ignore[valid-type]
        super().__init__()
        self.validate_path = validate

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Observe a run"
            yield Label(
                "Path: Trackio project .db, trainer_state.json (or its output/checkpoint dir), or JSONL"
            )
            yield Input(placeholder="~/runs/out/trainer_state.json", id="observe-path")
            yield Label("Run name (optional)")
            yield Input(placeholder="derived from the source", id="observe-name")
            with Horizontal():
                yield Checkbox("Follow (keep tailing)", value=True, id="observe-follow")
                yield Button("Observe", variant="primary", id="observe-ok")
            yield Static("", id="observe-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self._submit()

    def _submit(self) -> None:
        path = self.query_one("#observe-path", Input).value.strip()
        if not path:
            self.query_one("#observe-error", Static).update("enter a path")
            return
        if self.validate_path is not None:
            problem = self.validate_path(path)
            if problem:
                self.query_one("#observe-error", Static).update(problem)
                return
        name = self.query_one("#observe-name", Input).value.strip() or None
        follow = self.query_one("#observe-follow", Checkbox).value
        self.dismiss(ObserveRequest(path, follow, name))

    def action_cancel(self) -> None:
        self.dismiss(None)
