"""MLflow stores read without a server: a sqlite mlflow.db and an mlruns/ directory, written by MLflow itself.

Every run of every experiment becomes a carl run; params go into its config, |V| comes from a vocab_size
param; following re-reads only what is new; the user's store is never modified (bytes and mtimes checked).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from support import series

from engine.observe import ObserveError, detect_kind, ingest_source, observe, register_source
from engine.store import Store, StoreReader

mlflow = pytest.importorskip("mlflow")


def snapshot(path: Path) -> dict[str, tuple[int, str]]:
    """Every file's and folder's mtime and every file's bytes under `path` (or of the file and its folder)."""
    root = path.parent if path.is_file() else path
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p)] = (p.stat().st_mtime_ns, digest)
    return out


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store (creating its tables takes MLflow seconds: done once)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def db(template_db: Path, tmp_path: Path) -> Path:
    path = tmp_path / "store" / "mlflow.db"
    path.parent.mkdir()
    shutil.copy(template_db, path)
    return path


def writer(path: Path) -> Any:
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}" if path.is_file() else path.as_uri())


def log_run(
    client: Any, experiment_id: str, name: str, keys: dict[str, float], steps: range, **params: Any
) -> str:
    run_id = client.create_run(experiment_id, run_name=name).info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for step in steps:
        for i, (key, base) in enumerate(keys.items()):
            client.log_metric(run_id, key, base + i / 100 + step, step=step)
    return run_id


@pytest.fixture
def two_experiments(db: Path) -> dict[str, str]:
    client = writer(db)
    grpo = client.create_experiment("grpo")
    sft = client.create_experiment("sft")
    ids = {
        # veRL's MLflow adapter logs its keys as they are ("@" -> "_at_"; verl/utils/tracking.py).
        "verl": log_run(
            client,
            grpo,
            "verl-run",
            {"actor/entropy": 1.0, "critic/score/mean": 0.0, "actor/pg_clipfrac": 0.1, "timing_s/gen": 2.0},
            range(5),
            **{"actor_rollout_ref/model/vocab_size": 32_000, "max_steps": 100},
        ),
        "trl": log_run(
            client, grpo, "trl-run", {"entropy": 2.0, "reward": 0.5}, range(0, 30, 10), vocab_size=1000
        ),
        "plain": log_run(client, sft, "sft-run", {"loss": 3.0}, range(3), model_name_or_path="tiny/model"),
    }
    client.set_terminated(ids["plain"], status="FINISHED")
    return ids


def runs_by_name(store: Store) -> dict[str, dict[str, Any]]:
    rows = store.conn.execute("SELECT id FROM runs ORDER BY id").fetchall()
    return {run["name"]: run for run in (store.run(r[0]) for r in rows)}


def test_every_run_of_every_experiment(store: Store, db: Path, two_experiments: dict[str, str]) -> None:
    before = snapshot(db)
    assert detect_kind(db) == "mlflow"
    source_id, result = observe(store, db)
    assert snapshot(db) == before  # not a byte, not an mtime, no file beside it
    assert result.bad_lines == 0 and result.caught_up
    runs = runs_by_name(store)
    assert set(runs) == {"verl-run", "trl-run", "sft-run"}
    verl = runs["verl-run"]
    assert verl["external_id"] == two_experiments["verl"] and verl["source_kind"] == "mlflow"
    assert verl["framework"] == "verl" and verl["vocab_size"] == 32_000 and verl["max_steps"] == 100
    assert verl["status"] == "imported"
    import json

    config = json.loads(verl["config"])
    assert config["experiment"] == "grpo" and config["params"]["max_steps"] == "100"
    assert series(store, verl["id"], "entropy") == pytest.approx({s: 1.0 + s for s in range(5)})
    assert series(store, verl["id"], "phi/mean") == pytest.approx(
        {s: 1 - (1.0 + s) / math.log(32_000) for s in range(5)}
    )
    assert series(store, verl["id"], "clip_ratio/region_mean") == pytest.approx(
        {s: 0.12 + s for s in range(5)}
    )
    # timing_s/gen, under carl's name (docs/reference/frameworks.md §2.2)
    assert series(store, verl["id"], "perf/time/generation_s") == pytest.approx(
        {s: 2.03 + s for s in range(5)}
    )
    trl = runs["trl-run"]
    assert trl["framework"] is None  # two keys tell no framework; they are the vocabulary already
    assert series(store, trl["id"], "phi/mean") == pytest.approx(
        {s: 1 - (2.0 + s) / math.log(1000) for s in (0, 10, 20)}
    )
    sft = runs["sft-run"]
    assert sft["status"] == "finished" and sft["model"] == "tiny/model" and sft["ended_at"]
    assert series(store, sft["id"], "loss") == pytest.approx({0: 3.0, 1: 4.0, 2: 5.0})
    reader = StoreReader(store.path)
    try:
        assert reader.key_names(verl["id"])["entropy"] == "actor/entropy"
    finally:
        reader.close()
    # Observing again reads nothing twice.
    _, again = observe(store, db)
    assert again.rows == 0 and snapshot(db) == before


