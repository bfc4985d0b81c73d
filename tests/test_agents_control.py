"""Control of the agents plane that sticks (issue 23 §7): `carl agents down` with the engine down records
"not wanted" (an engine that starts leaves the plane down), `carl agents status` never calls a dead pid
running, and the demo's plane stops when the demo run ends unless asked to stay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai_server import OpenAIServer
from support import end_all, wait_for
from test_agents_plane import arithmetic_tasks, solve

from engine.agents.plane import Plane, PlaneSpec
from engine.demo.start import free_run_name, queue_demo_plane
from engine.store import Store

SPEC = {"workers": 2, "tasks": "demo", "train": False, "limit": None, "config": None, "overrides": {}}


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CARL_HOME": str(home)},
        timeout=120,
    )


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftover(home: Path) -> subprocess.Popen[bytes]:
    """A process that looks like one of this home's plane processes (what a killed engine leaves behind)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "engine.agents", "--home", str(home), "worker"]
    )


def kv(home: Path, key: str) -> Any:
    with Store(home / "carl.db") as store:
        return store.kv(key)


def test_down_with_the_engine_down_records_not_wanted_and_the_engine_leaves_it_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    left = leftover(home)
    try:
        with Store(home / "carl.db") as store:
            store.set_kv(
                "agents.plane",
                {
                    "wanted": True,
                    "spec": SPEC,
                    "processes": [{"role": "worker", "id": "w1", "pid": left.pid}],
                },
            )
            queued = store.enqueue_command("agents_up", SPEC, target="engine", origin="cli")
        down = carl(home, "agents", "down")
        assert down.returncode == 0, down.stderr
        assert down.stdout.strip() == (
            "the engine is not running: the agents plane is marked down"
            " (it stays down when the engine starts);"
            " stopped 1 of its processes that a killed engine had left running;"
            " cancelled 1 queued 'agents up'"
        )
        assert left.wait(30) is not None  # the killed engine's worker is stopped
        assert kv(home, "agents.plane") == {"wanted": False}
        with Store(home / "carl.db") as store:
            state, result = store.conn.execute(
                "SELECT state, result FROM commands WHERE id=?", (queued,)
            ).fetchone()
            assert (state, result) == ("failed", "cancelled: carl agents down")
            plane = Plane(store, home)
            plane.restore()  # what `carl engine start` does first
            assert not plane.up and store.kv("agents.plane") == {"wanted": False}
        assert not (home / "engine.pid").exists()  # down started no engine to say so
    finally:
        end_all([left])  # type: ignore[list-item]


