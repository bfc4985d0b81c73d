"""TensorBoard event files (`events.out.tfevents.*`): every scalar, read with tensorboard's own record reader.

A source is one event file or a directory tree of runs: each directory holding event files is one run, named
after its path relative to the root, and a run's files are read in name order (numbers as numbers). Every
scalar is read (no reservoir): `simple_value` as torch's SummaryWriter writes it, and 0-d tensors of the
scalars plugin as tf2-style writers do. Histograms (v1 `histo` of torch's and tensorboardX's `add_histogram`,
and the `histograms` plugin's tensors) are stored as histograms (observe/tracker_histograms.py); texts that
hold samples (OpenRLHF's `train/generated_samples`, tables of samples) become rollouts of the run
(rollouts/tensorboard_text.py); a text larger than MAX_TEXT_RECORD bytes is skipped with one line. Images and
other summaries are skipped and counted (`skipped` in the file's cursor), and so are the two texts
transformers' TensorBoardCallback writes first (`model_config` and `args`, as JSON): they give the run its
|V|, model and step budget.

Records are framed by our own reader (tfrecord.py): it starts at the byte offset the cursor keeps, so a
batch reads only what is new in each file, however many files are followed (no reader kept open between
batches, none re-reading a file from its top); a record over MAX_RECORD (16 MiB) is stepped over unread with
one line naming the file, its offset and size; the time budget is checked every 256 records and every 4 MiB.
A record cut off at the end of a file still being written is waited for; a damaged one (its CRC does not
match) is one problem line, and the file stops there, since its framing cannot be trusted past it. A tag's
plugin is named on its first value only: those of texts and histograms are kept in the file's cursor.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.files import kind_of, open_regular
from engine.limits import shown
from engine.store import Store
from engine.store.histograms import KEYS_CAP, HistogramRow, add_histograms
from engine.text import storable

from .keys import MAX_KEY_LENGTH, KeyMap
from .reader_base import (
    Budget,
    IngestResult,
    ObserveError,
    WriteCost,
    ensure_run,
    find_run,
    valid_max_steps,
    valid_vocab,
)
from .rollouts.rollout_base import ROW_WEIGHT, store_at_next_places
from .rollouts.tensorboard_text import tag_name, text_samples
from .runkeys import Row, finish_rows
from .tfrecord import MAX_RECORD, OVERHEAD, Oversized, Records, crc32c_api
from .tracker_histograms import HISTOGRAM_PLUGIN, from_histo, from_tensor

EVENT_MARK = "tfevents"  # tensorboard's own test of an event file's name (io_wrapper.IsSummaryEventsFile)
EMPTY_PROFILE = ".profile-empty"  # the profiler's empty marker files: named like event files, no summaries
MAX_DEPTH = 8  # directories below the root searched for runs
MAX_DIRS = 10_000  # directories visited per search
BUDGET_BYTES = 4 << 20  # bytes read between two looks at the batch's budget (and every 256 records)
SCALAR_PLUGIN = "scalars"
CONFIG_TEXTS = ("model_config/text_summary", "args/text_summary")  # SummaryWriter.add_text appends the suffix
MAX_CONFIG_TEXT = 1 << 20  # bytes of such a text parsed
MAX_MODEL_NAME = 200
TEXT_PLUGIN = "text"
MAX_TEXT_RECORD = 4 << 20  # bytes of one text summary looked at for samples; a larger one is skipped
KEYS = KeyMap()
DIGITS = re.compile(r"(\d+)")


def is_event_file(name: str) -> bool:
    return EVENT_MARK in name and not name.endswith(EMPTY_PROFILE)


def event_runs(root: Path) -> dict[str, list[Path]]:
    """Run (directory relative to `root`, "" for a single file) -> its event files in name order."""
    if root.is_file():
        return {"": [root]}
    runs: dict[str, list[Path]] = {}
    pending = [(root, 0)]
    visited = 0
    while pending and visited < MAX_DIRS:
        directory, depth = pending.pop()
        visited += 1
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError as exc:
            if directory == root:
                raise ObserveError(
                    f"{root}: cannot read the directory ({exc.strerror})", transient=True
                ) from None
            continue  # a run directory removed or closed to us: the others go on
        # A name that is not UTF-8 cannot be opened by tensorboard's reader (it decodes the path) nor kept in
        # the store: skipped, as discovery skips it with a note.
        entries = [e for e in entries if storable(e.name) == e.name]
        files = sorted((e.name for e in entries if is_event_file(e.name) and _regular(e)), key=name_order)
        if files:
            runs[directory.relative_to(root).as_posix()] = [directory / name for name in files]
        if depth < MAX_DEPTH:
            pending.extend(
                (Path(e.path), depth + 1)
                for e in entries
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            )
    return dict(sorted(runs.items()))


def name_order(name: str) -> list[Any]:
    """Name order with numbers compared as numbers: a writer's 10th file of a second (`....pid.10`) comes
    after its 9th (`....pid.9`)."""
    return [int(part) if part.isdigit() else part for part in DIGITS.split(name)]


def has_event_files(root: Path) -> bool:
    try:
        return bool(event_runs(root))
    except ObserveError:
        return False


def _regular(entry: os.DirEntry[str]) -> bool:
    """A regular file (a FIFO or socket named like an event file is never opened)."""
    try:
        return entry.is_file()
    except OSError:
        return False


# -- one event file ----------------------------------------------------------------------------


@functools.cache
def tensorboard_api() -> Any:
    """The Event message class (and the CRC-32C our framing reader needs), or ObserveError."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event

        crc32c_api()
    except ImportError:
        raise ObserveError(
            "reading TensorBoard event files needs the tensorboard extra: pip install 'carl-tui[tensorboard]'"
        ) from None
    return Event


