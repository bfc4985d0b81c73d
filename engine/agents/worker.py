"""A worker: takes tasks of one type from the plane, answers them with a model, publishes results.

Two kinds, both real:
- `model`: a transformers model on this machine (the built-in tiny model by default). It samples at
  the configured temperature and reports, per generated token, the behaviour policy's log-prob, so
  the trainer's importance ratio is exact; it hot-swaps each new LoRA adapter, or the full weights
  of a run it serves, without restarting.
- `http`: any OpenAI-compatible server (vLLM, llama.cpp's server, Ollama) over httpx. It asks for
  each token's log-prob and id (`logprobs`, and vLLM's `return_tokens_as_token_ids` and
  `return_token_ids`), so a server that gives them feeds training like a model worker; with
  `endpoint_lora` it loads each new adapter through vLLM's runtime LoRA API and then requests it.

New weights come on `model.updates`; the worker fetches them from the plane's object store by name
and digest into its own `$CARL_HOME` (weights.py), so it needs no filesystem shared with the trainer.

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
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import nats
from nats.js.api import DeliverPolicy

from engine.errors import CarlError

from .bus import STREAM, Address, connect, ensure_stream, fetch, publish_retrying, pull
from .bus import close as bus_close
from .config import AgentsSettings
from .events import (
    ControlEvent,
    EventRejected,
    ModelUpdateEvent,
    ResultEvent,
    TaskEvent,
    WorkerStatusEvent,
    parse_event,
)
from .scoring import render_reply, split_reply
from .weights import fetch_weights

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("carl.agents")

SYSTEM_PROMPT = (
    "Solve the task step by step. Write each step inside <step>...</step>, "
    "then the final answer inside <answer>...</answer>."
)
HEARTBEAT_S = 10.0  # an idle worker says it is alive this often
FETCH_WAIT_S = 5.0  # how long one wait for a task lasts
MAX_DELIVER = 5  # a task that made this many workers fail or vanish is not handed out again
MAX_SETTLING = 4  # results waiting for the stream's acknowledgement before the worker waits too
JOIN_WAIT_S = 60.0  # a worker that starts while a cluster elects its leaders waits this long for them
# A model on this machine that answered in less than this answers the next task on the event loop's own
# thread: handed to a thread, its Python competes for the GIL with the loop's (2-3 ms a task on the tiny
# model, bench/bench_agents.py). A slower answer goes to a thread, so controls and heartbeats never wait
# for it longer than this.
INLINE_ANSWER_S = 0.25


@dataclass
class Answer:
    """What a backend made of one task."""

    reply: str  # the model's raw text
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    temperature: float | None = None
    phi_mean: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    kind: str
    model: str
    version: str
    compute_bound: bool  # its answer is computed in this process (a local model), not awaited from a server

    def answer(self, task: TaskEvent) -> Answer: ...

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        """Serve the update's weights (unpacked at `path` on this machine) from now on; returns what
        was done, in one line."""
        ...

    def close(self) -> None: ...


class WorkerError(CarlError):
    """A worker cannot start (its model or endpoint is unusable); one line."""


def system_prompt(settings: AgentsSettings) -> str | None:
    """The instruction sent with every task: the settings' (an empty one: none at all), else the default.
    A model trained without one (the demo run) is served the way it was trained."""
    if settings.system_prompt is None:
        return SYSTEM_PROMPT
    return settings.system_prompt or None


# -- backends ----------------------------------------------------------------------------------


class ModelBackend:
    """A transformers model on this machine (engine.agents.policy)."""

    kind = "model"
    compute_bound = True

    def __init__(self, settings: AgentsSettings, home: Path, *, seed: int = 0) -> None:
        from .policy import LocalPolicy

        self.settings = settings
        self.model = settings.model
        self.policy = LocalPolicy.load(settings.model, home, seed=seed)

    @property
    def version(self) -> str:
        return str(self.policy.version)

    def answer(self, task: TaskEvent) -> Answer:
        generation = self.policy.generate(
            task.prompt,
            system=system_prompt(self.settings),
            max_new_tokens=self.settings.max_new_tokens,
            temperature=self.settings.temperature,
            seed=None,
        )
        return Answer(
            reply=generation.text,
            prompt_token_ids=list(generation.prompt_token_ids),
            token_ids=list(generation.token_ids),
            logprobs=[float(x) for x in generation.logprobs],
            temperature=self.settings.temperature,
            phi_mean=_unit(generation.phi_mean),
        )

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        fingerprint = update.base_fingerprint or None
        if update.weights == "full":
            self.policy.swap_full_weights(path, update.model_version, fingerprint)
            return f"serving {update.model_version} (every weight)"
        self.policy.swap_adapter(path, update.model_version, fingerprint)
        return f"serving adapter {update.model_version}"

    def close(self) -> None:
        pass


# What an http worker asks for so that its answers can train: every generated token's log-prob, and
# the ids of the prompt's and the answer's tokens (vLLM: `return_token_ids` puts them beside the text,
# and `return_tokens_as_token_ids` writes each log-prob entry's token as `token_id:<id>`).
BEHAVIOUR_FIELDS: dict[str, Any] = {
    "logprobs": True,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
}
TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class HttpBackend:
    """An OpenAI-compatible chat completions endpoint (vLLM, llama.cpp server, Ollama)."""

    compute_bound = False

    kind = "http"

    def __init__(self, settings: AgentsSettings, *, timeout: float | None = None) -> None:
        import httpx

        if not settings.endpoint:
            raise WorkerError("an http worker needs an endpoint (--endpoint or agents.endpoint)")
        self.settings = settings
        self.endpoint = settings.endpoint.rstrip("/")
        self.model = settings.endpoint_model or settings.model
        self.version = self.model
        key = os.environ.get("CARL_WORKER_API_KEY") or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(
            base_url=self.endpoint, headers=headers, timeout=timeout or settings.task_timeout_s
        )
        self.asking = dict(BEHAVIOUR_FIELDS)  # what the server has not refused yet

    def answer(self, task: TaskEvent) -> Answer:
        return self._complete(task.prompt, self.settings.max_new_tokens)

    def _complete(self, prompt: str, max_tokens: int) -> Answer:
        system = system_prompt(self.settings)
        body: dict[str, Any] = {
            "model": self.version,
            "messages": ([{"role": "system", "content": system}] if system else [])
            + [{"role": "user", "content": prompt}],
            "temperature": self.settings.temperature,
            "max_tokens": max_tokens,
        }
        response = self.client.post("/chat/completions", json={**body, **self.asking})
        while response.status_code == 400 and self._refused_field(response.text):
            response = self.client.post("/chat/completions", json={**body, **self.asking})
        if response.status_code != 200:
            raise WorkerError(f"{self.endpoint}: HTTP {response.status_code}: {_snippet(response.text)}")
        try:
            completion = response.json()
            choice = completion["choices"][0]
            reply = choice["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise WorkerError(f"{self.endpoint}: not a chat completion: {_snippet(response.text)}") from None
        prompt_ids, token_ids, logprobs = behaviour_of(completion, choice)
        return Answer(
            reply=reply,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            temperature=self.settings.temperature,
            metadata={"finish_reason": choice.get("finish_reason")},
        )

    def _refused_field(self, text: str) -> bool:
        """A 400 that names a field we asked for (a server without it): ask without it from now on."""
        lowered = text.lower()
        for field_name in [f for f in self.asking if f != "logprobs"] + ["logprobs"]:
            if field_name in self.asking and field_name.removesuffix("s") in lowered:
                del self.asking[field_name]
                return True
        return False

    def training_support(self) -> str | None:
        """Why this endpoint's answers cannot train the served model (None: they can): one short
        completion, asking as every task asks, must come back with each token's log-prob and the ids."""
        answer = self._complete("Say OK.", 4)
        missing = [
            what
            for what, given in (
                ("per-token log-probs", answer.logprobs),
                ("token ids", answer.token_ids),
                ("prompt token ids", answer.prompt_token_ids),
            )
            if not given
        ]
        if not answer.token_ids and not answer.logprobs:
            return "gives neither per-token log-probs nor token ids"
        if missing:
            return f"gives no {' and no '.join(missing)}"
        if len(answer.token_ids) != len(answer.logprobs):
            return f"gives {len(answer.token_ids)} token ids for {len(answer.logprobs)} log-probs"
        return None

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        keeps = f"keeps serving {self.version}"
        if not self.settings.endpoint_lora:
            return f"{keeps}: {self.endpoint} loads no adapters (agents.endpoint_lora is off)"
        if update.weights != "adapter":
            return f"{keeps}: {update.model_version} is every weight, not an adapter to load"
        # The server beside this worker reads the adapter from this machine's disk: where it was unpacked.
        response = self.client.post(
            "/load_lora_adapter",
            json={"lora_name": update.model_version, "lora_path": str(path)},
        )
        refused = lora_load_refused(response)
        if refused is not None:
            raise WorkerError(f"{self.endpoint}: loading adapter {update.model_version} failed: {refused}")
        self.version = update.model_version  # the name the server loaded is the name requested
        return f"serving adapter {update.model_version} from {self.endpoint}"

    def close(self) -> None:
        self.client.close()


