"""transformers/TRL `trainer_state.json`: the file, a checkpoint dir, or an output dir.

transformers rewrites the file wholesale at each save, and a training run writes a new
`checkpoint-<step>/` each time, so the cursor is the number of `log_history` entries imported
plus the identity (path, mtime, size) of the file they came from: an unchanged file costs one
stat, a changed one is read again and only its new entries are imported.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from engine.files import read_regular
from engine.store import Store

from .keys import KeyMap
from .reader_base import (
    Budget,
    IngestResult,
    ObserveError,
    WriteCost,
    as_step,
    ensure_run,
    find_run,
    number,
    valid_max_steps,
    valid_vocab,
)
from .runkeys import finish_rows

FILE_NAME = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
MAX_CONFIG_BYTES = 4 << 20  # a model's config.json is a few KiB
KEYS = KeyMap()


def resolve(path: Path) -> Path | None:
    """The trainer_state.json that `path` stands for, or None when there is none (yet).

    In an output dir the top-level file (written by `save_state`) wins unless the newest
    checkpoint's file is more recent, as when a run resumes into an old output dir.
    """
    if path.is_file():
        return path
    top = path / FILE_NAME
    candidates = [p for p in (top, newest_checkpoint(path)) if p is not None and p.is_file()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (p.stat().st_mtime_ns, p == top))


def newest_checkpoint(output_dir: Path) -> Path | None:
    best: tuple[int, Path] | None = None
    try:
        entries = list(os.scandir(output_dir))
    except OSError:
        return None
    for entry in entries:
        match = CHECKPOINT.match(entry.name)
        if match and (best is None or int(match[1]) > best[0]):
            state = Path(entry.path) / FILE_NAME
            if state.is_file():
                best = (int(match[1]), state)
    return best[1] if best else None


def run_dir(state_path: Path) -> Path:
    """The training output dir: the checkpoint's parent for a checkpoint's file."""
    parent = state_path.parent
    return parent.parent if CHECKPOINT.match(parent.name) else parent


def model_facts(state_path: Path) -> dict[str, Any]:
    """vocab_size and model from a config.json next to the file, in the output dir, or in its
    newest checkpoint (`save_state` writes no config.json beside the top-level file)."""
    output_dir = run_dir(state_path)
    checkpoint = newest_checkpoint(output_dir)
    folders = (state_path.parent, output_dir, checkpoint.parent if checkpoint else output_dir)
    for folder in dict.fromkeys(folders):
        try:
            config = json.loads(
                read_regular(folder / "config.json", error=ObserveError, limit=MAX_CONFIG_BYTES)
            )
        except (ObserveError, ValueError, RecursionError):
            continue  # missing, a FIFO, too big or not JSON: no facts from it
        vocab = valid_vocab(config.get("vocab_size")) if isinstance(config, dict) else None
        if vocab:
            architectures = config.get("architectures")
            architecture = architectures[0] if isinstance(architectures, list) and architectures else None
            model = config.get("_name_or_path") or architecture or config.get("model_type")
            return {"vocab_size": vocab, "model": model if isinstance(model, str) and model else None}
    return {}


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    given = Path(source["path"])
    state_path = resolve(given)
    if state_path is None:
        raise ObserveError(f"{given}: no {FILE_NAME} there (yet)", transient=True)
    cursor = source["cursor"]
    try:
        st = state_path.stat()
        identity = {"file": str(state_path), "mtime_ns": st.st_mtime_ns, "size": st.st_size}
        done = cursor.get("entries", 0)
        if cursor.get("identity") == identity and done >= cursor.get("total", 0):
            return IngestResult(caught_up=True, done=done, total=done)
        data = json.loads(read_regular(state_path, FILE_NAME, ObserveError))
    except OSError as exc:
        raise ObserveError(f"{state_path}: cannot read it ({exc.strerror})", transient=True) from None
    except (ValueError, RecursionError):
        # transformers writes the file in place, so a reader can catch it half written.
        raise ObserveError(f"{state_path}: not valid JSON (caught mid-write?)", transient=True) from None
    history = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise ObserveError(f"{state_path}: not a trainer_state.json (no log_history list)")
    if len(history) < done:
        done = 0  # a new training run rewrote it; rows already stored are ignored
    return _import(store, source, state_path, st.st_mtime, data, history, done, identity, budget)


def _import(
    store: Store,
    source: dict[str, Any],
    state_path: Path,
    mtime: float,
    data: dict[str, Any],
    history: list[Any],
    done: int,
    identity: dict[str, Any],
    budget: Budget,
) -> IngestResult:
    facts = model_facts(state_path)
    max_steps = valid_max_steps(data.get("max_steps"))
    if max_steps:
        facts["max_steps"] = max_steps
    result = IngestResult()
    rows: list[tuple[int, str, float | None, float]] = []
    finished = False
    now = time.time()
    while done < len(history) and not budget.spent(len(rows)):
        entry = history[done]
        done += 1
        where = f"{state_path.name}:log_history[{done - 1}]"
        if not isinstance(entry, dict):
            result.add_problem(f"{where}: not an object")
            continue
        step = as_step(entry.get("step"))
        if step is None:
            result.add_problem(f"{where}: no integer step")
            continue
        values = _entry_values(entry)
        rows.extend((step, key, value, now) for key, value in values.items())
        finished = finished or "train_runtime" in entry
    result.caught_up, result.done, result.total = done >= len(history), done, len(history)
    with WriteCost.measure(len(rows)), store.transaction():
        run = find_run(store, source["id"]) or ensure_run(
            store, source, source["name"] or run_dir(state_path).name or state_path.stem, **facts
        )
        if finished:
            facts.update(status="finished", ended_at=mtime)
        store.update_run(run.id, **facts)
        rows = finish_rows(
            store,
            run.id,
            source["id"],
            rows,
            vocab_size=facts.get("vocab_size"),
            origin=KEYS.origin,
            result=result,
        )
        result.rows = store.add_metrics(run.id, rows)
        result.run_ids.append(run.id)
        cursor = {"identity": identity, "entries": done, "total": len(history)}
        store.save_source_progress(source["id"], cursor, rows=result.rows, bad_lines=result.bad_lines)
    return result


def _entry_values(entry: dict[str, Any]) -> dict[str, float | None]:
    """An entry's metrics; null stays None (stored as NULL), strings and objects are skipped."""
    values: dict[str, float | None] = {}
    for key, raw in entry.items():
        name = KEYS[key]
        if name is None:
            continue
        value = number(raw)
        if value is not None or raw is None:
            values[name] = value
    return values
