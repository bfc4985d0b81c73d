"""The served policy for real: the tiny model samples, and what it reports is the distribution it drew
from."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.agents.policy import (
    Generation,
    LocalPolicy,
    PackedBatch,
    PolicyError,
    base_fingerprint,
    forward,
    resolve_model,
    response_logprobs,
)
from engine.coherence.phi import completion_token_stats, phi_from_entropy
from engine.models.tiny import default_model_dir

PROMPT = "What is the capital of France?"


@pytest.fixture
def home(tiny_home: Path) -> Path:
    return tiny_home


def recomputed(policy: LocalPolicy, gen: Generation, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """The trainer's view: one forward of prompt + response, log-probs and entropies of the response
    tokens."""
    batch = PackedBatch.of(
        [(gen.prompt_token_ids, gen.token_ids)], policy.tokenizer.pad_token_id, policy.device
    )
    with torch.no_grad():
        logits = forward(policy.model, batch)
    logprobs = response_logprobs(logits, batch, temperature)[0].numpy()
    stats = completion_token_stats(
        logits, batch.input_ids, completion_mask=batch.completion_mask, temperature=temperature
    )
    return logprobs, stats.entropy[0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_reports_the_distribution_it_sampled_from(home: Path, temperature: float) -> None:
    policy = LocalPolicy.load("carl-tiny", home)
    gen = policy.generate(
        PROMPT, system="Answer briefly.", max_new_tokens=48, temperature=temperature, seed=3
    )

    assert gen.model_version == "base" and gen.temperature == temperature
    assert gen.prompt_token_ids == policy.prompt_ids(PROMPT, "Answer briefly.")
    assert policy.tokenizer.decode(gen.prompt_token_ids).endswith("<|assistant|>\n")
    assert 0 < len(gen.token_ids) <= 48
    assert len(gen.logprobs) == len(gen.entropies) == len(gen.token_ids)
    assert gen.text == policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    if gen.finished:
        assert gen.token_ids[-1] in policy.eos_ids

    logprobs, entropies = recomputed(policy, gen, temperature)
    assert np.abs(logprobs - np.array(gen.logprobs)).max() <= 1e-4
    assert np.abs(entropies - np.array(gen.entropies)).max() <= 1e-4
    phi = phi_from_entropy(np.array(gen.entropies), policy.vocab_size)
    assert gen.phi_mean == pytest.approx(float(phi.mean()), abs=1e-9)
    assert policy.vocab_size == 512 and 0.0 <= gen.phi_mean < 0.05  # random weights: H near ln 512

    again = policy.generate(
        PROMPT, system="Answer briefly.", max_new_tokens=48, temperature=temperature, seed=3
    )
    assert again.token_ids == gen.token_ids and again.logprobs == gen.logprobs


def test_sampling_is_the_full_distribution_no_top_k(home: Path) -> None:
    """transformers' default top_k=50 would never draw more than 50 distinct first tokens."""
    policy = LocalPolicy.load("carl-tiny", home)
    prompt_ids = policy.prompt_ids(PROMPT)
    first = [
        policy.generate_ids(prompt_ids, max_new_tokens=1, temperature=1.0, seed=s).token_ids[0]
        for s in range(300)
    ]
    assert len(set(first)) > 150  # near-uniform over 512 ids: about 230 distinct in 300 draws


def test_unseeded_generations_differ_but_repeat_from_the_same_load_seed(home: Path) -> None:
    a, b = LocalPolicy.load("carl-tiny", home, seed=7), LocalPolicy.load("carl-tiny", home, seed=7)
    first, second = (a.generate(PROMPT, max_new_tokens=8, temperature=1.0).token_ids for _ in range(2))
    assert first != second
    assert b.generate(PROMPT, max_new_tokens=8, temperature=1.0).token_ids == first


def test_fingerprint_and_model_resolution(home: Path) -> None:
    where = resolve_model("carl-tiny", home)
    assert where == default_model_dir(home)
    expected = hashlib.sha256((where / "config.json").read_bytes()).hexdigest()[:16]
    assert base_fingerprint(where) == expected == LocalPolicy.load("carl-tiny", home).fingerprint
    assert resolve_model(str(where), home) == where


def test_a_prompt_longer_than_the_context_is_one_line(home: Path) -> None:
    policy = LocalPolicy.load("carl-tiny", home)
    with pytest.raises(PolicyError) as info:
        policy.generate_ids([5] * 300, max_new_tokens=4, temperature=1.0)
    assert str(info.value) == "the prompt has 300 tokens; the model's context is 256"
    with pytest.raises(PolicyError, match="not a peft adapter"):
        policy.swap_adapter(home, "v1", None)
    assert policy.version == "base"
