"""The manager's own feedback on a result, kept apart from the PRM and never part of the reward
(docs/reference/agents-plane.md §12 rule 4).

Three dimensions in [0, 1] (correctness, completeness, quality) and their mean as the score, after
the published manager (docs/reference/agents-plane.md §4). `OfflineFeedback` reads the task prompt, the steps
and the answer, and nothing else: not the PRM scores, not the verifier, so it stays a second, independent
opinion (the collusion alarm compares it with them). `ClaudeFeedback` asks Claude for the same
three numbers and a sentence of advice; when the call or its reply fails, it gives the offline
judgement and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine.llm import claude
from engine.redact import redact

from .events import ResultEvent, TaskEvent
from .scoring import (
    CONTRADICTED,
    IRRELEVANT,
    NEUTRAL,
    JudgeReplyError,
    LengthBand,
    Source,
    balanced,
    claim_verdict,
    claims,
    clamp01,
    covers,
    distinct_ratio,
    equations,
    facts,
    first_text,
    json_values,
    mean,
    parse_json_object,
    readability,
    salient_terms,
    split_reply,
)

DIMENSIONS = ("correctness", "completeness", "quality")
ANSWER_BAND = LengthBand(min_words=1, max_words=150)  # an answer longer than this reads as padding


@dataclass(frozen=True)
class Feedback:
    """The manager's judgement of one result: `score` is the mean of the three `dimensions`."""

    score: float
    dimensions: dict[str, float]
    text: str
    source: Literal["offline", "claude"]

    @classmethod
    def of(cls, dimensions: dict[str, float], text: str, source: Literal["offline", "claude"]) -> Feedback:
        clamped = {name: clamp01(dimensions[name]) for name in DIMENSIONS}
        return cls(clamp01(mean(list(clamped.values()))), clamped, text, source)


def reply_parts(result: ResultEvent) -> tuple[list[str], str]:
    """A result's steps and answer (the answer from its text when the worker left the field empty)."""
    return list(result.steps), result.answer or split_reply(result.result)[1]


def failed_feedback(result: ResultEvent) -> Feedback:
    """A failed task: nothing to credit, and the reason it failed."""
    reason = " ".join((result.error or result.result or "no reason given").split())[:200]
    return Feedback.of(dict.fromkeys(DIMENSIONS, 0.0), f"The task failed: {reason}.", "offline")


# ============================================================================================== offline


class OfflineFeedback:
    """A deterministic reviewer of the prompt, the steps and the answer.

    correctness: the answer's claims checked against the prompt (the hallucination check's verdicts:
    supported 1, unsupported 0.5, contradicted 0.25, about something else 0; none: 0.5), averaged
    with the share of its numbers and names that the prompt (or checked arithmetic) grounds.
    completeness: 0.4 for having an answer, plus 0.6 times the
    share of the prompt's salient terms the answer mentions. quality: the mean of concision (the
    answer's length against ANSWER_BAND), variety (distinct-token ratio, full marks from 0.5) and
    form (balanced brackets, JSON that parses when it looks like JSON, no empty steps).
    """

    source: Literal["offline"] = "offline"

    def __init__(self, answer_band: LengthBand = ANSWER_BAND) -> None:
        self.answer_band = answer_band

    async def feedback(self, task: TaskEvent, result: ResultEvent) -> Feedback:
        if result.status == "failed":
            return failed_feedback(result)
        steps, answer = reply_parts(result)
        return self.assess(task.prompt, steps, answer)

    def assess(self, prompt: str, steps: Sequence[str], answer: str) -> Feedback:
        if not answer.strip():
            return Feedback.of(dict.fromkeys(DIMENSIONS, 0.0), "There is no answer to judge.", "offline")
        work = "\n".join([*steps, answer])  # the answer is judged with the steps that lead to it
        correctness, why_correct = self.correctness(prompt, answer, work)
        completeness, why_complete = self.completeness(prompt, work)
        quality, why_quality = self.quality(steps, answer)
        dimensions = {"correctness": correctness, "completeness": completeness, "quality": quality}
        reasons = {"correctness": why_correct, "completeness": why_complete, "quality": why_quality}
        return Feedback.of(dimensions, _advice(dimensions, reasons), "offline")

    @staticmethod
    def correctness(prompt: str, answer: str, work: str | None = None) -> tuple[float, str]:
        """The answer's claims against the prompt; a number the steps worked out (checked
        arithmetic in `work`) counts as grounded."""
        source = Source.of(prompt)
        verdicts = [claim_verdict(claim, source) for claim in claims(answer)]
        answer_numbers, names = facts(answer)
        derived, wrong = equations(work if work is not None else answer)
        checked = answer_numbers | names
        loose = sorted(f for f in checked if f not in derived and not source.grounds(f))
        verdict = mean(verdicts, NEUTRAL)
        grounding = (len(checked) - len(loose)) / len(checked) if checked else verdict
        if wrong:
            why = "its arithmetic is wrong"
        elif CONTRADICTED in verdicts:
            why = "it contradicts the task"
        elif verdicts and all(v == IRRELEVANT for v in verdicts):
            why = "it speaks of something else than the task"
        elif loose:
            why = f"it names {', '.join(loose[:3])}, which the task does not"
        elif not verdicts:
            why = "it makes no claim that can be checked against the task"
        else:
            why = "it is grounded in the task"
        return clamp01((verdict + grounding) / 2), why

    @staticmethod
    def completeness(prompt: str, answer: str) -> tuple[float, str]:
        wanted = salient_terms(prompt)
        if not wanted:
            return NEUTRAL, "the task names nothing to look for"
        terms, lowered = salient_terms(answer), answer.lower()
        missing = sorted(term for term in wanted if not covers(term, terms, lowered))
        share = 1 - len(missing) / len(wanted)
        why = f"it leaves out {', '.join(repr(t) for t in missing[:3])}" if missing else "it covers the task"
        return clamp01(share), why

    def quality(self, steps: Sequence[str], answer: str) -> tuple[float, str]:
        concision = self.answer_band.score(answer)
        ratio = distinct_ratio(answer)
        variety = min(1.0, ratio / 0.5) if len(answer.split()) >= 6 else 1.0
        form, form_why = _form(steps, answer)
        readable = readability(answer)
        if readable < 0.8:
            why = f"it is mostly unreadable ({readable:.0%} of it reads as words)"
        elif concision < 1.0:
            count = len(answer.split())
            why = f"it is {'too long' if count > self.answer_band.max_words else 'too short'} ({count} words)"
        elif variety < 1.0:
            why = f"it repeats itself ({ratio:.0%} distinct words)"
        else:
            why = form_why
        return clamp01(mean([concision, variety, form]) * readable), why


