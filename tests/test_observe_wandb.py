"""W&B run files written by the real wandb (offline, in a subprocess: no network, no login), read back."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb_frames
from support import series
from test_daemon import metric_count, wait_for

from engine import paths
from engine.control import engine_status, start_engine, stop_engine
from engine.observe import IngestResult, detect_kind, ingest_source, observe, register_source
from engine.store import Store

pytestmark = pytest.mark.slow
STEPS = 300  # the module's GRPO run: about ten of wandb's 32 KiB blocks


def ingest(store: Store, source_id: int) -> IngestResult:
    """One batch with room for everything these small files hold, however loaded the machine is."""
    return ingest_source(store, source_id, max_rows=1_000_000, max_seconds=60)


# Logs the steps it is given, says so, and (when told to wait) logs the rest once a line comes on stdin.
WRITER = """
import json, sys, wandb
spec = json.load(open(sys.argv[1]))
run = wandb.init(project="carl-test", name=spec.get("name"), config=spec.get("config"),
                 settings=wandb.Settings(console="off"))
for step, metrics in spec["steps"]:
    if spec.get("table_every") and step % spec["table_every"] == 0:  # as TRL logs its completions
        metrics = {**metrics, "completions": wandb.Table(columns=["prompt", "completion"], data=[["p", "c"]])}
    if spec.get("histogram"):  # as veRL and TRL users log a distribution: counts and n + 1 edges
        counts, edges = spec["histogram"]
        metrics = {**metrics, "actor/log_probs": wandb.Histogram(np_histogram=(counts, edges))}
    wandb.log(metrics, step=step) if step is not None else wandb.log(metrics)
for key, value in spec.get("summary", {}).items():
    run.summary[key] = value
print("logged", flush=True)
if spec.get("then"):
    sys.stdin.readline()
    for step, metrics in spec["then"]:
        wandb.log(metrics, step=step)
