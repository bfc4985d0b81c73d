"""What the System screen reads, on one thread: no Textual here, so tests and benches drive it alone.

`SystemFeed.poll()` looks at `PRAGMA data_version` and, when the box moved (a sample, a node, a process:
`SystemReads.signature`) or the user asked for another window, reads for every node the series its charts draw
over the window (raw samples, or minute or quarter-hour rollups: at most `max_points` a series), the selected
run's steps over the same wall times (bounded, `SystemReads.run_steps`) and the run's processes. A window ends
at the newest sample, so the charts follow the box while it is sampled and stay put when it is not. Requests
(another window, another width) come through a queue that each poll drains first, as the control room's
watcher does (carl_tui/model.py).
"""

from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store import StoreReader
from engine.store.system_reads import TimeSeries

WINDOWS = (15 * 60.0, 3600.0, 6 * 3600.0, 86400.0)  # the windows `[` `]` step through: 15 min to a day
DEFAULT_WINDOW = 0  # 15 minutes: raw samples at 2 s
KEYS_RECHECK_S = 30.0  # a node's keys (a new disk, a GPU) are looked up again this often
MAX_POINTS = 400  # a chart is at most ~200 columns of 2 dots: more points draw nothing more
GPU_KEY = re.compile(r"^gpu/(?P<index>\d+)/(?P<what>[a-z_]+)$")


@dataclass(frozen=True)
class ChartSpec:
    """One chart of a node: its title, unit, the keys drawn as its lines (with each line's name), a fixed
    range when it has one, and the factor its values are divided by (bytes to GiB)."""

    kind: str
    title: str
    unit: str
    keys: tuple[str, ...]
    names: tuple[str, ...]
    y_range: tuple[float, float] | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class NodeSeries:
    node: dict[str, Any]  # its row of `nodes`
    charts: list[ChartSpec]
    series: dict[str, TimeSeries]  # by key
    sample: dict[str, Any] | None = None  # its newest whole sample


@dataclass(frozen=True)
class SystemNews:
    since: float
    until: float
    window: float
    nodes: list[NodeSeries]
    steps: list[tuple[int, float]] = field(default_factory=list)  # the run's (step, wall time) in the window
    processes: list[dict[str, Any]] = field(default_factory=list)


def chart_specs(keys: list[str]) -> list[ChartSpec]:
    """The charts of a node, from the series it has (engine/system/readings.py `Sample.scalars`)."""
    have = set(keys)
    specs: list[ChartSpec] = []
    cpu = tuple(k for k in ("cpu/percent", "cpu/busiest_core") if k in have)
    if cpu:
        specs.append(
            ChartSpec("cpu", "CPU", "%", cpu, ("all cores", "busiest core")[: len(cpu)], (0.0, 100.0))
        )
    memory = tuple(k for k in ("mem/used", "swap/used") if k in have)
    if memory:
        specs.append(
            ChartSpec("mem", "memory", "GiB", memory, ("RAM used", "swap used")[: len(memory)], None, 2**30)
        )
    disks = tuple(sorted(k for k in keys if k.startswith("disk/free:")))
    if disks:
        names = tuple(k.removeprefix("disk/free:") for k in disks)
        specs.append(ChartSpec("disk", "disk free", "GiB", disks, names, None, 2**30))
    net = tuple(k for k in ("net/recv_Bps", "net/sent_Bps") if k in have)
    if net:
        specs.append(ChartSpec("net", "network", "MiB/s", net, ("received", "sent")[: len(net)], None, 2**20))
    gpus = sorted({int(m["index"]) for k in keys if (m := GPU_KEY.match(k))})
    for what, title, unit, y_range, scale in (
        ("util", "GPU utilisation", "%", (0.0, 100.0), 1.0),
        ("mem_used", "GPU memory", "GiB", None, 2**30),
        ("power_w", "GPU power", "W", None, 1.0),
        ("temp_c", "GPU temperature", "°C", None, 1.0),
    ):
        lines = tuple(f"gpu/{i}/{what}" for i in gpus if f"gpu/{i}/{what}" in have)
        if lines:
            names = tuple(f"gpu{k.split('/')[1]}" for k in lines)
            specs.append(ChartSpec(f"gpu-{what}", title, unit, lines, names, y_range, scale))
    return specs


class SystemFeed:
    """Reads the box for the System screen. `set_window` is for any thread; `poll` and `close` for the reader
    thread alone."""

    def __init__(
        self, db_path: Path, run_id: int | None, *, period: float = 0.25, max_points: int = MAX_POINTS
    ) -> None:
        self.db_path = db_path
        self.run_id = run_id
        self.period = period
        self.max_points = max_points
        self.requests: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.reader: StoreReader | None = None
        self.window = WINDOWS[DEFAULT_WINDOW]
        self.reads = 0  # full reads so far (a test checks an idle store is not read again)
        self._version = -1
        self._signature: tuple[Any, ...] | None = None
        self._asked = True  # the first poll reads
        self._keys: dict[int, tuple[float, list[str]]] = {}  # node id -> (when read, its keys)

    # -- requests, from any thread --------------------------------------------------------------------------

    def set_window(self, seconds: float) -> None:
        self.requests.put(("window", float(seconds)))

    # -- the reader thread ----------------------------------------------------------------------------------

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def poll(self) -> SystemNews | None:
        """News when the box moved or another window was asked for; None otherwise."""
        while True:
            try:
                kind, value = self.requests.get_nowait()
            except queue.Empty:
                break
            if kind == "window" and value != self.window:
                self.window, self._asked = value, True
        if self.reader is None:
            if not self.db_path.exists():
                return None
            self.reader = StoreReader(self.db_path)
        reader = self.reader
        version = reader.data_version()
        if version == self._version and not self._asked:
            return None
        self._version = version
        signature = reader.system.signature()
        if signature == self._signature and not self._asked:
            return None
        self._signature, self._asked = signature, False
        return self._read(reader)

    def _read(self, reader: StoreReader) -> SystemNews:
        self.reads += 1
        system = reader.system
        samples = system.now()
        nodes = system.nodes()
        newest = max((float(s.get("t") or 0.0) for s in samples.values()), default=0.0)
        until = newest or time.time()
        since = until - self.window
        out = []
        for node in nodes:
            keys = self._node_keys(reader, node["id"])
            specs = chart_specs(keys)
            wanted = {key for spec in specs for key in spec.keys}
            series = {
                key: system.series(node["id"], key, since, until, max_points=self.max_points)
                for key in sorted(wanted)
            }
            out.append(NodeSeries(node, specs, series, samples.get(node["id"])))
        steps: list[tuple[int, float]] = []
        processes: list[dict[str, Any]] = []
        if self.run_id is not None:
            steps = system.run_steps(self.run_id, since, until, max_points=self.max_points)
            processes = system.run_processes(self.run_id)
        return SystemNews(since, until, self.window, out, steps, processes)

    def _node_keys(self, reader: StoreReader, node_id: int) -> list[str]:
        known = self._keys.get(node_id)
        now = time.monotonic()
        if known is None or now - known[0] > KEYS_RECHECK_S:
            known = (now, reader.system.keys(node_id))
            self._keys[node_id] = known
        return known[1]
