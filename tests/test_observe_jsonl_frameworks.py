"""veRL's file logger and prime-rl's metrics.jsonl, written as their own code writes them, and nested objects.

The writers below are copied from the frameworks' source (neither is installed here):
- veRL: `FileLogger.log` in verl/utils/tracking.py (volcengine/verl b178a3cd): orjson of {"step", "data"}.
- prime-rl: `FileMonitor.log_metrics` in src/prime_rl/monitors/file.py (PrimeIntellect-ai/prime-rl 559b4477):
  json of {"step", "time", **metrics}, line-buffered appends from the trainer and the orchestrator alike.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import series
from test_observe_frameworks import PRIME_RL, VERL

from engine.observe import ingest_source, observe, register_source
from engine.store import Store, StoreReader


class VerlFileLogger:
    """verl/utils/tracking.py FileLogger, with the path given (veRL: VERL_FILE_LOGGER_PATH)."""

    def __init__(self, filepath: Path) -> None:
        self.fp = open(filepath, "wb", buffering=0)  # noqa: SIM115 (as veRL keeps it open)

    def log(self, data: dict[str, Any], step: int) -> None:
        data = {"step": step, "data": data}
        self.fp.write(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def finish(self) -> None:
        self.fp.close()


def prime_rl_log_metrics(file: Any, metrics: dict[str, Any], step: int) -> None:
    """src/prime_rl/monitors/file.py FileMonitor.log_metrics (after its sanitize of non-finite values)."""
    row = {"step": step, "time": time.time(), **metrics}
    file.write(json.dumps(row) + "\n")


def verl_step(step: int) -> dict[str, float]:
    return {key: 0.25 + i / 1000 + step / 10 for i, key in enumerate(VERL)}


def test_verl_file_logger(store: Store, tmp_path: Path) -> None:
    from engine.observe.runkeys import set_vocab_override

    path = tmp_path / "my_project" / "my_experiment.jsonl"  # {project}/{experiment}.jsonl
    path.parent.mkdir()
    logger = VerlFileLogger(path)
    for step in range(1, 4):
        logger.log(verl_step(step), step)
    source_id = register_source(store, path, follow=True)
    set_vocab_override(store, source_id, 151_936)  # as `carl observe --vocab-size` does
    result = ingest_source(store, source_id)
    assert result.bad_lines == 0 and result.caught_up
    run_id = result.run_ids[0]
    run = store.run(run_id)
    assert (run["name"], run["framework"], run["vocab_size"]) == ("my_experiment", "verl", 151_936)
    entropy = {s: verl_step(s)["actor/entropy"] for s in (1, 2, 3)}
    assert series(store, run_id, "entropy") == pytest.approx(entropy)
    assert series(store, run_id, "phi/mean") == pytest.approx(
        {s: 1 - h / math.log(151_936) for s, h in entropy.items()}
    )
    assert series(store, run_id, "reward") == pytest.approx(
        {s: verl_step(s)["critic/score/mean"] for s in (1, 2, 3)}
    )
    assert series(store, run_id, "actor/pg_clipfrac_lower")  # no concept of ours: kept as it is
    assert series(store, run_id, "perf/time/generation_s")  # timing_s/gen, under carl's name

    # Followed: the logger keeps writing.
    logger.log(verl_step(4), 4)
    result = ingest_source(store, source_id)
    assert result.rows > 0 and store.run(run_id)["last_step"] == 4
    assert series(store, run_id, "clip_ratio/region_mean")[4] == pytest.approx(
        verl_step(4)["actor/pg_clipfrac"]
    )
    logger.finish()
    reader = StoreReader(store.path)
    try:
        assert reader.key_names(run_id)["clip_ratio/region_mean"] == "actor/pg_clipfrac"
    finally:
        reader.close()


def test_a_verl_line_whose_data_is_not_an_object(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "exp.jsonl"
    logger = VerlFileLogger(path)
    logger.log(verl_step(1), 1)
    logger.fp.write(orjson.dumps({"step": 2, "data": [1.0, 2.0]}) + b"\n")
    logger.fp.write(orjson.dumps({"step": 3, "data": "oops"}) + b"\n")
    logger.log(verl_step(4), 4)
    logger.finish()
    _, result = observe(store, path)
    assert result.bad_lines == 2
    assert result.problems[0].startswith("exp.jsonl:2: 'data' is not an object")
    assert result.problems[1].startswith("exp.jsonl:3: 'data' is not an object")
    run_id = result.run_ids[0]
    assert set(series(store, run_id, "entropy")) == {1, 4}  # nothing else lost


def test_prime_rl_metrics_jsonl(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "outputs" / "metrics.jsonl"
    path.parent.mkdir()
    trainer = [k for k in PRIME_RL if not k.startswith(("train/", "time/wait_for_policy"))]
    orchestrator = [k for k in PRIME_RL if k not in trainer]
    with open(path, "a", buffering=1) as file:  # FileMonitor.init: line-buffered append
        for step in range(3):
            prime_rl_log_metrics(file, {k: 1.0 + i / 100 + step for i, k in enumerate(trainer)}, step)
            prime_rl_log_metrics(file, {k: 0.5 + i / 100 + step for i, k in enumerate(orchestrator)}, step)
    started = time.time()
    _, result = observe(store, path)
    assert result.bad_lines == 0
    run_id = result.run_ids[0]
    run = store.run(run_id)
    assert run["framework"] == "prime-rl" and run["name"] == "metrics"
    entropy_index = trainer.index("entropy/all/mean")
    assert series(store, run_id, "entropy") == pytest.approx(
        {s: 1.0 + entropy_index / 100 + s for s in range(3)}
    )
    reward_index = orchestrator.index("train/agg/effective/default/reward/mean")
    assert series(store, run_id, "reward") == pytest.approx(
        {s: 0.5 + reward_index / 100 + s for s in range(3)}
    )
    assert series(store, run_id, "agg/all/has_error/mean")  # train/ is stripped, as for every tracker
    walls = {
        w for (w,) in store.conn.execute("SELECT DISTINCT wall_time FROM metrics WHERE run_id=?", (run_id,))
    }
    assert all(w <= started for w in walls)  # the line's own `time`
    reader = StoreReader(store.path)
    try:
        names = reader.key_names(run_id)
    finally:
        reader.close()
    assert names["reward"] == "train/agg/effective/default/reward/mean"
    assert names["entropy"] == "entropy/all/mean"


def test_nested_objects_are_flattened_within_bounds(store: Store, tmp_path: Path) -> None:
    from engine.observe.jsonl import MAX_DEPTH, MAX_NESTED

    deep: dict[str, Any] = {"leaf": 1.0}
    for _ in range(MAX_DEPTH):
        deep = {"d": deep}
    path = tmp_path / "nested.jsonl"
    path.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in (
                {"step": 1, "loss": 1.0, "eval": {"acc": 0.5, "per_task": {"a": 0.25, "b": "text"}}, "x": {}},
                {"step": 2, "data": {"score/mean": 1.5, "optimizer": {"grad": 2.0}}},
                {"step": 3, "loss": 0.5, "deep": deep},
                {"step": 4, "loss": 0.25, "wide": {f"k{i}": i for i in range(MAX_NESTED + 1)}},
                {"step": 5, "loss": 0.125, "ok": {"d": {"d": {"leaf": 3.0}}}},
            )
        )
    )
    _, result = observe(store, path)
    run_id = result.run_ids[0]
    assert result.bad_lines == 2
    assert result.problems == [
        f"nested.jsonl:3: objects nested deeper than {MAX_DEPTH} levels",
        f"nested.jsonl:4: more than {MAX_NESTED:,} values in nested objects",
    ]
    assert series(store, run_id, "eval/acc") == {1: 0.5}
    assert series(store, run_id, "eval/per_task/a") == {1: 0.25}
    assert series(store, run_id, "score/mean") == {2: 1.5}  # veRL's data: no "data/" prefix
    assert series(store, run_id, "optimizer/grad") == {2: 2.0}
    assert series(store, run_id, "loss") == {1: 1.0, 5: 0.125}  # a line past a bound is skipped whole
    assert series(store, run_id, "ok/d/d/leaf") == {5: 3.0}
