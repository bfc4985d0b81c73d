"""What the box says of a run's health: its processes, its console, the GPUs and disks it uses.

`box_flags` reads the store (engine/store/system_reads.py) and returns one `BoxFlag` per cause of
engine/coherence/health.py's BOX_CAUSES that holds; the run's analysis (engine/coherence/analysis.py) adds
them to the run's health, so each is a reason in the control room, in the analyst's answer and in an alert
(once per cause per run). Each rule reads one thing, and every threshold is a named constant with its reason.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
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


# -- console_error: what the console scan found (engine/console/) -------------------------------------------

# A run that printed a traceback and has written no row for this long since it was found has ended with it
# (an observed script that crashed keeps the status `running`: nothing tells its end but the silence).
CRASH_QUIET_S = 60.0
CONSOLE_REASON_CHARS = 200  # of the exception line in the reason (the whole line is in the finding)
CONSOLE_WHAT = {"traceback": "traceback", "oom": "CUDA out of memory", "nccl": "NCCL error"}


def console_error(reads: SystemReads, run_id: int, status: str, now: float) -> list[BoxFlag]:
    """The newest finding of the run's consoles. Red for CUDA out of memory and NCCL errors (training does
    not go on after either), and for a traceback that ended the run: the run failed, or it has written
    nothing for CRASH_QUIET_S since the traceback was found. Yellow for a traceback while the run goes on, or
    in a run that ended otherwise (stopped, finished, imported): something printed one, and it did not stop
    the run."""
    found = reads.findings(run_id, limit=1)
    if not found:
        return []
    finding = found[0]
    level = "red"
    if finding["kind"] == "traceback" and status != "failed":
        last = reads.last_write(run_id)
        ended_with_it = status == "running" and (last is None or last <= finding["t"])
        if not (ended_with_it and now - finding["t"] >= CRASH_QUIET_S):
            level = "yellow"
    line = finding["line"]
    if len(line) > CONSOLE_REASON_CHARS:
        line = line[: CONSOLE_REASON_CHARS - 1] + "…"
    where = Path(finding["path"]).name + (f" line {finding['line_no']:,}" if finding["line_no"] else "")
    what = CONSOLE_WHAT.get(finding["kind"], finding["kind"])
    return [BoxFlag(level, "console_error", f"{what} in the console: {line} ({where})")]


BOX_RULES.append(console_error)
