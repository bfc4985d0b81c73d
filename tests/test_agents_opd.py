"""On-policy distillation in the agents plane's trainer, for real: the tiny model samples, the trainer scores
the sampled tokens with the hint in the policy's context, and each hinted token's advantage gains
w_opd · clip(teacher − student) (engine/training/opd.py). Checked against a direct computation of the same
log-probs, one unpadded row at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_agents_trainer import PROMPTS, feed, make_trainer, metrics, sample_group

from engine.agents.policy import LocalPolicy
from engine.agents.trainer import PlaneTrainer
from engine.store import Store
from engine.store.reader import StoreReader
from engine.training import opd

HINT = "Answer with one JSON tool call to get_time with the city Paris."


@pytest.fixture
def home(tiny_home: Path) -> Path:
    return tiny_home


def direct_gain(
    worker: LocalPolicy, trainer: PlaneTrainer, prompt: str, hint: str, tokens: list[int]
) -> np.ndarray:
    """clip(teacher − student) computed by hand: the hinted context built by the worker's policy, each side
    scored alone (no batch, no padding) by the trainer's current policy."""
    teacher_ids = worker.prompt_ids(opd.hinted_text(prompt, hint))
    teacher = np.asarray(trainer.score(teacher_ids, tokens))
    student = np.asarray(trainer.score(worker.prompt_ids(prompt), tokens))
    return np.clip(teacher - student, -opd.CLIP, opd.CLIP)


def test_opd_advantage_equals_the_direct_computation_within_1e_5(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store, opd=True)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    group = sample_group(worker, PROMPTS[0], 4, seed=10)
    hints = [HINT, "", "Say it in one word.", HINT]
    samples = [r.model_copy(update={"hint": h}) for r, h in zip(group, hints, strict=True)]
    student = [torch.tensor(trainer.score(r.prompt_token_ids, r.response_token_ids)) for r in samples]

    distilled = trainer.opd_advantages(samples, student)

    assert distilled.unmatched == 0 and distilled.summary.samples == 3
    assert distilled.advantages[1] is None  # no hint: no OPD term
    for r, gain in zip(samples, distilled.advantages, strict=True):
        if r.hint:
            assert gain is not None
            want = direct_gain(worker, trainer, r.prompt, r.hint, r.response_token_ids)
            np.testing.assert_allclose(gain, want, atol=1e-5, rtol=0)
            assert np.any(gain != 0)  # the hint moved the teacher: a real signal, not zeros


def test_one_hinted_sample_changes_only_its_token_advantages(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store, opd=True, w_opd=0.5)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    samples = sample_group(worker, PROMPTS[0], 4, seed=10) + sample_group(worker, PROMPTS[1], 4, seed=20)
    samples[5] = samples[5].model_copy(update={"hint": HINT})
    student = [torch.tensor(trainer.score(r.prompt_token_ids, r.response_token_ids)) for r in samples]
    grpo = [0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.75, -0.75]

    plain = trainer.token_advantages(grpo, None, student)
    distilled = trainer.opd_advantages(samples, student)
    mixed = trainer.token_advantages(grpo, distilled, student)

    assert plain == grpo  # without OPD: the very floats GRPO gave
    for i, (before, after) in enumerate(zip(plain, mixed, strict=True)):
        if i != 5:
            assert after == before and isinstance(after, float)
    gain = distilled.advantages[5]
    assert gain is not None
    np.testing.assert_allclose(mixed[5].numpy(), grpo[5] + 0.5 * gain, atol=1e-6)
    assert not np.allclose(mixed[5].numpy(), grpo[5])


def test_a_step_with_a_hint_stores_its_opd_advantages_and_figures(home: Path, store: Store) -> None:
    trainer = make_trainer(home, store, opd=True)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    first = sample_group(worker, PROMPTS[0], 4, seed=10)
    first[2] = first[2].model_copy(update={"hint": HINT})
    want = direct_gain(worker, trainer, first[2].prompt, HINT, first[2].response_token_ids)  # before the step
    feed(trainer, first)
    feed(trainer, sample_group(worker, PROMPTS[1], 4, seed=20))
    trainer.step()

    m = metrics(store, trainer.run_id, 1)
    assert m["opd/samples"] == 1 and m["opd/tokens"] == len(first[2].response_token_ids)
    assert m["opd/unmatched"] == 0 and np.isfinite(m["opd/kl"]) and m["timing/teacher_s"] >= 0
    stored = _stored_rollouts(store, trainer.run_id)
    hinted = [r for r in stored if r["extra"].get("hint")]
    assert len(stored) == 8 and len(hinted) == 1
    assert hinted[0]["extra"]["task_id"] == first[2].task_id
    np.testing.assert_allclose(hinted[0]["extra"]["opd_advantage"], want, atol=1e-4)
    assert all("opd_advantage" not in r["extra"] for r in stored if not r["extra"].get("hint"))


def test_without_hints_opd_on_trains_exactly_as_without_opd(home: Path, tmp_path: Path) -> None:
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    batch = sample_group(worker, PROMPTS[0], 4, seed=10) + sample_group(worker, PROMPTS[1], 4, seed=20)
    weights = []
    for name, on in (("off", False), ("on", True)):
        with Store(tmp_path / f"{name}.db") as store:
            trainer = make_trainer(home, store, opd=on)
            feed(trainer, batch)
            trainer.step()
            m = metrics(store, trainer.run_id, 1)
            assert ("opd/samples" in m) == on and m.get("opd/samples", 0) == 0
            weights.append(
                {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
            )
            trainer.close()
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_a_rollout_whose_prompt_ids_another_instruction_made_trains_by_its_reward_alone(
    home: Path, store: Store
) -> None:
    trainer = make_trainer(home, store, opd=True)
    worker = LocalPolicy.load("carl-tiny", home, seed=1)
    group = sample_group(worker, PROMPTS[0], 4, seed=10)
    other = worker.prompt_ids(PROMPTS[0], "You are a pirate.")  # not what this trainer's workers send
    samples = [group[0].model_copy(update={"hint": HINT, "prompt_token_ids": other}), *group[1:]]
    student = [torch.tensor(trainer.score(r.prompt_token_ids, r.response_token_ids)) for r in samples]
    distilled = trainer.opd_advantages(samples, student)
    assert distilled.unmatched == 1 and distilled.advantages == [None] * 4


def _stored_rollouts(store: Store, run_id: int) -> list[dict]:
    reader = StoreReader(store.path)
    try:
        return [dict(r, extra=r.get("extra") or {}) for r in reader.rollouts(run_id, step=1)]
    finally:
        reader.close()
