"""Φ on CUDA, checked in one command (`bash bench/gpu_check.sh`), for the day a GPU is lent.

Each section reports its own result and failure; the others still run. Exit status: 0 when every
section passed or was skipped, 1 when one failed, 0 with "skipped" lines when there is no CUDA.
Sections (about 5 minutes on an H100):
  kernel    the torch and Triton kernels against float64 on CUDA, float32 and bfloat16 logits
  tiny      Φ of the tiny model on cuda and on cpu (the forward path), and the generating pass on
            cuda against the forward on the same tokens
  grpo      a short GRPO run on cuda in bf16 (`python -m engine.training`), the coherence rewards on
            from step one: which Φ path each step took, and the step times; then the same with
            `phi_source: forward` for the comparison; every step's perf/tokens_per_s, and perf/mfu in
            (0, 1) on a GPU of the peak table (docs/reference/gpus.md), none on another
  nccl      the run again under torchrun with one process (accelerate's multi-GPU launcher is torchrun,
            and refuses `--multi_gpu --num_processes 1`): the Trainer's accelerate sets up NCCL
  speed     the kernels at [8192 x 151,936] bf16 against one read of the logits (goal <= 1.5x): the
            Triton kernel's block and warps, the torch kernel's chunk size; peak memory against the
            logits' size
  scale     bench/bench_phi_scale.py on cuda: a Qwen2.5-0.5B-shaped model, coherence cost per step
  nvml      the engine's sampler through NVML (nvidia-ml-py): every GPU found and named as torch names it;
            non-zero utilisation read while a GRPO run trains, its process listed on the GPU; this
            process's GPU memory as NVML sees it against torch.cuda.memory_reserved (goal within 10%);
            the engine's system job storing the gpu/* series
Needs torch with CUDA, transformers, accelerate, trl, datasets, pydantic, sqlite-utils, pyyaml; not textual.
`--only kernel,speed` runs some sections.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

V = 151_936
MIB = 2**20
results: list[tuple[str, str, str]] = []  # (section, ok | FAIL | skipped, detail)


def say(line: str) -> None:
    print(line, flush=True)


def section(name: str, fn: Callable[[], str]) -> None:
    started = time.perf_counter()
    say(f"== {name}")
    try:
        detail = fn()
        state = "ok"
    except Skip as exc:
        state, detail = "skipped", str(exc)
    except Exception as exc:  # each section reports its own failure; the others still run
        state, detail = "FAIL", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        say("".join(traceback.format_exc().splitlines(keepends=True)[-6:]).rstrip())
    say(f"-- {name}: {state} ({time.perf_counter() - started:.0f}s) {detail}")
    results.append((name, state, detail))


class Skip(Exception):
    pass


def cuda_ms(fn: Callable[[], object], reps: int = 10) -> float:
    """Median ms of `reps` calls on the GPU (CUDA events), after two warm-ups."""
    fn(), fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# -- sections ---------------------------------------------------------------------------------------


def kernel() -> str:
    from engine.coherence.phi import reference_entropy, token_entropy

    torch.manual_seed(0)
    base = torch.randn(256, V, device="cuda") * 3
    base[1, ::3] = -math.inf  # masked columns
    base[2] += 1e4  # a large offset: the shift keeps float32 exact
    base[3, :] = -math.inf
    base[3, 7] = 0.0  # one-hot
    worst = []
    for kernel_name in ("torch", "triton"):
        for dtype in (torch.float32, torch.bfloat16):
            logits = base.to(dtype)
            for temperature in (1.0, 0.7):
                h, lse = token_entropy(logits, temperature=temperature, kernel=kernel_name)
                ref = reference_entropy(logits, temperature=temperature)
                lse_ref = torch.logsumexp(logits.double() / temperature, dim=-1)
                err = float((h.double() - ref).abs().max())
                lse_err = float(((lse.double() - lse_ref) / lse_ref.abs().clamp(min=1)).abs().max())
                say(
                    f"kernel {kernel_name:6} {str(dtype)[6:]:8} T={temperature}: max|H-H64| {err:.2e} nats,"
                    f" lse rel {lse_err:.1e}"
                )
                worst.append(err)
                if not err <= 1e-5:
                    raise AssertionError(
                        f"{kernel_name} {dtype} T={temperature}: |H - H64| = {err:.2e} > 1e-5"
                    )
    return f"max |H - H64| {max(worst):.2e} nats (goal <= 1e-5)"


def tiny_model() -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.tiny import build_tiny_model

    path = build_tiny_model(Path(tempfile.mkdtemp(prefix="carl-gpu-")) / "carl-tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(path).eval(), tokenizer


def tiny() -> str:
    from transformers import GenerationConfig

    from engine.coherence.phi import phi_from_model
    from engine.training.phi_sampling import SamplingEntropy, recording

    model, tokenizer = tiny_model()
    prompts = [
        tokenizer(p).input_ids
        for p in (
            "<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n",
            "<|user|>\nHi</s>\n<|assistant|>\n",
        )
    ] * 4
    eos = [tokenizer.eos_token_id, *range(100, 140)]  # more ids end a row: rows finish at different steps
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device="cuda")
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    figures = []
    for dtype in (torch.float32, torch.bfloat16):
        gpu = model.to("cuda", dtype)
        config = GenerationConfig(
            do_sample=True, temperature=0.7, max_new_tokens=24, pad_token_id=pad, eos_token_id=eos
        )
        sampler = SamplingEntropy(0.7, eos)
        sampler.place(gpu, config)
        torch.manual_seed(0)
        with recording(gpu, sampler):
            out = gpu.generate(input_ids=ids, attention_mask=attention, generation_config=config)
        completions = []
        for row in out[:, width:].tolist():
            ends = [i for i, t in enumerate(row) if t in eos]
            completions.append(row[: ends[0] + 1] if ends else row)
        sampled = sampler.per_sequence([len(c) for c in completions])
        assert sampled is not None, "the sampling entropies do not line up with the completions"
        rows = [p + c for p, c in zip(prompts, completions, strict=True)]
        full = max(map(len, rows))
        batch = torch.tensor([r + [pad] * (full - len(r)) for r in rows])
        attn = torch.tensor([[1] * len(r) + [0] * (full - len(r)) for r in rows])
        mask = torch.tensor(
            [
                [0] * len(p) + [1] * len(c) + [0] * (full - len(p) - len(c))
                for p, c in zip(prompts, completions, strict=True)
            ]
        )
        on_gpu = phi_from_model(gpu, batch.cuda(), attn.cuda(), mask.cuda(), temperature=0.7)
        gen_err = max(float(abs(a - b).max()) for a, b in zip(sampled, on_gpu.entropy, strict=True))
        lengths = sorted({len(c) for c in completions})
        line = (
            f"tiny {str(dtype)[6:]:8}: generating pass vs forward on cuda max {gen_err:.2e} nats "
            f"(lengths {lengths})"
        )
        if dtype == torch.float32:
            on_cpu = phi_from_model(model.to("cpu", torch.float32), batch, attn, mask, temperature=0.7)
            dev_err = max(
                float(abs(a - b).max()) for a, b in zip(on_gpu.entropy, on_cpu.entropy, strict=True)
            )
            line += f"; forward cuda vs cpu max {dev_err:.2e} nats"
            figures += [gen_err, dev_err]
        say(line)
    worst = max(figures)
    if not worst <= 1e-4:
        raise AssertionError(f"float32 tiny model: {worst:.2e} nats apart (> 1e-4)")
    return f"float32: generate vs forward {figures[0]:.1e}, cuda vs cpu {figures[1]:.1e} nats"


def carl_config(path: Path, model: str, steps: int, **settings: object) -> Path:
    config = {
        "name": path.stem,
        "model": model,
        "max_steps": steps,
        "save_steps": 100,
        "max_completion_length": 24,
        "rewards": [
            {"name": "task"},
            {"name": "format", "weight": 0.5},
            {"name": "coherence", "weight": 0.25},
        ],
        "cascade": {"mode": "always"},  # the coherence rewards from step one
        **settings,
    }
    path.write_text(json.dumps(config))
    return path


def run_carl(home: Path, argv: list[str], timeout: float) -> tuple[int, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def step_figures(home: Path, name: str) -> dict[str, dict[int, float]]:
    db = sqlite3.connect(home / "carl.db")
    run_id = db.execute("SELECT id FROM runs WHERE name=?", (name,)).fetchone()[0]
    keys = (
        "phi/from_generate",
        "timing/phi_generate",
        "timing/phi_forward",
        "step_time",
        "phi/mean",
        "perf/tokens_per_s",
        "perf/mfu",
    )
    out: dict[str, dict[int, float]] = {k: {} for k in keys}
    for key, step, value in db.execute(
        f"SELECT key, step, value FROM metrics WHERE run_id=? AND key IN ({','.join('?' * len(keys))})",
        (run_id, *keys),
    ):
        out[key][step] = value
    return out


def grpo() -> str:
    home = Path(tempfile.mkdtemp(prefix="carl-gpu-home-"))
    lines = []
    for source in ("generate", "forward"):
        config = carl_config(home / f"grpo-{source}.yaml", "carl-tiny", 6, phi_source=source)
        started = time.perf_counter()
        code, out = run_carl(
            home, [sys.executable, "-m", "engine.training", "--home", str(home), "--config", str(config)], 600
        )
        wall = time.perf_counter() - started
        for line in out.splitlines():
            if "phi:" in line or "Traceback" in line or "Error" in line:
                say(f"  {line[:200]}")
        if code != 0:
            say(out[-2000:])
            raise AssertionError(f"carl train (phi_source {source}) exited {code}")
        figures = step_figures(home, f"grpo-{source}")
        steps = sorted(figures["step_time"])
        paths = [figures["phi/from_generate"].get(s) for s in steps]
        phi_time = figures[f"timing/phi_{source}"]
        say(
            f"grpo {source:8}: {len(steps)} steps in {wall:.0f}s; phi/from_generate {paths}; step_time s "
            + " ".join(f"{figures['step_time'][s]:.2f}" for s in steps)
            + "; phi s "
            + " ".join(f"{phi_time.get(s, float('nan')):.4f}" for s in steps)
        )
        expected = 1.0 if source == "generate" else 0.0
        taken = [p for p in paths if p is not None]  # None: a step before the gate's ramp began
        if len(taken) < len(paths) - 1 or any(p != expected for p in taken):
            raise AssertionError(f"phi_source {source}: steps took phi/from_generate {paths}")
        lines.append(f"{source}: median step {statistics.median(figures['step_time'].values()):.2f}s")
        lines.append(perf_line(figures, steps))
    return "; ".join(lines)


def perf_line(figures: dict[str, dict[int, float]], steps: list[int]) -> str:
    """Every step's tokens/s; MFU on every step, a fraction, where this GPU's peak is in the table, else
    none."""
    from engine.training.flops import gpu_peak

    name = torch.cuda.get_device_name()
    tokens, mfu = figures["perf/tokens_per_s"], figures["perf/mfu"]
    if sorted(tokens) != steps or min(tokens.values()) <= 0:
        raise AssertionError(f"perf/tokens_per_s at steps {sorted(tokens)} of {steps}")
    if gpu_peak(name) is None:
        if mfu:
            raise AssertionError(f"perf/mfu logged on {name!r}, which has no peak in the table")
        return f"{name}: no peak known, no perf/mfu; tokens/s {statistics.median(tokens.values()):.0f}"
    if sorted(mfu) != steps or not all(0 < value < 1 for value in mfu.values()):
        raise AssertionError(f"perf/mfu on {name!r}: {mfu}")
    return f"tokens/s {statistics.median(tokens.values()):.0f}, mfu {statistics.median(mfu.values()):.2e}"


def nccl() -> str:
    home = Path(tempfile.mkdtemp(prefix="carl-gpu-nccl-"))
    config = carl_config(home / "nccl.yaml", "carl-tiny", 2)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "engine.training",
        "--home",
        str(home),
        "--config",
        str(config),
    ]
    os.environ["NCCL_DEBUG"] = "INFO"
    try:
        code, out = run_carl(home, argv, 600)
    finally:
        del os.environ["NCCL_DEBUG"]
    nccl_lines = [line for line in out.splitlines() if "NCCL INFO" in line]
    for line in [line for line in out.splitlines() if "grpo step" in line][-3:] + nccl_lines[:2]:
        say(f"  {line[:200]}")
    if code != 0:
        say(out[-2500:])
        raise AssertionError(f"torchrun exited {code}")
    figures = step_figures(home, "nccl")
    return (
        f"{len(figures['step_time'])} steps, NCCL {'initialised' if nccl_lines else 'NOT initialised'}"
        f" ({len(nccl_lines)} NCCL INFO lines), phi/from_generate "
        f"{sorted(set(figures['phi/from_generate'].values()))}"
    )


def speed() -> str:
    from engine.coherence import phi as phi_module
    from engine.coherence.phi import token_entropy

    torch.manual_seed(0)
    logits = torch.randn(8192, V, device="cuda", dtype=torch.bfloat16) * 3
    size = logits.numel() * logits.element_size()
    read_ms = cuda_ms(lambda: logits.amax(dim=-1))
    sum_ms = cuda_ms(lambda: logits.sum(dim=-1, dtype=torch.float32))
    say(
        f"speed one read of [8192 x {V:,}] bf16 ({size / 2**30:.2f} GiB): amax {read_ms:.2f} ms "
        f"({size / read_ms / 1e6:.0f} GB/s), sum {sum_ms:.2f} ms"
    )
    from engine.coherence import phi_triton

    results = []
    for block in (1024, 2048, 4096):
        for warps in (4, 8, 16):
            ms = cuda_ms(
                lambda b=block, w=warps: phi_triton.token_entropy(logits, block=b, num_warps=w), reps=5
            )
            default = " (default)" if (block, warps) == (phi_triton.BLOCK, phi_triton.NUM_WARPS) else ""
            say(
                f"speed triton block {block:5} warps {warps:2}{default}: "
                f"{ms:7.2f} ms = {ms / read_ms:5.2f}x one read"
            )
            results.append((ms, f"triton block {block} warps {warps}"))
    for elements in (1 << 20, 1 << 24, 1 << 26):
        rows = max(1, elements // V)
        ms = cuda_ms(lambda rows=rows: token_entropy(logits, chunk_rows=rows, kernel="torch"), reps=3)
        default = " (default)" if elements == phi_module.CHUNK_ELEMENTS_GPU else ""
        say(f"speed torch kernel chunk {rows:5} rows{default}: {ms:8.2f} ms = {ms / read_ms:5.2f}x one read")
        results.append((ms, f"torch chunk {rows} rows"))
    for name in ("triton", "torch"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        token_entropy(logits, kernel=name)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        say(
            f"speed {name} kernel (default settings) "
            f"peak +{peak / MIB:.1f} MiB = {peak / size:.4f}x the logits"
        )
    auto = cuda_ms(lambda: token_entropy(logits), reps=5)
    best = min(results)
    return (
        f"token_entropy (auto) {auto:.2f} ms = {auto / read_ms:.2f}x one read (goal <= 1.5x);"
        f" best {best[1]} {best[0]:.2f} ms"
    )


def scale() -> str:
    argv = [sys.executable, str(ROOT / "bench" / "bench_phi_scale.py"), "--device", "cuda", "--steps", "3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    for line in lines[-24:]:
        say(f"  {line[:200]}")
    if proc.returncode != 0:
        say(proc.stderr[-2000:])
        raise AssertionError(f"bench_phi_scale.py exited {proc.returncode}")
    return next(
        (line.strip() for line in lines if "coherence cost per step (generating pass)" in line), "done"
    )


def nvml() -> str:
    from engine.store import Store, StoreReader
    from engine.system import Sampler
    from engine.system.system_job import SystemJob

    sampler = Sampler()
    if sampler.note:
        raise AssertionError(f"NVML on a CUDA machine: {sampler.note}")
    first = sampler.sample()
    count = torch.cuda.device_count()
    names = [g.name for g in first.gpus]
    if len(first.gpus) != count or torch.cuda.get_device_name(0) not in names[0]:
        raise AssertionError(
            f"NVML found {names}, torch {count} GPU(s) named {torch.cuda.get_device_name(0)!r}"
        )
    # Non-zero utilisation while a real GRPO run trains, and its process on the GPU.
    home = Path(tempfile.mkdtemp(prefix="carl-gpu-nvml-"))
    config = carl_config(home / "grpo-nvml.yaml", "carl-tiny", 8)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    argv = [sys.executable, "-m", "engine.training", "--home", str(home), "--config", str(config)]
    train = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_util, seen_pid, samples = 0.0, False, 0
    try:
        while train.poll() is None:
            sample = sampler.sample()
            samples += 1
            peak_util = max([peak_util] + [g.util or 0.0 for g in sample.gpus])
            seen_pid |= any(p.pid == train.pid for g in sample.gpus for p in g.processes)
            time.sleep(0.25)
    finally:
        if train.poll() is None:
            train.kill()
        train.wait()
    if train.returncode != 0:
        raise AssertionError(f"the GRPO run exited {train.returncode}")
    if peak_util <= 0:
        raise AssertionError(f"NVML read 0% utilisation over {samples} samples of a GRPO run")
    # This process's memory: NVML's per-process figure against what torch reserved (its CUDA context adds a
    # few hundred MiB: 8 GiB reserved keeps that under the 10% the check allows).
    block = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    mine = [p.used_bytes for g in sampler.sample().gpus for p in g.processes if p.pid == os.getpid()]
    del block
    if not mine or mine[0] is None:
        raise AssertionError("NVML does not list this process's GPU memory (a container without its pid?)")
    ratio = mine[0] / reserved
    if not 0.9 <= ratio <= 1.1:
        raise AssertionError(
            f"NVML says {mine[0] / 2**30:.2f} GiB, torch reserved {reserved / 2**30:.2f} GiB"
        )
    # The engine's job stores the gpu series.
    with Store(home / "carl.db") as store:
        job = SystemJob(store, home, sampler=sampler)
        for _ in range(3):
            job.next_sample = 0.0
            job.tick()
    reader = StoreReader(home / "carl.db")
    try:
        keys = reader.system.keys(reader.system.nodes()[0]["id"])
    finally:
        reader.close()
    if "gpu/0/util" not in keys or "gpu/0/mem_used" not in keys:
        raise AssertionError(f"the system job stored {keys}")
    gpu = first.gpus[0]
    return (
        f"{count} GPU(s), {gpu.name}; peak util {peak_util:.0f}% over {samples} samples of a GRPO run"
        f" (its pid listed: {seen_pid}); NVML {mine[0] / 2**30:.2f} GiB"
        f" vs reserved {reserved / 2**30:.2f} GiB"
        f" (ratio {ratio:.3f}); power {gpu.power_w} W of {gpu.power_limit_w}, {gpu.temp_c} C"
    )


SECTIONS = {
    "kernel": kernel,
    "tiny": tiny,
    "speed": speed,
    "grpo": grpo,
    "nccl": nccl,
    "scale": scale,
    "nvml": nvml,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    args = parser.parse_args()
    import transformers

    say(
        f"python {platform.python_version()} torch {torch.__version__} transformers "
        f"{transformers.__version__}"
    )
    if not torch.cuda.is_available():
        say("gpu_check: no CUDA device: every section skipped")
        return 0
    props = torch.cuda.get_device_properties(0)
    say(
        f"device {props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
        f"CUDA {torch.version.cuda}"
    )
    for name in args.only.split(","):
        section(name, SECTIONS[name])
    say("== summary (paste me)")
    for name, state, detail in results:
        say(f"{name:7} {state:7} {detail}")
    return 1 if any(state == "FAIL" for _, state, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
