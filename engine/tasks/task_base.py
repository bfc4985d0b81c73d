"""What a task gives training, evaluation and the agents plane: a parser, a verifier and a format check.

A task never owns a model or a reward weight. The reward functions (`engine.rewards`) take a task
as a parameter, so the torch and MLX backends and the agents plane share one reward set that knows
nothing of any particular task. A task's answer for one dataset row comes from that row's columns
(`answer_columns`), which TRL passes to reward functions as keyword lists.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings for text prompts and message lists for chat."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


class Task(ABC):
    """A kind of task: how to read an answer and how to check it against a row's reference columns."""

    name: str  # the config's `task:` value
    required_columns: frozenset[str]  # dataset columns every row needs for `score`
    prefix: str = ""  # further columns named `<prefix>...` are part of the row's answer too

    @abstractmethod
    def parse(self, text: str) -> Any | None:
        """The structured answer in `text`, or None when there is none."""

    @abstractmethod
    def score(self, text: str, answer: Mapping[str, Any]) -> float:
        """The verifier: how right `text` is for a row whose answer columns are `answer`, in [0, 1]."""

    @abstractmethod
    def format_score(self, text: str) -> float:
        """How well `text` follows the answer format, in [0, 1], 1.0 for full compliance."""

    def answer_columns(self, columns: Mapping[str, Any]) -> list[str]:
        """The names among `columns` that carry a row's answer."""
        return sorted(
            name
            for name in columns
            if name in self.required_columns or (self.prefix and name.startswith(self.prefix))
        )

    def answers(self, kwargs: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
        """Per completion, its row's answer columns, from TRL's keyword lists."""
        names = [n for n in self.answer_columns(kwargs) if isinstance(kwargs[n], list | tuple)]
        return [{name: kwargs[name][i] for name in names} for i in range(count)]

    def missing(self, columns: set[str]) -> list[str]:
        """Required columns absent from a dataset's `columns`."""
        return sorted(self.required_columns - columns)
