"""The box: this machine and the other nodes of a run (CPU, memory, disks, network, NVIDIA GPUs), the
processes of each run, and its console. The engine samples (system_job.py) and stores
(engine/store/system.py); `carl node` publishes another machine's samples over NATS. docs/guide/system.md is
the user's page."""

from .readings import BadSample, DiskReading, GpuProcess, GpuReading, Sample, from_json
from .sampler import Sampler
from .system_job import SystemJob

__all__ = [
    "BadSample",
    "DiskReading",
    "GpuProcess",
    "GpuReading",
    "Sample",
    "Sampler",
    "SystemJob",
    "from_json",
]
