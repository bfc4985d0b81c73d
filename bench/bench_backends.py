"""The two training backends side by side on this machine's CPU: a GRPO step, and the Phi kernel.

GRPO step: the same config (the demo task, the tiny model, 8 completions of one prompt per step, 24 tokens at
most, the five rewards) trained by `python -m engine.training --backend torch` and `--backend mlx` in one run,
one after the other. Seconds per step from the store's own timestamps of each step's metrics, the first
5 steps left out (start-up), the median of the per-step gaps. Reported as MLX / torch; no goal.

Phi kernel: `engine.coherence.phi_mlx.token_entropy` (MLX) against `engine.coherence.phi.token_entropy`
(torch) on the same logits, each against baselines measured in the same run:
  [2048 x 151,936] float32 (a Qwen-width batch) and [16,384 x 512] float32 (the tiny model's width):
    speed     MLX ms / torch ms. No goal: MLX's CPU backend is how the MLX path is tested
              here, and Apple's GPU is what it is for. Reported so a change to either kernel shows.
    agreement max |H_mlx - H_torch| over every row: goal <= 1e-5 nats
    accuracy  max |H - H_float64| on a 256-row slice, for each kernel: goal <= 1e-5 nats
  the textbook MLX form (mx.logsumexp, then p = exp(z - lse), H = lse - sum p z) on a 256-row
  slice, the form the kernel replaces: goal kernel speedup >= 2x. Its error is printed too.
Timings are medians of alternating runs, so a slow spell of a shared box hits both sides. torch runs
at 1 thread unless BENCH_THREADS says otherwise (bench/bench_phi.py explains why); the MLX kernel
runs on one core (its CPU time equals its wall time). BENCH_SWEEP=1 also sweeps the MLX kernel's chunk_rows.
The default run takes well under a minute.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.coherence import phi as torch_phi  # noqa: E402
from engine.coherence import phi_mlx  # noqa: E402

QWEN_V, SMALL_V = 151_936, 512
ROWS, SMALL_ROWS, SLICE = 2048, 16_384, 256
SCALE = 3.0
TOL = 1e-5  # nats
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
SWEEP = (1, 2, 3, 4, 6, 8, 16)


def once_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def timed_pair(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median ms of a and of b, run alternately after one warm-up call each."""
    a(), b()
    times = [(once_ms(a), once_ms(b)) for _ in range(reps)]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def make_logits(rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, vocab), dtype=np.float32) * np.float32(SCALE)


def mlx_kernel(logits: mx.array) -> Callable[[], mx.array]:
    return lambda: phi_mlx.token_entropy(logits)[0]  # evaluated inside: every chunk is mx.eval'd


