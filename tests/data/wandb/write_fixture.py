"""Writes the fixture run of this folder with the wandb of the Python that runs it (offline, no network):

    /work/venvs/wandb-0.19/bin/python tests/data/wandb/write_fixture.py tests/data/wandb/0.19.11
    /work/venvs/wandb-0.31/bin/python tests/data/wandb/write_fixture.py tests/data/wandb/0.31.0

(bench/wandb_versions.py makes those venvs.) A small GRPO-like run: a config with the model's vocab_size, 12
steps of metrics, veRL's validation generations table every 4 steps (logged the way veRL 0.9.1's
ValidationGenerationsLogger logs it: verl/utils/tracking.py), a TRL-style completions table at step 6, lines
printed to stdout and stderr (the console), a summary value, and the exit. Only the run file, its tables and
its output.log (where that wandb writes one) are kept; `VERSION` beside them says which wandb wrote them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

STEPS = 12
SAMPLES = ["What is 2+2?", "Name a prime.", "Capital of France?"]


def main(out: Path) -> None:
    work = Path(tempfile.mkdtemp())
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(work),
        WANDB_CONFIG_DIR=str(work / ".config"),
        WANDB_CACHE_DIR=str(work / ".cache"),
        WANDB_DATA_DIR=str(work / ".data"),
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
    )
    import wandb

    run = wandb.init(
        project="carl-fixture",
        name="fixture-grpo",
        config={"model": {"vocab_size": 128, "model_type": "llama"}, "max_steps": STEPS},
        settings=wandb.Settings(x_disable_stats=True, x_disable_meta=True),
    )
    columns = ["step"] + sum([[f"input_{i + 1}", f"output_{i + 1}", f"score_{i + 1}"] for i in range(3)], [])
    validation = wandb.Table(columns=columns)
    for step in range(1, STEPS + 1):
        print(f"step {step}: reward {step / STEPS:.3f}", flush=True)
        wandb.log(
            {
                "train/reward": step / STEPS,
                "train/entropy": 2.0 - step / STEPS,
                "train/kl": 0.01 * step,
                "train/global_step": step,
            },
            step=step,
        )
        if step % 4 == 0:  # veRL: a new table with the old rows and one new row, every validation
            table = wandb.Table(columns=columns, data=validation.data)
            row = [step]
            for n, prompt in enumerate(SAMPLES):
                row += [prompt, f"answer {n} at {step}", float((step + n) % 2)]
            table.add_data(*row)
            wandb.log({"val/generations": table}, step=step)
            validation = table
        if step == 6:
            completions = wandb.Table(
                columns=["step", "prompt", "completion", "accuracy_reward", "advantage"],
                data=[[6, "2+2?", "4", 1.0, 0.5], [6, "2+2?", "5", 0.0, -0.5]],
            )
            wandb.log({"completions": completions}, step=step)
    print(
        'Traceback (most recent call last):\n  File "train.py", line 1\nValueError: a fixture',
        file=sys.stderr,
    )
    run.summary["best_reward"] = 1.0
    run.finish()
    wandb.teardown()  # the service process gone: everything it wrote is on disk

    [run_dir] = (work / "wandb").glob("offline-run-*")
    target = out / "wandb" / run_dir.name
    shutil.rmtree(out, ignore_errors=True)
    target.mkdir(parents=True)
    for path in run_dir.rglob("*"):
        relative = path.relative_to(run_dir)
        keep = (
            path.suffix == ".wandb"
            or relative.parts[:2] == ("files", "media")
            or relative == Path("files/output.log")
        )
        if path.is_file() and keep:
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target / relative)
    (out / "VERSION").write_text(f"wandb {wandb.__version__}\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
