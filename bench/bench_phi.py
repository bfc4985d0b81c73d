"""Phi kernel (`engine.coherence.phi.token_entropy`) on [2048 x 151,936] float32 logits, scale 3.

`token_entropy` takes the numba kernel (engine/coherence/phi_numba.py) on the CPU when numba is
installed, else the torch kernel; both are measured. It first prints the machine: the CPU model
(/proc/cpuinfo), numba's target (LLVM's CPU name, the features it was given, the vector registers
of the kernel's hot loop) and whether numba has SVML. Figures, each against a baseline measured in
the same run with the same thread count (1 unless BENCH_THREADS says otherwise):
  speed     vs one plain reduction of the same tensor (`logits.sum(-1)`): one read of memory, the
            floor of any kernel that reads the logits once: goal ratio <= 2.0 (the yardstick that
            holds across CPUs)
  speed     vs TRL's `entropy_from_logits` CPU path: goal speedup >= 10
  speed     vs one exp pass over the same logits (`torch.exp` chunk by chunk into one reused
            buffer), for reference: torch's exp is vectorised differently on each CPU
  memory    RSS growth around the call (psutil), fresh processes: numba ~0; torch <= 2 chunks
  accuracy  max |H - H_float64| on a 256-row slice, float32 and bf16 inputs: goal <= 1e-5 nats
  first call  numba's compile on a machine's first call, and the cached load after it
It also sweeps the torch kernel's chunk_rows, the measurement behind its default chunk size, and
times one softmax over the same chunks: the floor of any exact method built from torch ops here.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402

from engine.coherence.phi import (  # noqa: E402
    default_chunk_rows,
    numba_applies,
    reference_entropy,
    token_entropy,
)

N, V, SCALE = 2048, 151_936, 3.0
# One thread by default: on this box's 2 shared vCPUs two OpenMP threads stall whenever one is
# descheduled (each op ends in a barrier), which swings the kernel's time 2-20x from run to run.
# BENCH_THREADS=2 (or 1,2) measures the other setting; every compared op runs at the same count.
THREADS = tuple(int(t) for t in os.environ.get("BENCH_THREADS", "1").split(","))
SWEEP = (1, 2, 4, 6, 8, 16, 64, 256)
MIB = 2**20


def once_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median wall time in ms of `reps` calls after one warm-up call."""
    fn()
    return statistics.median(once_ms(fn) for _ in range(reps))


