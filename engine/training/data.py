"""The inputs of a training run, for every backend: the model to load and the dataset's rows.

Nothing here imports torch or mlx; building the tiny model (on first use) imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engine.files import read_utf8
from engine.models.tiny import build_tiny_model, default_model_dir
from engine.tasks import Task, task_for
from engine.text import loads_storable, one_line

from .backend import BadInput
from .config import DEMO_DATASET, TINY_MODEL, TrainConfig


def is_local_model(model: str) -> bool:
    """A path (absolute, relative with ./ or ../, ~, or existing) rather than a hub id."""
    return (
        model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or Path(model).expanduser().exists()
    )


def resolve_model(model: str, home: Path, seed: int) -> str:
    """The directory or hub id to load; builds the tiny model on first use."""
    if model == TINY_MODEL:
        return str(build_tiny_model(default_model_dir(home), seed=0))
    if is_local_model(model):
        path = Path(model).expanduser()
        if not path.is_dir():
            raise BadInput(f"model {model}: no such directory")
        if not (path / "config.json").is_file():
            raise BadInput(f"model {model}: not a model directory (no config.json)")
        return str(path.resolve())
    return model


def load_rows(dataset: str, seed: int) -> list[dict[str, Any]]:
    """The dataset's rows: the demo task, or a .jsonl / .json file of objects."""
    if dataset == DEMO_DATASET:
        from engine.demo.task import demo_rows

        return demo_rows(seed)
    path = Path(dataset).expanduser()
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"dataset {dataset}: no such file")
    text = read_utf8(path, "dataset file", BadInput)  # a FIFO, a device or a loop: one line
    rows: Any = []
    places: list[str] = []  # where each row is, for the messages: file:line, or file: row N
    lineno = 0
    try:
        if path.suffix == ".jsonl":
            for lineno, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    rows.append(loads_storable(line))
                    places.append(f"{dataset}:{lineno}")
        else:
            rows = loads_storable(text)
    except (ValueError, RecursionError) as exc:
        where = f"{dataset}:{lineno}" if lineno else str(dataset)
        why = "nested too deeply" if isinstance(exc, RecursionError) else one_line(str(exc), 200)
        raise BadInput(f"dataset {where}: not readable JSON ({why})") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise BadInput(f"dataset {dataset}: expected a non-empty list of JSON objects")
    places = places or [f"{dataset}: row {i}" for i in range(1, len(rows) + 1)]
    for place, row in zip(places, rows, strict=True):
        problem = prompt_problem(row["prompt"]) if "prompt" in row else None
        if problem is not None:
            raise BadInput(f"dataset {place}: {problem}")
    return rows


def prompt_problem(prompt: Any) -> str | None:
    """Why a row's prompt cannot be trained on, or None: text, or a conversation (a list of messages, each
    an object with a `content`: text, or a list of parts)."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list) or not prompt:
        return f"'prompt' is {type(prompt).__name__}, not text or a list of messages"
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            return f"'prompt'[{i}] is not a message (an object with a 'content')"
        if not isinstance(message.get("role", "user"), str):
            return f"'prompt'[{i}].role is not text"
    return None


def dataset_columns(rows: list[dict[str, Any]]) -> set[str]:
    """Columns every row has (a column missing from some rows is not usable)."""
    columns = set(rows[0])
    for row in rows[1:]:
        columns &= set(row)
    return columns


def run_task(config: TrainConfig, columns: set[str]) -> Task:
    """The task whose checks the run's `task` and `format` rewards apply (the demo's: tool calls)."""
    return task_for("toolcall" if config.dataset == DEMO_DATASET else config.task, columns)


def checked_inputs(
    config: TrainConfig, home: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any, str]:
    """The run's training rows, held-out rows, rewards (None for SFT) and model to load, each checked:
    BadInput names what is wrong. Every backend calls this first, and so does `--processes` before it
    launches any rank, so bad input is one line there too."""
    from .holdout import split_holdout
    from .reward_set import build_rewards

    every = load_rows(config.dataset, config.seed)
    rows, held = split_holdout(every, config.eval.holdout)
    columns = dataset_columns(rows)
    have = ", ".join(sorted(columns))
    if "prompt" not in columns:
        raise BadInput(f"dataset {config.dataset}: no 'prompt' column (columns: {have})")
    if config.method == "sft" and "completion" not in columns:
        raise BadInput(f"dataset {config.dataset}: SFT needs a 'completion' column (columns: {have})")
    if config.opd:
        hint_problem(every, config.dataset)
    rewards = None
    if config.method == "grpo":
        rewards = build_rewards(config, run_task(config, columns))
        rewards.check_columns(columns, config.dataset)
    return rows, held, rewards, resolve_model(config.model, home, config.seed)


def hint_problem(rows: list[dict[str, Any]], dataset: str) -> None:
    """OPD reads each row's `hint` (text; empty or null: no hint, and the row trains on GRPO alone): BadInput
    when a row lacks the column, or holds something else in it."""
    columns = dataset_columns(rows)
    if "hint" not in columns:
        raise BadInput(
            f"dataset {dataset}: opd needs a 'hint' column in every row (text; empty or null where a row has"
            f" no hint); columns: {', '.join(sorted(columns))}"
        )
    for i, row in enumerate(rows, start=1):
        if row["hint"] is not None and not isinstance(row["hint"], str):
            raise BadInput(
                f"dataset {dataset}: row {i}: 'hint' is {type(row['hint']).__name__}, not text or null"
            )


def row_hint(row: dict[str, Any]) -> str | None:
    """The row's hint for OPD, or None when it has none (no column, null, or only blanks)."""
    hint = row.get("hint")
    return hint if isinstance(hint, str) and hint.strip() else None


def prompt_text(prompt: Any) -> str:
    """A prompt for display: plain text, or a conversation as 'role: content' lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)


def offline_if_local(model: str) -> None:
    """Nothing to download for a local model: make sure nothing is even asked of the hub."""
    if model == TINY_MODEL or is_local_model(model):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
