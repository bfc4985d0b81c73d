"""The engine's console job: which files are a run's console, and the scan of each for what went wrong.

A run's consoles (`run_consoles`), by kind:
- `train`: the log the engine writes a training process's stdout and stderr to ($CARL_HOME/logs/train-...log,
  engine/daemon/loop.py `start_training`). The run it is the console of is the one whose pid is that process's
  (the runner's, or for `carl train --processes N` the launcher's, and then rank 0's: a process under it);
  `expect_train` names the process and its log, and the job looks for the run each LINK_EVERY_S while the
  process lives (and once after it ended: a run that failed at once has its pid too).
- `wandb`: an observed W&B run's `files/output.log` (registered by engine/observe/wandb_run.py).
- `user`: the files `carl observe ... --log FILE` named, for every run of the sources that command observed,
  those there now and those that come later (the sources' logs are kept in the store: `attach_logs`).

Then each console is read a bounded batch at a time (engine/console/scan.py), at most SCAN_SECONDS a tick; a
console whose file stopped growing for FINAL_AFTER_S is read to its very end. `tick` returns the runs that got
a finding, for the engine to analyse again (their health gets the `console_error` cause,
engine/system/box_health.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .logfile import LogFileError
from .scan import scan_console

if TYPE_CHECKING:
    from engine.store import Store

LINK_EVERY_S = 1.0  # how often runs are looked for: observed sources' new runs, our training processes' runs
SCAN_EVERY_S = 1.0  # how often consoles are looked at when none has bytes waiting
SCAN_SECONDS = 0.05  # of a tick, the most the scan takes (the rest of the engine goes on)
FINAL_AFTER_S = 10.0  # a file unchanged this long is read to its end (a last line with no newline)
EXPECT_MAX_S = 24 * 3600.0  # a training process whose run never appeared is forgotten after this
SOURCE_LOGS_KEY = "consoles.sources"  # kv: source id -> the log files named for its runs

log = logging.getLogger("carl.engine.console")


@dataclass
class Expected:
    """A training process the engine started, and its log: its run is not known yet."""

    pid: int
    log: str
    started: float  # wall time


def attach_logs(store: Store, source_ids: list[int], logs: list[str]) -> list[int]:
    """Name `logs` as the console of every run of these sources, now and to come; returns the runs they were
    attached to now."""
    if not logs or not source_ids:
        return []
    with store.transaction():
        kept = store.kv(SOURCE_LOGS_KEY) or {}
        for source_id in source_ids:
            paths = kept.setdefault(str(source_id), [])
            paths.extend(p for p in logs if p not in paths)
        store.set_kv(SOURCE_LOGS_KEY, kept)
        runs = [r for ids in store.system.runs_of_sources(source_ids).values() for r in ids]
        for run_id in runs:
            for path in logs:
                store.system.add_console(run_id, path, "user")
    return runs


class ConsoleJob:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.expected: dict[int, Expected] = {}  # by pid
        self.linked: set[tuple[int, str]] = set()  # (run id, path) known to be registered
        self.quiet: dict[int, tuple[int, float]] = {}  # console id -> (its size, since when it is that)
        self.said: dict[int, str] = {}  # console id -> the last problem logged for it
        self.next_link = 0.0
        self.next_scan = 0.0

    def expect_train(self, pid: int, log_path: Path | str) -> None:
        """The engine started training process `pid`, writing to `log_path`."""
        self.expected[pid] = Expected(pid, str(log_path), time.time())
        self.next_link = 0.0

    def tick(self) -> set[int]:
        """Link consoles to runs and scan them; the runs that got a finding."""
        now = time.monotonic()
        if now >= self.next_link:
            self.next_link = now + LINK_EVERY_S
            self.link_training()
            self.link_sources()
        if now < self.next_scan:
            return set()
        return self.scan()

    # -- which files are a run's console ---------------------------------------------------------------------

    def link_training(self) -> None:
        if not self.expected:
            return
        import psutil

        since = min(e.started for e in self.expected.values()) - 1.0
        runs = self.store.system.runs_updated_since(since)
        for pid, expected in list(self.expected.items()):
            alive = psutil.pid_exists(pid)
            run_id = next((r for r, p in runs if p == pid), None)
            if run_id is None:  # `--processes N`: rank 0 stands for the run, a process under the launcher
                run_id = next((r for r, p in runs if _descends_from(p, pid)), None)
            if run_id is not None:
                self.store.system.add_console(run_id, expected.log, "train")
                log.info("console: run %d writes to %s (pid %d)", run_id, expected.log, pid)
                del self.expected[pid]
            elif not alive or time.time() - expected.started > EXPECT_MAX_S:
                del self.expected[pid]  # it ended before opening a run: its log is the engine's to show

    def link_sources(self) -> None:
        kept = self.store.kv(SOURCE_LOGS_KEY)
        if not kept:
            return
        logs = {int(k): v for k, v in kept.items()}
        for source_id, runs in self.store.system.runs_of_sources(logs).items():
            for run_id in runs:
                for path in logs[source_id]:
                    if (run_id, path) not in self.linked:
                        self.store.system.add_console(run_id, path, "user")
                        self.linked.add((run_id, path))

    # -- the scan ------------------------------------------------------------------------------------------

    def scan(self) -> set[int]:
        """A batch of each console with bytes to read, within SCAN_SECONDS."""
        found: set[int] = set()
        deadline = time.monotonic() + SCAN_SECONDS
        pending = False
        for console in self.store.system.consoles():
            if time.monotonic() >= deadline:
                pending = True
                break
            try:
                result = scan_console(self.store, console, final=self._quiet(console))
            except (OSError, LogFileError) as exc:
                self._say(console, exc)
                continue
            self.said.pop(console["id"], None)
            if result.restarted:
                log.info("console %s: %s; scanned again from its start", console["path"], result.restarted)
            if result.new:
                found.add(console["run_id"])
            pending |= result.more
        self.next_scan = time.monotonic() + (0.0 if pending else SCAN_EVERY_S)
        return found

    def _quiet(self, console: dict[str, Any]) -> bool:
        """Whether the console's file has not changed size for FINAL_AFTER_S."""
        size = (console["identity"] or {}).get("size", -1)
        seen = self.quiet.get(console["id"])
        if seen is None or seen[0] != size:
            self.quiet[console["id"]] = (size, time.monotonic())
            return False
        return time.monotonic() - seen[1] >= FINAL_AFTER_S

    def _say(self, console: dict[str, Any], exc: Exception) -> None:
        missing = isinstance(exc, FileNotFoundError)
        message = f"{console['path']}: not there (yet)" if missing else str(exc)
        if self.said.get(console["id"]) != message:
            self.said[console["id"]] = message
            log.info("console of run %d: %s", console["run_id"], message)


def _descends_from(pid: int, ancestor: int) -> bool:
    import psutil

    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False
