"""Training control from the keyboard: each key queues the right command for the selected run,
destructive keys need a confirmation, a second command waits for the first, read-only hides
control, and the command log shows outcomes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support import status_text, until

from carl_tui.app import ControlRoom
from engine.store import Store
from widgets.command_log import CommandLog
from widgets.long_text import LongText


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def carl_run(home: Path, status: str = "running") -> int:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("grpo-1", source_kind="carl", status=status, max_steps=100)
        store.add_metrics(run_id, [(s, "learning_rate", 1e-3, time.time()) for s in range(5)])
        store.add_metrics(run_id, [(s, "rewards/task/mean", 0.1, time.time()) for s in range(5)])
        return run_id


def commands(home: Path) -> list[tuple[str, dict, str]]:
    with Store(home / "carl.db") as store:
        rows = store.conn.execute("SELECT verb, args, target FROM commands ORDER BY id").fetchall()
    return [(verb, json.loads(args), target) for verb, args, target in rows]


async def settled(pilot: Any) -> None:
    """Let the workers the last key started finish: commands are written, and short reads made, off
    the UI thread, and their results come back as messages."""
    app = pilot.app
    started = [w for w in app.workers if w.group in ("commands", "reads")]  # the finished ones are gone
    if started:  # (an empty list would wait for every worker, the store's watcher too)
        await app.workers.wait_for_complete(started)
    await pilot.pause()


def finish_all(home: Path, ok: bool = True, result: str = "applied at step 5") -> None:
    with Store(home / "carl.db") as store:
        for row in store.conn.execute("SELECT id FROM commands WHERE state='pending'").fetchall():
            store.finish_command(row[0], ok, result)


async def test_keys_queue_commands_for_the_selected_run(home: Path) -> None:
    run_id = carl_run(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
        await pilot.press("space")
        await settled(pilot)
        assert commands(home) == [("pause", {}, "run")]
        await pilot.press("c")  # refused: the pause is still pending
        await settled(pilot)
        assert len(commands(home)) == 1
        finish_all(home)
        await until(pilot, lambda: "✓" in str(app.query_one(CommandLog).render()))
        await pilot.press("c")
        await settled(pilot)
        assert commands(home)[-1] == ("checkpoint", {}, "run")
        finish_all(home)
        await until(pilot, lambda: all(c["state"] == "done" for c in app.main.view.commands))
        await pilot.press("l")
        assert app.screen.__class__.__name__ == "ValueScreen"
        app.screen.query_one("#value-input").value = "-1"
        await pilot.press("enter")
        assert "positive" in str(app.screen.query_one("#value-error").render())
        app.screen.query_one("#value-input").value = "2e-5"
        await pilot.press("enter")
        await settled(pilot)
        assert commands(home)[-1] == ("set_lr", {"lr": 2e-5}, "run")
        finish_all(home, ok=False, result="lr must be positive")
        await until(pilot, lambda: "lr must be positive" in str(app.query_one(CommandLog).render()))
        await pilot.press("w")
        app.screen.query_one("#value-input").value = "coherence=0.25"
        await pilot.press("enter")
        await settled(pilot)
        assert commands(home)[-1] == ("set_weight", {"reward": "coherence", "weight": 0.25}, "run")


async def test_stop_needs_confirmation(home: Path) -> None:
    carl_run(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("s")
        assert app.screen.__class__.__name__ == "ConfirmScreen"
        await pilot.press("enter")  # focus starts on Cancel: enter alone cancels
        assert commands(home) == []
        await pilot.pause(0.35)  # destructive keys are debounced
        await pilot.press("s")
        await pilot.press("tab", "enter")
        await until(pilot, lambda: commands(home) == [("stop", {}, "run")])


async def test_new_run_and_resume_go_to_the_engine(home: Path) -> None:
    carl_run(home, status="failed")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("space")  # a failed run takes no pause
        await settled(pilot)
        assert commands(home) == []
        await pilot.press("n")
        assert app.screen.__class__.__name__ == "ChoiceScreen"
        await pilot.press("enter")  # the first choice is the built-in demo
        await until(pilot, lambda: commands(home) == [("train", {"config": "demo"}, "engine")])
        await pilot.press("r")
        await until(pilot, lambda: commands(home)[-1] == ("train", {"resume": "grpo-1"}, "engine"))


async def test_readonly_hides_control_and_observed_runs_take_none(home: Path, tmp_path: Path) -> None:
    carl_run(home)
    app = ControlRoom(home, start_engine=False, readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        for key in ("space", "c", "s", "n", "l"):
            await pilot.press(key)
        await settled(pilot)
        assert commands(home) == [] and app.screen.__class__.__name__ == "MainScreen"
        assert "read-only" in status_text(app)
    with Store(home / "carl.db") as store:
        store.create_run("observed", source_kind="jsonl", status="running")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "observed")
        await pilot.press("space", "c")
        await settled(pilot)
        assert commands(home) == []


async def test_samples_view_colours_tokens_by_phi(home: Path) -> None:
    run_id = carl_run(home)
    with Store(home / "carl.db") as store:
        store.add_samples(
            run_id,
            [
                {
                    "step": 4,
                    "kind": "best",
                    "prompt": "Call the weather tool for Paris",
                    "completion": '{"tool": "get_weather"}',
                    "tokens": ['{"', "tool", '": "', "get_weather", '"}'],
                    "phi": [0.1, 0.5, 0.9, 0.95, 0.99],
                    "entropy": [5.6, 3.1, 0.6, 0.3, 0.06],
                    "rewards": {"task": 1.0, "format_reward": 1.0},
                }
            ],
        )
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("v")
        await settled(pilot)
        assert app.screen.__class__.__name__ == "SamplesScreen"
        await pilot.pause(0.1)
        completion = app.screen.query_one("#sample-completion", LongText)
        figures = app.screen.query_one("#sample-figures").render()
        assert "get_weather" in completion.plain
        assert "Φ min 0.100" in str(figures) and "5 tokens" in str(figures)
        styles = {str(style) for _, style in completion.pieces}
        assert len(styles) >= 3  # low, middle and high Phi get different colours


async def test_the_planes_trainer_run_obeys_the_run_keys_but_is_not_resumed_by_carl_train(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("agents-train", source_kind="agents", status="running", max_steps=10)
        store.add_metrics(run_id, [(s, "loss", 1.0, time.time()) for s in range(3)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
        await pilot.press("space")
        await settled(pilot)
        assert commands(home) == [("pause", {}, "run")]
        with Store(home / "carl.db") as store:
            store.update_run(run_id, status="stopped")
        finish_all(home)
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.status == "stopped")
        await pilot.press("r")
        await settled(pilot)
        assert commands(home) == [("pause", {}, "run")]  # nothing more: the trainer resumes itself
