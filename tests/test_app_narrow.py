"""At 80 columns nothing a new user needs is cut (issue 30 item 11): the status line keeps the ETA while the
run is live and the health reason before the phase, every screen's key bar fits its width and keeps its ways
to help and out (`g Group`, `h Entropy` in the rollouts viewer), and a long run name is cut before the counts
and the smoothing of a header. And an idle control room sends nothing (item 12): a notice whose time is up
leaves with the next change on screen, not on its own timer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import status_text, until
from test_app_rollouts import our_run
from textual.notifications import Notification
from textual.widgets import Static
from textual.widgets._footer import FooterKey, FooterLabel

from carl_tui.app import ControlRoom
from carl_tui.explorer import ExplorerScreen
from carl_tui.rollouts_view import RolloutsScreen
from engine.store import Store
from widgets.key_bar import KeyBar

LONG_NAME = "qwen2.5-0.5b-grpo-gsm8k-lr3e-6-seed1234"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def live_run(store: Store, name: str = "grpo", *, steps: int = 15, max_steps: int = 30) -> int:
    """A live run of ours on torch, two steps a second so far: an ETA, a phase, a green health."""
    run = store.create_run(name, source_kind="carl", status="running", max_steps=max_steps, backend="torch")
    start = time.time() - steps / 2
    store.add_metrics(run, [(s, "rewards/task/mean", 0.5, start + s / 2) for s in range(1, steps + 1)])
    store.update_run(run, phase="crystallizing", health="green")
    return run


def key_bar(app: ControlRoom) -> list[tuple[str, int]]:
    """What the screen's key bar shows, each with the column its right edge reaches."""
    bar = app.screen.query_one(KeyBar)
    return [
        (item.description if isinstance(item, FooterKey) else str(item.content), item.region.right)
        for item in bar.query("FooterKey, FooterLabel")
        if isinstance(item, FooterKey | FooterLabel) and item.display and item.region.width
    ]


async def test_the_status_line_keeps_the_eta_at_80_columns_while_the_run_is_live(home: Path) -> None:
    with Store(home / "carl.db") as store:
        live_run(store)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "15/30" in status_text(app))
        line = status_text(app)
        assert "ETA" in line and "● green" in line and "engine" in line and len(line) <= 80, line
    async with ControlRoom(home, start_engine=False).run_test(size=(160, 50)) as pilot:
        app = pilot.app
        await until(pilot, lambda: "15/30" in status_text(app))
        line = status_text(app)  # room for all of it at 160
        assert "ETA" in line and "phase crystallizing" in line and "torch" in line, line


async def test_the_health_reason_outlasts_the_phase_and_the_step_keeps_its_word_when_there_is_room(
    home: Path,
) -> None:
    with Store(home / "carl.db") as store:
        run = live_run(store, LONG_NAME)
        store.update_run(run, health="yellow", health_reasons=["entropy collapsed from 5.6 to 1.1 nats"])
    async with ControlRoom(home, start_engine=False).run_test(size=(100, 30)) as pilot:
        app = pilot.app
        await until(pilot, lambda: "15/30" in status_text(app))
        line = status_text(app)
        assert "▲ yellow entropy col" in line and "ETA" in line and len(line) <= 100, line
        assert "phase" not in line and LONG_NAME not in line  # the phase went, the name was cut
    async with ControlRoom(home, start_engine=False).run_test(size=(160, 50)) as pilot:
        app = pilot.app
        await until(pilot, lambda: "15/30" in status_text(app))
        line = status_text(app)  # the words first, then the reason takes the room that is left
        assert LONG_NAME in line and "phase crystallizing" in line and "entropy collapsed" in line, line


async def test_every_key_bar_fits_80_columns_and_keeps_help_and_the_way_out(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run = our_run(store, name=LONG_NAME)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run)
        await until(pilot, lambda: bool(key_bar(app)))
        shown = key_bar(app)
        assert all(right <= 80 for _, right in shown), shown
        assert {"Help", "Quit", "Diagnose"} <= {name for name, _ in shown}

        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen) and bool(key_bar(app)))
        await pilot.pause()
        shown = key_bar(app)
        assert all(right <= 80 for _, right in shown), shown
        assert {"Step", "Group", "Entropy", "Close"} <= {name for name, _ in shown}
        await pilot.press("escape")

        await until(pilot, lambda: not isinstance(app.screen, RolloutsScreen))
        await pilot.press("S")
        await until(pilot, lambda: type(app.screen).__name__ == "SystemScreen" and bool(key_bar(app)))
        await pilot.pause()
        shown = key_bar(app)
        assert all(right <= 80 for _, right in shown), shown
        assert {"Window", "Cursor", "Back"} <= {name for name, _ in shown}


async def test_a_headers_long_run_name_is_cut_before_its_counts_at_80_columns(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run = our_run(store, name=LONG_NAME)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run)
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, ExplorerScreen))
        header = app.screen.query_one("#explorer-header", Static)
        await until(pilot, lambda: " key" in str(header.content))
        text = str(header.content)
        assert text.endswith("no smoothing") and "…" in text and len(text) <= 80, text
    async with ControlRoom(home, start_engine=False).run_test(size=(160, 50)) as pilot:
        app = pilot.app
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, ExplorerScreen))
        header = app.screen.query_one("#explorer-header", Static)
        await until(pilot, lambda: " key" in str(header.content))
        assert LONG_NAME in str(header.content), str(header.content)  # whole where there is room


def held(app: ControlRoom) -> list[Notification]:
    return list(app._notifications)


async def test_a_notice_whose_time_is_up_leaves_with_the_next_change_not_on_its_own_timer(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run = live_run(store)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run)
        app.notify("checkpoint saved", timeout=0.1)
        await until(pilot, lambda: any(n.message == "checkpoint saved" for n in held(app)))
        await pilot.pause(0.5)  # its time is up, nothing else moved: it stays, and nothing is redrawn for it
        assert any(n.message == "checkpoint saved" for n in held(app))
        with Store(home / "carl.db") as store:  # a new step: the frame that draws it takes the notice away
            store.add_metrics(run, [(16, "rewards/task/mean", 0.6, time.time())])
        await until(pilot, lambda: not held(app))

        app.notify("another", timeout=0.1)
        await until(pilot, lambda: bool(held(app)))
        await pilot.pause(0.3)
        assert held(app)
        await pilot.press("tab")  # a key: the screen changes anyway
        await until(pilot, lambda: not held(app))

        app.notify("long", timeout=30)
        await until(pilot, lambda: bool(held(app)))
        await pilot.press("tab")  # a notice whose time is not up stays through a key
        await pilot.pause(0.2)
        assert held(app)
