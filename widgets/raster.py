"""Chart rasterizer: bucketed series to per-cell dot patterns, numpy only (no Textual here).

A chart area is a grid of cells and each cell a small grid of dots: 2 wide by 4 high in
braille mode, 2 by 2 quadrant blocks in block mode. Layers are drawn per dot column:
- a line spans the lowest to the highest value of the buckets falling in the column, and
  reaches halfway to its neighbours so it stays continuous (spikes survive downsampling);
- a band fills from the lowest `lo` to the highest `hi` of the column;
- a marker fills its whole column.
Non-finite values are gaps: they draw nothing and never move the bounds.

Series must be sorted by step (the store reads them that way): the columns are found by a
binary search per column edge, then one `reduceat` per array, so the cost is a couple of
passes over the visible buckets, whatever the width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.store.reader import Series

Range = tuple[float, float]

# Dots per cell, as (rows, columns).
CELL_DOTS: dict[str, tuple[int, int]] = {"braille": (4, 2), "block": (2, 2)}

# Braille: U+2800 + bits; dots 1,2,3,7 run down the left column, 4,5,6,8 down the right.
BRAILLE_WEIGHTS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]])
# Quadrant blocks indexed by bits: upper-left 1, upper-right 2, lower-left 4, lower-right 8.
BLOCK_WEIGHTS = np.array([[1, 2], [4, 8]])
BLOCK_CHARS = " ▘▝▀▖▌▞▛▗▚▐▜▄▙▟█"
_BLOCK_CODES = np.array([ord(c) for c in BLOCK_CHARS], dtype=np.uint32)


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

    bits: np.ndarray  # (rows, cols) dot pattern of each cell
    owner: np.ndarray  # (rows, cols) index of the last layer with a dot in the cell, -1 if none
    mode: str

    def lines(self) -> list[str]:
        """The characters of each row; cells without dots are spaces."""
        if self.mode == "braille":
            codes = np.where(self.bits == 0, 0x20, 0x2800 + self.bits).astype("<u4")
        else:
            codes = _BLOCK_CODES[self.bits].astype("<u4")
        text = codes.tobytes().decode("utf-32-le")  # one decode for the whole grid
        width = self.bits.shape[1]
        return [text[i : i + width] for i in range(0, len(text), width)]


# -- ranges ------------------------------------------------------------------------------------


def bucket_steps(series: Series) -> np.ndarray:
    """Where each bucket sits on the x axis: a raw point at its step, a bucket at its midpoint."""
    if series.level == 1:
        return series.first  # raw: first == last; no arithmetic over a long array
    return (series.first + series.last) / 2.0


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


def dot_rows_of(values: np.ndarray, y_range: Range, dot_rows: int) -> np.ndarray:
    """Dot row (0 at the top) of each value, as floats; NaN stays NaN, off-range clips to -1/dot_rows."""
    y0, y1 = widen(y_range)
    with np.errstate(invalid="ignore"):
        rows = np.rint((y1 - values) * ((dot_rows - 1) / (y1 - y0)))
        return np.clip(rows, -1, dot_rows)


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


def column_edges(x_range: Range, dot_cols: int) -> np.ndarray:
    """Step boundaries of the dot columns: column c is centred on x0 + c * (x1 - x0) / (dot_cols - 1)."""
    x0, x1 = widen(x_range, 1.0)
    dx = (x1 - x0) / max(dot_cols - 1, 1)
    return x0 + (np.arange(dot_cols + 1) - 0.5) * dx


# -- rasterizing -----------------------------------------------------------------------------


@dataclass
class Envelope:
    """One layer reduced to dot columns: the lowest and highest value each column draws (NaN: none)."""

    lo: np.ndarray
    hi: np.ndarray
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
            hi = np.full(dot_cols, np.nan)
            hi[_marker_columns(layer.steps, x_range, dot_cols)] = np.inf
            out.append(Envelope(-hi, hi, "marker"))
    return out


def extent(envs: Sequence[Envelope], axis: int = 0) -> Range | None:
    """Lowest and highest finite value drawn on `axis`, or None when nothing is."""
    lows = [np.fmin.reduce(e.lo) for e in envs if e.kind != "marker" and e.axis == axis]
    highs = [np.fmax.reduce(e.hi) for e in envs if e.kind != "marker" and e.axis == axis]
    lows = [float(v) for v in lows if np.isfinite(v)]
    highs = [float(v) for v in highs if np.isfinite(v)]
    return (min(lows), max(highs)) if lows and highs else None


def draw(envs: Sequence[Envelope], height: int, y_range: Range, mode: str = "braille",
         right_range: Range | None = None) -> Raster:  # fmt: skip
    """Paint envelopes in order into `height` cell rows; later ones win a shared cell's colour."""
    rows_per_cell, cols_per_cell = CELL_DOTS[mode]
    dot_rows, width = height * rows_per_cell, (envs[0].lo.size if envs else 0) // cols_per_cell
    ranges = (y_range, right_range or y_range)
    bits = np.zeros((height, width), dtype=np.int64)
    owner = np.full((height, width), -1, dtype=np.int64)
    for index, env in enumerate(envs):
        y_range = ranges[env.axis]
        top, bottom = dot_rows_of(env.hi, y_range, dot_rows), dot_rows_of(env.lo, y_range, dot_rows)
        if env.kind == "line":
            top, bottom = _connect(top, bottom)
        layer_bits = _pack(_span_dots(top, bottom, dot_rows), mode)
        bits |= layer_bits
        owner[layer_bits != 0] = index
    return Raster(bits, owner, mode)


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


