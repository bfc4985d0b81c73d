"""The grammar of a GUI agent's actions: the step that ends with one is a valid action."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GuiAction:
    name: str
    args: tuple[Any, ...]


_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_STRING = r"\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')\s*"
_ACTIONS: dict[str, tuple[re.Pattern[str], bool]] = {
    # name: (argument pattern, may the numbers be negative)
    "click": (re.compile(rf"{_NUM},{_NUM}"), False),
    "double_click": (re.compile(rf"{_NUM},{_NUM}"), False),
    "type": (re.compile(_STRING), False),
    "key": (re.compile(_STRING), False),
    "scroll": (re.compile(rf"{_NUM},{_NUM}"), True),  # negative deltas scroll up or left
    "drag": (re.compile(rf"{_NUM},{_NUM},{_NUM},{_NUM}"), False),
    "wait": (re.compile(_NUM), False),
}
_CALL = re.compile(r"^`*\s*([a-z_]+)\((.*)\)\s*;?\s*`*\s*;?$", re.DOTALL)


def parse_action(step: str) -> GuiAction | None:
    """The GUI action a step ends with, or None. The grammar (the whole step, or its last non-empty
    line, optionally in backticks and with a trailing `;`):

        click(x, y) | double_click(x, y) | drag(x1, y1, x2, y2)   x, y >= 0
        scroll(dx, dy)                                              signed: negative scrolls up/left
        type("text") | key("name")                                  a quoted string; a key is non-empty
        wait(seconds)                                               seconds >= 0
    """
    lines = [line.strip() for line in step.strip().splitlines() if line.strip()]
    for candidate in (step.strip(), lines[-1] if lines else ""):
        action = _parse_call(candidate)
        if action is not None:
            return action
    return None


def _parse_call(text: str) -> GuiAction | None:
    call = _CALL.match(text)
    if call is None or call.group(1) not in _ACTIONS:
        return None
    name = call.group(1)
    pattern, signed = _ACTIONS[name]
    args = pattern.fullmatch(call.group(2))
    if args is None:
        return None
    if name in ("type", "key"):
        value = _string_literal(args.group(1))
        if value is None or (name == "key" and not value.strip()):
            return None
        return GuiAction(name, (value,))
    values = tuple(float(v) for v in args.groups())
    if not signed and any(v < 0 for v in values):
        return None
    return GuiAction(name, values)


def _string_literal(text: str) -> str | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None
