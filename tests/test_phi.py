"""Phi per token: the chunked kernel against a float64 reference, the alignment rule, masking,
the aggregation, and a real forward of the built-in tiny model."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.coherence.phi import (
    completion_token_stats,
    phi_from_entropy,
    phi_from_model,
    reference_entropy,
    selected_token_stats,
    token_entropy,
)
from engine.coherence.summary import (
    phi_histogram,
    pick_traces,
    step_phi_stats,
    summarize_completion,
)
from engine.store import Store

# Nothing in these tests may reach the Hugging Face hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

TOL = 1e-4  # nats
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_logits(n: int, v: int, scale: float, seed: int, dtype: torch.dtype, offset: float = 0.0) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=gen) * scale + offset).to(dtype)


def reference_lse(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.logsumexp(logits.double() / temperature, dim=-1)


# -- the kernel -------------------------------------------------------------------------------


@PROPERTY
@given(
    n=st.integers(1, 64),
    v=st.integers(2, 5000),
    log_scale=st.floats(-3, 3),
    offset=st.floats(-100, 100),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    chunk_rows=st.one_of(st.none(), st.integers(1, 70)),
    seed=st.integers(0, 2**31 - 1),
)
def test_entropy_matches_the_float64_reference(
    n: int,
    v: int,
    log_scale: float,
    offset: float,
    dtype: torch.dtype,
    temperature: float,
    chunk_rows: int | None,
    seed: int,
) -> None:
    logits = random_logits(n, v, 10.0**log_scale, seed, dtype, offset)
    entropy, lse = token_entropy(logits, temperature=temperature, chunk_rows=chunk_rows)
    assert entropy.dtype == lse.dtype == torch.float32 and entropy.shape == lse.shape == (n,)
    # The reference sees the same low-precision values, upcast.
    expected = reference_entropy(logits, temperature=temperature)
    assert (entropy.double() - expected).abs().max().item() <= TOL
    expected_lse = reference_lse(logits, temperature)
    assert ((lse.double() - expected_lse).abs() <= 1e-5 + 1e-6 * expected_lse.abs()).all()
    phi = phi_from_entropy(entropy, v)
    assert phi.min().item() >= -1e-6 and phi.max().item() <= 1.0


@PROPERTY
@given(
    v=st.integers(2, 5000),
    value=st.floats(-1e4, 1e4),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
)
def test_uniform_logits_give_phi_zero(v: int, value: float, dtype: torch.dtype, temperature: float) -> None:
    logits = torch.full((3, v), value).to(dtype)
    entropy, _ = token_entropy(logits, temperature=temperature)
    assert phi_from_entropy(entropy, v).abs().max().item() <= 1e-6


def test_uniform_at_the_qwen_vocabulary_width() -> None:
    v = 151_936
    entropy, lse = token_entropy(torch.full((3, v), 7.25))
    assert phi_from_entropy(entropy, v).abs().max().item() <= 1e-6
    assert torch.allclose(lse.double(), torch.full((3,), 7.25 + math.log(v), dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@given(v=st.integers(2, 3000), hot_value=st.floats(-1e3, 1e3), seed=st.integers(0, 1000))
@settings(max_examples=25, deadline=None)
def test_one_hot_over_masked_vocab_gives_phi_one(
    v: int, hot_value: float, seed: int, dtype: torch.dtype
) -> None:
    hot = seed % v
    logits = torch.full((2, v), float("-inf"))
    logits[:, hot] = hot_value
    logits = logits.to(dtype)
    entropy, lse = token_entropy(logits)
    assert not entropy.isnan().any()
    assert entropy.abs().max().item() == 0.0
    assert phi_from_entropy(entropy, v).tolist() == [1.0, 1.0]
    prob, surprisal = selected_token_stats(logits, torch.tensor([hot, hot]), lse)
    assert prob.tolist() == [1.0, 1.0] and surprisal.abs().max().item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_margin_is_near_one_hot(dtype: torch.dtype) -> None:
    logits = random_logits(16, 4096, 1.0, 3, torch.float32)
    logits[torch.arange(16), torch.arange(16) * 7] = 200.0  # exp(-190) per other column
    logits = logits.to(dtype)
    entropy, _ = token_entropy(logits, chunk_rows=5)
    assert entropy.max().item() <= 1e-6
    assert (entropy.double() - reference_entropy(logits)).abs().max().item() <= TOL


def test_partly_masked_rows_have_no_nan_and_an_empty_row_is_nan() -> None:
    logits = random_logits(32, 1000, 3.0, 5, torch.float32)
    gen = torch.Generator().manual_seed(6)
    masked = torch.rand(32, 1000, generator=gen) < torch.linspace(0.0, 0.999, 32).unsqueeze(1)
    masked[:, 0] = False  # every row keeps at least one finite logit
    logits[masked] = float("-inf")
    entropy, lse = token_entropy(logits, temperature=0.8, chunk_rows=7)
    assert not entropy.isnan().any() and not lse.isnan().any()
    assert (entropy.double() - reference_entropy(logits, temperature=0.8)).abs().max().item() <= TOL
    empty, _ = token_entropy(torch.full((1, 10), float("-inf")))
    assert empty.isnan().all()  # no distribution, no entropy


def test_selected_token_stats_match_float64() -> None:
    logits = random_logits(40, 777, 4.0, 9, torch.bfloat16)
    ids = torch.randint(0, 777, (40,), generator=torch.Generator().manual_seed(1))
    _, lse = token_entropy(logits, temperature=0.7)
    prob, surprisal = selected_token_stats(logits, ids, lse, temperature=0.7)
    logp = torch.log_softmax(logits.double() / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(surprisal.double(), -logp, atol=1e-4)
    assert torch.allclose(prob.double(), logp.exp(), atol=1e-6, rtol=1e-4)


def test_the_kernel_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        token_entropy(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError):
        token_entropy(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        token_entropy(torch.zeros(2, 3), temperature=0.0)


# -- alignment and masking --------------------------------------------------------------------


def predictive_logits(ids: torch.Tensor, vocab: int, margins: torch.Tensor) -> torch.Tensor:
    """[1, T, V] logits whose row i puts `margins[i]` on ids[i + 1]: position i predicts token i+1."""
    t = ids.shape[0]
    logits = torch.zeros(1, t, vocab)
    logits[0, torch.arange(t - 1), ids[1:]] = margins[: t - 1]
    return logits


def test_token_t_is_scored_by_the_logits_at_t_minus_1() -> None:
    vocab, prompt = 50, 4
    ids = torch.tensor([3, 17, 8, 29, 11, 40, 2, 33, 21, 9])
    margins = torch.linspace(4.0, 13.0, ids.shape[0])  # each position a different certainty
    logits = predictive_logits(ids, vocab, margins)
    mask = (torch.arange(ids.shape[0]) >= prompt).unsqueeze(0)
    stats = completion_token_stats(logits, ids.unsqueeze(0), completion_mask=mask)
    n = ids.shape[0] - prompt
    assert len(stats) == 1 and stats.phi[0].shape == (n,) and stats.phi[0].dtype == np.float32

    expected = reference_entropy(logits[0, prompt - 1 : -1])  # rows P-1 .. N-2
    np.testing.assert_allclose(stats.entropy[0], expected.numpy(), atol=TOL)
    np.testing.assert_allclose(stats.phi[0], 1 - expected.numpy() / math.log(vocab), atol=TOL)
    # Every completion token was the one its previous position predicted, with margin >= 4.
    assert (stats.selected_prob[0] > 0.5).all()
    np.testing.assert_allclose(stats.surprisal[0], -np.log(stats.selected_prob[0]), rtol=1e-5, atol=1e-6)

    # The published pairing (logits[t] with ids[t], docs/reference/carl.md §2) scores the wrong distribution:
    # its entropies are shifted by one position and the "selected" token is one it did not predict.
    shifted_entropy, shifted_lse = token_entropy(logits[0, prompt:])
    shifted_prob, _ = selected_token_stats(logits[0, prompt:], ids[prompt:], shifted_lse)
    assert np.abs(shifted_entropy.numpy() - stats.entropy[0]).min() > 1e-3
    assert (shifted_prob.numpy() <= 1 / vocab + 1e-6).all()


def batch_with_prompts_and_padding() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Three right-padded prompt + completion rows; logits are NaN wherever they must not be read."""
    vocab, width = 64, 12
    prompt_lengths, completion_lengths = [3, 5, 2], [6, 2, 0]
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(1, vocab, (3, width), generator=gen)
    logits = torch.randn(3, width, vocab, generator=gen) * 3
    attention = torch.zeros(3, width, dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        attention[row, : p + c] = 1
        ids[row, p + c :] = 0  # padding id
        logits[row, : p - 1] = float("nan")  # prompt positions that score no completion token
        logits[row, p + c - 1 :] = float("nan")  # the last token's logits and the padding
    return logits, ids, attention, prompt_lengths, completion_lengths


def test_prompt_and_padding_positions_are_masked() -> None:
    logits, ids, attention, prompt_lengths, completion_lengths = batch_with_prompts_and_padding()
    mask = torch.zeros_like(attention, dtype=torch.bool)
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        mask[row, p : p + c] = True
    stats = completion_token_stats(logits, ids, completion_mask=mask, temperature=0.9)
    same = completion_token_stats(
        logits, ids, prompt_lengths=prompt_lengths, attention_mask=attention, temperature=0.9
    )
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        assert stats.phi[row].shape == (c,)
        for values in (stats.phi, stats.entropy, stats.selected_prob, stats.surprisal):
            assert np.isfinite(values[row]).all()
        expected = reference_entropy(logits[row, p - 1 : p + c - 1], temperature=0.9).numpy()
        np.testing.assert_allclose(stats.entropy[row], expected, atol=TOL)
        np.testing.assert_array_equal(same.entropy[row], stats.entropy[row])
        np.testing.assert_array_equal(same.surprisal[row], stats.surprisal[row])


def test_a_hole_in_the_completion_mask_is_skipped() -> None:
    logits, ids, _, _, _ = batch_with_prompts_and_padding()
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[0, [3, 4, 7, 8]] = True  # e.g. a tool result at 5..6 that the model did not generate
    stats = completion_token_stats(logits[:1], ids[:1], completion_mask=mask[:1])
    expected = reference_entropy(logits[0, [2, 3, 6, 7]]).numpy()
    np.testing.assert_allclose(stats.entropy[0], expected, atol=TOL)


def test_a_completion_at_column_zero_has_no_scoring_position() -> None:
    logits = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="column 0"):
        completion_token_stats(logits, torch.zeros(1, 4, dtype=torch.long), prompt_lengths=[0])
    with pytest.raises(ValueError):
        completion_token_stats(logits, torch.zeros(1, 5, dtype=torch.long), prompt_lengths=[1])


