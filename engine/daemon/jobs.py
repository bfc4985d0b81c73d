"""Each of the engine's jobs on its own: a failure is logged once and retried later, and the other
jobs of the tick still run.

The engine's tick does many unrelated things (claim commands, ingest each source, turn the hook spool
into trajectories, analyse runs, send alerts, reap children, supervise the agents plane). A job that
raises must cost only itself: it is logged once per distinct failure (with its traceback the first
time), tried again after a delay that doubles up to a minute, and logged again when it recovers.
Sources (one per followed file) use the same backoff, keyed by source id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

from engine.text import one_line

T = TypeVar("T")
RETRY_FIRST_S = 1.0  # a job that raised is tried again this much later, then twice as late each time
RETRY_MOST_S = 60.0


def describe(exc: BaseException) -> str:
    """An error as one line: its type and message (a CarlError's message says it all)."""
    from engine.errors import CarlError

    return one_line(str(exc) if isinstance(exc, CarlError) else f"{type(exc).__name__}: {exc}", 300)


@dataclass
class Failing:
    error: str  # the last failure, one line
    failures: int  # in a row
    retry_at: float  # time.monotonic() when it may be tried again


class Backoff:
    """What is failing, by key, and when each may be tried again (from `first` seconds,
    doubling to `most`)."""

    def __init__(self, first: float = RETRY_FIRST_S, most: float = RETRY_MOST_S) -> None:
        self.first, self.most = first, most
        self.failing: dict[Hashable, Failing] = {}

    def due(self, key: Hashable) -> bool:
        failing = self.failing.get(key)
        return failing is None or time.monotonic() >= failing.retry_at

    def failed(self, key: Hashable, error: str) -> tuple[bool, float]:
        """Record a failure; returns whether it differs from the last one (log it) and the delay."""
        previous = self.failing.get(key)
        failures = previous.failures + 1 if previous else 1
        delay = min(self.first * 2 ** min(failures - 1, 16), self.most)
        self.failing[key] = Failing(error, failures, time.monotonic() + delay)
        return previous is None or previous.error != error, delay

    def recovered(self, key: Hashable) -> Failing | None:
        """Forget a failure (it worked, or it was asked for again); returns it, if there was one."""
        return self.failing.pop(key, None)

    def get(self, key: Hashable) -> Failing | None:
        return self.failing.get(key)


class Jobs:
    """Runs the engine's jobs, each isolated (see the module's docstring)."""

    def __init__(self, log: logging.Logger, backoff: Backoff | None = None) -> None:
        self.log = log
        self.backoff = backoff or Backoff()

    def run(self, name: str, job: Callable[..., T], *args: object, default: T, retry_later: bool = True) -> T:
        """`job(*args)`, or `default` when it raised (or is waiting out its backoff). Without `retry_later`
        it is tried again next tick (the heartbeat: cheap, and a late one looks like a dead engine)."""
        if retry_later and not self.backoff.due(name):
            return default
        try:
            result = job(*args)
        except Exception as exc:
            error = describe(exc)
            new, delay = self.backoff.failed(name, error)
            if new:
                after = f"; trying again in {delay:.0f}s" if retry_later else ""
                self.log.error("%s failed: %s%s", name, error, after, exc_info=exc)
            if not retry_later:
                self.backoff.failing[name].retry_at = 0.0
            return default
        if self.backoff.recovered(name) is not None:
            self.log.info("%s works again", name)
        return result
