"""Shared bench helpers: run a program in a real pseudo-terminal and read its screen with pyte.

A terminal program is measured the way a person meets it over SSH: bytes on the pty, and the
screen those bytes paint (pyte emulates the terminal).
"""

from __future__ import annotations

import fcntl
import math
import os
import pty
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyte

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


@dataclass
class PtyApp:
    """A child process on a pty of a fixed size, with a pyte screen fed by its output."""

    argv: list[str]
    cols: int = 160
    rows: int = 50
    env: dict[str, str] = field(default_factory=dict)
    pid: int = 0
    fd: int = -1
    started: float = 0.0
    bytes_read: int = 0

    def __post_init__(self) -> None:
        self.screen = pyte.Screen(self.cols, self.rows)
        self.stream = pyte.ByteStream(self.screen)

    def start(self) -> PtyApp:
        env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", **self.env}
        self.started = time.perf_counter()
        pid, fd = pty.fork()
        if pid == 0:  # child
            os.execvpe(self.argv[0], self.argv, env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        return self

    def pump(self, timeout: float) -> int:
        """Read whatever arrives within `timeout` seconds; returns the byte count."""
        got = 0
        deadline = time.perf_counter() + timeout
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return got
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return got
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return got
            if not data:
                return got
            got += len(data)
            self.bytes_read += len(data)
            self.stream.feed(data)

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 30.0) -> float:
        """Seconds since start until the screen satisfies `predicate` (raises on timeout).

        The screen is read again only when bytes arrived: rebuilding pyte's text is the costly
        part of this loop, and on a small machine it would take CPU from the program measured."""
        deadline = time.perf_counter() + timeout
        changed = True
        while time.perf_counter() < deadline:
            if changed and predicate(self.text()):
                return time.perf_counter() - self.started
            changed = self.pump(0.005) > 0
        raise TimeoutError(f"screen never matched; last screen:\n{self.text()}")

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
                for _ in range(50):
                    self.pump(0.02)
                    done, _ = os.waitpid(self.pid, os.WNOHANG)
                    if done:
                        break
                else:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(self.fd)
            self.pid = 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def tui_argv(home: Path) -> list[str]:
    return [sys.executable, "-m", "carl_tui", "--home", str(home), "--no-engine"]


def build_big_store(home: Path, steps: int = 1_000_000) -> Path:
    """A store holding one finished run of `steps` steps: Phi mean/p10/p90/entropy and three
    reward series. Built once and cached in bench/out (the rows are generated, the store and
    rollups are written by the real Store code)."""
    from engine.store import Store

    db = home / "carl.db"
    marker = home / f"built-{steps}"
    if marker.exists() and db.exists():
        return db
    home.mkdir(parents=True, exist_ok=True)
    for stale in home.glob("carl.db*"):
        stale.unlink()
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.arange(steps)
    phi = 0.2 + 0.6 / (1 + np.exp(-(x - steps * 0.4) / (steps * 0.05))) + rng.normal(0, 0.01, steps)
    series = {
        "phi/mean": phi,
        "phi/p10": phi - 0.1,
        "phi/p90": phi + 0.08,
        "phi/entropy": (1 - phi) * math.log(512),
        "rewards/task/mean": np.clip(phi + rng.normal(0, 0.05, steps), 0, 1),
        "rewards/format/mean": np.clip(0.5 + phi / 2 + rng.normal(0, 0.05, steps), 0, 1),
        "reward": phi * 2,
    }
    with Store(db) as store:
        run_id = store.create_run(
            "bench-1m", source_kind="jsonl", status="finished", max_steps=steps, vocab_size=512
        )
        now = time.time()
        chunk = 200_000
        for key, values in series.items():
            for lo in range(0, steps, chunk):
                rows = [
                    (int(s), key, float(v), now)
                    for s, v in zip(x[lo : lo + chunk], values[lo : lo + chunk], strict=True)
                ]
                store.add_metrics(run_id, rows)
            print(f"  built {key}", file=sys.stderr)
    marker.touch()
    return db
