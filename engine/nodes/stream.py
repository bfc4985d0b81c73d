"""The nodes' JetStream stream and the engine's consumer of it (nats-py; the connection is the agents plane's,
engine/agents/bus.py: the same URLs, token file, creds and TLS, the same one-line errors).

`CARL_NODES` holds `carl.nodes.>` on file storage, with limits (a week, 1 GiB, 1 MiB a message, the oldest
dropped first) and a duplicate window: a node that publishes a message again (its ack was lost) is stored
once. Either side creates the stream, so what a node sends before the engine first looks is kept. The engine
reads it through a durable pull consumer of its own (its name is kept in the store, so two engines on one
server each read everything), acknowledging each message only once its rows are committed, and made again
from its ack floor whenever the engine starts reading (`subscribe`), so what a killed engine left
unacknowledged comes first, in order.
"""

from __future__ import annotations

from typing import Any

import nats
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy, StorageType, StreamConfig

from .wire import PREFIX, STREAM, STREAM_MAX_MSG_BYTES, SUBJECTS

MAX_AGE_S = 7 * 86400.0  # a node's messages wait this long for an engine that is down
MAX_BYTES = 1 << 30
DUPLICATE_WINDOW_S = 120.0  # a publish repeated within this (its ack was lost) is stored once
ACK_WAIT_S = 30.0  # a batch not acknowledged in this time is delivered again (the engine was killed)
MAX_ACK_PENDING = 10_000
CONSUMER_IDLE_S = MAX_AGE_S  # a consumer nobody reads from for this long is removed by the server
STREAM_NAME_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"


def stream_config() -> StreamConfig:
    return StreamConfig(
        name=STREAM,
        subjects=list(SUBJECTS),
        storage=StorageType.FILE,
        max_age=MAX_AGE_S,
        max_bytes=MAX_BYTES,
        max_msg_size=STREAM_MAX_MSG_BYTES,
        duplicate_window=DUPLICATE_WINDOW_S,
        discard=DiscardPolicy.OLD,
    )


async def ensure_stream(js: JetStreamContext) -> None:
    """Create the stream, or bring its limits up to date; keeps the replicas an operator gave it."""
    config = stream_config()
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != STREAM_NAME_IN_USE:
            raise
        current = await js.stream_info(STREAM)
        config.num_replicas = current.config.num_replicas or 1
        await js.update_stream(config)


def consumer_config(durable: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable,
        filter_subject=f"{PREFIX}.>",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT_S,
        max_ack_pending=MAX_ACK_PENDING,
        deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=CONSUMER_IDLE_S,
    )


async def subscribe(js: JetStreamContext, durable: str) -> Any:
    """The engine's consumer, delivering in stream order from the first message it has not acknowledged.

    A consumer that exists is made again from its ack floor: what an engine killed mid-batch had fetched and
    never acknowledged would otherwise come back only after ACK_WAIT_S, behind newer messages, and a node's
    console lines must be appended in order. Messages past the floor that were acknowledged come again too,
    and are stored once (writer.py)."""
    config = consumer_config(durable)
    try:
        info = await js.consumer_info(STREAM, durable)
    except nats.js.errors.NotFoundError:
        info = None
    if info is not None:
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
        await js.delete_consumer(STREAM, durable)
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = (floor or 0) + 1
    return await js.pull_subscribe(f"{PREFIX}.>", durable=durable, stream=STREAM, config=config)


async def fetch(sub: Any, batch: int, timeout: float) -> list[Any]:
    """Up to `batch` messages, or none after `timeout` (no exception for an empty wait)."""
    try:
        return await sub.fetch(batch, timeout=timeout)
    except (TimeoutError, nats.errors.TimeoutError):
        return []


def jetstream_missing(exc: BaseException) -> bool:
    """Whether the server (or this account) has no JetStream: nothing a retry fixes."""
    text = str(exc).lower()
    return isinstance(exc, nats.js.errors.ServiceUnavailableError) or "jetstream not enabled" in text
