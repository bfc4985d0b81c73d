"""Phase and health of a run, derived from the run's own signal (never from a log flag).

Phase (of the Phi mean series, over a trailing window):
  crystallizing  Phi rises by more than `K_NOISE` noise-widths over the window
  melting        Phi falls by more than `K_NOISE` noise-widths over the window
  knowing        flat, and high: in the top third of the run's own range, or Phi >= `KNOWING_PHI`
  guessing       flat and low
The noise width is the robust (MAD) standard deviation of step-to-step differences, scaled by
sqrt(window) because a random walk's drift over W steps grows like sqrt(W).

Health: green / yellow / red with the reasons that made it so (see `assess_health`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

K_NOISE = 3.0
KNOWING_PHI = 0.8
MIN_POINTS = 5
SILENT_AFTER_S = 120.0
CRASHED_AFTER_S = 600.0  # LEET's RunCrashTimeout
ZERO_STD_YELLOW = 0.5
ZERO_STD_RED = 0.9
ENTROPY_COLLAPSE_RATIO = 0.5


def trailing_window(n: int) -> int:
    return int(min(50, max(MIN_POINTS, n // 10)))


def robust_noise(values: np.ndarray) -> float:
    diffs = np.diff(values)
    if len(diffs) == 0:
        return 0.0
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return 1.4826 * mad / math.sqrt(2.0)


def classify_phase(phi: np.ndarray) -> str | None:
    """Phase of the newest point of a Phi mean series (finite values, step order)."""
    phi = phi[np.isfinite(phi)]
    n = len(phi)
    if n < MIN_POINTS:
        return None
    w = trailing_window(n)
    recent = phi[-w:]
    slope = float(np.polyfit(np.arange(len(recent), dtype=np.float64), recent, 1)[0])
    drift = slope * (len(recent) - 1)
    width = K_NOISE * max(robust_noise(phi), 1e-9) * math.sqrt(len(recent))
    if drift > width:
        return "crystallizing"
    if drift < -width:
        return "melting"
    lo, hi = float(phi.min()), float(phi.max())
    level = float(recent.mean())
    high_in_range = hi - lo > width and (level - lo) >= (hi - lo) * 2 / 3
    return "knowing" if high_in_range or level >= KNOWING_PHI else "guessing"


@dataclass
class Health:
    level: str = "green"
    reasons: list[str] = field(default_factory=list)

    def flag(self, level: str, reason: str) -> None:
        order = {"green": 0, "yellow": 1, "red": 2}
        if order[level] > order[self.level]:
            self.level = level
        self.reasons.append(reason)


@dataclass
class RunSignals:
    """The recent signals of a run that health looks at; any may be empty."""

    status: str
    last_update: float | None
    phi: np.ndarray
    loss: np.ndarray
    loss_steps: np.ndarray
    reward: np.ndarray
    entropy: np.ndarray
    zero_std: np.ndarray
    phase: str | None = None


def assess_health(sig: RunSignals, now: float | None = None) -> Health:
    now = time.time() if now is None else now
    health = Health()
    if sig.status == "running" and sig.last_update:
        quiet = now - sig.last_update
        if quiet >= CRASHED_AFTER_S:
            health.flag("red", f"no new step for {quiet / 60:.0f} min: presumed crashed")
        elif quiet >= SILENT_AFTER_S:
            health.flag("yellow", f"silent for {quiet / 60:.0f} min")
    bad_loss = ~np.isfinite(sig.loss)
    if bad_loss.any():
        health.flag("red", f"loss is not finite at step {int(sig.loss_steps[np.argmax(bad_loss)])}")
    zero_std = sig.zero_std[np.isfinite(sig.zero_std)]
    if len(zero_std):
        frac = float(zero_std[-trailing_window(len(zero_std)) :].mean())
        if frac >= ZERO_STD_RED:
            health.flag("red", f"no learning signal: {frac:.0%} of groups have zero reward std")
        elif frac > ZERO_STD_YELLOW:
            health.flag("yellow", f"{frac:.0%} of groups have zero reward std")
    reward = sig.reward[np.isfinite(sig.reward)]
    if len(reward) >= MIN_POINTS:
        starved = float(np.mean(np.abs(reward) < 1e-6))
        if starved > 0.5:
            health.flag("red", f"reward starvation: {starved:.0%} of steps have zero reward")
    entropy = sig.entropy[np.isfinite(sig.entropy)]
    if len(entropy) >= 2 * MIN_POINTS:
        early = float(entropy[: max(MIN_POINTS, len(entropy) // 10)].mean())
        late = float(entropy[-trailing_window(len(entropy)) :].mean())
        if early > 0 and late < early * ENTROPY_COLLAPSE_RATIO:
            health.flag("yellow", f"entropy collapsed from {early:.3g} to {late:.3g} nats")
    if sig.phase == "crystallizing" and len(reward) >= 2 * MIN_POINTS:
        w = trailing_window(len(reward))
        noise = max(robust_noise(reward), 1e-9) * math.sqrt(w)
        rise = float(reward[-w:].mean() - reward[-2 * w : -w].mean()) if len(reward) >= 2 * w else 0.0
        if abs(rise) <= K_NOISE * noise:
            health.flag("yellow", "coherence trap: Phi rising while task reward is flat")
    if not health.reasons:
        health.reasons.append("training dynamics healthy")
    return health
