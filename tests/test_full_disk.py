"""A full disk, and an engine that stops answering (issue 30 §5): one line everywhere, never a wait for ever.

The store lives on a real file system that fills up: a small tmpfs mounted for the test (it needs root, as
the machines this runs on give; elsewhere the tests skip and say why). An engine that stops answering is a
real engine process, stopped with SIGSTOP (a stall without a full disk), or one whose disk filled up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from engine.control import engine_status, start_engine, stop_engine
from engine.control.process import STALLED_AFTER_S
from engine.store import Store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB file system of the test's own."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({mounted.stderr.strip() or 'mount failed'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path) -> None:
    """Write until the disk is full (it may be already: the engine's own writes can fill 4 MB)."""
    with contextlib.suppress(OSError), open(disk / "ballast", "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def carl(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def metrics_file(path: Path, steps: int = 50) -> Path:
    path.write_text("".join(f'{{"step": {s}, "loss": {1 / (s + 1)}, "reward": 0.5}}\n' for s in range(steps)))
    return path


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_carl_observe_on_a_full_disk_is_one_line_and_nothing_stored_is_lost(
    disk: Path, tmp_path: Path
) -> None:
    home = disk / "carl"
    first = carl(home, "observe", str(metrics_file(tmp_path / "a.jsonl")))
    assert first.returncode == 0, first.stderr
    fill(disk)
    done = carl(home, "observe", str(metrics_file(tmp_path / "b.jsonl", 5000)))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"the disk holding {home} has " in line and "free some space, then try again" in line
    follow = carl(home, "observe", str(metrics_file(tmp_path / "c.jsonl")), "--follow")
    assert follow.returncode == 2 and f"the disk holding {home} has " in one_line(follow.stderr)
    (disk / "ballast").unlink()
    with Store(home / "carl.db") as store:  # what was stored before is all there
        assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 100


def test_a_stalled_engine_is_said_by_status_and_a_follow_gives_up_with_the_reason(tmp_path: Path) -> None:
    """The engine stops answering (SIGSTOP): `carl engine status` says it is stalled, since when, and why as
    far as is known; `carl observe --follow` gives up with that instead of waiting for ever."""
    home = tmp_path / "carl"
    status, _ = start_engine(home)
    assert status.state == "up" and status.pid
    os.kill(status.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: time.time() - (engine_status(home).heartbeat_at or 0) > STALLED_AFTER_S + 1,
            timeout=STALLED_AFTER_S + 60,
            what="the heartbeat going stale",
        )
        report = carl(home, "engine", "status")
        assert report.returncode == 4, report.stdout
        assert report.stdout.startswith("engine stalled since ") and "no heartbeat for" in report.stdout
        started = time.monotonic()
        follow = carl(home, "observe", str(metrics_file(tmp_path / "m.jsonl")), "--follow")
        assert follow.returncode == 2 and time.monotonic() - started < 60
        assert "the engine has not answered for" in one_line(follow.stderr)
    finally:
        os.kill(status.pid, signal.SIGCONT)
        stop_engine(home)


def test_an_engine_whose_disk_fills_says_so_in_its_status(disk: Path) -> None:
    home = disk / "carl"
    status, _ = start_engine(home)
    assert status.state == "up"
    try:
        fill(disk)
        wait_for(
            lambda: time.time() - (engine_status(home).heartbeat_at or 0) > STALLED_AFTER_S + 1,
            timeout=STALLED_AFTER_S + 60,
            what="the heartbeat going stale",
        )
        report = carl(home, "engine", "status")
        assert report.returncode == 4
        assert f"the disk holding {home} has " in report.stdout.splitlines()[0]
    finally:
        (disk / "ballast").unlink(missing_ok=True)
        stop_engine(home)


def test_carl_engine_start_on_a_full_disk_says_why_not_an_empty_log(disk: Path) -> None:
    home = disk / "carl"
    home.mkdir()
    fill(disk)
    done = carl(home, "engine", "start")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert line.startswith("carl: the engine did not start: ") and f"the disk holding {home} has " in line
