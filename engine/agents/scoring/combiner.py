"""The combiner: a result's PRM and profile scores, and the reward the trainer optimises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..events import ResultEvent, TaskEvent
from .dimensions import (
    COST,
    DEFAULT_STEP_BUDGET,
    DIMENSIONS,
    FALLBACK_PROFILE,
    NEEDS,
    PROFILES,
    Evidence,
    LengthBand,
)
from .prm import PRMScorer
from .replies import split_reply
from .scale import NEUTRAL, clamp01, mean
from .text_reading import shorten


@dataclass(frozen=True)
class ScoredResult:
    """A result's scores. `step_scores` and `prm_score` are the PRM's (clamped; the mean of the steps,
    0.0 without steps); `outcome_score` is the profile's weighted score averaged over the steps;
    `dimensions` holds each dimension that had evidence, averaged over the steps, and `profile` the
    profile that weighed them (the chat profile when the environment's own had no evidence of
    success); `reward` is what the trainer optimises (`reward_of`). `notes` says what was left out,
    and why."""

    step_scores: list[float]
    prm_score: float
    outcome_score: float
    dimensions: dict[str, float]
    profile: str
    verifier_score: float | None
    reward: float
    notes: tuple[str, ...] = field(default=())


def reward_of(outcome_score: float, verifier_score: float | None) -> float:
    """The trainer's reward: the mean of the outcome and the task's verifier when it has one, else the
    outcome. The manager's feedback is never part of it (docs/reference/agents-plane.md §12 rule 4)."""
    if verifier_score is None:
        return clamp01(outcome_score)
    return clamp01((clamp01(outcome_score) + clamp01(verifier_score)) / 2)


def profile_for(environment: str) -> tuple[str, tuple[str, ...]]:
    """The profile that scores an environment, and a note when it is the chat fallback."""
    if environment in PROFILES:
        return environment, ()
    return FALLBACK_PROFILE, (f"environment {environment!r} has no profile: scored with the chat profile",)


class Combined(NamedTuple):
    """A profile's score of a result: per unit, each dimension's mean, the notes, and the profile used."""

    units: list[float]
    dimensions: dict[str, float]
    notes: list[str]
    profile: str


def combine(profile: str, evidence: Evidence) -> Combined:
    """Per unit, sum(w * s) / sum(w) over the profile's dimensions that had evidence and did not fail.

    A profile left with COST dimensions only (terminal without exit codes: efficiency alone would
    decide) scores the result with the chat profile instead, and says so. No dimension left: every
    unit 0.5.
    """
    per_dimension, notes = _scored(profile, evidence)
    if profile != FALLBACK_PROFILE and not set(per_dimension) - COST:
        alone = (
            f"only {', '.join(per_dimension)} had evidence" if per_dimension else "no dimension had evidence"
        )
        notes.append(f"{profile}: {alone}: scored with the {FALLBACK_PROFILE} profile")
        profile = FALLBACK_PROFILE
        per_dimension, more = _scored(profile, evidence)
        notes += more
    weights = PROFILES[profile]
    total = sum(weights[name] for name in per_dimension)
    if total < 1e-12:
        return Combined([NEUTRAL] * len(evidence.units), {}, notes, profile)
    units = [
        clamp01(sum(weights[name] * values[i] for name, values in per_dimension.items()) / total)
        for i in range(len(evidence.units))
    ]
    return Combined(units, {name: mean(values) for name, values in per_dimension.items()}, notes, profile)


def _scored(profile: str, evidence: Evidence) -> tuple[dict[str, list[float]], list[str]]:
    """Each of the profile's dimensions that had evidence, per unit; and notes on those left out."""
    per_dimension: dict[str, list[float]] = {}
    notes: list[str] = []
    for name in PROFILES[profile]:
        try:
            values = DIMENSIONS[name](evidence)
        except Exception as exc:  # a dimension that fails is left out, not the whole result
            notes.append(f"{name} failed: {shorten(str(exc) or type(exc).__name__)}")
            continue
        if values is None:
            notes.append(f"{name}: no data ({NEEDS.get(name, 'nothing to read')})")
            continue
        per_dimension[name] = [clamp01(v) for v in values]
    return per_dimension, notes


class CombinedScorer:
    """Scores a result with the PRM and its environment's profile
    (docs/reference/agents-plane.md §6, §12 rule 3).

    A failed result scores 0 everywhere (no steps, no outcome, no reward): a crash is not a partial
    answer. A result without steps has PRM 0 and its answer stands in for the steps elsewhere; with
    neither steps nor answer, the outcome is 0.
    """

    def __init__(
        self,
        prm: PRMScorer,
        *,
        length_band: LengthBand | None = None,
        step_budget: int = DEFAULT_STEP_BUDGET,
    ) -> None:
        self.prm = prm
        self.length_band = length_band or LengthBand()
        self.step_budget = step_budget

    async def score(self, task: TaskEvent, result: ResultEvent, verifier_score: float | None) -> ScoredResult:
        profile, notes = profile_for(result.environment)
        verifier = None if verifier_score is None else clamp01(verifier_score)
        if result.status == "failed":
            return ScoredResult([], 0.0, 0.0, {}, profile, verifier, 0.0, (*notes, "failed result: scored 0"))
        answer = result.answer or split_reply(result.result)[1]
        prm = await self.prm.score_steps(task.prompt, result.steps)
        if prm.failures:
            notes += (
                f"prm: {len(prm.failures)} of {prm.calls} judge calls failed (last: {prm.failures[-1]})",
            )
        evidence = Evidence(
            prompt=task.prompt,
            reference=task.reference,
            steps=tuple(result.steps),
            answer=answer,
            step_scores=prm.scores,
            metadata={**task.metadata, **result.metadata},
            length_band=self.length_band,
            step_budget=self.step_budget,
        )
        if not evidence.units:
            notes += ("no steps and no answer: outcome 0",)
            return ScoredResult([], 0.0, 0.0, {}, profile, verifier, reward_of(0.0, verifier), notes)
        combined = combine(profile, evidence)
        if not evidence.steps and "prm" in combined.dimensions:
            notes += ("no steps: prm 0, the answer stands in for the steps",)
        outcome = clamp01(mean(combined.units))
        return ScoredResult(
            step_scores=list(prm.scores),
            prm_score=clamp01(mean(prm.scores)),
            outcome_score=outcome,
            dimensions=combined.dimensions,
            profile=combined.profile,
            verifier_score=verifier,
            reward=reward_of(outcome, verifier),
            notes=(*notes, *combined.notes),
        )
