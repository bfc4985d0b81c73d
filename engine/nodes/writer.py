"""The engine's side of the nodes: what they sent, stored per node (no NATS here: the consumer hands it
bytes).

A batch of messages is written in one transaction, each message in a savepoint of its own: a message that is
not valid (wire.parse), or that the store refuses, costs one row of `node_rejected` with its reason, and the
batch around it is stored. Only the store's own trouble (locked, full disk) raises, so the consumer tries the
whole batch again and acknowledges nothing before it is committed.

Every message can be stored twice without effect, since a batch committed and not yet acknowledged comes again
after a crash: a sample adds nothing at a time already stored (engine/store/system.py), a hello or a bye sets
a state, and a console message carries its log's follow state (`epoch`) and its number `n`, so one already
appended is skipped. Lines are appended to `$CARL_HOME/nodes/<node id>/console-<id>.log` (named by ids, never
by what the node sent) before the new length is committed; a file longer than its committed length (a crash
between the two) is cut back first, so each line is there once. A file past CONSOLE_FILE_MAX is rotated to
`.1` (one older file is kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.faults import store_trouble
from engine.text import one_line

from .wire import MAX_CONSOLES, MAX_NODES, Console, Message, Rejected, parse

if TYPE_CHECKING:
    from engine.store import Store

CONSOLE_FILE_MAX = 32 * 1024 * 1024  # a node's console file is rotated past this (one rotated file kept)
DURABLE_KEY = "nodes.durable"  # kv: the name of this store's consumer on the server


@dataclass(frozen=True)
class Incoming:
    subject: str
    data: bytes


@dataclass
class Counts:
    stored: int = 0
    rejected: int = 0
    repeats: int = 0  # console messages already appended (a batch delivered again)
    reasons: list[str] = field(default_factory=list)  # the first few rejections, for the engine's log

    def add(self, other: Counts) -> None:
        self.stored += other.stored
        self.rejected += other.rejected
        self.repeats += other.repeats


def nodes_dir(home: Path, node_id: int) -> Path:
    path = home / "nodes" / str(node_id)
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


class NodeWriter:
    def __init__(self, store: Store, home: Path) -> None:
        self.store = store
        self.system = store.system
        self.home = home
        self.ids: dict[str, int] = {}  # node name -> id, for nodes heard over NATS

    def durable(self) -> str:
        """This store's consumer name, made once: two engines reading one server each get every message."""
        import secrets

        name = self.store.kv(DURABLE_KEY)
        if not isinstance(name, str):
            name = f"carl-engine-{secrets.token_hex(4)}"
            self.store.set_kv(DURABLE_KEY, name)
        return name

    def write(self, items: list[Incoming]) -> Counts:
        """Store a batch; raises only for the store's own trouble (then nothing of it is committed)."""
        counts = Counts()
        try:
            with self.store.transaction():
                for item in items:
                    self._one(item, counts)
        except BaseException:
            self.ids.clear()  # what the rolled-back transaction made is gone
            raise
        return counts

    def _one(self, item: Incoming, counts: Counts) -> None:
        node: str | None = None
        try:
            message = parse(item.subject, item.data)
            node = message.node
            with self.system.savepoint():
                self._apply(message, counts)
            counts.stored += 1
            return
        except Rejected as exc:
            why, node = str(exc), exc.node or node
        except Exception as exc:
            if store_trouble(exc):
                raise
            why = one_line(f"cannot be stored: {type(exc).__name__}: {exc}", 500)
        self.ids.clear()  # the savepoint may have undone a node it made
        self.system.reject_node_message(node, item.subject, why, item.data)
        counts.rejected += 1
        if len(counts.reasons) < 5:
            counts.reasons.append(one_line(f"{node or '?'}: {why}", 300))

    def _apply(self, message: Message, counts: Counts) -> None:
        node_id = self._node_id(message)
        if message.hello is not None:
            hello = message.hello
            self.system.node(message.node, host=hello.host or message.node, via="nats", info=hello.info)
            if hello.note:
                self.system.set_node_note(node_id, hello.note)
        elif message.sample is not None:
            sample = message.sample
            self.system.add_sample(node_id, sample.t, sample.scalars(), sample.to_json())
            self.system.node_heard(node_id)
        elif message.console is not None:
            self._console(node_id, message.console, counts)
        else:
            said = f" ({message.reason})" if message.reason else ""
            self.system.set_node_state(node_id, "stopped", f"said bye{said}")

    def _node_id(self, message: Message) -> int:
        known = self.ids.get(message.node)
        if known is not None:
            return known
        row = self.system.node_row(message.node)
        if row is None:
            if self.system.node_count() >= MAX_NODES:
                raise Rejected(f"a new node, and the store keeps {MAX_NODES} already", message.node)
            info = message.hello.info if message.hello is not None else None
            node_id = self.system.node(message.node, host=message.host or message.node, via="nats", info=info)
        elif row[1] != "nats":
            raise Rejected(
                f"node {message.node!r} is the name of the engine's own machine; give this node another"
                " --name",
                message.node,
            )
        else:
            node_id = row[0]
        self.ids[message.node] = node_id
        return node_id

    def _console(self, node_id: int, console: Console, counts: Counts) -> None:
        row = self.system.node_console(node_id, console.name)
        if row is None:
            if self.system.node_console_count(node_id) >= MAX_CONSOLES:
                raise Rejected(f"console {console.name!r}: a node keeps {MAX_CONSOLES} consoles at most")
            row = self.system.add_node_console(
                node_id, console.name, console.source, nodes_dir(self.home, node_id)
            )
        if row["epoch"] == console.epoch and console.n <= row["n"]:
            counts.repeats += 1
            return
        length = append_lines(Path(row["path"]), int(row["length"]), console.lines)
        self.system.node_console_written(
            row["id"],
            epoch=console.epoch,
            n=console.n,
            length=length,
            lines=len(console.lines),
            source=console.source,
        )
        if console.run is not None:
            run_id = self.system.run_named(console.run)
            if run_id is not None and run_id != row["run_id"]:
                self.system.add_console(run_id, row["path"], "node", node_id)
                self.system.node_console_run(row["id"], run_id)


def append_lines(path: Path, committed: int, lines: list[str]) -> int:
    """Append `lines` to `path`, whose first `committed` bytes are what the store says it holds; returns its
    new length. Bytes past `committed` (an append whose commit never came) are cut first; a file shorter than
    `committed` is a new one (rotated, or removed) whose every byte is uncommitted, so it is emptied."""
    data = ("\n".join(lines) + "\n").encode("utf-8", errors="replace")
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size != committed:
            size = committed if size > committed else 0
            os.ftruncate(fd, size)
        if size and size + len(data) > CONSOLE_FILE_MAX:
            os.replace(path, path.with_name(path.name + ".1"))
            os.close(fd)
            fd = os.open(path, flags | os.O_TRUNC, 0o600)
            size = 0
        view = memoryview(data)
        written = 0
        while written < len(data):
            written += os.pwrite(fd, view[written:], size + written)
        return size + len(data)
    finally:
        os.close(fd)
