"""W&B run files (`run-<id>.wandb`) of any wandb from 0.19 on, read offline: our reader of the framing
(wandb_log.py) over the record protobufs of whatever wandb is installed.

A source is a run directory (`run-*` or `offline-run-*`), its `.wandb` file, or a `wandb/` directory holding
several runs; each W&B run becomes one carl run (a resumed run's second directory joins the first: same run
id), named from its display name, else its id. From the records: history (every key, nested keys joined
with "/"; the step is transformers' `train/global_step` where its WandbCallback logged one, else `_step`;
`_timestamp` is the wall time, other `_` keys are not metrics), config (the
run's config, and |V| when a `vocab_size` appears anywhere in it), summary (kept in the config as
`summary`), the run's name, and its exit; tables of samples a history value points to become the run's
rollouts (wandb_tables.py), and output records its console where wandb wrote no output.log
(wandb_console.py).

wandb 0.30 removed its Python reader of the framing (and the extra's old `<0.30` pin with it): the protobufs
still ship (`wandb.proto.wandb_internal_pb2.Record`, which picks the v5/v6/v7 module for the installed
protobuf), and wandb 0.31 ships no local reader to prefer (`reader_note` says what is used). The cursor per
file is the byte offset after the last whole record, so a record still being written is read again, whole,
later (wandb itself writes the file a block at a time); a damaged one is one problem line, and reading goes on
at the first record that starts in a later block. A file of another log format version, or record types the
installed protobufs do not know (a newer writer), is one line naming the file and the record.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

from engine.files import open_regular
from engine.limits import shown
from engine.store import Store
from engine.store.histograms import KEYS_CAP, HistogramRow, add_histograms
from engine.store.source_links import attached_kinds

from . import wandb_console, wandb_tables
from .keys import KeyMap
from .reader_base import (
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
from .rollouts.rollout_base import ROW_WEIGHT
from .runkeys import Row, finish_rows
from .tracker_histograms import JSON_TYPES as HISTOGRAM_TYPES
from .tracker_histograms import from_json as histogram_of
from .wandb_log import HEADER_LEN, Damaged, Oversized, RecordLog, header_problem

FILE_SUFFIX = ".wandb"
RUN_DIR_PREFIXES = ("run-", "offline-run-")
MAX_RECORD_MIB = 16  # wandb_log.MAX_RECORD, for the problem line
MAX_VALUE_JSON = 1024  # longer summary values (tables, media) are left out of the run's config
MAX_CONFIG_JSON = 64 * 1024  # a config value longer than this is left out
MAX_CONFIG_DEPTH = 6  # how deep a config is searched for `vocab_size`
MAX_NAME = 200  # characters of a display name kept as the run's name
GLOBAL_STEP_KEYS = frozenset(
    {"train/global_step", "global_step"}
)  # transformers' WandbCallback logs the first
MEDIA_TYPE = "/_type"  # wandb logs a media object's fields flat, beside its type
MEDIA_FIELDS = frozenset({"_type", "path"})  # a media object's fields kept (a table's file)
# A `wandb.Histogram` is logged flat too: `<key>/_type` "histogram", `<key>/values` (n counts), `<key>/bins`
# (n + 1 edges; 512 buckets at most by default, a few kB of JSON). Longer lists are no histogram wandb writes.
HISTOGRAM_FIELDS = frozenset({"values", "bins", "packedBins"})
MAX_HISTOGRAM_JSON = 2 << 20
LOCAL_READERS = (("wandb.beta", "LocalApi"), ("wandb", "LocalApi"))  # where a local reader would ship
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
def wandb_api() -> tuple[Any, str]:
    """(the Record message of the installed wandb, wandb's version), or ObserveError."""
    try:  # wandb star-imports the generated module of the installed protobuf: mypy cannot see its Record
        import wandb
        from wandb.proto.wandb_internal_pb2 import Record  # type: ignore[attr-defined]
    except ImportError as exc:
        why = "" if getattr(exc, "name", None) == "wandb" else f" ({' '.join(str(exc).split())[:160]})"
        raise ObserveError(
            "reading W&B run files needs wandb's record protobufs (any wandb from 0.19, the wandb extra):"
            f" pip install 'carl-tui[wandb]'{why}"
        ) from None
    return Record, str(getattr(wandb, "__version__", "?"))


def shipped_local_reader() -> str | None:
    """The local reader API the installed wandb ships (`wandb.beta.LocalApi` was proposed in wandb PR
    #12745), or None; wandb 0.31 ships none."""
    import importlib

    for module, name in LOCAL_READERS:
        try:
            if hasattr(importlib.import_module(module), name):
                return f"{module}.{name}"
        except ImportError:
            continue
    return None


def reader_note() -> str:
    """Which reader reads W&B run files here, for `carl observe`'s output."""
    try:
        _, version = wandb_api()
    except ObserveError as exc:
        return str(exc)
    note = f"read by carl's framing reader over wandb {version}'s record protobufs"
    shipped = shipped_local_reader()
    if shipped:
        return f"{note} (wandb {version} ships {shipped}, whose API this carl does not know yet)"
    return f"{note} (wandb {version} ships no local reader)"


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
    rollouts: list[dict[str, Any]] = field(default_factory=list)  # samples of the tables it logged
    console: list[str] = field(default_factory=list)  # the text of its output records
    histograms: list[HistogramRow] = field(default_factory=list)  # its `wandb.Histogram` values

    def seen(self) -> bool:
        return bool(
            self.rows
            or self.name
            or self.config
            or self.summary
            or self.exit_code is not None
            or self.rollouts
            or self.console
            or self.histograms
        )

    def weight(self) -> int:
        """What the batch's time box counts: a metric row 1, a sample ROW_WEIGHT, a histogram 1."""
        return len(self.rows) + ROW_WEIGHT * len(self.rollouts) + len(self.histograms)


class RunScan:
    """Reads the records of one run file from a cursor entry on, whole records only."""

    def __init__(
        self, path: Path, name: str, entry: dict[str, Any], result: IngestResult, left_out: set[str]
    ) -> None:
        self.path, self.name, self.result = path, name, result
        self.entry = dict(entry)
        self.left_out = left_out  # dump kinds attached to the run: their tables are left out
        self.read = RunRead()
        self.cut: str | None = None  # where a record still being written begins, when the read stopped at one

    def where(self, number: int, offset: int) -> str:
        return f"{self.name}: record {number} (byte {offset})"

    def run(self, budget: Budget, rows_before: int) -> bool:
        """Read until the end, a record still being written, or the budget; returns whether caught up."""
        record_class, version = wandb_api()
        if not self.path.exists():
            raise ObserveError(f"{self.path}: the run file is gone (moved or deleted?)", transient=True)
        with open_regular(self.path, "W&B run file", ObserveError) as f:
            try:
                size = os.fstat(f.fileno()).st_size  # what was written when the file was opened
                if self.entry.get("offset", 0) < HEADER_LEN:
                    head = f.read(HEADER_LEN)
                    if len(head) < HEADER_LEN:
                        return True  # the writer has only just created the file
                    problem = header_problem(head)
                    if problem:
                        self.result.add_problem(
                            f"{self.name}: record 0 (the file header): {problem}; not read"
                        )
                        self.entry["refused"] = "header"
                        return True
                return self.scan(f, size, record_class.FromString, version, budget, rows_before)
            except OSError as exc:
                raise ObserveError(f"{self.path}: cannot read it ({exc.strerror})", transient=True) from None

    def scan(self, f: Any, size: int, parse: Any, version: str, budget: Budget, rows_before: int) -> bool:
        from google.protobuf.message import DecodeError

        entry, read = self.entry, self.read
        skip = entry.get("skip")
        log = RecordLog(
            f,
            size,
            entry.get("offset", 0),
            resync=bool(entry.get("resync")),
            skip=(int(skip[0]), int(skip[1])) if skip else None,
            deadline=budget.deadline,
        )
        records = entry.get("records", 0)
        caught_up = True
        for start, item in log:
            if type(item) is bytes:  # a record
                records += 1
                try:
                    record = parse(item)
                except DecodeError:
                    self.result.add_problem(f"{self.where(records, start)}: not a W&B record; skipped")
                    continue
                tables = len(read.rollouts)
                self.take(record, version, records, start)
                if ((records & 15) == 0 or len(read.rollouts) != tables) and budget.spent(
                    rows_before + read.weight()
                ):
                    caught_up = False
                    break
            elif isinstance(item, Damaged):
                self.result.add_problem(
                    f"{self.where(records + 1, start)}: damaged ({item.reason}); read on from the next block"
                )
            elif isinstance(item, Oversized):
                records += 1
                self.result.add_problem(
                    f"{self.where(records, start)}: {item.size:,} bytes, longer than {MAX_RECORD_MIB} MiB;"
                    " skipped unread"
                )
        entry["offset"], entry["records"] = log.offset, records
        for key, value in (("resync", log.resync), ("skip", list(log.skip) if log.skip else None)):
            if value:
                entry[key] = value
            else:
                entry.pop(key, None)
        if log.stopped == "deadline":
            return False
        if caught_up and log.stopped == "partial":
            self.cut = self.where(records + 1, log.offset)
        return caught_up

    def take(self, record: Any, version: str, number: int, offset: int) -> None:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            self.take_history(record.history, number, offset)
        elif kind == "summary":
            self.take_summary(record.summary)
        elif kind == "output_raw" or (kind == "output" and not self.entry.get("raw_output")):
            if kind == "output_raw":
                self.entry["raw_output"] = True
            if self.entry.get("console") != "file":
                self.read.console.append(getattr(record, kind).line)
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
                self.entry["newer"] = number
                self.result.add_problem(
                    f"{self.where(number, offset)}: a record type wandb {version} does not know (written by a"
                    " newer wandb?); skipped"
                )

    def take_history(self, history: Any, number: int, offset: int) -> None:
        step, wall, names, values, media = _history_values(history, self.read.wall, ())
        fields: dict[str, dict[str, Any]] = {}
        if media:  # a media object's numbers (a table's size, rows, columns) are not metrics: read it again
            step, wall, names, values, _ = _history_values(history, wall, tuple(f"{p}/" for p in media))
            fields = _media_fields(history, media)
        if step is None:
            step = history.step.num
        if wall is None:
            wall = time.time()
        self.read.wall = wall
        count = len(names)  # the rows' tuples built in C: a third of the loop's time otherwise
        self.read.rows.extend(zip(repeat(step, count), names, values, repeat(wall, count), strict=True))
        for ref in wandb_tables.table_refs(fields, step, wall):
            self.read.rollouts.extend(
                wandb_tables.read_table(
                    self.path.parent, ref, self.entry, self.left_out, self.result, self.where(number, offset)
                )
            )
        for key, media_fields in fields.items():
            if media_fields.get("_type") in HISTOGRAM_TYPES and (name := KEYS[key]) is not None:
                histogram = histogram_of(media_fields)
                if histogram is None:
                    self.result.add_problem(
                        f"{self.where(number, offset)}: {shown(key)} at step {step} is not a usable"
                        " histogram; skipped"
                    )
                else:
                    self.read.histograms.append((step, name, histogram, wall))

    def take_summary(self, summary: Any) -> None:
        """wandb updates the summary after every step: each key's latest text is kept, and decoded once."""
        latest = self.read.summary
        for item in summary.update:
            nested = item.nested_key
            latest[nested[0] if len(nested) == 1 else "/".join(nested) or item.key] = item.value_json
        for item in summary.remove:
            latest["/".join(item.nested_key) or item.key] = REMOVE


def _media_fields(history: Any, media: list[str]) -> dict[str, dict[str, Any]]:
    """The `_type` and `path` of each media object of a history record, and a histogram's buckets (key ->
    {field: value})."""
    prefixes = {f"{key}/": key for key in media}
    out: dict[str, dict[str, Any]] = {}
    for item in history.item:
        nested = item.nested_key
        key = nested[0] if len(nested) == 1 else "/".join(nested) or item.key
        head, _, last = key.rpartition("/")
        if f"{head}/" not in prefixes:
            continue
        size = len(item.value_json)
        if (last in MEDIA_FIELDS and size <= MAX_VALUE_JSON) or (
            last in HISTOGRAM_FIELDS and size <= MAX_HISTOGRAM_JSON
        ):
            out.setdefault(head, {})[last] = _json(item.value_json)
    return out


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
    reads: list[tuple[Path, RunRead, str]] = []
    row_count = 0
    left_out = attached_kinds(store, source["id"])
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
        scan = RunScan(path, name, {**entry, "inode": st.st_ino}, result, left_out)
        caught_up = scan.run(budget, row_count)
        files[name] = scan.entry
        if scan.cut and not source["follow"]:
            result.add_problem(
                f"{scan.cut}: cut off at the end of the file (still being written?); not read yet"
            )
        if scan.read.seen():
            reads.append((path, scan.read, name))
            row_count += scan.read.weight()
        if not caught_up:
            result.caught_up = False
            break
    result.done = sum(entry.get("offset", 0) for entry in files.values())
    result.total = max(result.done, sum(_size(path) for path in paths))
    if files == old_files:
        return result  # nothing moved: no write, so an idle source costs a stat per file per tick
    with WriteCost.measure(row_count), store.transaction():
        for path, read, name in reads:
            run_id = _write_run(store, source, path, read, files[name], single=len(paths) == 1, result=result)
            if run_id not in result.run_ids:
                result.run_ids.append(run_id)
        store.save_source_progress(
            source["id"], {"files": files}, rows=result.rows, bad_lines=result.bad_lines
        )
    return result


def _write_run(
    store: Store,
    source: dict[str, Any],
    path: Path,
    read: RunRead,
    entry: dict[str, Any],
    *,
    single: bool,
    result: IngestResult,
) -> int:
    """Create or update the carl run of one W&B run and add its rows, samples and console; inside the batch's
    transaction, which commits `entry` (the run file's cursor entry) with them."""
    external_id = run_id_of(path)
    run = find_run(store, source["id"], external_id)
    if run is None:
        name = (read.name or external_id)[:MAX_NAME]
        if source["name"]:
            name = str(source["name"]) if single else f"{source['name']}/{name}"
        run = ensure_run(store, source, name, external_id=external_id, started_at=read.started_at)
    # The run's console (each run directory's: a resumed run's second one too); the engine scans it and the
    # log view shows it (engine/console/).
    wandb_console.register(store, run.id, source["id"], path, external_id, read.console, entry, result)
    facts: dict[str, Any] = {}
    vocab_size = run.vocab_size
    if read.config or read.summary:
        config = json.loads((store.run(run.id) or {}).get("config") or "{}")
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
    if read.rollouts:
        store.add_rollouts(run.id, read.rollouts)  # a (step, idx) already stored is ignored
    if read.histograms:
        added, refused = add_histograms(store, run.id, read.histograms)
        result.rows += added
        for key in refused:
            result.add_problem(
                f"histogram {shown(key)}: the run has {KEYS_CAP} histogram keys already; skipped"
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
