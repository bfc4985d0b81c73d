"""The seeds of the binary families, written by the real writers and kept in tests/hostile/seeds/.

torch's SummaryWriter (TensorBoard), wandb 0.29 offline (W&B), Trackio (its own SQLite), MlflowClient (an
`mlflow.db` and an `mlruns/` directory) and pandas' `to_parquet` as TRL's `log_completions` calls it; and the
rollouts and histograms trackers write: Trackio 0.43's traces and histograms, TensorBoard texts of samples (as
OpenRLHF 0.11 writes them, and tables) and histograms of both kinds (`write_trace_seeds`). Each
writer runs in its own process (torch, mlflow and wandb take seconds to import, and wandb and Trackio keep
their folders in the environment). The files are small (the SQLite ones gzipped) and kept in the repository,
so CI starts from them at no cost; write them again with `python bench/hostile.py --write-seeds` (a newer
writer's files are then what the suite mutates).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

SEEDS = Path(__file__).resolve().parent / "seeds"
ROOT = SEEDS.parent.parent.parent

CONFIG = {"vocab_size": 512, "model_type": "llama", "model_name_or_path": "tiny", "max_steps": 8}

TENSORBOARD = """
import json, sys
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(sys.argv[1])
writer.add_text("model_config", json.dumps(CONFIG))
writer.add_text("args", json.dumps({"max_steps": 8, "learning_rate": 1e-5}))
for step in range(8):
    writer.add_scalar("train/loss", 1 / (step + 1), step)
    writer.add_scalar("train/reward", step / 8, step)
    writer.add_scalar("train/entropy", 2.0 - step / 8, step)
writer.add_histogram("weights", __import__("numpy").array([0.1, 0.2, 0.3]), 1)
writer.close()
"""

WANDB = """
import sys, wandb
run = wandb.init(project="hostile", name="seed-run", config=CONFIG, settings=wandb.Settings(console="off"))
for step in range(8):
    wandb.log({"train/loss": 1 / (step + 1), "train/reward": step / 8, "train/global_step": step}, step=step)
run.summary["best"] = 0.9
run.finish()
"""

TRACKIO = """
import sys, trackio
trackio.init(project="hostile", name="seed-run", config=CONFIG, auto_log_cpu=False, auto_log_gpu=False)
for step in range(8):
    trackio.log({"train/loss": 1 / (step + 1), "train/reward": step / 8}, step=step)
