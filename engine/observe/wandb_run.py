"""W&B run files (`run-<id>.wandb`), read offline with wandb's own record reader and protobufs.

A source is a run directory (`run-*` or `offline-run-*`), its `.wandb` file, or a `wandb/` directory holding
several runs; each W&B run becomes one carl run (a resumed run's second directory joins the first: same run
id), named from its display name, else its id. From the records: history (every key, nested keys joined
with "/"; the step is transformers' `train/global_step` where its WandbCallback logged one, else `_step`;
`_timestamp` is the wall time, other `_` keys are not metrics), config (the
run's config, and |V| when a `vocab_size` appears anywhere in it), summary (kept in the config as
`summary`), the run's name, and its exit.

The file is LevelDB-log framed (32 KiB blocks) and read with wandb's DataStore, which wandb 0.30 removed
(hence the extra's pin). The cursor per file is the byte offset after the last whole record, so a record
still being written is read again, whole, later (wandb itself writes the file a block at a time); a damaged
one is one problem line, and reading goes on at the first record that starts in a later block. A file
written by a newer wandb (another log format version, or record types these protobufs do not know) is one
line naming the file and the record.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import time
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

from engine.store import Store

from .common import (
    Budget,
    IngestResult,
    ObserveError,
    WriteCost,
    as_step,
    ensure_run,
    find_run,
    valid_max_steps,
    valid_vocab,
)
from .keys import KeyMap
from .runkeys import Row, finish_rows

FILE_SUFFIX = ".wandb"
RUN_DIR_PREFIXES = ("run-", "offline-run-")
CONSOLE_FILE = "files/output.log"  # the run's console, as W&B captures it (its `console` setting)
BLOCK = 32 * 1024  # the log's block size (wandb.sdk.internal.datastore.LEVELDBLOG_BLOCK_LEN)
MAX_VALUE_JSON = 1024  # longer summary values (tables, media) are left out of the run's config
MAX_CONFIG_JSON = 64 * 1024  # a config value longer than this is left out
MAX_CONFIG_DEPTH = 6  # how deep a config is searched for `vocab_size`
MAX_NAME = 200  # characters of a display name kept as the run's name
GLOBAL_STEP_KEYS = frozenset(
    {"train/global_step", "global_step"}
)  # transformers' WandbCallback logs the first
MEDIA_TYPE = "/_type"  # wandb logs a media object's fields flat, beside its type
KEYS = KeyMap()


def is_run_file(name: str) -> bool:
    return name.startswith("run-") and name.endswith(FILE_SUFFIX)


def run_files(root: Path) -> list[Path]:
    """The `.wandb` files of a file, a run directory or a directory of run directories, in name order."""
    if root.is_file():
        return [root]
    found = _files_in(root)
    if found:
        return found
    try:
        children = sorted(root.iterdir())
    except OSError as exc:
        raise ObserveError(f"{root}: cannot read the directory ({exc.strerror})", transient=True) from None
    for child in children:  # `latest-run` is a link to one of them: links are not followed
        if child.name.startswith(RUN_DIR_PREFIXES) and child.is_dir() and not child.is_symlink():
            found.extend(_files_in(child))
    return found


def _files_in(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if is_run_file(p.name) and p.is_file())
    except OSError:
        return []


def has_runs(path: Path) -> bool:
    """A run directory, or a directory holding run directories."""
    try:
        return bool(run_files(path))
    except ObserveError:
        return False


def run_id_of(path: Path) -> str:
    """`abc123` of `run-abc123.wandb`."""
    return path.name[len("run-") : -len(FILE_SUFFIX)] or path.stem


# -- the record reader -------------------------------------------------------------------------


@functools.cache
def wandb_api() -> tuple[type, Any, str]:
    """(a read-only DataStore class, the Record message, wandb's version), or ObserveError."""
    try:
        import wandb
        from wandb.proto.wandb_internal_pb2 import Record
        from wandb.sdk.internal import datastore
    except ImportError:
        raise ObserveError(
            "reading W&B run files needs the wandb extra (wandb<0.30, which still has the record reader):"
            " pip install 'carl-tui[wandb]'"
        ) from None

    class ReadOnlyDataStore(datastore.DataStore):  # type: ignore[misc, name-defined]
        """wandb's DataStore opens a file to scan it with "r+b": this one opens it read-only."""

        def open_for_scan(self, fname: str) -> None:
            self._fname = fname
            self._fp = open(fname, "rb")  # noqa: SIM115 (closed by DataStore.close)
            self._index = 0
            self._size_bytes = os.stat(fname).st_size
            self._opened_for_scan = True
            self._read_header()

    return ReadOnlyDataStore, Record, wandb.__version__


def header_problem(path: Path, version: str) -> str:
    """Why the file's header was refused, in one line."""
    from wandb.sdk.internal import datastore

    with open(path, "rb") as f:
        head = f.read(datastore.LEVELDBLOG_HEADER_LEN)
    ident, magic, format_version = struct.unpack("<4sHB", head)
    if ident == datastore.LEVELDBLOG_HEADER_IDENT.encode() and magic == datastore.LEVELDBLOG_HEADER_MAGIC:
        return (
            f"record 0 (the file header): log format version {format_version}, but wandb {version} reads"
            f" version {datastore.LEVELDBLOG_HEADER_VERSION} (written by a newer wandb?);"
            " the file is not read"
        )
    return "record 0 (the file header): not a W&B run file; the file is not read"


# -- one run file ------------------------------------------------------------------------------

REMOVE = object()  # a config or summary key the run removed


@dataclass
class RunRead:
    """What one call read from one run file, applied to the store afterwards."""

    rows: list[Row] = field(default_factory=list)
    name: str | None = None  # the display name, from the run record
    started_at: float | None = None
    config: list[tuple[list[str], Any]] = field(default_factory=list)  # (keys, value or REMOVE) in order
    summary: dict[str, Any] = field(default_factory=dict)  # "a/b" -> its latest JSON text, or REMOVE
    exit_code: int | None = None
    wall: float | None = None  # the newest `_timestamp`

    def seen(self) -> bool:
        return bool(self.rows or self.name or self.config or self.summary or self.exit_code is not None)


class RunScan:
    """Reads the records of one run file from a cursor entry on, whole records only."""

    def __init__(self, path: Path, name: str, entry: dict[str, Any], result: IngestResult) -> None:
        self.path, self.name, self.result = path, name, result
        self.entry = dict(entry)
        self.read = RunRead()
        self.cut: str | None = None  # where a record still being written begins, when the read stopped at one

    def where(self, number: int, offset: int) -> str:
        return f"{self.name}: record {number} (byte {offset})"

    def run(self, budget: Budget, rows_before: int) -> bool:
        """Read until the end, a record still being written, or the budget; returns whether caught up."""
        store_class, record_class, version = wandb_api()
        data_store = store_class()
        try:
            data_store.open_for_scan(str(self.path))
        except FileNotFoundError:
            raise ObserveError(
                f"{self.path}: the run file is gone (moved or deleted?)", transient=True
            ) from None
        except OSError as exc:
            raise ObserveError(f"{self.path}: cannot read it ({exc.strerror})", transient=True) from None
        except AssertionError:  # fewer bytes than a header: the writer has only just created the file
            data_store.close()
            return True
        except Exception:  # noqa: BLE001 (DataStore raises a bare Exception for a header it does not read)
            data_store.close()
            self.result.add_problem(f"{self.name}: {header_problem(self.path, version)}")
            self.entry["refused"] = "header"
            return True
        try:
            size = self.path.stat().st_size  # what was written when the file was opened
            data_store.seek(max(self.entry.get("offset", 0), data_store.get_offset()))
            return self.scan(data_store, record_class.FromString, version, size, budget, rows_before)
        finally:
            data_store.close()

    def scan(
        self, data_store: Any, parse: Any, version: str, size: int, budget: Budget, rows_before: int
    ) -> bool:
        from google.protobuf.message import DecodeError

        entry, rows = self.entry, self.read.rows
        offset, records = data_store.get_offset(), entry.get("records", 0)
        while True:
            if (records & 15) == 0 and budget.spent(rows_before + len(rows)):
                entry["offset"], entry["records"] = offset, records
                return False
            try:
                data = data_store.scan_data()
            except (AssertionError, IndexError):  # DataStore's checks of framing, length and CRC
                if data_store.get_offset() >= size:
                    break  # it ran into the end of the file: a record still being written
                offset = self.skip_damage(data_store, records + 1, offset, size)
                continue
            if data is None:
                break  # the end, or a record whose last part is still to be written
            records += 1
            entry["records"] = records
            start, offset = offset, data_store.get_offset()
            entry.pop("resync", None)
            try:
                record = parse(data)
            except DecodeError:
                self.result.add_problem(f"{self.where(records, start)}: not a W&B record; skipped")
                continue
            self.take(record, version, self.where(records, start))
        entry["offset"], entry["records"] = offset, records
        if offset < size:
            self.cut = self.where(records + 1, offset)
        return True

    def skip_damage(self, data_store: Any, number: int, offset: int, size: int) -> int:
        """One line for a damaged record (none for what follows until a record reads whole again), and on at
        the first record that starts in a later block; returns where reading resumes."""
        if not self.entry.get("resync"):
            self.result.add_problem(
                f"{self.where(number, offset)}: damaged (framing or checksum); read on from the next block"
            )
            self.entry["resync"] = True
        return next_record_start(data_store, (offset // BLOCK + 1) * BLOCK, size)

    def take(self, record: Any, version: str, where: str) -> None:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            self.take_history(record.history)
        elif kind == "summary":
            self.take_summary(record.summary)
        elif kind == "config":
            self.read.config.extend(_config_updates(record.config))
        elif kind == "run":
            run = record.run
            self.read.name = run.display_name or run.run_id or None
            if run.HasField("start_time"):
                self.read.started_at = run.start_time.seconds + run.start_time.nanos / 1e9
            self.read.config.extend(_config_updates(run.config))
        elif kind == "exit":
            self.read.exit_code = record.exit.exit_code
        elif kind is None and _has_unknown_fields(record):
            if "newer" in self.entry:
                self.result.bad_lines += 1  # told once per file; still counted
            else:
                self.entry["newer"] = self.entry.get("records", 0)
                self.result.add_problem(
                    f"{where}: a record type wandb {version} does not know (written by a newer wandb?);"
                    " skipped"
                )

    def take_history(self, history: Any) -> None:
        step, wall, names, values, media = _history_values(history, self.read.wall, ())
        if media:  # a media object's numbers (a table's size, rows, columns) are not metrics: read it again
            step, wall, names, values, _ = _history_values(history, wall, tuple(f"{p}/" for p in media))
        if step is None:
            step = history.step.num
        if wall is None:
            wall = time.time()
        self.read.wall = wall
        count = len(names)  # the rows' tuples built in C: a third of the loop's time otherwise
        self.read.rows.extend(zip(repeat(step, count), names, values, repeat(wall, count), strict=True))

    def take_summary(self, summary: Any) -> None:
        """wandb updates the summary after every step: each key's latest text is kept, and decoded once."""
        latest = self.read.summary
        for item in summary.update:
            nested = item.nested_key
            latest[nested[0] if len(nested) == 1 else "/".join(nested) or item.key] = item.value_json
        for item in summary.remove:
            latest["/".join(item.nested_key) or item.key] = REMOVE


def next_record_start(data_store: Any, position: int, size: int) -> int:
    """The first position from `position` on where a record begins (a whole one or the first part of a long
    one), found with DataStore's own fragment reader: a block begins with the rest of the record that crossed
    into it, and a damaged fragment sends the search on to the next block. The store is left there."""
    from wandb.sdk.internal import datastore

    starts = (datastore.LEVELDBLOG_FULL, datastore.LEVELDBLOG_FIRST)
    while position < size:
        if BLOCK - position % BLOCK < datastore.LEVELDBLOG_HEADER_LEN:
            position += BLOCK - position % BLOCK  # the block's zero trailer
            continue
        data_store.seek(position)
        try:
            fragment = data_store.scan_record()
        except (AssertionError, IndexError):
            if data_store.get_offset() >= size:
                break  # a fragment still being written: looked at again when there is more
            position = (position // BLOCK + 1) * BLOCK
            continue
        if fragment is None or fragment[0] in starts:
            break
        position = data_store.get_offset()
    data_store.seek(position)
    return position


def _history_values(
    history: Any, wall: float | None, media: tuple[str, ...]
) -> tuple[int | None, float | None, list[str], list[float], list[str]]:
    """(the step, `_timestamp` or `wall`, metric names, their values, keys of media objects met) of one
    history record, leaving out the keys under `media`."""
    keys = KEYS
    step: int | None = None
    global_step: int | None = None
    names: list[str] = []
    values: list[float] = []
    found: list[
        str
    ] = []  # a media object (a table, an image) is logged flat: `<key>/_type`, `<key>/size`, ...
    for item in history.item:
        nested = item.nested_key
        key = nested[0] if len(nested) == 1 else "/".join(nested) or item.key  # the first: twice as fast
        if key[:1] == "_":  # wandb's own: the step, the time, the runtime, media counters
            if key == "_step":
                step = as_step(_json(item.value_json))
            elif key == "_timestamp":
                wall = _wall(_json(item.value_json), wall)
            continue
        try:
            value = float(item.value_json)  # a JSON number (or NaN, Infinity) without the JSON decoder
        except ValueError:
            if key.endswith(MEDIA_TYPE):
                found.append(key[: -len(MEDIA_TYPE)])
            continue  # strings, booleans and lists are not metrics
        if media and key.startswith(media):
            continue
        name = keys[key]
        if name is not None:
            names.append(name)
            values.append(value)
        elif key in GLOBAL_STEP_KEYS:  # the trainer's step: wandb's own `_step` counts every log call
            global_step = as_step(value)
    return step if global_step is None else global_step, wall, names, values, found


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _wall(value: Any, default: float | None) -> float | None:
    return float(value) if type(value) in (int, float) and 0 < value < 1e11 else default


def _nested(item: Any) -> list[str]:
    return list(item.nested_key) or [item.key]


def _config_updates(config: Any) -> list[tuple[list[str], Any]]:
    """A config record's changes: values (JSON decoded; `_wandb`, wandb's own, left out) and removals."""
    updates: list[tuple[list[str], Any]] = []
    for item in config.update:
        keys = _nested(item)
        if keys[0] != "_wandb" and len(item.value_json) <= MAX_CONFIG_JSON:
            updates.append((keys, _json(item.value_json)))
    updates.extend((_nested(item), REMOVE) for item in config.remove)
    return updates


def _apply_summary(summary: dict[str, Any], latest: dict[str, Any]) -> None:
    """The summary's changes, flat ("a/b"), wandb's own `_` keys left out; values longer than MAX_VALUE_JSON
    (tables, media) are left out too."""
    media = [key[: -len(MEDIA_TYPE)] for key in latest if key.endswith(MEDIA_TYPE)]
    for key, text in latest.items():
        if key.startswith("_") or any(key.startswith(f"{prefix}/") for prefix in media):
            continue
        if text is REMOVE or len(text) > MAX_VALUE_JSON:
            summary.pop(key, None)
        else:
            summary[key] = _json(text)


def _has_unknown_fields(record: Any) -> bool:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(record)) > 0


# -- ingest ------------------------------------------------------------------------------------


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    root = Path(source["path"])
    if not root.exists():
        raise ObserveError(f"{root}: the W&B run is gone (moved or deleted?)", transient=True)
    paths = run_files(root)
    old_files: dict[str, dict[str, Any]] = source["cursor"].get("files", {})
    files = dict(old_files)
    result = IngestResult(caught_up=True)
    reads: list[tuple[Path, RunRead]] = []
    row_count = 0
    for path in paths:
        name = path.name if path == root else path.relative_to(root).as_posix()
        entry = files.get(name, {})
        try:
            st = path.stat()
        except OSError:
            continue  # gone since the directory was listed: what was read stays stored
        if entry.get("inode", st.st_ino) != st.st_ino or st.st_size < entry.get("offset", 0):
            entry = {}  # replaced or truncated: read again from the top; rows already stored are ignored
        if entry.get("refused") or st.st_size <= entry.get("offset", 0):
            files[name] = entry
            continue
        scan = RunScan(path, name, {**entry, "inode": st.st_ino}, result)
        caught_up = scan.run(budget, row_count)
        files[name] = scan.entry
        if scan.cut and not source["follow"]:
            result.add_problem(
                f"{scan.cut}: cut off at the end of the file (still being written?); not read yet"
            )
        if scan.read.seen():
            reads.append((path, scan.read))
            row_count += len(scan.read.rows)
        if not caught_up:
            result.caught_up = False
            break
    result.done = sum(entry.get("offset", 0) for entry in files.values())
    result.total = max(result.done, sum(_size(path) for path in paths))
    if files == old_files:
        return result  # nothing moved: no write, so an idle source costs a stat per file per tick
    with WriteCost.measure(row_count), store.transaction():
        for path, read in reads:
            run_id = _write_run(store, source, path, read, single=len(paths) == 1, result=result)
            result.run_ids.append(run_id)
        store.save_source_progress(
            source["id"], {"files": files}, rows=result.rows, bad_lines=result.bad_lines
        )
    return result


def _write_run(
    store: Store, source: dict[str, Any], path: Path, read: RunRead, *, single: bool, result: IngestResult
) -> int:
    """Create or update the carl run of one W&B run and add its rows; inside the batch's transaction."""
    external_id = run_id_of(path)
    run = find_run(store, source["id"], external_id)
    if run is None:
        name = (read.name or external_id)[:MAX_NAME]
        if source["name"]:
            name = str(source["name"]) if single else f"{source['name']}/{name}"
        run = ensure_run(store, source, name, external_id=external_id, started_at=read.started_at)
    # The run's console: W&B writes what the script printed to files/output.log of each run directory (a
    # resumed run's second directory too); the engine scans it and the log view shows it (engine/console/).
    store.system.add_console(run.id, str(path.parent / CONSOLE_FILE), "wandb")
    facts: dict[str, Any] = {}
    vocab_size = run.vocab_size
    if read.config or read.summary:
        config = json.loads(store.run(run.id)["config"] or "{}")
        for keys, value in read.config:
            _apply(config, keys, value)
        if read.summary:
            if not isinstance(config.get("summary"), dict):
                config["summary"] = {}
            _apply_summary(config["summary"], read.summary)
        facts.update(config=config, **_run_facts(config))
        if vocab_size is None and facts.get("vocab_size"):
            vocab_size = facts["vocab_size"]
        else:
            facts.pop("vocab_size", None)  # a size given by the user (or found first) stays
    if read.exit_code is not None:
        facts.update(
            status="finished" if read.exit_code == 0 else "failed", ended_at=read.wall or time.time()
        )
    if facts:
        store.update_run(run.id, **facts)
    if read.rows:
        result.rows += store.add_metrics(
            run.id, finish_rows(store, run.id, source["id"], read.rows, vocab_size=vocab_size, result=result)
        )
    return run.id


def _apply(config: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set (or remove) a nested config key."""
    target = config
    for key in keys[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            if value is REMOVE:
                return
            child = target[key] = {}
        target = child
    if value is REMOVE:
        target.pop(keys[-1], None)
    else:
        target[keys[-1]] = value


def _run_facts(config: dict[str, Any]) -> dict[str, Any]:
    """|V|, the model and the step budget, where the config tells them (transformers logs its model config and
    training arguments into it)."""
    facts: dict[str, Any] = {}
    vocab = _find_vocab(config, MAX_CONFIG_DEPTH)
    if vocab:
        facts["vocab_size"] = vocab
    max_steps = valid_max_steps(config.get("max_steps"))
    if max_steps:
        facts["max_steps"] = max_steps
    model = config.get("_name_or_path") or config.get("model_name_or_path") or config.get("model_type")
    if isinstance(model, str) and model:
        facts["model"] = model
    return facts


def _find_vocab(value: Any, depth: int) -> int | None:
    """A valid `vocab_size` of a nested config: its own first, then its sections', in order."""
    if not isinstance(value, dict) or depth < 0:
        return None
    vocab = valid_vocab(value.get("vocab_size"))
    if vocab:
        return vocab
    for child in value.values():
        vocab = _find_vocab(child, depth - 1)
        if vocab:
            return vocab
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
