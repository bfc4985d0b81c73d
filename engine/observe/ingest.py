"""Registering a source and importing it in bounded batches.

Each batch writes its rows and the source cursor that covers them in one transaction, so a
process killed at any moment resumes exactly where the last commit left it; the unique
(run, key, step) index makes a replayed row a no-op besides.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine import files
from engine.store import Store, StoreError, sources
from engine.text import storable

from . import jsonl, mlflow_store, rollouts, tensorboard, trackio, trainer_state, wandb_run
from .detect import detect_kind
from .reader_base import Budget, IngestResult, ObserveError, joins_key, source_run_ids

Reader = Callable[[Store, dict[str, Any], Budget], IngestResult]
READERS: dict[str, Reader] = {
    "jsonl": jsonl.ingest,
    "mlflow": mlflow_store.ingest,
    "trackio": trackio.ingest,
    "trainer_state": trainer_state.ingest,
    "tensorboard": tensorboard.ingest,
    "wandb": wandb_run.ingest,
    **rollouts.READERS,
}
# `observe` runs in the foreground with nothing else to serve: bigger batches go faster.
OBSERVE_ROWS = 100_000
OBSERVE_SECONDS = 1.0


def register_source(
    store: Store,
    path: str | Path,
    *,
    follow: bool,
    name: str | None = None,
    kind: str | None = None,
    attach_to: int | None = None,
    default_name: str | None = None,
) -> int:
    """Record `path` (made absolute) as a source of `kind` (else its detected kind); returns the source id.

    `name` is the user's (`--name`), kept over any earlier one; `default_name` (what discovery calls the run)
    is taken only by a source that has no name yet, so observing a folder again never renames what the user
    named.

    `attach_to` names the source whose run a rollout source's samples join (`sources.attach_to`), as discovery
    (discover.py) sets it.
    Registering a path again keeps its cursor, so nothing already imported is read twice.
    """
    resolved = files.resolved(path, ObserveError)
    if storable(str(resolved)) != str(resolved):  # the store keeps the path to open it again: it must be text
        raise ObserveError(
            f"{storable(str(resolved))}: the path is not valid UTF-8, so it cannot be kept; rename it"
        )
    kind = kind or detect_kind(resolved)
    known = sources.source_at(store, str(resolved))
    if known is not None and known.kind != kind:
        raise ObserveError(f"{resolved}: was observed as {known.kind} but now looks like {kind}")
    if name is None and default_name is not None:
        name = default_name if known is None or known.name is None else None
    source_id = store.upsert_source(kind, str(resolved), name=name, follow=follow)
    with store.transaction():
        if attach_to is not None:
            sources.set_attach_to(store, source_id, attach_to)
        if follow:  # following again: what a finished import left 'imported' is live once more
            _move_runs(store, source_id, "imported", "running")
    return source_id


def set_joined(store: Store, source_id: int, target: int | None, external_id: str | None = None) -> None:
    """Read a metrics source into the run of source `target` (discovery found both logged one training run),
    or into runs of its own again (`target` None). A store of many runs joins one run at a time
    (`external_id`), in kv `observe.joins.<id>` (common.joined_to); any other source joins whole, through
    `sources.attach_to`."""
    with store.transaction():
        if external_id is None:
            sources.set_attach_to(store, source_id, target)
        joins = store.kv(joins_key(source_id))
        if external_id is not None or (target is None and joins):
            joins = dict(joins) if isinstance(joins, dict) else {}
            if target is None:
                joins.clear()
            else:
                joins[external_id] = target
            store.set_kv(joins_key(source_id), joins)


def ingest_source(
    store: Store, source_id: int, *, max_rows: int = 20_000, max_seconds: float = 0.1
) -> IngestResult:
    """Import one bounded, time-boxed batch from a source; safe to repeat after any crash.

    A source that cannot be read raises ObserveError after recording the message in the
    source row: a followed source with a transient problem stays 'following' (retry later),
    anything else is set to 'error'.
    """
    try:
        source = store.source(source_id)
    except StoreError as exc:
        raise ObserveError(str(exc)) from None
    reader = READERS.get(source["kind"])
    if reader is None:
        raise ObserveError(f"{source['path']}: unknown source kind {source['kind']!r}")
    try:
        with gc_paused():
            return reader(store, source, Budget(max_rows, max_seconds))
    except ObserveError as exc:
        state = None if exc.transient and source["follow"] else "error"
        store.save_source_progress(source_id, source["cursor"], state=state, error=str(exc))
        raise


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic GC for one bounded batch.

    A batch allocates hundreds of thousands of acyclic objects (parsed lines, row tuples);
    the collector would walk them again and again for nothing, which costs a third of the
    import time. Nothing in a batch builds cycles, and the pause ends with the batch.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def observe(
    store: Store,
    path: str | Path,
    *,
    follow: bool = False,
    name: str | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> tuple[int, IngestResult]:
    """Register `path` and import it until caught up; returns (source id, the summed result).

    `progress(done, total)` is called after each batch, in the source's own unit (bytes,
    Trackio row ids or log entries). Without `follow` the source is then marked 'done' and its
    runs 'imported' (those that reached their end stay 'finished').
    """
    source_id = register_source(store, path, follow=follow, name=name)
    return source_id, import_source(store, source_id, finish=not follow, progress=progress)


def import_source(
    store: Store,
    source_id: int,
    *,
    finish: bool = True,
    progress: Callable[[int, int | None], None] | None = None,
) -> IngestResult:
    """Import a registered source until caught up; `finish` marks it 'done' and its runs 'imported' then."""
    total = IngestResult()
    while not total.caught_up:
        batch = ingest_source(store, source_id, max_rows=OBSERVE_ROWS, max_seconds=OBSERVE_SECONDS)
        total.merge(batch)
        if progress is not None:
            progress(batch.done, batch.total)
    if finish:
        finish_import(store, source_id)
    total.run_ids = list(dict.fromkeys([*total.run_ids, *source_run_ids(store, source_id)]))
    return total


def finish_import(store: Store, source_id: int) -> None:
    with store.transaction():
        store.save_source_progress(source_id, store.source(source_id)["cursor"], state="done")
        _move_runs(store, source_id, "running", "imported")


def _move_runs(store: Store, source_id: int, old: str, new: str) -> None:
    """Set the status of this source's runs that are in `old` to `new`."""
    for run_id in sources.run_ids(store, source_id, old):
        store.update_run(run_id, status=new)
