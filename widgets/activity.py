"""The Trajectories pane (newest first, bounded, with an empty state that says how data gets there)
and the plain activity list it is built on. The Agents pane is in widgets/agents.py."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from engine.text import visible_line

TRAJECTORIES_EMPTY = (  # what to do first: a pane may have room for two or three lines only
    "No trajectories yet. `carl hooks install` records Claude Code sessions as they happen; "
    "`carl trajectories import` reads past Claude Code and Codex sessions. Each is scored with the "
    "5-signal trajectory reward and streams in here, newest first."
)
MAX_ROWS = 200


def _clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "--:--:--"


def _num(value: float | None, spec: str = "+.2f") -> str:
    return "  —  " if value is None else format(value, spec)


class ActivityPane(Static):
    """A bounded list of the newest rows of one table, rendered as plain lines."""

    def __init__(self, empty_text: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(empty_text, id=id, classes=classes)
        self.empty_text = empty_text
        self.rows: list[dict[str, Any]] = []
        self.add_class("-empty")

    def set_rows(self, rows: list[dict[str, Any]], total: int) -> None:
        rows = rows[:MAX_ROWS]
        if rows == self.rows:
            return
        self.rows = rows
        self.set_class(not rows, "-empty")
        if not rows:
            self.update(self.empty_text)
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{total:,} total, newest first\n", style="dim")
        for i, row in enumerate(rows):
            if i:
                text.append("\n")
            text.append(self.format_row(row))
        self.update(text)

    def format_row(self, row: dict[str, Any]) -> str:
        """Generic `key=value` line; the panes below format their own tables' columns. Stored text
        in it is written out with `visible_line` (each line is one line of the pane)."""
        return visible_line(" ".join(f"{k}={v}" for k, v in row.items() if v is not None))


class TrajectoriesPane(ActivityPane):
    """Newest first; focus it (tab) and move with up/down, `enter` opens the highlighted one."""

    can_focus = True
    BINDINGS = [
        Binding("up,k", "move(-1)", "Previous", show=False, id="trajectories.previous"),
        Binding("down,j", "move(1)", "Next", show=False, id="trajectories.next"),
        Binding("enter", "open", "Open trajectory", id="trajectories.open"),
    ]

    class Selected(Message):
        def __init__(self, row: dict[str, Any]) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(TRAJECTORIES_EMPTY, id=id, classes=classes)
        self.cursor = 0
        self.top = 0  # first row shown
        self.total = 0

    def set_rows(self, rows: list[dict[str, Any]], total: int) -> None:
        self.total = total
        selected = self.rows[self.cursor]["id"] if self.rows and self.cursor < len(self.rows) else None
        super().set_rows(rows, total)
        ids = [r.get("id") for r in self.rows]
        self.cursor = ids.index(selected) if selected in ids else 0  # the cursor stays on its row
        self._draw()

    def _draw(self) -> None:
        if not self.rows:
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{self.total:,} · newest first · enter opens\n", style="dim")
        visible = max(1, self.size.height - 1) if self.size.height else len(self.rows)
        self.top = min(max(self.top, self.cursor - visible + 1), self.cursor)  # keep the cursor in view
        for i in range(self.top, min(len(self.rows), self.top + visible)):
            if i > self.top:
                text.append("\n")
            style = "reverse" if i == self.cursor and self.has_focus else ""
            text.append(self.format_row(self.rows[i]), style=style)
        self.update(text)

    def on_resize(self) -> None:
        self._draw()

    def on_focus(self) -> None:
        self._draw()

    def on_blur(self) -> None:
        self._draw()

    def action_move(self, delta: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
            self._draw()

    def action_open(self) -> None:
        if self.rows:
            self.post_message(self.Selected(self.rows[self.cursor]))

    def format_row(self, row: dict[str, Any]) -> str:
        session = visible_line(row.get("session_id"))[:8]
        domain = visible_line(row.get("domain") or "-")[:12]
        rate = row.get("success_rate")
        return (
            f"{_clock(row.get('created_at'))} {session:<8} {domain:<12}"
            f" tools {row.get('tool_count') or 0:>3} ok {_num(rate, '.0%') if rate is not None else '  — '}"
            f" R {_num(row.get('reward'))} A {_num(row.get('advantage'))}"
        )
