"""Tool calls: the answer is one JSON object `{"tool": str, "args": {...}}` (the demo task's kind).

A row's answer is its `answer_tool` column and one `answer_<arg>` column per expected argument; an
argument whose value is None is not required for that row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .task_base import Task


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


def call_score(text: str, tool: str, args: Mapping[str, Any]) -> float:
    """Half for the right tool and half shared by the expected args (all of it for the tool when none).

    An unparsed completion earns 0.2 for naming the tool and up to 0.2 for mentioning the expected
    values, so near-misses rank above noise.
    """
    wanted = {name: value for name, value in args.items() if value is not None}
    call = parse_call(text)
    if call is not None:
        tool_part = (0.5 if wanted else 1.0) if call["tool"] == tool else 0.0
        if not wanted:
            return tool_part
        hits = sum(call["args"].get(name) == value for name, value in wanted.items())
        return tool_part + 0.5 * hits / len(wanted)
    named = 0.2 if tool and tool in text else 0.0
    if not wanted:
        return named
    mentioned = sum(str(value) in text for value in wanted.values())
    return named + 0.2 * mentioned / len(wanted)


def call_format_score(text: str) -> float:
    """1.0 for a well-formed call anywhere in the text.

    Otherwise partial credit: 0.15 for each of `{`, `"tool"`, `"args"`, `}` present, plus 0.1 when
    the braces balance (at most 0.7).
    """
    if parse_call(text) is not None:
        return 1.0
    score = sum(0.15 for piece in ("{", '"tool"', '"args"', "}") if piece in text)
    if text.count("{") == text.count("}") > 0:
        score += 0.1
    return round(score, 4)


class ToolCallTask(Task):
    name = "toolcall"
    required_columns = frozenset({"answer_tool"})
    prefix = "answer_"

    def parse(self, text: str) -> dict[str, Any] | None:
        return parse_call(text)

    def score(self, text: str, answer: Mapping[str, Any]) -> float:
        args = {k.removeprefix("answer_"): v for k, v in answer.items() if k != "answer_tool"}
        return call_score(text, str(answer["answer_tool"]), args)

    def format_score(self, text: str) -> float:
        return call_format_score(text)
