"""Start, stop and look at the engine daemon from another process (the TUI, the CLI).

`engine_status` is cheap enough to call a few times a second: it reads the pidfile, probes
the pid and reads the engine row read-only; it never writes the store or takes the lock.
`engine_report` adds what the engine is running (its training runs, evals, agents plane) for
`carl engine status`. `ensure_engine` is what a headless command that needs the engine calls:
it starts one if none is up and says so in one line, since the engine outlives the command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine import paths
from engine.errors import CarlError
from engine.store import StoreError, StoreReader, run_lookup

from .pidfile import (
    PidRecord,
    ensure_home,
    is_our_engine,
    log_path,
    parent_pid,
    pid_alive,
    proc_start_time,
    read_pidfile,
    remove_pidfile_if,
)

POLL = 0.05  # seconds between checks while waiting for the engine to come up or go away
# The engine beats every 2 s (engine/daemon/loop.py HEARTBEAT_EVERY): ten beats missed and it is stalled (a
# full disk, a store it cannot write), not slow. Its longest lone work in a tick is a time-boxed batch.
STALLED_AFTER_S = 20.0
LOG_TAIL_BYTES = 64 * 1024  # of engine.log read for its last error
# The store's kv row where the engine lists the processes it started and has not reaped yet:
# {"pid": the engine's pid, "children": [{"kind": "train"|"eval", "pid", "command_id", "what", "log",
# "started_at"}]}. The engine rewrites it when the list changes (and empties it when it starts).
CHILDREN_KEY = "engine.children"
Row = dict[str, Any]
T = TypeVar("T")

# Engines this process started. Polling them reaps a dead one, so it does not linger as a
# zombie that still answers os.kill(pid, 0).
_children: list[subprocess.Popen[bytes]] = []


@dataclass
class EngineStatus:
    state: str  # 'up' | 'down'
    pid: int | None
    started_at: float | None
    heartbeat_at: float | None  # the newest heartbeat in the store, also after the engine stopped
    log_path: Path
    stale_pidfile_recovered: bool  # a pidfile of a dead engine was found (and removed)
    stopped_by_user: bool  # the last engine stopped cleanly (its row says 'stopped')


def _home(home: Path | None) -> Path:
    return Path(home).expanduser() if home is not None else paths.carl_home()


def _reap() -> None:
    _children[:] = [child for child in _children if child.poll() is None]


def _read_store(home: Path, read: Callable[[StoreReader], T], default: T) -> T:
    """`read` on a read-only store of `home`; `default` when there is no readable store yet (none,
    or the first engine is still creating the schema)."""
    db = paths.db_path(home)
    if not db.exists():
        return default
    try:
        reader = StoreReader(db)
    except (StoreError, sqlite3.Error):
        return default
    try:
        return read(reader)
    except sqlite3.Error:
        return default
    finally:
        reader.close()


def _engine_row(home: Path) -> dict[str, Any] | None:
    return _read_store(home, StoreReader.engine_row, None)


class EngineError(CarlError):
    """The engine did not come up (the reason is in its log)."""


def stalled(status: EngineStatus, now: float | None = None) -> float | None:
    """Seconds since the heartbeat of an engine that is up but has not beaten for STALLED_AFTER_S (None: it
    beats, or it is down)."""
    if status.state != "up" or not status.heartbeat_at:
        return None
    quiet = (time.time() if now is None else now) - status.heartbeat_at
    return quiet if quiet >= STALLED_AFTER_S else None


def last_log_error(path: Path) -> str | None:
    """The newest ERROR or WARNING line of engine.log (its message only), read from the file's end."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - LOG_TAIL_BYTES))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        for level in (" ERROR ", " WARNING "):
            if level in line:
                message = line.split(level, 1)[1]
                return message.split("] ", 1)[1] if message.startswith("[engine") else message
    return None


def why_stuck(home: Path, status: EngineStatus) -> str:
    """What is known of why an engine does not answer: its log's last error, and the disk when it is full."""
    from engine.faults import disk_line

    parts = []
    error = last_log_error(status.log_path)
    if error:
        parts.append(f"its last error: {error[:200]}")
    disk = disk_line(home)
    if disk:
        parts.append(disk)
    return "; ".join(parts) or f"nothing in its log ({status.log_path})"


def start_failure(home: Path, status: EngineStatus, code: int | None) -> str:
    """One line when an engine did not come up: its log's last error, its exit status, a full disk; never
    only "see the log" when the log says nothing."""
    from engine.faults import disk_line

    parts = []
    error = last_log_error(status.log_path)
    if error:
        parts.append(error[:200])
    elif code not in (None, 0):
        parts.append(f"it exited with status {code} before writing a line to {status.log_path}")
    disk = disk_line(home)
    if disk:
        parts.append(disk)
    return "the engine did not start: " + ("; ".join(parts) or f"see {status.log_path}")


