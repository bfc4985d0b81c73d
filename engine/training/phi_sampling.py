"""Φ from the generating pass: each decoding step's entropy, measured while transformers samples.

Token t of a completion is drawn from the distribution of decoding step t, which `generate` holds
as one [batch × |V|] slice of scores. `SamplingEntropy` is a logits processor that reduces that
slice with the fused kernel (`engine.coherence.phi.token_entropy`) and keeps only [batch] floats a
step, so the coherence rewards get every token's entropy with no extra forward, and the
[T × |V|] logits are never held (docs/reference/carl.md §1-2 for the definition).

Where it sits. transformers 5 builds its processor list in `GenerationMixin._get_logits_processor`:
its own processors (repetition penalty, suppressed tokens, ...), then the caller's (merged in by
`_merge_criteria_processor_list`), then, when sampling, the warpers: temperature, top-k, top-p,
min-p. So a processor passed to `generate` sees the scores *before* the temperature. `placement`
asks transformers where it would put ours, and the kernel applies the sampling temperature itself
when no temperature warper runs first. Φ is then the entropy of softmax(scores / T), the same
distribution the forward path, and TRL's own loss-forward entropy, measure. When top-k, top-p or
min-p also run, sampling draws from the truncated distribution; Φ stays on the full one, as on
every other path.

Rows of sequences that have finished (their last token an EOS; transformers pads them after it)
are measured and then masked to NaN, with no wait for the device: a GPU step is never synced.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper

from engine.coherence.phi import token_entropy


class HookUnavailable(Exception):
    """The processor cannot be put into this model's `generate`; the caller falls back to a forward."""


class SamplingEntropy(LogitsProcessor):
    """Per-row entropy (nats) of each decoding step's distribution at `temperature`; scores pass unchanged."""

    def __init__(self, temperature: float, eos_ids: Sequence[int]) -> None:
        self.temperature = temperature
        self.applied_temperature = temperature  # 1.0 where a temperature warper runs before this
        self.eos_ids = list(eos_ids)
        self.seconds = 0.0  # host time spent here (on a GPU: launching the kernels, not running them)
        self.reset()

    def reset(self) -> None:
        self.steps: list[torch.Tensor] = []  # one [batch] float32 tensor per decoding step
        self.done: torch.Tensor | None = None
        self.calls = 0
        self.width = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        started = time.perf_counter()
        if self.done is None:  # the first step: the last column is the prompt's, not a sampled token
            self.done = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
            self.eos = torch.tensor(self.eos_ids, dtype=input_ids.dtype, device=input_ids.device)
        else:
            self.done |= torch.isin(input_ids[:, -1], self.eos).to(self.done.device)
        self.width = scores.shape[-1]  # the logits width: the |V| of Phi
        entropy, _ = token_entropy(scores, temperature=self.applied_temperature)
        self.steps.append(torch.where(self.done, torch.nan, entropy))
        self.calls += 1
        self.seconds += time.perf_counter() - started
        return scores

    def per_sequence(self, lengths: Sequence[int]) -> list[np.ndarray] | None:
        """Each row's first lengths[row] entropies (float64), or None when they do not line up with the
        completions (fewer steps than tokens, or a masked step inside a completion)."""
        if not self.steps:
            return None
        values = torch.stack(self.steps).float().cpu().numpy()  # [steps, batch]: one copy, at the end
        if values.shape[1] != len(lengths) or max(lengths, default=0) > values.shape[0]:
            return None
        rows = [values[:length, row].astype(np.float64) for row, length in enumerate(lengths)]
        return None if any(np.isnan(r).any() for r in rows) else rows

    def place(self, model: Any, generation_config: GenerationConfig) -> str:
        """Ask transformers where this processor would run, and apply the temperature only where its
        warper does not run first. Returns the warpers that run after it (for the log line)."""
        if "generate" in vars(model):
            raise HookUnavailable("the model's generate is already wrapped")
        probe = model._get_logits_processor(
            generation_config=generation_config,
            input_ids_seq_length=1,
            encoder_input_ids=None,
            prefix_allowed_tokens_fn=None,
            logits_processor=LogitsProcessorList([self]),
            device="cpu",
            model_kwargs={},
        )
        if self not in probe:
            raise HookUnavailable("transformers dropped the processor from its list")
        ours = probe.index(self)
        before = probe[:ours]
        self.applied_temperature = (
            1.0 if any(isinstance(p, TemperatureLogitsWarper) for p in before) else self.temperature
        )
        return ", ".join(type(p).__name__ for p in probe[ours + 1 :])


