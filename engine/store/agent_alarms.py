"""The agents plane's alarms in carl.db as the alert job reads them (engine/alerts/alert_job.py): the newest
agent event, where its cursor starts, and the alarms after its cursor.

Reads on the writer's connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store

AlarmRow = tuple[int, str | None, str | None, str | None]  # id, payload (JSON text), worker_id, task_id


def newest_event_id(store: Store) -> int:
    """The id of the newest agent event (0: none yet)."""
    return int(store.conn.execute("SELECT coalesce(max(id), 0) FROM agent_events").fetchone()[0])


def alarms_after(store: Store, after_id: int, limit: int) -> list[AlarmRow]:
    """The stored alarms (not rejected) after event `after_id`, oldest first, at most `limit`."""
    return store.conn.execute(
        "SELECT id, payload, worker_id, task_id FROM agent_events WHERE kind='alarm'"
        " AND coalesce(status, 'ok')='ok' AND id>? ORDER BY id LIMIT ?",
        (after_id, limit),
    ).fetchall()
