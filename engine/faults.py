"""Telling the store's trouble from one bad input's, for writers that must never stop on the latter.

A writer that meets an error has two choices: try the same thing again later (the store was locked,
the disk full: nothing about the input was wrong), or set that one input aside as rejected and go on
(a number beyond SQLite's integers, text it cannot encode). Retrying a bad input for ever stops the
writer for good; rejecting good input because the disk was full loses it. `store_trouble` decides.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path


def store_trouble(exc: BaseException) -> bool:
    """Whether `exc` is the store's own trouble (locked, full, unreadable, the disk), worth trying the
    same work again, rather than one input the store cannot take (OverflowError, UnicodeEncodeError,
    an integrity or binding error), which should be set aside."""
    return isinstance(exc, sqlite3.OperationalError | OSError) or type(exc) is sqlite3.DatabaseError


# -- a full disk, said in one line ---------------------------------------------------------------------------

LOW_DISK_BYTES = 16 * 1024 * 1024  # under this a disk is full for a store that writes pages and a WAL
_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or the user's quota) is full: SQLite's SQLITE_FULL, or ENOSPC/EDQUOT."""
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding `path` (its nearest existing
    ancestor); None when that cannot be read."""
    for place in (path, *path.parents):
        try:
            return shutil.disk_usage(place).free
        except OSError:
            continue
    return None


def disk_line(path: Path) -> str | None:
    """ "the disk holding PATH has 12 KB free", when it is nearly full (under LOW_DISK_BYTES); else None."""
    free = free_bytes(path)
    if free is None or free >= LOW_DISK_BYTES:
        return None
    return f"the disk holding {path} has {_size(free)} free"


def full_disk_message(exc: BaseException, home: Path) -> str:
    """One line for a write that failed on a full disk: where, how full, what to do."""
    return f"{disk_line(home) or f'the disk holding {home} is full'} ({exc}): free some space, then try again"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
