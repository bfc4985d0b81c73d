"""What the box says of a run's health: its processes, its console, the GPUs and disks it uses.

`box_flags` reads the store (engine/store/system_reads.py) and returns one `BoxFlag` per cause of
engine/coherence/health.py's BOX_CAUSES that holds; the run's analysis (engine/coherence/analysis.py) adds
them to the run's health, so each is a reason in the control room, in the analyst's answer and in an alert
(once per cause per run). Each rule reads one thing, and every threshold is a named constant with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from engine.faults import store_trouble
from engine.store.system_reads import SystemReads

log = logging.getLogger("carl.engine.system")


class BoxFlag(NamedTuple):
    level: str  # yellow | red
    cause: str  # one of engine/coherence/health.py BOX_CAUSES
    reason: str


BoxRule = Callable[[SystemReads, int, str, float], list[BoxFlag]]  # (reads, run id, its status, now)

GiB = 1024**3
LIVE = ("running", "paused")
# A node's newest sample older than this says nothing about now (sampling off, the node lost): its rules
# stay quiet rather than judge from what no longer holds.
SAMPLE_STALE_S = 120.0
# A condition held over a window when the sample in force at its start (at most this much older: the
# longest interval between samples worth judging, and the minute rollups' width) and every one after hold it.
COVER_SLACK_S = 60.0

# GPUs idle: every sample of the run's GPUs under GPU_IDLE_UTIL percent for GPU_IDLE_S while the run is
# running. Yellow: GPUs paid for and doing nothing (a stalled data pipeline, a hung collective, work left on
# the CPU) waste the run's time, but need not be a failure (a long evaluation on the CPU, a checkpoint).
GPU_IDLE_UTIL = 5.0
GPU_IDLE_S = 300.0
# GPU memory above GPU_MEMORY_FULL of a GPU the run uses, in every sample of GPU_MEMORY_HOLD_S. Yellow: an
# out-of-memory is near. The frameworks that reserve memory ahead take less on purpose (vLLM's
# gpu_memory_utilization defaults to 0.9), and the minute keeps a passing peak from flapping the flag.
GPU_MEMORY_FULL = 0.98
GPU_MEMORY_HOLD_S = 60.0
# The disk the run writes on: red under DISK_FREE_RED_BYTES (the next checkpoint or even a log line can fail
# to be written), yellow under DISK_FREE_YELLOW_FRACTION of its size (filling; the checkpoints of a large
# model take tens of GiB each).
DISK_FREE_RED_BYTES = 2 * GiB
DISK_FREE_YELLOW_FRACTION = 0.05
# XID errors on a GPU the run uses, during the run. Red: the driver reports a GPU fault (a kernel killed by
# an illegal access, memory errors, a GPU fallen off the bus); the run's processes on it rarely survive.
XID_BASELINE_S = 900.0  # how far before the run's start the XID counter's value is looked for


def _rank_died(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    """A process of the run died while the run was live: the first death of its current life (a process
    that started before the newest start of its runner or launcher belongs to an earlier life, before a
    resume)."""
    processes = reads.run_processes(run_id)
    starts = [p["started"] for p in processes if p["role"] in ("runner", "launcher")]
    life = max(starts) if starts else None
    deaths = sorted(
        (
            p
            for p in processes
            if p["died"] and p["ended_at"] is not None and (life is None or p["started"] >= life)
        ),
        key=lambda p: (p["ended_at"], p["id"]),
    )
    if not deaths:
        return []
    return [BoxFlag("red", "rank_died", deaths[0]["end_reason"] or f"pid {deaths[0]['pid']} died")]


def _gpu_idle(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    if status != "running":
        return []
    box = _RunBox.read(reads, run_id, now)
    if box is None or now - box.life < GPU_IDLE_S:
        return []
    flags = []
    for node in box.nodes:
        gpus, known = box.gpus(node)
        idle = [
            i for i in gpus if _held(reads, node, f"gpu/{i}/util", now - GPU_IDLE_S, now, below=GPU_IDLE_UTIL)
        ]
        if idle and (known or len(idle) == len(gpus)):
            flags.append(
                BoxFlag(
                    "yellow",
                    "gpu_idle",
                    f"{_gpu_list(idle)}{box.where(node)} idle (under {GPU_IDLE_UTIL:g}% for"
                    f" {GPU_IDLE_S / 60:g} min) while the run is running",
                )
            )
    return flags[:1]


def _gpu_memory(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    if status != "running":
        return []
    box = _RunBox.read(reads, run_id, now)
    if box is None:
        return []
    for node in box.nodes:
        gpus, _ = box.gpus(node)
        for i in gpus:
            gpu = box.gpu(node, i)
            total = gpu.get("mem_total")
            used = gpu.get("mem_used")
            if not total or used is None or used / total <= GPU_MEMORY_FULL:
                continue
            if _held(
                reads, node, f"gpu/{i}/mem_used", now - GPU_MEMORY_HOLD_S, now, above=GPU_MEMORY_FULL * total
            ):
                return [
                    BoxFlag(
                        "yellow",
                        "gpu_memory",
                        f"GPU {i}{box.where(node)} memory {used / total:.1%} full ({used / GiB:.1f} of"
                        f" {total / GiB:.1f} GiB) for {GPU_MEMORY_HOLD_S:g} s: an out-of-memory is near",
                    )
                ]
    return []


def _disk_full(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    if status not in LIVE:
        return []
    box = _RunBox.read(reads, run_id, now)
    if box is None or not box.run["dir"]:
        return []
    for node in box.nodes:
        disk = box.disk(node, box.run["dir"])
        if disk is None or not disk.get("total"):
            continue
        free, total = float(disk["free"]), float(disk["total"])
        if free < DISK_FREE_RED_BYTES or free < DISK_FREE_YELLOW_FRACTION * total:
            return [
                BoxFlag(
                    "red" if free < DISK_FREE_RED_BYTES else "yellow",
                    "disk_full",
                    f"disk {disk.get('mount')}{box.where(node)} where the run writes has {free / GiB:.1f} GiB"
                    f" free ({free / total:.1%}): checkpoints and logs fail to be written when it is full",
                )
            ]
    return []


def _xid(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    box = _RunBox.read(reads, run_id, now, fresh=False)
    if box is None:
        return []
    end = box.run["ended_at"] or now
    for node in box.nodes:
        gpus, _ = box.gpus(node, live=False)
        for i in gpus:
            key = f"gpu/{i}/xid"
            during = reads.series(node, key, box.life, end, max_points=2000)
            if not len(during):
                continue
            before = reads.series(node, key, box.life - XID_BASELINE_S, box.life, max_points=2000)
            baseline = before.mean[-1] if len(before) else 0.0
            if max(during.vmax) > baseline:
                last = box.gpu(node, i).get("last_xid")
                which = f" (XID {last})" if last is not None else ""
                return [
                    BoxFlag(
                        "red",
                        "xid",
                        f"XID error{which} on GPU {i}{box.where(node)} during the run: the driver reported"
                        " a GPU fault",
                    )
                ]
    return []


BOX_RULES: list[BoxRule] = [_rank_died, _gpu_idle, _gpu_memory, _disk_full, _xid]


def box_flags(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    """Every box rule's flags for the run, from the box's tables as `reads` reads them (none on a store
    without them)."""
    if not reads.ready:
        return []
    flags = []
    for rule in BOX_RULES:
        try:
            flags += rule(reads, run_id, status, now)
        except Exception as exc:  # one rule's failure costs its own flag, not the run's health
            if store_trouble(exc):
                raise
            name = rule.__name__.lstrip("_")
            message = f"box rule {name}: {type(exc).__name__}: {exc}"
            if _said.get(name) != message:
                _said[name] = message
                log.warning("run %d: %s", run_id, message)
    return flags


_said: dict[str, str] = {}  # each rule's last failure, logged once


# -- what the rules share --------------------------------------------------------------------------------


class _RunBox:
    """A run seen from the box: its row, the nodes it runs on (those of its processes, else the engine's own)
    with their newest samples, the GPUs its live processes hold, and when its current life began."""

    def __init__(self, run: dict[str, Any], processes: list[dict[str, Any]], samples: dict[int, Any]) -> None:
        self.run = run
        self.processes = processes
        self.samples = samples
        self.nodes = sorted(samples)
        self.names: dict[int, str] = {}
        # Its current life began with its newest runner or launcher (a resume starts a new one); a run without
        # one (ranks started by hand, an observed run) with its oldest process, else when it was made.
        ours = [p["started"] for p in processes if p["role"] in ("runner", "launcher")]
        others = [p["started"] for p in processes]
        self.life = max(ours) if ours else min(others) if others else float(run["created_at"] or 0.0)

    @classmethod
    def read(cls, reads: SystemReads, run_id: int, now: float, *, fresh: bool = True) -> _RunBox | None:
        """None when the run or any node's sample is missing (or, `fresh`, when every sample is stale)."""
        run = reads.run_context(run_id)
        if run is None:
            return None
        processes = reads.run_processes(run_id)
        nodes = reads.nodes()
        wanted = {p["node_id"] for p in processes} or {n["id"] for n in nodes if n["via"] == "local"}
        samples = {
            node: sample
            for node, sample in reads.now().items()
            if node in wanted and (not fresh or now - float(sample.get("t") or 0.0) <= SAMPLE_STALE_S)
        }
        if not samples:
            return None
        box = cls(run, processes, samples)
        box.names = {n["id"]: n["name"] for n in nodes} if len(samples) > 1 else {}
        return box

    def where(self, node: int) -> str:
        """ " on NODE" when the run spans several nodes."""
        return f" on {self.names[node]}" if node in self.names else ""

    def gpu(self, node: int, index: int) -> dict[str, Any]:
        return next((g for g in self.samples[node].get("gpus") or [] if g.get("index") == index), {})

    def gpus(self, node: int, *, live: bool = True) -> tuple[list[int], bool]:
        """The GPUs of the node the run's processes (its live ones, with `live`) hold or held memory on, and
        whether that is known (NVML listed them); unknown: every GPU of the node."""
        every = [g["index"] for g in self.samples[node].get("gpus") or []]
        held = {
            i
            for p in self.processes
            if p["node_id"] == node and (p["ended_at"] is None or not live)
            for i in p["gpus"] or []
            if i in every
        }
        return (sorted(held), True) if held else (every, False)

    def disk(self, node: int, path: str) -> dict[str, Any] | None:
        """The node's disk holding `path`: the one the engine watches it on, else the deepest mount above
        it."""
        disks = self.samples[node].get("disks") or []
        for disk in disks:
            if path in (disk.get("paths") or []):
                return disk
        above = [d for d in disks if _under(path, str(d.get("mount") or ""))]
        return max(above, key=lambda d: len(str(d.get("mount")))) if above else None


def _under(path: str, mount: str) -> bool:
    return bool(mount) and (path == mount or path.startswith(mount.rstrip("/") + "/"))


def _held(
    reads: SystemReads,
    node: int,
    key: str,
    since: float,
    now: float,
    *,
    below: float | None = None,
    above: float | None = None,
) -> bool:
    """Whether the series stayed below `below` / above `above` from `since` to `now`: the sample in force at
    `since` (the newest at or before it, at most COVER_SLACK_S earlier) and every one after, the newest of
    them recent. Rollup buckets answer by their max / min where raw samples no longer reach."""
    series = reads.series(node, key, since - COVER_SLACK_S, now, max_points=2000)
    at_start = [i for i, t in enumerate(series.t) if t <= since]
    if not at_start or now - series.t[-1] > SAMPLE_STALE_S:
        return False
    first = at_start[-1]
    highs, lows = series.vmax[first:], series.vmin[first:]
    return (below is None or max(highs) < below) and (above is None or min(lows) > above)


def _gpu_list(indexes: list[int]) -> str:
    if len(indexes) == 1:
        return f"GPU {indexes[0]}"
    return "GPUs " + ", ".join(map(str, indexes[:-1])) + f" and {indexes[-1]}"


# -- console_error: what the console scan found (engine/console/) -------------------------------------------

# A run that printed a traceback and has written no row for this long since it was found has ended with it
# (an observed script that crashed keeps the status `running`: nothing tells its end but the silence).
CRASH_QUIET_S = 60.0
CONSOLE_REASON_CHARS = 200  # of the exception line in the reason (the whole line is in the finding)
CONSOLE_WHAT = {"traceback": "traceback", "oom": "CUDA out of memory", "nccl": "NCCL error"}


def console_error(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    """The newest finding of the run's consoles. Red for CUDA out of memory and NCCL errors (training does
    not go on after either), and for a traceback that ended the run: the run failed, or it has written
    nothing for CRASH_QUIET_S since the traceback was found. Yellow for a traceback while the run goes on, or
    in a run that ended otherwise (stopped, finished, imported): something printed one, and it did not stop
    the run."""
    found = reads.findings(run_id, limit=1)
    if not found:
        return []
    finding = found[0]
    level = "red"
    if finding["kind"] == "traceback" and status != "failed":
        last = reads.last_write(run_id)
        ended_with_it = status == "running" and (last is None or last <= finding["t"])
        if not (ended_with_it and now - finding["t"] >= CRASH_QUIET_S):
            level = "yellow"
    line = finding["line"]
    if len(line) > CONSOLE_REASON_CHARS:
        line = line[: CONSOLE_REASON_CHARS - 1] + "…"
    where = Path(finding["path"]).name + (f" line {finding['line_no']:,}" if finding["line_no"] else "")
    what = CONSOLE_WHAT.get(finding["kind"], finding["kind"])
    return [BoxFlag(level, "console_error", f"{what} in the console: {line} ({where})")]


BOX_RULES.append(console_error)
