"""NVML's failures, which this machine (no NVIDIA driver) cannot produce: a GPU that falls off the bus
mid-run, calls a board does not support, an XID event. NVML itself is replaced by a stand-in `pynvml` module
that answers with the same calls, errors and structures as nvidia-ml-py's (the project's own code is what
runs); the real NVML is checked on a GPU machine by bench/gpu_check.sh."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import until

from carl_tui.app import ControlRoom
from engine.store import Store
from engine.system import Sampler
from engine.system.nvml import Nvml
from widgets.system_pane import SystemPane

GIB = 1024**3


def stand_in_nvml() -> types.ModuleType:
    """Two GPUs; GPU 0 falls off the bus at its third read; GPU 1 has no power reading and reports XID 79
    once."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_GpuIsLost(NVMLError):  # noqa: N801 - nvidia-ml-py's name
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801
        pass

    class NVMLError_Timeout(NVMLError):  # noqa: N801
        pass

    nv.NVMLError, nv.NVMLError_GpuIsLost = NVMLError, NVMLError_GpuIsLost
    nv.NVMLError_NotSupported, nv.NVMLError_Timeout = NVMLError_NotSupported, NVMLError_Timeout
    nv.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (NVMLError,), {})
    nv.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})
    nv.NVMLError_NoPermission = type("NVMLError_NoPermission", (NVMLError,), {})
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM = 0, 1
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC = 1, 0
    nv.nvmlEventTypeXidCriticalError = 8
    nv.nvmlClocksEventReasonSwPowerCap = 0x4
    nv.nvmlClocksEventReasonHwThermalSlowdown = 0x40
    reads = {0: 0, 1: 0}
    xids = [(1, 79)]

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    nv.nvmlDeviceGetIndex = lambda handle: int(handle[-1])
    nv.nvmlDeviceGetName = lambda handle: "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle}"

    def utilization(handle: str) -> Any:
        index = int(handle[-1])
        reads[index] += 1
        if index == 0 and reads[0] >= 3:
            raise NVMLError_GpuIsLost("GPU is lost")
        return types.SimpleNamespace(gpu=97, memory=40)

    def power(handle: str) -> int:
        if handle == "gpu1":
            raise NVMLError_NotSupported("Not Supported")
        return 650_000

    def event_wait(event_set: Any, timeout_ms: int) -> Any:
        if not xids:
            raise NVMLError_Timeout("Timeout")
        index, xid = xids.pop()
        return types.SimpleNamespace(device=f"gpu{index}", eventData=xid)

    nv.nvmlDeviceGetUtilizationRates = utilization
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=70 * GIB, total=80 * GIB)
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 71
    nv.nvmlDeviceGetClockInfo = lambda h, clock: 1980
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=4242, usedGpuMemory=60 * GIB)
    ]
    nv.nvmlEventSetCreate = lambda: object()
    nv.nvmlEventSetFree = lambda event_set: None
    nv.nvmlDeviceRegisterEvents = lambda handle, kinds, event_set: None
    nv.nvmlEventSetWait_v2 = event_wait
    return nv


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Nvml]:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", stand_in_nvml())
    opened = Nvml().open()
    yield opened
    opened.close()


def test_a_gpu_that_falls_off_the_bus_is_shown_lost_with_nvmls_error_and_the_rest_goes_on(nvml: Nvml) -> None:
    assert nvml.note is None and nvml.count == 2
    sampler = Sampler(nvml)
    first = sampler.sample()
    gpu0, gpu1 = first.gpus
    assert gpu0.util == 97.0 and gpu0.mem_fraction == pytest.approx(70 / 80) and gpu0.power_w == 650.0
    assert gpu0.throttle_reasons == ["power cap"] and gpu0.processes[0].pid == 4242
    assert gpu1.power_w is None  # not supported on that board: that field empty, the rest read
    assert (gpu1.xid, gpu1.last_xid) == (1, 79)  # the XID event drained at the sample
    sampler.sample()
    lost = sampler.sample()  # GPU 0's third read: fallen off the bus
    assert lost.gpus[0].error == "GPU 0 lost: GPU is lost" and lost.gpus[0].util is None
    assert lost.gpus[1].util == 97.0 and lost.cpu is not None  # the other GPU and the machine still sampled
    scalars = lost.scalars()
    assert "gpu/0/util" not in scalars and scalars["gpu/1/util"] == 97.0 and scalars["gpu/1/xid"] == 1.0
    assert sampler.sample().gpus[0].error == "GPU 0 lost: GPU is lost"  # stays lost: never read again


async def test_the_system_pane_shows_a_lost_gpu_in_one_line(nvml: Nvml, tmp_path: Path) -> None:
    sampler = Sampler(nvml)
    for _ in range(3):
        sample = sampler.sample()
    with Store(tmp_path / "carl.db") as store:
        node = store.system.node("gpu-box", host="gpu-box", via="local")
        store.system.add_sample(node, sample.t, sample.scalars(), sample.to_json())
    app = ControlRoom(tmp_path, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        pane = app.query_one(SystemPane)
        await pilot.press("5")  # maximized: every GPU's line

        def lines() -> list[str]:
            return [pane.render_line(y).text for y in range(pane.size.height)]

        await until(pilot, lambda: any("GPU 0 lost: GPU is lost" in line for line in lines()))
        assert any("97%" in line for line in lines())  # GPU 1, still read
