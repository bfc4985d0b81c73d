"""The control room's one write path and the watcher's request queue: commands are written from a
worker thread, never the UI thread, and never by a read-only session, whoever asks; what the app
wants read reaches the watcher through its queue and is applied by the thread that polls."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from support import until
from test_app_control import carl_run, commands, finish_all, settled

import engine.store
from carl_tui.app import ControlRoom
from carl_tui.command_sender import CommandRequest
from carl_tui.model import StoreWatcher
from carl_tui.screens import ObserveRequest
from engine.store import Store, StoreError
from engine.store.commands import Verb


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


async def test_commands_are_written_from_a_worker_thread(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = carl_run(home)
    threads: list[threading.Thread] = []
    insert = engine.store.insert_command

    def recorded(*args: object, **kwargs: object) -> int:  # the real insert, and the thread it ran on
        threads.append(threading.current_thread())
        return insert(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.store, "insert_command", recorded)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
        ui_thread = threading.current_thread()
        await pilot.press("space")
        await settled(pilot)
        assert commands(home) == [("pause", {}, "run")]
        assert len(threads) == 1 and threads[0] is not ui_thread
        await until(
            pilot, lambda: any("applied at the next step boundary" in n.message for n in app._notifications)
        )
        finish_all(home, result="paused at step 5")
        await until(pilot, lambda: any(n.message == "paused at step 5" for n in app._notifications))
        assert app.sender.pending == []  # the watcher saw it finish


async def test_a_command_that_cannot_be_written_is_one_line(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)  # no store yet
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.sender.send(CommandRequest("train", {"config": "demo"}, target="engine"))
        await settled(pilot)
        assert any("the store does not exist yet" in n.message for n in app._notifications)
        assert app.sender.pending == []


async def test_the_sender_refuses_what_the_vocabulary_does_with_its_line(home: Path) -> None:
    run_id = carl_run(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        assert not app.sender.send(CommandRequest("warp", run_id=run_id))
        assert not app.sender.send(CommandRequest(Verb.SET_LR, {"lr": 0}, run_id=run_id))
        assert not app.sender.send(CommandRequest(Verb.TRAIN, {"config": "demo"}, run_id=run_id))
        await settled(pilot)
        assert commands(home) == [] and app.sender.pending == []
        assert not [w for w in app.workers if w.group == "commands"], "no writer was started"
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert errors == [
            f"unknown command 'warp' (known: {', '.join(Verb)})",
            "set_lr: lr must be a number > 0, got 0",
            "train: obeyed by the engine, so sent to 'engine', not 'run'",
        ]


async def test_a_readonly_session_never_writes_whoever_asks(home: Path) -> None:
    run_id = carl_run(home)
    app = ControlRoom(home, start_engine=False, readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        # Past the hidden keys: the actions and the sender called directly.
        assert not app.sender.send(CommandRequest("pause", run_id=run_id))
        app.main.controls.observe_chosen(ObserveRequest(str(home / "x.jsonl"), True, None))
        app.main.controls.config_chosen("demo")
        app.main.controls.stop_confirmed(True)
        app.main.controls.lr_chosen("0.5")
        app.main.activity.send_agents("agents_add_worker", "adding a worker")
        app.main.action_observe()  # the palette's "Observe a run" reaches it without check_action
        app.main.action_diagnose()  # the chat stores its conversations
        await settled(pilot)
        assert commands(home) == [] and app.screen.__class__.__name__ == "MainScreen"
        assert not [w for w in app.workers if w.group == "commands"], "no writer was started"
        assert any("read-only session" in n.message for n in app._notifications)
        with pytest.raises(
            StoreError, match="^read-only session: the diagnosis chat stores its conversations$"
        ):
            app.sender.conversations()  # the chat's writes go through the sender too


def test_the_watchers_requests_wait_in_its_queue_for_the_polling_thread(home: Path) -> None:
    with Store(home / "carl.db") as store:
        first = store.create_run("first", source_kind="jsonl")
        second = store.create_run("second", source_kind="jsonl")
        command_id = engine.store.insert_command(store.conn, "pause", None, target="run", run_id=first)
    watcher = StoreWatcher(home / "carl.db")
    snapshot = watcher.poll()
    assert snapshot is not None and snapshot.selected == second  # none asked: the newest

    def ask() -> None:  # another thread asks, as the UI thread does
        watcher.select(first)
        watcher.compare([first, second])
        watcher.watch_command(command_id)

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join()
    assert watcher.requests.qsize() == 3 and watcher.selected == second, "asked, not applied"
    snapshot = watcher.poll()  # the polling thread applies them, in order, then reads
    assert watcher.requests.empty() and watcher.selected == first
    assert snapshot is not None and snapshot.selected == first
    assert snapshot.view is not None and snapshot.view.run.id == first
    assert snapshot.compare is not None and list(snapshot.compare) == [first, second]
    assert snapshot.commands == []  # watched, not finished
    assert watcher.poll() is None  # nothing asked, nothing moved
    with Store(home / "carl.db") as store:
        store.finish_command(command_id, True, "paused")
    snapshot = watcher.poll()
    assert snapshot is not None and [c["id"] for c in snapshot.commands] == [command_id]
