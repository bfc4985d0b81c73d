"""Write each run's phase and health into the store, from the rows the store already has."""

from __future__ import annotations

import json
import sqlite3
import time

import numpy as np

from .phases import RunSignals, assess_health, classify_phase, crystallization_step

CRYSTALLIZATION_CONFIDENCE = 0.8  # below this the chart shows no crystallization marker
HORIZON_STEPS = 2000  # phase and health look at the newest steps only, so a 1M-step run costs the same


def _series(
    conn: sqlite3.Connection, run_id: int, keys: tuple[str, ...], since: int
) -> tuple[np.ndarray, np.ndarray]:
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
    phi_steps, phi = _series(conn, run_id, ("phi/mean",), since)
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
    mark_crystallization(conn, run_id, phi_steps, phi)


def mark_crystallization(conn: sqlite3.Connection, run_id: int, steps: np.ndarray, phi: np.ndarray) -> None:
    """Keep one 'crystallization' event per run, at the step the logistic fit finds, once the fit
    is confident; it moves if more data moves it."""
    finite = np.isfinite(phi)
    found = crystallization_step(steps[finite], phi[finite]) if finite.sum() >= 8 else None
    if found is None or found.confidence < CRYSTALLIZATION_CONFIDENCE:
        return
    detail = (
        f"Φ {found.phi_before:.3f} → {found.phi_after:.3f} over ~{found.width:.0f} steps "
        f"(confidence {found.confidence:.2f})"
    )
    current = conn.execute(
        "SELECT step, detail FROM events WHERE run_id=? AND kind='crystallization'", (run_id,)
    ).fetchall()
    if current == [(found.step, detail)]:
        return
    conn.execute("DELETE FROM events WHERE run_id=? AND kind='crystallization'", (run_id,))
    conn.execute(
        "INSERT INTO events (run_id, step, kind, detail, wall_time) VALUES (?,?,?,?,?)",
        (run_id, int(found.step), "crystallization", detail, time.time()),
    )


def analyze_runs(conn: sqlite3.Connection, run_ids: list[int], now: float | None = None) -> None:
    now = time.time() if now is None else now
    for run_id in run_ids:
        analyze_run(conn, run_id, now)
