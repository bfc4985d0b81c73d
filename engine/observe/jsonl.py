"""JSONL metric logs: one object per line, tailed by byte offset.

Three shapes: a flat object with a step (our own logs, prime-rl's `metrics.jsonl`: `{"step": N, "time": t,
"entropy/all/mean": ...}`, src/prime_rl/monitors/file.py), veRL's file logger (`{"step": N, "data": {...}}`,
verl/utils/tracking.py FileLogger), and either with nested objects, flattened with "/".

The cursor is the byte offset just after the last complete line consumed, so a line the
writer has not finished yet is read again, whole, on a later call. Reads are bounded in rows,
time and bytes, and a line longer than `MAX_LINE` is skipped without ever being held whole.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.files import kind_of, open_regular, reason
from engine.store import Store

from .keys import KeyMap
from .reader_base import (
    Budget,
    IngestResult,
    ObserveError,
    RunInfo,
    WriteCost,
    as_step,
    ensure_run,
    find_run,
    valid_vocab,
)
from .runkeys import finish_rows

CHUNK = 1 << 20  # bytes per read
MAX_BYTES = 4 << 20  # bytes per call
MAX_LINE = 1 << 20  # longer lines are malformed

STEP_FIELDS = ("step", "global_step", "train/global_step")
TIME_FIELDS = ("timestamp", "time", "wall_time")
STEP_AND_TIME = frozenset((*STEP_FIELDS, *TIME_FIELDS))
META_FIELDS = (*STEP_AND_TIME, "vocab_size")  # numeric, but not metrics
KEYS = KeyMap(jsonl=True, extra=dict.fromkeys(META_FIELDS))
INF = math.inf
MAX_DEPTH = 8  # levels of nested objects flattened into one key
MAX_NESTED = 10_000  # values inside nested objects, per line
# accepts NaN and Infinity, like json.loads (typeshed leaves out scan_once, which JSONDecoder.__init__ sets)
SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
SKIP = object()


class LineParser:
    """Turns complete lines into metric rows, counting the malformed ones as `file:line: reason`."""

    def __init__(self, file_name: str, vocab_size: int | None, now: float) -> None:
        self.file_name = file_name
        self.vocab_size = vocab_size
        self.vocab_changed = False
        self.now = now
        self.rows: list[tuple[int, str, float, float]] = []
        self.result = IngestResult()

    def bad(self, lineno: int, reason: str) -> None:
        self.result.add_problem(f"{self.file_name}:{lineno}: {reason}")

    def parse(self, lines: Sequence[str | bytes], lineno: int, budget: Budget) -> int:
        """Parse `lines` (without their newlines; `lineno` = lines before them) until the budget
        is spent; returns how many were consumed. Lines come as str when their chunk was valid
        UTF-8 (the fast path), as bytes otherwise."""
        rows = self.rows
        append = rows.append
        keys = KEYS
        scan = SCAN
        max_rows = budget.max_rows
        now = self.now
        n = 0
        for raw in lines:
            n += 1
            if len(raw) > MAX_LINE:
                self.bad(lineno + n, "line longer than 1 MiB")
                continue
            try:
                # The decoder's scanner without json.loads' wrapping: a third of the cost.
                obj, end = scan(raw, 0)
                if end != len(raw) and raw[end:].strip():
                    raise ValueError("trailing data")
            except (StopIteration, ValueError, RecursionError, TypeError):
                obj = self.load_slowly(raw, lineno + n)
                if obj is SKIP:
                    continue
            if type(obj) is not dict:
                self.bad(lineno + n, "not an object")
                continue
            data = obj
            if "data" in obj and _is_verl_line(obj):
                data = obj["data"]
                if type(data) is not dict:
                    self.bad(lineno + n, '\'data\' is not an object (veRL\'s {"step": N, "data": {...}})')
                    continue
            step = obj.get("step")
            if step is None:
                step = obj.get("global_step")
                if step is None:
                    step = obj.get("train/global_step")
                    if step is None:
                        self.bad(lineno + n, "no step")
                        continue
            if type(step) is not int or not -(2**63) < step < 2**63:
                step = as_step(step)
                if step is None:
                    self.bad(lineno + n, "step is not an integer")
                    continue
            wall = now
            if "timestamp" in obj or "time" in obj or "wall_time" in obj:
                wall = _wall_time(obj, now)
            if "vocab_size" in obj:
                self.note_vocab(obj["vocab_size"])
            before = len(rows)
            nested = None
            for key, value in data.items():
                kind = type(value)
                if kind is int:
                    if not -1e308 < value < 1e308:
                        value = INF if value > 0 else -INF
                elif kind is not float:
                    if kind is dict:
                        nested = nested or []
                        nested.append((key, value))
                    continue
                name = keys[key]
                if name is not None:
                    append((step, name, value, wall))
            if nested is not None:
                problem = self.add_nested(nested, step, wall)
                if problem is not None:
                    del rows[before:]
                    self.bad(lineno + n, problem)
                    continue
            if len(rows) == before:
                if not _has_numbers(data):
                    self.bad(lineno + n, "no numeric values")
                continue
            if len(rows) >= max_rows or ((n & 255) == 0 and budget.spent(len(rows))):
                break
        return n

    def add_nested(self, nested: list[tuple[str, Any]], step: int, wall: float) -> str | None:
        """Rows for the numbers inside a line's nested objects, keys joined with "/"; the reason when the
        line passes a bound (then it is skipped whole)."""
        leaves: list[tuple[str, Any]] = []
        for key, value in nested:
            problem = _flatten(value, key, 1, leaves)
            if problem is not None:
                return problem
        for key, value in leaves:
            kind = type(value)
            if kind is int:
                if not -1e308 < value < 1e308:
                    value = INF if value > 0 else -INF
            elif kind is not float:
                continue
            name = KEYS[key]
            if name is not None:
                self.rows.append((step, name, value, wall))
        return None

    def load_slowly(self, raw: str | bytes, lineno: int) -> Any:
        """json.loads for what the scanner refused: bytes, a BOM, blank or malformed lines."""
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                self.bad(lineno, "not UTF-8")
                return SKIP
        raw = raw.lstrip("\ufeff")
        if not raw.strip():
            return SKIP  # blank lines are skipped quietly
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            self.bad(lineno, "not JSON")
            return SKIP

    def note_vocab(self, value: Any) -> None:
        vocab = valid_vocab(value)
        if vocab is not None and vocab != self.vocab_size:
            self.vocab_size = vocab
            self.vocab_changed = True


def _wall_time(obj: dict[str, Any], now: float) -> float:
    """The line's own timestamp when it has a plausible numeric one (epoch seconds)."""
    for name in TIME_FIELDS:
        value = obj.get(name)
        if (type(value) is int or type(value) is float) and 0 < value < 1e11:
            return float(value)
    return now


