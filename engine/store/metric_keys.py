"""A run's metric keys in carl.db, as the readers of other tools' runs need them (engine/observe/runkeys.py):
the framework and |V| stored on the run, the renames kept in run_keys, which keys it has, the entropy steps
still without a Φ; and the values of a run's first steps, which pairing compares (engine/observe/pairing.py).

Reads on the writer's connection, inside the transaction of the caller's batch when it has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .db import Store


def framework_and_vocab(store: Store, run_id: int) -> tuple[str | None, int | None]:
    """The framework and |V| stored on the run."""
    return store.conn.execute("SELECT framework, vocab_size FROM runs WHERE id=?", (run_id,)).fetchone()


def claimed_keys(store: Store, run_id: int) -> dict[str, str]:
    """The run's renamed keys: our key -> the source's own spelling (run_keys)."""
    return dict(store.conn.execute("SELECT key, source_key FROM run_keys WHERE run_id=?", (run_id,)))


def config_text(store: Store, run_id: int) -> tuple[int, str | None]:
    """(its length, the text) of the run's stored config; (0, None) for no run."""
    return store.conn.execute("SELECT length(config), config FROM runs WHERE id=?", (run_id,)).fetchone() or (
        0,
        None,
    )


def has_key(store: Store, run_id: int, key: str) -> bool:
    """Whether the run has rows of `key` (a primary-key seek in the rollups)."""
    seen = "SELECT 1 FROM rollups WHERE run_id=? AND key=? LIMIT 1"
    return store.conn.execute(seen, (run_id, key)).fetchone() is not None


def keys_of(store: Store, run_id: int, limit: int) -> set[str]:
    """A run's distinct metric keys, at most `limit` of them: one primary-key seek in the rollups per key, so
    the cost does not grow with the rows."""
    keys: set[str] = set()
    key = ""
    while len(keys) < limit:
        row = store.conn.execute(
            "SELECT min(key) FROM rollups WHERE run_id=? AND key>?", (run_id, key)
        ).fetchone()
        if row[0] is None:
            break
        key = row[0]
        keys.add(key)
    return keys


def has_event(store: Store, run_id: int, kind: str) -> bool:
    """Whether the run has an event of `kind`."""
    said = store.conn.execute("SELECT 1 FROM events WHERE run_id=? AND kind=?", (run_id, kind))
    return said.fetchone() is not None


def entropy_without_phi(store: Store, run_id: int) -> list[tuple[Any, ...]]:
    """(step, entropy, wall time) of the run's steps with an entropy and no Φ."""
    return store.conn.execute(
        "SELECT step, value, wall_time FROM metrics WHERE run_id=? AND key='entropy' AND step NOT IN"
        " (SELECT step FROM metrics WHERE run_id=? AND key='phi/mean')",
        (run_id, run_id),
    ).fetchall()


def first_steps(store: Store, run_id: int, limit: int) -> list[int]:
    """The run's first `limit` distinct steps, in order."""
    rows = store.conn.execute(
        "SELECT DISTINCT step FROM metrics WHERE run_id=? ORDER BY step LIMIT ?", (run_id, limit)
    )
    return [r[0] for r in rows]


def values_between(store: Store, run_id: int, first: int, last: int) -> dict[tuple[str, int], float | None]:
    """(key, step) -> value of the run's rows from step `first` to `last`, both included (NaN is NULL)."""
    rows = store.conn.execute(
        "SELECT step, key, value FROM metrics WHERE run_id=? AND step BETWEEN ? AND ?", (run_id, first, last)
    )
    return {(key, step): value for step, key, value in rows}
