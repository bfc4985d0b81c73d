"""Poison messages on the agents plane, against a real nats-server (issue 22 §1 and §10).

A message the audit cannot store costs one rejected row with its reason, never the stream: the good
events around it are stored, all of it is acknowledged, and a restarted audit finds nothing to do
again. Answers to tasks nobody assigned, or from a worker that did not take the task, are refused
the same way."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agents_support import address_of, drained, jetstream, nats_server

from engine import paths
from engine.agents.audit import AUDIT_CONSUMER, AUDIT_KEY, MAX_PAYLOAD, AuditWriter, Incoming
from engine.agents.bus import STREAM, publish
from engine.agents.events import (
    FeedbackEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
    parse_event,
)
from engine.agents.plane import Bridge
from engine.agents.plane_settings import AgentsSettings
from engine.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _task(prompt: str = "p") -> TaskEvent:
    return TaskEvent(manager_id="m", task_type="demo", prompt=prompt)


def _busy(worker: str, task: TaskEvent) -> WorkerStatusEvent:
    return WorkerStatusEvent(
        worker_id=worker, kind="model", task_types=["demo"], state="busy", task_id=task.task_id
    )


def _result(task: TaskEvent | str, worker: str = "w1") -> ResultEvent:
    task_id = task if isinstance(task, str) else task.task_id
    return ResultEvent(
        task_id=task_id, worker_id=worker, task_type="demo", status="success", result="r", answer="x"
    )


def _rollout(task: TaskEvent | str, worker: str = "w1") -> TrainingRolloutEvent:
    task_id = task if isinstance(task, str) else task.task_id
    return TrainingRolloutEvent(
        task_id=task_id,
        worker_id=worker,
        task_type="demo",
        prompt="p",
        response="x",
        prm_score=0.5,
        outcome_score=0.5,
        reward=0.5,
    )


def _feedback(task: TaskEvent | str, worker: str = "w1", manager: str = "m") -> FeedbackEvent:
    task_id = task if isinstance(task, str) else task.task_id
    return FeedbackEvent(task_id=task_id, manager_id=manager, worker_id=worker, score=0.5)


def _nested(depth: int) -> bytes:
    head = (
        b'{"type":"result","task_id":"t","worker_id":"w1","task_type":"demo","status":"success","result":"r",'
    )
    return head + b'"metadata":{"x":' + b"[" * depth + b"]" * depth + b"}}"


# subject, payload, the start of the reason it is rejected with
POISON: list[tuple[str, bytes, str]] = [
    ("results.demo", _nested(100_000), "invalid JSON: nested too deeply"),
    (
        "tasks.demo",
        b'{"type":"task","manager_id":"m","task_type":"demo","prompt":"a\\ud800b"}',
        "prompt: text holds a lone surrogate",
    ),
    (
        "status.workers.w7",
        b'{"type":"worker_status","worker_id":"w7","kind":"model","task_types":["demo"],"state":"idle",'
        b'"detail":"\\udcff"}',
        "detail: text holds a lone surrogate",
    ),
    (
        "tasks.demo",
        b'{"type":"task","manager_id":"m","task_type":"demo","prompt":"\xff\xfe\xed\xa0\x80"}',
        "invalid JSON",
    ),
    (
        "tasks.demo",
        b'{"type":"task","manager_id":"m","task_type":"demo","prompt":"' + b"y" * 900_000 + b'","sneaky":1}',
        "sneaky: unknown field",
    ),
    (  # valid, but SQLite's integers stop at 2**63: the store refuses it
        "status.workers.w8",
        b'{"type":"worker_status","worker_id":"w8","kind":"model","task_types":["demo"],"state":"idle",'
        b'"pid":' + str(2**70).encode() + b"}",
        "cannot be stored: OverflowError",
    ),
]


def _rows(store: Store) -> list[dict[str, Any]]:
    cur = store.conn.execute(
        "SELECT subject, kind, task_id, worker_id, status, reason, payload FROM agent_events ORDER BY id"
    )
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


async def _until_drained_by(bridge: Bridge, js: Any) -> None:
    """Until the engine's audit (the bridge, in its thread) has acknowledged everything on the stream."""
    deadline = time.monotonic() + 30
    while not bridge.connected.is_set():
        assert time.monotonic() < deadline and bridge.alive(), bridge.error
        await asyncio.sleep(0.05)
    await drained(js, AUDIT_CONSUMER, timeout=60)


