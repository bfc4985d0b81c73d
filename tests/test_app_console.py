"""The log view (`L`) driven by Pilot at 80×24 and 160×50 on a real store and real files: a run with no
console says so in one line; a big log opens at its end and follows what is appended; `/` `n` `N` search,
`t` `T` jump between tracebacks; `tab` goes to the run's other console; a truncated file is read again and
said so; a FIFO is refused in one line; escape sequences show as text. And the control room does not load the
log view until it is asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, until
from textual.content import Content
from textual.widgets import Static

from carl_tui.app import ControlRoom
from carl_tui.console_view import ConsoleScreen
from engine.store import Store
from widgets.log_lines import LogLines

SIZES = [(80, 24), (160, 50)]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 12, in <module>\n'
    "    trainer.train()\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
)


def step_line(i: int) -> str:
    return f"step {i} loss={1 / (i + 1):.6f}\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def make_run(home: Path, name: str, consoles: list[tuple[Path, str]]) -> int:
    with Store(home / "carl.db") as store:
        run_id = store.create_run(name, source_kind="carl", status="running")
        for path, kind in consoles:
            store.system.add_console(run_id, str(path), kind)
    return run_id


def screen(app: ControlRoom) -> ConsoleScreen:
    assert isinstance(app.screen, ConsoleScreen), app.screen
    return app.screen


def title(app: ControlRoom) -> str:
    return Content.from_markup(screen(app).query_one("#console").border_title or "").plain


def status(app: ControlRoom) -> str:
    return str(screen(app).query_one("#console-status", Static).content)


def shown(app: ControlRoom) -> list[str]:
    """The text of the log's lines on screen."""
    lines = screen(app).query_one(LogLines)
    return [lines.render_line(y).text.rstrip() for y in range(lines.size.height)]


async def open_view(pilot: Any, run_id: int) -> ConsoleScreen:
    app = pilot.app
    await until(pilot, lambda: app.main.view is not None)
    if app.main.view.run.id != run_id:
        app.main.select(run_id)
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
    await pilot.press("L")
    await until(pilot, lambda: isinstance(app.screen, ConsoleScreen))
    return screen(app)


async def test_a_run_without_a_console_says_how_to_name_one(home: Path) -> None:
    run_id = make_run(home, "observed", [])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await open_view(pilot, run_id)
        await until(pilot, lambda: "no console" in status(app))
        empty = str(view.query_one("#console-empty", Static).content)
        assert "No console is known for this run" in empty and "carl observe DIR --log train.log" in empty
        await pilot.press("escape")
        assert not isinstance(app.screen, ConsoleScreen)


@pytest.mark.parametrize("size", SIZES)
async def test_a_log_opens_at_its_end_follows_searches_and_jumps(
    home: Path, tmp_path: Path, size: tuple
) -> None:
    log = tmp_path / "train-20250101-120000-3.log"
    with open(log, "w") as f:
        f.writelines(step_line(i) for i in range(5000))
        f.write(TRACEBACK)  # lines 5001-5004
        f.writelines(step_line(i) for i in range(5000, 6000))
        f.write("\x1b[31mred\x1b[0m \x1b]0;title\x07 done\n")  # line 6005
    run_id = make_run(home, "grpo", [(log, "train")])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        view = await open_view(pilot, run_id)
        lines = view.query_one(LogLines)
        await until(pilot, lambda: lines.count == 6005)
        assert "6,005 lines" in status(app) and "following" in status(app)
        assert title(app) == "Console · grpo · train-20250101-120000-3.log (train)"
        await until(pilot, lambda: shown(app)[-1].endswith("\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 done"))
        assert shown(app)[-1].startswith("6,005 ")  # the line number in its gutter

        with open(log, "a") as f:  # written to as it is shown: the view follows
            f.write("step 6000 appended\n")
        await until(pilot, lambda: shown(app)[-1].endswith("step 6000 appended"))
        assert lines.count == 6006

        await pilot.press("T")  # the previous traceback, from the bottom
        await until(pilot, lambda: lines.mark == 5000)
        assert "traceback: RuntimeError: CUDA error" in status(app) and not lines.following
        top = lines.top_line
        assert shown(app)[5000 - top].split(maxsplit=1)[1] == "Traceback (most recent call last):"
        assert any("RuntimeError: CUDA error: an illegal memory access" in s for s in shown(app))

        await pilot.press("slash", *"step 42 ", "enter")  # none below the traceback: from the top
        await until(pilot, lambda: lines.mark == 42)
        assert "/step 42 " in status(app) and "search went on from the top" in status(app)
        strip = lines.render_line(42 - lines.top_line)
        (match,) = [segment for segment in strip if segment.text == "step 42 "]  # shown where it is
        assert match.style is not None and match.style.bgcolor is not None
        await pilot.press("g")
        assert lines.top_line == 0
        await pilot.press("n")
        await until(pilot, lambda: lines.mark == 42)
        await pilot.press("t")
        await until(pilot, lambda: lines.mark == 5000)
        await pilot.press("t")
        await until(pilot, lambda: "no traceback, OOM or NCCL error below" in status(app))
        await pilot.press("G")
        assert lines.following and "following" in status(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ConsoleScreen)


