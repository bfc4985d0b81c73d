"""The trainer's rollouts in the store, from their arrival until a checkpoint covers the step that used them.

The trainer acknowledges a rollout on the stream only once it is stored here (`keep`), so a trainer killed
at any moment loses none. The restarted one (`--resume`) carries on its run from the newest checkpoint:
the rollouts used by steps after that checkpoint wait again (`rewind`), and with those never used they are
read back (`waiting`) and trained, each exactly once in the run's history. Every row says which step used
it (`used`), or that its group was given up (`dropped`); once a checkpoint holds that step, the row keeps
only that: its payload (prompt, token ids and log-probs) is cleared, as nothing will read it again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from engine.store.trainer_rollouts import TrainerRollouts

from .events import TrainingRolloutEvent

if TYPE_CHECKING:
    from engine.store import Store

WAITING, USED, DROPPED = "waiting", "used", "dropped"


class RolloutSpool:
    """One run's rollouts in `trainer_rollouts` (schema 8): one row per task."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store = store
        self.rows = TrainerRollouts(store, run_id)
        self.run_id = run_id

    def keep(self, rollouts: Sequence[TrainingRolloutEvent]) -> None:
        """Store rollouts the trainer took, in one transaction; one stored already stays as it is (a
        redelivery of a rollout stored before the trainer was killed, and refused by it as a duplicate)."""
        now = time.time()
        with self.store.transaction():
            self.rows.insert_new(
                [(r.task_id, r.group_id or "", r.model_dump_json()) for r in rollouts], now, WAITING
            )

    def used(self, step: int, task_ids: Iterable[str], *, checkpointed: int | None) -> None:
        """The rollouts `step` trained on; `checkpointed`: the newest step a checkpoint holds, whose rows
        need their payloads no more."""
        with self.store.transaction():
            self.rows.mark(task_ids, USED, step)
            if checkpointed is not None:
                self.rows.clear_payloads(WAITING, checkpointed)

    def dropped(self, task_ids: Iterable[str]) -> None:
        """Rollouts of a group given up (too few arrived in time): never trained."""
        with self.store.transaction():
            self.rows.mark(task_ids, DROPPED)

    def rewind(self, step: int) -> int:
        """The run carries on from its checkpoint at `step`: rollouts used by later steps wait again, to be
        trained again by those steps' replays. Returns how many."""
        with self.store.transaction():
            return self.rows.restate_after(step, USED, WAITING)

    def waiting(self) -> list[tuple[TrainingRolloutEvent, float]]:
        """The rollouts not trained yet, oldest first, each with when it arrived."""
        rows = self.rows.payloads(WAITING)
        return [(TrainingRolloutEvent.model_validate_json(payload), received) for payload, received in rows]

    def closed(self) -> list[tuple[str, str]]:
        """(task id, group id) of every rollout trained or given up: a repeat of one is refused."""
        return self.rows.tasks_not_in(WAITING)

    def counts(self) -> dict[str, int]:
        """Rows by state (for the log and the tests)."""
        return self.rows.counts()
