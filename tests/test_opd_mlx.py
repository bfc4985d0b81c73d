"""On-policy distillation (OPD) on the MLX backend: the teacher's per-token advantage against an independent
forward, the per-token advantages that leave every row without a hint as it was, the loss identical for one
advantage per row and the same broadcast per token, and a real GRPO step on the tiny model with and without
hints (engine/training/opd.py holds the arithmetic; mlx_losses.py and mlx_backend.py the rest)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import llama  # noqa: E402
from support import OFFLINE  # noqa: E402

from engine.store import Store  # noqa: E402
from engine.training import opd  # noqa: E402
from engine.training.backend import CommandPump, Reporter  # noqa: E402
from engine.training.config import config_from_data  # noqa: E402
from engine.training.mlx_backend import MLXBackend  # noqa: E402
from engine.training.mlx_losses import (  # noqa: E402
    Batch,
    grpo_loss,
    opd_advantages,
    per_token_advantages,
    teacher_pairs,
)

VOCAB = 97
TEMPERATURE = 0.7


def random_model(seed: int = 0) -> Any:
    """A small Llama with random weights, built from a config in code."""
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    # Sharper than the initialisation's near-uniform logits, so the teacher and the student disagree by
    # more than a clip.
    model.lm_head.weight = model.lm_head.weight * 8
    mx.eval(model.parameters())
    return model


def plain_logprobs(model: Any, prompt: list[int], completion: list[int], temperature: float) -> np.ndarray:
    """log π(completion[t] | prompt, completion[:t]) from one unpacked forward of this row alone: the
    log-softmax of the logits at the position before each completion token."""
    ids = prompt + completion
    logits = model(mx.array([ids]))[0].astype(mx.float32) / temperature
    logp = np.array(nn.log_softmax(logits, axis=-1)).astype(np.float64)
    return np.array([logp[len(prompt) + t - 1, token] for t, token in enumerate(completion)])


def hinted_rows(seed: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """(student prompts, teacher prompts, completions) of different lengths: the teacher's prompt is the
    student's with extra tokens standing for the hint."""
    rng = np.random.default_rng(seed)
    students, teachers, completions = [], [], []
    for prompt_len, hint_len, completion_len in [(5, 3, 7), (9, 6, 2), (3, 11, 10), (7, 1, 5)]:
        prompt = rng.integers(0, VOCAB, prompt_len).tolist()
        students.append(prompt)
        teachers.append(prompt + rng.integers(0, VOCAB, hint_len).tolist())
        completions.append(rng.integers(0, VOCAB, completion_len).tolist())
    return students, teachers, completions


def test_the_opd_advantage_is_the_clipped_teacher_minus_student_gap_of_a_plain_forward() -> None:
    model = random_model()
    students, teachers, completions = hinted_rows(1)
    student_lp = [
        plain_logprobs(model, p, c, TEMPERATURE) for p, c in zip(students, completions, strict=True)
    ]
    teacher_lp = [
        plain_logprobs(model, p, c, TEMPERATURE) for p, c in zip(teachers, completions, strict=True)
    ]
    gaps = np.concatenate([t - s for t, s in zip(teacher_lp, student_lp, strict=True)])
    clip = float(np.median(np.abs(gaps)))  # some tokens are clipped, some are not
    assert (np.abs(gaps) > clip).any() and (np.abs(gaps) < clip).any()

    teacher_batch = Batch.of(list(zip(teachers, completions, strict=True)), pad=0)
    got = opd_advantages(model, teacher_batch, student_lp, TEMPERATURE, clip)

    assert [len(a) for a in got] == [len(c) for c in completions]
    for advantage, t, s in zip(got, teacher_lp, student_lp, strict=True):
        np.testing.assert_allclose(advantage, np.clip(t - s, -clip, clip), rtol=0, atol=1e-5)
    assert max(np.abs(a).max() for a in got) == pytest.approx(clip)


def test_one_hinted_sample_changes_only_its_own_per_token_advantages() -> None:
    model = random_model()
    students, teachers, completions = hinted_rows(2)
    batch = Batch.of(list(zip(students, completions, strict=True)), pad=0)
    mask = np.array(batch.mask).astype(bool)
    grpo = np.array([0.8, -0.3, 1.1, -1.6])
    hinted = 2
    student_lp = [plain_logprobs(model, students[hinted], completions[hinted], 1.0)]
    teacher_batch = Batch.of([(teachers[hinted], completions[hinted])], pad=0)
    [advantage] = opd_advantages(model, teacher_batch, student_lp, 1.0, opd.CLIP)
    assert np.abs(advantage).max() > 0

    per_token = per_token_advantages(grpo, {hinted: advantage}, mask, w_opd=0.5)
    alone = grpo.astype(np.float32)

    assert per_token.shape == mask.shape and per_token.dtype == np.float32
    for row in range(len(grpo)):
        if row != hinted:  # bit for bit the GRPO advantage, on every position
            assert (per_token[row] == alone[row]).all()
    assert (per_token[hinted][~mask[hinted]] == alone[hinted]).all()  # its prompt and padding positions
    expected = opd.combined(grpo[hinted], advantage, len(completions[hinted]), 0.5).astype(np.float32)
    assert (per_token[hinted][mask[hinted]] == expected).all()
    assert (per_token[hinted][mask[hinted]] != alone[hinted]).any()
    with pytest.raises(ValueError, match="OPD advantages for"):
        per_token_advantages(grpo, {hinted: advantage[:-1]}, mask, w_opd=0.5)