async def test_poison_messages_cost_one_row_each_and_never_stop_the_audit(tmp_path: Path) -> None:
    """§1: a deeply nested event (RecursionError), lone surrogates, non-UTF-8 bytes, a huge payload and
    a number beyond SQLite's range, between good events: each is stored as rejected with its reason and
    its payload cut and storable; every good event is stored; all of it is acknowledged, so a restarted
    engine's audit redelivers nothing; `carl agents status` counts them."""
    home = tmp_path / "home"
    home.mkdir()
    with nats_server(home) as server:
        address = address_of(server)
        nc, js = await jetstream(address)
        good_tasks = [_task(f"prompt {i}") for i in range(len(POISON) + 1)]
        await publish(js, good_tasks[0])
        for (subject, payload, _), task in zip(POISON, good_tasks[1:], strict=True):
            await js.publish(subject, payload)
            await publish(js, task)  # a good event right after each bad one

        bridge = Bridge(home, address, AgentsSettings())  # the engine's audit
        bridge.start()
        try:
            await _until_drained_by(bridge, js)
        finally:
            bridge.stop()
        assert not bridge.alive() and bridge.audit_trouble is None

        with Store(paths.db_path(home)) as store:
            rows = _rows(store)
            assert [r["status"] for r in rows] == ["ok"] + ["rejected", "ok"] * len(POISON)
            assert {r["task_id"] for r in rows if r["status"] == "ok"} == {t.task_id for t in good_tasks}
            for row, (subject, _, reason) in zip(rows[1::2], POISON, strict=True):
                assert row["subject"] == subject and row["reason"].startswith(reason), row["reason"]
                assert len(row["payload"].encode("utf-8")) <= MAX_PAYLOAD + 2  # a cut character: U+FFFD
                assert "\n" not in row["reason"] and len(row["reason"]) <= 500
            huge = rows[1 + 2 * 4]
            assert huge["payload"].startswith('{"type":"task"') and len(huge["payload"]) == MAX_PAYLOAD
            assert store.kv(AUDIT_KEY)["rejected"] == len(POISON)
            stored = len(rows)

        # An engine restart: a new audit on the same durable consumer finds nothing left to deliver.
        again = Bridge(home, address, AgentsSettings())
        again.start()
        try:
            await _until_drained_by(again, js)
            await asyncio.sleep(0.5)  # a redelivery would come now
            info = await js.consumer_info(STREAM, AUDIT_CONSUMER)
        finally:
            again.stop()
        assert info.num_redelivered == 0 and info.num_pending == 0 and info.num_ack_pending == 0
        with Store(paths.db_path(home)) as store:
            assert len(_rows(store)) == stored
        await nc.drain()

    env = {**os.environ, "CARL_HOME": str(home)}
    status = subprocess.run(
        [sys.executable, "-m", "engine.cli", "agents", "status"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert f"{stored} events in the audit, {len(POISON)} rejected, 0 dead-lettered; newest:" in status.stdout


def test_answers_to_tasks_nobody_assigned_are_refused(tmp_path: Path) -> None:
    """§10: results, rollouts and feedback for task ids never assigned, or from a worker that did not
    take the task, or feedback from another manager, are stored as rejected with their reason and
    change no task or worker; the plane's own flow (including the manager's give-up and a redelivered
    task taken by two workers) is stored as before."""
    with Store(tmp_path / "carl.db") as store:
        writer = AuditWriter(store)
        taken, other, redelivered, given_up = _task("taken"), _task("other"), _task("again"), _task("late")
        events: list[tuple[Any, str | None]] = [
            (taken, None),
            (other, None),
            (redelivered, None),
            (given_up, None),
            (_result("never-assigned"), "task never-assigned was never assigned"),
            (_rollout("never-assigned"), "task never-assigned was never assigned"),
            (_feedback("never-assigned"), "task never-assigned was never assigned"),
            (_busy("w1", taken), None),
            (_result(taken, "w9"), f"task {taken.task_id} was taken by worker w1, not w9"),
            (_rollout(other), f"task {other.task_id} has no result yet"),
            (_result(taken, "w1"), None),
            (_result(taken, "w9"), f"task {taken.task_id} was answered by worker w1, not w9"),
            (_result(taken, "w1"), None),  # a repeat from the worker that answered: the first stands
            (_rollout(taken, "w9"), f"task {taken.task_id} was answered by worker w1, not w9"),
            (_feedback(taken, "w1", "m2"), f"task {taken.task_id} belongs to manager m, not m2"),
            (_rollout(taken, "w1"), None),
            (_feedback(taken, "w1"), None),
            (_busy("w1", redelivered), None),
            (_busy("w2", redelivered), None),  # w1 went quiet: the stream gave the task to w2 too
            (_result(redelivered, "w2"), None),
            (_busy("w3", given_up), None),
            (
                ResultEvent(
                    task_id=given_up.task_id,
                    worker_id="unassigned",
                    task_type="demo",
                    status="failed",
                    result="timed out",
                    worker_kind="manager",
                ),
                None,
            ),
        ]
        # In two batches: what the first stored decides for the second too.
        items = [Incoming(e.subject(), e.encode(), i + 1, f"t:{i + 1}") for i, (e, _) in enumerate(events)]
        first = writer.write(items[:9])
        second = writer.write(items[9:])
        refused = [why for _, why in events if why]
        assert first.rejected + second.rejected == len(refused)
        rows = _rows(store)
        assert [r["reason"] for r in rows] == [why for _, why in events]
        assert all(r["kind"] in ("result", "rollout", "feedback") for r in rows if r["reason"])
        task = store.conn.execute(
            "SELECT worker_id, reward, feedback_score FROM agent_tasks WHERE task_id=?", (taken.task_id,)
        ).fetchone()
        assert task == ("w1", 0.5, 0.5)
        assert store.conn.execute("SELECT count(*) FROM agent_tasks").fetchone()[0] == 4
        workers = dict(store.conn.execute("SELECT worker_id, tasks_done FROM agent_workers"))
        assert "w9" not in workers and workers["w1"] == 1 and workers["w2"] == 1
        assert store.kv(AUDIT_KEY)["rejected"] == len(refused)


def test_parse_event_refuses_what_no_store_can_keep() -> None:
    """§1 at its root: parse_event (the audit's, the manager's, every worker's) says EventRejected for
    a deeply nested payload and for lone surrogates, never RecursionError or a later UnicodeEncodeError."""
    from engine.agents.events import EventRejected

    for subject, payload, reason in POISON[:4]:
        with pytest.raises(EventRejected) as caught:
            parse_event(subject, payload)
        assert str(caught.value).startswith(reason)
    ok = b'{"type":"task","manager_id":"m","task_type":"demo","prompt":"\\ud83d\\ude00"}'  # a pair: one emoji
    assert parse_event("tasks.demo", ok).prompt == "\U0001f600"  # type: ignore[union-attr]
    assert json.loads(ok)["prompt"] == "\U0001f600"


def test_the_manager_scores_only_results_from_a_worker_that_took_the_task() -> None:
    """§10, the manager's side: a result from a worker that did not take the task is ignored (no rollout,
    no feedback); any worker's, while none said it took it; the manager's own answer only when it gave up."""
    from engine.agents.manager import Manager, Pending

    task = _task()
    pending = Pending(task, deadline=0.0)
    assert Manager._from_taker(pending, _result(task, "w9"))  # nobody said yet: nothing to compare with
    pending.takers.update({"w1", "w2"})
    assert Manager._from_taker(pending, _result(task, "w2"))
    assert not Manager._from_taker(pending, _result(task, "w9"))
    own = ResultEvent(
        task_id=task.task_id,
        worker_id="w1",
        task_type="demo",
        status="failed",
        result="timed out",
        worker_kind="manager",
    )
    assert not Manager._from_taker(pending, own)  # a forged give-up
    pending.given_up = True
    assert Manager._from_taker(pending, own)


async def test_a_locked_store_holds_the_stream_back_and_says_so(tmp_path: Path) -> None:
    """The one thing that may hold the audit back is the store's own trouble: then nothing is skipped or
    acknowledged, the trouble is reported (the bridge shows it as `audit stalled` in `carl agents
    status`), and once the store takes writes again everything is stored and the report clears."""
    import sqlite3

    from engine.agents.audit import run_audit

    with nats_server(tmp_path / "home") as server, Store(tmp_path / "carl.db") as store:
        store.conn.execute("PRAGMA busy_timeout=100")  # give up on the lock quickly, and try again
        nc, js = await jetstream(address_of(server))
        blocker = sqlite3.connect(tmp_path / "carl.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holding the store
        reports: list[str | None] = []
        stop = asyncio.Event()
        audit = asyncio.create_task(run_audit(js, AuditWriter(store), stop, on_trouble=reports.append))
        try:
            tasks = [_task(f"p{i}") for i in range(5)]
            for task in tasks:
                await publish(js, task)
            deadline = time.monotonic() + 30
            while not reports:
                assert time.monotonic() < deadline, "the locked store was never reported"
                await asyncio.sleep(0.05)
            assert reports[0] is not None and "locked" in reports[0]
            info = await js.consumer_info(STREAM, AUDIT_CONSUMER)
            assert info.num_ack_pending == len(tasks)  # nothing acknowledged while nothing is stored
            blocker.execute("COMMIT")
            await drained(js, AUDIT_CONSUMER)
        finally:
            stop.set()
            await audit
            blocker.close()
        assert reports[-1] is None
        assert store.conn.execute("SELECT count(*) FROM agent_events WHERE status='ok'").fetchone()[0] == 5
        await nc.drain()
