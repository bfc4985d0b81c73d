"""The light half of the store: connecting, schema checks and command rows.

Kept free of sqlite-utils (which pulls in pandas when it is installed, ~0.5 s) so that the
control room, which only reads and enqueues commands, opens fast.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from engine.errors import CarlError

from .schema import APPLICATION_ID, SCHEMA_VERSION


class StoreError(CarlError):
    """A store problem with a one-line, user-facing message."""


MetricRow = tuple[int, str, float | None, float]  # (step, key, value, wall_time)


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    if readonly:
        uri = f"file:{path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=5.0)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
    return conn


def check_schema(conn: sqlite3.Connection, path: Path) -> int:
    """Return the schema version, raising StoreError for a foreign, newer or corrupt file."""
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a readable carl database ({exc})") from None
    if tables and app_id != APPLICATION_ID:
        raise StoreError(f"{path}: this SQLite file is not a carl database (application_id {app_id:#x})")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: schema version {version} is newer than this carl-tui understands "
            f"({SCHEMA_VERSION}); upgrade carl-tui"
        )
    return version


def insert_command(
    conn: sqlite3.Connection, verb: str, args: dict[str, Any] | None = None, *, target: str = "engine",
    run_id: int | None = None, origin: str = "cli",
) -> int:  # fmt: skip
    """Append a pending command; the caller owns the transaction (or autocommit)."""
    cur = conn.execute(
        "INSERT INTO commands (target, run_id, verb, args, state, origin, created_at)"
        " VALUES (?,?,?,?, 'pending', ?, ?)",
        (target, run_id, verb, json.dumps(args or {}), origin, time.time()),
    )
    return int(cur.lastrowid)
