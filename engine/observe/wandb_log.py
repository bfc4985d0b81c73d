"""The framing of a W&B run file (`run-<id>.wandb`), read by our own code: whole records as bytes, from an
offset on, in a file that may still be growing.

wandb 0.30 removed its Python reader of this framing (`wandb/sdk/internal/datastore.py`); the record
protobufs still ship (`wandb.proto.wandb_internal_pb2.Record`), so wandb_run.py parses what this module
frames with whatever wandb is installed. The format, as wandb's Go reader documents it
(`core/pkg/leveldb/record.go`, read at wandb commit b6e29505; docs/reference/frameworks.md §6):

- a 7-byte file header: `:W&B`, the magic 0xBEE1 as a little-endian uint16, the version 0;
- then LevelDB log blocks of 32 KiB, counted from the start of the file (so the first one holds 7 bytes
  less); a chunk never crosses a block, and a block tail shorter than a chunk header is zeros;
- each chunk: a CRC-32 (IEEE, as zlib computes it: not CRC32C, not masked) of its type byte and payload
  (uint32 little-endian), the payload length (uint16 little-endian), the type (1 FULL, 2 FIRST, 3 MIDDLE,
  4 LAST), the payload; a record is one FULL chunk, or FIRST, any MIDDLEs and a LAST;
- on a damaged chunk (a bad checksum, a length past its block, an unknown type) a reader goes on at the
  next block, skipping the pieces of a record that crossed into it, up to the next FULL or FIRST chunk.

Bounded: at most MAX_RECORD bytes of a record are held; a longer one is skipped, its remaining chunks
stepped over by their headers alone (their payloads are not read), and told once with its offset and size.
The reader stops at the end of what was written when it started (a chunk or record still being written is
read again, whole, later), and, inside a skipped record, when its deadline passes; `offset`, `resync` and
`skip` then say where to go on, for the caller's cursor.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import BinaryIO

FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
IDENT = b":W&B"
MAGIC = 0xBEE1
VERSION = 0
HEADER_LEN = 7  # the file header, and each chunk header too
BLOCK = 32 * 1024
MASK = BLOCK - 1
CHUNK = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_RECORD = 16 << 20  # bytes of one record held at most; a longer one is skipped
READ_SIZE = 32 * BLOCK  # bytes read from the file at a time (whole blocks)
SKIP_CHECK = 256  # chunks stepped over between two looks at the clock


def header_problem(head: bytes) -> str | None:
    """Why a file's first 7 bytes are not a W&B header this reader reads, in words; None when they are."""
    ident, magic, version = FILE_HEADER.unpack(head[:HEADER_LEN])
    if ident != IDENT or magic != MAGIC:
        return "not a W&B run file"
    if version != VERSION:
        return f"log format version {version}, but carl reads version {VERSION} (written by a newer wandb?)"
    return None


@dataclass(frozen=True)
class Damaged:
    """A chunk that fails its checks at `offset`: reading goes on at the next block."""

    offset: int
    reason: str


@dataclass(frozen=True)
class Oversized:
    """A record longer than MAX_RECORD that began at `offset`, `size` payload bytes long: skipped."""

    offset: int
    size: int


