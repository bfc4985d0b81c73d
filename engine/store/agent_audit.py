"""The agents plane's audit in carl.db: the event log (`agent_events`), its two summaries (`agent_tasks`,
`agent_workers`), the kv rows the audit keeps, and the commands the plane answers; and what the plane's other
processes read back of it (the manager a task it assigned, the trainer the verdict on each rollout).

Every write runs in the transaction of the audit's batch (engine/agents/audit.py opens it with
`Store.transaction`); the savepoints here let one message, or one optimistic insert, be taken back alone.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import connect, in_chunks

if TYPE_CHECKING:
    from .db import Store

INSERT_EVENT = (
    "INSERT INTO agent_events (subject, kind, task_id, manager_id, worker_id, score, payload, created_at,"
    " environment, model_version, stream_seq, stream_key, msg_id, received_at, status, reason)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
# The same, skipping a row whose stream key is stored already.
INSERT_UNSEEN_EVENT = INSERT_EVENT + " ON CONFLICT (stream_key) WHERE stream_key IS NOT NULL DO NOTHING"

EventRow = tuple[Any, ...]  # the 16 columns of INSERT_EVENT, in its order


class AgentAudit:
    """The audit's statements on the writer's connection."""

    def __init__(self, store: Store) -> None:
        self.conn = store.conn

    def stop_auto_checkpoint(self) -> None:
        """Checkpoints off the insert path: the audit runs them itself (`checkpoint`)."""
        self.conn.execute("PRAGMA wal_autocheckpoint=0")

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (PASSIVE: it never waits for a reader); sqlite3.Error when
        another connection is checkpointing."""
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    # -- the event log -----------------------------------------------------------------------------

    def insert_events(self, rows: Iterable[EventRow]) -> None:
        self.conn.executemany(INSERT_EVENT, rows)

    def insert_event(self, row: EventRow) -> None:
        self.conn.execute(INSERT_EVENT, row)

    def insert_unseen_events(self, rows: Sequence[EventRow]) -> bool:
        """Insert `rows` in one statement, skipping stream keys stored already; True when every row went in,
        else (one was stored: a redelivered batch) none did."""
        before = self.conn.total_changes
        self.conn.execute("SAVEPOINT audit_batch")
        try:
            self.conn.executemany(INSERT_UNSEEN_EVENT, rows)
            if self.conn.total_changes - before == len(rows):
                return True
            self.conn.execute("ROLLBACK TO audit_batch")
        except BaseException:
            self.conn.execute("ROLLBACK TO audit_batch")
            raise
        finally:
            self.conn.execute("RELEASE audit_batch")
        return False

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """What runs inside is taken back alone when it raises."""
        self.conn.execute("SAVEPOINT audit_one")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK TO audit_one")
            raise
        finally:
            self.conn.execute("RELEASE audit_one")

    def counts(self) -> dict[str, int]:
        """Stored events by kind, and how many were stored as rejected (`rejected`)."""
        rows = self.conn.execute(
            "SELECT kind, count(*) FROM agent_events WHERE status='ok' GROUP BY kind"
        ).fetchall()
        found = {kind: n for kind, n in rows}
        found["rejected"] = self.conn.execute(
            "SELECT count(*) FROM agent_events WHERE status='rejected'"
        ).fetchone()[0]
        return found

    def stored_stream_keys(self, keys: Sequence[str]) -> set[str]:
        """Those of `keys` the log holds."""
        stored: set[str] = set()
        for chunk, marks in in_chunks(keys):
            rows = self.conn.execute(
                f"SELECT stream_key FROM agent_events WHERE stream_key IN ({marks})", chunk
            )
            stored.update(r[0] for r in rows)
        return stored

    # -- admission ---------------------------------------------------------------------------------

    def tasks_among(self, task_ids: Iterable[str]) -> list[tuple[str, str | None, str | None, str | None]]:
        """(task_id, manager_id, worker_id, status) of the stored tasks among `task_ids`."""
        found = []
        for chunk, marks in in_chunks(task_ids):
            found += self.conn.execute(
                f"SELECT task_id, manager_id, worker_id, status FROM agent_tasks WHERE task_id IN ({marks})",
                chunk,
            ).fetchall()
        return found

    def takers(self, task_ids: Iterable[str]) -> list[tuple[str, str | None]]:
        """(task_id, worker_id) of each worker that said it was busy with one of `task_ids`."""
        found = []
        for chunk, marks in in_chunks(task_ids):
            found += self.conn.execute(
                f"SELECT DISTINCT task_id, worker_id FROM agent_events WHERE task_id IN ({marks})"
                " AND kind='worker_status' AND status='ok'",
                chunk,
            ).fetchall()
        return found

    # -- the summaries -----------------------------------------------------------------------------

    def assign_task(self, row: tuple[Any, ...]) -> None:
        """A task assigned: (task_id, task_type, environment, prompt, reference, verifier, group_id,
        manager_id, assigned_at, updated_at)."""
        self.conn.execute(
            "INSERT INTO agent_tasks (task_id, task_type, environment, prompt, reference, verifier, group_id,"
            " manager_id, state, assigned_at, updated_at) VALUES (?,?,?,?,?,?,?,?, 'assigned', ?, ?)"
            " ON CONFLICT (task_id) DO UPDATE SET prompt=excluded.prompt, reference=excluded.reference,"
            " verifier=excluded.verifier, group_id=excluded.group_id, manager_id=excluded.manager_id,"
            " assigned_at=excluded.assigned_at",
            row,
        )

    def answer_task(self, task_id: str, values: tuple[Any, ...]) -> bool:
        """A task's first result: (worker_id, status, result, answer, steps, model_version, elapsed_s,
        phi_mean, tokens, state, done_at, updated_at); False when it had one already."""
        cur = self.conn.execute(
            "UPDATE agent_tasks SET worker_id=?, status=?, result=?, answer=?, steps=?, model_version=?,"
            " elapsed_s=?, phi_mean=?, tokens=?, state=?, done_at=?, updated_at=?"
            " WHERE task_id=? AND status IS NULL",
            (*values, task_id),
        )
        return cur.rowcount != 0

    def reward_task(self, task_id: str, values: tuple[Any, ...]) -> bool:
        """A task's first rollout: (step_scores, prm_score, outcome_score, verifier_score, reward,
        updated_at); False when it had one already."""
        cur = self.conn.execute(
            "UPDATE agent_tasks SET step_scores=?, prm_score=?, outcome_score=?, verifier_score=?, reward=?,"
            " updated_at=? WHERE task_id=? AND reward IS NULL",
            (*values, task_id),
        )
        return bool(cur.rowcount)

    def feedback_task(self, task_id: str, score: float, text: str, source: str, updated_at: float) -> None:
        self.conn.execute(
            "UPDATE agent_tasks SET feedback_score=?, feedback_text=?, feedback_source=?, updated_at=?"
            " WHERE task_id=?",
            (score, text, source, updated_at, task_id),
        )

    def hint_task(self, task_id: str, hint: str, source: str, updated_at: float) -> None:
        """A task's hint (the first one stands: a hint is made once per result)."""
        self.conn.execute(
            "UPDATE agent_tasks SET hint=?, hint_source=?, updated_at=? WHERE task_id=? AND hint IS NULL",
            (hint, source, updated_at, task_id),
        )

    def add_judgement(self, row: tuple[Any, ...]) -> None:
        """One judgement of the manager: (task_id, manager_id, worker_id, kind, value, next_task_id,
        created_at, received_at)."""
        self.conn.execute(
            "INSERT INTO agent_judgements (task_id, manager_id, worker_id, kind, value, next_task_id,"
            " created_at, received_at) VALUES (?,?,?,?,?,?,?,?)",
            row,
        )

    def worker_seen(self, worker_id: str, received: float, kind: str | None = None) -> None:
        self.conn.execute(
            "INSERT INTO agent_workers (worker_id, kind, state, first_seen, last_seen)"
            " VALUES (?,?, 'idle', ?, ?)"
            " ON CONFLICT (worker_id) DO UPDATE"
            " SET last_seen=max(coalesce(last_seen, 0), excluded.last_seen)",
            (worker_id, kind, received, received),
        )

    def worker_status(self, worker_id: str, values: tuple[Any, ...]) -> None:
        """A worker's status: (kind, task_types, model, model_version, state, task_id, host, pid, detail)."""
        self.conn.execute(
            "UPDATE agent_workers SET kind=?, task_types=?, model=?,"
            " model_version=coalesce(?, model_version), state=?, task_id=?, host=?, pid=?, detail=?"
            " WHERE worker_id=?",
            (*values, worker_id),
        )

    def add_worker_tally(self, worker_id: str, done: int, failed: int, scored: int, score_sum: float) -> None:
        self.conn.execute(
            "UPDATE agent_workers SET tasks_done=tasks_done+?, failures=failures+?, score_n=score_n+?,"
            " score_sum=score_sum+? WHERE worker_id=?",
            (done, failed, scored, score_sum, worker_id),
        )

    # -- kv and commands ---------------------------------------------------------------------------

    def kv_text(self, key: str) -> str | None:
        """A kv row's value as stored (JSON text)."""
        row = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_kv_text(self, key: str, text: str) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO kv (key, value, updated_at) VALUES (?,?,?)", (key, text, time.time())
        )

    def answer_command(self, command_id: int, result: str) -> None:
        """A command the plane answered: done, unless it finished already (failed for lack of an answer)."""
        self.conn.execute(
            "UPDATE commands SET state='done', result=?, finished_at=?"
            " WHERE id=? AND state IN ('pending','running')",
            (result, time.time(), command_id),
        )


