"""The cost of storing a GRPO step's rollouts, per-token entropy included, as a share of the step's time.

Real runs of the built-in tiny model with the demo's GRPO settings (4 prompts x 8 completions of up to 24
tokens a step, every one of the 32 kept: rollouts_per_step 64), on the torch backend and, where mlx is
installed, the MLX one. Each step logs `timing/rollouts_s`: building the step's rollout rows (texts, rewards,
the per-token token texts, entropies and log-probabilities, which the Φ path already computed) and writing
them to the store. It is set against the step's own time (TRL's `step_time` on torch, `timing/step_s` on MLX).

The per-token part alone is then measured apart: the same stored rollouts written again into a fresh store,
with and without their per-token values, step by step.

    python bench/bench_rollouts.py      # about a minute on 2 cores
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.store import Store, StoreReader  # noqa: E402

STEPS = 40
SKIP = 5  # the first steps warm the allocator and the token-text memo
DEMO = ROOT / "engine" / "training" / "demo.yaml"
STEP_TIME = {"torch": "step_time", "mlx": "timing/step_s"}
PER_TOKEN = ("tokens", "entropy", "logprob")


def train(home: Path, backend: str) -> None:
    config = yaml.safe_load(DEMO.read_text())
    config.update(
        name=backend,
        backend=backend,
        max_steps=STEPS,
        sft_warmup_steps=0,
        save_steps=10_000,
        rollouts_per_step=64,
    )
    config["eval"] = {**config.get("eval", {}), "at_end": False}
    path = home / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, "-m", "engine.training", "--config", str(path), "--home", str(home)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def series(reader: StoreReader, run_id: int, key: str) -> dict[int, float]:
    rows = reader.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND value IS NOT NULL", (run_id, key)
    )
    return dict(rows.fetchall())


def rewrite_seconds(
    reader: StoreReader, run_id: int, steps: list[int], home: Path, per_token: bool
) -> list[float]:
    """Seconds to write each step's stored rollouts again into a new store, with or without per-token data."""
    out = []
    with Store(home / f"rewrite-{run_id}-{per_token}.db") as store:
        target = store.create_run("rewrite", source_kind="bench")
        for step in steps:
            rows = reader.rollouts(run_id, step, limit=10_000)
            for row in rows:
                for name in ("id", "run_id"):
                    row.pop(name)
                if not per_token:
                    row.update(dict.fromkeys(PER_TOKEN))
            started = time.perf_counter()
            store.add_rollouts(target, rows)
            out.append(time.perf_counter() - started)
    return out


def report(home: Path, backend: str) -> None:
    reader = StoreReader(home / "carl.db")
    run = next(r for r in reader.runs() if r.name == backend)
    step_s = series(reader, run.id, STEP_TIME[backend])
    rollout_s = series(reader, run.id, "timing/rollouts_s")
    steps = sorted(set(step_s) & set(rollout_s))[SKIP:]
    step_median = statistics.median(step_s[s] for s in steps)
    rollout_median = statistics.median(rollout_s[s] for s in steps)
    samples = reader.rollout_count(run.id) / max(len(rollout_s), 1)
    tokens = statistics.mean(r["length"] or 0 for r in reader.rollouts(run.id, steps[-1], limit=10_000))
    with_tokens = statistics.median(rewrite_seconds(reader, run.id, steps, home, per_token=True))
    without = statistics.median(rewrite_seconds(reader, run.id, steps, home, per_token=False))
    reader.close()
    print(f"{backend}: {len(steps)} GRPO steps, {samples:.0f} rollouts a step, {tokens:.1f} tokens each")
    print(f"  step time (median)                       {step_median * 1e3:9.2f} ms")
    print(
        f"  rollouts built and stored (median)       {rollout_median * 1e3:9.3f} ms"
        f"   = {rollout_median / step_median:.2%} of the step"
    )
    print(
        f"  per-token values alone (store write)     {(with_tokens - without) * 1e3:9.3f} ms"
        f"   = {(with_tokens - without) / step_median:.2%} of the step"
    )


def main() -> None:
    backends = ["torch"] + (["mlx"] if importlib.util.find_spec("mlx") else [])
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            home = Path(tmp) / backend
            home.mkdir()
            train(home, backend)
            report(home, backend)


if __name__ == "__main__":
    main()
