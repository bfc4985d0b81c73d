"""The arrays of one MLX training step: the batch (prompt + completion rows, padded by grpo.pack), the
per-token log-prob and entropy in one fused pass, the two losses (GRPO's advantages: grpo.py), and the
no-grad teacher forward of on-policy distillation (its arithmetic: opd.py).

Pure functions of arrays and the model, for engine/training/mlx_backend.py's loop; no state, no store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from . import grpo, opd


@dataclass
class Batch:
    """Prompt + completion rows, right-padded, and which positions are completion tokens."""

    inputs: mx.array  # [B, L]
    targets: mx.array  # [B, L-1]: the next token of each position
    mask: mx.array  # [B, L-1]: 1 where the target is a completion token
    lengths: list[int] = field(default_factory=list)  # completion tokens per row

    @classmethod
    def of(cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad: int) -> Batch:
        """The pairs packed by engine.training.grpo.pack (the agents trainer's too), as MLX arrays."""
        packed = grpo.pack(pairs, pad)
        inputs = mx.array(packed.ids.astype(np.int32))
        return cls(inputs, inputs[:, 1:], mx.array(packed.targets.astype(np.float32)), packed.lengths)


def token_stats(logits: mx.array, targets: mx.array, temperature: float) -> tuple[mx.array, mx.array]:
    """Log-prob of each target token and the entropy (nats) of its distribution, at `temperature`: one
    fused pass over the logits, never a stored log-softmax. With d = z - max z and e = exp(d):
    S = Σe, D = Σe·d, log-sum-exp = max z + ln S, H = ln S - D / S. The sums are taken in blocks
    (`blocked_sum`): one float32 sum over a 152k vocabulary on MLX's CPU drifts by ~4e-3 nats."""
    z = logits.astype(mx.float32) / temperature
    top = mx.stop_gradient(z.max(axis=-1, keepdims=True))
    d = z - top
    e = mx.exp(d)
    total = blocked_sum(e)
    log_total = mx.log(total)
    logp = mx.take_along_axis(d, targets[..., None], axis=-1)[..., 0] - log_total
    entropy = log_total - blocked_sum(e * d) / total
    return logp, entropy


def blocked_sum(x: mx.array, block: int = 512) -> mx.array:
    """Σ over the last axis as sums of blocks of `block` (zero-padded), then of those: the rounding of
    two short float32 sums instead of one long one."""
    width = x.shape[-1]
    if width <= block:
        return x.sum(axis=-1)
    blocks = -(-width // block)
    if blocks * block != width:
        x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * block - width)])
    return x.reshape(*x.shape[:-1], blocks, block).sum(axis=-1).sum(axis=-1)


def per_row(values: mx.array, batch: Batch) -> list[np.ndarray]:
    """A [B, L-1] array's completion positions, one numpy array per row."""
    array, mask = np.array(values), np.array(batch.mask).astype(bool)
    return [array[row][mask[row]].astype(np.float64) for row in range(array.shape[0])]


def completion_logprobs(model: Any, batch: Batch, temperature: float) -> list[np.ndarray]:
    """Each row's log-probs of its completion tokens at `temperature`, from one forward with no gradient
    (token_stats' fused pass, as the loss takes them): OPD's teacher scoring the student's tokens."""
    logits = model(batch.inputs)[:, :-1, :]
    logp, _ = token_stats(logits, batch.targets, temperature)
    return per_row(mx.stop_gradient(logp), batch)


def opd_advantages(
    model: Any,
    teacher_batch: Batch,
    student_logprobs: Sequence[np.ndarray],
    temperature: float,
    clip: float,
) -> list[np.ndarray]:
    """OPD's per-token advantages of hinted samples: clip(teacher − student, −clip, clip) on each sample's
    own completion tokens (opd.token_advantages). `teacher_batch` holds, a row per sample, the hinted prompt
    and the SAME completion tokens the student sampled (Batch.of); `student_logprobs` are the student's
    log-probs of those tokens, in the same order."""
    return [
        opd.token_advantages(t, s, clip)
        for t, s in teacher_pairs(model, teacher_batch, student_logprobs, temperature)
    ]


