"""The processes of a run as the run records them (engine/system/run_processes.py has the engine's side).

- The runner of a one-process run, and the launching `carl train` of `--processes N` with accelerate's
  launcher, write their own rows when they start (`note_self`); rank 0 writes every rank's, gathered at the
  start (engine/training/distributed.py). A process that exits in order writes its own end (`end_self`).
- A rank's end is reported by torch's elastic agent, which logs to the launcher's stderr
  (torch/distributed/elastic/multiprocessing/api.py):

      failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: /usr/bin/python3
      Sending process 4241 closing signal SIGTERM

  and prints a summary of every failed worker (`rank : 1 (local_rank: 1)`, `exitcode : -9 (pid: 4242)`).
  `LauncherReport` reads that stderr on a thread, copies every byte on to this process's stderr (the user
  sees what the launcher printed, as before), and records each rank's end as it is reported: "rank 1 (pid
  4242) killed by SIGKILL at step 812". The agent reports a failure only once it has stopped the other ranks,
  so those ends come a few seconds after the rank died; the engine waits for them (END_GRACE_S).

A rank's end is a death (health's rank_died) when a signal ended it, or when it failed while the run was still
live or when rank 0 failed the run because another rank was lost; not when the launcher stopped it after
another rank failed, nor after the run ended for a reason it recorded itself.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import IO, Any

import psutil

from engine import paths
from engine.store import ProcessRow, Store
from engine.system.run_processes import (
    LIVE,
    end_own,
    end_reason,
    from_returncode,
    note_own,
    note_ranks,
    this_process,
    who,
)
from engine.text import one_line, visible

from .ranks import LOST_RANK_REASON

FIRST_FAILURE = re.compile(rb"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
CLOSING = re.compile(rb"Sending process (\d+) closing signal (SIG[A-Z0-9]+)")
SUMMARY_RANK = re.compile(rb"^\s*rank\s*: (\d+) \(local_rank: (\d+)\)")
SUMMARY_EXIT = re.compile(rb"^\s*exitcode\s*: (-?\d+) \(pid: (\d+)\)")
MAX_LINE = 4096  # bytes of a line kept for matching (a progress bar's carriage returns make long lines)
READ_CHUNK = 65536


def say(message: str) -> None:
    print(f"carl train: {visible(message)}", file=sys.stderr, flush=True)


def note_self(store: Store | None, run_id: int, role: str, rank: int | None = None) -> None:
    """This process as one of the run's (runner, launcher, rank); trouble is one line, never the run's end."""
    if store is None:
        return
    try:
        note_own(store, run_id, [this_process(role, rank)])
    except Exception as exc:  # the row is for watching the run: training goes on without it
        say(f"could not record this process for run {run_id}: {one_line(str(exc))}")


def note_ranks_of(store: Store | None, run_id: int, everyone: list[dict[str, Any]]) -> None:
    """Every rank of the run as rank 0 gathered them (`rank_info` of each)."""
    if store is None:
        return
    try:
        note_ranks(store, run_id, everyone)
    except Exception as exc:
        say(f"could not record the ranks of run {run_id}: {one_line(str(exc))}")


def end_self(store: Store | None, run_id: int, exit_code: int) -> None:
    if store is None:
        return
    try:
        end_own(store, run_id, exit_code)
    except Exception as exc:
        say(f"could not record the end of this process for run {run_id}: {one_line(str(exc))}")


class LauncherReport:
    """The launcher's stderr, copied on to ours, with the ranks' ends recorded as the agent reports them."""

    def __init__(self, stream: IO[bytes], home: Path, run_id: int, out: IO[bytes] | None = None) -> None:
        self.stream = stream
        self.home = home
        self.run_id = run_id
        self.out: IO[bytes] | None = out if out is not None else getattr(sys.stderr, "buffer", None)
        self.stopping = False  # set when this carl train ends the ranks itself (a second Ctrl-C)
        self.first: int | None = None  # the local rank the agent reported first
        self.closing: dict[int, str] = {}  # pid -> the signal the launcher sent it to stop it
        self.summary: dict[int, int] = {}  # pid -> exit code, from the agent's summary
        self.trouble: str | None = None
        self._summary_rank: int | None = None
        self._store: Store | None = None
        self._thread = threading.Thread(target=self._pump, name="launcher-stderr", daemon=True)

    def start(self) -> LauncherReport:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        """Wait for the launcher's stderr to end (a rank that outlives the launcher keeps it open: not for
        longer than `timeout`)."""
        self._thread.join(timeout)

    # -- the reading thread -------------------------------------------------------------------------------

    def _pump(self) -> None:
        pending = b""
        fd = self.stream.fileno()
        try:
            while chunk := _read(fd):
                self._copy(chunk)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()[-MAX_LINE:]
                for line in lines:
                    self._line(line[-MAX_LINE:])
            if pending:
                self._line(pending)
        finally:
            if self._store is not None:
                self._store.close()
            if self.trouble:
                say(self.trouble)

    def _copy(self, chunk: bytes) -> None:
        if self.out is None:
            return
        try:
            self.out.write(chunk)
            self.out.flush()
        except (OSError, ValueError):  # our stderr is gone: the launcher's is still drained
            self.out = None

    def _line(self, line: bytes) -> None:
        try:
            if m := FIRST_FAILURE.search(line):
                code, local_rank, pid = (int(g) for g in m.groups())
                self.first = local_rank
                self._record(pid, code, first=True)
            elif m := CLOSING.search(line):
                self.closing[int(m.group(1))] = m.group(2).decode()
            elif m := SUMMARY_RANK.search(line):
                self._summary_rank = int(m.group(1))
            elif (m := SUMMARY_EXIT.search(line)) and self._summary_rank is not None:
                code, pid = int(m.group(1)), int(m.group(2))
                self.summary[pid] = code
                self._record(pid, code, first=False)
        except Exception as exc:  # recording is for watching the run: the copy goes on
            self.trouble = self.trouble or f"could not record a rank's end: {one_line(str(exc))}"

    def _record(self, pid: int, code: int, *, first: bool) -> None:
        if self._store is None:
            self._store = Store(paths.db_path(self.home))
        record_rank_end(self._store, self.run_id, pid, code, self, first=first)

    # -- after the launcher exited ------------------------------------------------------------------------

    def settle(self, store: Store, launcher_pid: int, returncode: int) -> None:
        """The ends the agent did not report (every rank exited 0 when the launcher did), and the
        launcher's own."""
        for row in store.system.open_processes(run_id=self.run_id):
            if row["role"] == "rank":
                code = self.summary.get(row["pid"], 0 if returncode == 0 else None)
                record_rank_end(store, self.run_id, row["pid"], code, self, first=False)
            elif row["pid"] == launcher_pid:
                exit_code, signal = from_returncode(returncode)
                state = store.system.run_state(self.run_id) or {}
                died = signal is not None and not self.stopping and state.get("status") in LIVE
                step = state.get("last_step")
                store.system.process_ended(
                    row["id"],
                    exit_code=exit_code,
                    signal=signal,
                    end_step=step,
                    reason=end_reason(who("launcher", row["pid"]), exit_code, signal, step),
                    died=died,
                )