def test_grpo_loss_is_identical_for_row_advantages_and_the_same_broadcast_per_token() -> None:
    model = random_model()
    students, _, completions = hinted_rows(3)
    batch = Batch.of(list(zip(students, completions, strict=True)), pad=0)
    rng = np.random.default_rng(4)
    # Behaviour log-probs off the current ones, so that the ratio clips on both sides.
    current = np.zeros(np.array(batch.mask).shape, dtype=np.float32)
    mask = np.array(batch.mask).astype(bool)
    for row, (p, c) in enumerate(zip(students, completions, strict=True)):
        current[row][mask[row]] = plain_logprobs(model, p, c, 1.0)
    behaviour = mx.array(current + rng.normal(0, 1.0, current.shape).astype(np.float32))
    reference = mx.array(current + rng.normal(0, 0.1, current.shape).astype(np.float32))
    rows = np.array([-0.9, 1.2, 0.4, -0.1], dtype=np.float32)
    broadcast = np.repeat(rows[:, None], mask.shape[1], axis=1)

    by_row = grpo_loss(model, batch, behaviour, reference, mx.array(rows), 1.0, 0.2, 0.04)
    by_token = grpo_loss(model, batch, behaviour, reference, mx.array(broadcast), 1.0, 0.2, 0.04)

    loss_row, (*_, low_row, high_row, kl_row) = by_row
    loss_token, (*_, low_token, high_token, kl_token) = by_token
    assert float(loss_row) == float(loss_token)
    assert (float(low_row), float(high_row), float(kl_row)) == (
        float(low_token),
        float(high_token),
        float(kl_token),
    )
    assert float(low_row) > 0 and float(high_row) > 0  # the clip's counts were exercised
    with pytest.raises(ValueError, match="expected"):
        grpo_loss(model, batch, behaviour, reference, mx.array(broadcast[:, :-1]), 1.0, 0.2, 0.04)


# -- a real GRPO step on the tiny model ------------------------------------------------------------------


def write_dataset(path: Path, hints: list[str | None]) -> Path:
    """Sums to answer in a conversation, with a `hint` column (empty or null: no hint)."""
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + {i + 2}?"}],
            "reference": str(2 * i + 2),
            "verifier": "number",
            "hint": hint,
        }
        for i, hint in enumerate(hints)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def stores() -> Iterator[list[Store]]:
    """The stores the test's backends report into, closed after it."""
    opened: list[Store] = []
    yield opened
    for store in opened:
        store.close()


def prepared(
    tmp_path: Path, tiny_model: Path, stores: list[Store], name: str, dataset: Path, *, opd_on: bool
) -> MLXBackend:
    """The MLX backend, prepared for a GRPO run of two prompts a step (two samples each) on the tiny model,
    reporting into a store of its own."""
    config = config_from_data(
        {
            "model": str(tiny_model),
            "dataset": str(dataset),
            "backend": "mlx",
            "max_steps": 1,
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "max_completion_length": 6,
            "rewards": [{"name": "task"}, {"name": "format", "weight": 0.5}],
            "eval": {"holdout": 0.0},
            "opd": opd_on,
        },
        name,
    )
    home = tmp_path / name
    store = Store(home / "carl.db")
    stores.append(store)
    run_id = store.create_run(name, source_kind="carl", config=config.model_dump())
    reporter = Reporter(store, run_id)
    backend = MLXBackend(
        config,
        home=home,
        output_dir=home / "out",
        reporter=reporter,
        pump=CommandPump(store, run_id, reporter),
    )
    backend.prepare()
    backend._begin_phase("grpo")
    return backend


def stored_metrics(backend: MLXBackend) -> dict[str, float | None]:
    store = backend.reporter.store
    assert store is not None
    rows = store.conn.execute("SELECT key, value FROM metrics WHERE run_id=?", (backend.reporter.run_id,))
    return dict(rows.fetchall())


