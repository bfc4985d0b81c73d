"""The audit's writer at speed: a redelivered batch is stored once (found after one optimistic insert, not by
looking every key up first), the WAL is checkpointed by the audit off its insert path, and schema 8 drops
the indexes no reader uses while every read of the plane's tables still answers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

import engine.agents.audit as audit
from engine.agents.audit import AuditWriter, Incoming
from engine.agents.events import FeedbackEvent, PlaneEvent, ResultEvent, TaskEvent, TrainingRolloutEvent
from engine.store import SCHEMA_VERSION, Store, StoreReader
from engine.store.schema import APPLICATION_ID, MIGRATIONS


def _events(n: int) -> list[PlaneEvent]:
    out: list[PlaneEvent] = []
    for i in range(n):
        task = TaskEvent(manager_id="m", task_type="demo", prompt=f"p{i}")
        worker = f"w{i % 2 + 1}"
        out += [
            task,
            ResultEvent(
                task_id=task.task_id,
                worker_id=worker,
                task_type="demo",
                status="success",
                result="r",
                answer="x",
            ),
            TrainingRolloutEvent(
                task_id=task.task_id,
                worker_id=worker,
                task_type="demo",
                prompt=task.prompt,
                response="x",
                prm_score=0.5,
                outcome_score=0.5,
                reward=0.75,
            ),
            FeedbackEvent(task_id=task.task_id, manager_id="m", worker_id=worker, score=0.9),
        ]
    return out


def _incoming(events: list[PlaneEvent], first_seq: int = 1) -> list[Incoming]:
    return [
        Incoming(e.subject(), e.encode(), first_seq + i, f"e1:{first_seq + i}") for i, e in enumerate(events)
    ]


def _summary(store: Store) -> tuple[object, ...]:
    events = store.conn.execute("SELECT count(*), max(id) FROM agent_events").fetchone()
    workers = store.conn.execute(
        "SELECT worker_id, tasks_done, score_n, score_sum FROM agent_workers ORDER BY worker_id"
    ).fetchall()
    return events, workers


def test_a_redelivered_batch_is_stored_once_and_counted_once(store: Store) -> None:
    writer = AuditWriter(store)
    items = _incoming(_events(6))
    first = writer.write(items[:16])
    assert (first.stored, first.duplicates) == (16, 0)
    after_first = _summary(store)

    # The audit restarted between a commit and its ack: the same batch again, then one that overlaps it.
    again = writer.write(items[:16])
    assert (again.stored, again.duplicates, again.rejected) == (0, 16, 0)
    assert _summary(store) == after_first  # no row, and no worker tally, twice
    overlap = writer.write(items[8:] + items[-1:])  # a repeat inside the batch, too
    assert (overlap.stored, overlap.duplicates) == (8, 9)

    events, workers = _summary(store)
    assert events == (24, 24)
    assert workers == [("w1", 3, 3, 2.25), ("w2", 3, 3, 2.25)]
    done = store.conn.execute(
        "SELECT count(*) FROM agent_tasks WHERE state='done' AND reward=0.75"
    ).fetchone()
    assert done == (6,)


def test_the_audit_checkpoints_the_wal_itself_off_the_insert_path(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = AuditWriter(store)
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the migrations' pages: in the file
    empty = store.path.stat().st_size
    writer.write(_incoming(_events(50)))
    # The commits only appended to the WAL: nothing was copied into the database file.
    assert store.path.stat().st_size == empty and writer.unchecked == 200

    writer.checkpoint()  # what run_audit does when the stream is quiet
    grown = store.path.stat().st_size
    assert grown > empty and writer.unchecked == 0

    # A stream that never goes quiet is checkpointed every CHECKPOINT_EVERY events all the same.
    monkeypatch.setattr(audit, "CHECKPOINT_EVERY", 100)
    writer.write(_incoming(_events(30), first_seq=1000))
    assert store.path.stat().st_size > grown and writer.unchecked == 0


def test_schema_8_drops_the_unread_indexes_and_every_read_still_answers(store: Store) -> None:
    events = _events(4)
    AuditWriter(store).write(_incoming(events))
    names = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert not names & {"idx_agent_tasks_state", "idx_agent_tasks_worker_id", "idx_agent_events_worker_id_id"}
    assert {"idx_agent_events_kind_id", "idx_agent_events_task_id", "idx_agent_events_stream_key"} <= names
    reader = StoreReader(store.path)
    try:
        assert [r["kind"] for r in reader.agent_audit(worker="w2")] == ["result", "rollout", "feedback"] * 2
        assert len(reader.agent_audit(kind="feedback")) == 4
        task = reader.agent_task(events[0].task_id)  # type: ignore[attr-defined]
        assert task is not None and task["state"] == "done" and len(task["events"]) == 4
        assert task["rollout"]["reward"] == 0.75
    finally:
        reader.close()


def test_a_version_7_store_with_the_plane_in_it_migrates_to_8(tmp_path: Path) -> None:
    db_file = tmp_path / "carl.db"
    conn = sqlite3.connect(db_file, isolation_level=None)
    for migrate in MIGRATIONS[:7]:
        migrate(sqlite_utils.Database(conn))
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=7")
    conn.execute(
        "INSERT INTO agent_events (subject, kind, task_id, worker_id, payload, stream_key, status)"
        " VALUES ('results.demo', 'result', 't1', 'w1', '{}', 'e0:1', 'ok')"
    )
    conn.execute("INSERT INTO agent_tasks (task_id, state, worker_id) VALUES ('t1', 'done', 'w1')")
    conn.close()
    with Store(db_file) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 8
        names = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert not names & {
            "idx_agent_tasks_state",
            "idx_agent_tasks_worker_id",
            "idx_agent_events_worker_id_id",
        }
        assert store.conn.execute("SELECT task_id, worker_id FROM agent_events").fetchall() == [("t1", "w1")]
        assert store.conn.execute("SELECT state FROM agent_tasks WHERE task_id='t1'").fetchone() == ("done",)
        assert store.conn.execute("SELECT count(*) FROM trainer_rollouts").fetchone() == (0,)
