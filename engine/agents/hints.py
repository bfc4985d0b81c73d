"""Hints: a short corrective instruction made from a result's directive signal, for on-policy distillation.

OpenClaw-RL (docs/reference/agents-plane.md §14) splits what follows an answer into an evaluative signal (a
score) and a directive one (what should have been done). Here the directive signal of a result is, first
found first taken:
- the tool's or worker's error, for a failed result;
- the task's verifier, for an answer it scores below 1: what it expected and what it got (`verifier_message`);
- the manager's advice, for a task with no verifier whose feedback scores below FEEDBACK_BELOW.
A result with none of these (a verified right answer, good feedback) gets no hint: OPD needs an explicit
corrective signal, and a sample without one trains by its reward alone.

The hint is written from that signal by Claude when the manager's feedback is Claude's (`ClaudeHints`: one
call, the signal and the answer through `redact`), by the manager's own local model when one is configured
(engine/agents/manager_model.py), else offline (`offline_hint`). Every way falls back to the offline hint.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from engine.llm import claude
from engine.redact import redact
from engine.tasks.checks import CHECKS, normalise
from engine.text import storable

from .events import HINT_CHARS, HintSource, ResultEvent, TaskEvent
from .feedback import Feedback
from .scoring import first_text
from .tasks import DEMO_TASK, verify

log = logging.getLogger("carl.agents")
FEEDBACK_BELOW = 0.7  # a task without a verifier gets a hint from feedback scoring below this
HINT_TOKENS = 200  # what Claude may write for a hint (one or two sentences, and the markers)
HINT_WORDS = 40  # a hint longer than this is cut (a hint is an instruction, not an essay)
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)


@dataclass(frozen=True)
class Signal:
    """A result's directive signal: where it comes from and what it says."""

    source: HintSource
    text: str


@dataclass(frozen=True)
class Hint:
    text: str
    source: HintSource
    signal: str
    manager_version: str | None = None


class HintWriter(Protocol):
    """What writes the hint for a signal (offline, Claude or the manager's model)."""

    async def hint(self, task: TaskEvent, result: ResultEvent, signal: Signal) -> Hint: ...


def directive_signal(
    task: TaskEvent, result: ResultEvent, verifier_score: float | None, feedback: Feedback
) -> Signal | None:
    """The result's directive signal, or None when nothing says what to do better."""
    if result.status == "failed":
        reason = " ".join((result.error or result.result or "").split())
        return Signal("error", reason[:HINT_CHARS]) if reason else None
    answer = result.answer or result.result
    if verifier_score is not None:
        if verifier_score >= 1.0:
            return None
        return Signal("verifier", verifier_message(task, answer)[:HINT_CHARS])
    if feedback.score < FEEDBACK_BELOW and feedback.text.strip():
        return Signal("feedback", " ".join(feedback.text.split())[:HINT_CHARS])
    return None


def verifier_message(task: TaskEvent, answer: str) -> str:
    """What the task's verifier found wrong, as a test runner would say it: expected, then got."""
    if task.verifier == "demo":
        want_tool, want_city = _demo_expected(task)
        call = DEMO_TASK.parse(answer)
        if call is None:
            return f"expected one JSON tool call to {want_tool} for {want_city}; got no parsable call"
        tool, city = call.get("tool"), (call.get("args") or {}).get("city")
        wrong = []
        if tool != want_tool:
            wrong.append(f"tool {tool!r} (expected {want_tool!r})")
        if city != want_city:
            wrong.append(f"city {city!r} (expected {want_city!r})")
        what = " and ".join(wrong) if wrong else "a call that does not score full marks"
        return f"expected a call to {want_tool} for {want_city}; got {what}"
    if task.verifier in CHECKS and task.reference is not None:
        got = normalise(answer)[:80] or "an empty answer"
        return f"{task.verifier} check failed: expected {task.reference!r}; got {got!r}"
    score = verify(task, answer)
    return f"the verifier scored the answer {score:.2f} of 1"