run.finish(exit_code=spec.get("exit_code", 0))
"""


def wandb_env(wandb_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_CONFIG_DIR": str(wandb_dir / ".config"),
        "WANDB_CACHE_DIR": str(wandb_dir / ".cache"),
        "WANDB_DATA_DIR": str(wandb_dir / ".data"),
    }


def start_writer(wandb_dir: Path, spec: dict[str, Any]) -> subprocess.Popen[str]:
    wandb_dir.mkdir(parents=True, exist_ok=True)
    spec_file = wandb_dir / f"spec-{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(spec))
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(spec_file)],
        env=wandb_env(wandb_dir),
        cwd=wandb_dir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def write_run(wandb_dir: Path, spec: dict[str, Any]) -> Path:
    """Run the writer to its end; returns the new run directory."""
    before = set(run_dirs(wandb_dir))
    writer = start_writer(wandb_dir, spec)
    assert writer.wait(timeout=120) == 0
    [new] = set(run_dirs(wandb_dir)) - before
    return new


def run_dirs(wandb_dir: Path) -> list[Path]:
    root = wandb_dir / "wandb"
    return sorted(p for p in root.glob("offline-run-*") if not p.is_symlink()) if root.exists() else []


def run_file(run_dir: Path) -> Path:
    [file] = run_dir.glob("run-*.wandb")
    return file


def grpo_step(step: int) -> dict[str, Any]:
    return {
        "train/entropy": 1.0 + step / 64,
        "train/reward": step / 10,
        "train/rewards/fmt/mean": 0.5 + step / 100,
        "train/clip_ratio/low_mean": 0.001 * step,
        "train/completions/mean_length": 40.0 + step,
        "eval": {"accuracy": step / 30},  # nested: eval/accuracy
        "note": "text is not a metric",
        "flag": True,
    }


def expected_series(steps: range, key: str) -> dict[int, float]:
    """What was logged for a stored key (`train/` dropped; `eval/accuracy` was nested)."""
    path = key.split("/") if key.startswith("eval/") else [f"train/{key}"]
    values = {}
    for step in steps:
        value: Any = grpo_step(step)
        for part in path:
            value = value[part]
        values[step] = float(value)
    return values


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished offline run as TRL's WandbCallback would log it (model config in the run's config)."""
    wandb_dir = tmp_path_factory.mktemp("wandb-grpo")
    return write_run(
        wandb_dir,
        {
            "name": "grpo-tiny",
            "config": {
                "model": {"vocab_size": 64, "hidden_size": 16},
                "learning_rate": 1e-5,
                "max_steps": STEPS,
            },
            "steps": [[step, grpo_step(step)] for step in range(STEPS)],
            "table_every": 100,  # a table's fields are logged flat (completions/size, ...): not metrics
            "summary": {"best_reward": 2.9},
        },
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "carl"
    monkeypatch.setenv("CARL_HOME", str(home))
    yield home
    stop_engine(home, timeout=5.0)  # never leave a daemon behind


def test_a_run_directory(store: Store, grpo_run: Path) -> None:
    file = run_file(grpo_run)
    before = (file.read_bytes(), file.stat().st_mtime_ns)
    assert detect_kind(grpo_run) == detect_kind(file) == detect_kind(grpo_run.parent) == "wandb"

    source_id, result = observe(store, grpo_run)
    assert result.bad_lines == 0 and result.caught_up
    [run_id] = result.run_ids
    run = store.run(run_id)
    assert (run["name"], run["external_id"], run["framework"]) == ("grpo-tiny", file.stem[4:], "trl")
    assert (run["status"], run["vocab_size"], run["max_steps"]) == ("finished", 64, STEPS)
    config = json.loads(run["config"])
    assert config["learning_rate"] == 1e-5 and config["model"] == {"vocab_size": 64, "hidden_size": 16}
    assert config["summary"]["best_reward"] == 2.9 and config["summary"]["train/reward"] == (STEPS - 1) / 10
    assert "_wandb" not in config and not any(k.startswith("_") for k in config["summary"])

    steps = range(STEPS)
    for key in ("entropy", "reward", "rewards/fmt/mean", "clip_ratio/low_mean", "completions/mean_length"):
        assert series(store, run_id, key) == expected_series(steps, key), key
    assert series(store, run_id, "eval/accuracy") == expected_series(steps, "eval/accuracy")
    keys = {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (run_id,))}
    assert keys == {
        "entropy",
        "reward",
        "rewards/fmt/mean",
        "clip_ratio/low_mean",
        "completions/mean_length",
        "eval/accuracy",
        "phi/mean",  # from the entropy and |V| = 64 of the run's config
        "phi/entropy",
    }
    assert series(store, run_id, "phi/mean")[5] == pytest.approx(1 - (1 + 5 / 64) / math.log(64))
    walls = [r[0] for r in store.conn.execute("SELECT wall_time FROM metrics WHERE run_id=?", (run_id,))]
    assert file.stat().st_mtime - 120 < min(walls) <= max(walls) <= file.stat().st_mtime + 1  # `_timestamp`
    assert store.source(source_id)["cursor"]["files"][file.name]["offset"] == file.stat().st_size
    assert (file.read_bytes(), file.stat().st_mtime_ns) == before  # the user's file is never written


def test_histograms_are_kept_as_wandb_wrote_them(store: Store, tmp_path: Path) -> None:
    """A `wandb.Histogram` is logged flat (`<key>/_type`, `<key>/values`, `<key>/bins`): kept as the run's
    histogram at its step, never as metrics."""
    from engine.store import StoreReader

    edges = [-2.0, -1.0, -0.25, 0.0]
    spec = {
        "steps": [[step, {"train/reward": step / 2}] for step in range(3)],
        "histogram": [[1, 5, 2], edges],
    }
    run_dir = write_run(tmp_path, spec)
    _, result = observe(store, run_dir)
    [run_id] = result.run_ids
    assert result.rows == 3 + 3 and result.problems == []
    reader = StoreReader(store.path)
    try:
        assert reader.histograms.keys(run_id) == ["actor/log_probs"]
        series = reader.histograms.series(run_id, "actor/log_probs")
        metric_keys = reader.metric_keys(run_id)
    finally:
        reader.close()
    assert series.steps == [0, 1, 2]
    assert all(list(h.edges) == edges and list(h.counts) == [1, 5, 2] for h in series.histograms)
    assert not any(key.startswith("actor/log_probs") for key in metric_keys), metric_keys


def test_a_wandb_directory_with_two_runs(store: Store, tmp_path: Path) -> None:
    named = write_run(tmp_path, {"name": "first", "steps": [[s, {"loss": 1 / (s + 1)}] for s in range(5)]})
    unnamed = write_run(tmp_path, {"steps": [[s, {"loss": 2 / (s + 1)}] for s in range(7)], "exit_code": 3})
    assert (tmp_path / "wandb" / "latest-run").is_symlink()  # a link to the second: not read twice

    _, result = observe(store, tmp_path / "wandb")
    assert result.rows == 12 and result.bad_lines == 0
    runs = {store.run(r)["name"]: store.run(r) for r in result.run_ids}
    unnamed_id = run_file(unnamed).stem[4:]
    assert set(runs) == {"first", unnamed_id}  # an unnamed offline run is named by its id
    assert runs["first"]["status"] == "finished" and runs[unnamed_id]["status"] == "failed"  # its exit code
    assert series(store, runs["first"]["id"], "loss") == {s: 1 / (s + 1) for s in range(5)}
    assert named != unnamed


