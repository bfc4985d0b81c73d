"""The FlowRL sampler (docs/reference/karl.md §5) over the scored trajectories in carl.db.

docs/reference/karl.md §12(c): the advantage is read from the store (one z-score pass over the whole store
wrote it), never recomputed here. The hold-out trajectories (`holdout = 1`, stable by uid) are the evaluation
set: `load_records` leaves them out unless asked, and `sample` drops any that reach it anyway.
Unlike the published sampler, the random draws take a seed, so a batch can be reproduced.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine.store import Store
from engine.store import trajectories as trajectory_rows
from engine.trajectories.store import is_holdout

Strategy = Literal["uniform", "balanced", "advantage", "top_k"]
STRATEGIES: tuple[str, ...] = ("uniform", "balanced", "advantage", "top_k")
GLOBAL_DOMAIN = "_global"
TEMPERATURE = 2.0  # advantage weights: exp((A - max A) / T)
MIN_WEIGHT = 0.01  # so no record's chance is ever 0


@dataclass(frozen=True)
class Step:
    """One stored event (the first 50 of a trajectory): what a plan line describes."""

    tool: str
    ok: bool | None  # None: unknown, not a failure
    params: dict[str, str] = field(default_factory=dict)
    ts: float | None = None
    exit_code: int | None = None
    duration_ms: float | None = None


@dataclass
class Record:
    """A scored trajectory as sampling, export and evaluation read it."""

    id: int
    uid: str
    domain: str | None
    reward: float | None
    advantage: float | None
    prompt: str
    events: list[Step]
    grade: str | None
    tool_count: int
    cwd: str | None = None
    skill: str | None = None
    holdout: bool = False
    total_tools: int = 0
    successes: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    outcome: dict[str, Any] = field(default_factory=dict)  # the cross-turn signals

    @property
    def domain_key(self) -> str:
        return self.domain or GLOBAL_DOMAIN

    @property
    def tools(self) -> list[str]:
        return [e.tool for e in self.events]


# -- loading -----------------------------------------------------------------------------------


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _events(store: Store) -> dict[int, list[Step]]:
    out: dict[int, list[Step]] = {}
    for traj_id, tool, ok, params, ts, exit_code, duration_ms in trajectory_rows.stored_events(store):
        step = Step(
            tool or "unknown",
            None if ok is None else bool(ok),
            {str(k): str(v) for k, v in _json(params).items()},
            ts,
            exit_code,
            duration_ms,
        )
        out.setdefault(traj_id, []).append(step)
    return out


def _successes(events: list[Step], total: int, success_rate: float | None) -> int:
    # Counts are over every event, but only the first 50 are stored: count them when all are here.
    if total <= len(events) or success_rate is None:
        return sum(1 for e in events if e.ok is True)
    return round(success_rate * total)


def load_records(store: Store, *, include_holdout: bool = False) -> list[Record]:
    """Every stored trajectory with its stored events, in id order (the hold-out only when asked)."""
    events = _events(store)
    records = []
    for row in trajectory_rows.scored(store):
        (
            traj_id,
            uid,
            domain,
            skill,
            reward,
            advantage,
            prompt,
            cwd,
            grade,
            tool_count,
            total_tools,
            success_rate,
            holdout,
            outcome,
            started_at,
            ended_at,
        ) = row
        held = bool(holdout) if holdout is not None else is_holdout(uid)
        if held and not include_holdout:
            continue
        steps = events.get(traj_id, [])
        total = int(total_tools if total_tools is not None else tool_count or len(steps))
        records.append(
            Record(
                id=traj_id,
                uid=uid,
                domain=domain or None,
                reward=reward,
                advantage=advantage,
                prompt=prompt or "",
                events=steps,
                grade=grade,
                tool_count=int(tool_count or 0),
                cwd=cwd,
                skill=skill,
                holdout=held,
                total_tools=total,
                successes=_successes(steps, total, success_rate),
                started_at=started_at,
                ended_at=ended_at,
                outcome=_json(outcome),
            )
        )
    return records


# -- sampling ----------------------------------------------------------------------------------


def by_domain(records: Sequence[Record]) -> dict[str, list[Record]]:
    """Records grouped by domain key, domains in first-seen order."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(record.domain_key, []).append(record)
    return groups


def advantage_weights(records: Sequence[Record], temperature: float = TEMPERATURE) -> np.ndarray:
    """w_i = max(exp((A_i - max A) / T), 0.01), a missing A counting as 0; normalized to sum to 1."""
    adv = np.array([r.advantage if r.advantage is not None else 0.0 for r in records], dtype=np.float64)
    weights = np.maximum(np.exp((adv - adv.max()) / temperature), MIN_WEIGHT)
    return weights / weights.sum()


def _pick(rng: np.random.Generator, records: Sequence[Record], n: int, *, replace: bool) -> list[Record]:
    return [records[int(i)] for i in rng.choice(len(records), size=n, replace=replace)]


def _balanced(rng: np.random.Generator, pool: list[Record], size: int) -> list[Record]:
    groups = by_domain(pool)
    per_domain = max(1, size // len(groups))
    remainder = size - per_domain * len(groups)
    out: list[Record] = []
    for members in groups.values():
        n = per_domain
        # Published rule: a small domain (at most per_domain records) takes the spare draws.
        if len(members) <= per_domain and remainder > 0:
            n += 1
            remainder -= 1
        out += _pick(rng, members, n, replace=len(members) < n)
    rng.shuffle(out)
    return out[:size]


def sample(
    records: Sequence[Record],
    batch_size: int,
    strategy: Strategy = "balanced",
    *,
    min_reward: float | None = None,
    seed: int | None = None,
) -> list[Record]:
    """A batch by docs/reference/karl.md §5; hold-out records are never drawn.
    `seed` makes the draw reproducible."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sampling strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    pool = [r for r in records if not r.holdout]
    if min_reward is not None:
        pool = [r for r in pool if (r.reward if r.reward is not None else 0.0) >= min_reward]
    size = min(batch_size, len(pool))
    if size <= 0:
        return []
    rng = np.random.default_rng(seed)
    if strategy == "uniform":
        return _pick(rng, pool, size, replace=False)
    if strategy == "balanced":
        return _balanced(rng, pool, size)
    if strategy == "advantage":
        chosen = rng.choice(len(pool), size=size, replace=True, p=advantage_weights(pool))
        return [pool[int(i)] for i in chosen]
    ranked = sorted(pool, key=lambda r: r.reward if r.reward is not None else 0.0, reverse=True)  # stable
    return ranked[:size]


def format_sample(batch: Sequence[Record]) -> str:
    """A short table of a batch: one line per record."""
    lines = [f"{len(batch)} trajectories"]
    for r in batch:
        reward = "-" if r.reward is None else f"{r.reward:.3f}"
        adv = "-" if r.advantage is None else f"{r.advantage:+.2f}"
        lines.append(
            f"  #{r.id:<5} {r.domain_key:<14} R={reward} A={adv} {len(r.events):>2} tools  {r.prompt[:50]!r}"
        )
    return "\n".join(lines)
