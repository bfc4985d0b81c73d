"""Write each run's phase and health into the store, from the rows the store already has.

Health's RL rules read the run from the start of RL (`rl_start`): the first step with a reward, or, while a
run is still in its SFT warm-up, the step after the warm-up its config names.
Entropy collapse is judged from there. The async-RL series (mismatch, staleness) and throughput are read over
every step, with the run's configured staleness bound from its stored config (engine/coherence/staleness.py).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import numpy as np

from engine.store import run_health
from engine.system.box_health import box_flags

from .health import Flag, Health, RunSignals, assess_health
from .phases import classify_phase, crystallization_step
from .staleness import staleness_bound

if TYPE_CHECKING:
    from engine.store import Store, StoreReader

CRYSTALLIZATION_CONFIDENCE = 0.8  # below this the chart shows no crystallization marker
HORIZON_STEPS = 2000  # phase and health look at the newest steps only, so a 1M-step run costs the same
EARLY_ENTROPY_STEPS = 200  # the start of RL's entropy, kept as the collapse baseline past the horizon
EVALS_READ = 50  # the newest held-out evals the hacking rule compares
MISMATCH_KEYS = ("mismatch/kl", "mismatch/logprob_abs_diff/mean")  # the first a run has is judged
THROUGHPUT_KEYS = ("perf/tokens_per_s", "perf/tokens_per_s_per_gpu")
ENTROPY_KEYS = ("phi/entropy", "entropy")  # the first a run has is judged


def _series(
    db: Store | StoreReader,
    run_id: int,
    keys: tuple[str, ...],
    since: int,
    *,
    before: int | None = None,
    limit: int = -1,
) -> tuple[np.ndarray, np.ndarray]:
    """The first of `keys` the run has, as (steps, values) from step `since` on (before step `before`, at
    most `limit` of them, when given)."""
    for key in keys:
        found = run_health.metric_values(db, run_id, key, since, before=before, limit=limit)
        if found:
            steps = np.array([r[0] for r in found], dtype=np.int64)
            values = np.array([np.nan if r[1] is None else r[1] for r in found], dtype=np.float64)
            return steps, values
    return np.empty(0, dtype=np.int64), np.empty(0)


def run_config(db: Store | StoreReader, run_id: int) -> dict:
    """The run's stored config ({} when it has none, or none that reads as an object)."""
    text = run_health.stored_config(db, run_id)
    try:
        config = json.loads(text) if text else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def rl_start(db: Store | StoreReader, run_id: int) -> int | None:
    """The first step of RL: the first with a reward, else (a run still in its SFT warm-up) the step after the
    warm-up its config names; None for a run with neither (SFT, or a source that logs no reward)."""
    for key in ("reward", "rewards/task/mean"):
        step = run_health.first_metric_step(db, run_id, key)
        if step is not None:
            return step
    config = run_config(db, run_id)
    if config.get("method") != "grpo":
        return None
    warmup = config.get("sft_warmup_steps")
    return int(warmup) + 1 if isinstance(warmup, int) and warmup >= 0 else 1


