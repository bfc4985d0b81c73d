"""Chart rasterizer: bucketed series to per-cell dot patterns (no Textual here).

A chart area is a grid of cells and each cell a small grid of dots: 2 wide by 4 high in
braille mode, 2 by 2 quadrant blocks in block mode. Layers are drawn per dot column:
- a line spans the lowest to the highest value of the buckets falling in the column, and
  reaches halfway to its neighbours so it stays continuous (spikes survive downsampling);
- a band fills from the lowest `lo` to the highest `hi` of the column;
- a marker fills its whole column.
Non-finite values are gaps: they draw nothing and never move the bounds.

Series must be sorted by step (the store reads them that way): the columns are found by a
binary search per column edge, then one min and one max per column, so the cost is a pass
over the visible buckets, whatever the width. That pass has two kernels with one contract:
plain Python over lists (what the store reads: at most a few thousand buckets a series, and
no numpy to import before the first frame) and numpy over arrays (`raster_numpy`: a million
raw points in a few milliseconds). Everything after it works on one value per dot column.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.store.reader import Series

Range = tuple[float, float]

# Dots per cell, as (rows, columns).
CELL_DOTS: dict[str, tuple[int, int]] = {"braille": (4, 2), "block": (2, 2)}

# Braille: U+2800 + bits; dots 1,2,3,7 run down the left column, 4,5,6,8 down the right.
BRAILLE_WEIGHTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
# Quadrant blocks indexed by bits: upper-left 1, upper-right 2, lower-left 4, lower-right 8.
BLOCK_WEIGHTS = ((1, 2), (4, 8))
BLOCK_CHARS = " ▘▝▀▖▌▞▛▗▚▐▜▄▙▟█"
NAN = math.nan


def _column_masks(weights: tuple[tuple[int, ...], ...]) -> list[list[list[int]]]:
    """masks[dot column][first row][last row]: the bits of rows first..last of one dot column of a cell."""
    rows, cols = len(weights), len(weights[0])
    return [
        [[sum(weights[r][c] for r in range(a, b + 1)) for b in range(rows)] for a in range(rows)]
        for c in range(cols)
    ]


_MASKS = {"braille": _column_masks(BRAILLE_WEIGHTS), "block": _column_masks(BLOCK_WEIGHTS)}


@dataclass(frozen=True, eq=False)
class LineLayer:
    """A series drawn as a line; `axis` 0 uses the left scale, 1 the right one."""

    series: Series
    axis: int = 0


@dataclass(frozen=True, eq=False)
class BandLayer:
    """The area between two series (e.g. p10 and p90), filled."""

    lo: Series
    hi: Series
    axis: int = 0


@dataclass(frozen=True, eq=False)
class MarkerLayer:
    """Full-height vertical lines at the given steps."""

    steps: tuple[float, ...]


Layer = LineLayer | BandLayer | MarkerLayer


@dataclass
class Raster:
    """A rasterized chart area: per cell, its dot bits and the layer that colours it."""

    bits: list[list[int]]  # [row][col] dot pattern of each cell
    owner: list[list[int]]  # [row][col] index of the last layer with a dot in the cell, -1 if none
    mode: str
    width: int  # cells per row

    def lines(self) -> list[str]:
        """The characters of each row; cells without dots are spaces."""
        if self.mode == "braille":
            return ["".join([chr(0x2800 + b) if b else " " for b in row]) for row in self.bits]
        return ["".join([BLOCK_CHARS[b] for b in row]) for row in self.bits]


# -- ranges ------------------------------------------------------------------------------------


def series_of(layer: Layer) -> tuple[Series, ...]:
    if isinstance(layer, LineLayer):
        return (layer.series,)
    if isinstance(layer, BandLayer):
        return (layer.lo, layer.hi)
    return ()


def x_extent(layers: Sequence[Layer]) -> Range | None:
    """First to last step over all series of the layers; None when they are all empty."""
    spans = [(s.first[0], s.last[-1]) for layer in layers for s in series_of(layer) if len(s)]
    if not spans:
        return None
    return float(min(a for a, _ in spans)), float(max(b for _, b in spans))


def widen(r: Range, pad: float | None = None) -> Range:
    """A range with a non-zero span: a single value gets `pad` (default 5% of it) each side."""
    lo, hi = r
    if hi > lo:
        return lo, hi
    if pad is None:
        pad = abs(lo) * 0.05 or 0.5
    return lo - pad, lo + pad


def padded(r: Range, fraction: float = 0.05) -> Range:
    """`r` grown by `fraction` of its span each side, so lines do not sit on the frame."""
    lo, hi = widen(r)
    pad = (hi - lo) * fraction
    return lo - pad, hi + pad


def at_least(r: Range, span: float, limits: Range | None = None, data: Range | None = None) -> Range:
    """`r` widened about its centre to at least `span`, so a flat noisy series is not blown up
    to fill the chart. With `limits` (Φ lives in [0, 1]) the widened window is shifted to stay
    inside them, never cut, as long as `data` (default `r`) itself lies inside them."""
    lo, hi = r
    if not hi - lo < span:
        return r
    centre = (lo + hi) / 2
    lo, hi = centre - span / 2, centre + span / 2
    if limits is None:
        return lo, hi
    floor, ceiling = limits
    data_lo, data_hi = data or r
    if not floor <= data_lo <= data_hi <= ceiling:
        return lo, hi  # values outside their limits stay visible
    if span >= ceiling - floor:
        return floor, ceiling
    if lo < floor:
        return floor, floor + span
    if hi > ceiling:
        return ceiling - span, ceiling
    return lo, hi


# -- scale helpers shared with the axes ------------------------------------------------------


def cell_row(value: float, y_range: Range, height: int, mode: str) -> int:
    """The cell row a value is drawn in (same arithmetic as `dot_rows_of`), or -1 when outside."""
    rows_per_cell = CELL_DOTS[mode][0]
    dot_rows = height * rows_per_cell
    y0, y1 = widen(y_range)
    row = round((y1 - value) * ((dot_rows - 1) / (y1 - y0)))  # round half to even, as np.rint
    return row // rows_per_cell if 0 <= row < dot_rows else -1


def dot_col(step: float, x_range: Range, dot_cols: int) -> int:
    """The dot column whose edges (see `column_edges`) hold `step`; may fall outside 0..dot_cols-1."""
    x0, x1 = widen(x_range, 1.0)
    return math.floor((step - x0) * ((dot_cols - 1) / (x1 - x0)) + 0.5)


def cell_col(step: float, x_range: Range, width: int, mode: str) -> int:
    """The cell column a step is drawn in, or -1 when it is outside the chart."""
    cols_per_cell = CELL_DOTS[mode][1]
    col = dot_col(step, x_range, width * cols_per_cell)
    return col // cols_per_cell if 0 <= col < width * cols_per_cell else -1


def column_edges(x_range: Range, dot_cols: int) -> list[float]:
    """Step boundaries of the dot columns: column c is centred on x0 + c * (x1 - x0) / (dot_cols - 1)."""
    x0, x1 = widen(x_range, 1.0)
    dx = (x1 - x0) / max(dot_cols - 1, 1)
    return [x0 + (c - 0.5) * dx for c in range(dot_cols + 1)]


# -- rasterizing -----------------------------------------------------------------------------


@dataclass
class Envelope:
    """One layer reduced to dot columns: the lowest and highest value each column draws (NaN: none)."""

    lo: list[float]
    hi: list[float]
    kind: str  # "line" (joined to its neighbours), "band" or "marker" (full height, no bounds)
    axis: int = 0


def envelopes(layers: Sequence[Layer], x_range: Range, dot_cols: int) -> list[Envelope]:
    """Reduce each layer to `dot_cols` columns: the only pass over the data."""
    edges = column_edges(x_range, dot_cols)
    out = []
    for layer in layers:
        if isinstance(layer, LineLayer):
            out.append(Envelope(*_line_envelope(layer.series, edges), "line", layer.axis))
        elif isinstance(layer, BandLayer):
            out.append(Envelope(*_band_envelope(layer.lo, layer.hi, edges), "band", layer.axis))
        else:
            hi = [NAN] * dot_cols
            for col in _marker_columns(layer.steps, x_range, dot_cols):
                hi[col] = math.inf
            out.append(Envelope([-v for v in hi], hi, "marker"))
    return out


def extent(envs: Sequence[Envelope], axis: int = 0) -> Range | None:
    """Lowest and highest finite value drawn on `axis`, or None when nothing is."""
    drawn = [e for e in envs if e.kind != "marker" and e.axis == axis]
    lows = [v for e in drawn for v in e.lo if math.isfinite(v)]
    highs = [v for e in drawn for v in e.hi if math.isfinite(v)]
    return (min(lows), max(highs)) if lows and highs else None


def draw(
    envs: Sequence[Envelope],
    height: int,
    y_range: Range,
    mode: str = "braille",
    right_range: Range | None = None,
) -> Raster:
    """Paint envelopes in order into `height` cell rows; later ones win a shared cell's colour."""
    rows_per_cell, cols_per_cell = CELL_DOTS[mode]
    masks = _MASKS[mode]
    dot_rows, width = height * rows_per_cell, (len(envs[0].lo) if envs else 0) // cols_per_cell
    ranges = (y_range, right_range or y_range)
    bits = [[0] * width for _ in range(height)]
    owner = [[-1] * width for _ in range(height)]
    for index, env in enumerate(envs):
        y_range = ranges[env.axis]
        top, bottom = dot_rows_of(env.hi, y_range, dot_rows), dot_rows_of(env.lo, y_range, dot_rows)
        if env.kind == "line":
            top, bottom = _connect(top, bottom)
        for col in range(width * cols_per_cell):
            first, last = top[col], bottom[col]
            if not first <= last:  # NaN (a gap) or an empty span
                continue
            first, last = max(int(first), 0), min(int(last), dot_rows - 1)
            cell, mask = col // cols_per_cell, masks[col % cols_per_cell]
            for row in range(first // rows_per_cell, last // rows_per_cell + 1):
                base = row * rows_per_cell
                bits[row][cell] |= mask[max(first - base, 0)][min(last - base, rows_per_cell - 1)]
                owner[row][cell] = index
    return Raster(bits, owner, mode, width)


def rasterize(
    layers: Sequence[Layer],
    width: int,
    height: int,
    x_range: Range,
    y_range: Range | None = None,
    mode: str = "braille",
    right_range: Range | None = None,
) -> Raster:
    """Draw `layers` into a width x height cell grid; y_range None fits the data (5% pad)."""
    envs = envelopes(layers, x_range, width * CELL_DOTS[mode][1])
    y_range = y_range or padded(extent(envs, 0) or (0.0, 1.0))
    return draw(envs, height, y_range, mode, right_range)


def _marker_columns(steps: Sequence[float], x_range: Range, dot_cols: int) -> list[int]:
    cols = (dot_col(step, x_range, dot_cols) for step in steps)
    return [col for col in cols if 0 <= col < dot_cols]


def _uses_numpy(*series: Series) -> bool:
    """Lists (what the store reads) are reduced here; anything else by `raster_numpy`."""
    return not all(isinstance(s.vmin, list) for s in series)


def _line_envelope(series: Series, edges: list[float]) -> tuple[list[float], list[float]]:
    """Per dot column, the lowest vmin and highest vmax of its buckets; gaps NaN, empty columns bridged."""
    if _uses_numpy(series):
        from .raster_numpy import line_envelope

        return line_envelope(series, edges)
    bounds = _bounds(bucket_steps(series), edges)
    lo = _reduce_columns(series.vmin, min, bounds)
    hi = _reduce_columns(series.vmin if series.level == 1 else series.vmax, max, bounds)  # raw: vmin == vmax
    return _bridge(lo, bounds), _bridge(hi, bounds)


def _band_envelope(
    lo_series: Series, hi_series: Series, edges: list[float]
) -> tuple[list[float], list[float]]:
    """Per dot column, the lowest `lo` and highest `hi`; the two series may sit on different steps."""
    if _uses_numpy(lo_series, hi_series):
        from .raster_numpy import band_envelope

        return band_envelope(lo_series, hi_series, edges)
    bounds = _bounds(bucket_steps(lo_series), edges)
    lo = _bridge(_reduce_columns(lo_series.vmin, min, bounds), bounds)
    bounds = _bounds(bucket_steps(hi_series), edges)
    hi = _bridge(_reduce_columns(hi_series.vmax, max, bounds), bounds)
    # a column is filled only where both edges are known (NaN in either: none)
    known = [a == a and b == b for a, b in zip(lo, hi, strict=True)]
    return (
        [min(a, b) if k else NAN for a, b, k in zip(lo, hi, known, strict=True)],
        [max(a, b) if k else NAN for a, b, k in zip(lo, hi, known, strict=True)],
    )


def bucket_steps(series: Series) -> Sequence[float]:
    """Where each bucket sits on the x axis: a raw point at its step, a bucket at its midpoint."""
    if series.level == 1:
        return series.first  # raw: first == last
    return [(a + b) / 2.0 for a, b in zip(series.first, series.last, strict=True)]


def _bounds(x: Sequence[float], edges: list[float]) -> list[int]:
    """Where each column edge falls in x (bisect left); integer steps are compared with ceiled edges,
    as the numpy kernel does."""
    if x and isinstance(x[0], int):
        return [bisect_left(x, math.ceil(e)) for e in edges]
    return [bisect_left(x, e) for e in edges]


def _reduce_columns(
    values: Sequence[float], pick: Callable[[Sequence[float]], float], bounds: list[int]
) -> list[float]:
    """`pick` (min or max) over the finite values of each column; NaN where there are none."""
    out = []
    for a, b in pairwise(bounds):  # bounds has one more entry than there are columns
        if a == b:
            out.append(NAN)
            continue
        part = values[a:b]
        value = pick(part)
        if value - value != 0:  # a NaN or an inf took part: keep only the finite values
            finite = [v for v in part if v - v == 0]
            value = pick(finite) if finite else NAN
        out.append(value)
    return out


def _bridge(values: list[float], bounds: list[int]) -> list[float]:
    """Empty columns between two drawn columns get the straight line between them (as np.interp
    draws it). A column whose buckets are all non-finite is occupied but NaN: a gap, never bridged."""
    previous = -1  # the last occupied column, if its value is finite
    out = values
    for col in range(len(values)):
        if bounds[col + 1] == bounds[col]:  # empty
            continue
        value = values[col]
        if previous >= 0 and col - previous > 1 and value == value:
            if out is values:
                out = list(values)
            before = values[previous]
            slope = (value - before) / (col - previous)
            for between in range(previous + 1, col):
                out[between] = slope * (between - previous) + before
        previous = col if value == value else -1
    return out


def dot_rows_of(values: Sequence[float], y_range: Range, dot_rows: int) -> list[float]:
    """Dot row (0 at the top) of each value, as floats; NaN stays NaN, off-range clips to -1/dot_rows."""
    y0, y1 = widen(y_range)
    scale = (dot_rows - 1) / (y1 - y0)
    out = []
    for value in values:
        row = (y1 - value) * scale
        if row != row:
            out.append(NAN)
        elif row <= -1:
            out.append(-1.0)
        elif row >= dot_rows:
            out.append(float(dot_rows))
        else:
            out.append(float(round(row)))  # round half to even, as np.rint
    return out


def _connect(top: list[float], bottom: list[float]) -> tuple[list[float], list[float]]:
    """Extend neighbouring columns halfway towards each other so a steep line has no holes.

    Rows count down from the top; both columns must be drawn (finite) to be joined.
    """
    new_top, new_bottom = list(top), list(bottom)
    joined = [a == a and b == b for a, b in pairwise(top)]  # both neighbours drawn (not NaN)
    for i, both in enumerate(joined):  # the line falls: the next column lies wholly below this one
        if both and top[i + 1] > bottom[i] + 1:
            mid = math.floor((bottom[i] + top[i + 1]) / 2)
            new_bottom[i] = max(new_bottom[i], mid) if new_bottom[i] == new_bottom[i] else mid
            new_top[i + 1] = min(new_top[i + 1], mid + 1)
    for i, both in enumerate(joined):  # the line rises: the next column lies wholly above this one
        if both and top[i] > bottom[i + 1] + 1:
            mid = math.floor((bottom[i + 1] + top[i]) / 2)
            new_bottom[i + 1] = max(new_bottom[i + 1], mid) if new_bottom[i + 1] == new_bottom[i + 1] else mid
            new_top[i] = min(new_top[i], mid + 1)
    return new_top, new_bottom


# -- ticks and labels ------------------------------------------------------------------------


def nice_step(span: float, target: int) -> float:
    """The 1-2-5 step nearest (geometrically) to `span / target`, as d3's tickIncrement picks it."""
    raw = span / max(target, 1)
    if not raw > 0 or not math.isfinite(raw):
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(raw))
    error = raw / magnitude
    factor = (
        10 if error >= math.sqrt(50) else 5 if error >= math.sqrt(10) else 2 if error >= math.sqrt(2) else 1
    )
    return factor * magnitude


