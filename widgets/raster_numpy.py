"""The envelope pass of `widgets.raster` over numpy arrays: a million raw points in a few
milliseconds. Imported only when a chart is handed arrays; what the store reads are lists,
which `raster` reduces in plain Python. Both kernels give the same envelopes (tested).

The columns are found by a binary search per column edge, then one `reduceat` per array.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.store.reader import Series


def line_envelope(series: Series, edges: list[float]) -> tuple[list[float], list[float]]:
    """Per dot column, the lowest vmin and highest vmax of its buckets; gaps NaN, empty columns bridged."""
    occupied, starts, stop = _columns(_bucket_steps(series), np.asarray(edges))
    vmin = np.asarray(series.vmin, dtype=np.float64)
    lo = _reduce_columns(vmin, np.fmin, occupied, starts, stop)
    # raw points have vmin == vmax: reading one array twice beats reading two (memory-bound)
    vmax = vmin if series.level == 1 else np.asarray(series.vmax, dtype=np.float64)
    hi = _reduce_columns(vmax, np.fmax, occupied, starts, stop)
    return _bridge(lo, occupied).tolist(), _bridge(hi, occupied).tolist()


def band_envelope(
    lo_series: Series, hi_series: Series, edges: list[float]
) -> tuple[list[float], list[float]]:
    """Per dot column, the lowest `lo` and highest `hi`; the two series may sit on different steps."""
    edge_array = np.asarray(edges)
    occupied, starts, stop = _columns(_bucket_steps(lo_series), edge_array)
    vmin = np.asarray(lo_series.vmin, dtype=np.float64)
    lo = _bridge(_reduce_columns(vmin, np.fmin, occupied, starts, stop), occupied)
    occupied, starts, stop = _columns(_bucket_steps(hi_series), edge_array)
    vmax = np.asarray(hi_series.vmax, dtype=np.float64)
    hi = _bridge(_reduce_columns(vmax, np.fmax, occupied, starts, stop), occupied)
    # minimum/maximum propagate NaN: a column is filled only where both edges are known
    return np.minimum(lo, hi).tolist(), np.maximum(lo, hi).tolist()


def _bucket_steps(series: Series) -> np.ndarray:
    """Where each bucket sits on the x axis: a raw point at its step, a bucket at its midpoint."""
    first = np.asarray(series.first)
    if series.level == 1:
        return first  # raw: first == last; no arithmetic over a long array
    middle: np.ndarray = (first + np.asarray(series.last)) / 2.0
    return middle


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


def _reduce_columns(
    values: np.ndarray, ufunc: np.ufunc, occupied: np.ndarray, starts: np.ndarray, stop: int
) -> np.ndarray:
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