def test_the_trainers_global_step_is_the_step(store: Store, tmp_path: Path) -> None:
    """transformers' WandbCallback logs without a step, adding `train/global_step`; TRL logs its profiling
    timings in calls of their own: wandb's `_step` counts all of them."""
    logs: list[list[Any]] = []
    for step in range(1, 6):
        logs.append([None, {"profiling/Time taken: GRPOTrainer.generate": 0.2}])
        logs.append([None, {"train/loss": step / 10, "train/global_step": step}])
    run_dir = write_run(tmp_path, {"name": "trl", "steps": logs})
    _, result = observe(store, run_dir)
    assert series(store, result.run_ids[0], "loss") == {step: step / 10 for step in range(1, 6)}


def test_following_a_run_being_written(store: Store, tmp_path: Path) -> None:
    """wandb writes its file a 32 KiB block at a time: records cut at a block's end wait for the next."""
    spec = {
        "name": "live",
        "steps": [[s, {"loss": s / 7, "text": "x" * 200}] for s in range(400)],
        "then": [[s, {"loss": s / 7, "text": "y" * 200}] for s in range(400, 500)],
    }
    writer = start_writer(tmp_path, spec)
    assert writer.stdout is not None and writer.stdout.readline() == "logged\n"
    [run_dir] = run_dirs(tmp_path)
    source_id = register_source(store, run_dir, follow=True)
    wait_for(lambda: run_file(run_dir).stat().st_size > 64 * 1024, what="the writer's first blocks")
    seen = 0
    deadline = time.monotonic() + 10
    while seen == 0 and time.monotonic() < deadline:
        result = ingest(store, source_id)
        assert result.bad_lines == 0, result.problems
        seen += result.rows
    assert 0 < seen < 500

    writer.communicate("go on\n", timeout=120)
    assert writer.returncode == 0
    total = seen
    while True:
        result = ingest(store, source_id)
        assert result.bad_lines == 0, result.problems
        total += result.rows
        if result.caught_up:
            break
    [run_id] = result.run_ids or [r[0] for r in store.conn.execute("SELECT id FROM runs")]
    assert total == 500 and series(store, run_id, "loss") == {s: s / 7 for s in range(500)}
    assert store.run(run_id)["status"] == "finished"


def test_a_file_cut_anywhere_waits_for_the_rest(store: Store, grpo_run: Path, tmp_path: Path) -> None:
    data = run_file(grpo_run).read_bytes()
    block = 32 * 1024
    cuts = [5, 1000, block - 3, block + 4, block + 300, len(data) - 20]
    for n, cut in enumerate(cuts):
        followed = tmp_path / f"cut-{n}" / run_file(grpo_run).name
        shutil.copytree(grpo_run / "files", followed.parent / "files")  # its tables
        followed.write_bytes(data[:cut])
        source_id = register_source(store, followed, follow=True, name=f"cut-{n}")
        first = ingest(store, source_id)
        assert first.caught_up and first.bad_lines == 0, (cut, first.problems)
        with open(followed, "ab") as f:
            f.write(data[cut:])
        second = ingest(store, source_id)
        assert second.bad_lines == 0, (cut, second.problems)
        assert first.rows + second.rows == STEPS * 8, cut  # 6 series and 2 derived, each row once
        run_id = store.run_id_by_name(f"cut-{n}")
        assert run_id is not None and series(store, run_id, "reward") == expected_series(
            range(STEPS), "reward"
        )


def test_a_file_from_a_newer_wandb_is_one_line(store: Store, grpo_run: Path, tmp_path: Path) -> None:
    _, good = observe(store, grpo_run)
    stored = metric_rows(store)
    newer = tmp_path / run_file(grpo_run).name
    data = bytearray(run_file(grpo_run).read_bytes())
    data[6] = 1  # the header's log format version
    newer.write_bytes(bytes(data))

    source_id = register_source(store, newer, follow=True)
    result = ingest(store, source_id)
    assert result.rows == 0 and result.bad_lines == 1 and len(result.problems) == 1
    line = result.problems[0]
    assert (
        line.startswith(f"{newer.name}: record 0 (the file header): log format version 1")
        and "\n" not in line
    )
    assert ingest(store, source_id).bad_lines == 0  # said once
    assert metric_rows(store) == stored and good.rows == stored  # nothing stored is lost


