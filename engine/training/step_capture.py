"""What one GRPO step of the torch backend produced: its generations, rewards and per-token values.

`CarlGRPOTrainer` (engine/training/torch_backend.py) fills a `StepCapture` as TRL goes through the step:
the sampled ids, the rewards TRL computed, the loss forward's entropies and log-probabilities, the
advantages, and the entropies measured while sampling (engine/training/phi_sampling.py). The reporter
reads it at the step's end; with several ranks, `pooled` gathers every rank's part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .ranks import Ranks


@dataclass
class StepCapture:
    """The current optimizer step's generations, rewards and loss-forward entropies."""

    prompts: list[Any] = field(default_factory=list)
    completions: list[Any] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    rewards: np.ndarray | None = None  # (completions, functions), NaN where a function gave None
    weights: list[float] = field(default_factory=list)  # the reward weights this step used
    entropy: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict)  # sequence -> per-token nats
    logprob: dict[tuple[int, ...], np.ndarray] = field(
        default_factory=dict
    )  # sequence -> chosen tokens' log p
    advantages: np.ndarray | None = None  # per completion, as TRL computed them
    phi_seconds: float = 0.0  # spent on reward-time Phi (a forward, or the sampling kernel), for its cost
    sampled: list[np.ndarray] | None = None  # per completion: entropies measured while it was sampled
    sampled_width: int = 0  # their logits width: the |V| of Phi
    phi_source: str | None = None  # where the coherence rewards got Phi this step: generate | forward
    forward_passes: int = 0  # forwards without gradients over the step's sequences, besides generating them

    def add_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        keep: int,
        entropies: torch.Tensor,
        logps: torch.Tensor,
    ) -> None:
        ids, mask = input_ids.detach().cpu(), attention_mask.detach().cpu().bool()
        ent, logp = entropies.detach().float().cpu(), logps.detach().float().cpu()
        for row in range(ids.shape[0]):
            sequence = tuple(ids[row][mask[row]].tolist())
            completion = mask[row, -keep:]
            self.entropy[sequence] = ent[row][completion].numpy().astype(np.float64)
            self.logprob[sequence] = logp[row][completion].numpy().astype(np.float64)

    def entropies(self) -> list[np.ndarray | None]:
        """Per completion, in generation order: its tokens' entropies from the loss forward."""
        return self._per_completion(self.entropy)

    def logprobs(self) -> list[np.ndarray | None]:
        """Per completion, in generation order: its tokens' log-probabilities from the loss forward."""
        return self._per_completion(self.logprob)

    def _per_completion(self, values: dict[tuple[int, ...], np.ndarray]) -> list[np.ndarray | None]:
        return [values.get(tuple(p + c)) for p, c in zip(self.prompt_ids, self.completion_ids, strict=True)]

    def pooled(self, ranks: Ranks) -> StepCapture:
        """Every rank's completions, in rank order: the order of `rewards`, which TRL gathered so."""
        if ranks.world == 1:
            return self
        parts = ranks.all_gather(
            (
                self.prompts,
                self.completions,
                self.prompt_ids,
                self.completion_ids,
                self.entropies(),
                self.logprobs(),
                self.advantages,
                self.phi_seconds,
            )
        )
        out = StepCapture(
            rewards=self.rewards,
            weights=self.weights,
            phi_seconds=max(p[-1] for p in parts),
            phi_source=self.phi_source,
            forward_passes=self.forward_passes,  # every rank runs the same ones
        )
        advantages = []
        for prompts, completions, prompt_ids, completion_ids, entropies, logprobs, local, _ in parts:
            out.prompts += prompts
            out.completions += completions
            out.prompt_ids += prompt_ids
            out.completion_ids += completion_ids
            advantages.append(local)
            for prompt, completion, entropy, logprob in zip(
                prompt_ids, completion_ids, entropies, logprobs, strict=True
            ):
                if entropy is not None:
                    out.entropy[tuple(prompt + completion)] = entropy
                if logprob is not None:
                    out.logprob[tuple(prompt + completion)] = logprob
        present = [a for a in advantages if a is not None]
        if len(present) == len(advantages):
            out.advantages = np.concatenate(present)
        return out

    def task_mean(self, names: list[str], task_names: list[str]) -> float:
        if self.rewards is None or not task_names:
            return math.nan
        columns = [names.index(n) for n in task_names]
        values = self.rewards[:, columns]
        return round(float(np.nanmean(values)), 6) if np.isfinite(values).any() else math.nan

    def totals(self) -> np.ndarray:
        """Each completion's weighted reward, as TRL sums it."""
        assert self.rewards is not None
        return np.nansum(self.rewards * np.asarray(self.weights)[None, :], axis=1)


__all__ = ["StepCapture"]
