"""The box in carl.db, written: nodes, their system samples, the processes of runs, their consoles and
findings.

Every statement on these tables is here (and in system_reads.py for reading). Samples are bounded like
metrics: a series keeps its raw samples for the newest RAW_KEEP_S (at most RAW_MAX_PER_SERIES of them), and
minute and quarter-hour rollups, folded in as each sample is stored, for the windows beyond; `thin` removes
what is older, oldest first, never a node's newest sample (docs/guide/system.md).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.text import one_line, storable

from .base import in_chunks

if TYPE_CHECKING:
    from .db import Store

RAW_KEEP_S = 6 * 3600.0  # raw samples of a series: the newest six hours ...
RAW_MAX_PER_SERIES = 10_800  # ... and at most this many (six hours at 2 s; 18 minutes at 10 a second)
ROLLUP_WIDTHS = (60, 900)  # seconds per bucket: a minute, a quarter of an hour
ROLLUP_KEEP_S = {60: 7 * 86400.0, 900: 90 * 86400.0}  # a week of minutes, a quarter of quarter-hours
CMDLINE_CHARS = 300


@dataclass
class ProcessRow:
    """A process of a run as the engine saw it now (what `note_processes` stores)."""

    pid: int
    started: float  # its start time (psutil's create_time)
    role: str  # runner | launcher | rank | observed
    state: str
    cmdline: str = ""
    rank: int | None = None
    cpu: float | None = None
    rss: int | None = None
    gpu_mem: int | None = None
    gpus: list[int] | None = None


class SystemTables:
    """The writer of the box's tables, on a `Store`'s connection and transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.conn = store.conn

    # -- nodes ----------------------------------------------------------------------------------------------

    def node(self, name: str, *, host: str, via: str, info: dict[str, Any] | None = None) -> int:
        """The node's id, made on first sight; it is live from now on (a lost node that speaks again is
        back)."""
        now = time.time()
        name, host = storable(one_line(name, 200)), storable(one_line(host, 200))
        with self.store.transaction():
            row = self.conn.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()
            if row is None:
                cur = self.conn.execute(
                    "INSERT INTO nodes (name, host, via, state, info, first_seen, last_seen)"
                    " VALUES (?,?,?, 'live', ?, ?, ?)",
                    (name, host, via, json.dumps(info or {}), now, now),
                )
                return int(cur.lastrowid)  # type: ignore[arg-type]
            sets = "host=?, via=?, state='live', lost_at=NULL, note=NULL, last_seen=?"
            params: list[Any] = [host, via, now]
            if info is not None:
                sets += ", info=?"
                params.append(json.dumps(info))
            self.conn.execute(f"UPDATE nodes SET {sets} WHERE id=?", (*params, row[0]))
            return int(row[0])

    def set_node_state(self, node_id: int, state: str, note: str | None = None) -> None:
        """live, lost (with the reason) or stopped; what it sent stays."""
        lost_at = time.time() if state == "lost" else None
        with self.store.transaction():
            self.conn.execute(
                "UPDATE nodes SET state=?, note=?, lost_at=coalesce(?, lost_at) WHERE id=?",
                (state, note and storable(one_line(note, 300)), lost_at, node_id),
            )

    def set_node_note(self, node_id: int, note: str | None) -> None:
        with self.store.transaction():
            self.conn.execute("UPDATE nodes SET note=? WHERE id=?", (note and one_line(note, 300), node_id))

    def nodes(self) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT id, name, host, via, state, note, last_seen FROM nodes ORDER BY id")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # -- samples --------------------------------------------------------------------------------------------

    def add_sample(self, node_id: int, t: float, scalars: dict[str, float], whole: dict[str, Any]) -> None:
        """One sample of a node: its series' values at `t`, folded into the rollups, and the whole sample as
        the node's newest. A sample at a time already stored adds nothing twice."""
        rows = [(node_id, key, t, value) for key, value in scalars.items() if math.isfinite(value)]
        with self.store.transaction():
            before = self.conn.total_changes
            self.conn.executemany(
                "INSERT OR IGNORE INTO system_samples (node_id, key, t, value) VALUES (?,?,?,?)", rows
            )
            if self.conn.total_changes - before == len(rows):
                self._merge_rollups(rows)
            self.conn.execute(
                "INSERT INTO system_now (node_id, t, sample) VALUES (?,?,?) ON CONFLICT (node_id) DO UPDATE"
                " SET t=excluded.t, sample=excluded.sample WHERE excluded.t >= system_now.t",
                (node_id, t, json.dumps(whole, allow_nan=False)),
            )
            self.conn.execute(
                "UPDATE nodes SET last_seen=max(last_seen, ?) WHERE id=?", (time.time(), node_id)
            )

    def _merge_rollups(self, rows: list[tuple[int, str, float, float]]) -> None:
        upserts = [
            (node_id, key, width, int(t // width), value, value, value, t, value)
            for node_id, key, t, value in rows
            for width in ROLLUP_WIDTHS
        ]
        self.conn.executemany(
            """
            INSERT INTO system_rollups (node_id, key, width, bucket, n, vmin, vmax, vsum, last_t, last_value)
            VALUES (?,?,?,?, 1, ?,?,?,?,?)
            ON CONFLICT (node_id, key, width, bucket) DO UPDATE SET
                n = n + 1,
                vmin = min(vmin, excluded.vmin),
                vmax = max(vmax, excluded.vmax),
                vsum = vsum + excluded.vsum,
                last_value = CASE WHEN excluded.last_t >= last_t THEN excluded.last_value ELSE last_value END,
                last_t = max(last_t, excluded.last_t)
            """,
            upserts,
        )

    def thin(self) -> int:
        """Remove raw samples and rollups past what is kept, per node, relative to its newest sample (a node
        that went quiet keeps what it last sent). Returns the rows removed."""
        removed = 0
        nodes = self.conn.execute("SELECT node_id, t FROM system_now").fetchall()
        with self.store.transaction():
            for node_id, newest in nodes:
                cutoff = newest - RAW_KEEP_S
                # The RAW_MAX_PER_SERIES-th newest sample time of the node's CPU series bounds every series of
                # it (they are sampled together).
                row = self.conn.execute(
                    "SELECT t FROM system_samples WHERE node_id=? AND key='cpu/percent' ORDER BY t DESC"
                    " LIMIT 1 OFFSET ?",
                    (node_id, RAW_MAX_PER_SERIES - 1),
                ).fetchone()
                if row is not None:
                    cutoff = max(cutoff, row[0])
                removed += self.conn.execute(
                    "DELETE FROM system_samples WHERE node_id=? AND t<?", (node_id, cutoff)
                ).rowcount
                for width, keep in ROLLUP_KEEP_S.items():
                    removed += self.conn.execute(
                        "DELETE FROM system_rollups WHERE node_id=? AND width=? AND bucket<?",
                        (node_id, width, int((newest - keep) // width)),
                    ).rowcount
        return removed

    def running_run_dirs(self) -> list[str]:
        """The directories of the runs that are running or paused: our runs' output directories, and the
        folder of an observed run's source."""
        rows = self.conn.execute(
            "SELECT output_dir, source_path FROM runs WHERE status IN ('running', 'paused')"
        ).fetchall()
        out = []
        for output_dir, source_path in rows:
            if output_dir:
                out.append(output_dir)
            elif source_path:
                path = Path(source_path)
                out.append(str(path if path.is_dir() else path.parent))
        return sorted(set(out))

    # -- processes of runs ----------------------------------------------------------------------------------

    def note_processes(self, run_id: int, node_id: int, rows: Iterable[ProcessRow]) -> None:
        """The run's processes as seen now: new ones added, known ones updated (an ended one stays ended)."""
        now = time.time()
        with self.store.transaction():
            for p in rows:
                self.conn.execute(
                    "INSERT INTO run_processes (run_id, node_id, pid, started, role, rank, cmdline, state,"
                    " cpu, rss, gpu_mem, gpus, seen_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (run_id, node_id, pid, started) DO UPDATE SET state=excluded.state,"
                    " cpu=excluded.cpu, rss=excluded.rss, gpu_mem=excluded.gpu_mem, gpus=excluded.gpus,"
                    " seen_at=excluded.seen_at, role=excluded.role, rank=coalesce(excluded.rank, rank)"
                    " WHERE ended_at IS NULL",
                    (
                        run_id,
                        node_id,
                        p.pid,
                        p.started,
                        p.role,
                        p.rank,
                        storable(one_line(p.cmdline, CMDLINE_CHARS)),
                        p.state,
                        p.cpu,
                        p.rss,
                        p.gpu_mem,
                        json.dumps(p.gpus) if p.gpus is not None else None,
                        now,
                    ),
                )

    def process_ended(
        self,
        process_id: int,
        *,
        exit_code: int | None,
        signal: int | None,
        end_step: int | None,
        reason: str,
        ended_at: float | None = None,
    ) -> None:
        with self.store.transaction():
            self.conn.execute(
                "UPDATE run_processes SET state='ended', ended_at=?, exit_code=?, signal=?, end_step=?,"
                " end_reason=? WHERE id=? AND ended_at IS NULL",
                (
                    ended_at or time.time(),
                    exit_code,
                    signal,
                    end_step,
                    storable(one_line(reason, 300)),
                    process_id,
                ),
            )

    def open_processes(self, node_id: int | None = None) -> list[dict[str, Any]]:
        """Processes not known to have ended (on one node, or all)."""
        where = "ended_at IS NULL" + (" AND node_id=?" if node_id is not None else "")
        cur = self.conn.execute(
            "SELECT id, run_id, node_id, pid, started, role, rank, state, seen_at FROM run_processes"
            f" WHERE {where}",
            () if node_id is None else (node_id,),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # -- consoles and what was found in them ----------------------------------------------------------------

    def add_console(self, run_id: int, path: str, kind: str, node_id: int | None = None) -> int:
        """A log file of the run (idempotent per run and path)."""
        with self.store.transaction():
            self.conn.execute(
                "INSERT OR IGNORE INTO run_consoles (run_id, node_id, path, kind, added_at)"
                " VALUES (?,?,?,?,?)",
                (run_id, node_id, storable(path), kind, time.time()),
            )
            row = self.conn.execute(
                "SELECT id FROM run_consoles WHERE run_id=? AND path=?", (run_id, storable(path))
            ).fetchone()
            return int(row[0])

    def runs_updated_since(self, t: float) -> list[tuple[int, int]]:
        """(run id, pid) of the runs written to since `t` that have a pid: the engine looks among them for
        the run a training process it started became (engine/console/job.py)."""
        rows = self.conn.execute(
            "SELECT id, pid FROM runs WHERE updated_at >= ? AND pid IS NOT NULL ORDER BY id", (t,)
        ).fetchall()
        return [(int(r[0]), int(r[1])) for r in rows]

    def runs_of_sources(self, source_ids: Iterable[int]) -> dict[int, list[int]]:
        """Source id -> the ids of its runs."""
        ids = list(source_ids)
        out: dict[int, list[int]] = {i: [] for i in ids}
        for chunk, marks in in_chunks(ids):
            for run_id, source_id in self.conn.execute(
                f"SELECT id, source_id FROM runs WHERE source_id IN ({marks}) ORDER BY id", chunk
            ):
                out[source_id].append(run_id)
        return out

    def consoles(self) -> list[dict[str, Any]]:
        """Every console with its scan position (`identity` decoded)."""
        cur = self.conn.execute(
            "SELECT id, run_id, node_id, path, kind, scanned, identity FROM run_consoles ORDER BY id"
        )
        cols = [d[0] for d in cur.description]
        out = []
        for r in cur.fetchall():
            record = dict(zip(cols, r, strict=True))
            record["identity"] = json.loads(record["identity"]) if record["identity"] else None
            out.append(record)
        return out

    def save_console_scan(
        self,
        console_id: int,
        run_id: int,
        scanned: int,
        identity: dict[str, Any],
        findings: Iterable[tuple[str, int, str] | tuple[str, int, str, int | None]],
    ) -> int:
        """Where the scan of a console got to, and what it found there ((kind, offset, line[, line number])
        each), together. Returns the findings that were new."""
        now = time.time()
        with self.store.transaction():
            before = self.conn.total_changes
            self.conn.executemany(
                "INSERT OR IGNORE INTO console_findings (run_id, console_id, kind, offset, line, line_no, t)"
                " VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        console_id,
                        f[0],
                        f[1],
                        storable(one_line(f[2], 500)),
                        f[3] if len(f) > 3 else None,
                        now,
                    )
                    for f in findings
                ],
            )
            added = self.conn.total_changes - before
            self.conn.execute(
                "UPDATE run_consoles SET scanned=?, identity=? WHERE id=?",
                (scanned, json.dumps(identity), console_id),
            )
            return added
