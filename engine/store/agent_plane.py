"""What the agents plane reads of runs and commands in carl.db: the state of a command it answers (or that
`carl agents up` waits on), the `agents_up` commands still queued, the status of the run a plane is bound to,
and the saved weights of the run it serves.

Each read is one statement on the writer's connection (engine/agents/plane.py's `Plane` and the `carl agents`
commands hold a `Store`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .db import Store


def command_state(store: Store, command_id: int) -> tuple[str, str | None] | None:
    """(state, result) of a command (None: no such command)."""
    row = store.conn.execute("SELECT state, result FROM commands WHERE id=?", (command_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def queued_engine_commands(store: Store, verb: str) -> list[int]:
    """The ids of the engine's commands of `verb` still pending."""
    rows = store.conn.execute(
        "SELECT id FROM commands WHERE target='engine' AND verb=? AND state='pending'", (verb,)
    )
    return [r[0] for r in rows]


def run_status(store: Store, name: str) -> str | None:
    """The status of the run named `name` (running, paused, finished, failed, stopped...); None: no such
    run."""
    row = store.conn.execute("SELECT status FROM runs WHERE name=?", (name,)).fetchone()
    return str(row[0]) if row is not None else None


def saved_weights(store: Store, run_id: int, limit: int = 8) -> list[tuple[Any, ...]]:
    """(step, kind, detail) of a run's newest `limit` events that saved weights ('final' or 'checkpoint'),
    the newest step first, its final model before a checkpoint of the same step."""
    return store.conn.execute(
        "SELECT step, kind, detail FROM events WHERE run_id=? AND kind IN ('final', 'checkpoint')"
        " ORDER BY step DESC, (kind = 'final') DESC, id DESC LIMIT ?",
        (run_id, limit),
    ).fetchall()
