"""TensorBoard event files written by the real writers: torch's SummaryWriter (simple_value) and tensorboard's
own summary Writer (0-d tensors of the scalars plugin), read back and compared with its EventFileLoader."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import series
from test_daemon import metric_count, wait_for

from engine import paths
from engine.control import engine_status, start_engine, stop_engine
from engine.observe import IngestResult, ObserveError, detect_kind, ingest_source, observe, register_source
from engine.observe import tensorboard as tb
from engine.store import Store

pytestmark = pytest.mark.slow


def ingest(store: Store, source_id: int) -> IngestResult:
    """One batch with room for everything these small files hold, however loaded the machine is."""
    return ingest_source(store, source_id, max_rows=1_000_000, max_seconds=60)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "carl"
    monkeypatch.setenv("CARL_HOME", str(home))
    yield home
    stop_engine(home, timeout=5.0)  # never leave a daemon behind


def summary_writer(logdir: Path):  # noqa: ANN201 (torch's SummaryWriter, imported late: torch loads slowly)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(logdir), max_queue=1000)


def event_files(logdir: Path) -> list[Path]:
    return sorted((p for p in logdir.iterdir() if "tfevents" in p.name), key=lambda p: tb.name_order(p.name))


def loader_scalars(*files: Path) -> dict[str, dict[int, float]]:
    """Every scalar of the files as tensorboard's own EventFileLoader (compat layers included) gives them."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    scalars: dict[str, dict[int, float]] = {}
    for file in files:
        for event in EventFileLoader(str(file)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name in ("scalars", "") and value.HasField("tensor"):
                    array = tensor_util.make_ndarray(value.tensor)
                    if array.ndim == 0 and array.dtype.kind == "f":
                        scalars.setdefault(value.tag, {})[event.step] = float(array)
    return scalars


def stored(store: Store, run_id: int) -> dict[str, dict[int, float]]:
    keys = [r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (run_id,))]
    return {key: series(store, run_id, key) for key in keys}


def row_count(store: Store) -> int:
    return int(store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0])


def test_every_scalar_of_a_long_tag_is_read(store: Store, tmp_path: Path) -> None:
    logdir = tmp_path / "runs" / "Nov27_01-16-09_box"
    writer = summary_writer(logdir)
    for step in range(12_000):  # past the accumulator's 10,000-point reservoir
        writer.add_scalar("train/loss", 1 / (step + 1), step)
        if step % 100 == 0:
            writer.add_scalar("eval/loss", 2 / (step + 1), step)
    writer.add_histogram("weights", np.arange(10), 5)
    writer.add_text("args", "lr=1e-5", 5)
    writer.add_image("sample", np.zeros((3, 4, 4)), 5)
    writer.close()
    [file] = event_files(logdir)
    before = (file.read_bytes(), file.stat().st_mtime_ns)

    detected = detect_kind(file)
    source_id, result = observe(store, file)
    assert detected == "tensorboard" and result.bad_lines == 0
    [run_id] = result.run_ids
    assert store.run(run_id)["name"] == "Nov27_01-16-09_box"  # a run is named after its directory
    expected = loader_scalars(file)
    assert len(expected["train/loss"]) == 12_000
    assert stored(store, run_id) == {"loss": expected["train/loss"], "eval/loss": expected["eval/loss"]}
    assert result.rows == 12_000 + 120 + 1  # the scalars and the histogram
    [(key, step)] = store.conn.execute(
        "SELECT key, step FROM histograms WHERE run_id=?", (run_id,)
    ).fetchall()
    assert (key, step) == ("weights", 5)
    entry = store.source(source_id)["cursor"]["files"][file.name]
    assert entry["skipped"] == 2 and entry["bytes"] == file.stat().st_size  # the text (no samples), the image
    walls = [r[0] for r in store.conn.execute("SELECT wall_time FROM metrics WHERE run_id=?", (run_id,))]
    assert (
        file.stat().st_mtime - 120 < min(walls) <= max(walls) <= file.stat().st_mtime + 1
    )  # the events' own
    assert (file.read_bytes(), file.stat().st_mtime_ns) == before  # the user's file is never written


