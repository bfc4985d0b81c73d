"""When to retrain: the four plasticity triggers (docs/reference/karl.md §9), with a drift that works.

The published drift window read numeric timestamps the recorder never wrote, so it always said
`no_data`. Here the window is taken over the trajectories' numeric `ended_at` (unix seconds,
NaN when unknown), and each domain's baseline is the smoothed baseline of §4 (docs/reference/karl.md §12(c)).

| trigger | fires when |
|---|---|
| stale | never trained, or more than 72 h since the last training |
| volume | at least 50 trajectories added since the last training |
| drift | over the last 24 h: (baselines weighted by recent counts) − (recent mean) > 0.08 |
| coverage | a domain with at least 5 trajectories that the last training did not cover |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.trajectories.scoring.advantages import DomainBaseline, domain_key

STALE_HOURS = 72.0
NEW_TRAJECTORIES_TRIGGER = 50
DRIFT_THRESHOLD = 0.08
DRIFT_WINDOW_S = 24 * 3600.0
COVERAGE_GAP_THRESHOLD = 5
DEFAULT_BASELINE = 0.5  # a domain without a stored baseline


@dataclass(frozen=True)
class TrainState:
    """What the last training saw: when (unix seconds, None if never), how many trajectories,
    which domains."""

    ts: float | None = None
    count: int = 0
    domains: frozenset[str] = frozenset()
    version: str | None = None


@dataclass(frozen=True)
class Trigger:
    kind: str  # stale | volume | drift | coverage
    detail: str  # one line, with the numbers
    drift: dict[str, float] = field(default_factory=dict)  # per domain, for kind == "drift"


@dataclass(frozen=True)
class Drift:
    """Drift over the recent window; `global_drift` is None when no trajectory is recent (no data)."""

    global_drift: float | None
    recent: int
    per_domain: dict[str, float]


@dataclass(frozen=True)
class Triggers:
    fired: list[Trigger]
    drift: Drift

    @property
    def should_retrain(self) -> bool:
        return bool(self.fired)

    @property
    def kinds(self) -> list[str]:
        return [t.kind for t in self.fired]


# Per domain: the §4 baselines, or just their smoothed values (as the store keeps them).
Baselines = Mapping[str, DomainBaseline] | Mapping[str, float]


def drift(
    now: float,
    rewards: np.ndarray,
    domains: Sequence[str | None],
    timestamps: np.ndarray,
    baselines: Baselines,
) -> Drift:
    """§9 drift over trajectories that ended in the last 24 h: drift_d = baseline_d − recent mean_d."""
    r = np.asarray(rewards, dtype=float)
    ts = np.asarray(timestamps, dtype=float)
    recent = np.flatnonzero(ts >= now - DRIFT_WINDOW_S)  # NaN (unknown) is never recent
    if len(recent) == 0:
        return Drift(None, 0, {})
    keys = [domain_key(domains[i]) for i in recent.tolist()]
    index: dict[str, int] = {}
    inverse = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    n = np.bincount(inverse, minlength=len(index))
    recent_mean = np.bincount(inverse, r[recent], len(index)) / n
    base = np.array([_baseline(baselines, k) for k in index])
    per_domain = {k: float(base[i] - recent_mean[i]) for i, k in enumerate(index)}
    global_drift = float((base * n).sum() / n.sum() - r[recent].mean())
    return Drift(global_drift, len(recent), per_domain)


def _baseline(baselines: Baselines, key: str) -> float:
    value = baselines.get(key)
    if value is None:
        return DEFAULT_BASELINE
    return float(value.baseline if isinstance(value, DomainBaseline) else value)


def compute_triggers(
    now: float,
    state: TrainState,
    rewards: np.ndarray,
    domains: Sequence[str | None],
    timestamps: np.ndarray,
    baselines: Baselines,
) -> Triggers:
    """Every trigger of §9 that fires for the whole store, given the last training's state."""
    fired = [t for t in (_stale(now, state), _volume(len(rewards), state)) if t]
    d = drift(now, rewards, domains, timestamps, baselines)
    if d.global_drift is not None and d.global_drift > DRIFT_THRESHOLD:
        worst = max(d.per_domain, key=lambda k: d.per_domain[k])
        fired.append(
            Trigger(
                "drift",
                f"rewards of the last 24 h are {d.global_drift:.3f} below their baselines "
                f"(> {DRIFT_THRESHOLD}) over {d.recent} trajectories; worst {worst} "
                f"{d.per_domain[worst]:+.3f}",
                dict(d.per_domain),
            )
        )
    gap = _coverage(domains, state)
    if gap:
        fired.append(gap)
    return Triggers(fired, d)


def evaluate_triggers(
    *,
    now: float,
    rewards: np.ndarray,
    domains: Sequence[str | None],
    timestamps: np.ndarray,
    baselines: Baselines,
    last_train_ts: float | None = None,
    last_train_count: int = 0,
    trained_domains: Iterable[str] = (),
) -> list[Trigger]:
    """The fired triggers only (empty: no retraining needed), from the last training's plain values."""
    state = TrainState(last_train_ts, last_train_count, frozenset(trained_domains))
    return compute_triggers(now, state, rewards, domains, timestamps, baselines).fired


def _stale(now: float, state: TrainState) -> Trigger | None:
    if state.ts is None:
        return Trigger("stale", "never trained")
    hours = (now - state.ts) / 3600.0
    if hours > STALE_HOURS:
        return Trigger("stale", f"{hours:.1f} h since the last training (> {STALE_HOURS:g} h)")
    return None


def _volume(count: int, state: TrainState) -> Trigger | None:
    added = count - state.count
    if added >= NEW_TRAJECTORIES_TRIGGER:
        return Trigger(
            "volume", f"{added} new trajectories since the last training (>= {NEW_TRAJECTORIES_TRIGGER})"
        )
    return None


def _coverage(domains: Sequence[str | None], state: TrainState) -> Trigger | None:
    counts: dict[str, int] = {}
    for d in domains:
        key = domain_key(d)
        counts[key] = counts.get(key, 0) + 1
    gaps = {k: n for k, n in counts.items() if n >= COVERAGE_GAP_THRESHOLD and k not in state.domains}
    if not gaps:
        return None
    listed = ", ".join(f"{k} ({n})" for k, n in sorted(gaps.items(), key=lambda kv: (-kv[1], kv[0])))
    return Trigger(
        "coverage",
        f"{len(gaps)} domain(s) with >= {COVERAGE_GAP_THRESHOLD} trajectories never trained: {listed}",
    )
