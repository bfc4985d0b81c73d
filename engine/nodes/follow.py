"""Following a log file on a node: its new bytes, as text lines, a bounded chunk at a time.

Each `read()` looks at the file once and returns at most MAX_CONSOLE_BYTES of whole lines (a line longer than
MAX_LINE_BYTES comes in pieces; a last line without its newline waits PARTIAL_WAIT_S for the rest, then goes
as it is), or None when there is nothing new. Bytes that are not UTF-8 become U+FFFD; escape sequences stay as
they are (the engine keeps them, the log view shows them as text). A file renamed away and replaced (log
rotation) is read to its end before the new one is followed from its start; a file cut shorter (truncated) is
followed from its start again. A FIFO, a device or a socket is refused by type before it is opened: one line,
never a hang. Each chunk says where it came from (the file's identity and its byte range), so the node can
note how far it got and start there again after a restart.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from engine.errors import CarlError
from engine.files import kind_of, named, open_regular, reason

from .wire import MAX_CONSOLE_BYTES, MAX_CONSOLE_LINES, MAX_LINE_BYTES

FIRST_READ_MAX = 8 * 1024 * 1024  # a log met for the first time is sent from at most this far before its end
PARTIAL_WAIT_S = 2.0  # a last line without its newline is sent once it has sat this long


class FollowError(CarlError):
    """A log that cannot be followed now (missing, not a regular file, unreadable), in one line."""


@dataclass
class Chunk:
    identity: tuple[int, int]  # (device, inode) of the file the lines come from
    offset: int  # its byte offset of the first line
    end: int  # the byte after the last one
    lines: list[str] = field(default_factory=list)


@dataclass
class LogFollower:
    path: Path
    identity: tuple[int, int] | None = None  # of the file followed (from the node's saved state at start)
    offset: int = 0  # the next byte to read in it
    notes: list[str] = field(default_factory=list)  # what happened, one line each, for the node to say
    file: BinaryIO | None = None
    _tail: tuple[int, float] | None = None  # an unfinished last line: the file's size, and since when

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def read(self) -> Chunk | None:
        """The next chunk of whole lines, or None; FollowError when the file cannot be followed now."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self.close()
            raise FollowError(f"{named(self.path)}: {reason(exc)}") from None
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise FollowError(f"{named(self.path)}: {kind_of(st.st_mode)}, not a log file; not followed")
        identity = (st.st_dev, st.st_ino)
        if self.file is not None and identity != self.identity:
            chunk = self._chunk()  # rotated: the rest of the old file first
            if chunk is not None:
                return chunk
            self.close()
            self.notes.append(f"{named(self.path)}: rotated; following the new file from its start")
            self.identity, self.offset, self._tail = None, 0, None
        if self.file is None:
            self._open(identity, st.st_size)
        elif st.st_size < self.offset:
            self.notes.append(f"{named(self.path)}: truncated; following it from its start")
            self.offset, self._tail = 0, None
        return self._chunk()

    def _open(self, identity: tuple[int, int], size: int) -> None:
        self.file = open_regular(self.path, "log file", FollowError)
        if identity == self.identity and self.offset <= size:
            return  # where a previous `carl node` got to
        if self.identity is not None:
            self.notes.append(
                f"{named(self.path)}: not the file followed before; following it from its start"
            )
            self.offset = 0
        elif size > FIRST_READ_MAX:
            self.offset = self._line_start(size - FIRST_READ_MAX)
            self.notes.append(
                f"{named(self.path)}: its first {self.offset:,} bytes are not sent (only the last"
            )
            self.notes[-1] += f" {FIRST_READ_MAX // 2**20} MiB of a log met for the first time)"
        else:
            self.offset = 0
        self.identity, self._tail = identity, None

    def _line_start(self, at: int) -> int:
        """The offset of the first line that starts at or after `at`."""
        assert self.file is not None
        self.file.seek(at)
        while True:
            block = self.file.read(64 * 1024)
            if not block:
                return at
            newline = block.find(b"\n")
            if newline >= 0:
                return at + newline + 1
            at += len(block)

    def _chunk(self) -> Chunk | None:
        assert self.file is not None and self.identity is not None
        self.file.seek(self.offset)
        try:
            data = self.file.read(MAX_CONSOLE_BYTES)
        except OSError as exc:
            raise FollowError(f"{named(self.path)}: {reason(exc)}") from None
        if not data:
            self._tail = None
            return None
        cut = _cut(data)
        if cut == 0:  # one unfinished line
            if len(data) >= MAX_LINE_BYTES:
                cut = _char_boundary(data, MAX_LINE_BYTES)
            elif self._waited(len(data)):
                cut = len(data)
            else:
                return None
        self._tail = None
        body = data[:cut]
        raw_lines = body.split(b"\n")
        if raw_lines[-1] == b"":
            raw_lines.pop()
        lines = [
            piece.decode("utf-8", errors="replace").removesuffix("\r")
            for raw in raw_lines
            for piece in _pieces(raw)
        ]
        chunk = Chunk(self.identity, self.offset, self.offset + cut, lines)
        self.offset += cut
        return chunk

    def _waited(self, pending: int) -> bool:
        """Whether an unfinished last line has sat unchanged for PARTIAL_WAIT_S."""
        now = time.monotonic()
        if self._tail is None or self._tail[0] != pending:
            self._tail = (pending, now)
            return False
        return now - self._tail[1] >= PARTIAL_WAIT_S


def _cut(data: bytes) -> int:
    """How many bytes of `data` are whole lines making at most MAX_CONSOLE_LINES lines, long ones counted as
    the pieces they are cut in (0: no line ends here)."""
    end, count = 0, 0
    while True:
        newline = data.find(b"\n", end)
        if newline < 0:
            return end
        count += max(1, -(-(newline - end) // (MAX_LINE_BYTES - 3)))  # a piece ends where a character starts
        if count > MAX_CONSOLE_LINES:
            return end
        end = newline + 1


def _pieces(raw: bytes) -> list[bytes]:
    """A line of at most MAX_LINE_BYTES, or its pieces, each cut where a UTF-8 character starts."""
    out = []
    while len(raw) > MAX_LINE_BYTES:
        cut = _char_boundary(raw, MAX_LINE_BYTES)
        out.append(raw[:cut])
        raw = raw[cut:]
    out.append(raw)
    return out


def _char_boundary(data: bytes, at: int) -> int:
    """`at`, moved back (at most 3 bytes) to where a UTF-8 character starts."""
    if at >= len(data):
        return len(data)
    for cut in range(at, max(at - 3, 1) - 1, -1):
        if data[cut] & 0xC0 != 0x80:
            return cut
    return at
