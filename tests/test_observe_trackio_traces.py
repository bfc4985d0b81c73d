"""Trackio traces as rollouts, and Trackio histograms, from projects written by the real `trackio` (0.43) and
by TRL's own async GRPO trace logger (engine/observe/trackio_traces.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from support import until

from engine.observe import ingest_source, observe, register_source
from engine.observe import trackio_traces as traces_module
from engine.store import Store, StoreReader

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


def db_path(project: str) -> Path:
    from trackio.sqlite_storage import SQLiteStorage

    return Path(SQLiteStorage.get_project_db_path(project))


def start(trackio: ModuleType, project: str, name: str) -> None:
    trackio.init(project=project, name=name, auto_log_cpu=False, auto_log_gpu=False)


def conversation(step: int, i: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": f"{step} + {i} = ?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "content": str(step + i)},
        {"role": "assistant", "content": f"{step + i}"},
    ]


def rollouts(store: Store, run_id: int) -> list[dict[str, Any]]:
    reader = StoreReader(store.path)
    try:
        return reader.rollouts(run_id, limit=10_000)
    finally:
        reader.close()


@pytest.fixture(scope="module")
def grpo_project(trackio: ModuleType) -> Path:
    """A run logging metrics, a histogram and traces as TRL's async GRPO does: the traces of a policy version
    under that version's step, with the sample's metrics in their metadata."""
    project = f"traces-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "grpo")
    rng = np.random.default_rng(0)
    for step in range(3):
        traces = [
            trackio.Trace(
                messages=conversation(step, i),
                metadata={
                    "reward": float(i % 2),
                    "reward_std": 0.5,
                    "rewards/accuracy": float(i % 2),
                    "rewards/format": 1.0,
                    "advantage": (-1.0) ** i,
                    "group_id": i // 2,
                    "model_version": step,
                    "prompt_tokens": 12,
                    "completion_tokens": 3 + i,
                },
            )
            for i in range(4)
        ]
        trackio.log(
            {
                "train/loss": 1.0 / (step + 1),
                "logprobs": trackio.Histogram(rng.normal(-step, 1.0, 300), num_bins=12),
                "rollouts": traces,
            },
            step=step,
        )
    trackio.finish()
    return db_path(project)


def test_traces_become_rollouts_of_their_run(store: Store, grpo_project: Path) -> None:
    _, result = observe(store, grpo_project)
    [run_id] = result.run_ids
    rows = rollouts(store, run_id)
    assert [(r["step"], r["idx"]) for r in rows] == [(s, i) for s in range(3) for i in range(4)]
    first = rows[1]
    assert first["prompt"] == "system: Answer with a number.\nuser: 0 + 1 = ?"
    assert first["completion"] == "assistant:  [call add({})]\ntool: 1\nassistant: 1"
    assert first["rewards"] == {"accuracy": 1.0, "format": 1.0} and first["total"] == 1.0
    assert first["advantage"] == -1.0 and first["group_id"] == "0" and first["length"] == 4
    assert first["extra"] == {
        "key": "rollouts",
        "trace_index": 1,
        "reward_std": 0.5,
        "prompt_tokens": 12,
        "policy_version": 0,
    }
    assert {r["extra"]["policy_version"] for r in rows if r["step"] == 2} == {2}
    assert result.bad_lines == 0


def test_histograms_are_kept_as_trackio_wrote_them(store: Store, grpo_project: Path) -> None:
    _, result = observe(store, grpo_project)
    [run_id] = result.run_ids
    conn = sqlite3.connect(f"file:{grpo_project}?mode=ro", uri=True)
    try:
        logged = [
            json.loads(m)["logprobs"] for (m,) in conn.execute("SELECT metrics FROM metrics ORDER BY id")
        ]
    finally:
        conn.close()
    reader = StoreReader(store.path)
    try:
        assert reader.histograms.keys(run_id) == ["logprobs"]
        series = reader.histograms.series(run_id, "logprobs")
    finally:
        reader.close()
    assert series.steps == [0, 1, 2]
    for histogram, value in zip(series.histograms, logged, strict=True):
        assert list(histogram.edges) == value["bins"] and list(histogram.counts) == value["values"]


def test_verl_traces_take_their_step_group_and_score(store: Store, trackio: ModuleType) -> None:
    """The metadata veRL puts on its traces (verl/utils/tracking.py `log_generations_to_trackio`, and
    verl/utils/rollout_trace.py `_log_trackio_trace`, at verl 1dda039b9), written by trackio."""
    project = f"verl-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "verl")
    generations = [
        trackio.Trace(
            messages=[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}],
            metadata={"source": "validation_generations", "sample_index": i, "score": i / 2},
        )
        for i in range(3)
    ]
    trackio.log({"val/generations": generations}, step=10)
    op = trackio.Trace(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        metadata={
            "op": "generate",
            "backend": "trackio",
            "step": 12,
            "sample_index": 5,
            "rollout_n": 1,
            "validate": False,
            "status": "success",
        },
    )
    trackio.log({"rollout_trace/generate": op}, step=None)
    trackio.finish()
    _, result = observe(store, db_path(project))
    [run_id] = result.run_ids
    rows = rollouts(store, run_id)
    assert [(r["step"], r["group_id"], r["total"], r["completion"]) for r in rows] == [
        (10, "0", 0.0, "a0"),
        (10, "1", 0.5, "a1"),
        (10, "2", 1.0, "a2"),
        (12, "5", None, "a"),
    ]
    assert rows[3]["extra"]["key"] == "rollout_trace/generate" and rows[3]["extra"]["rollout_n"] == 1


def test_trl_async_grpo_logs_traces_that_become_rollouts(store: Store, trackio: ModuleType) -> None:
    """TRL 1.16's own `log_rollout_traces` (trl/experimental/async_grpo/async_grpo_trainer.py), given the
    samples its rollout worker makes. The trainer itself needs a vLLM server, so it is not run here."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutSample, log_rollout_traces

    project = f"trl-{uuid.uuid4().hex[:8]}"
    start(trackio, project, "async-grpo")
    for version in (3, 4):
        samples = [
            RolloutSample(
                prompt=[{"role": "user", "content": f"v{version} question {i // 2}"}],
                completion=[{"role": "assistant", "content": f"answer {i}"}],
                input_ids=np.arange(10, dtype=np.int64),
                completion_mask=np.array([0] * 6 + [1] * 4, dtype=np.int64),
                old_log_probs=np.zeros(10, dtype=np.float32),
                advantage=0.5 - i % 2,
                model_version=version,
                group_id=100 * version + i // 2,
                metrics={"reward": float(i % 2 == 0), "reward_std": 0.5, "rewards/accuracy_reward": 1.0},
            )
            for i in range(4)
        ]
        log_rollout_traces(samples, step=version, report_to=["trackio"])
    trackio.finish()
    _, result = observe(store, db_path(project))
    [run_id] = result.run_ids
    rows = rollouts(store, run_id)
    assert [(r["step"], r["idx"], r["group_id"]) for r in rows] == [
        (v, i, str(100 * v + i // 2)) for v in (3, 4) for i in range(4)
    ]
    assert rows[0]["prompt"] == "user: v3 question 0" and rows[0]["completion"] == "answer 0"
    assert rows[0]["total"] == 1.0 and rows[0]["rewards"] == {"accuracy_reward": 1.0}
    assert rows[1]["advantage"] == -0.5 and rows[1]["length"] == 4
    assert rows[5]["extra"]["policy_version"] == 4 and rows[5]["extra"]["prompt_tokens"] == 6


def test_followed_while_written_in_bounded_batches_across_restarts(
    tmp_path: Path, trackio: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Traces logged while the engine follows, read a few pages at a time by a store opened anew each batch
    (an engine that restarts): every trace once, in its place, each batch bounded."""
    monkeypatch.setattr(traces_module, "PAGE", 7)
    project = f"follow-{uuid.uuid4().hex[:8]}"
    db = tmp_path / "carl.db"
    source_id = None
    for step in range(5):
        trackio.init(project=project, name="live", resume="allow", auto_log_cpu=False, auto_log_gpu=False)
        trackio.log({"rollouts": [trackio.Trace(conversation(step, i)) for i in range(9)]}, step=step)
        trackio.finish()
        with Store(db) as store:
            if source_id is None:
                source_id = register_source(store, db_path(project), follow=True)
        for _ in range(20):
            with Store(db) as store:
                result = ingest_source(store, source_id, max_rows=100, max_seconds=5.0)  # 10 traces' worth
            assert result.rows <= 14, "a batch stays bounded (pages of 7)"
            if result.caught_up:
                break
    with Store(db) as store:
        [run_id] = [r[0] for r in store.conn.execute("SELECT id FROM runs WHERE source_id=?", (source_id,))]
        places = store.conn.execute(
            "SELECT step, idx FROM rollouts WHERE run_id=? ORDER BY step, idx", (run_id,)
        )
        assert places.fetchall() == [(s, i) for s in range(5) for i in range(9)]


def test_a_bad_or_oversized_trace_is_one_line_and_the_rest_is_read(
    store: Store, grpo_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "damaged.db"
    shutil.copy(grpo_project, path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE traces SET messages = 'not json' WHERE rowid = 2")
    conn.execute("UPDATE traces SET metadata = '[1, 2]' WHERE rowid = 3")
    conn.execute("UPDATE traces SET step = 'x' WHERE rowid = 4")
    conn.execute("UPDATE traces SET messages = ? WHERE rowid = 5", (json.dumps([{"content": "x" * 5000}]),))
    conn.commit()
    conn.close()
    monkeypatch.setattr(traces_module, "MAX_TRACE_CHARS", 4000)
    _, result = observe(store, path)
    assert result.problems[0].startswith("traces row 5: 5,") and result.problems[0].endswith(
        " characters, over the limit of 4,000; skipped, unread"
    )
    assert result.problems[1:] == [
        "traces row 2: messages are not a list of chat messages; skipped",
        "traces row 3: metadata is not an object; skipped",
        "traces row 4: step 'x' is not an integer; skipped",
    ]
    [run_id] = result.run_ids
    steps = [r["step"] for r in rollouts(store, run_id)]
    assert len(steps) == 12 - 4 and steps.count(0) == 1


async def test_the_traces_in_the_rollouts_viewer(tmp_path: Path, grpo_project: Path) -> None:
    """The run's traces listed by the viewer (`R`) at 80×24, a GRPO group side by side, and a sample with the
    policy version that sampled it."""
    from rich.console import Console
    from test_app_rollouts import open_viewer, rows
    from textual.widgets import Static

    from carl_tui.app import ControlRoom
    from carl_tui.rollouts_detail import RolloutGroupScreen, RolloutSampleScreen

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        _, result = observe(store, grpo_project)
    [run_id] = result.run_ids
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_viewer(pilot, run_id)
        listed = rows(app)
        assert [(r.step, r.idx, r.group_id) for r in listed] == [(2, i, str(i // 2)) for i in range(4)]
        assert listed[0].prompt.startswith("system: Answer with a number.") and listed[1].total == 1.0
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, RolloutGroupScreen))
        assert [s["advantage"] for s in app.screen.samples] == [1.0, -1.0]
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
        console = Console(file=io.StringIO(), width=120)
        console.print(app.screen.query_one("#sample-summary", Static).content)
        assert "step 2 · group 0 · #0 · policy v2" in console.file.getvalue()
