"""Agent session traces in carl.db: `trajectories`, their first events (`trajectory_events`) and the domain
baselines (`trajectory_domains`), as engine/trajectories/store.py saves them, inside its transactions; the
hook payloads live capture keeps (`hook_events`); and what the `carl trajectories` commands, the sampler and
the retraining triggers read of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .db import Store

HookRow = tuple[str, str, float, str]  # (session_id, event, received_at, payload JSON)


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


# -- hook payloads (engine/trajectories/capture/live.py) -------------------------------------------


def add_hook_payloads(store: Store, rows: Iterable[HookRow]) -> None:
    """Hook payloads moved from the spool, not assembled yet."""
    store.conn.executemany(
        "INSERT INTO hook_events (session_id, event, received_at, payload, assembled) VALUES (?,?,?,?,0)",
        rows,
    )


def session_payloads(store: Store, session_id: str) -> list[tuple[float, str]]:
    """(received_at, payload JSON) of every payload stored for a session, in arrival order."""
    return store.conn.execute(
        "SELECT received_at, payload FROM hook_events WHERE session_id=? ORDER BY id", (session_id,)
    ).fetchall()


def sessions_active_since(store: Store, since: float) -> list[str | None]:
    """The sessions whose newest payload came after `since`."""
    rows = store.conn.execute(
        "SELECT session_id FROM hook_events GROUP BY session_id HAVING max(received_at) > ?", (since,)
    )
    return [r[0] for r in rows]


def hook_payload_count(store: Store) -> int:
    return int(store.conn.execute("SELECT count(*) FROM hook_events").fetchone()[0])


# -- what the commands and the retraining triggers read --------------------------------------------


def count(store: Store) -> int:
    """How many trajectories are stored."""
    return int(store.conn.execute("SELECT count(*) FROM trajectories").fetchone()[0])


def count_with_holdout(store: Store) -> tuple[int, int]:
    """(trajectories, of which held out for evaluation)."""
    total, holdout = store.conn.execute(
        "SELECT count(*), coalesce(sum(holdout), 0) FROM trajectories"
    ).fetchone()
    return total, holdout


def newest(store: Store, limit: int, domain: str | None = None) -> list[tuple[Any, ...]]:
    """(id, session_id, agent, domain or '_global', tool_count, success_rate, reward, advantage, holdout,
    prompt) of the newest `limit` trajectories, newest first; of one domain ('_global': those without one)
    when given."""
    where, params = ("WHERE coalesce(domain, '_global')=?", [domain]) if domain else ("", [])
    return store.conn.execute(
        "SELECT id, session_id, agent, coalesce(domain, '_global'), tool_count, success_rate, reward, "
        f"advantage, holdout, prompt FROM trajectories {where} ORDER BY id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()


def domains(store: Store) -> list[tuple[str, int, float, float, float]]:
    """(domain, n, mean, baseline, sigma) of every domain baseline, the largest first."""
    return store.conn.execute(
        "SELECT domain, n, mean, baseline, sigma FROM trajectory_domains ORDER BY n DESC"
    ).fetchall()


def baselines(store: Store) -> dict[str, float]:
    """domain -> its baseline."""
    return {r[0]: r[1] for r in store.conn.execute("SELECT domain, baseline FROM trajectory_domains")}


def signals(store: Store) -> list[str | None]:
    """The five signals (JSON text) of every trajectory."""
    return [r[0] for r in store.conn.execute("SELECT signals FROM trajectories").fetchall()]


def rewards_over_time(store: Store) -> list[tuple[float | None, str | None, float | None]]:
    """(reward, domain, ended_at or created_at) of every trajectory: what the retraining triggers judge."""
    return store.conn.execute(
        "SELECT reward, domain, coalesce(ended_at, created_at) FROM trajectories"
    ).fetchall()


def last_loss(store: Store, run_id: int) -> float | None:
    """The loss at a run's newest step that logged one (an adapter's training run); None: none logged."""
    row = store.conn.execute(
        "SELECT value FROM metrics WHERE run_id=? AND key='loss' ORDER BY step DESC LIMIT 1", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


# -- the sampler's records (engine/trajectories/training/flowrl_sampler.py) --------------------------------
# Plain functions over a connection: the sampler reads the writer's, or one its caller holds.

SCORED_COLUMNS = (
    "id, uid, domain, skill, reward, advantage, prompt, cwd, grade, tool_count, total_tools,"
    " success_rate, holdout, outcome, started_at, ended_at"
)


def scored(store: Store) -> Iterator[tuple[Any, ...]]:
    """Every trajectory's SCORED_COLUMNS, in id order, a row at a time."""
    return store.conn.execute(f"SELECT {SCORED_COLUMNS} FROM trajectories ORDER BY id")


def stored_events(store: Store) -> Iterator[tuple[Any, ...]]:
    """(trajectory_id, tool, ok, params, ts, exit_code, duration_ms) of every stored event, by trajectory
    and order, a row at a time."""
    return store.conn.execute(
        "SELECT trajectory_id, tool, ok, params, ts, exit_code, duration_ms FROM trajectory_events"
        " ORDER BY trajectory_id, seq"
    )