# -- aggregation ------------------------------------------------------------------------------


def test_completion_summary_counts_events() -> None:
    phi = np.array([0.5, 0.6, 0.55, 0.56, 0.4, 0.9], dtype=np.float32)
    entropy = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    summary = summarize_completion(phi, entropy, surprisal=[0.5, 1.5])
    # dPhi = +0.10, -0.05, +0.01, -0.16, +0.50
    assert (summary.n_crystallizations, summary.n_meltings) == (2, 2)
    assert summary.defect_density == pytest.approx(4 / 6)
    assert summary.commitments == (1, 5) and summary.n_commitments == 2
    assert summary.tokens == 6
    assert summary.phi_mean == pytest.approx(float(phi.astype(np.float64).mean()))
    assert summary.phi_std == pytest.approx(float(phi.astype(np.float64).std()))
    assert summary.phi_min == pytest.approx(0.4)
    assert summary.phi_p50 == pytest.approx(float(np.percentile(phi.astype(np.float64), 50)))
    assert summary.phi_p10 <= summary.phi_p50 <= summary.phi_p90
    assert summary.entropy_mean == 3.5 and summary.surprisal_mean == 1.0


def test_thresholds_are_strict_and_tunable() -> None:
    phi = [0.5, 0.75, 0.5, 1.0]  # exact binary steps: +0.25, -0.25, +0.5
    summary = summarize_completion(phi, [0.0] * 4, defect_threshold=0.25, commitment_threshold=0.25)
    assert (summary.n_crystallizations, summary.n_meltings) == (1, 0)
    assert summary.commitments == (3,)
    assert summarize_completion(phi, [0.0] * 4, commitment_threshold=0.6).commitments == ()


