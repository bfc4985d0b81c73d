"""MLflow tracking stores, read without a server: a sqlite `mlflow.db` or an `mlruns/` directory.

Read through `mlflow.tracking.MlflowClient` (the `mlflow` extra); every run of every experiment becomes a carl
run (external id = MLflow's run id), its params the run's config, |V| from a `vocab_size` param. The cursor,
per run and key, is the last step stored; a key whose latest step (MLflow keeps it per run) has not moved
costs nothing, so following a store re-reads only what is new.
A later value at a step already stored is ignored, as everywhere.

The user's store is never written: the sqlite file is opened read-only (`mode=ro`, through SQLAlchemy's URI
form, which also keeps MLflow from creating tables or parent folders), and an `mlruns/` directory is opened
only when it has the `.trash` folder MLflow's file store would otherwise create on opening.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from engine.files import checked_stat, kind_of
from engine.limits import int_text, shown
from engine.store import Store
from engine.text import storable

from .keys import KeyMap
from .reader_base import (
    MAX_PROBLEMS,
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

INSTALL = "pip install 'carl-tui[mlflow]'"
DB_TABLES = {"experiments", "runs", "metrics", "params", "latest_metrics", "alembic_version"}
STATUS = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "stopped"}  # else running
MODEL_PARAMS = ("model_name_or_path", "_name_or_path", "model_name", "model")
PAGE = 1000  # runs per search
MAX_ENTRIES = 1_000_000  # files of an mlruns/ tree looked at for a FIFO, per call
KEYS = KeyMap()


def is_mlflow_db(path: Path) -> bool:
    """Whether an SQLite file holds MLflow's tracking tables (read-only; no mlflow import)."""
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return False
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return DB_TABLES.issubset(tables)


def is_mlruns_dir(path: Path) -> bool:
    """Whether a directory is MLflow's file store: experiment folders (numbered, with a meta.yaml)."""
    try:
        entries = [e for _, e in zip(range(1000), os.scandir(path), strict=False)]
    except OSError:
        return False
    return any(
        e.name.isdigit() and e.is_dir() and os.path.isfile(os.path.join(e.path, "meta.yaml")) for e in entries
    )


def check_files(path: Path) -> None:
    """ObserveError unless `path` is a regular file, or a directory holding only directories and regular
    files: MLflow opens what it finds, and a FIFO in an mlruns/ tree would block it for ever."""
    mode = checked_stat(path, ObserveError).st_mode
    if not stat.S_ISDIR(mode):
        if not stat.S_ISREG(mode):
            raise ObserveError(f"{path}: {kind_of(mode)}, not an MLflow store")
        return
    pending, seen = [path], 0
    while pending and seen < MAX_ENTRIES:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # MLflow says what it cannot read
        seen += len(entries)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
                continue
            try:
                mode = entry.stat().st_mode  # a link is followed: one to a FIFO is one too
            except OSError:
                continue  # a dangling link or a loop: MLflow says so itself, without blocking
            if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise ObserveError(
                    f"{entry.path}: {kind_of(mode)} inside the MLflow store; MLflow would block on it"
                )


def tracking_uri(path: Path) -> str:
    """The URI MlflowClient opens `path` with: read-only for sqlite, the file store's for a directory."""
    if path.is_dir():
        if not (path / ".trash").is_dir():
            raise ObserveError(
                f"{path}: an mlruns directory without its .trash folder; MLflow would create it on opening,"
                " and carl never writes into a store it reads"
            )
        return path.absolute().as_uri()
    import sqlalchemy  # comes with mlflow

    # "file:" + a percent-encoded path is SQLite's URI form (mode=ro: never written, never created); the URL
    # object quotes it once more for SQLAlchemy. The `+pysqlite` spelling also keeps MLflow from creating the
    # "parent folder" of what it would take for a relative path.
    url = sqlalchemy.engine.URL.create(
        "sqlite+pysqlite", database="file:" + quote(str(path.absolute())), query={"mode": "ro", "uri": "true"}
    )
    return url.render_as_string(hide_password=False)


