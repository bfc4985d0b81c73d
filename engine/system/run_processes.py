"""Every process of a run: who it is, what it uses, and how it ended.

Our runs name their own processes: the runner of a one-process run, the launching `carl train` and
accelerate's launcher of `carl train --processes N`, and each rank (rank 0 learns every rank's pid, host and
start time in one exchange and writes them, engine/training/distributed.py). Each writes its own end when it
exits in order; the launching `carl train` also records a rank's end as torch's elastic agent reports it
(engine/training/rank_processes.py). For an observed run the engine looks for the processes working in its
directory (working directory inside it, or a file inside it open for writing), at most every
OBSERVED_SCAN_S and for at most SCAN_BUDGET_S at a time.

At each system sample the engine's `ProcessTracker` looks at every open process of this node by pid and
start time (a pid the system gave to a new process is never mistaken for the old one): CPU, RSS, state, and
GPU memory from NVML's process list in the sample. A process that is gone gets its end: the exit status
when it can be known (the engine's own child, a zombie's /proc/<pid>/stat), else, after END_GRACE_S in
which another writer may record it exactly, "exit status unknown". An end is a death (`died`, health's
`rank_died`, engine/system/box_health.py) when it was not a clean exit and the run was still live
(docs/guide/processes.md).
"""

from __future__ import annotations

import logging
import os
import signal as signals
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from engine.store.system import ProcessRow

from .readings import Sample

if TYPE_CHECKING:
    from engine.store import Store

# A process seen gone waits this long for an exact exit status from another writer (the launching carl
# train reports a rank's end once torch's agent has stopped the others, which takes a few seconds) before
# its end is recorded as unknown. An exact status that comes later still replaces the unknown one.
END_GRACE_S = 10.0
# psutil's start time is the boot time plus the process's start ticks; the boot time (/proc/stat btime) is
# the wall clock less the uptime and moves when the clock is stepped, by a second at most in practice.
START_TOLERANCE_S = 1.0
OBSERVED_SCAN_S = 15.0  # an observed run's directory is looked for among the processes this often
SCAN_BUDGET_S = 0.2  # one scan's time box; a scan that runs out goes on from there at the next sample
MAX_FDS_LOOKED_AT = 256  # a process with more open files is judged by its working directory alone
MAX_OBSERVED_PER_RUN = 32  # processes followed per observed run (dataloader workers add up)
CHILD_MEMORY_S = 600.0  # how long the exit status of an engine child is kept for its row
ENDS_MARGIN_S = 5.0  # ends written by other processes are looked for this far back (commit order)
LIVE = ("running", "paused")
OUR_SOURCES = ("carl", "callback")  # runs whose processes write their own rows
# Tools a person runs in a run's directory (a shell, a pager, an editor, a monitor): not the run's processes.
INTERACTIVE = {"bash", "sh", "zsh", "fish", "dash", "ksh", "tcsh", "tmux", "screen", "less", "more", "tail"}
INTERACTIVE |= {"head", "cat", "vi", "vim", "nvim", "emacs", "nano", "watch", "ssh", "sshd", "top", "htop"}
INTERACTIVE |= {"btop", "nvitop", "git", "mc", "ranger", "rsync", "scp", "du", "find"}

log = logging.getLogger("carl.engine.system")


# -- words ------------------------------------------------------------------------------------------------


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def who(role: str, pid: int, rank: int | None = None, cmdline: str | None = None) -> str:
    """How an end names its process: "rank 1 (pid 4242)", "the runner (pid 77)", "python (pid 9)"."""
    if role == "rank" and rank is not None:
        return f"rank {rank} (pid {pid})"
    if role in ("runner", "launcher"):
        return f"the {role} (pid {pid})"
    name = Path((cmdline or "").split(" ", 1)[0]).name or "process"
    return f"{name} (pid {pid})"


def end_reason(whom: str, exit_code: int | None, signal: int | None, step: int | None) -> str:
    """One line: "rank 1 (pid 4242) killed by SIGKILL at step 812"."""
    if signal is not None:
        how = f"killed by {signal_name(signal)}"
    elif exit_code is not None:
        how = f"exited with code {exit_code}"
    else:
        how = "ended (exit status unknown)"
    return f"{whom} {how}" + (f" at step {step}" if step is not None else "")


