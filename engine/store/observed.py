"""The reads that tell whether an observed run is still being written (engine/observe/ending.py).

A followed run's signs of life: the wall time of its newest row (`runs.last_update`, the writer's clock where
the source has one) and when the sources that feed it last moved their cursor (`sources.updated_at`: a reader
writes its cursor only when it read something). A store of many runs (MLflow, Trackio) moves for any of its
runs, so only the run's own rows count for its runs.

Reads and writes on the writer's connection, inside the caller's transaction when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store

MULTI_RUN_KINDS = ("mlflow", "trackio")
ENDED_PREFIX = "observe.ended."  # kv: a run the quiet rule ended, and its sign of life then


@dataclass
class Followed:
    """An observed run whose main source is followed."""

    id: int
    status: str
    source_id: int
    last_step: int | None
    max_steps: int | None
    life: float  # the newest sign of life: a row's wall time, or a feeding source's cursor moving
    ended_at: float | None = None


def followed_runs(store: Store, statuses: tuple[str, ...]) -> list[Followed]:
    """Runs in one of `statuses` whose source is followed, with their newest sign of life."""
    marks = ",".join("?" * len(statuses))
    rows = store.conn.execute(
        "SELECT r.id, r.status, r.source_id, r.last_step, r.max_steps, r.last_update, r.started_at, s.kind,"
        " r.ended_at"
        " FROM runs r JOIN sources s ON s.id = r.source_id"
        f" WHERE s.follow = 1 AND s.state = 'following' AND r.status IN ({marks}) ORDER BY r.id",
        statuses,
    ).fetchall()
    out = []
    for run_id, status, source_id, last_step, max_steps, last_update, started, kind, ended_at in rows:
        life = max(last_update or 0.0, started or 0.0)
        if kind not in MULTI_RUN_KINDS:
            feeding = store.conn.execute(
                "SELECT max(updated_at) FROM sources WHERE (id = ? OR attach_to = ?)"
                f" AND kind NOT IN ({','.join('?' * len(MULTI_RUN_KINDS))})",
                (source_id, source_id, *MULTI_RUN_KINDS),
            ).fetchone()[0]
            life = max(life, feeding or 0.0)
        out.append(Followed(run_id, status, source_id, last_step, max_steps, life, ended_at))
    return out


def step_walls(store: Store, run_id: int, steps: int) -> list[float]:
    """The wall times of the run's newest `steps` steps of one of its keys (the first: an index seek, not a
    scan of the run's rows), oldest first."""
    key = store.conn.execute("SELECT min(key) FROM rollups WHERE run_id = ?", (run_id,)).fetchone()[0]
    if key is None:
        return []
    rows = store.conn.execute(
        "SELECT wall_time FROM metrics WHERE run_id = ? AND key = ? ORDER BY step DESC LIMIT ?",
        (run_id, key, steps),
    ).fetchall()
    return sorted(r[0] for r in rows if r[0] is not None)


def ended_by_quiet(store: Store) -> dict[int, float]:
    """Run id -> its sign of life when the quiet rule ended it."""
    out = {}
    for key, value in store.conn.execute("SELECT key, value FROM kv WHERE key LIKE ?", (ENDED_PREFIX + "%",)):
        try:
            out[int(key[len(ENDED_PREFIX) :])] = float(value)
        except ValueError:
            continue
    return out


def forget_ended(store: Store, run_id: int) -> None:
    """Drop the quiet rule's mark on the run (its tracker recorded an end, or it grew again)."""
    store.conn.execute("DELETE FROM kv WHERE key = ?", (f"{ENDED_PREFIX}{run_id}",))