trackio.finish()
"""

TRACKIO_TRACES = """
import sys, numpy as np, trackio
trackio.init(project="hostile-traces", name="seed-run", config=CONFIG, auto_log_cpu=False, auto_log_gpu=False)
for step in range(4):
    traces = [
        trackio.Trace(
            [{"role": "user", "content": f"{step} + {i} = ?"}, {"role": "assistant", "content": "4"}],
            metadata={"reward": float(i % 2), "rewards/accuracy": float(i % 2), "advantage": 0.5 - i % 2,
                      "group_id": i // 2, "model_version": step, "completion_tokens": 2},
        )
        for i in range(4)
    ]
    histogram = trackio.Histogram(np.arange(40.0) - step, num_bins=8)
    trackio.log({"train/loss": 1 / (step + 1), "logprobs": histogram, "rollouts": traces}, step=step)
trackio.finish()
"""

TENSORBOARD_SAMPLES = r"""
import sys, numpy as np
from torch.utils.tensorboard import SummaryWriter
from tensorboard.plugins.histogram import summary_v2 as histogram
from tensorboard.plugins.text import summary_v2 as text
writer = SummaryWriter(sys.argv[1])
log = writer._get_file_writer()
for step in range(4):
    writer.add_scalar("train/reward", step / 4, step)
    sample = f"{step} + {step} = {2 * step}"
    writer.add_text("train/generated_samples", f"Sample:\\n{sample}\\n\\nReward: {step / 4:.4f}", step)
    writer.add_histogram("actor/logprobs", np.arange(50.0) - step, step)
    log.add_summary(histogram.histogram_pb("train/ratio", np.arange(10.0), buckets=4), step)
writer.add_text("eval/table", "| prompt | completion | reward |\n|---|---|---|\n| 2+2 | 4 | 1 |", 3)
table = np.array([["prompt", "response", "score"], ["q", "r", "0.5"]])
log.add_summary(text.text_pb("eval/generations", table), 3)
writer.close()
"""

MLFLOW = """
import sys
from mlflow.tracking import MlflowClient
for uri in sys.argv[1:]:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("hostile")
    run = client.create_run(experiment, run_name="seed-run")
    for key, value in CONFIG.items():
        client.log_param(run.info.run_id, key, value)
    for step in range(8):
        client.log_metric(run.info.run_id, "train/loss", 1 / (step + 1), step=step)
        client.log_metric(run.info.run_id, "train/reward", step / 8, step=step)
    client.set_terminated(run.info.run_id)
"""

PARQUET = """
import os, sys
import pandas as pd
out = sys.argv[1]
os.makedirs(os.path.join(out, "completions"), exist_ok=True)
for step in (1, 2):
    table = {
        "step": [step] * 4,
        "prompt": [f"question {step}.{i // 2}" for i in range(4)],
        "completion": [f"answer {step}.{i}" for i in range(4)],
        "accuracy_reward": [float(i % 2) for i in range(4)],
        "format_reward": [0.5] * 4,
        "solution": ["4"] * 4,
        "advantage": [(-1.0) ** i for i in range(4)],
    }
    pd.DataFrame(table).to_parquet(os.path.join(out, "completions", f"completions_{step:05d}.parquet"))
"""


def run_writer(code: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    program = f"CONFIG = {CONFIG!r}\n{code}"
    subprocess.run(
        [sys.executable, "-c", program, *args],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        cwd=cwd or ROOT,
        timeout=300,
    )


def write_seeds(folder: Path = SEEDS) -> None:
    """Every binary seed, written again by its real writer."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_writer(TENSORBOARD, str(folder / "tensorboard"))

        wandb_dir = work / "wandb-dir"
        wandb_dir.mkdir()
        settings = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(wandb_dir)}
        settings |= {f"WANDB_{k}_DIR": str(wandb_dir / f".{k.lower()}") for k in ("CONFIG", "CACHE", "DATA")}
        run_writer(WANDB, env=settings, cwd=wandb_dir)
        [run_file] = (wandb_dir / "wandb").glob("offline-run-*/run-*.wandb")
        (folder / "wandb" / run_file.parent.name).mkdir(parents=True)
        shutil.copy(run_file, folder / "wandb" / run_file.parent.name / run_file.name)

        run_writer(TRACKIO, env={"TRACKIO_DIR": str(work / "trackio")})
        pack(work / "trackio" / "hostile.db", folder / "trackio.db.gz")

        mlruns = folder / "mlflow" / "mlruns"
        mlflow_db = work / "mlflow.db"
        run_writer(MLFLOW, f"sqlite:///{mlflow_db}", mlruns.as_uri(), env={"MLFLOW_ALLOW_FILE_STORE": "true"})
        pack(mlflow_db, folder / "mlflow" / "mlflow.db.gz")
        run_writer(PARQUET, str(folder / "trl"))
    write_trace_seeds(folder)
    (folder / "README.md").write_text(
        "Seeds of the hostile-input suite, written by the real writers (tests/hostile/seeds.py);\n"
        "write them again with `python bench/hostile.py --write-seeds`.\n"
    )


def write_trace_seeds(folder: Path = SEEDS) -> None:
    """The seeds of the trackers' rollouts and histograms (Trackio traces, TensorBoard samples), alone."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_writer(TRACKIO_TRACES, env={"TRACKIO_DIR": str(work / "trackio")})
        pack(work / "trackio" / "hostile-traces.db", folder / "trackio-traces.db.gz")
        shutil.rmtree(folder / "tensorboard-samples", ignore_errors=True)
        run_writer(TENSORBOARD_SAMPLES, str(folder / "tensorboard-samples"))


def pack(db: Path, to: Path) -> None:
    """An SQLite file, vacuumed and gzipped: its pages are mostly empty (MLflow's is 1 MB, 18 KB packed)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("VACUUM")
    finally:
        conn.close()
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes(gzip.compress(db.read_bytes(), mtime=0))


def seed_bytes(relative: str) -> bytes:
    """A seed's bytes (a packed one unpacked)."""
    path = SEEDS / relative
    if path.exists():
        return path.read_bytes()
    return gzip.decompress((SEEDS / f"{relative}.gz").read_bytes())