def lora_load_refused(response: httpx.Response) -> str | None:
    """Why vLLM's `POST /v1/load_lora_adapter` did not load the adapter (None: it is loaded).

    A name already loaded is loaded (a redelivered update asks twice). vLLM started without
    VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such route: FastAPI's bare 404, not vLLM's error object.
    """
    if response.status_code == 200:
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    if response.status_code == 400 and "already been loaded" in str(message):
        return None
    if response.status_code in (404, 405) and not (isinstance(body, dict) and body.get("object") == "error"):
        return (
            "the server has no runtime LoRA loading (vLLM: start it with --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        )
    return f"HTTP {response.status_code}: {_snippet(str(message) if message else response.text)}"


def behaviour_of(
    completion: dict[str, Any], choice: dict[str, Any]
) -> tuple[list[int], list[int], list[float]]:
    """(prompt token ids, answer token ids, answer log-probs) of a chat completion, each [] when the
    server did not give it (or gave it malformed): vLLM's `prompt_token_ids` beside the choices and
    `token_ids` in the choice, else the ids spelled `token_id:<id>` in the log-prob entries."""
    content = (choice.get("logprobs") or {}).get("content") or []
    entries = [t for t in content if isinstance(t, dict)]
    logprobs = [float(t["logprob"]) for t in entries if isinstance(t.get("logprob"), int | float)]
    if len(logprobs) != len(content):
        logprobs = []
    token_ids = _ids(choice.get("token_ids"))
    if not token_ids and entries:
        spelled = [TOKEN_ID.match(str(t.get("token", ""))) for t in entries]
        token_ids = [int(m.group(1)) for m in spelled if m] if all(spelled) else []
    if logprobs and token_ids and len(token_ids) != len(logprobs):
        token_ids = []  # ids that do not line up with the log-probs would train the wrong tokens
    prompt_ids = _ids(completion.get("prompt_token_ids")) or _ids(choice.get("prompt_token_ids"))
    return prompt_ids, token_ids, logprobs


def _ids(value: Any) -> list[int]:
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        return list(value)
    return []


def check_trainable_endpoint(settings: AgentsSettings) -> None:
    """`--train` with http workers: their server must give what the trainer needs, or the plane does not
    start (today's alternative: every rollout refused, one by one). Raises WorkerError, one line."""
    if not (settings.train.enabled and settings.worker_kind == "http" and settings.workers > 0):
        return
    backend = HttpBackend(settings, timeout=min(settings.task_timeout_s, 60.0))
    try:
        reason = backend.training_support()
    except Exception as exc:
        reason = f"did not answer a probe ({' '.join(str(exc).split())[:200]})"
    finally:
        backend.close()
    if reason is not None:
        raise WorkerError(
            f"--train: http workers cannot feed training: {settings.endpoint} {reason} "
            "(vLLM gives them with logprobs, return_tokens_as_token_ids and return_token_ids)"
        )


def _snippet(text: str) -> str:
    return " ".join(text.split())[:160]


def _unit(value: float | None) -> float | None:
    if value is None or value != value:
        return None
    return min(1.0, max(0.0, float(value)))


def make_backend(kind: str, settings: AgentsSettings, home: Path) -> Backend:
    if kind == "model":
        return ModelBackend(settings, home)
    if kind == "http":
        return HttpBackend(settings)
    raise WorkerError(f"--kind {kind!r}: expected model or http")


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
        self.last_answer_s: float | None = None  # how long the latest answer took (INLINE_ANSWER_S)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.lock = asyncio.Lock()  # a hot-swap waits for the task in hand
        self.js: Any = None
        self.nc: Any = None
        self.settling: set[asyncio.Task[None]] = set()  # results handed in, waiting for the stream's ack

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
        while msgs and not taken.is_set():
            try:
                await asyncio.wait_for(taken.wait(), self.settings.ack_wait_s / 3)
            except TimeoutError:
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.in_progress()
        return msgs

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
            await self.status("busy", wait=False)
            started = time.monotonic()
            try:
                answer = await self._answer(task)
                self.last_answer_s = time.monotonic() - started
                result = self._result(task, answer, self.last_answer_s)
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
            await self._hand_in(msg, result)
            if result.status == "success":
                self.done += 1
            else:
                self.failures += 1
            self.task_id = None

    async def _answer(self, task: TaskEvent) -> Answer:
        """The backend's answer: on this thread when it is a local model that answers fast
        (INLINE_ANSWER_S), once what the loop has to send is sent; otherwise on a thread."""
        quick = self.last_answer_s is not None and self.last_answer_s < INLINE_ANSWER_S
        if not (self.backend.compute_bound and quick):
            return await asyncio.to_thread(self.backend.answer, task)
        await self._sent()
        return self.backend.answer(task)

    async def _sent(self, turns: int = 10) -> None:
        """Let the loop run until the pull request for the next task (asked for when this one was taken)
        and everything else queued (statuses, acknowledgements) is written to the server, so that the next
        task is on its way while the loop is blocked. A few turns of the loop; bounded, since a fetch
        served from messages already here sends nothing."""
        sent = self.nc.stats["out_msgs"]
        for _ in range(turns):
            await asyncio.sleep(0)
            if self.nc.stats["out_msgs"] > sent and not self.nc.pending_data_size:
                return

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
        """Say what this worker is doing. `wait=False` (busy and idle around each task, heartbeats): sent
        without waiting for the stream's acknowledgement, so it costs the task nothing; a status that
        answers a command, or a swap, waits for it."""
        self.state = state if state != "stopped" else self.state
        event = WorkerStatusEvent(
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
        self.last_status = time.monotonic()
        try:
            if wait or command_id is not None:
                await publish_retrying(self.js, event, attempts=10)
            else:
                await self.nc.publish(event.subject(), event.encode())
        except Exception as exc:  # a status is informative; the work goes on without it
            log.debug("status not published: %s", exc)

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

    async def _apply_update(self, subject: str, data: bytes) -> None:
        try:
            event = parse_event(subject, data)
        except EventRejected as exc:
            log.warning("worker %s: rejected a model update: %s", self.worker_id, exc)
            return
        if not isinstance(event, ModelUpdateEvent):
            return
        if event.target_worker_id not in (None, self.worker_id) or event.model_version in (
            self.backend.version,
            self.tried_version,
        ):
            return
        self.tried_version = event.model_version  # the subscription redelivers the update just applied
        async with self.lock:
            try:
                path = await self._weights_of(event)
                detail = await asyncio.to_thread(self.backend.hot_swap, event, path)
            except Exception as exc:
                detail = f"kept {self.backend.version}: {' '.join(str(exc).split())[:200]}"
                log.warning("worker %s: %s", self.worker_id, detail)
            else:
                log.info("worker %s: %s", self.worker_id, detail)
            await self.status(self.state, detail=detail)

    async def _weights_of(self, update: ModelUpdateEvent) -> Path:
        """Where the update's weights are on this machine: fetched from the plane's object store when
        the update names an object (the digest checked), else the path it gives (a publisher on this disk)."""
        if update.object_name:
            return await fetch_weights(self.js, update, self.home)
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
    backend = await asyncio.to_thread(make_backend, kind, settings, home)
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
        worker_id=worker_id or default_worker_id(kind),
        home=home,
        command_id=command_id,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop.set)
    await worker.run()
    return 0