class RecordLog:
    """Whole records of one run file from `offset` (a record's first chunk, or the file header's end) to the
    end of the file as it was when `size` was taken.

    Iterating yields (offset where the record begins, its bytes), (offset, Damaged) for a damaged chunk
    (once per damaged stretch: `resync` is then set until a record reads whole again), and (offset,
    Oversized) for a record skipped for its length. Afterwards `offset` is where to go on (the start of a
    record not wholly written yet, or the end), `stopped` says why it stopped ("end", "partial": a record or
    chunk cut off by the end of what was written, "deadline": inside a skipped record), and `skip` is (start,
    bytes so far) while inside a skipped record.
    """

    def __init__(
        self,
        f: BinaryIO,
        size: int,
        offset: int,
        *,
        resync: bool = False,
        skip: tuple[int, int] | None = None,
        deadline: float | None = None,
    ) -> None:
        self.f, self.size = f, size
        self.offset = max(offset, HEADER_LEN)
        self.resync = resync
        self.skip = skip
        self.deadline = deadline
        self.stopped = "end"
        self.buf = b""
        self.base = 0  # the file offset of buf[0]

    def _load(self, pos: int) -> None:
        """Read whole blocks from the one holding `pos` (the last one as far as `size`)."""
        base = pos - pos % BLOCK
        self.f.seek(base)
        self.buf = self.f.read(min(READ_SIZE, self.size - base))
        self.base = base

    def __iter__(self) -> Iterator[tuple[int, bytes | Damaged | Oversized]]:
        size, crc32, unpack = self.size, zlib.crc32, CHUNK.unpack_from
        pos = self.offset
        if self.skip is not None:
            pos = yield from self._skip_rest(pos)
            if self.skip is not None:
                return
        start = pos  # where the record being put together began
        parts: list[bytes] = []
        held = 0
        self._load(pos)
        buf, base = self.buf, self.base
        view, filled = memoryview(buf), len(buf)
        while True:
            room = BLOCK - (pos & MASK)
            if room < HEADER_LEN:  # the block's zero tail (not checked, as wandb's reader does not)
                if pos + room > size:
                    break
                pos += room
                continue
            at = pos - base
            if at + HEADER_LEN > filled:
                if pos + HEADER_LEN > size:
                    break  # the end, or a chunk header still being written
                self._load(pos)
                buf, base, at = self.buf, self.base, pos - self.base
                view, filled = memoryview(buf), len(buf)
            checksum, length, kind = unpack(buf, at)
            stop = at + HEADER_LEN + length  # in buf
            # The common case first: a whole record in one chunk, within its block and what was read.
            if (
                kind == FULL
                and length < room - 6
                and stop <= filled
                and not parts
                and crc32(view[at + 6 : stop]) == checksum
            ):
                if self.resync:
                    self.resync = False
                self.offset = end = base + stop
                yield pos, buf[at + HEADER_LEN : stop]  # bytes: protobuf parses them faster than a view
                pos = start = end
                continue
            end = base + stop
            if HEADER_LEN + length > room:
                problem = f"a chunk of {length:,} bytes is longer than the rest of its block"
            elif end > size:
                break  # a chunk still being written
            elif checksum == 0 and length == 0 and kind == 0 and not parts:
                # Zeroed space (a preallocated file): on at the next block, as wandb's reader goes; at the
                # end of what was written it may yet be filled, so reading waits here.
                if pos + room >= size:
                    break
                pos = start = pos + room
                continue
            elif crc32(view[at + 6 : stop]) != checksum:
                problem = "checksum mismatch"
            elif kind in (FULL, FIRST):
                if parts:  # this chunk begins a record: the one being put together lost its end
                    yield start, Damaged(start, "a record's last part is missing")
                    parts, held = [], 0
                self.resync = False
                start = pos
                payload = buf[at + HEADER_LEN : stop]
                pos = end
                if kind == FULL:
                    self.offset = pos
                    yield start, payload
                    start = pos
                else:
                    parts, held = [payload], length
                continue
            elif kind in (MIDDLE, LAST):
                if not parts:
                    if self.resync:  # the rest of a record that crossed into this block: skipped quietly
                        pos = start = self.offset = end
                        continue
                    problem = "a piece of a record whose beginning is missing"
                else:
                    parts.append(buf[at + HEADER_LEN : stop])
                    held += length
                    pos = end
                    if kind == LAST:
                        data = b"".join(parts)
                        parts, held = [], 0
                        self.offset = pos
                        yield start, data
                        start = pos
                    elif held > MAX_RECORD:
                        parts, self.skip = [], (start, held)
                        pos = yield from self._skip_rest(pos)
                        if self.skip is not None:
                            return
                        start, held = pos, 0
                        self._load(pos)
                        buf, base = self.buf, self.base
                        view, filled = memoryview(buf), len(buf)
                    continue
            else:
                problem = f"unknown chunk type {kind}"
            # A damaged chunk: the record it is part of is lost; on at the next block.
            if not self.resync:
                self.resync = True
                yield (start if parts else pos), Damaged(pos, problem)
            parts, held = [], 0
            if pos + room > size:  # the next block is not written yet: wait here (`resync` says the rest)
                start = pos
                break
            pos = start = self.offset = pos + room
        self.offset = start
        self.stopped = "partial" if start < size else "end"

    def _skip_rest(self, pos: int) -> Generator[tuple[int, Oversized], None, int]:
        """Step over the rest of an oversized record by its chunk headers alone (read from the file, not
        into the buffer: the payloads are never read). Returns where reading goes on; `skip` stays set when
        it stopped first (at the end of what was written, or at the deadline)."""
        assert self.skip is not None
        start, held = self.skip
        f, size = self.f, self.size
        steps = 0
        while True:
            room = BLOCK - pos % BLOCK
            if room < HEADER_LEN:
                if pos + room > size:
                    break
                pos += room
                continue
            if pos + HEADER_LEN > size:
                break
            steps += 1
            if steps % SKIP_CHECK == 0 and self.deadline is not None and time.monotonic() > self.deadline:
                self.offset, self.skip, self.stopped = pos, (start, held), "deadline"
                return pos
            f.seek(pos)
            _, length, kind = CHUNK.unpack(f.read(HEADER_LEN))
            end = pos + HEADER_LEN + length
            if HEADER_LEN + length > room or kind not in (MIDDLE, LAST):
                break_off = True  # not the rest of this record: it ends here; reading goes on at this chunk
            else:
                if end > size:
                    break
                held += length
                pos = end
                break_off = kind == LAST
            if break_off:
                self.skip = None
                self.offset = pos
                yield start, Oversized(start, held)
                return pos
        self.offset, self.skip, self.stopped = pos, (start, held), "partial"
        return pos
