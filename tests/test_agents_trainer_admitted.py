"""The plane's trainer trains only on rollouts the audit admitted. Anyone holding the plane's token can
publish on `training.rollouts`; the audit stores each rollout with admission's verdict (a task that was
assigned, answered by the worker the rollout names), and the trainer reads that verdict before it trains
(engine/agents/verdicts.py). A real trainer process, a real nats-server and the real audit."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from test_agents_trainer_durable import (
    audited_plane,
    group,
    plane_settings,
    rows,
    send,
    start_trainer,
    unacknowledged,
    wait_for,
)

pytestmark = pytest.mark.slow


def test_the_trainer_trains_only_on_rollouts_the_audit_admitted(tiny_home: Path) -> None:
    home = tiny_home
    settings_file = plane_settings(home, publish_every=1)
    never_assigned = group(0)  # a whole group for tasks nobody assigned
    legit, stolen = group(1), group(2)
    # The second group's tasks were answered by w1; rollouts naming w2 claim them.
    stolen_claims = [r.model_copy(update={"worker_id": "w2"}) for r in stolen]
    with audited_plane(home) as (server, store):
        trainer = start_trainer(home, settings_file, server)
        try:
            asyncio.run(send(server, never_assigned, forged=True))
            asyncio.run(send(server, stolen))  # tasks, w1's results and w1's rollouts: admitted
            asyncio.run(send(server, stolen_claims, forged=True))
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
