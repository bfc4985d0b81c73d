"""Helpers shared by the test files (imported as `support`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from engine.store import Store


def series(store: Store, run_id: int, key: str) -> dict[int, float | None]:
    """A run's stored values of one key, by step."""
    rows = store.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step", (run_id, key)
    )
    return dict(rows.fetchall())


async def until(pilot: Any, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let a Pilot-driven app run until `predicate` holds (the store watcher polls at 4 Hz)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


def status_text(app: Any) -> str:
    """The control room's status line as plain text."""
    from widgets.status_bar import StatusBar

    bar = app.query_one(StatusBar)
    return bar.render_info(bar.info).plain


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 120.0,
    what: str = "condition",
    *,
    proc: subprocess.Popen[str] | None = None,
) -> Any:
    """Poll `predicate` (a read of the store or of a process: a known point, not a sleep) until it is truthy;
    fail at once, with its stderr, when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the process exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.05)
    raise AssertionError(f"{what} not met in {timeout:.0f}s")


ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def start_training(home: Path, *args: str) -> subprocess.Popen[str]:
    """`python -m engine.training --home HOME ARGS` as the engine starts it, offline, its output piped."""
    argv = [sys.executable, "-m", "engine.training", "--home", str(home), *args]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, **OFFLINE},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def end_all(procs: Iterable[subprocess.Popen[str]]) -> None:
    """Kill those of `procs` still running (a test's finally: none outlives it, also when it failed)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@dataclass
class Launched:
    """A training run started ahead of the test that checks it: its process, and the store of its own home."""

    proc: subprocess.Popen[str]
    store: Store

    def finish(self) -> tuple[int, str, str]:
        return finish(self.proc)


@contextmanager
def launched_together(runs: dict[str, tuple[Path, list[str]]]) -> Iterator[dict[str, Launched]]:
    """Start the runs `name: (home, args)` side by side (each is mostly one core's work), each home's store
    made before its run opens it. None outlives the block, finished or not."""
    started: dict[str, Launched] = {}
    try:
        for name, (home, args) in runs.items():
            store = Store(home / "carl.db")
            started[name] = Launched(start_training(home, *args), store)
        yield started
    finally:
        end_all(launched.proc for launched in started.values())
        for launched in started.values():
            launched.store.close()


def kill_runs(home: Path) -> None:
    """Training runs outlive the engine (they are their own processes): end the test's, those that
    opened their run and those the engine had started before (its list in the store)."""
    db = home / "carl.db"
    if not db.exists():
        return
    with Store(db) as store:
        pids = [r[0] for r in store.conn.execute("SELECT pid FROM runs WHERE pid IS NOT NULL").fetchall()]
        row = store.conn.execute("SELECT value FROM kv WHERE key='engine.children'").fetchone()
    pids += [child["pid"] for child in (json.loads(row[0])["children"] if row else [])]
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if str(home) in process.cmdline():  # `--home HOME`: never a reused pid's process
                process.kill()
