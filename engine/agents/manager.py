"""The manager: assigns tasks, scores each result, publishes the rollout and its own feedback.

Tasks come from the built-in demo task or a JSONL file (engine.agents.tasks). The manager keeps
at most `concurrency` tasks in flight and gives a task up after `task_timeout_s` (it then answers
it itself, `status=failed`, so every task ends with exactly one result). With training on, each
prompt is assigned `group_size` times under one `group_id`: a GRPO group.

Each result is scored three ways, kept apart (docs/reference/agents-plane.md §12 rule 4):
- the PRM step scores, clamped to [0, 1], combined with the environment's profile
  (docs/reference/agents-plane.md §12 rule 3) into the outcome score;
- the task's own verifier, where it has one;
- the manager's feedback (offline, or written by Claude), published on `feedback.scored` and never
  part of the reward.
The rollout on `training.rollouts` carries the reward the trainer optimises (scoring.reward_of).
The alarms watch all three as they arrive. A result for a task this manager did not assign, or from a
worker that did not take it (see admission.py, the audit's same rule), is not scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engine.store.agent_audit import assigned_task
from engine.text import visible

from .alarms import AlarmMonitor
from .bus import (
    STREAM,
    Address,
    connect,
    ensure_stream,
    manager_trainer_subscription,
    publish_retrying,
    trainer_subscription,
)
from .bus import close as bus_close
from .events import (
    ControlEvent,
    EventRejected,
    FeedbackEvent,
    HintEvent,
    ManagerJudgedEvent,
    ManagerStatusEvent,
    ModelUpdateEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
    parse_event,
)
from .feedback import Feedback
from .hints import Hint, HintWriter, make_hint
from .manager_judge import Judged, ManagerJudge
from .manager_model import ModelHints
from .plane_settings import AgentsSettings
from .scoring import CombinedScorer, ScoredResult
from .server import AgentsError
from .tasks import TaskSpec, verify
from .weights import fetch_weights

log = logging.getLogger("carl.agents")
STATUS_EVERY_S = 2.0  # a running manager reports its counts at most this often
SCORING_AT_ONCE = 8  # results scored concurrently (a remote judge is slow, the bus is not)


class FeedbackWriter(Protocol):
    """What writes the manager's feedback (feedback.OfflineFeedback or feedback.ClaudeFeedback)."""

    source: str

    async def feedback(self, task: TaskEvent, result: ResultEvent) -> Feedback: ...


@dataclass
class Pending:
    event: TaskEvent
    deadline: float
    worker_id: str | None = None  # the worker that said it is busy with it (the latest, on redelivery)
    takers: set[str] = field(default_factory=set)  # every worker that said so
    given_up: bool = False  # timed out: the manager answered it itself
    assigned_at: float = field(default_factory=time.monotonic)


