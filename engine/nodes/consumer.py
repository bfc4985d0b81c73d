"""The engine's consumer of the nodes' stream: a thread with its own event loop and its own store connection
(the engine's `Store` is its loop's alone), so the engine's tick never waits for NATS.

It connects (trying again, with backoff, while the server is away), makes sure the stream is there, and reads
its durable pull consumer in batches of up to BATCH messages. A batch is written in one transaction (in a
worker thread: the client keeps its connection alive meanwhile) and each of its messages acknowledged only
after the commit: an engine killed in between gets the batch again, and the writer stores each message once.
The store's own trouble (locked, full) holds the batch back and is tried again, with the line kept in
`trouble`; a message that cannot be stored is a rejected row (writer.py), never a stopped consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

import nats

from engine import paths
from engine.agents.bus import Address, connect, explain
from engine.agents.bus import close as bus_close
from engine.agents.server import AgentsError
from engine.text import one_line

from .stream import ensure_stream as ensure_nodes_stream
from .stream import fetch, subscribe
from .writer import Counts, Incoming, NodeWriter

# Messages a fetch asks for: at most 64 MiB at the stream's 1 MiB a message (a few MiB in practice).
BATCH = 64
FETCH_WAIT_S = 0.5  # an empty fetch returns after this: how soon a stop is seen
RETRY_MOST_S = 5.0

log = logging.getLogger("carl.engine.nodes")


class Consumer:
    def __init__(self, home: Path, address: Address) -> None:
        self.home = home
        self.address = address
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.nc: Any = None
        self.error: str | None = None  # why it is not connected, while it is not
        self.trouble: str | None = None  # the store refusing batches, while it lasts
        self.counts = Counts()
        self.thread = threading.Thread(target=self._thread, name="carl-nodes", daemon=True)

    @property
    def connected(self) -> bool:
        nc = self.nc
        return nc is not None and bool(nc.is_connected)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, wait: float = 10.0) -> None:
        if self.loop is not None and self.stop_event is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: the thread is ending
                self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(wait)

    def _thread(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # a bug: the engine's job says so and starts another
            self.error = one_line(f"{type(exc).__name__}: {exc}", 300)
            log.exception("nodes: the consumer stopped")

    async def _main(self) -> None:
        from engine.store import Store

        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        store = Store(paths.db_path(self.home))
        try:
            writer = NodeWriter(store, self.home)
            durable = writer.durable()
            while not self.stop_event.is_set():
                nc = await self._connect()
                if nc is None:
                    return
                self.nc = nc
                try:
                    await self._consume(nc.jetstream(), writer, durable)
                finally:
                    self.nc = None
                    await bus_close(nc)
        finally:
            store.close()

    async def _connect(self) -> Any:
        assert self.stop_event is not None
        delay = 0.5
        while not self.stop_event.is_set():
            try:
                nc = await connect(self.address, "carl-engine-nodes")
            except AgentsError as exc:
                self.error = str(exc)
                await self._pause(delay)
                delay = min(delay * 2, RETRY_MOST_S)
                continue
            self.error = None
            return nc
        return None

    async def _pause(self, seconds: float) -> None:
        assert self.stop_event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), seconds)

    async def _consume(self, js: Any, writer: NodeWriter, durable: str) -> None:
        assert self.stop_event is not None
        sub, delay = None, 0.5
        while not self.stop_event.is_set():
            if sub is None:
                try:
                    await ensure_nodes_stream(js)
                    sub = await subscribe(js, durable)
                except (nats.errors.Error, TimeoutError) as exc:
                    self.error = explain(exc, self.address.url)
                    await self._pause(delay)
                    delay = min(delay * 2, RETRY_MOST_S)
                    continue
                self.error, delay = None, 0.5
            try:
                msgs = await fetch(sub, BATCH, FETCH_WAIT_S)
            except nats.errors.Error as exc:  # the consumer went away (a server that lost its store): again
                self.error = explain(exc, self.address.url)
                sub = None
                await self._pause(delay)
                continue
            if not msgs:
                continue
            counts = await self._write(writer, [Incoming(m.subject, m.data or b"") for m in msgs])
            if counts is None:
                return  # stopped while the store failed: unacknowledged, they come again
            for msg in msgs:
                with contextlib.suppress(Exception):  # a lost ack only delivers it again: stored once
                    await msg.ack()
            self.counts.add(counts)
            if counts.reasons:
                log.warning("nodes: %d message(s) rejected; first: %s", counts.rejected, counts.reasons[0])

    async def _write(self, writer: NodeWriter, items: list[Incoming]) -> Counts | None:
        """The batch written, tried again while the store has trouble; None when stopped meanwhile."""
        assert self.stop_event is not None
        delay = 0.5
        while True:
            try:
                counts = await asyncio.to_thread(writer.write, items)
            except Exception as exc:
                trouble = one_line(f"cannot store what nodes sent: {type(exc).__name__}: {exc}", 300)
                if trouble != self.trouble:
                    log.warning("nodes: %s; trying again", trouble)
                    self.trouble = trouble
                if self.stop_event.is_set():
                    return None
                await self._pause(delay)
                delay = min(delay * 2, 10.0)
                continue
            if self.trouble is not None:
                log.info("nodes: storing again")
                self.trouble = None
            return counts
