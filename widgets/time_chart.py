"""TimeChart: a Chart over wall time, with a run's steps under its clock.

The x axis is wall time (seconds since the epoch) labelled as a clock (14:05, or 14:05:30 in a short window);
under it, when a run's (step, wall time) points are given, a row names the step the run was at every few
columns, from its first step in view to its newest, so a drop in a machine's series reads against the run
("GPU utilisation fell at step 400"). Everything else (the lines, bands, markers, scales, the cache of strips)
is Chart's (widgets/chart.py).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Sequence

from rich.segment import Segment
from textual.strip import Strip

from .chart import Chart
from .raster import CELL_DOTS, Range, cell_col

# Clock tick spacings, seconds: the first that leaves LABEL_GAP cells between labels is used.
TICK_STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
LABEL_GAP = 12  # cells from one label's start to the next's, at least


def clock_ticks(x_range: Range, plot_w: int) -> tuple[list[float], int]:
    """Round wall times in the range, spaced so their labels do not crowd, and the spacing in seconds."""
    x0, x1 = x_range
    span = max(x1 - x0, 1e-9)
    wanted = max(1, plot_w // LABEL_GAP)
    step = next((s for s in TICK_STEPS if span / s <= wanted), TICK_STEPS[-1])
    offset = time.localtime(x0).tm_gmtoff  # ticks fall on round local times
    first = ((x0 + offset) // step + 1) * step - offset
    ticks, t = [], first
    while t <= x1:
        ticks.append(t)
        t += step
    return ticks, step


def clock_label(t: float, step: int) -> str:
    return time.strftime("%H:%M:%S" if step < 60 else "%H:%M", time.localtime(t))


def step_at(steps: Sequence[tuple[int, float]], t: float) -> int | None:
    """The step the run was at, at wall time `t`: the last step written by then (None: before its first)."""
    times = [w for _, w in steps]
    index = bisect_right(times, t)
    return steps[index - 1][0] if index else None


class TimeChart(Chart):
    """A Chart whose x values are wall times; `set_steps(points)` adds the run's step row under the clock."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._steps: tuple[tuple[int, float], ...] = ()

    def set_steps(self, points: Sequence[tuple[int, float]]) -> None:
        """The run's (step, wall time) points, oldest first; the same points again cost nothing."""
        steps = tuple(points)
        if steps != self._steps:
            self._steps = steps
            self.invalidate()

    def _build(self, width: int, height: int) -> list[Strip]:
        if not self._steps or height < 4:
            return super()._build(width, height)
        strips = super()._build(width, height - 1)
        return [*strips, self._step_row(width)]

    def _x_labels(self, x_range: Range, plot_w: int) -> str:
        ticks, step = clock_ticks(x_range, plot_w)
        return self._place(ticks, [clock_label(t, step) for t in ticks], x_range, plot_w)

    def _place(self, ticks: list[float], labels: list[str], x_range: Range, plot_w: int) -> str:
        """Labels centred under their columns, never overlapping, in a line `plot_w` wide."""
        line = [" "] * plot_w
        free_from = 0
        for t, label in zip(ticks, labels, strict=True):
            col = cell_col(t, x_range, plot_w, self.mode)
            start = max(0, min(col - len(label) // 2, plot_w - len(label)))
            if col < 0 or start < free_from or start + len(label) > plot_w:
                continue
            line[start : start + len(label)] = label
            free_from = start + len(label) + 1
        return "".join(line)

    def _step_row(self, width: int) -> Strip:
        """`step` in the left gutter, then the run's step every LABEL_GAP cells over the part of the window
        the run covers, from its first step in view to its newest: where the run started and where it is now
        are always named."""
        left_w, right_w = self._gutters
        plot_w = max(0, width - left_w - right_w)
        x_range = self.x_range
        axis = self.component_style("chart--axis")
        if x_range is None or plot_w < 2:
            return Strip.blank(width, self.rich_style)
        line = [" "] * plot_w
        first = max(0, cell_col(self._steps[0][1], x_range, plot_w, self.mode))
        last = cell_col(self._steps[-1][1], x_range, plot_w, self.mode)
        last = plot_w - 1 if last < 0 else last
        # The newest step first, ending under its column (or at the edge): where the run is now always shows.
        newest = f"{self._steps[-1][0]:,}"
        newest_at = max(0, min(last + 1, plot_w) - len(newest))
        line[newest_at : newest_at + len(newest)] = newest[: plot_w - newest_at]
        free_from = 0
        for col in [first, *range(first + LABEL_GAP, last, LABEL_GAP)]:
            step = self._steps[0][0] if col == first else step_at(self._steps, self._time_at(col, plot_w))
            label = f"{step:,}" if step is not None else ""
            if label and col >= free_from and col + len(label) < newest_at:
                line[col : col + len(label)] = label
                free_from = col + len(label) + 1
        name = "step" if left_w > 4 else "stp"[: left_w - 1]  # the gutter's width is the value labels'
        gutter = name.rjust(left_w - 1) + " "
        return Strip([Segment(gutter, axis), Segment("".join(line), axis)], width).extend_cell_length(
            width, self.rich_style
        )

    def _time_at(self, col: int, plot_w: int) -> float:
        """The wall time at the middle of cell column `col`."""
        assert self.x_range is not None
        x0, x1 = self.x_range
        cells = CELL_DOTS[self.mode][1]
        dots = plot_w * cells
        return x0 + (col * cells + (cells - 1) / 2) * (x1 - x0) / max(dots - 1, 1)
