"""Trackio's traces as rollouts: the `traces` table of a project's SQLite file (Trackio >= 0.25).

`trackio.log({"rollouts": [trackio.Trace(messages, metadata)]}, step=...)` stores each trace as a row of
`traces` (trackio/sqlite_storage.py, Trackio 0.43: `_split_trace_metrics`, `_insert_trace_rows`): `messages`
and `metadata` as JSON, `spans`, the run (`run_id`, `run_name`), the log's `step`, the logged `key` and
`trace_index` (its place in the logged list). Trackio also writes each trace to
`traces/<project>/<run>/<id>.jsonl`, an agent-session file for the Hub's viewer, "never the source of truth:
the `traces` table stays authoritative" (`write_trace_sessions`); those files are not read.

Each trace becomes a rollout of its run (rollouts/columns.py TRACKIO_TRACES says which metadata field is
what). The table is tailed by rowid (Trackio inserts, never updates, a trace), the rowid reached kept in the
source's cursor with the rows: one cursor per project file, so every run of it is followed and a restart
resumes where the last commit left. A page's sizes are read first; a trace larger than MAX_TRACE_CHARS is
skipped with one line, unread, and a batch reads at most MAX_BATCH_CHARS of them (always at least one). A
trace that is not one (messages that are not a list of messages, metadata that is not an object, a step that
is no integer) is one line and skipped.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from engine.limits import shown
from engine.text import loads_storable

from .reader_base import Budget, IngestResult, as_step
from .rollouts.columns import TRACKIO_TRACES, mapped
from .rollouts.rollout_base import ROW_WEIGHT, split_messages

PAGE = 200  # traces whose sizes are read at once
MAX_TRACE_CHARS = 4 << 20  # a trace's messages and metadata together; a larger one is skipped, unread
MAX_BATCH_CHARS = 32 << 20  # read in one batch (a trace larger than what is left waits for the next)
NEEDED = {"run_name", "step", "key", "messages", "metadata", "timestamp"}

Sample = dict[str, Any]


def traces_columns(conn: sqlite3.Connection) -> set[str]:
    """The traces table's columns; empty when the project has none (Trackio < 0.25)."""
    return {r[1] for r in conn.execute("PRAGMA table_info(traces)")}


def read_traces(
    conn: sqlite3.Connection,
    run_col: str,
    after: int,
    budget: Budget,
    rows_before: int,
    add: Callable[[str, str, Sample], None],
    result: IngestResult,
    wall_time: Callable[[Any], float],
) -> tuple[int, bool]:
    """Read traces past rowid `after` until caught up, the budget is spent or MAX_BATCH_CHARS are read; hand
    each one's sample to `add(external id, run name, sample)`. Returns (the rowid reached, caught up)."""
    columns = traces_columns(conn)
    if not columns >= NEEDED:
        return after, True
    run_col = run_col if run_col in columns else "run_name"
    index = "trace_index" if "trace_index" in columns else "NULL"
    chars = 0
    count = 0
    while True:
        sizes = conn.execute(
            "SELECT rowid, length(messages) + length(metadata) FROM traces WHERE rowid > ? ORDER BY rowid"
            " LIMIT ?",
            (after, PAGE),
        ).fetchall()
        wanted: list[int] = []
        full = False
        reached = after
        for rowid, size in sizes:
            size = size or 0
            if size > MAX_TRACE_CHARS:
                result.add_problem(
                    f"traces row {rowid}: {size:,} characters, over the limit of {MAX_TRACE_CHARS:,};"
                    " skipped, unread"
                )
            elif chars and chars + size > MAX_BATCH_CHARS:
                full = True  # the batch's characters are spent: the rest waits for the next batch
                break
            else:
                wanted.append(rowid)
                chars += size
            reached = rowid
        if wanted:
            marks = ",".join("?" * len(wanted))
            rows = conn.execute(
                f"SELECT rowid, {run_col}, run_name, step, key, {index}, timestamp, messages, metadata"
                f" FROM traces WHERE rowid IN ({marks}) ORDER BY rowid",
                wanted,
            ).fetchall()
            for row in rows:
                sample = trace_sample(row, result, wall_time)
                if sample is not None:
                    add(str(row[1]), str(row[2]), sample)
                    count += 1
        after = reached
        if full:
            return after, False
        if len(sizes) < PAGE:
            return after, True
        if budget.spent(rows_before + count * ROW_WEIGHT):
            return after, False


def trace_sample(
    row: tuple[Any, ...], result: IngestResult, wall_time: Callable[[Any], float]
) -> Sample | None:
    """One trace row as a rollout (without its `idx`), or None and a problem line."""
    rowid, _, _, step, key, index, stamp, messages_blob, metadata_blob = row
    where = f"traces row {rowid}"
    messages = _json(messages_blob)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        result.add_problem(f"{where}: messages are not a list of chat messages; skipped")
        return None
    metadata = _json(metadata_blob) if metadata_blob not in (None, "", b"") else {}
    if not isinstance(metadata, dict):
        result.add_problem(f"{where}: metadata is not an object; skipped")
        return None
    sample = mapped(TRACKIO_TRACES, metadata)
    if sample["step"] is None:
        sample["step"] = 0 if step is None else as_step(step)  # SQLite reads a NaN step back as NULL
        if sample["step"] is None:
            result.add_problem(f"{where}: step {shown(step)} is not an integer; skipped")
            return None
    prompt, completion = split_messages(messages)
    if sample["prompt"] is None:
        sample["prompt"] = prompt
    if sample["completion"] is None:
        sample["completion"] = completion
    sample["extra"] = {
        "key": str(key),
        **({"trace_index": index} if index is not None else {}),
        **sample["extra"],
    }
    sample["wall_time"] = wall_time(stamp)
    return sample


def _json(blob: Any) -> Any:
    try:
        return loads_storable(blob)
    except (TypeError, ValueError, RecursionError):
        return None
