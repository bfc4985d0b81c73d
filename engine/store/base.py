"""The light half of the store: connecting, schema checks and command rows.

Kept free of sqlite-utils (which pulls in pandas when it is installed, ~0.5 s) so that the
control room, which only reads and enqueues commands, opens fast.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from engine.errors import CarlError
from engine.files import kind_of, reason

from .commands import Verb, check
from .schema import APPLICATION_ID, SCHEMA_VERSION


class StoreError(CarlError):
    """A store problem with a one-line, user-facing message."""


MetricRow = tuple[int, str, float | None, float]  # (step, key, value, wall_time)

# What a run is doing before its first step (a kv row; `Store.set_run_stage`, `StoreReader.run_stage`).
RUN_STAGE_KEY = "run.{}.stage"
# Engine commands that start something the control room waits for: shown until what they start is there.
STARTING_VERBS = (Verb.TRAIN, Verb.AGENTS_UP)


IN_CHUNK = 500  # values per `IN (...)`: under SQLite's 999 bound parameters of older builds


def in_chunks(values: Iterable[Any]) -> list[tuple[list[Any], str]]:
    """`values` in chunks for `WHERE x IN (...)`, each with its `?, ?, ...` (in sorted order)."""
    ordered = sorted(set(values))
    chunks = [ordered[start : start + IN_CHUNK] for start in range(0, len(ordered), IN_CHUNK)]
    return [(chunk, ",".join("?" * len(chunk))) for chunk in chunks]


def unreadable(path: Path, exc: sqlite3.Error) -> str:
    """Why a store could not be opened, in one line: a full disk when it is one (SQLite says "disk I/O error"
    when it cannot make its WAL files), else not a carl database."""
    from engine.faults import disk_line

    if isinstance(exc, sqlite3.OperationalError) and (full := disk_line(path.parent)):
        return f"{path}: cannot be opened: {full} ({exc}): free some space, then try again"
    return f"{path}: not a readable carl database ({exc})"


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    if readonly:
        uri = f"{path.absolute().as_uri()}?mode=ro"  # a path with ? or # in it stays a path
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=5.0)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
    return conn


def existing_store(path: Path) -> bool:
    """Whether `path` holds a store to open (False: none yet), checked without writing a byte to it.

    StoreError for what is not a carl database: a FIFO, a device or a directory, a symbolic link loop,
    or an SQLite file of somebody else's, which is refused before the writer would switch it to WAL.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"{path}: {reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: {kind_of(st.st_mode)}, not a carl database")
    if st.st_size:
        try:
            conn = connect(path, readonly=True)
        except sqlite3.Error as exc:
            raise StoreError(unreadable(path, exc)) from None
        try:
            check_schema(conn, path)
        finally:
            conn.close()
    return True


def check_schema(conn: sqlite3.Connection, path: Path) -> int:
    """Return the schema version, raising StoreError for a foreign, newer or corrupt file."""
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise StoreError(unreadable(path, exc)) from None
    if tables and app_id != APPLICATION_ID:
        raise StoreError(f"{path}: this SQLite file is not a carl database (application_id {app_id:#x})")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: schema version {version} is newer than this carl-tui understands "
            f"({SCHEMA_VERSION}); upgrade carl-tui"
        )
    return version


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid of the row an INSERT on `cur` just made (sqlite3 types lastrowid `int | None`: None only
    before any INSERT)."""
    return cast(int, cur.lastrowid)


def insert_command(
    conn: sqlite3.Connection,
    verb: str,
    args: dict[str, Any] | None = None,
    *,
    target: str = "engine",
    run_id: int | None = None,
    origin: str = "cli",
) -> int:
    """Append a pending command, checked against the vocabulary first (engine/store/commands.py: CommandError
    for an unknown verb, a bad argument or the wrong target); the caller owns the transaction (or
    autocommit)."""
    args = check(verb, args, target=target, run_id=run_id)
    cur = conn.execute(
        "INSERT INTO commands (target, run_id, verb, args, state, origin, created_at)"
        " VALUES (?,?,?,?, 'pending', ?, ?)",
        (target, run_id, str(verb), json.dumps(args), origin, time.time()),
    )
    return inserted_id(cur)


def insert_chat_message(
    conn: sqlite3.Connection,
    conversation_id: int | None,
    run_id: int | None,
    role: str,
    content: str,
    meta: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Append a chat message, redacted (its text and its meta: a tool's input), starting a conversation
    (titled by its first line) when none is given; returns (conversation, message). The caller owns the
    transaction. Redacting here covers every writer of chat messages (docs/guide/diagnosis.md)."""
    from engine.redact import redact, redact_value  # here: ~10 ms of patterns a reader never needs

    content, meta = redact(content), redact_value(meta) if meta else meta
    now = time.time()
    if conversation_id is None:
        title = content.strip().splitlines()[0][:80] if content.strip() else "conversation"
        cur = conn.execute(
            "INSERT INTO conversations (run_id, title, created_at, updated_at) VALUES (?,?,?,?)",
            (run_id, title, now, now),
        )
        conversation_id = inserted_id(cur)
    cur = conn.execute(
        "INSERT INTO chat_messages (conversation_id, run_id, role, content, meta, created_at) "
        "VALUES (?,?,?,?,?,?)",
        (conversation_id, run_id, role, content, json.dumps(meta or {}), now),
    )
    conn.execute("UPDATE conversations SET updated_at=? WHERE id=?", (now, conversation_id))
    return conversation_id, inserted_id(cur)


# -- experiments (schema v5): read by the writer and by read-only readers alike ---------------


def read_experiment(conn: sqlite3.Connection, ref: str | int) -> dict[str, Any] | None:
    """An experiment by id (int) or name (str), its JSON columns decoded; None when there is none."""
    column = "id" if isinstance(ref, int) else "name"
    cur = conn.execute(f"SELECT * FROM experiments WHERE {column}=?", (ref,))
    row = cur.fetchone()
    if row is None:
        return None
    record = dict(zip([d[0] for d in cur.description], row, strict=True))
    for key in ("config", "arms", "seeds"):
        record[key] = json.loads(record[key])
    return record


def read_experiments(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every experiment, oldest first."""
    ids = [r[0] for r in conn.execute("SELECT id FROM experiments ORDER BY id")]
    return [e for i in ids if (e := read_experiment(conn, i)) is not None]


def read_experiment_runs(conn: sqlite3.Connection, experiment_id: int) -> list[dict[str, Any]]:
    """An experiment's arm x seed cells, in insertion order; `run_id` is NULL until a cell starts."""
    cur = conn.execute("SELECT * FROM experiment_runs WHERE experiment_id=? ORDER BY rowid", (experiment_id,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
