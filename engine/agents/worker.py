"""A worker: takes tasks of one type from the plane, answers them with a backend (backends.py: a model on
this machine, run in a process of its own by model_process.py, or an OpenAI-compatible server), publishes
results.

New weights come on `model.updates`; the worker fetches them from the plane's object store by name
and digest into its own `$CARL_HOME` (weights.py), so it needs no filesystem shared with the trainer,
and has its backend swap them in between two tasks.

The workers of a task type share one durable consumer (their queue group): each task goes to one
worker, which acknowledges it once its result is stored in the stream. A worker that dies before
that leaves the task unacknowledged, and the stream gives it to another worker after the ack wait.
Every reply is in the `<step>…</step>` / `<answer>…</answer>` format; work that fails is answered
with `status=failed` and the reason. Each result names the model version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import DeliverPolicy

from engine.errors import CarlError

from .backends import Answer, Backend, HttpBackend, SwapNotNow, WorkerError
from .bus import STREAM, Address, connect, ensure_stream, fetch, publish_retrying, pull
from .bus import close as bus_close
from .events import (
    ControlEvent,
    EventRejected,
    ModelUpdateEvent,
    ResultEvent,
    TaskEvent,
    WorkerStatusEvent,
    parse_event,
)
from .model_process import ModelProcess
from .plane_settings import AgentsSettings
from .scoring import render_reply, split_reply
from .weights import fetch_weights

log = logging.getLogger("carl.agents")

HEARTBEAT_S = 10.0  # an idle worker says it is alive this often
FETCH_WAIT_S = 5.0  # how long one wait for a task lasts
MAX_DELIVER = 5  # a task that made this many workers fail or vanish is not handed out again
MAX_SETTLING = 4  # results waiting for the stream's acknowledgement before the worker waits too
JOIN_WAIT_S = 60.0  # a worker that starts while a cluster elects its leaders waits this long for them
# A swap that failed for a reason that may pass (a server error, a lost connection, a fetch that timed
# out) is tried again after these waits, unless a newer update came meanwhile. A refusal is not.
SWAP_RETRY_S = (2.0, 10.0, 30.0)


def make_backend(kind: str, settings: AgentsSettings, home: Path, worker_id: str = "") -> Backend:
    """A `model` worker's model runs in a process of its own (model_process.py); an `http` worker asks a
    server."""
    if kind == "model":
        return ModelProcess(settings, home, seed=sampling_seed(settings.seed, worker_id))
    if kind == "http":
        return HttpBackend(settings)
    raise WorkerError(f"--kind {kind!r}: expected model or http")


def sampling_seed(seed: int, worker_id: str) -> int:
    """A model worker's sampling seed: the plane's `seed` and the worker's id. Two workers never draw the same
    answers to the same prompt (the same seed would give a GRPO group identical members); the same plane
    seed and worker id draw the same answers again."""
    return seed * 1_000_003 + zlib.crc32(worker_id.encode())


def default_worker_id(kind: str) -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:24]
    return f"{kind}-{host}-{os.getpid()}"


# -- the worker --------------------------------------------------------------------------------


class Worker:
    """One worker process's loop: fetch a task, answer it, publish the result, acknowledge."""

    def __init__(
        self,
        address: Address,
        settings: AgentsSettings,
        backend: Backend,
        *,
        worker_id: str,
        home: Path,
        command_id: int | None = None,
    ) -> None:
        self.address = address
        self.settings = settings
        self.backend = backend
        self.home = home  # where fetched weights are unpacked: this machine's, never the trainer's
        self.tried_version: str | None = None  # the newest update tried, loaded or refused: tried once
        self.worker_id = worker_id
        self.task_type = settings.task_type
        self.command_id = command_id  # the "add worker" command this worker answers when it is up
        self.stop = asyncio.Event()
        self.stop_command: int | None = None
        self.state = "starting"
        self.task_id: str | None = None
        self.done = 0
        self.failures = 0
        self.last_status = 0.0
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.lock = asyncio.Lock()  # a hot-swap waits for the task in hand
        self.js: Any = None
        self.nc: Any = None
        self.settling: set[asyncio.Task[None]] = set()  # results handed in, waiting for the stream's ack
        self.retrying: set[asyncio.Task[None]] = set()  # swaps to try again (SWAP_RETRY_S)

    async def run(self) -> None:
        self.nc = await connect(self.address, f"carl-worker-{self.worker_id}", on_event=self._connection)
        self.js = self.nc.jetstream()
        log.info(
            "worker %s (%s, %s) on %s, taking %s tasks",
            self.worker_id,
            self.backend.kind,
            self.backend.model,
            self.address.url,
            self.task_type,
        )
        try:
            await self._joining(
                "the stream", lambda: ensure_stream(self.js, self.settings.stream, self.settings.replicas)
            )
            tasks = await self._joining(
                "the workers' consumer",
                lambda: pull(
                    self.js,
                    f"tasks.{self.task_type}",
                    f"workers-{self.task_type}",
                    ack_wait=self.settings.ack_wait_s,
                    max_ack_pending=1000,
                ),
            )
            await self._subscribe_controls()
            await self._joining("model updates", self._subscribe_updates)
            await self.status("idle", command_id=self.command_id, detail=f"serving {self.backend.version}")
            ahead: asyncio.Future[list[Any]] | None = None  # the fetch in flight, kept across short waits
            taken = asyncio.Event()  # the worker took what `ahead` fetched (it stops renewing its ack wait)
            while not self.stop.is_set():
                if ahead is None:
                    ahead = asyncio.ensure_future(self._fetch(tasks, FETCH_WAIT_S))
                taken.set()
                # Right after a task, a short wait: with no next task the worker says it is idle at once.
                await asyncio.wait({ahead}, timeout=0.2 if self.state == "busy" else None)
                msgs: list[Any] = []
                if ahead.done():
                    msgs, ahead = ahead.result(), None
                for msg in msgs:
                    if ahead is None:
                        taken = asyncio.Event()
                        ahead = asyncio.ensure_future(self._fetch_ahead(tasks, taken))
                    await self.handle(msg)
                if not msgs and (self.state != "idle" or time.monotonic() - self.last_status > HEARTBEAT_S):
                    await self.status("idle", wait=False)  # no task came: idle (or still alive)
            taken.set()
            await self._give_back(ahead)
            await self.status("stopped", command_id=self.stop_command, detail="stopped on request")
        finally:
            for retry in self.retrying:
                retry.cancel()
            if self.settling:  # every result handed in is stored, and its task acknowledged, before we go
                await asyncio.wait(self.settling, timeout=30)
            with contextlib.suppress(Exception):
                await bus_close(self.nc)
            self.backend.close()

    async def _joining(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """`call`, a JetStream request of the worker's start, again while nobody answers it: a cluster
        that lost a node times requests out or answers 503 until it has elected new leaders. After
        JOIN_WAIT_S, one line naming the URL."""
        deadline, delay = time.monotonic() + JOIN_WAIT_S, 0.25
        while True:
            try:
                return await call()
            except (
                TimeoutError,
                nats.errors.NoRespondersError,
                nats.js.errors.ServiceUnavailableError,
            ) as exc:
                reason = " ".join(str(exc).split()).removeprefix("nats: ") or type(exc).__name__
                if time.monotonic() >= deadline:
                    raise WorkerError(
                        f"{self.address.url}: JetStream did not answer for {what} in {JOIN_WAIT_S:.0f}s "
                        f"({reason})"
                    ) from None
                log.info("worker %s: waiting for JetStream (%s): %s", self.worker_id, what, reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _fetch(self, sub: Any, wait: float) -> list[Any]:
        """The next task, waiting up to `wait` seconds, or nothing
        (also as soon as the worker is told to stop).

        The wait is long on purpose: idle workers whose pull requests expire and are renewed in step with
        the arrival of tasks starve each other (measured: at one task a second with 1 s waits, one of two
        workers got all 20); with 5 s waits they take turns."""
        fetching = asyncio.ensure_future(fetch(sub, 1, wait))
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not fetching.done():
            fetching.cancel()  # a task it would still have got is redelivered after the ack wait
            return []
        try:
            return fetching.result()
        except (
            nats.errors.ConnectionClosedError,
            nats.errors.NoRespondersError,
            nats.js.errors.ServiceUnavailableError,
            nats.js.errors.APIError,
        ) as exc:
            log.debug("fetch: %s", exc)
            await asyncio.sleep(0.25)  # the server is away: the client reconnects on its own
            return []

    async def _fetch_ahead(self, sub: Any, taken: asyncio.Event) -> list[Any]:
        """The next task, asked for while the worker answers the one in hand: it is there when that one
        ends, instead of a round trip to the server after it (2-4 ms a task on the tiny model, about 15%:
        bench/bench_agents.py). Until the worker takes it, its ack wait is renewed, so a long task in hand
        never makes the stream give it to another worker meanwhile. (An idle worker still gets a new task
        first: the server serves the pull requests in the order they came.)"""
        msgs = await self._fetch(sub, FETCH_WAIT_S)
        self._ask_ahead(msgs)
        while msgs and not taken.is_set():
            try:
                await asyncio.wait_for(taken.wait(), self.settings.ack_wait_s / 3)
            except TimeoutError:
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.in_progress()
        return msgs

    def _ask_ahead(self, msgs: list[Any]) -> None:
        """A backend that can (a model in its own process) is asked for the next task's answer as soon as
        the task is here, so that it starts on it the moment the answer in hand is done."""
        submit = getattr(self.backend, "submit", None)
        if submit is None:
            return
        for msg in msgs:
            try:
                task = parse_event(msg.subject, msg.data)
            except EventRejected:
                continue  # `handle` says why
            if isinstance(task, TaskEvent) and msg.metadata.num_delivered <= MAX_DELIVER:
                with contextlib.suppress(WorkerError):  # the model process is gone: `handle` says so
                    submit(task)

    async def _give_back(self, ahead: asyncio.Future[list[Any]] | None) -> None:
        """A task fetched ahead and never answered (the worker is stopping) goes back to the stream now, for
        another worker, instead of after the ack wait."""
        if ahead is None:
            return
        with contextlib.suppress(Exception):
            for msg in await asyncio.wait_for(ahead, 5.0):
                with contextlib.suppress(Exception):
                    await msg.nak()

    def _connection(self, what: str) -> None:
        log.info("worker %s: %s", self.worker_id, what)

    async def handle(self, msg: Any) -> None:
        try:
            task = parse_event(msg.subject, msg.data)
        except EventRejected as exc:
            log.warning("worker %s: rejected a message on %s: %s", self.worker_id, msg.subject, exc)
            await msg.term()  # never handed to anyone again; the audit keeps it, with the reason
            return
        if not isinstance(task, TaskEvent):
            await msg.term()
            return
        if msg.metadata.num_delivered > MAX_DELIVER:
            await msg.term()
            return
        async with self.lock:
            self.task_id = task.task_id
            taken = await self._taking()
            started = time.monotonic()
            try:
                answer = await asyncio.to_thread(self.backend.answer, task)
                result = self._result(task, answer, time.monotonic() - started)
            except Exception as exc:  # the work failed: say so, with the reason, and move on
                reason = " ".join(str(exc).split())[:300] or type(exc).__name__
                result = ResultEvent(
                    task_id=task.task_id,
                    worker_id=self.worker_id,
                    task_type=task.task_type,
                    environment=task.environment,
                    prompt=task.prompt,
                    status="failed",
                    result=reason,
                    error=reason,
                    elapsed_seconds=time.monotonic() - started,
                    model_version=self.backend.version,
                    worker_kind=self.backend.kind,
                )
            await self._stored(taken)
            await self._hand_in(msg, result)
            if result.status == "success":
                self.done += 1
            else:
                self.failures += 1
            self.task_id = None

    async def _taking(self) -> tuple[WorkerStatusEvent, asyncio.Future[Any] | None]:
        """Say this worker took the task in hand (a busy status naming it), without waiting for the stream:
        the receipt is waited for before the answer goes out (`_stored`), long after it came back."""
        event = self._status_event("busy")
        try:
            receipt = await self.js.publish_async(
                event.subject(), event.encode(), headers={"Nats-Msg-Id": event.dedup_id()}
            )
        except Exception:  # the connection is away: `_stored` publishes it the slow way
            receipt = None
        return event, receipt

    async def _stored(self, taken: tuple[WorkerStatusEvent, asyncio.Future[Any] | None]) -> None:
        """The busy status is in the stream before the answer: admission knows who took a task from these
        statuses (admission.py), and a status lost while a cluster elects a new leader would have this
        worker's answer refused for a task another worker took after it."""
        event, receipt = taken
        try:
            if receipt is None:
                raise ConnectionError("not sent")
            if not receipt.done():
                await asyncio.wait_for(receipt, 5.0)
            receipt.result()
        except Exception:  # lost with a reconnect, or timed out: again (the message id keeps it single)
            with contextlib.suppress(Exception):
                await publish_retrying(self.js, event, attempts=10)

    async def _hand_in(self, msg: Any, result: ResultEvent) -> None:
        """Publish the result and acknowledge the task once the stream has stored the result; meanwhile
        this worker already takes its next task (the acknowledgement comes back while it works)."""
        while len(self.settling) >= MAX_SETTLING:
            await asyncio.wait(self.settling, return_when=asyncio.FIRST_COMPLETED)
        try:
            stored = await self.js.publish_async(
                result.subject(), result.encode(), headers={"Nats-Msg-Id": result.dedup_id()}
            )
        except Exception:  # the connection is away: publish the slow way, retrying until the server is back
            stored = None
        settle = asyncio.create_task(self._settle(msg, result, stored))
        self.settling.add(settle)
        settle.add_done_callback(self.settling.discard)

    async def _settle(self, msg: Any, result: ResultEvent, stored: asyncio.Future[Any] | None) -> None:
        try:
            if stored is None:
                raise ConnectionError("not sent")
            await asyncio.wait_for(stored, 5.0)
        except Exception:  # lost with a reconnect, or timed out: again (the message id keeps it single)
            await publish_retrying(self.js, result)
        with contextlib.suppress(Exception):  # a lost ack redelivers the task; its result is a duplicate
            await msg.ack()

    def _result(self, task: TaskEvent, answer: Answer, elapsed: float) -> ResultEvent:
        steps, final = split_reply(answer.reply)
        return ResultEvent(
            task_id=task.task_id,
            worker_id=self.worker_id,
            task_type=task.task_type,
            environment=task.environment,
            prompt=task.prompt,
            status="success",
            result=render_reply(steps, final),
            steps=steps,
            answer=final,
            elapsed_seconds=elapsed,
            model_version=self.backend.version,
            worker_kind=self.backend.kind,
            prompt_token_ids=answer.prompt_token_ids,
            response_token_ids=answer.token_ids,
            token_logprobs=answer.logprobs,
            temperature=answer.temperature,
            phi_mean=answer.phi_mean,
            metadata=answer.metadata,
        )

    async def status(
        self, state: str, *, command_id: int | None = None, detail: str = "", wait: bool = True
    ) -> None:
        """Say what this worker is doing. `wait=False` (idle after a task, heartbeats): sent without waiting
        for the stream's acknowledgement, so it costs the task nothing; a status that answers a command, or
        a swap, waits for it. (Busy with a task: `_taking`.)"""
        event = self._status_event(state, detail=detail, command_id=command_id)
        try:
            if wait or command_id is not None:
                await publish_retrying(self.js, event, attempts=10)
            else:
                await self.nc.publish(event.subject(), event.encode())
        except Exception as exc:  # a status is informative; the work goes on without it
            log.debug("status not published: %s", exc)

    def _status_event(
        self, state: str, *, detail: str = "", command_id: int | None = None
    ) -> WorkerStatusEvent:
        self.state = state if state != "stopped" else self.state
        self.last_status = time.monotonic()
        return WorkerStatusEvent(
            worker_id=self.worker_id,
            kind=self.backend.kind,
            task_types=[self.task_type],
            model=self.backend.model,
            model_version=self.backend.version,
            state=state,
            task_id=self.task_id,
            tasks_done=self.done,
            failures=self.failures,
            host=self.host,
            pid=self.pid,
            detail=detail,
            command_id=command_id,
        )

    # -- controls and model updates --------------------------------------------------------------

    async def _subscribe_controls(self) -> None:
        async def on_control(msg: Any) -> None:
            try:
                event = parse_event(msg.subject, msg.data)
            except EventRejected as exc:
                log.warning("worker %s: rejected control: %s", self.worker_id, exc)
                return
            if not isinstance(event, ControlEvent):
                return
            if event.target not in ("workers", self.worker_id):
                return
            if event.action in ("stop_worker", "shutdown"):
                self.stop_command = event.command_id
                self.stop.set()

        # Core subscriptions: a control matters to the workers up when it is sent (the stream keeps it
        # for the audit); the client renews them itself after a reconnect.
        await self.nc.subscribe("control.workers", cb=on_control)
        await self.nc.subscribe(f"control.workers.{self.worker_id}", cb=on_control)

    async def _subscribe_updates(self) -> None:
        """Serve the newest adapter before the first task (a worker that joins late is not behind),
        then swap in each new one between two tasks."""
        try:
            last = await self.js.get_last_msg(STREAM, "model.updates")
        except nats.js.errors.NotFoundError:
            last = None
        if last is not None and last.data:
            await self._apply_update(str(last.subject), last.data)

        async def on_update(msg: Any) -> None:
            await self._apply_update(msg.subject, msg.data)

        # From the last update on (the one just applied is skipped: its version is already served).
        await self.js.subscribe(
            "model.updates",
            cb=on_update,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )

    async def _apply_update(self, subject: str, data: bytes, attempt: int = 0) -> None:
        try:
            event = parse_event(subject, data)
        except EventRejected as exc:
            log.warning("worker %s: rejected a model update: %s", self.worker_id, exc)
            return
        if not isinstance(event, ModelUpdateEvent):
            return
        if event.target_worker_id not in (None, self.worker_id):
            return
        if event.model_version == self.backend.version:
            return
        if event.model_version == self.tried_version and not attempt:
            return  # the subscription redelivers the update just applied (or being retried)
        if attempt and event.model_version != self.tried_version:
            return  # a newer update came meanwhile
        self.tried_version = event.model_version
        async with self.lock:
            try:
                path = await self._weights_of(event)
                detail = await asyncio.to_thread(self.backend.hot_swap, event, path)
            except Exception as exc:
                detail = f"kept {self.backend.version}: {' '.join(str(exc).split())[:200]}"
                passing = not isinstance(exc, CarlError) or isinstance(exc, SwapNotNow)
                if passing and attempt < len(SWAP_RETRY_S):
                    detail += f" (trying again in {SWAP_RETRY_S[attempt]:g}s)"
                    self._retry(subject, data, attempt)
                log.warning("worker %s: %s", self.worker_id, detail)
            else:
                log.info("worker %s: %s", self.worker_id, detail)
            await self.status(self.state, detail=detail)

    def _retry(self, subject: str, data: bytes, attempt: int) -> None:
        async def later() -> None:
            await asyncio.sleep(SWAP_RETRY_S[attempt])
            await self._apply_update(subject, data, attempt + 1)

        retry = asyncio.create_task(later())
        self.retrying.add(retry)
        retry.add_done_callback(self.retrying.discard)

    async def _weights_of(self, update: ModelUpdateEvent) -> Path:
        """Where the update's weights are on this machine: fetched from the plane's object store when
        the update names an object (the digest checked), else the path it gives (a publisher on this disk)."""
        if update.object_name:
            return await fetch_weights(self.js, update, self.home, self.worker_id)
        return Path(update.checkpoint_path)


async def run_worker(
    address: Address,
    settings: AgentsSettings,
    *,
    kind: str,
    home: Path,
    worker_id: str | None = None,
    command_id: int | None = None,
) -> int:
    """A worker process until it is told to stop (a control, SIGTERM or SIGINT)."""
    worker_id = worker_id or default_worker_id(kind)
    backend = await asyncio.to_thread(make_backend, kind, settings, home, worker_id)
    # The imports and the model live as long as the process: after one full collection they are set aside
    # from the garbage collector, whose full collections otherwise walk them all (100-500 ms each, every
    # few seconds at first, on the tiny model). The collector's thresholds stay: larger young generations
    # slowed the generation (bench/bench_agents.py).
    gc.collect()
    gc.freeze()
    worker = Worker(
        address,
        settings,
        backend,
        worker_id=worker_id,
        home=home,
        command_id=command_id,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop.set)
    await worker.run()
    return 0
