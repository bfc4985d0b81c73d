"""Helpers for the agents plane's tests (imported as `agents_support`): a real nats-server in a temp
home on a free port, stopped even when the test fails; a cluster of them on loopback; an audit storing
the plane's events, as the engine's bridge does; and a way to wait until the audit has stored everything
on the stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.agents.bus import STREAM, Address, close, connect, ensure_stream
from engine.agents.plane_settings import AgentsSettings
from engine.agents.server import Cluster, LocalServer, ensure_token, free_port, token_path


@contextmanager
def nats_server(home: Path, port: int | None = None) -> Iterator[LocalServer]:
    server = LocalServer(home, port or free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def nats_cluster(root: Path, size: int = 3, name: str = "carl") -> Iterator[list[LocalServer]]:
    """`size` nats-servers on loopback, routed to each other as one cluster with JetStream clustered: each
    node has its own home (its store), free ports for clients and routes, and the same token. Every node
    is stopped when the block ends, even when the test fails; a node the test killed is already gone."""
    ports: set[int] = set()
    while len(ports) < 2 * size:  # distinct: a port handed out twice would leave a node unable to listen
        ports.add(free_port())
    client_ports, route_ports = sorted(ports)[:size], sorted(ports)[size:]
    homes = [root / f"node{i}" for i in range(size)]
    token = ensure_token(homes[0])
    nodes = []
    for home, port, route_port in zip(homes, client_ports, route_ports, strict=True):
        if home != homes[0]:
            shutil.copyfile(token, token_path(home))  # (token_path makes the node's nats/, 0700)
            os.chmod(token_path(home), 0o600)
        routes = [f"nats-route://127.0.0.1:{p}" for p in route_ports if p != route_port]
        nodes.append(LocalServer(home, port, Cluster(name, route_port, routes)))
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def cluster_url(*nodes: LocalServer) -> str:
    """The nodes' client URLs as one comma-separated list, in the order given (the first is tried first)."""
    return ",".join(node.url for node in nodes)


async def meta_leader(address: Address, timeout: float = 60.0) -> None:
    """Until the cluster has a JetStream meta leader: only then does `$JS.API.INFO` get an answer."""
    nc = await connect(address, "cluster-probe")
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = await nc.request("$JS.API.INFO", b"", timeout=0.25)
                if "error" not in json.loads(reply.data):
                    return
            except Exception:  # no answer yet: the cluster is still electing its meta leader
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"the cluster elected no JetStream meta leader in {timeout:.0f}s")
    finally:
        await close(nc)


def address_of(server: LocalServer) -> Address:
    return Address(server.url, str(token_path(server.home)), local=True)


async def jetstream(address: Address, name: str = "test") -> tuple[Any, Any]:
    nc = await connect(address, name)
    js = nc.jetstream()
    await ensure_stream(js, AgentsSettings().stream)
    return nc, js


async def drained(js: Any, consumer: str, timeout: float = 60.0) -> None:
    """Until `consumer` has acknowledged everything in its filter (the audit stored it all)."""
    import nats

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await js.consumer_info(STREAM, consumer)
        except nats.js.errors.NotFoundError:  # the consumer's owner has not made it yet
            info = None
        if info is not None and info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"consumer {consumer} did not drain in {timeout:.0f}s")


@contextmanager
def audit_running(address: Address, db: Path) -> Iterator[None]:
    """The audit storing the plane's events into the store at `db`, as the engine's bridge does: in a
    thread with its own event loop, so a test that is not async has one too. Stopped on the way out."""
    import threading

    from engine.agents.audit import AuditWriter, run_audit
    from engine.store import Store

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    async def audit() -> None:
        nc, js = await jetstream(address, "audit")
        try:
            with Store(db) as store:
                await run_audit(js, AuditWriter(store), stop)
        finally:
            await close(nc)

    def run() -> None:
        try:
            loop.run_until_complete(audit())
        except BaseException as exc:  # said by the test's thread, on the way out
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="audit", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the audit ended already
            loop.call_soon_threadsafe(stop.set)
        thread.join(60)
    if failed:
        raise failed[0]
