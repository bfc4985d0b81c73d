"""trainer_state.json and Trackio files written by a real (tiny) transformers Trainer run."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import series

from engine.observe import ObserveError, detect_kind, ingest_source, observe
from engine.store import Store

pytestmark = pytest.mark.slow

PROJECT = "carl-observe-trainer"


@dataclass
class Trained:
    output_dir: Path
    trackio_db: Path

    def state(self, name: str = "trainer_state.json") -> dict:
        return json.loads((self.output_dir / name).read_text())


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """6 steps of a random 2-layer Llama (vocab 64) on CPU, logging every step to Trackio,
    checkpointing every 3 steps, then `save_state()`; a few seconds, once per session."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if "trackio" not in sys.modules:  # trackio fixes its directory when imported
        os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    import torch
    from trackio.sqlite_storage import SQLiteStorage
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    ids = [torch.tensor([(i + j) % 64 for j in range(8)]) for i in range(64)]
    dataset = [
        {"input_ids": x, "labels": x.clone(), "attention_mask": torch.ones(8, dtype=torch.long)} for x in ids
    ]
    output_dir = tmp_path_factory.mktemp("trainer") / "tiny-run"
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=6,
        logging_steps=1,
        save_steps=3,
        save_only_model=True,
        per_device_train_batch_size=4,
        use_cpu=True,
        disable_tqdm=True,
        report_to=["trackio"],
        project=PROJECT,
        run_name="tiny",
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=dataset)
    trainer.train()
    trainer.save_state()
    return Trained(output_dir, Path(SQLiteStorage.get_project_db_path(PROJECT)))


def expected(history: list[dict], key: str) -> dict[int, float]:
    """First value of `key` per step, as the unique (run, key, step) index keeps it."""
    out: dict[int, float] = {}
    for entry in history:
        if key in entry:
            out.setdefault(entry["step"], entry[key])
    return out


# -- trainer_state.json ------------------------------------------------------------------------


def test_trainer_state_file(store: Store, trained: Trained) -> None:
    path = trained.output_dir / "trainer_state.json"
    history = trained.state()["log_history"]
    assert len(history) == 7 and "train_runtime" in history[-1]
    assert detect_kind(path) == "trainer_state"
    source_id, result = observe(store, path)
    assert result.caught_up and result.bad_lines == 0 and (result.done, result.total) == (7, 7)
    run = store.run(result.run_ids[0])
    assert run["name"] == "tiny-run" and run["source_kind"] == "trainer_state"
    assert run["max_steps"] == 6 and run["last_step"] == 6
    assert run["vocab_size"] == 64 and run["model"] == "LlamaForCausalLM"  # newest checkpoint's config.json
    assert run["status"] == "finished" and run["ended_at"] == path.stat().st_mtime
    for key in (
        "loss",
        "grad_norm",
        "learning_rate",
        "epoch",
        "train_loss",
        "train_runtime",
        "total_flos",
        "train_samples_per_second",
        "train_steps_per_second",
    ):
        assert series(store, run["id"], key) == expected(history, key), key
    assert len(series(store, run["id"], "loss")) == 6
    assert series(store, run["id"], "train_loss") == {6: history[-1]["train_loss"]}  # kept as is
    assert store.source(source_id)["state"] == "done"


def test_checkpoint_dir(store: Store, trained: Trained) -> None:
    checkpoint = trained.output_dir / "checkpoint-3"
    assert detect_kind(checkpoint) == "trainer_state"
    _, result = observe(store, checkpoint, name="ckpt")
    run = store.run(result.run_ids[0])
    assert run["name"] == "ckpt" and run["status"] == "imported" and run["vocab_size"] == 64
    assert series(store, run["id"], "loss") == expected(trained.state()["log_history"][:3], "loss")


def test_output_dir_uses_the_top_level_file(store: Store, trained: Trained) -> None:
    _, result = observe(store, trained.output_dir)
    assert result.total == 7 and store.run(result.run_ids[0])["status"] == "finished"


