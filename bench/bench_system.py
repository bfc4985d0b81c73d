"""What sampling the machine costs the engine: CPU time (process time) of its system job per sample and per
hour at the default 2 s, against calling the same psutil (and NVML, where there is a GPU) functions in a bare
loop, in the same run. Goal: under 1% of one core at 2 s, i.e. under 20 ms of CPU a sample.

- engine: `engine.system.system_job.SystemJob.tick` on a real `Store` in a temporary home, made due at each
  call: the sample, its store writes (raw rows, rollups, the newest sample, the node's last_seen) and the
  settings check, on a store already holding what the engine keeps of a node (6 hours and 10 minutes of
  samples at 2 s, written first through the same writer); the thinning the job runs every 10 minutes (every
  300 samples at 2 s), which then removes 10 minutes of them, is measured on the same store and added per
  sample;
- bare: the sampler's own calls, nothing stored: `cpu_percent(percpu=True)`, `getloadavg`, `virtual_memory`,
  `swap_memory`, `net_io_counters`, `disk_usage` of the same mount, and NVML's reads of every GPU when NVML
  starts (`Nvml.read`).

    python bench/bench_system.py [--samples 600]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.store import Store  # noqa: E402
from engine.store.system import RAW_KEEP_S  # noqa: E402
from engine.system.nvml import Nvml  # noqa: E402
from engine.system.sampler import mount_of  # noqa: E402
from engine.system.system_job import THIN_EVERY_S, SystemJob  # noqa: E402

INTERVAL_S = 2.0  # the default [system] interval_s
GOAL_CORE_SHARE = 0.01  # of one core


def engine_ticks(home: Path, samples: int) -> tuple[list[float], list[float], float, int]:
    """CPU and wall seconds of each due tick, CPU seconds of one thinning of what they stored, GPUs seen."""
    cpu, wall = [], []
    with Store(home / "carl.db") as store:
        job = SystemJob(store, home)
        job.tick()  # the first: opens NVML, makes the node, primes psutil's CPU counters
        prefill(store, job)
        for _ in range(samples):
            job.next_sample = 0.0  # due now: what the engine's loop finds every 2 s
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            job.tick()
            cpu.append(time.process_time() - started_cpu)
            wall.append(time.perf_counter() - started_wall)
        started = time.process_time()
        store.system.thin()
        thin = time.process_time() - started
        gpus = job.sampler.nvml.count if job.sampler is not None else 0
        job.close()
    return cpu, wall, thin, gpus


def prefill(store: Store, job: SystemJob) -> None:
    """What a node has after a day at 2 s that the job thins back: RAW_KEEP_S and THIN_EVERY_S of samples (the
    keys of a real sample of this machine), the newest one 2 s ago."""
    assert job.sampler is not None
    sample = job.sampler.sample()
    scalars, whole = sample.scalars(), sample.to_json()
    count = int((RAW_KEEP_S + THIN_EVERY_S) / INTERVAL_S)
    now = time.time()
    with store.transaction():  # one transaction: the rows, not a day of commits, are what is wanted here
        for i in range(count):
            t = now - INTERVAL_S * (count - i)
            store.system.add_sample(job.node(), t, scalars, {**whole, "t": t})


def bare_calls(home: Path, samples: int) -> list[float]:
    """CPU seconds of the sampler's own psutil and NVML calls, nothing stored."""
    mount = str(mount_of(home))
    nvml = Nvml().open()
    psutil.cpu_percent(percpu=True)
    cpu = []
    for _ in range(samples):
        started = time.process_time()
        psutil.cpu_percent(percpu=True)
        psutil.getloadavg()
        psutil.virtual_memory()
        psutil.swap_memory()
        psutil.net_io_counters()
        psutil.disk_usage(mount)
        nvml.read()
        cpu.append(time.process_time() - started)
    nvml.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        bare = bare_calls(home, args.samples)
        cpu, wall, thin, gpus = engine_ticks(home, args.samples)
        bare = bare + bare_calls(home, args.samples)  # before and after: the machine's load drifts
    per_sample = statistics.mean(cpu) + thin / (THIN_EVERY_S / INTERVAL_S)
    bare_per_sample = statistics.mean(bare)
    share = per_sample / INTERVAL_S
    print(f"gpus_seen_by_nvml={gpus} samples={args.samples} interval_s={INTERVAL_S:g}")
    print(
        f"engine_cpu_ms_per_sample={per_sample * 1000:.2f} (tick {statistics.mean(cpu) * 1000:.2f},"
        f" p95 {sorted(cpu)[int(0.95 * len(cpu))] * 1000:.2f}; thinning {thin * 1000:.1f} ms every"
        f" {THIN_EVERY_S / INTERVAL_S:.0f} samples) wall_ms_per_sample={statistics.mean(wall) * 1000:.2f}"
    )
    print(
        f"engine_cpu_s_per_hour={per_sample * 3600 / INTERVAL_S:.1f} share_of_one_core={share:.3%}"
        f" goal<{GOAL_CORE_SHARE:.0%} {'OK' if share < GOAL_CORE_SHARE else 'MISSED'}"
    )
    print(
        f"baseline_bare_psutil_nvml_cpu_ms_per_sample={bare_per_sample * 1000:.2f}"
        f" baseline_cpu_s_per_hour={bare_per_sample * 3600 / INTERVAL_S:.1f}"
        f" ratio={per_sample / bare_per_sample:.2f}"
    )


if __name__ == "__main__":
    main()
