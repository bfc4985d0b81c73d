"""The agents trainer's rollouts in carl.db (`trainer_rollouts`, schema 8): one row per task of a run, from
its arrival until a checkpoint covers the step that used it. What the states mean, and when each write
happens, is engine/agents/spool.py's (`RolloutSpool`), which calls these inside its own transactions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .base import in_chunks

if TYPE_CHECKING:
    from .db import Store


class TrainerRollouts:
    """One run's rows of `trainer_rollouts`."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.conn = store.conn
        self.run_id = run_id

    def insert_new(self, rows: Iterable[tuple[str, str, str]], received_at: float, state: str) -> None:
        """(task id, group id, payload) rows; a task stored already stays as it is."""
        self.conn.executemany(
            "INSERT OR IGNORE INTO trainer_rollouts"
            " (run_id, task_id, group_id, payload, received_at, state) VALUES (?,?,?,?,?,?)",
            [(self.run_id, task, group, payload, received_at, state) for task, group, payload in rows],
        )

    def clear_payloads(self, except_state: str, up_to_step: int) -> None:
        """Clear the payload of every row not in `except_state` whose step is at most `up_to_step`."""
        self.conn.execute(
            "UPDATE trainer_rollouts SET payload=NULL"
            " WHERE run_id=? AND state!=? AND payload IS NOT NULL AND coalesce(step, 0) <= ?",
            (self.run_id, except_state, up_to_step),
        )

    def restate_after(self, step: int, old: str, new: str) -> int:
        """Rows in state `old` used by a step after `step` (payload kept) go to `new`, without a step;
        returns how many."""
        return self.conn.execute(
            "UPDATE trainer_rollouts SET state=?, step=NULL WHERE run_id=? AND state=? AND step>?"
            " AND payload IS NOT NULL",
            (new, self.run_id, old, step),
        ).rowcount

    def payloads(self, state: str) -> list[tuple[str, float]]:
        """(payload, received_at) of the rows in `state` with a payload, oldest first."""
        return self.conn.execute(
            "SELECT payload, received_at FROM trainer_rollouts"
            " WHERE run_id=? AND state=? AND payload IS NOT NULL ORDER BY received_at, task_id",
            (self.run_id, state),
        ).fetchall()

    def tasks_not_in(self, state: str) -> list[tuple[str, str]]:
        """(task id, group id) of every row not in `state`."""
        return self.conn.execute(
            "SELECT task_id, group_id FROM trainer_rollouts WHERE run_id=? AND state!=?",
            (self.run_id, state),
        ).fetchall()

    def counts(self) -> dict[str, int]:
        """Rows by state."""
        rows = self.conn.execute(
            "SELECT state, count(*) FROM trainer_rollouts WHERE run_id=? GROUP BY state", (self.run_id,)
        )
        return dict(rows.fetchall())

    def mark(self, task_ids: Iterable[str], state: str, step: int | None = None) -> None:
        """Set the state (and, given one, the step) of the rows of `task_ids`."""
        assignments, values = ("state=?", (state,)) if step is None else ("state=?, step=?", (state, step))
        for chunk, marks in in_chunks(task_ids):
            self.conn.execute(
                f"UPDATE trainer_rollouts SET {assignments} WHERE run_id=? AND task_id IN ({marks})",
                (*values, self.run_id, *chunk),
            )
