"""The rollouts viewer (`R`): the selected run's samples, a step at a time or every step at once.

Each line is a sample: its place, its total reward, its advantage, its length and the heads of its prompt and
completion. The list is any length: RolloutList (widgets/rollout_list.py) draws only the visible lines and
asks for pages, which a reader thread (carl_tui/rollouts_model.py) reads by keyset and posts back; the same
thread follows the store, so new steps appear, and the view moves to the newest step unless the user moved off
it.

Under the list, for runs that store per-token values (our own), the token entropy of the step as a histogram
and, over the run, its p10/p50/p90 as a band. `enter` opens a sample, `g` its GRPO group side by side
(carl_tui/rollouts_detail.py). The keys are in docs/guide/control-room.md ("The rollouts viewer").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Static
from textual.worker import get_current_worker

from engine.store import RunRow, Series
from engine.store.rollout_reads import SORTS, FilterError, RolloutFilter, RolloutQuery, parse_filter
from engine.text import visible_line
from widgets.chart import Chart
from widgets.histogram import Histogram
from widgets.key_bar import KeyBar
from widgets.rollout_list import RolloutList, header

from .reads import StoreReads
from .rollouts_model import PAGE, Band, Page, Result, RolloutsReader, StepHistogram, Steps, Total
from .shown_errors import ONE_LINE

if TYPE_CHECKING:
    from engine.store import StoreReader

TALL = 36  # rows from which the entropy panel shows without asking
EMPTY = (
    "No rollouts stored for this run. carl's own GRPO runs store every step's samples (with per-token "
    "entropy); `carl observe` reads TRL's completions parquet and veRL, prime-rl and verifiers dumps "
    "into the same table."
)
SORT_NAMES = {"order": "source order", "reward": "reward", "advantage": "advantage", "length": "length"}
STEP_KEYS = Binding.Group("Step")


class RolloutsRead(Message):
    """What the reader thread read, to apply in order."""

    def __init__(self, results: list[Result]) -> None:
        super().__init__()
        self.results = results


class ReaderFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def band_series(points: list[tuple[int, float, float, float]]) -> tuple[Series, Series, Series]:
    """The (p10, p50, p90) of each step as three raw series."""
    steps = [p[0] for p in points]
    lows, mids, highs = ([p[i] for p in points] for i in (1, 2, 3))
    return tuple(Series(steps, steps, v, v, v) for v in (lows, mids, highs))  # type: ignore[return-value]


class RolloutsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "close", "Close", id="rollouts.close"),
        # One entry in the key bar, `[ ] Step`: at 80 columns it leaves room for `g Group` and `h Entropy`.
        Binding(
            "left_square_bracket,left",
            "step(-1)",
            "Step ←",
            key_display="[",
            group=STEP_KEYS,
            id="rollouts.previous-step",
        ),
        Binding(
            "right_square_bracket,right",
            "step(1)",
            "Step →",
            key_display="]",
            group=STEP_KEYS,
            id="rollouts.next-step",
        ),
        Binding("home", "end_step(0)", "First step", show=False, id="rollouts.first-step"),
        Binding("end", "end_step(1)", "Last step", show=False, id="rollouts.last-step"),
        Binding("s", "sort", "Sort", id="rollouts.sort"),
        Binding("S", "reverse", "Reverse the order", show=False, id="rollouts.reverse"),
        Binding("slash", "filter", "Filter", key_display="/", id="rollouts.filter"),
        Binding("a", "scope", "All steps", id="rollouts.scope"),
        Binding("g", "group", "Group", id="rollouts.group"),
        Binding("h", "entropy", "Entropy", id="rollouts.entropy"),
    ]

    def __init__(self, run: RunRow, reader: RolloutsReader, *, chart_mode: str = "braille") -> None:
        super().__init__()
        self.run = run
        self.reader = reader
        self.chart_mode = chart_mode
        self.steps: list[int] | None = None  # None: not read yet
        self.step: int | None = None  # the step shown (or last shown, while every step is)
        self.every_step = False
        self.sort = "order"
        self.descending = False
        self.filter_text = ""
        self.filter = RolloutFilter()
        self.following = True  # on the newest step, and moved there as new ones come
        self.generation = 0
        self.entropy_shown: bool | None = None  # None: shown when the run has per-token values and room
        self.has_tokens = False
        self.band: list[tuple[int, float, float, float]] = []

    # -- layout ----------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Vertical(id="rollouts") as box:
            framework = f" ({self.run.framework})" if self.run.framework else ""
            # Titles of stored text are Text, never markup (a run's name is the source's).
            box.border_title = Text(f"Rollouts · {visible_line(self.run.name)}{visible_line(framework)}")
            yield Static("", id="rollouts-status")
            yield Input(placeholder='reward<0.2 adv>0 len>100 task=1 "some text"', id="rollouts-filter")
            yield Static("", id="rollouts-header")
            yield RolloutList(PAGE, id="rollout-list")
            yield Static(EMPTY, id="rollouts-empty")
            with Horizontal(id="rollouts-entropy"):
                histogram = Histogram(unit="nats", empty_text="no per-token entropy", id="entropy-histogram")
                histogram.border_title = "token entropy · step"
                yield histogram
                band = Chart(id="entropy-band", empty_text="no per-token entropy")
                band.border_title = "token entropy p10–p90, p50 (nats) · steps"
                yield band
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#rollouts-filter").display = False
        self.query_one("#rollouts-empty").display = False
        self.query_one("#rollouts-entropy").display = False
        self.query_one(Chart).mode = self.chart_mode
        self.query_one(RolloutList).focus()
        self.watch(self.list, "cursor", self.cursor_moved, init=False)
        self.reader.want_band()
        self.read_store()
        self.show_status()

    def on_resize(self) -> None:
        self.place_entropy()

    @property
    def list(self) -> RolloutList:
        return self.query_one(RolloutList)

    # -- the reader thread -----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="rollouts-reader")
    def read_store(self) -> None:
        worker = get_current_worker()
        try:
            while not worker.is_cancelled:
                results = self.reader.answer()
                if results and not worker.is_cancelled:
                    self.post_message(RolloutsRead(results))
        except ONE_LINE as exc:  # an unreadable store: one line, the viewer stays up
            self.post_message(ReaderFailed(str(exc)))
        finally:
            self.reader.close()

    @on(ReaderFailed)
    def reader_failed(self, event: ReaderFailed) -> None:
        self.notify(event.error, title="rollouts", severity="error", timeout=10, markup=False)

    @on(RolloutsRead)
    def apply(self, event: RolloutsRead) -> None:
        for result in event.results:
            if isinstance(result, Page):
                if result.generation == self.generation:
                    self.list.set_page(result.number, result.rows)
                    if not self.has_tokens and any(r.has_tokens for r in result.rows):
                        self.has_tokens = True
                        self.place_entropy()
            elif isinstance(result, Total):
                if result.generation == self.generation:
                    self.list.set_total(result.total)
            elif isinstance(result, Steps):
                self.steps_read(result)
            elif isinstance(result, StepHistogram):
                self.histogram_read(result)
            elif isinstance(result, Band):
                self.band = result.points
                self.has_tokens = self.has_tokens or bool(result.points)
                self.draw_band()
                self.place_entropy()
        self.show_status()

    def steps_read(self, news: Steps) -> None:
        first = self.steps is None
        self.steps = news.steps
        self.query_one("#rollouts-empty").display = not news.steps
        if not news.steps:
            return
        newer = self.following and not self.every_step and news.steps[-1] != self.step
        if first or newer or self.step not in news.steps:
            self.go_to_step(news.steps[-1], follow=True)
        elif news.reset or (self.every_step and news.changed) or self.step in news.changed:
            self.set_query(keep_cursor=True)  # rows arrived in what is shown

    # -- what is listed --------------------------------------------------------------------------------------

    def set_query(self, *, keep_cursor: bool = False) -> None:
        query = RolloutQuery(
            self.run.id,
            None if self.every_step else self.step,
            self.sort,
            self.descending,
            self.filter,
        )
        self.generation = self.reader.set_query(query)
        self.list.reset(show_step=self.every_step, cursor=self.list.cursor if keep_cursor else 0)
        self.query_one("#rollouts-header", Static).update(header(self.every_step))
        self.show_status()

    def go_to_step(self, step: int, *, follow: bool) -> None:
        self.step, self.every_step = step, False
        self.following = follow
        self.set_query()
        self.want_histogram()
        self.query_one(Chart).set_markers([step])

    def want_histogram(self) -> None:
        if self.step is not None:
            top = math.log(self.run.vocab_size) if self.run.vocab_size and self.run.vocab_size > 1 else None
            self.reader.want_histogram(self.step, top)

    def histogram_read(self, result: StepHistogram) -> None:
        if result.step != self.step:
            return
        widget = self.query_one(Histogram)
        hist = result.histogram
        if hist is None:
            widget.border_title = f"token entropy · step {result.step:,}"
            widget.set_empty("no per-token entropy at this step")
            return
        widget.border_title = (
            f"token entropy · step {hist.step:,} · {hist.tokens:,} tokens of {hist.samples:,} samples"
        )
        widget.set_data(hist.edges, hist.counts)

    def draw_band(self) -> None:
        chart = self.query_one(Chart)
        if not self.band:
            chart.set_series()
            return
        low, mid, high = band_series(self.band)
        chart.set_series(mid, band=(low, high))

    def place_entropy(self) -> None:
        """The entropy panel: as asked (`h`), else shown for a run with per-token values on a tall screen."""
        shown = (
            self.entropy_shown
            if self.entropy_shown is not None
            else self.has_tokens and self.size.height >= TALL
        )
        self.query_one("#rollouts-entropy").display = bool(shown)

    def show_status(self) -> None:
        parts = []
        steps = self.steps or []
        if self.steps is None:
            parts.append("reading…")
        elif not steps:
            parts.append("no rollouts")
        elif self.every_step:
            parts.append(f"every step ({len(steps):,})")
        elif self.step is not None and self.step in steps:
            where = steps.index(self.step) + 1
            parts.append(f"step {self.step:,} ({where:,} of {len(steps):,})")
            parts.append(
                "following the newest" if self.following and where == len(steps) else "end: follow the newest"
            )
        total = self.list.total
        if steps:
            if total is None:
                parts.append("counting…")
            else:
                at = f"{self.list.cursor + 1:,} of " if total else ""
                parts.append(f"row {at}{total:,}")
        parts.append(f"sort {SORT_NAMES[self.sort]} {'↓' if self.descending else '↑'}")
        if self.filter:
            parts.append(f"filter {self.filter_text}")
        status = self.query_one("#rollouts-status", Static)
        text = " · ".join(parts)
        if status.size.width and len(text) > status.size.width:  # narrow: the same, in fewer words
            text = " · ".join(short_status(part) for part in parts)
        line = Text(text, no_wrap=True, overflow="ellipsis")
        if line != status.content:
            status.update(line, layout=False)  # one line, always: no layout of the screen for it

    @on(RolloutList.Wanted)
    def rows_wanted(self, event: RolloutList.Wanted) -> None:
        if self.generation:
            self.reader.want_pages(self.generation, event.pages)

    def cursor_moved(self) -> None:
        self.show_status()  # in the same refresh as the list's lines

    # -- keys ------------------------------------------------------------------------------------------------

    def action_close(self) -> None:
        field = self.query_one("#rollouts-filter", Input)
        if field.display:  # esc in the filter: it closes, and the filter with it
            field.value = ""
            self.apply_filter("")
            field.display = False
            self.list.focus()
            return
        self.workers.cancel_group(self, "rollouts-reader")
        self.dismiss(None)

    def action_step(self, delta: int) -> None:
        steps = self.steps or []
        if not steps:
            return
        here = steps.index(self.step) if self.step in steps else len(steps) - 1
        if not self.every_step:
            here = max(0, min(len(steps) - 1, here + delta))
        self.go_to_step(steps[here], follow=here == len(steps) - 1)

    def action_end_step(self, last: int) -> None:
        steps = self.steps or []
        if self.every_step:  # every step listed: the first or last row
            total = self.list.total
            if last and total is None:
                self.notify("still counting the rows", title="rollouts")
                return
            self.list.move_to((total or 1) - 1 if last else 0)
        elif steps:
            self.go_to_step(steps[-1] if last else steps[0], follow=bool(last))

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.descending = self.sort in ("reward", "advantage", "length")  # the best, the longest first
        self.set_query()

    def action_reverse(self) -> None:
        self.descending = not self.descending
        self.set_query()

    def action_scope(self) -> None:
        if not self.steps:
            return
        self.every_step = not self.every_step
        self.following = not self.every_step and self.step == self.steps[-1]
        self.set_query()

    def action_filter(self) -> None:
        field = self.query_one("#rollouts-filter", Input)
        field.display = True
        field.value = self.filter_text
        field.focus()

    @on(Input.Changed, "#rollouts-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.apply_filter(event.value, quiet=True)

    @on(Input.Submitted, "#rollouts-filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        if self.apply_filter(event.value):
            event.input.display = False
            self.list.focus()

    def apply_filter(self, text: str, *, quiet: bool = False) -> bool:
        """Filter by `text` (the filter language); a filter that cannot be read leaves the list as it is."""
        try:
            parsed = parse_filter(text)
        except FilterError as exc:
            if not quiet:
                self.notify(str(exc), title="filter", severity="warning", markup=False)
            return False
        self.filter_text = text.strip()
        if parsed != self.filter:
            self.filter = parsed
            self.set_query()
        self.show_status()
        return True

    def action_group(self) -> None:
        row = self.list.row(self.list.cursor)
        if row is None:
            return
        from .rollouts_detail import RolloutGroupScreen

        run = self.run

        def read(reader: StoreReader) -> list[dict[str, Any]]:
            prompt = None if row.group_id else (reader.rollout(row.id) or {}).get("prompt")
            return reader.rollout_group(run.id, row.step, row.group_id, prompt)

        def show(rows: list[dict[str, Any]] | None) -> None:
            self.app.push_screen(RolloutGroupScreen(run, rows or [], row.id))

        self.reads.read(read, show, title="group")

    @on(RolloutList.Selected)
    def open_sample(self, event: RolloutList.Selected) -> None:
        from .rollouts_detail import RolloutSampleScreen

        run = self.run

        def show(sample: dict[str, Any] | None) -> None:
            if sample:
                self.app.push_screen(RolloutSampleScreen(run, sample))

        self.reads.read(lambda reader: reader.rollout(event.row.id), show, title="sample")

    def action_entropy(self) -> None:
        shown = self.query_one("#rollouts-entropy").display
        self.entropy_shown = not shown
        self.place_entropy()
        if self.entropy_shown:
            self.want_histogram()

    @property
    def reads(self) -> StoreReads:
        """The group's and the sample's reads: in a worker, each comes back to the app as a message."""
        return StoreReads(self.app, self.reader.db_path)


def short_status(part: str) -> str:
    """A part of the status line in fewer words, for a narrow screen: `45 of 45` → `45/45`, `following the
    newest` → `following`, `sort source order ↑` → `source order ↑`."""
    for long, short in (
        (" of ", "/"),
        ("following the newest", "following"),
        ("end: follow the newest", "end: follow"),
        ("sort ", ""),
    ):
        part = part.replace(long, short)
    return part
