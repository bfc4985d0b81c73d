"""A run's health in carl.db: the rows health reads (metric series, the run's state and config, held-out
evals) and what it writes back (phase, health, the crystallization event).

Plain functions over the writer (`Store`) or a reader (`StoreReader`), because the analysis runs on the writer
in the engine and on a reader in the offline analyst (engine/coherence/analysis.py, read by
engine/diagnosis/digest.py); each write, on the writer only, is one statement in the caller's transaction, or
its own when there is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .system_reads import SystemReads

if TYPE_CHECKING:
    from .db import Store
    from .reader import StoreReader

NO_END = 2**62  # a step past any run's last


def metric_values(
    db: Store | StoreReader, run_id: int, key: str, since: int, *, before: int | None = None, limit: int = -1
) -> list[tuple[int, float | None]]:
    """(step, value) of one key from step `since` on, before `before`, at most `limit` (-1: all), by step."""
    return db.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND step>=? AND step<? ORDER BY step"
        " LIMIT ?",
        (run_id, key, since, NO_END if before is None else before, limit),
    ).fetchall()


def first_metric_step(db: Store | StoreReader, run_id: int, key: str) -> int | None:
    """The first step the run logged `key` at (None: never)."""
    row = db.conn.execute("SELECT min(step) FROM metrics WHERE run_id=? AND key=?", (run_id, key)).fetchone()
    return None if row[0] is None else int(row[0])


def has_metric(db: Store | StoreReader, run_id: int, key: str) -> bool:
    """Whether the run logged `key` at all (one index seek)."""
    return bool(
        db.conn.execute("SELECT 1 FROM metrics WHERE run_id=? AND key=? LIMIT 1", (run_id, key)).fetchone()
    )


def stored_config(db: Store | StoreReader, run_id: int) -> str | None:
    """The run's config as stored (JSON text; None: no run, or no config)."""
    row = db.conn.execute("SELECT config FROM runs WHERE id=?", (run_id,)).fetchone()
    return row[0] if row else None


def run_state(db: Store | StoreReader, run_id: int) -> tuple[str, int | None, float | None] | None:
    """(status, last_step, last_update) of the run (None: no such run)."""
    return db.conn.execute("SELECT status, last_step, last_update FROM runs WHERE id=?", (run_id,)).fetchone()


def run_framework(db: Store | StoreReader, run_id: int) -> str | None:
    return db.conn.execute("SELECT framework FROM runs WHERE id=?", (run_id,)).fetchone()[0]


def schema_version(db: Store | StoreReader) -> int:
    return db.conn.execute("PRAGMA user_version").fetchone()[0]


def newest_eval_metrics(db: Store | StoreReader, run_id: int, limit: int) -> list[str | None]:
    """The metrics (JSON text) of the run's newest `limit` evals, newest first."""
    rows = db.conn.execute(
        "SELECT metrics FROM evals WHERE run_id=? ORDER BY id DESC LIMIT ?", (run_id, limit)
    ).fetchall()
    return [text for (text,) in rows]


def set_run_health(store: Store, run_id: int, phase: str | None, level: str, reasons: str) -> None:
    """Store the run's phase (None: not classified), health level and reasons (JSON text)."""
    store.conn.execute(
        "UPDATE runs SET phase=?, health=?, health_reasons=? WHERE id=?", (phase, level, reasons, run_id)
    )


def crystallization_events(db: Store | StoreReader, run_id: int) -> list[tuple[Any, ...]]:
    """(step, detail) of the run's crystallization events (at most one is kept)."""
    return db.conn.execute(
        "SELECT step, detail FROM events WHERE run_id=? AND kind='crystallization'", (run_id,)
    ).fetchall()


def replace_crystallization(store: Store, run_id: int, step: int, detail: str, wall_time: float) -> None:
    """The run's one crystallization event, now at `step`."""
    store.conn.execute("DELETE FROM events WHERE run_id=? AND kind='crystallization'", (run_id,))
    store.conn.execute(
        "INSERT INTO events (run_id, step, kind, detail, wall_time) VALUES (?,?,?,?,?)",
        (run_id, step, "crystallization", detail, wall_time),
    )


def system_reads(db: Store | StoreReader) -> SystemReads:
    """The box's tables, read on the same connection (the box's health rules: engine/system/box_health.py)."""
    return SystemReads(db.conn, schema_version(db))
