"""The log view (`L`): the selected run's console, followed as it grows, searched, its tracebacks at a key.

A run's consoles are the files the engine registered for it (engine/console/console_job.py): our runs' train
log, a W&B run's `files/output.log`, files named with `carl observe --log`. The newest is shown first; `tab`
goes to the next. The file is read by offsets and never whole (engine/console/log_reader.py, on this screen's
reader thread); LogLines (widgets/log_lines.py) draws the lines on screen. The status line says where the view
is, and one line when the file was truncated or replaced, or cannot be read. The keys are in
docs/guide/console.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Static
from textual.worker import get_current_worker

from engine.console.log_reader import Failed, Found, Grew, LogReader, Opened, Progress, Result
from engine.text import visible_line
from widgets.key_bar import KeyBar
from widgets.log_lines import LogLines

from .shown_errors import ONE_LINE

if TYPE_CHECKING:
    from engine.store import RunRow, StoreReader

CONSOLES_EVERY_S = 2.0  # how often the run's consoles are looked up again (one is registered as it starts)
NOTE_S = 15.0  # how long a note (truncated, rotated, a search that wrapped) stays in the status line
NONE = (
    "No console is known for this run. The engine keeps one for each run it starts (its log under "
    "$CARL_HOME/logs) and for observed W&B runs (files/output.log); for another, name its log file: "
    "carl observe DIR --log train.log"
)


class ConsolesRead(Message):
    def __init__(self, consoles: list[dict[str, Any]]) -> None:
        super().__init__()
        self.consoles = consoles


class LogRead(Message):
    """What a log file's reader returned, to apply in order (dropped when it is not the file shown now)."""

    def __init__(self, reader: LogReader, results: list[Result]) -> None:
        super().__init__()
        self.reader = reader
        self.results = results


class ReaderFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class ConsoleScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "close", "Close", id="console.close"),
        Binding("slash", "search", "Search", key_display="/", id="console.search"),
        Binding("n", "again(1)", "Next", id="console.next-match"),
        Binding("N", "again(-1)", "Previous match", show=False, id="console.previous-match"),
        Binding("t", "problem(1)", "Traceback", id="console.next-traceback"),
        Binding("T", "problem(-1)", "Previous traceback", show=False, id="console.previous-traceback"),
        Binding("tab", "next_console", "Next log", id="console.next-log"),
    ]

    def __init__(self, run: RunRow, db_path: Path) -> None:
        super().__init__()
        self.run = run
        self.db_path = db_path
        self.consoles: list[dict[str, Any]] | None = None  # None: not read yet
        self.chosen: str | None = None  # the path shown
        self.reader: LogReader | None = None  # the shown file's; the reader thread answers for it
        self.search_text = ""
        self.generation = 0  # of the newest search or jump: answers to older ones are dropped
        self.indexing: tuple[int, int] | None = None
        self.error: str | None = None
        self.note = ""
        self.note_until = 0.0

    # -- layout ----------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(id="console"):
            yield Static("", id="console-status")
            yield Input(
                placeholder="search: text (smart case); enter: next match, n / N after", id="console-search"
            )
            yield LogLines(id="console-lines")
            yield Static("", id="console-empty")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#console-search").display = False
        self.query_one("#console-empty").display = False
        self.lines.focus()
        self.watch(self.lines, "scroll_y", self.show_status, init=False)
        self.set_interval(1.0, self.show_status)  # the note's end, and `following` as lines come
        self.show_title()
        self.show_status()
        self.read_console()

    @property
    def lines(self) -> LogLines:
        return self.query_one(LogLines)

    # -- the reader thread -----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="console-reader")
    def read_console(self) -> None:
        worker = get_current_worker()
        current: LogReader | None = None
        store: StoreReader | None = None
        seen: list[dict[str, Any]] | None = None
        next_lookup = 0.0
        try:
            while not worker.is_cancelled:
                if time.monotonic() >= next_lookup:
                    next_lookup = time.monotonic() + CONSOLES_EVERY_S
                    store = store or self._open_store()
                    consoles = store.system.run_consoles(self.run.id) if store is not None else []
                    if consoles != seen:
                        seen = consoles
                        self.post_message(ConsolesRead(consoles))
                reader = self.reader  # set on the UI thread when a file is chosen
                if reader is not current:
                    if current is not None:
                        current.close()
                    current = reader
                if current is None:
                    time.sleep(0.1)
                    continue
                results = current.answer(timeout=0.1)
                if results and not worker.is_cancelled:
                    self.post_message(LogRead(current, results))
        except ONE_LINE as exc:  # an unreadable store: one line, the view stays up
            self.post_message(ReaderFailed(str(exc)))
        finally:
            if current is not None:
                current.close()
            if store is not None:
                store.close()

    def _open_store(self) -> StoreReader | None:
        from engine.store import StoreReader

        return StoreReader(self.db_path) if self.db_path.exists() else None

    @on(ReaderFailed)
    def reader_failed(self, event: ReaderFailed) -> None:
        self.notify(event.error, title="console", severity="error", timeout=10, markup=False)

    @on(ConsolesRead)
    def consoles_read(self, event: ConsolesRead) -> None:
        self.consoles = event.consoles
        paths = [c["path"] for c in event.consoles]
        if self.chosen not in paths:
            self.choose(paths[-1] if paths else None)  # the newest: a resumed run's latest log
        self.show_title()
        self.show_status()

    def choose(self, path: str | None) -> None:
        self.chosen = path
        self.reader = LogReader(path) if path else None
        self.indexing, self.error = None, None
        self.lines.following = True
        empty = self.query_one("#console-empty", Static)
        empty.display = path is None
        empty.update(Text(NONE))
        self.show_title()
        self.show_status()

    @on(LogRead)
    def apply(self, event: LogRead) -> None:
        stale = event.reader is not self.reader
        for result in event.results:
            if isinstance(result, Opened):
                if stale:
                    result.file.close()
                    continue
                self.error = None
                self.query_one("#console-empty").display = False
                self.indexing = None if result.whole else self.indexing
                self.lines.show(result.index, result.file, result.count, result.end, whole=result.whole)
                if not result.whole:  # its end is drawn with this refresh: the reader indexes the rest now
                    self.call_after_refresh(event.reader.view_ready.set)
                if result.note:
                    self.say(result.note)
                    self.notify(result.note, title="console", markup=False)
            elif stale:
                continue
            elif isinstance(result, Grew):
                self.lines.grow(result.count, result.end)
            elif isinstance(result, Progress):
                self.indexing = (result.done, result.total)
            elif isinstance(result, Found):
                if result.generation == self.generation:
                    if result.line is not None:
                        self.lines.go_to(result.line)
                    self.say(result.note)
            elif isinstance(result, Failed):
                self.error = result.error
                empty = self.query_one("#console-empty", Static)
                empty.update(Text(visible_line(result.error)))
                empty.display = True
        self.show_status()

    # -- what is said ----------------------------------------------------------------------------------------

    def say(self, note: str) -> None:
        self.note, self.note_until = note, time.monotonic() + NOTE_S

    def show_title(self) -> None:
        name = f"Console · {visible_line(self.run.name)}"
        consoles = self.consoles or []
        if self.chosen is not None:
            where = next((i for i, c in enumerate(consoles) if c["path"] == self.chosen), 0)
            of = f" · {where + 1} of {len(consoles)}, tab: next" if len(consoles) > 1 else ""
            kind = consoles[where]["kind"] if consoles else ""
            name += f" · {visible_line(Path(self.chosen).name)} ({kind}){of}"
        # Titles of stored text are Text, never markup (a run's name and a path are the source's).
        self.query_one("#console").border_title = Text(name)

    def show_status(self, *_: Any) -> None:
        lines = self.lines
        parts = []
        if self.consoles is None:
            parts.append("reading…")
        elif self.chosen is None:
            parts.append("no console")
        elif self.error:
            parts.append(self.error)
        elif lines.index is None:
            parts.append("opening…")
        else:
            parts.append(f"{lines.count:,} lines" if lines.whole else f"the last {lines.count:,} lines")
            parts.append(size_text(lines.end))
            if self.indexing and not lines.whole:
                done, total = self.indexing
                parts.append(f"indexing {100 * done // max(1, total)}% (line numbers then)")
            if lines.following:
                parts.append("following")
            elif lines.count:
                top = lines.top_line
                last = min(lines.count, top + lines.rows)
                if lines.whole:
                    parts.append(f"lines {top + 1:,}–{last:,}")
                parts.append("end: follow")
        if self.search_text:
            parts.append(f"/{visible_line(self.search_text)}")
        if self.note and time.monotonic() < self.note_until:
            parts.append(visible_line(self.note))
        line = Text(" · ".join(parts), no_wrap=True, overflow="ellipsis")
        status = self.query_one("#console-status", Static)
        if line != status.content:
            status.update(line, layout=False)

    # -- keys ------------------------------------------------------------------------------------------------

    def action_close(self) -> None:
        field = self.query_one("#console-search", Input)
        if field.display:  # esc in the search field closes it, not the view
            field.display = False
            self.lines.focus()
            return
        self.workers.cancel_group(self, "console-reader")
        self.dismiss(None)

    def action_search(self) -> None:
        field = self.query_one("#console-search", Input)
        field.display = True
        field.value = self.search_text
        field.focus()

    @on(Input.Submitted, "#console-search")
    def search_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.lines.focus()
        self.search_text = event.value
        self.lines.set_highlight(event.value)
        if event.value:
            self.action_again(1)
        self.show_status()

    def action_again(self, direction: int) -> None:
        """The next (1) or previous (-1) line holding the search text."""
        forward = direction > 0
        if not self.search_text:
            self.say("nothing to search for: / first")
        elif self.reader is not None:
            here = self.lines.here(forward=forward)
            self.generation = self.reader.want_search(self.search_text, here, forward=forward)
            self.say("searching…")
        self.show_status()

    def action_problem(self, direction: int) -> None:
        """The next (1) or previous (-1) traceback, CUDA out-of-memory or NCCL error."""
        forward = direction > 0
        if self.reader is not None:
            self.generation = self.reader.want_problem(self.lines.here(forward=forward), forward=forward)
            self.say("looking for tracebacks…")
            self.show_status()

    def action_next_console(self) -> None:
        paths = [c["path"] for c in self.consoles or []]
        if len(paths) < 2:
            self.say("this run has one console" if paths else "this run has no console")
            self.show_status()
            return
        at = paths.index(self.chosen) if self.chosen in paths else -1
        self.choose(paths[(at + 1) % len(paths)])
