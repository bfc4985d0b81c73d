"""The engine's pidfile and lock, and how to tell whether a pid is still our engine.

The lock (`engine.lock`, an exclusive flock held for the engine's whole life) is what keeps
one engine per $CARL_HOME; the kernel drops it when the process dies, even on kill -9.
The pidfile (`engine.pid`) only says who holds it, so that status checks stay cheap and
never touch the lock. A pidfile can go stale; `is_our_engine` is how readers notice.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.processes import alive


def ensure_home(home: Path | None) -> Path:
    """The given $CARL_HOME (or the default one), created with mode 0700 when missing."""
    if home is None:
        return paths.carl_home()
    home = Path(home).expanduser()
    if not home.exists():
        home.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(home, 0o700)  # mkdir's mode is filtered by the umask
    return home


def pid_path(home: Path) -> Path:
    return home / "engine.pid"


def lock_path(home: Path) -> Path:
    return home / "engine.lock"


def log_path(home: Path) -> Path:
    return home / "logs" / "engine.log"


@dataclass(frozen=True)
class PidRecord:
    pid: int
    started_at: float  # wall time the engine started
    proc_start: str | None  # the kernel's start time of the process (Linux), guards against pid reuse


def take_lock(home: Path) -> int | None:
    """Return an fd holding the engine lock, or None when another process holds it.

    The fd is non-inheritable (Python's default), so processes the engine spawns never keep
    the lock alive after the engine dies.
    """
    fd = os.open(lock_path(home), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None off Linux.

    Returns "" for a process that is gone or a zombie, which never matches a live record.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name sits in parentheses and may itself contain spaces or parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start = fields[0], fields[19]
    return "" if state in ("Z", "X") else start


def parent_pid(pid: int) -> int | None:
    """The parent of a live process (None when it is gone or cannot be read): /proc on Linux, ps elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    import subprocess

    try:
        out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out.stdout) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def write_pidfile(home: Path, record: PidRecord) -> None:
    """Write the pidfile atomically (a reader sees the old file or the new one, never half)."""
    path = pid_path(home)
    tmp = path.with_name(f"{path.name}.{record.pid}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": record.pid, "started_at": record.started_at, "proc_start": record.proc_start}, f)
    os.replace(tmp, path)


def read_pidfile(home: Path) -> PidRecord | None:
    """The pidfile's record, or None when there is none or it cannot be parsed."""
    try:
        data = json.loads(pid_path(home).read_text())
        return PidRecord(int(data["pid"]), float(data["started_at"]), data.get("proc_start"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_pidfile_if(home: Path, record: PidRecord | None) -> bool:
    """Remove the pidfile only if it still holds `record`, so a newer engine's file survives."""
    if record is None or read_pidfile(home) != record:
        return False
    try:
        pid_path(home).unlink()
    except FileNotFoundError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    return alive(pid, others_count=False)  # someone else's process: our engine runs as us


def is_our_engine(record: PidRecord, heartbeat_at: float | None, heartbeat_pid: int | None) -> bool:
    """Whether the pidfile's process is alive and is the engine that wrote it.

    On Linux the kernel's process start time settles it exactly. Elsewhere a live pid with a
    fresh store heartbeat from that pid (< 10 s old) stands in for it.
    """
    if not pid_alive(record.pid):
        return False
    current = proc_start_time(record.pid)
    if current is not None and record.proc_start is not None:
        return current == record.proc_start
    return heartbeat_pid == record.pid and heartbeat_at is not None and time.time() - heartbeat_at < 10.0
