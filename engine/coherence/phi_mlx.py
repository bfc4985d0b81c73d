"""Phi per token on MLX: the quantities of `engine.coherence.phi`, from mx.array logits.

    H   = -sum_v p_v ln p_v   (nats)        Phi = 1 - H / ln|V|

`token_entropy` reduces [N, V] logits row chunk by row chunk in float32; `completion_entropies`
and `completion_token_stats` apply the alignment rule (completion token t is scored by the logits
at t-1, prompt included as context) to a right-padded [B, T, V] batch; `phi_from_mlx_model` runs
the forward that produces those logits. Only MLX code imports this module (`engine.coherence`
does not import mlx), and it imports no torch.

How a chunk is reduced. With m the row maximum (taken in the logits' own dtype, so exact) and
d = (z - m) / temperature in float32 (d <= 0, and -inf at masked columns):
    e = exp(d),   S = sum e,   D = sum e * d,   H = ln S - D / S,   lse = m / temperature + ln S.
This is the textbook lse = logsumexp(z), p = exp(z - lse), H = lse - sum p * z, rearranged so
each logit costs one exp instead of two (logsumexp takes one and p another); exp is most of the
kernel's time on MLX's CPU backend. The shift by m keeps every term of D small, so float32
holds H to ~1e-6 nats at any offset of the logits. Without the shift, an offset of 1e4 leaves
lse and sum p * z each with ~1e-3 of rounding, and their difference keeps it.

Two more choices were measured before they were made (bench/bench_backends.py,
tests/test_phi_mlx.py):
- exp is a Cephes-style polynomial: range reduction by ln 2 split in two parts, a degree-6
  polynomial, and 2^n built from exponent bits. Its relative error is ~1e-7, and it is fused
  with the shift, the product e * d and the masking by `mx.compile`. MLX's CPU `mx.exp` is
  several times slower here (x86) and ~2e-6 relative. Where d < -87 the term is set to
  exactly 0: exp(-87) is near float32's smallest normal, and next to the row's largest term
  (1) no such term can change S. The same rule gives -inf (masked) columns zero probability
  without a 0 * -inf NaN.
- S and D are summed in two levels: float32 sums over blocks of at most sqrt(V) columns, then
  the sum of the block sums. That second sum is float64 where the default device is the CPU
  (MLX has no float64 on the GPU, where reductions are trees anyway). MLX's CPU reduction
  accumulates sequentially. At V = 151,936 with logits of scale 3, one float32 level gives H
  errors of ~3e-4 nats, two float32 levels ~6e-6, and a float64 outer level ~1e-6 (float32's
  own rounding of H near 12 nats is 5e-7). A width with no divisor near sqrt(V), a prime for
  example, is first padded with -inf columns, which have zero probability and change nothing.

A row with no finite logit has no distribution: its entropy and lse are NaN.

Memory: each chunk is evaluated (mx.eval) before the next is built, so the working set is a
handful of [chunk_rows, V] float32 buffers whatever N is: tests/test_phi_mlx.py measures about
8, under 10 MiB at the default CPU chunk (MLX splits an elementwise graph this deep into a few
kernels, and each intermediate is a buffer). Because of the mx.eval, call these functions
outside mx.grad and mx.compile transforms; logits from a training forward come out of the loss
as an auxiliary output, through mx.stop_gradient.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from engine.coherence.phi import CompletionTokenStats, phi_from_entropy

# A chunk holds about this many logits. On the CPU that is 1 MiB per float32 buffer, one row at
# |V| = 151,936. bench/bench_backends.py sweeps chunk_rows on Linux/x86: buffers of 2 MiB and more
# now and then run 3-5x slower, because the allocator maps them afresh for each chunk and pays a
# page fault per 4 KiB (seen as ~100k-200k minor faults per call, depending on the allocator's
# history). At 1 MiB or less no faults were seen, and 1-3 rows at that width are within noise of
# each other. On Apple's GPU each chunk's mx.eval is a round trip, so chunks are larger there.
# That GPU size is a guess: there is no Apple GPU here to measure it.
CHUNK_ELEMENTS_CPU = 1 << 18
CHUNK_ELEMENTS_GPU = 1 << 22

# Below this shifted logit a term is exactly 0 (exp(-87) = 1.6e-38, just above float32's smallest
# normal, so 2^n stays a normal number for every kept term).
EXP_FLOOR = -87.0
# Cephes expf: x = n ln2 + r with |r| <= ln2 / 2, ln2 split in two so n * ln2 is exact.
_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_ROUND = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds a float32 to the nearest integer
# The two-level sum: the outer level adds at most this many block sums.
MAX_BLOCKS = 4096
PAD_MULTIPLE = 256


def default_chunk_rows(vocab_size: int) -> int:
    elements = CHUNK_ELEMENTS_CPU if mx.default_device() == mx.cpu else CHUNK_ELEMENTS_GPU
    return max(1, elements // max(1, vocab_size))


# -- the kernel -------------------------------------------------------------------------------


def token_entropy(
    logits: mx.array, *, temperature: float = 1.0, chunk_rows: int | None = None
) -> tuple[mx.array, mx.array]:
    """Entropy (nats) and log-sum-exp of softmax(logits / temperature), row by row.

    logits: [N, V] mx.array of any floating dtype (float32, bfloat16, float16), reduced in
    float32. Returns two evaluated float32 [N] arrays. Masked columns (-inf) carry zero
    probability; a row with no finite logit gives NaN. Extra memory: a handful of
    [chunk_rows, V] float32 buffers (about 8, measured), whatever N is.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not mx.issubdtype(logits.dtype, mx.floating):
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n, v = logits.shape
    if n == 0:
        empty = mx.zeros((0,), dtype=mx.float32)
        return empty, empty
    pad, block = _sum_layout(v)
    outer = _outer_sum_dtype()
    rows = max(1, min(chunk_rows or default_chunk_rows(v), n))
    t = mx.array(temperature, dtype=mx.float32)  # an array, so a new temperature is not a recompile
    entropies, lses = [], []
    for start in range(0, n, rows):
        h, lse = _reduce_chunk(logits[start : start + rows], t, temperature, pad, block, outer)
        mx.eval(h, lse)  # bounds the working set to this chunk's buffers
        entropies.append(h)
        lses.append(lse)
    if len(entropies) == 1:
        return entropies[0], lses[0]
    entropy, lse = mx.concatenate(entropies), mx.concatenate(lses)
    mx.eval(entropy, lse)
    return entropy, lse


