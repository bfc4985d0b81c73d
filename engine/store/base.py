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


def insert_chat_message(
    conn: sqlite3.Connection, conversation_id: int | None, run_id: int | None, role: str, content: str,
    meta: dict[str, Any] | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Append a chat message, starting a conversation (titled by its first line) when none is given;
    returns (conversation, message). The caller owns the transaction."""
    now = time.time()
    if conversation_id is None:
        title = content.strip().splitlines()[0][:80] if content.strip() else "conversation"
        cur = conn.execute(
            "INSERT INTO conversations (run_id, title, created_at, updated_at) VALUES (?,?,?,?)",
            (run_id, title, now, now),
        )
        conversation_id = int(cur.lastrowid)  # type: ignore[arg-type]
    cur = conn.execute(
        "INSERT INTO chat_messages (conversation_id, run_id, role, content, meta, created_at) VALUES (?,?,?,?,?,?)",
        (conversation_id, run_id, role, content, json.dumps(meta or {}), now),
    )
    conn.execute("UPDATE conversations SET updated_at=? WHERE id=?", (now, conversation_id))
    return conversation_id, int(cur.lastrowid)  # type: ignore[arg-type]
