"""Agent session traces in carl.db: `trajectories`, their first events (`trajectory_events`) and the domain
baselines (`trajectory_domains`), as engine/trajectories/store.py saves them, inside its transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .db import Store


def stored(store: Store, uid: str, columns: Sequence[str]) -> tuple[Any, ...] | None:
    """(id, *columns) of the trajectory with `uid` (None: not stored)."""
    return store.conn.execute(
        f"SELECT id, {', '.join(columns)} FROM trajectories WHERE uid=?", (uid,)
    ).fetchone()


def replace(store: Store, trajectory_id: int, row: dict[str, Any]) -> None:
    """A stored trajectory changed: its columns set from `row`, its events gone (the caller adds them)."""
    sets = ", ".join(f"{k}=?" for k in row)
    store.conn.execute(f"UPDATE trajectories SET {sets} WHERE id=?", (*row.values(), trajectory_id))
    store.conn.execute("DELETE FROM trajectory_events WHERE trajectory_id=?", (trajectory_id,))


def insert(store: Store, row: dict[str, Any]) -> int | None:
    """A new trajectory; its id."""
    cur = store.conn.execute(
        f"INSERT INTO trajectories ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
        tuple(row.values()),
    )
    return cur.lastrowid


def add_events(store: Store, rows: Iterable[tuple[Any, ...]]) -> None:
    """(trajectory_id, seq, tool, ok, params, ts, exit_code, duration_ms) rows."""
    store.conn.executemany(
        "INSERT INTO trajectory_events (trajectory_id, seq, tool, ok, params, ts, exit_code, "
        "duration_ms) VALUES (?,?,?,?,?,?,?,?)",
        rows,
    )


def rewards(store: Store) -> list[tuple[Any, ...]]:
    """(id, reward, domain, advantage) of every trajectory, by id."""
    return store.conn.execute("SELECT id, reward, domain, advantage FROM trajectories ORDER BY id").fetchall()


def set_advantages(store: Store, rows: Iterable[tuple[float, float, int]]) -> None:
    """(advantage, updated_at, id) rows."""
    store.conn.executemany("UPDATE trajectories SET advantage=?, updated_at=? WHERE id=?", rows)


def replace_domains(store: Store, rows: Iterable[tuple[Any, ...]]) -> None:
    """Every domain baseline, anew: (domain, n, mean, baseline, sigma, updated_at) rows."""
    store.conn.execute("DELETE FROM trajectory_domains")
    store.conn.executemany(
        "INSERT INTO trajectory_domains (domain, n, mean, baseline, sigma, updated_at) VALUES (?,?,?,?,?,?)",
        rows,
    )
