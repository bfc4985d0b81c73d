"""The one launcher of the agents plane: the settings file its processes read, the NATS server it runs on
(or the URL it is given), each process (manager, workers, trainer) with its argv, environment and log, and
stopping them.

Both ways the plane runs start it here: the engine's plane (plane.py: it supervises what this starts,
restarting a process that dies with backoff) and `carl agents run` (carl_agents.py's `headless`: until every
task is done, its manager in its own event loop). What an engine that was killed left running is found again
by the argv this gives each process (`stop_leftovers`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import paths

from .bus import Address
from .server import LocalServer, listening, local_url, token_path

if TYPE_CHECKING:
    from engine.store import Store

    from .plane_settings import AgentsSettings

STOP_WAIT_S = 15.0  # a process asked to stop gets this long to finish its task


def plane_dir(home: Path) -> Path:
    path = home / "agents"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def write_settings(home: Path, settings: AgentsSettings, name: str = "plane.json") -> Path:
    """The settings every child process reads (no secret in them: the token stays in its file)."""
    path = plane_dir(home) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(settings.model_dump_json(indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


# -- where the plane is ----------------------------------------------------------------------------


def given_address(settings: AgentsSettings) -> Address | None:
    """The plane's address when a URL is given (`--url`, $CARL_NATS_URL or $NATS_URL, `agents.url`): then
    no server of ours runs."""
    from .bus import resolve_address
    from .plane_settings import env_url

    return resolve_address(settings) if (settings.url or env_url()) else None


def start_server(home: Path, port: int) -> tuple[LocalServer, Address]:
    """This home's nats-server on `port`, listening; with the address of it that the processes get."""
    server = LocalServer(home, port)
    server.start()
    return server, Address(local_url(port), str(token_path(home)), local=True)


def engine_server(home: Path, store: Store) -> Address | None:
    """The engine's local server, when the store says it is up and its port is listening."""
    running = store.kv("agents.server") or {}
    port = running.get("port")
    if running.get("local") and running.get("state") == "up" and isinstance(port, int) and listening(port):
        return Address(local_url(port), str(token_path(home)), local=True)
    return None


# -- the processes -----------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a plane process: offline from the hub unless told otherwise, no tokenizer threads,
    no progress bars in its log."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        **extra,
    }


def child_argv(role: str, home: Path, settings_file: Path, address: Address, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "engine.agents",
        role,
        "--home",
        str(home),
        "--settings",
        str(settings_file),
        *address.argv(),
        *extra,
    ]


@dataclass
class Child:
    """One process of the plane: its role, id, argv, and how it has been doing."""

    role: str  # manager | worker | trainer
    ident: str
    argv: list[str]
    log_path: Path
    one_thread: bool = False  # OMP_NUM_THREADS=1 unless the environment sets it
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    crashes: int = 0
    restart_at: float | None = None
    stopping: bool = False
    state: str = "starting"  # starting | running | restarting | stopped | failed
    last_exit: int | None = None

    def spawn(self) -> None:
        threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")} if self.one_thread else {}
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                close_fds=True,
                start_new_session=True,
                env=child_env(**threads),
            )
        self.started_at = time.monotonic()
        self.restart_at = None
        self.state = "running"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        """Its exit status once it has exited (None: running, or never started)."""
        return self.proc.poll() if self.proc is not None else None

    def describe(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "id": self.ident,
            "state": self.state,
            "pid": self.pid,
            "crashes": self.crashes,
            "last_exit": self.last_exit,
            "log": str(self.log_path),
        }


class Launcher:
    """Starts the plane's processes for one home: each reads `settings_file`, joins `address`, and writes
    `logs/agents-<id>.log`. Keeps what it started (`children`, by id) until it is stopped.

    `one_thread`: each process gets OMP_NUM_THREADS=1 unless the environment sets it (the engine's plane);
    without it the environment's setting, or none, is theirs (a headless run)."""

    def __init__(self, home: Path, settings_file: Path, address: Address, *, one_thread: bool) -> None:
        self.home = home
        self.settings_file = settings_file
        self.address = address
        self.one_thread = one_thread
        self.children: dict[str, Child] = {}

    def start(self, role: str, ident: str, *extra: str) -> Child:
        """Start one process: a manager, a worker (given `--id ident` after `extra`) or a trainer."""
        argv = child_argv(role, self.home, self.settings_file, self.address, *extra)
        if role == "worker":
            argv += ["--id", ident]
        log_path = paths.logs_dir(self.home) / f"agents-{ident}.log"
        child = Child(role, ident, argv, log_path, one_thread=self.one_thread)
        child.spawn()
        self.children[ident] = child
        return child

    def stop(self, children: Sequence[Child] | None = None, wait: float = STOP_WAIT_S) -> None:
        """Stop `children` (default: every one) at once, each marked stopping, then stopped."""
        chosen = list(self.children.values()) if children is None else list(children)
        for child in chosen:
            child.stopping = True
        stop_processes([c.proc for c in chosen], wait)
        for child in chosen:
            child.state = "stopped"


def stop_processes(procs: Sequence[subprocess.Popen[bytes] | None], wait: float = STOP_WAIT_S) -> None:
    """Stop them all at once: SIGTERM to each, then wait, then SIGKILL what is left after `wait`."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- what a killed engine left running ----------------------------------------------------------------


def stop_leftovers(store: Store, home: Path) -> int:
    """Stop what an engine that was killed left running of its plane (its manager, workers, trainer,
    then its server), by the pids it recorded; returns how many were stopped."""
    server = store.kv("agents.server") or {}
    plane = store.kv("agents.plane") or {}
    children = [p.get("pid") for p in plane.get("processes") or []]
    return _stop_pids(children, home) + _stop_pids([server.get("pid")], home)


def _stop_pids(pids: list[Any], home: Path, wait: float = STOP_WAIT_S) -> int:
    """SIGTERM those of `pids` that are this home's plane processes, SIGKILL after `wait`; how many."""
    found = [pid for pid in pids if isinstance(pid, int) and _plane_process(pid, home)]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    left, deadline = found, time.monotonic() + wait
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if _plane_process(pid, home)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


def _plane_process(pid: int, home: Path) -> bool:
    """Whether `pid` is alive and one of this home's plane processes (never someone else's reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask ps
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
        )
        argv = out.stdout
    if not argv.strip():
        return False  # a zombie, or gone
    ours_server = "nats-server" in argv and str(home / "nats" / "server.conf") in argv
    ours_child = "engine.agents" in argv and f"--home {home} " in argv + " "
    return ours_server or ours_child