def torch_kernel(logits: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch_phi.token_entropy(logits)[0]


def textbook_mlx(logits: mx.array) -> mx.array:
    """H = lse - sum p z with lse = mx.logsumexp(z) and p = exp(z - lse), chunked as the kernel is."""
    rows = phi_mlx.default_chunk_rows(logits.shape[-1])
    out = []
    for start in range(0, logits.shape[0], rows):
        z = logits[start : start + rows].astype(mx.float32)
        lse = mx.logsumexp(z, axis=-1, keepdims=True)
        h = (lse - mx.sum(mx.exp(z - lse) * z, axis=-1, keepdims=True)).squeeze(-1)
        mx.eval(h)
        out.append(h)
    return mx.concatenate(out)


def compare(values: np.ndarray, reps: int) -> dict[str, float]:
    """Speed, agreement and accuracy of the two kernels on the same logits."""
    as_mlx, as_torch = mx.array(values), torch.from_numpy(values)
    mx.eval(as_mlx)
    mlx_ms, torch_ms = timed_pair(mlx_kernel(as_mlx), torch_kernel(as_torch), reps)
    h_mlx = np.array(mlx_kernel(as_mlx)()).astype(np.float64)
    h_torch = torch_kernel(as_torch)().numpy().astype(np.float64)
    reference = phi_mlx.reference_entropy(values[:SLICE])
    return {
        "mlx_ms": mlx_ms,
        "torch_ms": torch_ms,
        "ratio_mlx_torch": mlx_ms / torch_ms,
        "max_abs_diff_nats": float(np.abs(h_mlx - h_torch).max()),
        "mlx_max_err_nats": float(np.abs(h_mlx[:SLICE] - reference).max()),
        "torch_max_err_nats": float(np.abs(h_torch[:SLICE] - reference).max()),
    }


def textbook_and_sweep(values: np.ndarray, reps: int, sweep: bool) -> dict[str, Any]:
    part = mx.array(values)
    mx.eval(part)
    reference = phi_mlx.reference_entropy(values)
    kernel_ms, textbook_ms = timed_pair(mlx_kernel(part), lambda: textbook_mlx(part), max(3, reps // 2))
    out: dict[str, Any] = {
        "textbook": {
            "kernel_ms": kernel_ms,
            "textbook_ms": textbook_ms,
            "speedup": textbook_ms / kernel_ms,
            "textbook_max_err_nats": float(np.abs(np.array(textbook_mlx(part)) - reference).max()),
        }
    }
    if sweep:
        scale = ROWS / part.shape[0]  # ms per ROWS rows
        out["chunk_rows_ms"] = {
            rows: statistics.median(
                once_ms(lambda r=rows: phi_mlx.token_entropy(part, chunk_rows=r)) for _ in range(3)
            )
            * scale
            for rows in SWEEP
        }
    return out


def bench_phi_kernel(reps: int = 5, sweep: bool = False) -> dict[str, Any]:
    """Figures of the Phi kernels on this CPU, by case: "qwen" ([2048 x 151,936]), "tiny"
    ([16,384 x 512]), "textbook" (the mx.logsumexp form on 256 Qwen-width rows) and, with
    `sweep`, "chunk_rows_ms" (MLX kernel ms per 2048 rows, by chunk_rows)."""
    torch.set_num_threads(THREADS)
    figures: dict[str, Any] = {"torch_threads": THREADS, "mlx_device": str(mx.default_device())}

    values = make_logits(ROWS, QWEN_V)
    figures["qwen"] = compare(values, reps)

    figures.update(textbook_and_sweep(values[:SLICE], reps, sweep))
    del values  # 1.2 GiB

    figures["tiny"] = compare(make_logits(SMALL_ROWS, SMALL_V, seed=1), reps)
    return figures


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def format_phi_kernel(figures: dict[str, Any]) -> list[str]:
    """One line per measurement."""
    lines = [f"phi_kernel torch_threads={figures['torch_threads']} mlx_device={figures['mlx_device']}"]
    for case, shape in (("qwen", f"{ROWS}x{QWEN_V}"), ("tiny", f"{SMALL_ROWS}x{SMALL_V}")):
        f = figures[case]
        lines += [
            f"phi_kernel [{shape}] float32 speed: mlx_ms={f['mlx_ms']:.1f} torch_ms={f['torch_ms']:.1f} "
            f"ratio_mlx/torch={f['ratio_mlx_torch']:.2f} (no goal: MLX on CPU is the test vehicle)",
            f"phi_kernel [{shape}] float32 agreement: max|H_mlx-H_torch|={f['max_abs_diff_nats']:.1e} nats "
            f"goal<={TOL:.0e} {_verdict(f['max_abs_diff_nats'] <= TOL)}",
            f"phi_kernel [{shape}] float32 accuracy ({SLICE} rows vs float64): "
            f"mlx={f['mlx_max_err_nats']:.1e} torch={f['torch_max_err_nats']:.1e} nats "
            f"goal<={TOL:.0e} {_verdict(max(f['mlx_max_err_nats'], f['torch_max_err_nats']) <= TOL)}",
        ]
    t = figures["textbook"]
    lines.append(
        f"phi_kernel [{SLICE}x{QWEN_V}] float32 vs textbook mx.logsumexp form: "
        f"kernel_ms={t['kernel_ms']:.1f} textbook_ms={t['textbook_ms']:.1f} speedup={t['speedup']:.1f}x "
        f"goal>=2x {_verdict(t['speedup'] >= 2)} (textbook max_err={t['textbook_max_err_nats']:.1e} nats)"
    )
    if "chunk_rows_ms" in figures:
        sweep = " ".join(f"{rows}={ms:.0f}" for rows, ms in figures["chunk_rows_ms"].items())
        default = phi_mlx.default_chunk_rows(QWEN_V)
        lines.append(f"phi_kernel mlx chunk_rows_sweep_ms_per_{ROWS}_rows {sweep} (default {default})")
    return lines


def bench_grpo_step(steps: int = 40) -> dict[str, float]:
    """Seconds per GRPO step on each backend, the same config, trained one after the other."""
    import json
    import sqlite3
    import subprocess
    import tempfile

    config = {
        "name": "bench",
        "model": "carl-tiny",
        "dataset": "demo",
        "method": "grpo",
        "max_steps": steps,
        "save_steps": 10_000,
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "max_completion_length": 24,
        "learning_rate": 5e-4,
        "eval": {"holdout": 0.1},
    }
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        path = home / "bench.json"
        path.write_text(json.dumps(config))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        for backend in ("torch", "mlx"):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "engine.training",
                    "--home",
                    str(home),
                    "--config",
                    str(path),
                    "--backend",
                    backend,
                    "--name",
                    backend,
                ],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            with sqlite3.connect(home / "carl.db") as conn:
                (run_id,) = conn.execute("SELECT id FROM runs WHERE name=?", (backend,)).fetchone()
                times = [
                    t
                    for (t,) in conn.execute(
                        "SELECT max(wall_time) FROM metrics WHERE run_id=? GROUP BY step ORDER BY step",
                        (run_id,),
                    )
                ]
            gaps = np.diff(times[5:])
            out[backend] = float(np.median(gaps))
    return out


def main() -> None:
    grpo = bench_grpo_step()
    print(
        f"GRPO step (tiny model, 8 completions of one prompt, 24 tokens): torch CPU {grpo['torch']:.3f} s, "
        f"MLX CPU {grpo['mlx']:.3f} s; MLX / torch {grpo['mlx'] / grpo['torch']:.2f}",
        flush=True,
    )
    for line in format_phi_kernel(bench_phi_kernel(sweep=os.environ.get("BENCH_SWEEP") == "1")):
        print(line, flush=True)


if __name__ == "__main__":
    main()
