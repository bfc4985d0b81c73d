"""The control room with the real engine daemon: it starts the engine, shows its state, keeps
showing the store while the engine is gone, and shows a followed source's error in one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from support import status_text, until

from carl_tui.app import ControlRoom
from engine.control import engine_status, stop_engine


async def test_tui_starts_the_engine_and_survives_its_death(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0, "phi": 0.5}) + "\n" for s in range(5)))
    app = ControlRoom(home)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: "engine ● up" in status_text(app))
            first_pid = engine_status(home).pid
            # Observe a followed source through the dialog; the engine imports it.
            await pilot.press("o")
            app.screen.query_one("#observe-path").value = str(log)
            await pilot.press("enter")
            await until(pilot, lambda: app.main.view is not None and app.main.view.run.last_step == 4)
            # kill -9 the engine: the TUI keeps the run on screen and brings the engine back.
            os.kill(first_pid, signal.SIGKILL)
            await until(pilot, lambda: engine_status(home).pid not in (None, first_pid), timeout=40)
            assert "train" in status_text(app)
            await until(pilot, lambda: "engine ● up" in status_text(app))
            with log.open("a") as f:
                f.write(json.dumps({"step": 5, "loss": 0.9, "phi": 0.6}) + "\n")
            await until(pilot, lambda: app.main.view is not None and app.main.view.run.last_step == 5)
            # The source becomes unreadable: one line in the status bar, the run stays.
            log.write_bytes(b"")
            os.chmod(log, 0)
            log.unlink()
            await until(pilot, lambda: "train.jsonl" in status_text(app) and "✕" in status_text(app))
            assert app.main.view is not None and app.main.view.run.last_step == 5
    finally:
        stop_engine(home)


async def test_a_sleeping_worker_does_not_hold_the_quit() -> None:
    """The control room's thread workers sleep between looks (the engine's restart backoff grows to a
    minute); `q` waits for their threads, so their sleep wakes when the worker is cancelled."""
    from textual import work
    from textual.app import App
    from textual.worker import get_current_worker

    from carl_tui.supervisor import nap

    class Sleeper(App[None]):
        woke = False

        @work(thread=True)
        def backoff(self) -> None:
            nap(get_current_worker(), 60.0)
            self.woke = True

    app = Sleeper()
    async with app.run_test() as pilot:
        worker = app.backoff()
        await pilot.pause(0.1)
        assert not app.woke, "still sleeping"
        worker.cancel()
        await until(pilot, lambda: app.woke, timeout=10)  # a plain sleep would take the minute
