"""The engine daemon as the control room sees it: a thread worker starts it when it is down and
restarts it (with backoff) when it dies, unless the session is watch-only or the user stopped it,
and posts its state to the app; the status line shows it. `carl-tui` says, after `q`, that an engine it
started is still running (launch.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.app import App
from textual.message import Message
from textual.worker import Worker, get_current_worker

from .command_sender import QUEUED_UNTIL_UP
from .shown_errors import ONE_LINE

DOWN = ("down", "stopped")  # engine states in which nothing runs it
READONLY_ENGINE_HINT = "`carl engine start` starts it"  # after "engine ✕ down" in a read-only status line
READONLY_ENGINE_DOWN = (
    "engine down — this session is watch-only and starts nothing; start it with `carl engine start`"
)


def nap(worker: Worker[Any], seconds: float) -> None:
    """Sleep in a thread worker, waking within 50 ms of its cancellation or of its app's end: `q` waits
    for the workers' threads, so a plain sleep (up to a minute of engine backoff) would hold the exit."""
    deadline = time.monotonic() + seconds
    while not ended(worker) and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def ended(worker: Worker[Any]) -> bool:
    """The worker was cancelled, or its app is shutting down. A worker started while `q` was being handled
    (the supervisor starts after the first paint, which a fast `q` can precede) is never cancelled, and the
    app's exit waits for its thread for ever."""
    return worker.is_cancelled or not worker.node.app.is_running


class EngineState(Message):
    """What the supervisor's last look found (its thread posts it to the app)."""

    def __init__(self, state: str, detail: str = "", *, started_pid: int | None = None) -> None:
        super().__init__()
        self.state = state
        self.detail = detail  # an error to show
        self.started_pid = started_pid  # this control room has just started the engine, as this process


class EngineSupervisor:
    """The engine daemon as this control room knows it: its state for the status line, and what this session
    did about it (started it, was told it is down). The looking is done by a thread worker of the app, which
    posts `EngineState`; the app hands each to `changed` on the UI thread."""

    def __init__(
        self, app: App[Any], home: Path, *, readonly: bool, start: bool, up: bool, stopped: bool
    ) -> None:
        """`start`: start the engine when it is down (not a watch-only session, nor `--no-engine`); `up` and
        `stopped`: what the store's first read found, which the first frame shows."""
        self.app = app
        self.home = home
        self.readonly = readonly
        self.auto = start and not readonly  # a watch-only session starts nothing that writes
        self.asked = False  # the user asked for the engine from the palette
        self.started_pid: int | None = None  # the engine this control room started, if any
        self.found_down = False  # the last look found it down (read-only: say how to start it)
        self.said: str | None = None  # the engine's last problem notified (said again only if it changes)
        # The first frame says what the supervisor will find: up, or starting when this session starts it.
        if up:
            self.state = "up"
        elif self.auto:
            self.state = "starting"
        else:
            self.state = "stopped" if stopped else "down"

    def queued_suffix(self) -> str:
        """What a notice of a command for the engine adds while the engine is not up."""
        return "" if self.state == "up" else QUEUED_UNTIL_UP

    def supervise(self) -> None:
        """Start looking (again: the new worker replaces the last)."""
        self.app.run_worker(
            self._supervise, thread=True, exclusive=True, group="engine", description="supervise the engine"
        )

    def _supervise(self) -> None:
        """In the worker's thread: start the engine if it is down; restart it (with backoff) if it dies."""
        from engine.control import engine_status, start_engine
        from engine.control.process import stalled, why_stuck

        worker = get_current_worker()
        post = self.app.post_message
        backoff = 2.0
        seen_up = False
        while not ended(worker):
            # Read-only: not even a dead engine's pidfile is removed.
            status = engine_status(self.home, recover=not self.readonly)
            if status.state == "up" and stalled(status) is not None:  # up, but it writes nothing: say why
                post(EngineState("stalled", f"the engine is stalled: {why_stuck(self.home, status)}"))
                seen_up = True
            elif status.state == "up":
                post(EngineState("up"))
                seen_up, backoff = True, 2.0
            elif (status.stopped_by_user and not self.asked) or not self.auto:
                post(EngineState("stopped" if status.stopped_by_user else "down"))
            else:
                post(EngineState("restarting" if seen_up else "starting"))
                started = False
                try:
                    status, started = start_engine(self.home, wait=10.0)
                except ONE_LINE as exc:  # report, keep showing what is stored
                    post(EngineState("down", f"engine failed to start: {exc}"))
                if status.state != "up":
                    post(EngineState("down", f"engine did not start; see {status.log_path}"))
                    nap(worker, backoff)
                    backoff = min(backoff * 2, 60.0)
                    continue
                post(EngineState("up", started_pid=status.pid if started else None))
                seen_up = True
            nap(worker, 2.0)

    def changed(self, event: EngineState, shown: str | None = None) -> None:
        """On the UI thread: take the state, and say what the user should hear, once (`shown`: what the
        status line says already)."""
        if event.detail and event.detail not in (shown, self.said):
            self.app.notify(event.detail, title="engine", severity="error", timeout=8)
        self.said = event.detail or None  # said once until it changes (a stall is seen every 2 s)
        if event.started_pid is not None:
            # The engine outlives this control room: say so now, and (launch.py) again after `q`.
            from engine.control import started_line

            self.started_pid = event.started_pid
            self.app.notify(
                started_line(event.started_pid, after="you quit"), title="engine", timeout=12, markup=False
            )
        down = event.state in DOWN
        if self.readonly and down and not self.found_down:  # once, until it has been up again
            self.app.notify(
                READONLY_ENGINE_DOWN, title="engine", severity="warning", timeout=30, markup=False
            )
        self.found_down = down
        self.state = event.state

    def start_now(self) -> None:
        """Asked for by name (the palette): start it even if `carl engine stop` stopped it."""
        if self.readonly:
            self.app.notify(READONLY_ENGINE_DOWN, title="engine", severity="warning", markup=False)
            return
        self.auto = True
        self.asked = True
        self.supervise()
