"""Phase of a run, and the step where it crystallized, derived from the run's own signal
(never from a log flag).

Phase (of the Phi mean series, over a trailing window):
  crystallizing  Phi rises by more than `K_NOISE` noise-widths over the window
  melting        Phi falls by more than `K_NOISE` noise-widths over the window
  knowing        flat, and high: in the top third of the run's own range, or Phi >= `KNOWING_PHI`
  guessing       flat and low
The noise width is the robust (MAD) standard deviation of step-to-step differences, scaled by
sqrt(window) because a random walk's drift over W steps grows like sqrt(W).

A run's health (green, yellow, red) is judged in health.py.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

K_NOISE = 3.0
KNOWING_PHI = 0.8
MIN_POINTS = 5


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


# --- per-step phases --------------------------------------------------------------------------


def _kth_of_two(ordered: list[float], split: int, center: float, k: int) -> float:
    """The k-th smallest (0-based) of |s - center| over a sorted list, where ordered[:split] < center.

    A[i] = center - ordered[split-1-i] and B[j] = ordered[split+j] - center are both ascending, so this
    is the classic k-th of two sorted arrays, by binary search on how many come from A.
    """
    len_a, len_b = split, len(ordered) - split

    def a(i: int) -> float:
        return center - ordered[split - 1 - i]

    def b(j: int) -> float:
        return ordered[split + j] - center

    lo, hi = max(0, k + 1 - len_b), min(k + 1, len_a)
    while lo < hi:
        i = (lo + hi) // 2  # try taking i + 1 from A and k - i from B
        if a(i) < b(k - i):  # A[i] is among the k + 1 smallest
            lo = i + 1
        else:
            hi = i
    i, j = lo, k + 1 - lo
    return max(([a(i - 1)] if i > 0 else []) + ([b(j - 1)] if j > 0 else []))


def _running_noise(values: np.ndarray) -> np.ndarray:
    """`robust_noise(values[:n])` for every n (0 where n < 2), in O(n log n) comparisons."""
    out = np.zeros(len(values))
    ordered: list[float] = []
    for n, diff in enumerate(np.diff(values).tolist(), start=2):
        bisect.insort(ordered, diff)
        size = len(ordered)
        half = size // 2
        med = ordered[half] if size % 2 else (ordered[half - 1] + ordered[half]) / 2
        split = bisect.bisect_left(ordered, med)
        if size % 2:
            mad = _kth_of_two(ordered, split, med, half)
        else:
            mad = (_kth_of_two(ordered, split, med, half - 1) + _kth_of_two(ordered, split, med, half)) / 2
        out[n - 1] = 1.4826 * mad / math.sqrt(2.0)
    return out


def phases_per_step(phi: np.ndarray) -> list[str | None]:
    """`classify_phase(phi[: i + 1])` for every i, without refitting every prefix from scratch.

    Non-finite points are skipped as `classify_phase` skips them (a point gets the phase of the finite
    values up to it). About 0.1 s for 10,000 points.
    """
    phi = np.asarray(phi, dtype=np.float64)
    finite = np.isfinite(phi)
    f = phi[finite]
    m = len(f)
    phases = np.full(m, None, dtype=object)
    if m >= MIN_POINTS:
        ns = np.arange(MIN_POINTS, m + 1)
        ws = np.minimum(50, np.maximum(MIN_POINTS, ns // 10))
        drift = np.empty(len(ns))
        level = np.empty(len(ns))
        for w in np.unique(ws):
            sel = np.flatnonzero(ws == w)
            windows = np.lib.stride_tricks.sliding_window_view(f, int(w))[ns[sel] - w]
            t = np.arange(w, dtype=np.float64) - (w - 1) / 2
            slope = windows @ t / float(t @ t)
            drift[sel] = slope * (w - 1)
            level[sel] = windows.mean(axis=1)
        noise = _running_noise(f)[ns - 1]
        width = K_NOISE * np.maximum(noise, 1e-9) * np.sqrt(ws)
        lo = np.minimum.accumulate(f)[ns - 1]
        hi = np.maximum.accumulate(f)[ns - 1]
        high = ((hi - lo > width) & ((level - lo) >= (hi - lo) * 2 / 3)) | (level >= KNOWING_PHI)
        flat = np.where(high, "knowing", "guessing")
        labels = np.where(drift > width, "crystallizing", np.where(drift < -width, "melting", flat))
        phases[MIN_POINTS - 1 :] = labels.astype(object)
    # Map back: point i has the phase of the finite prefix that ends at or before it.
    count = np.cumsum(finite)
    return [phases[c - 1] if c >= MIN_POINTS else None for c in count.tolist()]


# --- crystallization step ---------------------------------------------------------------------

FIT_BINS = 400  # longer series are averaged into this many bins for the grid search
_TEN_NINETY = 2.0 * math.log(9.0)  # logistic scale -> 10%-90% rise width


@dataclass(frozen=True)
class Crystallization:
    """Where the Phi mean series steps from low to high (a fitted logistic), and how sure that is.

    step        the observed step nearest the fitted midpoint
    midpoint    the fitted midpoint itself, in steps
    confidence  in [0, 1]: evidence for the step over a constant and a straight line, times its size
    phi_before  the fitted low plateau; phi_after the high one
    width       steps from 10% to 90% of the rise
    """

    step: int
    confidence: float
    phi_before: float
    phi_after: float
    width: float
    midpoint: float


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for any z


def _binned(u: np.ndarray, y: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(u)
    if n <= bins:
        return u, y, np.ones(n)
    idx = np.arange(n) * bins // n
    w = np.bincount(idx, minlength=bins).astype(np.float64)
    return np.bincount(idx, u) / w, np.bincount(idx, y) / w, w


def _grid_fit(
    u: np.ndarray, y: np.ndarray, w: np.ndarray, mids: np.ndarray, scales: np.ndarray
) -> tuple[float, float]:
    """The (midpoint, scale) on the grid whose weighted least-squares logistic fits best."""
    g = _sigmoid((u[None, None, :] - mids[:, None, None]) / scales[None, :, None])
    yc = y - np.average(y, weights=w)  # centred: keeps the normal-equation RSS well conditioned
    s0, sy, syy = w.sum(), (w * yc).sum(), (w * yc * yc).sum()
    sg, sgg, sgy = g @ w, (g * g) @ w, g @ (w * yc)
    den = s0 * sgg - sg * sg
    ok = den > 1e-12 * s0 * s0
    d = np.where(ok, (s0 * sgy - sg * sy) / np.where(ok, den, 1.0), 0.0)
    a = (sy - d * sg) / s0
    rss = np.where(ok, syy - a * sy - d * sgy, np.inf)
    i, j = np.unravel_index(int(np.argmin(rss)), rss.shape)
    return float(mids[i]), float(scales[j])


def _bic(rss: float, n: int, k: int) -> float:
    return n * math.log(rss / n) + k * math.log(n)


def crystallization_step(steps: np.ndarray, phi: np.ndarray, min_points: int = 8) -> Crystallization | None:
    """Fit Phi(step) = lo + (hi - lo) * sigmoid((step - mid) / scale) and judge it (numpy only).

    The fit is a grid search over (mid, scale), coarse then fine, with (lo, hi) solved by least squares
    at each grid point (series longer than FIT_BINS points are binned for the search, then the winner
    is refitted on every point). Confidence = evidence * size, where
      evidence = sigmoid((dBIC - 6) / 2), dBIC = BIC of the better of a constant and a straight line
                 minus BIC of the logistic (4 parameters), so a trend without a step scores low;
      size     = min(1, (hi - lo) / (3 * residual std)).
    None with fewer than `min_points` finite points, a constant series, or a fit that falls (hi <= lo:
    that is melting, not crystallization).
    """
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(phi, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    n = len(y)
    if n < min_points or x[-1] <= x[0]:
        return None
    rss_const = float(((y - y.mean()) ** 2).sum())
    if rss_const <= 0:
        return None
    span = x[-1] - x[0]
    u = (x - x[0]) / span
    ub, yb, wb = _binned(u, y, FIT_BINS)
    step_mid = 0.96 / 48
    mids = np.linspace(0.02, 0.98, 49)
    scales = np.geomspace(0.25 / len(ub), 0.3, 16)
    mid, scale = _grid_fit(ub, yb, wb, mids, scales)
    mids = np.linspace(mid - step_mid, mid + step_mid, 21)
    scales = scale * np.geomspace(0.6, 1.6, 11)
    mid, scale = _grid_fit(ub, yb, wb, mids, scales)

    g = _sigmoid((u - mid) / scale)
    design = np.column_stack([np.ones(n), g])
    (lo, rise), *_ = np.linalg.lstsq(design, y, rcond=None)
    if not rise > 0:
        return None
    floor = 1e-12 * rss_const  # a noiseless series must not take log(0)
    rss_log = max(float(((y - design @ np.array([lo, rise])) ** 2).sum()), floor)
    rss_lin = max(float(((y - np.polyval(np.polyfit(u, y, 1), u)) ** 2).sum()), floor)
    dbic = min(_bic(rss_const, n, 1), _bic(rss_lin, n, 2)) - _bic(rss_log, n, 4)
    evidence = float(_sigmoid(np.array((dbic - 6.0) / 2.0)))
    size = min(1.0, float(rise) / (3.0 * math.sqrt(rss_log / n)))
    midpoint = float(x[0] + mid * span)
    return Crystallization(
        step=int(round(x[int(np.argmin(np.abs(x - midpoint)))])),
        confidence=evidence * size,
        phi_before=float(lo),
        phi_after=float(lo + rise),
        width=_TEN_NINETY * scale * float(span),
        midpoint=midpoint,
    )
