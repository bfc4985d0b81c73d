"""Sampling this machine: CPU, memory, swap, load, disks and network through psutil, NVIDIA GPUs through NVML.

A `Sampler` is made once and asked for a `Sample` at each interval. CPU percentages are psutil's since the
previous call (the first call primes them), network bytes/s are the counters' difference over the time between
two samples. Disks are the file systems that hold the watched paths ($CARL_HOME and every run's directory),
each once, with the space an unprivileged user may still write. On Apple silicon psutil gives CPU and the
unified memory; the GPU's utilisation needs root (powermetrics), so it is not sampled (docs/guide/system.md).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from .nvml import Nvml
from .readings import DiskReading, Sample

MOUNTS_RECHECK_S = 300.0  # which file system holds a watched path is looked up again this often
APPLE_NOTE = (
    "Apple GPU: its utilisation needs root (powermetrics), not sampled; MLX runs log their own memory"
)


def mount_of(path: Path) -> Path | None:
    """The mount point holding `path` (its nearest existing ancestor's); None when nothing of it exists."""
    try:
        current = path.expanduser().resolve()
    except (OSError, RuntimeError):
        return None
    while not current.exists():
        if current.parent == current:
            return None
        current = current.parent
    while not os.path.ismount(current) and current.parent != current:
        current = current.parent
    return current


@dataclass
class _Mounts:
    by_path: dict[str, Path | None]
    at: float


class Sampler:
    """Samples this machine; `nvml` may be given (tests, a node that shares one)."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml if nvml is not None else Nvml().open()
        self.watched: list[str] = []
        self._mounts = _Mounts({}, 0.0)
        self._net: tuple[float, int, int] | None = None
        psutil.cpu_percent(percpu=True)  # primes the counters: the next call measures from here
        self.apple = sys.platform == "darwin" and platform.machine() == "arm64"

    def close(self) -> None:
        self.nvml.close()

    def watch(self, paths: Iterable[str | Path]) -> None:
        """The paths whose file systems' free space is sampled."""
        wanted = sorted({str(p) for p in paths if p})
        if wanted != self.watched:
            self.watched = wanted
            self._mounts.at = 0.0

    @property
    def note(self) -> str | None:
        return self.nvml.note

    def sample(self) -> Sample:
        now = time.time()
        cores = psutil.cpu_percent(percpu=True)
        sample = Sample(t=now, cores=[float(c) for c in cores])
        sample.cpu = sum(cores) / len(cores) if cores else None
        with contextlib.suppress(OSError):
            sample.load = [float(x) for x in psutil.getloadavg()]
        memory = psutil.virtual_memory()
        sample.mem_total, sample.mem_used = float(memory.total), float(memory.total - memory.available)
        swap = psutil.swap_memory()
        sample.swap_total, sample.swap_used = float(swap.total), float(swap.used)
        self._network(sample)
        sample.disks = self._disks()
        sample.gpus = self.nvml.read()
        if self.nvml.note:
            sample.notes.append(self.nvml.note)
        if self.apple:
            sample.notes.append(APPLE_NOTE)
        return sample

    def _network(self, sample: Sample) -> None:
        counters = psutil.net_io_counters()
        if counters is None:
            return
        previous = self._net
        self._net = (sample.t, counters.bytes_recv, counters.bytes_sent)
        if previous is None or sample.t <= previous[0]:
            return
        span = sample.t - previous[0]
        sample.net_recv = max(0, counters.bytes_recv - previous[1]) / span
        sample.net_sent = max(0, counters.bytes_sent - previous[2]) / span

    def _disks(self) -> list[DiskReading]:
        if time.monotonic() - self._mounts.at > MOUNTS_RECHECK_S or set(self._mounts.by_path) != set(
            self.watched
        ):
            self._mounts = _Mounts({p: mount_of(Path(p)) for p in self.watched}, time.monotonic())
        by_mount: dict[Path, list[str]] = {}
        for path, mount in self._mounts.by_path.items():
            if mount is not None:
                by_mount.setdefault(mount, []).append(path)
        disks = []
        for mount, paths in sorted(by_mount.items()):
            try:
                usage = psutil.disk_usage(str(mount))
            except OSError:  # unmounted since, or not readable: left out of this sample
                continue
            disks.append(DiskReading(str(mount), float(usage.total), float(usage.free), sorted(paths)))
        return disks
