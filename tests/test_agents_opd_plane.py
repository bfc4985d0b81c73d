"""The plane learns from the manager's words, end to end: a headless plane with `--train --opd` on demo tasks
that all ask for the same tool (so each later group is a similar task to the earlier ones). The manager hints
at every answer the verifier fails, the hints travel on `opd.hints` and with the rollouts, the trainer process
distils from them, and the manager is judged (agreement with the verifier, hints' help); with
`--manager-model` its own model writes the hints and a second trainer trains it on their judged help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.agents.carl_agents import headless
from engine.agents.events import MANAGER_TARGET, ModelUpdateEvent, ResultEvent
from engine.agents.hints import Signal
from engine.agents.manager_model import ModelHints
from engine.agents.plane_settings import AgentsSettings, TrainerSettings
from engine.agents.tasks import demo_tasks
from engine.store import StoreReader

pytestmark = pytest.mark.slow


def same_tool_tasks(count: int) -> list:
    tasks = [t for t in demo_tasks() if t.metadata["answer_tool"] == "get_weather"]
    return tasks[:count]


def train_settings(**changes: object) -> AgentsSettings:
    train = TrainerSettings(
        enabled=True, group_size=2, groups_per_update=1, publish_every=1, max_updates=3, opd=True
    )
    return AgentsSettings(
        workers=1,
        worker_kind="model",
        max_new_tokens=12,
        concurrency=2,
        ack_wait_s=60,
        train=train,
        **changes,
    )


async def test_a_headless_run_with_opd_stores_hints_opd_advantages_and_the_managers_quality(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    summary = await headless(home, train_settings(), same_tool_tasks(3), limit=6)
    assert summary["done"] + summary["failed"] == 6
    assert summary["hints"] >= 1 and summary["manager_agreement"] is not None

    reader = StoreReader(home / "carl.db")
    try:
        run = next(r for r in reader.runs() if r.name == "agents-train")
        keys = set(reader.metric_keys(run.id))
        assert {"opd/samples", "opd/kl", "opd/advantage_mean", "timing/teacher_s"} <= keys
        hints = [json.loads(r["payload"]) for r in reader.agent_audit(kind="hint", limit=None)]
        assert len(hints) == summary["hints"]
        assert all(h["source"] == "verifier" and "get_weather" in h["hint"] for h in hints)
        tasks = [reader.agent_task(h["task_id"]) for h in hints]
        assert all(t is not None and t["hint"] == h["hint"] for t, h in zip(tasks, hints, strict=True))
        distilled = [t for t in tasks if t and t["opd_advantage"]]
        assert distilled, "no hinted task got its OPD advantages stored"
        for task in distilled:
            assert len(task["opd_advantage"]) == len(task["opd_tokens"]) == task["tokens"]
            assert task["opd_step"] >= 1 and task["opd_kl"] is not None
        quality = reader.manager_quality()
        assert quality["agreement"][1] == 6  # every result was verified
        assert 0.0 <= quality["agreement"][0] <= 1.0
        if summary["hint_help"] is not None:
            assert quality["hint_help"][0] == pytest.approx(summary["hint_help"], abs=1e-9)
        rollouts = reader.rollouts(run.id)
        assert any("opd_advantage" in (r["extra"] or {}) for r in rollouts)
    finally:
        reader.close()


async def test_the_managers_own_model_writes_hints_and_is_trained_on_their_help(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = train_settings(manager_model="carl-tiny")
    summary = await headless(home, settings, same_tool_tasks(4), limit=8)
    assert summary["hints"] >= 2

    reader = StoreReader(home / "carl.db")
    try:
        hints = [json.loads(r["payload"]) for r in reader.agent_audit(kind="hint", limit=None)]
        assert hints and {h["source"] for h in hints} <= {"manager_model", "verifier"}
        written = [h for h in hints if h["source"] == "manager_model"]
        assert written and all(h["manager_version"] for h in written)
        rollouts = [json.loads(r["payload"]) for r in reader.agent_audit(kind="manager_rollout", limit=None)]
        judged = [json.loads(r["payload"]) for r in reader.agent_audit(kind="judged", limit=None)]
        helps = {j["task_id"]: j["value"] for j in judged if j["kind"] == "hint_help"}
        for rollout in rollouts:  # each rollout of the manager's model is a judged hint, its reward the help
            assert rollout["task_id"] in helps
            assert rollout["reward"] == pytest.approx((helps[rollout["task_id"]] + 1) / 2)
        manager_run = next((r for r in reader.runs() if r.name == "agents-manager"), None)
        assert len(rollouts) >= settings.train.group_size  # one similar-task group of judged hints at least
        assert manager_run is not None and manager_run.last_step >= 1
        updates = [json.loads(r["payload"]) for r in reader.agent_audit(kind="model_update", limit=None)]
    finally:
        reader.close()
    # The manager trainer's adapters go to the manager only (model.manager), never to the workers.
    own = [u for u in updates if u["target_worker_id"] == MANAGER_TARGET]
    assert own and all(u["run"] == "agents-manager" for u in own)
    assert all(u["run"] == "agents-train" for u in updates if u["target_worker_id"] is None)
    # And the manager's model takes the newest of them in place, as a worker does, and writes with it.
    hints = ModelHints(settings, home)
    update = ModelUpdateEvent.model_validate(own[-1])
    assert (
        await hints.swap(update, Path(update.checkpoint_path))
        == f"manager model serves {update.model_version}"
    )
    task = same_tool_tasks(1)[0].event("manager")
    result = ResultEvent(task_id=task.task_id, worker_id="w1", task_type="demo", status="success", result="x")
    written = await hints.hint(task, result, Signal("verifier", "expected a call to get_weather"))
    assert written.source == "manager_model" and written.manager_version == update.model_version


def test_opd_without_training_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "agents", "run", "--opd", "--limit", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "CARL_HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "carl: --opd needs --train: on-policy distillation is part of training"
    ]