def _line_envelope(series: Series, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per dot column, the lowest vmin and highest vmax of its buckets; gaps NaN, empty columns bridged."""
    occupied, starts, stop = _columns(bucket_steps(series), edges)
    lo = _reduce_columns(series.vmin, np.fmin, occupied, starts, stop)
    # raw points have vmin == vmax: reading one array twice beats reading two (memory-bound)
    hi = _reduce_columns(series.vmin if series.level == 1 else series.vmax, np.fmax, occupied, starts, stop)
    return _bridge(lo, occupied), _bridge(hi, occupied)


def _band_envelope(lo_series: Series, hi_series: Series, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per dot column, the lowest `lo` and highest `hi`; the two series may sit on different steps."""
    occupied, starts, stop = _columns(bucket_steps(lo_series), edges)
    lo = _bridge(_reduce_columns(lo_series.vmin, np.fmin, occupied, starts, stop), occupied)
    occupied, starts, stop = _columns(bucket_steps(hi_series), edges)
    hi = _bridge(_reduce_columns(hi_series.vmax, np.fmax, occupied, starts, stop), occupied)
    # minimum/maximum propagate NaN: a column is filled only where both edges are known
    return np.minimum(lo, hi), np.maximum(lo, hi)


def _columns(x: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Which dot columns hold buckets, where each occupied column starts in x, and where the last ends."""
    bounds = _searchsorted(x, edges)
    occupied = np.diff(bounds) > 0
    return occupied, bounds[:-1][occupied], int(bounds[-1])


def _searchsorted(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """np.searchsorted (left) without converting x: integer steps get integer (ceiled) edges."""
    if x.dtype.kind in "iu":
        edges = np.ceil(edges).astype(x.dtype)
    return np.searchsorted(x, edges)


def _reduce_columns(values: np.ndarray, ufunc: np.ufunc, occupied: np.ndarray, starts: np.ndarray, stop: int
                    ) -> np.ndarray:  # fmt: skip
    """ufunc (np.fmin or np.fmax: NaN-skipping) over each occupied column; NaN elsewhere."""
    out = np.full(occupied.size, np.nan)
    if starts.size == 0:
        return out
    visible = values[:stop]  # reduceat runs the last segment to the end of its input
    reduced = ufunc.reduceat(visible, starts)
    if np.isinf(reduced).any():  # inf is not skipped by fmin/fmax: redo with it masked (rare)
        reduced = ufunc.reduceat(np.where(np.isfinite(visible), visible, np.nan), starts)
    out[occupied] = reduced
    return out


def _bridge(values: np.ndarray, occupied: np.ndarray) -> np.ndarray:
    """Empty columns between two drawn columns get the straight line between them.

    A column whose buckets are all non-finite is occupied but NaN: a gap, never bridged.
    """
    finite = np.isfinite(values)
    if np.count_nonzero(finite) < 2 or occupied.all():
        return values
    cols = np.arange(values.size)
    prev_occupied = np.maximum.accumulate(np.where(occupied, cols, -1))
    next_occupied = np.minimum.accumulate(np.where(occupied, cols, values.size)[::-1])[::-1]
    inside = ~occupied & (prev_occupied >= 0) & (next_occupied < values.size)
    inside[inside] = finite[prev_occupied[inside]] & finite[next_occupied[inside]]
    if not inside.any():
        return values
    values = values.copy()
    values[inside] = np.interp(cols[inside], cols[finite], values[finite])
    return values


def _connect(top: np.ndarray, bottom: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Extend neighbouring columns halfway towards each other so a steep line has no holes.

    Rows count down from the top; both columns must be drawn (finite) to be joined.
    """
    new_top, new_bottom = top.copy(), bottom.copy()
    with np.errstate(invalid="ignore"):
        both = np.isfinite(top[:-1]) & np.isfinite(top[1:])
        # the line falls: the next column lies wholly below this one
        falls = both & (top[1:] > bottom[:-1] + 1)
        mid = np.floor((bottom[:-1] + top[1:]) / 2)
        new_bottom[:-1] = np.where(falls, np.fmax(new_bottom[:-1], mid), new_bottom[:-1])
        new_top[1:] = np.where(falls, np.fmin(new_top[1:], mid + 1), new_top[1:])
        # the line rises: the next column lies wholly above this one
        rises = both & (top[:-1] > bottom[1:] + 1)
        mid = np.floor((bottom[1:] + top[:-1]) / 2)
        new_bottom[1:] = np.where(rises, np.fmax(new_bottom[1:], mid), new_bottom[1:])
        new_top[:-1] = np.where(rises, np.fmin(new_top[:-1], mid + 1), new_top[:-1])
    return new_top, new_bottom


def _span_dots(top: np.ndarray, bottom: np.ndarray, dot_rows: int) -> np.ndarray:
    """Light rows top..bottom (inclusive) of each column; NaN columns stay dark."""
    rows = np.arange(dot_rows)[:, None]
    with np.errstate(invalid="ignore"):
        return (rows >= top) & (rows <= bottom)


def _pack(dots: np.ndarray, mode: str) -> np.ndarray:
    """Bits of each cell: a weighted sum over the cell's dot positions (8 or 4 strided slices)."""
    rows_per_cell, cols_per_cell = CELL_DOTS[mode]
    weights = BRAILLE_WEIGHTS if mode == "braille" else BLOCK_WEIGHTS
    bits = np.zeros((dots.shape[0] // rows_per_cell, dots.shape[1] // cols_per_cell), dtype=np.int64)
    for r in range(rows_per_cell):
        for c in range(cols_per_cell):
            bits += dots[r::rows_per_cell, c::cols_per_cell] * int(weights[r, c])
    return bits


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
