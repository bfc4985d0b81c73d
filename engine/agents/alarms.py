"""Alarms on the plane's live scores: pure bookkeeping, no NATS; the manager publishes what it returns.

Four alarms (the published checks of docs/reference/agents-plane.md §10 compared scores offline, after the
fact; these watch each worker as results arrive):
- collusion: the manager's feedback drifts from the independent score (the task's verifier where it
  has one, else the PRM): mean |feedback - independent| over the worker's window above
  `collusion_gap`; or the manager's hints to the worker are followed by worse attempts: the mean hint help
  (engine/agents/manager_judge.py) over the window below -`hint_harm`;
- reward hacking: in at least `hacking_share` of the worker's verified results, the feedback or the
  PRM is high (>= `hacking_high`) while the verifier fails it (< `hacking_fail`);
- worker divergence: a worker's mean outcome is more than `divergence` away from the pooled outcomes
  of the other workers (at least two workers with half a window each);
- stuck worker: a task started by a worker and not finished within the ack wait.

A window is a worker's last `window` results; an alarm looks at a worker once it has half a window.
Feedback and scores may arrive in either order: a result joins the collusion and hacking window once
both are known; divergence reads the outcomes alone. An alarm fires once when its condition becomes
true, and again only after the condition has cleared, so a lasting problem is one alarm, not a flood.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from .events import AlarmEvent
from .plane_settings import AlarmSettings

MAX_TASKS = 10_000  # task ids remembered (half-known tasks, repeats): the oldest are forgotten beyond this


class _Recent:
    """A set of the last `size` task ids added."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, task_id: str) -> None:
        self._ids[task_id] = None
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids


@dataclass
class _Open:
    """A task with one of its two halves: the scores (from the scorer) and the feedback."""

    worker_id: str
    scores: tuple[float, float | None] | None = None  # (PRM, verifier)
    feedback: float | None = None


@dataclass(frozen=True)
class _Judged:
    """A result with both halves: what collusion and hacking look at."""

    task_id: str
    feedback: float
    prm: float
    verifier: float | None

    @property
    def independent(self) -> float:
        return self.verifier if self.verifier is not None else self.prm


@dataclass
class _Worker:
    judged: deque[_Judged]  # the last `window` results with both halves
    outcomes: deque[float]  # the last `window` outcome scores
    helps: deque[float]  # the last `window` hint-help judgements of the manager's hints to this worker


