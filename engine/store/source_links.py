"""Which sources join another's run (`sources.attach_to`, set by discovery): a reader of metrics that also
finds samples (W&B Tables) leaves out those a dump attached to it holds in full
(engine/observe/wandb_tables.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .db import Store


def attached_kinds(store: Store, source_id: int) -> set[str]:
    """The kinds of the sources whose samples join the run of source `source_id`."""
    rows = store.conn.execute("SELECT DISTINCT kind FROM sources WHERE attach_to=?", (source_id,))
    return {str(r[0]) for r in rows}
