"""The box's health rules on stored samples: GPU readings written through the store's own API
(`store.system.add_sample`, as the engine's sampler and a `carl node` write them; there is no GPU here), a
run and its processes, and each rule's flag with its threshold: GPUs idle, GPU memory full, the disk the run
writes on filling, XID errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.coherence.analysis import analyze_run
from engine.store import SCHEMA_VERSION, ProcessRow, Store
from engine.store.system_reads import SystemReads
from engine.system import DiskReading, GpuReading, Sample
from engine.system.box_health import (
    DISK_FREE_RED_BYTES,
    GPU_IDLE_S,
    GPU_IDLE_UTIL,
    GPU_MEMORY_HOLD_S,
    GiB,
    box_flags,
)

EVERY = 10.0  # seconds between the stored samples
NOW = time.time()


class Box:
    """A node with GPUs, a running run writing in `run_dir`, and its runner holding `gpus`."""

    def __init__(
        self, store: Store, run_dir: Path, *, gpus: list[int] | None = (0,), age: float = 3600.0
    ) -> None:
        self.store = store
        self.run_dir = str(run_dir)
        self.node = store.system.node("gpu-box", host="gpu-box", via="local")
        self.run_id = store.create_run("r", source_kind="carl", status="running")
        store.update_run(self.run_id, output_dir=self.run_dir, last_step=40, last_update=NOW)
        runner = ProcessRow(4242, NOW - age, "runner", "running", "python -m engine.training", gpus=gpus)
        store.system.note_processes(self.run_id, self.node, [runner])

    def feed(
        self,
        since: float,
        until: float = NOW,
        *,
        util: tuple[float, float] = (90.0, 90.0),
        mem: float = 0.5,
        xid: int = 0,
        free: float = 500 * GiB,
    ) -> None:
        """Samples every EVERY seconds: GPUs 0 and 1 at `util` percent, GPU 0's memory `mem` full."""
        t = since
        while t <= until:
            gpus = [
                GpuReading(
                    0, util=util[0], mem_used=mem * 80 * GiB, mem_total=80 * GiB, xid=xid, last_xid=79
                ),
                GpuReading(1, util=util[1], mem_used=1 * GiB, mem_total=80 * GiB),
            ]
            disk = DiskReading("/data", 1000 * GiB, free, paths=[self.run_dir])
            sample = Sample(t=t, cpu=10.0, gpus=gpus, disks=[disk])
            self.store.system.add_sample(self.node, t, sample.scalars(), sample.to_json())
            t += EVERY

    def flags(self, status: str = "running", now: float = NOW) -> dict[str, tuple[str, str]]:
        flags = box_flags(SystemReads(self.store.conn, SCHEMA_VERSION), self.run_id, status, now)
        return {f.cause: (f.level, f.reason) for f in flags}


@pytest.fixture
def box(store: Store, tmp_path: Path) -> Box:
    return Box(store, tmp_path / "run")


def test_gpus_idle_for_five_minutes_while_the_run_is_running(box: Box) -> None:
    box.feed(NOW - GPU_IDLE_S - 60, util=(GPU_IDLE_UTIL - 1, 90.0))
    reason = "GPU 0 idle (under 5% for 5 min) while the run is running"
    assert box.flags() == {"gpu_idle": ("yellow", reason)}  # GPU 1 is busy, and not the run's
    assert box.flags(status="paused") == {}  # a paused run's GPUs wait on purpose
    assert box.flags(now=NOW + 200) == {}  # the newest sample is stale: nothing said of now


def test_gpus_busy_within_the_five_minutes_are_not_idle(box: Box) -> None:
    box.feed(NOW - GPU_IDLE_S - 60, NOW - 200, util=(90.0, 90.0))
    box.feed(NOW - 190, util=(0.0, 0.0))  # idle for three minutes only
    assert box.flags() == {}


def test_a_young_run_is_not_judged_idle(store: Store, tmp_path: Path) -> None:
    box = Box(store, tmp_path / "run", age=60.0)  # still loading its model
    box.feed(NOW - GPU_IDLE_S - 60, util=(0.0, 0.0))
    assert box.flags() == {}


