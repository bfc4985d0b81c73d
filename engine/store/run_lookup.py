"""Runs in carl.db as the capabilities outside the store look them up: every run's name, the names taken under
a prefix (a new run's free name), the live demo run, the live runs with their process (the engine's status).

Each is one read, on the writer's connection or on a reader's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store
    from .reader import StoreReader

LiveRun = tuple[int, str, str, int | None, int | None, int]  # id, name, status, last_step, max_steps, pid


def names(db: Store | StoreReader) -> dict[int, str]:
    """Every run's name, by its id."""
    return dict(db.conn.execute("SELECT id, name FROM runs").fetchall())


def names_like(db: Store | StoreReader, prefix: str) -> set[str]:
    """The names that start with `prefix`, as SQL's LIKE matches them (any case; `_` and `%` in `prefix`
    match any character and any text)."""
    return {row[0] for row in db.conn.execute("SELECT name FROM runs WHERE name LIKE ?", (f"{prefix}%",))}


def live_demo_run(db: Store | StoreReader) -> str | None:
    """The name of a demo run of ours (named demo...) that is running or paused, if there is one."""
    row = db.conn.execute(
        "SELECT name FROM runs WHERE source_kind='carl' AND name LIKE 'demo%' "
        "AND status IN ('running','paused')"
    ).fetchone()
    return row[0] if row else None


def live_runs_with_pid(db: Store | StoreReader) -> list[LiveRun]:
    """The runs running or paused that have a process id, by id."""
    return db.conn.execute(
        "SELECT id, name, status, last_step, max_steps, pid FROM runs"
        " WHERE status IN ('running', 'paused') AND pid IS NOT NULL ORDER BY id"
    ).fetchall()
