"""The control room's only write path to the store: commands (DESIGN.md, "Control is a durable
command queue"), and the diagnosis chat's conversations. A key becomes a request here; a thread worker
inserts it as a row of `commands` and the app hears back by message: `Queued` once the row is in, `Failed`
when it could not be written; the watcher then reports the command done or failed, as for any command.

A request names a verb of the vocabulary (engine/store/commands.py); an unknown verb or a bad argument is
refused by `send` with the vocabulary's one line, before anything is queued.

A read-only session never writes, whoever asks: `send` and `conversations` refuse it here, the one place that
checks. The UI thread never opens the store for writing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.message import Message
from textual.notifications import SeverityLevel

from engine.store.commands import CommandError, Verb, check

from .model import StoreWatcher
from .shown_errors import ONE_LINE

if TYPE_CHECKING:
    from engine.diagnosis.conversations import Conversations

QUEUED_UNTIL_UP = " (queued until the engine is up)"


@dataclass
class CommandRequest:
    """One command to queue: what the runner (or the engine) is asked, and what to say once queued."""

    verb: Verb
    args: dict[str, Any] | None = None
    target: str = "run"  # "run": the runner of run_id; "engine": the engine daemon
    run_id: int | None = None
    notice: str | None = None  # a notification once the row is in (title: the verb)
    title: str | None = None
    then: Callable[[int], None] | None = None  # called on the UI thread with the command id
    command_id: int | None = None  # known once queued


class CommandSender:
    """Queues commands from a thread worker, and keeps what this control room has sent and not yet
    seen finish: a run takes one command at a time, and so does the agents plane's manager."""

    class Queued(Message):
        """The command's row is in the store."""

        def __init__(self, request: CommandRequest) -> None:
            super().__init__()
            self.request = request

    class Failed(Message):
        """The command could not be written (no store yet, a locked or damaged file)."""

        def __init__(self, request: CommandRequest, error: str) -> None:
            super().__init__()
            self.request = request
            self.error = error

    def __init__(self, app: App[Any], db_path: Path, watcher: StoreWatcher, *, readonly: bool) -> None:
        self.app = app
        self.db_path = db_path
        self.watcher = watcher
        self.readonly = readonly
        self.pending: list[CommandRequest] = []  # sent from here, not seen finished yet

    def refused(self, what: str, *, title: str = "", severity: SeverityLevel = "warning") -> bool:
        """True (and the user told why) when this session may not write; `what` completes
        "read-only session: ..."."""
        if self.readonly:
            self.app.notify(f"read-only session: {what}", title=title, severity=severity, markup=False)
        return self.readonly

    def send(self, request: CommandRequest) -> bool:
        """Queue the command from a worker; False when refused: a read-only session, or a command the
        vocabulary refuses (an unknown verb, a bad argument: its one line, as an error)."""
        if self.refused(f"{request.verb} writes to the store"):
            return False
        try:
            request.args = check(request.verb, request.args, target=request.target, run_id=request.run_id)
        except CommandError as exc:
            self.app.notify(str(exc), title=request.title or "command", severity="error", markup=False)
            return False
        self.pending.append(request)  # known at once: a second key waits for it
        self.app.run_worker(
            lambda: self._write(request),
            thread=True,
            group="commands",
            description=f"queue {request.verb}",
        )
        return True

    def _write(self, request: CommandRequest) -> None:
        """In the worker's thread: insert the row, tell the app, then have the watcher follow it
        (in that order, so the app hears of the command before of its outcome)."""
        from engine.store import connect, insert_command

        try:
            if not self.db_path.exists():
                raise FileNotFoundError("the store does not exist yet; is the engine starting?")
            conn = connect(self.db_path, readonly=False)
            try:
                request.command_id = insert_command(
                    conn,
                    request.verb,
                    request.args,
                    target=request.target,
                    run_id=request.run_id,
                    origin="tui",
                )
            finally:
                conn.close()
        except ONE_LINE as exc:  # the store cannot take it: one line, the control room stays up
            message = str(exc) if isinstance(exc, FileNotFoundError) else f"{request.verb}: {exc}"
            self.app.post_message(self.Failed(request, message))
            return
        self.app.post_message(self.Queued(request))
        self.watcher.watch_command(request.command_id)

    def conversations(self) -> Conversations:
        """The diagnosis chat's stored conversations, open for writing its questions, answers and tool calls
        (the other rows this control room writes); from a worker thread. StoreError in a read-only session."""
        from engine.diagnosis.conversations import Conversations
        from engine.store import StoreError

        if self.readonly:
            raise StoreError("read-only session: the diagnosis chat stores its conversations")
        return Conversations(self.db_path)

    # -- on the UI thread, from the app's message handlers --------------------------------------------

    def queued(self, request: CommandRequest) -> None:
        assert request.command_id is not None
        if request.then is not None:
            request.then(request.command_id)
        if request.notice:
            self.app.notify(request.notice, title=request.title or request.verb, markup=False)

    def failed(self, request: CommandRequest, error: str) -> None:
        if request in self.pending:
            self.pending.remove(request)
        self.app.notify(error, severity="error", markup=False)

    def finished(self, command: dict[str, Any]) -> None:
        """The watcher saw a command end: it is no longer pending."""
        self.pending = [r for r in self.pending if r.command_id != command["id"]]

    def pending_for_run(self, run_id: int) -> str | None:
        """The verb of a command sent from here to this run's runner and not finished yet."""
        return next((r.verb for r in self.pending if r.target == "run" and r.run_id == run_id), None)

    def pending_verb(self, *verbs: str) -> str | None:
        """The first of these verbs sent from here and not finished yet."""
        return next((r.verb for r in self.pending if r.verb in verbs), None)
