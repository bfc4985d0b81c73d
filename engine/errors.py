"""The base of every error carl reports to a user as one line (what is wrong, and where), and the
guard that turns one into that line: `carl` and `carl-tui` share it."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine.text import visible

T = TypeVar("T")


class CarlError(Exception):
    """A user-facing failure: `str(exc)` is the whole message, no traceback needed."""


class CliError(CarlError):
    """A one-line problem with a command line: a flag, a missing extra, a name the store lacks."""


def fail(message: str) -> int:
    """The one line on stderr: a message names what the user gave (a run, a path, a key), so it is
    made `visible` (no control character of a stored name reaches the terminal)."""
    print(f"carl: {visible(message)}", file=sys.stderr)
    return 2


def guard(fn: Callable[[T], int], args: T) -> int:
    """Errors meant for the user become one line, a full disk included; anything else is a bug and keeps its
    traceback."""
    try:
        return fn(args)
    except (CarlError, FileNotFoundError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `carl ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush does not raise
        return 0
    except (sqlite3.OperationalError, OSError) as exc:
        from engine.faults import disk_full, full_disk_message

        if not disk_full(exc):
            raise
        # $CARL_HOME as engine/paths.py reads it (importing paths here would make an import circle)
        home = Path(os.environ.get("CARL_HOME") or Path.home() / ".carl").expanduser()
        return fail(full_disk_message(exc, home))
