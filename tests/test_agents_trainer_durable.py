"""The plane's trainer loses nothing: each rollout is stored before the stream hears it was received, so a
trainer killed with SIGKILL in the middle of a group, restarted (`--resume`), trains every rollout exactly
once in its run, the rollouts of a step it had not checkpointed included."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agents_support import address_of, audit_running, jetstream, nats_server

from engine.agents.bus import STREAM, TRAINER_DURABLE, close, publish, trainer_subscription
from engine.agents.events import ResultEvent, TaskEvent, TrainingRolloutEvent
from engine.agents.launcher import child_argv
from engine.agents.plane_settings import AgentsSettings, TrainerSettings
from engine.agents.spool import RolloutSpool
from engine.store import Store

pytestmark = pytest.mark.slow

GROUP = 2  # rollouts in a group; one group an optimizer step; a checkpoint every second step


def group(n: int) -> list[TrainingRolloutEvent]:
    """A GRPO group of rollouts the tiny model can train on (ids in its vocabulary, log-probs <= 0)."""
    group_id = f"group-{n}-{uuid.uuid4().hex[:6]}"
    return [
        TrainingRolloutEvent(
            task_id=f"task-{n}-{k}",
            worker_id="w1",
            task_type="demo",
            group_id=group_id,
            group_size=GROUP,
            prompt="What is 6 x 7?",
            response="42",
            prm_score=0.5,
            outcome_score=0.5,
            reward=0.2 + 0.6 * k,  # the group's rewards differ: it has an advantage to learn from
            model_version="base",
            prompt_token_ids=[5, 6, 7, 8],
            response_token_ids=[20 + n, 30 + k, 40],
            token_logprobs=[-1.5, -2.0, -0.7],
            temperature=1.0,
        )
        for k in range(GROUP)
    ]


def start_trainer(home: Path, settings_file: Path, server: Any, *extra: str) -> subprocess.Popen[bytes]:
    log = (home / "trainer.log").open("ab")
    return subprocess.Popen(
        child_argv("trainer", home, settings_file, address_of(server), *extra),
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def rows(store: Store) -> dict[str, tuple[str, int | None]]:
    """task id -> (state, step) of every stored rollout."""
    found = store.conn.execute("SELECT task_id, state, step FROM trainer_rollouts").fetchall()
    return {task: (state, step) for task, state, step in found}


def logged_steps(store: Store) -> dict[int, float]:
    """step -> the samples the step itself logged it trained on."""
    return dict(store.conn.execute("SELECT step, value FROM metrics WHERE key='samples'").fetchall())


async def send(server: Any, rollouts: list[TrainingRolloutEvent], *, forged: bool = False) -> None:
    """Each rollout after its task and the worker's result, as a plane sends them: the trainer trains only
    on rollouts the audit admitted (engine/agents/verdicts.py). `forged`: the rollouts alone, as a token
    holder would publish them straight onto `training.rollouts`, with no message id (so the stream does
    not take them for repeats of real ones)."""
    nc, js = await jetstream(address_of(server))
    try:
        await (await trainer_subscription(js)).unsubscribe()  # as the manager does: the consumer exists first
        for rollout in rollouts:
            if forged:
                await js.publish(rollout.subject(), rollout.encode())
                continue
            task = TaskEvent(task_id=rollout.task_id, manager_id="m", task_type="demo", prompt=rollout.prompt)
            answer = ResultEvent(
                task_id=rollout.task_id,
                worker_id=rollout.worker_id,
                task_type="demo",
                status="success",
                result=rollout.response,
            )
            for event in (task, answer, rollout):
                await publish(js, event)
    finally:
        await close(nc)


@contextmanager
def audited_plane(home: Path) -> Iterator[tuple[Any, Store]]:
    """Where a trainer runs: a nats-server, the store, and the audit storing the plane's events into it."""
    with (
        nats_server(home / "nats-home") as server,
        Store(home / "carl.db") as store,
        audit_running(address_of(server), home / "carl.db"),
    ):
        yield server, store


def plane_settings(home: Path, publish_every: int) -> Path:
    """The settings file of a training plane on the tiny model, one group an optimizer step."""
    train = TrainerSettings(enabled=True, group_size=GROUP, groups_per_update=1, publish_every=publish_every)
    settings_file = home / "plane.json"
    settings_file.write_text(
        AgentsSettings(model="carl-tiny", temperature=1.0, train=train).model_dump_json()
    )
    return settings_file


