"""The whole plane with real processes: a real nats-server, worker processes (http workers against a
local OpenAI-compatible server, model workers on the built-in tiny model), the manager, the audit into
a real store; and the faults: a worker killed mid-task, the server restarted mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from agents_support import nats_server
from openai_server import OpenAIServer

from engine.agents.cli import headless
from engine.agents.config import AgentsSettings
from engine.agents.server import token_path
from engine.agents.tasks import load_tasks
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def arithmetic_tasks(path: Path, n: int, *, task_type: str = "math") -> Path:
    lines = [
        json.dumps({"prompt": f"What is {i} + {i + 1}? (task {i})", "task_type": task_type, "environment": "chat",
                    "reference": str(2 * i + 1), "verifier": "number"})
        for i in range(n)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def solve(request: dict[str, Any]) -> str:
    """What the local 'model' answers: the sum, in the step/answer format."""
    prompt = request["messages"][-1]["content"]
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[0])
    return f"<step>Add {a} and {b}.</step>\n<step>{a} + {b} = {a + b}</step>\n<answer>{a + b}</answer>"


def http_settings(llm: OpenAIServer, **extra: Any) -> AgentsSettings:
    return AgentsSettings(workers=2, worker_kind="http", endpoint=llm.base_url, endpoint_model=llm.model,
                          task_type="math", concurrency=8, ack_wait_s=2, task_timeout_s=60, **extra)  # fmt: skip


def counts(store: Store) -> dict[str, int]:
    rows = store.conn.execute("SELECT kind, count(*) FROM agent_events WHERE status='ok' GROUP BY kind")
    return dict(rows.fetchall())


def one_result_per_task(store: Store) -> None:
    doubled = store.conn.execute(
        "SELECT task_id, count(*) FROM agent_events WHERE kind IN ('result', 'rollout') AND status='ok'"
        " GROUP BY task_id, kind HAVING count(*) > 1"
    ).fetchall()
    assert doubled == []


async def test_two_workers_handle_a_hundred_tasks_exactly_once(tmp_path: Path) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 100))
    with OpenAIServer(responder=solve) as llm:
        summary = await headless(tmp_path / "home", http_settings(llm), specs, limit=None)
    assert (summary["assigned"], summary["done"], summary["failed"]) == (100, 100, 0)
    assert summary["mean_verifier"] == 1.0
    with Store(tmp_path / "home" / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"], kinds["feedback"]) == (100, 100, 100, 100)
        one_result_per_task(store)
        rows = store.conn.execute("SELECT state, worker_id, reward, verifier_score FROM agent_tasks").fetchall()
        assert len(rows) == 100 and {r[0] for r in rows} == {"done"}
        assert all(r[2] is not None and r[3] == 1.0 for r in rows)
        by_worker = {w: sum(1 for r in rows if r[1] == w) for w in ("w1", "w2")}
        assert by_worker["w1"] > 0 and by_worker["w2"] > 0 and sum(by_worker.values()) == 100
    assert len([r for r in llm.requests if r.path.endswith("/chat/completions")]) == 100  # no task done twice


async def _busy_worker(db: Path, task_prefix: str, timeout: float = 30.0) -> dict[str, Any]:
    """The worker that reported it is busy with the task whose prompt starts with `task_prefix`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reader = StoreReader(db)
        try:
            task = reader.conn.execute(
                "SELECT task_id FROM agent_tasks WHERE prompt LIKE ?", (task_prefix + "%",)
            ).fetchone()
            busy = [w for w in reader.agent_workers() if task and w["task_id"] == task[0] and w["state"] == "busy"]
        finally:
            reader.close()
        if busy:
            return {**busy[0], "task": task[0]}
        await asyncio.sleep(0.05)
    raise AssertionError("no worker reported it was busy with the held task")


async def test_a_worker_killed_mid_task_leaves_its_task_to_another_and_nothing_is_lost_or_doubled(
    tmp_path: Path,
) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 20))
    home = tmp_path / "home"
    with OpenAIServer(responder=solve) as llm:
        llm.hold(lambda body: "(task 7)" in body["messages"][-1]["content"])
        run = asyncio.create_task(headless(home, http_settings(llm), specs, limit=None))
        assert await asyncio.to_thread(llm.wait_held, 1, 60.0)
        victim = await _busy_worker(home / "carl.db", "What is 7 + 8")
        os.kill(victim["pid"], signal.SIGKILL)
        llm.release()  # the dead worker's request is answered into the void
        summary = await asyncio.wait_for(run, 120)
    assert (summary["done"], summary["failed"], summary["timed_out"]) == (20, 0, 0)
    with Store(home / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"]) == (20, 20, 20)
        one_result_per_task(store)
        worker, answer = store.conn.execute(
            "SELECT worker_id, answer FROM agent_tasks WHERE task_id=?", (victim["task"],)
        ).fetchone()
    assert worker != victim["worker_id"] and answer == "15"  # redelivered to the other worker, and done


async def test_a_restarted_nats_server_loses_no_acknowledged_event_and_the_clients_reconnect(tmp_path: Path) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 40))
    home = tmp_path / "home"
    with nats_server(home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(llm, url=server.url, token_file=str(token_path(home)))
        llm.hold(lambda body: "(task 20)" in body["messages"][-1]["content"])
        run = asyncio.create_task(headless(home, settings, specs, limit=None))
        assert await asyncio.to_thread(llm.wait_held, 1, 60.0)  # mid-run: a worker is inside task 20
        await asyncio.to_thread(server.stop)  # SIGTERM; JetStream flushes its files
        await asyncio.to_thread(server.start)  # the same port, store and token
        llm.release()
        summary = await asyncio.wait_for(run, 180)
    assert (summary["done"], summary["failed"]) == (40, 0)
    with Store(home / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"], kinds["feedback"]) == (40, 40, 40, 40)
        one_result_per_task(store)
    logs = "".join(p.read_text() for p in (home / "logs").glob("agents-*.log"))
    assert "reconnected" in logs


async def test_model_workers_answer_with_the_tiny_model_and_report_the_behaviour_policy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    from engine.agents.tasks import demo_tasks

    settings = AgentsSettings(workers=1, worker_kind="model", max_new_tokens=16, ack_wait_s=60)
    summary = await headless(home, settings, demo_tasks(), limit=3)
    assert summary["done"] == 3
    reader = StoreReader(home / "carl.db")
    try:
        results = [json.loads(r["payload"]) for r in reader.agent_audit(kind="result")]
        workers = reader.agent_workers()
    finally:
        reader.close()
    assert len(results) == 3
    for result in results:
        assert result["model_version"] == "base" and result["worker_kind"] == "model"
        assert result["result"].count("<answer>") == 1 and result["steps"]
        assert 0 < len(result["response_token_ids"]) == len(result["token_logprobs"]) <= 16
        assert all(lp <= 0 for lp in result["token_logprobs"]) and result["temperature"] == 1.0
        assert 0.0 <= result["phi_mean"] <= 1.0
    assert [w["worker_id"] for w in workers] == ["w1"] and workers[0]["tasks_done"] == 3
