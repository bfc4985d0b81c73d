"""What went wrong, found in a console's bytes: Python tracebacks, CUDA out of memory, NCCL errors.

A traceback is a line holding `Traceback (most recent call last):` and the lines after it: its frames are
indented, and its first line that is not is the exception (`RuntimeError: CUDA error: ...`), which is what
the finding says. Text before `Traceback` on its line (`[rank1]: ` of torchrun, `(WorkerDict pid=12) ` of Ray)
is a prefix every line of the block repeats; it is taken off. A traceback whose exception is an out-of-memory
or an NCCL error is of that kind. Outside a traceback, a line saying `CUDA out of memory` (or
`OutOfMemoryError`) is an `oom`, and a line with an NCCL error (`NCCL error`, `ncclSystemError`, ..., or
ProcessGroupNCCL's watchdog timing out a collective) an `nccl`. `NCCL WARN` lines are not errors.

`find_problems` reads a buffer that starts at a line start and says how far it is done: a traceback whose
exception line has not been written yet is read again, whole, from its first line next time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

TRACEBACK = b"Traceback (most recent call last):"
OOM_LINE = re.compile(
    rb"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|MPS backend out of memory"
)
NCCL_LINE = re.compile(rb"NCCL error|nccl[A-Z][A-Za-z]*Error|Watchdog caught collective operation timeout")
# Where a problem can be: each is looked for with bytes.find, which reads a gigabyte in a fraction of a second
# (one regex of the alternatives above reads it ten times slower); the line around each is then classified.
ANCHORS = (TRACEBACK, b"out of memory", b"OutOfMemoryError", b"NCCL error", b"nccl", b"Watchdog caught")
TAG = re.compile(rb"\s*(\[[^\]]*\]|\([^)]*\))\s*:?\s*")  # `[rank1]: `, `(WorkerDict pid=12) `: on every line
MAX_PREFIX = 120  # bytes before `Traceback` on its line that can be a prefix of the block's lines
MAX_BLOCK_BYTES = 256 * 1024  # a traceback with no exception line within this is taken as it is
MAX_LINE_CHARS = 500  # of the line a finding keeps
KINDS = {"traceback": "traceback", "oom": "CUDA out of memory", "nccl": "NCCL error"}


class Problem(NamedTuple):
    kind: str  # traceback | oom | nccl
    offset: int  # the first byte of its first line
    end: int  # the byte after its last line
    line: str  # what went wrong: the exception line, or the error line


def classify(line: bytes) -> str | None:
    if OOM_LINE.search(line):
        return "oom"
    if NCCL_LINE.search(line):
        return "nccl"
    return None


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").strip()[:MAX_LINE_CHARS]


def find_problems(buf: bytes, base: int = 0, *, final: bool = False) -> tuple[list[Problem], int]:
    """The problems whose first line is in `buf` (a file's bytes from offset `base`, which starts a line),
    and the offset up to which the buffer is done: the end of its last whole line, or the first line of a
    traceback still being written. With `final` the buffer is all there is: its last line counts though no
    newline ends it, and a traceback without its exception line is taken as it is."""
    limit = len(buf) if final else buf.rfind(b"\n") + 1
    if limit == 0:
        return [], base  # not one whole line yet
    found: list[Problem] = []
    done = 0  # bytes of buf read as part of a problem
    for at, anchor in _anchors(buf, limit):
        if at < done:
            continue  # inside a traceback already read, or on a line already classified
        first = buf.rfind(b"\n", 0, at) + 1
        end = buf.find(b"\n", at, limit)
        end = limit if end < 0 else end
        if anchor == TRACEBACK or (tb := buf.find(TRACEBACK, first, end)) >= 0:
            block = _traceback(buf, first, at if anchor == TRACEBACK else tb, end, limit, final)
            if block is None:
                return found, base + first  # its exception line is not written yet: read it again later
            kind, after, line = block
            found.append(Problem(kind, base + first, base + after, line))
            done = after
        else:
            raw_line = buf[first:end]
            line_kind = classify(raw_line)
            if line_kind is not None:
                found.append(Problem(line_kind, base + first, base + min(end + 1, limit), _text(raw_line)))
            done = end + 1
    return found, base + limit


def _anchors(buf: bytes, limit: int) -> Iterator[tuple[int, bytes]]:
    """Where each anchor is in buf[:limit], in order (each found again past its last place)."""
    places = {anchor: buf.find(anchor, 0, limit) for anchor in ANCHORS}
    while True:
        live = [(at, anchor) for anchor, at in places.items() if at >= 0]
        if not live:
            return
        at, anchor = min(live)
        yield at, anchor
        places[anchor] = buf.find(anchor, at + 1, limit)


def _traceback(
    buf: bytes, first: int, at: int, end: int, limit: int, final: bool
) -> tuple[str, int, str] | None:
    """(kind, the byte after its exception line, the exception line) of the traceback whose first line is at
    `first` (`Traceback` at `at`, its line ending at `end`); None when the buffer ends before its exception
    line (unless `final`)."""
    prefix = buf[first:at] if at - first <= MAX_PREFIX else b""
    # A tag ([rank1]: ) is on every line of the block, and lines without it are another writer's; other text
    # before `Traceback` (a logger's) is taken for a prefix only when the next line repeats it.
    checked = not prefix or TAG.fullmatch(prefix) is not None
    pos = end + 1
    while pos < limit:
        if pos - first > MAX_BLOCK_BYTES:
            return "traceback", pos, "Traceback (no exception line in its first 256 KB)"
        stop = buf.find(b"\n", pos, limit)
        stop = limit if stop < 0 else stop
        line = buf[pos:stop]
        if not checked:
            checked = True
            if not line.startswith(prefix):
                prefix = b""  # a prefix of its first line only (a logger's), not of the block
        if prefix:
            if not line.startswith(prefix):
                pos = stop + 1  # another writer's line in between (another rank): not the block's
                continue
            line = line[len(prefix) :]
        if line.strip() and line[:1] not in (b" ", b"\t"):
            return classify(line) or "traceback", min(stop + 1, limit), _text(line)
        pos = stop + 1
    if final:
        return "traceback", limit, "Traceback (its exception line is not in the file)"
    return None