def _demo_expected(task: TaskEvent) -> tuple[str, str]:
    tool, city = task.metadata.get("answer_tool"), task.metadata.get("answer_city")
    if isinstance(tool, str) and isinstance(city, str):
        return tool, city
    call = DEMO_TASK.parse(task.reference or "") or {}
    return str(call.get("tool", "?")), str((call.get("args") or {}).get("city", "?"))


def offline_hint(task: TaskEvent, signal: Signal) -> str:
    """A corrective instruction from the signal alone, deterministic."""
    if signal.source == "verifier" and task.verifier == "demo":
        tool, city = _demo_expected(task)
        return f"Answer with one JSON tool call to {tool} with the city {city}."
    if signal.source == "verifier" and task.verifier in CHECKS and task.reference is not None:
        return f"The expected answer is {task.reference.strip()}."
    if signal.source == "error":
        return f"The last attempt failed ({signal.text}); avoid that."
    advice = signal.text.split(" Scores:", 1)[0].strip()  # the offline manager's advice, without its numbers
    return advice if advice.endswith(".") else f"{advice}."


def trimmed(text: str) -> str:
    """A hint as sent: one line, at most HINT_WORDS words and HINT_CHARS characters, every character one
    UTF-8 can carry (whoever wrote it)."""
    words = storable(text).split()
    cut = " ".join(words[:HINT_WORDS]) + (" ..." if len(words) > HINT_WORDS else "")
    return cut[:HINT_CHARS]


class OfflineHints:
    """The hint from the signal alone (`offline_hint`)."""

    async def hint(self, task: TaskEvent, result: ResultEvent, signal: Signal) -> Hint:
        return Hint(trimmed(offline_hint(task, signal)), signal.source, signal.text)


def hint_prompt(task: TaskEvent, answer: str, signal: Signal) -> str:
    """What Claude is asked: the task, the answer and the signal (all through `redact`)."""
    return (
        "A worker agent answered a task, and something told it what was wrong. Turn that into one short "
        "corrective instruction the worker could follow next time on the same task.\n\n"
        f"Task:\n{redact(task.prompt)}\n\n"
        f"Answer:\n{redact(answer) or '(empty)'}\n\n"
        f"What was wrong ({signal.source}):\n{redact(signal.text)}\n\n"
        "Reply with the instruction between [HINT_START] and [HINT_END], at most two sentences, and nothing "
        "else; reply NONE if it says nothing the worker can act on."
    )


def parse_hint(text: str) -> str | None:
    """The instruction in Claude's reply, or None (NONE, or no marked hint)."""
    found = _HINT.search(text)
    if found is None:
        return None
    hint = " ".join(found.group(1).split())
    return hint or None


class ClaudeHints:
    """Claude writes the hint from the signal; the offline hint when the call fails or says NONE."""

    def __init__(self, asker: claude.AsyncAsker) -> None:
        self._asker = asker  # a hint is a sentence or two: an asker with a small max_tokens (HINT_TOKENS)
        self.model = asker.model

    async def hint(self, task: TaskEvent, result: ResultEvent, signal: Signal) -> Hint:
        answer = result.answer or result.result
        try:
            written = parse_hint(first_text(await self._asker.ask(hint_prompt(task, answer, signal))))
        except Exception as exc:  # any failure: the offline hint
            why = " ".join(str(exc).split())[:160]
            log.warning("hints: Claude failed (%s); the offline hint is used", why)
            written = None
        if written is None:
            return Hint(trimmed(offline_hint(task, signal)), signal.source, signal.text)
        return Hint(trimmed(written), "claude", signal.text)

    async def aclose(self) -> None:
        await self._asker.aclose()


async def make_hint(
    writer: Any,
    task: TaskEvent,
    result: ResultEvent,
    verifier_score: float | None,
    feedback: Feedback,
) -> Hint | None:
    """The result's hint, or None when it has no directive signal."""
    signal = directive_signal(task, result, verifier_score, feedback)
    if signal is None:
        return None
    hint: Hint = await writer.hint(task, result, signal)
    return hint if hint.text.strip() else None
