"""The diagnosis pane through Pilot: `d` opens it over the control room, a question streams its
answer in (batched), tool calls and errors show as lines, slash commands work, and a stored
conversation is resumed and deleted. Claude is the real SDK against tests/messages_server.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from messages_server import MessagesServer, conversation_of
from support import until
from test_diagnosis import grpo_run
from test_diagnosis_claude import KEY

from carl_tui.app import ControlRoom
from carl_tui.chat_screen import ChatScreen
from engine.diagnosis.conversations import Conversations
from engine.store import Store
from widgets.chat_log import ChatInput, ChatLog


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        grpo_run(store, "chatty", 60)
    return home


def log_text(app: ControlRoom) -> str:
    log = app.screen.query_one(ChatLog)
    parts = []
    for child in log.children:
        if hasattr(child, "source"):  # Markdown
            parts.append(child.source)
        else:
            parts.append(str(child.render()))
    return "\n".join(parts)


async def ask(pilot: object, app: ControlRoom, text: str) -> None:
    box = app.screen.query_one(ChatInput)
    box.text = text
    await pilot.press("enter")  # type: ignore[attr-defined]


async def open_chat(pilot: object, app: ControlRoom) -> None:
    await until(pilot, lambda: app.main.view is not None)
    await pilot.press("d")  # type: ignore[attr-defined]
    await until(pilot, lambda: isinstance(app.screen, ChatScreen))


async def test_a_streamed_answer_with_a_tool_call(home: Path, server: MessagesServer) -> None:
    server.tool_use("get_metric", {"key": "rewards/task/mean", "start_step": 1, "end_step": 2})
    server.text(["The task reward ", "rose steadily ", "from **0.2**."], chunk_delay=0.05)
    app = ControlRoom(home, start_engine=False, api_key=KEY, claude_base_url=server.base_url)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_chat(pilot, app)
        assert "Claude claude-sonnet" in str(app.screen.query_one("#chat-title").render())
        await ask(pilot, app, "how is the task reward?")
        await until(pilot, lambda: "from **0.2**." in log_text(app))
        text = log_text(app)
        assert "› how is the task reward?" in text
        assert '⚙ get_metric({"key": "rewards/task/mean", "start_step": 1, "end_step": 2})' in text
        assert "↳" in text and "chars" in text
        assert "The task reward rose steadily from **0.2**." in text
        await until(pilot, lambda: not app.screen.busy)
        assert "1 tool call" in str(app.screen.query_one("#chat-status").render())
        # Stored: the question, the tool call and the answer, under the run.
        chats = Conversations(home / "carl.db")
        try:
            (conversation,) = chats.list(1)
            roles = [m["role"] for m in chats.messages(conversation["id"])]
        finally:
            chats.close()
        assert roles == ["user", "tool", "assistant"]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ChatScreen))


async def test_errors_show_as_a_line_and_the_chat_goes_on(home: Path, server: MessagesServer) -> None:
    server.error(401)
    server.text(["Fine now."])
    app = ControlRoom(home, start_engine=False, api_key=KEY, claude_base_url=server.base_url)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_chat(pilot, app)
        await ask(pilot, app, "first")
        await until(pilot, lambda: "✕ Claude refused the API key (401)" in log_text(app))
        await until(pilot, lambda: not app.screen.busy)
        await ask(pilot, app, "second")
        await until(pilot, lambda: "Fine now." in log_text(app))
        # The failed question is not sent again as history.
        assert conversation_of(server.last_request.json) == ["second"]


async def test_slash_commands_and_history(home: Path, server: MessagesServer) -> None:
    from carl_tui.screens import TextScreen

    app = ControlRoom(home, start_engine=False, api_key=KEY, claude_base_url=server.base_url)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_chat(pilot, app)
        await ask(pilot, app, "/model claude-other")
        await until(pilot, lambda: "Claude claude-other" in str(app.screen.query_one("#chat-title").render()))
        await ask(pilot, app, "/offline")
        await until(pilot, lambda: "offline analyst on" in log_text(app))
        await ask(pilot, app, "is the gate open?")
        await until(pilot, lambda: "**Offline analyst**" in log_text(app))
        assert server.requests == []  # offline: nothing went over the network
        await ask(pilot, app, "/context")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        shown = str(app.screen.query_one("Static").render())
        assert "RUN chatty" in shown and "get_metric" in shown and "model: claude-other" in shown
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        await ask(pilot, app, "/nonsense")
        await until(pilot, lambda: "unknown command /nonsense" in log_text(app))
        # up walks back through what was sent; down returns to the draft.
        box = app.screen.query_one(ChatInput)
        box.focus()
        await pilot.press("up")
        assert box.text == "/nonsense"
        await pilot.press("up")
        assert box.text == "/context"
        await pilot.press("down", "down")
        assert box.text == ""
        await pilot.press("ctrl+j")
        assert box.text == "\n"  # a line break, not a send


async def test_a_stored_conversation_is_resumed_and_deleted(home: Path, server: MessagesServer) -> None:
    chats = Conversations(home / "carl.db")
    try:
        conversation, _ = chats.add(None, 1, "user", "why flat at step 40?")
        chats.add(conversation, 1, "assistant", "Because **the gate** was closed.")
    finally:
        chats.close()
    server.text(["Still closed."])
    app = ControlRoom(home, start_engine=False, api_key=KEY, claude_base_url=server.base_url)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_chat(pilot, app)
        await until(
            pilot, lambda: app.screen.query_one("#chat-list").option_count == 1
        )  # read off the UI thread
        await pilot.press("ctrl+l")
        await pilot.press("enter")
        await until(pilot, lambda: "Because **the gate** was closed." in log_text(app))
        assert app.screen.conversation == conversation
        await ask(pilot, app, "and now?")
        await until(pilot, lambda: "Still closed." in log_text(app))
        sent = conversation_of(server.last_request.json)
        assert sent == ["why flat at step 40?", "Because **the gate** was closed.", "and now?"]
        await until(pilot, lambda: not app.screen.busy)
        await pilot.press("ctrl+l")
        await pilot.press("delete")
        await pilot.press("delete")  # the confirmation's own key
        await until(pilot, lambda: app.screen.conversations == [])
        assert app.screen.conversation is None