def test_tensor_scalars_of_tf2_style_writers(store: Store, tmp_path: Path) -> None:
    from tensorboard.summary import Writer

    tf2 = Writer(str(tmp_path / "tf2"))  # 0-d tensors, scalars plugin metadata on a tag's first value
    for step in range(50):
        tf2.add_scalar("train/entropy", 0.5 + step / 100, step)
        tf2.add_scalar("train/kl", step / 1000, step)
    tf2.close()
    torch_writer = summary_writer(tmp_path / "torch-new-style")
    for step in range(50):
        torch_writer.add_scalar("train/reward", step / 50, step, new_style=True)
    torch_writer.close()

    source_id, result = observe(store, tmp_path)
    assert result.bad_lines == 0 and len(result.run_ids) == 2
    runs = {store.run(r)["name"]: r for r in result.run_ids}
    tf2_expected = loader_scalars(*event_files(tmp_path / "tf2"))
    assert stored(store, runs["tf2"]) == {
        "entropy": tf2_expected["train/entropy"],
        "kl": tf2_expected["train/kl"],
    }
    new_style = loader_scalars(*event_files(tmp_path / "torch-new-style"))
    assert stored(store, runs["torch-new-style"]) == {"reward": new_style["train/reward"]}


def test_a_tree_of_runs_read_in_name_order(store: Store, tmp_path: Path) -> None:
    """Two runs; one restarted, so it has two event files; TRL's keys tell the framework; |V| gives Phi."""
    root = tmp_path / "logs"
    first = summary_writer(root / "grpo" / "seed-1")
    for step in range(10):
        first.add_scalar("train/entropy", 1.0 + step / 10, step)
        first.add_scalar("train/clip_ratio/low_mean", 0.01, step)
        first.add_scalar("train/completions/mean_length", 40.0, step)
    first.close()
    resumed = summary_writer(root / "grpo" / "seed-1")  # a second file in the same run directory
    for step in range(10, 15):
        resumed.add_scalar("train/entropy", 1.0 + step / 10, step)
    resumed.close()
    other = summary_writer(root / "sft")
    for step in range(7):
        other.add_scalar("train/loss", 3.0 - step / 10, step)
    other.close()
    assert len(event_files(root / "grpo" / "seed-1")) == 2

    assert detect_kind(root) == "tensorboard"
    source_id = register_source(store, root, follow=True)
    result = ingest(store, source_id)
    assert result.caught_up and result.bad_lines == 0
    runs = {store.run(r)["name"]: store.run(r) for r in result.run_ids}
    assert set(runs) == {"grpo/seed-1", "sft"}
    grpo = runs["grpo/seed-1"]
    assert grpo["framework"] == "trl" and runs["sft"]["framework"] is None
    expected = loader_scalars(*event_files(root / "grpo" / "seed-1"))
    assert series(store, grpo["id"], "entropy") == expected["train/entropy"]
    assert sorted(series(store, grpo["id"], "entropy")) == list(range(15))
    assert (
        series(store, runs["sft"]["id"], "loss") == loader_scalars(*event_files(root / "sft"))["train/loss"]
    )

    # |V| set on the run (as `carl observe --vocab-size` does): what comes next derives Phi from the entropy.
    store.update_run(grpo["id"], vocab_size=64)
    more = summary_writer(root / "grpo" / "seed-1")
    more.add_scalar("train/entropy", 2.0, 15)
    more.close()
    ingest(store, source_id)
    assert series(store, grpo["id"], "phi/mean")[15] == pytest.approx(1 - 2.0 / np.log(64))


