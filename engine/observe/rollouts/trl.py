"""TRL's completions: `completions/completions_{step:05d}.parquet`, a file per logged step, read by pyarrow.

GRPOTrainer with `log_completions=True` writes, at each log (trl/trainer/grpo_trainer.py, `GRPOTrainer.log`),
the last generation batch through `pd.DataFrame(table).to_parquet(...)`: columns `step`, `prompt`,
`completion`, one float column per reward function (named after it), the columns reward functions add with
`log_extra`, and `advantage`. The reward columns are the float columns right after `completion`; the first
other column and every column after it (but `advantage`) are extras. A GRPO group is a run of consecutive rows
with the same prompt. The file has no reward weights, so a sample's total is the plain sum of its reward
columns.

Files are read in step order. The cursor is the file being read and how many of its rows are stored. A file
that cannot be read yet (pandas writes it in place) is waited for while it is the newest one and was written
to in the last STALE_SECONDS; otherwise it is one problem line and reading goes on with the next file.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from engine.limits import int_text
from engine.store import Store

from ..common import Budget, IngestResult, ObserveError
from .common import attached_run, chat_text, not_a_file, spent, write_batch

FILE = re.compile(r"completions_(\d+)\.parquet$")
REQUIRED = ("prompt", "completion")
KNOWN = frozenset({"step", "prompt", "completion", "advantage"})
STALE_SECONDS = 30.0
WAIT = object()


def run_name(root: Path) -> str:
    """The output directory's name (the parent of `completions/`)."""
    folder = root.parent if root.is_file() else root
    return folder.parent.name if folder.name == "completions" else folder.name


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    root = Path(source["path"])
    run = attached_run(store, source)
    folder, listing = _listing(root)
    cursor = source["cursor"]
    at = (cursor.get("key", -1), cursor.get("file", ""))
    todo = [f for f in listing if f > at or (f == at and not cursor.get("done", False))]
    result = IngestResult(caught_up=True, total=listing[-1][0] if listing else None)
    rows: list[dict[str, Any]] = []
    new_cursor = dict(cursor)
    for key, name in todo:
        path = folder / name
        first = cursor.get("row", 0) if (key, name) == at else 0
        table = _read(path, result, waiting=bool(source["follow"]) and (key, name) == listing[-1])
        if table is WAIT:
            break  # the newest file is still being written: read it again later
        if table is None:  # unusable: its problem is reported, the next file is read
            new_cursor = {"key": key, "file": name, "row": 0, "done": True}
            continue
        stop = _rows(table, path, key, first, rows, budget)
        new_cursor = {"key": key, "file": name, "row": stop, "done": stop >= table.num_rows}
        if stop < table.num_rows:
            result.caught_up = False
            break
    result.done = max(new_cursor.get("key", 0), 0)  # progress in steps
    if new_cursor != cursor:
        write_batch(store, source, run, run_name(root), rows, new_cursor, result)
    return result


def _names(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []


def _listing(root: Path) -> tuple[Path, list[tuple[int, str]]]:
    """(the folder, its completions files as (step, name) in step order)."""
    if root.is_file():
        match = FILE.match(root.name)
        return root.parent, [((int_text(match[1]) or 0) if match else 0, root.name)]
    if not root.is_dir():
        raise ObserveError(f"{root}: no such directory (moved or deleted?)", transient=True)
    found = [(int_text(m[1]), m[0]) for m in (FILE.match(n) for n in _names(root)) if m]
    return root, sorted((step, name) for step, name in found if step is not None)


def _read(path: Path, result: IngestResult, *, waiting: bool) -> Any:
    """The file's table; WAIT when it may still be being written; None (and a problem) when it is unusable."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ObserveError(
            f"{path}: reading TRL's completions needs pyarrow (pip install 'carl-tui[parquet]')"
        ) from None
    refused = not_a_file(path)
    if refused:
        result.add_problem(f"{path.name}: {refused}")
        return None
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        if waiting:
            return WAIT
        result.add_problem(f"{path.name}: the file is gone")
        return None
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError and more for a file it cannot read
        if waiting and time.time() - _mtime(path) < STALE_SECONDS:
            return WAIT
        result.add_problem(f"{path.name}: not a readable parquet file ({' '.join(str(exc).split())[:160]})")
        return None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        columns = ", ".join(table.column_names) or "none"
        result.add_problem(f"{path.name}: no {' or '.join(missing)} column (it has: {columns})")
        return None
    return table


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _rows(table: Any, path: Path, key: int, first: int, out: list[dict[str, Any]], budget: Budget) -> int:
    """Append the table's samples from row `first` on until the budget is spent; returns the row after
    them."""
    import pyarrow as pa

    names = table.column_names
    start = names.index("completion") + 1
    rewards: list[str] = []
    for name in names[start:]:
        if name == "advantage" or not pa.types.is_floating(table.schema.field(name).type):
            break
        rewards.append(name)
    extras = [n for n in names if n not in KNOWN and n not in rewards and not n.startswith("__index_level_")]
    data = _pydict(table, path)
    groups = _groups(data["prompt"])
    steps = data.get("step")
    wall = _mtime(path) or time.time()
    row = first
    while row < table.num_rows and not spent(budget, len(out)):
        step = steps[row] if steps is not None and type(steps[row]) is int else key
        out.append(
            {
                "step": step,
                "idx": row,
                "group_id": str(groups[row]),
                "prompt": chat_text(data["prompt"][row]),
                "completion": chat_text(data["completion"][row]),
                "rewards": {name: data[name][row] for name in rewards},
                "advantage": data["advantage"][row] if "advantage" in data else None,
                "extra": {name: data[name][row] for name in extras},
                "wall_time": wall,
            }
        )
        row += 1
    return row


def _pydict(table: Any, path: Path) -> dict[str, list[Any]]:
    """The table's columns as Python lists. Text that is not UTF-8 (a damaged page: parquet pages carry no
    checksum by default) is kept with U+FFFD in a column of text, and leaves a column of messages out
    (`None`)."""
    try:
        return table.to_pydict()
    except UnicodeDecodeError:
        pass
    import pyarrow as pa

    data: dict[str, list[Any]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        try:
            data[name] = column.to_pylist()
            continue
        except UnicodeDecodeError:
            pass
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            raw = column.cast(pa.large_binary()).to_pylist()
            data[name] = [None if v is None else v.decode("utf-8", "replace") for v in raw]
        else:
            data[name] = [None] * len(column)
    return data


def _groups(prompts: list[Any]) -> list[int]:
    """A group number per row: a new group starts where the prompt changes."""
    out, group, previous = [], -1, object()
    for prompt in prompts:
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
        if text != previous:
            group += 1
            previous = text
        out.append(group)
    return out
