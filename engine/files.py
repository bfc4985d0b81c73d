"""Paths from outside, checked for what they are before anything is opened.

Opening a FIFO for reading waits for a writer that may never come, and reading a device may never end;
a symbolic link loop raises deep inside pathlib. Every path a user or a foreign tool names is checked
here first: a FIFO, a device, a socket or a loop becomes one line naming the path, never a hang or a
traceback. `open_regular` also checks the file it opened (O_NONBLOCK, then fstat), so a file swapped for
a FIFO between the check and the open cannot hang either.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from engine.errors import CarlError
from engine.text import storable

KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class FileKindError(CarlError):
    """A path that is not what it should be (a FIFO for a file, a loop), in one line."""


def named(path: Path | str) -> str:
    """A path as the text of a message: a name that was not UTF-8 on disk keeps U+FFFD, so the line can be
    printed and stored."""
    return storable(str(path))


def kind_of(mode: int) -> str:
    """What a stat mode is, as a person says it: 'a FIFO (named pipe)', 'a regular file', ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def checked_stat(path: Path | str, error: type[CarlError] = FileKindError) -> os.stat_result:
    """os.stat (following links); `error` for a loop, a missing path or one that cannot be looked at."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise error(f"{named(path)}: {reason(exc)}") from None


def reason(exc: OSError) -> str:
    """An OSError as the end of one line."""
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop"
    if exc.errno == errno.ENOENT:
        return "no such file or directory"
    return f"cannot read it ({exc.strerror or exc})"


def regular_file(
    path: Path | str, what: str = "regular file", error: type[CarlError] = FileKindError
) -> os.stat_result:
    """The stat of `path` when it is a regular file; `error` naming the path and what it is otherwise."""
    st = checked_stat(path, error)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{named(path)}: {kind_of(st.st_mode)}, not a {what}")
    return st


def readable_dir(path: Path | str, what: str = "directory", error: type[CarlError] = FileKindError) -> Path:
    """`path` when it is a directory; `error` naming the path and what it is otherwise."""
    st = checked_stat(path, error)
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{named(path)}: {kind_of(st.st_mode)}, not a {what}")
    return Path(path)


def is_regular(path: Path | str) -> bool:
    """Whether `path` is a regular file (after links); False for anything else, missing or a loop."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return False


def open_regular(
    path: Path | str, what: str = "regular file", error: type[CarlError] = FileKindError
) -> BinaryIO:
    """`path` opened for reading in binary, once it is known to be a regular file (checked before and
    after the open)."""
    regular_file(path, what, error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{named(path)}: {reason(exc)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped since the check
            raise error(f"{named(path)}: {kind_of(mode)}, not a {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: Path | str,
    what: str = "regular file",
    error: type[CarlError] = FileKindError,
    limit: int | None = None,
) -> bytes:
    """The bytes of a regular file, at most `limit` of them (`error` when it holds more)."""
    with open_regular(path, what, error) as f:
        try:
            data = f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            raise error(f"{named(path)}: {reason(exc)}") from None
    if limit is not None and len(data) > limit:
        raise error(f"{named(path)}: larger than {limit:,} bytes; not read")
    return data


def read_utf8(
    path: Path | str,
    what: str = "regular file",
    error: type[CarlError] = FileKindError,
    limit: int | None = None,
) -> str:
    """The text of a regular UTF-8 file; `error` naming the byte that is not UTF-8."""
    data = read_regular(path, what, error, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{named(path)}: not UTF-8 text (byte {exc.start:,} is {data[exc.start]:#04x})") from None


def resolved(path: Path | str, error: type[CarlError] = FileKindError) -> Path:
    """`path` with ~ expanded, made absolute and its links resolved; `error` for a symbolic link loop."""
    try:
        return Path(path).expanduser().resolve()
    except RuntimeError:  # Python 3.11's pathlib on a loop ("Symlink loop from ...")
        raise error(f"{named(path)}: a symbolic link loop") from None
    except OSError as exc:
        raise error(f"{named(path)}: {reason(exc)}") from None