def test_status_never_reports_a_dead_pid_as_running(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    gone = dead_pid()
    here = socket.gethostname()
    with Store(home / "carl.db") as store:
        store.set_kv(
            "agents.server", {"state": "up", "url": "nats://127.0.0.1:4999", "pid": gone, "local": True}
        )
        store.set_kv(
            "agents.plane",
            {
                "wanted": True,
                "spec": SPEC,
                "processes": [
                    {"role": "manager", "id": "manager", "state": "running", "pid": gone, "log": "m.log"},
                    {
                        "role": "trainer",
                        "id": "trainer",
                        "state": "running",
                        "pid": os.getpid(),
                        "log": "t.log",
                    },
                ],
            },
        )
        manager = {"state": "assigning", "assigned": 3, "total": None, "in_flight": 1, "done": 2, "failed": 0}
        store.set_kv("agents.manager", {**manager, "timed_out": 0, "feedback": "offline"})
        now = time.time()
        for worker_id, host, pid, state in (
            ("w1", here, gone, "busy"),
            ("w2", here, os.getpid(), "idle"),
            ("w3", "another-host", gone, "idle"),  # another machine's pid is not ours to check
        ):
            store.conn.execute(
                "INSERT INTO agent_workers (worker_id, kind, state, host, pid, first_seen, last_seen)"
                " VALUES (?, 'http', ?, ?, ?, ?, ?)",
                (worker_id, state, host, pid, now, now),
            )
    status = json.loads(carl(home, "agents", "status", "--json").stdout)
    assert status["server"]["state"] == "dead" and status["engine"] == "down"
    states = {p["role"]: p["state"] for p in status["plane"]["processes"]}
    assert states == {"manager": "dead", "trainer": "running"}
    assert (status["manager"]["state"], status["manager"]["last_state"]) == ("dead", "assigning")
    assert {w["worker_id"]: w["state"] for w in status["workers"]} == {
        "w1": "dead",
        "w2": "idle",
        "w3": "idle",
    }
    text = carl(home, "agents", "status").stdout
    lines = text.splitlines()
    assert (
        lines[0].startswith("plane up when the engine starts (the engine is down")
        and "server dead" in lines[0]
    )
    assert "manager dead (last said assigning): 3 assigned" in text
    assert f"manager dead (pid {gone}; log m.log)" in text and f"trainer running (pid {os.getpid()}" in text
    worker_states = {line.split()[0]: line.split()[2] for line in lines if line[:2] in ("w1", "w2", "w3")}
    assert worker_states == {"w1": "dead", "w2": "idle", "w3": "idle"}
    assert " running " not in next(line for line in lines if line.startswith("manager "))


def test_the_demo_plane_is_bound_to_the_demo_run_unless_asked_to_stay(store: Store) -> None:
    assert free_run_name(store, "demo") == "demo"
    store.create_run("demo", source_kind="carl")
    store.create_run("demo-2", source_kind="carl")
    assert free_run_name(store, "demo") == "demo-3"  # what the store will call the run the demo starts
    said = queue_demo_plane(store, "demo-3")
    assert said is not None and "it stops when run 'demo-3' ends" in said
    [(args,)] = store.conn.execute("SELECT args FROM commands WHERE verb='agents_up'").fetchall()
    assert json.loads(args)["until_run"] == "demo-3"
    store.conn.execute("DELETE FROM commands")
    said = queue_demo_plane(store, None)  # --stay
    assert said is not None and "it stays up after the run" in said
    [(args,)] = store.conn.execute("SELECT args FROM commands WHERE verb='agents_up'").fetchall()
    assert "until_run" not in json.loads(args)


def test_a_plane_bound_to_a_run_that_ended_while_the_engine_was_down_stays_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Store(home / "carl.db") as store:
        run_id = store.create_run("demo", source_kind="carl")
        store.update_run(run_id, status="finished")
        store.set_kv("agents.plane", {"wanted": True, "spec": {**SPEC, "until_run": "demo"}})
        plane = Plane(store, home)
        plane.restore()
        assert not plane.up and store.kv("agents.plane") == {"wanted": False}
    with pytest.raises(Exception, match="until_run: expected a run's name"):
        PlaneSpec.from_args({**SPEC, "until_run": 3})


@pytest.mark.slow
def test_a_plane_bound_to_a_run_stops_when_the_run_ends(tmp_path: Path) -> None:
    """The demo's plane: its workers stop when the run does (they kept working at ~9% CPU each)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 4)
    with OpenAIServer(responder=solve) as llm, Store(home / "carl.db") as store:
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            "  task_type: math\n  rate: 5\n"
        )
        run_id = store.create_run("demo", source_kind="carl")
        plane = Plane(store, home)
        try:
            said = plane.start(PlaneSpec(workers=1, tasks=str(tasks), until_run="demo"))
            assert said.endswith("until run 'demo' ends")
            pids = [c.proc.pid for c in plane.children.values() if c.proc is not None]

            def tick_until(done: Any) -> Any:
                plane.tick()
                return done()

            wait_for(lambda: tick_until(lambda: store.kv("agents.manager")), what="the manager reporting")
            store.update_run(run_id, status="paused")  # a paused run is not over
            plane.next_run_check = 0.0  # look at the run at this tick
            plane.tick()
            assert plane.up and plane.next_run_check > 0.0
            store.update_run(run_id, status="finished")
            wait_for(lambda: tick_until(lambda: not plane.up), timeout=60, what="the plane stopped")
            assert store.kv("agents.plane") == {"wanted": False}
            for pid in pids:
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
        finally:
            plane.stop()