@functools.lru_cache(maxsize=64)
def _sum_layout(v: int) -> tuple[int, int]:
    """(padding columns, block width) for the two-level row sums of a width-v row.

    The block is the largest divisor of the (padded) width up to its square root, which balances
    the two levels' sequential accumulation; a width without one (a prime, say) is padded.
    """
    block = _largest_divisor_upto_sqrt(v)
    if v // block <= MAX_BLOCKS:
        return 0, block
    padded = -(-v // PAD_MULTIPLE) * PAD_MULTIPLE
    return padded - v, _largest_divisor_upto_sqrt(padded)


def _largest_divisor_upto_sqrt(v: int) -> int:
    return max(b for b in range(1, math.isqrt(v) + 1) if v % b == 0)


def _outer_sum_dtype() -> mx.Dtype:
    return mx.float64 if mx.default_device() == mx.cpu else mx.float32


def _exp_terms_ops(chunk: mx.array, m: mx.array, t: mx.array) -> tuple[mx.array, mx.array]:
    """(e, e * d) with d = (chunk - m) / t in float32; both exactly 0 where d < EXP_FLOOR or d = -inf."""
    d = (chunk.astype(mx.float32) - m) / t
    keep = d >= EXP_FLOOR  # False at -inf and NaN too: no 0 * -inf below, no NaN cast to int
    kept = mx.where(keep, d, 0.0)
    n = (kept * _LOG2E + _ROUND) - _ROUND  # nearest integer to d / ln2; faster here than mx.floor
    r = (kept - n * _LN2_HI) - n * _LN2_LO  # |r| <= ln2 / 2
    poly = _EXP_POLY[0] * r + _EXP_POLY[1]
    for c in _EXP_POLY[2:]:
        poly = poly * r + c
    two_n = mx.view(mx.left_shift(n.astype(mx.int32) + 127, 23), mx.float32)  # 2^n from its exponent bits
    e = mx.where(keep, (poly * (r * r) + r + 1.0) * two_n, 0.0)
    return e, mx.where(keep, e * d, 0.0)


# Fused into a few elementwise kernels (JIT-compiled C++ on CPU, Metal on Apple silicon; mlx.nn's
# activations are compiled the same way, so an mlx-lm box already has what this needs). MLX
# splits a graph this deep into a few kernels, each intermediate a [chunk_rows, V] buffer.
# Traced once per shape and dtype (cheap); the first C++ compile in a fresh MLX cache takes ~2 s.
_exp_terms = mx.compile(_exp_terms_ops)


def _reduce_chunk(
    chunk: mx.array, t: mx.array, temperature: float, pad: int, block: int, outer: mx.Dtype
) -> tuple[mx.array, mx.array]:
    if pad:
        chunk = mx.pad(chunk, [(0, 0), (0, pad)], constant_values=-math.inf)
    m = mx.max(chunk, axis=-1, keepdims=True).astype(mx.float32)  # exact in the input dtype
    e, ed = _exp_terms(chunk, m, t)
    total = _row_sum(e, block, outer)  # S in [1, V]
    dot = _row_sum(ed, block, outer)  # D <= 0
    entropy = (mx.log(total) - dot / total).astype(mx.float32)
    log_total = mx.log(total).astype(mx.float32)
    m = m.squeeze(-1)
    entropy = mx.maximum(entropy, 0.0)  # rounding can land just below 0
    lse = m / temperature + log_total
    empty = m == -math.inf  # no finite logit: no distribution
    nan = mx.array(math.nan, dtype=mx.float32)
    return mx.where(empty, nan, entropy), mx.where(empty, nan, lse)


def _row_sum(x: mx.array, block: int, outer: mx.Dtype) -> mx.array:
    """Row sums of [rows, width] float32: float32 sums of `block` columns, then their sum in `outer`."""
    rows, width = x.shape
    blocks = mx.sum(x.reshape(rows, width // block, block), axis=-1) if block > 1 else x
    return mx.sum(blocks.astype(outer), axis=-1)


def selected_token_stats(
    logits: mx.array, next_ids: mx.array, lse: mx.array, *, temperature: float = 1.0
) -> tuple[mx.array, mx.array]:
    """(probability, surprisal in nats) of next_ids[i] under row i, with `lse` from `token_entropy`.

    logits [N, V], next_ids [N] integer, lse [N] (same temperature). Both results are float32 [N].
    """
    ids = mx.array(next_ids).astype(mx.int32).reshape(-1, 1)
    picked = mx.take_along_axis(logits, ids, axis=-1).squeeze(-1).astype(mx.float32)
    logp = mx.minimum(picked / temperature - lse, 0.0)  # rounding can put it a hair above 0
    return mx.exp(logp), -logp


def reference_entropy(logits: Any, *, temperature: float = 1.0) -> np.ndarray:
    """Float64 entropy (nats) by plain numpy log-softmax, for tests and benches: [N, V] -> [N]."""
    z = _to_numpy(logits).astype(np.float64) / temperature
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # an all -inf row: NaN, as the kernel gives
        shifted = z - m
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        terms = np.where(np.isneginf(logp), 0.0, np.exp(logp) * logp)  # 0 * -inf is 0 here
    return -terms.sum(axis=-1)


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, mx.array):
        # numpy has no bfloat16: widen first (exact), then convert.
        return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)
    return np.asarray(x)


# -- completions ------------------------------------------------------------------------------


def completion_entropies(
    logits: mx.array,
    prompt_lengths: Sequence[int],
    completion_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> list[np.ndarray]:
    """Per-token entropy (nats, float32) of each row's completion tokens.

    logits [B, T', V] from a forward over right-padded prompt + completion rows (T' = T, or
    T - 1 for `model(ids[:, :-1])`: the last token's logits are never used). Row b holds
    prompt_lengths[b] prompt tokens, then completion_lengths[b] completion tokens, then padding;
    its completion token t is scored by logits[b, t - 1] (docs/reference/carl.md §2), so its values come from
    rows P-1 .. P+C-2. Padding after a row's tokens never reaches them under causal attention.
    """
    return [
        _to_numpy(entropy).astype(np.float32, copy=False)
        for entropy, _ in _completion_spans(
            logits, prompt_lengths, completion_lengths, temperature, chunk_rows
        )
    ]


def completion_token_stats(
    logits: mx.array,
    input_ids: Any,
    prompt_lengths: Sequence[int],
    completion_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_rows: int | None = None,
) -> CompletionTokenStats:
    """Phi, entropy, selected probability and surprisal of every completion token (as in
    `engine.coherence.phi.completion_token_stats`), for the batch layout of `completion_entropies`.

    input_ids [B, T]: the prompt + completion ids (mx.array, numpy or nested lists; ragged rows
    are fine), which give the selected tokens. `vocab_size` defaults to the logits width, the |V|
    of Phi.
    """
    width = vocab_size or logits.shape[-1]
    out = CompletionTokenStats([], [], [], [], width, temperature)
    spans = _completion_spans(logits, prompt_lengths, completion_lengths, temperature, chunk_rows)
    for row, (entropy, lse) in enumerate(spans):
        p, c = int(prompt_lengths[row]), int(completion_lengths[row])
        ids = _to_numpy(input_ids[row])
        if ids.shape[0] < p + c:
            raise ValueError(f"row {row} has {ids.shape[0]} ids, fewer than its {p} + {c} tokens")
        if c:
            span = logits[row, p - 1 : p + c - 1]
            prob, surprisal = selected_token_stats(
                span, mx.array(ids[p : p + c]), lse, temperature=temperature
            )
        else:
            prob = surprisal = mx.zeros((0,), dtype=mx.float32)
        h = _to_numpy(entropy).astype(np.float32, copy=False)
        out.phi.append(phi_from_entropy(h, width).astype(np.float32, copy=False))
        out.entropy.append(h)
        out.selected_prob.append(np.array(prob, dtype=np.float32))
        out.surprisal.append(np.array(surprisal, dtype=np.float32))
    return out


def _completion_spans(
    logits: mx.array,
    prompt_lengths: Sequence[int],
    completion_lengths: Sequence[int],
    temperature: float,
    chunk_rows: int | None,
) -> list[tuple[mx.array, mx.array]]:
    """(entropy, lse) over rows P-1 .. P+C-2 of each sequence's logits."""
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    batch, positions, _ = logits.shape
    if not len(prompt_lengths) == len(completion_lengths) == batch:
        raise ValueError(
            f"{len(prompt_lengths)} prompt lengths and {len(completion_lengths)} completion lengths "
            f"for {batch} rows of logits"
        )
    out = []
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        p, c = int(p), int(c)
        if c < 0 or p < 0:
            raise ValueError(f"row {row}: negative length (prompt {p}, completion {c})")
        if c == 0:
            empty = mx.zeros((0,), dtype=mx.float32)
            out.append((empty, empty))
            continue
        if p == 0:
            raise ValueError("a completion token at column 0 has no previous position to be scored by")
        if p + c - 1 > positions:
            raise ValueError(f"row {row}: {p} + {c} tokens need {p + c - 1} logit positions, got {positions}")
        # A contiguous view of the scoring rows; no copy of the logits.
        out.append(
            token_entropy(logits[row, p - 1 : p + c - 1], temperature=temperature, chunk_rows=chunk_rows)
        )
    return out


# -- from a model -----------------------------------------------------------------------------


def phi_from_mlx_model(
    model: Any,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_rows: int | None = None,
    batch_size: int | None = None,
) -> list[np.ndarray]:
    """Per-token Phi (float32) of each sequence's completion: sequences[b][prompt_lengths[b]:].

    The MLX counterpart of `engine.coherence.phi.phi_from_model`; see `token_stats_from_mlx_model`.
    """
    return token_stats_from_mlx_model(
        model,
        sequences,
        prompt_lengths,
        temperature=temperature,
        vocab_size=vocab_size,
        chunk_rows=chunk_rows,
        batch_size=batch_size,
    ).phi


def token_stats_from_mlx_model(
    model: Any,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    chunk_rows: int | None = None,
    batch_size: int | None = None,
) -> CompletionTokenStats:
    """Forwards of an mlx-lm causal LM over prompt + completion ids, reduced to per-token stats.

    sequences[b] is the full prompt + completion id list and its first prompt_lengths[b] ids are
    the prompt. Rows are right-padded (causal attention keeps the padding out of every real
    position) and the last column is not fed: its logits would score no token. `batch_size` rows
    per forward bound the logits held at once (default: all rows in one forward). No gradient is
    taken; the model runs in eval mode and its mode is restored after. |V| defaults to the
    logits width.
    """
    if len(sequences) != len(prompt_lengths):
        raise ValueError(f"{len(sequences)} sequences but {len(prompt_lengths)} prompt lengths")
    step = batch_size or max(1, len(sequences))
    out: CompletionTokenStats | None = None
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        for start in range(0, len(sequences), step):
            part = _forward_stats(
                model,
                sequences[start : start + step],
                prompt_lengths[start : start + step],
                temperature,
                vocab_size,
                chunk_rows,
            )
            if out is None:
                out = part
            else:
                for name in ("phi", "entropy", "selected_prob", "surprisal"):
                    getattr(out, name).extend(getattr(part, name))
    finally:
        model.train(was_training)
    return out if out is not None else CompletionTokenStats([], [], [], [], vocab_size or 0, temperature)


def _forward_stats(
    model: Any,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    temperature: float,
    vocab_size: int | None,
    chunk_rows: int | None,
) -> CompletionTokenStats:
    prompts = [int(p) for p in prompt_lengths]
    completions = [len(seq) - p for seq, p in zip(sequences, prompts, strict=True)]
    if any(c < 0 for c in completions):
        raise ValueError("a prompt length is longer than its sequence")
    if any(c > 0 and p == 0 for p, c in zip(prompts, completions, strict=True)):
        raise ValueError("a completion token at column 0 has no previous position to be scored by")
    if not any(completions):  # nothing to score: skip the forward
        width = vocab_size or _logits_width(model)
        empty = [np.zeros(0, dtype=np.float32) for _ in sequences]
        return CompletionTokenStats(empty, list(empty), list(empty), list(empty), width, temperature)
    columns = max(len(seq) for seq in sequences) - 1
    ids = np.zeros((len(sequences), columns), dtype=np.int32)  # pad id 0: never attended to
    for row, seq in enumerate(sequences):
        fed = list(seq[:columns])
        ids[row, : len(fed)] = fed
    logits = model(mx.array(ids))
    return completion_token_stats(
        logits,
        [list(seq) for seq in sequences],
        prompts,
        completions,
        temperature=temperature,
        vocab_size=vocab_size,
        chunk_rows=chunk_rows,
    )


def _logits_width(model: Any) -> int:
    args = getattr(model, "args", None)
    if args is not None and getattr(args, "vocab_size", None):
        return int(args.vocab_size)
    return int(model(mx.array([[0]])).shape[-1])


__all__ = [
    "CHUNK_ELEMENTS_CPU",
    "CHUNK_ELEMENTS_GPU",
    "completion_entropies",
    "completion_token_stats",
    "default_chunk_rows",
    "phi_from_mlx_model",
    "reference_entropy",
    "selected_token_stats",
    "token_entropy",
    "token_stats_from_mlx_model",
]
