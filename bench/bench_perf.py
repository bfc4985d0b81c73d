"""What measuring throughput costs a step, and the demo's throughput on this machine.

One real run of `carl demo`'s config per backend (shortened: 40 SFT warm-up steps, 60 GRPO steps), read
back from its store: the median GRPO step's time, its split into generation, scoring and update, and its
tokens and samples per second, and the warm-up's tokens per second. Against that step, in the same
invocation, what the perf record adds to it:

- the timing and the record itself: a step's `StepClock` phases (the nested update included), then
  `StepPerf.of(...).metrics()` over the demo's 32 sequences with the FLOPs count on (as on a GPU with a known
  peak), repeated in a loop;
- the store: writing a step's metric rows with the perf/* rows against without them, into a real SQLite
  store, each as the runner writes a step (one transaction).

On a GPU the torch backend also waits once a step for the optimizer step's kernels (`torch.cuda.synchronize`
at `on_optimizer_step`), which the next step's first sync would wait for anyway; not measured here.

    python bench/bench_perf.py                   # both backends where MLX imports; a minute or two
    python bench/bench_perf.py --backends torch
"""

from __future__ import annotations

import argparse
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
from engine.training.flops import ModelFlops  # noqa: E402
from engine.training.perf import GENERATION, SCORING, UPDATE, StepClock, StepPerf  # noqa: E402

DEMO = ROOT / "engine" / "training" / "demo.yaml"
WARMUP, GRPO, SKIP = 40, 60, 10  # steps; the first GRPO steps compile kernels and fill caches
TINY = {  # engine/models/tiny.py's architecture, as its config.json has it
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
}


def run(home: Path, backend: str) -> Path:
    config = yaml.safe_load(DEMO.read_text())
    config.update(
        name=f"demo-{backend}",
        backend=backend,
        max_steps=GRPO,
        sft_warmup_steps=WARMUP,
        save_steps=10_000,
        eval={**config["eval"], "at_end": False},
    )
    path = home / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "engine.training", "--config", str(path), "--home", str(home)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return home / "carl.db"


def series(db: Path, name: str, key: str, steps: range) -> list[float]:
    reader = StoreReader(db)
    try:
        run_id = next(r.id for r in reader.runs() if r.name == name)
        rows = reader.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND value IS NOT NULL ORDER BY step",
            (run_id, key),
        ).fetchall()
    finally:
        reader.close()
    return [value for step, value in rows if step in steps]


def record_seconds(repeats: int = 20_000) -> float:
    """One step's timing and record: the phases as TRL's step opens them, then the perf metrics."""
    model = ModelFlops.from_config(TINY)
    prompts, completions = [22] * 32, [16] * 32
    clock = StepClock()
    started = time.perf_counter()
    for _ in range(repeats):
        clock.start()
        with clock.phase(GENERATION):
            pass
        with clock.phase(SCORING):
            pass
        clock.begin(UPDATE)
        with clock.phase(UPDATE):  # the loss forward, inside the update
            pass
        clock.end(UPDATE)
        perf = StepPerf.of(clock.stop(), prompts, completions, flops=model, forwards=1, peak_flops=1e15)
        assert perf is not None and perf.metrics()
    return (time.perf_counter() - started) / repeats


def store_seconds(db: Path, name: str, steps: int = 200, rounds: int = 3) -> tuple[float, float]:
    """Seconds a step to write the run's real metric rows of one GRPO step, without and with its perf rows
    (each the best of `rounds`, taken in turns: the machine is shared)."""
    reader = StoreReader(db)
    try:
        run_id = next(r.id for r in reader.runs() if r.name == name)
        rows = reader.conn.execute(
            "SELECT key, value FROM metrics WHERE run_id=? AND step=?", (run_id, WARMUP + GRPO)
        ).fetchall()
    finally:
        reader.close()
    plain = [(k, v) for k, v in rows if not k.startswith("perf/")]
    best = {"without": float("inf"), "with": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "carl.db")
        for turn in range(rounds):
            for which, keys in (("without", plain), ("with", rows)):
                run_id = store.create_run(f"{which}-{turn}", source_kind="carl")
                started = time.perf_counter()
                for step in range(1, steps + 1):
                    with store.transaction():
                        store.add_metrics(run_id, [(step, k, v, time.time()) for k, v in keys])
                best[which] = min(best[which], (time.perf_counter() - started) / steps)
        store.close()
    return best["without"], best["with"]


def main() -> None:
    parser = argparse.ArgumentParser(description="the cost of the perf record, and the demo's throughput")
    parser.add_argument("--backends", default="torch,mlx")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b != "mlx" or _mlx()]
    record = record_seconds()
    for backend in backends:
        with tempfile.TemporaryDirectory() as tmp:
            report(run(Path(tmp), backend), backend, record)


def report(db: Path, backend: str, record: float) -> None:
    name = f"demo-{backend}"
    grpo = range(WARMUP + SKIP + 1, WARMUP + GRPO + 1)
    warmup = range(2, WARMUP + 1)

    def median(key: str, steps: range = grpo) -> float:
        return statistics.median(series(db, name, key, steps))

    step = median("perf/step_time_s")
    phases = {phase: median(f"perf/time/{phase}_s") for phase in ("generation", "scoring", "update")}
    shares = " ".join(f"{phase}={seconds / step:.1%}" for phase, seconds in phases.items())
    print(
        f"[{backend}] grpo step_s={step:.4f} tokens_per_s={median('perf/tokens_per_s'):.0f} "
        f"(prompt {median('perf/prompt_tokens_per_s'):.0f}, completion "
        f"{median('perf/completion_tokens_per_s'):.0f}) samples_per_s={median('perf/samples_per_s'):.1f} "
        f"| {shares} other={1 - sum(phases.values()) / step:.1%} "
        f"| sft warm-up tokens_per_s={median('perf/tokens_per_s', warmup):.0f} "
        f"step_s={median('perf/step_time_s', warmup):.4f}"
    )
    print(
        f"[{backend}] the timing itself: {record * 1e6:.1f} us a step = {record / step:.4%} of the step "
        f"(goal < 1%: {'OK' if record / step < 0.01 else 'MISSED'})"
    )
    without, with_perf = store_seconds(db, name)
    extra = with_perf - without
    print(
        f"[{backend}] storing the perf/* rows: {extra * 1e6:+.0f} us a step ({without * 1e3:.1f} -> "
        f"{with_perf * 1e3:.1f} ms to write the step's metrics, after the step) = {extra / step:.2%} of the "
        "step"
    )


def _mlx() -> bool:
    try:
        import mlx.core  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
