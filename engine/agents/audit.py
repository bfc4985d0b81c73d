"""The audit: every event on the plane, stored in SQLite, and the tables the control room reads.

One durable consumer, `carl-audit`, reads the whole stream in batches. A batch is written in one
transaction, then acknowledged (ack-all: one ack covers the batch), so an event is stored before
the stream forgets it was delivered: a crash between the two only redelivers the batch, and the
unique stream sequence stores each event once. Events a dying cluster node pushed and never
delivered show as a gap in the sequences; they are read from the stream before the ack that would
cover them. A payload that is not a valid event (invalid JSON, a wrong or missing `type`, an
unknown field, a score out of range, nested too deep, a lone surrogate) is stored too, as
`rejected` with its one-line reason and its payload cut to MAX_PAYLOAD and made storable; so is an
answer to a task nobody assigned (admission.py), and an event the store itself refuses (a number
beyond SQLite's integers). One bad message costs one row: the batch around it is stored, and all of
it acknowledged. Only the store's own trouble (locked, full) holds the stream back, and the bridge
says so in `carl agents status`. The totals of rejected (and dead-lettered: not even a rejected row
could be stored) messages are kept in the store's kv, `agents.audit`.

Besides the event log (`agent_events`), each event keeps two summaries current:
- `agent_tasks`, one row per task: the prompt, the first result (a redelivered task answered twice
  is stored once), its step scores, scores, feedback and reward;
- `agent_workers`, one row per worker: its state and model version from its status events, and
  tasks done, failures and score from the results and rollouts it earned.
A status event that answers a control room command (`command_id`) finishes that command.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engine.faults import store_trouble
from engine.store.agent_audit import AgentAudit
from engine.text import one_line, storable

from .admission import refusals
from .bus import STREAM
from .events import (
    EventRejected,
    FeedbackEvent,
    HintEvent,
    ManagerJudgedEvent,
    ManagerStatusEvent,
    ModelUpdateEvent,
    PlaneEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
    event_ids,
    parse_event,
)

if TYPE_CHECKING:
    from engine.store import Store

AUDIT_CONSUMER = "carl-audit"
MAX_UNACKED = 20_000  # events pushed to the audit and not yet stored
CHECKPOINT_EVERY = 50_000  # events written between two WAL checkpoints while the stream never goes quiet
MAX_PAYLOAD = 64 * 1024  # a rejected payload is kept up to this many bytes
REASON_CHARS = 500  # a rejection's reason is kept up to this many characters
AUDIT_KEY = "agents.audit"  # kv: rejected and dead-lettered totals, and the newest reason
log = logging.getLogger("carl.agents")


@dataclass(frozen=True)
class Incoming:
    """One message as it came off the stream."""

    subject: str
    data: bytes
    stream_seq: int | None = None
    stream_key: str | None = None  # "<stream created>:<sequence>", unique across a re-created stream
    msg_id: str | None = None
    received_at: float = field(default_factory=time.time)


@dataclass
class AuditCounts:
    stored: int = 0
    rejected: int = 0  # stored as rejected, with the reason
    duplicates: int = 0  # already stored (a redelivered batch)
    dead_letters: int = 0  # not even a rejected row could be stored: counted, logged, acknowledged
    reasons: list[str] = field(default_factory=list)  # the first few rejections, for the log
    last: str | None = None  # the newest rejection

    def add(self, other: AuditCounts) -> None:
        self.stored += other.stored
        self.rejected += other.rejected
        self.duplicates += other.duplicates
        self.dead_letters += other.dead_letters
        self.reasons = (self.reasons + other.reasons)[:5]
        self.last = other.last or self.last

    def refused(self, item: Incoming, why: EventRejected) -> None:
        self.rejected += 1
        self.note(item, str(why))

    def note(self, item: Incoming, why: str) -> None:
        self.last = one_line(f"{item.subject}: {why}", REASON_CHARS)
        if len(self.reasons) < 5:
            self.reasons.append(self.last)


# One message as parsed: the event, or why it is not one (then the event is None); or an event
# refused all the same (an answer to a task nobody assigned: both are set).
Parsed = tuple[Incoming, PlaneEvent | None, EventRejected | None]


def _parse(item: Incoming) -> Parsed:
    try:
        return item, parse_event(item.subject, item.data), None
    except EventRejected as exc:
        return item, None, exc
    except Exception as exc:  # parse_event says EventRejected; whatever else it meets is a reason too
        return item, None, EventRejected(f"unreadable: {type(exc).__name__}: {exc}")


def _admitted(tables: AgentAudit, entries: list[Parsed]) -> list[Parsed]:
    """`entries`, with results, rollouts and feedback the plane never asked for marked refused."""
    refused = refusals(tables, [event if why is None else None for _, event, why in entries])
    if not refused:
        return entries
    return [
        (item, event, EventRejected(refused[i], event.TYPE) if i in refused and event else why)
        for i, (item, event, why) in enumerate(entries)
    ]


def _epoch(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class _Tally:
    """A worker's counts in this batch (added to its row once, at the batch's end), and its last message's
    time."""

    seen: float
    done: int = 0
    failed: int = 0
    scored: int = 0
    score_sum: float = 0.0


class AuditWriter:
    """Writes batches of plane messages into the store; one transaction per batch."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tables = AgentAudit(store)
        self._tallies: dict[str, _Tally] = {}
        # Checkpoints off the insert path (SQLite's own run inside the commit that passes 1,000 WAL pages,
        # about every batch): the audit runs them when the stream is quiet, or every CHECKPOINT_EVERY events.
        self.tables.stop_auto_checkpoint()
        self.unchecked = 0  # events written since the last checkpoint

    def write(self, items: Sequence[Incoming]) -> AuditCounts:
        """Store a batch: the log rows in one statement, then each new event's summaries, in order.

        A message the store refuses (a number beyond SQLite's integers, say) costs its own row, not the
        batch: the batch is written again one message at a time, and that one is stored as rejected.
        Only the store's own trouble (locked, full, unreadable) raises, for the caller to try again."""
        parsed = [_parse(item) for item in items]
        try:
            return self._write(parsed, one_by_one=False)
        except Exception as exc:
            if store_trouble(exc):
                raise
            log.warning("audit: a batch of %d could not be stored whole (%s); one by one", len(items), exc)
            return self._write(parsed, one_by_one=True)

    def _write(self, parsed: list[Parsed], *, one_by_one: bool) -> AuditCounts:
        counts = AuditCounts()
        self._tallies.clear()  # what a failed try counted was rolled back with it
        with self.store.transaction():
            if one_by_one:
                for entry in _admitted(self.tables, self._new_only(parsed, counts)):
                    self._store_one(entry, counts)
            else:
                for item, event, why in self._insert_new(parsed, counts):
                    if why is not None:
                        counts.refused(item, why)
                        continue
                    counts.stored += 1
                    self._apply(event, item.received_at)
            self._flush_tallies()
            if counts.rejected or counts.dead_letters:
                self._count_refusals(counts)
        self.unchecked += len(parsed)
        if self.unchecked >= CHECKPOINT_EVERY:
            self.checkpoint()
        return counts

    def _insert_new(self, parsed: list[Parsed], counts: AuditCounts) -> list[Parsed]:
        """Insert the batch's log rows (in stream order, accepted and rejected alike: the log's ids are the
        order things arrived in); returns the entries inserted. Optimistic: a stored message comes back only
        in a redelivered batch (a restart between a commit and its ack), so one statement skips a stored
        stream key, and only when it skipped one is each key looked up (2 us an event when always done)."""
        new = _admitted(self.tables, _once_each(parsed, counts))
        if self.tables.insert_unseen_events([_row(item, event, why) for item, event, why in new]):
            return new
        counts.duplicates = 0
        new = _admitted(self.tables, self._new_only(parsed, counts))
        self.tables.insert_events([_row(item, event, why) for item, event, why in new])
        return new

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (PASSIVE: it never waits for a reader)."""
        self.unchecked = 0
        try:
            self.tables.checkpoint()
        except sqlite3.Error as exc:  # another connection checkpointing: it does the work
            log.debug("audit: checkpoint: %s", exc)

    def _store_one(self, entry: Parsed, counts: AuditCounts) -> None:
        """One message in a savepoint: stored, or else stored as rejected with why, or else dead-lettered."""
        item, event, why = entry
        if why is None:
            assert event is not None  # parsed: an event, no why
            tallies = {worker: replace(tally) for worker, tally in self._tallies.items()}
            try:
                with self.tables.savepoint():
                    self.tables.insert_event(_row(item, event, None))
                    self._apply(event, item.received_at)
                counts.stored += 1
                return
            except Exception as exc:
                if store_trouble(exc):
                    raise
                self._tallies = tallies
                # Kept bare (the payload and why): whatever in the event the store refused stays out.
                why = EventRejected(f"cannot be stored: {type(exc).__name__}: {exc}", event.TYPE)
                event = None
        try:
            with self.tables.savepoint():
                self.tables.insert_event(_row(item, event, why))
            counts.refused(item, why)
        except Exception as exc:
            if store_trouble(exc):
                raise
            counts.dead_letters += 1  # acknowledged all the same: the stream must go on
            counts.note(item, f"dead-lettered ({why}; then {type(exc).__name__}: {exc})")

    def _apply(self, event: PlaneEvent | None, received: float) -> None:
        apply = _APPLY.get(type(event))
        if apply is not None:
            apply(self, event, received)

    def _count_refusals(self, counts: AuditCounts) -> None:
        """The running totals `carl agents status` shows, kept with the rows they count."""
        text = self.tables.kv_text(AUDIT_KEY)
        totals = json.loads(text) if text is not None else {}
        totals["rejected"] = int(totals.get("rejected") or 0) + counts.rejected
        totals["dead_letters"] = int(totals.get("dead_letters") or 0) + counts.dead_letters
        totals["last"] = counts.reasons[-1] if counts.reasons else totals.get("last")
        totals["last_at"] = time.time()
        self._kv(AUDIT_KEY, totals)

    def _new_only(self, parsed: list[Any], counts: AuditCounts) -> list[Any]:
        """The messages not stored yet (a redelivered batch, or a repeat inside this one, is stored once)."""
        keys = [item.stream_key for item, _, _ in parsed if item.stream_key is not None]
        stored = self.tables.stored_stream_keys(keys)
        new = []
        for entry in parsed:
            key = entry[0].stream_key
            if key is not None and key in stored:
                counts.duplicates += 1
                continue
            if key is not None:
                stored.add(key)
            new.append(entry)
        return new

    # -- the summaries ---------------------------------------------------------------------------

    def _task(self, event: TaskEvent, received: float) -> None:
        self.tables.assign_task(
            (
                event.task_id,
                event.task_type,
                event.environment,
                event.prompt,
                event.reference,
                event.verifier,
                event.group_id,
                event.manager_id,
                _epoch(event.created_at),
                received,
            ),
        )

    def _result(self, event: ResultEvent, received: float) -> None:
        values = (
            event.worker_id,
            event.status,
            event.result,
            event.answer,
            _json(event.steps),
            event.model_version,
            event.elapsed_seconds,
            event.phi_mean,
            len(event.response_token_ids),
            "done" if event.status == "success" else "failed",
            _epoch(event.created_at),
            received,
        )
        if not self.tables.answer_task(event.task_id, values):
            return  # a repeat of the result that stands (a result for a task never assigned is refused)
        tally = self._tally_of(event.worker_id, received)
        if event.status == "success":
            tally.done += 1
        else:
            tally.failed += 1

    def _rollout(self, event: TrainingRolloutEvent, received: float) -> None:
        values = (
            _json(event.step_scores),
            event.prm_score,
            event.outcome_score,
            event.verifier_score,
            event.reward,
            received,
        )
        if self.tables.reward_task(event.task_id, values):
            tally = self._tally_of(event.worker_id, received)
            tally.scored += 1
            tally.score_sum += event.reward

    def _feedback(self, event: FeedbackEvent, received: float) -> None:
        self.tables.feedback_task(event.task_id, event.score, event.textual_feedback, event.source, received)

    def _hint(self, event: HintEvent, received: float) -> None:
        self.tables.hint_task(event.task_id, event.hint, event.source, received)

    def _judged(self, event: ManagerJudgedEvent, received: float) -> None:
        self.tables.add_judgement(
            (
                event.task_id,
                event.manager_id,
                event.worker_id,
                event.kind,
                event.value,
                event.next_task_id,
                _epoch(event.created_at),
                received,
            )
        )

    def _worker_status(self, event: WorkerStatusEvent, received: float) -> None:
        self._worker_seen(event.worker_id, received)
        self.tables.worker_status(
            event.worker_id,
            (
                event.kind,
                _json(event.task_types),
                event.model,
                event.model_version,
                event.state,
                event.task_id,
                event.host,
                event.pid,
                event.detail,
            ),
        )
        if event.command_id is not None:
            self._answer(event.command_id, f"worker {event.worker_id} {event.state}" + _detail(event.detail))

    def _manager_status(self, event: ManagerStatusEvent, received: float) -> None:
        # The plane's own manager is "manager"; one that joined for a `carl agents run` keeps a row of its
        # own.
        key = "agents.manager" if event.manager_id == "manager" else f"agents.manager.{event.manager_id}"
        self._kv(key, {**event.model_dump(mode="json"), "received_at": received})
        if event.command_id is not None:
            self._answer(event.command_id, f"manager {event.state}" + _detail(event.detail))

    def _model_update(self, event: ModelUpdateEvent, received: float) -> None:
        self._kv(
            "agents.model",
            {
                "model_version": event.model_version,
                "checkpoint_path": event.checkpoint_path,
                "base_model": event.base_model,
                "step": event.step,
                "received_at": received,
            },
        )

    def _tally_of(self, worker_id: str, received: float) -> _Tally:
        """This batch's counts for a worker (written once)."""
        tally = self._tallies.get(worker_id)
        if tally is None:
            tally = self._tallies[worker_id] = _Tally(received)
        tally.seen = max(tally.seen, received)
        return tally

    def _flush_tallies(self) -> None:
        for worker_id, tally in self._tallies.items():
            self._worker_seen(worker_id, tally.seen)
            self.tables.add_worker_tally(worker_id, tally.done, tally.failed, tally.scored, tally.score_sum)
        self._tallies.clear()

    def _worker_seen(self, worker_id: str, received: float, kind: str | None = None) -> None:
        self.tables.worker_seen(worker_id, received, kind)

    def _kv(self, key: str, value: Any) -> None:
        self.tables.set_kv_text(key, _json(value))

    def _answer(self, command_id: int, result: str) -> None:
        """A command the plane answered: done, unless it finished already (failed for lack of an answer)."""
        self.tables.answer_command(command_id, result)


