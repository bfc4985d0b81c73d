"""Chat widgets: a transcript that streams Markdown answers, and a multi-line input with history.

The transcript appends: a streamed answer grows one Markdown widget through Textual's
`MarkdownStream` (which re-parses only the last block and coalesces fragments), so a long
conversation is never re-rendered per chunk.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from engine.diagnosis.render import answer_parser
from engine.text import visible, visible_line


class ChatLog(VerticalScroll):
    """The conversation: questions, answers (Markdown), tool calls, notes and errors."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.answer: Markdown | None = None
        self.stream: MarkdownStream | None = None

    def _add(self, widget: Any) -> None:
        at_end = self.is_vertical_scroll_end or self.max_scroll_y == 0
        self.mount(widget)
        if at_end:  # follow the conversation unless the user scrolled back to read
            self.call_after_refresh(self.scroll_end, animate=False)

    def clear(self) -> None:
        self.answer = None
        self.stream = None
        self.remove_children()

    # Everything shown is text with its control characters made visible: a question, an answer, a tool's
    # input or result quote stored names, keys and prompts. Answers are Markdown (Claude writes it) without
    # links or HTML: a URL or a tag it quotes from a stored name is text (`answer_parser`, shared with
    # `carl diagnose`).

    def add_user(self, text: str) -> None:
        self._add(Static(Text("› " + visible(text)), classes="chat-user"))

    def add_markdown(self, text: str) -> None:
        self._add(Markdown(visible(text), parser_factory=answer_parser))

    def add_tool_call(self, name: str, args: dict[str, Any]) -> None:
        shown = json.dumps(args, ensure_ascii=False)
        self._add(Static(Text(visible_line(f"⚙ {name}({shown[:200]})")), classes="chat-tool"))

    def add_tool_result(self, text: str, error: bool = False) -> None:
        self._add(
            Static(
                Text(("  ✕ " if error else "  ↳ ") + visible(text[:200])),
                classes="chat-error" if error else "chat-tool",
            )
        )

    def add_error(self, text: str) -> None:
        self._add(Static(Text("✕ " + visible(text)), classes="chat-error"))

    def add_note(self, text: str) -> None:
        self._add(Static(Text(visible(text)), classes="chat-note"))

    async def start_answer(self) -> None:
        self.answer = Markdown("", parser_factory=answer_parser)
        self._add(self.answer)
        self.stream = Markdown.get_stream(self.answer)

    async def write_answer(self, fragment: str) -> None:
        if self.stream is None:
            await self.start_answer()
        assert self.stream is not None
        await self.stream.write(visible(fragment))
        if self.is_vertical_scroll_end or self.max_scroll_y - self.scroll_y <= 3:
            self.call_after_refresh(self.scroll_end, animate=False)

    async def end_answer(self) -> None:
        if self.stream is not None:
            await self.stream.stop()
        self.stream = None
        self.answer = None


class ChatInput(TextArea):
    """Multi-line input: `enter` sends, `ctrl+j` / `alt+enter` break the line, `up` / `down` on the
    first / last line walk the history of what was sent."""

    BINDINGS = [
        Binding("enter", "send", "Send", id="chat.send"),  # handled in _on_key, before TextArea inserts
        Binding("ctrl+j,alt+enter", "newline", "New line", id="chat.newline"),
    ]

    class Submitted(Message):
        def __init__(self, value: str) -> None:
            super().__init__()
            self.value = value

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.sent: list[str] = []
        self.position: int | None = None  # index into history while walking it
        self.draft = ""

    def action_send(self) -> None:
        value = self.text.strip()
        if not value:
            return
        if not self.sent or self.sent[-1] != value:
            self.sent.append(value)
        self.position = None
        self.text = ""
        self.post_message(self.Submitted(value))

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_key(self, event: events.Key) -> None:
        # TextArea takes enter for itself: this input's own keys (as the app's keymap binds them) go first.
        bound = self.screen.active_bindings.get(event.key)
        if bound is not None and bound.node is self and bound.binding.action in ("send", "newline"):
            event.prevent_default()
            event.stop()
            if bound.binding.action == "send":
                self.action_send()
            else:
                self.action_newline()
            return
        row = self.cursor_location[0]
        if event.key == "up" and row == 0 and self.sent:
            event.prevent_default()
            event.stop()
            if self.position is None:
                self.draft, self.position = self.text, len(self.sent)
            self.position = max(0, self.position - 1)
            self._show(self.sent[self.position])
            return
        if event.key == "down" and self.position is not None and row == self.document.line_count - 1:
            event.prevent_default()
            event.stop()
            self.position += 1
            if self.position >= len(self.sent):
                self.position = None
                self._show(self.draft)
            else:
                self._show(self.sent[self.position])
            return
        await super()._on_key(event)

    def _show(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)
