"""The log view's reader thread, without Textual (tests and the bench drive it alone): Toolong's LineReader.

`LogReader` owns one log file. Its thread calls `answer()` in a loop; the view asks from the UI thread
(`want_search`, `want_problem`) through a queue, and applies what `answer` returns, in order:

- `Opened`: a document to show, with its own descriptor of the file (`LogFile.dup`) for the view to read
  lines with. A file larger than TAIL_FIRST is shown first by its last TAIL_BYTES (an index that does not
  know its line numbers); once the view says it drew that (`view_ready`), the whole file is indexed a chunk
  at a time (`Progress`); then the whole document comes, and the view keeps its place.
- `Grew`: the file grew and the new lines are indexed (the view follows, as `tail -f`, when at the bottom).
- `Opened` with a `note`: the file was truncated, or replaced (rotated): it is read again from its start.
- `Found`: where a search or a jump to a problem landed (a line of the current document), or why nowhere.
- `Failed`: the file cannot be read (missing, a FIFO, unreadable), one line; it is tried again now and then.

Searches and jumps run here, a chunk at a time, and one asked for later makes an earlier one stop.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .logfile import CHUNK, LineIndex, LogFile, LogFileError, Pattern, search
from .problems import KINDS, MAX_BLOCK_BYTES, find_problems

TAIL_FIRST = 8 << 20  # a larger file shows its end before its whole index is built
TAIL_BYTES = 1 << 20  # how much of its end
FOLLOW_S = 0.2  # how often a followed file is looked at
RETRY_S = 2.0  # how often a file that could not be read is tried again
VIEW_WAIT_S = 1.0  # the longest the whole index waits for the view to draw the file's end
GROW_BYTES = 64 << 20  # of a file grown a lot at once, indexed before requests are answered again


@dataclass(frozen=True)
class Opened:
    index: LineIndex
    file: LogFile  # the view's own descriptor: it closes it when the next document comes
    count: int
    end: int
    whole: bool  # False: the end of the file only, while the whole is indexed
    note: str = ""  # why it was opened again (truncated, rotated)


@dataclass(frozen=True)
class Grew:
    count: int
    end: int


@dataclass(frozen=True)
class Progress:
    done: int
    total: int


@dataclass(frozen=True)
class Found:
    generation: int
    line: int | None  # a line of the current document
    note: str  # what was found ("traceback: RuntimeError: ..."), or why nothing was


@dataclass(frozen=True)
class Failed:
    error: str


Result = Opened | Grew | Progress | Found | Failed


class LogReader:
    """Reads one log file for the view. `want_*` and `generation` are for the UI thread; the rest is the
    reader thread's."""

    def __init__(self, path: Path | str, *, follow_s: float = FOLLOW_S) -> None:
        self.path = Path(path)
        self.follow_s = follow_s
        self.requests: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.generation = 0  # of the newest search or jump asked for
        self.file: LogFile | None = None
        self.index: LineIndex | None = None  # the whole file's, while built and once whole
        self.whole = False
        self.shown_end = 0  # bytes of the file the view was told about
        self.waiting: list[tuple[Any, ...]] = []  # requests that need the whole index
        self.failed: str | None = None
        self.next_look = 0.0
        self._busy = 0  # the generation of the request being answered
        # Set by the view once it drew the file's end: the whole index is built after that (the GIL is shared:
        # indexing first would hold back the first screen), or after VIEW_WAIT_S whatever happens.
        self.view_ready = threading.Event()
        self.view_waited_until = 0.0

    # -- from the UI thread ----------------------------------------------------------------------------------

    def want_search(self, text: str, line: int, *, forward: bool) -> int:
        """The next (or previous) line after (before) `line` that holds `text`; returns its generation."""
        self.generation += 1
        self.requests.put(("search", self.generation, text, line, forward))
        return self.generation

    def want_problem(self, line: int, *, forward: bool) -> int:
        """The next (or previous) traceback, out-of-memory or NCCL error after (before) `line`."""
        self.generation += 1
        self.requests.put(("problem", self.generation, line, forward))
        return self.generation

    # -- the reader thread -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def answer(self, timeout: float | None = None) -> list[Result]:
        """Wait up to `timeout` (the follow period by default) for a request; answer what can be answered,
        index what is due and look at the file; what to apply, in order."""
        out: list[Result] = []
        if self.file is None:
            if time.monotonic() < self.next_look:
                time.sleep(min(self.follow_s, self.next_look - time.monotonic()))
                return out
            self._open(out, note="")
            return out  # the first screen before anything else
        if not self.whole:
            if not self.view_ready.is_set() and time.monotonic() < self.view_waited_until:
                self.view_ready.wait(timeout=self.follow_s if timeout is None else timeout)
                if not self.view_ready.is_set() and time.monotonic() < self.view_waited_until:
                    return out  # the view has not drawn the file's end yet: indexing now would slow it
            self._index_some(out)
        else:
            try:
                request = self.requests.get(timeout=self.follow_s if timeout is None else timeout)
            except queue.Empty:
                request = None
            if request is not None:
                self.waiting.append(request)
        self._drain()
        if self.whole:
            for request in self.waiting:
                if request[1] == self.generation:  # an older one was asked again since: not answered
                    out.append(self._answer(request))
            self.waiting.clear()
            self._follow(out)
        return out

    def _drain(self) -> None:
        while True:
            try:
                self.waiting.append(self.requests.get_nowait())
            except queue.Empty:
                return

    def _stale(self) -> bool:
        """A newer search or jump was asked for than the one being answered."""
        return self._busy != self.generation

    # -- opening and indexing --------------------------------------------------------------------------------

    def _open(self, out: list[Result], note: str) -> None:
        self.close()
        try:
            self.file = LogFile.open(self.path)
            size = self.file.size()
        except (LogFileError, OSError) as exc:
            self.close()
            error = str(exc) if isinstance(exc, LogFileError) else f"{self.path}: {exc}"
            if error != self.failed:
                self.failed = error
                out.append(Failed(error))
            self.next_look = time.monotonic() + RETRY_S
            return
        self.failed = None
        self.index = LineIndex()
        self.whole = False
        if size > TAIL_FIRST:
            tail = self._tail(size)
            self.shown_end = size
            out.append(Opened(tail, self.file.dup(), tail.count(size), size, whole=False, note=note))
            out.append(Progress(0, size))
            self.view_ready.clear()
            self.view_waited_until = time.monotonic() + VIEW_WAIT_S
        else:
            self.index.scan(self.file, size)
            self._whole(out, note)

    def _tail(self, size: int) -> LineIndex:
        """An index of the file's last TAIL_BYTES, from the first line that starts in them."""
        assert self.file is not None
        start = size - TAIL_BYTES
        first = self.file.read(start, TAIL_BYTES).find(b"\n")
        tail = LineIndex(start + first + 1 if first >= 0 else start, first_number=None)
        tail.scan(self.file, size)
        return tail

    def _index_some(self, out: list[Result]) -> None:
        """A few chunks of the whole index, then back to the loop (requests wait for the whole index)."""
        assert self.file is not None and self.index is not None
        deadline = time.monotonic() + 0.1
        size = self.file.size()
        while self.index.scanned < size and time.monotonic() < deadline:
            self.index.scan(self.file, min(size, self.index.scanned + CHUNK))
            time.sleep(0)  # the GIL to the UI thread between chunks: the view scrolls while this indexes
        if self.index.scanned < size:
            out.append(Progress(self.index.scanned, size))
        else:
            self._whole(out, "")

    def _whole(self, out: list[Result], note: str) -> None:
        assert self.file is not None and self.index is not None
        self.whole = True
        end = self.index.scanned
        self.shown_end = end
        out.append(Opened(self.index, self.file.dup(), self.index.count(end), end, whole=True, note=note))

    # -- following -------------------------------------------------------------------------------------------

    def _follow(self, out: list[Result]) -> None:
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + self.follow_s
        assert self.file is not None and self.index is not None
        try:
            size = self.file.size()
            replaced = self.file.replaced()
        except OSError:
            return
        if size < self.index.scanned:
            self._open(out, note="the file was truncated: read again from its start")
        elif replaced and size == self.index.scanned:  # what was written to the old one is shown
            self._open(out, note="the file was replaced (rotated): reading the new one from its start")
        elif size > self.index.scanned:
            self.index.scan(self.file, min(size, self.index.scanned + GROW_BYTES))
            self.shown_end = self.index.scanned
            out.append(Grew(self.index.count(self.shown_end), self.shown_end))
            self.next_look = 0.0 if self.index.scanned < size else self.next_look

    # -- searches and jumps ----------------------------------------------------------------------------------

    def _answer(self, request: tuple[Any, ...]) -> Found:
        assert self.file is not None and self.index is not None
        what, generation = request[0], request[1]
        self._busy = generation
        end = self.shown_end
        try:
            if what == "search":
                return self._search(generation, request[2], request[3], request[4], end)
            return self._problem(generation, request[2], request[3], end)
        except LogFileError as exc:
            return Found(generation, None, str(exc))

    def _line_start(self, line: int, end: int) -> int:
        """The first byte of `line`; the end of the document past its last line, 0 before its first."""
        assert self.index is not None
        if line >= self.index.count(end):
            return end
        return self.index.span(max(0, line), end)[0]

    def _search(self, generation: int, text: str, line: int, forward: bool, end: int) -> Found:
        """From the line after `line` down, then from the top (forward); from the line before it up, then from
        the bottom."""
        assert self.file is not None and self.index is not None
        pattern = Pattern.of(text)
        if forward:
            start = self._line_start(line + 1, end)
            spans, wrapped = [(start, end), (0, start)], "search went on from the top"
        else:
            start = self._line_start(line, end)
            spans, wrapped = [(0, start), (start, end)], "search went on from the bottom"
        for n, (first, last) in enumerate(spans):
            hit = search(self.file, pattern, first, last, forward=forward, stale=self._stale)
            if self._stale():
                return Found(generation, None, "")
            if hit is not None:
                return Found(generation, self.index.line_of(hit), wrapped if n else "")
        return Found(generation, None, f"not found: {pattern.text}")

    def _problem(self, generation: int, line: int, forward: bool, end: int) -> Found:
        """The first problem on a line after `line` (forward), or the last one before it."""
        assert self.file is not None and self.index is not None
        if forward:
            problem = self._next_problem(self._line_start(line + 1, end), end)
        else:
            problem = self._previous_problem(self._line_start(line, end))
        what = "below" if forward else "above"
        if problem is None:
            return Found(generation, None, "" if self._stale() else f"no traceback, OOM or NCCL error {what}")
        return Found(generation, self.index.line_of(problem.offset), f"{KINDS[problem.kind]}: {problem.line}")

    def _next_problem(self, pos: int, end: int) -> Any:
        """The first problem starting at or after `pos` (a line's first byte), a chunk at a time."""
        assert self.file is not None
        while pos < end:
            data = self.file.read(pos, min(CHUNK, end - pos))
            final = pos + len(data) >= end
            found, done = find_problems(data, pos, final=final)
            if found:
                return found[0]
            if done <= pos:  # one line longer than a chunk: go past it
                done = pos + len(data)
            pos = done
            if self._stale():
                return None
        return None

    def _previous_problem(self, here: int) -> Any:
        """The last problem starting before `here`, a chunk at a time backwards."""
        assert self.file is not None
        stop = here
        while stop > 0:
            start = max(0, stop - CHUNK)
            data = self.file.read(start, stop - start + MAX_BLOCK_BYTES)  # a block may end past `stop`
            skip = 0 if start == 0 else data.find(b"\n") + 1  # from a line start
            if start and skip == 0:
                stop = start
                continue
            found, _ = find_problems(data[skip:], start + skip, final=True)
            before = [p for p in found if p.offset < stop]
            if before:
                return before[-1]
            stop = start + skip if start + skip < stop else start
            if self._stale():
                return None
        return None