def teacher_pairs(
    model: Any, teacher_batch: Batch, student_logprobs: Sequence[np.ndarray], temperature: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(teacher, student) log-probs of each hinted sample's completion tokens: the teacher's from one
    no-grad forward of `teacher_batch`; what opd.token_advantages and opd.summary take."""
    teacher = completion_logprobs(model, teacher_batch, temperature)
    if len(teacher) != len(student_logprobs):
        raise ValueError(f"{len(teacher)} teacher rows for {len(student_logprobs)} student rows")
    return [(t, np.asarray(s, dtype=np.float64)) for t, s in zip(teacher, student_logprobs, strict=True)]


def per_token_advantages(
    advantages: np.ndarray, distilled: dict[int, np.ndarray], mask: np.ndarray, w_opd: float
) -> np.ndarray:
    """The [B, L-1] advantages of a batch whose rows `distilled` (row -> OPD advantage per completion token)
    have hints: each row's GRPO advantage on every position, plus w_opd times its OPD advantages on its
    completion positions (opd.combined). A row without a hint holds exactly float32(its GRPO advantage)."""
    out = np.repeat(np.asarray(advantages, dtype=np.float64)[:, None], mask.shape[1], axis=1)
    for row, opd_row in distilled.items():
        where = mask[row].astype(bool)
        out[row][where] = opd.combined(advantages[row], opd_row, int(where.sum()), w_opd)
    return out.astype(np.float32)


# -- the two losses (functions of the model, for nn.value_and_grad) ------------------------------------


def sft_loss(model: Any, batch: Batch) -> tuple[mx.array, tuple[mx.array, mx.array]]:
    """Mean cross-entropy over the completion tokens (TRL's completion-only loss); aux: their mean
    entropy and the share of them the model would have picked."""
    logits = model(batch.inputs)[:, :-1, :]
    logp, entropy = token_stats(logits, batch.targets, 1.0)
    n = mx.maximum(batch.mask.sum(), 1.0)
    loss = -(logp * batch.mask).sum() / n
    correct = (mx.argmax(logits, axis=-1) == batch.targets).astype(mx.float32)
    return loss, (
        mx.stop_gradient((entropy * batch.mask).sum() / n),
        mx.stop_gradient((correct * batch.mask).sum() / n),
    )


def grpo_loss(
    model: Any,
    batch: Batch,
    behaviour: mx.array,
    reference: mx.array | None,
    advantages: mx.array,
    temperature: float,
    epsilon: float,
    beta: float,
) -> tuple[mx.array, tuple[mx.array, ...]]:
    """The clipped surrogate of the per-token ratio to the behaviour policy, plus beta * k3 KL to the
    reference, over every completion token of the batch; aux: per-token entropy and log-prob, the
    shares of tokens the clip held below (r < 1 - ε, A < 0) and above (r > 1 + ε, A > 0), as TRL counts
    them, and the mean KL. `advantages` is one per row ([B], GRPO's) or one per token ([B, L-1], aligned
    with `targets`: GRPO's plus OPD's); the surrogate and the clip's counts take it elementwise either way."""
    logits = model(batch.inputs)[:, :-1, :]
    logp, entropy = token_stats(logits, batch.targets, temperature)
    ratio = mx.exp(logp - behaviour)
    if advantages.ndim == 1:
        advantage = advantages[:, None]
    elif advantages.shape == logp.shape:
        advantage = advantages
    else:
        raise ValueError(f"advantages of shape {advantages.shape}: expected [B] or {logp.shape}")
    surrogate = mx.minimum(ratio * advantage, mx.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage)
    per_token = -surrogate
    kl = mx.zeros_like(logp)
    if reference is not None and beta > 0:
        delta = reference - logp
        kl = mx.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    n = mx.maximum(batch.mask.sum(), 1.0)
    loss = (per_token * batch.mask).sum() / n
    low = ((ratio < 1 - epsilon) & (advantage < 0)).astype(mx.float32)
    high = ((ratio > 1 + epsilon) & (advantage > 0)).astype(mx.float32)
    return loss, (
        mx.stop_gradient(entropy),
        mx.stop_gradient(logp),
        mx.stop_gradient((low * batch.mask).sum() / n),
        mx.stop_gradient((high * batch.mask).sum() / n),
        mx.stop_gradient((kl * batch.mask).sum() / n),
    )
