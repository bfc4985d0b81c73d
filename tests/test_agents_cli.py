"""`carl agents ...` as a user runs it: real processes, a real nats-server and engine, one-line errors;
the plane under the engine driven through the command queue; the token kept out of every place it could
leak to; the Claude manager over the real SDK against the local Messages API server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents_support import nats_server
from messages_server import MessagesServer
from openai_server import OpenAIServer
from support import end_all, wait_for
from test_agents_plane import arithmetic_tasks, http_settings, solve

from engine.agents.carl_agents import headless
from engine.agents.launcher import child_argv
from engine.agents.server import read_token, token_path
from engine.agents.tasks import load_tasks
from engine.control import engine_status, stop_engine
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def carl(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_events_are_printed_filtered_and_as_json_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 6)
    with OpenAIServer(responder=solve) as llm:
        (home).mkdir()
        (home / "agents.yaml").write_text(
            f"agents:\n  workers: 2\n  worker_kind: http\n  endpoint: {llm.base_url}\n"
            f"  endpoint_model: {llm.model}\n"
            "  task_type: math\n"
        )
        # The worker that pulls task 0 waits on it until both workers have said they are up: on a loaded
        # machine one could do all six before the other has started, and the other would never be seen.
        llm.hold(lambda body: "(task 0)" in body["messages"][-1]["content"])
        out, err = tmp_path / "run.out", tmp_path / "run.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            run = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "agents", "run", "--tasks", str(tasks), "--json"],
                env={**os.environ, "CARL_HOME": str(home)},
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        try:
            assert llm.wait_held(1, 60.0)
            wait_for(lambda: workers_seen(home) == {"w1", "w2"}, what="both workers up", proc=run)
            llm.release()
            run.wait(180)
        finally:
            llm.release()
            end_all([run])
    assert run.returncode == 0, err.read_text()
    summary = json.loads(out.read_text())
    assert summary["done"] == 6 and summary["stored"]["rollout"] == 6

    lines = carl(home, "agents", "events", "--json", "--limit", "0").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == summary["stored"]["rejected"] + sum(
        v for k, v in summary["stored"].items() if k != "rejected"
    )
    for event in events:
        assert {"type", "subject", "task_id", "worker_id", "environment", "step_scores", "score"} <= set(
            event
        )
    rollouts = [
        json.loads(line)
        for line in carl(home, "agents", "events", "--json", "--type", "rollout").stdout.splitlines()
    ]
    assert len(rollouts) == 6 and all(
        e["type"] == "rollout" and e["subject"] == "training.rollouts" for e in rollouts
    )
    assert all(
        e["step_scores"] and all(0 <= s <= 1 for s in e["step_scores"]) and e["environment"] == "chat"
        for e in rollouts
    )
    assert all(e["score"] == e["reward"] and e["verifier_score"] == 1.0 for e in rollouts)
    # Each rollout lists the dimensions that scored it (the others had no evidence and were left out).
    assert all(
        e["profile"] == "chat" and set(e["dimensions"]) == {"prm", "halugate", "length"} for e in rollouts
    )
    one = rollouts[0]["task_id"]
    of_task = [
        json.loads(line)
        for line in carl(home, "agents", "events", "--json", "--task", one[:8]).stdout.splitlines()
    ]
    assert {e["type"] for e in of_task} == {
        "task",
        "worker_status",
        "result",
        "rollout",
        "feedback",
        "judged",  # the manager's feedback against the verifier (every answer was right: no hint)
    }  # busy: on it
    assert {e["task_id"] for e in of_task} == {one}
    judged = carl(home, "agents", "events", "--type", "judged").stdout.splitlines()
    assert len(judged) == 6 and all(re.search(r" agreement [01]\.\d{3}$", line) for line in judged), judged
    status = json.loads(carl(home, "agents", "status", "--json").stdout)
    assert sorted(w["worker_id"] for w in status["workers"]) == ["w1", "w2"]
    assert sum(w["tasks_done"] for w in status["workers"]) == 6
    # Which worker pulls which task is a race (under load one may take all six): each worker's filtered
    # results are the ones the store counts for it, the other worker's none.
    for worker in status["workers"]:
        ident = worker["worker_id"]
        of_worker = carl(home, "agents", "events", "--worker", ident, "--type", "result").stdout.splitlines()
        assert len(of_worker) == worker["tasks_done"]
        assert all(f" {ident} " in line and "result" in line for line in of_worker)


def workers_seen(home: Path) -> set[str]:
    """The workers whose status the audit has stored."""
    reader = StoreReader(home / "carl.db")
    try:
        return {w["worker_id"] for w in reader.agent_workers()}
    finally:
        reader.close()


def test_bad_input_is_one_line_naming_the_place(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bad_tasks = tmp_path / "tasks.jsonl"
    bad_tasks.write_text(
        '{"prompt": "a", "task_type": "math", "environment": "chat"}\n'
        '{"prompt": "b", "task_type": "a.b", "environment": "chat"}\n'
    )
    assert one_line_error(carl(home, "agents", "run", "--tasks", str(bad_tasks))) == (
        f"carl: {bad_tasks}:2: task_type: must be one subject token (got 'a.b')"
    )
    config = tmp_path / "agents.yaml"
    config.write_text("agents:\n  judge: offline\n  workers: many\n")
    line = one_line_error(carl(home, "agents", "run", "--config", str(config)))
    assert line.startswith(f"carl: {config}:3: agents.workers: Input should be a valid integer")
    line = one_line_error(carl(home, "agents", "run", "--workers", "100"))
    assert line == "carl: agents.workers (from the command line): Input should be less than or equal to 64"
    line = one_line_error(carl(home, "agents", "run", "--url", "http://example.com"))
    assert line.startswith("carl: ") and "'http://example.com' is not a nats://" in line


def test_a_worker_with_a_wrong_token_or_url_stops_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with nats_server(tmp_path / "server") as server:
        wrong = tmp_path / "token"
        wrong.write_text("wrong\n")
        line = one_line_error(
            carl(
                home,
                "agents",
                "worker",
                "--kind",
                "http",
                "--endpoint",
                "http://127.0.0.1:9/v1",
                "--url",
                server.url,
                "--token-file",
                str(wrong),
            )
        )
        assert line == f"carl: {server.url}: authorization violation (wrong or missing token or credentials)"
        port = server.port
    line = one_line_error(
        carl(
            home,
            "agents",
            "worker",
            "--kind",
            "http",
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--url",
            f"nats://127.0.0.1:{port}",
        )
    )
    assert line == f"carl: nats://127.0.0.1:{port}: cannot connect (nothing answers there)"


def command(home: Path, verb: str, args: dict[str, Any] | None = None) -> tuple[str, str]:
    """Queue an engine command as the control room does, and wait for its outcome."""
    with Store(home / "carl.db") as store:
        command_id = store.enqueue_command(verb, args or {}, target="engine", origin="tui")

        def finished() -> tuple[str, str] | None:
            state, result = store.conn.execute(
                "SELECT state, result FROM commands WHERE id=?", (command_id,)
            ).fetchone()
            return (state, result) if state in ("done", "failed") else None

        return wait_for(finished, what=f"{verb} answered")


def overview(home: Path) -> dict[str, Any]:
    reader = StoreReader(home / "carl.db")
    try:
        return reader.agents_overview()
    finally:
        reader.close()


def test_the_engine_runs_the_plane_and_obeys_the_control_room(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with OpenAIServer(responder=solve) as llm:
        tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 10)
        # The ack wait outlasts the test: the held task is never redelivered to w2 (it would hold w2 too,
        # and w2's stop would wait for it), however slowly a loaded machine gets through the steps below.
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            "  task_type: math\n  concurrency: 4\n  ack_wait_s: 600\n"
        )
        # Task 2 stays in the worker's hands until released: the manager cannot finish before that.
        llm.hold(lambda body: "(task 2)" in body["messages"][-1]["content"])
        try:
            up = carl(home, "agents", "up", "--workers", "1", "--tasks", str(tasks), "--limit", "10")
            assert up.returncode == 0, up.stderr
            assert re.match(
                r"agents plane up on nats://127\.0\.0\.1:\d+: manager, 1 worker on .*tasks\.jsonl tasks",
                up.stdout,
            )
            assert llm.wait_held(1, 60.0)

            assert command(home, "agents_pause") == ("done", "manager paused: no new tasks until resumed")
            assert command(home, "agents_resume") == ("done", "manager assigning: assigning again")
            assert command(home, "agents_add_worker") == ("done", "worker w2 idle: serving test-model")
            wait_for(
                lambda: (overview(home)["manager"] or {}).get("done", 0) >= 8, what="w2 takes the other tasks"
            )
            assert command(home, "agents_stop_worker", {"worker_id": "w2"}) == (
                "done",
                "worker w2 stopped: stopped on request",
            )

            # The server dies: the engine restarts it on the same port, and the plane carries on.
            server = overview(home)["server"]
            os.kill(server["pid"], signal.SIGKILL)
            wait_for(
                lambda: (
                    overview(home)["server"]["state"] == "up"
                    and overview(home)["server"]["pid"] != server["pid"]
                ),
                what="nats-server restarted",
            )
            assert (
                overview(home)["server"]["port"] == server["port"]
                and overview(home)["server"]["restarts"] == 1
            )
            llm.release()
            wait_for(
                lambda: (overview(home)["manager"] or {}).get("state") == "done",
                timeout=120,
                what="all tasks",
            )
            status = carl(home, "agents", "status")
            assert "manager done: 10/10 assigned" in status.stdout and "10 done" in status.stdout
            workers = {w["worker_id"]: w for w in overview(home)["workers"]}
            assert (
                workers["w2"]["state"] == "stopped"
                and workers["w1"]["tasks_done"] + workers["w2"]["tasks_done"] == 10
            )

            down = carl(home, "agents", "down")
            assert down.stdout.strip() == "agents plane stopped"
            processes = (overview(home)["plane"] or {}).get("processes") or []
            assert processes == [] and overview(home)["server"]["state"] == "stopped"
        finally:
            llm.release()
            stop_engine(home)
    assert engine_status(home).state == "down"


async def test_the_token_stays_out_of_logs_store_argv_and_claude(tmp_path: Path) -> None:
    home = tmp_path / "home"
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 4))
    with OpenAIServer(responder=solve) as llm, MessagesServer() as claude:
        for _ in specs:
            claude.text(['{"correctness": 0.9, "completeness": 1, "quality": 0.8, "feedback": "Right sum."}'])
        settings = http_settings(llm, feedback="claude")
        summary = await headless(
            home, settings, specs, limit=None, api_key="sk-test", base_url=claude.base_url
        )
        requests = [json.dumps(r.json) for r in claude.requests]
    assert summary["done"] == 4 and summary["mean_feedback"] == pytest.approx(0.9)
    token = read_token(token_path(home))
    assert len(requests) == 4 and all(token not in r for r in requests)
    with Store(home / "carl.db") as store:
        sources = {r[0] for r in store.conn.execute("SELECT feedback_source FROM agent_tasks")}
        assert sources == {"claude"}
    assert token.encode() not in (home / "carl.db").read_bytes()
    for path in (home / "logs").iterdir():
        assert token not in path.read_text(errors="replace"), path
    settings_file = home / "agents" / "plane.json"
    assert token not in settings_file.read_text()
    argv = child_argv("worker", home, settings_file, _address(home))
    assert token not in " ".join(argv) and "--token-file" in argv


def _address(home: Path) -> Any:
    from engine.agents.bus import Address

    return Address("nats://127.0.0.1:4222", str(token_path(home)), local=True)


def test_a_killed_engine_comes_back_with_one_plane_not_two(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with OpenAIServer(responder=solve) as llm:
        tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 10)
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            "  task_type: math\n  rate: 5\n"
        )
        old: set[int] = set()
        try:
            assert carl(home, "agents", "up", "--workers", "1", "--tasks", str(tasks)).returncode == 0
            before = overview(home)
            old = {p["pid"] for p in before["plane"]["processes"]} | {before["server"]["pid"]}
            wait_for(
                lambda: (
                    len([p for p in overview(home)["plane"]["processes"] if p["state"] == "running"]) == 2
                ),
                what="manager and worker running",
            )
            killed = engine_status(home).pid
            os.kill(killed, signal.SIGKILL)
            from engine.control import start_engine
            from engine.control.pidfile import pid_alive

            # SIGKILL is delivered asynchronously: until the process is gone it still reads as the engine,
            # and a start then (rightly) starts none. The known point is its death, not a sleep.
            wait_for(lambda: not pid_alive(killed), what="the killed engine gone")
            start_engine(home)
            wait_for(
                lambda: (
                    overview(home)["server"]["pid"] not in old and overview(home)["server"]["state"] == "up"
                ),
                what="the plane back up",
            )
            after = overview(home)
            assert after["server"]["port"] == before["server"]["port"]  # clients find it where it was
            for pid in old:
                assert not _alive(pid), f"a process of the killed engine's plane is still running: {pid}"
            roles = sorted(p["role"] for p in after["plane"]["processes"])
            assert roles == ["manager", "worker"]
        finally:
            carl(home, "agents", "down")
            stop_engine(home)
            for pid in old:  # never leave the killed engine's plane behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_down_while_the_engine_is_down_keeps_the_plane_down_when_the_engine_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with OpenAIServer(responder=solve) as llm:
        tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 4)
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            "  task_type: math\n  rate: 5\n"
        )
        try:
            assert carl(home, "agents", "up", "--workers", "1", "--tasks", str(tasks)).returncode == 0
            wait_for(
                lambda: [p["state"] for p in overview(home)["plane"]["processes"]] == ["running", "running"],
                what="manager and worker running",
            )
            stop_engine(home)  # the plane stops with it, and is still wanted
            assert carl(home, "agents", "status").stdout.startswith("plane up when the engine starts")
            down = carl(home, "agents", "down")
            assert down.stdout.startswith("the engine is not running: the agents plane is marked down")
            from engine.control import start_engine

            start_engine(home)
            # The engine restores the plane before it takes its first command: a control now finds none.
            assert command(home, "agents_pause") == ("failed", "the agents plane is not up (carl agents up)")
            assert overview(home)["plane"] == {"wanted": False}
        finally:
            stop_engine(home)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def test_the_engine_joins_an_existing_server_from_the_environment_and_starts_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with nats_server(tmp_path / "shared") as shared, OpenAIServer(responder=solve) as llm:
        token = tmp_path / "plane.token"
        token.write_text((tmp_path / "shared" / "nats" / "token").read_text())
        tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 4)
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            f"  task_type: math\n  token_file: {token}\n"
        )
        env = {**os.environ, "CARL_HOME": str(home), "CARL_NATS_URL": shared.url}
        try:
            up = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "engine.cli",
                    "agents",
                    "up",
                    "--workers",
                    "1",
                    "--tasks",
                    str(tasks),
                    "--limit",
                    "4",
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert up.returncode == 0, up.stderr
            assert f"agents plane up on {shared.url}" in up.stdout
            wait_for(lambda: (overview(home)["manager"] or {}).get("state") == "done", what="the tasks done")
            server = overview(home)["server"]
            assert server["state"] == "external" and server["local"] is False and server["pid"] is None
            assert not (home / "nats" / "server.conf").exists()  # no server of its own
        finally:
            carl(home, "agents", "down")
            stop_engine(home)
