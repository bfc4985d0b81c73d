"""The engine's nodes job: read what `carl node`s publish, and mark lost the nodes that stopped.

Called from each engine tick (engine/daemon/loop.py), isolated like every job there. It reads `[nodes]` of
engine.toml again when the file changes, and keeps one consumer (consumer.py: a thread of its own) reading
from `[nodes] url`, or from the agents plane's server while the plane is up and no URL is given; a consumer
whose address changed is replaced, one that died is started again with backoff. The tick itself never waits
for NATS. Every LOST_CHECK_S it marks lost each node heard over NATS whose newest sample is older than
`lost_after_s` (the note says so, and why when the engine itself cannot read the stream); what the node sent
stays, and its next sample makes it live again. Without the nats extra, a configured `[nodes]` is one line in
the engine's log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.tomlfile import FileWatch

from .node_settings import FILE_NAME, NodesSettings, load_nodes_settings

if TYPE_CHECKING:
    from engine.agents.bus import Address
    from engine.store import Store

    from .consumer import Consumer

CONFIG_CHECK_S = 2.0
THIN_EVERY_S = (
    600.0  # as the system job: the nodes' old samples are thinned even when [system] samples nothing
)
LOST_CHECK_S = 0.5
RESTART_FIRST_S = 1.0
RESTART_MOST_S = 60.0
STATE_KEY = "nodes.consumer"  # kv: where the engine reads nodes from, and how that goes

log = logging.getLogger("carl.engine.nodes")


class NodesJob:
    def __init__(self, store: Store, home: Path, plane_address: Callable[[], Address | None]) -> None:
        self.store = store
        self.home = home
        self.plane_address = plane_address
        self.settings = NodesSettings()
        self.consumer: Consumer | None = None
        self.retired: list[Consumer] = []  # asked to stop, not waited for (the tick never waits)
        self.config = FileWatch(home / FILE_NAME, CONFIG_CHECK_S)  # engine.toml, read again when it changes
        self.next_lost_check = 0.0
        self.next_thin = time.monotonic() + THIN_EVERY_S
        self.next_start = 0.0
        self.restarts = 0
        self.said: dict[str, str] = {}
        self.published: dict[str, Any] | None = None

    def close(self) -> None:
        if self.consumer is not None:
            self.retired.append(self.consumer)
            self.consumer = None
        for consumer in self.retired:
            consumer.stop()
        self.retired.clear()
        self._publish()

    def tick(self) -> None:
        self._reload()
        self._supervise()
        self._lose_silent()
        self._thin()
        self._publish()

    # -- the consumer --------------------------------------------------------------------------------------

    def wanted(self) -> Address | None:
        """Where the nodes' stream should be read from now, if anywhere."""
        if not self.settings.enabled:
            return None
        s = self.settings
        if s.url:
            try:
                from engine.agents.bus import Address
            except ImportError as exc:
                self._say(
                    "extra",
                    f"nodes: reading nodes needs the nats extra (pip install 'carl-tui[nats]'): {exc}",
                )
                return None
            return Address(s.url, s.token_file, s.creds_file, s.tls_ca_file)
        return self.plane_address()

    def _supervise(self) -> None:
        wanted = self.wanted()
        consumer = self.consumer
        self.retired = [old for old in self.retired if old.alive()]
        if consumer is not None and consumer.address != wanted:
            consumer.stop(
                wait=0.0
            )  # it ends within a fetch's wait; its batch in hand is stored or comes again
            self.retired.append(consumer)
            self.consumer = consumer = None
            if wanted is None:
                log.info("nodes: no longer reading nodes (no [nodes] url, and the agents plane is down)")
        if consumer is not None and not consumer.alive():
            self.restarts += 1
            delay = min(RESTART_FIRST_S * 2 ** min(self.restarts - 1, 6), RESTART_MOST_S)
            log.warning("nodes: the consumer stopped (%s); starting again in %.0fs", consumer.error, delay)
            self.consumer, self.next_start = None, time.monotonic() + delay
        if wanted is None or self.consumer is not None or time.monotonic() < self.next_start:
            return
        try:
            from .consumer import Consumer
        except ImportError as exc:
            self._say(
                "extra", f"nodes: reading nodes needs the nats extra (pip install 'carl-tui[nats]'): {exc}"
            )
            return
        self.consumer = Consumer(self.home, wanted)
        self.consumer.start()
        log.info("nodes: reading what nodes publish on %s", wanted.url)

    # -- lost nodes ----------------------------------------------------------------------------------------

    def _lose_silent(self) -> None:
        now = time.monotonic()
        if now < self.next_lost_check:
            return
        self.next_lost_check = now + LOST_CHECK_S
        after = self.settings.lost_after_s
        lost = self.store.system.lose_silent_nodes(
            time.time() - after, f"no sample for {after:g} s{self._why()}"
        )
        for name in lost:
            log.info("nodes: %s lost: no sample for %g s", name, after)

    def _thin(self) -> None:
        now = time.monotonic()
        if now < self.next_thin:
            return
        self.next_thin = now + THIN_EVERY_S
        removed = self.store.system.thin()
        if removed:
            log.info("nodes: %d old sample rows thinned", removed)

    def _why(self) -> str:
        """Why the engine itself may have heard nothing (appended to a lost node's note), or nothing."""
        consumer = self.consumer
        if consumer is None:
            if not self.settings.enabled:
                return " (reading nodes is off: [nodes] enabled = false)"
            return (
                " (nothing reads the nodes' stream: no [nodes] url in engine.toml, and the agents plane is"
                " down)"
            )
        if not consumer.connected:
            return f" (the engine cannot reach it: {consumer.error or 'connecting'})"
        if consumer.trouble:
            return f" (the engine {consumer.trouble})"
        return ""

    # -- settings and state ---------------------------------------------------------------------------------

    def _reload(self) -> None:
        if not self.config.changed():
            return
        settings, problems = load_nodes_settings(self.home)
        for line in problems:
            log.warning("%s", line)
        self.settings = settings

    def _publish(self) -> None:
        """Where nodes are read from and how that goes, in the store's kv for `carl node --list` (written when
        it changes)."""
        consumer = self.consumer
        state: dict[str, Any] = {
            "url": consumer.address.url if consumer is not None else None,
            "state": "off" if consumer is None else "reading" if consumer.connected else "connecting",
            "error": consumer.error if consumer is not None else None,
            "trouble": consumer.trouble if consumer is not None else None,
            "lost_after_s": self.settings.lost_after_s,
        }
        if state != self.published:
            self.store.set_kv(STATE_KEY, state)
            self.published = state

    def _say(self, topic: str, message: str) -> None:
        if self.said.get(topic) != message:
            self.said[topic] = message
            log.warning("%s", message)
