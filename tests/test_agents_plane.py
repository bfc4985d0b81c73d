"""The whole plane with real processes: a real nats-server, worker processes (http workers against a
local OpenAI-compatible server, model workers on the built-in tiny model), the manager, the audit into
a real store; and the faults: a worker killed mid-task, the server restarted mid-run."""

from __future__ import annotations

import asyncio
import contextlib
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

from engine.agents.carl_agents import headless
from engine.agents.plane_settings import AgentsSettings
from engine.agents.server import token_path
from engine.agents.tasks import load_tasks
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def arithmetic_tasks(path: Path, n: int, *, task_type: str = "math") -> Path:
    lines = [
        json.dumps(
            {
                "prompt": f"What is {i} + {i + 1}? (task {i})",
                "task_type": task_type,
                "environment": "chat",
                "reference": str(2 * i + 1),
                "verifier": "number",
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def solve(request: dict[str, Any]) -> str:
    """What the local 'model' answers: the sum, in the step/answer format."""
    prompt = request["messages"][-1]["content"]
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[0])
    return f"<step>Add {a} and {b}.</step>\n<step>{a} + {b} = {a + b}</step>\n<answer>{a + b}</answer>"


def http_settings(llm: OpenAIServer, **extra: Any) -> AgentsSettings:
    fields = {
        "workers": 2,
        "worker_kind": "http",
        "endpoint": llm.base_url,
        "endpoint_model": llm.model,
        "task_type": "math",
        "concurrency": 8,
        "ack_wait_s": 2,
        "task_timeout_s": 60,
        **extra,
    }
    return AgentsSettings(**fields)


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
    db = tmp_path / "home" / "carl.db"
    with OpenAIServer(responder=solve) as llm:
        # Whichever worker pulls task 0 waits on it until the other has answered a task: both take part
        # even when one starts seconds before the other (under load it could take all hundred). The ack
        # wait is longer than the hold, so no task is redelivered and answered twice meanwhile.
        llm.hold(lambda body: "(task 0)" in body["messages"][-1]["content"])
        run = asyncio.create_task(
            headless(tmp_path / "home", http_settings(llm, ack_wait_s=60), specs, limit=None)
        )
        try:
            assert await asyncio.to_thread(llm.wait_held, 1, 60.0)
            holder = await _busy_worker(db, "What is 0 + 1")
            await _done_by_another(db, holder["worker_id"])
            llm.release()
            summary = await asyncio.wait_for(run, 120)
        finally:
            await _settled(llm, run)
    assert (summary["assigned"], summary["done"], summary["failed"]) == (100, 100, 0)
    assert summary["mean_verifier"] == 1.0
    with Store(tmp_path / "home" / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"], kinds["feedback"]) == (100, 100, 100, 100)
        one_result_per_task(store)
        rows = store.conn.execute(
            "SELECT state, worker_id, reward, verifier_score FROM agent_tasks"
        ).fetchall()
        assert len(rows) == 100 and {r[0] for r in rows} == {"done"}
        assert all(r[2] is not None and r[3] == 1.0 for r in rows)
        by_worker = {w: sum(1 for r in rows if r[1] == w) for w in ("w1", "w2")}
        assert by_worker["w1"] > 0 and by_worker["w2"] > 0 and sum(by_worker.values()) == 100
    assert len([r for r in llm.requests if r.path.endswith("/chat/completions")]) == 100  # no task done twice


async def _busy_worker(db: Path, task_prefix: str, timeout: float = 60.0) -> dict[str, Any]:
    """The worker that reported it is busy with the task whose prompt starts with `task_prefix`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reader = StoreReader(db)
        try:
            task = reader.conn.execute(
                "SELECT task_id FROM agent_tasks WHERE prompt LIKE ?", (task_prefix + "%",)
            ).fetchone()
            busy = [
                w for w in reader.agent_workers() if task and w["task_id"] == task[0] and w["state"] == "busy"
            ]
        finally:
            reader.close()
        if busy:
            return {**busy[0], "task": task[0]}
        await asyncio.sleep(0.05)
    raise AssertionError("no worker reported it was busy with the held task")


async def _done_by_another(db: Path, worker_id: str, timeout: float = 60.0) -> None:
    """Until a worker other than `worker_id` has a task done in the store."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reader = StoreReader(db)
        try:
            done = reader.conn.execute(
                "SELECT count(*) FROM agent_tasks WHERE state='done' AND worker_id!=?", (worker_id,)
            ).fetchone()[0]
        finally:
            reader.close()
        if done:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no worker but {worker_id} finished a task")


async def _settled(llm: OpenAIServer, run: asyncio.Task[Any]) -> None:
    """Nothing held, and the plane's run over (cancelled when the test failed first: it stops its
    processes)."""
    llm.release()
    if not run.done():
        run.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # the test's own failure is the one to see
        await run


async def test_a_worker_killed_mid_task_leaves_its_task_to_another_and_nothing_is_lost_or_doubled(
    tmp_path: Path,
) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 20))
    home = tmp_path / "home"
    with OpenAIServer(responder=solve) as llm:
        llm.hold(lambda body: "(task 7)" in body["messages"][-1]["content"])
        run = asyncio.create_task(headless(home, http_settings(llm), specs, limit=None))
        try:
            assert await asyncio.to_thread(llm.wait_held, 1, 60.0)
            victim = await _busy_worker(home / "carl.db", "What is 7 + 8")
            os.kill(victim["pid"], signal.SIGKILL)
            llm.release()  # the dead worker's request is answered into the void
            summary = await asyncio.wait_for(run, 120)
        finally:
            await _settled(llm, run)
    assert (summary["done"], summary["failed"], summary["timed_out"]) == (20, 0, 0)
    with Store(home / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"]) == (20, 20, 20)
        one_result_per_task(store)
        worker, answer = store.conn.execute(
            "SELECT worker_id, answer FROM agent_tasks WHERE task_id=?", (victim["task"],)
        ).fetchone()
    assert worker != victim["worker_id"] and answer == "15"  # redelivered to the other worker, and done


async def test_a_restarted_nats_server_loses_no_acknowledged_event_and_the_clients_reconnect(
    tmp_path: Path,
) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 40))
    home = tmp_path / "home"
    with nats_server(home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(llm, url=server.url, token_file=str(token_path(home)))
        llm.hold(lambda body: "(task 20)" in body["messages"][-1]["content"])
        run = asyncio.create_task(headless(home, settings, specs, limit=None))
        try:
            assert await asyncio.to_thread(llm.wait_held, 1, 60.0)  # mid-run: a worker is inside task 20
            await asyncio.to_thread(server.stop)  # SIGTERM; JetStream flushes its files
            await asyncio.to_thread(server.start)  # the same port, store and token
            llm.release()
            summary = await asyncio.wait_for(run, 180)
        finally:
            await _settled(llm, run)
    assert (summary["done"], summary["failed"]) == (40, 0)
    with Store(home / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"], kinds["feedback"]) == (40, 40, 40, 40)
        one_result_per_task(store)
    logs = "".join(p.read_text() for p in (home / "logs").glob("agents-*.log"))
    assert "reconnected" in logs


async def test_model_workers_answer_with_the_tiny_model_and_report_the_behaviour_policy(
    tmp_path: Path,
) -> None:
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


async def test_work_that_fails_is_answered_failed_with_its_reason(tmp_path: Path) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 3))
    with OpenAIServer() as llm:
        llm.error(500, "CUDA out of memory")
        llm.responder = solve
        summary = await headless(tmp_path / "home", http_settings(llm, workers=1), specs, limit=None)
        base_url = llm.base_url
    assert (summary["done"], summary["failed"]) == (2, 1)
    reader = StoreReader(tmp_path / "home" / "carl.db")
    try:
        [failed] = [
            json.loads(r["payload"])
            for r in reader.agent_audit(kind="result")
            if json.loads(r["payload"])["status"] == "failed"
        ]
        task = reader.agent_task(failed["task_id"])
    finally:
        reader.close()
    assert failed["error"].startswith(f"{base_url}: HTTP 500: ") and "CUDA out of memory" in failed["error"]
    assert failed["model_version"] == llm.model
    assert task is not None and task["state"] == "failed" and task["reward"] == 0.0