def _form(steps: Sequence[str], answer: str) -> tuple[float, str]:
    form, problems = 1.0, []
    if not balanced(answer):
        form *= 0.5
        problems.append("unbalanced brackets or quotes")
    if answer.lstrip()[:1] in ("{", "[") and not json_values(answer):
        form *= 0.5
        problems.append("JSON that does not parse")
    if any(not step.strip() for step in steps):
        form *= 0.75
        problems.append("empty steps")
    return form, ("it has " + " and ".join(problems)) if problems else "it is well formed"


def _advice(dimensions: dict[str, float], reasons: dict[str, str]) -> str:
    """One or two sentences: the weakest dimension and why, then the three numbers."""
    scores = ", ".join(f"{name} {value:.2f}" for name, value in dimensions.items())
    weakest = min(DIMENSIONS, key=lambda name: dimensions[name])
    if dimensions[weakest] >= 0.95:
        return f"A sound, complete and clean answer ({scores})."
    return f"Weakest is {weakest} ({dimensions[weakest]:.2f}): {reasons[weakest]}. Scores: {scores}."


# =============================================================================================== Claude


def feedback_prompt(prompt: str, steps: Sequence[str], answer: str) -> str:
    """What Claude is asked: the task, the numbered steps and the answer (all through `redact`)."""
    shown = "\n".join(f"{n}. {redact(step)}" for n, step in enumerate(steps, 1)) or "(no steps)"
    return (
        "You are the manager of worker agents. Judge one worker's result.\n\n"
        f"Task:\n{redact(prompt)}\n\n"
        f"Steps:\n{shown}\n\n"
        f"Answer:\n{redact(answer) or '(empty)'}\n\n"
        "Score three dimensions from 0 to 1: correctness (the answer is right and grounded in the task), "
        "completeness (it does all the task asks), quality (clear, concise, well formed). "
        "Reply with one JSON object and nothing else: "
        '{"correctness": <0-1>, "completeness": <0-1>, "quality": <0-1>, '
        '"feedback": "<one or two sentences the worker can act on>"}'
    )


class ClaudeFeedback:
    """Claude as the manager's reviewer (the SDK is imported when this is made); falls back to
    OfflineFeedback, saying why, when the call or its reply fails."""

    source: Literal["claude"] = "claude"

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        *,
        max_retries: int = 2,
        max_tokens: int = 512,
        fallback: OfflineFeedback | None = None,
    ) -> None:
        self.fallback = fallback or OfflineFeedback()
        self._asker = claude.AsyncAsker(
            api_key, model, base_url, timeout=timeout, max_retries=max_retries, max_tokens=max_tokens
        )
        self.model = self._asker.model

    async def feedback(self, task: TaskEvent, result: ResultEvent) -> Feedback:
        if result.status == "failed":
            return failed_feedback(result)  # nothing for Claude to read
        steps, answer = reply_parts(result)
        return await self.assess(task.prompt, steps, answer)

    async def assess(self, prompt: str, steps: Sequence[str], answer: str) -> Feedback:
        try:
            message = await self._asker.ask(feedback_prompt(prompt, steps, answer))
            return parse_feedback(first_text(message))
        except Exception as exc:  # any failure: the offline judgement, labelled
            offline = self.fallback.assess(prompt, steps, answer)
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
            return replace(offline, text=f"offline (Claude failed: {reason}): {offline.text}")

    async def aclose(self) -> None:
        await self._asker.aclose()


def parse_feedback(text: str) -> Feedback:
    """Claude's JSON reply as Feedback; raises JudgeReplyError when a dimension is missing or not a number."""
    reply = parse_json_object(text)
    dimensions = {name: _number(reply, name) for name in DIMENSIONS}
    advice = reply.get("feedback", "")
    return Feedback.of(dimensions, " ".join(str(advice).split()), "claude")


def _number(reply: dict[str, Any], name: str) -> float:
    value = reply.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise JudgeReplyError(f"the reply's {name!r} is not a number (got {value!r})")
    return float(value)
