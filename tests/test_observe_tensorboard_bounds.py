"""The TensorBoard reader's bounds (issue 30 items 1 and 2): a record over the limit is stepped over unread,
with one line naming the file, its byte and its size; reading resumes at the cursor's byte, whatever the
number of files followed, never re-reading a file from its top."""

from __future__ import annotations

import os
import resource
import struct
from pathlib import Path

import google_crc32c
import pytest
from support import series
from test_observe_tensorboard import event_files, ingest, summary_writer

from engine.observe import register_source
from engine.observe.tfrecord import MAX_RECORD, masked
from engine.store import Store

pytestmark = pytest.mark.slow


def scalars(logdir: Path, steps: range, tag: str = "train/loss") -> Path:
    """An event file of one scalar a step, as torch's SummaryWriter writes it."""
    writer = summary_writer(logdir)
    for step in steps:
        writer.add_scalar(tag, step / 10, step)
    writer.close()
    [file] = event_files(logdir)
    return file


def records_after_the_first(file: Path) -> bytes:
    """A file's bytes without its first record (the file version every writer starts with)."""
    data = file.read_bytes()
    (length,) = struct.unpack_from("<Q", data)
    return data[16 + length :]


def header(length: int) -> bytes:
    """A record's header claiming `length` bytes, with the length's own CRC right."""
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked(google_crc32c.value(raw)))


def peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_record_claiming_two_gib_is_stepped_over_unread(store: Store, tmp_path: Path) -> None:
    """A header claiming 2 GiB over a sparse tail (the file really is that long): the reader steps over it
    by its length, says so in one line, and reads the records after it; it never holds the record."""
    file = scalars(tmp_path / "run", range(5))
    after = records_after_the_first(scalars(tmp_path / "more", range(5, 10)))
    claimed = 2 << 30
    with open(file, "ab") as f:
        at = f.tell()
        f.write(header(claimed))
    os.truncate(file, at + 12 + claimed + 4)  # the body and its CRC: a hole, no disk used
    with open(file, "ab") as f:
        f.write(after)

    before = peak_rss_kib()
    source_id = register_source(store, tmp_path / "run", follow=False)
    result = ingest(store, source_id)
    assert result.caught_up and result.rows == 10
    [problem] = result.problems
    assert problem == (
        f"{file.name}: record 7 (byte {at}): {claimed + 16:,} bytes, over the limit of {MAX_RECORD:,};"
        " skipped unread"
    )
    assert series(store, result.run_ids[0], "loss") == {step: pytest.approx(step / 10) for step in range(10)}
    assert peak_rss_kib() - before < 256 * 1024  # the tensorboard stub held the whole record: 8.5 GB


def test_a_text_over_the_limit_is_skipped_and_the_run_goes_on(store: Store, tmp_path: Path) -> None:
    """A valid 20 MB `add_text` record (the stub took 24 s over its CRC in Python): one line, unread."""
    writer = summary_writer(tmp_path / "run")
    writer.add_scalar("train/loss", 0.5, 0)
    writer.add_text("notes", "x" * (20 << 20), 0)
    writer.add_scalar("train/loss", 0.25, 1)
    writer.close()
    source_id = register_source(store, tmp_path / "run", follow=False)
    result = ingest(store, source_id)
    assert result.rows == 2
    [problem] = result.problems
    assert "record 3 (byte " in problem and "over the limit of 16,777,216; skipped unread" in problem


def test_reading_resumes_at_the_cursor_in_each_of_many_files(store: Store, tmp_path: Path) -> None:
    """Twenty followed files (more than the sixteen readers the stub-based reader kept open): each batch
    reads each file from the byte its cursor keeps. The bytes before the cursor are overwritten with zeros in
    place (same file, same size) before the files grow: a reader that went back to the top would stop there
    as damaged."""
    runs = 20
    files = [scalars(tmp_path / "sweep" / f"r{n:02}", range(50), tag=f"train/r{n}") for n in range(runs)]
    more = [
        records_after_the_first(scalars(tmp_path / "more" / f"r{n:02}", range(50, 60), tag=f"train/r{n}"))
        for n in range(runs)
    ]
    source_id = register_source(store, tmp_path / "sweep", follow=True)
    first = ingest(store, source_id)
    assert first.caught_up and first.rows == runs * 50 and first.problems == []

    for file, tail in zip(files, more, strict=True):
        size = file.stat().st_size
        with open(file, "r+b") as f:
            f.write(bytes(size))
        with open(file, "ab") as f:
            f.write(tail)
    second = ingest(store, source_id)
    assert second.caught_up and second.problems == [] and second.rows == runs * 10
    for n, run_id in enumerate(sorted(first.run_ids)):
        assert len(series(store, run_id, f"r{n}")) == 60
