"""Trackio project databases written by the real `trackio` library."""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support import series

from engine.observe import ObserveError, detect_kind, ingest_source, observe, register_source
from engine.store import Store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trackio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The trackio module, writing under a temp dir (its dir is fixed when it is imported)."""
    saved = os.environ.get("TRACKIO_DIR")
    if "trackio" not in sys.modules:
        os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    import trackio

    yield trackio
    if saved is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = saved


def db_path(trackio: ModuleType, project: str) -> Path:
    from trackio.sqlite_storage import SQLiteStorage

    return Path(SQLiteStorage.get_project_db_path(project))


def start(trackio: ModuleType, project: str, name: str, **config: object) -> None:
    trackio.init(project=project, name=name, config=config or None, auto_log_cpu=False, auto_log_gpu=False)


def trackio_run_ids(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT run_name, run_id FROM configs").fetchall())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def two_runs(trackio: ModuleType) -> Path:
    """A project with two runs, logged the way transformers and TRL log to Trackio."""
    project = f"obs-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "run-a", lr=0.1, vocab_size=64, max_steps=40, model_name_or_path="tiny-llama")
    trackio.log(
        {
            "train/loss": 2.0,
            "train/global_step": 10,
            "train/entropy": 1.5,
            "eval/loss": float("nan"),
            "train/grad_norm": float("inf"),
        }
    )
    trackio.log(
        {
            "train/loss": 1.0,
            "train/global_step": 20,
            "train/rewards/fmt/mean": 0.5,
            "train/reward": float("-inf"),
            "train/trace/phi_mean": 0.97,
        }
    )
    trackio.log({"profiling/Time taken: GRPOTrainer.transformers.generate": 0.3}, step=20)
    trackio.log({"completions": trackio.Table(columns=["step", "completion"], data=[[20, "hello"]])})
    trackio.log({"loss": 0.5, "note": "text"}, step=30)  # no global step: the row's step column
    trackio.finish()
    start(trackio, project, "run-b")
    trackio.log({"train/loss": 9.0, "train/global_step": 1})
    trackio.finish()
    return db_path(trackio, project)


def run_by_name(store: Store, name: str) -> dict:
    run_id = store.run_id_by_name(name)
    assert run_id is not None, f"no run {name!r}"
    return store.run(run_id)


def test_detects_a_trackio_database(two_runs: Path) -> None:
    assert detect_kind(two_runs) == "trackio"


def test_trackio_mapping(store: Store, two_runs: Path) -> None:
    source_id, result = observe(store, two_runs, name="ignored-with-two-runs")
    assert result.caught_up and result.bad_lines == 0 and len(result.run_ids) == 2
    ids = trackio_run_ids(two_runs)
    a, b = run_by_name(store, "run-a"), run_by_name(store, "run-b")
    assert a["external_id"] == ids["run-a"] and b["external_id"] == ids["run-b"]
    assert a["source_id"] == b["source_id"] == source_id and a["source_kind"] == "trackio"
    assert a["status"] == b["status"] == "imported"
    assert a["vocab_size"] == 64 and a["max_steps"] == 40 and a["model"] == "tiny-llama"
    assert '"lr": 0.1' in a["config"]

    ln_v = math.log(64)
    assert series(store, a["id"], "loss") == {10: 2.0, 20: 1.0, 30: 0.5}
    assert series(store, a["id"], "entropy") == {10: 1.5}
    assert series(store, a["id"], "phi/mean") == {10: pytest.approx(1 - 1.5 / ln_v), 20: 0.97}
    assert series(store, a["id"], "phi/entropy") == {10: 1.5, 20: pytest.approx(0.03 * ln_v)}
    assert series(store, a["id"], "eval/loss") == {10: None}  # Trackio's "NaN" string
    assert series(store, a["id"], "grad_norm") == {10: math.inf}
    assert series(store, a["id"], "reward") == {20: -math.inf}
    assert series(store, a["id"], "rewards/fmt/mean") == {20: 0.5}
    keys = {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (a["id"],))}
    assert keys == {
        "loss",
        "entropy",
        "phi/mean",
        "phi/entropy",
        "eval/loss",
        "grad_norm",
        "reward",
        "rewards/fmt/mean",
    }  # no profiling, no table, no global_step
    assert series(store, b["id"], "loss") == {1: 9.0}
    assert result.rows == store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 13
    walls = {r[0] for r in store.conn.execute("SELECT wall_time FROM metrics WHERE run_id=?", (a["id"],))}
    assert all(abs(w - time.time()) < 600 for w in walls)  # Trackio's own ISO timestamps


def test_observing_again_adds_nothing(store: Store, two_runs: Path) -> None:
    source_id, first = observe(store, two_runs)
    _, second = observe(store, two_runs)
    assert second.rows == 0 and sorted(second.run_ids) == sorted(first.run_ids)
    assert ingest_source(store, register_source(store, two_runs, follow=True)).rows == 0
    assert store.conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    assert store.source(source_id)["rows"] == first.rows == 13


def test_single_run_takes_the_requested_name(store: Store, trackio: ModuleType) -> None:
    project = f"obs-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "trackio-name")
    trackio.log({"train/loss": 1.0, "train/global_step": 5})
    trackio.finish()
    _, result = observe(store, db_path(trackio, project), name="mine")
    assert [store.run(r)["name"] for r in result.run_ids] == ["mine"]


def wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_follow_while_the_writer_keeps_the_database_open(store: Store, trackio: ModuleType) -> None:
    project = f"obs-{uuid.uuid4().hex[:8]}"
    path = db_path(trackio, project)
    start(trackio, project, "live", vocab_size=100)
    try:
        trackio.log({"train/loss": 3.0, "train/global_step": 1})
        wait_for(lambda: _has_rows(path))
        source_id, result = observe(store, path, follow=True)
        run_id = result.run_ids[0]
        assert store.run(run_id)["status"] == "running" and store.source(source_id)["state"] == "following"

        trackio.log({"train/loss": 2.0, "train/global_step": 2, "train/entropy": 2.0})
        rows = 0

        def more_rows() -> bool:
            nonlocal rows
            rows += ingest_source(store, source_id).rows
            return rows > 0

        wait_for(more_rows)  # the writer flushes every 0.5 s and keeps running meanwhile
        assert series(store, run_id, "loss") == {1: 3.0, 2: 2.0}
        assert series(store, run_id, "phi/mean") == {2: pytest.approx(1 - 2.0 / math.log(100))}
    finally:
        trackio.finish()

    start(trackio, project, "live-2")  # a new run in the followed project
    trackio.log({"train/loss": 7.0, "train/global_step": 1})
    trackio.finish()
    created: list[int] = []
    wait_for(lambda: bool(created.extend(ingest_source(store, source_id).run_ids) or created))
    assert store.run(created[-1])["name"] == "live-2"
    assert series(store, created[-1], "loss") == {1: 7.0}
    assert store.run(run_id)["status"] == "running"


def _has_rows(path: Path) -> bool:
    if not path.exists():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM metrics").fetchone()[0] > 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def test_sqlite_files_that_are_not_trackio(store: Store, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE metrics (x)")
    conn.close()
    with pytest.raises(ObserveError, match=r"other\.db: an SQLite file, but not a Trackio project"):
        detect_kind(other)
    with pytest.raises(ObserveError, match=r"carl\.db: this is a carl database, not a Trackio project"):
        detect_kind(store.path)


def test_a_followed_database_that_stops_being_trackio_is_an_error(
    store: Store, trackio: ModuleType, tmp_path: Path
) -> None:
    project = f"obs-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "r")
    trackio.log({"train/loss": 1.0, "train/global_step": 1})
    trackio.finish()
    copy = tmp_path / "copy.db"
    copy.write_bytes(db_path(trackio, project).read_bytes())
    source_id, _ = observe(store, copy, follow=True)
    copy.write_bytes(b"SQLite format 3\x00" + b"\x00" * 4000)  # clobbered
    with pytest.raises(ObserveError, match=r"copy\.db") as err:
        ingest_source(store, source_id)
    assert not err.value.transient
    assert store.source(source_id)["state"] == "error" and "copy.db" in store.source(source_id)["last_error"]