def test_a_real_grpo_step_with_hints_distils_and_without_hints_trains_as_without_opd(
    tmp_path: Path, tiny_model: Path, stores: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in OFFLINE.items():  # nothing from the Hugging Face hub
        monkeypatch.setenv(key, value)
    # Both of the step's prompts carry a hint: every sample has a teacher.
    hinted = prepared(
        tmp_path,
        tiny_model,
        stores,
        "hinted",
        write_dataset(tmp_path / "hinted.jsonl", ["The answer is a number.", "Add the two numbers."]),
        opd_on=True,
    )
    # The student's log-probs are the sampler's: the same model given the same prompt (no hint) scores the
    # sampled tokens as the sampler did, so its OPD advantage is nothing but float noise.
    prompt_ids = hinted._prompt_ids(hinted.rows[0]["prompt"])
    drawn = hinted._sample(prompt_ids, 2, mx.random.key(5))
    same = teacher_pairs(
        hinted.model,
        Batch.of([(prompt_ids, s.token_ids) for s in drawn], pad=0),
        [np.array(s.logprobs) for s in drawn],
        hinted.config.temperature,
    )
    assert max(np.abs(t - s).max() for t, s in same) < 1e-5
    record = hinted._grpo_step(1)
    hinted.reporter.write(record)
    metrics = stored_metrics(hinted)
    assert metrics["opd/samples"] == 4.0
    assert metrics["opd/tokens"] == metrics["num_tokens"]
    assert metrics["timing/teacher_s"] is not None and metrics["timing/teacher_s"] > 0
    assert -1.0 <= (metrics["opd/advantage_mean"] or 0.0) <= 1.0
    assert 0.0 <= (metrics["opd/clip_ratio"] or 0.0) <= 1.0
    assert metrics["opd/kl"] is not None and np.isfinite(metrics["opd/kl"])
    assert record.samples and all("opd_advantage" in trace for trace in record.samples)
    for trace in record.samples:
        advantage = trace["opd_advantage"]
        assert len(advantage) == len(trace["tokens"]) > 0
        assert all(-opd.CLIP <= a <= opd.CLIP and round(a, 6) == a for a in advantage)
    # The hint changes the teacher's context, so some token's log-prob moved.
    assert any(a != 0.0 for trace in record.samples for a in trace["opd_advantage"])
    # Every hinted sample's rollout row keeps its hint and per-token OPD advantages (the store's `extra`).
    assert record.rollouts
    for row in record.rollouts:
        assert len(row["extra"]["opd_advantage"]) == row["length"] and row["extra"]["hint"]

    # OPD on but no row with a hint (empty, null, blanks): the step is the one a run without OPD takes.
    plain = write_dataset(tmp_path / "plain.jsonl", ["", None, "  "])
    quiet = prepared(tmp_path, tiny_model, stores, "quiet", plain, opd_on=True)
    off = prepared(tmp_path, tiny_model, stores, "off", plain, opd_on=False)
    quiet_record, off_record = quiet._grpo_step(1), off._grpo_step(1)
    quiet.reporter.write(quiet_record)
    assert not any(key.startswith("opd/") or key == "timing/teacher_s" for key in stored_metrics(quiet))
    assert all("opd_advantage" not in trace for trace in quiet_record.samples)
    assert quiet_record.metrics["loss"] == off_record.metrics["loss"]
    assert quiet_record.metrics["grad_norm"] == off_record.metrics["grad_norm"]
    trained = dict(tree_flatten(quiet.model.parameters()))
    for name, weight in dict(tree_flatten(off.model.parameters())).items():
        assert mx.array_equal(trained[name], weight).item(), name


# -- the same OPD advantage as the agents plane's torch trainer ---------------------------------------------


def test_the_mlx_opd_advantage_matches_the_agents_planes_torch_trainer_on_the_same_weights(
    tiny_home: Path, store: Store
) -> None:
    """The agents plane's trainer (torch, engine/agents/trainer.py) and the MLX backend, given the same
    tokens, the same teacher context and the same student log-probs, compute the same OPD advantage: their
    teacher forwards agree on the tiny model's weights (the plane's fresh LoRA adapter adds nothing yet)."""
    torch = pytest.importorskip("torch")
    import mlx_lm
    from test_agents_trainer import PROMPTS, make_trainer, sample_group

    from engine.agents.policy import LocalPolicy
    from engine.models.tiny import default_model_dir

    trainer = make_trainer(tiny_home, store, opd=True)
    worker = LocalPolicy.load("carl-tiny", tiny_home, seed=1)
    hints = ["Answer with one JSON tool call to get_time with the city Paris.", "Say it in one word."]
    samples = [
        r.model_copy(update={"hint": h})
        for r, h in zip(sample_group(worker, PROMPTS[0], 2, seed=10), hints, strict=True)
    ]
    student = [torch.tensor(trainer.score(r.prompt_token_ids, r.response_token_ids)) for r in samples]
    on_torch = trainer.opd_advantages(samples, student).advantages

    model = mlx_lm.load(str(default_model_dir(tiny_home)))[0]
    contexts = [trainer.teacher_context(r) for r in samples]
    assert all(ids is not None for ids in contexts)
    teacher_batch = Batch.of(
        [(ids or [], r.response_token_ids) for ids, r in zip(contexts, samples, strict=True)], pad=0
    )
    on_mlx = opd_advantages(model, teacher_batch, [s.double().numpy() for s in student], 1.0, opd.CLIP)

    for mine, theirs in zip(on_mlx, on_torch, strict=True):
        assert theirs is not None
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)  # ~1.5e-6 apart, float32 on both
        assert np.any(mine != 0)
    trainer.close()
