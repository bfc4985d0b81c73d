"""Smoothing a metric's line in the metrics explorer (carl_tui/explorer.py): none, TensorBoard's
debiased exponential moving average, or a centred moving average (Trackio's). Pure Python over the
points a chart draws (raw steps, or the bucket means of a long series), so it is tested on its own
against values worked out by hand (tests/test_app_explorer_smoothing.py).

TensorBoard's EMA, as its scalar chart computes it in the browser (`resmoothDataset`, vz_line_chart2):

    last_0 = 0
    last_t = w * last_{t-1} + (1 - w) * x_t         over the finite points x_1, x_2, ...
    shown_t = last_t / (1 - w**t)                   the debiasing: a start at 0 would pull it down

A non-finite point is drawn as it is and does not count in t; a series whose points are all equal
is drawn unsmoothed. Weight 0 is no smoothing; near 1, a long memory.

Trackio's centred moving average (`smoothData`, its frontend's dataProcessing.js): with the window k
taken as at least 3 and at most the number of points, each point becomes the mean of the finite
points within k // 2 places either side of it (fewer at the ends); a non-finite point stays as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.store import Series

KINDS = ("none", "ema", "mean")  # the order `s` cycles through
EMA_WEIGHTS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)  # what `[` and `]` step through
WINDOWS = (3, 5, 10, 20, 50, 100, 200)
DEFAULT_WEIGHT = 0.6  # TensorBoard's default
DEFAULT_WINDOW = 10  # Trackio's default


def ema(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average of `values` (see the top)."""
    values = list(values)
    if values and all(v == values[0] for v in values):  # TensorBoard leaves a constant series alone
        return values
    out = []
    last, count = 0.0, 0
    for value in values:
        if not math.isfinite(value):
            out.append(value)
            continue
        last = last * weight + (1 - weight) * value
        count += 1
        debias = 1 - weight**count if weight != 1 else 1.0
        out.append(last / debias)
    return out


def centred_mean(values: Sequence[float], window: int) -> list[float]:
    """Trackio's centred moving average of `values` (see the top)."""
    values = list(values)
    n = len(values)
    half = max(3, min(window, n)) // 2
    sums, counts = [0.0], [0]
    for value in values:
        finite = math.isfinite(value)
        sums.append(sums[-1] + (value if finite else 0.0))
        counts.append(counts[-1] + finite)
    out = []
    for i, value in enumerate(values):
        if not math.isfinite(value):
            out.append(value)
            continue
        start, end = max(0, i - half), min(n, i + half + 1)
        count = counts[end] - counts[start]
        out.append((sums[end] - sums[start]) / count if count else value)
    return out


@dataclass(frozen=True)
class Smoothing:
    """What the explorer's charts apply: `kind` (none, ema, mean), the EMA's weight and the mean's
    window. `s` cycles the kind, `[` and `]` step the weight or the window in force."""

    kind: str = "none"
    weight: float = DEFAULT_WEIGHT
    window: int = DEFAULT_WINDOW

    def cycled(self) -> Smoothing:
        return replace(self, kind=KINDS[(KINDS.index(self.kind) + 1) % len(KINDS)])

    def stronger(self) -> Smoothing:
        return self._step(+1)

    def weaker(self) -> Smoothing:
        return self._step(-1)

    def _step(self, direction: int) -> Smoothing:
        if self.kind == "ema":
            return replace(self, weight=_neighbour(EMA_WEIGHTS, self.weight, direction))
        if self.kind == "mean":
            return replace(self, window=int(_neighbour(WINDOWS, self.window, direction)))
        return self

    @property
    def label(self) -> str:
        """How the title names it: `EMA w=0.6`, `centred mean k=10`, `no smoothing`."""
        if self.kind == "ema":
            return f"EMA w={self.weight:g}"
        if self.kind == "mean":
            return f"centred mean k={self.window}"
        return "no smoothing"

    def values(self, values: Sequence[float]) -> list[float]:
        if self.kind == "ema":
            return ema(values, self.weight)
        if self.kind == "mean":
            return centred_mean(values, self.window)
        return list(values)

    def apply(self, series: Series) -> Series:
        """The series as drawn smoothed: one line through the smoothed bucket means (the same series
        when there is no smoothing)."""
        if self.kind == "none" or not len(series):
            return series
        smoothed = self.values(series.mean)
        latest = next((v for v in reversed(smoothed) if math.isfinite(v)), None)
        return Series(
            series.first, series.last, smoothed, smoothed, smoothed, series.level, latest, series.latest_step
        )


def _neighbour(ladder: Sequence[float], value: float, direction: int) -> float:
    """The next value of `ladder` above (direction +1) or below (-1) `value`, or the end it reached."""
    if direction > 0:
        return next((v for v in ladder if v > value), ladder[-1])
    return next((v for v in reversed(ladder) if v < value), ladder[0])
