"""Which results, rollouts and feedback the audit takes: only those about tasks that were assigned,
from the workers that took them.

Anyone with the plane's token can publish. A result, rollout or feedback names a task id; without
this check a token holder could answer tasks nobody assigned, or answer someone else's. The rules,
checked against the store and the batch before it (in stream order):
- a result needs a task event for its id; when workers said they took the task (a busy status naming
  it: a redelivered task may have several), it must come from one of them. The manager's own answer
  to a task it gave up on (`worker_kind` "manager", status failed) is taken from it. A second
  result for an answered task from the worker that answered it is a harmless repeat (the first
  stands); from another worker it is refused.
- a rollout, feedback, hint or judgement of the manager needs the task's result, and must name the worker
  whose result stands; feedback, hints and judgements must also come from the manager that assigned the task.
A refused event is stored as rejected with its reason (see audit.py), never applied to the summaries.
Without credentials per worker this checks what events say of each other, not who sent them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .events import (
    FeedbackEvent,
    HintEvent,
    ManagerJudgedEvent,
    PlaneEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
)

if TYPE_CHECKING:
    from engine.store.agent_audit import AgentAudit

CLAIMS = (ResultEvent, TrainingRolloutEvent, FeedbackEvent, HintEvent, ManagerJudgedEvent)
BY_THE_MANAGER = (FeedbackEvent, HintEvent, ManagerJudgedEvent)  # what only the task's manager may say of it


@dataclass
class Task:
    """What the audit knows of one task while it checks a batch."""

    manager_id: str | None
    takers: set[str] = field(default_factory=set)  # workers that said they are busy with it
    answered_by: str | None = None  # the worker whose result stands


def refusals(tables: AgentAudit, events: Sequence[PlaneEvent | None]) -> dict[int, str]:
    """Index in `events` -> why that result, rollout or feedback is refused (None entries are skipped)."""
    if not any(isinstance(e, CLAIMS) for e in events):
        return {}
    tasks = _known(
        tables,
        {e.task_id for e in events if isinstance(e, CLAIMS)},
        {e.task_id for e in events if isinstance(e, ResultEvent)},
    )
    refused: dict[int, str] = {}
    for index, event in enumerate(events):
        if isinstance(event, TaskEvent):
            tasks.setdefault(event.task_id, Task(event.manager_id))
        elif isinstance(event, WorkerStatusEvent):
            task = tasks.get(event.task_id) if event.state == "busy" and event.task_id else None
            if task is not None and task.answered_by is None:
                task.takers.add(event.worker_id)
        elif isinstance(event, CLAIMS):
            why = _check(event, tasks.get(event.task_id))
            if why is not None:
                refused[index] = why
    return refused


def _check(event: PlaneEvent, task: Task | None) -> str | None:
    task_id = event.task_id  # type: ignore[attr-defined]
    if task is None:
        return f"task {task_id} was never assigned"
    worker = event.worker_id  # type: ignore[attr-defined]
    if isinstance(event, ResultEvent):
        if task.answered_by is not None:
            if worker == task.answered_by:
                return None  # a repeat: stored, and the first result stands
            return f"task {task_id} was answered by worker {task.answered_by}, not {worker}"
        given_up = event.worker_kind == "manager" and event.status == "failed"
        if task.takers and worker not in task.takers and not given_up:
            return f"task {task_id} was taken by worker {', '.join(sorted(task.takers))}, not {worker}"
        task.answered_by = worker
        return None
    if task.answered_by is None:
        return f"task {task_id} has no result yet"
    if worker != task.answered_by:
        return f"task {task_id} was answered by worker {task.answered_by}, not {worker}"
    if isinstance(event, BY_THE_MANAGER) and task.manager_id not in (None, event.manager_id):
        return f"task {task_id} belongs to manager {task.manager_id}, not {event.manager_id}"
    return None


def _known(tables: AgentAudit, task_ids: set[str], answered: set[str]) -> dict[str, Task]:
    """The stored tasks among `task_ids`, with who answered them; for those in `answered` (the batch
    holds results for them) not answered yet, also the workers that took them."""
    tasks: dict[str, Task] = {}
    for task_id, manager_id, worker_id, status in tables.tasks_among(task_ids):
        tasks[task_id] = Task(manager_id, answered_by=worker_id if status is not None else None)
    open_ids = {task_id for task_id in answered if task_id in tasks and tasks[task_id].answered_by is None}
    for task_id, worker_id in tables.takers(open_ids):
        if worker_id:
            tasks[task_id].takers.add(worker_id)
    return tasks