@dataclass
class FileRead:
    """What one call read from one event file, and where it got to."""

    records: int = 0  # records of the file read so far, this call's included
    offset: int = 0  # the byte where the next record begins
    plugins: dict[str, str] = field(default_factory=dict)  # tag -> plugin of its first metadata
    rows: list[Row] = field(default_factory=list)
    state: str = "end"  # "end" (caught up), "cut" (a record still being written), "broken", "budget"
    skipped: int = 0  # summaries that are not scalars
    not_events: list[int] = field(default_factory=list)  # whole records that are not Event messages
    facts: dict[str, Any] = field(default_factory=dict)  # vocab_size, model, max_steps from config texts
    parent_rows: list[Row] = field(default_factory=list)  # an add_scalars sub-run's rows, for its parent
    samples: list[dict[str, Any]] = field(default_factory=list)  # rollouts from texts that hold samples
    histograms: list[HistogramRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "record N: ...", one line each

    def weight(self) -> int:
        """What the batch's budget counts: a rollout as ROW_WEIGHT rows, a histogram as one."""
        return len(self.rows) + len(self.parent_rows) + len(self.samples) * ROW_WEIGHT + len(self.histograms)

    def kept_plugins(self) -> dict[str, str]:
        """The plugins the cursor keeps: every tag's but the scalars' (a tag without one is a scalar)."""
        return {tag: plugin for tag, plugin in self.plugins.items() if plugin != SCALAR_PLUGIN}


def read_events(
    path: Path,
    entry: dict[str, Any],
    size: int,
    budget: Budget,
    rows_before: int,
    channel: str | None = None,
) -> FileRead:
    """Read the records of `path` from its cursor `entry` on, up to `size` bytes, until the file ends, a
    record is cut off or damaged, or the budget is spent (looked at after a record, every 256 records and
    every BUDGET_BYTES: every call reads at least one).

    `channel`: the folder name of a run inside another run's folder, which may be an `add_scalars` sub-run
    (`sub_run_key`): its values go to `parent_rows` under the parent's key for them.
    """
    parse = event_parser()
    read = FileRead(
        records=entry.get("records", 0), offset=entry.get("bytes", 0), plugins=dict(entry.get("plugins", {}))
    )
    with open_regular(path, "event file", ObserveError) as f:
        records = Records(f, read.offset, size)
        unchecked = 0  # bytes read since the budget was looked at
        try:
            for offset, record in records:
                read.records += 1
                read.offset = records.offset
                if isinstance(record, Oversized):
                    read.problems.append(
                        f"record {read.records} (byte {offset}): {record.length + OVERHEAD:,} bytes, over the"
                        f" limit of {MAX_RECORD:,}; skipped unread"
                    )
                    continue
                take_event(parse(record), read, channel)
                unchecked += len(record) + OVERHEAD
                if (read.records & 255) == 0 or unchecked >= BUDGET_BYTES:
                    unchecked = 0
                    if budget.spent(rows_before + read.weight()):
                        read.state = "budget"
                        return read
        except OSError as exc:
            raise ObserveError(f"{path}: cannot read it ({exc.strerror})", transient=True) from None
    read.state = {"end": "end", "cut": "cut", "damaged": "broken"}[records.stopped]
    return read


def event_parser() -> Any:
    """A function from a record's bytes to its Event, or None when the record is not one."""
    from google.protobuf.message import DecodeError

    from_string = tensorboard_api().FromString

    def parse(record: bytes) -> Any:
        try:
            return from_string(record)
        except DecodeError:  # whole and checksummed, yet not an Event (a tag that is not UTF-8, say)
            return None

    return parse


def take_event(event: Any, read: FileRead, channel: str | None) -> None:
    """The scalars, histograms, samples and config facts of one record's event (None: not an Event)."""
    if event is None:
        read.not_events.append(read.records)
        return
    values = event.summary.value
    if not values:
        return  # the file version, a graph, a session log: no summaries
    plugins, keys, record = read.plugins, KEYS, read.records
    step, wall = event.step, event.wall_time
    for value in values:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            number: float | None = value.simple_value
        elif kind == "tensor" or kind is None:
            number = tensor_scalar(value, plugins)
            if number is None:
                if value.tag in CONFIG_TEXTS:
                    read.facts.update(config_facts(value))
                    read.skipped += 1
                elif not other_tensor(value, plugins.get(value.tag), step, wall, read, record):
                    read.skipped += 1
                continue
        else:  # a histogram, image or audio summary of the v1 kind
            if not (
                kind == "histo"
                and add_histogram(value.tag, from_histo(value.histo), step, wall, read, record)
            ):
                read.skipped += 1
            continue
        if channel is not None:
            sub_key = sub_run_key(channel, value.tag)
            if sub_key is not None:
                read.parent_rows.append((step, sub_key, number, wall))
                continue
        name = keys[value.tag]
        if name is not None:
            read.rows.append((step, name, number, wall))


def sub_run_key(folder: str, tag: str) -> str | None:
    """The parent run's key for a value of an `add_scalars` sub-run, else None; `folder` is the sub-run's
    folder relative to its parent run's.

    `SummaryWriter.add_scalars(main_tag, {name: value})` writes each value with the tag `main_tag` into a
    writer of its own, in a folder of its own: torch (torch/utils/tensorboard/writer.py)
    `<logdir>/<main_tag with "/" as "_">_<name>`, tensorboardX 2.6 (tensorboardX/writer.py)
    `<logdir>/<main_tag>/<name>`. Either is the parent's series `main_tag/name`, kept as written (no
    `reward_` channel alias: `reward_parts/format` is a part of a reward, not a reward function); only
    transformers' `train/` prefix goes, as for every key."""
    if folder.startswith(tag + "/") and len(folder) > len(tag) + 1:
        key = folder  # tensorboardX
    else:
        prefix = tag.replace("/", "_") + "_"
        if "/" in folder or not folder.startswith(prefix) or len(folder) == len(prefix):
            return None
        key = f"{tag}/{folder[len(prefix) :]}"  # torch
    key = storable(key)
    key = key[6:] if key.startswith("train/") else key
    return key if 0 < len(key) <= MAX_KEY_LENGTH else None


def tensor_scalar(value: Any, plugins: dict[str, str]) -> float | None:
    """The number a 0-d numeric tensor of the scalars plugin holds, else None.

    Writers put a tag's metadata on its first value only, so the plugin is remembered per tag.
    """
    tag = value.tag
    if value.HasField("metadata") and tag not in plugins and len(plugins) < KEYS.LIMIT:
        plugins[tag] = value.metadata.plugin_data.plugin_name
    if plugins.get(tag, SCALAR_PLUGIN) != SCALAR_PLUGIN or not value.HasField("tensor"):
        return None
    tensor = value.tensor
    if tensor.tensor_shape.dim:
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(tensor)
    except (TypeError, ValueError, KeyError):  # KeyError: a dtype enum tensorboard's stub does not know
        return None
    return float(array) if array.dtype.kind in "fiu" else None


def other_tensor(value: Any, plugin: str | None, step: int, wall: float, read: FileRead, record: int) -> bool:
    """A tensor that is no scalar: a text that may hold samples, or a histogram of the `histograms` plugin.
    Returns whether it was taken (False: skipped, and counted as such)."""
    if plugin == HISTOGRAM_PLUGIN:
        return add_histogram(value.tag, from_tensor(value.tensor), step, wall, read, record)
    if plugin == TEXT_PLUGIN:
        texts = value.tensor.string_val
        size = sum(len(text) for text in texts)
        if size > MAX_TEXT_RECORD:
            read.problems.append(
                f"record {record}: text {shown(tag_name(value.tag))} at step {step} is {size:,} bytes,"
                f" over the limit of {MAX_TEXT_RECORD:,}; skipped"
            )
            return False
        samples = text_samples(value.tag, text_cells(value.tensor))
        for sample in samples or ():
            sample.setdefault("step", step)
            sample["wall_time"] = wall
            read.samples.append(sample)
        return samples is not None
    return False


def text_cells(tensor: Any) -> list[list[str]]:
    """A string tensor as rows of text: a 2-D one row by row, a single text as one cell, else nothing."""
    texts = [raw.decode("utf-8", "replace") for raw in tensor.string_val]
    dims = [d.size for d in tensor.tensor_shape.dim]
    if len(dims) == 2 and dims[0] > 0 and dims[1] > 0 and dims[0] * dims[1] == len(texts):
        return [texts[row * dims[1] : (row + 1) * dims[1]] for row in range(dims[0])]
    return [[texts[0]]] if len(texts) == 1 else []


def add_histogram(tag: str, histogram: Any, step: int, wall: float, read: FileRead, record: int) -> bool:
    """Take a histogram summary; False (and a problem line when it is no usable histogram) when it is not."""
    name = KEYS[tag]
    if name is None:
        return False
    if histogram is None:
        read.problems.append(
            f"record {record}: {shown(tag)} at step {step} is not a usable histogram; skipped"
        )
        return False
    read.histograms.append((step, name, histogram, wall))
    return True


def config_facts(value: Any) -> dict[str, Any]:
    """|V|, the model and the step budget from a config that transformers' TensorBoardCallback wrote as text
    (`model_config`: the model's config.json; `args`: the TrainingArguments), when they are there."""
    texts = value.tensor.string_val
    if len(texts) != 1 or len(texts[0]) > MAX_CONFIG_TEXT:
        return {}
    try:
        config = json.loads(texts[0])
    except (ValueError, RecursionError):
        return {}
    if not isinstance(config, dict):
        return {}
    facts: dict[str, Any] = {}
    vocab = valid_vocab(config.get("vocab_size"))
    if vocab:
        facts["vocab_size"] = vocab
    max_steps = valid_max_steps(config.get("max_steps"))
    if max_steps:
        facts["max_steps"] = max_steps
    model = config.get("_name_or_path")
    if isinstance(model, str) and model:
        facts["model"] = model[:MAX_MODEL_NAME]
    return facts


# -- ingest ------------------------------------------------------------------------------------


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    root = Path(source["path"])
    if not root.exists():
        raise ObserveError(f"{root}: the event file or directory is gone (moved or deleted?)", transient=True)
    runs = event_runs(root)
    old_files: dict[str, dict[str, Any]] = source["cursor"].get("files", {})
    batch = EventBatch(source, budget, old_files)
    for run_dir, paths in runs.items():
        parent = parent_run(run_dir, runs)
        for path in paths:
            name = path.name if run_dir == "" else path.relative_to(root).as_posix()
            if not batch.read_file(path, name, run_dir, parent):
                break
        if not batch.result.caught_up:
            break
    result, files = batch.result, batch.files
    result.done = sum(entry.get("bytes", 0) for entry in files.values())
    result.total = max(_total_bytes(runs), result.done)
    if files == old_files:
        return result  # nothing moved: no write, so an idle source costs a directory walk per tick
    with WriteCost.measure(batch.row_count), store.transaction():
        for run_dir in {**batch.rows, **batch.facts, **batch.samples, **batch.histograms}:
            run = find_run(store, source["id"], run_dir) or ensure_run(
                store, source, _run_name(source, root, run_dir, len(runs)), external_id=run_dir
            )
            vocab_size = run.vocab_size
            facts = batch.facts.get(run_dir, {})
            if vocab_size is not None:
                facts.pop("vocab_size", None)  # a size given by the user (or found first) stays
            if facts:
                store.update_run(run.id, **facts)
                vocab_size = vocab_size or facts.get("vocab_size")
            rows = batch.rows.get(run_dir, [])
            result.rows += store.add_metrics(
                run.id, finish_rows(store, run.id, source["id"], rows, vocab_size=vocab_size, result=result)
            )
            result.rows += store_at_next_places(store, run.id, batch.samples.get(run_dir, []))
            added, refused = add_histograms(store, run.id, batch.histograms.get(run_dir, []))
            result.rows += added
            for key in refused:
                result.add_problem(f"histogram {shown(key)}: the run has {KEYS_CAP} histogram keys already")
            result.run_ids.append(run.id)
        store.save_source_progress(
            source["id"], {"files": files}, rows=result.rows, bad_lines=result.bad_lines
        )
    return result


class EventBatch:
    """One call's reading of a source's event files: the rows by run, the files' new cursor entries."""

    def __init__(self, source: dict[str, Any], budget: Budget, files: dict[str, dict[str, Any]]) -> None:
        self.source_id, self.follow, self.budget = source["id"], bool(source["follow"]), budget
        self.files = dict(files)
        self.result = IngestResult(caught_up=True)
        self.rows: dict[str, list[Row]] = {}  # by run directory
        self.facts: dict[str, dict[str, Any]] = {}  # by run directory: what its config texts tell
        self.samples: dict[str, list[dict[str, Any]]] = {}  # by run directory: rollouts from its texts
        self.histograms: dict[str, list[HistogramRow]] = {}
        self.row_count = 0  # what the budget counts (FileRead.weight)

    def read_file(self, path: Path, name: str, run_dir: str, parent: str | None = None) -> bool:
        """Read what is new in one file; False when the batch is full. `parent`: the run whose folder holds
        this run's, whose series an `add_scalars` sub-run's values are (`sub_run_key`)."""
        entry = self.files.get(name, {})
        try:
            st = os.stat(path)
        except OSError:
            return True  # gone between the directory walk and now: what was read stays stored
        if not stat.S_ISREG(st.st_mode):  # a FIFO given as the source, or put in a file's place: never opened
            self.result.add_problem(f"{name or path.name}: {kind_of(st.st_mode)}, not an event file")
            return True
        if entry.get("inode", st.st_ino) != st.st_ino or st.st_size < entry.get("bytes", 0):
            entry = {}  # replaced or truncated: read it again from the top; rows already stored are ignored
        self.files[name] = entry
        if entry.get("broken") or st.st_size == entry.get("bytes", 0):
            return True
        channel = None if parent is None else run_dir if parent == "." else run_dir[len(parent) + 1 :]
        read = read_events(path, entry, st.st_size, self.budget, self.row_count, channel)
        if read.rows:
            self.rows.setdefault(run_dir, []).extend(read.rows)
        if read.parent_rows and parent is not None:
            self.rows.setdefault(parent, []).extend(read.parent_rows)
        if read.samples:
            self.samples.setdefault(run_dir, []).extend(read.samples)
        if read.histograms:
            self.histograms.setdefault(run_dir, []).extend(read.histograms)
        self.row_count += read.weight()
        if read.facts:
            self.facts.setdefault(run_dir, {}).update(read.facts)
        self.files[name] = self.new_entry(name, entry, st.st_ino, read)
        if read.state == "budget":
            self.result.caught_up = False
            return False
        return True

    def new_entry(self, name: str, entry: dict[str, Any], inode: int, read: FileRead) -> dict[str, Any]:
        new: dict[str, Any] = {
            "inode": inode,
            "records": read.records,
            "bytes": read.offset,
            "skipped": entry.get("skipped", 0) + read.skipped,
        }
        if plugins := read.kept_plugins():
            new["plugins"] = plugins
        for number in read.not_events:
            self.result.add_problem(f"{name}: record {number}: not a TensorBoard event; skipped")
        for problem in read.problems:
            self.result.add_problem(f"{name}: {problem}")
        where = f"{name}: record {read.records + 1} (byte {read.offset})"
        if read.state == "broken":
            self.result.add_problem(
                f"{where}: failed its CRC check (damaged); the rest of the file is not read"
            )
            new["broken"] = read.records + 1
        elif read.state == "cut" and not self.follow:
            self.result.add_problem(
                f"{where}: cut off at the end of the file (still being written?); not read yet"
            )
        return new


def parent_run(run_dir: str, runs: dict[str, list[Path]]) -> str | None:
    """The nearest run whose folder holds this run's folder (its writer made it: `add_scalars`), or None."""
    if run_dir in ("", "."):
        return None
    folder = run_dir
    while folder:
        folder = posixpath.dirname(folder)
        parent = folder or "."
        if parent in runs:
            return parent
    return None


def _run_name(source: dict[str, Any], root: Path, run_dir: str, run_count: int) -> str:
    """The source's name for a single run, else the run's directory relative to the root."""
    default = root.parent.name if run_dir == "" else root.name if run_dir == "." else run_dir
    if source["name"] and (run_count == 1 or run_dir in ("", ".")):
        return str(source["name"])
    if source["name"]:
        return f"{source['name']}/{run_dir}"
    return default or root.name


def _total_bytes(runs: dict[str, list[Path]]) -> int:
    total = 0
    for paths in runs.values():
        for path in paths:
            with contextlib.suppress(OSError):
                total += path.stat().st_size
    return total
