"""Names people and foreign tools give to runs, checked where they enter; paths never come from them.

A run's name is shown, searched and typed; its directory comes from its id (`paths.run_dir`), so a
name such as `../../elsewhere/x` can never point a write outside $CARL_HOME. A name a person gives
(a config's `name:`, `--name`) is refused with one line when it is not a plain name; a name a foreign
tool recorded (a Trackio run, a W&B run, a folder) is made storable, printable and short (`as_name`), since
its run must be imported anyway; it may keep a "/" (`out/run-1`), which names no path.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from engine.errors import CarlError
from engine.text import storable

MAX_NAME = 128
SEPARATORS = ("/", "\\")
UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]+")  # what a directory name keeps of a name (`slug`)


class InvalidName(CarlError):
    """A name that cannot be used, in one line naming the field."""


def name_problem(name: Any) -> str | None:
    """Why `name` is not a valid name, or None: printable, 1 to MAX_NAME characters, no path separator,
    not "." or ".."."""
    if not isinstance(name, str):
        return f"expected text, not {type(name).__name__}"
    if not name.strip():
        return "empty"
    if len(name) > MAX_NAME:
        return f"{len(name):,} characters long (at most {MAX_NAME})"
    if any(sep in name for sep in SEPARATORS):
        return "contains a path separator (/ or \\)"
    if name in (".", ".."):
        return f"{name!r} is not a name"
    if not name.isprintable():
        return "contains a control or unprintable character"
    return None


def valid_name(name: Any, field: str) -> str:
    """`name` when it is a valid name; InvalidName naming `field` otherwise."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidName(f"{field}: {problem}")
    return name


def name_arg(text: str) -> str:
    """An argparse `type` for a name flag (`--name`): a bad one is argparse's one-line usage error."""
    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def as_name(text: Any, fallback: str = "run") -> str:
    """A name made from what a foreign tool recorded: storable, every unprintable character a space, cut
    to MAX_NAME characters; `fallback` when nothing is left. A valid name comes back unchanged."""
    raw = storable(text if isinstance(text, str) else "" if text is None else str(text))
    cleaned = "".join(c if c.isprintable() else " " for c in raw[:MAX_NAME])
    return fallback if cleaned.strip() in ("", ".", "..") else cleaned


def slug(name: str, limit: int = 48) -> str:
    """A directory-safe rendering of a name, for reading a directory listing only: the id beside it is
    what makes a run's directory unique."""
    return UNSAFE.sub("-", name).strip("-.")[:limit] or "run"
