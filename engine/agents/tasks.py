"""Where the manager's tasks come from, and how a task checks its own answer.

Two sources: the built-in demo (`demo_tasks`: the tool-calling task the tiny model is trained on)
and a JSONL file (`load_tasks`), one task a line:

    {"prompt": "What is 6 x 7?", "task_type": "math", "environment": "chat", "reference": "42",
     "verifier": "number"}

`prompt`, `task_type` and `environment` are required (the last two are NATS subject tokens);
`reference`, `verifier` and `metadata` are optional. A task with a reference and no verifier is
checked with "exact". A mistake is one line naming the file, the line and the field.

Verifiers (`verify`), each giving a score in [0, 1]:
- demo: the demo task's own check, 0.5 for the right tool and 0.5 for the right city;
- exact, contains, json, number: the reference checks training shares (`engine.tasks.checks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.demo.task import TASK as DEMO_TASK
from engine.demo.task import task_rows
from engine.errors import CarlError
from engine.files import named, read_utf8
from engine.tasks.checks import CHECKS, check, expected

from .events import TOKEN, TaskEvent

VERIFIERS = ("demo", *CHECKS)
NEEDS_REFERENCE = CHECKS
FIELDS = ("prompt", "task_type", "environment", "reference", "verifier", "metadata")


class TaskFileError(CarlError):
    """A tasks file that cannot be used, as one line: `file:line: field: what is wrong`."""


@dataclass(frozen=True)
class TaskSpec:
    """One task to assign: what to ask, on which queue, in which environment, and how to check it."""

    prompt: str
    task_type: str
    environment: str = "chat"
    reference: str | None = None
    verifier: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def event(self, manager_id: str, **fields: Any) -> TaskEvent:
        """The TaskEvent that assigns this task (`fields`: group_id, group_size, task_id)."""
        return TaskEvent(
            manager_id=manager_id,
            task_type=self.task_type,
            environment=self.environment,
            prompt=self.prompt,
            reference=self.reference,
            verifier=self.verifier,
            metadata=dict(self.metadata),
            **fields,
        )


# ================================================================================================= demo


def demo_tasks(seed: int = 0) -> list[TaskSpec]:
    """The demo's tool-calling requests (384, shuffled by `seed`), checked by the demo's own reward."""
    return [
        TaskSpec(
            prompt=row["prompt"][0]["content"],
            task_type="demo",
            environment="chat",
            reference=row["completion"][0]["content"],
            verifier="demo",
            metadata={"answer_tool": row["answer_tool"], "answer_city": row["answer_city"]},
        )
        for row in task_rows(seed)
    ]


# ============================================================================================ the file


def load_tasks(path: str | Path) -> list[TaskSpec]:
    """The tasks of a JSONL file (blank lines skipped); raises TaskFileError on the first mistake."""
    name = named(path)
    if not Path(path).exists() and not Path(path).is_symlink():
        raise TaskFileError(f"{name}: no such file")
    text = read_utf8(path, "tasks file", TaskFileError)  # a FIFO, a device or a loop: one line, never a hang
    specs = [
        _task(_object(line, f"{name}:{number}"), f"{name}:{number}")
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not specs:
        raise TaskFileError(f"{name}: no tasks")
    return specs


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {_json_type(value)}")
    return value


def _task(data: dict[str, Any], where: str) -> TaskSpec:
    unknown = [key for key in data if key not in FIELDS]
    if unknown:
        raise TaskFileError(f"{where}: {unknown[0]}: unknown field (expected one of {', '.join(FIELDS)})")
    prompt = _required_text(data, "prompt", where)
    task_type = _token(data, "task_type", where)
    environment = _token(data, "environment", where)
    reference = data.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise TaskFileError(f"{where}: reference: expected a string (got {_json_type(reference)})")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise TaskFileError(f"{where}: metadata: expected an object (got {_json_type(metadata)})")
    # An explicit "verifier": null means no verifier even with a reference.
    verifier = data.get("verifier", "exact" if reference is not None else None)
    spec = TaskSpec(prompt, task_type, environment, reference, verifier, metadata)
    if verifier is not None:
        _check_verifier(spec, where)
    return spec


def _required_text(data: dict[str, Any], key: str, where: str) -> str:
    if key not in data:
        raise TaskFileError(f"{where}: {key}: required")
    value = data[key]
    if not isinstance(value, str):
        raise TaskFileError(f"{where}: {key}: expected a string (got {_json_type(value)})")
    if not value.strip():
        raise TaskFileError(f"{where}: {key}: must not be empty")
    return value


def _token(data: dict[str, Any], key: str, where: str) -> str:
    value = _required_text(data, key, where)
    if not TOKEN.match(value):
        # A dot, space or wildcard would change the subject the task travels on
        # (docs/reference/agents-plane.md §2).
        raise TaskFileError(f"{where}: {key}: must be one subject token (got {value!r})")
    return value


def _check_verifier(spec: TaskSpec, where: str) -> None:
    """The verifier exists and has what it needs, so `verify` cannot fail on a loaded task."""
    name = spec.verifier
    if not isinstance(name, str) or name not in VERIFIERS:
        raise TaskFileError(f"{where}: verifier: must be one of {', '.join(VERIFIERS)} (got {name!r})")
    if name in NEEDS_REFERENCE and spec.reference is None:
        raise TaskFileError(f"{where}: verifier: {name!r} needs a reference")
    try:
        _expected(spec)
    except ValueError as exc:
        raise TaskFileError(f"{where}: {exc}") from None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


# =========================================================================================== verifiers


class Checkable(Protocol):
    """A TaskSpec or a TaskEvent: both carry these."""

    @property
    def reference(self) -> str | None: ...

    @property
    def verifier(self) -> str | None: ...

    @property
    def metadata(self) -> dict[str, Any]: ...


def verify(task: Checkable, answer: str) -> float | None:
    """The task's own score of `answer` in [0, 1]; None when the task has no verifier.

    Raises ValueError for an unknown verifier or one missing what it needs (a loaded file cannot
    have either)."""
    if task.verifier is None:
        return None
    want = _expected(task)
    if task.verifier == "demo":
        tool, city = want
        return DEMO_TASK.score(answer, {"answer_tool": tool, "answer_city": city})
    return check(task.verifier, answer, want)


def _expected(task: Checkable) -> Any:
    """What the verifier compares with, checked: raises ValueError naming the field at fault."""
    name, reference = task.verifier, task.reference
    if name == "demo":
        return _demo_answer(task)
    if name not in NEEDS_REFERENCE:
        raise ValueError(f"verifier: must be one of {', '.join(VERIFIERS)} (got {name!r})")
    if reference is None:
        raise ValueError(f"verifier: {name!r} needs a reference")
    return expected(name, reference)


def _demo_answer(task: Checkable) -> tuple[str, str]:
    """The demo's right tool and city: from metadata answer_tool/answer_city, else the reference call."""
    tool, city = task.metadata.get("answer_tool"), task.metadata.get("answer_city")
    if isinstance(tool, str) and isinstance(city, str):
        return tool, city
    call = DEMO_TASK.parse(task.reference or "")
    if call is not None and isinstance(call["args"].get("city"), str):
        return call["tool"], call["args"]["city"]
    raise ValueError("metadata: the 'demo' verifier needs answer_tool and answer_city (or a reference call)")
