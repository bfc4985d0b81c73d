"""Where the manager's tasks come from: the demo, a JSONL file (each mistake one line naming the file,
the line and the field), and every verifier, on a TaskSpec and on a TaskEvent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.agents.tasks import (
    TaskFileError,
    TaskSpec,
    demo_tasks,
    load_tasks,
    verify,
)
from engine.demo.task import task_rows
from engine.tasks.checks import last_number, normalise


def write(tmp_path: Path, *lines: str | dict[str, object]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    message = str(caught.value)
    assert "\n" not in message
    return message.replace(str(path), "tasks.jsonl")


TASK = {"prompt": "What is 6 x 7?", "task_type": "math", "environment": "chat"}


def test_demo_tasks_are_the_demo_rows_with_their_own_check() -> None:
    tasks, rows = demo_tasks(seed=3), task_rows(3)
    assert len(tasks) == len(rows) == 384
    first, row = tasks[0], rows[0]
    assert first.prompt == row["prompt"][0]["content"] and first.reference == row["completion"][0]["content"]
    assert (first.task_type, first.environment, first.verifier) == ("demo", "chat", "demo")
    assert first.metadata == {"answer_tool": row["answer_tool"], "answer_city": row["answer_city"]}
    assert verify(first, first.reference or "") == 1.0
    assert demo_tasks(seed=3) == tasks and demo_tasks(seed=4) != tasks


def test_the_demo_verifier_gives_half_for_each_of_tool_and_city() -> None:
    spec = TaskSpec(
        "Call the weather tool for Paris.",
        "demo",
        reference=None,
        verifier="demo",
        metadata={"answer_tool": "get_weather", "answer_city": "Paris"},
    )
    assert verify(spec, '{"tool": "get_weather", "args": {"city": "Paris"}}') == 1.0
    assert verify(spec, '{"tool": "get_weather", "args": {"city": "Rome"}}') == 0.5
    assert verify(spec, '{"tool": "get_time", "args": {"city": "Rome"}}') == 0.0
    from_reference = TaskSpec(
        "p", "demo", reference='{"tool": "get_time", "args": {"city": "Oslo"}}', verifier="demo"
    )
    assert verify(from_reference, '{"tool": "get_time", "args": {"city": "Oslo"}}') == 1.0


def test_a_file_loads_with_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        TASK | {"reference": "42"},
        "",
        "   ",
        TASK | {"reference": "42", "verifier": "number", "metadata": {"difficulty": 1}},
        {"prompt": "Explain GRPO.", "task_type": "chat-1", "environment": "chat"},
        TASK | {"reference": "42", "verifier": None},
    )
    first, second, third, fourth = load_tasks(path)
    assert first == TaskSpec("What is 6 x 7?", "math", "chat", "42", "exact", {})
    assert second.verifier == "number" and second.metadata == {"difficulty": 1}
    assert third.reference is None and third.verifier is None and verify(third, "anything") is None
    assert fourth.reference == "42" and fourth.verifier is None
    event = second.event("m1", group_size=2)
    assert (event.task_type, event.environment, event.reference, event.verifier) == (
        "math",
        "chat",
        "42",
        "number",
    )
    assert event.group_size == 2 and event.metadata == {"difficulty": 1}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"prompt": "x",'],
            "tasks.jsonl:1: invalid JSON: Expecting property name enclosed in double quotes",
        ),
        ([TASK, "[1, 2]"], "tasks.jsonl:2: expected a JSON object, got an array"),
        (
            [TASK, TASK | {"task_type": "a.b"}],
            "tasks.jsonl:2: task_type: must be one subject token (got 'a.b')",
        ),
        (
            [TASK | {"environment": "my env"}],
            "tasks.jsonl:1: environment: must be one subject token (got 'my env')",
        ),
        ([{"task_type": "t", "environment": "chat"}], "tasks.jsonl:1: prompt: required"),
        ([TASK | {"prompt": "  "}], "tasks.jsonl:1: prompt: must not be empty"),
        ([TASK | {"prompt": 3}], "tasks.jsonl:1: prompt: expected a string (got a number)"),
        ([TASK | {"answer": "42"}], "tasks.jsonl:1: answer: unknown field"),
        ([TASK | {"reference": 42}], "tasks.jsonl:1: reference: expected a string (got a number)"),
        ([TASK | {"metadata": []}], "tasks.jsonl:1: metadata: expected an object (got an array)"),
        (
            [TASK | {"verifier": "fuzzy", "reference": "x"}],
            "tasks.jsonl:1: verifier: must be one of demo, exact",
        ),
        ([TASK | {"verifier": "exact"}], "tasks.jsonl:1: verifier: 'exact' needs a reference"),
        ([TASK | {"verifier": "json", "reference": "{oops"}], "tasks.jsonl:1: reference: is not JSON"),
        ([TASK | {"verifier": "number", "reference": "many"}], "tasks.jsonl:1: reference: has no number"),
        ([TASK | {"verifier": "demo"}], "tasks.jsonl:1: metadata: the 'demo' verifier needs answer_tool"),
        (["", "  "], "tasks.jsonl: no tasks"),
    ],
)
def test_each_mistake_is_one_line_naming_line_and_field(tmp_path: Path, lines: list, message: str) -> None:
    assert error_of(write(tmp_path, *lines)).startswith(message)


def test_unreadable_files(tmp_path: Path) -> None:
    assert error_of(tmp_path / "tasks.jsonl") == "tasks.jsonl: no such file"
    (tmp_path / "tasks.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    assert error_of(tmp_path / "tasks.jsonl") == "tasks.jsonl: not UTF-8 text (byte 12 is 0xff)"


@pytest.mark.parametrize(
    ("verifier", "reference", "answer", "score"),
    [
        ("exact", "Paris", "  paris. ", 1.0),
        ("exact", "New  York", "new york!", 1.0),
        ("exact", "Paris", "Paris, France", 0.0),
        ("contains", "Paris", "The answer is PARIS, of course.", 1.0),
        ("contains", "Paris", "Lyon", 0.0),
        ("json", '{"a": 1, "b": [true, null]}', '```json\n{"b": [true, null], "a": 1.0}\n```', 1.0),
        ("json", '{"a": 1}', '{"a": true}', 0.0),
        ("json", '{"a": 1}', "not json", 0.0),
        ("number", "42", "6 x 7 = 42", 1.0),
        ("number", "1234.5", "about 1,234.5000001", 1.0),
        ("number", "0.1", "0.1000002", 0.0),
        ("number", "42", "41 or maybe 43", 0.0),
        ("number", "42", "no idea", 0.0),
    ],
)
def test_verifiers(verifier: str, reference: str, answer: str, score: float) -> None:
    spec = TaskSpec("q", "t", reference=reference, verifier=verifier)
    assert verify(spec, answer) == score
    assert verify(spec.event("m1"), answer) == score  # a TaskEvent carries the same fields


def test_verify_refuses_what_a_file_could_not_hold() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        verify(TaskSpec("q", "t", reference="x", verifier="fuzzy"), "x")
    with pytest.raises(ValueError, match="needs a reference"):
        verify(TaskSpec("q", "t", verifier="exact"), "x")


def test_normalise_and_last_number() -> None:
    assert normalise("  The  Answer\tis 42!! ") == "the answer is 42"
    assert last_number("from 5-3 we get 2, then 1,234.5") == 1234.5
    assert last_number("it is -7.") == -7.0 and last_number("none") is None
