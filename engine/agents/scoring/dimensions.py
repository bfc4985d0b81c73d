"""The dimensions an environment's profile weighs, each scoring a result's steps in [0, 1].

Every dimension of every profile is implemented; one without its evidence returns None and is left
out (a reply's own step count is no evidence of what an environment ran). The COST dimensions say
what a result took, not whether it is right: they never score a result alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .actions import parse_action
from .halugate import halugate_score
from .scale import clamp01, mean
from .text_reading import Source, readability, readable_words

PROFILES: dict[str, dict[str, float]] = {
    "chat": {"prm": 0.6, "halugate": 0.3, "length": 0.1},
    "terminal": {"success": 0.8, "efficiency": 0.2},
    "swe": {"tests": 0.5, "prm": 0.3, "diff_size": 0.2},
    "gui": {"prm": 0.5, "action_validity": 0.3, "efficiency": 0.2},
}
FALLBACK_PROFILE = "chat"  # unknown environments, and results without their profile's evidence
COST = frozenset({"length", "efficiency", "diff_size"})
DEFAULT_STEP_BUDGET = 8  # steps (or commands) a task may take before efficiency starts to fall
DIFF_SCALE = 200  # changed diff lines at which diff_size is 0.5


@dataclass(frozen=True)
class LengthBand:
    """The target length of a step, in whitespace-separated words: 1.0 inside [min, max]; below,
    words/min; above, max/words (twice too long is 0.5); empty is 0. `score` counts every word;
    `readable_score` counts those that read as words, and scales by their share of the text."""

    min_words: int = 2
    max_words: int = 80

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError("LengthBand needs 1 <= min_words <= max_words")

    def score(self, text: str) -> float:
        return self.band(len(text.split()))

    def readable_score(self, text: str) -> float:
        return self.band(readable_words(text)) * readability(text) if text.strip() else 0.0

    def band(self, count: int) -> float:
        if count == 0:
            return 0.0
        if count < self.min_words:
            return count / self.min_words
        if count > self.max_words:
            return self.max_words / count
        return 1.0


@dataclass(frozen=True)
class Evidence:
    """What the dimensions read: the task, the result's steps (or its answer, when it has none), the
    PRM's step scores, and the environment signals (task metadata, overridden by result metadata)."""

    prompt: str
    reference: str | None
    steps: tuple[str, ...]
    answer: str
    step_scores: tuple[float, ...]
    metadata: dict[str, Any]
    length_band: LengthBand = LengthBand()
    step_budget: int = DEFAULT_STEP_BUDGET

    @property
    def units(self) -> tuple[str, ...]:
        """What the per-step dimensions score: the steps, or the answer alone when there are none."""
        return self.steps or ((self.answer,) if self.answer.strip() else ())


Dimension = Callable[[Evidence], list[float] | None]


def prm_dimension(evidence: Evidence) -> list[float]:
    """The PRM step scores; a result without steps has none, and scores 0 (nothing to credit)."""
    if not evidence.step_scores:
        return [0.0] * len(evidence.units)
    return [clamp01(s) for s in evidence.step_scores]


def halugate_dimension(evidence: Evidence) -> list[float]:
    """The hallucination check of the whole reply (steps and answer), given to every step: a step
    without a claim of its own ("Let me think.") is neither credited nor blamed for it."""
    source = Source.of(evidence.prompt, evidence.reference)
    return [halugate_score([*evidence.steps, evidence.answer], source)] * len(evidence.units)


def length_dimension(evidence: Evidence) -> list[float]:
    """Each step's length in words that read as words, scaled by their share (byte soup is short)."""
    return [evidence.length_band.readable_score(unit) for unit in evidence.units]


def success_dimension(evidence: Evidence) -> list[float] | None:
    """From `exit_codes` (one per step; another count gives every step the share that succeeded) or
    one `exit_code`: 1.0 for exit status 0, else 0.0."""
    meta, count = evidence.metadata, len(evidence.units)
    if "exit_codes" in meta:
        codes = _int_list(meta["exit_codes"], "exit_codes")
        if not codes:
            return None
        ok = [1.0 if code == 0 else 0.0 for code in codes]
        return ok if len(ok) == count else [mean(ok)] * count
    if "exit_code" in meta and meta["exit_code"] is not None:
        return [1.0 if _integer(meta["exit_code"], "exit_code") == 0 else 0.0] * count
    return None


