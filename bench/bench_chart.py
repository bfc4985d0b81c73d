"""How long the Phi chart takes to redraw, against Textual's built-in Sparkline.

Redraw = every Strip of a 100x20-cell Chart (braille, mean line over a p10..p90 band, axes),
built inside a headless Textual app, from:
  (a) raw series of 1,000,000 points each (first == last), as the store reads raw rows;
  (b) rollup series of 4,000 buckets each, as numpy arrays;
  (c) the same buckets as lists, as the store reads a long run (the plain-Python envelope kernel).
Each figure is the median of 15 redraws, once as is and once ("cold") with the CPU caches
flushed before each redraw (a 64 MiB sweep), the worst case for data that arrived a while ago.
Baseline: Textual's `Sparkline` renderable building one 100x4 frame from the same 1M values
(no axes, one series, its cheapest size), timed in the same run.

Goal: (a) <= 5 ms, median of several runs. Run: python bench/bench_chart.py
"""

from __future__ import annotations

import asyncio
import io
import statistics
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from textual.app import App, ComposeResult
from textual.renderables.sparkline import Sparkline

from engine.store.reader import Series
from widgets.chart import Chart

POINTS = 1_000_000
BUCKETS = 4_000
RUNS = 15
GOAL_MS = 5.0

_FLUSH = np.ones(64 * 1024 * 1024 // 8)  # bigger than any last-level cache


def flush_caches() -> None:
    _FLUSH.sum()


def phi_values(n: int, seed: int = 0) -> np.ndarray:
    """A Phi-like curve: rising, noisy, with a few non-finite values."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, n)
    phi = 0.55 + 0.35 * np.tanh((x - 0.3) * 6) + 0.01 * rng.standard_normal(n)
    phi[rng.integers(0, n, 50)] = np.nan
    return phi


def raw_series(values: np.ndarray) -> Series:
    steps = np.arange(len(values), dtype=np.int64)
    return Series(steps, steps.copy(), values, values.copy(), values.copy(), 1)


def rollup_series(values: np.ndarray, level: int) -> Series:
    """Buckets of `level` steps, as the store's rollup rows give them."""
    buckets = values.reshape(-1, level)
    first = np.arange(len(buckets), dtype=np.int64) * level
    with np.errstate(invalid="ignore"):
        vmin, vmax, mean = np.nanmin(buckets, 1), np.nanmax(buckets, 1), np.nanmean(buckets, 1)
    return Series(first, first + level - 1, vmin, vmax, mean, level)


def as_lists(series: Series) -> Series:
    """The same buckets as plain lists: what `StoreReader.series` returns."""
    fields = (series.first, series.last, series.vmin, series.vmax, series.mean)
    return Series(*(np.asarray(f).tolist() for f in fields), series.level)


def phi_set(make: Callable[[np.ndarray], Series], values: np.ndarray) -> tuple[Series, Series, Series]:
    """mean, p10, p90 series built by `make` (a spread of +-0.05 around the mean)."""
    return make(values), make(values - 0.05), make(values + 0.05)


class ChartApp(App[None]):
    CSS = "Chart { width: 100; height: 20; }"

    def compose(self) -> ComposeResult:
        yield Chart(empty_text="no Phi data yet")


def time_redraws(chart: Chart, *, cold: bool = False, runs: int = RUNS) -> float:
    """Median milliseconds to rebuild every strip of the chart; `cold` flushes CPU caches first."""
    times = []
    for _ in range(runs):
        if cold:
            flush_caches()
        before = chart.build_count
        chart.invalidate()
        start = time.perf_counter()
        chart.strips()
        times.append(time.perf_counter() - start)
        assert chart.build_count == before + 1, "the chart did not rebuild"
    return statistics.median(times) * 1e3


async def chart_figures() -> dict[str, float]:
    values = phi_values(POINTS)
    raw = phi_set(raw_series, values)
    rolled = phi_set(lambda v: rollup_series(v[: BUCKETS * 250], 250), values)
    figures = {}
    app = ChartApp()
    async with app.run_test(size=(120, 30)) as pilot:
        chart = app.query_one(Chart)
        await pilot.pause()
        assert (chart.size.width, chart.size.height) == (100, 20), chart.size
        listed = tuple(as_lists(s) for s in rolled)
        for name, (mean, p10, p90) in (("1M", raw), ("rollup4k", rolled), ("rollup4k_lists", listed)):
            chart.set_series(mean, band=(p10, p90))
            figures[f"phi_chart_redraw_{name}_ms"] = time_redraws(chart)
            figures[f"phi_chart_redraw_{name}_cold_ms"] = time_redraws(chart, cold=True)
        chart.set_series(raw[0], band=(raw[1], raw[2]))
        chart.mode = "block"
        figures["phi_chart_redraw_1M_block_ms"] = time_redraws(chart)
    return figures


def sparkline_ms(values: list[float], runs: int = 3) -> float:
    """Median milliseconds for Textual's Sparkline to build one 100x4 frame of `values`."""
    console = Console(width=100, file=io.StringIO(), color_system="truecolor")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        segments = list(console.render(Sparkline(values, width=100, height=4)))
        times.append(time.perf_counter() - start)
        assert segments
    return statistics.median(times) * 1e3


def main() -> None:
    figures = asyncio.run(chart_figures())
    baseline = sparkline_ms(np.nan_to_num(phi_values(POINTS), nan=0.5).tolist())  # it cannot take NaN
    for name, ms in figures.items():
        print(f"{name}={ms:.2f} baseline_sparkline_1M_ms={baseline:.1f} ratio={ms / baseline:.4f}")
    met = figures["phi_chart_redraw_1M_ms"] <= GOAL_MS
    print(f"goal_phi_chart_redraw_1M_ms={GOAL_MS} met={'yes' if met else 'no'}")


if __name__ == "__main__":
    main()
