"""What a `carl node` keeps in its home between runs: how far each log got, the console message on its way,
and what it has sent.

One JSON file per node name, `$CARL_HOME/node/<digest of the name>.json` (0600; the name is data, never a
path), replaced whole at each change. A console message is noted here before it is published and cleared once
the server acknowledged it: a node killed in between publishes that same message (same bytes, same message
id) first when it starts again, so the server or the engine drops it if it was stored, and the log goes on
from the end of it, neither lost nor doubled. A lock on the file keeps a second `carl node` of the same name
and home from running beside the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from engine.errors import CarlError


class NodeStateError(CarlError):
    """The node's state file cannot be used, in one line."""


def state_dir(home: Path) -> Path:
    path = home / "node"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def state_path(home: Path, name: str) -> Path:
    return state_dir(home) / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"


class NodeState:
    def __init__(self, home: Path, name: str) -> None:
        self.name = name
        self.path = state_path(home, name)
        self.logs: dict[str, dict[str, Any]] = {}  # console name -> path, epoch, n, dev, ino, offset
        self.inflight: dict[str, Any] | None = None  # a console message published and not yet acknowledged
        # samples, consoles and lines published, the newest sample's time, as the state file's JSON gives them
        self.published: dict[str, Any] = {"samples": 0, "consoles": 0, "lines": 0, "last_sample_t": None}
        self._lock: IO[str] | None = None

    def acquire(self) -> NodeState:
        """Take the lock and read what a previous run left (NodeStateError when another holds it)."""
        lock = open(self.path.with_suffix(".lock"), "a")  # noqa: SIM115 (held as long as the node runs)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise NodeStateError(
                f"another carl node named {self.name!r} runs with this home ({self.path.parent.parent})"
            ) from None
        self._lock = lock
        self._load()
        return self

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()
            self._lock = None

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise NodeStateError(f"{self.path}: unreadable ({exc}); remove it to start afresh") from None
        if not isinstance(data, dict) or data.get("name") != self.name:
            raise NodeStateError(f"{self.path}: not this node's state; remove it to start afresh")
        logs = data.get("logs")
        self.logs = {k: v for k, v in logs.items() if isinstance(v, dict)} if isinstance(logs, dict) else {}
        inflight = data.get("inflight")
        self.inflight = inflight if isinstance(inflight, dict) else None
        published = data.get("published")
        if isinstance(published, dict):
            self.published.update({k: v for k, v in published.items() if k in self.published})

    def save(self) -> None:
        data = {"name": self.name, "logs": self.logs, "inflight": self.inflight, "published": self.published}
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, separators=(",", ":"))
        os.replace(tmp, self.path)