def record_rank_end(
    store: Store, run_id: int, pid: int, code: int | None, report: LauncherReport, *, first: bool
) -> None:
    """A rank's end as the launcher reports it (`code`: its exit code, negative for a signal; None:
    unknown)."""
    row = store.system.process_of(run_id, pid)
    if row is None or row["role"] != "rank":
        return
    exit_code, signal = from_returncode(code) if code is not None else (None, None)
    state = store.system.run_state(run_id) or {}
    step = state.get("last_step")
    whom = who("rank", pid, row["rank"])
    stopped = report.closing.get(pid)
    if stopped is not None and not first:
        after = f" after rank {report.first} failed" if report.first is not None else ""
        reason, died = f"{whom} stopped by the launcher ({stopped}){after}", False
        if step is not None:
            reason += f" at step {step}"
    else:
        reason = end_reason(whom, exit_code, signal, step)
        lost = str(state.get("error") or "").startswith(LOST_RANK_REASON)
        failed = code is not None and code != 0
        died = not report.stopping and (
            signal is not None or (failed and (state.get("status") in LIVE or lost))
        )
    store.system.process_ended(
        row["id"], exit_code=exit_code, signal=signal, end_step=step, reason=reason, died=died
    )


def agent_row(pid: int) -> ProcessRow:
    """The row of accelerate's launcher (torch's elastic agent), a child of this process."""
    proc = psutil.Process(pid)
    return ProcessRow(pid, proc.create_time(), "launcher", "running", " ".join(proc.cmdline()))


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_CHUNK)
    except OSError:
        return b""
