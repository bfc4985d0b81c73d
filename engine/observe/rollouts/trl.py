"""TRL's completions: `completions/completions_{step:05d}.parquet`, a file per logged step, read by pyarrow.

GRPOTrainer with `log_completions=True` writes, at each log (trl/trainer/grpo_trainer.py, `GRPOTrainer.log`),
the last generation batch through `pd.DataFrame(table).to_parquet(...)`: columns `step`, `prompt`,
`completion`, one float column per reward function (named after it), the columns reward functions add with
`log_extra`, and `advantage`. The reward columns are the float columns right after `completion`; the first
other column and every column after it (but `advantage`) are extras. A GRPO group is a run of consecutive rows
with the same prompt. The file has no reward weights, so a sample's total is the plain sum of its reward
columns.

Files are read in step order, a few rows at a time (`ParquetFile.iter_batches`, from the row group that holds
the cursor's row): never a whole file, and each text cut to MAX_TEXT before it becomes a Python string, so a
small dictionary-encoded file of a thousand copies of one 1 MB completion costs a batch's worth of memory. A
row group over MAX_ROW_GROUP bytes uncompressed is skipped with one line. The cursor is the file being read,
how many of its rows are stored, and the group of the last one; every batch stores at least one row or moves
the cursor past a file, so a file slower to read than a batch's budget still goes on; the next batch goes on
from the rows' iterator where the last one stopped (KEPT: TRL writes one row group a file, and resuming inside
it would decode every row before the cursor again). A file that cannot be
read yet (pandas writes it in place) is waited for while it is the newest one and was written to in the last
STALE_SECONDS; otherwise it is one problem line and reading goes on with the next file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.limits import int_text
from engine.store import Store

from ..reader_base import Budget, IngestResult, ObserveError
from .rollout_base import MAX_TEXT, attached_run, chat_text, not_a_file, spent, write_batch

FILE = re.compile(r"completions_(\d+)\.parquet$")
REQUIRED = ("prompt", "completion")
KNOWN = frozenset({"step", "prompt", "completion", "advantage"})
STALE_SECONDS = 30.0
WAIT = object()
BATCH_ROWS = 16  # rows decoded at a time
MAX_ROW_GROUP = 1 << 30  # uncompressed bytes of one row group; a larger one is skipped with one line
BATCH_TEXT = 64 << 20  # characters of prompts and completions one batch holds before it is written
TEXT_BYTES = 4 * (MAX_TEXT + 1)  # UTF-8 bytes of a text kept before decoding (chat_text cuts at MAX_TEXT)


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
        resumed = cursor if (key, name) == at else {}
        parquet = _open(path, result, waiting=bool(source["follow"]) and (key, name) == listing[-1])
        if parquet is WAIT:
            break  # the newest file is still being written: read it again later
        if parquet is None:  # unusable: its problem is reported, the next file is read
            new_cursor = {"key": key, "file": name, "row": 0, "done": True}
            continue
        reading = FileRows(parquet, path, key, resumed, result)
        stop = reading.read(rows, budget)
        total = parquet.metadata.num_rows
        new_cursor = {"key": key, "file": name, "row": stop, "done": stop >= total, **reading.group_state()}
        if stop < total:
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


def _open(path: Path, result: IngestResult, *, waiting: bool) -> Any:
    """The file as a ParquetFile (its footer read, no row yet); WAIT when it may still be being written; None
    (and a problem) when it is unusable."""
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
        parquet = pq.ParquetFile(path)
    except FileNotFoundError:
        if waiting:
            return WAIT
        result.add_problem(f"{path.name}: the file is gone")
        return None
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError and more for a file it cannot read
        if waiting and time.time() - _mtime(path) < STALE_SECONDS:
            return WAIT
        result.add_problem(f"{path.name}: not a readable parquet file ({_said(exc)})")
        return None
    names = parquet.schema_arrow.names
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        columns = ", ".join(names) or "none"
        result.add_problem(f"{path.name}: no {' or '.join(missing)} column (it has: {columns})")
        return None
    return parquet


def _said(exc: Exception) -> str:
    return " ".join(str(exc).split())[:160]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class FileRows:
    """The samples of one completions file from the cursor's row on, a batch of rows at a time."""

    def __init__(
        self, parquet: Any, path: Path, key: int, cursor: dict[str, Any], result: IngestResult
    ) -> None:
        import pyarrow as pa

        self.parquet, self.path, self.key, self.result = parquet, path, key, result
        self.first = int(cursor.get("row", 0))
        self.group = int(cursor.get("group", -1))  # the group of the row before `first`
        self.previous: str | None = cursor.get("prompt")  # a digest of that row's prompt
        schema = parquet.schema_arrow
        names = schema.names
        start = names.index("completion") + 1
        self.rewards: list[str] = []
        for name in names[start:]:
            if name == "advantage" or not pa.types.is_floating(schema.field(name).type):
                break
            self.rewards.append(name)
        self.extras = [
            n
            for n in names
            if n not in KNOWN and n not in self.rewards and not n.startswith("__index_level_")
        ]
        self.wall = _mtime(path) or time.time()

    def group_state(self) -> dict[str, Any]:
        return {"group": self.group, "prompt": self.previous}

    def read(self, out: list[dict[str, Any]], budget: Budget) -> int:
        """Append samples from row `first` on until the file ends or the budget is spent (after one row at
        least) or the batch holds BATCH_TEXT characters of text; returns the row after the last one
        appended. Where an earlier batch stopped in this file, its rows go on from there (KEPT)."""
        key, signature = str(self.path), _signature(self.path)
        kept = KEPT.pop(key, None)
        if kept is not None and kept.signature == signature and kept.row == self.first:
            rows = kept.rows
        else:
            rows = self.rows_from(self.first)
        row, held = self.first, 0
        try:
            for number, data, i in rows:
                if data is None:  # a row group skipped: its line
                    self.result.add_problem(f"{self.path.name}: {i}")
                    continue
                sample = self.sample(data, i, number)
                out.append(sample)
                row = number + 1
                held += len(sample["prompt"] or "") + len(sample["completion"] or "")
                if spent(budget, len(out)) or held >= BATCH_TEXT:
                    KEPT[key] = Kept(signature, row, rows)
                    while len(KEPT) > KEPT_FILES:
                        KEPT.popitem(last=False)
                    return row
        except Exception as exc:  # a damaged page: the rest of the file is one problem line
            self.result.add_problem(f"{self.path.name}: row {row}: cannot be read ({_said(exc)}); skipped")
        return self.parquet.metadata.num_rows

    def rows_from(self, first: int) -> Iterator[tuple[int, Any, Any]]:
        """(row number, its batch's columns, its place in them) for each row from `first` on; a row group over
        MAX_ROW_GROUP is (its first row, None, the problem line) instead."""
        metadata = self.parquet.metadata
        row, group_start = first, 0
        for index in range(metadata.num_row_groups):
            group_rows = metadata.row_group(index).num_rows
            if row >= group_start + group_rows:
                group_start += group_rows
                continue
            size = metadata.row_group(index).total_byte_size
            if size > MAX_ROW_GROUP:
                yield (
                    row,
                    None,
                    (
                        f"row group {index} (rows {group_start}-{group_start + group_rows - 1}) is"
                        f" {size:,} bytes uncompressed, over the limit of {MAX_ROW_GROUP:,}; skipped"
                    ),
                )
                group_start += group_rows
                row = group_start
                continue
            at = group_start
            for batch in self.parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[index]):
                if at + batch.num_rows <= row:  # before the cursor: a batch resumed elsewhere decodes these
                    at += batch.num_rows
                    continue
                data = _columns(batch)
                for i in range(row - at, batch.num_rows):
                    yield row, data, i
                    row += 1
                at += batch.num_rows
            group_start += group_rows

    def sample(self, data: dict[str, list[Any]], i: int, row: int) -> dict[str, Any]:
        prompt = data["prompt"][i]
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
        digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()
        if digest != self.previous:  # a GRPO group is a run of rows with the same prompt
            self.group += 1
            self.previous = digest
        steps = data.get("step")
        step = steps[i] if steps is not None and type(steps[i]) is int else self.key
        return {
            "step": step,
            "idx": row,
            "group_id": str(self.group),
            "prompt": chat_text(prompt),
            "completion": chat_text(data["completion"][i]),
            "rewards": {name: data[name][i] for name in self.rewards},
            "advantage": data["advantage"][i] if "advantage" in data else None,
            "extra": {name: data[name][i] for name in self.extras},
            "wall_time": self.wall,
        }


