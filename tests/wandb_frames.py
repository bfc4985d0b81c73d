"""A `.wandb` file written the way wandb's own writer frames it (core/pkg/leveldb/record.go, `Writer`): the
tests' and the hostile suite's writer of records, since wandb 0.30 has no Python writer either. `frame` puts
in a file what `Writer.Next`/`Write`/`Close` put there for each record; files the real wandb wrote are the
same bytes (tests/test_wandb_log.py)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

BLOCK = 32 * 1024
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def chunk(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IHB", zlib.crc32(bytes([kind]) + payload), len(payload), kind) + payload


def frame(records: Iterable[bytes], header: bytes = HEADER) -> bytes:
    """The file: the header, then each record cut into chunks at block ends; a block tail too short for a
    chunk header is zeros."""
    out = bytearray(header)
    for record in records:
        first = True
        rest = record
        while True:
            room = BLOCK - len(out) % BLOCK
            if room < 7:
                out += b"\x00" * room
                room = BLOCK
            piece, rest = rest[: room - 7], rest[room - 7 :]
            last = not rest
            kind = (FULL if last else FIRST) if first else (LAST if last else MIDDLE)
            out += chunk(kind, piece)
            first = False
            if last:
                break
    return bytes(out)


def write(path: Path, records: Iterable[bytes]) -> Path:
    path.write_bytes(frame(records))
    return path


def starts(records: list[bytes]) -> list[int]:
    """Where each record of `frame(records)` begins."""
    offsets, size = [], len(HEADER)
    for record in records:
        if BLOCK - size % BLOCK < 7:
            size += BLOCK - size % BLOCK
        offsets.append(size)
        size = _after(size, record)
    return offsets


def _after(size: int, record: bytes) -> int:
    rest = len(record)
    while True:
        room = BLOCK - size % BLOCK
        if room < 7:
            size += room
            room = BLOCK
        piece = min(rest, room - 7)
        size += 7 + piece
        rest -= piece
        if rest == 0:
            return size