def records_of(path: Path) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each record of a run file, as our framing reader reads them."""
    from engine.observe.wandb_log import RecordLog

    with open(path, "rb") as f:
        items = RecordLog(f, path.stat().st_size, 0)
        return [(offset, bytes(item)) for offset, item in items if isinstance(item, bytes | memoryview)]


def test_a_record_type_this_wandb_does_not_know_is_one_line(
    store: Store, grpo_run: Path, tmp_path: Path
) -> None:
    """The run framed again as wandb frames it (tests/wandb_frames.py), with one record of a type from the
    future added."""
    records = [data for _, data in records_of(run_file(grpo_run))]
    future = b"\xb8\x3e\x01"  # field 999: a record type these protobufs do not have
    newer = tmp_path / "newer" / run_file(grpo_run).name
    newer.parent.mkdir()
    wandb_frames.write(newer, [*records[:3], future, *records[3:]])

    _, result = observe(store, newer)
    assert result.rows == STEPS * 8 and result.bad_lines == 1 + 3  # the line, and the three missing tables
    assert result.problems[0].startswith(f"{newer.name}: record 4 (byte ")
    assert "a record type wandb" in result.problems[0] and "newer wandb" in result.problems[0]
    assert "no such file" in result.problems[1] and len(result.problems) == 2  # a missing table, said once


def test_a_damaged_record_is_one_line_and_reading_goes_on(
    store: Store, grpo_run: Path, tmp_path: Path
) -> None:
    from wandb.proto.wandb_internal_pb2 import Record

    history: dict[int, int] = {}  # step -> where its history record starts
    for offset, data in records_of(run_file(grpo_run)):
        record = Record.FromString(data)
        if record.WhichOneof("record_type") == "history":
            history[record.history.step.num] = offset
    data = bytearray(run_file(grpo_run).read_bytes())
    data[history[200] + 7 + 20] ^= 0xFF  # in the data of step 200's record: its checksum fails
    damaged = tmp_path / run_file(grpo_run).name
    damaged.write_bytes(bytes(data))
    shutil.copytree(grpo_run / "files", tmp_path / "files")

    _, result = observe(store, damaged)
    assert result.bad_lines == 1 and len(result.problems) == 1
    assert result.problems[0].startswith(f"{damaged.name}: record ") and "damaged" in result.problems[0]
    [run_id] = result.run_ids
    steps = set(series(store, run_id, "reward"))
    lost = set(range(STEPS)) - steps
    assert 200 in lost and max(lost) < 240 and set(range(200)) <= steps  # at most the rest of one block
    assert set(range(240, STEPS)) <= steps  # read on after it


def test_kill_9_mid_follow_loses_and_duplicates_nothing(home: Path, tmp_path: Path) -> None:
    keys = [f"train/k{i}" for i in range(40)]
    steps = 4000
    run_dir = write_run(
        tmp_path / "w",
        {"name": "big", "steps": [[s, {k: s / 1000 + i for i, k in enumerate(keys)}] for s in range(steps)]},
    )
    with Store(paths.db_path(home)) as store:  # as `carl observe --follow RUN_DIR` asks the engine
        store.enqueue_command("observe", {"path": str(run_dir), "follow": True})

    first, _ = start_engine(home)
    assert first.pid is not None
    wait_for(lambda: metric_count(home) > 0, what="the first rows", timeout=30)
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: engine_status(home).state == "down", what="the killed engine to be gone")
    partial = metric_count(home)
    assert 0 < partial < steps * len(keys), "killed too late to test anything"

    start_engine(home)
    wait_for(lambda: metric_count(home) >= steps * len(keys), what="catching up", timeout=120)
    stop_engine(home, timeout=10)
    with Store(paths.db_path(home)) as store:
        assert metric_rows(store) == steps * len(keys)  # none lost, none twice
        [run_id] = [r[0] for r in store.conn.execute("SELECT id FROM runs")]
        for i in (0, 17, 39):
            assert series(store, run_id, f"k{i}") == {s: s / 1000 + i for s in range(steps)}


def metric_rows(store: Store) -> int:
    return int(store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0])
