"""The diagnosis chat (`d`): ask Claude, or the offline analyst, about the selected run.

A screen over the control room: the run's stored conversations on the left (enter resumes one,
delete removes it), the transcript in the middle, a multi-line input at the bottom. A turn runs
in a thread worker; its events reach the transcript batched, a few updates a second, and every
tool call is shown as it happens. Questions and answers are stored per run in carl.db, written through the
control room's sender (carl_tui/command_sender.py, its one write path). Every read and write of the stored
conversations runs in a thread worker too, and comes back as a message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from engine.diagnosis.chat import ChatEvent, Diagnoser
from engine.diagnosis.conversations import Conversations
from engine.text import visible_line
from widgets.chat_log import ChatInput, ChatLog
from widgets.key_bar import KeyBar

from .shown_errors import ONE_LINE

if TYPE_CHECKING:
    from .command_sender import CommandSender

NARROW = 100  # columns below which the conversation list hides until ctrl+l
FLUSH_S = 0.25  # streamed text reaches the screen at most 4 times a second
SLASH_HELP = """\
/context   show exactly what is sent to Claude with each question
/model     show the model; /model NAME switches to NAME
/offline   toggle the offline analyst (no network, no key needed)
/clear     start a new conversation (the old one stays in the list)
/delete    delete this conversation
/help      this list"""


class ChatScreen(Screen[None]):
    BINDINGS = [
        # Short words in the key bar (80 columns), the whole of them in the help (their tooltips).
        Binding("escape", "leave", "Back", tooltip="Back to the control room", id="chat.leave"),
        Binding("ctrl+n", "new_conversation", "New", tooltip="New conversation", id="chat.new"),
        Binding("ctrl+l", "focus_list", "Conversations", id="chat.conversations"),
        Binding("delete", "delete_selected", "Delete conversation", show=False, id="chat.delete"),
    ]

    def __init__(
        self,
        sender: CommandSender,
        run_id: int,
        run_name: str,
        *,
        api_key: str | None,
        model: str | None,
        base_url: str | None = None,
    ) -> None:
        super().__init__()
        self.sender = sender
        self.run_id = run_id
        self.run_name = run_name
        self.diagnoser = Diagnoser(sender.db_path, run_id, api_key=api_key, model=model, base_url=base_url)
        self.conversation: int | None = None
        self.busy = False
        self.conversations: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="chat-title")
        with Horizontal():
            yield OptionList(id="chat-list")
            with Vertical(id="chat-main"):
                yield ChatLog(id="chat-log")
                yield Static("", id="chat-status")
                yield ChatInput(id="chat-input")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#chat-list", OptionList).border_title = "Conversations"
        self._refresh_list()
        self._show_title()
        log = self.query_one(ChatLog)
        who = (
            "Claude " + self.diagnoser.model
            if not self.diagnoser.offline
            else f"the offline analyst ({self.diagnoser.offline_reason()})"
        )
        log.add_note(f"Ask about run {self.run_name}: {who} answers from its numbers. /help lists commands.")
        self.query_one(ChatInput).focus()
        self.call_after_refresh(self._fit_list)  # a screen gets no Resize when pushed at a size already set

    # -- header, list ------------------------------------------------------------------------

    def _show_title(self) -> None:
        """`Diagnose RUN │ WHO │ CONVERSATION`; on a narrow screen the offline analyst's reason goes (the
        first note of the transcript says it), then a long run name is cut, then the conversation's title."""
        if self.diagnoser.offline:
            who = Text(f"offline analyst ({self.diagnoser.offline_reason()})", style="bold yellow")
            short_who = Text("offline analyst", style="bold yellow")
        else:
            who = short_who = Text(f"Claude {visible_line(self.diagnoser.model)}", style="bold")
        title = next(
            (c["title"] for c in self.conversations if c["id"] == self.conversation), "new conversation"
        )
        header = self.query_one("#chat-title", Static)
        width = header.content_size.width or 10_000
        name = Text(visible_line(self.run_name), style="bold")
        line = title_line(name, who, title)
        if line.cell_len > width:
            line = title_line(name, short_who, title)
        if line.cell_len > width and name.cell_len > 12:  # still too long: a long run name is cut
            name.truncate(max(12, name.cell_len - (line.cell_len - width)), overflow="ellipsis")
            line = title_line(name, short_who, title)
        header.update(line)

    def _store(self) -> Conversations:
        """The stored conversations, through the sender (which refuses a read-only session)."""
        return self.sender.conversations()

    # -- the stored conversations, off the UI thread ------------------------------------------------

    class Stored(Message):
        """A read or write of the conversations finished: `then(result)` runs on the UI thread."""

        def __init__(self, result: Any, then: Callable[[Any], None]) -> None:
            super().__init__()
            self.result = result
            self.then = then

    def in_store(self, job: Callable[[Conversations], Any], then: Callable[[Any], None]) -> None:
        """Run `job` on the conversations in a thread worker; `then` gets its result. A failure is a
        line in the transcript: the chat stays usable."""

        def run() -> None:
            try:
                store = self._store()
                try:
                    result = job(store)
                finally:
                    store.close()
            except ONE_LINE as exc:  # an unreadable store
                self.post_message(self.Stored(f"cannot read the conversations: {exc}", self._store_failed))
                return
            self.post_message(self.Stored(result, then))

        self.run_worker(run, thread=True, group="chat-store")

    def on_chat_screen_stored(self, event: ChatScreen.Stored) -> None:
        event.then(event.result)

    def _store_failed(self, error: str) -> None:
        self.query_one(ChatLog).add_error(error)

    def _refresh_list(self) -> None:
        self.in_store(lambda store: store.list(self.run_id), self._show_list)

    def _show_list(self, conversations: list[dict[str, Any]]) -> None:
        self.conversations = conversations
        options = [
            Option(
                Text(f"{visible_line(c['title'])[:26]}\n", overflow="ellipsis").append(
                    f"{time.strftime('%m-%d %H:%M', time.localtime(c['updated_at']))} · {c['messages']} msg",
                    style="dim",
                ),
                id=str(c["id"]),
            )
            for c in self.conversations
        ]
        box = self.query_one("#chat-list", OptionList)
        box.clear_options()
        box.add_options(options)
        for index, c in enumerate(self.conversations):
            if c["id"] == self.conversation:
                box.highlighted = index
        self._show_title()  # a new conversation's title comes with the list

    @on(OptionList.OptionSelected, "#chat-list")
    def _resume(self, event: OptionList.OptionSelected) -> None:
        if self.busy or event.option.id is None:
            return
        self.load_conversation(int(event.option.id))
        self.query_one(ChatInput).focus()
        self._fit_list()

    def load_conversation(self, conversation_id: int) -> None:
        self.in_store(
            lambda store: store.messages(conversation_id),
            lambda messages: self._show_conversation(conversation_id, messages),
        )

    def _show_conversation(self, conversation_id: int, messages: list[dict[str, Any]]) -> None:
        self.conversation = conversation_id
        log = self.query_one(ChatLog)
        log.clear()
        for m in messages:
            if m["role"] == "user":
                log.add_user(m["content"])
            elif m["role"] == "assistant":
                log.add_markdown(m["content"])
            elif m["role"] == "tool":
                log.add_tool_call(m["meta"].get("name", "?"), m["meta"].get("input", {}))
            elif m["role"] == "error":
                log.add_error(m["content"])
        self._show_title()

    def action_focus_list(self) -> None:
        box = self.query_one("#chat-list", OptionList)
        box.display = True  # shown on demand on a narrow terminal
        if box.highlighted is None and box.option_count:
            box.highlighted = 0
        box.focus()

    def on_resize(self) -> None:
        self._fit_list()
        self._show_title()

    def _fit_list(self) -> None:
        """Below 100 columns the transcript gets the width; ctrl+l brings the list back."""
        box = self.query_one("#chat-list", OptionList)
        box.display = self.size.width >= NARROW or box.has_focus

    def action_new_conversation(self) -> None:
        if self.busy:
            return
        self.conversation = None
        self.query_one(ChatLog).clear()
        self.query_one(ChatLog).add_note("New conversation.")
        self._show_title()
        self.query_one(ChatInput).focus()

    def action_delete_selected(self) -> None:
        box = self.query_one("#chat-list", OptionList)
        if self.busy or box.highlighted is None or not box.has_focus:
            return
        self._delete(int(box.get_option_at_index(box.highlighted).id or 0))

    def _delete(self, conversation_id: int) -> None:
        from .screens import ConfirmScreen

        title = next((c["title"] for c in self.conversations if c["id"] == conversation_id), "?")

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.in_store(lambda store: store.delete(conversation_id), deleted)

        def deleted(_: object) -> None:
            if self.conversation == conversation_id:
                self.action_new_conversation()
            self._refresh_list()
            self.notify(f"deleted “{title[:40]}”", title="diagnose", markup=False)

        screen = ConfirmScreen(
            "Delete conversation", f"Delete “{title[:50]}” and its messages?", "Delete", "delete"
        )
        self.app.push_screen(screen, confirmed)

    def action_leave(self) -> None:
        self.dismiss(None)

    # -- input ---------------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    def _submitted(self, event: ChatInput.Submitted) -> None:
        text = event.value
        if text.startswith("/"):
            self._slash(text)
            return
        if self.busy:
            self.query_one(ChatLog).add_note("still answering: wait for it (or esc and come back)")
            return
        self.query_one(ChatLog).add_user(text)
        self.busy = True
        self._set_status("thinking…" if not self.diagnoser.offline else "analysing…")
        self.ask(text, self.conversation)

    def _slash(self, text: str) -> None:
        command, _, rest = text.partition(" ")
        log = self.query_one(ChatLog)
        rest = rest.strip()
        if command == "/help":
            log.add_note(SLASH_HELP)
        elif command == "/context":
            self._show_context()
        elif command == "/model":
            if rest:
                self.diagnoser.model = rest
                self.diagnoser._client = None
                log.add_note(f"model: {rest}")
            else:
                log.add_note(
                    f"model: {self.diagnoser.model}" + (" (offline now)" if self.diagnoser.offline else "")
                )
            self._show_title()
        elif command == "/offline":
            self.diagnoser.force_offline = not self.diagnoser.force_offline
            if self.diagnoser.offline:
                log.add_note(f"offline analyst on ({self.diagnoser.offline_reason()})")
            else:
                log.add_note(f"Claude {self.diagnoser.model} on")
            self._show_title()
        elif command == "/clear":
            self.action_new_conversation()
        elif command == "/delete":
            if self.conversation is None:
                log.add_note("nothing to delete: this conversation is not stored yet")
            else:
                self._delete(self.conversation)
        else:
            log.add_error(f"unknown command {command}; /help lists them")

    def _show_context(self) -> None:
        """What is sent to Claude: the context (the run's digest, read from the store) and the history."""
        conversation = self.conversation

        def read(store: Conversations) -> tuple[dict[str, Any] | str, list[Any]]:
            try:
                parts: dict[str, Any] | str = self.diagnoser.context()
            except ONE_LINE as exc:  # an unreadable store: say so, stay usable
                parts = f"cannot build the context: {exc}"
            return parts, store.history(conversation)

        self.in_store(read, self._context_read)

    def _context_read(self, read: tuple[dict[str, Any] | str, list[Any]]) -> None:
        from .screens import TextScreen

        parts, history = read
        if isinstance(parts, str):
            self.query_one(ChatLog).add_error(parts)
            return
        system = "\n\n".join(block["text"] for block in parts["system"])
        digest = parts["digest"]["text"]
        tools = "\n".join(f"- {t['name']}: {t['description']}" for t in parts["tools"])
        offline = "(offline now: nothing is sent; the analyst reads the same digest)"
        text = (
            f"model: {parts['model']}   max_tokens: {parts['max_tokens']}   "
            f"history: {len(history)} earlier messages   cached: digest and tools\n"
            f"{offline if self.diagnoser.offline else ''}"
            f"\n── system ──\n{system}\n\n── the first message's data: the run digest ──\n{digest}"
            f"\n\n── tools ──\n{tools}"
        )
        self.app.push_screen(TextScreen("What is sent to Claude", text))

    def _set_status(self, text: str) -> None:
        self.query_one("#chat-status", Static).update(Text(visible_line(text)))  # a tool's name is text

    # -- a turn, in a thread ---------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="diagnose")
    def ask(self, question: str, conversation: int | None) -> None:
        store = self._store()
        try:
            history = store.history(conversation)
            conversation, _ = store.add(conversation, self.run_id, "user", question)
            self.post_message(self.TurnStarted(conversation))
            buffer: list[str] = []
            last = time.monotonic()
            final: dict[str, Any] = {}
            for event in self.diagnoser.ask(question, history):
                if event.kind == "text":
                    buffer.append(event.text)
                    if time.monotonic() - last >= FLUSH_S:
                        self.post_message(self.Turn(ChatEvent("text", "".join(buffer))))
                        buffer, last = [], time.monotonic()
                    continue
                if buffer:
                    self.post_message(self.Turn(ChatEvent("text", "".join(buffer))))
                    buffer = []
                if event.kind == "tool_call":
                    store.add(
                        conversation,
                        self.run_id,
                        "tool",
                        event.text,
                        {"name": event.data["name"], "input": event.data["input"]},
                    )
                if event.kind in ("done", "error"):
                    final = event.data
                self.post_message(self.Turn(event))
            if final.get("answer"):
                meta = {
                    "offline": final.get("offline", False),
                    "model": final.get("model"),
                    "usage": final.get("usage"),
                    "tool_calls": final.get("tool_calls"),
                }
                store.add(conversation, self.run_id, "assistant", final["answer"], meta)
            if final.get("error"):
                store.add(conversation, self.run_id, "error", final["error"])
        except ONE_LINE as exc:  # the store: one line in the pane, the chat stays usable
            self.post_message(self.Turn(ChatEvent("error", f"diagnosis failed: {exc}", {})))
        finally:
            store.close()
            self.post_message(self.TurnEnded())

    class TurnStarted(Message):
        """The question is stored, in this conversation (a new one when the turn started none)."""

        def __init__(self, conversation: int) -> None:
            super().__init__()
            self.conversation = conversation

    class Turn(Message):
        """One event of the turn: streamed text (a few pieces a second), a tool call, its result, the end."""

        def __init__(self, event: ChatEvent) -> None:
            super().__init__()
            self.event = event

    class TurnEnded(Message):
        """The turn is over, its answer (or error) stored."""

    def on_chat_screen_turn_started(self, message: ChatScreen.TurnStarted) -> None:
        self.conversation = message.conversation

    async def on_chat_screen_turn(self, message: ChatScreen.Turn) -> None:
        event = message.event
        log = self.query_one(ChatLog)
        if event.kind == "text":
            await log.write_answer(event.text)
        elif event.kind == "tool_call":
            await log.end_answer()
            log.add_tool_call(event.data["name"], event.data["input"])
            self._set_status(f"running tool {event.data['name']}…")
        elif event.kind == "tool_result":
            log.add_tool_result(event.text, error=event.data.get("error", False))
            self._set_status("thinking…")
        elif event.kind == "status":
            log.add_note(event.text)
        elif event.kind == "error":
            await log.end_answer()
            log.add_error(event.text)
        elif event.kind == "done":
            await log.end_answer()
            self._set_status(_usage_line(event.data))

    def on_chat_screen_turn_ended(self) -> None:
        self.busy = False
        if "…" in str(self.query_one("#chat-status", Static).render()):
            self._set_status("")  # a turn that ended in an error leaves no "thinking…" behind
        self._refresh_list()
        self._show_title()


def _usage_line(data: dict[str, Any]) -> str:
    if data.get("offline"):
        return "offline analyst"
    usage = data.get("usage") or {}
    calls = len(data.get("tool_calls") or [])
    parts = [f"{data.get('model')}", f"{calls} tool call{'s' if calls != 1 else ''}"]
    if usage:
        parts.append(f"in {usage.get('input_tokens', 0):,} · out {usage.get('output_tokens', 0):,} tokens")
        if usage.get("cache_read_input_tokens"):
            parts.append(f"cache read {usage['cache_read_input_tokens']:,}")
    return " · ".join(parts)


def title_line(name: Text, who: Text, title: str) -> Text:
    line = Text.assemble(("Diagnose ", "bold"), name, " │ ", who, " │ ", visible_line(title)[:60])
    line.no_wrap, line.overflow = True, "ellipsis"
    return line