async def unacknowledged(server: Any) -> int:
    nc, js = await jetstream(address_of(server))
    try:
        info = await js.consumer_info(STREAM, TRAINER_DURABLE)
        return int(info.num_ack_pending + info.num_pending)
    finally:
        await close(nc)


def test_a_trainer_killed_mid_group_trains_every_rollout_exactly_once(tiny_home: Path) -> None:
    home = tiny_home
    settings_file = plane_settings(home, publish_every=2)
    groups = [group(n) for n in range(5)]
    everything = [r for g in groups for r in g]
    with audited_plane(home) as (server, store):
        trainer = start_trainer(home, settings_file, server)
        try:
            # Steps 1 and 2 (checkpointed with step 2), step 3 (not checkpointed), and half of the fourth
            # group.
            asyncio.run(send(server, [*groups[0], *groups[1], *groups[2], groups[3][0]]))
            wait_for(lambda: rows(store).get(groups[2][-1].task_id) == ("used", 3), "step 3")
            wait_for(lambda: len(rows(store)) == 7, "the half group stored")
            wait_for(lambda: asyncio.run(unacknowledged(server)) == 0, "every rollout acknowledged")
            assert rows(store)[groups[3][0].task_id] == ("waiting", None)
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait(30)

            # The restart carries on from the checkpoint at step 2: step 3's group trains again, as step 3.
            trainer = start_trainer(home, settings_file, server, "--resume")
            asyncio.run(send(server, [groups[3][1], *groups[4]]))
            wait_for(lambda: rows(store).get(groups[4][-1].task_id) == ("used", 5), "steps 4 and 5")
            trainer.send_signal(signal.SIGTERM)
            assert trainer.wait(120) == 0
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait(30)

        used = rows(store)
        steps = logged_steps(store)
        assert sorted(steps) == [1, 2, 3, 4, 5]
        # Exactly once: each rollout has one step, and each step logged as many samples as rollouts name it.
        assert all(state == "used" for state, _ in used.values()) and len(used) == len(everything)
        for step, samples in steps.items():
            assert samples == sum(1 for _, s in used.values() if s == step), step
        assert [used[r.task_id][1] for r in groups[3]] == [4, 4]
        run_id = store.run_id_by_name("agents-train")
        assert run_id is not None and store.run(run_id)["last_step"] == 5
        # What the checkpoints hold keeps only its step: the payloads are gone.
        spool = RolloutSpool(store, run_id)
        assert spool.counts() == {"used": len(everything)}
        kept = store.conn.execute("SELECT step FROM trainer_rollouts WHERE payload IS NOT NULL").fetchall()
        assert kept == [(5,)] * GROUP  # the checkpoint at step 4 holds the rest
        log = (home / "trainer.log").read_text()
        assert "3 stored rollouts back in their groups (2 to train again), 0 refused" in log


def test_a_group_given_up_stays_given_up_after_a_restart(tiny_home: Path, store: Store) -> None:
    """A lone rollout whose group never filled is dropped; the restarted trainer neither trains it nor
    takes it again, while a rollout still waiting comes back in its group with its age."""
    from engine.agents.trainer import PlaneTrainer

    now = [0.0]
    settings = TrainerSettings(enabled=True, group_size=GROUP, groups_per_update=1, publish_every=2)

    def trainer() -> PlaneTrainer:
        made = PlaneTrainer(
            settings,
            model="carl-tiny",
            home=tiny_home,
            store=store,
            temperature=1.0,
            group_timeout_s=10.0,
            clock=lambda: now[0],
        )
        made.prepare(reopen=True)
        return made

    first = trainer()
    lone, late = group(0)[0], group(1)[0]
    assert first.add(lone) is None
    first.keep([lone])
    now[0] = 11.0  # past the group timeout: a group of one has nothing to learn from
    assert first.ready() == 0 and first.dropped == 1
    assert first.add(late) is None
    first.keep([late])
    first.close("failed", error="killed")

    now[0] = 15.0
    again = trainer()
    assert again.resume() == 0
    assert (
        list(again.groups) == [late.group_id] and again.groups[late.group_id].first_seen < now[0]
    )  # its age
    assert again.add(lone) is not None  # already dealt with: refused as a repeat
    assert RolloutSpool(store, again.run_id).counts() == {"dropped": 1, "waiting": 1}
    again.close("stopped")