def efficiency_dimension(evidence: Evidence) -> list[float] | None:
    """What the environment ran against `metadata["step_budget"]` (default DEFAULT_STEP_BUDGET): 1.0
    within the budget, budget/taken beyond it. Taken: `metadata["commands"]` (a list, or a count; a
    GUI's actions too), else one per `exit_codes`, else, with one `exit_code`, the steps. Without any
    of those, or nothing taken: no data (the reply's step count alone is no evidence of work)."""
    meta = evidence.metadata
    commands = meta.get("commands")
    if isinstance(commands, list):
        taken = len(commands)
    elif commands is not None:
        taken = _integer(commands, "commands")
    elif isinstance(meta.get("exit_codes"), list):
        taken = len(meta["exit_codes"])
    elif meta.get("exit_code") is not None:
        taken = len(evidence.steps)
    else:
        return None
    budget = _integer(meta["step_budget"], "step_budget") if "step_budget" in meta else evidence.step_budget
    if budget < 1:
        raise ValueError("metadata.step_budget: must be at least 1")
    if taken <= 0:
        return None
    return [1.0 if taken <= budget else budget / taken] * len(evidence.units)


def tests_dimension(evidence: Evidence) -> list[float] | None:
    """`tests_passed / tests_total`; no data without both, or when no test ran."""
    meta = evidence.metadata
    if "tests_passed" not in meta or "tests_total" not in meta:
        return None
    passed, total = (
        _integer(meta["tests_passed"], "tests_passed"),
        _integer(meta["tests_total"], "tests_total"),
    )
    if total == 0:
        return None
    if not 0 <= passed <= total:
        raise ValueError(f"metadata.tests_passed: {passed} is not within 0..tests_total ({total})")
    return [passed / total] * len(evidence.units)


def diff_size_dimension(evidence: Evidence) -> list[float] | None:
    """1 / (1 + changed/DIFF_SCALE), changed = `diff_lines`, or the +/- lines of a unified `diff`
    (not its ---/+++ headers): a 200-line change scores 0.5, an empty one 1.0."""
    meta = evidence.metadata
    if "diff_lines" in meta:
        changed = _integer(meta["diff_lines"], "diff_lines")
        if changed < 0:
            raise ValueError("metadata.diff_lines: must not be negative")
    elif isinstance(meta.get("diff"), str):
        changed = changed_lines(meta["diff"])
    else:
        return None
    return [1.0 / (1.0 + changed / DIFF_SCALE)] * len(evidence.units)


def changed_lines(diff: str) -> int:
    return sum(
        1
        for line in diff.splitlines()
        if line[:1] in "+-" and line and not line.startswith(("+++ ", "--- ", "+++\t", "---\t"))
    )


def action_validity_dimension(evidence: Evidence) -> list[float]:
    return [1.0 if parse_action(unit) is not None else 0.0 for unit in evidence.units]


def _integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"metadata.{key}: expected an integer (got {value!r})")
    return value


def _int_list(value: Any, key: str) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"metadata.{key}: expected a list of integers")
    return [_integer(v, key) for v in value]


DIMENSIONS: dict[str, Dimension] = {
    "prm": prm_dimension,
    "halugate": halugate_dimension,
    "length": length_dimension,
    "success": success_dimension,
    "efficiency": efficiency_dimension,
    "tests": tests_dimension,
    "diff_size": diff_size_dimension,
    "action_validity": action_validity_dimension,
}
NEEDS = {
    "success": "metadata exit_code or exit_codes",
    "efficiency": "metadata commands, exit_codes or exit_code",
    "tests": "metadata tests_passed and tests_total (> 0)",
    "diff_size": "metadata diff or diff_lines",
}
