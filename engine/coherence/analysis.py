"""Write each run's phase and health into the store, from the rows the store already has."""

from __future__ import annotations

import json
import sqlite3
import time

import numpy as np

from .phases import RunSignals, assess_health, classify_phase

HORIZON_STEPS = 2000  # phase and health look at the newest steps only, so a 1M-step run costs the same


def _series(conn: sqlite3.Connection, run_id: int, keys: tuple[str, ...], since: int
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The first of `keys` the run has, as (steps, values) from step `since` on."""
    for key in keys:
        rows = conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND step>=? ORDER BY step",
            (run_id, key, since),
        ).fetchall()
        if rows:
            steps = np.array([r[0] for r in rows], dtype=np.int64)
            values = np.array([np.nan if r[1] is None else r[1] for r in rows], dtype=np.float64)
            return steps, values
    return np.empty(0, dtype=np.int64), np.empty(0)


def early_entropy(conn: sqlite3.Connection, run_id: int) -> np.ndarray:
    for key in ("phi/entropy", "entropy"):
        rows = conn.execute(
            "SELECT value FROM metrics WHERE run_id=? AND key=? ORDER BY step LIMIT ?", (run_id, key, 200)
        ).fetchall()
        if rows:
            return np.array([np.nan if r[0] is None else r[0] for r in rows], dtype=np.float64)
    return np.empty(0)


def analyze_run(conn: sqlite3.Connection, run_id: int, now: float | None = None) -> None:
    """Recompute phase and health of one run and store them (one short transaction)."""
    row = conn.execute("SELECT status, last_step, last_update FROM runs WHERE id=?", (run_id,)).fetchone()
    if row is None:
        return
    status, last_step, last_update = row
    since = max(0, (last_step or 0) - HORIZON_STEPS)
    _, phi = _series(conn, run_id, ("phi/mean",), since)
    loss_steps, loss = _series(conn, run_id, ("loss",), since)
    _, reward = _series(conn, run_id, ("reward", "rewards/task/mean"), since)
    _, entropy = _series(conn, run_id, ("phi/entropy", "entropy"), since)
    if since > 0:  # keep the run's early entropy as the collapse baseline
        entropy = np.concatenate([early_entropy(conn, run_id), entropy])
    _, zero_std = _series(conn, run_id, ("frac_reward_zero_std",), since)
    phase = classify_phase(phi)
    signals = RunSignals(status, last_update, phi, loss, loss_steps, reward, entropy, zero_std, phase)
    health = assess_health(signals, now)
    conn.execute(
        "UPDATE runs SET phase=?, health=?, health_reasons=? WHERE id=?",
        (phase, health.level, json.dumps(health.reasons), run_id),
    )


def analyze_runs(conn: sqlite3.Connection, run_ids: list[int], now: float | None = None) -> None:
    now = time.time() if now is None else now
    for run_id in run_ids:
        analyze_run(conn, run_id, now)
