"""The rollouts table: one sample per (run, step, idx) from any source, per-token values as float16, a run
capped by thinning its oldest steps, and a reader on a store not migrated yet."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from engine.store import Store, StoreReader
from engine.store.rollouts import pack_half, unpack_half
from engine.store.schema import APPLICATION_ID, MIGRATIONS


def sample(step: int, idx: int, **fields: object) -> dict[str, object]:
    return {"step": step, "idx": idx, "prompt": f"p{step}", "completion": f"c{step}.{idx}", **fields}


def test_rollouts_round_trip_and_a_replay_adds_nothing(store: Store) -> None:
    run = store.create_run("r", source_kind="carl")
    rows = [
        sample(
            1,
            0,
            group_id="g1",
            rewards={"task": 1.0, "format": 0.5},
            advantage=0.7,
            length=3,
            extra={"source_col": "x"},
            tokens=["a", "b", "c"],
            entropy=[0.1, 2.5, 11.9],
            logprob=[-0.01, -3.2, -40.0],
        ),
        sample(1, 1, group_id="g1", rewards={"task": 0.0, "format": math.nan}, total=0.25),
    ]
    assert store.add_rollouts(run, rows) == 2
    assert store.add_rollouts(run, rows) == 0  # read again after a crash: nothing twice
    reader = StoreReader(store.path)
    first, second = reader.rollouts(run, 1)
    assert first["rewards"] == {"task": 1.0, "format": 0.5} and first["total"] == 1.5  # summed when absent
    assert (first["group_id"], first["advantage"], first["length"], first["extra"]) == (
        "g1",
        0.7,
        3,
        {"source_col": "x"},
    )
    assert first["tokens"] == ["a", "b", "c"]
    assert first["entropy"] == pytest.approx([0.1, 2.5, 11.9], rel=1e-3)  # float16: 3 significant digits
    assert first["logprob"] == pytest.approx([-0.01, -3.2, -40.0], rel=1e-3)
    assert second["rewards"] == {"task": 0.0, "format": None} and second["total"] == 0.25
    assert second["tokens"] is None and second["entropy"] is None
    assert reader.rollout(first["id"])["completion"] == "c1.0"
    assert reader.rollout_steps(run) == [(1, 2)] and reader.rollout_count(run) == 2
    reader.close()


def test_text_that_cannot_be_encoded_is_made_storable(store: Store) -> None:
    run = store.create_run("r", source_kind="carl")
    store.add_rollouts(run, [sample(0, 0, prompt="lone \ud800 surrogate", completion={"not": "text"})])
    reader = StoreReader(store.path)
    (row,) = reader.rollouts(run)
    assert row["prompt"] == "lone \ufffd surrogate" and row["completion"] == '{"not": "text"}'
    reader.close()


def test_float16_is_clamped_to_its_range() -> None:
    assert unpack_half(pack_half([1e9, -1e9, 0.5])) == [65504.0, -65504.0, 0.5]
    assert math.isnan(unpack_half(pack_half([math.nan]))[0])


def test_a_run_over_the_cap_loses_samples_of_its_oldest_steps_never_its_newest(store: Store) -> None:
    run = store.create_run("r", source_kind="carl")
    for step in range(10):
        store.add_rollouts(run, [sample(step, i) for i in range(8)])
    removed = store._thin_rollouts(run, cap=40)  # 80 rows: down to 36
    assert removed >= 44
    counts = dict(StoreReader(store.path).rollout_steps(run))
    assert counts[9] == 8  # the newest step is whole
    assert sum(counts.values()) <= 36
    steps = sorted(counts)
    assert all(counts[a] <= counts[b] for a, b in zip(steps, steps[1:], strict=False))  # oldest thinned most


def test_a_resume_forgets_the_rollouts_after_its_checkpoint(store: Store) -> None:
    run = store.create_run("r", source_kind="carl")
    store.add_rollouts(run, [sample(s, 0) for s in range(1, 6)])
    store.truncate_run_after(run, 3)
    assert [s for s, _ in StoreReader(store.path).rollout_steps(run)] == [1, 2, 3]


def test_a_reader_of_a_store_before_rollouts_sees_none(tmp_path: Path) -> None:
    """Only writers migrate: a control room may open a store at schema 5."""
    import sqlite_utils

    db_file = tmp_path / "carl.db"
    conn = sqlite3.connect(db_file, isolation_level=None)
    for migrate in MIGRATIONS[:5]:
        migrate(sqlite_utils.Database(conn))
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=5")
    conn.execute(
        "INSERT INTO runs (name, source_kind, status, created_at) VALUES ('old', 'jsonl', 'imported', 1)"
    )
    conn.close()
    reader = StoreReader(db_file)
    assert reader.runs()[0].framework is None
    assert (reader.rollouts(1), reader.rollout_steps(1), reader.rollout_count(1), reader.key_names(1)) == (
        [],
        [],
        0,
        {},
    )
    reader.close()
    with Store(db_file) as s:  # a writer migrates it, keeping the run
        s.update_run(1, framework="verl")
        s.set_key_names(1, {"entropy": "actor/entropy"})
    reader = StoreReader(db_file)
    assert reader.runs()[0].framework == "verl" and reader.key_names(1) == {"entropy": "actor/entropy"}
    reader.close()
