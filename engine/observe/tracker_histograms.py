"""Histograms as other tools write them, made one `Histogram` (engine/store/histograms.py) each.

- Trackio's `Histogram._to_dict` (trackio/histogram.py): `{"_type": "trackio.histogram", "bins": [n + 1
  edges], "values": [n counts]}` inside a metrics payload;
- W&B's `Histogram.to_json` (wandb/sdk/data_types/histogram.py): `{"_type": "histogram", "bins": [...],
  "values": [...]}`, or the packed form of W&B's backend, `{"packedBins": {"min", "size", "count"},
  "values"}`. `from_json` is the one the W&B reader calls for a history value;
- TensorBoard: the v1 `HistogramProto` of torch's and tensorboardX's `add_histogram` (`min`, `max`,
  `bucket_limit` right edges, `bucket` counts), made edges as tensorboard's own `data_compat.
  _migrate_histogram_value` does (empty buckets at both ends dropped, the outer edges `min` and `max`, not
  +-DBL_MAX); and the `histograms` plugin's [k, 3] tensor (left, right, count) of tf2-style writers.

A value that is not a usable histogram (edges not increasing, a count below 0, NaN, sizes that disagree) is
None: the reader counts it, says so in one line and goes on. More than MAX_BUCKETS buckets are merged down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

from engine.store.histograms import MAX_BUCKETS, Histogram

JSON_TYPES = frozenset({"trackio.histogram", "histogram"})
MAX_INPUT_BUCKETS = 1 << 16  # buckets looked at in one value; more is no histogram a writer makes
HISTOGRAM_PLUGIN = "histograms"


def from_edges(edges: Sequence[Any], counts: Sequence[Any]) -> Histogram | None:
    """A histogram from n + 1 edges and n counts, or None when they are not one."""
    n = len(counts)
    if not 0 < n <= MAX_INPUT_BUCKETS or len(edges) != n + 1:
        return None
    try:
        edge_values = [float(e) for e in edges if type(e) in (int, float)]
        count_values = [float(c) for c in counts if type(c) in (int, float)]
    except OverflowError:
        return None
    if len(edge_values) != n + 1 or len(count_values) != n:
        return None
    if not all(math.isfinite(e) for e in edge_values) or not all(
        math.isfinite(c) and c >= 0 for c in count_values
    ):
        return None
    if any(b < a for a, b in zip(edge_values, edge_values[1:], strict=False)):
        return None
    if edge_values[-1] <= edge_values[0]:
        return None
    return merged(edge_values, count_values)


def merged(edges: list[float], counts: list[float]) -> Histogram:
    """At most MAX_BUCKETS buckets: neighbours summed in runs of the same length."""
    n = len(counts)
    if n <= MAX_BUCKETS:
        return Histogram(tuple(edges), tuple(counts))
    width = -(-n // MAX_BUCKETS)
    out_edges = edges[::width]
    if out_edges[-1] != edges[-1]:
        out_edges.append(edges[-1])
    out_counts = [math.fsum(counts[i : i + width]) for i in range(0, n, width)]
    return Histogram(tuple(out_edges), tuple(out_counts))


def is_histogram_json(value: Any) -> bool:
    return isinstance(value, dict) and value.get("_type") in JSON_TYPES


def _is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number: an int or a float, not a bool."""
    return type(value) in (int, float)


def from_json(value: Any) -> Histogram | None:
    """A Trackio or W&B histogram value (parsed JSON), or None when `value` is not a usable one."""
    if not isinstance(value, dict):
        return None
    counts = value.get("values")
    if not isinstance(counts, list):
        return None
    packed = value.get("packedBins")
    if isinstance(packed, dict):
        low, size, count = packed.get("min"), packed.get("size"), packed.get("count")
        if not (_is_number(low) and _is_number(size)) or type(count) is not int:
            return None
        if count != len(counts) or not 0 < count <= MAX_INPUT_BUCKETS:
            return None
        return from_edges([low + i * size for i in range(count + 1)], counts)
    edges = value.get("bins")
    if not isinstance(edges, list):
        return None
    return from_edges(edges, counts)


def from_histo(histo: Any) -> Histogram | None:
    """A TensorBoard v1 `HistogramProto`, as tensorboard's data_compat migrates it."""
    limits, buckets = list(histo.bucket_limit), list(histo.bucket)
    if len(limits) != len(buckets) or len(buckets) > MAX_INPUT_BUCKETS:
        return None
    non_empty = [i for i, count in enumerate(buckets) if count > 0]
    if not non_empty:
        return None
    start, end = non_empty[0], non_empty[-1]
    edges = [histo.min, *limits[start:end], histo.max]
    return from_edges(edges, buckets[start : end + 1])


def from_tensor(tensor: Any) -> Histogram | None:
    """The `histograms` plugin's tensor: k rows of (left edge, right edge, count)."""
    dims = [d.size for d in tensor.tensor_shape.dim]
    if len(dims) != 2 or dims[1] != 3 or not 0 < dims[0] <= MAX_INPUT_BUCKETS:
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(tensor)
    except (TypeError, ValueError, KeyError):
        return None
    if array.dtype.kind not in "fiu" or array.shape != (dims[0], 3):
        return None
    rows = array.tolist()
    edges = [rows[0][0], *(row[1] for row in rows)]
    return from_edges(edges, [row[2] for row in rows])
