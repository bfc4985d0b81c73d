"""Trackio project databases (`<project>.db`), read as a third party.

Opened read-only (`mode=ro`) in autocommit mode: every SELECT is its own short read transaction and is drained
at once, so the Trackio writer is never held up. Rows are tailed by `metrics.id`; each Trackio run becomes one
carl run (external id = Trackio's run id). Histograms in a metrics payload (`trackio.Histogram`) are stored as
histograms (observe/tracker_histograms.py), and the project's traces (`trackio.Trace`) as rollouts of their
runs (trackio_traces.py), tailed by rowid.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.limits import shown
from engine.store import Store
from engine.store.histograms import KEYS_CAP, HistogramRow, add_histograms
from engine.store.schema import APPLICATION_ID
from engine.store.sources import has_runs
from engine.text import loads_storable

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
    number,
    valid_max_steps,
    valid_vocab,
)
from .rollouts.rollout_base import store_at_next_places
from .runkeys import finish_rows
from .tracker_histograms import from_json, is_histogram_json
from .trackio_traces import read_traces

PAGE = 500  # Trackio rows per query
METRICS_COLUMNS = {"id", "timestamp", "run_name", "step", "metrics"}
CONFIGS_COLUMNS = {"run_name", "config"}
SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
KEYS = KeyMap()


def connect(path: Path) -> sqlite3.Connection:
    """A read-only, autocommit connection; waits at most a second on a busy writer."""
    uri = f"{path.absolute().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=1.0, check_same_thread=False)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")  # a text that is not UTF-8 is still read
    return conn


def check(path: Path) -> str:
    """Raise ObserveError unless `path` is a Trackio project database; returns the run column."""
    try:
        conn = connect(path)
    except sqlite3.Error as exc:
        raise ObserveError(f"{path}: cannot open the SQLite file ({exc})", transient=True) from None
    try:
        return _run_column(conn, path)
    finally:
        conn.close()


def _run_column(conn: sqlite3.Connection, path: Path) -> str:
    """`run_id` (schema 2) or `run_name` (older projects, keyed by name only)."""
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            raise ObserveError(f"{path}: this is a carl database, not a Trackio project")
        metrics = {r[1] for r in conn.execute("PRAGMA table_info(metrics)")}
        configs = {r[1] for r in conn.execute("PRAGMA table_info(configs)")}
    except sqlite3.OperationalError as exc:
        raise ObserveError(f"{path}: cannot read the SQLite file ({exc})", transient=True) from None
    except sqlite3.DatabaseError as exc:
        raise ObserveError(f"{path}: not a readable SQLite database ({exc})") from None
    if not (metrics.issuperset(METRICS_COLUMNS) and configs.issuperset(CONFIGS_COLUMNS)):
        raise ObserveError(f"{path}: an SQLite file, but not a Trackio project (no metrics/configs tables)")
    return "run_id" if "run_id" in metrics and "run_id" in configs else "run_name"


def decode(blob: Any) -> dict[str, Any]:
    """A metrics or config payload (orjson bytes, or text in old files) as a dict; {} if unreadable."""
    try:
        value = loads_storable(blob)
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _metric(value: Any) -> float | int | None:
    number_value = number(value)
    if number_value is None and type(value) is str:
        return SPECIAL_FLOATS.get(value)
    return number_value  # tables, media and other objects are None: skipped


# -- ingest ------------------------------------------------------------------------------------


class TrackioBatch:
    """Rows and run facts read in one call, written together afterwards."""

    def __init__(self, store: Store, source: dict[str, Any]) -> None:
        self.store = store
        self.source = source
        self.runs: dict[str, RunInfo | None] = {}  # external id -> carl run (None: not created yet)
        self.names: dict[str, str] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, list[tuple[int, str, float | None, float]]] = {}
        self.row_count = 0
        self.traces: dict[str, list[dict[str, Any]]] = {}  # external id -> its traces, as rollouts
        self.histograms: dict[str, list[HistogramRow]] = {}
        self.walls: dict[str, float] = {}
        self.now = time.time()
        self.result = IngestResult()  # the rows skipped, each one line

    def run(self, external_id: str) -> RunInfo | None:
        if external_id not in self.runs:
            self.runs[external_id] = find_run(self.store, self.source["id"], external_id)
        return self.runs[external_id]

    def add_config(self, external_id: str, run_name: str, blob: Any) -> None:
        self.names.setdefault(external_id, run_name)
        self.configs[external_id] = decode(blob)

    def add_metrics(self, external_id: str, run_name: str, step: int, stamp: str, blob: Any) -> None:
        self.names.setdefault(external_id, run_name)
        payload = decode(blob)
        global_step = as_step(payload.get("train/global_step"))
        if global_step is not None:
            step = global_step
        wall = self.wall_time(stamp)
        values: dict[str, float | int | None] = {}
        for key, raw in payload.items():
            name = KEYS[key]
            if name is not None:
                value = _metric(raw)
                if value is not None:
                    values[name] = value
                elif is_histogram_json(raw):
                    self.add_histogram(external_id, step, name, raw, wall)
        rows = self.rows.setdefault(external_id, [])
        rows.extend((step, name, value, wall) for name, value in values.items())
        self.row_count += len(values)

    def add_histogram(self, external_id: str, step: int, key: str, raw: dict[str, Any], wall: float) -> None:
        histogram = from_json(raw)
        if histogram is None:
            self.result.add_problem(f"{shown(key)} at step {step}: not a usable histogram; skipped")
            return
        self.histograms.setdefault(external_id, []).append((step, key, histogram, wall))
        self.row_count += 1

    def add_trace(self, external_id: str, run_name: str, sample: dict[str, Any]) -> None:
        self.names.setdefault(external_id, run_name)
        self.traces.setdefault(external_id, []).append(sample)

    def wall_time(self, stamp: str) -> float:
        wall = self.walls.get(stamp)
        if wall is None:
            wall = _parse_time(stamp) or self.now
            if len(self.walls) < 1000:
                self.walls[stamp] = wall
        return wall


def _parse_time(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return None


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    path = Path(source["path"])
    cursor = dict(source["cursor"])
    metrics_id, configs_id = cursor.get("metrics_id", 0), cursor.get("configs_id", 0)
    traces_at = cursor.get("traces_rowid", 0)
    if not path.exists():
        raise ObserveError(f"{path}: the Trackio database is gone (moved or deleted?)", transient=True)
    batch = TrackioBatch(store, source)
    try:
        conn = connect(path)
    except sqlite3.Error as exc:
        raise ObserveError(f"{path}: cannot open the Trackio database ({exc})", transient=True) from None
    try:
        run_col = _run_column(conn, path)
        configs_id = _read_configs(conn, run_col, configs_id, batch)
        metrics_id, caught_up = _read_metrics(conn, run_col, metrics_id, batch, budget)
        if caught_up:  # traces next, in what the metrics left of the budget
            traces_at, caught_up = read_traces(
                conn,
                run_col,
                traces_at,
                budget,
                batch.row_count,
                batch.add_trace,
                batch.result,
                batch.wall_time,
            )
        last_id = conn.execute("SELECT max(id) FROM metrics").fetchone()[0] or 0
        single_run = _single_run(conn, run_col) if _names_first_run(store, source, batch) else False
    except sqlite3.OperationalError as exc:
        raise ObserveError(f"{path}: cannot read the Trackio database ({exc})", transient=True) from None
    except sqlite3.DatabaseError as exc:
        raise ObserveError(f"{path}: not a readable Trackio database ({exc})") from None
    finally:
        conn.close()
    result = batch.result
    result.caught_up, result.done, result.total = caught_up, metrics_id, max(last_id, metrics_id)
    new_cursor = {"metrics_id": metrics_id, "configs_id": configs_id, "traces_rowid": traces_at}
    if new_cursor == source["cursor"]:
        return result
    with WriteCost.measure(batch.row_count), store.transaction():
        for external_id in batch.names:
            run = _write_run(batch, external_id, single_run)
            rows = batch.rows.get(external_id)
            if rows:
                vocab = valid_vocab(batch.configs.get(external_id, {}).get("vocab_size"))
                rows = finish_rows(
                    store, run.id, source["id"], rows, vocab_size=vocab, origin=KEYS.origin, result=result
                )
                result.rows += store.add_metrics(run.id, rows)
            _write_extras(batch, external_id, run.id)
            if rows or batch.traces.get(external_id) or batch.histograms.get(external_id):
                result.run_ids.append(run.id)
        store.save_source_progress(source["id"], new_cursor, rows=result.rows, bad_lines=result.bad_lines)
    return result


def _write_extras(batch: TrackioBatch, external_id: str, run_id: int) -> None:
    """A run's traces (as rollouts) and histograms; inside the batch's transaction."""
    result = batch.result
    result.rows += store_at_next_places(batch.store, run_id, batch.traces.get(external_id, []))
    added, refused = add_histograms(batch.store, run_id, batch.histograms.get(external_id, []))
    result.rows += added
    for key in refused:
        result.add_problem(f"histogram {shown(key)}: the run has {KEYS_CAP} histogram keys already; skipped")


def _read_configs(conn: sqlite3.Connection, run_col: str, after: int, batch: TrackioBatch) -> int:
    """Configs are few and rewritten (with a new id) as a run goes: read all the new ones."""
    rows = conn.execute(
        f"SELECT id, {run_col}, run_name, config FROM configs WHERE id > ? ORDER BY id", (after,)
    ).fetchall()
    for row_id, external_id, run_name, blob in rows:
        batch.add_config(str(external_id), str(run_name), blob)
        after = row_id
    return after


def _read_metrics(
    conn: sqlite3.Connection, run_col: str, after: int, batch: TrackioBatch, budget: Budget
) -> tuple[int, bool]:
    """Tail metrics rows by id until caught up or the budget is spent; returns (last id, caught up)."""
    while True:
        page = conn.execute(
            f"SELECT id, {run_col}, run_name, step, timestamp, metrics FROM metrics"
            " WHERE id > ? ORDER BY id LIMIT ?",
            (after, PAGE),
        ).fetchall()
        for row_id, external_id, run_name, step, stamp, blob in page:
            after = row_id
            row_step = 0 if step is None else as_step(step)  # SQLite reads a NaN step back as NULL
            if row_step is None:
                batch.result.add_problem(f"metrics row {row_id}: step {shown(step)} is not an integer")
                continue
            batch.add_metrics(str(external_id), str(run_name), row_step, stamp, blob)
            if budget.spent(batch.row_count):
                return after, False
        if len(page) < PAGE:
            return after, True


def _names_first_run(store: Store, source: dict[str, Any], batch: TrackioBatch) -> bool:
    """Whether this batch creates the source's first run under a name the user asked for."""
    if not source["name"] or not batch.names:
        return False
    return not has_runs(store, source["id"])