@dataclass
class ManagerSummary:
    """What `carl agents run` prints when every task is done."""

    assigned: int = 0
    done: int = 0
    failed: int = 0
    timed_out: int = 0
    unmatched: int = 0  # results for tasks this manager did not assign (or answered twice)
    rewards: list[float] = field(default_factory=list)
    prm: list[float] = field(default_factory=list)
    feedback: list[float] = field(default_factory=list)
    verifier: list[float] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    hints: int = 0
    agreement: list[float] = field(default_factory=list)  # the manager judged (manager_judge.py)
    hint_help: list[float] = field(default_factory=list)
    workers: dict[str, int] = field(default_factory=dict)
    model_versions: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def as_dict(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return round(sum(values) / len(values), 4) if values else None

        return {
            "assigned": self.assigned,
            "done": self.done,
            "failed": self.failed,
            "timed_out": self.timed_out,
            "unmatched": self.unmatched,
            "mean_reward": mean(self.rewards),
            "mean_prm": mean(self.prm),
            "mean_feedback": mean(self.feedback),
            "mean_verifier": mean(self.verifier),
            "hints": self.hints,
            "manager_agreement": mean(self.agreement),
            "hint_help": mean(self.hint_help),
            "alarms": self.alarms,
            "workers": dict(sorted(self.workers.items())),
            "model_versions": self.model_versions,
            "seconds": round((self.finished or time.monotonic()) - self.started, 2),
        }


class TaskFeed:
    """The tasks to assign, in order: once through (or up to `limit`), or round and round."""

    def __init__(self, specs: Sequence[TaskSpec], *, limit: int | None, cycle: bool) -> None:
        if not specs:
            raise ValueError("no tasks to assign")
        self.specs = list(specs)
        self.total = limit if limit is not None else (None if cycle else len(self.specs))
        self.cycle = cycle
        self.index = 0
        self.issued = 0

    def exhausted(self) -> bool:
        if self.total is not None and self.issued >= self.total:
            return True
        return not self.cycle and self.index >= len(self.specs)

    def next_group(self, size: int) -> tuple[TaskSpec, int]:
        """The next prompt and how many times to ask it (its group; smaller at the limit)."""
        spec = self.specs[self.index % len(self.specs)]
        self.index += 1
        if self.total is not None:
            size = min(size, self.total - self.issued)
        self.issued += size
        return spec, size


class Manager:
    def __init__(
        self,
        address: Address,
        settings: AgentsSettings,
        feed: TaskFeed,
        scorer: CombinedScorer,
        feedback: FeedbackWriter,
        *,
        manager_id: str = "manager",
        group_size: int = 1,
        store_path: Path | None = None,
        on_summary: Callable[[ManagerSummary], None] | None = None,
        transient: bool = False,
        hints: HintWriter | None = None,
    ) -> None:
        self.address = address
        self.settings = settings
        self.feed = feed
        self.scorer = scorer
        self.feedback_writer = feedback
        self.manager_id = manager_id
        self.group_size = group_size
        self.store_path = store_path  # where to look up a task a previous manager process assigned
        self.transient = transient
        self.on_summary = on_summary
        self.alarms = AlarmMonitor(settings.alarms, settings.ack_wait_s)
        self.hints = hints  # None: no hints (agents.hints false)
        self.judge = ManagerJudge()
        self.summary = ManagerSummary()
        self.pending: dict[str, Pending] = {}
        self.finished_ids: set[str] = set()
        self.paused = False
        self.stop = asyncio.Event()
        self.done = asyncio.Event()
        self.last_status = 0.0
        self.scoring = asyncio.Semaphore(SCORING_AT_ONCE)
        self.scoring_tasks: set[asyncio.Task[None]] = set()
        self.room = asyncio.Event()  # assignment may go on (a task ended, or it was resumed)
        self.nc: Any = None
        self.js: Any = None

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> ManagerSummary:
        self.nc = await connect(self.address, f"carl-manager-{self.manager_id}", on_event=self._connection)
        self.js = self.nc.jetstream()
        try:
            await ensure_stream(self.js, self.settings.stream, self.settings.replicas)
            results = await self._subscribe_results()
            if self.group_size > 1:  # training: the trainer's consumer exists before the first rollout
                await (await trainer_subscription(self.js)).unsubscribe()
                if self.settings.trains_manager:  # and the manager trainer's, before the first hint
                    await (await manager_trainer_subscription(self.js)).unsubscribe()
            await self.nc.subscribe("control.manager", cb=self._on_control)
            if isinstance(self.hints, ModelHints):
                await self._subscribe_own_model(self.hints)
            await self.nc.subscribe("status.workers.*", cb=self._on_worker_status)
            await self.report("assigning")
            background = [asyncio.create_task(self._assign_loop()), asyncio.create_task(self._watch_loop())]
            stopper = asyncio.create_task(self.stop.wait())
            await asyncio.wait(
                [stopper, asyncio.create_task(self.done.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await results.unsubscribe()
            if self.transient:  # a manager of one `carl agents run` leaves no consumer behind
                with contextlib.suppress(Exception):
                    await self.js.delete_consumer(STREAM, f"manager-{self.manager_id}")
            self.summary.finished = time.monotonic()
            await self.report("done" if self.done.is_set() else "stopped", force=True)
        finally:
            with contextlib.suppress(Exception):
                await bus_close(self.nc)
        return self.summary

    def _connection(self, what: str) -> None:
        log.info("manager %s: %s", self.manager_id, what)

    async def _assign_loop(self) -> None:
        interval = self.group_size / self.settings.rate if self.settings.rate else 0.0
        while not self.feed.exhausted():
            while self.paused or len(self.pending) + self.group_size > max(
                self.settings.concurrency, self.group_size
            ):
                self.room.clear()
                await self.room.wait()  # set when a task ends or assignment resumes
            spec, size = self.feed.next_group(self.group_size)
            group_id = str(uuid.uuid4()) if size > 1 or self.group_size > 1 else None
            for _ in range(size):
                event = TaskEvent(
                    manager_id=self.manager_id,
                    task_type=spec.task_type,
                    environment=spec.environment,
                    prompt=spec.prompt,
                    reference=spec.reference,
                    verifier=spec.verifier,
                    group_id=group_id,
                    group_size=size,
                    metadata=dict(spec.metadata),
                )
                self.pending[event.task_id] = Pending(event, time.monotonic() + self.settings.task_timeout_s)
                await publish_retrying(self.js, event)
                self.summary.assigned += 1
            await self.report("paused" if self.paused else "assigning")
            if interval:
                await asyncio.sleep(interval)

    async def _subscribe_results(self) -> Any:
        """Results are pushed to the manager (a durable consumer, so none is missed while it restarts):
        no request per result, as a pull would cost. Each is scored in a task of its own, at most
        SCORING_AT_ONCE at a time; the callback waits for room, which holds further deliveries back."""
        durable = f"manager-{self.manager_id}"
        try:
            info = await self.js.consumer_info(STREAM, durable)
            if not info.config.deliver_subject:  # a pull consumer of an older manager: made anew
                await self.js.delete_consumer(STREAM, durable)
        except nats.js.errors.NotFoundError:
            pass
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=60,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=1000,
            flow_control=True,
            idle_heartbeat=5,
        )

        async def on_result(msg: Any) -> None:
            await self.scoring.acquire()
            task = asyncio.create_task(self._handle_result(msg))
            self.scoring_tasks.add(task)
            task.add_done_callback(self.scoring_tasks.discard)

        try:
            return await self.js.subscribe(
                "results.>", durable=durable, stream=STREAM, cb=on_result, manual_ack=True, config=config
            )
        except nats.js.errors.Error as exc:
            if "already bound" in str(exc):
                raise AgentsError(
                    f"a manager named {self.manager_id!r} is already running on this plane"
                ) from None
            raise

    async def _watch_loop(self) -> None:
        """Give up tasks past their timeout, raise stuck-worker alarms, and notice when all is done."""
        while True:
            now = time.monotonic()
            for pending in list(self.pending.values()):
                if now >= pending.deadline:
                    pending.deadline = float("inf")  # answered once: by the result published below
                    pending.given_up = True
                    await self._give_up(pending)
            for alarm in self.alarms.check_stuck(time.time()):
                await self._alarm(alarm)
            if self.feed.exhausted() and not self.pending:
                self.done.set()
                return
            if time.monotonic() - self.last_status > STATUS_EVERY_S:
                await self.report("paused" if self.paused else "assigning")
            await asyncio.sleep(0.1)

    async def _give_up(self, pending: Pending) -> None:
        task = pending.event
        reason = f"timed out after {self.settings.task_timeout_s:g}s without a result"
        result = ResultEvent(
            task_id=task.task_id,
            worker_id=pending.worker_id or "unassigned",
            task_type=task.task_type,
            environment=task.environment,
            prompt=task.prompt,
            status="failed",
            result=reason,
            error=reason,
            worker_kind="manager",
        )
        self.summary.timed_out += 1
        await publish_retrying(self.js, result)  # a late answer from the worker is then a duplicate

    # -- one result --------------------------------------------------------------------------------

    async def _handle_result(self, msg: Any) -> None:
        try:
            await self._score(msg)
        except Exception:
            log.exception("manager: scoring a result on %s failed", msg.subject)
        finally:
            self.scoring.release()
            with contextlib.suppress(Exception):
                await msg.ack()

    async def _score(self, msg: Any) -> None:
        try:
            result = parse_event(msg.subject, msg.data)
        except EventRejected as exc:
            log.warning("manager: rejected a message on %s: %s", msg.subject, exc)
            return
        if not isinstance(result, ResultEvent):
            return
        pending = self.pending.get(result.task_id)
        if pending is not None and not self._from_taker(pending, result):
            self.summary.unmatched += 1  # the audit stores it as rejected, with the same reason
            log.warning(
                "manager: a result for task %s from worker %s, which did not take it; ignored",
                result.task_id,
                visible(result.worker_id),
            )
            return
        task = pending.event if pending is not None else None
        if task is None:
            if result.task_id in self.finished_ids:
                self.summary.unmatched += 1  # a second answer to a task already scored: the first stands
                return
            task = self._lookup(result.task_id)
            if task is None:
                self.summary.unmatched += 1
                return
        verifier_score = (
            verify(task, result.answer) if result.status == "success" else (0.0 if task.verifier else None)
        )
        scored = await self.scorer.score(task, result, verifier_score)
        feedback = await self.feedback_writer.feedback(task, result)
        hint = None
        if self.hints is not None:
            hint = await make_hint(self.hints, task, result, scored.verifier_score, feedback)
        if result.task_id in self.finished_ids:  # scored twice at once (a redelivery): publish once
            return
        self.finished_ids.add(result.task_id)
        await publish_retrying(self.js, self._rollout(task, result, scored, hint))
        await publish_retrying(
            self.js,
            FeedbackEvent(
                task_id=task.task_id,
                manager_id=self.manager_id,
                worker_id=result.worker_id,
                score=feedback.score,
                textual_feedback=feedback.text,
                source=feedback.source,
                dimensions=feedback.dimensions,
            ),
        )
        if hint is not None:
            await publish_retrying(self.js, self._hint_event(task, result, hint))
        judged = self._judged(task, result, scored, feedback, hint, pending)
        self.alarms.finished(result.task_id)
        alarms = [
            *self.alarms.scored(
                task.task_id, result.worker_id, scored.prm_score, scored.verifier_score, scored.outcome_score
            ),
            *self.alarms.feedback(task.task_id, result.worker_id, feedback.score),
        ]
        for judgement in judged:
            await publish_retrying(self.js, self._judged_event(judgement))
            if judgement.kind == "hint_help":
                alarms += self.alarms.hint_help(judgement.worker_id, judgement.value)
                if isinstance(self.hints, ModelHints) and self.settings.trains_manager:
                    rollout = self.hints.rollout(judgement)
                    if rollout is not None:  # its own model wrote that hint: it learns from its help
                        await publish_retrying(self.js, rollout)
        for alarm in alarms:
            await self._alarm(alarm)
        self._count(result, scored, feedback)
        self.pending.pop(result.task_id, None)
        self.room.set()

    @staticmethod
    def _from_taker(pending: Pending, result: ResultEvent) -> bool:
        """Whether a result comes from a worker that took the task (any, when none said so yet), or is
        the manager's own answer to a task it gave up on (see admission.py for the audit's rules)."""
        if result.worker_kind == "manager":
            return pending.given_up and result.status == "failed"
        return not pending.takers or result.worker_id in pending.takers

    def _judged(
        self,
        task: TaskEvent,
        result: ResultEvent,
        scored: ScoredResult,
        feedback: Feedback,
        hint: Hint | None,
        pending: Pending | None,
    ) -> list[Judged]:
        """The manager judged by this result: its feedback against the verifier, and the hints at similar
        tasks given before this task was assigned, by this attempt's score."""
        summary = self.summary
        if hint is not None:
            summary.hints += 1
        judged = []
        agreement = self.judge.agreement(
            task.task_id, result.worker_id, feedback.score, scored.verifier_score
        )
        if agreement is not None:
            judged.append(agreement)
            summary.agreement.append(agreement.value)
        assigned_at = pending.assigned_at if pending is not None else 0.0  # a previous process's: older
        helps = self.judge.attempt(
            task,
            result.worker_id,
            scored.verifier_score,
            assigned_at,
            time.monotonic() if hint is not None else None,
        )
        summary.hint_help.extend(j.value for j in helps)
        return [*judged, *helps]

    def _hint_event(self, task: TaskEvent, result: ResultEvent, hint: Hint) -> HintEvent:
        return HintEvent(
            task_id=task.task_id,
            manager_id=self.manager_id,
            worker_id=result.worker_id,
            group_id=task.group_id,
            hint=hint.text,
            source=hint.source,
            signal=hint.signal,
            manager_version=hint.manager_version,
        )

    def _judged_event(self, judged: Judged) -> ManagerJudgedEvent:
        return ManagerJudgedEvent(
            task_id=judged.task_id,
            manager_id=self.manager_id,
            worker_id=judged.worker_id,
            kind=judged.kind,
            value=judged.value,
            next_task_id=judged.next_task_id,
        )

    def _rollout(
        self, task: TaskEvent, result: ResultEvent, scored: ScoredResult, hint: Hint | None = None
    ) -> TrainingRolloutEvent:
        return TrainingRolloutEvent(
            task_id=task.task_id,
            worker_id=result.worker_id,
            task_type=task.task_type,
            environment=result.environment,
            group_id=task.group_id,
            group_size=task.group_size,
            prompt=task.prompt,
            response=result.answer if result.status == "success" else result.result,
            steps=result.steps,
            step_scores=scored.step_scores,
            prm_score=scored.prm_score,
            outcome_score=scored.outcome_score,
            profile=scored.profile,
            dimensions=scored.dimensions,
            verifier_score=scored.verifier_score,
            reward=scored.reward,
            model_version=result.model_version,
            prompt_token_ids=result.prompt_token_ids,
            response_token_ids=result.response_token_ids,
            token_logprobs=result.token_logprobs,
            temperature=result.temperature,
            hint=hint.text if hint is not None else "",
        )

    def _count(self, result: ResultEvent, scored: ScoredResult, feedback: Feedback) -> None:
        summary = self.summary
        if result.status == "success":
            summary.done += 1
        else:
            summary.failed += 1
        summary.rewards.append(scored.reward)
        summary.prm.append(scored.prm_score)
        summary.feedback.append(feedback.score)
        if scored.verifier_score is not None:
            summary.verifier.append(scored.verifier_score)
        summary.workers[result.worker_id] = summary.workers.get(result.worker_id, 0) + 1
        version = result.model_version or "?"
        summary.model_versions[version] = summary.model_versions.get(version, 0) + 1

    def _lookup(self, task_id: str) -> TaskEvent | None:
        """A task an earlier process of this manager assigned, as the audit stored it (None: unknown)."""
        if self.store_path is None or not self.store_path.exists():
            return None
        try:  # another manager's results are its own to score
            row = assigned_task(self.store_path, task_id, self.manager_id)
        except sqlite3.Error:
            return None
        if row is None:
            return None
        return TaskEvent(
            task_id=task_id,
            task_type=row[0],
            environment=row[1],
            prompt=row[2],
            reference=row[3],
            verifier=row[4],
            group_id=row[5],
            manager_id=row[6],
        )

    async def _alarm(self, alarm: Any) -> None:
        self.summary.alarms.append(f"{alarm.kind}: {alarm.reason}")
        log.warning("alarm %s: %s", alarm.kind, alarm.reason)
        await publish_retrying(self.js, alarm)

    async def _subscribe_own_model(self, hints: ModelHints) -> None:
        """The manager trainer's adapters (`model.manager`): the newest before the first hint, then each new
        one as it comes, swapped in between two hints. A swap that fails keeps the model served and says
        why."""

        async def apply(subject: str, data: bytes) -> None:
            try:
                update = parse_event(subject, data)
            except EventRejected as exc:
                log.warning("manager: rejected a model update: %s", exc)
                return
            if not isinstance(update, ModelUpdateEvent) or update.model_version == hints.version:
                return
            try:
                path = (
                    await fetch_weights(self.js, update, hints.home, f"manager-{self.manager_id}")
                    if update.object_name
                    else Path(update.checkpoint_path)
                )
                log.info("manager: %s", await hints.swap(update, path))
            except Exception as exc:
                log.warning("manager: kept its model: %s", " ".join(str(exc).split())[:200])

        with contextlib.suppress(nats.js.errors.NotFoundError):
            last = await self.js.get_last_msg(STREAM, "model.manager")
            if last is not None and last.data:
                await apply(str(last.subject), last.data)

        async def on_update(msg: Any) -> None:
            await apply(msg.subject, msg.data)

        await self.js.subscribe(
            "model.manager",
            cb=on_update,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )

    # -- what arrives on core subjects -------------------------------------------------------------

    async def _on_worker_status(self, msg: Any) -> None:
        try:
            event = parse_event(msg.subject, msg.data)
        except EventRejected:
            return  # the audit stores it as rejected; nothing for the manager to do
        if not isinstance(event, WorkerStatusEvent):
            return
        if event.state == "busy" and event.task_id:
            pending = self.pending.get(event.task_id)
            if pending is not None:
                pending.worker_id = event.worker_id
                pending.takers.add(event.worker_id)
                self.alarms.started(event.task_id, event.worker_id, time.time())

    async def _on_control(self, msg: Any) -> None:
        try:
            event = parse_event(msg.subject, msg.data)
        except EventRejected as exc:
            log.warning("manager: rejected a control: %s", exc)
            return
        if not isinstance(event, ControlEvent) or event.target != "manager":
            return
        if event.action == "pause_assignment":
            self.paused = True
            await self.report(
                "paused", command_id=event.command_id, detail="no new tasks until resumed", force=True
            )
        elif event.action == "resume_assignment":
            self.paused = False
            self.room.set()
            await self.report("assigning", command_id=event.command_id, detail="assigning again", force=True)
        elif event.action == "shutdown":
            self.stop.set()
            await self.report("stopped", command_id=event.command_id, detail="stopped on request", force=True)

    async def report(
        self, state: str, *, command_id: int | None = None, detail: str = "", force: bool = False
    ) -> None:
        """The manager's counts on `status.manager` (throttled unless forced)."""
        if not force and command_id is None and time.monotonic() - self.last_status < STATUS_EVERY_S:
            return
        self.last_status = time.monotonic()
        summary = self.summary
        event = ManagerStatusEvent(
            manager_id=self.manager_id,
            state=state,
            total=self.feed.total,
            assigned=summary.assigned,
            in_flight=len(self.pending),
            done=summary.done,
            failed=summary.failed,
            timed_out=summary.timed_out,
            feedback=self.feedback_writer.source,
            detail=detail,
            command_id=command_id,
        )
        try:
            await publish_retrying(self.js, event, attempts=10 if state not in ("done", "stopped") else 3)
        except Exception as exc:
            log.debug("manager status not published: %s", exc)
        if self.on_summary is not None:
            self.on_summary(summary)


def summary_line(summary: dict[str, Any]) -> str:
    """`carl agents run`'s last line."""
    parts = [f"{summary['done']} done", f"{summary['failed']} failed"]
    if summary["timed_out"]:
        parts.append(f"{summary['timed_out']} timed out")
    for key, label in (
        ("mean_reward", "reward"),
        ("mean_prm", "PRM"),
        ("mean_verifier", "verifier"),
        ("mean_feedback", "feedback"),
    ):
        if summary.get(key) is not None:
            parts.append(f"{label} {summary[key]:.3f}")
    if summary.get("hints"):
        parts.append(f"{summary['hints']} hints")
    if summary.get("manager_agreement") is not None:
        parts.append(f"manager agrees with the verifier {summary['manager_agreement']:.2f}")
    if summary.get("hint_help") is not None:
        parts.append(f"hints help {summary['hint_help']:+.2f}")
    workers = ", ".join(f"{w} {n}" for w, n in summary["workers"].items())
    return (
        f"{summary['assigned']} tasks in {summary['seconds']:.1f}s: "
        + ", ".join(parts)
        + (f"; by worker: {workers}" if workers else "")
        + (f"; {len(summary['alarms'])} alarms" if summary["alarms"] else "")
    )


def dump(summary: ManagerSummary) -> str:
    return json.dumps(summary.as_dict())
