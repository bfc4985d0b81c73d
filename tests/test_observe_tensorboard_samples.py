"""TensorBoard texts that hold samples as rollouts, and TensorBoard histograms, from event files written by
the real writers: torch's SummaryWriter (`add_text` as OpenRLHF 0.11 calls it, `add_histogram`) and
tensorboard's own summary protos (a table of text, the histograms plugin's tensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.observe import IngestResult, ingest_source, observe, register_source
from engine.observe import tensorboard as tb
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def summary_writer(logdir: Path):  # noqa: ANN201 (torch's SummaryWriter, imported late: torch loads slowly)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(logdir), max_queue=1000)


def openrlhf_text(text: str, reward: float) -> str:
    """What OpenRLHF's TensorboardLogger.log_train writes for `generated_samples` (openrlhf/utils/
    logging_utils.py, OpenRLHF 0.11.0), its separators a backslash and an `n`."""
    return f"Sample:\\n{text}\\n\\nReward: {reward:.4f}"


def rollouts(store: Store, run_id: int) -> list[dict[str, Any]]:
    reader = StoreReader(store.path)
    try:
        return reader.rollouts(run_id, limit=10_000)
    finally:
        reader.close()


def ingest(store: Store, source_id: int) -> IngestResult:
    return ingest_source(store, source_id, max_rows=1_000_000, max_seconds=60)


def test_openrlhf_samples_and_tables_become_rollouts_and_other_texts_do_not(
    store: Store, tmp_path: Path
) -> None:
    from tensorboard.plugins.text import summary_v2

    writer = summary_writer(tmp_path / "tb" / "ppo")
    writer.add_text("args", '{"max_steps": 3}', 0)
    writer.add_text("notes", "a note, not a sample", 0)
    for step in range(1, 4):
        writer.add_scalar("train/reward", step / 4, step)
        sample = f"<|user|>\n{step} + {step} = ?\n<|assistant|>\n{2 * step}"
        writer.add_text("train/generated_samples", openrlhf_text(sample, step / 4), step)
    writer.add_text(
        "eval/samples_table",
        "| prompt | completion | reward | gts |\n|---|---|---|---|\n"
        "| 2+2 | 4 | 1.0 | 4 |\n| 3+3 \\| ? | 7 | 0 | 6 |",
        3,
    )
    table = np.array([["Prompt", "Response", "Score"], ["q1", "r1", "0.5"], ["q2", "r2", "x"]])
    writer._get_file_writer().add_summary(summary_v2.text_pb("eval/generations", table), 4)
    writer.close()
    _, result = observe(store, tmp_path / "tb")
    [run_id] = result.run_ids
    rows = rollouts(store, run_id)
    found = [(r["step"], r["idx"], r["prompt"], r["completion"], r["total"]) for r in rows]
    assert found == [
        (1, 0, None, "<|user|>\n1 + 1 = ?\n<|assistant|>\n2", 0.25),
        (2, 0, None, "<|user|>\n2 + 2 = ?\n<|assistant|>\n4", 0.5),
        (3, 0, None, "<|user|>\n3 + 3 = ?\n<|assistant|>\n6", 0.75),
        (3, 1, "2+2", "4", 1.0),
        (3, 2, "3+3 | ?", "7", 0.0),
        (4, 0, "q1", "r1", 0.5),
        (4, 1, "q2", "r2", None),
    ]
    assert rows[0]["extra"] == {"tag": "train/generated_samples"}
    assert rows[3]["extra"] == {"tag": "eval/samples_table", "gts": 4.0}
    assert rows[6]["extra"] == {"tag": "eval/generations"}
    assert result.bad_lines == 0
    [entry] = store.source(store.conn.execute("SELECT max(id) FROM sources").fetchone()[0])["cursor"][
        "files"
    ].values()
    assert entry["skipped"] == 2, "the args and the note are skipped, as before"


def test_histograms_of_both_kinds_are_stored(store: Store, tmp_path: Path) -> None:
    from tensorboard.plugins.histogram import summary_v2

    rng = np.random.default_rng(0)
    writer = summary_writer(tmp_path / "tb" / "run")
    values = {step: rng.normal(step, 1.0, 1000) for step in range(4)}
    for step, data in values.items():
        writer.add_histogram("actor/logprobs", data, step)
        writer._get_file_writer().add_summary(summary_v2.histogram_pb("train/ratio", data, buckets=9), step)
    writer.close()
    _, result = observe(store, tmp_path / "tb")
    [run_id] = result.run_ids
    reader = StoreReader(store.path)
    try:
        assert reader.histograms.keys(run_id) == ["actor/logprobs", "ratio"]  # `train/` goes, as for scalars
        logprobs = reader.histograms.series(run_id, "actor/logprobs")
        ratio = reader.histograms.series(run_id, "ratio")
    finally:
        reader.close()
    assert logprobs.steps == ratio.steps == [0, 1, 2, 3]
    for step, histogram in zip(logprobs.steps, logprobs.histograms, strict=True):
        assert histogram.total == 1000
        assert histogram.low == pytest.approx(values[step].min()) and histogram.high == pytest.approx(
            values[step].max()
        )
    assert all(len(h.counts) == 9 and h.total == 1000 for h in ratio.histograms)


def test_a_text_over_the_limit_is_one_line(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tb, "MAX_TEXT_RECORD", 2000)
    writer = summary_writer(tmp_path / "tb" / "run")
    writer.add_text("train/generated_samples", openrlhf_text("x" * 3000, 1.0), 1)
    writer.add_text("train/generated_samples", openrlhf_text("short", 0.5), 2)
    writer.close()
    _, result = observe(store, tmp_path / "tb")
    [problem] = result.problems
    assert problem.startswith("run/events.out.tfevents.") and problem.endswith(
        ": record 2: text 'train/generated_samples' at step 1 is 3,027 bytes, over the limit of 2,000;"
        " skipped"
    )
    [run_id] = result.run_ids
    assert [(r["step"], r["completion"]) for r in rollouts(store, run_id)] == [(2, "short")]


def test_samples_followed_as_they_are_written(store: Store, tmp_path: Path) -> None:
    logdir = tmp_path / "tb" / "run"
    writer = summary_writer(logdir)
    source_id = None
    for step in range(6):
        writer.add_text("train/generated_samples", openrlhf_text(f"sample {step}", step / 6), step)
        writer.add_histogram("w", np.arange(10.0) + step, step)
        writer.flush()
        if source_id is None:
            source_id = register_source(store, tmp_path / "tb", follow=True)
        ingest(store, source_id)
    writer.close()
    ingest(store, source_id)
    [run_id] = [r[0] for r in store.conn.execute("SELECT id FROM runs WHERE source_id=?", (source_id,))]
    assert [(r["step"], r["idx"], r["completion"]) for r in rollouts(store, run_id)] == [
        (step, 0, f"sample {step}") for step in range(6)
    ]
    count = store.conn.execute("SELECT count(*) FROM histograms WHERE run_id=?", (run_id,)).fetchone()[0]
    assert count == 6