@dataclass
class Kept:
    """Where a batch stopped in a file: the iterator of its rows, so that the next batch goes on from there
    (resuming inside a row group otherwise decodes every row before the cursor again: TRL writes one row group
    a file)."""

    signature: tuple[int, int, int]  # the file's inode, size and mtime when it was opened
    row: int  # the row the iterator gives next
    rows: Iterator[tuple[int, Any, Any]]


# file path -> where the last batch stopped in it, least recently used first (each holds a batch of at most
# BATCH_ROWS decoded rows and the open file)
KEPT: OrderedDict[str, Kept] = OrderedDict()
KEPT_FILES = 4


def _signature(path: Path) -> tuple[int, int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _columns(batch: Any) -> dict[str, list[Any]]:
    """A batch's columns as Python lists, texts cut to TEXT_BYTES before they are decoded. Text that is not
    UTF-8 (a damaged page: parquet pages carry no checksum by default) is kept with U+FFFD; a column of
    messages that cannot be decoded is left out (`None`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    data: dict[str, list[Any]] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        kind = column.type
        if pa.types.is_dictionary(kind):
            column = column.dictionary_decode()
            kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            raw = pc.binary_slice(column.cast(pa.large_binary()), 0, TEXT_BYTES).to_pylist()
            data[name] = [None if v is None else v.decode("utf-8", "replace") for v in raw]
            continue
        try:
            data[name] = column.to_pylist()
        except UnicodeDecodeError:
            data[name] = [None] * len(column)
    return data
