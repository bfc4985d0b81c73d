"""Live capture, engine side: hook payloads from the spool into the store, assembled into scored turns.

`carl hook` only drops each payload into `$CARL_HOME/spool/hooks/` (milliseconds, nothing else),
so an agent never waits on the store and nothing is lost while the engine is down. The engine
moves the spool into the `hook_events` table (durable first, files removed after the commit),
re-assembles every session that received payloads, and saves the turns: scoring, domains, one
advantage pass over the store (docs/reference/karl.md §12(c)), and the retraining triggers for the TUI.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.faults import store_trouble
from engine.redact import redact_value
from engine.store import Store
from engine.store import trajectories as trajectory_rows
from engine.text import one_line, storable
from engine.trajectories.store import SaveResult, save
from engine.trajectories.trajectory_settings import TrajectoryConfig

if TYPE_CHECKING:
    from engine.trajectories.capture.hooks import SpoolItem

log = logging.getLogger("carl.hooks")

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
    try:
        with store.transaction():
            trajectory_rows.add_hook_payloads(store, [_row(i) for i in items])
    except Exception as exc:
        if store_trouble(exc):
            raise  # the store's own trouble: the files stay in the spool for the next tick
        items = _store_one_by_one(store, home, items)  # one file the store refuses is moved aside
    remove_spool(items)  # only now: a crash before this line re-inserts nothing it lost
    sessions = sorted({i.session_id for i in items if i.session_id})
    saved = assemble_sessions(store, sessions, config, now=now)
    return LiveResult(len(items), len(sessions), saved)


def _row(item: SpoolItem) -> tuple[str, str, float, str]:
    # json.dumps escapes what UTF-8 cannot take; the spool reader made the payload's text storable. The
    # payload is kept whole (sessions are re-assembled from it), so its secrets go before it is stored.
    return (
        item.session_id,
        storable(str(item.payload.get("hook_event_name") or "")),
        item.received_at,
        json.dumps(redact_value(item.payload)),
    )


def _store_one_by_one(store: Store, home: Path, items: list[SpoolItem]) -> list[SpoolItem]:
    """Each payload in a transaction of its own; one the store refuses goes to spool/bad with why.
    Returns those stored."""
    from engine.trajectories.capture.hooks import quarantine

    stored = []
    for item in items:
        try:
            with store.transaction():
                trajectory_rows.add_hook_payloads(store, [_row(item)])
        except Exception as exc:
            if store_trouble(exc):
                raise
            quarantine(home, item.path, f"cannot be stored: {type(exc).__name__}: {exc}")
            continue
        stored.append(item)
    return stored


def assemble_sessions(
    store: Store, sessions: list[str], config: TrajectoryConfig, *, now: float | None = None
) -> SaveResult:
    """Re-assemble whole sessions from their stored payloads (pure and idempotent: upsert by uid).

    A session that cannot be assembled or saved is logged (once per session and reason) and left out;
    the others are saved, and it is tried again with its next payload or sweep."""
    from engine.trajectories.capture.hooks import assemble

    by_session = {}
    for session_id in sessions:
        rows = trajectory_rows.session_payloads(store, session_id)
        try:
            items = [{"received_at": r[0], "payload": json.loads(r[1])} for r in rows]
            by_session[session_id] = assemble(items, detector=config.detector, now=now).trajectories
        except Exception as exc:
            _session_failed(session_id, exc)
    trajectories = [t for found in by_session.values() for t in found]
    try:
        result = save(store, trajectories, table=config.table)
    except Exception as exc:
        if store_trouble(exc) or len(by_session) < 2:
            raise
        result = _save_each(store, by_session, config)  # one session the store refuses costs only itself
    if result.stored:
        refresh_plasticity(store, now=now)
    return result


def _save_each(store: Store, by_session: dict[str, list[Any]], config: TrajectoryConfig) -> SaveResult:
    total = SaveResult()
    for session_id, trajectories in by_session.items():
        try:
            result = save(store, trajectories, table=config.table)
        except Exception as exc:
            if store_trouble(exc):
                raise
            _session_failed(session_id, exc)
            continue
        total.new += result.new
        total.updated += result.updated
        total.unchanged += result.unchanged
    return total


_said: dict[str, str] = {}  # session -> the last failure logged for it


def _session_failed(session_id: str, exc: Exception) -> None:
    message = one_line(f"hooks: session {session_id}: {type(exc).__name__}: {exc}")
    if _said.get(session_id) != message:
        if len(_said) > 1000:  # a memory of the recent failures only
            _said.clear()
        _said[session_id] = message
        log.warning("%s", message)


def sweep_open_turns(store: Store, config: TrajectoryConfig, *, now: float | None = None) -> SaveResult:
    """Sessions active in the last day, re-assembled so a turn whose Stop never came gets closed."""
    now = time.time() if now is None else now
    sessions = trajectory_rows.sessions_active_since(store, now - RECENT_S)
    return assemble_sessions(store, [s for s in sessions if s], config, now=now)


def refresh_plasticity(store: Store, *, now: float | None = None) -> dict[str, Any]:
    """The retraining triggers over the whole store, kept in kv for the control room."""
    from engine.trajectories.scoring.plasticity import evaluate_triggers

    now = time.time() if now is None else now
    rows = trajectory_rows.rewards_over_time(store)
    baselines = trajectory_rows.baselines(store)
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
