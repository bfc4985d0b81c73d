"""Which format a path holds, told from its name and first bytes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from engine.files import checked_stat, kind_of, named, open_regular, read_regular, reason

from . import mlflow_store, tensorboard, trackio, trainer_state, wandb_run
from .reader_base import ObserveError

SQLITE_HEADER = b"SQLite format 3\x00"
JSONL_SUFFIXES = {".jsonl", ".ndjson", ".jsonlines"}
SNIFF_BYTES = 64 * 1024
MAX_STATE_BYTES = 256 * 1024 * 1024  # a JSON file read whole to look for log_history


def detect_kind(path: str | Path) -> str:
    """'trackio' | 'trainer_state' | 'jsonl' | 'mlflow' | 'tensorboard' | 'wandb'; ObserveError for a missing,
    unreadable or unknown path."""
    path = Path(path).expanduser()
    mode = checked_stat(path, ObserveError).st_mode  # missing, a loop: one line
    if stat.S_ISDIR(mode):
        if trainer_state.resolve(path) is not None:
            return "trainer_state"
        if detect_mlflow(path, b""):
            return "mlflow"
        tracker = tracker_kind(path)
        if tracker is not None:
            return tracker
        raise ObserveError(
            f"{named(path)}: a directory with no trainer_state.json (nor checkpoint-*/trainer_state.json),"
            " TensorBoard event files or W&B runs"
        )
    if not stat.S_ISREG(mode):  # a FIFO would block the read below for ever; a device may never end
        raise ObserveError(f"{named(path)}: {kind_of(mode)}, not a file to import")
    tracker = tracker_kind(path)
    if tracker is not None:
        return tracker
    with open_regular(path, "file to import", ObserveError) as f:
        try:
            head = f.read(SNIFF_BYTES)
        except OSError as exc:
            raise ObserveError(f"{named(path)}: {reason(exc)}") from None
    # A name that says what the file is wins over sniffing: a .jsonl file full of garbage is a
    # JSONL log with malformed lines, reported line by line.
    if path.name == trainer_state.FILE_NAME:
        return "trainer_state"
    if path.suffix.lower() in JSONL_SUFFIXES:
        return "jsonl"  # even empty: a log that is about to be written
    if detect_mlflow(path, head):
        return "mlflow"
    if head.startswith(SQLITE_HEADER):
        trackio.check(path)
        return "trackio"
    if not head.strip():
        raise ObserveError(f"{named(path)}: the file is empty, so its format cannot be told (name it .jsonl)")
    if _first_line_is_object(head):
        return "jsonl"
    if head.lstrip().startswith(b"{") and _has_log_history(path):
        return "trainer_state"
    raise ObserveError(
        f"{named(path)}: not a Trackio project database, a trainer_state.json or a JSONL metrics file"
    )


def detect_mlflow(path: Path, head: bytes) -> bool:
    """An MLflow store: an `mlruns/` directory, or an SQLite file with MLflow's tables (`mlflow.db`)."""
    if path.is_dir():
        return mlflow_store.is_mlruns_dir(path)
    return head.startswith(SQLITE_HEADER) and mlflow_store.is_mlflow_db(path)


def _first_line_is_object(head: bytes) -> bool:
    line = next((x for x in head.split(b"\n") if x.strip()), b"")
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _has_log_history(path: Path) -> bool:
    try:
        data = json.loads(read_regular(path, error=ObserveError, limit=MAX_STATE_BYTES))
    except (ObserveError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("log_history"), list)


def tracker_kind(path: Path) -> str | None:
    """'tensorboard' or 'wandb' for a tracker's own files, told by their names (no tracker library is
    imported): an event file or a tree of them; a `.wandb` file, a W&B run directory or a directory of
    them."""
    if path.is_dir():
        if wandb_run.has_runs(path):
            return "wandb"  # checked first: a W&B run directory may hold a copy of TensorBoard's files
        return "tensorboard" if tensorboard.has_event_files(path) else None
    if not path.is_file():
        return None  # a FIFO, socket or device is never taken for a tracker's file
    if tensorboard.is_event_file(path.name):
        return "tensorboard"
    return "wandb" if path.suffix == wandb_run.FILE_SUFFIX else None
