"""The agents plane's trainer for real: the tiny model samples rollouts, GRPO trains a LoRA adapter on it,
the run lands in a real store, and a served policy hot-swaps the published adapter."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.agents.events import TrainingRolloutEvent
from engine.agents.plane_settings import TrainerSettings
from engine.agents.policy import Generation, LocalPolicy, PolicyError
from engine.agents.trainer import PlaneTrainer, adapters_dir, rollout_advantages
from engine.store import Store
from engine.training.backend import TrainingFailed

PROMPTS = ["What is the capital of France?", "Name a city in Peru.", "Say hello.", "Count to three."]
SETTINGS = {"group_size": 4, "groups_per_update": 2, "learning_rate": 5e-3, "publish_every": 2}


@pytest.fixture
def home(tiny_home: Path) -> Path:
    return tiny_home


def make_trainer(home: Path, store: Store, *, temperature: float = 1.0, **settings: Any) -> PlaneTrainer:
    options = {key: settings.pop(key) for key in ("clock", "sleep", "group_timeout_s") if key in settings}
    trainer = PlaneTrainer(
        TrainerSettings(**{**SETTINGS, **settings}),
        model="carl-tiny",
        home=home,
        store=store,
        temperature=temperature,
        **options,
    )
    trainer.prepare()
    return trainer


def rollout(
    gen: Generation, group_id: str, group_size: int, reward: float, **changes: Any
) -> TrainingRolloutEvent:
    fields: dict[str, Any] = {
        "task_id": str(uuid.uuid4()),
        "worker_id": "w1",
        "task_type": "demo",
        "group_id": group_id,
        "group_size": group_size,
        "prompt": "p",
        "response": gen.text,
        "prm_score": reward,
        "outcome_score": reward,
        "reward": reward,
        "model_version": gen.model_version,
        "prompt_token_ids": gen.prompt_token_ids,
        "response_token_ids": gen.token_ids,
        "token_logprobs": gen.logprobs,
        "temperature": gen.temperature,
    }
    return TrainingRolloutEvent(**{**fields, **changes})


def low_ids_reward(ids: list[int]) -> float:
    """Prefers low token ids: random answers score apart, so every group has a spread."""
    return 1.0 - float(np.mean(ids)) / 512


def sample_group(
    worker: LocalPolicy,
    prompt: str,
    size: int,
    *,
    seed: int,
    temperature: float = 1.0,
    max_new_tokens: int = 16,
    reward: Callable[[list[int]], float] = low_ids_reward,
    **changes: Any,
) -> list[TrainingRolloutEvent]:
    group_id = str(uuid.uuid4())
    out = []
    for k in range(size):
        gen = worker.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + k)
        out.append(rollout(gen, group_id, size, reward(gen.token_ids), prompt=prompt, **changes))
    return out


def feed(trainer: PlaneTrainer, rollouts: list[TrainingRolloutEvent]) -> None:
    for r in rollouts:
        assert trainer.add(r) is None


def metrics(store: Store, run_id: int, step: int) -> dict[str, float]:
    rows = store.conn.execute("SELECT key, value FROM metrics WHERE run_id=? AND step=?", (run_id, step))
    return dict(rows.fetchall())


def outcome(store: Store, command_id: int) -> tuple[str, str]:
    row = store.conn.execute("SELECT state, result FROM commands WHERE id=?", (command_id,)).fetchone()
    return row[0], row[1]


# -- the first step, and what the run leaves in the store --------------------------------------------


def test_first_step_on_fresh_rollouts_has_ratio_one_and_reports_like_a_run(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store, max_updates=50)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    feed(trainer, sample_group(worker, PROMPTS[0], 4, seed=10, verifier_score=1.0))
    assert trainer.ready() == 1 and trainer.step() is None  # one group of the two an update takes
    feed(trainer, sample_group(worker, PROMPTS[1], 4, seed=20))
    assert trainer.step() is None  # publish_every=2: nothing to publish after step 1
    assert trainer.global_step == 1

    m = metrics(store, trainer.run_id, 1)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_ratio/region_mean"] == 0.0 and m["kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["groups"] == 2 and m["groups/zero_variance"] == 0 and m["samples"] == 8
    assert m["staleness/mean"] == 0.0 and m["learning_rate"] == pytest.approx(5e-3)
    assert m["rewards/verifier/mean"] == 1.0  # only the first group's rollouts carry one
    for key in (
        "loss",
        "grad_norm",
        "advantage_std",
        "reward",
        "rewards/prm/mean",
        "rewards/outcome/mean",
        "phi/mean",
        "phi/entropy",
        "phi/spread",
        "tokens",
    ):
        assert key in m and np.isfinite(m[key]), key
    # Groups of 4 scaled by their sample std (TRL's): the advantages' population std is sqrt(3/4), less
    # what eps 1e-4 takes off a small spread of rewards.
    assert m["grad_norm"] > 0 and m["advantage_std"] == pytest.approx(np.sqrt(3 / 4), abs=2e-3)

    run = store.run(trainer.run_id)
    assert run["source_kind"] == "agents" and run["backend"] == "torch" and run["model"] == "carl-tiny"
    assert run["vocab_size"] == 512 and run["max_steps"] == 50 and run["temperature"] == 1.0
    assert run["output_dir"] == str(home / "runs" / "agents-train") and run["last_step"] == 1
    phi = store.conn.execute(
        "SELECT phi_mean, tokens, vocab_size, weighting FROM phi_stats WHERE run_id=?", (trainer.run_id,)
    ).fetchall()
    assert len(phi) == 1 and phi[0][1] == m["tokens"] and phi[0][2:] == (512, "token")
    assert phi[0][0] == pytest.approx(m["phi/mean"])
    samples = store.conn.execute(
        "SELECT kind, tokens, phi, rewards FROM samples WHERE run_id=? AND step=1", (trainer.run_id,)
    ).fetchall()
    assert sorted(s[0] for s in samples) == ["best", "median", "random", "worst"]
    assert all(s[1] and s[2] and "total" in s[3] for s in samples)
    trainer.close("finished")
    assert store.run(trainer.run_id)["status"] == "finished"


def test_rollout_advantages_normalise_within_each_group_as_trl() -> None:
    """TRL's: the sample std (n - 1) and eps 1e-4 (tests/test_grpo.py compares with TRL's trainer)."""
    advantages, zero = rollout_advantages([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3]])
    assert advantages[:4] == pytest.approx([1.224445, -1.224445, 0.0, 0.0], abs=1e-5)
    assert advantages[4:] == [0.0, 0.0] and zero == 1


# -- stale rollouts ------------------------------------------------------------------------------------


def test_stale_rollouts_are_importance_corrected_and_still_trained(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    stale = sample_group(worker, PROMPTS[2], 4, seed=100) + sample_group(worker, PROMPTS[3], 4, seed=200)
    for step in range(2):
        feed(trainer, sample_group(worker, PROMPTS[0], 4, seed=300 + 10 * step))
        feed(trainer, sample_group(worker, PROMPTS[1], 4, seed=400 + 10 * step))
        update = trainer.step()
    assert update is not None and trainer.versions == ["base", "agents-train-v0002"]

    # What the trainer's adapter policy now says of the tokens the base sampled: the importance ratios.
    log_ratios = np.concatenate(
        [
            np.array(trainer.score(r.prompt_token_ids, r.response_token_ids)) - np.array(r.token_logprobs)
            for r in stale
        ]
    )
    assert np.abs(log_ratios).max() > 1e-2  # the policy has moved: ratios are not 1
    before = [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    feed(trainer, stale)
    trainer.step()
    m = metrics(store, trainer.run_id, 3)
    assert m["ratio_mean"] == pytest.approx(float(np.exp(log_ratios).mean()), abs=1e-5)
    assert m["staleness/mean"] == 1.0  # sampled by base, one published version behind
    assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
    after = [p for p in trainer.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


# -- learning ------------------------------------------------------------------------------------------


def test_the_policy_learns_what_the_reward_prefers(home: Path, store: Store) -> None:
    """Reward: the 4-token answer contains a line break. Workers sample at 0.2, where the tiny random
    model puts ~10% on a line break first; each update is published and swapped into the worker,
    so every batch is fresh from the updated policy."""
    temperature, new_tokens = 0.2, 4
    trainer = make_trainer(home, store, temperature=temperature, group_size=8, publish_every=1)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    newline = worker.tokenizer("\n", add_special_tokens=False)["input_ids"][0]

    def reward(ids: list[int]) -> float:
        return 1.0 if newline in ids else 0.0

    def mean_reward() -> float:
        return float(
            np.mean(
                [
                    reward(
                        worker.generate(
                            PROMPTS[i % 4], max_new_tokens=new_tokens, temperature=temperature, seed=10**6 + i
                        ).token_ids
                    )
                    for i in range(64)
                ]
            )
        )

    before = mean_reward()
    for step in range(30):
        for g in range(2):
            feed(
                trainer,
                sample_group(
                    worker,
                    PROMPTS[(2 * step + g) % 4],
                    8,
                    seed=1000 * step + 100 * g,
                    temperature=temperature,
                    max_new_tokens=new_tokens,
                    reward=reward,
                ),
            )
        update = trainer.step()
        assert update is not None
        worker.swap_adapter(Path(update.checkpoint_path), update.model_version, update.base_fingerprint)
        m = metrics(store, trainer.run_id, trainer.global_step)
        assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["staleness/mean"] == 0.0
    after = mean_reward()
    assert before < 0.2 and after >= before + 0.4, (before, after)  # measured: 0.125 -> 0.73-0.78 over seeds


# -- commands at step boundaries -----------------------------------------------------------------------


def test_commands_apply_at_step_boundaries(home: Path, store: Store) -> None:
    held: list[str] = []  # what was done while the run sat paused

    def sleep(seconds: float) -> None:
        # A paused trainer waits here between looks at its queue: ask for a checkpoint, then resume.
        verb = "checkpoint" if not held else "resume"
        held.append(verb)
        store.enqueue_command(verb, target="run", run_id=trainer.run_id)

    trainer = make_trainer(home, store, sleep=sleep, publish_every=100)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    send = lambda verb, args=None: store.enqueue_command(verb, args, target="run", run_id=trainer.run_id)  # noqa: E731

    def train_one(seed: int) -> None:
        feed(
            trainer,
            sample_group(worker, PROMPTS[0], 4, seed=seed)
            + sample_group(worker, PROMPTS[1], 4, seed=seed + 50),
        )
        trainer.step()

    set_lr, set_weight = send("set_lr", {"lr": 1e-3}), send("set_weight", {"reward": "prm", "weight": 2.0})
    train_one(0)
    assert outcome(store, set_lr) == ("done", "learning rate 0.001 from step 1")
    state, result = outcome(store, set_weight)
    assert state == "failed" and "no reward weights" in result and "\n" not in result
    assert metrics(store, trainer.run_id, 1)["learning_rate"] == pytest.approx(1e-3)

    checkpoint = send("checkpoint")
    trainer.poll()  # applied between steps, while waiting for rollouts
    state, result = outcome(store, checkpoint)
    saved = home / "runs" / "agents-train" / "checkpoint-1"
    assert (state, result) == ("done", f"checkpoint at step 1: {saved}")
    assert {p.name for p in saved.iterdir()} == {"adapter", "optimizer.pt", "trainer_state.json"}
    assert store.run(trainer.run_id)["last_checkpoint"] == str(saved)

    pause = send("pause")
    trainer.poll()
    assert outcome(store, pause) == ("done", "paused at step 1") and trainer.paused
    assert store.run(trainer.run_id)["status"] == "paused"
    train_one(100)  # holds at the boundary first: a checkpoint while paused, then the resume
    assert held == ["checkpoint", "resume"] and not trainer.paused
    assert trainer.global_step == 2 and store.run(trainer.run_id)["status"] == "running"
    states = store.conn.execute(
        "SELECT verb, state, result FROM commands WHERE verb IN ('checkpoint', 'resume') ORDER BY id"
    ).fetchall()
    assert states[1] == ("checkpoint", "done", f"checkpoint at step 1: {saved}")
    assert states[2] == ("resume", "done", "resumed at step 1")

    stop = send("stop")
    feed(
        trainer, sample_group(worker, PROMPTS[2], 4, seed=300) + sample_group(worker, PROMPTS[3], 4, seed=350)
    )
    assert trainer.step() is None and trainer.done and trainer.global_step == 2  # stopped before training
    assert outcome(store, stop) == ("done", "stopping after step 2, with a checkpoint")
    assert store.run(trainer.run_id)["last_checkpoint"] == str(saved.with_name("checkpoint-2"))
    trainer.close("stopped")
    run = store.run(trainer.run_id)
    assert run["status"] == "stopped" and run["ended_at"] is not None


# -- publishing, hot-swap and resume -------------------------------------------------------------------


def test_published_adapters_hot_swap_into_the_served_model(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    base_model = worker.model
    fixed = worker.generate(PROMPTS[0], max_new_tokens=24, temperature=1.0, seed=5)

    updates = []
    for step in range(4):
        feed(
            trainer,
            sample_group(worker, PROMPTS[step % 4], 4, seed=10 * step)
            + sample_group(worker, PROMPTS[(step + 1) % 4], 4, seed=10 * step + 5),
        )
        updates.append(trainer.step())
    assert [u is None for u in updates] == [True, False, True, False]
    update = updates[1]
    assert update.model_version == "agents-train-v0002" and update.step == 2
    assert update.checkpoint_path == str(adapters_dir(home) / "agents-train-v0002")
    assert update.base_model == "carl-tiny" and update.base_fingerprint == worker.fingerprint
    assert set(update.metrics) == {"loss", "reward", "kl"}
    assert (Path(update.checkpoint_path) / "adapter_config.json").is_file()
    assert not [p for p in adapters_dir(home).iterdir() if p.name.startswith(".")]  # no half directories

    with pytest.raises(PolicyError) as info:
        worker.swap_adapter(Path(update.checkpoint_path), update.model_version, "0123456789abcdef")
    message = str(info.value)
    assert "\n" not in message and "0123456789abcdef" in message and worker.fingerprint in message
    assert worker.version == "base" and worker.model is base_model

    latest = updates[3]
    worker.swap_adapter(Path(update.checkpoint_path), update.model_version, update.base_fingerprint)
    assert worker.version == "agents-train-v0002" and worker.model.get_base_model() is base_model
    worker.swap_adapter(Path(latest.checkpoint_path), latest.model_version, latest.base_fingerprint)
    assert worker.version == "agents-train-v0004" and len(worker.adapters) == 1  # the old one was deleted
    assert worker.model.get_base_model() is base_model  # never reloaded

    served = np.array(worker.score(fixed.prompt_token_ids, fixed.token_ids))
    trained = np.array(trainer.score(fixed.prompt_token_ids, fixed.token_ids))
    assert np.abs(served - trained).max() <= 1e-4
    assert np.abs(served - np.array(fixed.logprobs)).max() > 1e-3  # and it is not the base any more
    generated = worker.generate(PROMPTS[1], max_new_tokens=8, temperature=1.0, seed=1)
    assert generated.model_version == "agents-train-v0004"

    # A restarted trainer carries on from the newest checkpoint (saved with each published version).
    trainer.close("failed", error="killed")
    again = PlaneTrainer(
        TrainerSettings(**SETTINGS), model="carl-tiny", home=home, store=store, temperature=1.0
    )
    again.prepare(reopen=True)
    assert again.run_id == trainer.run_id and again.resume() == 4
    assert again.versions == ["base", "agents-train-v0002", "agents-train-v0004"]
    resumed = np.array(again.score(fixed.prompt_token_ids, fixed.token_ids))
    assert np.abs(resumed - trained).max() <= 1e-6
    assert again.optimizer.state_dict()["state"]  # AdamW's moments came back too
    assert store.run(again.run_id)["status"] == "running"
    feed(again, sample_group(worker, PROMPTS[0], 4, seed=900) + sample_group(worker, PROMPTS[1], 4, seed=950))
    assert again.step() is None and again.global_step == 5
    assert metrics(store, again.run_id, 5)["staleness/mean"] == 0.0  # the worker serves the newest version


# -- rollouts that cannot train, and groups that never fill ----------------------------------------------


def test_untrainable_rollouts_are_refused_with_their_reason(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    group = sample_group(worker, PROMPTS[0], 4, seed=1)
    good = group[0]
    assert trainer.add(good) is None

    cases = {
        "no token ids": good.model_copy(
            update={"task_id": "t1", "response_token_ids": [], "token_logprobs": []}
        ),
        "temperature": good.model_copy(update={"task_id": "t2", "temperature": 0.7}),
        "duplicate": good,
        "size 1": good.model_copy(update={"task_id": "t3", "group_size": 1, "group_id": "solo"}),
        "log-probs": good.model_copy(update={"task_id": "t4", "token_logprobs": good.token_logprobs[:-1]}),
        "vocabulary": good.model_copy(
            update={"task_id": "t5", "response_token_ids": [9999] * len(good.token_logprobs)}
        ),
    }
    reasons = {name: trainer.add(r) for name, r in cases.items()}
    assert reasons["no token ids"] == "task t1: no token ids or log-probs (not sampled by a local model)"
    assert reasons["temperature"] == "task t2: sampled at temperature 0.7, the trainer trains at 1"
    assert reasons["duplicate"] == f"task {good.task_id}: a duplicate (its rollout is already in)"
    assert reasons["size 1"] == "task t3: a group of size 1 has no advantage to learn from"
    assert "log-probs" in reasons["log-probs"] and "vocabulary" in reasons["vocabulary"]
    assert all(r is not None and "\n" not in r for r in reasons.values())
    assert trainer.refused == len(cases) and len(trainer.groups[good.group_id].rollouts) == 1


def test_groups_that_never_fill_train_incomplete_or_are_dropped(home: Path, store: Store) -> None:
    now = [0.0]
    trainer = make_trainer(home, store, groups_per_update=1, clock=lambda: now[0], group_timeout_s=30.0)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    pair = sample_group(worker, PROMPTS[0], 4, seed=1)[:2]  # 2 of 4 arrive
    lone = sample_group(worker, PROMPTS[1], 4, seed=9)[:1]  # 1 of 4 arrives
    feed(trainer, pair + lone)
    assert trainer.ready() == 0 and trainer.step() is None
    now[0] = 31.0
    assert trainer.ready() == 1 and trainer.dropped == 1
    trainer.step()
    m = metrics(store, trainer.run_id, 1)
    assert m["groups"] == 1 and m["groups/incomplete"] == 1 and m["groups/dropped"] == 1 and m["samples"] == 2
    late = sample_group(worker, PROMPTS[1], 4, seed=9)[1].model_copy(update={"group_id": lone[0].group_id})
    assert (
        trainer.add(late) == f"task {late.task_id}: group {lone[0].group_id} was already trained or dropped"
    )
    assert not trainer.groups


def test_a_nan_loss_fails_the_step_in_one_line(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    feed(trainer, sample_group(worker, PROMPTS[0], 4, seed=1) + sample_group(worker, PROMPTS[1], 4, seed=5))
    with torch.no_grad():
        next(p for p in trainer.model.parameters() if p.requires_grad).fill_(float("nan"))
    with pytest.raises(TrainingFailed) as info:
        trainer.step()
    assert str(info.value).startswith("the loss became NaN at step 1")
    assert metrics(store, trainer.run_id, 1) == {"loss": None}  # NaN is stored as NULL
    trainer.close("failed", error=str(info.value))
    assert store.run(trainer.run_id)["status"] == "failed"
