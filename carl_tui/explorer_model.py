"""What the metrics explorer shows, as plain values (no Textual, no store): the keys grouped by prefix (and
the families of KEY_GROUPS under one heading each), the `/` filter, the rows of the chart grid, and what each
chart draws (the runs' lines, smoothed, on a log axis or not, with its title). carl_tui/explorer.py draws it;
tests use it on its own."""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from engine.store import Series
from engine.text import visible_line

from .smoothing import Smoothing

NO_PREFIX = "(no prefix)"  # the group of the keys without a "/": loss, reward, entropy, ...
PIN_MARK = "◆"  # a key pinned to the main screen
HISTOGRAM_MARK = "▦"  # a key of histograms, drawn as a heat strip over steps
GLOB_CHARS = frozenset("*?[")
# Families shown under one heading whatever their prefixes, in this order inside it: async RL (the canonical
# names of engine/observe/frameworks.py, then the frameworks' own async keys no table renames: veRL's
# rollout_corr/ and fully_async/, SkyRL's async/), and throughput.
KEY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "async RL: mismatch, staleness",
        ("mismatch/", "staleness/", "off_policy/", "rollout_corr/", "fully_async/", "async/"),
    ),
    ("perf: throughput, time, MFU", ("perf/",)),
)


@dataclass(frozen=True)
class KeyInfo:
    """A metric key, and the name its source gave it when a framework's key map renamed it. A key of
    histograms has its stored key in `histogram`, and `key` is how the explorer names it (`histogram_id`)."""

    key: str
    source: str | None = None
    histogram: str | None = None

    @property
    def group(self) -> str:
        """Its family's heading (KEY_GROUPS), else the part before the first "/" (TensorBoard's and W&B's
        sections)."""
        return self.family[1]

    @property
    def family(self) -> tuple[int, str, int]:
        """(the family's place in KEY_GROUPS, its heading, the place of the key's prefix in it); outside them
        (len(KEY_GROUPS), the prefix, 0)."""
        for place, (heading, prefixes) in enumerate(KEY_GROUPS):
            for rank, prefix in enumerate(prefixes):
                if self.key.startswith(prefix):
                    return place, heading, rank
        return len(KEY_GROUPS), (self.key.split("/", 1)[0] if "/" in self.key else ""), 0

    @property
    def label(self) -> str:
        """The key as shown, with its source's name beside it: `entropy  (actor/entropy)`; text that
        cannot drive the terminal."""
        if self.histogram is not None:
            return visible_line(f"{self.histogram}  {HISTOGRAM_MARK}")
        if self.source and self.source != self.key:
            return visible_line(f"{self.key}  ({self.source})")
        return visible_line(self.key)


def histogram_id(key: str, scalars: Collection[str]) -> str:
    """How the explorer names a key of histograms: the key itself, or the key marked when a metric has the
    same name (the two are drawn apart)."""
    return key if key not in scalars else f"{key}  {HISTOGRAM_MARK}"


def group_title(group: str) -> str:
    return visible_line(group) if group else NO_PREFIX


def order_keys(keys: Sequence[KeyInfo]) -> list[KeyInfo]:
    """The keys without a prefix first, then KEY_GROUPS' families (their prefixes in order), then the other
    groups by name; by key within each."""
    return sorted(keys, key=lambda info: (info.group != "", *info.family, info.key))


def is_glob(text: str) -> bool:
    return any(ch in GLOB_CHARS for ch in text)


def key_matches(info: KeyInfo, text: str) -> bool:
    """W&B LEET's filter: a glob (fnmatch, when the text has * ? or [) matches the whole key, else the
    text is a substring; case-insensitive, tried on the source's own name too."""
    if not text:
        return True
    pattern = text.lower()
    names = [info.key.lower()] + ([info.source.lower()] if info.source else [])
    if is_glob(text):
        return any(fnmatch.fnmatchcase(name, pattern) for name in names)
    return any(pattern in name for name in names)


def filter_keys(keys: Sequence[KeyInfo], text: str) -> list[KeyInfo]:
    return [info for info in keys if key_matches(info, text)]


def count_line(shown: int, total: int) -> str:
    return f"{shown:,} of {total:,} key{'s' if total != 1 else ''}"


def short_value(value: float | None) -> str:
    """A latest value in a few characters: 0.01234, 1.235e5, 12.5, —."""
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    text = f"{value:.4g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


# -- the grid -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridRow:
    """One row of small charts; `group` names the group it starts (its heading), None otherwise."""

    keys: tuple[str, ...]
    group: str | None = None


def grid_rows(keys: Sequence[KeyInfo], columns: int) -> list[GridRow]:
    """The keys (ordered by group) in rows of `columns` charts; each group starts a row, under its heading."""
    rows: list[GridRow] = []
    for group, members in itertools.groupby(keys, key=lambda info: info.group):
        names = [info.key for info in members]
        for start in range(0, len(names), columns):
            heading = group_title(group) if start == 0 else None
            rows.append(GridRow(tuple(names[start : start + columns]), heading))
    return rows