async def test_malformed_payloads_on_every_subject_stop_no_service(tmp_path: Path) -> None:
    from engine.agents.bus import connect

    home = tmp_path / "home"
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 6))
    with nats_server(home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(llm, url=server.url, token_file=str(token_path(home)))
        nc = await connect(settings_address(settings), "vandal")
        js = nc.jetstream()
        from engine.agents.bus import ensure_stream

        await ensure_stream(js, settings.stream)
        garbage = [
            ("tasks.math", b"{not json"),
            ("tasks.math", b'{"type": "result"}'),
            ("results.math", b'{"type": "result", "task_id": "x", "sneaky": 1}'),
            ("training.rollouts", b"[1, 2]"),
            ("feedback.scored", b'{"type": "feedback", "score": 3.0}'),
            ("model.updates", b'{"type": "model_update"}'),
            ("status.workers.w9", b"\xff\xfe"),
        ]
        for subject, payload in garbage:
            await js.publish(subject, payload)
        await nc.publish("control.manager", b'{"type": "control", "action": "explode"}')
        await nc.publish("control.workers", b"not even json")
        summary = await headless(home, settings, specs, limit=None)
        await nc.close()
    assert (summary["done"], summary["failed"]) == (6, 0)
    with Store(home / "carl.db") as store:
        rejected = store.conn.execute(
            "SELECT subject, reason FROM agent_events WHERE status='rejected' ORDER BY id"
        ).fetchall()
    # Core publishes on the plane's subjects are captured by the stream too: every one is in the audit.
    assert [s for s, _ in rejected] == [s for s, _ in garbage] + ["control.manager", "control.workers"]
    assert all(reason for _, reason in rejected)


def settings_address(settings: AgentsSettings) -> Any:
    from engine.agents.bus import resolve_address

    return resolve_address(settings)


async def test_an_http_worker_loads_each_adapter_into_vllm_and_requests_it(tmp_path: Path) -> None:
    from engine.agents.bus import connect, ensure_stream, publish
    from engine.agents.events import ModelUpdateEvent

    home = tmp_path / "home"
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 2))
    with nats_server(home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(
            llm, workers=1, url=server.url, token_file=str(token_path(home)), endpoint_lora=True
        )
        nc = await connect(settings_address(settings), "trainer")
        js = nc.jetstream()
        await ensure_stream(js, settings.stream)
        adapter = tmp_path / "adapters" / "agents-train-v0001"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")  # the server reads it from its disk, as vLLM does
        await publish(
            js,
            ModelUpdateEvent(
                model_version="agents-train-v0001", checkpoint_path=str(adapter), base_model=llm.model
            ),
        )
        summary = await headless(home, settings, specs, limit=None)
        await nc.close()
        loads = [r.json for r in llm.requests if r.path == "/v1/load_lora_adapter"]
        models = [r.json["model"] for r in llm.requests if r.path == "/v1/chat/completions"]
    assert loads == [{"lora_name": "agents-train-v0001", "lora_path": str(adapter)}]
    assert models == ["agents-train-v0001"] * 2  # the name the server loaded is the name requested
    assert summary["model_versions"] == {"agents-train-v0001": 2}


async def test_alarms_fire_on_live_data_and_are_stored_with_their_reason(tmp_path: Path) -> None:
    """A Claude manager that praises wrong answers (collusion, reward hacking), and a worker that sits on
    a task past the ack wait (stuck)."""
    from messages_server import MessagesServer

    home = tmp_path / "home"
    n = 12
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", n))

    def wrong(request: dict[str, Any]) -> str:
        return solve(request).replace("</answer>", "0</answer>")  # 15 becomes 150: the verifier fails

    with OpenAIServer(responder=wrong) as llm, MessagesServer() as claude:
        for _ in range(n):
            claude.text(['{"correctness": 1, "completeness": 1, "quality": 0.9, "feedback": "Perfect."}'])
        llm.hold(lambda body: "(task 11)" in body["messages"][-1]["content"])
        settings = http_settings(llm, workers=1, feedback="claude", concurrency=12)
        settings.alarms.window = 6
        run = asyncio.create_task(
            headless(home, settings, specs, limit=None, api_key="sk-test", base_url=claude.base_url)
        )
        try:
            assert await asyncio.to_thread(llm.wait_held, 1, 60.0)
            await _alarm(home / "carl.db", "stuck_worker")  # the held task is past the 2 s ack wait
            llm.release()
            summary = await asyncio.wait_for(run, 120)
        finally:
            await _settled(llm, run)
    assert summary["done"] == n and summary["mean_verifier"] == 0.0
    reader = StoreReader(home / "carl.db")
    try:
        alarms = {a["kind"]: a for a in reader.agent_alarms(20)}
    finally:
        reader.close()
    assert {"collusion", "reward_hacking", "stuck_worker"} <= set(alarms)
    assert alarms["collusion"]["worker_id"] == "w1" and "verifier" in alarms["collusion"]["reason"]
    assert "w1" in alarms["stuck_worker"]["reason"]


async def _alarm(db: Path, kind: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            reader = StoreReader(db)
            try:
                found = [a for a in reader.agent_alarms(50) if a["kind"] == kind]
            finally:
                reader.close()
            if found:
                return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {kind} alarm")
