"""Throughput of a training step: its time split into phases, tokens and samples per second, and MFU.

Both backends time their steps with a `StepClock` and hand a `StepPerf` to the shared `Reporter`, which writes
the same `perf/*` names whichever backend trained (docs/guide/training.md, "Throughput and MFU"):

    perf/step_time_s            the step: from the trainer's step begin to the end of its optimizer step
    perf/time/generation_s      sampling the completions
    perf/time/scoring_s         the reward functions, the coherence rewards' Φ included
    perf/time/update_s          learning from them: reference and old-policy forwards, loss forward, backward,
                                clipping and the optimizer step
    perf/tokens_per_s           prompt + completion tokens of the step, every rank's, per second of the step
    perf/prompt_tokens_per_s, perf/completion_tokens_per_s   the same, split
    perf/samples_per_s          completions (SFT: rows) per second
    perf/tokens_per_s_per_gpu   tokens_per_s / ranks, on GPUs or several ranks
    perf/mfu                    achieved model FLOP/s ÷ (peak FLOP/s x ranks), a fraction, where both known

The rest of the step (batching, padding, advantages) is its time less the three phases. What the step records
after it (Φ statistics, rollouts, the store write) is not in the step's time; it is timed on its own
(`timing/*`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from .flops import ModelFlops

GENERATION, SCORING, UPDATE = "generation", "scoring", "update"
STEP_TIME = "perf/step_time_s"
PHASE_KEYS = {
    GENERATION: "perf/time/generation_s",
    SCORING: "perf/time/scoring_s",
    UPDATE: "perf/time/update_s",
}
TOKENS_PER_S = "perf/tokens_per_s"
PROMPT_TOKENS_PER_S = "perf/prompt_tokens_per_s"
COMPLETION_TOKENS_PER_S = "perf/completion_tokens_per_s"
SAMPLES_PER_S = "perf/samples_per_s"
TOKENS_PER_S_PER_GPU = "perf/tokens_per_s_per_gpu"
MFU = "perf/mfu"
# Only the training process can see MLX's memory (the engine samples the machine, not MLX's allocator).
MLX_ACTIVE_MEMORY = "mlx/active_memory_gb"
MLX_PEAK_MEMORY = "mlx/peak_memory_gb"
GIB = float(1 << 30)  # the _gb keys are GiB, as veRL's perf/max_memory_allocated_gb


class StepClock:
    """Seconds of one step and of its named phases, on `time.perf_counter`.

    A phase may open in one hook and close in another (`begin`/`end`), or wrap a call (`phase`); opened
    again while open (the loss forward inside the update), it is counted once. Outside a step (between
    `stop` and the next `start`: an evaluation's generation, say) nothing is counted.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.started: float | None = None
        self.spent: dict[str, float] = {}
        self._opened: dict[str, float] = {}
        self._depth: dict[str, int] = {}

    def start(self) -> None:
        self.started = self.clock()
        self.spent, self._opened, self._depth = {}, {}, {}

    @property
    def running(self) -> bool:
        return self.started is not None

    def begin(self, phase: str) -> None:
        if self.started is None:
            return
        depth = self._depth.get(phase, 0)
        if depth == 0:
            self._opened[phase] = self.clock()
        self._depth[phase] = depth + 1

    def end(self, phase: str) -> None:
        depth = self._depth.get(phase, 0)
        if depth == 0:
            return
        self._depth[phase] = depth - 1
        if depth == 1:
            self.spent[phase] = self.spent.get(phase, 0.0) + self.clock() - self._opened.pop(phase)

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        self.begin(phase)
        try:
            yield
        finally:
            self.end(phase)

    def stop(self) -> tuple[float, dict[str, float]] | None:
        """The step's seconds and its phases' (a phase still open ends here); None outside a step."""
        if self.started is None:
            return None
        now = self.clock()
        for phase, opened in self._opened.items():
            self.spent[phase] = self.spent.get(phase, 0.0) + now - opened
        seconds, spent = now - self.started, self.spent
        self.started, self.spent, self._opened, self._depth = None, {}, {}, {}
        return seconds, spent


@dataclass
class StepPerf:
    """One step's throughput, every rank's work counted (rank 0 writes it)."""

    seconds: float
    phases: dict[str, float]
    tokens: int  # prompt + completion tokens processed
    samples: int
    prompt_tokens: int | None = None  # None where the step has no prompt/completion split (SFT)
    completion_tokens: int | None = None
    ranks: int = 1
    per_gpu: bool = False  # write perf/tokens_per_s_per_gpu (on GPUs, or several ranks)
    flops: float | None = None  # the step's model FLOPs (engine/training/flops.py)
    peak_flops: float | None = None  # one device's peak FLOP/s

    @classmethod
    def of(
        cls,
        times: tuple[float, dict[str, float]] | None,
        prompt_lengths: Sequence[int],
        completion_lengths: Sequence[int] | None = None,
        *,
        ranks: int = 1,
        per_gpu: bool = False,
        flops: ModelFlops | None = None,
        forwards: int = 0,
        peak_flops: float | None = None,
    ) -> StepPerf | None:
        """A step's perf from its clock (`StepClock.stop`) and every rank's sequences: their prompt and
        completion lengths, or for SFT rows their whole lengths alone. With a model's FLOPs and a peak, MFU
        over `forwards` passes without gradients over each sequence and one trained pass."""
        if times is None:
            return None
        seconds, phases = times
        lengths = list(prompt_lengths)
        if completion_lengths is not None:
            lengths = [p + c for p, c in zip(lengths, completion_lengths, strict=True)]
        split = completion_lengths is not None
        return cls(
            seconds,
            phases,
            tokens=sum(lengths),
            samples=len(lengths),
            prompt_tokens=sum(prompt_lengths) if split else None,
            completion_tokens=sum(completion_lengths) if completion_lengths is not None else None,
            ranks=ranks,
            per_gpu=per_gpu,
            flops=None
            if flops is None or peak_flops is None
            else flops.step(lengths, forwards=forwards, trained=True),
            peak_flops=peak_flops,
        )

    def metrics(self) -> dict[str, float]:
        seconds = self.seconds
        if not seconds > 0:
            return {}
        out = {STEP_TIME: seconds, TOKENS_PER_S: self.tokens / seconds, SAMPLES_PER_S: self.samples / seconds}
        if self.prompt_tokens is not None and self.completion_tokens is not None:
            out[PROMPT_TOKENS_PER_S] = self.prompt_tokens / seconds
            out[COMPLETION_TOKENS_PER_S] = self.completion_tokens / seconds
        for phase, key in PHASE_KEYS.items():
            if phase in self.phases:
                out[key] = self.phases[phase]
        if self.per_gpu:
            out[TOKENS_PER_S_PER_GPU] = self.tokens / seconds / self.ranks
        if self.flops is not None and self.peak_flops:
            out[MFU] = self.flops / seconds / (self.peak_flops * self.ranks)
        return out


__all__ = ["GENERATION", "MFU", "PHASE_KEYS", "SCORING", "UPDATE", "StepClock", "StepPerf"]
