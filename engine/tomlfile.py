"""Reading a TOML settings file ($CARL_HOME/tui.toml, trajectories.toml, engine.toml), with one-line errors
that name the file: the TOML twin of yamlfile.py.

The file is checked for what it is before it is opened (a FIFO in its place would block the reader for ever, a
link to /dev/zero would fill the memory), read whole up to MAX_BYTES, and parsed; tomllib's own limits
(nesting it recurses into, an integer of more than 4,300 digits) are one line too, never a traceback.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.files import named, read_utf8
from engine.yamlfile import MAX_BYTES, shape_problem


def read_table(path: Path, error: type[CarlError]) -> dict[str, Any]:
    """The table of the TOML file `path`; `error` with one line for a file that is not a regular file, is not
    UTF-8, is not valid TOML, or is nested too deeply. (Whether a missing file is an error is the caller's
    say.)"""
    import tomllib  # only a home that has such a file pays for the import

    text = read_utf8(path, error=error, limit=MAX_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{named(path)}: {exc}") from None
    except RecursionError:
        raise error(f"{named(path)}: invalid TOML: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"{named(path)}: invalid TOML: {str(exc).split(';')[0]}") from None
    problem = shape_problem(data)
    if problem is not None:
        raise error(f"{named(path)}: {problem}")
    return data


class FileWatch:
    """Whether a settings file changed since the last look: its modification time and size, looked at no more
    often than every `every` seconds (the engine's jobs read engine.toml again when it changes). A file that
    is not there counts as one state, so removing it is a change too."""

    def __init__(self, path: Path, every: float = 2.0) -> None:
        self.path = path
        self.every = every
        self.seen: tuple[float, int] | None = None
        self.next_look = 0.0

    def changed(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + self.every
        try:
            stat = self.path.stat()
            seen = (stat.st_mtime, stat.st_size)
        except OSError:
            seen = (0.0, -1)
        if seen == self.seen:
            return False
        self.seen = seen
        return True

    def look_now(self) -> None:
        """The next `changed()` looks at the file whatever the time (a test, or a job told to)."""
        self.next_look = 0.0
