"""W&B Tables as rollouts, from runs the real wandb writes here (offline, in a subprocess): veRL's validation
table followed while it is written, and TRL's completions table, left out where the run's parquet dump is
attached (the dump holds every sample). The column maps are engine/observe/rollouts/columns.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import wait_for
from test_observe_wandb import run_dirs, run_file, wandb_env

from engine.observe import ingest_source, register_source
from engine.observe.discover import discover, register
from engine.observe.ingest import import_source
from engine.store import Store

pytestmark = pytest.mark.slow
PROMPTS = ["What is 2+2?", "Name a prime.", "Capital of France?"]

# veRL's ValidationGenerationsLogger._log_generations_to_wandb (verl/utils/tracking.py, veRL 0.9.1), as it
# logs: the whole table again each time, with one new row of samples side by side. Waits on stdin after
# `pause` steps.
VERL = """
import json, sys, wandb
steps, pause = json.loads(sys.argv[1]), int(sys.argv[2])
run = wandb.init(project="verl", name="verl-val", settings=wandb.Settings(console="off"))
samples = [(p, f"answer {n}", float(n % 2)) for n, p in enumerate(PROMPTS)]
logger = type("ValidationGenerationsLogger", (), {})()
for step in steps:
    if step == pause:  # first some blocks of other values: wandb writes its file a block at a time
        for filler in range(300):
            wandb.log({"note": "x" * 200}, step=pause - 300 + filler)
        print("paused", flush=True)
        sys.stdin.readline()
    wandb.log({"val-core/acc/mean@1": step / 10}, step=step)
    columns = ["step"] + sum([[f"input_{i + 1}", f"output_{i + 1}", f"score_{i + 1}"] for i in range(3)], [])
    if not hasattr(logger, "validation_table"):
        logger.validation_table = wandb.Table(columns=columns)
    new_table = wandb.Table(columns=columns, data=logger.validation_table.data)
    row_data = [step]
    for sample in samples:
        row_data.extend(sample)
    new_table.add_data(*row_data)
    wandb.log({"val/generations": new_table}, step=step)
    logger.validation_table = new_table
run.finish()
"""

# TRL's GRPOTrainer with log_completions and report_to wandb (trl/trainer/grpo_trainer.py, TRL 1.16): the same
# table as a parquet file in <output_dir>/completions/ and, through wandb, as the `completions` Table.
TRL = """
import os, sys, wandb
import pandas as pd
out = sys.argv[1]
run = wandb.init(project="trl", name="trl-grpo", dir=out, settings=wandb.Settings(console="off"))
os.makedirs(os.path.join(out, "completions"), exist_ok=True)
for step in (1, 2):
    table = {"step": [step] * 4, "prompt": ["2+2?"] * 2 + ["3+3?"] * 2, "completion": ["4", "5", "6", "7"],
             "brevity": [1.0, 0.5, 1.0, 0.25], "solution": ["4", "4", "6", "6"], "advantage": [0.5, -0.5, 0.7,
             -0.7]}
    pd.DataFrame(table).to_parquet(os.path.join(out, "completions", f"completions_{step:05d}.parquet"))
    wandb.log({"train/reward": step / 2, "train/global_step": step})
    wandb.log({"completions": wandb.Table(dataframe=pd.DataFrame(table))})
run.finish()
"""


def start(code: str, folder: Path, *args: str) -> subprocess.Popen[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", f"PROMPTS = {PROMPTS!r}\n{code}", *args],
        env=wandb_env(folder),
        cwd=folder,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def samples(store: Store) -> list[tuple[Any, ...]]:
    return store.conn.execute(
        "SELECT step, prompt, completion, rewards, extra FROM rollouts ORDER BY step, idx"
    ).fetchall()


def verl_rows(steps: list[int]) -> list[tuple[Any, ...]]:
    return [
        (step, prompt, f"answer {n}", json.dumps({"score": float(n % 2)}), '{"table": "val/generations"}')
        for step in steps
        for n, prompt in enumerate(PROMPTS)
    ]


def test_verls_validation_table_is_followed_as_it_is_written(store: Store, tmp_path: Path) -> None:
    writer = start(VERL, tmp_path, json.dumps([5, 10, 400, 410]), "400")
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "paused\n"
        [run_dir] = run_dirs(tmp_path)
        source_id = register_source(store, run_dir, follow=True)
        wait_for(lambda: run_file(run_dir).stat().st_size > 64 * 1024, what="the writer's first blocks")
        result = ingest_source(store, source_id, max_rows=100_000, max_seconds=30)
        assert result.bad_lines == 0, result.problems
        assert samples(store) == verl_rows([5, 10])
        writer.communicate("go on\n", timeout=120)
        assert writer.returncode == 0
    finally:
        writer.kill()
    while not (result := ingest_source(store, source_id, max_rows=100_000, max_seconds=30)).caught_up:
        pass
    assert result.bad_lines == 0, result.problems
    # each sample once: a table logged again with its earlier rows adds only its new row
    assert samples(store) == verl_rows([5, 10, 400, 410])
    run = store.run(store.conn.execute("SELECT id FROM runs").fetchone()[0])
    assert run["status"] == "finished"


def test_trls_table_is_left_out_where_its_parquet_dump_is_attached(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "grpo-out"
    writer = start(TRL, tmp_path, str(out))
    writer.communicate(timeout=120)
    assert writer.returncode == 0
    [run] = discover(out).runs
    assert run.metrics.kind == "wandb" and [f.kind for f in run.rollouts] == ["rollouts-trl"]
    [registered] = register(store, discover(out), follow=False)
    for source_id, _ in registered.sources:
        assert import_source(store, source_id).bad_lines == 0
    rows = samples(store)
    assert len(rows) == 8 and all('"table"' not in (extra or "") for *_, extra in rows)  # the dump's, once

    # The W&B run alone (no dump attached): its table's samples, with the reward columns TRL names per
    # function.
    with Store(tmp_path / "alone.db") as alone:
        [run_dir] = (out / "wandb").glob("offline-run-*")
        source_id = register_source(alone, run_dir, follow=False)
        assert import_source(alone, source_id).bad_lines == 0
        rows = samples(alone)
        assert [(r[0], r[2], json.loads(r[3])) for r in rows] == [
            (step, completion, {"brevity": brevity})
            for step in (1, 2)
            for completion, brevity in zip("4567", (1.0, 0.5, 1.0, 0.25), strict=True)
        ]
        assert json.loads(rows[0][4]) == {"solution": "4", "table": "completions"}