def row_height(row: GridRow, chart_height: int) -> int:
    return chart_height + (1 if row.group is not None else 0)


def rows_in_view(rows: Sequence[GridRow], top: int, height: int, chart_height: int) -> int:
    """How many rows from `top` fit whole in `height` lines (at least one, when there is one)."""
    used, count = 0, 0
    for row in rows[top:]:
        used += row_height(row, chart_height)
        if used > height and count:
            break
        count += 1
    return count


def scrolled_to(rows: Sequence[GridRow], top: int, index: int, height: int, chart_height: int) -> int:
    """The top row that keeps row `index` in view, moving as little as possible from `top`."""
    if index < top:
        return index
    while top < index and index >= top + rows_in_view(rows, top, height, chart_height):
        top += 1
    return top


def locate(rows: Sequence[GridRow], key: str) -> tuple[int, int] | None:
    """(row, column) of a key in the grid."""
    for index, row in enumerate(rows):
        if key in row.keys:
            return index, row.keys.index(key)
    return None


# -- what a chart draws -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pow10:
    """The right axis of a log chart: the left axis is log10 of the value, the right reads it back
    as the value (the same line, two exact scales, as the Φ pane reads Φ as entropy). A value
    object, so setting it again does not redraw the chart."""

    def __call__(self, exponent: float) -> float:
        return math.pow(10.0, exponent)


def log10_series(series: Series) -> tuple[Series, int]:
    """The series on a log10 axis, and how many of its points (buckets) were left out because their
    values are not above 0."""
    dropped = 0
    lows, highs, means = [], [], []
    for lo, hi, mean in zip(series.vmin, series.vmax, series.mean, strict=True):
        top = math.log10(hi) if hi > 0 else math.nan
        middle = math.log10(mean) if mean > 0 else math.nan
        if math.isfinite(hi) and not hi > 0:
            dropped += 1
        lows.append(math.log10(lo) if lo > 0 else (middle if math.isfinite(middle) else top))
        highs.append(top)
        means.append(middle if math.isfinite(middle) else top)
    latest = math.log10(series.latest) if series.latest and series.latest > 0 else None
    logged = Series(series.first, series.last, lows, highs, means, series.level, latest, series.latest_step)
    return logged, dropped


@dataclass(frozen=True)
class ShownRun:
    """A run the explorer draws: its id, its label and its line colour (the comparison's)."""

    id: int
    name: str
    color: int = 0


@dataclass
class ChartPlan:
    """A chart's data as `Chart.set_series` takes it, and its title."""

    lines: tuple[Series | None, ...]
    colors: tuple[int, ...]
    band: tuple[Series, Series] | None
    log: bool
    dropped: int  # points left out of a log axis (not above 0)
    title: str


def plan_chart(
    info: KeyInfo,
    runs: Sequence[ShownRun],
    series: Mapping[tuple[int, str], Series],
    *,
    smoothing: Smoothing,
    log: bool = False,
    pinned: bool = False,
) -> ChartPlan:
    """Each run's line of the key (the first run drawn on top), smoothed, on a log axis when asked.
    One run smoothed keeps its raw values as a faint band under the line, as TensorBoard does."""
    lines: list[Series | None] = []
    dropped = 0
    band = None
    for run in runs:
        raw = series.get((run.id, info.key))
        if raw is None or not len(raw):
            lines.append(None)
            continue
        line = smoothing.apply(raw)
        if log:
            line, left_out = log10_series(line)
            dropped += left_out
        lines.append(line)
        if len(runs) == 1 and smoothing.kind != "none":
            under = log10_series(raw)[0] if log else raw
            band = (under, under)
    first = series.get((runs[0].id, info.key)) if runs else None
    title = f"{PIN_MARK} " if pinned else ""
    title += info.label
    if first is not None and len(first):
        title += f" {short_value(first.latest)}"
    if log:
        title += " · log"
        if dropped:
            title += f" · {dropped:,} ≤ 0 left out"
    return ChartPlan(tuple(lines), tuple(run.color for run in runs), band, log, dropped, title)


def value_at(series: Series | None, step: int) -> float | None:
    """The value drawn at `step`: the bucket holding it (its mean), None when no bucket does."""
    if series is None:
        return None
    for first, last, mean in zip(series.first, series.last, series.mean, strict=True):
        if first <= step <= last:
            return mean if math.isfinite(mean) else None
    return None


def moved_step(series: Series | None, step: int | None, direction: int) -> int | None:
    """The step of the next bucket (direction +1) or the previous one (-1) from `step`; the newest
    when there is no step yet. A bucket's step is its last (a step the store has a row at)."""
    if series is None or not len(series):
        return step
    return moved_among(list(series.last), step, direction)


def moved_among(steps: Sequence[int], step: int | None, direction: int) -> int | None:
    """The next (direction > 0) or previous step of `steps` (in order) from `step`; the newest when there is
    no step yet, `step` when there are none."""
    if not steps:
        return step
    if step is None:
        return int(steps[-1])
    if direction > 0:
        return int(next((s for s in steps if s > step), steps[-1]))
    return int(next((s for s in reversed(steps) if s < step), steps[0]))