@contextmanager
def recording(model: Any, processor: SamplingEntropy) -> Iterator[None]:
    """`model.generate`, while inside, with `processor` added after any logits_processor it is given."""
    original = model.generate

    @functools.wraps(original)
    def generate(*args: Any, logits_processor: Any = None, **kwargs: Any) -> Any:
        processors = LogitsProcessorList(list(logits_processor or []))
        processors.append(processor)
        return original(*args, logits_processor=processors, **kwargs)

    processor.reset()
    model.generate = generate  # an instance attribute: shadows the method, removed on the way out
    try:
        yield
    finally:
        del model.generate


# -- in TRL's GRPOTrainer ---------------------------------------------------------------------------

# TRL paths that do not call transformers' `generate` on the whole completion: vLLM returns top-k
# log-probs, not the distribution (docs/guide/training.md); continuous batching takes no logits
# processor; tool calls and custom rollouts splice tokens the model did not sample into a completion.
UNHOOKABLE = {
    "use_vllm": "TRL generates through vLLM",
    "use_transformers_continuous_batching": "TRL generates with continuous batching",
    "tools": "completions carry tool results",
    "rollout_func": "a custom rollout function generates",
}


class GenerationPhi:
    """The trainer's generating pass, measured when the coherence rewards will need Phi this step.

    `wrap` runs TRL's `_generate_single_turn` with the processor in place and keeps each completion's
    entropies; `take` hands them to the step's capture. When the hook cannot be installed, it says so
    in one line and measures no more: the coherence rewards then take the forward path.
    """

    def __init__(self, temperature: float, wanted: Any, say: Any) -> None:
        self.temperature = temperature
        self.wanted = wanted  # () -> bool: will a coherence reward be called this step?
        self.say = say
        self.sampler: SamplingEntropy | None = None
        self.broken: str | None = None  # why the generating pass cannot be measured
        self.values: list[np.ndarray] | None = None

    def wrap(self, trainer: Any, call: Any) -> Any:
        self.values = None
        if self.broken is not None or not trainer.model.training or not self.wanted():
            return call()
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        try:
            self._place(trainer, model)
        except (HookUnavailable, AttributeError, TypeError, ValueError) as exc:
            self.give_up(" ".join(str(exc).split())[:160] or type(exc).__name__)
            return call()
        assert self.sampler is not None
        with recording(model, self.sampler):
            out = call()
        if self.sampler.calls == 0:
            self.give_up("transformers never called the logits processor")
        else:
            self.values = self.sampler.per_sequence([len(ids) for ids in out[0]])
            if self.values is None:
                self.say(
                    "phi: this step's sampling entropies do not line up with its completions: one forward"
                )
        return out

    def _place(self, trainer: Any, model: Any) -> None:
        reasons = [why for name, why in UNHOOKABLE.items() if getattr(trainer, name, None)]
        if reasons:
            raise HookUnavailable(reasons[0])
        if self.sampler is None:
            sampler = SamplingEntropy(self.temperature, list(trainer.eos_token_ids))
            after = sampler.place(model, trainer.generation_config)
            self.sampler = sampler
            self.say(
                "phi: the coherence rewards measure each token while it is sampled (no extra forward)"
                + (f"; {after} run after it, and Phi stays on the full distribution" if after else "")
            )
        elif "generate" in vars(model):
            raise HookUnavailable("the model's generate is already wrapped")

    def give_up(self, reason: str) -> None:
        self.broken = reason
        self.say(
            f"phi: cannot measure while sampling ({reason}): the coherence rewards take one forward a step"
        )

    def take(self) -> tuple[list[np.ndarray] | None, int, float]:
        """This step's per-completion entropies (None: none), the logits width and the seconds spent."""
        values, self.values = self.values, None
        sampler = self.sampler
        if sampler is None:
            return None, 0, 0.0
        seconds, sampler.seconds = sampler.seconds, 0.0
        return values, sampler.width, seconds


__all__ = ["UNHOOKABLE", "GenerationPhi", "HookUnavailable", "SamplingEntropy", "recording"]
