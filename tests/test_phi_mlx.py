"""Phi on MLX (engine.coherence.phi_mlx): the kernel against a float64 reference and against the
torch kernel, the alignment rule on a right-padded batch, and parity with torch on the same
tiny-model weights loaded by transformers and by mlx-lm."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

mx = pytest.importorskip("mlx.core")

from engine.coherence import phi_mlx  # noqa: E402
from engine.coherence.phi_mlx import (  # noqa: E402
    completion_entropies,
    completion_token_stats,
    default_chunk_rows,
    phi_from_mlx_model,
    reference_entropy,
    selected_token_stats,
    token_entropy,
    token_stats_from_mlx_model,
)

# Nothing in these tests may reach the Hugging Face hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-5  # nats: the kernel against float64 (measured worst case ~6e-7 at |V| = 151,936)
PARITY_TOL = 1e-4  # Phi, MLX against torch on the same weights
DTYPES = (mx.float32, mx.bfloat16, mx.float16)
QWEN_V = 151_936
PROPERTY = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def random_logits(
    n: int, v: int, scale: float, seed: int, dtype: Any = mx.float32, offset: float = 0.0
) -> Any:
    values = np.random.default_rng(seed).standard_normal((n, v), dtype=np.float32) * np.float32(scale)
    return mx.array(values + np.float32(offset)).astype(dtype)


def as_float64(logits: Any) -> np.ndarray:
    return np.array(logits.astype(mx.float32)).astype(np.float64)


def reference_lse(logits: Any, temperature: float = 1.0) -> np.ndarray:
    z = as_float64(logits) / temperature
    m = z.max(axis=-1)
    return m + np.log(np.exp(z - m[:, None]).sum(axis=-1))


def max_error(entropy: Any, expected: np.ndarray) -> float:
    return float(np.abs(np.array(entropy).astype(np.float64) - expected).max())


# -- the kernel against float64 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "v", "scale", "offset"),
    [
        (1, 2, 1.0, 0.0),
        (17, 7, 2.0, 0.0),
        (64, 512, 3.0, 0.0),  # the tiny model's vocabulary
        (33, 5000, 0.05, 0.0),  # near uniform: H close to ln|V|
        (12, 50_021, 3.0, 0.0),  # a prime width: padded for the two-level sums
        (9, QWEN_V, 3.0, 0.0),
        (9, QWEN_V, 0.1, 0.0),
        (9, QWEN_V, 30.0, 0.0),  # peaked: H well below 1 nat
        (9, QWEN_V, 3.0, 1e4),  # a huge offset: the shift by the row max keeps float32 exact
        (9, QWEN_V, 3.0, -1e4),
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_entropy_matches_the_float64_reference(
    n: int, v: int, scale: float, offset: float, temperature: float, dtype: Any
) -> None:
    logits = random_logits(n, v, scale, seed=n * 7 + v, dtype=dtype, offset=offset)
    entropy, lse = token_entropy(logits, temperature=temperature)
    assert entropy.dtype == lse.dtype == mx.float32 and entropy.shape == lse.shape == (n,)
    # The reference sees the same low-precision values, widened.
    assert max_error(entropy, reference_entropy(logits, temperature=temperature)) <= TOL
    expected_lse = reference_lse(logits, temperature)
    assert (np.abs(np.array(lse) - expected_lse) <= 1e-5 + 1e-6 * np.abs(expected_lse)).all()
    phi = 1.0 - np.array(entropy) / math.log(v)
    assert phi.min() >= -1e-6 and phi.max() <= 1.0


@PROPERTY
@given(
    n=st.integers(1, 40),
    v=st.integers(2, 6000),
    log_scale=st.floats(-3, 3),
    offset=st.floats(-100, 100),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    chunk_rows=st.one_of(st.none(), st.integers(1, 50)),
    seed=st.integers(0, 2**31 - 1),
)
def test_entropy_matches_the_reference_for_any_shape_and_chunking(
    n: int,
    v: int,
    log_scale: float,
    offset: float,
    dtype: Any,
    temperature: float,
    chunk_rows: int | None,
    seed: int,
) -> None:
    logits = random_logits(n, v, 10.0**log_scale, seed, dtype, offset)
    entropy, _ = token_entropy(logits, temperature=temperature, chunk_rows=chunk_rows)
    assert max_error(entropy, reference_entropy(logits, temperature=temperature)) <= TOL


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_logits_give_phi_zero(dtype: Any) -> None:
    for v, value in ((2, 0.0), (512, -3.5), (QWEN_V, 7.25)):
        entropy, lse = token_entropy(mx.full((3, v), value).astype(dtype), temperature=0.6)
        assert np.abs(1.0 - np.array(entropy) / math.log(v)).max() <= 1e-6
        np.testing.assert_allclose(np.array(lse), value / 0.6 + math.log(v), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_over_masked_vocab_gives_phi_one(dtype: Any) -> None:
    for v, hot, value in ((2, 1, 0.0), (512, 17, -300.0), (QWEN_V, 150_000, 1000.0)):
        logits = np.full((2, v), -np.inf, dtype=np.float32)
        logits[:, hot] = value
        logits = mx.array(logits).astype(dtype)
        entropy, lse = token_entropy(logits)
        assert np.array(entropy).tolist() == [0.0, 0.0]  # exactly: no NaN from 0 * -inf
        prob, surprisal = selected_token_stats(logits, mx.array([hot, hot]), lse)
        assert np.array(prob).tolist() == [1.0, 1.0] and np.array(surprisal).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_huge_margin_is_near_one_hot(dtype: Any) -> None:
    values = np.random.default_rng(3).standard_normal((16, 4096), dtype=np.float32)
    values[np.arange(16), np.arange(16) * 7] = 200.0  # exp(-190) for every other column
    logits = mx.array(values).astype(dtype)
    entropy, _ = token_entropy(logits, chunk_rows=5)
    assert float(np.array(entropy).max()) <= 1e-6
    assert max_error(entropy, reference_entropy(logits)) <= TOL


def test_partly_masked_rows_have_no_nan_and_an_empty_row_is_nan() -> None:
    rng = np.random.default_rng(5)
    values = rng.standard_normal((32, 1000), dtype=np.float32) * 3
    masked = rng.random((32, 1000)) < np.linspace(0.0, 0.999, 32)[:, None]
    masked[:, 0] = False  # every row keeps at least one finite logit
    values[masked] = -np.inf
    values[3, 1:] = -np.inf  # a single finite logit: H = 0
    logits = mx.array(values)
    entropy, lse = token_entropy(logits, temperature=0.8, chunk_rows=7)
    assert np.isfinite(np.array(entropy)).all() and np.isfinite(np.array(lse)).all()
    assert max_error(entropy, reference_entropy(logits, temperature=0.8)) <= TOL
    assert float(np.array(entropy)[3]) == 0.0
    empty_h, empty_lse = token_entropy(mx.full((2, 10), -math.inf))
    assert np.isnan(np.array(empty_h)).all() and np.isnan(np.array(empty_lse)).all()
    # An empty row among finite ones spoils only itself.
    mixed = mx.concatenate([logits[:2], mx.full((1, 1000), -math.inf), logits[2:4]])
    h, _ = token_entropy(mixed, chunk_rows=2)
    assert np.isnan(np.array(h)).tolist() == [False, False, True, False, False]


def test_the_float32_sum_layout_used_off_the_cpu_is_within_tolerance() -> None:
    """Where MLX has no float64 (the GPU) the block sums are added in float32; check that path here."""
    logits = random_logits(9, QWEN_V, 3.0, seed=8)
    pad, block = phi_mlx._sum_layout(QWEN_V)
    t = mx.array(0.9, dtype=mx.float32)
    entropy, lse = phi_mlx._reduce_chunk(logits, t, 0.9, pad, block, mx.float32)
    assert max_error(entropy, reference_entropy(logits, temperature=0.9)) <= TOL
    np.testing.assert_allclose(np.array(lse), reference_lse(logits, 0.9), rtol=1e-6)


def test_the_working_set_is_bounded_by_the_chunk_not_the_rows() -> None:
    rows = default_chunk_rows(QWEN_V)
    logits = random_logits(30 * rows, QWEN_V, 3.0, seed=9)
    token_entropy(logits[:rows])  # compile and trace first
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    token_entropy(logits)
    chunk_bytes = rows * QWEN_V * 4
    # About 8 chunk-sized float32 buffers are live at once (the fused kernel's outputs and the
    # intermediates MLX materialises where it splits the graph); the logits are 30 chunks.
    assert mx.get_peak_memory() - before <= 10 * chunk_bytes


def test_selected_token_stats_match_float64() -> None:
    logits = random_logits(40, 777, 4.0, seed=9, dtype=mx.bfloat16)
    ids = np.random.default_rng(1).integers(0, 777, 40)
    _, lse = token_entropy(logits, temperature=0.7)
    prob, surprisal = selected_token_stats(logits, mx.array(ids), lse, temperature=0.7)
    z = as_float64(logits) / 0.7
    logp = z[np.arange(40), ids] - reference_lse(logits, 0.7)
    np.testing.assert_allclose(np.array(surprisal), -logp, atol=1e-4)
    np.testing.assert_allclose(np.array(prob), np.exp(logp), atol=1e-6, rtol=1e-4)


def test_the_kernel_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        token_entropy(mx.zeros((2, 3, 4)))
    with pytest.raises(TypeError):
        token_entropy(mx.zeros((2, 3), dtype=mx.int32))
    with pytest.raises(ValueError):
        token_entropy(mx.zeros((2, 3)), temperature=0.0)
    h, lse = token_entropy(mx.zeros((0, 5)))
    assert h.shape == lse.shape == (0,)


# -- against the torch kernel -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "v", "temperature"), [(64, 512, 1.0), (24, QWEN_V, 0.7), (40, 5003, 1.3)])
def test_entropy_matches_the_torch_kernel(dtype: Any, n: int, v: int, temperature: float) -> None:
    torch = pytest.importorskip("torch")
    from engine.coherence.phi import token_entropy as torch_token_entropy

    logits = random_logits(n, v, 3.0, seed=v + n, dtype=dtype, offset=-20.0)
    torch_dtype = {mx.float32: torch.float32, mx.bfloat16: torch.bfloat16, mx.float16: torch.float16}[dtype]
    # The same values: widening to float32 and narrowing back is exact.
    same = torch.from_numpy(np.array(logits.astype(mx.float32))).to(torch_dtype)
    entropy, lse = token_entropy(logits, temperature=temperature)
    torch_entropy, torch_lse = torch_token_entropy(same, temperature=temperature)
    np.testing.assert_allclose(np.array(entropy), torch_entropy.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(np.array(lse), torch_lse.numpy(), rtol=1e-6, atol=1e-5)


def test_completion_stats_match_the_torch_path() -> None:
    torch = pytest.importorskip("torch")
    from engine.coherence.phi import completion_token_stats as torch_completion_token_stats

    logits, ids, prompts, completions = padded_batch(vocab=300, width=14, seed=4)
    attention = np.zeros(ids.shape, dtype=np.int64)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        attention[row, : p + c] = 1
    expected = torch_completion_token_stats(
        torch.from_numpy(np.nan_to_num(logits)),  # torch reads every row it is given
        torch.from_numpy(ids),
        prompt_lengths=prompts,
        attention_mask=torch.from_numpy(attention),
        temperature=0.9,
    )
    got = completion_token_stats(mx.array(logits), mx.array(ids), prompts, completions, temperature=0.9)
    assert got.vocab_size == expected.vocab_size == 300 and len(got) == len(expected) == 3
    for name in ("phi", "entropy", "selected_prob", "surprisal"):
        for row in range(3):
            mine, theirs = getattr(got, name)[row], getattr(expected, name)[row]
            assert mine.dtype == np.float32 and mine.shape == theirs.shape == (completions[row],)
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=TOL, err_msg=name)


# -- alignment and padding --------------------------------------------------------------------


def padded_batch(vocab: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """Three right-padded prompt + completion rows; logits are NaN wherever they must not be read."""
    prompts, completions = [3, 5, 2], [6, 2, 0]
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (3, width))
    logits = (rng.standard_normal((3, width, vocab)) * 3).astype(np.float32)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[row, p + c :] = 0  # padding id
        logits[row, : p - 1] = np.nan  # prompt positions that score no completion token
        logits[row, p + c - 1 :] = np.nan  # the last token's logits and the padding
    return logits, ids, prompts, completions


def test_token_t_is_scored_by_the_logits_at_t_minus_1() -> None:
    vocab, prompt = 50, 4
    ids = np.array([3, 17, 8, 29, 11, 40, 2, 33, 21, 9])
    margins = np.linspace(4.0, 13.0, ids.shape[0])  # each position a different certainty
    logits = np.zeros((1, ids.shape[0], vocab), dtype=np.float32)
    logits[0, np.arange(ids.shape[0] - 1), ids[1:]] = margins[:-1]  # row i predicts token i + 1
    n = ids.shape[0] - prompt
    stats = completion_token_stats(mx.array(logits), [ids.tolist()], [prompt], [n])
    assert len(stats) == 1 and stats.phi[0].shape == (n,) and stats.phi[0].dtype == np.float32

    expected = reference_entropy(logits[0, prompt - 1 : -1])  # rows P-1 .. N-2
    np.testing.assert_allclose(stats.entropy[0], expected, atol=TOL)
    np.testing.assert_allclose(stats.phi[0], 1 - expected / math.log(vocab), atol=TOL)
    assert (stats.selected_prob[0] > 0.5).all()  # each token was the one its predecessor predicted
    np.testing.assert_allclose(stats.surprisal[0], -np.log(stats.selected_prob[0]), rtol=1e-5, atol=1e-6)
    # The logits of model(ids[:, :-1]) (one position shorter) give the same values.
    shorter = completion_entropies(mx.array(logits[:, :-1]), [prompt], [n])
    np.testing.assert_array_equal(shorter[0], stats.entropy[0])


def test_prompt_and_padding_positions_are_never_read() -> None:
    logits, _, prompts, completions = padded_batch(vocab=64, width=12, seed=11)
    entropies = completion_entropies(mx.array(logits), prompts, completions, temperature=0.9)
    assert [e.shape for e in entropies] == [(c,) for c in completions]
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        assert entropies[row].dtype == np.float32 and np.isfinite(entropies[row]).all()
        expected = reference_entropy(logits[row, p - 1 : p + c - 1], temperature=0.9)
        np.testing.assert_allclose(entropies[row], expected, atol=TOL)


def test_bad_lengths_are_refused() -> None:
    logits = mx.zeros((1, 4, 8))
    with pytest.raises(ValueError, match="column 0"):
        completion_entropies(logits, [0], [2])
    with pytest.raises(ValueError, match="logit positions"):
        completion_entropies(logits, [3], [3])  # needs rows 2 .. 4 of 4
    with pytest.raises(ValueError):
        completion_entropies(logits, [1, 1], [1, 1])  # two rows of lengths, one row of logits
    with pytest.raises(ValueError):
        completion_entropies(mx.zeros((4, 8)), [1], [1])
    assert completion_entropies(logits, [4], [0])[0].shape == (0,)


# -- a real model: the same weights in torch and MLX ------------------------------------------


@pytest.fixture(scope="module")
def sharpened_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its final norm scaled up: its random-weight logits are nearly uniform
    (Phi ~ 0), and sharper ones give the per-token values room to disagree."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("sharp") / "carl-tiny-sharp"
    shutil.copytree(tiny_model, out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    model.save_pretrained(out)
    return out


def task_sequences(tokenizer: Any, count: int) -> tuple[list[list[int]], list[int]]:
    """Chat-template prompts of the demo task with completions of different lengths and kinds."""
    from engine.demo.task import task_rows

    rows = task_rows()[:count]
    extra = ["", "I will check.", 'get_time("Lima")', "Sure, " * 7]
    sequences, prompt_lengths = [], []
    for i, row in enumerate(rows):
        prompt = list(
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)[
                "input_ids"
            ]
        )
        text = row["completion"][0]["content"] if i % 2 == 0 else extra[i % len(extra)] + row["answer_city"]
        completion = tokenizer(text + tokenizer.eos_token, add_special_tokens=False).input_ids
        sequences.append(prompt + completion)
        prompt_lengths.append(len(prompt))
    return sequences, prompt_lengths


def torch_stats(
    model_dir: Path, sequences: list[list[int]], prompt_lengths: list[int], temperature: float
) -> Any:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from engine.coherence.phi import phi_from_model

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    width = max(map(len, sequences))
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    completion = torch.zeros_like(ids)
    for row, (seq, p) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        completion[row, p : len(seq)] = 1
    return phi_from_model(model, ids, attention, completion, temperature=temperature)


@pytest.mark.parametrize("which", ["as_built", "sharpened"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_parity_with_torch_on_the_same_weights(
    which: str, temperature: float, tiny_model: Path, request: pytest.FixtureRequest
) -> None:
    mlx_lm = pytest.importorskip("mlx_lm")
    from transformers import AutoTokenizer

    model_dir = tiny_model if which == "as_built" else request.getfixturevalue("sharpened_model")
    sequences, prompt_lengths = task_sequences(AutoTokenizer.from_pretrained(model_dir), 6)
    expected = torch_stats(model_dir, sequences, prompt_lengths, temperature)

    model, _ = mlx_lm.load(str(model_dir))
    got = token_stats_from_mlx_model(model, sequences, prompt_lengths, temperature=temperature)
    phi = phi_from_mlx_model(model, sequences, prompt_lengths, temperature=temperature)
    assert got.vocab_size == expected.vocab_size == 512 and len(got) == len(phi) == len(sequences)
    for row, (seq, p) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        assert got.phi[row].shape == expected.phi[row].shape == (len(seq) - p,)
        np.testing.assert_allclose(got.phi[row], expected.phi[row], rtol=0, atol=PARITY_TOL)
        np.testing.assert_allclose(
            got.entropy[row], expected.entropy[row], rtol=0, atol=PARITY_TOL * math.log(512)
        )
        np.testing.assert_allclose(got.surprisal[row], expected.surprisal[row], rtol=0, atol=1e-3)
        np.testing.assert_array_equal(phi[row], got.phi[row])
    pooled = np.concatenate(got.phi)
    if which == "as_built":
        assert 0.0 <= pooled.mean() < 0.1  # random weights: close to uniform over 512 columns
    else:
        # Sharp and varied distributions (entropies spread over nats), so a misaligned row would show.
        entropies = np.concatenate(got.entropy)
        assert pooled.mean() > 0.5 and entropies.std() > 0.2, (pooled.mean(), entropies.std())


def test_phi_from_an_mlx_model_in_micro_batches_and_its_mode(tiny_model: Path) -> None:
    mlx_lm = pytest.importorskip("mlx_lm")
    from transformers import AutoTokenizer

    sequences, prompt_lengths = task_sequences(AutoTokenizer.from_pretrained(tiny_model), 4)
    sequences.append(sequences[0][: prompt_lengths[0]])  # a row with nothing to score
    prompt_lengths.append(prompt_lengths[0])
    model, _ = mlx_lm.load(str(tiny_model))
    model.train()  # the forward runs in eval mode, and the mode is restored after
    whole = token_stats_from_mlx_model(model, sequences, prompt_lengths, temperature=0.9)
    assert model.training
    one_by_one = token_stats_from_mlx_model(model, sequences, prompt_lengths, temperature=0.9, batch_size=1)
    assert len(whole) == len(one_by_one) == 5 and whole.phi[4].shape == one_by_one.phi[4].shape == (0,)
    for row in range(4):
        np.testing.assert_allclose(one_by_one.entropy[row], whole.entropy[row], atol=1e-5)
        np.testing.assert_allclose(one_by_one.surprisal[row], whole.surprisal[row], atol=1e-5)
    nothing = token_stats_from_mlx_model(model, sequences[4:], prompt_lengths[4:])
    assert nothing.vocab_size == 512 and nothing.phi[0].shape == (0,)
    with pytest.raises(ValueError, match="column 0"):
        phi_from_mlx_model(model, [[5, 6, 7]], [0])


# -- imports ----------------------------------------------------------------------------------


def test_the_mlx_path_imports_no_torch_and_coherence_imports_no_mlx() -> None:
    code = (
        "import json, sys\n"
        "import engine.coherence, engine.coherence.phi, engine.coherence.summary\n"
        "before = 'mlx' in sys.modules\n"
        "import engine.coherence.phi_mlx\n"
        "print(json.dumps([before, 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == [False, False]


# -- the MLX backend's sampler: Φ from the generating pass -----------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampler_measures_what_the_forward_path_measures(
    tiny_model: Path, tmp_path: Path, temperature: float
) -> None:
    """The MLX backend's sampler reduces each decoding step's logits with the fused kernel; the coherence
    rewards take those entropies. They equal a forward over prompt + completion on the same tokens (1e-5
    nats), with rows that finish at different steps (the finished rows' later steps are not kept)."""
    from engine.training.backend import Reporter
    from engine.training.config import TrainConfig
    from engine.training.mlx_backend import MLXBackend

    config = TrainConfig(model=str(tiny_model), temperature=temperature, max_completion_length=16)
    backend = MLXBackend(
        config, home=tmp_path, output_dir=tmp_path / "out", reporter=Reporter(None, 0), pump=None
    )
    backend.prepare()
    # The untrained tiny model rarely picks its one EOS: 40 more ids that end a sequence make rows finish
    # at different steps.
    backend.tokenizer.eos_token_ids = {backend.tokenizer.eos_token_id, *range(100, 140)}
    prompt = backend.tokenizer.encode("<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n")
    samples = backend._sample(prompt, 6, mx.random.key(3))
    lengths = [len(s.token_ids) for s in samples]
    assert len(set(lengths)) > 1, lengths
    stats = token_stats_from_mlx_model(
        backend.model,
        [s.prompt_ids + s.token_ids for s in samples],
        [len(s.prompt_ids) for s in samples],
        temperature=temperature,
    )
    for sample, entropy, surprisal in zip(samples, stats.entropy, stats.surprisal, strict=True):
        np.testing.assert_allclose(sample.entropies, entropy, atol=TOL, rtol=0)
        np.testing.assert_allclose(sample.logprobs, -surprisal, atol=TOL, rtol=0)
    assert backend.sampling_phi_seconds > 0
