"""The box in carl.db, read: nodes, their newest samples and series over time, runs' processes and consoles.

Used by `StoreReader` (read-only), the engine's health rules and the diagnosis digest. A store older than
schema 9 has none of these tables: every read answers empty there.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .system import ROLLUP_WIDTHS, run_dir

SCHEMA = 9  # the schema version that made these tables
MAX_PROCESSES = 500  # processes of a run read at once (live ones first): a table, not an archive
STEP_KEYS = ("loss", "reward", "phi/mean", "learning_rate")  # a run's steps are read along one of these


@dataclass
class TimeSeries:
    """A node's series over wall time: raw samples (n == 1 each) or rollup buckets (their mean, min and
    max)."""

    t: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    vmin: list[float] = field(default_factory=list)
    vmax: list[float] = field(default_factory=list)
    width: int = 0  # seconds per bucket; 0 = raw samples

    def __len__(self) -> int:
        return len(self.t)

    @property
    def latest(self) -> float | None:
        return self.mean[-1] if self.mean else None


class SystemReads:
    def __init__(self, conn: sqlite3.Connection, version: int) -> None:
        self.conn = conn
        self.ready = version >= SCHEMA

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        if not self.ready:
            return []
        cur = self.conn.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def signature(self) -> tuple[Any, ...]:
        """Moves when a sample, a node's state, a process or a finding changed (a few index reads)."""
        if not self.ready:
            return ()
        return tuple(
            self.conn.execute(
                "SELECT (SELECT max(t) FROM system_now), (SELECT group_concat(state) FROM nodes),"
                " (SELECT max(seen_at) FROM run_processes), (SELECT count(ended_at) FROM run_processes),"
                " (SELECT max(id) FROM console_findings), (SELECT count(*) FROM run_consoles)"
            ).fetchone()
        )

    def nodes(self) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT id, name, host, via, state, info, note, first_seen, last_seen, lost_at FROM nodes"
            " ORDER BY id"
        )
        for row in rows:
            row["info"] = _json(row["info"], {})
        return rows

    def node_consoles(self, node_id: int | None = None) -> list[dict[str, Any]]:
        """The consoles nodes follow (one node's, or every node's): the file under $CARL_HOME/nodes/ that
        holds their lines, the path on the node, the run they belong to."""
        where = "" if node_id is None else " WHERE c.node_id=?"
        return self._rows(
            "SELECT c.id, c.node_id, n.name AS node, c.name, c.source, c.path, c.run_id, c.lines, c.length,"
            f" c.updated_at FROM node_consoles c JOIN nodes n ON n.id = c.node_id{where} ORDER BY c.id",
            () if node_id is None else (node_id,),
        )

    def node_rejected(self, limit: int = 20) -> list[dict[str, Any]]:
        """What nodes sent that could not be stored, newest first, with the reason."""
        return self._rows(
            "SELECT id, node, subject, reason, payload, received_at FROM node_rejected"
            " ORDER BY id DESC LIMIT ?",
            (limit,),
        )

    def now(self) -> dict[int, dict[str, Any]]:
        """Each node's newest whole sample, by node id."""
        rows = self._rows("SELECT node_id, t, sample FROM system_now")
        return {r["node_id"]: _json(r["sample"], {}) for r in rows}

    def keys(self, node_id: int) -> list[str]:
        """The node's series, by a skip scan of the primary key."""
        if not self.ready:
            return []
        keys: list[str] = []
        key = ""
        while True:
            row = self.conn.execute(
                "SELECT min(key) FROM system_rollups WHERE node_id=? AND key>?", (node_id, key)
            ).fetchone()
            if row[0] is None:
                return keys
            key = row[0]
            keys.append(key)

    def series(
        self, node_id: int, key: str, since: float, until: float, *, max_points: int = 1000
    ) -> TimeSeries:
        """`key` of a node between two wall times: raw samples when the window holds few enough, else the
        finest rollup that brings it under `max_points` buckets."""
        out = TimeSeries()
        if not self.ready:
            return out
        raw = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM system_samples WHERE node_id=? AND key=?"
            " AND t BETWEEN ? AND ? LIMIT ?)",
            (node_id, key, since, until, max_points + 1),
        ).fetchone()[0]
        oldest_raw, oldest = self.conn.execute(
            "SELECT (SELECT min(t) FROM system_samples WHERE node_id=? AND key=?),"
            " (SELECT min(bucket) FROM system_rollups WHERE node_id=? AND key=? AND width=?)",
            (node_id, key, node_id, key, ROLLUP_WIDTHS[0]),
        ).fetchone()
        # Raw samples answer when they reach back to the window's start (or to the series' own start).
        start = max(since, (oldest or 0) * ROLLUP_WIDTHS[0])
        if raw <= max_points and oldest_raw is not None and oldest_raw <= start + ROLLUP_WIDTHS[0]:
            for t, value in self.conn.execute(
                "SELECT t, value FROM system_samples WHERE node_id=? AND key=? AND t BETWEEN ? AND ?"
                " ORDER BY t",
                (node_id, key, since, until),
            ):
                out.t.append(t)
                out.mean.append(value)
                out.vmin.append(value)
                out.vmax.append(value)
            return out
        span = max(until - since, 1.0)
        width = next((w for w in ROLLUP_WIDTHS if span / w <= max_points), ROLLUP_WIDTHS[-1])
        out.width = width
        for last_t, mean, vmin, vmax in self.conn.execute(
            "SELECT last_t, vsum / n, vmin, vmax FROM system_rollups WHERE node_id=? AND key=? AND width=?"
            " AND bucket BETWEEN ? AND ? ORDER BY bucket",
            (node_id, key, width, int(since // width), int(until // width)),
        ):
            out.t.append(last_t)
            out.mean.append(mean)
            out.vmin.append(vmin)
            out.vmax.append(vmax)
        return out

    def span(self, node_id: int) -> tuple[float, float] | None:
        """The first and last wall time the node has samples for (rollups included)."""
        if not self.ready:
            return None
        row = self.conn.execute(
            "SELECT min(bucket) * ?, (SELECT t FROM system_now WHERE node_id=?) FROM system_rollups"
            " WHERE node_id=? AND width=?",
            (ROLLUP_WIDTHS[-1], node_id, node_id, ROLLUP_WIDTHS[-1]),
        ).fetchone()
        return None if row is None or row[0] is None or row[1] is None else (float(row[0]), float(row[1]))

    # -- runs -----------------------------------------------------------------------------------------------

    def run_processes(self, run_id: int, limit: int = MAX_PROCESSES) -> list[dict[str, Any]]:
        """The run's processes, live ones first, each with its node's name (at most `limit`)."""
        rows = self._rows(
            "SELECT p.id, p.node_id, n.name AS node, p.pid, p.started, p.role, p.rank, p.cmdline, p.state,"
            " p.cpu, p.rss, p.gpu_mem, p.gpus, p.seen_at, p.ended_at, p.exit_code, p.signal, p.end_step,"
            " p.end_reason, p.died"
            " FROM run_processes p LEFT JOIN nodes n ON n.id = p.node_id WHERE p.run_id=?"
            " ORDER BY p.ended_at IS NOT NULL, coalesce(p.rank, -1), p.id LIMIT ?",
            (run_id, limit),
        )
        for row in rows:
            row["gpus"] = _json(row["gpus"], None)
        return rows

    def run_context(self, run_id: int) -> dict[str, Any] | None:
        """What the box rules need of a run: its status, when it was made and ended, its last step, and
        the directory it writes in (`dir`, as the engine watches it)."""
        rows = self._rows(
            "SELECT status, created_at, ended_at, last_step, error, output_dir, source_path FROM runs"
            " WHERE id=?",
            (run_id,),
        )
        if not rows:
            return None
        run = rows[0]
        run["dir"] = run_dir(run.pop("output_dir"), run.pop("source_path"))
        return run

    def run_consoles(self, run_id: int) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT c.id, c.node_id, n.name AS node, c.path, c.kind, c.scanned, c.added_at"
            " FROM run_consoles c LEFT JOIN nodes n ON n.id = c.node_id WHERE c.run_id=? ORDER BY c.id",
            (run_id,),
        )

    def findings(self, run_id: int, limit: int = 20) -> list[dict[str, Any]]:
        """What the console scan found for the run, newest first."""
        return self._rows(
            "SELECT f.id, f.console_id, c.path, f.kind, f.offset, f.line, f.line_no, f.t"
            " FROM console_findings f JOIN run_consoles c ON c.id = f.console_id"
            " WHERE f.run_id=? ORDER BY f.id DESC LIMIT ?",
            (run_id, limit),
        )

    # -- what the System pane and screen need besides --------------------------------------------------------

    def sample_interval(self, node_id: int) -> float | None:
        """Seconds between the node's two newest samples (its sampling interval, as it samples now); None
        before its second sample. Two seeks along the primary key."""
        if not self.ready:
            return None
        rows = self.conn.execute(
            "SELECT t FROM system_samples WHERE node_id=? AND key='cpu/percent' ORDER BY t DESC LIMIT 2",
            (node_id,),
        ).fetchall()
        return rows[0][0] - rows[1][0] if len(rows) == 2 and rows[0][0] > rows[1][0] else None

    def run_dir(self, run_id: int) -> str | None:
        """The directory a run writes in, as the engine watches its disk: our run's output directory, an
        observed run's source folder (SystemTables.running_run_dirs)."""
        row = self.conn.execute("SELECT output_dir, source_path FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            return None
        output_dir, source_path = row
        if output_dir:
            return str(output_dir)
        if source_path:
            path = Path(source_path)
            return str(path if path.is_dir() else path.parent)
        return None

    def run_steps(
        self, run_id: int, since: float, until: float, *, max_points: int = 200
    ) -> list[tuple[int, float]]:
        """(step, wall time) of the run's steps written between two wall times: every one when there are at
        most `max_points`, else `max_points` spread evenly over the steps. What lines the box's charts up with
        the run (the System screen). The steps are found along one key's index, bisecting on wall time (a
        run writes its steps in time order), so the cost grows with `max_points`, not with the run."""
        key = self._step_key(run_id)
        if key is None or until < since:
            return []
        low, high = self.conn.execute(
            "SELECT min(step), max(step) FROM metrics WHERE run_id=? AND key=?", (run_id, key)
        ).fetchone()
        if low is None:
            return []
        first = self._first_step_at(run_id, key, since, low, high)
        last = self._first_step_at(run_id, key, math.nextafter(until, math.inf), low, high)
        last = high if last is None else last - 1  # the step before the first one past `until`
        if first is None or last < first:
            return []
        count = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM metrics WHERE run_id=? AND key=? AND step BETWEEN ? AND ?"
            " LIMIT ?)",
            (run_id, key, first, last, max_points + 1),
        ).fetchone()[0]
        if count <= max_points:
            rows = self.conn.execute(
                "SELECT step, wall_time FROM metrics WHERE run_id=? AND key=? AND step BETWEEN ? AND ?"
                " AND wall_time IS NOT NULL ORDER BY step",
                (run_id, key, first, last),
            ).fetchall()
            return [(int(step), float(t)) for step, t in rows]
        out: list[tuple[int, float]] = []
        for i in range(max_points):
            row = self._step_from(run_id, key, first + (last - first) * i // (max_points - 1))
            if row is not None and row[1] is not None and (not out or row[0] > out[-1][0]):
                out.append((int(row[0]), float(row[1])))
        return out

    def _step_key(self, run_id: int) -> str | None:
        for key in STEP_KEYS:
            if self.conn.execute(
                "SELECT 1 FROM metrics WHERE run_id=? AND key=? LIMIT 1", (run_id, key)
            ).fetchone():
                return key
        row = self.conn.execute("SELECT min(key) FROM metrics WHERE run_id=?", (run_id,)).fetchone()
        return row[0] if row else None

    def _step_from(self, run_id: int, key: str, step: int) -> tuple[int, float | None] | None:
        """The first (step, wall time) of `key` at or after `step`."""
        return self.conn.execute(
            "SELECT step, wall_time FROM metrics WHERE run_id=? AND key=? AND step>=? ORDER BY step LIMIT 1",
            (run_id, key, step),
        ).fetchone()

    def _first_step_at(self, run_id: int, key: str, t: float, low: int, high: int) -> int | None:
        """The first step written at or after wall time `t` (None: none was), by bisection over steps."""
        found = None
        while low <= high:
            middle = (low + high) // 2
            row = self._step_from(run_id, key, middle)
            if row is None:
                high = middle - 1
            elif row[1] is not None and row[1] >= t:
                found, high = int(row[0]), middle - 1
            else:
                low = int(row[0]) + 1
        return found

    def last_write(self, run_id: int) -> float | None:
        """When the run last had a row written (runs.last_update): whether it went on after a finding."""
        rows = self._rows("SELECT last_update FROM runs WHERE id=?", (run_id,))
        return rows[0]["last_update"] if rows else None


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default
