"""engine/training/grpo.py: a GRPO group's advantages, checked against TRL's trainer on the same rewards, and
the one `pack` both the MLX backend and the agents trainer use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.training.grpo import group_advantages, pack

NAN = float("nan")
# Three groups of four, two reward functions (None where a function does not score a completion):
# a group with spread; a flat group (zero std); a group whose first completion no function scored.
FIRST = [1.0, 0.0, 0.5, 0.5, 0.3, 0.3, 0.3, 0.3, None, 0.7, 0.2, 0.9]
SECOND = [0.2, None, 0.9, 0.1, None, None, None, None, None, 0.1, 0.6, 0.0]
WEIGHTS = [1.0, 0.5]


def trl_advantages(tiny_model: Path, tmp_path: Path, aggregation: str, scale: str) -> tuple[Any, Any, float]:
    """One step of TRL's own GRPOTrainer on the tiny model, its reward functions answering FIRST and SECOND:
    (the rewards TRL logged [N, K], the advantages it computed [N], its frac_reward_zero_std)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

    def first(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return FIRST[: len(completions)]

    def second(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return SECOND[: len(completions)]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=12,
        num_generations=4,
        max_completion_length=4,
        reward_weights=WEIGHTS,
        multi_objective_aggregation=aggregation,
        scale_rewards=scale,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        activation_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        reward_funcs=[first, second],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"{n} + {n} ="} for n in range(3)]),
        processing_class=tokenizer,
    )
    trainer.train()
    logs = trainer._logs  # what TRL keeps of its newest generation batch, in its own order
    rewards = np.array([list(logs["rewards"]["first"]), list(logs["rewards"]["second"])]).T
    zero_std = next(
        h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h
    )
    return rewards, np.array(list(logs["advantages"])), zero_std


@pytest.mark.parametrize(
    ("aggregation", "scale"),
    [
        ("sum_then_normalize", "group"),
        ("sum_then_normalize", "batch"),
        ("sum_then_normalize", "none"),
        ("normalize_then_sum", "group"),
    ],
)
def test_the_advantages_are_trls_on_the_same_rewards(
    tiny_model: Path, tmp_path: Path, aggregation: Any, scale: Any
) -> None:
    rewards, expected, zero_std = trl_advantages(tiny_model, tmp_path, aggregation, scale)
    designed = np.array([FIRST, SECOND], dtype=float).T  # None becomes NaN, as in TRL
    np.testing.assert_allclose(rewards, designed, rtol=1e-6)  # TRL was handed the cases meant (float32)
    ours = group_advantages(rewards, np.array(WEIGHTS), [4, 4, 4], aggregation=aggregation, scale=scale)
    np.testing.assert_allclose(ours.advantages, expected, rtol=1e-5, atol=1e-5)  # TRL computes in float32
    assert ours.frac_zero_std == pytest.approx(zero_std)
    assert ours.advantages[8] == 0.0  # no function scored it
    if aggregation == "sum_then_normalize":
        assert np.all(ours.advantages[4:8] == 0.0)  # the flat group
        assert ours.frac_zero_std == pytest.approx(0.0 if scale == "batch" else 1 / 3)


def test_groups_of_different_sizes_are_normalised_each_on_its_own() -> None:
    """The agents plane trains a group that timed out with the members it has: each group is as TRL would
    normalise it alone, with the sample std (n - 1) and eps 1e-4."""
    rewards = np.array([[1.0], [0.0], [0.5], [0.5], [0.3], [0.3], [2.0], [4.0]])
    result = group_advantages(rewards, np.ones(1), [4, 2, 2])
    spread = np.std([1.0, 0.0, 0.5, 0.5], ddof=1)
    assert result.advantages[:4] == pytest.approx(np.array([0.5, -0.5, 0.0, 0.0]) / (spread + 1e-4))
    assert list(result.advantages[4:6]) == [0.0, 0.0]
    assert result.advantages[6:] == pytest.approx([-1 / (np.sqrt(2) + 1e-4), 1 / (np.sqrt(2) + 1e-4)])
    assert list(result.zero_std) == [False] * 4 + [True] * 2 + [False] * 2
    alone = group_advantages(rewards[6:], np.ones(1), [2])
    assert list(alone.advantages) == list(result.advantages[6:])
    assert list(result.totals) == list(rewards[:, 0])


def test_a_group_of_one_has_zero_advantage_and_sizes_must_cover_the_rows() -> None:
    result = group_advantages(np.array([[0.7]]), np.ones(1), [1])
    assert list(result.advantages) == [0.0] and list(result.zero_std) == [True]
    with pytest.raises(ValueError, match="disagree"):
        group_advantages(np.ones((5, 1)), np.ones(1), [4])
    with pytest.raises(ValueError, match="scale"):
        group_advantages(np.ones((4, 1)), np.ones(1), [4], scale="batches")  # type: ignore[arg-type]


def test_pack_pads_right_and_marks_the_completion_tokens() -> None:
    packed = pack([([5, 6], [7, 8, 9]), ([1], [2])], pad=0)
    assert packed.ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 0, 0, 0]]
    assert packed.attention.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert packed.completion.tolist() == [
        [False, False, True, True, True],
        [False, True, False, False, False],
    ]
    # position t's logits predict token t + 1: the completion's first token is predicted by the prompt's last
    assert packed.targets.tolist() == [[False, True, True, True], [True, False, False, False]]
    assert packed.lengths == [3, 1]
    with pytest.raises(ValueError, match="at least one prompt token"):
        pack([([], [1, 2])], pad=0)
