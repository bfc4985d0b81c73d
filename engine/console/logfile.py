"""A log file read by offsets, as Toolong reads one (github.com/Textualize/toolong): never whole.

`LogFile` is an open regular file (a FIFO, a device or a socket is refused by its type before it is opened,
engine/files.py) read with `os.pread` at an offset, so two threads read it without sharing a position.
`LineIndex` is where its lines are: the offsets of its newlines, found by scanning the file in chunks (numpy
finds the newlines of a chunk in C) and kept in fixed blocks of int64, 8 bytes a line and nothing else: a 1 GB
log of 100-byte lines is an index of 80 MB, and growing it never copies what is there. An index may start at
a line in the middle of the file (the last megabyte, shown before the whole file is indexed): then it does not
know its line numbers. `shown_text` is a line as the log view shows it: every byte as text (invalid UTF-8
replaced, escape sequences and control bytes written out by engine.text.visible), cut past SHOWN_BYTES with
its length said. `search` finds a pattern forwards or backwards, a chunk at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import CarlError
from engine.files import named, open_regular, reason
from engine.text import visible

CHUNK = 4 << 20  # bytes read at a time by the index and by search
BLOCK = 1 << 16  # newline offsets per block of the index (512 KB)
SHOWN_BYTES = 16 * 1024  # of a line, the bytes read to show it; a longer line is cut, its length said
MAX_PATTERN = 1000  # characters of a search pattern


class LogFileError(CarlError):
    """A log file that cannot be read (missing, a FIFO, unreadable), in one line."""


class LogFile:
    """A regular file open for reading at offsets. `dup` gives another thread its own descriptor of the same
    file, so each side closes its own (a descriptor closed under a reader could be reused by another file)."""

    def __init__(self, path: Path | str, fd: int) -> None:
        self.path = Path(path)
        self.fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: Path | str) -> LogFile:
        with open_regular(path, "regular file (a log)", LogFileError) as f:
            return cls(path, os.dup(f.fileno()))

    def dup(self) -> LogFile:
        return LogFile(self.path, os.dup(self.fd))

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, offset: int, n: int) -> bytes:
        if n <= 0:
            return b""
        try:
            return os.pread(self.fd, n, offset)
        except OSError as exc:
            raise LogFileError(f"{named(self.path)}: {reason(exc)}") from None

    def replaced(self) -> bool:
        """Whether the path now names another file (rotated: moved away, a new one made). A path that is gone
        is not replaced yet: what was open is still read, as `tail -F` does until a new file appears."""
        try:
            st = os.stat(self.path)
        except (OSError, ValueError):
            return False
        return (st.st_dev, st.st_ino) != self.identity

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LineIndex:
    """The lines of a file from `start` (a line's first byte) on: the offsets of the newlines scanned so far.

    Line i runs from the byte after newline i-1 (or `start`) to newline i; past the last newline, the bytes
    scanned make one more line, not ended yet (a log being written). `first_number` is the file's number of
    line 0 (None: not known, for an index that starts in the middle). Appends never move what is stored, so
    another thread may read lines below a count it was given while this one scans on.
    """

    def __init__(self, start: int = 0, first_number: int | None = 0) -> None:
        self.start = start
        self.first_number = first_number
        self.scanned = start  # bytes up to here are indexed
        self.newlines = 0
        self._blocks: list[np.ndarray] = []

    # -- building --------------------------------------------------------------------------------------------

    def scan(
        self, file: LogFile, until: int, *, chunk: int = CHUNK, stale: Callable[[], bool] | None = None
    ) -> None:
        """Index from where it got to up to byte `until` (or less when the file is shorter), a chunk at a
        time; `stale()` true between chunks stops early."""
        while self.scanned < until:
            data = file.read(self.scanned, min(chunk, until - self.scanned))
            if not data:
                return
            found = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            if len(found):
                self._append(found.astype(np.int64) + self.scanned)
            self.scanned += len(data)
            if stale is not None and stale():
                return

    def _append(self, offsets: np.ndarray) -> None:
        while len(offsets):
            if self.newlines == len(self._blocks) * BLOCK:
                self._blocks.append(np.empty(BLOCK, dtype=np.int64))
            block = self._blocks[-1]
            at = self.newlines % BLOCK
            take = min(BLOCK - at, len(offsets))
            block[at : at + take] = offsets[:take]
            self.newlines += take  # after the values: a reader given this count finds them written
            offsets = offsets[take:]

    # -- reading ---------------------------------------------------------------------------------------------

    def newline(self, i: int) -> int:
        return int(self._blocks[i // BLOCK][i % BLOCK])

    def count(self, end: int | None = None, newlines: int | None = None) -> int:
        """Lines in [start, end): the ended ones, and one more when bytes follow the last newline."""
        end = self.scanned if end is None else end
        newlines = self.newlines if newlines is None else newlines
        last_start = self.newline(newlines - 1) + 1 if newlines else self.start
        return newlines + (1 if end > last_start else 0)

    def span(self, i: int, end: int | None = None) -> tuple[int, int]:
        """Line i's first byte and the byte past its last (its newline left out); `end` bounds the line not
        ended yet."""
        first = self.newline(i - 1) + 1 if i > 0 else self.start
        last = self.newline(i) if i < self.newlines else (self.scanned if end is None else end)
        return first, last

    def line_of(self, offset: int) -> int:
        """The line that holds byte `offset` (offset >= start)."""
        n = self.newlines
        if not n or offset <= self.newline(0):
            return 0
        lo = 0  # first block whose last offset >= offset
        blocks = (n + BLOCK - 1) // BLOCK
        hi = blocks - 1
        while lo < hi:
            mid = (lo + hi) // 2
            last = min(BLOCK, n - mid * BLOCK) - 1
            if self._blocks[mid][last] >= offset:
                hi = mid
            else:
                lo = mid + 1
        block = self._blocks[lo][: min(BLOCK, n - lo * BLOCK)]
        return lo * BLOCK + int(np.searchsorted(block, offset, side="left"))

    def number(self, i: int) -> int | None:
        """The file's line number (from 1) of line i, when known."""
        return None if self.first_number is None else self.first_number + i + 1

    @property
    def nbytes(self) -> int:
        return len(self._blocks) * BLOCK * 8


def shown_text(raw: bytes, length: int) -> tuple[str, str]:
    """A line's bytes as the log view shows them: UTF-8 with invalid bytes replaced, control bytes and escape
    sequences written out, tabs as spaces; and, when `length` (the line's whole length) is more than was read,
    a note saying it was cut."""
    cut = length > len(raw)
    if raw.endswith(b"\r") and not cut:
        raw = raw[:-1]  # a CRLF file's line end, not part of the line
    text = visible(raw.decode("utf-8", errors="replace")).expandtabs(8)
    return text, f" … (cut: the line is {length:,} bytes)" if cut else ""


def read_line(file: LogFile, index: LineIndex, i: int, end: int) -> tuple[str, str]:
    """Line i as shown, and its cut note (at most SHOWN_BYTES of it are read)."""
    first, last = index.span(i, end)
    return shown_text(file.read(first, min(last - first, SHOWN_BYTES)), last - first)


# -- search --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """What a search looks for: the text typed, as bytes; case-insensitive unless it has a capital (smart
    case, as less -i and vim's smartcase). Looked for with bytes.find (a case-insensitive search lowers the
    chunk first): a regex with IGNORECASE reads a gigabyte ten times slower."""

    text: str
    needle: bytes
    fold: bool  # lower the bytes before looking

    @classmethod
    def of(cls, text: str) -> Pattern:
        text = text[:MAX_PATTERN]
        fold = not any(c.isupper() for c in text)
        needle = text.encode("utf-8", errors="replace")
        return cls(text, needle.lower() if fold else needle, fold)


def search(
    file: LogFile,
    pattern: Pattern,
    start: int,
    stop: int,
    *,
    forward: bool,
    stale: Callable[[], bool] | None = None,
) -> int | None:
    """The offset of the first match starting in [start, stop) (forward), or of the last one (backward); None
    when there is none, or when `stale()` became true between chunks. A chunk at a time, overlapping by the
    pattern's length, so a match across two chunks is found."""
    needle = pattern.needle
    if not needle:
        return None
    overlap = len(needle) - 1
    if forward:
        pos = start
        while pos < stop:
            data = file.read(pos, min(CHUNK, stop - pos) + overlap)
            if not data:
                return None
            at = (data.lower() if pattern.fold else data).find(needle)
            if at >= 0 and pos + at < stop:
                return pos + at
            pos += CHUNK
            if stale is not None and stale():
                return None
        return None
    end = stop
    while end > start:
        pos = max(start, end - CHUNK)
        data = file.read(pos, end - pos + overlap)
        at = (data.lower() if pattern.fold else data).rfind(needle, 0, end - pos + len(needle) - 1)
        if at >= 0:
            return pos + at
        end = pos
        if stale is not None and stale():
            return None
    return None
