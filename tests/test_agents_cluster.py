"""The agents plane across machines, on a NATS cluster: three real nats-servers on loopback, routed as one
cluster with JetStream clustered; the plane's stream in 3 replicas; the manager on node A, two workers
started as on other machines (`carl agents worker --url LIST`) on nodes B and C; the node of the worker
busy with a held task killed (SIGKILL) mid-task. The clients fail over, the plane carries on, and every task
is handled exactly once. Also: a worker that starts while the cluster has no leader waits for one; the
one-line error for more replicas than the servers can keep; and the audit reading back, by sequence,
events a dying node counted as pushed but never delivered."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import nats
import psutil
import pytest
from agents_support import address_of, cluster_url, jetstream, meta_leader, nats_cluster, nats_server
from nats.js.api import AckPolicy, ConsumerConfig
from openai_server import OpenAIServer
from support import wait_for
from test_agents_cli import carl, one_line_error
from test_agents_plane import (
    _busy_worker,
    arithmetic_tasks,
    counts,
    http_settings,
    one_result_per_task,
    solve,
)

from engine.agents.audit import Incoming, fill_gaps, stream_epoch
from engine.agents.bus import STREAM, Address, connect, ensure_stream, publish
from engine.agents.bus import close as bus_close
from engine.agents.carl_agents import headless
from engine.agents.events import WorkerStatusEvent
from engine.agents.launcher import stop_processes
from engine.agents.plane_settings import AgentsSettings
from engine.agents.server import AgentsError, LocalServer, token_path
from engine.agents.tasks import load_tasks
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow

TASKS = 60
HELD = 30  # the task whose answer the model server holds while the worker's node is killed
ACK_WAIT_S = 5


def start_worker(
    root: Path, worker_id: str, url: str, token: str, llm: OpenAIServer
) -> subprocess.Popen[bytes]:
    """A worker as a second machine runs it: a home and agents.yaml of its own, the cluster's URLs with its
    own node first. Its settings say nothing of replicas: a worker that joins does not lower them."""
    home = root / worker_id
    home.mkdir(parents=True)
    (home / "agents.yaml").write_text(f"agents:\n  ack_wait_s: {ACK_WAIT_S}\n")
    argv = [
        sys.executable,
        "-m",
        "engine.cli",
        "agents",
        "worker",
        "--url",
        url,
        "--token-file",
        token,
        "--kind",
        "http",
        "--endpoint",
        llm.base_url,
        "--endpoint-model",
        llm.model,
        "--task-type",
        "math",
        "--id",
        worker_id,
    ]
    with (home / "worker.log").open("wb") as log:
        return subprocess.Popen(
            argv,
            env={**os.environ, "CARL_HOME": str(home)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def node_ports(pid: int, nodes: list[LocalServer]) -> set[int]:
    """The client ports of `nodes` that process `pid` holds an established connection to."""
    ports = {node.port for node in nodes}
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return {c.raddr.port for c in connections if c.raddr and c.status == psutil.CONN_ESTABLISHED} & ports


def workers_seen(db: Path) -> set[str]:
    """The workers that said, through the audit, that they are up."""
    if not db.exists():
        return set()
    reader = StoreReader(db)
    try:
        return {w["worker_id"] for w in reader.agent_workers()}
    finally:
        reader.close()


async def replication(address: Address, timeout: float = 60.0) -> tuple[int, dict[str, int]]:
    """The stream's replicas, and the peers beside the leader of each durable consumer. Asked again while
    the cluster does not answer (a node just killed: its leaders are being elected anew)."""
    nc = await connect(address, "replication-probe")
    deadline = time.monotonic() + timeout
    try:
        js = nc.jetstream()
        while True:
            try:
                info = await js.stream_info(STREAM)
                consumers = {
                    c.config.durable_name: len(c.cluster.replicas or [])
                    for c in await js.consumers_info(STREAM)
                    if c.config.durable_name and c.cluster is not None
                }
                return info.config.num_replicas, consumers
            except (TimeoutError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)
    finally:
        await bus_close(nc)


async def test_a_killed_node_leaves_the_plane_running_and_every_task_handled_once(tmp_path: Path) -> None:
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", TASKS))
    home = tmp_path / "manager-home"  # the manager's machine: the audit goes to its store
    with nats_cluster(tmp_path / "cluster") as nodes, OpenAIServer(responder=solve) as llm:
        a, b, c = nodes
        token = str(token_path(a.home))
        await meta_leader(Address(cluster_url(a, b, c), token))
        # A result a dying node pushed to the manager and never delivered comes again after the manager's
        # ack wait (60 s): the task's timeout is longer, so such a task is late, not lost.
        settings = http_settings(
            llm,
            workers=0,
            url=cluster_url(a, b, c),
            token_file=token,
            replicas=3,
            ack_wait_s=ACK_WAIT_S,
            task_timeout_s=150,
        )
        llm.hold(lambda body: f"(task {HELD})" in body["messages"][-1]["content"])
        node_of = {"wb": b, "wc": c}
        workers: dict[str, subprocess.Popen[bytes]] = {}
        run = asyncio.create_task(headless(home, settings, specs, limit=None))
        try:
            for ident, first in node_of.items():  # each worker's list names its own node first
                others = [n for n in nodes if n is not first]
                workers[ident] = start_worker(tmp_path, ident, cluster_url(first, *others), token, llm)
            for ident, proc in workers.items():
                ports = {node_of[ident].port}
                await asyncio.to_thread(
                    wait_for, lambda p=proc.pid, w=ports: node_ports(p, nodes) == w, 60, ident
                )
            # Both workers are up (their consumer made, their status stored) before a node dies. (A worker
            # still starting when the cluster loses a leader stops on a JetStream timeout; the engine
            # restarts its workers, one started by hand must be started again.)
            db = home / "carl.db"
            await asyncio.to_thread(wait_for, lambda: workers_seen(db) >= set(workers), 60, "both workers up")
            # Mid-run: a worker is inside the held task.
            assert await asyncio.to_thread(llm.wait_held, 1, 60.0)
            victim = await _busy_worker(home / "carl.db", f"What is {HELD} + {HELD + 1}")
            node = node_of[victim["worker_id"]]
            assert node_ports(os.getpid(), nodes) == {a.port}  # the manager and the audit, here, are on A
            replicas, consumers = await replication(Address(a.url, token))
            assert replicas == 3  # agents.replicas reached the stream ...
            assert f"workers-{settings.task_type}" in consumers  # ... and its consumers inherit them:
            assert set(consumers.values()) == {2}  # a leader and two more peers each
            reader = StoreReader(home / "carl.db")
            try:
                done = reader.conn.execute("SELECT count(*) FROM agent_tasks WHERE state='done'").fetchone()
            finally:
                reader.close()
            assert done[0] <= HELD + settings.concurrency < TASKS  # most of the run is still ahead

            assert node.proc is not None
            node.proc.kill()  # SIGKILL: no goodbye to the cluster or the clients
            node.proc.wait(10)
            survivors = [n for n in nodes if n is not node]
            pid = workers[victim["worker_id"]].pid
            await asyncio.to_thread(wait_for, lambda: node_ports(pid, survivors), 60, "a failover")
            llm.release()  # the victim answers the held task over its new node
            summary = await asyncio.wait_for(run, 240)

            assert (summary["assigned"], summary["done"]) == (TASKS, TASKS)
            assert (summary["failed"], summary["timed_out"]) == (0, 0)
            assert summary["mean_verifier"] == 1.0
            replicas, _ = await replication(Address(cluster_url(*survivors), token))
            assert replicas == 3  # the workers' default settings did not lower it
        finally:
            llm.release()
            await asyncio.to_thread(stop_processes, list(workers.values()), 15.0)
            if not run.done():
                run.cancel()
            with contextlib.suppress(BaseException):
                await run
    with Store(home / "carl.db") as store:
        kinds = counts(store)
        assert (kinds["task"], kinds["result"], kinds["rollout"], kinds["feedback"]) == (TASKS,) * 4
        one_result_per_task(store)
        rows = store.conn.execute("SELECT state, worker_id, verifier_score FROM agent_tasks").fetchall()
    assert len(rows) == TASKS and all(r[0] == "done" and r[2] == 1.0 for r in rows)
    other = "wc" if victim["worker_id"] == "wb" else "wb"
    assert other in {r[1] for r in rows} <= {"wb", "wc"}
    victim_log = (tmp_path / victim["worker_id"] / "worker.log").read_text()
    assert "disconnected" in victim_log and "reconnected" in victim_log


async def test_a_worker_that_starts_while_the_cluster_has_no_leader_waits_for_one(tmp_path: Path) -> None:
    """Two nodes of three down: JetStream has no quorum, so the worker's first requests time out. It waits
    (and says so) instead of stopping, and takes tasks once a node is back."""
    with nats_cluster(tmp_path / "cluster") as nodes, OpenAIServer(responder=solve) as llm:
        a, b, c = nodes
        address = Address(a.url, str(token_path(a.home)))
        await meta_leader(address)
        nc = await connect(address, "probe")
        worker = None
        try:
            js = nc.jetstream(timeout=1)
            await ensure_stream(js, AgentsSettings().stream, replicas=3)
            await asyncio.to_thread(b.stop)
            await asyncio.to_thread(c.stop)
            worker = start_worker(tmp_path, "wa", a.url, str(token_path(a.home)), llm)
            log = tmp_path / "wa" / "worker.log"
            await asyncio.to_thread(
                wait_for, lambda: "waiting for JetStream" in log.read_text(), 60, "a wait"
            )
            await asyncio.to_thread(b.start)  # a quorum again: the cluster elects its leaders

            async def pulling() -> bool:  # the worker's consumer exists and the worker waits on it for a task
                with contextlib.suppress(Exception):
                    return (await js.consumer_info(STREAM, "workers-math")).num_waiting >= 1
                return False

            deadline = asyncio.get_running_loop().time() + 90
            while not await pulling():
                assert worker.poll() is None, log.read_text()[-2000:]
                assert asyncio.get_running_loop().time() < deadline, "the worker did not take up its consumer"
                await asyncio.sleep(0.1)
        finally:
            if worker is not None:
                await asyncio.to_thread(stop_processes, [worker], 15.0)
            await bus_close(nc)
    assert worker.returncode == 0 and "Traceback" not in log.read_text()


async def test_more_replicas_than_the_servers_can_keep_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    with nats_cluster(tmp_path / "cluster") as nodes:
        token = str(token_path(nodes[0].home))
        await meta_leader(Address(cluster_url(*nodes), token))
        config = tmp_path / "agents.yaml"
        config.write_text("agents:\n  replicas: 5\n  workers: 0\n")
        args = ["agents", "run", "--url", cluster_url(*nodes), "--token-file", token, "--config", str(config)]
        line = one_line_error(await asyncio.to_thread(carl, tmp_path / "home", *args))
        assert line == (
            "carl: agents.replicas 5: the NATS server cannot keep 5 copies of CARL_AGENTS: "
            "no suitable peers for placement"
        )
        bad = f"{nodes[0].url},http://{nodes[1].url.removeprefix('nats://')}"
        line = one_line_error(await asyncio.to_thread(carl, tmp_path / "home", "agents", "run", "--url", bad))
        assert line.startswith("carl: ") and f"'{bad.split(',')[1]}' is not a nats://" in line
    with nats_server(tmp_path / "solo") as solo:  # one server is no cluster: it keeps one copy
        nc = await connect(Address(solo.url, str(token_path(solo.home))), "t")
        try:
            with pytest.raises(AgentsError) as caught:
                await ensure_stream(nc.jetstream(), AgentsSettings().stream, replicas=3)
        finally:
            await bus_close(nc)
    assert str(caught.value) == (
        "agents.replicas 3: the NATS server cannot keep 3 copies of CARL_AGENTS: "
        "replicas > 1 not supported in non-clustered mode"
    )


async def test_the_audit_reads_back_events_pushed_but_never_delivered(tmp_path: Path) -> None:
    """A gap in the sequences the audit receives (a consumer leader killed mid-push) is filled from the
    stream before the ack-all that would cover it; an event the stream no longer holds is skipped."""
    with nats_server(tmp_path / "home") as server:
        nc, js = await jetstream(address_of(server))
        try:
            for i in range(5):
                await publish(
                    js,
                    WorkerStatusEvent(
                        worker_id=f"w{i + 1}",
                        kind="http",
                        task_types=["math"],
                        state="idle",
                        model_version="base",
                        command_id=None,
                    ),
                )
            await js.delete_msg(STREAM, 4)  # as if aged out of the stream
            sub = await js.pull_subscribe("", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.ALL))
            msgs = await sub.fetch(4, timeout=5)  # sequences 1, 2, 3, 5
            received = [msgs[0], msgs[1], msgs[3]]  # 3 (and the deleted 4) never arrived
            epoch = await stream_epoch(js)
            filled = await fill_gaps(js, received, None, epoch, asyncio.Event())
        finally:
            await bus_close(nc)
    assert filled is not None
    items, last_seq = filled
    assert last_seq == 5 and len(items) == 4
    assert (items[0], items[1], items[3]) == tuple(received)
    assert isinstance(items[2], Incoming) and (items[2].stream_seq, items[2].stream_key) == (3, f"{epoch}:3")
    assert items[2].data == msgs[2].data and items[2].subject == msgs[2].subject == "status.workers.w3"
