"""`carl node --join URL`: this machine's samples and consoles, published over NATS JetStream to the engine
that holds the store.

Three tasks feed one outbox and one sends it. The sampler takes a `Sample` every interval (engine.system:
psutil and NVML, as the engine samples its own machine); the follower reads the new lines of each `--log` file
(follow.py); the sender publishes the outbox in order, one message at a time, and waits for the stream's
acknowledgement before it takes the next. Every message has a `Nats-Msg-Id`, so a message sent again after a
lost acknowledgement is stored once.

While the server is away (a restart, a network cut) the client reconnects by itself and the sender waits:
samples pile up in the outbox (the newest MAX_BUFFERED_SAMPLES; older ones are dropped, and the node says how
many), and the follower stops reading ahead (the log file itself is the buffer), so nothing is lost for an
outage of hours and memory stays bounded. SIGTERM or SIGINT stop the sampler and the follower, publish a
`bye`, wait up to BYE_WAIT_S for the outbox to drain, and exit 0. Each problem is one line on stderr, said
once until it changes; a wrong token, a server without JetStream or a bad option end the node with status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import secrets
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from engine import __version__
from engine.agents.bus import Address, connect
from engine.agents.bus import close as bus_close
from engine.agents.server import AgentsError
from engine.system import Sampler
from engine.text import one_line, visible

from .follow import FollowError, LogFollower
from .state import NodeState
from .stream import ensure_stream, jetstream_missing
from .wire import STREAM, console_name, encode, subject

PUBLISH_TIMEOUT_S = 5.0  # an acknowledgement not back by then: the message is sent again (same id)
RETRY_MOST_S = 5.0  # the longest wait between two tries (to connect, to publish)
MAX_BUFFERED_SAMPLES = 3600  # kept while the server is away: two hours at 2 s, a few MiB
CONSOLE_AHEAD = 4  # console messages of one log read ahead of the server's acknowledgements
FOLLOW_EVERY_S = 0.5  # how often the logs are looked at (or every interval, when that is shorter)
BYE_WAIT_S = 5.0  # at a stop, how long the outbox may take to drain


@dataclass
class NodeOptions:
    url: str
    name: str
    home: Path
    interval_s: float = 2.0
    token_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    logs: list[Path] = field(default_factory=list)
    run: str | None = None
    watch: list[str] = field(default_factory=list)


@dataclass
class Outgoing:
    kind: str
    subject: str
    data: bytes
    msg_id: str
    console: str | None = None  # the console whose lines it carries
    follow: dict[str, Any] | None = None  # that log's follow state once it is acknowledged
    lines: int = 0
    t: float | None = None  # a sample's time

    def noted(self) -> dict[str, Any]:
        """As the state file keeps a console message on its way."""
        return {
            "subject": self.subject,
            "data": self.data.decode(),
            "msg_id": self.msg_id,
            "console": self.console,
            "follow": self.follow,
            "lines": self.lines,
        }

    @classmethod
    def from_noted(cls, noted: dict[str, Any]) -> Outgoing:
        return cls(
            "console",
            str(noted["subject"]),
            str(noted["data"]).encode(),
            str(noted["msg_id"]),
            str(noted["console"]),
            noted.get("follow"),
            int(noted.get("lines") or 0),
        )


class Outbox:
    """What waits to be published, in order; at most `most_samples` samples (the oldest go first)."""

    def __init__(self, most_samples: int) -> None:
        self.items: deque[Outgoing] = deque()
        self.most_samples = most_samples
        self.samples = 0
        self.dropped = 0  # samples dropped since the node started
        self.ready = asyncio.Event()  # set while something waits

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: Outgoing, *, first: bool = False) -> None:
        if first:
            self.items.appendleft(item)
        else:
            self.items.append(item)
        if item.kind == "sample":
            self.samples += 1
            if self.samples > self.most_samples:
                self._drop_oldest_sample()
        self.ready.set()

    def _drop_oldest_sample(self) -> None:
        for i, item in enumerate(self.items):
            if i > 0 and item.kind == "sample":  # never the head: the sender may be publishing it
                del self.items[i]
                self.samples -= 1
                self.dropped += 1
                return

    def head(self) -> Outgoing | None:
        return self.items[0] if self.items else None

    def pop(self) -> None:
        item = self.items.popleft()
        if item.kind == "sample":
            self.samples -= 1
        if not self.items:
            self.ready.clear()

    def pending(self, console: str) -> int:
        return sum(1 for item in self.items if item.console == console)


@dataclass
class Log:
    """A `--log` as the node follows it: its follower, and the state its next message starts from."""

    name: str
    path: Path
    follower: LogFollower
    epoch: str
    n: int  # the number of the last message made from it


class NodeProcess:
    def __init__(self, options: NodeOptions, sampler: Sampler | None = None) -> None:
        self.options = options
        self.name = options.name
        self.url = options.url
        self.address = Address(options.url, options.token_file, options.creds_file, options.tls_ca_file)
        self.host = socket.gethostname()
        self.boot = secrets.token_hex(4)  # this process: its messages' ids differ from a previous run's
        self.seq = 0
        self.outbox = Outbox(MAX_BUFFERED_SAMPLES)
        self.state = NodeState(options.home, options.name)
        self.sampler = sampler
        self.logs: dict[str, Log] = {}
        self.stop = asyncio.Event()
        self.up = asyncio.Event()  # connected, and the stream is there
        self.nc: Any = None
        self.js: Any = None
        self.closing = False
        self.fatal: str | None = None
        self.stopped_by = "stopped"
        self.said: dict[str, str] = {}
        self.reported_drops = 0

    # -- what it says -----------------------------------------------------------------------------------

    def tell(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{stamp} carl node {self.name}: {visible(one_line(message, 500))}", file=sys.stderr, flush=True
        )

    def say(self, topic: str, message: str) -> None:
        """`message`, unless it repeats what was last said on `topic` (a problem is one line, not one a
        second)."""
        if self.said.get(topic) != message:
            self.said[topic] = message
            self.tell(message)

    def _fail(self, message: str) -> None:
        self.fatal = message
        self.stop.set()

    # -- the run ----------------------------------------------------------------------------------------

    async def run(self) -> int:
        self.state.acquire()
        try:
            return await self._run()
        finally:
            self.state.release()
            for log in self.logs.values():
                log.follower.close()
            if self.sampler is not None:
                self.sampler.close()

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig)
        if self.sampler is None:
            self.sampler = await asyncio.to_thread(Sampler)
        self.sampler.watch(self._watched())
        resumed = self._resume()
        self.outbox.put(self._hello())
        if resumed is not None:
            self.outbox.put(resumed)
        feeders = [
            asyncio.create_task(self._guarded("connecting", self._connect())),
            asyncio.create_task(self._guarded("sampling", self._sampling())),
            asyncio.create_task(self._guarded("following the logs", self._following())),
        ]
        sender = asyncio.create_task(self._guarded("sending", self._sending()))
        await self.stop.wait()
        for task in feeders:
            task.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)
        if self.fatal is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            await self._close()
            self.tell(self.fatal)
            return 2
        self.outbox.put(self._message("bye", {"reason": self.stopped_by}))
        self.closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sender, BYE_WAIT_S)
        left = len(self.outbox)
        if left:
            self.tell(
                f"{left} message(s) not sent: {self.url} did not take them in {BYE_WAIT_S:g} s (the logs go"
                " on from where the server got them at the next start)"
            )
        await self._close()
        sent = self.state.published
        self.tell(
            f"stopped ({self.stopped_by}): {sent['samples']} samples and {sent['consoles']} console messages"
            f" ({sent['lines']} lines) sent"
        )
        return 0

    async def _guarded(self, what: str, work: Any) -> None:
        """`work`, and if it fails for a reason nobody foresaw, the node stops with that reason in one line
        (status 2: whatever runs it may start it again) rather than going on without it."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(f"{what} failed: {type(exc).__name__}: {exc}")

    def _signalled(self, sig: int) -> None:
        self.stopped_by = signal.Signals(sig).name
        self.stop.set()

    async def _close(self) -> None:
        nc, self.nc = self.nc, None
        if nc is not None:
            await bus_close(nc)

    def _watched(self) -> list[str]:
        dirs = [str(path.parent) for path in self.options.logs]
        return [str(self.options.home), *dirs, *self.options.watch]

    # -- messages ----------------------------------------------------------------------------------------

    def _message(self, kind: str, body: dict[str, Any], *, t: float | None = None) -> Outgoing:
        self.seq += 1
        data = encode({"type": kind, "node": self.name, "host": self.host, "boot": self.boot, **body})
        return Outgoing(kind, subject(self.name, kind), data, f"{self.name}.{self.boot}.{self.seq}", t=t)

    def _hello(self) -> Outgoing:
        import psutil

        assert self.sampler is not None
        nvml = self.sampler.nvml
        info = {
            "cores": psutil.cpu_count() or 0,
            "memory": psutil.virtual_memory().total,
            "platform": f"{platform.system()} {platform.machine()}",
            "gpus": [
                {"index": i, "name": name, "uuid": uuid}
                for i, (name, uuid) in enumerate(zip(nvml.names, nvml.uuids, strict=True))
            ],
        }
        return self._message(
            "hello",
            {
                "version": __version__,
                "interval_s": self.options.interval_s,
                "info": info,
                "note": self.sampler.note,
            },
        )

    def _resume(self) -> Outgoing | None:
        """The logs to follow, each from where a previous run got (the console message it left on its way
        comes first, as it was)."""
        resumed = None
        if self.state.inflight is not None:
            try:
                resumed = Outgoing.from_noted(self.state.inflight)
            except (KeyError, TypeError, ValueError) as exc:
                self.tell(
                    f"{self.state.path}: the console message on its way cannot be read ({exc!r}); dropped"
                )
        taken: set[str] = set()
        for path in self.options.logs:
            name = console_name(path.name, taken)
            taken.add(name)
            saved = self.state.logs.get(name)
            if resumed is not None and resumed.console == name and resumed.follow is not None:
                saved = resumed.follow
            follower = LogFollower(path)
            epoch, n = secrets.token_hex(6), 0
            if isinstance(saved, dict) and saved.get("path") == str(path):
                try:
                    identity, offset = (int(saved["dev"]), int(saved["ino"])), int(saved["offset"])
                    epoch, n = str(saved["epoch"]), int(saved["n"])
                except (KeyError, TypeError, ValueError):
                    self.tell(f"{self.state.path}: where {path} got to cannot be read; following it afresh")
                else:
                    follower.identity, follower.offset = identity, offset
            self.logs[name] = Log(name, path, follower, epoch, n)
        return resumed

    def _console(
        self, log: Log, lines: list[str], offset: int, end: int, identity: tuple[int, int]
    ) -> Outgoing:
        log.n += 1
        body = {
            "console": log.name,
            "source": str(log.path),
            "run": self.options.run,
            "epoch": log.epoch,
            "n": log.n,
            "offset": offset,
            "lines": lines,
        }
        item = self._message("console", body)
        item.msg_id = (
            f"{self.name}.{log.epoch}.{log.n}"  # the same message, the same id, whichever run sends it
        )
        item.console = log.name
        item.lines = len(lines)
        item.follow = {
            "path": str(log.path),
            "epoch": log.epoch,
            "n": log.n,
            "dev": identity[0],
            "ino": identity[1],
            "offset": end,
        }
        return item

    # -- the tasks ----------------------------------------------------------------------------------------

    async def _connect(self) -> None:
        """Connect (trying again while nothing answers), make sure the stream is there, then leave the
        reconnecting to the client."""
        delay = 0.5
        while True:
            try:
                nc = await connect(self.address, f"carl-node-{self.name}", on_event=self._on_event)
            except AgentsError as exc:
                if "cannot connect" not in str(exc) and "timed out" not in str(exc):
                    self._fail(str(exc))  # a wrong token, a bad creds file: trying again changes nothing
                    return
                self.say("link", f"{exc}; trying again (samples are kept meanwhile)")
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MOST_S)
                continue
            js = nc.jetstream()
            try:
                await ensure_stream(js)
            except Exception as exc:
                await bus_close(nc)
                if jetstream_missing(exc) or isinstance(exc, nats.errors.NoRespondersError):
                    self._fail(
                        f"{self.url}: JetStream is not enabled there (nats-server -js): nothing to publish"
                        " into"
                    )
                    return
                self.say(
                    "link", f"{self.url}: cannot make the {STREAM} stream ({_describe(exc)}); trying again"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MOST_S)
                continue
            self.nc, self.js = nc, js
            self.up.set()
            logs = ", ".join(str(log.path) for log in self.logs.values()) or "no logs"
            run = f" (run {self.options.run})" if self.options.run and self.logs else ""
            self.say(
                "link",
                f"joined {self.url}: sampling every {self.options.interval_s:g} s, following {logs}{run}",
            )
            return

    def _on_event(self, event: str) -> None:
        if self.closing:
            return
        if event == "disconnected":
            self.up.clear()
            self.say("link", f"{self.url}: disconnected; samples are kept until it is back")
        elif event == "reconnected":
            self.up.set()
            self.said.pop("error", None)  # the next outage's errors are said again
            self.say(
                "link", f"{self.url}: reconnected; sending the {len(self.outbox)} message(s) that waited"
            )
        else:
            self.say("error", event)

    async def _sampling(self) -> None:
        assert self.sampler is not None
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            sample = await asyncio.to_thread(self.sampler.sample)
            try:
                self.outbox.put(self._message("sample", {"sample": sample.to_json()}, t=sample.t))
            except ValueError as exc:  # a reading JSON cannot carry (NaN): that sample only
                self.say("sample", f"a sample could not be sent: {exc}")
            if self.outbox.dropped != self.reported_drops:
                self.reported_drops = self.outbox.dropped
                self.say(
                    "buffer",
                    f"{self.url} has been away: {self.outbox.dropped} sample(s) dropped so far (the newest"
                    f" {MAX_BUFFERED_SAMPLES} are kept)",
                )
            due += self.options.interval_s
            now = loop.time()
            if due <= now:  # fell behind (a slow sample): start over from now, no burst
                due = now + self.options.interval_s
            await asyncio.sleep(due - now)

    async def _following(self) -> None:
        every = min(FOLLOW_EVERY_S, self.options.interval_s)
        while True:
            for log in self.logs.values():
                await self._follow(log)
            await asyncio.sleep(every)

    async def _follow(self, log: Log) -> None:
        topic = f"log {log.name}"
        while self.outbox.pending(log.name) < CONSOLE_AHEAD:
            try:
                chunk = await asyncio.to_thread(log.follower.read)
            except FollowError as exc:
                self.say(topic, f"{exc} (looked at again every {FOLLOW_EVERY_S:g} s)")
                return
            if self.said.get(topic):
                self.say(topic, f"{log.path}: followed")
            for note in log.follower.notes:
                self.tell(note)
            log.follower.notes.clear()
            if chunk is None:
                return
            self.outbox.put(self._console(log, chunk.lines, chunk.offset, chunk.end, chunk.identity))

    async def _sending(self) -> None:
        delay = 0.1
        while True:
            item = self.outbox.head()
            if item is None:
                if self.closing:
                    return
                await self.outbox.ready.wait()
                continue
            await self.up.wait()
            if item.console is not None:
                self.state.inflight = item.noted()
                self.state.save()
            try:
                await self.js.publish(
                    item.subject, item.data, timeout=PUBLISH_TIMEOUT_S, headers={"Nats-Msg-Id": item.msg_id}
                )
            except (
                nats.errors.NoRespondersError,
                nats.js.errors.NotFoundError,
            ):  # a server that lost its store
                self.say("publish", f"{self.url}: no {STREAM} stream; making it again")
                with contextlib.suppress(Exception):
                    await ensure_stream(self.js)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MOST_S)
                continue
            except (
                nats.errors.MaxPayloadError,
                nats.js.errors.BadRequestError,
            ) as exc:  # never taken: dropped
                self.say(
                    "refused",
                    f"a {item.kind} message of {len(item.data):,} bytes was refused ({_describe(exc)})",
                )
                self.outbox.pop()
                self._done(item, stored=False)
                continue
            except (TimeoutError, nats.errors.Error) as exc:  # away, or slow: the same message again
                self.say("publish", f"{self.url}: not acknowledged ({_describe(exc)}); trying again")
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MOST_S)
                continue
            if self.said.get("publish"):
                self.say("publish", f"{self.url}: acknowledged again")
            delay = 0.1
            self.outbox.pop()
            self._done(item, stored=True)

    def _done(self, item: Outgoing, *, stored: bool) -> None:
        """What the state file keeps once a message is acknowledged (or refused for good)."""
        published = self.state.published
        if item.kind == "sample" and stored:
            published["samples"] = int(published["samples"] or 0) + 1
            published["last_sample_t"] = item.t
        if item.console is not None:
            if item.follow is not None:
                self.state.logs[item.console] = item.follow
            self.state.inflight = None
            if stored:
                published["consoles"] = int(published["consoles"] or 0) + 1
                published["lines"] = int(published["lines"] or 0) + item.lines
        self.state.save()


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).removeprefix("nats: ")
    return one_line(text or type(exc).__name__, 200)
