"""Histograms: what each tool writes made one `Histogram`, stored bounded in carl.db, read back, and spread
over a heat strip's columns (engine/observe/tracker_histograms.py, engine/store/histograms.py,
widgets/heat_strip.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.observe.tracker_histograms import from_histo, from_json, from_tensor
from engine.store import Store, StoreReader
from engine.store import histograms as stored
from engine.store.histograms import MAX_BUCKETS, Histogram, HistogramReads, add_histograms, spread
from widgets.heat_strip import densities, spread_rows, value_range


def test_trackio_and_wandb_values() -> None:
    """The JSON forms (the Trackio writer's own is read in tests/test_observe_trackio_traces.py)."""
    counts, edges = np.histogram(np.random.default_rng(0).normal(size=1000), bins=16)
    trackio_value = {"_type": "trackio.histogram", "bins": edges.tolist(), "values": counts.tolist()}
    made = from_json(trackio_value)
    assert made is not None and made.edges == tuple(edges.tolist()) and made.total == 1000
    wandb_value = {"_type": "histogram", "values": [1, 2, 3], "bins": [0.0, 1.0, 2.0, 3.0]}
    assert from_json(wandb_value) == Histogram((0.0, 1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    packed = {
        "_type": "histogram",
        "packedBins": {"min": -1.0, "size": 0.5, "count": 4},
        "values": [1, 0, 2, 1],
    }
    assert from_json(packed) == Histogram((-1.0, -0.5, 0.0, 0.5, 1.0), (1.0, 0.0, 2.0, 1.0))


@pytest.mark.parametrize(
    "value",
    [
        {"bins": [0, 1], "values": [1, 2]},  # sizes disagree
        {"bins": [1, 0], "values": [1]},  # edges going down
        {"bins": [0, 1], "values": [-1]},  # a count below 0
        {"bins": [0, float("nan")], "values": [1]},
        {"bins": [0, 1], "values": [True]},  # bool is no count
        {"bins": [0, 10**400], "values": [1]},  # past a float's range
        {"bins": [], "values": []},
        {"bins": "0,1", "values": [1]},
        {"packedBins": {"min": 0, "size": 1, "count": 2**40}, "values": [1]},
        [1, 2],
        None,
    ],
)
def test_a_value_that_is_no_histogram_is_none(value: object) -> None:
    assert from_json(value) is None


def test_more_buckets_than_kept_are_merged_with_every_count() -> None:
    counts = list(range(1, 2001))
    made = from_json({"bins": list(range(2001)), "values": counts})
    assert made is not None and len(made.counts) <= MAX_BUCKETS and len(made.edges) == len(made.counts) + 1
    assert made.total == sum(counts) and made.edges[0] == 0 and made.edges[-1] == 2000


def test_tensorboard_histograms_as_tensorboard_migrates_them() -> None:
    """torch's v1 `histo`, its outer limit DBL_MAX and empty end buckets dropped for `min` and `max` (as
    tensorboard's data_compat does), and the `histograms` plugin's tensor."""
    from tensorboard.compat.proto.summary_pb2 import HistogramProto
    from tensorboard.plugins.histogram import summary_v2
    from torch.utils.tensorboard.summary import histogram

    values = np.random.default_rng(1).normal(size=500)
    [v1] = histogram("w", values, bins=30).value
    made = from_histo(v1.histo)
    assert made is not None and made.total == 500
    assert made.low == pytest.approx(values.min()) and made.high == pytest.approx(values.max())
    proto = HistogramProto(
        min=0.5, max=7.0, bucket_limit=[0.0, 1.0, 1.7976931348623157e308], bucket=[0, 5, 3]
    )
    assert from_histo(proto) == Histogram((0.5, 1.0, 7.0), (5.0, 3.0))
    assert from_histo(HistogramProto(min=0.0, max=1.0, bucket_limit=[1.0], bucket=[0])) is None
    [v2] = summary_v2.histogram_pb("w", values, buckets=7).value
    made = from_tensor(v2.tensor)
    assert made is not None and len(made.counts) == 7 and made.total == 500


def write_run(store: Store) -> int:
    return store.create_run("h", source_kind="tensorboard", status="running")


def one(step: int, shift: float = 0.0) -> Histogram:
    return Histogram((shift, shift + 1.0, shift + 2.0), (float(step), 1.0))


def test_stored_and_read_back_once(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as store:
        run_id = write_run(store)
        rows = [(step, "w", one(step), 1.7e9 + step) for step in range(10)]
        assert add_histograms(store, run_id, rows) == (10, [])
        assert add_histograms(store, run_id, rows) == (0, []), "a source read again adds nothing twice"
    reader = StoreReader(tmp_path / "carl.db")
    try:
        assert reader.histograms.keys(run_id) == ["w"]
        series = reader.histograms.series(run_id, "w", max_steps=4)
        assert series.stored == 10 and series.steps == [0, 3, 6, 9]
        assert series.histograms[1] == one(3)
    finally:
        reader.close()


def test_a_run_keeps_a_bounded_number_of_keys_and_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored, "KEYS_CAP", 3)
    with Store(tmp_path / "carl.db") as store:
        run_id = write_run(store)
        added, refused = add_histograms(store, run_id, [(0, f"k{i}", one(0), 0.0) for i in range(5)])
        assert added == 3 and refused == ["k3", "k4"]
        for step in range(1, 1 + stored.STEPS_CAP):
            add_histograms(store, run_id, [(step, "k0", one(step), 0.0)])
        steps = [r[0] for r in store.conn.execute("SELECT step FROM histograms WHERE key='k0' ORDER BY step")]
        assert len(steps) <= stored.STEPS_CAP and steps[0] == 0 and steps[-1] == stored.STEPS_CAP
        assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 2, "the whole run stays covered"


def test_a_store_older_than_schema_10_has_no_histograms(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as store:
        run_id = write_run(store)
        reads = HistogramReads(store.conn, 9)
        assert (
            reads.keys(run_id) == []
            and not reads.series(run_id, "w")
            and reads.latest_step(run_id, "w") is None
        )


def test_spread_keeps_the_first_and_the_newest() -> None:
    assert spread(list(range(10)), 3) == [0, 4, 9] == [spread_rows(10, 3)[i] for i in range(3)]
    assert spread([5, 6], 10) == [5, 6] and spread(list(range(5)), 1) == [4]


def test_densities_spread_every_count_over_the_columns() -> None:
    histogram = Histogram((0.0, 1.0, 3.0, 3.0, 4.0), (4.0, 2.0, 5.0, 1.0))
    low, high = value_range([histogram, Histogram((-1.0, 0.0), (1.0,))])
    assert (low, high) == (-1.0, 4.0)
    cells = densities(histogram, low, high, 10)
    assert math.isclose(sum(cells), 12.0) and cells[:2] == [0.0, 0.0]
    assert cells[2] == cells[3] == 2.0, "a bucket's count spread over its columns"
    assert cells[8] >= 5.0, "a bucket of no width in the column of its edge"
