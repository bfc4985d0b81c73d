"""The engine daemon as the control room sees it: a thread worker starts it when it is down and
restarts it (with backoff) when it dies, unless the session is watch-only or the user stopped it,
and posts its state; the status line shows it. `carl-tui` says, after `q`, that an engine it
started is still running (cli.py).

A mixin of the control room (its handlers are the app's, found by their names); `self` is the
ControlRoom.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual import work
from textual.message import Message
from textual.worker import Worker, get_current_worker

from .faults import ONE_LINE

if TYPE_CHECKING:
    from .app import ControlRoom

DOWN = ("down", "stopped")  # engine states in which nothing runs it
READONLY_ENGINE_HINT = "`carl engine start` starts it"  # after "engine ✕ down" in a read-only status line
READONLY_ENGINE_DOWN = (
    "engine down — this session is watch-only and starts nothing; start it with `carl engine start`"
)


def nap(worker: Worker, seconds: float) -> None:
    """Sleep in a thread worker, waking within 50 ms of its cancellation or of its app's end: `q` waits
    for the workers' threads, so a plain sleep (up to a minute of engine backoff) would hold the exit."""
    deadline = time.monotonic() + seconds
    while not ended(worker) and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def ended(worker: Worker) -> bool:
    """The worker was cancelled, or its app is shutting down. A worker started while `q` was being handled
    (the supervisor starts after the first paint, which a fast `q` can precede) is never cancelled, and the
    app's exit waits for its thread for ever."""
    return worker.is_cancelled or not worker.node.app.is_running


class EngineState(Message):
    def __init__(self, state: str, detail: str = "", *, started_pid: int | None = None) -> None:
        super().__init__()
        self.state = state
        self.detail = detail  # an error to show
        self.started_pid = started_pid  # this control room has just started the engine, as this process


class EngineSupervision:
    @work(thread=True, exclusive=True, group="engine")
    def supervise_engine(self: ControlRoom) -> None:
        """Start the engine if it is down; restart it (with backoff) if it dies."""
        from engine.control import engine_status, start_engine
        from engine.control.process import stalled, why_stuck

        worker = get_current_worker()
        backoff = 2.0
        seen_up = False
        while not ended(worker):
            # Read-only: not even a dead engine's pidfile is removed.
            status = engine_status(self.home, recover=not self.readonly)
            if status.state == "up" and stalled(status) is not None:  # up, but it writes nothing: say why
                self.post_message(
                    EngineState("stalled", f"the engine is stalled: {why_stuck(self.home, status)}")
                )
                seen_up = True
            elif status.state == "up":
                self.post_message(EngineState("up"))
                seen_up, backoff = True, 2.0
            elif (status.stopped_by_user and not self.engine_asked) or not self.auto_engine:
                self.post_message(EngineState("stopped" if status.stopped_by_user else "down"))
            else:
                self.post_message(EngineState("restarting" if seen_up else "starting"))
                started = False
                try:
                    status, started = start_engine(self.home, wait=10.0)
                except ONE_LINE as exc:  # report, keep showing what is stored
                    self.post_message(EngineState("down", f"engine failed to start: {exc}"))
                if status.state != "up":
                    self.post_message(EngineState("down", f"engine did not start; see {status.log_path}"))
                    nap(worker, backoff)
                    backoff = min(backoff * 2, 60.0)
                    continue
                self.post_message(EngineState("up", started_pid=status.pid if started else None))
                seen_up = True
            nap(worker, 2.0)

    def on_engine_state(self: ControlRoom, event: EngineState) -> None:
        if self.widgets_gone():
            return
        if event.detail and event.detail not in (self.message, self.engine_said):
            self.notify(event.detail, title="engine", severity="error", timeout=8)
        self.engine_said = event.detail or None  # said once until it changes (a stall is seen every 2 s)
        if event.started_pid is not None:
            # The engine outlives this control room: say so now, and (cli.py) again after `q`.
            from engine.control import started_line

            self.engine_started_pid = event.started_pid
            self.notify(
                started_line(event.started_pid, after="you quit"), title="engine", timeout=12, markup=False
            )
        down = event.state in DOWN
        if self.readonly and down and not self.engine_found_down:  # once, until it has been up again
            self.notify(READONLY_ENGINE_DOWN, title="engine", severity="warning", timeout=30, markup=False)
        self.engine_found_down = down
        self.engine_state = event.state
        self.update_status()
        self.feed_agents_pane()  # the plane is on its way while its engine is
        self.draw_system()  # the System pane says when a quiet machine's engine is down

    def start_engine_now(self: ControlRoom) -> None:
        """Asked for by name (the palette): start it even if `carl engine stop` stopped it."""
        if self.readonly:
            self.notify(READONLY_ENGINE_DOWN, title="engine", severity="warning", markup=False)
            return
        self.auto_engine = True
        self.engine_asked = True
        self.supervise_engine()
