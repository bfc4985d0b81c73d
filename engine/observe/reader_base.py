"""What the three source readers share: the error, the result, the time box and run lookup."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.limits import COUNT_MAX, int_within
from engine.store import Store, sources

MAX_PROBLEMS = 20  # problems reported per result; the counts stay exact
MAX_VOCAB = COUNT_MAX  # a vocabulary size past this is no model's (and |V| >= 2**63 cannot be stored)


from engine.errors import CarlError  # noqa: E402  (the base of one-line user errors)


class ObserveError(CarlError):
    """A one-line, user-facing message naming the path (and line or field) that is wrong.

    `transient` is True for trouble that may pass (a file missing mid-rotation, a database
    locked, a JSON file caught mid-rewrite): a followed source stays 'following'.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass
class IngestResult:
    rows: int = 0  # metric rows added to the store (duplicates already there are not counted)
    bad_lines: int = 0  # malformed lines (JSONL) or log entries (trainer_state) skipped
    caught_up: bool = False  # nothing more to read right now
    run_ids: list[int] = field(default_factory=list)  # carl runs that this batch touched
    problems: list[str] = field(default_factory=list)  # e.g. "metrics.jsonl:17: not JSON", bounded
    done: int = 0  # position in the source: bytes (JSONL), Trackio row ids, log entries
    total: int | None = None  # the same unit's end, when known

    def add_problem(self, text: str) -> None:
        self.bad_lines += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def merge(self, other: IngestResult) -> None:
        """Fold a later batch into this running total."""
        self.rows += other.rows
        self.bad_lines += other.bad_lines
        self.caught_up = other.caught_up
        self.run_ids.extend(r for r in other.run_ids if r not in self.run_ids)
        room = MAX_PROBLEMS - len(self.problems)
        self.problems.extend(other.problems[: max(room, 0)])
        self.done, self.total = other.done, other.total


class WriteCost:
    """Seconds the store takes per metric row, learnt from the batches written so far.

    Reading stops early enough to leave the write its share of the time box; the cost varies
    with the machine, its load and the batch size, so it is measured rather than assumed.
    """

    per_row = 8e-6

    @classmethod
    @contextmanager
    def measure(cls, rows: int) -> Iterator[None]:
        started = time.monotonic()
        yield
        if rows >= 1000:  # small batches are all fixed overhead
            observed = (time.monotonic() - started) / rows
            cls.per_row = min(max(0.7 * cls.per_row + 0.3 * observed, 1e-6), 1e-4)


class Budget:
    """The bound of one batch: at most `max_rows` rows and about `max_seconds`, writing included."""

    def __init__(self, max_rows: int, max_seconds: float) -> None:
        self.max_rows = max_rows
        self.deadline = time.monotonic() + max_seconds
        self.row_cost = WriteCost.per_row

    def spent(self, rows: int) -> bool:
        return rows >= self.max_rows or time.monotonic() + rows * self.row_cost >= self.deadline


def number(value: Any) -> float | int | None:
    """`value` if it is a usable number (bool is not), else None; huge ints become +-inf."""
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        return value if -1e308 < value < 1e308 else math.copysign(math.inf, value)
    return None


def as_step(value: Any) -> int | None:
    """An integral step that SQLite can store, or None (text, NaN, inf, bool, 2**63)."""
    return int_within(value)


# -- runs of a source ------------------------------------------------------------------------


@dataclass
class RunInfo:
    id: int
    vocab_size: int | None
    status: str


def find_run(store: Store, source_id: int, external_id: str = "") -> RunInfo | None:
    """The carl run that (source, external id) writes to: the run of the source it joins, when discovery
    found both logged one training run (`joined_to`), else its own, else None.

    A joined source whose main source has made no run yet raises a transient ObserveError: its rows wait."""
    target = joined_to(store, source_id, external_id)
    if target is not None:
        joined = sources.first_run(store, target)
        if joined is None:
            raise ObserveError(
                f"source {source_id}: waiting for the run of source {target}, which it logged too",
                transient=True,
            )
        return RunInfo(*joined)
    own = sources.run_of(store, source_id, external_id)
    return None if own is None else RunInfo(*own)


# A store of many runs (MLflow, Trackio) joins another source's run one of its runs at a time: kv
# `observe.joins.<source id>` maps an external run id to the source whose run it logged too.
MULTI_RUN_KINDS = frozenset({"mlflow", "trackio"})


def joins_key(source_id: int) -> str:
    return f"observe.joins.{source_id}"


def joined_to(store: Store, source_id: int, external_id: str) -> int | None:
    """The source whose run this metrics source (or, in a store of many runs, this one of its runs) writes
    into, as discovery joined them (discover.py, `register`); None for a source read into runs of its own.
    A rollout source's `attach_to` is read by the rollout readers, not here."""
    row = sources.kind_and_attach_to(store, source_id)
    if row is None or row[0].startswith("rollouts-"):
        return None
    if row[0] in MULTI_RUN_KINDS:
        joins = store.kv(joins_key(source_id))
        target = joins.get(external_id) if isinstance(joins, dict) else None
        return target if type(target) is int and target != source_id else None
    return row[1] if type(row[1]) is int and row[1] != source_id else None


def ensure_run(
    store: Store, source: dict[str, Any], name: str, *, external_id: str = "", **fields: Any
) -> RunInfo:
    """The carl run for (source, external id), created on first sight.

    Call inside the batch's transaction, so a run never exists without the cursor that made it.
    """
    found = find_run(store, source["id"], external_id)
    if found is not None:
        return found
    run_id = store.create_run(
        name,
        source_kind=source["kind"],
        source_path=source["path"],
        source_id=source["id"],
        external_id=external_id,
        status="running",
        **fields,
    )
    return RunInfo(run_id, fields.get("vocab_size"), "running")


def source_run_ids(store: Store, source_id: int) -> list[int]:
    """The runs that hold what a source imported: its own, and the run of the source it joins or its
    rollouts attach to (not its own, yet it holds them) once it has read something there: rows stored, or
    read without a bad line (a joined source's rows may all be there already, from the source it joins)."""
    ids = sources.run_ids(store, source_id)
    read = sources.source_progress(store, source_id)
    if read is None or not (read.rows or (not read.bad_lines and read.cursor not in (None, "", "{}"))):
        return ids
    targets = set()
    if type(read.attach_to) is int:
        targets.add(read.attach_to)
    joins = store.kv(joins_key(source_id))
    if isinstance(joins, dict):
        targets.update(t for t in joins.values() if type(t) is int)
    for target in sorted(targets - {source_id}):
        first = sources.first_run(store, target)
        if first is not None and first[0] not in ids:
            ids.append(first[0])
    return ids


def valid_max_steps(value: Any) -> int | None:
    """A run's planned steps (an int from 1 to COUNT_MAX), or None."""
    return value if type(value) is int and 1 <= value <= COUNT_MAX else None


def valid_vocab(value: Any) -> int | None:
    """A vocabulary size |V| (an int from 2 to MAX_VOCAB), or None."""
    return value if type(value) is int and 2 <= value <= MAX_VOCAB else None
