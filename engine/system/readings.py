"""What one look at a machine gives: a `Sample` of its CPU, memory, swap, load, disks, network and GPUs.

A sample travels three ways: its scalars become time series in the store (`scalars()`), the whole of it is the
node's newest state (`to_json()`, what the System pane draws: per core, per GPU with its processes, the
notes), and a `carl node` on another machine publishes it over NATS. What comes from another machine is
hostile input: `from_json` checks every field (type, range, size) and says in one line what is wrong and
where, so the engine stores a rejected row, never a traceback (docs/guide/system.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.text import one_line, storable

MAX_CORES = 4096  # more cores than any machine has: a list longer than this is refused
MAX_GPUS = 64
MAX_GPU_PROCESSES = 512  # per GPU
MAX_DISKS = 64
MAX_NOTES = 16
MAX_TEXT = 200  # characters of a name, a mount point, a note
MAX_NUMBER = 2.0**63  # bytes, watts, percents: anything above is not a reading


class BadSample(ValueError):
    """A sample (from another node) that cannot be stored: the message names the field."""


@dataclass
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: the driver does not say (WDDM, some containers)


@dataclass
class GpuReading:
    index: int
    name: str = ""
    uuid: str = ""
    util: float | None = None  # percent of the last sample period a kernel ran
    mem_util: float | None = None  # percent of the period memory was read or written
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    throttle: int | None = None  # NVML's clock event reasons, a bit mask
    throttle_reasons: list[str] = field(default_factory=list)  # the bits that matter, in words
    xid: int = 0  # XID errors seen since the sampler started
    last_xid: int | None = None  # the newest XID's number
    ecc_uncorrected: int | None = None  # volatile, since the driver loaded
    processes: list[GpuProcess] = field(default_factory=list)
    error: str | None = None  # the GPU could not be read (fallen off the bus): NVML's error

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return self.mem_used / self.mem_total


@dataclass
class DiskReading:
    mount: str  # the mount point
    total: float
    free: float  # bytes free for an unprivileged user (what a run can still write)
    paths: list[str] = field(default_factory=list)  # the watched paths on it ($CARL_HOME, runs' directories)

    @property
    def free_fraction(self) -> float:
        return self.free / self.total if self.total else 0.0


@dataclass
class Sample:
    t: float  # wall time
    cpu: float | None = None  # percent of all cores
    cores: list[float] = field(default_factory=list)  # percent per core
    load: list[float] = field(default_factory=list)  # 1, 5, 15 min
    mem_used: float | None = None  # bytes (total - available)
    mem_total: float | None = None
    swap_used: float | None = None
    swap_total: float | None = None
    net_recv: float | None = None  # bytes/s since the previous sample
    net_sent: float | None = None
    disks: list[DiskReading] = field(default_factory=list)
    gpus: list[GpuReading] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each: "no NVIDIA GPU: NVML not found"

    def scalars(self) -> dict[str, float]:
        """The series a sample adds, by key (docs/guide/system.md lists them). Per-core CPU is not a series:
        the busiest core is (`cpu/busiest_core`), and the whole list lives in the node's newest sample."""
        out: dict[str, float | None] = {
            "cpu/percent": self.cpu,
            "cpu/busiest_core": max(self.cores) if self.cores else None,
            "load/1m": self.load[0] if self.load else None,
            "mem/used": self.mem_used,
            "mem/total": self.mem_total,
            "swap/used": self.swap_used,
            "net/recv_Bps": self.net_recv,
            "net/sent_Bps": self.net_sent,
        }
        for disk in self.disks:
            out[f"disk/free:{disk.mount}"] = disk.free
        for gpu in self.gpus:
            prefix = f"gpu/{gpu.index}/"
            out.update(
                {
                    prefix + "util": gpu.util,
                    prefix + "mem_used": gpu.mem_used,
                    prefix + "mem_total": gpu.mem_total,
                    prefix + "power_w": gpu.power_w,
                    prefix + "temp_c": gpu.temp_c,
                    prefix + "sm_clock_mhz": gpu.sm_clock_mhz,
                    prefix + "xid": float(gpu.xid) if gpu.error is None else None,
                }
            )
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- from another node: every field checked ----------------------------------------------------------------


def from_json(data: Any) -> Sample:
    """A sample as another node sent it; BadSample names the first field that is wrong."""
    if not isinstance(data, dict):
        raise BadSample(f"a sample is an object, not {type(data).__name__}")
    sample = Sample(t=_required_number(data, "t", low=0.0))
    sample.cpu = _number(data, "cpu", low=0.0, high=100.0 * MAX_CORES)
    sample.cores = _numbers(data, "cores", MAX_CORES, low=0.0, high=100.0)
    sample.load = _numbers(data, "load", 3, low=0.0)
    for name in ("mem_used", "mem_total", "swap_used", "swap_total", "net_recv", "net_sent"):
        setattr(sample, name, _number(data, name, low=0.0))
    sample.disks = [_disk(d, f"disks[{i}]") for i, d in enumerate(_list(data, "disks", MAX_DISKS))]
    sample.gpus = [_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(data, "gpus", MAX_GPUS))]
    sample.notes = [_text(n, f"notes[{i}]") for i, n in enumerate(_list(data, "notes", MAX_NOTES))]
    return sample