def _is_verl_line(obj: dict[str, Any]) -> bool:
    """veRL's FileLogger line: a step (and maybe a time) and `data`, nothing else."""
    return all(key == "data" or key in STEP_AND_TIME for key in obj)


def _flatten(obj: dict[str, Any], prefix: str, depth: int, leaves: list[tuple[str, Any]]) -> str | None:
    """Append ("prefix/key/...", value) for every value under `obj` that is not an object itself."""
    if depth > MAX_DEPTH:
        return f"objects nested deeper than {MAX_DEPTH} levels"
    for key, value in obj.items():
        name = f"{prefix}/{key}"
        if type(value) is dict:
            problem = _flatten(value, name, depth + 1, leaves)
            if problem is not None:
                return problem
        else:
            leaves.append((name, value))
            if len(leaves) > MAX_NESTED:
                return f"more than {MAX_NESTED:,} values in nested objects"
    return None


def _has_numbers(obj: dict[str, Any]) -> bool:
    """Whether the line had a numeric value besides its step and time (a vocab size counts)."""
    return any(type(v) in (int, float) and k not in STEP_AND_TIME for k, v in obj.items())


# -- reading -----------------------------------------------------------------------------------


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    path = Path(source["path"])
    cursor = source["cursor"]
    offset, line, skipping = cursor.get("offset", 0), cursor.get("line", 0), cursor.get("skipping", False)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ObserveError(f"{path}: the file is gone (moved or rotated?)", transient=True) from None
    except OSError as exc:
        raise ObserveError(f"{path}: {reason(exc)}", transient=True) from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: reading it would block or never end
        raise ObserveError(f"{path}: {kind_of(st.st_mode)}, not a JSONL file")
    if cursor.get("inode", st.st_ino) != st.st_ino or st.st_size < offset:
        # Replaced or truncated: read it from the top; rows already stored are ignored.
        offset, line, skipping = 0, 0, False
    run = find_run(store, source["id"])
    parser = LineParser(path.name, run.vocab_size if run else None, time.time())
    follow = bool(source["follow"])
    caught_up = st.st_size == offset
    if not caught_up:
        try:
            offset, line, skipping, caught_up = _read(path, offset, line, skipping, follow, parser, budget)
        except OSError as exc:
            raise ObserveError(f"{path}: cannot read it ({exc.strerror})", transient=True) from None
    result = parser.result
    result.caught_up, result.done, result.total = caught_up, offset, max(st.st_size, offset)
    new_cursor = {"offset": offset, "line": line, "skipping": skipping, "inode": st.st_ino}
    if new_cursor == cursor:
        return result  # nothing moved: no write, so an idle source costs one stat per tick
    with WriteCost.measure(len(parser.rows)), store.transaction():
        if parser.rows or parser.vocab_changed:
            run = run or _new_run(store, source, path, parser.vocab_size)
            if parser.vocab_changed and run.vocab_size != parser.vocab_size:
                store.update_run(run.id, vocab_size=parser.vocab_size)
            rows = finish_rows(
                store,
                run.id,
                source["id"],
                parser.rows,
                vocab_size=parser.vocab_size,
                origin=KEYS.origin,
                result=result,
            )
            result.rows = store.add_metrics(run.id, rows)
            result.run_ids.append(run.id)
        store.save_source_progress(source["id"], new_cursor, rows=result.rows, bad_lines=result.bad_lines)
    return result