def test_gpus_of_a_run_not_known_are_all_the_nodes_and_idle_only_when_all_are(
    store: Store, tmp_path: Path
) -> None:
    box = Box(store, tmp_path / "run", gpus=None)  # NVML does not list its processes (a container)
    box.feed(NOW - GPU_IDLE_S - 60, NOW - GPU_IDLE_S + 60, util=(0.0, 90.0))
    box.feed(NOW - GPU_IDLE_S + 70, util=(0.0, 90.0))
    assert box.flags() == {}  # GPU 1 works: it may be the run's
    box.store.conn.execute("DELETE FROM system_samples")
    box.store.conn.execute("DELETE FROM system_rollups")
    box.feed(NOW - GPU_IDLE_S - 60, util=(0.0, 1.0))
    assert box.flags()["gpu_idle"][1].startswith("GPUs 0 and 1 idle")


def test_gpu_memory_full_for_a_minute_is_an_out_of_memory_near(box: Box) -> None:
    box.feed(NOW - 600, NOW - GPU_MEMORY_HOLD_S - 20, mem=0.9)
    box.feed(NOW, mem=0.995)  # one peak: not yet
    assert "gpu_memory" not in box.flags()
    box.feed(NOW - GPU_MEMORY_HOLD_S - 10, NOW - 10, mem=0.995)
    level, reason = box.flags()["gpu_memory"]
    assert level == "yellow"
    assert reason == "GPU 0 memory 99.5% full (79.6 of 80.0 GiB) for 60 s: an out-of-memory is near"


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        (DISK_FREE_RED_BYTES - GiB, ("red", "disk /data where the run writes has 1.0 GiB free (0.1%)")),
        (40 * GiB, ("yellow", "disk /data where the run writes has 40.0 GiB free (4.0%)")),
        (60 * GiB, None),
    ],
)
def test_the_disk_the_run_writes_on_filling(box: Box, free: float, expected: tuple[str, str] | None) -> None:
    box.feed(NOW - 30, free=free)
    flag = box.flags().get("disk_full")
    if expected is None:
        assert flag is None
    else:
        assert flag is not None and flag[0] == expected[0]
        assert flag[1] == expected[1] + ": checkpoints and logs fail to be written when it is full"
    assert box.flags(status="finished") == {}  # a run that ended writes no more


def test_an_xid_during_the_run_and_not_one_from_before(store: Store, tmp_path: Path) -> None:
    box = Box(store, tmp_path / "run", age=600.0)
    box.feed(NOW - 1200, NOW - 300, xid=2)  # two XIDs before the run started, the counter holds them
    assert box.flags(now=NOW - 300) == {}
    box.feed(NOW - 290, xid=3)
    assert box.flags()["xid"] == (
        "red",
        "XID error (XID 79) on GPU 0 during the run: the driver reported a GPU fault",
    )
    box.store.update_run(box.run_id, status="failed", ended_at=NOW)
    assert box.flags(status="failed")["xid"][0] == "red"  # still the reason after the run failed


def test_a_node_without_gpus_says_nothing_of_gpus(store: Store, tmp_path: Path) -> None:
    box = Box(store, tmp_path / "run")
    t = NOW - GPU_IDLE_S - 60
    while t <= NOW:
        sample = Sample(t=t, cpu=1.0, disks=[DiskReading("/data", 1000 * GiB, 500 * GiB, [box.run_dir])])
        store.system.add_sample(box.node, t, sample.scalars(), sample.to_json())
        t += EVERY
    assert box.flags() == {}


def test_the_runs_health_carries_the_box_reasons(store: Store, tmp_path: Path) -> None:
    box = Box(store, tmp_path / "run")
    now = time.time()
    box.feed(now - GPU_IDLE_S - 60, now, util=(0.0, 0.0), free=1 * GiB)
    # Written just now (NOW is when this module was imported, which a worker may have done long before): the
    # run is not silent, so its reasons are the box's alone.
    store.update_run(box.run_id, last_update=now)
    with store.transaction():
        health = analyze_run(store, box.run_id)
    assert health is not None and health.level == "red"
    assert set(health.alerting()) == {"gpu_idle", "disk_full"}  # each alerted on once, whatever its level
    reasons = json.loads(store.run(box.run_id)["health_reasons"])  # type: ignore[index]
    assert "GPU 0 idle (under 5% for 5 min) while the run is running" in reasons
    assert any(r.startswith("disk /data where the run writes has 1.0 GiB free") for r in reasons)