def _once_each(parsed: list[Parsed], counts: AuditCounts) -> list[Parsed]:
    """`parsed` without a message repeated inside it (the same stream key twice: stored once)."""
    seen: set[str] = set()
    out = []
    for entry in parsed:
        key = entry[0].stream_key
        if key is not None:
            if key in seen:
                counts.duplicates += 1
                continue
            seen.add(key)
        out.append(entry)
    return out


def _row(item: Incoming, event: PlaneEvent | None, why: EventRejected | None) -> tuple[Any, ...]:
    """The log row of one message: an event as it came, or (with `why`) a rejected payload."""
    if why is not None:
        return _rejected_row(item, event, why)
    assert event is not None
    ids = event_ids(event)
    return (
        item.subject,
        ids["type"],
        ids["task_id"],
        ids["manager_id"],
        ids["worker_id"],
        ids["score"],
        item.data.decode("utf-8"),
        _epoch(ids["created_at"]),
        ids["environment"],
        ids["model_version"],
        item.stream_seq,
        item.stream_key,
        item.msg_id,
        item.received_at,
        "ok",
        None,
    )


def _rejected_row(item: Incoming, event: PlaneEvent | None, why: EventRejected) -> tuple[Any, ...]:
    """A payload refused with its one-line reason: kept up to MAX_PAYLOAD bytes and made storable, with
    the event's ids where it is a valid event refused all the same (an answer to a task nobody assigned)."""
    ids: dict[str, Any] = event_ids(event) if event is not None else {}
    return (
        storable(item.subject),
        ids.get("type") or why.type_name or "?",
        ids.get("task_id"),
        ids.get("manager_id"),
        ids.get("worker_id"),
        ids.get("score"),
        storable(item.data[:MAX_PAYLOAD].decode("utf-8", errors="replace")),
        _epoch(ids.get("created_at")) or item.received_at,
        ids.get("environment"),
        ids.get("model_version"),
        item.stream_seq,
        item.stream_key,
        storable(item.msg_id) if item.msg_id is not None else None,
        item.received_at,
        "rejected",
        one_line(str(why), REASON_CHARS),
    )


