"""What runs in the background, said where a user sees it (issue 14, points 5 and 6).

- A read-only control room starts nothing and writes nothing: with the engine down it says how to
  start it, and no engine process, pidfile, lock, log or settings file appears.
- A command that starts the engine says so once, with how to stop it: `carl demo` on the terminal,
  `carl-tui` after its screen has gone. `carl engine status` lists what the engine runs.

Real processes throughout: the engine daemon on a temporary $CARL_HOME (stopped by each test, also
when it fails), `carl` as a subprocess, `carl-tui` through its main() with the app headless, and
the control room under Pilot. Waits are on known points (a status line, a store row), not sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, kill_runs, status_text, until, wait_for

from carl_tui.app import ControlRoom
from carl_tui.launch import tui_main
from engine.control import engine_status, stop_engine
from engine.store import Store

STARTED = "in the background; it keeps running after"
HOW_TO_STOP = "`carl engine stop` stops it"


def carl(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def listing(home: Path) -> list[str]:
    """What is in the home, less the files SQLite's WAL mode gives any reader (a `mode=ro` connection
    too): the -shm index and an empty -wal, made when missing; the database itself is not written."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if not p.name.endswith(("-shm", "-wal")))


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    stop_engine(home, timeout=10.0)  # never leave a daemon behind, also when the test failed


@pytest.fixture
def tui_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tui_main sets these in os.environ; through monkeypatch they are put back after the test."""
    for name, value in (
        ("CARL_HOME", str(home)),
        ("TEXTUAL_ANIMATIONS", "none"),
    ):
        monkeypatch.setenv(name, value)


# -- point 5: a read-only session starts nothing ---------------------------------------------------


@pytest.mark.slow
async def test_a_readonly_control_room_starts_no_engine_and_says_how_to(home: Path) -> None:
    home.mkdir(mode=0o700)
    Store(home / "carl.db").close()  # a store, as a watch-only session usually finds one
    before, db = listing(home), (home / "carl.db").read_bytes()
    # As `carl-tui --readonly` makes it: start_engine is left at its default (True).
    app = ControlRoom(home, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        # The supervisor's first look at the engine: the status line says it is down and how to start it.
        await until(
            pilot, lambda: "engine ✕ down: `carl engine start` starts it" in status_text(app), timeout=60
        )
        notes = [n.message for n in app._notifications]
        assert any("watch-only" in n and "`carl engine start`" in n for n in notes), notes
        assert "read-only" in status_text(app)
        await pilot.press("t")  # a new theme holds for the session; tui.toml is not written
        await pilot.pause()
        palette = [c.title for c in app.get_system_commands(app.screen)]
        assert "Start engine" not in palette
    assert engine_status(home).state == "down"
    assert listing(home) == before, "a read-only session wrote to its home"
    assert (home / "carl.db").read_bytes() == db and (home / "carl.db-wal").stat().st_size == 0
    assert not (home / "engine.pid").exists() and not (home / "engine.lock").exists()


def test_readonly_and_demo_is_refused_and_creates_no_home(
    home: Path, capsys: pytest.CaptureFixture[str], tui_env: None
) -> None:
    assert tui_main(["--home", str(home), "--readonly", "--demo"]) == 2
    assert "--readonly session starts nothing" in capsys.readouterr().err
    assert not home.exists()


# -- point 6: a command that starts the engine says so ---------------------------------------------


@pytest.mark.slow
def test_carl_tui_says_after_its_screen_that_it_left_the_engine_running(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tui_env: None
) -> None:
    """`carl-tui` through its main(): the app runs headless until the engine it started is up, then quits."""
    notes: list[str] = []

    async def until_engine_up_then_quit(pilot: Any) -> None:
        await until(pilot, lambda: pilot.app.engine.state == "up", timeout=60)
        notes.extend(n.message for n in pilot.app._notifications)
        await pilot.press("q")

    def run_headless(self: ControlRoom, **_: Any) -> None:
        super(ControlRoom, self).run(headless=True, size=(80, 24), auto_pilot=until_engine_up_then_quit)

    monkeypatch.setattr(ControlRoom, "run", run_headless)
    assert tui_main(["--home", str(home)]) == 0
    pid = engine_status(home).pid
    assert pid is not None
    err = capsys.readouterr().err
    assert f"started the carl engine (pid {pid}) {STARTED} carl-tui — {HOW_TO_STOP}" in err
    assert any(f"(pid {pid}) {STARTED} you quit" in n for n in notes), notes  # and on screen, while it ran
    # The engine was up already: this control room started nothing, so it says nothing.
    assert tui_main(["--home", str(home)]) == 0
    assert STARTED not in capsys.readouterr().err
    assert engine_status(home).pid == pid


@pytest.mark.slow
def test_carl_demo_says_it_started_the_engine_and_engine_status_lists_what_it_runs(home: Path) -> None:
    pytest.importorskip("trl")
    try:
        demo = carl(home, "demo", "--steps", "400")
        assert demo.returncode == 0, demo.stderr
        pid = engine_status(home).pid
        assert pid is not None
        said = [line for line in demo.stderr.splitlines() if STARTED in line]
        assert said == [f"started the carl engine (pid {pid}) {STARTED} this command — {HOW_TO_STOP}"]
        assert "demo training queued" in demo.stdout  # stdout keeps the command's own output
        from engine.control import engine_report

        # The known point: the engine has started the runner, and the runner has opened its run.
        report = wait_for(
            lambda: (r := engine_report(home))["training"] and r["training"][0]["run"] and r,
            timeout=120,
            what="the demo run in the engine's report",
        )
        [run] = report["training"]
        assert (run["run"], run["state"], run["max_steps"]) == ("demo", "running", 600 + 400)

        text = carl(home, "engine", "status")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].startswith(f"engine up (pid {pid}, up ")
        assert f"  home      {home}" in lines
        training = next(line for line in lines if line.startswith("  training  "))
        assert "demo: running, step " in training and "/1,000 (pid " in training
        assert lines[-2].startswith("`carl engine stop` stops it")

        status = json.loads(carl(home, "engine", "status", "--json").stdout)
        assert (status["state"], status["pid"], status["home"]) == ("up", pid, str(home))
        assert status["uptime_s"] >= 0 and status["training"][0]["run"] == "demo"
        if importlib_has("nats"):  # `carl demo` brings up a small agents plane beside the run
            agents = wait_for(
                lambda: (a := engine_report(home)["agents"])["server"] and a,
                timeout=60,
                what="the agents plane's nats-server in the report",
            )
            assert agents["up"] and agents["server"]["state"] == "up" and agents["server"]["pid"]
            assert "nats-server up at nats://127.0.0.1:" in carl(home, "engine", "status").stdout

        # Asked again, with the engine up: it starts nothing, so it says nothing.
        again = carl(home, "demo")
        assert again.returncode == 0 and STARTED not in again.stderr and "is live" in again.stdout

        stopped = carl(home, "engine", "stop")
        assert stopped.stdout.startswith("engine stopped\nstill training: demo (pid ")
        assert engine_status(home).state == "down"
    finally:
        kill_runs(home)
        stop_engine(home, timeout=10.0)
        kill_runs(home)


def importlib_has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_durations_read_compactly_from_seconds_to_days() -> None:
    from engine.durations import compact_duration

    assert [compact_duration(s) for s in (-3, 42, 185, 7620, 86400 + 4 * 3600 + 59)] == [
        "0s",
        "42s",
        "3m05s",
        "2h07m",
        "1d4h00m",
    ]
