"""The plane's transport against a real nats-server: the local server's security, one-line connection
errors, JetStream deduplication, and the audit (every event stored once; bad payloads stored as rejected
with their reason; restarts lose and double nothing)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import psutil
import pytest
from agents_support import address_of, drained, jetstream, nats_server

from engine.agents.audit import AUDIT_CONSUMER, AuditWriter, run_audit
from engine.agents.bus import Address, connect, publish
from engine.agents.events import (
    FeedbackEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
)
from engine.agents.server import AgentsError, free_port, read_token, token_path
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_local_server_listens_on_loopback_only_and_keeps_its_token_out_of_argv(tmp_path: Path) -> None:
    with nats_server(tmp_path) as server:
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        listening = [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}
        token = read_token(token_path(tmp_path))
        assert len(token) >= 32
        assert token not in " ".join(proc.cmdline())
        assert _mode(token_path(tmp_path)) == 0o600
        assert _mode(tmp_path / "nats" / "server.conf") == 0o600
        assert _mode(tmp_path / "nats") == 0o700
        assert token not in (tmp_path / "logs" / "nats-server.log").read_text()
        first = token
    with nats_server(tmp_path):  # a restart keeps the token generated at first start
        assert read_token(token_path(tmp_path)) == first


async def test_a_wrong_token_or_an_unreachable_url_is_one_line_naming_the_url(tmp_path: Path) -> None:
    with nats_server(tmp_path / "home") as server:
        wrong = tmp_path / "wrong-token"
        wrong.write_text("not-the-token\n")
        with pytest.raises(AgentsError) as caught:
            await connect(Address(server.url, str(wrong)), "t")
        message = str(caught.value)
        assert message == f"{server.url}: authorization violation (wrong or missing token or credentials)"
        assert "\n" not in message
    nowhere = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(AgentsError) as caught:
        await connect(Address(nowhere), "t")
    assert str(caught.value) == f"{nowhere}: cannot connect (nothing answers there)"


def _events(n: int) -> list:
    out: list = []
    for i in range(n):
        task = TaskEvent(
            manager_id="m", task_type="demo", prompt=f"prompt {i}", reference="x", verifier="exact"
        )
        result = ResultEvent(
            task_id=task.task_id,
            worker_id=f"w{i % 2 + 1}",
            task_type="demo",
            status="success",
            result="<step>s</step><answer>x</answer>",
            steps=["s"],
            answer="x",
            model_version="base",
        )
        rollout = TrainingRolloutEvent(
            task_id=task.task_id,
            worker_id=result.worker_id,
            task_type="demo",
            prompt=task.prompt,
            response="x",
            steps=["s"],
            step_scores=[0.75],
            prm_score=0.75,
            outcome_score=0.7,
            verifier_score=1.0,
            reward=0.85,
        )
        feedback = FeedbackEvent(
            task_id=task.task_id,
            manager_id="m",
            worker_id=result.worker_id,
            score=0.9,
            textual_feedback="fine",
        )
        out += [task, result, rollout, feedback]
    return out


async def _audit_until_drained(js, store: Store) -> None:
    stop = asyncio.Event()
    audit = asyncio.create_task(run_audit(js, AuditWriter(store), stop))
    try:
        await drained(js, AUDIT_CONSUMER)
    finally:
        stop.set()
        await audit


async def test_the_audit_stores_every_event_once_and_keeps_the_summaries(tmp_path: Path) -> None:
    with nats_server(tmp_path / "home") as server, Store(tmp_path / "carl.db") as store:
        nc, js = await jetstream(address_of(server))
        events = _events(10)
        for event in events:
            await publish(js, event)
        # A repeat within the duplicate window (a retried publish, a redelivered task answered twice):
        first_result = events[1]
        ack = await publish(js, first_result)
        assert ack.duplicate
        # A second result for the same task from another worker, with another message id, still reaches the
        # stream; the task keeps its first result.
        other = first_result.model_copy(update={"worker_id": "w9", "answer": "late"})
        await js.publish(other.subject(), other.encode(), headers={"Nats-Msg-Id": "another-id"})
        await publish(
            js,
            WorkerStatusEvent(
                worker_id="w1",
                kind="model",
                task_types=["demo"],
                state="idle",
                model_version="base",
                command_id=None,
            ),
        )
        await _audit_until_drained(js, store)
        # Restarted (a new consumer loop, the same durable): nothing is stored twice.
        await _audit_until_drained(js, store)
        await nc.drain()

        kinds = dict(store.conn.execute("SELECT kind, count(*) FROM agent_events GROUP BY kind").fetchall())
        assert kinds == {"task": 10, "result": 11, "rollout": 10, "feedback": 10, "worker_status": 1}
        tasks = store.conn.execute(
            "SELECT task_id, worker_id, answer, reward, feedback_score FROM agent_tasks"
        ).fetchall()
        assert len(tasks) == 10
        assert all(r[2] == "x" and r[3] == 0.85 and r[4] == 0.9 for r in tasks)
        assert dict((r[0], r[1]) for r in tasks)[first_result.task_id] == "w1"
        reader = StoreReader(tmp_path / "carl.db")
        try:
            workers = {w["worker_id"]: w for w in reader.agent_workers()}
            assert workers["w1"]["tasks_done"] == 5 and workers["w2"]["tasks_done"] == 5
            assert workers["w1"]["mean_score"] == pytest.approx(0.85)
            assert workers["w1"]["state"] == "idle"
            task = reader.agent_task(first_result.task_id)
            assert task is not None and task["steps"] == ["s"] and task["step_scores"] == [0.75]
            assert task["rollout"]["reward"] == 0.85
        finally:
            reader.close()


@pytest.mark.parametrize(
    ("subject", "payload", "reason"),
    [
        ("results.demo", b"{not json", "invalid JSON"),
        (
            "results.demo",
            json.dumps({"type": "task", "manager_id": "m", "task_type": "demo", "prompt": "p"}).encode(),
            "type 'task' on subject results.demo (expects result)",
        ),
        (
            "tasks.demo",
            json.dumps({"manager_id": "m", "task_type": "demo", "prompt": "p"}).encode(),
            "no 'type' field (subject tasks.demo expects task)",
        ),
        (
            "tasks.demo",
            json.dumps(
                {"type": "task", "manager_id": "m", "task_type": "demo", "prompt": "p", "sneaky": 1}
            ).encode(),
            "sneaky: unknown field",
        ),
        (
            "feedback.scored",
            json.dumps(
                {"type": "feedback", "task_id": "t", "manager_id": "m", "worker_id": "w", "score": 3.0}
            ).encode(),
            "score: Input should be less than or equal to 1",
        ),
        (
            "training.rollouts",
            json.dumps(
                {
                    "type": "rollout",
                    "task_id": "t",
                    "worker_id": "w",
                    "task_type": "demo",
                    "prompt": "p",
                    "response": "r",
                    "step_scores": [0.5, 3.0],
                    "prm_score": 0.5,
                    "outcome_score": 0.5,
                    "reward": 0.5,
                }
            ).encode(),
            "step_scores[1]: Input should be less than or equal to 1",
        ),
    ],
)
async def test_a_malformed_payload_is_stored_as_rejected_with_its_reason(
    tmp_path: Path, subject: str, payload: bytes, reason: str
) -> None:
    with nats_server(tmp_path / "home") as server, Store(tmp_path / "carl.db") as store:
        nc, js = await jetstream(address_of(server))
        await js.publish(subject, payload)
        good = _events(1)
        for event in good:
            await publish(js, event)
        await _audit_until_drained(js, store)  # the bad payload did not stop it: the good ones follow
        await nc.drain()
        rows = store.conn.execute(
            "SELECT subject, status, reason, payload FROM agent_events ORDER BY id"
        ).fetchall()
        assert rows[0][:2] == (subject, "rejected")
        assert rows[0][2].startswith(reason), rows[0][2]
        assert rows[0][3] == payload.decode()
        assert [r[1] for r in rows[1:]] == ["ok"] * 4


def test_a_store_file_keeps_the_audit_across_processes(tmp_path: Path) -> None:
    """The audit lives in carl.db: a new store connection (a restarted engine) reads it all back."""
    with nats_server(tmp_path / "home") as server:

        async def write() -> None:
            with Store(tmp_path / "carl.db") as store:
                nc, js = await jetstream(address_of(server))
                for event in _events(3):
                    await publish(js, event)
                await _audit_until_drained(js, store)
                await nc.drain()

        asyncio.run(write())
    reader = StoreReader(tmp_path / "carl.db")
    try:
        assert len(reader.agent_audit(limit=None)) == 12
        assert len(reader.agent_audit(kind="rollout")) == 3
    finally:
        reader.close()
    assert os.stat(tmp_path / "carl.db").st_mode & 0o077 == 0
