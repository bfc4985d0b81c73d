"""Connecting to the plane's NATS server and its JetStream stream (nats-py, asyncio).

One stream, `CARL_AGENTS`, holds every subject of the plane on file storage with age and byte
limits and a duplicate window: a publish carries a `Nats-Msg-Id`, and a repeat within the window
is acknowledged as a duplicate and stored once. The workers of a task type share one durable pull
consumer (their queue group), with explicit ack: each task goes to exactly one worker, and comes
back to another when that worker dies without acknowledging it. (The audit and the manager take
their messages pushed, with durable consumers of their own: see audit.py and manager.py.)

On a NATS cluster the stream keeps `agents.replicas` copies, on as many nodes, and its consumers
inherit them: with 3, a node may die and the plane carries on. The address may list several
servers; a client connects to the first that answers and fails over to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy, StorageType, StreamConfig

from .events import STREAM_SUBJECTS, PlaneEvent
from .plane_settings import AgentsSettings, StreamLimits, check_url, env_url, server_urls
from .server import AgentsError, read_token

STREAM = "CARL_AGENTS"
log = logging.getLogger("carl.agents")


@dataclass(frozen=True)
class Address:
    """Where the plane is and how to authenticate; `url` never holds a secret."""

    url: str
    token_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    local: bool = False  # the engine's own nats-server

    def argv(self) -> list[str]:
        """Flags that hand this address to a child process (paths only, never the token)."""
        out = ["--url", self.url]
        if self.token_file:
            out += ["--token-file", self.token_file]
        if self.creds_file:
            out += ["--creds", self.creds_file]
        if self.tls_ca_file:
            out += ["--tls-ca", self.tls_ca_file]
        return out


def resolve_address(
    settings: AgentsSettings,
    *,
    url: str | None = None,
    token_file: str | None = None,
    creds_file: str | None = None,
    local_port: int | None = None,
    home: Path | None = None,
) -> Address:
    """Flag, then environment, then config; else the local server (its port must be known)."""
    chosen = url or env_url() or settings.url
    token_file = token_file or _env_token_file() or settings.token_file
    creds_file = creds_file or settings.creds_file
    if chosen:
        try:
            check_url(chosen)
        except ValueError as exc:
            raise AgentsError(f"--url: {exc}") from None
        return Address(chosen, _abs(token_file), _abs(creds_file), _abs(settings.tls_ca_file))
    if local_port is None or home is None:
        raise AgentsError("no NATS server: start the plane (carl agents up) or give --url")
    from .server import local_url, token_path

    return Address(local_url(local_port), str(token_path(home)), None, None, local=True)


def _env_token_file() -> str | None:
    import os

    return os.environ.get("CARL_NATS_TOKEN_FILE") or None


def _abs(path: str | None) -> str | None:
    return str(Path(path).expanduser().resolve()) if path else None


def _tls_context(address: Address) -> ssl.SSLContext | None:
    if not address.tls_ca_file and not any(
        u.startswith(("tls://", "wss://")) for u in server_urls(address.url)
    ):
        return None
    context = ssl.create_default_context(cafile=address.tls_ca_file)
    return context


def explain(exc: BaseException, url: str) -> str:
    """A connection failure as one line naming the URL."""
    text = " ".join(str(exc).split()).removeprefix("nats: ").strip("'")
    lowered = text.lower()
    if "authorization" in lowered or "authentication" in lowered:
        return f"{url}: authorization violation (wrong or missing token or credentials)"
    if (
        isinstance(exc, nats.errors.NoServersError)
        or "no servers" in lowered
        or "connect call failed" in lowered
    ):
        return f"{url}: cannot connect (nothing answers there)"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"{url}: timed out connecting"
    return f"{url}: {text or type(exc).__name__}"


async def connect(
    address: Address,
    name: str,
    *,
    reconnect: bool = True,
    connect_timeout: float = 3.0,
    on_event: Callable[[str], None] | None = None,
) -> Client:
    """A client for `address`; a failure to connect raises AgentsError naming the URL.

    With `reconnect` the client retries forever once connected (a restarted server is found again);
    the first connection is tried once, so a wrong URL or token fails fast. The servers of a list are
    tried in its order (so a machine can name its nearest node first); when the one in use goes away,
    the client goes on to the next, and to the nodes the cluster announced.
    """
    options: dict[str, Any] = {
        "servers": server_urls(address.url),
        "dont_randomize": True,
        "name": name,
        "connect_timeout": connect_timeout,
        "allow_reconnect": reconnect,
        "max_reconnect_attempts": -1 if reconnect else 0,
        "reconnect_time_wait": 0.25,
        "ping_interval": 10,
        "max_outstanding_pings": 3,
        "drain_timeout": 5,
    }
    if address.token_file:
        options["token"] = read_token(address.token_file)
    if address.creds_file:
        if not Path(address.creds_file).is_file():
            raise AgentsError(f"{address.creds_file}: no such credentials file")
        options["user_credentials"] = address.creds_file
    tls = _tls_context(address)
    if tls is not None:
        options["tls"] = tls

    failure: list[BaseException] = []

    async def error_cb(exc: Exception) -> None:
        failure.append(exc)
        if on_event is not None:
            on_event(f"error: {explain(exc, address.url)}")

    async def disconnected_cb() -> None:
        if on_event is not None:
            on_event("disconnected")

    async def reconnected_cb() -> None:
        if on_event is not None:
            on_event("reconnected")

    options.update(error_cb=error_cb, disconnected_cb=disconnected_cb, reconnected_cb=reconnected_cb)

    # nats-py retries even the first connection when reconnecting is allowed (a wrong token would hang
    # forever), so a probe without reconnects comes first: it fails fast, with the server's reason.
    async def probe_error(exc: Exception) -> None:
        failure.append(exc)  # reported once, by the AgentsError below

    # (max_reconnect_attempts 0 means "forever" to nats-py; 1 means one try.)
    probe = {
        **options,
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.05,
        "error_cb": probe_error,
        "disconnected_cb": None,
        "reconnected_cb": None,
    }
    attempts = [probe]
    if reconnect:
        attempts.append(options)
    client = None
    for attempt in attempts:
        try:
            client = await asyncio.wait_for(nats.connect(**attempt), connect_timeout * 3)
        except Exception as exc:
            cause = failure[0] if failure and not isinstance(exc, nats.errors.Error) else exc
            if failure and "authorization" in str(failure[-1]).lower():
                cause = failure[-1]
            raise AgentsError(explain(cause, address.url)) from None
        if attempt is probe and reconnect:
            await client.close()
    assert client is not None
    return client


async def close(client: Client) -> None:
    """Flush what is buffered and close. (Not `drain()`: draining a pull or ordered-consumer subscription
    waits out its whole timeout, and every publish of ours has already been acknowledged by the stream.)"""
    with contextlib.suppress(Exception):
        await client.flush(timeout=2)
    with contextlib.suppress(Exception):
        await client.close()


def stream_config(limits: StreamLimits, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM,
        subjects=list(STREAM_SUBJECTS),
        storage=StorageType.FILE,
        max_age=limits.max_age_s,
        max_bytes=limits.max_bytes,
        duplicate_window=limits.duplicate_window_s,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
    )


async def ensure_stream(js: JetStreamContext, limits: StreamLimits, replicas: int = 1) -> None:
    """Create the stream, or bring its limits up to date (every service may call it; it is idempotent).

    Replicas only go up here: a worker that joins a cluster with the default settings must not strip the
    plane's stream of its copies (lowering them is an operator's act: `nats stream edit`). A server or
    cluster that cannot keep `replicas` copies is one line naming `agents.replicas`."""
    config = stream_config(limits, replicas)
    try:
        try:
            info = await js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:  # it exists with other limits (or replicas)
            if exc.err_code != STREAM_NAME_IN_USE:
                raise
            current = await js.stream_info(STREAM)
            config.num_replicas = max(replicas, current.config.num_replicas or 1)
            info = await js.update_stream(config)
    except nats.js.errors.APIError as exc:
        if replicas > 1 and exc.err_code in REPLICA_ERRORS:
            raise AgentsError(_replicas_error(replicas, exc.description or str(exc))) from None
        raise
    kept = info.config.num_replicas or 1
    if kept < replicas:  # a server that is no cluster keeps one copy, and says so only in its log
        raise AgentsError(
            _replicas_error(replicas, f"the server keeps {kept} (it is not a cluster of {replicas})")
        )


STREAM_NAME_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"
REPLICA_ERRORS = {10005, 10023, 10074}  # no suitable peers; insufficient resources; not a cluster


def _replicas_error(replicas: int, why: str) -> str:
    return f"agents.replicas {replicas}: the NATS server cannot keep {replicas} copies of {STREAM}: {why}"


async def publish(js: JetStreamContext, event: PlaneEvent, *, timeout: float = 5.0) -> Any:
    """Publish and wait for the stream's acknowledgement (the event is stored once that returns)."""
    return await js.publish(
        event.subject(), event.encode(), timeout=timeout, headers={"Nats-Msg-Id": event.dedup_id()}
    )