def _detail(detail: str) -> str:
    return f": {detail}" if detail else ""


_APPLY: dict[type, Callable[[AuditWriter, Any, float], None]] = {
    TaskEvent: AuditWriter._task,
    ResultEvent: AuditWriter._result,
    TrainingRolloutEvent: AuditWriter._rollout,
    FeedbackEvent: AuditWriter._feedback,
    WorkerStatusEvent: AuditWriter._worker_status,
    ManagerStatusEvent: AuditWriter._manager_status,
    ModelUpdateEvent: AuditWriter._model_update,
    HintEvent: AuditWriter._hint,
    ManagerJudgedEvent: AuditWriter._judged,
}


# -- the consumer ---------------------------------------------------------------------------------


def audit_config() -> ConsumerConfig:
    """A durable push consumer over the whole stream, with flow control (the server never floods the
    client) and ack-all (one ack covers a batch). Push, not pull: nats-py receives pushed messages
    about 2.5x faster than it fetches them (bench/bench_agents.py)."""
    return ConsumerConfig(
        durable_name=AUDIT_CONSUMER,
        ack_policy=AckPolicy.ALL,
        ack_wait=30,
        deliver_policy=DeliverPolicy.ALL,
        max_ack_pending=MAX_UNACKED,
        flow_control=True,
        idle_heartbeat=5,
    )