# -- read back by the plane's other processes ---------------------------------------------------------


def record_task_opd(store: Store, rows: Sequence[tuple[str, int, str, bytes | None, float]]) -> None:
    """What the plane's trainer distilled from each hinted task: (task_id, step, token texts as JSON, OPD
    advantages packed as float16, teacher/student KL), in one transaction; a task the audit has not stored
    is skipped (its row comes with its events). The row's `updated_at` moves with it, so that an open task
    card (which follows `StoreReader.agent_task_signature`) shows it."""
    now = time.time()
    with store.transaction():
        store.conn.executemany(
            "UPDATE agent_tasks SET opd_step=?, opd_tokens=?, opd_advantage=?, opd_kl=?,"
            " updated_at=? WHERE task_id=?",
            [(step, tokens, blob, kl, now, task_id) for task_id, step, tokens, blob, kl in rows],
        )


def assigned_task(db_path: Path, task_id: str, manager_id: str) -> tuple[Any, ...] | None:
    """(task_type, environment, prompt, reference, verifier, group_id, manager_id) of a task `manager_id`
    assigned, as the audit stored it (None: not stored), on a read-only connection opened for this read.
    sqlite3.Error when the store cannot be read."""
    conn = connect(db_path, readonly=True)
    try:
        row: tuple[Any, ...] | None = conn.execute(
            "SELECT task_type, environment, prompt, reference, verifier, group_id, manager_id "
            "FROM agent_tasks WHERE task_id=? AND prompt IS NOT NULL AND manager_id=?",
            (task_id, manager_id),
        ).fetchone()
    finally:
        conn.close()
    return row


class StoredVerdicts:
    """The audit's verdict on events, by stream key, read on a read-only connection of its own (opened at
    the first read, kept until `close`): the trainer's, in another process than the audit."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.conn: sqlite3.Connection | None = None

    def of(self, keys: Iterable[str]) -> list[tuple[str, str, str | None]]:
        """(stream_key, status, reason) of those of `keys` the log holds."""
        if self.conn is None:
            self.conn = connect(self.db_path, readonly=True)
        found = []
        for chunk, marks in in_chunks(keys):
            found += self.conn.execute(
                f"SELECT stream_key, status, reason FROM agent_events WHERE stream_key IN ({marks})", chunk
            ).fetchall()
        return found

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
