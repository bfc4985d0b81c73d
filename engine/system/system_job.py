"""The engine's system job: sample this machine every `[system] interval_s` and store it as this node's
series.

Called from each engine tick (engine/daemon/loop.py); it does its work only when due, so the tick's own pace
does not change the sampling rate (the loop sleeps no longer than `seconds_to_next`). Settings are read again
when engine.toml changes. The paths whose disks are watched are $CARL_HOME, the `[system] paths` and the
directories of the runs that are running, looked up again every WATCH_RECHECK_S.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

from engine.store import Store
from engine.tomlfile import FileWatch

from .run_processes import ProcessTracker
from .sampler import Sampler
from .system_settings import FILE_NAME, SystemSettings, load_system_settings

CONFIG_CHECK_S = 2.0
WATCH_RECHECK_S = 30.0
THIN_EVERY_S = 600.0
SAMPLING_OFF = "sampling is off ([system] enabled = false in engine.toml)"

log = logging.getLogger("carl.engine.system")


class SystemJob:
    def __init__(self, store: Store, home: Path, *, sampler: Sampler | None = None) -> None:
        self.store = store
        self.home = home
        self.host = socket.gethostname()
        self.settings = SystemSettings()
        self.sampler = sampler
        self.node_id: int | None = None
        self.next_sample = 0.0
        self.next_watch = 0.0
        self.next_thin = time.monotonic() + THIN_EVERY_S
        self.config = FileWatch(home / FILE_NAME, CONFIG_CHECK_S)  # engine.toml, read again when it changes
        self.samples = 0
        self.processes = ProcessTracker(store)  # every process of the runs on this node (run_processes.py)
        self.process_trouble: str | None = None  # the last failure of the tracker, logged once

    def seconds_to_next(self) -> float:
        """How long the engine may sleep before this job is due again."""
        if not self.settings.enabled:
            return 3600.0
        return max(0.0, self.next_sample - time.monotonic())

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def tick(self) -> None:
        self._reload()
        now = time.monotonic()
        if not self.settings.enabled or now < self.next_sample:
            return
        # Due at fixed steps of the interval, not an interval after the last (late) one: no drift; a job that
        # fell behind (a long tick) starts over from now rather than sampling in a burst.
        self.next_sample += self.settings.interval_s
        if self.next_sample <= now:
            self.next_sample = now + self.settings.interval_s
        sampler = self._sampler()
        if now >= self.next_watch:
            self.next_watch = now + WATCH_RECHECK_S
            sampler.watch(self.watched_paths())
        sample = sampler.sample()
        self.store.system.add_sample(self.node(), sample.t, sample.scalars(), sample.to_json())
        self.samples += 1
        self._track_processes(sample)
        if now >= self.next_thin:
            self.next_thin = now + THIN_EVERY_S
            removed = self.store.system.thin()
            if removed:
                log.info("system samples: %d old rows thinned", removed)

    def _track_processes(self, sample: Any) -> None:
        """The runs' processes at this sample; its failure is logged once and never stops the sampling."""
        try:
            self.processes.tick(sample, self.node())
        except Exception as exc:
            message = f"system: the runs' processes: {type(exc).__name__}: {exc}"
            if message != self.process_trouble:
                log.warning("%s", message)
            self.process_trouble = message
        else:
            self.process_trouble = None

    def child_ended(self, pid: int, returncode: int) -> None:
        """The engine reaped a process it started: its exit status is that process's end."""
        self.processes.child_ended(pid, returncode)

    def take_changed_runs(self) -> set[int]:
        """Runs with a process end recorded since the last call: the engine analyses them again."""
        return self.processes.take_changed_runs()

    def node(self) -> int:
        """This machine's node id, made on first use with what does not change (cores, memory, GPUs)."""
        if self.node_id is None:
            self.node_id = self.store.system.node(self.host, host=self.host, via="local", info=self._info())
            sampler = self._sampler()
            self.store.system.set_node_note(self.node_id, sampler.note)
            if sampler.note:
                log.info("system: %s", sampler.note)
        return self.node_id

    def watched_paths(self) -> list[str]:
        return [str(self.home), *self.settings.paths, *self.store.system.running_run_dirs()]

    def _sampler(self) -> Sampler:
        if self.sampler is None:
            self.sampler = Sampler()
        return self.sampler

    def _info(self) -> dict[str, Any]:
        import platform

        import psutil

        sampler = self._sampler()
        return {
            "cores": psutil.cpu_count() or 0,
            "memory": psutil.virtual_memory().total,
            "platform": f"{platform.system()} {platform.machine()}",
            "gpus": [
                {"index": i, "name": name, "uuid": uuid}
                for i, (name, uuid) in enumerate(zip(sampler.nvml.names, sampler.nvml.uuids, strict=True))
            ],
        }

    def _reload(self) -> None:
        if not self.config.changed():
            return
        settings, problems = load_system_settings(self.home)
        for line in problems:
            log.warning("%s", line)
        if settings != self.settings:
            if settings.enabled:
                log.info("system: sampling every %g s", settings.interval_s)
            else:
                log.info("system: sampling is off ([system] enabled = false)")
            if not (settings.enabled and self.settings.enabled):  # off, or just back on
                self._say_sampling(settings.enabled)
            self.next_sample = 0.0
            self.next_watch = 0.0
        self.settings = settings

    def _say_sampling(self, enabled: bool) -> None:
        """The node's state says whether the machine is sampled, so the System pane can say why nothing new
        comes: `stopped` with SAMPLING_OFF while it is off (the node is made for it, without opening NVML),
        `live` again when it is back on (a node first sampled then is made live by `node()`)."""
        if not enabled:
            node_id = self.node_id
            if node_id is None:
                node_id = self.store.system.node(self.host, host=self.host, via="local")
            self.store.system.set_node_state(node_id, "stopped", SAMPLING_OFF)
        elif self.node_id is not None:
            self.store.system.set_node_state(self.node_id, "live", self._sampler().note)
