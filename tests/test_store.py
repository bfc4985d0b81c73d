"""The store: schema, migrations, safety of foreign/newer/corrupt files, rollups, cursors."""

from __future__ import annotations

import math
import sqlite3
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import paths
from engine.store import ROLLUP_LEVELS, SCHEMA_VERSION, Store, StoreError, StoreReader
from engine.store.schema import APPLICATION_ID


def test_new_store_is_wal_versioned_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    home = paths.carl_home()
    with Store(paths.db_path(home)) as s:
        assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert s.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        tables = {r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {
        "runs",
        "metrics",
        "phi_stats",
        "samples",
        "commands",
        "chat_messages",
        "conversations",
        "trajectories",
        "trajectory_events",
        "agent_events",
        "sources",
        "rollups",
    } <= tables
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(paths.db_path(home).stat().st_mode) == 0o600


def test_reopen_keeps_data_and_does_not_remigrate(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as s:
        rid = s.create_run("a", source_kind="jsonl")
        s.add_metrics(rid, [(1, "loss", 2.0, 1.0)])
    with Store(tmp_path / "carl.db") as s:
        assert s.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 1


def test_newer_schema_is_refused_without_damage(tmp_path: Path) -> None:
    db = tmp_path / "carl.db"
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 5}")
    conn.close()
    before = db.read_bytes()
    with pytest.raises(StoreError, match="newer than this carl-tui"):
        Store(db)
    with pytest.raises(StoreError, match="newer"):
        StoreReader(db)
    assert db.read_bytes() == before


def test_corrupt_and_foreign_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a readable carl database"):
        Store(junk)
    assert junk.read_bytes() == b"this is not sqlite at all" * 100
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a carl database"):
        Store(foreign)
    with pytest.raises(StoreError, match="no carl database"):
        StoreReader(tmp_path / "missing.db")


def test_metrics_dedupe_nan_and_last_step(store: Store) -> None:
    rid = store.create_run("r", source_kind="jsonl")
    assert store.add_metrics(rid, [(1, "loss", 1.0, 10.0), (2, "loss", float("nan"), 11.0)]) == 2
    assert store.add_metrics(rid, [(1, "loss", 5.0, 12.0), (3, "loss", float("inf"), 13.0)]) == 1
    rows = store.conn.execute("SELECT step, value FROM metrics ORDER BY step").fetchall()
    assert rows == [(1, 1.0), (2, None), (3, math.inf)]
    run = store.run(rid)
    assert run["last_step"] == 3 and run["last_update"] == 13.0


def test_run_names_are_made_unique(store: Store) -> None:
    a = store.create_run("demo", source_kind="carl")
    b = store.create_run("demo", source_kind="carl")
    assert store.run(a)["name"] == "demo" and store.run(b)["name"] == "demo-2"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(st.integers(0, 20_000), min_size=1, max_size=300, unique=True),
    seed=st.integers(0, 2**16),
    batches=st.integers(1, 4),
)
def test_rollups_match_a_numpy_aggregation(
    tmp_path_factory: pytest.TempPathFactory, steps: list[int], seed: int, batches: int
) -> None:
    rng = np.random.default_rng(seed)
    arr_extra: list[int] = []
    steps = [s for s in steps if s != 50_000 + seed]
    if not steps:
        return
    values = rng.normal(size=len(steps))
    values[rng.random(len(steps)) < 0.1] = np.nan
    with Store(tmp_path_factory.mktemp("r") / "carl.db") as s:
        rid = s.create_run("r", source_kind="jsonl")
        order = rng.permutation(len(steps))  # arrival order need not be step order
        for chunk in np.array_split(order, batches):
            s.add_metrics(rid, [(steps[i], "k", float(values[i]), 1.0) for i in chunk])
            if seed % 3 == 0 and len(chunk):  # a re-sent batch: all duplicates, nothing changes
                s.add_metrics(rid, [(steps[i], "k", 99.0, 1.0) for i in chunk[: len(chunk) // 2 + 1]])
            if seed % 3 == 1 and len(chunk):  # a batch mixing duplicates with a new far-away step
                s.add_metrics(rid, [(steps[chunk[0]], "k", 99.0, 1.0), (50_000 + seed, "k", 0.5, 1.0)])
                arr_extra.append(50_000 + seed)
        reader = StoreReader(s.path)
        arr_steps, arr_values = np.array(steps + arr_extra[:1]), np.r_[values, [0.5] * len(arr_extra[:1])]
        for level in ROLLUP_LEVELS:
            got = s.conn.execute(
                "SELECT bucket, n, vmin, vmax, vsum, first_step, last_step, last_value FROM rollups"
                " WHERE level=? ORDER BY bucket",
                (level,),
            ).fetchall()
            buckets = sorted(set(arr_steps // level))
            assert [g[0] for g in got] == buckets
            for bucket, n, vmin, vmax, vsum, first, last, last_value in got:
                mask = arr_steps // level == bucket
                vals = arr_values[mask]
                finite = vals[~np.isnan(vals)]
                assert n == len(finite)
                assert first == arr_steps[mask].min() and last == arr_steps[mask].max()
                if len(finite):
                    assert vmin == pytest.approx(finite.min()) and vmax == pytest.approx(finite.max())
                    assert vsum == pytest.approx(finite.sum())
                newest = arr_values[mask][np.argmax(arr_steps[mask])]
                assert (last_value is None) if np.isnan(newest) else last_value == pytest.approx(newest)
        series = reader.series(rid, "k", max_points=10)
        assert series.level > 1 or np.isfinite(arr_values).sum() <= 10
        if np.isfinite(arr_values).any():
            assert np.nanmax(series.vmax) == pytest.approx(np.nanmax(arr_values))
        reader.close()


def test_series_switches_to_rollups_and_extends_like_a_fresh_read(store: Store) -> None:
    rid = store.create_run("r", source_kind="jsonl")
    store.add_metrics(rid, [(s, "phi/mean", math.sin(s / 100), 1.0) for s in range(5000)])
    reader = StoreReader(store.path)
    raw = reader.series(rid, "phi/mean", max_points=10_000)
    assert raw.level == 1 and len(raw) == 5000
    coarse = reader.series(rid, "phi/mean", max_points=1000)
    assert coarse.level == 16 and len(coarse) == math.ceil(5000 / 16)
    assert max(coarse.vmax) == pytest.approx(max(raw.vmax))
    store.add_metrics(rid, [(s, "phi/mean", 2.0 + s, 2.0) for s in range(5000, 5100)])
    for old, max_points in ((raw, 10_000), (coarse, 1000)):
        extended = reader.extend_series(rid, "phi/mean", old, max_points=max_points)
        fresh = reader.series(rid, "phi/mean", max_points=max_points)
        assert extended.level == fresh.level
        np.testing.assert_allclose(extended.vmax, fresh.vmax)
        np.testing.assert_array_equal(extended.first, fresh.first)
        assert extended.latest == fresh.latest == 2.0 + 5099 and extended.latest_step == 5099
    reader.close()


def test_data_version_moves_only_when_another_connection_commits(store: Store) -> None:
    reader = StoreReader(store.path)
    v0 = reader.data_version()
    assert reader.data_version() == v0
    rid = store.create_run("r", source_kind="jsonl")
    assert reader.data_version() != v0
    v1 = reader.data_version()
    reader.runs()
    assert reader.data_version() == v1
    store.add_metrics(rid, [(1, "x", 1.0, 1.0)])
    assert reader.data_version() != v1
    reader.close()


def test_reader_cannot_write(store: Store) -> None:
    store.create_run("r", source_kind="jsonl")
    reader = StoreReader(store.path)
    with pytest.raises(sqlite3.OperationalError):
        reader.conn.execute("DELETE FROM runs")
    reader.close()


def test_phi_stats_are_mirrored_into_metrics(store: Store) -> None:
    rid = store.create_run("r", source_kind="carl", vocab_size=64)
    store.add_phi_stats(
        rid,
        [
            {
                "step": 1,
                "phi_mean": 0.5,
                "phi_p10": 0.2,
                "phi_p90": 0.8,
                "entropy_mean": 0.5 * math.log(64),
                "tokens": 40,
                "hist": [1, 2, 3],
            }
        ],
    )
    row = store.conn.execute("SELECT phi_mean, tokens, hist FROM phi_stats").fetchone()
    assert row == (0.5, 40, "[1, 2, 3]")
    keys = dict(store.conn.execute("SELECT key, value FROM metrics").fetchall())
    assert keys == {
        "phi/mean": 0.5,
        "phi/p10": 0.2,
        "phi/p90": 0.8,
        "phi/entropy": pytest.approx(2.0794, 1e-4),
    }


def test_command_queue_round_trip(store: Store) -> None:
    first = store.enqueue_command("observe", {"path": "/x"}, origin="tui")
    second = store.enqueue_command("observe", {"path": "/y"})
    claimed = store.claim_commands("engine")
    assert [c["id"] for c in claimed] == [first, second] and claimed[0]["args"] == {"path": "/x"}
    assert store.claim_commands("engine") == []
    store.finish_command(first, True, "ok")
    store.finish_command(second, False, "bad path")
    reader = StoreReader(store.path)
    states = {c["id"]: (c["state"], c["result"]) for c in reader.commands_after(0)}
    assert states == {first: ("done", "ok"), second: ("failed", "bad path")}
    reader.close()


def test_chat_messages_create_a_conversation(store: Store) -> None:
    conv, _ = store.add_chat_message(None, None, "user", "why is reward flat?\nsecond line")
    store.add_chat_message(conv, None, "assistant", "because")
    assert store.conn.execute("SELECT title FROM conversations").fetchone()[0] == "why is reward flat?"
    assert (
        store.conn.execute("SELECT count(*) FROM chat_messages WHERE conversation_id=?", (conv,)).fetchone()[
            0
        ]
        == 2
    )


def test_ingest_throughput_is_reasonable(store: Store) -> None:
    """Behaviour guard, not a benchmark: a 100k-row batch import finishes and is complete."""
    rid = store.create_run("r", source_kind="jsonl")
    started = time.perf_counter()
    for base in range(0, 25_000, 5000):
        store.add_metrics(rid, [(s, k, 1.0, 1.0) for s in range(base, base + 5000) for k in "abcd"])
    assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 100_000
    assert time.perf_counter() - started < 60


def test_a_version_1_store_migrates_forward_keeping_its_rows(tmp_path: Path) -> None:
    import sqlite_utils

    from engine.store.schema import MIGRATIONS

    db_file = tmp_path / "carl.db"
    conn = sqlite3.connect(db_file, isolation_level=None)
    MIGRATIONS[0](sqlite_utils.Database(conn))  # exactly what a version-1 carl-tui created
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=1")
    conn.execute(
        "INSERT INTO runs (name, source_kind, status, created_at) VALUES ('old', 'jsonl', 'imported', 1)"
    )
    conn.close()
    with Store(db_file) as s:
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
        assert s.run(1)["name"] == "old" and s.run(1)["error"] is None
        s.update_run(1, error="boom", pid=42)
        s.add_gate_states(
            1,
            [
                {
                    "step": 3,
                    "state": "closed",
                    "threshold": 0.1,
                    "multiplier": 0.0,
                    "reason": "closed: 1/5 above p60=0.10 (n=5)",
                }
            ],
        )
        s.add_event(1, 3, "gate_open", "opened")
        s.add_event(1, 3, "gate_open", "again")  # one per (run, kind, step)
    reader = StoreReader(db_file)
    assert reader.gate_state(1)["reason"].startswith("closed: 1/5")
    assert [e["detail"] for e in reader.events(1)] == ["opened"]
    assert reader.run(1).error == "boom"
    reader.close()


def test_truncate_after_a_checkpoint_rebuilds_rollups(store: Store) -> None:
    rid = store.create_run("r", source_kind="carl")
    store.add_metrics(rid, [(s, "loss", float(s), 1.0) for s in range(100)])
    store.add_phi_stats(rid, [{"step": s, "phi_mean": 0.5} for s in range(100)])
    removed = store.truncate_run_after(rid, 59)
    assert removed == 40 + 40  # loss and the mirrored phi/mean
    store.add_metrics(rid, [(s, "loss", -1.0, 2.0) for s in range(60, 80)])  # the replayed steps
    reader = StoreReader(store.path)
    fresh = reader.series(rid, "loss", max_points=10)
    raw = dict(store.conn.execute("SELECT step, value FROM metrics WHERE key='loss'").fetchall())
    assert max(raw) == 79 and raw[60] == -1.0 and raw[59] == 59.0
    assert min(fresh.vmin) == -1.0 and max(fresh.vmax) == 59.0 and fresh.latest_step == 79
    rollup_n = store.conn.execute("SELECT sum(n) FROM rollups WHERE key='loss' AND level=4096").fetchone()[0]
    assert rollup_n == 80 and store.run(rid)["last_step"] == 79
    reader.close()


def test_two_processes_opening_a_fresh_store_at_once_both_get_it(tmp_path: Path) -> None:
    """The second one finds the schema made by the first under the write lock, and migrates nothing twice."""
    import subprocess
    import sys

    code = "import sys; from engine.store import Store; Store(sys.argv[1]).close()"
    db = tmp_path / "carl.db"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(db)], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
