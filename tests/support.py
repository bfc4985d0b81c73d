"""Helpers shared by the test files (imported as `support`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.store import Store


def series(store: Store, run_id: int, key: str) -> dict[int, float | None]:
    """A run's stored values of one key, by step."""
    rows = store.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step", (run_id, key)
    )
    return dict(rows.fetchall())


async def until(pilot: Any, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
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


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll `predicate` (a read of the store or of a process: a known point, not a sleep) until it is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met in {timeout:.0f}s")