def nice_ticks(r: Range, target: int, *, integer: bool = False) -> tuple[list[float], float]:
    """Round tick values inside `r` (1-2-5 steps) and the step; integer ticks step by at least 1."""
    lo, hi = r
    step = nice_step(hi - lo, target)
    if integer:
        step = max(step, 1.0)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [k * step for k in range(first, last + 1)], step


_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_tick(
    value: float, step: float, *, width: int = 7, trim: bool = False, digits: int | None = None
) -> str:
    """A compact label at most `width` wide: decimals from the step, k/M/G/T from a thousand.

    `trim` drops trailing zeros (1.50 -> 1.5), which reads better on the step axis; labels
    with a suffix are always trimmed (1k, 1.5k). `digits` caps the significant digits
    (6.224, not 6.22366), whatever the step asks for.
    """
    if not math.isfinite(value):
        return str(value)[:width]
    if abs(value) < step * 1e-6:
        value = 0.0
    scale, suffix = next(((s, x) for s, x in _SUFFIXES if abs(value) >= s), (1.0, ""))
    if abs(value) >= 1e15 or (value and step < 1e-4 and abs(value) < 1e-2):
        return _scientific(value, step, width, digits)
    decimals = max(0, math.ceil(-math.log10(step / scale) - 1e-9)) if step > 0 else 0
    while True:
        text = f"{value / scale:.{decimals}f}"
        if (trim or suffix) and "." in text:  # 1k rather than 1.0k beside 500
            text = text.rstrip("0").rstrip(".")
        if text.lstrip("-").strip("0.") == "":
            text = text.lstrip("-")  # no "-0.0"
        text += suffix
        fits = len(text) <= width and (digits is None or significant_digits(text) <= digits)
        if fits or decimals == 0:
            return text if len(text) <= width else _scientific(value, step, width, digits)
        decimals -= 1


def significant_digits(label: str) -> int:
    """Significant digits of a tick label: 6.224 -> 4, 0.0023 -> 2, 2.3e-3 -> 2, 1.5k -> 2, 0.00 -> 1."""
    mantissa = label.lower().split("e")[0].rstrip("kmgt").lstrip("-").replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def _scientific(value: float, step: float, width: int, max_digits: int | None = None) -> str:
    """1.2e-5 style, with as many mantissa digits as the step needs and the width (and
    `max_digits` significant digits) allow."""
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    digits = max(0, exponent - math.floor(math.log10(step))) if step > 0 else 1
    if max_digits is not None:
        digits = min(digits, max(0, max_digits - 1))
    for d in range(digits, -1, -1):
        mantissa, exp = f"{value:.{d}e}".split("e")
        text = f"{mantissa}e{int(exp)}"
        if len(text) <= width:
            return text
    return text[:width]