def test_an_empty_completion_summarises_to_nan_and_zero_counts() -> None:
    summary = summarize_completion([], [])
    assert summary.tokens == 0 and math.isnan(summary.phi_mean) and math.isnan(summary.surprisal_mean)
    assert (summary.n_crystallizations, summary.n_meltings, summary.defect_density) == (0, 0, 0.0)


def test_step_stats_weight_by_token_and_by_completion(store: Store) -> None:
    phi = [np.array([1.0]), np.zeros(3), np.zeros(0)]  # lengths 1, 3 and an empty completion
    entropy = [np.array([0.0]), np.full(3, math.log(512)), np.zeros(0)]
    row, metrics = step_phi_stats(7, phi, entropy, vocab_size=512)
    assert row["phi_mean"] == 0.25 and row["weighting"] == "token" and row["tokens"] == 4
    assert row["entropy_mean"] == pytest.approx(0.75 * math.log(512))
    assert metrics["phi/completion_mean"] == 0.5  # the empty completion counts in no mean
    assert metrics["phi/spread"] == 0.5
    assert row["phi_p10"] == 0.0 and row["phi_p50"] == 0.0 and row["phi_p90"] == pytest.approx(0.7)
    assert row["hist"] == [3] + [0] * 18 + [1] and row["vocab_size"] == 512

    run_id = store.create_run("phi", source_kind="jsonl")
    assert store.add_phi_stats(run_id, [row]) == 1
    stored = store.conn.execute(
        "SELECT phi_mean, tokens, weighting, hist FROM phi_stats WHERE run_id=?", (run_id,)
    ).fetchone()
    assert stored[:3] == (0.25, 4, "token") and json.loads(stored[3]) == row["hist"]
    mirrored = store.conn.execute(
        "SELECT value FROM metrics WHERE run_id=? AND key='phi/mean'", (run_id,)
    ).fetchone()
    assert mirrored[0] == 0.25


