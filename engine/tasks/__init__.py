"""Tasks: how an answer is parsed and checked, apart from any model or reward weight.

`toolcall` (the demo's kind: one JSON tool call checked against `answer_*` columns) and `reference`
(a dataset with a `reference` answer per row). `task_for` picks one for a run's dataset.
"""

from __future__ import annotations

from .checks import CHECKS, normalise
from .reference import ReferenceTask
from .task_base import Task, completion_text
from .toolcall import ToolCallTask, call_format_score, call_score, parse_call

TASKS = ("auto", "toolcall", "reference")


def task_for(kind: str, columns: set[str]) -> Task:
    """The task named by `kind`; `auto` reads it off the dataset's columns (tool calls by default)."""
    if kind == "reference" or (kind == "auto" and "reference" in columns and "answer_tool" not in columns):
        return ReferenceTask()
    if kind in ("auto", "toolcall"):
        return ToolCallTask()
    raise ValueError(f"task: must be one of {', '.join(TASKS)} (got {kind!r})")


__all__ = [
    "CHECKS",
    "TASKS",
    "ReferenceTask",
    "Task",
    "ToolCallTask",
    "call_format_score",
    "call_score",
    "completion_text",
    "normalise",
    "parse_call",
    "task_for",
]
