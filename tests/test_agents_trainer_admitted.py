"""The plane's trainer trains only on rollouts the audit admitted. Anyone holding the plane's token can
publish on `training.rollouts`; the audit stores each rollout with admission's verdict (a task that was
assigned, answered by the worker the rollout names), and the trainer reads that verdict before it trains
(engine/agents/verdicts.py). A real trainer process, a real nats-server and the real audit."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from agents_support import address_of, audit_running, jetstream, nats_server
from test_agents_trainer_durable import GROUP, group, rows, send, start_trainer, unacknowledged, wait_for

from engine.agents.bus import close, trainer_subscription
from engine.agents.config import AgentsSettings, TrainerSettings
from engine.agents.events import TrainingRolloutEvent
from engine.store import Store

pytestmark = pytest.mark.slow


async def forge(server: Any, rollouts: list[TrainingRolloutEvent]) -> None:
    """Rollouts published straight onto `training.rollouts` by a token holder: no task or result before
    them, and no message id (so the stream does not take them for repeats of the real ones)."""
    nc, js = await jetstream(address_of(server))
    try:
        await (await trainer_subscription(js)).unsubscribe()
        for rollout in rollouts:
            await js.publish(rollout.subject(), rollout.encode())
    finally:
        await close(nc)


def test_the_trainer_trains_only_on_rollouts_the_audit_admitted(tiny_home: Path) -> None:
    home = tiny_home
    train = TrainerSettings(enabled=True, group_size=GROUP, groups_per_update=1, publish_every=1)
    settings_file = home / "plane.json"
    settings = AgentsSettings(model="carl-tiny", temperature=1.0, train=train)
    settings_file.write_text(settings.model_dump_json())
    never_assigned = group(0)  # a whole group for tasks nobody assigned
    legit, stolen = group(1), group(2)
    # The second group's tasks were answered by w1; rollouts naming w2 claim them.
    stolen_claims = [r.model_copy(update={"worker_id": "w2"}) for r in stolen]
    with (
        nats_server(home / "nats-home") as server,
        Store(home / "carl.db") as store,
        audit_running(address_of(server), home / "carl.db"),
    ):
        trainer = start_trainer(home, settings_file, server)
        try:
            asyncio.run(forge(server, never_assigned))
            asyncio.run(send(server, stolen))  # tasks, w1's results and w1's rollouts: admitted
            asyncio.run(forge(server, stolen_claims))
            asyncio.run(send(server, legit))
            wait_for(lambda: rows(store).get(legit[-1].task_id) == ("used", 2), "the admitted groups trained")
            wait_for(lambda: asyncio.run(unacknowledged(server)) == 0, "every rollout answered")
            trainer.send_signal(signal.SIGTERM)
            assert trainer.wait(120) == 0
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait(30)
        used = rows(store)
        verdicts = dict(
            store.conn.execute(
                "SELECT task_id || '/' || worker_id, reason FROM agent_events WHERE kind='rollout'"
            ).fetchall()
        )

    # Trained: the two admitted groups, w1's rollouts of the stolen tasks included, each once.
    assert sorted(used) == sorted(r.task_id for r in [*stolen, *legit])
    assert {step for _, step in used.values()} == {1, 2}
    # Refused, with the audit's reason: the tasks nobody assigned, and w2's claims on w1's answers.
    for r in never_assigned:
        assert verdicts[f"{r.task_id}/w1"] == f"task {r.task_id} was never assigned"
    for r in stolen:
        assert verdicts[f"{r.task_id}/w2"] == f"task {r.task_id} was answered by worker w1, not w2"
    log = (home / "trainer.log").read_text()
    assert f"task {never_assigned[0].task_id}: refused by the audit: task {never_assigned[0].task_id}" in log
    assert f"task {stolen[0].task_id}: refused by the audit: task {stolen[0].task_id} was answered by" in log
