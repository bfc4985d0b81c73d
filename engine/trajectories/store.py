"""Scored trajectories in carl.db: upsert by uid, then one advantage pass over the whole store.

Project rule 12(c) of docs/reference/karl.md: advantages are computed only after every record is scored, in
one pass over the store, and again whenever a record is added or re-scored. `save` does exactly that:
score what arrived, upsert it (a re-import or a re-assembled hook turn updates its row in place),
then recompute every advantage and the per-domain baselines the control room shows.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.store import Store
from engine.store import trajectories as trajectory_rows
from engine.trajectories.trajectory import MAX_STORED_EVENTS, Scored, Trajectory

HOLDOUT_SHARE = 0.1  # trajectories kept out of every sample, export and training, for evaluation


def is_holdout(uid: str, share: float = HOLDOUT_SHARE) -> bool:
    """Stable by uid: a re-import never moves a trajectory across the split."""
    return int(hashlib.sha1(uid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


@dataclass
class SaveResult:
    new: int = 0
    updated: int = 0
    unchanged: int = 0

    @property
    def stored(self) -> int:
        return self.new + self.updated


def _outcome(t: Trajectory) -> dict[str, Any]:
    flags = {
        "correction_detected": t.correction,
        "redo_detected": t.redo,
        "build_success": t.build_success,
        "session_continued": t.session_continued,
    }
    return (flags | {"recorded": t.recorded}) if t.recorded else flags


def _row(
    t: Trajectory, s: Scored, fingerprint: dict[str, Any], quality: dict[str, Any], now: float
) -> dict[str, Any]:
    return {
        "uid": t.uid,
        "session_id": t.session_id,
        "agent": t.agent,
        "source": t.source,
        "domain": t.domain,
        "skill": t.skill,
        "prompt": t.prompt,
        "cwd": t.cwd,
        "repo": t.git_repo,
        "turn_index": t.turn_index,
        "tool_count": t.total,
        "total_tools": t.total,
        "failures": t.failures,
        "success_rate": t.success_rate,
        "reward": s.reward,
        "signals": json.dumps(s.signals()),
        "components": json.dumps(s.components),
        "outcome": json.dumps(_outcome(t)),
        "fingerprint": json.dumps(fingerprint),
        "grade": quality.get("grade"),
        "started_at": t.started_at,
        "ended_at": t.ended_at,
        "duration_s": t.duration_s,
        "holdout": int(is_holdout(t.uid)),
        "updated_at": now,
    }


COMPARED = ("reward", "signals", "outcome", "domain", "skill", "tool_count", "prompt", "ended_at")


def upsert(
    store: Store, items: Sequence[tuple[Trajectory, Scored, dict[str, Any], dict[str, Any]]]
) -> SaveResult:
    """Insert new trajectories and update changed ones (by uid), with their first 50 events."""
    result = SaveResult()
    now = time.time()
    with store.transaction():
        for t, s, fingerprint, quality in items:
            row = _row(t, s, fingerprint, quality, now)
            existing = trajectory_rows.stored(store, t.uid, COMPARED)
            if existing is not None:
                if tuple(existing[1:]) == tuple(row[k] for k in COMPARED):
                    result.unchanged += 1
                    continue
                traj_id = existing[0]
                trajectory_rows.replace(store, traj_id, row)
                result.updated += 1
            else:
                row["created_at"] = now
                row["advantage"] = 0.0  # set by the pass over the whole store below
                traj_id = trajectory_rows.insert(store, row)
                result.new += 1
            trajectory_rows.add_events(
                store,
                [
                    (
                        traj_id,
                        i,
                        e.tool,
                        None if e.success is None else int(e.success),
                        json.dumps(e.params),
                        e.ts,
                        e.exit_code,
                        e.duration_ms,
                    )
                    for i, e in enumerate(t.events[:MAX_STORED_EVENTS])
                ],
            )
    return result


def recompute_advantages(store: Store) -> dict[str, Any]:
    """docs/reference/karl.md §12(c): one z-score pass over every stored reward;
    writes advantages and baselines."""
    from engine.trajectories.scoring.advantages import compute_advantages

    stored = trajectory_rows.rewards(store)
    if not stored:
        return {}
    ids = np.array([r[0] for r in stored], dtype=np.int64)
    rewards = np.array([r[1] if r[1] is not None else 0.0 for r in stored], dtype=np.float64)
    domains = [r[2] for r in stored]
    old = np.array([r[3] if r[3] is not None else np.nan for r in stored], dtype=np.float64)
    advantages, baselines = compute_advantages(rewards, domains)
    changed = ~np.isclose(advantages, old, atol=5e-5) | np.isnan(old)
    now = time.time()
    with store.transaction():
        trajectory_rows.set_advantages(
            store, [(float(a), now, int(i)) for a, i in zip(advantages[changed], ids[changed], strict=True)]
        )
        trajectory_rows.replace_domains(
            store, [(b.domain, b.n, b.mean, b.baseline, b.sigma, now) for b in baselines.values()]
        )
    return baselines


def save(store: Store, trajectories: Sequence[Trajectory], *, table: Any = None) -> SaveResult:
    """Infer domains, score, upsert, and recompute every advantage (when anything changed)."""
    from engine.trajectories.scoring.domains import DomainTable
    from engine.trajectories.scoring.fingerprint import fingerprint
    from engine.trajectories.scoring.signals import quality, score_many

    if not trajectories:
        return SaveResult()
    table = table or DomainTable.default()
    for t in trajectories:
        t.skill, t.domain = table.infer(t)
    scored = score_many(trajectories)
    items = [(t, s, fingerprint(t), quality(t)) for t, s in zip(trajectories, scored, strict=True)]
    result = upsert(store, items)
    if result.stored:
        recompute_advantages(store)
    return result