def engine_status(home: Path | None = None, *, recover: bool = True) -> EngineStatus:
    """`recover=False` leaves a dead engine's pidfile in place: a read-only session writes nothing."""
    home = _home(home)
    _reap()
    record = read_pidfile(home)
    row = _engine_row(home) or {}
    heartbeat_at, row_pid = row.get("heartbeat_at"), row.get("pid")
    if record is not None and is_our_engine(record, heartbeat_at, row_pid):
        return EngineStatus(
            state="up",
            pid=record.pid,
            started_at=record.started_at,
            heartbeat_at=heartbeat_at,
            log_path=log_path(home),
            stale_pidfile_recovered=False,
            stopped_by_user=False,
        )
    return EngineStatus(
        state="down",
        pid=None,
        started_at=None,
        heartbeat_at=heartbeat_at,
        log_path=log_path(home),
        stale_pidfile_recovered=remove_pidfile_if(home, record) if recover else False,
        stopped_by_user=row.get("state") == "stopped",
    )


def engine_report(home: Path | None = None) -> dict[str, Any]:
    """`carl engine status`: the status (as `engine_status`'s fields), the home, the uptime, and while
    the engine is up what it is running: the runs it is training, the evals it is doing, and the agents
    plane (the nats-server and processes it started). Read-only, like `engine_status`."""
    home = _home(home)
    status = engine_status(home)
    up = status.state == "up"
    report: dict[str, Any] = {
        "state": status.state,
        "pid": status.pid,
        "home": str(home),
        "started_at": status.started_at,
        "uptime_s": round(time.time() - status.started_at, 1) if up and status.started_at else None,
        "heartbeat_at": status.heartbeat_at,
        "version": None,
        "log_path": str(status.log_path),
        "stale_pidfile_recovered": status.stale_pidfile_recovered,
        "stopped_by_user": status.stopped_by_user,
        "stalled_s": None,  # seconds without a heartbeat, when up but stalled
        "why": None,  # what is known of why it is stalled (its log's last error, a full disk)
        "training": [],
        "evals": [],
        "agents": {"up": False, "wanted": False, "server": None, "processes": []},
    }

    def running(reader: StoreReader) -> dict[str, Any]:
        found: dict[str, Any] = {"version": (reader.engine_row() or {}).get("version")}
        plane, server = reader.kv("agents.plane") or {}, reader.kv("agents.server") or {}
        found["agents"] = {**report["agents"], "wanted": bool(plane.get("wanted"))}
        if up:  # what the kv says about a dead engine's children and plane is history, not "running"
            if plane.get("wanted"):
                found["agents"] = {
                    "up": True,
                    "wanted": True,
                    "server": _server(server),
                    "processes": [_process(p) for p in plane.get("processes") or []],
                }
            children = reader.kv(CHILDREN_KEY) or {}
            if children.get("pid") == status.pid:
                found["training"], found["evals"] = _running(reader, children.get("children") or [])
        return found

    quiet = stalled(status)
    if quiet is not None:
        report["stalled_s"], report["why"] = round(quiet, 1), why_stuck(home, status)
    return {**report, **_read_store(home, running, {})}  # without a readable store: the status alone


def _server(server: dict[str, Any]) -> dict[str, Any] | None:
    if not server:
        return None
    keys = ("state", "url", "pid", "local", "restarts", "bridge")
    return {key: server.get(key) for key in keys}


def _process(process: dict[str, Any]) -> dict[str, Any]:
    return {key: process.get(key) for key in ("role", "id", "state", "pid", "log")}


def _running(reader: StoreReader, children: list[dict[str, Any]]) -> tuple[list[Row], list[Row]]:
    """The engine's training children as the runs they train (a run's pid is its runner's, or with
    several processes rank 0's, whose parent is the runner), and its live eval children."""
    live = run_lookup.live_runs_with_pid(reader)
    training: list[Row] = []
    evals: list[Row] = []
    for child in children:
        pid = child.get("pid")
        if not isinstance(pid, int) or not pid_alive(pid):
            continue  # exited; the engine reaps it at its next tick
        common = {key: child.get(key) for key in ("command_id", "log", "started_at")}
        if child.get("kind") == "eval":
            evals.append({"run": child.get("what"), "pid": pid, **common})
            continue
        runs = [r for r in live if r[5] == pid or (pid_alive(r[5]) and parent_pid(r[5]) == pid)]
        for run_id, name, state, step, max_steps, run_pid in runs:
            training.append(
                {
                    "run": name,
                    "run_id": run_id,
                    "state": state,
                    "step": step,
                    "max_steps": max_steps,
                    "pid": run_pid,
                    **common,
                }
            )
        if not runs:  # the process has not opened its run yet (it is loading the model)
            training.append(
                {
                    "run": None,
                    "run_id": None,
                    "state": "starting",
                    "step": None,
                    "max_steps": None,
                    "pid": pid,
                    "what": child.get("what"),
                    **common,
                }
            )
    return training, evals


