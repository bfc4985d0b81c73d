"""The demo's first minute as a new user meets it (issue 30 §11), on the real app through Pilot and the real
commands: the first frame says what is true (the engine as found, or starting; the demo run and its agents
plane on their way, not "`carl agents up` starts the plane"), a starting run says what it is doing from the
first second, the run `--demo` asked for is the one shown (not the store's last run), and `carl runs` on an
empty store says how to get a run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, status_text, until

from carl_tui.app import ControlRoom
from carl_tui.model import Starting, StoreWatcher, nats_state, queued_state, starting_state
from engine import paths
from engine.demo.start import start_demo
from engine.store import Store
from widgets.agents import AGENTS_EMPTY, AGENTS_STARTING, AgentsPane


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def pane_text(app: ControlRoom) -> str:
    return str(app.query_one(AgentsPane).shown)


async def test_the_first_frame_shows_the_queued_demo_and_its_plane_on_their_way(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert start_demo(home, None, engine=False) == "demo"  # what `carl-tui --demo` queues (no engine yet)
    capsys.readouterr()
    app = ControlRoom(home, start_engine=False, follow_run="demo")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        line = status_text(app)
        assert line.startswith("demo starting ") and "waiting for the engine to start" in line, line
        assert "engine ✕ down" in line  # this session starts none: true
        assert pane_text(app) == AGENTS_STARTING and "`carl agents up`" not in pane_text(app)
    app = ControlRoom(home, start_engine=False, follow_run="demo")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        assert "nats ◌ starting" in status_text(app)


def test_the_first_frame_shows_the_engine_as_found_or_starting(home: Path) -> None:
    """Before, every first frame said "engine ✕ down" until the supervisor looked (after the frame)."""
    Store(paths.db_path(home)).close()
    assert ControlRoom(home).engine.state == "starting"  # down, and this session starts it
    assert ControlRoom(home, readonly=True).engine.state == "down"
    assert ControlRoom(home, start_engine=False).engine.state == "down"
    with Store(paths.db_path(home)) as store:  # `carl engine stop` left it stopped
        store.conn.execute("INSERT INTO engine (id, pid, state, started_at) VALUES (1, 1, 'stopped', 0)")
    assert ControlRoom(home, readonly=True).engine.state == "stopped"


async def test_a_starting_run_says_what_it_does_then_goes_live_and_is_the_run_shown(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        old = store.create_run("yesterday", source_kind="carl", status="finished", max_steps=5)
        store.add_metrics(old, [(5, "loss", 1.0, time.time() - 86400)])
    start_demo(home, None, engine=False)
    app = ControlRoom(home, start_engine=False, follow_run="demo")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert status_text(app).startswith("demo starting ")  # not yesterday's run
        with Store(paths.db_path(home)) as store:
            store.conn.execute(
                "UPDATE commands SET state='done', finished_at=? WHERE verb='train'", (time.time(),)
            )
            run = store.create_run("demo", source_kind="carl", max_steps=1000, backend="torch")
            store.set_run_stage(run, "importing torch, transformers and TRL")
        await until(pilot, lambda: "importing torch" in status_text(app))
        assert app.main.selected == run
        assert status_text(app).startswith("demo starting ")
        with Store(paths.db_path(home)) as store:
            store.set_run_stage(run, "preparing the SFT warm-up's first step (of 600)")
        await until(pilot, lambda: "warm-up's first step" in status_text(app))
        with Store(paths.db_path(home)) as store:
            store.add_metrics(run, [(1, "loss", 2.0, time.time())])
        await until(pilot, lambda: status_text(app).startswith("demo live · torch │ step 1/1,000"))


def test_the_starting_states_read_as_progress() -> None:
    now = 1000.0
    assert (
        starting_state({"text": "building the tiny model"}, 988.0, now)
        == "starting 12s: building the tiny model"
    )
    assert starting_state(None, None, now) == "starting"
    pending = {"state": "pending", "created_at": 999.0}
    assert queued_state(pending, "starting", now) == "starting 1s: waiting for the engine to start"
    assert queued_state(pending, "up", now) == "starting 1s: queued for the engine"
    assert queued_state({**pending, "state": "done"}, "up", now) == "starting 1s: starting its process"


def test_a_stored_nats_up_from_before_reads_as_starting_while_the_engine_starts() -> None:
    """The plane's local nats-server is the engine's child: the first frame of a session that starts the
    engine said `nats ● up` from the last session's row while both were starting."""
    overview = {"server": {"state": "up"}, "plane": {"wanted": True}}
    assert nats_state(overview, Starting(), "starting") == "starting"
    assert nats_state(overview, Starting(), "restarting") == "starting"
    assert nats_state(overview, Starting(), "up") == "up"
    assert nats_state(overview, Starting(), "down") == "up"  # as stored, as the Agents pane's title says
    assert nats_state({}, Starting(), "starting") is None  # no plane wanted, none on its way
    queued = Starting(commands=({"verb": "agents_up", "state": "pending", "args": {}},))
    assert nats_state({}, queued, "down") == "starting"


def test_the_watcher_reports_a_stage_only_while_the_run_has_no_step(home: Path) -> None:
    with Store(paths.db_path(home)) as store:
        run = store.create_run("r", source_kind="carl")
        store.set_run_stage(run, "loading the model (carl-tiny) and the dataset")
    watcher = StoreWatcher(paths.db_path(home))
    first = watcher.poll()
    assert first is not None and first.starting is not None
    assert first.starting.stage is not None and first.starting.stage["text"].startswith("loading the model")
    with Store(paths.db_path(home)) as store:
        store.add_metrics(run, [(1, "loss", 1.0, time.time())])
    later = watcher.poll()
    assert later is not None and later.starting is not None and later.starting.stage is None


async def test_the_agents_pane_says_how_to_start_a_plane_when_none_is_on_its_way(home: Path) -> None:
    Store(paths.db_path(home)).close()
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert pane_text(app) == AGENTS_EMPTY and "nats" not in status_text(app)


def test_carl_runs_on_an_empty_store_says_how_to_get_a_run(home: Path) -> None:
    def carl(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine.cli", "--home", str(home), *args]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)

    for before in ("no store", "an empty store"):
        done = carl("runs")
        assert done.returncode == 0 and done.stderr == "", before
        [line] = done.stdout.splitlines()
        assert line.startswith("no runs yet") and "`carl-tui --demo`" in line, before
        Store(paths.db_path(home)).close()
    assert carl("runs", "--json").stdout == ""  # JSON Lines: none
