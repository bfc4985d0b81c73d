"""Several nodes on this machine: `carl node --join` processes (each with its own home and name) publishing to
a real nats-server with a token, and one engine holding the store. Each process gets a free port or a temp
home and is stopped even when the test fails; every wait is for a point in the store, the stream or a
process's output.

What a node published is read back from the stream itself (by subject) and compared with what the engine
stored: equal sets of sample times mean nothing lost and nothing doubled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from engine import paths
from engine.agents.bus import Address, close, connect
from engine.agents.server import LocalServer, free_port, token_path
from engine.control import engine_status, start_engine, stop_engine
from engine.nodes.state import NodeState, state_path
from engine.nodes.stream import ensure_stream
from engine.nodes.wire import STREAM, encode
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
INTERVAL = "0.2"
LOST_AFTER_S = 3.0  # long enough that a loaded machine does not lose a node that still samples


@dataclass
class Room:
    """A nats-server, an engine reading nodes from it, and the node processes the test started."""

    root: Path
    server: LocalServer
    home: Path  # the engine's
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def token(self) -> str:
        return str(token_path(self.server.home))

    @property
    def address(self) -> Address:
        return Address(self.server.url, self.token)

    def start_node(self, name: str, *extra: str, url: str | None = None, token: str | None = None) -> Path:
        """`carl --home ROOT/NAME node --join URL --name NAME ...`; returns its home (its stderr is node.err
        there)."""
        home = self.root / name
        home.mkdir(exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "engine.cli",
            "--home",
            str(home),
            "node",
            "--join",
            url or self.server.url,
            "--name",
            name,
            "--token-file",
            token or self.token,
            "--interval",
            INTERVAL,
            *extra,
        ]
        with open(home / "node.err", "ab") as err:
            self.nodes[name] = subprocess.Popen(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=err, stderr=err
            )
        return home

    def said(self, name: str) -> str:
        return (self.root / name / "node.err").read_text(errors="replace")

    def stop_nodes(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def room(tmp_path: Path, *, nodes_url: bool = True) -> Iterator[Room]:
    server = LocalServer(tmp_path / "nats", free_port())
    server.start()
    home = tmp_path / "engine"
    home.mkdir()
    here = Room(tmp_path, server, home)
    table = f'[nodes]\nurl = "{server.url}"\ntoken_file = "{here.token}"\n' if nodes_url else "[nodes]\n"
    (home / "engine.toml").write_text(f"[system]\nenabled = false\n{table}lost_after_s = {LOST_AFTER_S}\n")
    try:
        yield here
    finally:
        here.stop_nodes()
        stop_engine(home, timeout=5.0)
        server.stop()


def engine_up(home: Path) -> int:
    status, _ = start_engine(home)
    assert status.state == "up" and status.pid is not None
    return status.pid


# -- reading the store and the stream ------------------------------------------------------------------------


def read(home: Path, fn: Any) -> Any:
    reader = StoreReader(paths.db_path(home))
    try:
        return fn(reader)
    finally:
        reader.close()


def states(home: Path) -> dict[str, tuple[str, str | None]]:
    """The nodes heard over NATS (the engine's own machine, sampling off here, is left out)."""
    return read(
        home, lambda r: {n["name"]: (n["state"], n["note"]) for n in r.system.nodes() if n["via"] == "nats"}
    )


def stored_times(home: Path, name: str) -> list[float]:
    """The times of the samples the engine stored for node `name` (every sample has cpu/percent)."""
    rows = read(
        home,
        lambda r: r.conn.execute(
            "SELECT s.t FROM system_samples s JOIN nodes n ON n.id = s.node_id WHERE n.name=?"
            " AND s.key='cpu/percent' ORDER BY s.t",
            (name,),
        ).fetchall(),
    )
    return [t for (t,) in rows]


def stream_messages(address: Address, subject: str) -> list[bytes]:
    """Every message the stream holds on `subject`, oldest first (what the server acknowledged to the
    nodes)."""
    import nats

    async def fetch() -> list[bytes]:
        nc = await connect(address, "test-reader", reconnect=False)
        try:
            js = nc.jetstream()
            out, seq = [], 1
            while True:
                try:
                    raw = await js.get_msg(STREAM, seq=seq, subject=subject, next=True)
                except nats.js.errors.NotFoundError:
                    return out
                out.append(raw.data or b"")
                seq = raw.seq + 1
        finally:
            await close(nc)

    return asyncio.run(fetch())


def stream_times(address: Address, name: str) -> list[float]:
    return sorted(json.loads(m)["sample"]["t"] for m in stream_messages(address, f"carl.nodes.{name}.sample"))


def published(node_home: Path, name: str) -> dict[str, Any]:
    """What the node says the server acknowledged (its state file)."""
    return json.loads(state_path(node_home, name).read_text())["published"]


def console_of(home: Path, node: str) -> dict[str, Any] | None:
    rows = read(home, lambda r: [c for c in r.system.node_consoles() if c["node"] == node])
    return rows[0] if rows else None


def write_lines(path: Path, first: int, count: int) -> list[str]:
    lines = [f"step {i}: loss {1 / (i + 1):.4f}" for i in range(first, first + count)]
    with open(path, "a") as out:
        out.write("".join(line + "\n" for line in lines))
    return lines


# -- the done-when: three nodes, one killed, one back --------------------------------------------------------


def test_three_nodes_appear_one_killed_is_lost_with_everything_it_sent_and_comes_back(tmp_path: Path) -> None:
    with room(tmp_path) as here:
        engine_up(here.home)
        with Store(paths.db_path(here.home)) as store:
            run_id = store.create_run("r1", source_kind="jsonl")
        train = tmp_path / "train.log"
        written = write_lines(train, 0, 50)
        here.start_node("n1", "--log", str(train), "--run", "r1")
        n2_log = tmp_path / "rank1.log"
        n2_lines = write_lines(n2_log, 0, 300)
        n2_home = here.start_node("n2", "--log", str(n2_log))
        here.start_node("n3")
        for name in ("n1", "n2", "n3"):
            wait_for(lambda n=name: len(stored_times(here.home, n)) >= 3, 60, f"samples of {name}")
        assert {name: s for name, (s, _) in states(here.home).items()} == {
            "n1": "live",
            "n2": "live",
            "n3": "live",
        }
        now = read(here.home, lambda r: r.system.now())
        assert len(now) == 3 and all(sample["cpu"] is not None for sample in now.values())

        written += write_lines(train, 50, 500)
        expected = "".join(line + "\n" for line in written)
        wait_for(
            lambda: (c := console_of(here.home, "n1")) is not None and c["lines"] == len(written),
            60,
            "n1's console",
        )
        console = console_of(here.home, "n1")
        assert console is not None and Path(console["path"]).read_text() == expected
        [registered] = read(here.home, lambda r: r.system.run_consoles(run_id))
        assert (registered["kind"], registered["node"], registered["path"]) == ("node", "n1", console["path"])

        # n2 killed while its log grows: lost after the timeout, and every sample the server took from it is
        # stored, once.
        wait_for(lambda: published(n2_home, "n2")["lines"] == 300, 60, "n2's first lines sent")
        n2_lines += write_lines(n2_log, 300, 3000)
        here.nodes["n2"].send_signal(signal.SIGKILL)
        here.nodes["n2"].wait()
        wait_for(lambda: states(here.home)["n2"][0] == "lost", 60, "n2 lost")
        assert states(here.home)["n2"][1] == f"no sample for {LOST_AFTER_S:g} s"
        assert states(here.home)["n1"][0] == states(here.home)["n3"][0] == "live"
        sent = stream_times(here.address, "n2")
        wait_for(lambda: stored_times(here.home, "n2") == sent, 60, "every sample of n2 stored")
        stored = stored_times(here.home, "n2")
        assert len(sent) >= 3
        counted = published(n2_home, "n2")
        assert counted["samples"] <= len(stored) and counted["last_sample_t"] in stored

        # n2 comes back under the same name: live again, and it goes on.
        n2_lines += write_lines(n2_log, 3300, 200)
        here.start_node("n2", "--log", str(n2_log))
        gpu_note = states(here.home)["n1"][
            1
        ]  # what a live node's note says: "no NVIDIA GPU: ..." here, or None
        wait_for(lambda: states(here.home)["n2"] == ("live", gpu_note), 60, "n2 live again")
        wait_for(lambda: len(stored_times(here.home, "n2")) > len(stored) + 2, 60, "n2's new samples")
        # its log goes on from where the server got it: every line once, in order
        wait_for(
            lambda: (c := console_of(here.home, "n2")) is not None and c["lines"] >= len(n2_lines),
            60,
            "n2's log",
        )
        n2_console = console_of(here.home, "n2")
        assert n2_console is not None and Path(n2_console["path"]).read_text() == "".join(
            line + "\n" for line in n2_lines
        )

        # n3 stopped: it says bye, exits 0, and is marked stopped; nothing it sent is missing.
        here.nodes["n3"].send_signal(signal.SIGTERM)
        assert here.nodes["n3"].wait(30) == 0
        wait_for(lambda: states(here.home)["n3"] == ("stopped", "said bye (SIGTERM)"), 60, "n3 stopped")
        assert stored_times(here.home, "n3") == stream_times(here.address, "n3")
        assert "stopped (SIGTERM):" in here.said("n3") and "Traceback" not in here.said("n3")
        n1 = read(here.home, lambda r: next(n["id"] for n in r.system.nodes() if n["name"] == "n1"))
        series = read(here.home, lambda r: r.system.series(n1, "cpu/percent", 0, time.time() + 60))
        assert series.width == 0 and len(series) == len(stored_times(here.home, "n1"))
        listing = subprocess.run(
            [sys.executable, "-m", "engine.cli", "--home", str(here.home), "node", "--list"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listing.returncode == 0 and f"reads nodes from {here.server.url}: reading" in listing.stdout
        assert "n3" in listing.stdout and "said bye (SIGTERM)" in listing.stdout


# -- hostile nodes -------------------------------------------------------------------------------------------


def test_malformed_messages_are_rejected_rows_with_reasons_while_the_others_go_on(tmp_path: Path) -> None:
    with room(tmp_path) as here:
        engine_up(here.home)
        here.start_node("n1")
        wait_for(lambda: len(stored_times(here.home, "n1")) >= 3, 60, "samples of n1")

        big = b'{"type": "sample", "node": "bad", "pad": "' + b"x" * 300_000 + b'"}'

        async def publish_garbage() -> None:
            nc = await connect(here.address, "hostile")
            try:
                js = nc.jetstream()
                await ensure_stream(js)
                good = {"type": "sample", "node": "probe", "sample": {"t": time.time(), "cpu": 1.0}}
                for subject, data in [
                    ("carl.nodes.bad.sample", b"{not json"),
                    (
                        "carl.nodes.bad.sample",
                        encode({"type": "sample", "node": "bad", "sample": {"t": 1, "cpu": -5}}),
                    ),
                    ("carl.nodes.evil.sample", encode({"type": "sample", "node": "../../etc/passwd"})),
                    ("carl.nodes.bad.sample", big),
                    ("carl.nodes.n1.hello", encode({"type": "bye", "node": "n1"})),
                    ("carl.nodes.probe.sample", encode(good)),
                ]:
                    await js.publish(subject, data, timeout=5)
            finally:
                await close(nc)

        asyncio.run(publish_garbage())
        wait_for(
            lambda: len(read(here.home, lambda r: r.system.node_rejected())) == 5, 60, "five rejected rows"
        )
        rejected = read(here.home, lambda r: r.system.node_rejected())
        reasons = [(row["node"], row["reason"]) for row in reversed(rejected)]
        assert reasons[0][0] == "bad" and reasons[0][1].startswith("not JSON: ")
        assert reasons[1:] == [
            ("bad", "sample: cpu: -5 is out of range"),
            ("../../etc/passwd", "node: only letters, digits, '_' and '-' (starting with a letter or digit)"),
            ("bad", f"too large: {len(big):,} bytes (at most 262,144)"),
            ("n1", "type: 'bye', but the subject says 'hello'"),
        ]
        assert len(rejected[1]["payload"]) == 2000  # its first characters are kept, as text
        wait_for(lambda: "probe" in states(here.home), 60, "the good message after the bad ones")
        before = len(stored_times(here.home, "n1"))
        wait_for(lambda: len(stored_times(here.home, "n1")) > before + 2, 60, "n1 going on")
        assert states(here.home)["n1"][0] == "live" and set(states(here.home)) == {"n1", "probe"}
        assert not (here.home / "etc").exists() and not list((here.home / "nodes").glob("*/..*"))
        assert "Traceback" not in (here.home / "logs" / "engine.log").read_text()


def test_a_wrong_token_ends_the_node_with_one_line(tmp_path: Path) -> None:
    with room(tmp_path) as here:
        wrong = tmp_path / "wrong-token"
        wrong.write_text("not-the-token\n")
        here.start_node("n1", token=str(wrong))
        assert here.nodes["n1"].wait(60) == 2
        [line] = here.said("n1").splitlines()
        why = "authorization violation (wrong or missing token or credentials)"
        assert line.endswith(f"carl node n1: {here.server.url}: {why}")


# -- faults: the server goes away, the engine is killed ------------------------------------------------------


def test_a_node_keeps_its_samples_while_the_server_is_away_and_sends_them_when_it_is_back(
    tmp_path: Path,
) -> None:
    with room(tmp_path) as here:
        engine_up(here.home)
        here.start_node("n1")
        wait_for(lambda: len(stored_times(here.home, "n1")) >= 3, 60, "samples of n1")
        away = time.time()
        here.server.stop()
        wait_for(
            lambda: "disconnected; samples are kept" in here.said("n1"), 60, "the node seeing the server go"
        )
        time.sleep(1.5)  # an outage of several intervals (a duration, not a race: nothing is waited for)
        back = time.time()
        here.server.start()
        wait_for(lambda: "reconnected; sending the" in here.said("n1"), 60, "the node back on the server")
        wait_for(
            lambda: len([t for t in stored_times(here.home, "n1") if away < t < back]) >= 5,
            60,
            "the gap filled",
        )
        assert here.nodes["n1"].poll() is None
        here.nodes["n1"].send_signal(signal.SIGTERM)
        assert here.nodes["n1"].wait(30) == 0
        wait_for(lambda: states(here.home)["n1"][0] == "stopped", 60, "n1 stopped")
        assert stored_times(here.home, "n1") == stream_times(here.address, "n1")
        assert "Traceback" not in here.said("n1")


def test_the_engine_killed_mid_stream_stores_every_sample_and_line_exactly_once(tmp_path: Path) -> None:
    with room(tmp_path) as here:
        logs = {name: tmp_path / f"{name}.log" for name in ("n1", "n2")}
        written = {name: write_lines(path, 0, 3000) for name, path in logs.items()}
        for name, path in logs.items():
            here.start_node(name, "--log", str(path))
        # A backlog waits in the stream (no engine yet): the engine is killed while it catches up.
        wait_for(lambda: len(stream_times(here.address, "n2")) >= 10, 60, "a backlog in the stream")
        first = engine_up(here.home)
        wait_for(lambda: stored_times(here.home, "n1") or stored_times(here.home, "n2"), 60, "the first rows")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: engine_status(here.home).state == "down", 60, "the killed engine gone")
        for name, path in logs.items():
            written[name] += write_lines(path, 3000, 2000)
        second = engine_up(here.home)
        assert second != first
        for name in logs:  # every line read and acknowledged before the nodes stop
            wait_for(lambda n=name: published(here.root / n, n)["lines"] == 5000, 60, f"{name}'s lines sent")
        for name, proc in here.nodes.items():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, here.said(name)
        for name in logs:
            wait_for(
                lambda n=name: states(here.home).get(n, ("",))[0] == "stopped", 60, f"{name}'s bye stored"
            )
            assert stored_times(here.home, name) == stream_times(here.address, name)
            console = console_of(here.home, name)
            assert console is not None and console["lines"] == 5000
            assert Path(console["path"]).read_text() == "".join(line + "\n" for line in written[name])
        with Store(paths.db_path(here.home)) as store:
            assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            for name in logs:
                folded = store.conn.execute(
                    "SELECT sum(r.n) FROM system_rollups r JOIN nodes n ON n.id = r.node_id WHERE n.name=?"
                    " AND r.key='cpu/percent' AND r.width=60",
                    (name,),
                ).fetchone()[0]
                assert folded == len(stored_times(here.home, name))  # each sample folded into its rollup once


# -- the agents plane's server -------------------------------------------------------------------------------


def test_without_a_nodes_url_the_engine_reads_nodes_from_the_agents_planes_server(tmp_path: Path) -> None:
    with room(tmp_path, nodes_url=False) as here:
        engine_up(here.home)
        with Store(paths.db_path(here.home)) as store:
            up = store.enqueue_command(
                "agents_up", {"workers": 0, "tasks": "demo"}, target="engine", origin="cli"
            )

        def plane_port() -> int | None:
            done = read(
                here.home, lambda r: r.conn.execute("SELECT state FROM commands WHERE id=?", (up,)).fetchone()
            )
            server = read(here.home, lambda r: r.kv("agents.server")) or {}
            return server.get("port") if done and done[0] == "done" and server.get("state") == "up" else None

        port = wait_for(plane_port, 120, "the agents plane up")
        here.start_node("n1", url=f"nats://127.0.0.1:{port}", token=str(token_path(here.home)))
        wait_for(
            lambda: len(stored_times(here.home, "n1")) >= 3, 60, "samples of n1 through the plane's server"
        )
        reading = read(here.home, lambda r: r.kv("nodes.consumer"))
        assert reading["url"] == f"nats://127.0.0.1:{port}" and reading["state"] == "reading"
        with Store(paths.db_path(here.home)) as store:
            store.enqueue_command("agents_down", {}, target="engine", origin="cli")
        wait_for(lambda: states(here.home)["n1"][0] == "lost", 120, "n1 lost once the plane is down")
        assert "nothing reads the nodes' stream" in (states(here.home)["n1"][1] or "")
        assert here.nodes["n1"].poll() is None  # the node waits for the server to come back


def test_the_console_message_a_killed_node_left_on_its_way_is_sent_again_first_and_stored_once(
    tmp_path: Path,
) -> None:
    """The window `kill -9` can hit: the server took a console message, the node never noted its ack."""
    with room(tmp_path) as here:
        engine_up(here.home)
        log = tmp_path / "train.log"
        lines = write_lines(log, 0, 10)
        head = "".join(line + "\n" for line in lines[:5]).encode()
        body = {"console": "train.log", "source": str(log), "run": None, "epoch": "e0", "n": 1, "offset": 0}
        data = encode(
            {"type": "console", "node": "n1", "host": "h", "boot": "b0", **body, "lines": lines[:5]}
        )
        st = log.stat()
        follow = {
            "path": str(log),
            "epoch": "e0",
            "n": 1,
            "dev": st.st_dev,
            "ino": st.st_ino,
            "offset": len(head),
        }
        home = tmp_path / "n1"
        home.mkdir()
        state = NodeState(home, "n1")
        state.inflight = {
            "subject": "carl.nodes.n1.console",
            "data": data.decode(),
            "msg_id": "n1.e0.1",
            "console": "train.log",
            "follow": follow,
            "lines": 5,
        }
        state.save()

        async def as_the_killed_node_did() -> None:
            nc = await connect(here.address, "killed-node")
            try:
                js = nc.jetstream()
                await ensure_stream(js)
                await js.publish("carl.nodes.n1.console", data, headers={"Nats-Msg-Id": "n1.e0.1"}, timeout=5)
            finally:
                await close(nc)

        asyncio.run(as_the_killed_node_did())
        here.start_node("n1", "--log", str(log))
        wait_for(lambda: published(home, "n1")["lines"] == 10, 60, "the node's lines sent")
        wait_for(
            lambda: (c := console_of(here.home, "n1")) is not None and c["lines"] == 10, 60, "the console"
        )
        console = console_of(here.home, "n1")
        assert console is not None and Path(console["path"]).read_text() == "".join(
            line + "\n" for line in lines
        )
        assert len(stream_messages(here.address, "carl.nodes.n1.console")) == 2  # the repeat was stored once
        assert json.loads(state_path(home, "n1").read_text())["inflight"] is None
