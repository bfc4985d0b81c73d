"""Observed sources in carl.db and the runs they write into, as the readers of other tools' runs need them
(engine/observe/): a source found by its path, its kind and the source whose run it joins (`attach_to`, set by
discovery), what it has read so far, and the runs it made.

Reads and writes on the writer's connection, inside the transaction of the caller's batch when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store

# (id, vocab_size, status) of a run: what a reader needs to write into it.
RunFacts = tuple[int, int | None, str]


@dataclass(frozen=True)
class SourceAt:
    """A registered source, found by its path."""

    id: int
    kind: str
    name: str | None


@dataclass(frozen=True)
class SourceProgress:
    """What a source has read so far, and the source whose run it joins."""

    attach_to: int | None
    rows: int
    bad_lines: int
    cursor: str | None  # the cursor's JSON text, as stored


@dataclass(frozen=True)
class SourceRun:
    """One run a source made, with its times (pairing, engine/observe/pairing.py)."""

    id: int
    external_id: str
    started_at: float | None
    last_update: float | None


# -- sources -------------------------------------------------------------------------------------------------


def source_at(store: Store, path: str) -> SourceAt | None:
    """The source registered at `path` (absolute), or None."""
    row = store.conn.execute("SELECT id, kind, name FROM sources WHERE path=?", (path,)).fetchone()
    return None if row is None else SourceAt(int(row[0]), row[1], row[2])


def kind_and_attach_to(store: Store, source_id: int) -> tuple[str, int | None] | None:
    """(kind, attach_to) of a source; None for no such source."""
    row = store.conn.execute("SELECT kind, attach_to FROM sources WHERE id=?", (source_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def source_progress(store: Store, source_id: int) -> SourceProgress | None:
    """What a source has read (rows, bad lines, its cursor) and the source it joins; None for no source."""
    row = store.conn.execute(
        "SELECT attach_to, rows, bad_lines, cursor FROM sources WHERE id=?", (source_id,)
    ).fetchone()
    return None if row is None else SourceProgress(row[0], row[1], row[2], row[3])


def set_attach_to(store: Store, source_id: int, target: int | None) -> None:
    """Make a source join the run of source `target` (None: a run of its own); one statement in the caller's
    transaction, or its own when there is none."""
    store.conn.execute("UPDATE sources SET attach_to=? WHERE id=?", (target, source_id))


# -- the runs of a source ------------------------------------------------------------------------------------


def first_run(store: Store, source_id: int) -> RunFacts | None:
    """The source's first run (the one a source joining it, or the rollouts attached to it, write into)."""
    row = store.conn.execute(
        "SELECT id, vocab_size, status FROM runs WHERE source_id=? ORDER BY id LIMIT 1", (source_id,)
    ).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2])


def run_of(store: Store, source_id: int, external_id: str) -> RunFacts | None:
    """The source's run of `external_id` (the source's own run id, "" when it has none)."""
    row = store.conn.execute(
        "SELECT id, vocab_size, status FROM runs WHERE source_id=? AND external_id=? ORDER BY id LIMIT 1",
        (source_id, external_id),
    ).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2])


def run_ids(store: Store, source_id: int, status: str | None = None) -> list[int]:
    """The ids of the source's runs (those in `status` only, when given), oldest first."""
    if status is None:
        rows = store.conn.execute("SELECT id FROM runs WHERE source_id=? ORDER BY id", (source_id,))
    else:
        rows = store.conn.execute(
            "SELECT id FROM runs WHERE source_id=? AND status=? ORDER BY id", (source_id, status)
        )
    return [int(r[0]) for r in rows.fetchall()]


def has_runs(store: Store, source_id: int) -> bool:
    """Whether the source has made a run yet."""
    return (
        store.conn.execute("SELECT 1 FROM runs WHERE source_id=? LIMIT 1", (source_id,)).fetchone()
        is not None
    )


def source_runs(store: Store, source_id: int) -> list[SourceRun]:
    """The source's runs with their times, oldest first."""
    rows = store.conn.execute(
        "SELECT id, external_id, started_at, last_update FROM runs WHERE source_id=? ORDER BY id",
        (source_id,),
    ).fetchall()
    return [SourceRun(int(r[0]), r[1], r[2], r[3]) for r in rows]
