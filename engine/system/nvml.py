"""NVIDIA GPUs through NVML (`nvidia-ml-py`, NVIDIA's own bindings, imported as `pynvml`).

`Nvml.open()` initialises the library once; without the package, the driver's library or a GPU it says so in
one line (`note`) and reads nothing, so the rest of the sampler goes on. Each GPU is read call by call: a call
the GPU does not support (power on some boards, ECC on consumer cards) leaves that field empty, and a GPU that
stops answering (fallen off the bus: NVML_ERROR_GPU_IS_LOST) is reported lost with NVML's error while the
other GPUs are still read. XID errors arrive as NVML events, drained without waiting at each sample.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from .readings import GpuProcess, GpuReading

log = logging.getLogger("carl.system")

# NVML's clock event ("throttle") reasons worth a word; idle, application clocks and sync boost are normal.
THROTTLE_WORDS = {
    "nvmlClocksEventReasonSwPowerCap": "power cap",
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonSwThermalSlowdown": "thermal (software)",
    "nvmlClocksEventReasonHwThermalSlowdown": "thermal (hardware)",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake",
}


class Nvml:
    """The NVIDIA GPUs of this machine (none when NVML cannot be used; `note` says why)."""

    def __init__(self) -> None:
        self.nv: Any = None  # the pynvml module once initialised
        self.handles: list[Any] = []
        self.names: list[str] = []
        self.uuids: list[str] = []
        self.note: str | None = None
        self.events: Any = None  # the XID event set
        self.xids: dict[int, int] = {}  # GPU index -> XID errors seen
        self.last_xid: dict[int, int] = {}
        self.lost: dict[int, str] = {}  # GPU index -> the error that lost it
        self._reasons: list[tuple[int, str]] = []

    def open(self) -> Nvml:
        try:
            import pynvml as nv
        except ImportError:
            self.note = "no NVIDIA GPU: nvidia-ml-py is not installed (pip install 'carl-tui[gpu]')"
            return self
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self.note = f"no NVIDIA GPU: {_why(nv, exc)}"
            return self
        except OSError as exc:  # a broken driver library
            self.note = f"no NVIDIA GPU: NVML cannot be loaded ({exc})"
            return self
        self.nv = nv
        try:
            count = nv.nvmlDeviceGetCount()
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nv.NVMLError as exc:
            self.note = f"NVML found no usable GPU: {exc}"
            self.handles = []
        if not self.handles and self.note is None:
            self.note = "no NVIDIA GPU: NVML found none"
        self.names = [_text(self._call(h, "nvmlDeviceGetName") or "") for h in self.handles]
        self.uuids = [_text(self._call(h, "nvmlDeviceGetUUID") or "") for h in self.handles]
        self._reasons = [
            (getattr(nv, name), word) for name, word in THROTTLE_WORDS.items() if hasattr(nv, name)
        ]
        self._watch_xids()
        return self

    def close(self) -> None:
        if self.nv is None:
            return
        try:
            if self.events is not None:
                self.nv.nvmlEventSetFree(self.events)
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass
        self.nv = None

    @property
    def count(self) -> int:
        return len(self.handles)

    def read(self) -> list[GpuReading]:
        """Every GPU now; a lost one carries its error and nothing else."""
        if self.nv is None:
            return []
        self._drain_xids()
        return [self._read_one(i, handle) for i, handle in enumerate(self.handles)]

    # -- one GPU --------------------------------------------------------------------------------------------

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        nv = self.nv
        gpu = GpuReading(index, self.names[index], self.uuids[index])
        gpu.xid, gpu.last_xid = self.xids.get(index, 0), self.last_xid.get(index)
        if index in self.lost:
            gpu.error = self.lost[index]
            return gpu
        try:
            rates = nv.nvmlDeviceGetUtilizationRates(handle)
            gpu.util, gpu.mem_util = float(rates.gpu), float(rates.memory)
        except nv.NVMLError as exc:
            if self._lost(index, exc):
                gpu.error = self.lost[index]
                return gpu
        memory = self._call(handle, "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            gpu.mem_used, gpu.mem_total = float(memory.used), float(memory.total)
        power = self._call(handle, "nvmlDeviceGetPowerUsage")
        gpu.power_w = power / 1000.0 if power is not None else None
        limit = self._call(handle, "nvmlDeviceGetEnforcedPowerLimit")
        gpu.power_limit_w = limit / 1000.0 if limit is not None else None
        temp = self._call(handle, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
        gpu.temp_c = float(temp) if temp is not None else None
        clock = self._call(handle, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)
        gpu.sm_clock_mhz = float(clock) if clock is not None else None
        reasons_call = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        mask = self._call(handle, reasons_call)
        if mask is not None:
            gpu.throttle = int(mask)
            gpu.throttle_reasons = [word for bit, word in self._reasons if mask & bit]
        gpu.ecc_uncorrected = self._call(
            handle, "nvmlDeviceGetTotalEccErrors", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        )
        running = self._call(handle, "nvmlDeviceGetComputeRunningProcesses") or []
        gpu.processes = [GpuProcess(int(p.pid), _bytes(getattr(p, "usedGpuMemory", None))) for p in running]
        return gpu

    def _call(self, handle: Any, name: str, *args: Any) -> Any:
        """One NVML call; None when this GPU or driver does not support it (or the GPU is lost)."""
        nv = self.nv
        try:
            return getattr(nv, name)(handle, *args)
        except nv.NVMLError:
            return None
        except AttributeError:  # an older nvidia-ml-py without this call
            return None

    def _lost(self, index: int, exc: Exception) -> bool:
        nv = self.nv
        if isinstance(exc, nv.NVMLError_GpuIsLost) or "lost" in str(exc).lower():
            self.lost[index] = f"GPU {index} lost: {exc}"
            log.error("%s", self.lost[index])
            return True
        return False

    # -- XID errors -----------------------------------------------------------------------------------------

    def _watch_xids(self) -> None:
        nv = self.nv
        try:
            self.events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return
        for handle in self.handles:
            # Not supported on some boards and under MIG: XIDs go unseen there (docs/guide/system.md).
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self.events)

    def _drain_xids(self) -> None:
        if self.events is None:
            return
        nv = self.nv
        for _ in range(64):  # at most this many per sample
            try:
                data = nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: none waiting
                return
            index = self._index_of(data.device)
            if index is not None:
                self.xids[index] = self.xids.get(index, 0) + 1
                self.last_xid[index] = int(data.eventData)
                log.error("GPU %d: XID %d", index, int(data.eventData))

    def _index_of(self, handle: Any) -> int | None:
        try:
            return int(self.nv.nvmlDeviceGetIndex(handle))
        except self.nv.NVMLError:
            return None


def _why(nv: Any, exc: Exception) -> str:
    if isinstance(exc, nv.NVMLError_LibraryNotFound):
        return "NVML not found (no NVIDIA driver here)"
    if isinstance(exc, nv.NVMLError_DriverNotLoaded):
        return "the NVIDIA driver is not loaded"
    if isinstance(exc, nv.NVMLError_NoPermission):
        return "no permission to use NVML"
    return f"NVML cannot start ({exc})"


def _bytes(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value >= 0 else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