def rl_entropy(db: Store | StoreReader, run_id: int, start: int, since: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the entropy the collapse rule reads: from `since` (the horizon, never before RL's
    `start`), after the first EARLY_ENTROPY_STEPS of RL, kept as the collapse baseline, when the horizon has
    passed them. The offline analyst (engine/diagnosis/digest.py) reads the same."""
    since = max(since, start)
    steps, values = _series(db, run_id, ENTROPY_KEYS, since)
    if since == start or not len(steps):
        return steps, values
    early_steps, early = _series(db, run_id, ENTROPY_KEYS, start, before=since, limit=EARLY_ENTROPY_STEPS)
    return np.concatenate([early_steps, steps]), np.concatenate([early, values])


def held_out_scores(db: Store | StoreReader, run_id: int) -> list[tuple[int, float]]:
    """(step, task reward) of the run's held-out evals, oldest first."""
    out = []
    for text in reversed(run_health.newest_eval_metrics(db, run_id, EVALS_READ)):
        try:
            metrics = json.loads(text or "{}")
        except ValueError:
            continue
        if not isinstance(metrics, dict):
            continue
        step, task = metrics.get("step"), metrics.get("task")
        if isinstance(step, int) and isinstance(task, int | float) and not isinstance(task, bool):
            out.append((step, float(task)))
    return out


def run_signals(db: Store | StoreReader, run_id: int) -> RunSignals | None:
    """What health looks at, read from the store (None: no such run)."""
    state = run_health.run_state(db, run_id)
    if state is None:
        return None
    status, last_step, last_update = state
    since = max(0, (last_step or 0) - HORIZON_STEPS)
    phi_steps, phi = _series(db, run_id, ("phi/mean",), since)
    loss_steps, loss = _series(db, run_id, ("loss",), since)
    start = rl_start(db, run_id)
    signals = RunSignals(status, last_update, phi, loss, loss_steps, np.empty(0), np.empty(0), np.empty(0))
    signals.phi_steps = phi_steps
    signals.phase = classify_phase(phi)
    signals.rl_start = start
    signals.box = [Flag(*f) for f in box_flags(run_health.system_reads(db), run_id, status, time.time())]
    # throughput is judged within one phase: an SFT warm-up runs far more tokens a second than GRPO's sampling
    throughput_since = since
    if start is not None and (last_step or 0) >= start:  # in RL now
        throughput_since = max(since, start)
    read_async(db, run_id, since, signals, throughput_since=throughput_since)
    if start is None:
        return signals
    rl_since = max(since, start)
    signals.reward_steps, signals.reward = _series(db, run_id, ("reward", "rewards/task/mean"), rl_since)
    signals.task_steps, signals.task = _series(db, run_id, ("rewards/task/mean", "reward"), rl_since)
    signals.entropy_steps, signals.entropy = rl_entropy(db, run_id, start, since)
    _, signals.zero_std = _series(db, run_id, ("frac_reward_zero_std",), rl_since)
    signals.clip_steps, signals.clip = _clip_series(db, run_id, rl_since)
    signals.kl_steps, signals.kl = _series(db, run_id, ("kl",), rl_since)
    signals.evals = held_out_scores(db, run_id)
    signals.verifier_steps, signals.verifier = _series(db, run_id, ("rewards/verifier/mean",), rl_since)
    signals.truncation_steps, signals.truncation = _series(
        db, run_id, ("completions/clipped_ratio",), rl_since
    )
    signals.opd_kl_steps, signals.opd_kl = _series(db, run_id, ("opd/kl",), rl_since)
    return signals


def read_async(
    db: Store | StoreReader, run_id: int, since: int, signals: RunSignals, *, throughput_since: int
) -> None:
    """The async-RL series from step `since`, the throughput from `throughput_since`, and the run's staleness
    bound."""
    signals.mismatch_key = _first_key(db, run_id, MISMATCH_KEYS)
    signals.mismatch_steps, signals.mismatch = _series(db, run_id, (signals.mismatch_key,), since)
    signals.staleness_max_steps, signals.staleness_max = _series(
        db, run_id, ("staleness/max", "staleness/mean"), since
    )
    _, signals.staleness_mean = _series(db, run_id, ("staleness/mean",), since)
    _, signals.staleness_violations = _series(db, run_id, ("staleness/violations",), since)
    if len(signals.staleness_max):
        framework = run_health.run_framework(db, run_id)
        signals.staleness_bound = staleness_bound(run_config(db, run_id), framework)
    signals.throughput_key = _first_key(db, run_id, THROUGHPUT_KEYS)
    signals.throughput_steps, signals.throughput = _series(
        db, run_id, (signals.throughput_key,), throughput_since
    )


def _first_key(db: Store | StoreReader, run_id: int, keys: tuple[str, ...]) -> str:
    """The first of `keys` the run has (one index seek each), else the first."""
    for key in keys:
        if run_health.has_metric(db, run_id, key):
            return key
    return keys[0]


def _clip_series(db: Store | StoreReader, run_id: int, since: int) -> tuple[np.ndarray, np.ndarray]:
    """The share of tokens clipped either side: clip_ratio/region_mean, else low + high."""
    steps, values = _series(db, run_id, ("clip_ratio/region_mean",), since)
    if len(values):
        return steps, values
    low_steps, low = _series(db, run_id, ("clip_ratio/low_mean",), since)
    high_steps, high = _series(db, run_id, ("clip_ratio/high_mean",), since)
    if not len(low) or not np.array_equal(low_steps, high_steps):
        return np.empty(0, dtype=np.int64), np.empty(0)
    return low_steps, low + high


def analyze_run(store: Store, run_id: int, now: float | None = None) -> Health | None:
    """Recompute phase and health of one run and store them (one short transaction); the health (None:
    no run)."""
    signals = run_signals(store, run_id)
    if signals is None:
        return None
    health = assess_health(signals, now)
    run_health.set_run_health(store, run_id, signals.phase, health.level, json.dumps(health.reasons))
    mark_crystallization(store, run_id, signals.phi_steps, signals.phi)
    return health


def mark_crystallization(store: Store, run_id: int, steps: np.ndarray, phi: np.ndarray) -> None:
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
    if run_health.crystallization_events(store, run_id) == [(found.step, detail)]:
        return
    run_health.replace_crystallization(store, run_id, int(found.step), detail, time.time())


def analyze_runs(store: Store, run_ids: list[int], now: float | None = None) -> dict[int, Health]:
    """Phase and health of each run; the health of each that exists."""
    now = time.time() if now is None else now
    judged = {}
    for run_id in run_ids:
        health = analyze_run(store, run_id, now)
        if health is not None:
            judged[run_id] = health
    return judged
