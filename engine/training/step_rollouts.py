"""One GRPO step's samples as rollout rows (engine/store/rollouts.py), alike from the torch and MLX backends.

Each sample keeps its prompt, completion, each reward function's value, the weighted total, the advantage the
trainer computed, its GRPO group (the step's i-th group of `num_generations` samples) and, per token, the
token's text, the entropy of the distribution that generated it (nats, at the sampling temperature) and the
chosen token's log-probability. The per-token values are the very arrays the run's Φ comes from (the loss
forward), so the rollouts viewer and the Φ charts can never disagree.

At most `rollouts_per_step` samples are kept a step: whole groups, the first ones of the step, so a group is
shown with all its members (a cap below the group size keeps the first group's first samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class TokenTexts:
    """Each token's text, decoded alone and once: a step has thousands of tokens but few distinct ids."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.known: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        known = self.known
        out = []
        for token in ids:
            text = known.get(token)
            if text is None:
                text = known[token] = self.decode([token])
            out.append(text)
        return out


def kept(samples: int, group: int, cap: int) -> range:
    """Which of a step's samples are stored: whole groups from the first, at most `cap` samples."""
    if cap >= samples:
        return range(samples)
    return range(max(cap // group * group, cap if cap < group else 0))


def step_rollouts(
    *,
    prompts: Sequence[str],
    completions: Sequence[str],
    token_ids: Sequence[Sequence[int]],
    token_texts: TokenTexts,
    names: Sequence[str],
    rewards: np.ndarray,
    totals: np.ndarray,
    advantages: np.ndarray | None,
    entropies: Sequence[np.ndarray | None],
    logprobs: Sequence[np.ndarray | None],
    group: int,
    cap: int,
    extras: dict[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The rows of the kept samples; `rewards` is (samples, functions) with NaN where a function gave None.
    extras: sample -> what its row keeps beside (an OPD sample's hint and per-token OPD advantages)."""
    rows = []
    for i in kept(len(completions), group, cap):
        ids = list(token_ids[i])
        row = {
            "idx": i,
            "group_id": str(i // group),
            "prompt": prompts[i],
            "completion": completions[i],
            "rewards": {name: _finite(rewards[i, j]) for j, name in enumerate(names)},
            "total": _finite(totals[i]),
            "advantage": None if advantages is None else _finite(advantages[i]),
            "length": len(ids),
            "tokens": token_texts(ids),
            "entropy": _per_token(entropies[i], len(ids)),
            "logprob": _per_token(logprobs[i], len(ids)),
        }
        if extras and i in extras:
            row["extra"] = extras[i]
        rows.append(row)
    return rows


def _per_token(values: np.ndarray | None, tokens: int) -> list[float] | None:
    """A per-token array as a list, or None when there is none for exactly these tokens."""
    if values is None or len(values) != tokens:
        return None
    return np.asarray(values, dtype=np.float64).tolist()


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