def test_the_config_texts_of_transformers_give_the_vocabulary(store: Store, tmp_path: Path) -> None:
    """transformers' TensorBoardCallback.on_train_begin writes the TrainingArguments and the model's config as
    text (transformers/integrations/integration_utils.py), then on_log the metrics: the same calls here."""
    writer = summary_writer(tmp_path / "runs" / "Nov27_12-00-00_box")
    writer.add_text("args", json.dumps({"output_dir": "out", "max_steps": 20, "learning_rate": 1e-5}))
    writer.add_text("model_config", json.dumps({"_name_or_path": "tiny-llama", "vocab_size": 512}))
    for step in range(1, 21):
        writer.add_scalar("train/entropy", 2.0 + step / 100, step)
        writer.add_scalar("train/reward", step / 20, step)
        writer.add_text("train/note", "text logged by the trainer", step)
    writer.close()

    _, result = observe(store, tmp_path / "runs")
    [run_id] = result.run_ids
    run = store.run(run_id)
    assert (run["vocab_size"], run["model"], run["max_steps"]) == (512, "tiny-llama", 20)
    phi = series(store, run_id, "phi/mean")
    assert sorted(phi) == list(range(1, 21))
    assert phi[10] == pytest.approx(1 - np.float32(2.1) / np.log(512))  # the entropy as float32, as written


def test_following_a_file_while_it_is_written(store: Store, tmp_path: Path) -> None:
    writer = summary_writer(tmp_path / "run")
    for step in range(100):
        writer.add_scalar("train/loss", step / 100, step)
    writer.flush()
    source_id = register_source(store, tmp_path / "run", follow=True)
    first = ingest(store, source_id)
    assert first.caught_up and first.rows == 100
    assert ingest(store, source_id).rows == 0  # nothing new: nothing read, nothing written

    for step in range(100, 250):
        writer.add_scalar("train/loss", step / 100, step)
    writer.flush()
    assert ingest(store, source_id).rows == 150

    # A restart (a new engine, the same cursor) reads on from the byte where the stored records end.
    for step in range(250, 260):
        writer.add_scalar("train/loss", step / 100, step)
    writer.close()
    assert ingest(store, source_id).rows == 10
    [run_id] = first.run_ids
    assert series(store, run_id, "loss") == loader_scalars(*event_files(tmp_path / "run"))["train/loss"]
    assert row_count(store) == 260


def test_a_record_cut_off_at_the_end_is_waited_for(store: Store, tmp_path: Path) -> None:
    writer = summary_writer(tmp_path / "written")
    for step in range(30):
        writer.add_scalar("train/loss", step / 10, step)
    writer.close()
    [written] = event_files(tmp_path / "written")
    data = written.read_bytes()
    followed = tmp_path / "followed" / written.name
    followed.parent.mkdir()
    followed.write_bytes(data[:-7])  # the writer is mid-way through its last record

    source_id = register_source(store, followed, follow=True)
    result = ingest(store, source_id)
    assert result.caught_up and result.bad_lines == 0 and result.rows == 29
    assert ingest(store, source_id).rows == 0  # still waiting, and quietly
    with open(followed, "ab") as f:
        f.write(data[-7:])
    result = ingest(store, source_id)
    assert result.rows == 1 and result.bad_lines == 0
    assert series(store, result.run_ids[0], "loss") == loader_scalars(written)["train/loss"]

    # Imported once (not followed), a cut-off end is said once, and what came before is stored.
    cut = tmp_path / "imported" / written.name
    cut.parent.mkdir()
    cut.write_bytes(data[:-7])
    _, imported = observe(store, cut)
    assert imported.rows == 29 and len(imported.problems) == 1
    [problem] = imported.problems
    assert "record 31 (byte 1478): cut off at the end" in problem and written.name in problem


