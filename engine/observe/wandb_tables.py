"""W&B Tables as rollouts: a table of samples a run logged becomes rows of that run's rollouts table.

`wandb.log({"val/generations": wandb.Table(...)})` writes the table to the run's
`files/media/table/<key>_<step>_<hash>.table.json` (`{"columns": [...], "data": [[...], ...]}`) and logs a
history value pointing at it, flat beside its key: `<key>/_type` = "table-file", `<key>/path` = the file under
`files/`, and its size and shape. wandb_run.py hands those references here while it reads the history, so a
table's samples commit with the cursor past the record that named it (followed as written, restart-safe).

Which columns are what comes from the declarative column maps of engine/observe/rollouts/columns.py (veRL's
wide validation table, TRL's completions table, any table of prompts and completions); a table of neither
shape is not samples and is left alone. A TRL table is left out where the run has TRL's parquet dump attached
(`ColumnMap.same_as`): the dump holds every sample, the table maybe only unique prompts.

Each table key of a run file gets its own range of `idx` (IDX_STRIDE), so two tables logged at one step never
share a sample's place, and a table logged again with its earlier rows (veRL logs its whole table each time)
adds only its new rows (the store ignores a (step, idx) it holds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.files import FileKindError, read_regular
from engine.text import loads_storable, visible_line

from .reader_base import IngestResult
from .rollouts.columns import Layout, match

TABLE_TYPE = "table-file"  # a media object's `_type` for a table written to a file
MAX_TABLE_BYTES = 32 << 20  # a table file larger than this is one line, not read
MAX_TABLE_KEYS = 64  # table keys of one run file that get samples; past them, one line each key
IDX_STRIDE = 1_000_000  # a table key's samples have idx from its ordinal * IDX_STRIDE
MAX_MATCH_ROWS = 200  # rows looked at to tell which columns hold numbers


@dataclass(frozen=True)
class TableRef:
    """A table a history record named: its key, its file under the run's `files/`, and when."""

    key: str
    path: str
    step: int
    wall: float


def table_refs(media: dict[str, dict[str, Any]], step: int, wall: float) -> list[TableRef]:
    """The tables among a history record's media objects (key -> {field: decoded value})."""
    return [
        TableRef(key, fields["path"], step, wall)
        for key, fields in media.items()
        if fields.get("_type") == TABLE_TYPE and isinstance(fields.get("path"), str)
    ]


def read_table(
    run_dir: Path,
    ref: TableRef,
    entry: dict[str, Any],
    left_out: set[str],
    result: IngestResult,
    where: str,
) -> list[dict[str, Any]]:
    """The samples of one table file (with `step`, `idx` and `wall_time`), [] when it holds none; one problem
    line for a file that cannot be read (for missing files, one a run file: a run folder copied without its
    media). `entry` is the run file's cursor entry: `table_keys`, its table keys in the order met, grows here.
    `left_out`: the dump kinds attached to the run, whose tables are left out."""
    path = _table_path(run_dir, ref.path)
    name = f"{where}: table {visible_line(ref.key)!r} ({visible_line(ref.path)})"
    if path is None:
        result.add_problem(f"{name}: not a file under the run's files/; not read")
        return []
    if not os.path.lexists(path):
        if entry.get("tables_missing"):
            result.bad_lines += 1  # told once per run file; still counted
        else:
            entry["tables_missing"] = True
            result.add_problem(f"{name}: no such file (the run's files/ not copied with it?); not read")
        return []
    try:
        data = read_regular(path, "table file", FileKindError, MAX_TABLE_BYTES)
    except FileKindError as exc:
        text = str(exc)
        if "larger than" in text:
            result.add_problem(f"{name}: larger than {MAX_TABLE_BYTES >> 20} MiB; not read")
        else:
            result.add_problem(f"{name}: {text.rsplit(': ', 1)[-1]}")
        return []
    try:
        table = loads_storable(data)
    except (ValueError, RecursionError):
        result.add_problem(f"{name}: not JSON")
        return []
    columns = table.get("columns") if isinstance(table, dict) else None
    rows = table.get("data") if isinstance(table, dict) else None
    if not isinstance(columns, list) or not isinstance(rows, list):
        result.add_problem(f"{name}: not a W&B table (no columns and data lists)")
        return []
    rows = [row for row in rows if isinstance(row, list)]
    layout = match(columns, rows[:MAX_MATCH_ROWS])
    if layout is None or layout.same_as in left_out:
        return []  # not samples (a table of numbers), or samples a dump of the run holds in full
    keys = entry.setdefault("table_keys", [])
    if ref.key not in keys:
        if len(keys) >= MAX_TABLE_KEYS:
            result.add_problem(f"{name}: more than {MAX_TABLE_KEYS} tables of samples in this run; not read")
            return []
        keys.append(ref.key)
    return _samples(layout, rows, keys.index(ref.key) * IDX_STRIDE, ref, result, name)


def _samples(
    layout: Layout, rows: list[list[Any]], base: int, ref: TableRef, result: IngestResult, name: str
) -> list[dict[str, Any]]:
    width = len(layout.samples_of_row)
    out: list[dict[str, Any]] = []
    for number, row in enumerate(rows):
        if (number + 1) * width > IDX_STRIDE:
            result.add_problem(f"{name}: more than {IDX_STRIDE:,} samples; the rest are not read")
            break
        try:
            samples = layout.samples(row)
        except RecursionError:
            result.add_problem(f"{name}: row {number}: nested too deeply; skipped")
            continue
        for j, sample in enumerate(samples):
            if sample["step"] is None:
                sample["step"] = ref.step
            sample["idx"] = base + number * width + j
            sample["wall_time"] = ref.wall
            sample["extra"]["table"] = ref.key
            out.append(sample)
    return out


def _table_path(run_dir: Path, relative: str) -> Path | None:
    """The table's file under `<run>/files/`, or None for a path that would leave it (absolute, `..`)."""
    if not relative or "\x00" in relative or os.path.isabs(relative):
        return None
    parts = Path(relative).parts
    if ".." in parts:
        return None
    return run_dir / "files" / relative
