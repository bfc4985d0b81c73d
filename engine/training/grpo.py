"""GRPO's arithmetic that no framework owns: a group's advantages, and prompt + completion rows packed.

One copy, shared by the MLX backend (`mlx_backend.py`) and the agents plane's trainer
(`engine/agents/trainer.py`); the torch backend leaves both to TRL's `GRPOTrainer`. The advantages are TRL's,
line for line: trl 1.16.0, `trl/trainer/grpo_trainer.py` (`GRPOTrainer._generate_and_score_completions`, the
`multi_objective_aggregation` and `scale_rewards` branches) and `trl/trainer/utils.py` (`nanstd`).
tests/test_grpo.py runs TRL's trainer on the same rewards and compares. Numpy only: no torch, no mlx.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

EPS = 1e-4  # TRL's: advantages / (std + 1e-4)
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]
Scale = Literal["group", "batch", "none"]


@dataclass(frozen=True)
class Advantages:
    advantages: np.ndarray  # [N]: one per completion; 0 for a completion no reward scored
    totals: np.ndarray  # [N]: the weighted sum of its rewards, NaN where no reward scored it
    zero_std: np.ndarray  # [N] bool: the std it was scaled by is ~0 (TRL's `is_std_zero`)

    @property
    def frac_zero_std(self) -> float:
        """TRL's `frac_reward_zero_std`."""
        return float(np.mean(self.zero_std)) if self.zero_std.size else 0.0


def group_advantages(
    values: np.ndarray,
    weights: np.ndarray,
    sizes: Sequence[int],
    *,
    aggregation: Aggregation = "sum_then_normalize",
    scale: Scale = "group",
) -> Advantages:
    """TRL's advantages of `values` [N, K] (reward k of completion n, NaN where reward k did not score it).

    sizes: the completions of each group, in order (summing to N). TRL's groups are all `num_generations`
    long; the agents plane trains a group that timed out with the members it has, so sizes may differ.
    sum_then_normalize: r = nansum_k w_k r_k, A = r - group mean, divided by (std + 1e-4) unless `scale` is
    "none"; std is the group's ("group") or the batch's ("batch"), the sample std (n - 1) ignoring NaN.
    normalize_then_sum (GDPO): each reward normalised in its group, weighted and summed, then (r - mean) /
    (std + 1e-4) over the batch. A group of one has std 0, as in TRL.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    bounds = np.cumsum([0, *sizes])
    if values.ndim != 2 or bounds[-1] != len(values) or len(weights) != values.shape[1]:
        raise ValueError(
            f"values {values.shape}, weights {weights.shape} and group sizes {list(sizes)} disagree"
        )
    groups = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    unscorable = np.isnan(values).all(axis=1)
    totals = np.nansum(values * weights[None, :], axis=1)
    totals[unscorable] = np.nan
    if aggregation == "sum_then_normalize":
        mean, std = np.empty(len(totals)), np.empty(len(totals))
        for group in groups:
            mean[group] = _nanmean(totals[group])
            std[group] = _nanstd(totals[group]) if len(totals[group]) > 1 else 0.0
        if scale == "batch":
            std = np.full(len(totals), _nanstd(totals) if totals.size > 1 else 0.0)
        elif scale not in ("group", "none"):  # "none": the group std only says which groups are flat
            raise ValueError(f"scale must be 'group', 'batch' or 'none', not {scale!r}")
        advantages = totals - mean
        if scale != "none":
            advantages = advantages / (std + EPS)
    elif aggregation == "normalize_then_sum":
        normalised = np.empty_like(values)
        for group in groups:
            rows = values[group]
            mean_k = _nanmean(rows, axis=0)
            std_k = _nanstd(rows, axis=0) if len(rows) > 1 else np.zeros_like(mean_k)
            normalised[group] = (rows - mean_k) / (std_k + EPS)
        summed = np.nansum(normalised * weights[None, :], axis=1)
        summed[unscorable] = np.nan
        std = np.full(len(summed), _nanstd(summed) if summed.size > 1 else 0.0)
        advantages = (summed - _nanmean(summed)) / (std + EPS)
    else:
        raise ValueError(
            f"aggregation must be 'sum_then_normalize' or 'normalize_then_sum', not {aggregation!r}"
        )
    zero = np.isclose(std, 0.0)  # torch.isclose's tolerances are numpy's: |std| <= 1e-8
    return Advantages(np.nan_to_num(advantages, nan=0.0), totals, zero)


def _nanmean(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.nansum(x, axis=axis) / np.sum(~np.isnan(x), axis=axis))


def _nanstd(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """TRL's `nanstd`: the sample std (Bessel's n - 1) of the values that are not NaN; NaN for fewer than two
    (an advantage divided by it becomes NaN, then 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        count = np.sum(~np.isnan(x), axis=axis, keepdims=True)
        mean = np.nansum(x, axis=axis, keepdims=True) / count
        variance = np.nansum((x - mean) ** 2, axis=axis, keepdims=True) / (count - 1)
        std = np.where(count > 1, np.sqrt(variance), np.nan)
    return std.squeeze(axis=axis) if axis is not None else std.reshape(())


@dataclass(frozen=True)
class Packed:
    """Prompt + completion rows, right-padded with `pad`: one forward scores every completion token."""

    ids: np.ndarray  # [B, T] int64
    attention: np.ndarray  # [B, T] int64: 1 at a token, 0 at padding
    completion: np.ndarray  # [B, T] bool: True at a completion token
    lengths: list[int]  # completion tokens per row

    @property
    def targets(self) -> np.ndarray:
        """[B, T-1]: True where position t's logits predict a completion token (token t + 1)."""
        return self.completion[:, 1:]


def pack(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad: int) -> Packed:
    """(prompt ids, completion ids) pairs as one right-padded batch."""
    if not pairs:
        raise ValueError("nothing to pack: no (prompt, completion) pairs")
    width = max(len(p) + len(c) for p, c in pairs)
    ids = np.full((len(pairs), width), pad, dtype=np.int64)
    attention = np.zeros((len(pairs), width), dtype=np.int64)
    completion = np.zeros((len(pairs), width), dtype=bool)
    for row, (prompt, response) in enumerate(pairs):
        if not prompt:  # its first token would have no logits to be scored by
            raise ValueError("a completion needs at least one prompt token to be scored by")
        end = len(prompt) + len(response)
        ids[row, :end] = [*prompt, *response]
        attention[row, :end] = 1
        completion[row, len(prompt) : end] = True
    return Packed(ids, attention, completion, [len(c) for _, c in pairs])