def _new_run(store: Store, source: dict[str, Any], path: Path, vocab_size: int | None) -> RunInfo:
    return ensure_run(store, source, source["name"] or path.stem, vocab_size=vocab_size)


def _read(
    path: Path, offset: int, line: int, skipping: bool, follow: bool, parser: LineParser, budget: Budget
) -> tuple[int, int, bool, bool]:
    """Parse lines from `offset` on; returns (offset, line, skipping, caught_up) after them."""
    pending = b""  # the start of a line whose newline has not been read yet
    read = 0
    with open_regular(path, "JSONL file", ObserveError) as f:
        f.seek(offset)
        while read < MAX_BYTES and not budget.spent(len(parser.rows)):
            chunk = f.read(CHUNK)
            if not chunk:
                break
            read += len(chunk)
            buf = pending + chunk if pending else chunk
            pending = b""
            if skipping:  # inside an over-long line: drop bytes up to its end
                nl = buf.find(b"\n")
                if nl < 0:
                    offset += len(buf)
                    continue
                offset += nl + 1
                buf = buf[nl + 1 :]
                skipping = False
            last = buf.rfind(b"\n")
            if last >= 0:
                body = buf[:last]
                try:
                    lines: list[str] | list[bytes] = body.decode("utf-8").split("\n")
                except UnicodeDecodeError:
                    lines = body.split(b"\n")  # each bad line is then reported on its own
                n = parser.parse(lines, line, budget)
                line += n
                if n < len(lines):  # the budget ran out mid-chunk; the rest is read again later
                    offset += sum(len(x) + 1 for x in body.split(b"\n")[:n])
                    return offset, line, skipping, False
                offset += last + 1
                buf = buf[last + 1 :]
            if len(buf) > MAX_LINE:
                line += 1
                parser.bad(line, "line longer than 1 MiB")
                offset += len(buf)
                skipping = True
            else:
                pending = buf
        else:
            return offset, line, skipping, False  # the byte or time box is full
    if pending and not follow:
        # A finished file may lack its last newline; a followed one may still be writing it.
        line += parser.parse([pending], line, budget)
        offset += len(pending)
    return offset, line, skipping, True
