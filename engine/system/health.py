"""What the box says of a run's health: its processes, its console, the GPUs and disks it uses.

`box_flags` reads the store (engine/store/system_reads.py) and returns one `BoxFlag` per cause of
engine/coherence/health.py's BOX_CAUSES that holds; the run's analysis (engine/coherence/analysis.py) adds
them to the run's health, so each is a reason in the control room, in the analyst's answer and in an alert
(once per cause per run). Each rule reads one thing, and every threshold is a named constant with its reason.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import NamedTuple

from engine.store.system_reads import SystemReads


class BoxFlag(NamedTuple):
    level: str  # yellow | red
    cause: str  # one of engine/coherence/health.py BOX_CAUSES
    reason: str


BoxRule = Callable[[SystemReads, int, str, float], list[BoxFlag]]  # (reads, run id, its status, now)

BOX_RULES: list[BoxRule] = []


def box_flags(conn: sqlite3.Connection, version: int, run_id: int, status: str, now: float) -> list[BoxFlag]:
    """Every box rule's flags for the run (none on a store without the box's tables)."""
    reads = SystemReads(conn, version)
    if not reads.ready:
        return []
    return [flag for rule in BOX_RULES for flag in rule(reads, run_id, status, now)]
