"""Histograms of observed runs in carl.db: one row per (run, key, step), its bucket edges and counts packed.

TensorBoard's `add_histogram`, Trackio's and W&B's `Histogram` arrive as a `Histogram` (engine/observe/
histograms.py makes one from each). Every statement on the `histograms` table is here: `add_histograms` for
the readers (inside their batch's transaction), `HistogramReads` for the explorer (read-only).

Bounded like rollouts: a run keeps at most KEYS_CAP histogram keys (a key past them is refused, and the reader
says so in one line), and a key at most STEPS_CAP steps; past that every other step but the newest goes, so
the whole run stays covered at half the resolution. At MAX_BUCKETS buckets of 16 bytes a row is at most 8 KiB,
typically one (64 buckets), so a run's histograms stay under a few hundred MiB in the worst case.
"""

from __future__ import annotations

import math
import sqlite3
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store

SCHEMA = 10  # the schema version that made the table
KEYS_CAP = 200  # histogram keys of one run
STEPS_CAP = 1000  # steps of one key kept; past it, every other older step goes
MAX_BUCKETS = 512  # buckets of one histogram (Trackio's own maximum); more are merged down to it


@dataclass(frozen=True)
class Histogram:
    """Counts over buckets: `edges` are n + 1 increasing finite numbers, `counts` n finite numbers >= 0."""

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return math.fsum(self.counts)

    @property
    def low(self) -> float:
        return self.edges[0]

    @property
    def high(self) -> float:
        return self.edges[-1]


HistogramRow = tuple[int, str, Histogram, float]  # (step, key, histogram, wall time)


def pack(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def unpack(blob: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(blob) // 8}d", blob[: len(blob) // 8 * 8])


# -- writing ----------------------------------------------------------------------------------------------


def run_keys(conn: sqlite3.Connection, run_id: int, limit: int = KEYS_CAP + 1) -> list[str]:
    """The run's histogram keys in order, at most `limit`: one primary-key seek per key (a skip scan)."""
    keys: list[str] = []
    key = ""
    while len(keys) < limit:
        row = conn.execute(
            "SELECT min(key) FROM histograms WHERE run_id=? AND key>?", (run_id, key)
        ).fetchone()
        if row[0] is None:
            break
        key = row[0]
        keys.append(key)
    return keys


def add_histograms(store: Store, run_id: int, rows: Sequence[HistogramRow]) -> tuple[int, list[str]]:
    """Store a run's histograms (a (key, step) already stored is left as it is: a source read again adds
    nothing twice); returns (rows added, the keys refused because the run has KEYS_CAP keys already). Call
    inside the batch's transaction. Keys that outgrow STEPS_CAP are thinned."""
    if not rows:
        return 0, []
    conn = store.conn
    have = set(run_keys(conn, run_id))
    refused: list[str] = []
    batch = []
    for step, key, histogram, wall in rows:
        if key not in have:
            if len(have) >= KEYS_CAP:
                if key not in refused:
                    refused.append(key)
                continue
            have.add(key)
        batch.append((run_id, key, int(step), pack(histogram.edges), pack(histogram.counts), float(wall)))
    with store.transaction():
        before = conn.total_changes
        conn.executemany(
            "INSERT OR IGNORE INTO histograms (run_id, key, step, edges, counts, wall_time)"
            " VALUES (?,?,?,?,?,?)",
            batch,
        )
        added = conn.total_changes - before
        if added:
            for key in {row[1] for row in batch}:
                thin(conn, run_id, key)
            # the run moved: a reader following it (the explorer) looks again
            conn.execute("UPDATE runs SET last_update=? WHERE id=?", (time.time(), run_id))
    return added, refused


def thin(conn: sqlite3.Connection, run_id: int, key: str, cap: int = STEPS_CAP) -> int:
    """Past `cap` steps of a key, every other step but the newest goes (the 2nd, 4th, ... oldest); returns
    rows removed."""
    count = conn.execute(
        "SELECT count(*) FROM histograms WHERE run_id=? AND key=?", (run_id, key)
    ).fetchone()[0]
    if count <= cap:
        return 0
    return conn.execute(
        "DELETE FROM histograms WHERE run_id=? AND key=? AND step IN (SELECT step FROM (SELECT step,"
        " row_number() OVER (ORDER BY step) AS r FROM histograms WHERE run_id=? AND key=?)"
        " WHERE r % 2 = 0 AND r < ?)",
        (run_id, key, run_id, key, count),
    ).rowcount


# -- reading ----------------------------------------------------------------------------------------------


@dataclass
class HistogramSeries:
    """A key's histograms over steps, oldest first (a sample of them when the key has more than were read)."""

    steps: list[int] = field(default_factory=list)
    histograms: list[Histogram] = field(default_factory=list)
    stored: int = 0  # steps the store holds for the key

    def __len__(self) -> int:
        return len(self.steps)


class HistogramReads:
    """The explorer's reads of histograms (read-only). A store older than schema 10 has none."""

    def __init__(self, conn: sqlite3.Connection, version: int) -> None:
        self.conn = conn
        self.present = version >= SCHEMA

    def keys(self, run_id: int) -> list[str]:
        return run_keys(self.conn, run_id, KEYS_CAP) if self.present else []

    def series(self, run_id: int, key: str, *, max_steps: int = 512) -> HistogramSeries:
        """The key's histograms, at most `max_steps` of them spread evenly over its steps (the first and the
        newest always among them)."""
        if not self.present:
            return HistogramSeries()
        steps = [
            int(r[0])
            for r in self.conn.execute(
                "SELECT step FROM histograms WHERE run_id=? AND key=? ORDER BY step", (run_id, key)
            )
        ]
        chosen = spread(steps, max_steps)
        out = HistogramSeries(stored=len(steps))
        for start in range(0, len(chosen), 400):
            part = chosen[start : start + 400]
            marks = ",".join("?" * len(part))
            for step, edges, counts in self.conn.execute(
                f"SELECT step, edges, counts FROM histograms WHERE run_id=? AND key=? AND step IN ({marks})"
                " ORDER BY step",
                (run_id, key, *part),
            ):
                out.steps.append(int(step))
                out.histograms.append(Histogram(unpack(edges), unpack(counts)))
        return out

    def latest_step(self, run_id: int, key: str) -> int | None:
        if not self.present:
            return None
        row = self.conn.execute(
            "SELECT max(step) FROM histograms WHERE run_id=? AND key=?", (run_id, key)
        ).fetchone()
        return None if row[0] is None else int(row[0])


def spread(values: Sequence[int], count: int) -> list[int]:
    """At most `count` of `values` (in order), evenly spaced, the first and the last among them."""
    n = len(values)
    if n <= count:
        return list(values)
    if count <= 1:
        return [values[-1]]
    picked = sorted({round(i * (n - 1) / (count - 1)) for i in range(count)})
    return [values[i] for i in picked]
