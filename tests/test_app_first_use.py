"""What a new user met at 80×24 (issue 21 §7), each checked on the real app through Pilot or the real command:
the status line keeps what matters, the ETA is per phase and leaves pauses out, empty states are said whole,
the key bar says Resume while paused, help shows the control room's own keys, the palette has one theme entry,
the eval reads as numbers, the chat's list hides on a narrow screen, `carl runs` has headers,
`carl hook --help` helps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, status_text, until

from carl_tui.app import ControlRoom
from carl_tui.model import StoreWatcher
from carl_tui.screens import eval_table
from engine import paths
from engine.store import Store
from widgets.chart import Chart


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def grpo_run(store: Store, *, last_step: int, status: str = "running", pause_at: int | None = None) -> int:
    """A GRPO run of ours with a 10-step SFT warm-up (1 s a step) then GRPO steps of 3 s; `pause_at`: a step
    after which the run sat paused for 100 s."""
    config = {"method": "grpo", "sft_warmup_steps": 10, "max_steps": 20}
    run = store.create_run(
        "grpo",
        source_kind="carl",
        status=status,
        max_steps=30,
        vocab_size=512,
        config=config,
        backend="torch",
    )
    start, rows, now = time.time() - 1000, [], 0.0
    for step in range(1, last_step + 1):
        now += 1.0 if step <= 10 else 3.0
        if pause_at is not None and step == pause_at + 1:
            now += 100.0
        rows.append((step, "loss", 1.0, start + now))
        if step > 10:
            rows.append((step, "rewards/task/mean", 0.5, start + now))
    store.add_metrics(run, rows)
    store.update_run(run, health="yellow", health_reasons=["a reason long enough to be cut on a narrow line"])
    return run


def view_of(home: Path):  # noqa: ANN201
    watcher = StoreWatcher(paths.db_path(home))
    snapshot = watcher.poll()
    assert snapshot is not None and snapshot.view is not None
    return snapshot.view


def test_the_eta_is_the_warm_ups_during_the_warm_up_then_the_runs_without_pauses(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        run = grpo_run(store, last_step=6)
    view = view_of(home)
    assert (view.eta_label, view.eta_s) == ("warm-up", pytest.approx(4.0))  # 4 SFT steps of 1 s to go
    with Store(paths.db_path(home)) as store:
        store.conn.execute("DELETE FROM metrics WHERE run_id=?", (run,))
        store.conn.execute("DELETE FROM rollups WHERE run_id=?", (run,))
        store.conn.execute("DELETE FROM runs WHERE id=?", (run,))
        grpo_run(store, last_step=25, pause_at=20)  # GRPO steps of 3 s, one 100 s pause among them
    view = view_of(home)
    assert view.eta_label is None and view.eta_s == pytest.approx(5 * 3.0)  # not the SFT pace, not the pause


async def test_the_status_line_keeps_state_step_health_and_engine_at_80_columns(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        grpo_run(store, last_step=15)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "step 15/30" in status_text(app))
        line = status_text(app)
        assert "grpo" in line and "▲ yellow" in line and "engine" in line
        assert "torch" not in line  # the backend tag goes first
        assert len(line) <= 80
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: "step 15/30" in status_text(app))
        assert "torch" in status_text(app) and "a reason long enough" in status_text(app)


async def test_the_key_bar_says_resume_while_paused_and_help_lists_the_rooms_own_keys(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        grpo_run(store, last_step=15, status="paused")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.status == "paused")
        shown = {b.binding.description for b in app.screen.active_bindings.values() if b.enabled}
        assert "Resume" in shown and "Pause" not in shown
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen")
        rows = app.screen.rows
        keys = [key for key, _ in rows]
        assert keys.count("tab") == 1
        assert all(description != "Copy selected text" for _, description in rows)  # Textual's, not ours
        assert "closes this" in app.screen.extra
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert (
            sum(title.startswith("Theme") for title in commands) == 4
        )  # ours, and not Textual's "Theme" too


async def test_rewards_start_after_the_warm_up_is_said_during_the_warm_up(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        grpo_run(store, last_step=6)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one("#reward-chart", Chart)
        await until(pilot, lambda: "warm-up" in chart.empty_text)
        assert chart.empty_text == "rewards start after the SFT warm-up (step 10)"


async def test_empty_states_wrap_instead_of_being_cut(home: Path) -> None:
    Store(paths.db_path(home)).close()
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        for selector in ("#trajectories", "#command-log"):
            widget = app.query_one(selector)
            text = "\n".join(widget.render_line(y).text for y in range(widget.size.height))
            assert "…" not in text, selector


async def test_the_chat_list_hides_below_100_columns(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        grpo_run(store, last_step=15)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("d")
        await until(pilot, lambda: type(app.screen).__name__ == "ChatScreen")
        await pilot.pause(0.2)
        assert not app.screen.query_one("#chat-list").display
        await pilot.press("ctrl+l")  # brought back on demand
        assert app.screen.query_one("#chat-list").display


def test_the_eval_reads_as_numbers() -> None:
    evaluation = {
        "passed": True,
        "reasons": ["mean task reward 0.882 >= 0.5 [bold]not markup[/bold]"],
        "metrics": {
            "task": 0.8816,
            "solved": 0.7632,
            "answer_tokens": 18.2632,
            "prompts": 38,
            "seconds": 0.15,
        },
    }
    from rich.console import Console

    console = Console(width=100, record=True)
    console.print(eval_table(evaluation))
    text = console.export_text()
    assert "answer tokens (mean)  18.3" in text and "18.2632" not in text
    assert "solved                76%" in text and "took                  0.1 s" in text
    assert "[bold]not markup[/bold]" in text  # a stored reason is text


def carl(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=ROOT,
        timeout=60,
    )


def test_carl_runs_has_headers_and_carl_hook_help_says_what_it_does(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        grpo_run(store, last_step=15)
    lines = carl(home, "runs").stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "STEP", "SOURCE", "FRAMEWORK", "HEALTH", "PHASE"]
    assert lines[1].split()[:4] == ["1", "grpo", "running", "15"]
    helped = carl(home, "hook", "--help")
    assert helped.returncode == 0 and "Claude Code hook payload" in helped.stdout
    recorded = carl(home, "hook", stdin=json.dumps({"session_id": "s", "hook_event_name": "Stop"}))
    assert (recorded.returncode, recorded.stdout, recorded.stderr) == (0, "", "")  # a hook stays silent


def test_paths_are_shown_from_the_home_the_user_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.shown(tmp_path / ".carl" / "logs" / "train-*.log") == "~/.carl/logs/train-*.log"
    assert paths.shown(Path("/srv/carl/logs")) == "/srv/carl/logs"
