"""Rollout dumps written as JSONL, one file per step (veRL, prime-rl) or one file for a whole run (verifiers).

A format says which files a source holds, each with the step it sorts by, and turns one JSON record into
samples. The files are read in step order; the cursor is the file being read, the bytes and lines of it
consumed, and how many samples it gave (a sample's `idx` in its step). A line the writer has not finished is
read again, whole, on a later call, unless the source is not followed or a later file exists (the writer has
moved on). The last file is followed as it grows; once a later one appears the reader moves on to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from engine.store import Store
from engine.text import loads_storable

from ..reader_base import Budget, IngestResult, ObserveError
from .rollout_base import attached_run, not_a_file, spent, write_batch

CHUNK = 1 << 20  # bytes per read
MAX_BYTES = 8 << 20  # bytes per batch (a longer line is still read whole)
MAX_LINE = 64 << 20  # an agent's episode can be long; past this a line is skipped, never held whole


class BadRecord(ValueError):
    """A record that is not a sample of its format; the message is the reason, for the problem line."""


@dataclass(frozen=True)
class DumpFormat:
    kind: str
    # (root, since) -> (folder, [(step, path in folder)]) in order, those of steps >= since at least
    files: Callable[[Path, int], tuple[Path, list[tuple[int, str]]]]
    samples: Callable[[Any, int], list[dict[str, Any]]]  # (record, the file's step) -> samples; or BadRecord
    run_name: Callable[[Path], str]  # the name of the run of its own, from the source's path


@dataclass
class Position:
    """Where reading stands in one file; the cursor, as committed with the rows."""

    key: int = -1
    file: str = ""
    offset: int = 0
    line: int = 0
    idx: int = 0
    skipping: bool = False
    inode: int = 0

    def cursor(self) -> dict[str, Any]:
        return dict(self.__dict__)


def ingest(fmt: DumpFormat, store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    root = Path(source["path"])
    run = attached_run(store, source)
    if not root.exists():
        raise ObserveError(f"{root}: no such file or directory (moved or deleted?)", transient=True)
    cursor = source["cursor"]
    pos = Position(**cursor) if cursor else Position()
    folder, listing = fmt.files(root, pos.key)
    todo = [f for f in listing if f >= (pos.key, pos.file)]
    result = IngestResult(caught_up=True, total=listing[-1][0] if listing else None)
    rows: list[dict[str, Any]] = []
    read = 0
    for n, (key, name) in enumerate(todo):
        if (key, name) != (pos.key, pos.file):
            pos = Position(key, name)
        final = not source["follow"] or n < len(todo) - 1  # a later file: this one is finished
        state, read = _read_file(fmt, folder / name, pos, final, rows, result, budget, read)
        if state != "done":
            result.caught_up = state == "eof"
            break
    result.done = max(pos.key, 0)  # progress in steps
    if pos.cursor() != cursor:
        write_batch(store, source, run, fmt.run_name(root), rows, pos.cursor(), result)
    return result


def _read_file(
    fmt: DumpFormat,
    path: Path,
    pos: Position,
    final: bool,
    rows: list[dict[str, Any]],
    result: IngestResult,
    budget: Budget,
    read: int,
) -> tuple[str, int]:
    """Read `path` from `pos` on, moving `pos` past what was consumed. Returns ("done": read to its end,
    "eof": waiting for more of it, "budget": the batch is full) and the bytes read so far in the batch."""
    refused = not_a_file(path)
    if refused:
        if pos.line != -1:  # said once: line -1 marks a file refused
            result.add_problem(f"{_where(path, 0)}: {refused}")
            pos.line = -1
        return "done", read
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if pos.inode and (st.st_ino != pos.inode or st.st_size < pos.offset):
                # Rewritten (a resumed run writes the step again): read it again; what is stored stays.
                pos.offset, pos.line, pos.idx, pos.skipping = 0, 0, 0, False
            pos.inode = st.st_ino
            for line, end, skipping in lines(f, pos.offset, pos.skipping, final):
                read += end - pos.offset
                if skipping and not pos.skipping:
                    result.add_problem(f"{_where(path, pos.line + 1)}: line longer than {MAX_LINE >> 20} MiB")
                if line is not None or not skipping:
                    pos.line += 1
                pos.offset, pos.skipping = end, skipping
                if line is not None:
                    _parse(fmt, path, pos, line, rows, result)
                if spent(budget, len(rows)) or read >= MAX_BYTES:
                    return "budget", read
    except FileNotFoundError:
        return ("done" if final else "eof"), read  # gone: nothing more will come from it
    except OSError as exc:
        raise ObserveError(f"{path}: cannot read it ({exc.strerror})", transient=True) from None
    return ("done" if final else "eof"), read


def _parse(
    fmt: DumpFormat, path: Path, pos: Position, line: bytes, rows: list[dict[str, Any]], result: IngestResult
) -> None:
    if not line.strip():
        return  # blank lines are skipped quietly
    try:
        record = loads_storable(line)  # a \ud800 escape in a prompt is kept as U+FFFD
        samples = fmt.samples(record, pos.key)
    except BadRecord as exc:
        result.add_problem(f"{_where(path, pos.line)}: {exc}")
        return
    except (ValueError, RecursionError):
        result.add_problem(f"{_where(path, pos.line)}: not JSON")
        return
    except (TypeError, AttributeError, KeyError, IndexError) as exc:  # a field of an unexpected type
        result.add_problem(f"{_where(path, pos.line)}: not a {fmt.kind} record ({type(exc).__name__})")
        return
    for sample in samples:
        sample.setdefault("step", pos.key)
        sample["idx"] = pos.idx
        pos.idx += 1
        rows.append(sample)


def _where(path: Path, line: int) -> str:
    return f"{path.parent.name}/{path.name}:{line}"


def lines(f: IO[bytes], offset: int, skipping: bool, final: bool) -> Iterator[tuple[bytes | None, int, bool]]:
    """The complete lines of `f` from `offset`, as (line without its newline, offset after it, False). A line
    longer than MAX_LINE is dropped as it is read: (None, offset reached, True) while inside it, then (None,
    offset after it, False). At the end of the file an unfinished last line is given only when `final`."""
    f.seek(offset)
    buf = bytearray()
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            break
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                offset += len(chunk)
                yield None, offset, True
                continue
            offset += nl + 1
            skipping = False
            yield None, offset, False
            chunk = chunk[nl + 1 :]
        buf += chunk
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            offset += nl + 1 - start
            yield bytes(buf[start:nl]).rstrip(b"\r"), offset, False
            start = nl + 1
        del buf[:start]
        if len(buf) > MAX_LINE:
            offset += len(buf)
            buf.clear()
            skipping = True
            yield None, offset, True
    if final and skipping:
        yield None, offset, False
    elif final and buf:
        yield bytes(buf).rstrip(b"\r"), offset + len(buf), False
