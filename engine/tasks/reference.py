"""Reference answers: a row's `reference` column is the right answer, checked as the row says.

The completion writes its final answer as `<answer>...</answer>` (the agents plane's format); text
without the tags is taken whole. A row may name its check in a `verifier` column (exact, contains,
json or number; see `checks`), otherwise the task's default check applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .checks import CHECKS, check, expected
from .task_base import Task

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class ReferenceTask(Task):
    name = "reference"
    required_columns = frozenset({"reference"})
    prefix = ""

    def __init__(self, verifier: str = "exact") -> None:
        if verifier not in CHECKS:
            raise ValueError(f"verifier: must be one of {', '.join(CHECKS)} (got {verifier!r})")
        self.verifier = verifier

    def answer_columns(self, columns: Mapping[str, Any]) -> list[str]:
        return [name for name in ("reference", "verifier") if name in columns]

    def parse(self, text: str) -> str | None:
        found = _ANSWER.findall(text)
        if found:
            return found[-1].strip()
        return text.strip() or None

    def score(self, text: str, answer: Mapping[str, Any]) -> float:
        name = answer.get("verifier") or self.verifier
        parsed = self.parse(text)
        if parsed is None:
            return 0.0
        try:
            return check(name, parsed, expected(name, str(answer["reference"])))
        except ValueError:
            return 0.0  # a reference its check cannot read scores nothing (load_rows reports it)

    def format_score(self, text: str) -> float:
        """1.0 for exactly one non-empty `<answer>` block; 0.35 for each tag present otherwise."""
        found = _ANSWER.findall(text)
        if len(found) == 1 and found[0].strip():
            return 1.0
        return round(0.35 * ("<answer>" in text) + 0.35 * ("</answer>" in text), 4)
