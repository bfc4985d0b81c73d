"""The process reward model: each step's score is the median of its judges' votes."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .judges import JudgeReplyError, StepJudge
from .scale import NEUTRAL, clamp01
from .text_reading import shorten

log = logging.getLogger("carl.agents")


def vote_of(reply: dict[str, Any]) -> float:
    """One judge reply as a vote: (progress + correctness) / 2, each clamped to [0, 1]; a missing,
    non-numeric or NaN value counts 0.5."""
    return (_judged(reply.get("progress")) + _judged(reply.get("correctness"))) / 2


def _judged(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NEUTRAL
    return clamp01(float(value))


@dataclass(frozen=True)
class StepScores:
    """The PRM's scores of a result's steps, and the judge calls that failed and were left out."""

    scores: tuple[float, ...]
    failures: tuple[str, ...] = ()
    calls: int = 0


class PRMScorer:
    """Per-step process reward: `votes` judge calls per step in parallel; the step score is their
    median (even count: the mean of the middle two). A reply that is not JSON votes 0.5; a transport
    error is left out; no vote left gives 0.5. Steps are scored one after another."""

    def __init__(self, judge: StepJudge, votes: int = 1) -> None:
        if votes < 1:
            raise ValueError("votes must be at least 1")
        self.judge = judge
        self.votes = votes

    async def score(self, task: str, steps: Sequence[str]) -> list[float]:
        return list((await self.score_steps(task, steps)).scores)

    async def score_steps(self, task: str, steps: Sequence[str]) -> StepScores:
        scores: list[float] = []
        failures: list[str] = []
        for index in range(len(steps)):
            votes = await asyncio.gather(*(self._vote(task, steps, index) for _ in range(self.votes)))
            valid = [v for v in votes if isinstance(v, float)]
            failures += [v for v in votes if isinstance(v, str)]
            scores.append(clamp01(statistics.median(valid)) if valid else NEUTRAL)
        return StepScores(tuple(scores), tuple(failures), len(steps) * self.votes)

    async def _vote(self, task: str, steps: Sequence[str], index: int) -> float | str:
        """A vote, or the one-line reason the call failed (left out of the median)."""
        try:
            return vote_of(await self.judge.judge(task, steps, index))
        except JudgeReplyError:
            return NEUTRAL
        except Exception as exc:  # transport: the vote is left out, never the whole result
            reason = f"{type(exc).__name__}: {shorten(str(exc))}"
            log.warning("judge %s failed on step %d: %s", self.judge.name, index + 1, reason)
            return reason
