"""TensorBoard text summaries that hold samples, as rollouts of their run (engine/observe/tensorboard.py).

`SummaryWriter.add_text(tag, text, step)` (torch, tensorboardX) writes a string tensor of the `text` plugin
under `<tag>/text_summary`; tf2-style writers may write a 2-D string tensor, which TensorBoard shows as a
table. A text is samples when:

- it is OpenRLHF's `train/generated_samples` (openrlhf/utils/logging_utils.py `TensorboardLogger.log_train`,
  OpenRLHF 0.11.0): `"Sample:\\n{text}\\n\\nReward: {reward:.4f}"`, the separators written as a backslash and
  an `n`, `text` the first sample of the step decoded whole (prompt and response together, so it is kept as
  the completion, with no prompt);
- it is a table (markdown, or a 2-D string tensor whose first row is its header) one of whose columns is a
  completion (columns.py TENSORBOARD_TEXT names which column is what);
- it is JSON: an object, or a list of objects, with a completion field;
- or its tag's last part names samples (SAMPLE_TAGS): then the whole text is one sample's completion.

Any other text (transformers' `args` and `model_config`, notes) is not samples and is skipped, as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .columns import TENSORBOARD_TEXT, has_completion, mapped
from .rollout_base import chat_text, finite

TEXT_SUFFIX = "/text_summary"  # what SummaryWriter.add_text appends to a tag
SAMPLE_TAGS = frozenset({"generated_samples", "samples", "generations", "completions", "rollouts"})
MAX_TABLE_ROWS = 10_000  # rows of one table taken as samples
OPENRLHF = re.compile(r"\ASample:(?:\\n|\n)(.*)(?:\\n|\n)(?:\\n|\n)Reward: (\S+)\s*\Z", re.DOTALL)
SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def tag_name(tag: str) -> str:
    return tag[: -len(TEXT_SUFFIX)] if tag.endswith(TEXT_SUFFIX) else tag


def names_samples(tag: str) -> bool:
    return tag_name(tag).rsplit("/", 1)[-1].lower() in SAMPLE_TAGS


def text_samples(tag: str, cells: list[list[str]]) -> list[dict[str, Any]] | None:
    """The samples a text summary holds (each without step and idx, its tag in `extra`), or None when it
    holds none. `cells` is its string tensor as rows of text: one row of one cell for `add_text`."""
    samples = _samples(tag, cells)
    for sample in samples or ():
        sample["extra"] = {"tag": tag_name(tag), **(sample.get("extra") or {})}
    return samples


def _samples(tag: str, cells: list[list[str]]) -> list[dict[str, Any]] | None:
    if len(cells) > 1 and cells[0]:
        header = cells[0]
        if has_completion(TENSORBOARD_TEXT, header):
            return [_row(header, row) for row in cells[1 : MAX_TABLE_ROWS + 1]]
        return None
    if len(cells) != 1 or len(cells[0]) != 1:
        return None
    text = cells[0][0]
    match = OPENRLHF.match(text)
    if match:
        reward = _number(match[2])
        return [{"completion": chat_text(match[1]), "total": reward}]
    table = markdown_table(text)
    if table is not None and has_completion(TENSORBOARD_TEXT, table[0]):
        return [_row(table[0], row) for row in table[1 : MAX_TABLE_ROWS + 1]]
    from_json = json_samples(text)
    if from_json is not None:
        return from_json
    if names_samples(tag):
        return [{"completion": chat_text(text)}]
    return None


TEXT_ROLES = frozenset(TENSORBOARD_TEXT.prompt + TENSORBOARD_TEXT.completion)


def _row(header: list[str], row: list[str]) -> dict[str, Any]:
    """One table row as a sample: a cell that reads as a number is one, but in a prompt or completion."""
    fields: dict[str, Any] = {}
    for name, cell in zip(header, row, strict=False):
        key = name.strip()
        if not key or key in fields:
            continue
        number = None if key.lower() in TEXT_ROLES else _number(cell)
        fields[key] = number if number is not None else cell.strip()
    sample = mapped(TENSORBOARD_TEXT, fields)
    return {k: v for k, v in sample.items() if k != "step" or v is not None}


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or len(text) > 40:
        return None
    try:
        return finite(float(text))
    except ValueError:
        return None


def markdown_table(text: str) -> list[list[str]] | None:
    """A markdown table's rows of cells (the header first, the separator line left out), or None."""
    lines = text.strip().splitlines()
    if len(lines) < 2 or not lines[0].lstrip().startswith("|") or not SEPARATOR.match(lines[1]):
        return None
    rows = [_cells(lines[0])]
    for line in lines[2 : MAX_TABLE_ROWS + 2]:
        if line.strip():
            rows.append(_cells(line))
    return rows


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells = re.split(r"(?<!\\)\|", line)
    return [cell.replace("\\|", "|").replace("<br>", "\n").strip() for cell in cells]


def json_samples(text: str) -> list[dict[str, Any]] | None:
    """Samples from a text that is JSON: an object, or a list of objects, with a completion field."""
    stripped = text.lstrip()
    if stripped[:1] not in ("{", "["):
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    records = value if isinstance(value, list) else [value]
    if not records or not all(isinstance(r, dict) for r in records[:MAX_TABLE_ROWS]):
        return None
    if not has_completion(TENSORBOARD_TEXT, [str(k) for k in records[0]]):
        return None
    out = []
    for record in records[:MAX_TABLE_ROWS]:
        sample = mapped(TENSORBOARD_TEXT, record)
        out.append({k: v for k, v in sample.items() if k != "step" or v is not None})
    return out