def timed_pair(a: Callable[[], object], b: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median ms of a and of b, run alternately, so a slow spell of this shared box hits both."""
    a(), b()
    times = [(once_ms(a), once_ms(b)) for _ in range(reps)]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def rss_growth(fn: Callable[[], object]) -> float:
    """Peak RSS above the starting RSS while fn runs, in MiB (sampled every 0.5 ms)."""
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return (max(peak, proc.memory_info().rss) - base) / MIB


def make_logits(rows: int = N) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, V).mul_(SCALE)  # in place: no second full-size tensor


def memory_child(case: str) -> None:
    """Print the RSS growth (MiB) of one call, in a fresh process: nothing freed earlier can hide it."""
    from trl.trainer.utils import entropy_from_logits

    torch.set_num_threads(THREADS[-1])
    # Warm up on a few rows first, so the library code pages touched by the first call (RSS, but
    # not working memory) are not counted.
    token_entropy(make_logits(4).bfloat16(), temperature=0.7, kernel="torch")
    entropy_from_logits(make_logits(4))
    if numba_applies(tiny := torch.zeros(2, 64)):
        token_entropy(tiny)  # loads numba and its compiled kernel
    if case == "bf16":  # bf16 input with a temperature: the torch path that uses both buffers
        low = make_logits(512).bfloat16()
        print(rss_growth(lambda: token_entropy(low, temperature=0.7, kernel="torch")))
        return
    logits = make_logits()
    fn = {
        "fp32": lambda: token_entropy(logits),
        "torch": lambda: token_entropy(logits, kernel="torch"),
        "trl": lambda: entropy_from_logits(logits),
    }[case]
    print(rss_growth(fn))


def first_call_child() -> None:
    """Print the seconds of `import numba` and of the first call for each input dtype (NUMBA_CACHE_DIR
    is the parent's choice: empty for a compile, filled for a cached load)."""
    started = time.perf_counter()
    from engine.coherence import phi_numba

    imported = time.perf_counter() - started
    part = make_logits(2)
    calls = {}
    for name, array, bf16 in (
        ("fp32", part.numpy(), False),
        ("bf16", part.bfloat16().view(torch.uint16).numpy(), True),
        ("fp16", part.half().numpy(), False),
    ):
        started = time.perf_counter()
        phi_numba.token_entropy(array, bfloat16=bf16)
        calls[name] = time.perf_counter() - started
    print(imported, *calls.values())


def first_call_seconds() -> tuple[list[float], list[float]]:
    """(cold, cached): [import, fp32, bf16, fp16] first-call seconds with an empty and a filled cache."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        runs = [
            subprocess.run(
                [sys.executable, __file__, "--first-call"],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            for _ in range(2)
        ]
    cold, cached = ([float(x) for x in run.stdout.split()[-4:]] for run in runs)
    return cold, cached


def measured_rss(case: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--memory", case], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def speed(logits: torch.Tensor, threads: int) -> None:
    """The speed figures at one thread count (every compared op runs at that count; the numba
    kernel splits rows across torch.get_num_threads() threads, so it follows too)."""
    from trl.trainer.utils import entropy_from_logits

    torch.set_num_threads(threads)
    tag = f"threads={threads}"
    rows = default_chunk_rows(V)
    sweep = {r: timed(lambda r=r: token_entropy(logits, chunk_rows=r, kernel="torch"), reps=3) for r in SWEEP}
    print(f"{tag} torch_kernel chunk_rows_sweep_ms " + " ".join(f"{r}={ms:.0f}" for r, ms in sweep.items()))

    # One exp pass: each logit read once and exp'd once, into one reused cache-sized buffer (a
    # fresh 1.24 GB output would time page faults, not exp).
    out = torch.empty(rows, V)
    chunks = logits.split(rows)
    exp_pass = lambda: [torch.exp(c, out=out[: len(c)]) for c in chunks]  # noqa: E731
    plain_sum = lambda: logits.sum(-1)  # noqa: E731
    exp_ms, sum_ms = timed_pair(exp_pass, plain_sum, reps=9)
    print(
        f"{tag} exp_pass_ms={exp_ms:.1f} plain_sum_ms={sum_ms:.1f} ({logits.numel() * 4 / sum_ms / 1e6:.1f} "
        f"GB/s) exp_pass/sum={exp_ms / sum_ms:.2f}"
    )

    kernels = {"torch": lambda: token_entropy(logits, kernel="torch")}
    if numba_applies(logits):
        kernels["numba"] = lambda: token_entropy(logits, kernel="numba")
    print(f"{tag} token_entropy_default={'numba' if 'numba' in kernels else 'torch (numba not installed)'}")
    for name, kernel in kernels.items():
        kernel_ms, exp_ms = timed_pair(kernel, exp_pass, reps=9)
        kernel_ms2, sum_ms = timed_pair(kernel, plain_sum, reps=5)
        print(
            f"{tag} {name}_kernel_ms={kernel_ms2:.1f} vs plain_sum_ms={sum_ms:.1f} "
            f"ratio={kernel_ms2 / sum_ms:.2f} goal<=2.0 {'OK' if kernel_ms2 <= 2.0 * sum_ms else 'MISSED'}; "
            f"vs exp_pass_ms={exp_ms:.1f} ratio={kernel_ms / exp_ms:.2f}"
        )
    if "numba" in kernels:
        # As many logits again, but from a [64 x V/64] block (0.6 MB) that stays in the L2 cache
        # over N calls (each ~6 us of call overhead): if this takes as long as the real call, the
        # kernel is bound by its arithmetic, not by reading memory.
        from engine.coherence import phi_numba

        small = logits[:64, : V // 64].contiguous().numpy()
        in_cache = lambda: [phi_numba.token_entropy(small) for _ in range(N)]  # noqa: E731
        kernel_ms, cache_ms = timed_pair(kernels["numba"], in_cache, reps=5)
        print(
            f"{tag} numba_kernel_ms={kernel_ms:.1f} numba_same_work_in_cache_ms={cache_ms:.1f} "
            f"ratio={kernel_ms / cache_ms:.2f}"
        )
    # The floor of an exact method built from torch ops: one softmax over the same chunks.
    softmax_ms, sum_ms = timed_pair(
        lambda: [torch.softmax(c, -1, out=out[: len(c)]) for c in chunks], plain_sum, reps=5
    )
    print(f"{tag} softmax_only_ms={softmax_ms:.1f} plain_sum_ms={sum_ms:.1f} ratio={softmax_ms / sum_ms:.2f}")

    for name, kernel in kernels.items():
        kernel_ms, trl_ms = timed_pair(kernel, lambda: entropy_from_logits(logits), reps=3)
        print(
            f"{tag} {name}_kernel_ms={kernel_ms:.1f} trl_entropy_from_logits_ms={trl_ms:.1f} "
            f"speedup={trl_ms / kernel_ms:.1f}x goal>=10x {'OK' if trl_ms >= 10 * kernel_ms else 'MISSED'}"
        )


def machine() -> None:
    """The CPU, and what numba compiles the kernel for on it."""
    import re

    import numba
    from llvmlite import binding as llvm

    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown",
        )
        if Path("/proc/cpuinfo").exists()
        else "unknown"
    )
    print(f"cpu={model!r} cores={os.cpu_count()} llvm_host_cpu={llvm.get_host_cpu_name()}")
    if not numba_applies(torch.zeros(2, 64)):
        print("numba: not installed (the torch kernel runs)")
        return
    from numba.core import config

    from engine.coherence import phi_numba

    phi_numba.token_entropy(make_logits(2).numpy())
    asm = next(iter(phi_numba._block_sums.inspect_asm().values()), "")
    print(
        f"numba={numba.__version__} target_cpu={config.CPU_NAME or llvm.get_host_cpu_name()} "
        f"features: {phi_numba.VECTOR_TARGET}; svml={config.USING_SVML}; hot loop vector registers: "
        f"zmm={len(re.findall('zmm', asm))} ymm={len(re.findall('ymm', asm))}"
        + (" (cached code: not inspectable, set NUMBA_CACHE_DIR to an empty folder)" if not asm else "")
    )


def main() -> None:
    machine()
    logits = make_logits()
    print(
        f"shape=[{N}x{V}] dtype=float32 scale={SCALE} threads={','.join(map(str, THREADS))} "
        f"({logits.numel() * 4 / 1e9:.2f} GB)"
    )
    for threads in THREADS:
        speed(logits, threads)

    part = logits[:256]
    low = part.bfloat16()
    errors = {}
    for kernel in ("numba", "torch") if numba_applies(part) else ("torch",):
        err32 = (token_entropy(part, kernel=kernel)[0].double() - reference_entropy(part)).abs().max().item()
        err16 = (token_entropy(low, kernel=kernel)[0].double() - reference_entropy(low)).abs().max().item()
        errors[kernel] = max(err32, err16)
        print(
            f"{kernel} max_abs_err_nats_fp32={err32:.2e} max_abs_err_nats_bf16={err16:.2e} rows=256 "
            f"goal<=1e-5 {'OK' if errors[kernel] <= 1e-5 else 'MISSED'}"
        )

    default_rows = default_chunk_rows(V)
    chunk_mib = default_rows * V * 4 / MIB
    # The torch kernel: two float32 buffers of one chunk each (shifted logits, probabilities).
    analytic_mib = 2 * chunk_mib
    rss_mib, torch_mib, bf16_mib, trl_mib = (measured_rss(c) for c in ("fp32", "torch", "bf16", "trl"))
    print(
        f"rss_growth_mib token_entropy={rss_mib:.1f} torch_kernel={torch_mib:.1f} "
        f"({torch_mib / chunk_mib:.1f} chunks) torch_kernel_bf16_temp={bf16_mib:.1f} "
        f"({bf16_mib / chunk_mib:.1f} chunks) trl={trl_mib:.1f}; chunk_mib={chunk_mib:.1f} torch "
        f"analytic={analytic_mib:.1f} (2 chunks) goal<=2chunks "
        f"{'OK' if max(rss_mib, torch_mib, bf16_mib) <= 2 * chunk_mib + 1 else 'MISSED'}"
    )

    if numba_applies(part):
        cold, cached = first_call_seconds()
        print(
            "numba_first_call_s cold (empty cache): "
            f"import={cold[0]:.2f} fp32={cold[1]:.2f} bf16={cold[2]:.2f} fp16={cold[3]:.2f}; "
            f"cached: import={cached[0]:.2f} fp32={cached[1]:.3f} bf16={cached[2]:.3f} fp16={cached[3]:.3f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--memory"]:
        memory_child(sys.argv[2])
    elif sys.argv[1:2] == ["--first-call"]:
        first_call_child()
    else:
        main()