async def audit_bound(js: Any) -> bool:
    """Whether an audit is already consuming (another process stores the events into this store)."""
    try:
        info = await js.consumer_info(STREAM, AUDIT_CONSUMER)
    except nats.js.errors.NotFoundError:
        return False
    return bool(info.push_bound)


async def stream_epoch(js: Any) -> str:
    """The stream's creation time, which tells this stream from an earlier one of the same name."""
    info = await js.stream_info(STREAM)
    created = info.created
    return str(int(created.timestamp() * 1e6)) if hasattr(created, "timestamp") else str(created)


def incoming(msg: Any, epoch: str) -> Incoming:
    headers = msg.headers or {}
    seq = _stream_seq(msg.reply)
    return Incoming(msg.subject, msg.data, seq, f"{epoch}:{seq}", headers.get("Nats-Msg-Id"), time.time())


def _stream_seq(reply: str) -> int:
    """The stream sequence from a JetStream ack subject, `$JS.ACK.<stream>.<consumer>.<delivered>.<stream
    seq>...` (the short form; the long one, with domain and account, goes through nats-py's parser)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5])
    from nats.aio.msg import Msg

    return Msg.Metadata._from_reply(reply).sequence.stream


async def _subscribe(js: Any, cb: Callable[[Any], Awaitable[None]]) -> Any:
    try:
        info = await js.consumer_info(STREAM, AUDIT_CONSUMER)
    except nats.js.errors.NotFoundError:
        info = None
    if info is not None and not info.config.deliver_subject:
        # A pull consumer of an older audit: made anew. It starts over from the stream's first event,
        # and the stream keys keep what is stored already from being stored twice.
        await js.delete_consumer(STREAM, AUDIT_CONSUMER)
    return await js.subscribe(
        "",
        durable=AUDIT_CONSUMER,
        stream=STREAM,
        cb=cb,
        manual_ack=True,
        config=audit_config(),
        pending_msgs_limit=4 * MAX_UNACKED,
        pending_bytes_limit=512 * 1024 * 1024,
    )


async def run_audit(
    js: Any,
    writer: AuditWriter,
    stop: asyncio.Event,
    *,
    batch: int = 2000,
    wait: float = 0.25,
    on_batch: Callable[[AuditCounts], None] | None = None,
    on_trouble: Callable[[str | None], None] | None = None,
) -> AuditCounts:
    """Store the stream's events until `stop` is set; returns what it stored.

    Messages pile up in `arrived` as the server pushes them; every `wait` seconds (or at `batch`
    messages) what arrived is written in one transaction, in a thread (the client keeps receiving
    meanwhile), then acknowledged with its last message. A write that fails is tried again, never
    skipped: one ack covers every earlier message. A server restart is waited out; what it had pushed
    and we had not acknowledged comes again after the ack wait, and is stored once. What it counted as
    pushed and never delivered (a cluster node killed mid-push) is read back by sequence (`fill_gaps`).
    `on_trouble` hears the store's trouble while it lasts (one line), and None once a batch is stored.
    """
    total = AuditCounts()
    arrived: list[Any] = []
    last_seq: int | None = None  # the highest stream sequence delivered to this audit
    enough = asyncio.Event()
    tune_gc()

    async def on_message(msg: Any) -> None:
        arrived.append(msg)
        if len(arrived) >= batch:
            enough.set()

    sub = None
    try:
        while not stop.is_set():
            if sub is None:
                try:
                    epoch = await stream_epoch(js)
                    sub = await _subscribe(js, on_message)
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    log.debug("audit: %s; retrying", exc)
                    await asyncio.sleep(0.5)
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), wait)
            enough.clear()
            if not arrived and writer.unchecked:  # the stream is quiet: the checkpoint costs it nothing now
                await asyncio.to_thread(writer.checkpoint)
            while arrived:
                msgs = arrived[:batch]
                del arrived[:batch]
                filled = await fill_gaps(js, msgs, last_seq, epoch, stop)
                if filled is None:
                    return total  # stopped before a gap was filled: unacknowledged, they come again
                items, last_seq = filled
                counts = await _write_until_stored(writer, items, epoch, stop, on_trouble)
                if counts is None:
                    return total  # stopped while the store was failing: unacknowledged, they come again
                await _ack_all(msgs[-1])
                total.add(counts)
                if on_batch is not None:
                    on_batch(counts)
    finally:
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    return total


async def fill_gaps(
    js: Any, msgs: list[Any], last_seq: int | None, epoch: str, stop: asyncio.Event
) -> tuple[list[Any], int | None] | None:
    """`msgs`, with the events they skip over read from the stream and put in their place, and the highest
    sequence delivered so far; None when stopped before a gap was filled.

    The audit reads the whole stream, so its deliveries run 1, 2, 3, ... (a redelivery goes back). A
    gap is events the server counted as delivered that never arrived: pushed by a consumer leader that
    died (a cluster node killed) before they left it. The ack-all after this batch would acknowledge
    them unseen, so they are read by sequence first. Events the stream no longer holds (aged out, or
    beyond its byte limit) are skipped."""
    out: list[Any] = []
    for msg in msgs:
        seq = _stream_seq(msg.reply)
        if last_seq is not None and seq > last_seq + 1:
            missing = await _read_missing(js, last_seq + 1, seq, epoch, stop)
            if missing is None:
                return None
            out += missing
        last_seq = seq if last_seq is None else max(last_seq, seq)
        out.append(msg)
    return out, last_seq


async def _read_missing(
    js: Any, first: int, end: int, epoch: str, stop: asyncio.Event
) -> list[Incoming] | None:
    """Stream sequences first..end-1 as Incoming, those the stream still holds; retried while the cluster
    elects a new stream leader."""
    found: list[Incoming] = []
    oldest: int | None = None
    seq, delay = first, 0.1
    while seq < end and not stop.is_set():
        try:
            if oldest is None:
                oldest = (await js.stream_info(STREAM)).state.first_seq
                seq = max(seq, oldest)
                continue
            raw = await js.get_msg(STREAM, seq)
        except nats.js.errors.NotFoundError:  # gone (aged out, or deleted): nothing to keep
            seq += 1
            continue
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:  # no leader yet: wait
            log.debug("audit: reading back event %d: %s; retrying", seq, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        headers = raw.headers or {}
        found.append(
            Incoming(raw.subject, raw.data or b"", seq, f"{epoch}:{seq}", headers.get("Nats-Msg-Id"))
        )
        seq += 1
    if seq < end:
        return None
    log.info(
        "audit: %d event(s) pushed but never delivered (%d-%d) read back from the stream",
        len(found),
        first,
        end - 1,
    )
    return found


def tune_gc() -> None:
    """Fewer, cheaper garbage collections while events stream in: the objects alive by now (imports,
    the process's state) are set aside from collection, and a collection waits for 50,000 allocations
    instead of 700. Measured on the audit: about 10% more events a second (bench/bench_agents.py)."""
    gc.freeze()
    if gc.get_threshold()[0] < 50_000:
        gc.set_threshold(50_000, 20, 20)


async def _write_until_stored(
    writer: AuditWriter,
    msgs: list[Any],
    epoch: str,
    stop: asyncio.Event,
    on_trouble: Callable[[str | None], None] | None = None,
) -> AuditCounts | None:
    """Write in the thread, reading the messages there too: the event loop's own time goes to receiving.

    A bad message never raises here (the writer stores it as rejected); what does is the store's own
    trouble (locked, full), so the batch is tried again, and nothing after it is acknowledged."""

    def write() -> AuditCounts:
        return writer.write([m if isinstance(m, Incoming) else incoming(m, epoch) for m in msgs])

    delay, said = 0.5, None
    while True:
        try:
            counts = await asyncio.to_thread(write)
        except Exception as exc:
            trouble = one_line(f"cannot store events: {type(exc).__name__}: {exc}")
            if trouble != said:  # once per distinct failure, with its traceback
                log.exception("audit: could not store %d events; trying again", len(msgs))
                said = trouble
            if on_trouble is not None:
                on_trouble(trouble)
            if stop.is_set():
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            continue
        if said is not None and on_trouble is not None:
            on_trouble(None)
        return counts


async def _ack_all(last: Any) -> None:
    """Acknowledge a batch with its last message (AckPolicy.ALL); a lost ack only redelivers it."""
    try:
        await last.ack()
    except Exception as exc:  # the connection went away: the batch comes again, and is stored once
        log.debug("audit ack failed: %s", exc)
