"""Helpers for the agents plane's tests (imported as `agents_support`): a real nats-server in a temp
home on a free port, stopped even when the test fails, and a way to wait until the audit has stored
everything on the stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.agents.bus import STREAM, Address, connect, ensure_stream
from engine.agents.config import AgentsSettings
from engine.agents.server import LocalServer, free_port, token_path


@contextmanager
def nats_server(home: Path, port: int | None = None) -> Iterator[LocalServer]:
    server = LocalServer(home, port or free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def address_of(server: LocalServer) -> Address:
    return Address(server.url, str(token_path(server.home)), local=True)


async def jetstream(address: Address, name: str = "test") -> tuple[Any, Any]:
    nc = await connect(address, name)
    js = nc.jetstream()
    await ensure_stream(js, AgentsSettings().stream)
    return nc, js


async def drained(js: Any, consumer: str, timeout: float = 30.0) -> None:
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
