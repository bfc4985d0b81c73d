"""The headless `carl` command as a user runs it: real processes, real files, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store import StoreReader


def carl(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_observe_imports_a_jsonl_and_lists_it(home: Path, tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": s, "loss": 1 / (s + 1), "phi_mean": 0.1 + s / 100, "reward_task": s / 50})
        for s in range(40)
    ]
    log.write_text("\n".join(lines[:20]) + "\nnot json\n" + "\n".join(lines[20:]) + "\n")
    result = carl(home, "observe", str(log), "--name", "imported")
    assert result.returncode == 0, result.stderr
    assert "120 metric rows" in result.stdout and "1 malformed" in result.stdout
    assert "metrics.jsonl:21" in result.stderr
    reader = StoreReader(home / "carl.db")
    [run] = reader.runs()
    assert (run.name, run.last_step, run.status) == ("imported", 39, "imported")
    assert run.phase is not None and run.health in ("green", "yellow", "red")  # analysed at import
    assert reader.series(run.id, "rewards/task/mean").latest == pytest.approx(39 / 50)
    listing = carl(home, "runs")
    assert "imported" in listing.stdout and "39" in listing.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["observe", "/no/such/file.jsonl"], "/no/such/file.jsonl"),
        (["observe", "__FOREIGN__"], "not"),
    ],
)
def test_bad_input_is_one_line_without_traceback(
    home: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    foreign = tmp_path / "photo.bin"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 10)
    args = [str(foreign) if a == "__FOREIGN__" else a for a in args]
    result = carl(home, *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_a_newer_store_is_refused_in_one_line(home: Path) -> None:
    import sqlite3

    from engine.store import SCHEMA_VERSION, Store

    Store(home / "carl.db").close()
    conn = sqlite3.connect(home / "carl.db")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    result = carl(home, "runs")
    assert (
        result.returncode == 2
        and "newer than this carl-tui" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_engine_lifecycle_and_followed_observe(home: Path, tmp_path: Path) -> None:
    log = tmp_path / "live.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(10)))
    try:
        assert carl(home, "engine", "status").returncode == 3
        started = carl(home, "engine", "start")
        assert started.returncode == 0 and "engine started" in started.stdout
        assert "already running" in carl(home, "engine", "start").stdout
        followed = carl(home, "observe", str(log), "--follow")
        assert followed.returncode == 0, followed.stderr
        assert "keeps following" in followed.stdout
        with log.open("a") as f:
            f.write(json.dumps({"step": 10, "loss": 0.5}) + "\n")
        reader = StoreReader(home / "carl.db")
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (reader.runs()[0].last_step or 0) < 10:
            time.sleep(0.1)
        assert reader.runs()[0].last_step == 10
        assert carl(home, "engine", "status").returncode == 0
    finally:
        stopped = carl(home, "engine", "stop")
    assert "engine stopped" in stopped.stdout
