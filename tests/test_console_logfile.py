"""A log file read by offsets (engine/console/): the line index over a big file, a line's text (every byte
shown), following a file that grows, is truncated or replaced, a FIFO refused, search, and the tracebacks,
CUDA out-of-memory and NCCL errors found in it. Real files in a temporary directory; the reader is driven as
the log view's thread drives it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from engine.console.log_reader import TAIL_BYTES, TAIL_FIRST, Failed, Found, Grew, LogReader, Opened, Progress
from engine.console.logfile import (
    BLOCK,
    SHOWN_BYTES,
    LineIndex,
    LogFile,
    LogFileError,
    Pattern,
    read_line,
    search,
    shown_text,
)
from engine.console.problems import Problem, find_problems

TRACEBACK = (
    b"Traceback (most recent call last):\n"
    b'  File "train.py", line 12, in <module>\n'
    b"    trainer.train()\n"
    b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
)


def line(i: int) -> bytes:
    return f"step {i} loss={1 / (i + 1):.6f} reward={i % 7 / 7:.4f}\n".encode()


def write_lines(path: Path, n: int, *, start: int = 0, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(b"".join(line(i) for i in range(start, start + n)))


def settle(reader: LogReader, until: type, tries: int = 200) -> list:
    """Answers until one of type `until` comes (the reader's thread would post each)."""
    seen: list = []
    for _ in range(tries):
        got = reader.answer(timeout=0.01)
        seen += got
        if any(isinstance(r, until) and (until is not Opened or r.whole) for r in got):
            return seen
    raise AssertionError(f"no {until.__name__} in {seen}")


def text_of(opened: Opened, i: int, end: int | None = None) -> str:
    text, note = read_line(opened.file, opened.index, i, opened.end if end is None else end)
    return text + note


# -- the index -----------------------------------------------------------------------------------------------


def test_the_index_of_a_big_file_reads_any_line_at_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    n = 3 * BLOCK + 123  # more than one block of newline offsets
    write_lines(path, n)
    with LogFile.open(path) as f:
        index = LineIndex()
        index.scan(f, f.size(), chunk=64 * 1024)  # many chunks: lines cut across chunk ends
        assert index.count() == n and index.newlines == n
        lines = path.read_bytes().split(b"\n")
        for i in (0, 1, BLOCK - 1, BLOCK, 2 * BLOCK + 5, n - 1):
            first, last = index.span(i)
            assert f.read(first, last - first) == lines[i]
            assert index.line_of(first) == i and index.line_of(last) == i  # its newline is its own
        assert index.number(n - 1) == n
        assert index.nbytes == 4 * BLOCK * 8  # 8 bytes a line, in whole blocks: never the file


def test_a_line_not_ended_yet_is_a_line_and_grows(tmp_path: Path) -> None:
    path = tmp_path / "growing.log"
    path.write_bytes(b"one\ntwo\nthr")
    with LogFile.open(path) as f:
        index = LineIndex()
        index.scan(f, f.size())
        assert index.count() == 3 and index.span(2) == (8, 11)
        with open(path, "ab") as out:
            out.write(b"ee\nfour\n")
        index.scan(f, f.size())
        assert index.count() == 4
        first, last = index.span(2)
        assert f.read(first, last - first) == b"three"
        assert index.count(end=11, newlines=2) == 3  # what a view told of the earlier size still holds


def test_every_byte_is_shown_as_text(tmp_path: Path) -> None:
    path = tmp_path / "hostile.log"
    long = b"x" * (10 * 1024 * 1024)
    path.write_bytes(
        b"\x1b[31mred\x1b[0m \x1b]52;c;ZXZpbA==\x07 \xc2\x9b2J \x9b\r\n"  # colour, clipboard, C1 CSI; CRLF
        + b"bad \xff\xfe utf-8\tand a tab\n"
        + long
        + b"\nafter\n"
    )
    with LogFile.open(path) as f:
        index = LineIndex()
        index.scan(f, f.size())
        opened = Opened(index, f, index.count(), f.size(), whole=True)
        first = text_of(opened, 0)
        assert (
            first == "\\x1b[31mred\\x1b[0m \\x1b]52;c;ZXZpbA==\\x07 \\x9b2J \ufffd"
        )  # a lone 0x9b: not UTF-8
        assert text_of(opened, 1) == "bad \ufffd\ufffd utf-8    and a tab"  # to the next tab stop
        started = time.perf_counter()
        cut = text_of(opened, 2)
        assert time.perf_counter() - started < 1.0  # a 10 MB line is read up to SHOWN_BYTES, never whole
        assert cut.startswith("x" * SHOWN_BYTES) and cut.endswith("(cut: the line is 10,485,760 bytes)")
        assert text_of(opened, 3) == "after"
    assert shown_text(b"\x00\x07\x7f", 3) == ("\\x00\\x07\\x7f", "")


def test_a_fifo_a_directory_and_a_missing_file_are_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, said in (
        (fifo, "a FIFO (named pipe), not a regular file"),
        (tmp_path, "a directory, not a regular file"),
        (tmp_path / "nope.log", "no such file or directory"),
    ):
        with pytest.raises(LogFileError) as caught:
            LogFile.open(path)
        assert said in str(caught.value) and "\n" not in str(caught.value)
        reader = LogReader(path)
        failed = reader.answer(timeout=0.01)
        assert [type(r) for r in failed] == [Failed] and said in failed[0].error  # never a hang
        assert reader.answer(timeout=0.01) == []  # said once; tried again later


# -- the reader: opening, following, truncation and rotation -------------------------------------------------


def test_a_big_file_shows_its_end_first_then_the_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    n = (TAIL_FIRST // len(line(0))) * 2  # about twice the size from which the end comes first
    write_lines(path, n)
    reader = LogReader(path)
    first = reader.answer(timeout=0.01)
    tail = first[0]
    assert isinstance(tail, Opened) and not tail.whole and tail.index.first_number is None
    assert tail.end == path.stat().st_size and text_of(tail, tail.count - 1) == line(n - 1).decode().strip()
    assert tail.index.start >= tail.end - TAIL_BYTES  # only its end was read
    assert any(isinstance(r, Progress) for r in first)
    assert reader.answer(timeout=0.01) == []  # the whole index waits for the view to draw the end ...
    reader.view_ready.set()  # ... which it says once it has
    whole = [r for r in settle(reader, Opened) if isinstance(r, Opened)][-1]
    assert whole.whole and whole.count == n and whole.index.number(n - 1) == n
    assert text_of(whole, 0) == line(0).decode().strip()
    assert whole.index.line_of(tail.index.start) == n - tail.count  # where the view keeps its place
    reader.close()


def test_following_a_file_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    write_lines(path, 10)
    reader = LogReader(path, follow_s=0.0)
    opened = settle(reader, Opened)[-1]
    assert opened.count == 10
    with open(path, "ab") as f:
        f.write(line(10) + b"step 11 half")  # a line being written
    grew = [r for r in settle(reader, Grew) if isinstance(r, Grew)][-1]
    assert grew.count == 12 and text_of(opened, 11, grew.end) == "step 11 half"
    with open(path, "ab") as f:
        f.write(b" done\n")
    grew = [r for r in settle(reader, Grew) if isinstance(r, Grew)][-1]
    assert grew.count == 12 and text_of(opened, 11, grew.end) == "step 11 half done"
    reader.close()


def test_a_truncated_file_and_a_rotated_file_are_read_again_and_said_so(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    write_lines(path, 50)
    reader = LogReader(path, follow_s=0.0)
    settle(reader, Opened)
    path.write_bytes(line(0))  # truncated (copytruncate)
    again = [r for r in settle(reader, Opened) if isinstance(r, Opened)][-1]
    assert again.count == 1 and again.note == "the file was truncated: read again from its start"

    with open(path, "ab") as f:
        f.write(line(1))
    path.rename(tmp_path / "train.log.1")  # rotated: moved away, then a new file
    write_lines(path, 3, start=100)
    results = settle(reader, Opened)
    grew = [r for r in results if isinstance(r, Grew)]
    assert grew and grew[0].count == 2  # what was written to the old file first
    new = [r for r in results if isinstance(r, Opened)][-1]
    assert new.count == 3 and "replaced (rotated)" in new.note
    assert text_of(new, 0) == line(100).decode().strip()
    reader.close()


# -- search and problems ------------------------------------------------------------------------------------


def test_search_forward_backward_wrapping_and_smart_case(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    with open(path, "wb") as f:
        for i in range(2000):
            f.write(line(i) if i not in (150, 1700) else b"WARNING: Reward is NaN here\n")
    reader = LogReader(path)
    settle(reader, Opened)
    want = [
        ((lambda: reader.want_search("reward is nan", 0, forward=True)), 150, ""),
        ((lambda: reader.want_search("reward is nan", 150, forward=True)), 1700, ""),
        (
            (lambda: reader.want_search("reward is nan", 1700, forward=True)),
            150,
            "search went on from the top",
        ),
        ((lambda: reader.want_search("reward is nan", 1700, forward=False)), 150, ""),
        ((lambda: reader.want_search("Reward is", 1999, forward=False)), 1700, ""),
        (
            (lambda: reader.want_search("REWARD", 0, forward=True)),
            None,
            "not found: REWARD",
        ),  # a capital: exact
    ]
    for ask, at, note in want:
        generation = ask()
        found = [r for r in settle(reader, Found) if isinstance(r, Found)]
        assert found == [Found(generation, at, note)]
    with LogFile.open(path) as f:  # a match across two chunks is found: they overlap by its length
        size = f.size()
        needle = Pattern.of("reward is nan")
        hit = search(f, needle, 0, size, forward=True)
        assert hit is not None and search(f, needle, hit - 5, size, forward=True) == hit
    reader.close()


def test_a_newer_search_stops_an_older_one(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    write_lines(path, 1000)
    reader = LogReader(path)
    settle(reader, Opened)
    reader.want_search("nowhere", 0, forward=True)
    newest = reader.want_search("step 500 ", 0, forward=True)
    found = [r for r in settle(reader, Found) if isinstance(r, Found)]
    assert found == [Found(newest, 500, "")]  # the older one is not answered at all
    reader.close()


def test_jumps_to_the_next_and_previous_traceback(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    parts = [line(i) for i in range(100)]
    parts.insert(20, TRACEBACK)  # lines 20-23
    parts.insert(60, b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    parts.insert(
        80, b"[rank1]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed\n"
    )
    path.write_bytes(b"".join(parts))
    reader = LogReader(path)
    settle(reader, Opened)
    steps = [
        (0, True, 20, "traceback: RuntimeError: CUDA error: an illegal memory access was encountered"),
        (
            20,
            True,
            63,
            "CUDA out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (63, True, 83, "NCCL error: [rank1]: ncclSystemError: System call (e.g. socket, malloc) or external"),
        (83, True, None, "no traceback, OOM or NCCL error below"),
        (83, False, 63, "CUDA out of memory"),
        (63, False, 20, "traceback: RuntimeError"),
        (20, False, None, "no traceback, OOM or NCCL error above"),
    ]
    for here, forward, at, note in steps:
        generation = reader.want_problem(here, forward=forward)
        (found,) = [r for r in settle(reader, Found) if isinstance(r, Found)]
        assert found.generation == generation and found.line == at and found.note.startswith(note), found
    reader.close()


def test_problems_found_in_bytes() -> None:
    text = (
        b"step 1\n"
        + b"[rank0]: Traceback (most recent call last):\n"
        + b"[rank1]: step 2 (another rank, in between)\n"
        + b'[rank0]:   File "grpo.py", line 9, in step\n'
        + b"[rank0]: RuntimeError: CUDA error: out of memory\n"
        + b"NCCL WARN NET/IB : No device found.\n"  # a warning: not an error
        + b"libnccl.so.2 loaded\n"
        + b"2024-05-01 ERROR Traceback (most recent call last):\n"  # a logger's prefix on its first line only
        + b'  File "x.py", line 1, in <module>\n'
        + b"ValueError: first\n"
        + b"\nDuring handling of the above exception, another exception occurred:\n\n"
        + b"Traceback (most recent call last):\n"
        + b'  File "x.py", line 3, in <module>\n'
        + b"KeyError: 'second'\n"
        + b"[E ProcessGroupNCCL.cpp:1316] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL\n"
    )
    found, done = find_problems(text, 1000)
    assert done == 1000 + len(text)
    assert [(p.kind, p.line) for p in found] == [
        ("oom", "RuntimeError: CUDA error: out of memory"),
        ("traceback", "ValueError: first"),
        ("traceback", "KeyError: 'second'"),
        (
            "nccl",
            "[E ProcessGroupNCCL.cpp:1316] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL",
        ),
    ]
    assert found[0].offset == 1000 + len(b"step 1\n")
    # A traceback still being written is read again, whole, from its first line; `final` takes it as it is.
    open_block = b"ok\n" + TRACEBACK[:60]
    found, done = find_problems(open_block, 0)
    assert found == [] and done == 3
    found, done = find_problems(open_block, 0, final=True)
    assert found == [
        Problem("traceback", 3, len(open_block), "Traceback (its exception line is not in the file)")
    ]
    assert find_problems(b"no newline yet", 0) == ([], 0)


def test_a_gigabyte_of_index_costs_eight_bytes_a_line(tmp_path: Path) -> None:
    """The index is offsets only: its memory follows the lines, not the bytes (a 10 MB line costs 8)."""
    path = tmp_path / "wide.log"
    with open(path, "wb") as f:
        for _ in range(4):
            f.write(b"y" * (4 << 20) + b"\n")
    with LogFile.open(path) as f:
        index = LineIndex()
        index.scan(f, f.size())
        assert index.count() == 4 and index.nbytes == BLOCK * 8
        assert np.all(np.diff([index.newline(i) for i in range(4)]) == (4 << 20) + 1)
