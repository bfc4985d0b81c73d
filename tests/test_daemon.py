"""The engine daemon, as real detached processes on a temporary $CARL_HOME."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from test_command_vocabulary import command_row

from engine import paths
from engine.control import engine_status, start_engine, stop_engine
from engine.daemon.loop import ROW_HOOKS, on_run_rows
from engine.observe import register_source
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow

T = TypeVar("T")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "carl"
    monkeypatch.setenv("CARL_HOME", str(home))
    yield home
    stop_engine(home, timeout=5.0)  # never leave a daemon behind


def wait_for(check: Callable[[], T], *, timeout: float = 60.0, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds (a bound for a loaded
    machine: a passing wait returns as soon as its point is reached)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def engine_row(home: Path) -> dict[str, Any]:
    reader = StoreReader(paths.db_path(home))
    try:
        row = reader.engine_row()
    finally:
        reader.close()
    assert row is not None
    return row


def metric_count(home: Path) -> int:
    """Metric rows in the store; max(id) is exact here (rows are only added) and costs no scan."""
    reader = StoreReader(paths.db_path(home))
    try:
        return int(reader.conn.execute("SELECT coalesce(max(id), 0) FROM metrics").fetchone()[0])
    finally:
        reader.close()


def command_state(store: Store, command_id: int) -> tuple[str, str | None]:
    row = store.conn.execute("SELECT state, result FROM commands WHERE id=?", (command_id,)).fetchone()
    return row[0], row[1]


def finished(store: Store, command_id: int) -> tuple[str, str] | None:
    state, result = command_state(store, command_id)
    return (state, result or "") if state in ("done", "failed") else None


def write_jsonl(path: Path, steps: range, mode: str = "w") -> None:
    with open(path, mode) as f:
        f.writelines(
            f'{{"step": {s}, "loss": {1 / (s + 1):.6f}, "reward": {s % 7 / 7:.4f}, "kl": 0.01, "lr": 1e-5}}\n'
            for s in steps
        )


def log_text(home: Path) -> str:
    return (home / "logs" / "engine.log").read_text()


# -- lifecycle ---------------------------------------------------------------------------------


def test_start_status_stop(home: Path) -> None:
    status, started = start_engine(home)
    assert started and status.state == "up" and status.pid is not None
    pid = status.pid
    os.kill(pid, 0)  # alive
    assert (home / "engine.pid").exists()
    assert "engine started" in log_text(home)
    row = engine_row(home)
    assert row["pid"] == pid and row["state"] == "up" and time.time() - row["heartbeat_at"] < 10

    again, started_again = start_engine(home)
    assert not started_again and again.pid == pid
    assert engine_status().pid == pid  # $CARL_HOME from the environment

    assert stop_engine(home) is True
    status = engine_status(home)
    assert status.state == "down" and status.pid is None
    assert status.stopped_by_user and not status.stale_pidfile_recovered
    assert not (home / "engine.pid").exists()
    assert engine_row(home)["state"] == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "engine stopped" in log_text(home)
    assert stop_engine(home) is False


def test_kill_9_leaves_a_stale_pidfile_that_is_recovered(home: Path) -> None:
    first, _ = start_engine(home)
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    status = wait_for(lambda: (s := engine_status(home)).state == "down" and s, what="engine down")
    assert status.stale_pidfile_recovered and not status.stopped_by_user
    assert not (home / "engine.pid").exists()

    second, started = start_engine(home)
    assert started and second.state == "up" and second.pid != first.pid


def test_a_second_engine_exits_at_once(home: Path) -> None:
    status, _ = start_engine(home)
    other = subprocess.run(
        [sys.executable, "-m", "engine.daemon", "run", "--home", str(home)], timeout=60, capture_output=True
    )
    assert other.returncode == 0
    assert f"engine already running (pid {status.pid})" in log_text(home)
    assert engine_status(home).pid == status.pid


def test_an_unreadable_store_stops_the_engine_with_exit_2(home: Path) -> None:
    home.mkdir(mode=0o700)
    paths.db_path(home).write_bytes(b"this is not a SQLite database, not at all" * 100)
    began = time.monotonic()
    status, started = start_engine(home)
    assert status.state == "down" and not started
    assert time.monotonic() - began < 8  # it noticed the failed child, it did not wait out the timeout
    assert "cannot open the store" in log_text(home)
    result = subprocess.run([sys.executable, "-m", "engine.daemon", "run", "--home", str(home)], timeout=60)
    assert result.returncode == 2


def test_row_hooks_report_failures_without_raising(tmp_path: Path) -> None:
    seen: list[list[int]] = []

    def broken(store: Store, run_ids: list[int]) -> None:
        raise RuntimeError("no analyser today")

    with Store(tmp_path / "carl.db") as store:
        ROW_HOOKS[:] = [lambda store, ids: seen.append(ids), broken]
        try:
            errors = on_run_rows(store, [3])
        finally:
            ROW_HOOKS.clear()
    assert seen == [[3]]
    assert len(errors) == 1 and "no analyser today" in errors[0]


# -- commands and sources ----------------------------------------------------------------------


def test_observe_command_follows_a_jsonl_source(home: Path, tmp_path: Path) -> None:
    start_engine(home)
    log = tmp_path / "metrics.jsonl"
    write_jsonl(log, range(10))
    with Store(paths.db_path(home)) as store:
        command = store.enqueue_command("observe", {"path": str(log), "follow": True, "name": "x"})
        state, result = wait_for(lambda: finished(store, command), what="observe command")
        assert state == "done" and result.startswith("observing metrics.jsonl as run 'x'"), result
        assert metric_count(home) == 40

        write_jsonl(log, range(10, 25), mode="a")
        wait_for(lambda: metric_count(home) == 100, what="appended rows")

        missing = store.enqueue_command("observe", {"path": str(tmp_path / "nope.jsonl"), "follow": True})
        unknown = command_row(store, "dance", {}, target="engine")  # past the vocabulary: by hand
        no_path = command_row(store, "observe", {"follow": True}, target="engine")
        state, result = wait_for(lambda: finished(store, missing), what="bad path command")
        assert state == "failed" and "nope.jsonl" in result and "\n" not in result
        state, result = wait_for(lambda: finished(store, unknown), what="unknown verb")
        assert state == "failed" and result.startswith(
            "unknown engine command 'dance' (known: observe, train,"
        )
        state, result = wait_for(lambda: finished(store, no_path), what="observe without a path")
        assert (state, result) == (
            "failed",
            "observe: path is missing (observe takes path, follow, name, logs, pairing)",
        )
    assert engine_status(home).state == "up"  # failures never end the engine


def test_a_failing_source_is_recorded_and_others_go_on(home: Path, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_jsonl(good, range(5))
    write_jsonl(bad, range(5))
    with Store(paths.db_path(home)) as store:
        register_source(store, str(good), follow=True)
        bad_id = register_source(store, str(bad), follow=True)
    start_engine(home)
    wait_for(lambda: metric_count(home) == 40, what="both sources ingested")
    bad.unlink()
    bad.mkdir()  # a directory where the file was: reading it fails on every try
    write_jsonl(good, range(5, 10), mode="a")
    wait_for(lambda: metric_count(home) == 60, what="the good source goes on")
    with Store(paths.db_path(home)) as store:
        wait_for(lambda: store.source(bad_id)["last_error"], what="the error on the bad source")
    assert engine_status(home).state == "up"


# -- reliability -------------------------------------------------------------------------------


def test_kill_9_mid_ingest_loses_and_duplicates_nothing(home: Path, tmp_path: Path) -> None:
    lines, keys = 300_000, 4
    log = tmp_path / "big.jsonl"
    write_jsonl(log, range(lines))
    with Store(paths.db_path(home)) as store:
        command = store.enqueue_command("observe", {"path": str(log), "follow": True})

    first, _ = start_engine(home)
    assert first.pid is not None
    wait_for(lambda: metric_count(home) > 0, what="the first rows")
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: engine_status(home).state == "down", what="the killed engine to be gone")
    partial = metric_count(home)
    assert 0 < partial < lines * keys, "killed too late to test anything"

    # The next engine takes up the command the dead one left 'running'. A stop in the middle of
    # the backlog finishes the batch at hand and exits cleanly, fast.
    second, started = start_engine(home)
    assert started and second.pid != first.pid
    wait_for(lambda: metric_count(home) > partial, what="progress after the restart")
    began = time.monotonic()
    assert stop_engine(home, timeout=5.0)
    assert time.monotonic() - began < 3
    assert f"engine stopped (pid {second.pid})" in log_text(home)  # it exited on its own, not by SIGKILL
    with Store(paths.db_path(home)) as store:
        state, result = command_state(store, command)
    assert state == "done" and "so far; resumes with the engine" in (result or ""), result

    third, _ = start_engine(home)
    wait_for(lambda: metric_count(home) >= lines * keys, what="catching up", timeout=180)

    with Store(paths.db_path(home)) as store:
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        total = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
        distinct = store.conn.execute(
            "SELECT count(*) FROM (SELECT DISTINCT run_id, key, step FROM metrics)"
        ).fetchone()[0]
        runs = store.conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        (source,) = store.followed_sources()
    assert total == distinct == lines * keys
    assert runs == 1
    assert source["rows"] == total  # the cursor's count moved with the rows, through both stops
    assert engine_row(home)["pid"] == third.pid


def test_an_observe_command_of_a_directory_imports_every_run_found_in_it(home: Path, tmp_path: Path) -> None:
    """What `o` in the control room queues for a veRL experiment folder: its log and its rollout dump (found
    by discovery, the dump attached to the log's run), imported by the engine, and the command says so."""
    from test_observe_discover import dump_generations
    from test_observe_jsonl_frameworks import VerlFileLogger, verl_step

    root = tmp_path / "verl-exp"
    (root / "proj").mkdir(parents=True)
    logger = VerlFileLogger(root / "proj" / "grpo.jsonl")
    for step in range(1, 4):
        logger.log(verl_step(step), step)
        dump_generations(root / "rollouts", step, ["2+2="] * 2, ["4", "5"], [1.0, 0.0])
    logger.finish()
    start_engine(home)
    with Store(paths.db_path(home)) as store:
        command = store.enqueue_command("observe", {"path": str(root), "follow": False})
        state, result = wait_for(lambda: finished(store, command), what="observe command", timeout=60)
        assert state == "done" and result.startswith("imported verl-exp as run 'grpo'"), result
        [(run_id, framework, status)] = store.conn.execute(
            "SELECT id, framework, status FROM runs"
        ).fetchall()
        assert (framework, status) == ("verl", "imported")
        rollouts = store.conn.execute("SELECT count(*) FROM rollouts WHERE run_id=?", (run_id,)).fetchone()[0]
        assert rollouts == 6  # 2 samples in each of 3 steps, on the log's run