def test_following_reads_only_what_is_new(store: Store, db: Path, two_experiments: dict[str, str]) -> None:
    source_id = register_source(store, db, follow=True)
    first = ingest_source(store, source_id, max_rows=100_000, max_seconds=5)
    assert first.caught_up
    count = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    idle = ingest_source(store, source_id, max_rows=100_000, max_seconds=5)
    assert idle.rows == 0 and store.source(source_id)["cursor"] == store.source(source_id)["cursor"]

    client = writer(db)
    run_id = two_experiments["trl"]
    client.log_metric(run_id, "entropy", 9.0, step=30)
    client.log_metric(run_id, "entropy", 8.0, step=30)  # a later value at a step: ignored, as everywhere
    client.log_metric(run_id, "kl", 0.25, step=30)
    client.log_param(run_id, "lr", "1e-5")
    new = log_run(client, "0", "late-run", {"loss": 1.0}, range(2))
    client.set_terminated(run_id, status="FAILED")
    result = ingest_source(store, source_id, max_rows=100_000, max_seconds=5)
    assert result.caught_up
    runs = runs_by_name(store)
    trl = runs["trl-run"]
    assert series(store, trl["id"], "entropy")[30] == 9.0
    assert series(store, trl["id"], "kl") == {30: 0.25}
    assert trl["status"] == "failed"
    assert runs["late-run"]["external_id"] == new
    # Exactly the new rows: the two step-30 values, Φ and its entropy derived there, the late run's two.
    assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == count + 6
    assert result.rows == 6


def test_bounded_batches_add_up(store: Store, db: Path) -> None:
    client = writer(db)
    experiment = client.create_experiment("long")
    run_id = client.create_run(experiment, run_name="long").info.run_id
    from mlflow.entities import Metric

    client.log_batch(run_id, metrics=[Metric("reward", s / 10, 1_700_000_000_000 + s, s) for s in range(250)])
    client.log_batch(
        run_id, metrics=[Metric("loss", 1 / (s + 1), 1_700_000_000_000 + s, s) for s in range(250)]
    )
    source_id = register_source(store, db, follow=True)
    batches = 0
    while True:
        result = ingest_source(store, source_id, max_rows=60, max_seconds=5)
        batches += 1
        if result.caught_up:
            break
        assert batches < 50
    assert batches > 5
    [run] = runs_by_name(store).values()
    assert series(store, run["id"], "reward") == pytest.approx({s: s / 10 for s in range(250)})
    assert len(series(store, run["id"], "loss")) == 250
    walls = store.conn.execute("SELECT min(wall_time), max(wall_time) FROM metrics").fetchone()
    assert walls == (1_700_000_000.0, pytest.approx(1_700_000_000.249))


def test_an_mlruns_directory(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "mlruns"
    client = writer(root)
    experiment = client.create_experiment("files")
    log_run(
        client, experiment, "file-run", {"policy/policy_entropy": 1.5, "reward/avg_raw_reward": 0.5}, range(4)
    )
    before = snapshot(root)
    assert detect_kind(root) == "mlflow"
    _, result = observe(store, root)
    assert snapshot(root) == before
    [run] = runs_by_name(store).values()
    assert run["name"] == "file-run" and run["framework"] == "skyrl"
    assert series(store, run["id"], "entropy") == pytest.approx({s: 1.5 + s for s in range(4)})

    shutil.rmtree(root / ".trash")  # a store MLflow's file store would write into on opening
    before = snapshot(root)
    with pytest.raises(ObserveError, match=r"\.trash"):
        observe(store, root)
    assert snapshot(root) == before


def test_a_store_of_another_mlflow_version_is_one_line(store: Store, db: Path, two_experiments: dict) -> None:
    _, result = observe(store, db)
    stored = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    newer = db.parent / "newer.db"  # MLflow caches a store it opened: a copy is a store it has not seen
    shutil.copy(db, newer)
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE alembic_version SET version_num='ffffffffffff'")
    conn.commit()
    conn.close()
    with pytest.raises(ObserveError) as caught:
        observe(store, newer)
    message = str(caught.value)
    assert "\n" not in message and str(newer) in message and "schema" in message
    assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == stored  # nothing lost


def test_without_mlflow_installed_one_line_names_the_extra(
    store: Store, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # `from mlflow.tracking import ...` fails
    with pytest.raises(ObserveError, match=r"carl-tui\[mlflow\]"):
        observe(store, db)


def test_sqlite_files_that_are_not_mlflow(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE runs (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(ObserveError, match="not a Trackio project"):
        detect_kind(other)
