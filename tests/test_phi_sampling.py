"""Φ from the generating pass (engine/training/phi_sampling.py): the entropy measured at each decoding step
while transformers samples equals the forward path's on the same tokens, at temperature ≠ 1, with left-padded
prompts and sequences that finish at different lengths;
and TRL's trainer hands it to the coherence rewards."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.coherence.phi import phi_from_model
from engine.training.phi_sampling import GenerationPhi, SamplingEntropy, recording

TOL = 1e-5  # nats
PROMPTS = [
    "<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n",
    "<|user|>\nHi</s>\n<|assistant|>\n",
    "<|user|>\nCall the weather tool for Oslo, and be brief about it.</s>\n<|assistant|>\n",
]


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), tokenizer


def forward_entropies(model: Any, prompts: list[list[int]], completions: list[list[int]], t: float) -> list:
    """Today's forward path, built as RewardPhi builds it: right-padded prompt + completion rows."""
    sequences = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    attention, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (prompt, seq) in enumerate(zip(prompts, sequences, strict=True)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        mask[row, len(prompt) : len(seq)] = 1
    return phi_from_model(model, ids, attention, mask, temperature=t).entropy


def sample(model: Any, tokenizer: Any, prompts: list[list[int]], t: float, seed: int, **settings: Any):
    """Left-padded sampling with the processor in place: (completions up to their first EOS, sampler)."""
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    # The untrained tiny model rarely picks its one EOS; with 40 more ids ending a sequence (as a model
    # with several EOS ids does), rows finish at different steps and the padding after them is masked.
    eos = [tokenizer.eos_token_id, *range(100, 140)]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(
        do_sample=True, temperature=t, max_new_tokens=16, pad_token_id=pad, eos_token_id=eos, **settings
    )
    sampler = SamplingEntropy(t, eos)
    sampler.place(model, config)
    torch.manual_seed(seed)
    with recording(model, sampler):
        out = model.generate(input_ids=ids, attention_mask=attention, generation_config=config)
    assert "generate" not in vars(model)  # the hook is gone
    completions = []
    for row in out[:, width:].tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        completions.append(row[: ends[0] + 1] if ends else row)
    return completions, sampler


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_sampling_entropy_equals_the_forward_path(tiny: tuple[Any, Any], temperature: float) -> None:
    model, tokenizer = tiny
    prompts = [tokenizer(p).input_ids for p in PROMPTS] * 2  # three prompt lengths: left padding
    for seed in range(4):
        completions, sampler = sample(model, tokenizer, prompts, temperature, seed)
        lengths = [len(c) for c in completions]
        measured = sampler.per_sequence(lengths)
        assert measured is not None and sampler.calls >= max(lengths) and sampler.width == 512
        expected = forward_entropies(model, prompts, completions, temperature)
        for got, want in zip(measured, expected, strict=True):
            np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        if len(set(lengths)) > 1 and min(lengths) < 16:
            break  # some finished early, others went on: padding after EOS was masked
    else:
        pytest.fail("no seed gave sequences finishing at different lengths")
    # Past its EOS a row is masked: the steps after it carry NaN, never a value of the padding.
    values = torch.stack(sampler.steps).numpy()
    for row, length in enumerate(lengths):
        assert np.isnan(values[length:, row]).all()


def test_the_processor_runs_before_the_warpers_and_applies_the_temperature(tiny: tuple[Any, Any]) -> None:
    """transformers merges a caller's processors before its sampling warpers, so the kernel applies T;
    with top-k after it, Φ stays on the full tempered distribution, as the forward path measures it."""
    from transformers import GenerationConfig

    model, tokenizer = tiny
    sampler = SamplingEntropy(0.7, [tokenizer.eos_token_id])
    after = sampler.place(model, GenerationConfig(do_sample=True, temperature=0.7, top_k=20))
    assert sampler.applied_temperature == 0.7
    assert after.split(", ") == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    completions, sampler = sample(model, tokenizer, prompts, 0.7, 0, top_k=20)
    measured = sampler.per_sequence([len(c) for c in completions])
    assert measured is not None
    for got, want in zip(measured, forward_entropies(model, prompts, completions, 0.7), strict=True):
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_per_sequence_refuses_what_does_not_line_up(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    completions, sampler = sample(model, tokenizer, prompts, 1.0, 1)
    lengths = [len(c) for c in completions]
    assert sampler.per_sequence(lengths) is not None
    assert sampler.per_sequence(lengths[:-1]) is None  # another batch
    assert sampler.per_sequence([sampler.calls + 1] * len(lengths)) is None  # more tokens than steps
    longest = int(np.argmax(lengths))
    if lengths[longest] < sampler.calls:  # a finished row asked for a masked step
        lengths[longest] += 1
        assert sampler.per_sequence(lengths) is None


# -- through TRL's trainer ------------------------------------------------------------------------


@pytest.mark.slow
def test_trl_grpo_hands_the_sampling_entropies_to_the_coherence_rewards(
    tiny_model: Path, tmp_path: Path
) -> None:
    """CarlGRPOTrainer with the hook: each step's coherence-reward Φ comes from the generating pass and
    equals the forward path's, at temperature 0.7, over left-padded prompts of several lengths."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from engine.training.torch_backend import RewardPhi, make_trainer_class

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    seen: list[tuple[list, list]] = []

    def coherence(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float]:
        capture = trainer.capture
        phi = provider(prompts=prompts, completions=completions, completion_ids=completion_ids)
        assert capture.phi_source == "generate"
        forward = forward_entropies(trainer.model, capture.prompt_ids, completion_ids, 0.7)
        seen.append((phi, [1.0 - h / math.log(512) for h in forward]))
        return [float(np.mean(p)) for p in phi]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=6,
        num_generations=3,
        max_completion_length=10,
        temperature=0.7,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,  # as the backend runs on CPU (accelerate would autocast every forward to bf16)
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        activation_checkpointing=False,
    )
    trainer = make_trainer_class()(
        model=model,
        reward_funcs=[coherence],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 4]),
        processing_class=tokenizer,
    )
    lines: list[str] = []
    trainer.generation_phi = GenerationPhi(0.7, lambda: True, lines.append)
    provider = RewardPhi(trainer, 0.7)
    trainer.train()
    assert trainer.generation_phi.broken is None, lines
    assert len(seen) == 2 and lines[0].startswith("phi: the coherence rewards measure each token")
    for phi, forward in seen:
        assert len(phi) == 6
        for got, want in zip(phi, forward, strict=True):
            np.testing.assert_allclose(got, want, atol=TOL / math.log(512), rtol=0)


def test_an_unhookable_generation_falls_back_in_one_line(tiny: tuple[Any, Any]) -> None:
    """Where TRL does not call transformers' generate on the whole completion (vLLM, say), nothing is
    wrapped: one line, and the coherence rewards take the forward path from then on."""
    model, _ = tiny

    class Accelerator:
        def unwrap_model(self, wrapped: Any) -> Any:
            return wrapped

    class VLLMTrainer:  # what GenerationPhi reads of TRL's GRPOTrainer when it generates through vLLM
        use_vllm = True
        accelerator = Accelerator()

        def __init__(self, model: Any) -> None:
            self.model = self.model_wrapped = copy.deepcopy(model).train()

    lines: list[str] = []
    phi = GenerationPhi(1.0, lambda: True, lines.append)
    assert phi.wrap(VLLMTrainer(model), lambda: ("ids", None)) == ("ids", None)
    assert phi.broken == "TRL generates through vLLM" and phi.take() == (None, 0, 0.0)
    assert lines == [
        "phi: cannot measure while sampling (TRL generates through vLLM): the coherence rewards take one"
        " forward a step"
    ]
    phi.wrap(VLLMTrainer(model), lambda: ("ids", None))
    assert len(lines) == 1  # said once


def test_runs_json_says_which_path_the_coherence_rewards_took(tmp_path: Path) -> None:
    """`carl runs --json` carries `phi_source`: the path of the newest step that called the coherence
    rewards (`phi/from_generate`), null before any did."""
    from engine.report.records import run_record
    from engine.store import Store, StoreReader

    with Store(tmp_path / "carl.db") as store:
        runs = {
            name: store.create_run(name, source_kind="carl") for name in ("sampled", "fell-back", "gated")
        }
        store.add_metrics(
            runs["sampled"], [(1, "phi/from_generate", 1.0, 0.0), (2, "phi/from_generate", 1.0, 0.0)]
        )
        store.add_metrics(
            runs["fell-back"], [(1, "phi/from_generate", 1.0, 0.0), (2, "phi/from_generate", 0.0, 0.0)]
        )
        store.add_metrics(runs["gated"], [(1, "reward", 0.5, 0.0)])
    reader = StoreReader(tmp_path / "carl.db")
    try:
        sources = {run.name: run_record(reader, run)["phi_source"] for run in reader.runs()}
    finally:
        reader.close()
    assert sources == {"sampled": "generate", "fell-back": "forward", "gated": None}
