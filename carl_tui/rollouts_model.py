"""What the rollouts viewer reads, on one thread: no Textual here, so tests and the bench drive it alone.

`RolloutsReader` owns a StoreReader and a request queue (Toolong's LineReader): the viewer asks for pages of
its list, a step's entropy histogram or the entropy band, from the UI thread; the reader thread answers each
with a result (`Page`, `Total`, `Steps`, `StepHistogram`, `Band`) that the viewer applies. A list is read a
page at a time by keyset: the reader remembers the first and last key of every page it read, so the page after
(or before) a known one starts from its key along an index. Only a far jump (a scroll bar dragged) looks a key
up by its position.

Between requests it follows the store: `PRAGMA data_version`, then the newest rollout id and the run's newest
step, then the steps of the new rows only. A list whose query changed (another sort, filter or step) gets a
new generation; answers to an older one are dropped, and a long count of an older one is interrupted.
"""

from __future__ import annotations

import queue
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store import StoreReader
from engine.store.rollout_reads import EntropyHistogram, Key, RolloutQuery, RolloutRow, spread

PAGE = 100  # rows a page
BAND_STEPS = 200  # steps the entropy band is computed at, spread over the run
INTERRUPT_EVERY = 1000  # SQLite virtual machine steps between looks at the generation


@dataclass(frozen=True)
class Page:
    generation: int
    number: int  # rows [number * PAGE, number * PAGE + len(rows))
    rows: list[RolloutRow]


@dataclass(frozen=True)
class Total:
    generation: int
    total: int


@dataclass(frozen=True)
class Steps:
    """The run's steps with rollouts, and which of them got rows since the last news."""

    steps: list[int]
    changed: frozenset[int] = frozenset()
    reset: bool = False  # the list was read anew (first read, or the run went back)


@dataclass(frozen=True)
class StepHistogram:
    step: int
    histogram: EntropyHistogram | None


@dataclass(frozen=True)
class Band:
    points: list[tuple[int, float, float, float]]  # (step, p10, p50, p90)


Result = Page | Total | Steps | StepHistogram | Band


@dataclass
class _List:
    """The current query and what the reader knows of it: each page's first and last key, and its size."""

    generation: int
    query: RolloutQuery
    bounds: dict[int, tuple[Key, Key]] = field(default_factory=dict)
    total: int | None = None


