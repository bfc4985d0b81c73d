"""Training from the plane, end to end: model workers on the tiny model answer the demo tasks in GRPO
groups, the trainer process trains a LoRA adapter of that same model from the rollouts (recorded as a
run with its Phi and reward charts), publishes each adapter, and the workers hot-swap it without
restarting and report it in their next results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.agents.carl_agents import headless
from engine.agents.plane_settings import AgentsSettings, TrainerSettings
from engine.agents.tasks import demo_tasks
from engine.store import StoreReader

pytestmark = pytest.mark.slow


async def test_the_plane_trains_the_served_model_and_the_workers_swap_in_each_adapter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    train = TrainerSettings(enabled=True, group_size=2, groups_per_update=1, publish_every=1, max_updates=2)
    settings = AgentsSettings(
        workers=1, worker_kind="model", max_new_tokens=12, concurrency=2, ack_wait_s=60, train=train
    )
    summary = await headless(home, settings, demo_tasks(), limit=6)
    assert summary["done"] == 6

    reader = StoreReader(home / "carl.db")
    try:
        run = next(r for r in reader.runs() if r.source_kind == "agents")
        assert (run.name, run.status, run.backend, run.last_step) == ("agents-train", "finished", "torch", 2)
        keys = set(reader.metric_keys(run.id))
        assert {"loss", "kl", "reward", "rewards/prm/mean", "rewards/outcome/mean", "phi/mean"} <= keys
        phi = reader.series(run.id, "phi/mean")
        assert len(phi.last) == 2 and all(0.0 < v <= 1.0 for v in phi.mean)
        updates = [json.loads(r["payload"]) for r in reader.agent_audit(kind="model_update")]
        assert [u["model_version"] for u in updates] == ["agents-train-v0001", "agents-train-v0002"]
        assert all(Path(u["checkpoint_path"]).is_dir() and u["base_model"] == "carl-tiny" for u in updates)
        statuses = [json.loads(r["payload"]) for r in reader.agent_audit(kind="worker_status", limit=None)]
        workers = reader.agent_workers()
    finally:
        reader.close()
    # One worker process throughout, which swapped each adapter in and ends serving the last one.
    assert len({s["pid"] for s in statuses}) == 1
    details = [s["detail"] for s in statuses]
    assert "serving adapter agents-train-v0001" in details and "serving adapter agents-train-v0002" in details
    assert workers[0]["model_version"] == "agents-train-v0002"

    # A worker that joins later serves the newest adapter from its first task on, and says so in its results.
    settings = AgentsSettings(workers=1, worker_kind="model", max_new_tokens=12, ack_wait_s=60)
    summary = await headless(home, settings, demo_tasks(), limit=2)
    assert summary["model_versions"] == {"agents-train-v0002": 2}