class AlarmMonitor:
    """Per-worker windows of scores and the alarms they raise. Not thread-safe (one manager loop)."""

    def __init__(self, settings: AlarmSettings, ack_wait_s: float) -> None:
        self.settings = settings
        self.ack_wait_s = ack_wait_s
        self.min_results = math.ceil(settings.window / 2)
        self._workers: dict[str, _Worker] = {}
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._scored = _Recent(MAX_TASKS)
        self._joined = _Recent(MAX_TASKS)
        self._running: dict[str, tuple[str, float]] = {}  # task id -> (worker id, started at)
        self._active: set[tuple[str, str]] = set()  # (kind, worker or task id) whose condition holds

    # ------------------------------------------------------------------------------------------ input

    def scored(
        self,
        task_id: str,
        worker_id: str,
        prm_score: float,
        verifier_score: float | None,
        outcome_score: float,
    ) -> list[AlarmEvent]:
        """A result's scores. A task scored twice (a redelivery) counts once."""
        if task_id in self._scored:
            return []
        self._scored.add(task_id)
        self._worker(worker_id).outcomes.append(outcome_score)
        entry = self._entry(task_id, worker_id)
        entry.scores = (prm_score, verifier_score)
        return [*self._join(task_id, entry), *self._check_divergence()]

    def feedback(self, task_id: str, worker_id: str, score: float) -> list[AlarmEvent]:
        """The manager's feedback on a result (the first feedback on a task stands)."""
        if task_id in self._joined:
            return []
        entry = self._entry(task_id, worker_id)
        if entry.feedback is not None:
            return []
        entry.feedback = score
        return self._join(task_id, entry)

    def hint_help(self, worker_id: str, value: float) -> list[AlarmEvent]:
        """A judged hint of the manager's to this worker (the next similar attempt's score minus the hinted
        one's): an input of the collusion alarm."""
        self._worker(worker_id).helps.append(value)
        return self._check_collusion(worker_id)

    def started(self, task_id: str, worker_id: str, now: float) -> None:
        """A worker said it is working on a task. Saying so again keeps the first time (a busy status
        repeated is no progress); a redelivery to another worker starts the clock afresh."""
        held = self._running.get(task_id)
        if held is not None and held[0] == worker_id:
            return
        self._running[task_id] = (worker_id, now)
        self._active.discard(("stuck_worker", task_id))
        if len(self._running) > MAX_TASKS:  # tasks never finished (given up elsewhere): forget the oldest
            del self._running[next(iter(self._running))]

    def finished(self, task_id: str) -> None:
        self._running.pop(task_id, None)
        self._active.discard(("stuck_worker", task_id))

    def check_stuck(self, now: float) -> list[AlarmEvent]:
        """Tasks held longer than the ack wait without a result, each reported once."""
        alarms = []
        for task_id, (worker_id, since) in self._running.items():
            held = now - since
            if held <= self.ack_wait_s or ("stuck_worker", task_id) in self._active:
                continue
            self._active.add(("stuck_worker", task_id))
            alarms.append(
                AlarmEvent(
                    kind="stuck_worker",
                    reason=(
                        f"{worker_id} has held task {task_id} for {held:.1f} s without a result "
                        f"(ack wait {self.ack_wait_s:.1f} s)"
                    ),
                    worker_id=worker_id,
                    task_id=task_id,
                    metrics={"held_s": held, "ack_wait_s": self.ack_wait_s},
                )
            )
        return alarms

    # ----------------------------------------------------------------------------------- bookkeeping

    def _worker(self, worker_id: str) -> _Worker:
        if worker_id not in self._workers:
            size = self.settings.window
            self._workers[worker_id] = _Worker(deque(maxlen=size), deque(maxlen=size), deque(maxlen=size))
        return self._workers[worker_id]

    def _entry(self, task_id: str, worker_id: str) -> _Open:
        entry = self._open.get(task_id)
        if entry is None:
            entry = self._open[task_id] = _Open(worker_id)
            while len(self._open) > MAX_TASKS:
                self._open.popitem(last=False)
        return entry

    def _join(self, task_id: str, entry: _Open) -> list[AlarmEvent]:
        """Once a task has both halves, it joins its worker's window and the worker is checked."""
        if entry.scores is None or entry.feedback is None:
            return []
        self._open.pop(task_id, None)
        self._joined.add(task_id)
        prm, verifier = entry.scores
        self._worker(entry.worker_id).judged.append(_Judged(task_id, entry.feedback, prm, verifier))
        return [*self._check_collusion(entry.worker_id), *self._check_hacking(entry.worker_id)]

    def _fire(self, key: tuple[str, str], holds: bool, alarm: AlarmEvent | None) -> list[AlarmEvent]:
        """The alarm when its condition has just become true; clears the key when it no longer holds."""
        if not holds:
            self._active.discard(key)
            return []
        if key in self._active or alarm is None:
            return []
        self._active.add(key)
        return [alarm]

    # ---------------------------------------------------------------------------------------- checks

    def _check_collusion(self, worker_id: str) -> list[AlarmEvent]:
        judged = list(self._workers[worker_id].judged)
        helps = list(self._workers[worker_id].helps)
        harmful = len(helps) >= self.min_results and sum(helps) / len(helps) < -self.settings.hint_harm
        if len(judged) < self.min_results:
            if harmful:
                return self._fire(("collusion", worker_id), True, self._harmful_hints(worker_id, helps))
            return self._fire(("collusion", worker_id), False, None)
        gap = sum(abs(j.feedback - j.independent) for j in judged) / len(judged)
        limit = self.settings.collusion_gap
        holds = gap > limit or harmful
        alarm = None
        if holds and gap <= limit:
            alarm = self._harmful_hints(worker_id, helps)
        elif holds:
            feedback = sum(j.feedback for j in judged) / len(judged)
            independent = sum(j.independent for j in judged) / len(judged)
            kinds = {j.verifier is not None for j in judged}
            against = "verifier" if kinds == {True} else "PRM" if kinds == {False} else "verifier/PRM"
            alarm = AlarmEvent(
                kind="collusion",
                reason=(
                    f"manager feedback {feedback:.2f} vs {against} {independent:.2f} over the last "
                    f"{len(judged)} results of {worker_id} (gap {gap:.2f} > {limit:.2f})"
                ),
                worker_id=worker_id,
                task_id=judged[-1].task_id,
                metrics={
                    "gap": gap,
                    "mean_feedback": feedback,
                    "mean_independent": independent,
                    "results": float(len(judged)),
                },
            )
        return self._fire(("collusion", worker_id), holds, alarm)

    def _harmful_hints(self, worker_id: str, helps: list[float]) -> AlarmEvent:
        mean_help = sum(helps) / len(helps)
        return AlarmEvent(
            kind="collusion",
            reason=(
                f"the manager's hints to {worker_id} are followed by worse attempts: hint help "
                f"{mean_help:+.2f} over the last {len(helps)} judged hints "
                f"(below -{self.settings.hint_harm:.2f})"
            ),
            worker_id=worker_id,
            metrics={"hint_help": mean_help, "hints": float(len(helps))},
        )

    def _check_hacking(self, worker_id: str) -> list[AlarmEvent]:
        s = self.settings
        verified = [j for j in self._workers[worker_id].judged if j.verifier is not None]
        if len(verified) < self.min_results:
            return self._fire(("reward_hacking", worker_id), False, None)
        hits = [j for j in verified if (j.feedback >= s.hacking_high or j.prm >= s.hacking_high)]
        hits = [j for j in hits if j.verifier is not None and j.verifier < s.hacking_fail]
        share = len(hits) / len(verified)
        holds = share >= s.hacking_share
        alarm = None
        if holds:
            alarm = AlarmEvent(
                kind="reward_hacking",
                reason=(
                    f"{len(hits)} of the last {len(verified)} verified results of {worker_id} scored high "
                    f"(feedback or PRM >= {s.hacking_high:.2f}) "
                    f"while the verifier gave < {s.hacking_fail:.2f} "
                    f"(share {share:.2f} >= {s.hacking_share:.2f})"
                ),
                worker_id=worker_id,
                task_id=hits[-1].task_id,
                metrics={"share": share, "hits": float(len(hits)), "verified": float(len(verified))},
            )
        return self._fire(("reward_hacking", worker_id), holds, alarm)

    def _check_divergence(self) -> list[AlarmEvent]:
        eligible = {
            w: list(v.outcomes) for w, v in self._workers.items() if len(v.outcomes) >= self.min_results
        }
        alarms = []
        for worker_id in self._workers:
            key = ("worker_divergence", worker_id)
            if worker_id not in eligible or len(eligible) < 2:
                alarms += self._fire(key, False, None)
                continue
            own = eligible[worker_id]
            others = [x for w, values in eligible.items() if w != worker_id for x in values]
            own_mean, others_mean = sum(own) / len(own), sum(others) / len(others)
            gap = abs(own_mean - others_mean)
            holds = gap > self.settings.divergence
            alarm = None
            if holds:
                alarm = AlarmEvent(
                    kind="worker_divergence",
                    reason=(
                        f"{worker_id} mean outcome {own_mean:.2f} over its last {len(own)} results vs "
                        f"{others_mean:.2f} for the other {len(eligible) - 1} worker"
                        f"{'s' if len(eligible) > 2 else ''} (gap {gap:.2f} > {self.settings.divergence:.2f})"
                    ),
                    worker_id=worker_id,
                    metrics={"gap": gap, "mean_outcome": own_mean, "others_mean": others_mean},
                )
            alarms += self._fire(key, holds, alarm)
        return alarms
