"""http workers feed training: they ask the OpenAI-compatible server for each token's log-prob and id
(`logprobs`, vLLM's `return_tokens_as_token_ids` and `return_token_ids`), their rollouts carry exactly
what the server gave, and the trainer trains on them. A server that gives neither makes `--train`
refuse http workers up front, in one line, before any worker starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_server import OpenAIServer, logprob_of, token_id_of, tokens_of
from test_agents_plane import arithmetic_tasks, http_settings, solve

from engine.agents.backends import HttpBackend, WorkerError, behaviour_of
from engine.agents.carl_agents import headless
from engine.agents.events import TaskEvent
from engine.agents.plane_settings import TrainerSettings
from engine.agents.tasks import load_tasks
from engine.store import StoreReader


def sum_or_ok(request: dict[str, Any]) -> str:
    """The sum for the arithmetic tasks; anything else (the plane's probe) gets a short reply."""
    return solve(request) if "What is" in request["messages"][-1]["content"] else "OK."


def test_the_behaviour_policy_is_read_as_vllm_gives_it() -> None:
    with OpenAIServer(responder=sum_or_ok) as llm:
        backend = HttpBackend(http_settings(llm))
        answer = backend.answer(TaskEvent(manager_id="m", task_type="math", prompt="What is 2 + 3?"))
        body = llm.requests[-1].json
        backend.close()
    assert (body["logprobs"], body["return_tokens_as_token_ids"], body["return_token_ids"]) == (
        True,
        True,
        True,
    )
    tokens = tokens_of(answer.reply)
    assert answer.token_ids == [token_id_of(t) for t in tokens]
    assert answer.logprobs == [logprob_of(t) for t in tokens]
    prompt = [t for m in body["messages"] for t in tokens_of(m["content"])]
    assert answer.prompt_token_ids == [token_id_of(t) for t in prompt]
    # The ids spelled in the log-prob entries serve when the choice has none; malformed ones give none.
    choice = {"logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}
    assert behaviour_of({"prompt_token_ids": [1, 2]}, choice) == ([1, 2], [7], [-0.5])
    choice = {"logprobs": {"content": [{"token": "hi", "logprob": -0.5}]}, "token_ids": [3, 4]}
    assert behaviour_of({}, choice) == ([], [], [-0.5])  # two ids for one log-prob: not the same tokens


@pytest.mark.slow
@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
async def test_http_workers_feed_training_with_the_servers_log_probs_and_token_ids(
    tmp_path: Path, tiny_home: Path
) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 2))
    train = TrainerSettings(enabled=True, group_size=2, groups_per_update=1, publish_every=1, max_updates=2)
    with OpenAIServer(responder=sum_or_ok) as llm:
        settings = http_settings(llm, workers=1, ack_wait_s=60, train=train)
        summary = await headless(tiny_home, settings, specs, limit=4)
    assert summary["done"] == 4  # two prompts, each asked twice: two GRPO groups
    reader = StoreReader(tiny_home / "carl.db")
    try:
        rollouts = [json.loads(r["payload"]) for r in reader.agent_audit(kind="rollout")]
        run = next(r for r in reader.runs() if r.source_kind == "agents")
        samples = reader.series(run.id, "samples")
        updates = [json.loads(r["payload"]) for r in reader.agent_audit(kind="model_update")]
    finally:
        reader.close()
    for rollout in rollouts:
        tokens = tokens_of(solve({"messages": [{"content": rollout["prompt"]}]}))
        assert rollout["response_token_ids"] == [token_id_of(t) for t in tokens]
        assert rollout["token_logprobs"] == [logprob_of(t) for t in tokens]
        assert rollout["prompt_token_ids"] and rollout["temperature"] == 1.0
    # Every rollout trained: two updates, each of one group of two.
    assert (run.status, run.last_step) == ("finished", 2)
    assert list(samples.mean) == [2.0, 2.0]
    assert [u["model_version"] for u in updates] == ["agents-train-v0001", "agents-train-v0002"]
    log = (tiny_home / "logs" / "agents-trainer.log").read_text()
    assert "not training on it" not in log


def test_a_server_that_gives_neither_makes_train_refuse_http_workers_up_front(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with OpenAIServer(responder=sum_or_ok, behaviour=False) as llm:
        (home / "agents.yaml").write_text(
            f"agents:\n  worker_kind: http\n  endpoint: {llm.base_url}\n  endpoint_model: {llm.model}\n"
            "  task_type: math\n"
        )
        tasks = arithmetic_tasks(tmp_path / "tasks.jsonl", 2)
        out = subprocess.run(
            [sys.executable, "-m", "engine.cli", "agents", "run", "--tasks", str(tasks), "--train"],
            capture_output=True,
            text=True,
            env={**os.environ, "CARL_HOME": str(home)},
            timeout=120,
            check=False,
        )
        asked = [r for r in llm.requests if r.path == "/v1/chat/completions"]
        base_url = llm.base_url
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "--train: http workers cannot feed training" in out.stderr
    assert f"{base_url} gives neither per-token log-probs nor token ids" in out.stderr
    assert len(asked) == 1  # the one probe: no worker started, no task handed out
    assert not list(home.glob("logs/agents-*.log"))


async def test_the_same_check_passes_a_server_that_gives_them(tmp_path: Path) -> None:
    from engine.agents.backends import check_trainable_endpoint

    train = TrainerSettings(enabled=True)
    with OpenAIServer(responder=sum_or_ok) as llm:
        check_trainable_endpoint(http_settings(llm, train=train))  # no error
    with OpenAIServer(responder=sum_or_ok, behaviour=False) as llm, pytest.raises(WorkerError):
        check_trainable_endpoint(http_settings(llm, train=train))