def test_step_stats_count_commitments_per_completion() -> None:
    phi = [np.array([0.1, 0.2, 0.1, 0.2]), np.array([0.5, 0.5])]
    _, metrics = step_phi_stats(0, phi, [np.zeros(4), np.zeros(2)], vocab_size=64)
    assert metrics["phi/commitments"] == 1.0  # two jumps in the first, none in the second
    assert metrics["phi/defect_density"] == pytest.approx((3 / 4 + 0) / 2)


def test_a_step_without_tokens_has_no_means() -> None:
    row, metrics = step_phi_stats(1, [np.zeros(0)], [np.zeros(0)], vocab_size=64)
    assert row["phi_mean"] is None and row["tokens"] == 0 and row["hist"] == [0] * 20
    assert metrics == {}


def test_histogram_clips_rounding_into_range() -> None:
    counts = phi_histogram([-1e-9, 0.0, 0.5, 1.0, 1.0000001, float("nan")])
    assert sum(counts) == 5 and counts[0] == 2 and counts[10] == 1 and counts[19] == 2


def test_pick_traces() -> None:
    rng = np.random.default_rng(0)
    picks = pick_traces([0.1, 0.9, 0.5, 0.3, 0.7], rng)
    assert (picks["best"], picks["worst"], picks["median"]) == (1, 0, 2)
    assert picks["random"] in {3, 4}
    tied = pick_traces([1.0, 1.0, 1.0], rng)
    assert (tied["best"], tied["worst"], tied["median"]) == (0, 0, 1)  # ties keep index order
    assert tied["random"] == 2
    with_nan = pick_traces([float("nan"), 2.0, 1.0], rng)
    assert (with_nan["best"], with_nan["worst"]) == (1, 2)
    assert pick_traces([], rng) == {}
    assert pick_traces([float("nan")], rng) == {"random": 0}


# -- a real model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.tiny import build_tiny_model

    path: Path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "carl-tiny")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def tiny_batch(tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + completion rows of different lengths."""
    pairs = [
        ("<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n", "It is sunny.</s>"),
        ("<|user|>\nHi</s>\n<|assistant|>\n", "Call the weather tool for Paris, please.</s>"),
    ]
    rows, masks = [], []
    for prompt, completion in pairs:
        p, c = tokenizer(prompt).input_ids, tokenizer(completion).input_ids
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    completion = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return ids, attention, completion


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_phi_from_the_tiny_model(tiny: tuple[Any, Any], dtype: torch.dtype) -> None:
    model, tokenizer = tiny
    model = copy.deepcopy(model).to(dtype).train()  # train mode: the forward must still run in eval
    ids, attention, completion = tiny_batch(tokenizer)
    stats = phi_from_model(model, ids, attention, completion, temperature=0.9)
    assert model.training  # restored

    assert stats.vocab_size == 512 and len(stats) == 2
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits
    for row in range(2):
        positions = completion[row].nonzero().squeeze(-1)
        assert stats.phi[row].shape == (positions.numel(),)
        scoring = logits[row, positions - 1]  # the model's own logits, in its dtype
        h64 = reference_entropy(scoring, temperature=0.9).numpy()
        np.testing.assert_allclose(stats.entropy[row], h64, atol=TOL)
        np.testing.assert_allclose(stats.phi[row], 1.0 - h64 / math.log(512), atol=TOL)
        logp = torch.log_softmax(scoring.double() / 0.9, -1).gather(-1, ids[row, positions, None]).squeeze(-1)
        np.testing.assert_allclose(stats.surprisal[row], -logp.numpy(), atol=TOL)
    # Random weights: close to uniform over 512 columns, so Phi sits near 0.
    assert 0.0 <= float(np.concatenate(stats.phi).mean()) < 0.1


def test_phi_from_the_tiny_model_in_micro_batches(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    ids, attention, completion = tiny_batch(tokenizer)
    ids, attention = torch.cat([ids, ids[:1]]), torch.cat([attention, attention[:1]])
    completion = torch.cat([completion, torch.zeros_like(completion[:1])])  # a row with nothing to score
    whole = phi_from_model(model, ids, attention, completion)
    one_by_one = phi_from_model(model, ids, attention, completion, batch_size=1)
    assert len(whole) == len(one_by_one) == 3 and whole.phi[2].shape == one_by_one.phi[2].shape == (0,)
    for row in range(2):
        np.testing.assert_allclose(one_by_one.entropy[row], whole.entropy[row], atol=1e-5)
        np.testing.assert_allclose(one_by_one.surprisal[row], whole.surprisal[row], atol=1e-5)
