"""Start, stop and look at the engine daemon from another process (the TUI, the CLI).

`engine_status` is cheap enough to call a few times a second: it reads the pidfile, probes
the pid and reads the engine row read-only; it never writes the store or takes the lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.store import StoreError, StoreReader

from .pidfile import (
    PidRecord,
    ensure_home,
    is_our_engine,
    log_path,
    pid_alive,
    proc_start_time,
    read_pidfile,
    remove_pidfile_if,
)

POLL = 0.05  # seconds between checks while waiting for the engine to come up or go away

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


def _engine_row(home: Path) -> dict[str, Any] | None:
    db = paths.db_path(home)
    if not db.exists():
        return None
    try:
        reader = StoreReader(db)
    except (StoreError, sqlite3.Error):
        return None
    try:
        return reader.engine_row()
    except sqlite3.Error:
        return None  # e.g. the first engine is still creating the schema
    finally:
        reader.close()


def engine_status(home: Path | None = None) -> EngineStatus:
    home = _home(home)
    _reap()
    record = read_pidfile(home)
    row = _engine_row(home) or {}
    heartbeat_at, row_pid = row.get("heartbeat_at"), row.get("pid")
    if record is not None and is_our_engine(record, heartbeat_at, row_pid):
        return EngineStatus(
            state="up", pid=record.pid, started_at=record.started_at, heartbeat_at=heartbeat_at,
            log_path=log_path(home), stale_pidfile_recovered=False, stopped_by_user=False,
        )  # fmt: skip
    return EngineStatus(
        state="down", pid=None, started_at=None, heartbeat_at=heartbeat_at, log_path=log_path(home),
        stale_pidfile_recovered=remove_pidfile_if(home, record),
        stopped_by_user=row.get("state") == "stopped",
    )  # fmt: skip


def start_engine(home: Path | None = None, *, wait: float = 10.0) -> tuple[EngineStatus, bool]:
    """Start a detached engine unless one is up; returns (status, started_now).

    started_now is True only when the engine that came up is the one this call spawned (two
    racing starts both spawn, the lock lets one live, and only its starter says True).
    """
    home = ensure_home(home)
    status = engine_status(home)
    if status.state == "up":
        return status, False
    child = _spawn(home)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        status = engine_status(home)
        if status.state == "up":
            return status, status.pid == child.pid
        if child.poll() not in (None, 0):
            break  # it failed (the reason is in the log); an exit 0 lost the lock to a racing start
        time.sleep(POLL)
    return status, False


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
