"""TFRecord framing, as TensorBoard event files are written: our reader, which starts at a byte offset and
never reads a record over MAX_RECORD.

Each record is `uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of the
data`, little-endian, the mask being `((crc >> 15) | (crc << 17)) + 0xa282ead8` (tensorflow's
core/lib/io/record_reader.cc and core/lib/hash/crc32c.h; tensorboard's stub reader `PyRecordReader` in
tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py reads the same). The CRC-32C is google-crc32c's
(Google's C implementation; tensorboard's stub computes it in pure Python at about 1 MB/s).

Why not tensorboard's stub: it reads every record whole, however long its header says it is (a header
claiming 2 GiB over a sparse file held 8.5 GB), it cannot start at an offset (a reader reopened re-read its
file from record 0: more than 16 growing files never caught up), and it checks each CRC in Python.

`Records(f, offset, size)` yields `(offset, data)` for each whole record from `offset` up to `size` (what was
written when the file was opened), `(offset, Oversized)` for a record whose length is over MAX_RECORD
(stepped over by its length, never read), and stops. Afterwards `offset` is where to go on and `stopped`
says why: "end" (every byte read), "cut" (a record not wholly written yet: wait for it), "damaged" (a CRC
that does not match: the framing cannot be trusted past it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

HEADER = struct.Struct("<QI")  # length, masked CRC-32C of the length's 8 bytes
FOOTER = struct.Struct("<I")  # masked CRC-32C of the data
OVERHEAD = HEADER.size + FOOTER.size  # 16 bytes a record besides its data
MAX_RECORD = 16 << 20  # bytes of one record read; a longer one is skipped with one line, unread
MASK_DELTA = 0xA282EAD8


@dataclass(frozen=True)
class Oversized:
    """A record over MAX_RECORD, stepped over."""

    length: int


def crc32c_api() -> Callable[[bytes], int]:
    """google-crc32c's `value`, or ImportError when the extra is missing."""
    import google_crc32c

    return google_crc32c.value


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


class Records:
    """The records of one event file from `offset` to `size`; see the module's docstring."""

    def __init__(self, f: BinaryIO, offset: int, size: int) -> None:
        self.f, self.offset, self.size = f, offset, size
        self.stopped = "end"
        self.crc32c = crc32c_api()

    def __iter__(self) -> Iterator[tuple[int, bytes | Oversized]]:
        f, size, crc32c = self.f, self.size, self.crc32c
        unpack_header, unpack_footer = HEADER.unpack, FOOTER.unpack
        f.seek(self.offset)
        while True:
            start = self.offset
            if start + HEADER.size > size:
                self.stopped = "end" if start == size else "cut"
                return
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:  # the file shrank since it was measured
                self.stopped = "cut"
                return
            length, length_crc = unpack_header(head)
            if masked(crc32c(head[:8])) != length_crc:
                self.stopped = "damaged"
                return
            end = start + OVERHEAD + length
            if length > MAX_RECORD:
                if end > size:
                    self.stopped = "cut"  # stepped over once it is all there, never read
                    return
                f.seek(end)
                self.offset = end
                yield start, Oversized(length)
                continue
            if end > size:
                self.stopped = "cut"
                return
            body = f.read(length + FOOTER.size)
            if len(body) < length + FOOTER.size:
                self.stopped = "cut"
                return
            data = body[:length]
            (data_crc,) = unpack_footer(body[length:])
            if masked(crc32c(data)) != data_crc:
                self.stopped = "damaged"
                return
            self.offset = end
            yield start, data
