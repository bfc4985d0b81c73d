"""When an observed run ends: the one place that decides it for the runs the engine follows
(docs/guide/observe.md, "When a run ends").

A tracker that records an end says so itself, and its reader sets the run's status: W&B's exit record
(wandb_run.py: finished, or failed with a non-zero exit code), MLflow's run status (mlflow_store.py:
FINISHED, FAILED, KILLED as stopped), transformers' last `log_history` entry (trainer_state.py: finished).
Most writers record no end: veRL's file logger and TensorBoard close their files, Trackio 0.43 keeps no run
status, vf-eval writes its last episode. A followed run whose sources have not grown for `quiet_seconds`
since its last sign of life is then `finished` — or `stopped`, with the reason, when it logged a planned
number of steps and did not reach it — and the engine's follow (daemon/loop.py) calls `settle` for that.
A run so ended turns back to `running` as soon as any of its sources grows again (a paused writer, a
resumed run).
"""

from __future__ import annotations

import statistics
import time

from engine.durations import compact_duration
from engine.store import Store
from engine.store.observed import (
    ENDED_PREFIX,
    ended_by_quiet,
    followed_runs,
    forget_ended,
    step_walls,
)

# A run is quiet after QUIET_STEPS of its own typical step intervals without a sign of life, and never before
# QUIET_MIN_SECONDS: TensorBoard's writer flushes every 120 s (SummaryWriter flush_secs), so a live
# TensorBoard run can look still for two minutes, and a checkpoint or an evaluation between steps takes a few
# more. A run whose steps take ten minutes (long rollouts) is not ended before fifty.
QUIET_MIN_SECONDS = 300.0
QUIET_STEPS = 5
STEPS_MEASURED = 20  # the newest steps whose intervals give the typical one (their median)
ENDED = "ended"  # the run's event that says why it ended
RESUMED = "resumed"  # ... and that it grew again


def quiet_seconds(store: Store, run_id: int) -> float:
    """How long this run may be still before it has ended."""
    walls = step_walls(store, run_id, STEPS_MEASURED)
    gaps = [b - a for a, b in zip(walls, walls[1:], strict=False) if b > a]
    typical = statistics.median(gaps) if gaps else 0.0
    return max(QUIET_MIN_SECONDS, QUIET_STEPS * typical)


def settle(store: Store, now: float | None = None) -> list[int]:
    """End the followed runs gone quiet, and take back to running those ended so that grew again; returns the
    ids of the runs whose status changed."""
    now = time.time() if now is None else now
    changed = []
    for run in followed_runs(store, ("running",)):
        quiet = now - run.life
        if quiet < QUIET_MIN_SECONDS or quiet < quiet_seconds(store, run.id):
            continue
        at = f"step {run.last_step:,}" if run.last_step is not None else "its start"
        if run.max_steps and run.last_step is not None and run.last_step < run.max_steps:
            status = "stopped"
            reason = (
                f"no new data for {compact_duration(quiet)} at step {run.last_step:,} of {run.max_steps:,}"
            )
        else:
            status, reason = "finished", f"no new data for {compact_duration(quiet)} after {at}"
        with store.transaction():
            store.update_run(
                run.id, status=status, ended_at=run.life, error=reason if status == "stopped" else None
            )
            store.set_kv(f"{ENDED_PREFIX}{run.id}", run.life)
            store.add_event(run.id, run.last_step, ENDED, f"{status}: {reason}")
        changed.append(run.id)
    ended = ended_by_quiet(store)
    for run in followed_runs(store, ("finished", "stopped")):
        if run.id not in ended:
            continue
        if run.ended_at != ended[run.id]:  # its tracker recorded an end since: that end stands
            with store.transaction():
                forget_ended(store, run.id)
        elif run.life > ended[run.id]:
            with store.transaction():
                store.update_run(run.id, status="running", ended_at=None, error=None)
                forget_ended(store, run.id)
                store.add_event(run.id, run.last_step, RESUMED, "its source grew again")
            changed.append(run.id)
    return changed