def _disk(data: Any, where: str) -> DiskReading:
    if not isinstance(data, dict):
        raise BadSample(f"{where}: expected an object")
    paths = [_text(p, f"{where}.paths[{i}]") for i, p in enumerate(_list(data, "paths", MAX_DISKS, where))]
    return DiskReading(
        mount=_text(data.get("mount"), f"{where}.mount"),
        total=_required_number(data, "total", low=0.0, where=where),
        free=_required_number(data, "free", low=0.0, where=where),
        paths=paths,
    )


def _gpu(data: Any, where: str) -> GpuReading:
    if not isinstance(data, dict):
        raise BadSample(f"{where}: expected an object")
    index = _integer(data, "index", where, high=MAX_GPUS)
    gpu = GpuReading(index=index if index is not None else -1)
    if gpu.index < 0:
        raise BadSample(f"{where}.index: missing")
    gpu.name = _text(data.get("name", ""), f"{where}.name")
    gpu.uuid = _text(data.get("uuid", ""), f"{where}.uuid")
    for name, high in (("util", 100.0), ("mem_util", 100.0), ("temp_c", 1000.0)):
        setattr(gpu, name, _number(data, name, low=0.0, high=high, where=where))
    for name in ("mem_used", "mem_total", "power_w", "power_limit_w", "sm_clock_mhz"):
        setattr(gpu, name, _number(data, name, low=0.0, where=where))
    gpu.throttle = _integer(data, "throttle", where)
    gpu.throttle_reasons = [
        _text(r, f"{where}.throttle_reasons[{i}]")
        for i, r in enumerate(_list(data, "throttle_reasons", 32, where))
    ]
    gpu.xid = _integer(data, "xid", where) or 0
    gpu.last_xid = _integer(data, "last_xid", where)
    gpu.ecc_uncorrected = _integer(data, "ecc_uncorrected", where)
    processes = _list(data, "processes", MAX_GPU_PROCESSES, where)
    gpu.processes = [_gpu_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)]
    error = data.get("error")
    gpu.error = None if error is None else _text(error, f"{where}.error")
    return gpu


def _gpu_process(data: Any, where: str) -> GpuProcess:
    if not isinstance(data, dict):
        raise BadSample(f"{where}: expected an object")
    pid = _integer(data, "pid", where, high=2**31)
    if pid is None:
        raise BadSample(f"{where}.pid: missing")
    return GpuProcess(pid, _integer(data, "used_bytes", where))


def _number(
    data: dict[str, Any],
    name: str,
    *,
    low: float | None = None,
    high: float = MAX_NUMBER,
    where: str = "",
) -> float | None:
    value = data.get(name)
    label = f"{where}.{name}" if where else name
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadSample(f"{label}: expected a number, got {one_line(repr(value), 40)}")
    if (low is not None and value < low) or value > high:
        raise BadSample(f"{label}: {value!r} is out of range")
    return float(value)


def _required_number(data: dict[str, Any], name: str, *, low: float, where: str = "") -> float:
    """A number a reading cannot do without: BadSample when it is missing, as when it is wrong."""
    value = _number(data, name, low=low, where=where)
    if value is None:
        raise BadSample(f"{where}.{name}: missing" if where else f"{name}: missing")
    return value


def _integer(data: dict[str, Any], name: str, where: str, *, high: int = 2**63 - 1) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise BadSample(f"{where}.{name}: expected a whole number from 0 to {high}")
    return value


def _numbers(
    data: dict[str, Any], name: str, most: int, *, low: float, high: float = MAX_NUMBER
) -> list[float]:
    values = _list(data, name, most)
    out = []
    for i, value in enumerate(values):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not low <= value <= high:
            raise BadSample(f"{name}[{i}]: expected a number from {low:g} to {high:g}")
        out.append(float(value))
    return out


def _list(data: dict[str, Any], name: str, most: int, where: str = "") -> list[Any]:
    value = data.get(name)
    label = f"{where}.{name}" if where else name
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadSample(f"{label}: expected a list")
    if len(value) > most:
        raise BadSample(f"{label}: {len(value):,} entries, at most {most:,}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadSample(f"{where}: expected text")
    if len(value) > MAX_TEXT:
        raise BadSample(f"{where}: {len(value):,} characters, at most {MAX_TEXT}")
    return storable(value)
