"""The manager judged against what happened: bookkeeping, no NATS (the manager publishes what it returns).

Two judgements, each a `ManagerJudgedEvent` the audit stores as a series (docs/guide/agents.md):
- agreement: for a result the task's verifier scored, 1 − |the manager's feedback score − the verifier's|;
- hint help: for a hinted result, the verifier's score of the next attempt at a similar task that was assigned
  after the hint, minus the hinted attempt's score (in [-1, 1]). A similar task is one with the same
  similarity key (`similar_key`): a task file's `metadata.skill`, the demo's asked-for tool, else the prompt.

Hint help is a before/after difference, and a hinted attempt is usually a poor one: some of any later
improvement is regression to the mean and training without hints. Compare it across arms (the OPD
experiment, docs/results/opd.md), not against zero.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .events import JudgedKind, TaskEvent

KEYS = 10_000  # similarity keys remembered; the oldest forgotten first
PER_KEY = 16  # hinted attempts waiting per key (a group's members), the oldest dropped first


def similar_key(task: TaskEvent) -> str:
    """Which tasks count as similar: the same skill, the demo's same asked-for tool, or the same prompt."""
    skill = task.metadata.get("skill")
    if isinstance(skill, str) and skill:
        return f"{task.task_type}/skill/{skill}"
    tool = task.metadata.get("answer_tool")
    if task.verifier == "demo" and isinstance(tool, str):
        return f"{task.task_type}/demo/{tool}"
    return f"{task.task_type}/prompt/{' '.join(task.prompt.split())}"


@dataclass(frozen=True)
class Judged:
    task_id: str  # the result judged (for hint help: the hinted one)
    worker_id: str
    kind: JudgedKind
    value: float
    next_task_id: str | None = None


@dataclass(frozen=True)
class _Hinted:
    task_id: str
    worker_id: str
    score: float
    hinted_at: float  # when its hint was made (the manager's clock)


class ManagerJudge:
    """Judges the manager's feedback and hints as results arrive. Not thread-safe (one manager loop)."""

    def __init__(self, keys: int = KEYS, per_key: int = PER_KEY) -> None:
        self.keys = keys
        self.per_key = per_key
        self._hinted: OrderedDict[str, list[_Hinted]] = OrderedDict()

    @staticmethod
    def agreement(task_id: str, worker_id: str, feedback: float, verifier: float | None) -> Judged | None:
        if verifier is None:
            return None
        return Judged(task_id, worker_id, "agreement", 1.0 - abs(float(feedback) - float(verifier)))

    def attempt(
        self,
        task: TaskEvent,
        worker_id: str,
        verifier: float | None,
        assigned_at: float,
        hinted_at: float | None,
    ) -> list[Judged]:
        """One verified attempt: judges the earlier hinted attempts at a similar task whose hints came before
        this one was assigned, then remembers this one if it was hinted itself."""
        if verifier is None:
            return []
        key = similar_key(task)
        waiting = self._hinted.get(key, [])
        judged = [
            Judged(h.task_id, h.worker_id, "hint_help", max(-1.0, min(1.0, verifier - h.score)), task.task_id)
            for h in waiting
            if h.hinted_at < assigned_at
        ]
        left = [h for h in waiting if h.hinted_at >= assigned_at]
        if hinted_at is not None:
            left = [*left, _Hinted(task.task_id, worker_id, float(verifier), hinted_at)][-self.per_key :]
        if left:
            self._hinted[key] = left
            self._hinted.move_to_end(key)
            while len(self._hinted) > self.keys:
                self._hinted.popitem(last=False)
        else:
            self._hinted.pop(key, None)
        return judged
