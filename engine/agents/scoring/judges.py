"""The judges of one step: `{progress, correctness, reasoning}` for step i, seeing steps 1..i only.

The offline heuristic (`OfflineJudge`), an OpenAI-compatible server (`OpenAIJudge`: vLLM, llama.cpp,
Ollama) or Claude (`ClaudeJudge`). Text sent to a remote judge goes through `redact` (secrets out) first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from engine.llm import claude
from engine.redact import redact

from .scale import clamp01
from .text_reading import (
    Source,
    balanced,
    coverage,
    distinct_ratio,
    equations,
    facts,
    json_values,
    salient_terms,
    shorten,
    word_share,
)


class JudgeReplyError(ValueError):
    """A judge answered, but not with a JSON object: the vote counts 0.5 (not left out)."""


class StepJudge(Protocol):
    """Judges step `index` (0-based) of `steps` for `task`, seeing steps 0..index only.

    Returns the reply's JSON object (`progress`, `correctness`, `reasoning`), whatever its values;
    raises JudgeReplyError when the reply is not a JSON object, anything else on transport errors.
    """

    name: str

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]: ...


def judge_prompt(task: str, steps: Sequence[str], index: int) -> str:
    """The one user message of a judge call (docs/reference/agents-plane.md §5): the task, steps 1..i
    numbered, and the step under judgement; later steps are never shown. Every text goes through `redact`."""
    shown = "\n".join(f"{n}. {redact(step)}" for n, step in enumerate(steps[: index + 1], 1))
    return (
        "You judge one step of a worker's solution to a task.\n\n"
        f"Task:\n{redact(task)}\n\n"
        f"Steps so far:\n{shown}\n\n"
        f"Step under judgement (step {index + 1}):\n{redact(steps[index])}\n\n"
        "Reply with one JSON object and nothing else: "
        '{"progress": <0 to 1: 0 = no progress on the task, 1 = solves it>, '
        '"correctness": <0 to 1: 0 = wrong, 1 = fully sound>, '
        '"reasoning": "<one short sentence>"}'
    )


_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a judge's reply (fenced in ``` or after a short preamble)."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    try:
        value = json.loads(stripped)
    except ValueError:
        objects = [v for v in json_values(stripped) if isinstance(v, dict)]
        if not objects:
            raise JudgeReplyError(f"the judge's reply is not JSON: {shorten(text)}") from None
        value = objects[0]
    if not isinstance(value, dict):
        raise JudgeReplyError(f"the judge replied {type(value).__name__}, not a JSON object")
    return value


class OfflineJudge:
    """A deterministic judge that reads the text; no network.

    progress = 0.75 x coverage + 0.25 x structure. Coverage: the share of the task's salient terms
    (content words, numbers, names, quoted strings, JSON keys and values) that steps 1..i mention.
    Structure: 1.0 when step i holds a JSON object or array, 0.5 when it states a result (`= 42`,
    `answer: ...`), else 0.

    correctness = the product of factors for step i: 0 when it has no letters or digits; word share
    (alphanumerics over visible characters) below 0.5 scales it down; a distinct-token ratio below
    0.5 (six tokens or more) scales it down; ungrounded facts (numbers and names that neither the
    task nor checked arithmetic gives) take up to 0.6 off by their share; unbalanced brackets or
    quotes x0.7; each wrong equation (`2 + 2 = 5`) halves it.
    """

    name = "offline"

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        progress, why_progress = self.progress(task, steps, index)
        correctness, why_correct = self.correctness(task, steps, index)
        return {
            "progress": progress,
            "correctness": correctness,
            "reasoning": f"{why_progress}; {why_correct}",
        }

    def progress(self, task: str, steps: Sequence[str], index: int) -> tuple[float, str]:
        wanted = salient_terms(task)
        covered = coverage(wanted, "\n".join(steps[: index + 1]))
        structure = self.structure(steps[index])
        score = clamp01(0.75 * covered + 0.25 * structure)
        return score, f"covers {covered:.0%} of the task's terms, structure {structure:.1f}"

    @staticmethod
    def structure(step: str) -> float:
        if any(isinstance(v, dict | list) and v for v in json_values(step)):
            return 1.0
        if re.search(r"(?i)(=\s*-?\d|\b(answer|result)\s*(is|:))", step):
            return 0.5
        return 0.0

    def correctness(self, task: str, steps: Sequence[str], index: int) -> tuple[float, str]:
        step = steps[index]
        if not any(c.isalnum() for c in step):
            return 0.0, "the step has no words"
        score, reasons = 1.0, []
        share = word_share(step)
        if share < 0.5 and not json_values(step):
            score *= share / 0.5
            reasons.append(f"mostly symbols ({share:.0%} alphanumeric)")
        ratio = distinct_ratio(step)
        if len(step.split()) >= 6 and ratio < 0.5:
            score *= ratio / 0.5
            reasons.append(f"repetitive ({ratio:.0%} distinct tokens)")
        ungrounded, checked, wrong = self.grounding(task, steps, index)
        if checked:
            score *= 1 - 0.6 * len(ungrounded) / checked
            if ungrounded:
                reasons.append(f"ungrounded: {', '.join(sorted(ungrounded)[:3])}")
        if not balanced(step):
            score *= 0.7
            reasons.append("unbalanced brackets or quotes")
        if wrong:
            score *= 0.5**wrong
            reasons.append(f"{wrong} wrong equation{'s' if wrong > 1 else ''}")
        return clamp01(score), ", ".join(reasons) or "sound"

    @staticmethod
    def grounding(task: str, steps: Sequence[str], index: int) -> tuple[set[str], int, int]:
        """(ungrounded facts of step i, facts checked, wrong equations in step i)."""
        source = Source.of(task)
        derived: set[str] = set()
        for earlier in steps[:index]:
            derived |= equations(earlier)[0]
        right, wrong = equations(steps[index])
        step_numbers, names = facts(steps[index])
        checked = step_numbers | names
        ungrounded = {f for f in checked if f not in derived | right and not source.grounds(f)}
        return ungrounded, len(checked), wrong


class OpenAIJudge:
    """A judge behind an OpenAI-compatible `/chat/completions` (vLLM, llama.cpp server, Ollama serve).

    `base_url` ends in `/v1`. JSON output is requested with `response_format={"type": "json_object"}`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        temperature: float | None = None,
        max_tokens: int = 256,
    ) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.temperature = temperature  # None: the server's default (votes need some randomness)
        self.max_tokens = max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout)

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": judge_prompt(task, steps, index)}],
            "response_format": {"type": "json_object"},
            "max_tokens": self.max_tokens,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        response = await self._client.post(self.url, json=body, headers=self._headers)
        response.raise_for_status()
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeReplyError("the reply has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise JudgeReplyError("choices[0].message.content is not text")
        return parse_json_object(content)

    async def aclose(self) -> None:
        await self._client.aclose()


def first_text(message: Any) -> str:
    """The first text block of a Messages API reply."""
    for block in message.content:
        if getattr(block, "type", None) == "text":
            return str(block.text)
    raise JudgeReplyError("the reply has no text block")


class ClaudeJudge:
    """A judge on the Anthropic Messages API (the SDK is imported when the judge is made; without it,
    `claude.ClaudeUnavailable` says how to install it)."""

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 256,
    ) -> None:
        self._asker = claude.AsyncAsker(
            api_key, model, base_url, timeout=timeout, max_retries=max_retries, max_tokens=max_tokens
        )
        self.model = self._asker.model
        self.name = f"claude:{self.model}"

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        message = await self._asker.ask(judge_prompt(task, steps, index))
        return parse_json_object(first_text(message))

    async def aclose(self) -> None:
        await self._asker.aclose()
