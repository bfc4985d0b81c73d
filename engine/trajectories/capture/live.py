"""Live capture, engine side: hook payloads from the spool into the store, assembled into scored turns.

`carl hook` only drops each payload into `$CARL_HOME/spool/hooks/` (milliseconds, nothing else),
so an agent never waits on the store and nothing is lost while the engine is down. The engine
moves the spool into the `hook_events` table (durable first, files removed after the commit),
re-assembles every session that received payloads, and saves the turns: scoring, domains, one
advantage pass over the store (docs/reference/karl.md §12(c)), and the retraining triggers for the TUI.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.store import Store
from engine.trajectories.config import TrajectoryConfig
from engine.trajectories.store import SaveResult, save

SPOOL_BATCH = 2000  # payloads moved per tick: a burst drains over a few ticks, never one long stall
RECENT_S = 24 * 3600.0  # sessions re-checked for turns that ended without Stop
SWEEP_EVERY_S = 300.0


@dataclass
class LiveResult:
    payloads: int = 0
    sessions: int = 0
    saved: SaveResult | None = None


def ingest_spool(
    store: Store, home: Path, config: TrajectoryConfig, *, now: float | None = None
) -> LiveResult:
    """Move waiting payloads into the store and save the turns of the sessions they belong to."""
    from engine.trajectories.capture.hooks import read_spool, remove_spool

    items = read_spool(home, limit=SPOOL_BATCH)
    if not items:
        return LiveResult()
    with store.transaction():
        store.conn.executemany(
            "INSERT INTO hook_events (session_id, event, received_at, payload, assembled) VALUES (?,?,?,?,0)",
            [
                (
                    i.session_id,
                    str(i.payload.get("hook_event_name") or ""),
                    i.received_at,
                    json.dumps(i.payload),
                )
                for i in items
            ],
        )
    remove_spool(items)  # only now: a crash before this line re-inserts nothing it lost
    sessions = sorted({i.session_id for i in items if i.session_id})
    saved = assemble_sessions(store, sessions, config, now=now)
    return LiveResult(len(items), len(sessions), saved)


def assemble_sessions(
    store: Store, sessions: list[str], config: TrajectoryConfig, *, now: float | None = None
) -> SaveResult:
    """Re-assemble whole sessions from their stored payloads (pure and idempotent: upsert by uid)."""
    from engine.trajectories.capture.hooks import assemble

    trajectories = []
    for session_id in sessions:
        rows = store.conn.execute(
            "SELECT received_at, payload FROM hook_events WHERE session_id=? ORDER BY id", (session_id,)
        ).fetchall()
        items = [{"received_at": r[0], "payload": json.loads(r[1])} for r in rows]
        assembly = assemble(items, detector=config.detector, now=now)
        trajectories += assembly.trajectories
    result = save(store, trajectories, table=config.table)
    if result.stored:
        refresh_plasticity(store, now=now)
    return result


def sweep_open_turns(store: Store, config: TrajectoryConfig, *, now: float | None = None) -> SaveResult:
    """Sessions active in the last day, re-assembled so a turn whose Stop never came gets closed."""
    now = time.time() if now is None else now
    rows = store.conn.execute(
        "SELECT session_id FROM hook_events GROUP BY session_id HAVING max(received_at) > ?",
        (now - RECENT_S,),
    ).fetchall()
    return assemble_sessions(store, [r[0] for r in rows if r[0]], config, now=now)


def refresh_plasticity(store: Store, *, now: float | None = None) -> dict[str, Any]:
    """The retraining triggers over the whole store, kept in kv for the control room."""
    from engine.trajectories.scoring.plasticity import evaluate_triggers

    now = time.time() if now is None else now
    rows = store.conn.execute(
        "SELECT reward, domain, coalesce(ended_at, created_at) FROM trajectories"
    ).fetchall()
    baselines = {r[0]: r[1] for r in store.conn.execute("SELECT domain, baseline FROM trajectory_domains")}
    last_train = store.kv("last_train") or {}
    triggers = evaluate_triggers(
        now=now,
        rewards=np.array([r[0] or 0.0 for r in rows], dtype=np.float64),
        domains=[r[1] for r in rows],
        timestamps=np.array([r[2] or 0.0 for r in rows], dtype=np.float64),
        baselines=baselines,
        last_train_ts=last_train.get("ts"),
        last_train_count=int(last_train.get("count") or 0),
        trained_domains=set(last_train.get("domains") or []),
    )
    value = {
        "computed_at": now,
        "triggers": [t if isinstance(t, dict) else t.__dict__ for t in triggers],
        "count": len(rows),
    }
    store.set_kv("plasticity", value)
    return value