def test_a_damaged_record_is_one_line_and_the_next_file_is_read(store: Store, tmp_path: Path) -> None:
    run = tmp_path / "run"
    writer = summary_writer(run)
    for step in range(40):
        writer.add_scalar("train/loss", step / 10, step)
    writer.close()
    [damaged] = event_files(run)
    source_id = register_source(store, run, follow=True)
    assert ingest(store, source_id).rows == 40

    # The writer goes on in a new file whose 21st record (step 19) the disk damages.
    later = summary_writer(run)
    for step in range(40, 80):
        later.add_scalar("train/loss", step / 10, step)
    later.close()
    newest = event_files(run)[-1]
    data = bytearray(newest.read_bytes())
    offsets = record_offsets(newest)
    data[offsets[20] + 14] ^= 0xFF  # a byte of the record's data: its CRC no longer matches
    newest.write_bytes(bytes(data))
    third = summary_writer(run)  # and then it restarts once more
    third.add_scalar("train/loss", 9.0, 80)
    third.close()

    result = ingest(store, source_id)
    assert result.bad_lines == 1 and len(result.problems) == 1
    assert result.problems[0].startswith(f"{newest.name}: record 21 (byte 1000): failed its CRC check")
    run_id = result.run_ids[0]
    loss = series(store, run_id, "loss")
    assert sorted(loss) == [*range(40), *range(40, 59), 80]  # before the damage, and the next file
    assert ingest(store, source_id).bad_lines == 0  # said once
    assert damaged.exists() and len(series(store, run_id, "loss")) == 60  # nothing stored was lost


def record_offsets(path: Path) -> list[int]:
    """Where each TFRecord of a file starts, from the lengths tensorboard's reader reports."""
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader = pywrap_tensorflow.PyRecordReader_New(str(path).encode())
    offsets, at = [], 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return offsets
        offsets.append(at)
        at += len(reader.record()) + 16


def test_kill_9_mid_follow_loses_and_duplicates_nothing(home: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "big"
    writer = summary_writer(logdir)
    keys = ("train/loss", "train/reward", "train/entropy", "train/kl")
    steps = 40_000
    for step in range(steps):
        for i, key in enumerate(keys):
            writer.add_scalar(key, step / steps + i, step)
    writer.flush()
    with Store(paths.db_path(home)) as store:
        register_source(store, logdir, follow=True)

    first, _ = start_engine(home)
    assert first.pid is not None
    wait_for(lambda: metric_count(home) > 0, what="the first rows", timeout=30)
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: engine_status(home).state == "down", what="the killed engine to be gone")
    partial = metric_count(home)
    assert 0 < partial < steps * len(keys), "killed too late to test anything"

    start_engine(home)  # skips the records the cursor counts, then reads on, and follows
    for step in range(steps, steps + 500):
        for i, key in enumerate(keys):
            writer.add_scalar(key, step / steps + i, step)
    writer.close()
    total = (steps + 500) * len(keys)
    wait_for(lambda: metric_count(home) >= total, what="catching up", timeout=120)
    stop_engine(home, timeout=10)
    with Store(paths.db_path(home)) as store:
        assert row_count(store) == total  # none lost, none twice
        [run_id] = [r[0] for r in store.conn.execute("SELECT id FROM runs")]
        expected = loader_scalars(*event_files(logdir))
        for key in keys:
            assert series(store, run_id, key.removeprefix("train/")) == expected[key]


def test_detection_by_name(tmp_path: Path) -> None:
    writer = summary_writer(tmp_path / "a" / "b")
    writer.add_scalar("x", 1.0, 0)
    writer.close()
    [file] = event_files(tmp_path / "a" / "b")
    copy = tmp_path / "elsewhere" / file.name
    copy.parent.mkdir()
    shutil.copy(file, copy)
    assert detect_kind(file) == detect_kind(tmp_path / "a") == detect_kind(copy.parent) == "tensorboard"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ObserveError, match="TensorBoard event files or W&B runs"):
        detect_kind(tmp_path / "empty")
