"""The record inspector (`i`): the raw stored row of one step of a run, every key and its value there,
the run's own columns (framework, source, vocabulary size, ...) and its settings, and how many rollouts
the step has. Read off the UI thread; `/` filters the rows; the table draws only the rows in view.

Opened from the control room (the selected run's newest step) or from the metrics explorer (the step
under the chart's cursor)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from engine.store import StoreReader
from engine.text import visible_line

from .explorer_model import KeyInfo, key_matches
from .shown_errors import ONE_LINE

TIME_FIELDS = frozenset({"last_update", "started_at", "ended_at"})


@dataclass
class Record:
    """One step of a run as stored: (key, value, the source's name) of every key with a row at the step."""

    run: dict[str, Any]
    step: int | None  # None: the run has no metric rows yet
    values: list[tuple[str, float | None, str | None]] = field(default_factory=list)
    missing: int = 0  # keys of the run without a row at this step
    config: dict[str, Any] = field(default_factory=dict)
    rollouts: int = 0


def read_record(reader: StoreReader, run_id: int, step: int | None) -> Record | None:
    """The run's row, and every key's value at `step` (the run's newest step when None): one index
    seek per key."""
    run = reader.run(run_id)
    if run is None:
        return None
    step = run.last_step if step is None else step
    record = Record(dataclasses.asdict(run), step, config=reader.run_config(run_id))
    if step is None:
        return record
    names = reader.key_names(run_id)
    for key in reader.metric_keys(run_id):
        at = reader.metric_range(run_id, key, step, step, max_points=1)
        if len(at):
            value = at.vmin[0]
            record.values.append((key, value if math.isfinite(value) else None, names.get(key)))
        else:
            record.missing += 1
    record.rollouts = dict(reader.rollout_steps(run_id)).get(step, 0)
    return record


def shown_value(value: Any) -> str:
    """A stored value as text: a float in full, null as null, a list or table as JSON."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def record_rows(record: Record) -> list[tuple[str, str, str, str | None]]:
    """(section, field, value, the source's name) of every row the inspector shows."""
    rows: list[tuple[str, str, str, str | None]] = []
    step = "—" if record.step is None else f"{record.step:,}"
    for key, value, source in record.values:
        rows.append(
            (f"metrics at step {step}", key, "null (not finite)" if value is None else repr(value), source)
        )
    rows.append(("rollouts", "rollouts at this step", f"{record.rollouts:,}", None))
    for name, value in record.run.items():
        text = shown_value(value)
        if name in TIME_FIELDS and isinstance(value, int | float):
            text += time.strftime("  (%Y-%m-%d %H:%M:%S)", time.localtime(value))
        rows.append(("run", name, text, None))
    for name, value in record.config.items():
        rows.append(("settings", name, shown_value(value), None))
    return rows


class RecordTable(DataTable[Text]):
    """The inspector's rows: home and end go to the first and the last row. DataTable's own home and end
    scroll sideways, to the end of the widest value (a run's settings as JSON), where every other row is
    blank."""

    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False, id="inspector.first-row"),
        Binding("end", "scroll_bottom", "Last row", show=False, id="inspector.last-row"),
    ]

    def action_scroll_top(self) -> None:
        """The first row, at the top, now: DataTable's own scroll waits for a refresh after the cursor moves,
        and the suite once saw the cursor on row 0 with the table still scrolled to the end 30 s later."""
        self.move_cursor(row=0, scroll=False)
        self.scroll_to(x=0, y=0, animate=False, immediate=True)

    def action_scroll_bottom(self) -> None:
        """The last row: the cursor scrolls it into view once the rows are laid out, and never sideways."""
        self.move_cursor(row=self.row_count - 1)
        self.scroll_to(x=0, animate=False, immediate=True)


class InspectorScreen(ModalScreen[None]):
    """One step of one run, every stored value of it."""

    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/", id="inspector.filter"),
        Binding("escape", "back", "Back", id="inspector.back"),
        Binding("i,q", "close", "Close", id="inspector.close"),
    ]

    class Read(Message):
        def __init__(self, record: Record | None, error: str | None = None) -> None:
            super().__init__()
            self.record = record
            self.error = error

    def __init__(self, db_path: Path, run_id: int, step: int | None = None) -> None:
        super().__init__()
        self.db_path = db_path
        self.run_id = run_id
        self.step = step
        self.record: Record | None = None
        self.rows: list[tuple[str, str, str, str | None]] = []
        self.filter_text = ""

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Record"
            yield Static(Text("reading…"), id="inspector-title")
            search = Input(
                placeholder="filter rows: a substring, or a glob such as rewards/*", id="inspector-filter"
            )
            search.display = False  # until `/`
            yield search
            yield RecordTable(cursor_type="row", zebra_stripes=True, id="inspector-table")
            yield Static(Text("/ filters · esc closes", style="dim"), id="inspector-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("field", "value")
        table.focus()
        self.read()

    @work(thread=True, exclusive=True, group="inspector")
    def read(self) -> None:
        try:
            reader = StoreReader(self.db_path)
            try:
                record = read_record(reader, self.run_id, self.step)
            finally:
                reader.close()
        except ONE_LINE as exc:  # an unreadable store: one line, the screen stays up
            self.post_message(self.Read(None, str(exc)))
            return
        self.post_message(self.Read(record))

    @on(Read)
    def record_read(self, event: Read) -> None:
        title = self.query_one("#inspector-title", Static)
        if event.record is None:
            title.update(Text(event.error or "that run is gone from the store", style="bold red"))
            return
        record = self.record = event.record
        self.rows = record_rows(record)
        name = visible_line(str(record.run.get("name")))
        if record.step is None:
            line = f"run {name} · no metrics yet"
        else:
            line = f"run {name} · step {record.step:,} · {len(record.values):,} keys"
            if record.missing:
                line += f" ({record.missing:,} more have no row at this step)"
            if record.rollouts:
                line += f" · {record.rollouts:,} rollouts"
        title.update(Text(line))
        self.fill()

    def fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        section = None
        for where, name, value, source in self.rows:
            if not key_matches(KeyInfo(name, source), self.filter_text):
                continue
            if where != section:  # a section's heading, over its first row that shows
                section = where
                table.add_row(Text(where, style="bold underline"), Text(""))
            # a renamed key shows both names, as in the explorer: `entropy  (actor/entropy)`
            table.add_row(Text(KeyInfo(name, source).label), Text(visible_line(value)))

    def action_filter(self) -> None:
        box = self.query_one("#inspector-filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#inspector-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.fill()

    @on(Input.Submitted, "#inspector-filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(DataTable).focus()

    def action_back(self) -> None:
        box = self.query_one("#inspector-filter", Input)
        if box.display or self.filter_text:
            box.value = ""
            box.display = False
            self.filter_text = ""
            self.fill()
            self.query_one(DataTable).focus()
        else:
            self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