class RolloutsReader:
    """Reads one run's rollouts for the viewer. `set_query` and the `want_*` methods are for any thread;
    `answer` and `close` for the reader thread alone."""

    def __init__(self, db_path: Path, run_id: int, *, period: float = 0.25) -> None:
        self.db_path = db_path
        self.run_id = run_id
        self.period = period
        self.requests: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.generation = 0  # the newest query's; moved by set_query on the UI thread
        self.rows_read = 0  # list rows read so far (a test checks pages are read, not everything)
        self.reader: StoreReader | None = None
        self._list: _List | None = None
        self._steps: list[int] | None = None
        self._signature: tuple[int, int | None] | None = None
        self._version = -1
        self._polled = 0.0
        self._band_wanted = False
        self._band: dict[int, tuple[int, float, float, float] | None] = {}
        self._busy = 0  # the generation of the request being answered

    # -- requests, from any thread ---------------------------------------------------------------------------

    def set_query(self, query: RolloutQuery) -> int:
        """A new list: returns its generation (answers carry it)."""
        self.generation += 1
        self.requests.put(("query", self.generation, query))
        return self.generation

    def want_pages(self, generation: int, pages: list[int]) -> None:
        self.requests.put(("pages", generation, tuple(pages)))

    def want_histogram(self, step: int, top: float | None) -> None:
        self.requests.put(("histogram", step, top))

    def want_band(self) -> None:
        """The band over the run's steps, and again whenever steps get rows."""
        self.requests.put(("band",))

    # -- the reader thread -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def _open(self) -> StoreReader | None:
        if self.reader is None and self.db_path.exists():
            self.reader = StoreReader(self.db_path)
            # A count or a page of an older list stops at once when a newer list is asked for.
            self.reader.conn.set_progress_handler(self._stale, INTERRUPT_EVERY)
        return self.reader

    def _stale(self) -> int:
        return int(self._busy != self.generation)

    def answer(self, timeout: float | None = None) -> list[Result]:
        """Wait up to `timeout` (the poll period by default) for a request, answer every queued one, and
        follow the store when the period has passed; what to apply, in order."""
        out: list[Result] = []
        reader = self._open()
        if reader is None:
            time.sleep(self.period if timeout is None else timeout)
            return out
        try:
            request = self.requests.get(timeout=self.period if timeout is None else timeout)
        except queue.Empty:
            request = None
        while request is not None:
            self._handle(reader, request, out)
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                request = None
        if time.monotonic() - self._polled >= self.period or self._steps is None:
            self._polled = time.monotonic()
            self._follow(reader, out)
        current = self._list
        if current is not None and current.total is None and current.generation == self.generation:
            self._count(reader, current, out)  # once nothing else waits: a filtered count can be long
        return out

    def _handle(self, reader: StoreReader, request: tuple[Any, ...], out: list[Result]) -> None:
        kind = request[0]
        if kind == "query":
            _, generation, query = request
            if generation == self.generation:
                self._list = _List(generation, query)
        elif kind == "pages":
            _, generation, numbers = request
            current = self._list
            if current is None or generation != current.generation:
                return
            self._busy = generation
            for number in numbers:
                try:
                    rows = self._page(reader, current, number)
                except sqlite3.OperationalError:  # interrupted: a newer list was asked for
                    return
                if rows is not None:
                    out.append(Page(generation, number, rows))
            self._busy = self.generation
        elif kind == "histogram":
            _, step, top = request
            self._busy = self.generation
            out.append(StepHistogram(step, reader.entropy_histogram(self.run_id, step, top=top)))
        elif kind == "band":
            self._band_wanted = True
            if self._steps is not None:
                out.append(self._read_band(reader))

    def _page(self, reader: StoreReader, current: _List, number: int) -> list[RolloutRow] | None:
        """Page `number` by keyset from the nearest page known (or an end of the list); None: a far page
        before the list's size is known (the viewer asks again once it is)."""
        query, bounds, total = current.query, current.bounds, current.total
        start = number * PAGE
        if total is not None and start >= total:
            return []
        if number in bounds:  # read before, and forgotten by the viewer: from its own first key
            rows = reader.rollout_page(query, after=bounds[number][0], limit=PAGE, inclusive=True)
        elif number - 1 in bounds:
            rows = reader.rollout_page(query, after=bounds[number - 1][1], limit=PAGE)
        elif number + 1 in bounds:
            rows = reader.rollout_page(query, after=bounds[number + 1][0], limit=PAGE, backward=True)
        elif number == 0:
            rows = reader.rollout_page(query, limit=PAGE)
        elif total is not None and (total - 1) // PAGE == number:  # the last page: from the end
            rows = reader.rollout_page(query, limit=total - start, backward=True)
        elif total is not None:
            key = reader.rollout_key_at(query, start, total)
            rows = [] if key is None else reader.rollout_page(query, after=key, limit=PAGE, inclusive=True)
        else:
            return None
        self.rows_read += len(rows)
        if rows:
            bounds[number] = (rows[0].key, rows[-1].key)
        if len(rows) < PAGE and current.total is None and (number == 0 or number - 1 in bounds):
            current.total = start + len(rows)  # the list ends here
        return rows

    def _count(self, reader: StoreReader, current: _List, out: list[Result]) -> None:
        self._busy = current.generation
        try:
            current.total = reader.rollout_total(current.query)
        except sqlite3.OperationalError:  # interrupted: a newer list was asked for
            return
        finally:
            self._busy = self.generation
        out.append(Total(current.generation, current.total))

    def _follow(self, reader: StoreReader, out: list[Result]) -> None:
        """News of the run's rollouts since the last look: new steps, steps that got rows."""
        version = reader.data_version()
        if version == self._version and self._steps is not None:
            return
        self._version = version
        signature = reader.rollouts_signature(self.run_id)
        previous, self._signature = self._signature, signature
        if (
            self._steps is None
            or previous is None
            or signature[0] < previous[0]
            or (signature[1] is not None and self._steps and signature[1] < self._steps[-1])
        ):
            self._steps = reader.rollout_step_list(self.run_id)  # first look, or the run went back
            self._band.clear()
            out.append(Steps(list(self._steps), reset=True))
        elif signature[0] > previous[0]:
            changed = frozenset(reader.rollout_steps_since(self.run_id, previous[0]))
            if not changed:
                return
            self._steps = sorted(set(self._steps) | changed)
            for step in changed:
                self._band.pop(step, None)
            out.append(Steps(list(self._steps), changed))
        else:
            return
        if self._band_wanted:
            out.append(self._read_band(reader))

    def _read_band(self, reader: StoreReader) -> Band:
        """The band at up to BAND_STEPS steps spread over the run; a step already read is not read again."""
        wanted = spread(self._steps or [], BAND_STEPS)
        missing = [s for s in wanted if s not in self._band]
        read = {point[0]: point for point in reader.entropy_band(self.run_id, missing)}
        for step in missing:
            self._band[step] = read.get(step)
        return Band([p for s in wanted if (p := self._band.get(s)) is not None])