def client(path: Path) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ObserveError(f"{path}: reading an MLflow store needs the mlflow extra: {INSTALL}") from None
    if path.is_dir():
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks file-store users to opt in
    # MLflow logs what it meets on the way, with a traceback (a read-only store missing its default
    # experiment, which it would create; a malformed experiment, through the root logger), before it raises or
    # skips it; carl says each failure in one line, so MLflow's logging keeps quiet.
    logging.getLogger("mlflow").setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if not any(isinstance(f, NotFromMlflow) for f in root.filters):
        root.addFilter(NotFromMlflow())
    return MlflowClient(tracking_uri=tracking_uri(path))


class NotFromMlflow(logging.Filter):
    """Drops what MLflow's modules log on the root logger (`logging.warning(...)` in its file store)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}mlflow{os.sep}" not in record.pathname


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


# -- ingest --------------------------------------------------------------------------------------------------


class MlflowBatch:
    """What one call read: per MLflow run, its rows and facts, and the cursor that covers them."""

    def __init__(self, cursor: dict[str, Any], budget: Budget) -> None:
        self.cursor = {
            run_id: {**done, "steps": dict(done.get("steps", {}))} for run_id, done in cursor.items()
        }
        self.budget = budget
        self.rows: dict[str, list[tuple[int, str, float | None, float]]] = {}
        self.facts: dict[str, dict[str, Any]] = {}
        self.names: dict[str, str] = {}
        self.vocab: dict[str, int | None] = {}
        self.count = 0
        self.keys_read = 0  # at least one key a call, however long opening the store took
        self.caught_up = True
        self.problems: list[str] = []  # values of someone else's writer that no step can be made of

    def problem(self, line: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(line)

    def read_run(self, mlflow: Any, run: Any, experiment: str) -> None:
        run_id = text(run.info.run_id)
        done = self.cursor.setdefault(run_id, {"steps": {}})
        params = {text(k): text(v) for k, v in run.data.params.items()}
        self.names[run_id] = text(run.info.run_name) or run_id
        self.vocab[run_id] = _vocab(params)
        state = [len(params), text(run.info.status)]
        if done.get("state") != state:
            self.facts[run_id] = _facts(run, params, text(experiment))
            done["state"] = state
        steps = done["steps"]
        latest = {text(m.key): as_step(m.step) for m in run.data.to_proto().metrics}
        for key in sorted(latest):
            if key in steps and latest[key] is not None and latest[key] <= steps[key]:
                continue
            if self.keys_read and self.budget.spent(self.count):
                self.caught_up = False
                return
            self.read_key(mlflow, run_id, key, steps)
            self.keys_read += 1

    def read_key(self, mlflow: Any, run_id: str, key: str, steps: dict[str, int]) -> None:
        last = steps.get(key)
        points = []
        for m in mlflow.get_metric_history(run_id, key):
            step = as_step(m.step)
            if step is None:  # MLflow's own writer never stores one: a store someone else wrote
                self.problem(f"run {run_id}, metric {key!r}: step {shown(m.step)} is not an integer")
            elif last is None or step > last:
                points.append(Point(step, number(m.value), epoch_ms(m.timestamp)))
        points.sort(key=lambda p: (p.step, p.wall or 0.0))
        room = max(self.budget.max_rows - self.count, 1)
        if len(points) > room:  # cut at a step boundary: the rest of the key waits for the next call
            cut = room
            while cut < len(points) and points[cut].step == points[cut - 1].step:
                cut += 1
            points = points[:cut]
            self.caught_up = False
        name = KEYS[key]
        rows = self.rows.setdefault(run_id, [])
        for m in points:
            if name is not None:
                rows.append((m.step, name, m.value, m.wall if m.wall is not None else time.time()))
        self.count += len(points)
        if points:
            steps[key] = points[-1].step


class Point(NamedTuple):
    """One value of a metric's history, its fields checked: MLflow's columns take whatever someone wrote."""

    step: int
    value: float | int | None
    wall: float | None  # unix seconds


def text(value: Any) -> str:
    """A field MLflow read from the store as text: storable; a blob (someone else's writer) decoded, never
    kept."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return storable(value) if isinstance(value, str) else "" if value is None else str(value)


def epoch_ms(value: Any) -> float | None:
    """Unix seconds from MLflow's milliseconds, when they are a finite number."""
    ms = number(value)
    return ms / 1000 if ms is not None and math.isfinite(ms) else None


def _vocab(params: dict[str, str]) -> int | None:
    """|V| from a `vocab_size` param, also nested (veRL flattens its config with "/" into params)."""
    for key, value in params.items():
        if key == "vocab_size" or key.endswith(("/vocab_size", ".vocab_size")):
            vocab = valid_vocab(int_text(value) if isinstance(value, str) else None)
            if vocab:
                return vocab
    return None


def _facts(run: Any, params: dict[str, str], experiment: str) -> dict[str, Any]:
    info = run.info
    facts: dict[str, Any] = {"config": {"experiment": experiment, "params": params}}
    vocab = _vocab(params)
    if vocab:
        facts["vocab_size"] = vocab
    model = next((params[k] for k in MODEL_PARAMS if params.get(k)), None)
    if model:
        facts["model"] = model
    max_steps = valid_max_steps(int_text(params.get("max_steps") or ""))
    if max_steps:
        facts["max_steps"] = max_steps
    started, ended = epoch_ms(info.start_time), epoch_ms(info.end_time)
    if started:
        facts["started_at"] = started
    status = STATUS.get(text(info.status))
    if status is not None:
        facts["status"] = status
        if ended:
            facts["ended_at"] = ended
    return facts


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    path = Path(source["path"])
    if not path.exists():
        raise ObserveError(f"{path}: the MLflow store is gone (moved or deleted?)", transient=True)
    check_files(path)
    if path.is_file() and not is_mlflow_db(path):
        raise ObserveError(
            f"{path}: not an MLflow tracking database (or it cannot be read now)", transient=True
        )
    cursor = source["cursor"]
    batch = MlflowBatch(cursor.get("runs", {}), budget)
    runs: list[tuple[Any, str]] = []
    try:
        mlflow = client(path)
        from mlflow.entities import ViewType

        for experiment in mlflow.search_experiments(view_type=ViewType.ACTIVE_ONLY):
            token = None
            while True:
                page = mlflow.search_runs([experiment.experiment_id], max_results=PAGE, page_token=token)
                runs.extend((run, experiment.name) for run in page)
                token = page.token
                if not token:
                    break
        runs.sort(key=lambda r: (r[0].info.start_time or 0, r[0].info.run_id))
        for run, experiment in runs:
            batch.read_run(mlflow, run, experiment)
            if not batch.caught_up:
                break
    except ObserveError:
        raise
    except Exception as exc:  # MlflowException, SQLAlchemy's errors: one line, never a traceback
        transient = "locked" in str(exc) or "busy" in str(exc)
        raise ObserveError(
            f"{path}: cannot read the MLflow store ({_one_line(exc)})", transient=transient
        ) from None
    result = IngestResult(caught_up=batch.caught_up, done=len(batch.cursor), total=len(runs))
    for problem in batch.problems:
        result.add_problem(f"{path.name}: {problem}")
    new_cursor = {"runs": batch.cursor}
    if new_cursor == cursor:
        return result
    single = len(runs) == 1 and bool(source["name"])
    with WriteCost.measure(batch.count), store.transaction():
        for run_id in batch.names:
            run = _write_run(store, source, batch, run_id, source["name"] if single else None)
            rows = batch.rows.get(run_id)
            if rows:
                rows = finish_rows(
                    store,
                    run.id,
                    source["id"],
                    rows,
                    vocab_size=batch.vocab[run_id],
                    origin=KEYS.origin,
                    result=result,
                )
                result.rows += store.add_metrics(run.id, rows)
                result.run_ids.append(run.id)
        store.save_source_progress(source["id"], new_cursor, rows=result.rows)
    return result


def _write_run(
    store: Store, source: dict[str, Any], batch: MlflowBatch, run_id: str, name: str | None
) -> Any:
    """The carl run of an MLflow run, created on first sight; its facts updated when they changed."""
    facts = dict(batch.facts.get(run_id, {}))
    run = find_run(store, source["id"], run_id)
    if run is None:
        created = {k: facts.pop(k) for k in CREATE_FIELDS if k in facts}
        run = ensure_run(store, source, name or batch.names[run_id], external_id=run_id, **created)
    else:
        facts.pop("started_at", None)
    if facts:  # status, end time, and whatever changed since the run was made
        store.update_run(run.id, **facts)
    return run


CREATE_FIELDS = ("config", "model", "max_steps", "vocab_size", "started_at")  # what Store.create_run takes
