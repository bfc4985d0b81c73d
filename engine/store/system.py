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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.text import one_line, storable

from .base import in_chunks, inserted_id

if TYPE_CHECKING:
    from .db import Store

RAW_KEEP_S = 6 * 3600.0  # raw samples of a series: the newest six hours ...
RAW_MAX_PER_SERIES = 10_800  # ... and at most this many (six hours at 2 s; 18 minutes at 10 a second)
ROLLUP_WIDTHS = (60, 900)  # seconds per bucket: a minute, a quarter of an hour
ROLLUP_KEEP_S = {60: 7 * 86400.0, 900: 90 * 86400.0}  # a week of minutes, a quarter of quarter-hours
CMDLINE_CHARS = 300
REJECTED_KEEP = 10_000  # rows of node_rejected kept, the newest: a node sending garbage cannot fill the disk
REJECTED_PAYLOAD_CHARS = 2000  # of a rejected message, its first characters are kept to show what it was


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


def run_dir(output_dir: str | None, source_path: str | None) -> str | None:
    """Where a run writes: our run's output directory, else the folder of an observed run's source (the
    source itself when it is a directory). The disks watched and the processes looked for are its."""
    if output_dir:
        return output_dir
    if not source_path:
        return None
    path = Path(source_path)
    return str(path if path.is_dir() else path.parent)


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
                return inserted_id(cur)
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

    def node_for(self, name: str, *, create: bool) -> int | None:
        """The id of the node called `name`, its state untouched; with `create`, a node this machine's engine
        samples (via local) is made when there is none yet (a run started before the engine ever sampled)."""
        name = storable(one_line(name, 200))
        with self.store.transaction():
            row = self.conn.execute("SELECT id FROM nodes WHERE name=?", (name,)).fetchone()
            if row is not None or not create:
                return None if row is None else int(row[0])
            now = time.time()
            cur = self.conn.execute(
                "INSERT INTO nodes (name, host, via, state, info, first_seen, last_seen)"
                " VALUES (?,?, 'local', 'live', '{}', ?, ?)",
                (name, name, now, now),
            )
            return inserted_id(cur)

    def nodes(self) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT id, name, host, via, state, note, last_seen FROM nodes ORDER BY id")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # -- nodes heard over NATS (engine/nodes/writer.py) ------------------------------------------------------

    def node_row(self, name: str) -> tuple[int, str, str] | None:
        """(id, via, state) of the node named `name`; None when there is none."""
        row = self.conn.execute("SELECT id, via, state FROM nodes WHERE name=?", (name,)).fetchone()
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def node_count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM nodes").fetchone()[0])

    def node_heard(self, node_id: int) -> None:
        """A node that sent a sample is live (again, after lost or stopped), its note what its hello said."""
        self.conn.execute(
            "UPDATE nodes SET state='live', lost_at=NULL, note=json_extract(info, '$.note')"
            " WHERE id=? AND state!='live'",
            (node_id,),
        )

    def lose_silent_nodes(self, before: float, note: str) -> list[str]:
        """Mark lost the live nodes heard over NATS whose newest sample was stored before `before` (wall
        time), with `note`; returns their names. Read first (no write lock while every node speaks), then
        each marked only if still silent: a sample the consumer's own connection stored meanwhile keeps its
        node live."""
        silent = self.conn.execute(
            "SELECT id, name FROM nodes WHERE via='nats' AND state='live' AND last_seen<?", (before,)
        ).fetchall()
        lost = []
        if silent:
            with self.store.transaction():
                for node_id, name in silent:
                    changed = self.conn.execute(
                        "UPDATE nodes SET state='lost', note=?, lost_at=? WHERE id=? AND state='live'"
                        " AND last_seen<?",
                        (storable(one_line(note, 300)), time.time(), node_id, before),
                    ).rowcount
                    if changed:
                        lost.append(str(name))
        return lost

    def reject_node_message(self, node: str | None, subject: str, reason: str, payload: bytes | str) -> None:
        """What a node sent that cannot be stored: its one-line reason and its first characters, as text. The
        newest REJECTED_KEEP rows are kept."""
        text = (
            payload
            if isinstance(payload, str)
            else payload[: 4 * REJECTED_PAYLOAD_CHARS].decode(errors="replace")
        )
        with self.store.transaction():
            cur = self.conn.execute(
                "INSERT INTO node_rejected (node, subject, reason, payload, received_at) VALUES (?,?,?,?,?)",
                (
                    node and storable(one_line(node, 200)),
                    storable(one_line(subject, 200)),
                    storable(one_line(reason, 500)),
                    storable(text[:REJECTED_PAYLOAD_CHARS]),
                    time.time(),
                ),
            )
            newest = inserted_id(cur)
            if newest % 100 == 0:  # now and then, not per row: the newest REJECTED_KEEP stay
                self.conn.execute("DELETE FROM node_rejected WHERE id<=?", (newest - REJECTED_KEEP,))

    def node_console(self, node_id: int, name: str) -> dict[str, Any] | None:
        cur = self.conn.execute(
            "SELECT id, node_id, name, source, path, run_id, epoch, n, length, lines FROM node_consoles"
            " WHERE node_id=? AND name=?",
            (node_id, name),
        )
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))

    def node_console_count(self, node_id: int) -> int:
        return int(
            self.conn.execute("SELECT count(*) FROM node_consoles WHERE node_id=?", (node_id,)).fetchone()[0]
        )

    def add_node_console(self, node_id: int, name: str, source: str, directory: Path) -> dict[str, Any]:
        """A console a node follows, its file `directory/console-<id>.log` (named by its id, never its
        name)."""
        with self.store.transaction():
            cur = self.conn.execute(
                "INSERT INTO node_consoles (node_id, name, source, path, updated_at) VALUES (?,?,?, '', ?)",
                (node_id, storable(name), storable(one_line(source, 500)), time.time()),
            )
            console_id = inserted_id(cur)
            path = str(directory / f"console-{console_id}.log")
            self.conn.execute("UPDATE node_consoles SET path=? WHERE id=?", (storable(path), console_id))
        found = self.node_console(node_id, name)
        assert found is not None
        return found

    def node_console_written(
        self, console_id: int, *, epoch: str, n: int, length: int, lines: int, source: str
    ) -> None:
        self.conn.execute(
            "UPDATE node_consoles SET epoch=?, n=?, length=?, lines=lines+?, source=?, updated_at=?"
            " WHERE id=?",
            (storable(epoch), n, length, lines, storable(one_line(source, 500)), time.time(), console_id),
        )

    def node_console_run(self, console_id: int, run_id: int) -> None:
        self.conn.execute("UPDATE node_consoles SET run_id=? WHERE id=?", (run_id, console_id))

    def run_named(self, name: str) -> int | None:
        row = self.conn.execute("SELECT id FROM runs WHERE name=?", (name,)).fetchone()
        return None if row is None else int(row[0])

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """One message's rows inside the caller's transaction, undone alone when it raises."""
        with self.store.transaction():
            self.conn.execute("SAVEPOINT node_message")
            try:
                yield
            except BaseException:
                self.conn.execute("ROLLBACK TO node_message")
                raise
            finally:
                self.conn.execute("RELEASE node_message")

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
        return sorted({run["dir"] for run in self.running_runs() if run["dir"]})

    def running_runs(self) -> list[dict[str, Any]]:
        """The runs that are running or paused: id, source kind, status and the directory it writes in
        (`run_dir`)."""
        rows = self.conn.execute(
            "SELECT id, source_kind, status, output_dir, source_path FROM runs"
            " WHERE status IN ('running', 'paused') ORDER BY id"
        ).fetchall()
        return [
            {"id": run_id, "source_kind": kind, "status": status, "dir": run_dir(output_dir, source_path)}
            for run_id, kind, status, output_dir, source_path in rows
        ]

    def run_state(self, run_id: int) -> dict[str, Any] | None:
        """What deciding a process's end needs of its run: status, last step, error."""
        row = self.conn.execute("SELECT status, last_step, error FROM runs WHERE id=?", (run_id,)).fetchone()
        return None if row is None else {"status": row[0], "last_step": row[1], "error": row[2]}

    # -- processes of runs ----------------------------------------------------------------------------------

    def note_processes(self, run_id: int, node_id: int, rows: Iterable[ProcessRow]) -> None:
        """The run's processes as seen now: new ones added, known ones updated (an ended one stays ended)."""
        from engine.redact import redact  # here: a reader of the store never needs it

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
                        storable(one_line(redact(p.cmdline), CMDLINE_CHARS)),  # argv may hold a key
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
        died: bool = False,
    ) -> bool:
        """Record a process's end (once). An exact status (an exit code or a signal) also replaces an end
        recorded as unknown: the launcher's report of a rank may come after the engine gave up waiting for it;
        the end keeps the time it was first seen. Returns whether the row changed."""
        from engine.redact import redact  # here: a reader of the store never needs it

        exact = exit_code is not None or signal is not None
        with self.store.transaction():
            cur = self.conn.execute(
                "UPDATE run_processes SET state='ended', ended_at=coalesce(ended_at, ?), exit_code=?,"
                " signal=?, end_step=coalesce(?, end_step), end_reason=?, died=?, seen_at=? WHERE id=?"
                " AND (ended_at IS NULL OR (? AND exit_code IS NULL AND signal IS NULL))",
                (
                    ended_at or time.time(),
                    exit_code,
                    signal,
                    end_step,
                    storable(one_line(redact(reason), 300)),
                    int(died),
                    time.time(),
                    process_id,
                    int(exact),
                ),
            )
            return cur.rowcount > 0

    def open_processes(
        self, node_id: int | None = None, *, run_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Processes not known to have ended (on one node, or all; of one run, or all)."""
        where = "ended_at IS NULL"
        params: list[int] = []
        if node_id is not None:
            where, params = where + " AND node_id=?", [*params, node_id]
        if run_id is not None:
            where, params = where + " AND run_id=?", [*params, run_id]
        cur = self.conn.execute(
            "SELECT id, run_id, node_id, pid, started, role, rank, cmdline, state, seen_at FROM run_processes"
            f" WHERE {where} ORDER BY id",
            params,
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def process_of(self, run_id: int, pid: int) -> dict[str, Any] | None:
        """The run's newest process row with this pid (ended or not): id, rank, role, started, ended_at,
        exit_code, signal."""
        cur = self.conn.execute(
            "SELECT id, rank, role, started, ended_at, exit_code, signal FROM run_processes"
            " WHERE run_id=? AND pid=? ORDER BY started DESC LIMIT 1",
            (run_id, pid),
        )
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))

    def ends_written_since(self, t: float) -> list[int]:
        """The runs whose processes' ends were recorded (or made exact) at or after wall time `t`."""
        rows = self.conn.execute(
            "SELECT DISTINCT run_id FROM run_processes WHERE ended_at IS NOT NULL AND seen_at >= ?", (t,)
        ).fetchall()
        return [r[0] for r in rows]

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
        the run a training process it started became (engine/console/console_job.py)."""
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
