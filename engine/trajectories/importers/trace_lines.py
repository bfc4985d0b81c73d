"""Pieces shared by the trace importers: parsed lines, timestamps, text of content blocks.

Every source format changes between versions, so each helper tolerates missing or odd fields and
returns None rather than raising.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from engine.limits import EXIT_CODE_MAX, EXIT_CODE_MIN, int_text, int_within
from engine.trajectories.trajectory import KEY_PARAMS, Trajectory, cut_prompt, key_params

Line = tuple[int, dict[str, Any]]  # (1-based line number, the JSON object on it)
# The model helpers redact before they cut, and only the first 500 (prompt) or 200 (parameter) chars are
# kept, so text past this window can only matter to a secret that starts inside the kept part. redact()
# is linear (tests/test_redaction.py), but a 10 MB tool input need not be scanned to keep 500 chars.
REDACT_WINDOW = 2000


@dataclass
class Parsed:
    """What one file gave: its trajectories, the sessions it held and the lines it could not use."""

    trajectories: list[Trajectory] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sessions: int = 0
    empty_sessions: int = 0

    def add_session(self, trajectories: list[Trajectory]) -> None:
        self.sessions += 1
        if trajectories:
            self.trajectories.extend(trajectories)
        else:
            self.empty_sessions += 1


def prompt_of(text: Any) -> str:
    """The stored prompt: cut to 500 chars and redacted (model.cut_prompt), in bounded time."""
    return cut_prompt(text[:REDACT_WINDOW] if isinstance(text, str) else None)


def params_of(tool_input: Any) -> dict[str, str]:
    """The stored key parameters (model.key_params), in bounded time."""
    if not isinstance(tool_input, dict):
        return {}
    return key_params({k: _window(tool_input[k]) for k in KEY_PARAMS if k in tool_input})


def _window(value: Any) -> Any:
    if isinstance(value, list):  # argv form: joined by key_params
        value = " ".join(str(v) for v in value)
    return value[:REDACT_WINDOW] if isinstance(value, str) else value


def unix_ts(value: Any) -> float | None:
    """Unix seconds from an ISO-8601 string (`Z` allowed) or a number (seconds, or milliseconds)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not -1e15 < value < 1e15:  # NaN, inf, and what no clock reads (float() of 10**400 raises)
            return None
        return float(value) / 1000.0 if value > 1e11 else float(value)  # 1e11 s is the year 5138
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:  # the formats write UTC; a naive stamp must not take the local zone
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the `text` of a list of blocks joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return content_text(content.get("text") if "text" in content else content.get("content"))
    if isinstance(content, list):
        parts = [content_text(block) for block in content if isinstance(block, str | dict)]
        return "\n".join(p for p in parts if p)
    return ""


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_int(value: Any) -> int | None:
    """An integer SQLite can store, from a number or a decimal text; None for anything else (bool, NaN,
    2**63, a text of a thousand digits)."""
    if isinstance(value, str):
        return int_text(value)
    return int_within(value)


def exit_code(value: Any) -> int | None:
    """A process's exit status: an integer of 32 bits; a larger one is no exit code."""
    return int_within(as_int(value), EXIT_CODE_MIN, EXIT_CODE_MAX)


def as_float(value: Any) -> float | None:
    """A number as a float; None for bool, text, and an int too large for a float (float() would raise)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if isinstance(value, float) or -1e308 < value < 1e308 else None


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def elapsed_ms(start: float | None, end: float | None) -> float | None:
    """Milliseconds from start to end; None when unknown or negative (timestamps are not strictly ordered)."""
    if start is None or end is None or end < start:
        return None
    return round((end - start) * 1000.0, 3)


def latest(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