def test_output_dir_without_top_level_file_uses_the_newest_checkpoint(
    store: Store, trained: Trained, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    for name in ("checkpoint-3", "checkpoint-6"):
        shutil.copytree(trained.output_dir / name, out / name)
    assert detect_kind(out) == "trainer_state"
    _, result = observe(store, out)
    assert result.total == 6 and len(series(store, result.run_ids[0], "loss")) == 6


def test_follow_as_checkpoints_appear_and_the_state_is_rewritten(
    store: Store, trained: Trained, tmp_path: Path
) -> None:
    out = tmp_path / "live"
    shutil.copytree(trained.output_dir / "checkpoint-3", out / "checkpoint-3")
    source_id, result = observe(store, out, follow=True)
    run_id = result.run_ids[0]
    assert sorted(series(store, run_id, "loss")) == [1, 2, 3]
    assert store.run(run_id)["status"] == "running"
    idle = ingest_source(store, source_id)  # unchanged file: one stat, no rows
    assert idle.caught_up and idle.rows == 0

    shutil.copytree(trained.output_dir / "checkpoint-6", out / "checkpoint-6")
    result = ingest_source(store, source_id)
    assert result.rows == 3 * 4  # steps 4-6: loss, grad_norm, learning_rate, epoch
    assert sorted(series(store, run_id, "loss")) == [1, 2, 3, 4, 5, 6]

    (out / "trainer_state.json").write_text('{\n  "best_global_step": nu')  # caught mid-write
    with pytest.raises(ObserveError, match="not valid JSON") as err:
        ingest_source(store, source_id)
    assert err.value.transient and store.source(source_id)["state"] == "following"

    shutil.copy(trained.output_dir / "trainer_state.json", out / "trainer_state.json")  # rewritten whole
    result = ingest_source(store, source_id)
    assert result.caught_up and result.rows == 5  # the summary entry's keys (its epoch is a duplicate)
    run = store.run(run_id)
    assert run["status"] == "finished" and run["ended_at"] is not None
    assert store.source(source_id)["last_error"] is None
    total = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert total == store.source(source_id)["rows"] == 6 * 4 + 5


def test_nulls_and_derived_phi(store: Store, trained: Trained, tmp_path: Path) -> None:
    state = trained.state()
    for i, entry in enumerate(state["log_history"][:6]):
        entry["entropy"] = 0.5 + i  # as TRL logs it: mean nats over completion tokens
    state["log_history"][1]["grad_norm"] = None
    state["log_history"].insert(2, {"eval_loss": 4.5, "step": "three"})
    folder = tmp_path / "checkpoint-6"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps(state))
    shutil.copy(trained.output_dir / "checkpoint-6" / "config.json", folder / "config.json")
    _, result = observe(store, folder / "trainer_state.json")
    assert result.problems == ["trainer_state.json:log_history[2]: no integer step"]
    run_id = result.run_ids[0]
    assert series(store, run_id, "grad_norm")[2] is None
    phi = series(store, run_id, "phi/mean")
    assert phi == {s: pytest.approx(1 - (s - 0.5) / math.log(64)) for s in range(1, 7)}
    assert series(store, run_id, "phi/entropy") == {s: s - 0.5 for s in range(1, 7)}
    assert store.run(run_id)["name"] == tmp_path.name  # a checkpoint's run is named after its output dir


# -- Trackio, written by the Trainer's TrackioCallback ------------------------------------------


def test_trackio_written_by_the_trainer(store: Store, trained: Trained) -> None:
    assert detect_kind(trained.trackio_db) == "trackio"
    _, result = observe(store, trained.trackio_db)
    assert len(result.run_ids) == 1
    run = store.run(result.run_ids[0])
    assert run["name"] == "tiny" and run["source_kind"] == "trackio" and len(run["external_id"]) == 32
    assert run["vocab_size"] == 64 and run["max_steps"] == 6 and run["status"] == "imported"
    history = trained.state()["log_history"]
    # `train/global_step` is the x axis (Trackio's own step column counts log calls).
    for key in ("loss", "grad_norm", "learning_rate", "epoch"):
        assert series(store, run["id"], key) == expected(history, key), key
    keys = {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics")}
    assert keys == {"loss", "grad_norm", "learning_rate", "epoch"}