async def test_tab_goes_to_the_other_console_and_a_fifo_is_one_line(home: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    good = tmp_path / "output.log"
    good.write_text("only line\n")
    run_id = make_run(home, "two", [(good, "wandb"), (fifo, "user")])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await open_view(pilot, run_id)
        await until(
            pilot, lambda: "a FIFO (named pipe), not a regular file" in status(app)
        )  # the newest first
        assert title(app) == "Console · two · pipe.log (user) · 2 of 2, tab: next"
        empty = str(view.query_one("#console-empty", Static).content)
        assert "pipe.log: a FIFO (named pipe), not a regular file" in empty and "\n" not in empty
        await pilot.press("tab")
        await until(pilot, lambda: "1 lines" in status(app))
        assert shown(app)[0] == "1 only line"


async def test_a_truncated_log_is_read_again_and_said_so(home: Path, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(step_line(i) for i in range(100)))
    run_id = make_run(home, "r", [(log, "train")])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await open_view(pilot, run_id)
        lines = view.query_one(LogLines)
        await until(pilot, lambda: lines.count == 100)
        log.write_text("fresh start\n")
        await until(pilot, lambda: "the file was truncated: read again from its start" in status(app))
        assert lines.count == 1 and shown(app)[0] == "1 fresh start"


def test_the_control_room_loads_the_log_view_only_when_asked() -> None:
    code = (
        "import json, sys\nimport carl_tui.app\n"
        "print(json.dumps([m for m in ('carl_tui.console_view', 'widgets.log_lines',"
        " 'engine.console.log_reader') if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


async def test_the_observe_dialog_names_a_console_log(home: Path, tmp_path: Path) -> None:
    """`o`: a path and a console log; the engine's observe command gets the log (a FIFO is refused there)."""
    from test_app_control import commands, settled

    metrics, log, fifo = tmp_path / "metrics.jsonl", tmp_path / "train.log", tmp_path / "pipe"
    metrics.write_text('{"step": 1, "loss": 0.5}\n')
    os.mkfifo(fifo)
    make_run(home, "first", [])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("o")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ObserveScreen")
        app.screen.query_one("#observe-path").value = str(metrics)
        app.screen.query_one("#observe-log").value = str(fifo)
        app.screen.query_one("#observe-log").focus()
        await pilot.press("enter")
        error = str(app.screen.query_one("#observe-error", Static).content)
        assert error == f"log: {fifo}: a FIFO (named pipe), not a regular file (a log)"
        app.screen.query_one("#observe-log").value = str(log)  # not there yet: taken
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.__class__.__name__ != "ObserveScreen")
        await settled(pilot)
    assert commands(home) == [
        ("observe", {"path": str(metrics), "follow": True, "name": None, "logs": [str(log)]}, "engine")
    ]