def start_engine(home: Path | None = None, *, wait: float = 10.0) -> tuple[EngineStatus, bool]:
    """Start a detached engine unless one is up; returns (status, started_now).

    started_now is True only when the engine that came up is the one this call spawned (two
    racing starts both spawn, the lock lets one live, and only its starter says True).
    """
    home = ensure_home(home)
    status = engine_status(home)
    if status.state == "up":
        return status, False
    try:
        child = _spawn(home)
    except OSError as exc:  # its log cannot even be opened (a full disk, a read-only home)
        raise EngineError(f"the engine did not start: {exc}; {_disk_or_log(home)}") from None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = engine_status(home)
        if status.state == "up":
            return status, status.pid == child.pid
        if child.poll() not in (None, 0):
            break  # it failed (the reason is in the log); an exit 0 lost the lock to a racing start
        time.sleep(POLL)
    _last_start_code[home] = child.poll()
    return status, False


_last_start_code: dict[
    Path, int | None
] = {}  # the exit status of the last engine this process failed to start


def _disk_or_log(home: Path) -> str:
    from engine.faults import disk_line

    return disk_line(home) or f"see {log_path(home)}"


def started_line(pid: int | None, after: str = "this command") -> str:
    """What a command says when it has started the engine: it keeps running, and how to stop it."""
    return (
        f"started the carl engine (pid {pid}) in the background; it keeps running after {after}"
        " — `carl engine stop` stops it"
    )


def ensure_engine(home: Path | None = None, *, say: Callable[[str], None] | None = None) -> EngineStatus:
    """The engine, up, for a headless command that needs it: started unless one is up already.

    When this call started it, `say` (default: one line on stderr, so stdout stays the command's
    output) is told so: the engine outlives the command. Raises EngineError when it did not come up.
    """
    status, started = start_engine(home)
    if status.state != "up":
        raise EngineError(start_failure(_home(home), status, _last_start_code.get(_home(home))))
    if started:
        (say or _say_on_stderr)(started_line(status.pid))
    return status


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _spawn(home: Path) -> subprocess.Popen[bytes]:
    paths.logs_dir(home)  # creates it
    env = dict(os.environ, CARL_HOME=str(home))
    with open(log_path(home), "ab") as log:  # the child keeps its own copy of the fd
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.daemon", "run", "--home", str(home)],
            start_new_session=True,  # no controlling terminal: survives the SSH session ending
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            close_fds=True,
            cwd=str(home),  # do not pin whatever directory the caller happened to be in
            env=env,
        )
    _children.append(child)
    return child


def stop_engine(home: Path | None = None, *, timeout: float = 10.0) -> bool:
    """SIGTERM the engine, SIGKILL it after `timeout`; True if it was running.

    Returns once the process is gone (not merely its pidfile), so a start right after works.
    """
    home = _home(home)
    if engine_status(home).state != "up":
        return False
    record = read_pidfile(home)
    if record is None:
        return False  # it stopped between the two reads
    _signal(record.pid, signal.SIGTERM)
    if _wait_gone(record, timeout):
        return True
    _signal(record.pid, signal.SIGKILL)
    _wait_gone(record, 5.0)
    # A killed engine cleaned up nothing: do what its exit would have done.
    remove_pidfile_if(home, record)
    _mark_stopped(home, record.pid)
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(record: PidRecord, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(record):
            return True
        time.sleep(POLL)
    return False


def _gone(record: PidRecord) -> bool:
    for child in _children:
        if child.pid == record.pid:
            # Our own child: gone once reaped. (Its /proc state reads 'Z' while a library
            # thread is still exiting, and then it cannot be reaped yet.)
            return child.poll() is not None
    # Someone else's: exited, a zombie its parent has not reaped, or the pid was reused.
    return not pid_alive(record.pid) or proc_start_time(record.pid) not in (None, record.proc_start)


def _mark_stopped(home: Path, pid: int) -> None:
    from engine.store import Store  # the writer; kept out of `engine_status`'s import cost

    try:
        with Store(paths.db_path(home), create=False) as store:
            store.engine_stopped(pid)
    except (StoreError, sqlite3.Error):
        pass  # the status is still right; only the "stopped by user" note is lost