def from_returncode(returncode: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from subprocess's returncode (negative: the signal that ended it)."""
    return (None, -returncode) if returncode < 0 else (returncode, None)


def zombie_status(pid: int) -> tuple[int | None, int | None] | None:
    """(exit code, signal) of a zombie, from /proc/<pid>/stat's exit_code (its wait status; Linux 3.5 and
    later); None when it is no zombie or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) < 50 or fields[0] != "Z":  # state is field 3, exit_code field 52
        return None
    status = int(fields[49])
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


# -- a process writing its own row ------------------------------------------------------------------------


def this_process(role: str, rank: int | None = None) -> ProcessRow:
    me = psutil.Process()
    return ProcessRow(
        pid=me.pid,
        started=me.create_time(),
        role=role,
        state="running",
        cmdline=" ".join(me.cmdline()),
        rank=rank,
    )


def rank_info(rank: int) -> dict[str, Any]:
    """What rank 0 gathers of every rank to record it (engine/training/distributed.py)."""
    row = this_process("rank", rank)
    return {
        "rank": rank,
        "pid": row.pid,
        "host": socket.gethostname(),
        "started": row.started,
        "cmd": row.cmdline,
    }


def note_own(store: Store, run_id: int, rows: Iterable[ProcessRow], host: str | None = None) -> None:
    """Rows a run's own process writes, under the node of `host` (this machine's, made if need be; another
    machine's only when that node is known: `carl node`)."""
    here = socket.gethostname()
    host = host or here
    node_id = store.system.node_for(host, create=host == here)
    if node_id is not None:
        store.system.note_processes(run_id, node_id, list(rows))


def note_ranks(store: Store, run_id: int, infos: list[dict[str, Any]]) -> None:
    """Every rank of a run, as rank 0 gathered them."""
    for info in infos:
        row = ProcessRow(info["pid"], info["started"], "rank", "running", info["cmd"], rank=info["rank"])
        note_own(store, run_id, [row], info["host"])


def end_own(store: Store, run_id: int, exit_code: int) -> None:
    """This process's own end, written as it exits in order (never a death: it settled its run first)."""
    row = store.system.process_of(run_id, os.getpid())
    if row is None or row["ended_at"] is not None:
        return
    state = store.system.run_state(run_id) or {}
    whom = who(row["role"], os.getpid(), row["rank"])
    store.system.process_ended(
        row["id"],
        exit_code=exit_code,
        signal=None,
        end_step=state.get("last_step"),
        reason=end_reason(whom, exit_code, None, state.get("last_step")),
    )


# -- the engine's side ------------------------------------------------------------------------------------


@dataclass
class _GpuUse:
    used: int | None  # bytes on every GPU together (None: the driver does not say)
    gpus: list[int]


def gpu_use(sample: Sample) -> dict[int, _GpuUse] | None:
    """pid -> its GPU memory and GPUs, from NVML's process lists in the sample; None without GPUs."""
    if not sample.gpus:
        return None
    out: dict[int, _GpuUse] = {}
    for gpu in sample.gpus:
        for p in gpu.processes:
            use = out.setdefault(p.pid, _GpuUse(None, []))
            if p.used_bytes is not None:
                use.used = (use.used or 0) + p.used_bytes
            if gpu.index not in use.gpus:
                use.gpus.append(gpu.index)
    return out


class ProcessTracker:
    """The processes of runs on this node, looked at once per system sample (engine/system/system_job.py)."""

    def __init__(self, store: Store, *, grace_s: float = END_GRACE_S) -> None:
        self.store = store
        self.grace_s = grace_s
        self.uid = os.getuid() if hasattr(os, "getuid") else None
        self.own = os.getpid()
        self.handles: dict[int, psutil.Process] = {}  # row id -> its process (CPU percent needs the same one)
        self.primed: set[int] = set()  # rows whose CPU percent was asked before: the next one measures
        self.gone: dict[int, float] = {}  # row id -> when it was first seen gone
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (returncode, when) of engine children
        self.changed_runs: set[int] = set()  # runs with an end recorded since the engine last asked
        self.ends_checked = time.time()
        self.next_scan = 0.0
        self.scan_after = 0  # the pid a scan that ran out of time goes on after

    def child_ended(self, pid: int, returncode: int) -> None:
        """The engine reaped a child of its own: its exit status, for its row."""
        self.children[pid] = (returncode, time.monotonic())

    def take_changed_runs(self) -> set[int]:
        changed, self.changed_runs = self.changed_runs, set()
        return changed

    def tick(self, sample: Sample, node_id: int) -> None:
        now = time.time()
        self._forget_old_children()
        rows = self.store.system.open_processes(node_id)
        if time.monotonic() >= self.next_scan:
            self._scan_observed(node_id, rows)
            rows = self.store.system.open_processes(node_id)
        gpus = gpu_use(sample)
        alive: dict[int, list[ProcessRow]] = {}
        for row in rows:
            proc = self._process(row)
            state = _status(proc)
            if proc is not None and state not in (None, psutil.STATUS_ZOMBIE):
                self.gone.pop(row["id"], None)
                alive.setdefault(row["run_id"], []).append(self._reading(row, proc, state, gpus))
                continue
            self._gone(row, proc, now)
        for run_id, live in alive.items():
            self.store.system.note_processes(run_id, node_id, live)
        known = {row["id"] for row in rows}
        self.handles = {k: v for k, v in self.handles.items() if k in known}
        self.primed &= known
        self.gone = {k: v for k, v in self.gone.items() if k in known}
        since, self.ends_checked = self.ends_checked - ENDS_MARGIN_S, now
        self.changed_runs.update(self.store.system.ends_written_since(since))

    # -- one process --------------------------------------------------------------------------------------

    def _process(self, row: dict[str, Any]) -> psutil.Process | None:
        """The process the row names, by pid and start time; None when it is gone or its pid was reused."""
        proc = self.handles.get(row["id"])
        if proc is None:
            try:
                proc = psutil.Process(row["pid"])
            except psutil.Error:
                return None
        try:
            if abs(proc.create_time() - row["started"]) > START_TOLERANCE_S:
                return None  # another process holds the pid now
        except psutil.Error:
            return None
        self.handles[row["id"]] = proc
        return proc

    def _reading(
        self, row: dict[str, Any], proc: psutil.Process, state: str, gpus: dict[int, _GpuUse] | None
    ) -> ProcessRow:
        reading = ProcessRow(row["pid"], row["started"], row["role"], state, rank=row["rank"])
        try:
            with proc.oneshot():
                cpu = proc.cpu_percent(None)  # since the previous call: the first one only primes it
                reading.rss = proc.memory_info().rss
            reading.cpu = cpu if row["id"] in self.primed else None
            self.primed.add(row["id"])
        except psutil.Error:
            pass
        if gpus is not None:
            use = gpus.get(row["pid"])
            reading.gpus = use.gpus if use else []
            reading.gpu_mem = use.used if use else 0
        return reading

    def _gone(self, row: dict[str, Any], proc: psutil.Process | None, now: float) -> None:
        """A process no longer running: its end, exact when it can be known, else unknown after the grace."""
        exact = zombie_status(row["pid"]) if proc is not None else None
        child = self.children.get(row["pid"])
        if exact is None and child is not None:
            exact = from_returncode(child[0])
        first = self.gone.setdefault(row["id"], now)
        if exact is None and now - first < self.grace_s:
            return  # its own report (the launcher's, for a rank) may still come
        self._record(row, exact, first)
        self.gone.pop(row["id"], None)
        self.handles.pop(row["id"], None)

    def _record(self, row: dict[str, Any], exact: tuple[int | None, int | None] | None, at: float) -> None:
        run = self.store.system.run_state(row["run_id"]) or {}
        exit_code, signal = exact if exact is not None else (None, None)
        clean = exit_code == 0 and signal is None
        # Not a death: a clean exit, a run that had already ended (it said why), or an observed process whose
        # end cannot be known (a script that finished looks the same). A signal in a run that has failed is
        # one, as the launcher's report counts it (training/rank_processes.py `record_rank_end`): the run may
        # turn `failed` before this pass sees the killed rank, and an exact status recorded here is never
        # replaced.
        status = run.get("status")
        live = status in LIVE or (signal is not None and status == "failed")
        died = live and not clean and not (exact is None and row["role"] == "observed")
        step = run.get("last_step")
        reason = end_reason(
            who(row["role"], row["pid"], row["rank"], row["cmdline"]), exit_code, signal, step
        )
        if self.store.system.process_ended(
            row["id"],
            exit_code=exit_code,
            signal=signal,
            end_step=step,
            reason=reason,
            ended_at=at,
            died=died,
        ):
            self.changed_runs.add(row["run_id"])
            if died:
                log.warning("run %d: %s", row["run_id"], reason)

    def _forget_old_children(self) -> None:
        cutoff = time.monotonic() - CHILD_MEMORY_S
        self.children = {pid: v for pid, v in self.children.items() if v[1] >= cutoff}

    # -- observed runs: who works in their directories ----------------------------------------------------

    def _scan_observed(self, node_id: int, rows: list[dict[str, Any]]) -> None:
        """Processes of this user working in an observed run's directory, added as its `observed` processes.
        Time-boxed: a scan that runs out of time goes on from the pid it reached at the next sample."""
        runs = [
            r for r in self.store.system.running_runs() if r["source_kind"] not in OUR_SOURCES and r["dir"]
        ]
        counts: dict[int, int] = {}
        for row in rows:
            counts[row["run_id"]] = counts.get(row["run_id"], 0) + 1
        dirs = {
            r["id"]: os.path.realpath(r["dir"]) for r in runs if counts.get(r["id"], 0) < MAX_OBSERVED_PER_RUN
        }
        if not dirs:
            self._scan_done()
            return
        tracked = {row["pid"] for row in rows} | {self.own}
        deadline = time.monotonic() + SCAN_BUDGET_S
        found: dict[int, list[ProcessRow]] = {}
        finished = True
        for pid in sorted(psutil.pids()):
            if pid <= self.scan_after or pid in tracked:
                continue
            if time.monotonic() > deadline:
                finished = False
                break
            self.scan_after = pid
            match = self._working_in(pid, dirs)
            if match is not None:
                found.setdefault(match[0], []).append(match[1])
        for run_id, new in found.items():
            self.store.system.note_processes(
                run_id, node_id, new[: MAX_OBSERVED_PER_RUN - counts.get(run_id, 0)]
            )
        if finished:
            self._scan_done()

    def _scan_done(self) -> None:
        self.scan_after = 0
        self.next_scan = time.monotonic() + OBSERVED_SCAN_S

    def _working_in(self, pid: int, dirs: dict[int, str]) -> tuple[int, ProcessRow] | None:
        try:
            proc = psutil.Process(pid)
            if self.uid is not None and proc.uids().real != self.uid:
                return None
            if proc.name() in INTERACTIVE:
                return None
            run_id = _inside(proc.cwd(), dirs)
            if run_id is None and proc.num_fds() <= MAX_FDS_LOOKED_AT:
                for f in proc.open_files():
                    if f.mode != "r" and (run_id := _inside(f.path, dirs)) is not None:
                        break
            if run_id is None:
                return None
            cmdline = proc.cmdline()
            if _ours(cmdline):
                return None
            return run_id, ProcessRow(pid, proc.create_time(), "observed", proc.status(), " ".join(cmdline))
        except (psutil.Error, OSError):
            return None


def _status(proc: psutil.Process | None) -> str | None:
    if proc is None:
        return None
    try:
        return str(proc.status())
    except psutil.Error:
        return None


def _inside(path: str, dirs: dict[int, str]) -> int | None:
    """The run whose directory holds `path` (the deepest, when directories nest)."""
    best: tuple[int, int] | None = None
    for run_id, d in dirs.items():
        if (path == d or path.startswith(d.rstrip(os.sep) + os.sep)) and (best is None or len(d) > best[1]):
            best = (run_id, len(d))
    return None if best is None else best[0]


def _ours(cmdline: list[str]) -> bool:
    """The control room, the engine or a carl command (reading a run's files is not working in it)."""
    if any(Path(arg).name in ("carl", "carl-tui") for arg in cmdline[:2]):
        return True
    return len(cmdline) >= 3 and cmdline[1] == "-m" and cmdline[2].split(".")[0] in ("engine", "carl_tui")
