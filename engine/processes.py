"""Whether a process is alive: it exists and is not a zombie.

A process killed with SIGKILL stays a zombie until its parent reaps it, and a zombie still answers
`os.kill(pid, 0)`. On a busy box the reaping can lag by seconds, long enough for a restart to
believe the dead engine or run is still there. /proc tells the two apart on Linux.
"""

from __future__ import annotations

import os


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # pid (comm) STATE ...: comm may hold spaces and parentheses, so read after the last ')'
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False  # no /proc (not Linux), or the process is gone: os.kill tells


def alive(pid: int, *, others_count: bool) -> bool:
    """`others_count`: whether a process of another user counts as alive (it cannot be probed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return others_count
    return not is_zombie(pid)
