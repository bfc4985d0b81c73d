"""Figures over seeds: a mean with its 95% t interval, and a paired t-test of two arms across seeds.

With one seed there is no interval (None); a paired test needs two seeds and some spread in the
differences (identical differences give p = 0 when they are non-zero, 1 when all are zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> dict[str, Any]:
    """{"mean", "ci95": [lo, hi] or None, "n"}: Student's t interval of the mean over the values."""
    from scipy import stats

    x = _finite(values)
    if not len(x):
        return {"mean": None, "ci95": None, "n": 0}
    mean = float(x.mean())
    if len(x) < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    sem = float(x.std(ddof=1)) / math.sqrt(len(x))
    half = float(stats.t.ppf(0.5 + level / 2, df=len(x) - 1)) * sem
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": int(len(x))}


def paired_delta(arm: Sequence[float | None], base: Sequence[float | None]) -> dict[str, Any]:
    """arm − base per seed (pairs where both are known): the mean Δ, its 95% CI and the paired t-test's p."""
    from scipy import stats

    pairs = [
        (a, b)
        for a, b in zip(arm, base, strict=True)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]
    diffs = [a - b for a, b in pairs]
    summary = mean_ci(diffs)
    p: float | None = None
    if len(diffs) >= 2:
        if np.ptp(diffs) == 0:
            p = 1.0 if diffs[0] == 0 else 0.0
        else:
            p = float(stats.ttest_rel([a for a, _ in pairs], [b for _, b in pairs]).pvalue)
    return {**summary, "p": p}
