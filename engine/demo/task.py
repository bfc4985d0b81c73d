"""The demo task: answer a request with one JSON tool call, checked by three reward functions.

Rewards follow TRL's contract: `f(prompts, completions, **kwargs) -> list[float]`, where the
dataset columns (`answer_tool`, `answer_city`) arrive as keyword lists, one entry per completion.
Each reward gives partial credit, so even a barely trained tiny model earns small, varying
rewards and GRPO has a gradient from the first step.
"""

from __future__ import annotations

import json
import random
from typing import Any

from engine.models.corpus import CITIES, CITY_REQUESTS, CITY_TOOLS, tool_call

CONCISE_CHARS = 60  # a bare call to a city tool is 45-55 characters


def task_rows(seed: int = 0) -> list[dict[str, Any]]:
    """Every (tool, city, phrasing) combination, shuffled: 4 x 16 x 6 = 384 conversational rows."""
    rows = [
        {
            "prompt": [{"role": "user", "content": request.format(phrase=phrase, city=city)}],
            "completion": [{"role": "assistant", "content": tool_call(tool, city=city)}],
            "answer_tool": tool,
            "answer_city": city,
        }
        for tool, phrase in sorted(CITY_TOOLS.items())
        for city in CITIES
        for request in CITY_REQUESTS
    ]
    random.Random(seed).shuffle(rows)
    return rows


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings for text prompts and message lists for chat."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


def parse_call(text: str) -> dict[str, Any] | None:
    """The first `{"tool": str, "args": dict}` object in the text, or None."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if (
            isinstance(value, dict)
            and isinstance(value.get("tool"), str)
            and isinstance(value.get("args"), dict)
        ):
            return value
        start = text.find("{", start + 1)
    return None


def _format_score(text: str) -> float:
    if parse_call(text) is not None:
        return 1.0
    # Partial credit for each piece of the shape, so near-misses rank above noise.
    pieces = ("{", '"tool"', '"args"', "}")
    score = sum(0.15 for piece in pieces if piece in text)
    if text.count("{") == text.count("}") > 0:
        score += 0.1
    return round(score, 4)


def _task_score(text: str, tool: str, city: str) -> float:
    call = parse_call(text)
    if call is not None:
        right_tool = 0.5 if call["tool"] == tool else 0.0
        right_city = 0.5 if call["args"].get("city") == city else 0.0
        return right_tool + right_city
    # Unparsed text still earns a little for naming the right tool or city.
    return (0.2 if tool in text else 0.0) + (0.2 if city in text else 0.0)


def _concise_score(text: str) -> float:
    length = len(text.strip())
    if length == 0:
        return 0.0  # silence is not concision
    if length <= CONCISE_CHARS:
        return 1.0
    return max(0.0, 1.0 - (length - CONCISE_CHARS) / (2 * CONCISE_CHARS))


def format_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 for a well-formed JSON tool call anywhere in the completion, partial credit for its pieces."""
    return [_format_score(completion_text(c)) for c in completions]


def task_reward(
    prompts: list, completions: list, answer_tool: list[str], answer_city: list[str], **kwargs: Any
) -> list[float]:
    """0.5 for calling the right tool, 0.5 for passing the right city."""
    return [
        _task_score(completion_text(c), tool, city)
        for c, tool, city in zip(completions, answer_tool, answer_city, strict=True)
    ]


def concise_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """1.0 up to CONCISE_CHARS characters, falling linearly to 0 at three times that; 0 when empty."""
    return [_concise_score(completion_text(c)) for c in completions]


REWARD_FUNCS = [format_reward, task_reward, concise_reward]