async def publish_retrying(js: JetStreamContext, event: PlaneEvent, *, attempts: int = 40) -> Any:
    """`publish`, retried while the server is away (a restart): the msg id keeps retries from doubling."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return await publish(js, event)
        except (
            TimeoutError,
            nats.errors.TimeoutError,
            nats.errors.ConnectionClosedError,
            nats.js.errors.NoStreamResponseError,
            nats.errors.NoRespondersError,
            nats.errors.OutboundBufferLimitError,
        ):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


async def pull(
    js: JetStreamContext,
    subject: str,
    durable: str,
    *,
    ack_wait: float,
    max_ack_pending: int = 1000,
    ack_policy: AckPolicy = AckPolicy.EXPLICIT,
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL,
) -> Any:
    """A durable pull subscription on `subject` (shared by every process that names the same durable)."""
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=ack_policy,
        ack_wait=ack_wait,
        max_ack_pending=max_ack_pending,
        deliver_policy=deliver_policy,
    )
    return await js.pull_subscribe(subject, durable=durable, stream=STREAM, config=config)


TRAINER_DURABLE = "trainer"  # the trainer's consumer of training.rollouts
MANAGER_TRAINER_DURABLE = "manager-trainer"  # the manager trainer's consumer of training.manager


async def trainer_subscription(js: JetStreamContext) -> Any:
    """The trainer's durable consumer of rollouts. The manager makes it before it assigns the first task
    of a training plane, so no rollout of that plane is missed while the trainer starts; made new, it
    begins with new rollouts only (not those of planes long gone, for other models)."""
    return await pull(
        js, "training.rollouts", TRAINER_DURABLE, ack_wait=120, deliver_policy=DeliverPolicy.NEW
    )


async def manager_trainer_subscription(js: JetStreamContext) -> Any:
    """The manager trainer's durable consumer of the manager's own rollouts (engine/agents/manager_model.py),
    made by the manager before its first hint, like the trainer's."""
    return await pull(
        js, "training.manager", MANAGER_TRAINER_DURABLE, ack_wait=120, deliver_policy=DeliverPolicy.NEW
    )


async def fetch(sub: Any, batch: int, timeout: float) -> list[Any]:
    """Up to `batch` messages, or none after `timeout` (no exception for an empty wait)."""
    try:
        return await sub.fetch(batch, timeout=timeout)
    except (TimeoutError, nats.errors.TimeoutError):
        return []