def _single_run(conn: sqlite3.Connection, run_col: str) -> bool:
    row = conn.execute(
        f"SELECT count(*) FROM (SELECT {run_col} FROM configs UNION SELECT {run_col} FROM metrics)"
    ).fetchone()
    return row[0] <= 1


def _write_run(batch: TrackioBatch, external_id: str, single_run: bool) -> RunInfo:
    """Create or update the carl run of a Trackio run; inside the batch's transaction."""
    store, source = batch.store, batch.source
    config = batch.configs.get(external_id)
    facts = _run_facts(config) if config is not None else {}
    run = batch.run(external_id)
    if run is None:
        name = source["name"] if single_run else batch.names[external_id]
        run = ensure_run(store, source, name or external_id, external_id=external_id, **facts)
        batch.runs[external_id] = run
    elif config is not None:
        store.update_run(run.id, **{k: v for k, v in facts.items() if k != "started_at"})
    return run


def _run_facts(config: dict[str, Any]) -> dict[str, Any]:
    """What a Trackio config tells about a run (transformers puts the model config in it)."""
    facts: dict[str, Any] = {"config": config}
    vocab = valid_vocab(config.get("vocab_size"))
    if vocab:
        facts["vocab_size"] = vocab
    max_steps = valid_max_steps(config.get("max_steps"))
    if max_steps:
        facts["max_steps"] = max_steps
    model = config.get("_name_or_path") or config.get("model_name_or_path") or config.get("model_type")
    if isinstance(model, str) and model:
        facts["model"] = model
    started = _parse_time(config.get("_Created"))
    if started:
        facts["started_at"] = started
    return facts
