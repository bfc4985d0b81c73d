"""The metrics explorer (`m`): every key of the selected run, or of the marked runs overlaid, as small
charts grouped by prefix.

- 80×24: a list of the keys (grouped, each with its newest value) and one chart of the highlighted key;
  160×50: a grid of small charts, as many columns as fit, scrolled by rows (carl_tui/explorer_grid.py).
- A key of histograms (▦) is a heat strip over steps (widgets/heat_strip.py): a line per step, its colour the
  density of the step's buckets; zoomed, every step read has its line and `←` `→` move the cursor over them.
- `/` filters the keys (a substring, or a glob with * ? [), `enter` zooms one chart, `s` cycles the
  smoothing and `[` `]` change its weight or window (carl_tui/smoothing.py), `l` puts the chart on a
  log axis, `p` pins it to the main screen, `i` opens the record inspector at the chart's cursor
  (`←` `→` move it) or at the newest step.

Only what is in view is read and drawn: a thread follows the store (carl_tui/explorer_data.py), reads
the series of the keys in view when asked, extends them when the store moves, and posts what changed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from engine.store import Series
from engine.store.histograms import HistogramSeries
from widgets.chart import Chart
from widgets.heat_strip import HeatStrip, short_number
from widgets.key_bar import KeyBar

from .explorer_data import ExplorerFeed, Listing, News, Pair
from .explorer_grid import CHART_HEIGHT, ChartGrid
from .explorer_model import (
    PIN_MARK,
    ChartPlan,
    GridRow,
    KeyInfo,
    Pow10,
    ShownRun,
    count_line,
    filter_keys,
    grid_rows,
    group_title,
    locate,
    moved_among,
    moved_step,
    plan_chart,
    rows_in_view,
    scrolled_to,
    short_value,
    value_at,
)
from .panes import set_subtitle, set_title
from .shown_errors import ONE_LINE
from .smoothing import Smoothing

NAME_MIN = 12  # cells a long run name is cut to, at the least, on a narrow header
GRID_MIN = (120, 32)  # from this size (columns, lines) the explorer shows a grid, below it a list and a chart
# What a chart's plan was made of: each run's raw series, the smoothing, log axis, pinned, the key's info.
PlanParts = tuple[tuple[Series | None, ...], Smoothing, bool, bool, KeyInfo]
POLL_S = 0.25  # how often the store is looked at (PRAGMA data_version), as the control room does


class ExplorerScreen(ModalScreen[None]):
    """Every metric of the runs shown (`runs`: the selected run, or the marked runs with their
    comparison colours, the selected one first). `pin(key)` pins or unpins a key for the first run
    and returns its pinned keys; `inspect(run_id, step)` opens the record inspector."""

    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/", id="explorer.filter"),
        # enter zooms wherever the focus is (the key list would take it to select); in the filter box it
        # ends the filter
        Binding("enter", "zoom", "Zoom", priority=True, id="explorer.zoom"),
        Binding("s", "smoothing", "Smoothing", id="explorer.smoothing"),
        Binding(
            "left_square_bracket",
            "smoothing_step(-1)",
            "Less smoothing",
            key_display="[",
            show=False,
            id="explorer.smooth-less",
        ),
        Binding(
            "right_square_bracket",
            "smoothing_step(1)",
            "More smoothing",
            key_display="]",
            show=False,
            id="explorer.smooth-more",
        ),
        Binding("l", "log", "Log y", id="explorer.log"),
        Binding("p", "pin", "Pin", id="explorer.pin"),
        Binding("i", "inspect", "Inspect", id="explorer.inspect"),
        Binding("up", "move(0, -1)", "Previous row", show=False, id="explorer.up"),
        Binding("down", "move(0, 1)", "Next row", show=False, id="explorer.down"),
        Binding(
            "left", "move(-1, 0)", "Previous chart, or the cursor a step back", show=False, id="explorer.left"
        ),
        Binding(
            "right", "move(1, 0)", "Next chart, or the cursor a step on", show=False, id="explorer.right"
        ),
        Binding("pageup", "page(-1)", "Page up", show=False, id="explorer.page-up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="explorer.page-down"),
        Binding("escape", "back", "Back", id="explorer.back"),
        Binding("m,q", "close", "Close", show=False, id="explorer.close"),
    ]

    AUTO_FOCUS = ""  # the key list takes the focus in the list layout (focus_keys); nothing does in the grid

    class Fed(Message):
        """The feed's news, from its thread."""

        def __init__(self, news: News) -> None:
            super().__init__()
            self.news = news

    class Failed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(
        self,
        db_path: Path,
        runs: Sequence[ShownRun],
        *,
        pinned: Sequence[str] = (),
        pin: Callable[[str], list[str]] | None = None,
        inspect: Callable[[int, int | None], None] | None = None,
        chart_mode: str = "braille",
        refresh_s: float = POLL_S,
    ) -> None:
        super().__init__()
        self.db_path = db_path
        self.runs = list(runs)
        self.pinned = set(pinned)
        self.pin_callback = pin
        self.inspect_callback = inspect
        self.chart_mode = chart_mode
        self.refresh_s = refresh_s
        self.feed: ExplorerFeed | None = None
        self.listing: Listing | None = None
        self.series: dict[Pair, Series] = {}
        self.heats: dict[Pair, HistogramSeries] = {}  # the keys of histograms read
        self.keys: list[KeyInfo] = []  # the keys the filter lets through, in order
        self.filter_text = ""
        self.smoothing = Smoothing()
        self.log_keys: set[str] = set()
        self.current: str | None = None  # the highlighted key
        self.zoomed = False
        self.cursor_step: int | None = None  # the step cursor of the list's chart and the zoomed one
        self.rows: list[GridRow] = []
        self.top = 0  # the grid's first row in view
        self.plans: dict[str, tuple[PlanParts, ChartPlan]] = {}  # key -> (what it was made of, the plan)
        self.error: str | None = None
        self.header_plain = ""

    # -- layout ------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("", id="explorer-header")
        box = Input(placeholder="filter keys: a substring, or a glob such as rewards/*", id="explorer-filter")
        box.display = False  # until `/`
        yield box
        with Vertical(id="explorer-body"):
            with Horizontal(id="explorer-list-view"):
                yield OptionList(id="explorer-keys")
                yield Chart(mode=self.chart_mode, empty_text="reading…", id="explorer-chart")
                yield HeatStrip(empty_text="reading…", id="explorer-heat")
            yield Static("", id="explorer-empty")  # the grid's empty state
            yield ChartGrid(id="explorer-grid")
            yield Chart(mode=self.chart_mode, empty_text="reading…", id="explorer-zoom")
            yield HeatStrip(fit=False, empty_text="reading…", id="explorer-heat-zoom")
        yield KeyBar()

    @property
    def wide(self) -> bool:
        width, height = self.app.size
        return width >= GRID_MIN[0] and height >= GRID_MIN[1]

    def on_mount(self) -> None:
        self.set_layout()
        self.feed = ExplorerFeed(self.db_path, [run.id for run in self.runs], first=self.first_screen)
        self.update_header()
        self.follow()

    def on_resize(self) -> None:
        self.set_layout()
        self.show_keys()
        self.update_header()  # a long run name is cut to the width

    def set_layout(self) -> None:
        self.set_class(self.zoomed, "-zoom")
        self.set_class(not self.zoomed and self.wide, "-grid")
        self.set_class(not self.zoomed and not self.wide, "-list")
        if not self.query_one("#explorer-filter", Input).has_focus:
            self.call_after_refresh(self.focus_keys)  # once the list shows (or is hidden)

    # -- the feed ----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="explorer")
    def follow(self) -> None:
        """Poll the store every `refresh_s`, or at once when other keys come into view; post news."""
        worker = get_current_worker()
        feed = self.feed
        assert feed is not None
        try:
            while not worker.is_cancelled:
                started = time.monotonic()
                try:
                    news = feed.poll()
                except ONE_LINE as exc:  # a locked or damaged store: one line, the explorer stays up
                    self.post_message(self.Failed(str(exc)))
                    news = None
                if news is not None:
                    self.post_message(self.Fed(news))
                feed.wait(self.refresh_s - (time.monotonic() - started))
        finally:
            feed.close()

    @on(Failed)
    def feed_failed(self, event: Failed) -> None:
        if event.error != self.error:
            self.error = event.error
            self.update_header()

    @on(Fed)
    def fed(self, event: Fed) -> None:
        news = event.news
        self.error = None
        self.series.update(news.series)
        self.heats.update(news.histograms)
        if news.listing is not None:
            self.listing = news.listing
            self.apply_filter()
        else:
            self.draw_charts()

    def first_screen(self, keys: list[KeyInfo]) -> list[str]:
        """The keys the first screen shows (called on the feed's thread, with the first listing): the
        first key, or the grid's rows that fit the screen as it is now."""
        if not self.wide:
            return [info.key for info in keys[:1]]
        width, height = self.app.size
        rows = grid_rows(keys, ChartGrid.columns_for(width))
        return [key for row in rows[: rows_in_view(rows, 0, height - 2, CHART_HEIGHT)] for key in row.keys]

    def want_visible(self) -> None:
        """Ask the feed for the series of the keys in view (of every run shown)."""
        if self.feed is not None:
            self.feed.want((run.id, key) for key in self.visible_keys() for run in self.runs)

    def is_heat(self, key: str | None) -> bool:
        """Whether `key` names histograms (drawn as a heat strip)."""
        return key is not None and self.listing is not None and key in self.listing.histograms

    def visible_keys(self) -> list[str]:
        if self.zoomed or not self.wide:
            return [self.current] if self.current else []
        return [key for key, _ in self.query_one(ChartGrid).cells()]

    # -- the keys ----------------------------------------------------------------------------------

    def apply_filter(self) -> None:
        """The keys the filter lets through; the highlighted key stays when it still shows."""
        all_keys = self.listing.keys if self.listing else []
        self.keys = filter_keys(all_keys, self.filter_text)
        names = [info.key for info in self.keys]
        if self.current not in names:
            self.current = names[0] if names else None
            if not names:
                self.zoomed = False
                self.set_layout()
        self.show_keys()

    def show_keys(self) -> None:
        """Lay out the list or the grid for the keys that show, ask for what is in view, draw it."""
        if self.listing is None:
            return
        with self.app.batch_update():
            if self.wide and not self.zoomed:
                self.show_grid()
            else:
                self.fill_list()
            empty = self.query_one("#explorer-empty", Static)
            empty.display = self.wide and not self.zoomed and not self.keys
            if empty.display:
                empty.update(Text("no keys match the filter" if self.filter_text else "no metrics yet"))
            self.update_header()
            self.want_visible()
            self.draw_charts()

    def fill_list(self) -> None:
        keys_list = self.query_one("#explorer-keys", OptionList)
        # a column kept for the scrollbar, which comes once the keys outgrow the list
        width = max(keys_list.scrollable_content_region.width - 1, 20)
        options: list[Option] = []
        index = None
        for group, members in itertools.groupby(self.keys, key=lambda info: info.group):
            options.append(Option(Text(group_title(group), style="bold"), disabled=True))
            for info in members:
                if info.key == self.current:
                    index = len(options)
                options.append(Option(self.key_line(info, width), id=info.key))
        keys_list.set_options(options)
        if index is not None:
            keys_list.highlighted = index

    def key_line(self, info: KeyInfo, width: int) -> Text:
        """A key, marked when pinned, and its newest value (of the first run) at the right."""
        latest = self.listing.latest.get((self.runs[0].id, info.key)) if self.listing and self.runs else None
        value = "" if info.histogram is not None else short_value(latest)  # its label has the mark
        name = (f"{PIN_MARK} " if info.key in self.pinned else "  ") + info.label
        room = width - len(value) - 1
        if cell_len(name) > room:
            name = set_cell_size(name, max(room - 1, 1)) + "…"
        line = Text(set_cell_size(name, room) + " ")
        line.append(value, style="bold")
        return line

    @on(OptionList.OptionHighlighted, "#explorer-keys")
    def key_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        key = event.option.id
        if key is not None and key != self.current:
            self.current = key
            self.want_visible()
            self.draw_charts()

    def show_grid(self) -> None:
        grid = self.query_one(ChartGrid)
        width, height = grid.size
        if not width:
            width, height = self.app.size[0], self.app.size[1] - 2
        columns = ChartGrid.columns_for(width)
        self.rows = grid_rows(self.keys, columns)
        self.top = min(self.top, max(len(self.rows) - 1, 0))
        where = locate(self.rows, self.current) if self.current else None
        if where is not None:
            self.top = scrolled_to(self.rows, self.top, where[0], height, CHART_HEIGHT)
        histograms = self.listing.histograms if self.listing else {}
        grid.show(self.rows, self.top, columns, height, self.chart_mode, histograms)

    # -- drawing -----------------------------------------------------------------------------------

    def plan(self, key: str) -> ChartPlan:
        """The key's chart, made again only when its series, the smoothing, the log axis or the pin moved."""
        info = next((i for i in self.keys if i.key == key), KeyInfo(key))
        raws = tuple(self.series.get((run.id, key)) for run in self.runs)
        made_of: PlanParts = (raws, self.smoothing, key in self.log_keys, key in self.pinned, info)
        cached = self.plans.get(key)
        if cached is not None and _same(cached[0], made_of):
            return cached[1]
        plan = plan_chart(
            info,
            self.runs,
            self.series,
            smoothing=self.smoothing,
            log=key in self.log_keys,
            pinned=key in self.pinned,
        )
        self.plans[key] = (made_of, plan)
        return plan

    def draw_charts(self) -> None:
        """Hand each chart in view its plan (a chart whose plan did not change is left alone)."""
        if self.zoomed or not self.wide:
            heated = self.is_heat(self.current)
            self.set_class(heated, "-heat")
            if heated:
                heat = self.query_one("#explorer-heat-zoom" if self.zoomed else "#explorer-heat", HeatStrip)
                self.draw_heat(heat, self.current, cursor=True)
                return
            target = self.query_one("#explorer-zoom" if self.zoomed else "#explorer-chart", Chart)
            if self.current is None:
                draw(target, None, "no keys match the filter" if self.filter_text else "no metrics yet")
            else:
                draw(target, self.plan(self.current), self.empty_text(self.current))
                self.draw_cursor(target)
            return
        grid = self.query_one(ChartGrid)
        for key, chart in grid.cells():
            if self.is_heat(key):
                continue
            draw(chart, self.plan(key), self.empty_text(key))
            chart.set_class(key == self.current, "-selected")
            set_subtitle(chart, None)
            chart.set_markers(())
        for key, heat in grid.heat_cells():
            self.draw_heat(heat, key, cursor=False)
            heat.set_class(key == self.current, "-selected")

    def draw_heat(self, heat: HeatStrip, key: str | None, *, cursor: bool) -> None:
        """A key of histograms of the first run shown, as a heat strip; with `cursor`, the step cursor on its
        line and what the step holds in the bottom border."""
        info = next((i for i in self.keys if i.key == key), None)
        series = self.heats.get((self.runs[0].id, key)) if self.runs and key else None
        title = info.label if info else ""
        if series is None or not series:
            heat.set_empty("reading…" if series is None else "no histograms")
            set_title(heat, title)
            set_subtitle(heat, None)
            return
        heat.set_data(series.steps, series.histograms)
        title += f" · {series.stored:,} steps" + (
            f" ({len(series):,} shown)" if len(series) < series.stored else ""
        )
        if len(self.runs) > 1:
            title += f" · run {self.runs[0].name}"
        set_title(heat, title)
        if not cursor:
            set_subtitle(heat, None)
            return
        if self.cursor_step is None:
            heat.set_cursor(None)
            set_subtitle(heat, Text(" ← → cursor · i inspects a step "))
            return
        row = min(range(len(series.steps)), key=lambda i: abs(series.steps[i] - (self.cursor_step or 0)))
        heat.set_cursor(row)
        histogram = series.histograms[row]
        set_subtitle(
            heat,
            Text(
                f" step {series.steps[row]:,} · {short_count(histogram.total)} values"
                f" · {short_number(histogram.low)} … {short_number(histogram.high)} "
            ),
        )

    def empty_text(self, key: str) -> str:
        if any((run.id, key) not in self.series for run in self.runs):
            return "reading…"
        return "no finite values" if key not in self.log_keys else "no values above 0"

    def draw_cursor(self, chart: Chart) -> None:
        """The step cursor, a vertical line, and each run's value there in the chart's bottom border."""
        if self.cursor_step is None or self.current is None:
            chart.set_markers(())
            set_subtitle(chart, Text(" ← → cursor · i inspects a step "))
            return
        chart.set_markers([self.cursor_step])
        parts = [f"step {self.cursor_step:,}"]
        for run in self.runs:
            value = value_at(self.series.get((run.id, self.current)), self.cursor_step)
            name = f"{run.name} " if len(self.runs) > 1 else ""
            parts.append(f"{name}{short_value(value)}")
        set_subtitle(chart, Text(" " + " · ".join(parts) + " "))

    def update_header(self) -> None:
        """Metrics · the run (or the runs compared, each in its line's colour) · the count · the filter ·
        the smoothing."""
        header, name_end = Text("Metrics · "), 0
        if len(self.runs) == 1:
            header.append(f"run {self.runs[0].name}")
            name_end = header.cell_len
        else:
            header.append(f"{len(self.runs)} runs:")
            chart = self.query_one("#explorer-zoom", Chart)
            for run in self.runs:
                header.append(" ━ " + run.name, chart.line_style(run.color))
        total = len(self.listing.keys) if self.listing else 0
        parts = [count_line(len(self.keys), total) if self.listing else "reading…"]
        if self.filter_text:
            parts.append(f"filter {self.filter_text}")
        parts.append(self.smoothing.label + (" ([ ] change it)" if self.smoothing.kind != "none" else ""))
        if self.error:
            parts.append(self.error)
        rest = " · " + " · ".join(parts)
        width = self.query_one("#explorer-header", Static).content_size.width
        over = header.cell_len + cell_len(rest) - width
        name = cell_len(self.runs[0].name) if len(self.runs) == 1 else 0
        if width and over > 0 and name > NAME_MIN:  # narrow: a long run name is cut before the counts are
            header.truncate(name_end - min(over, name - NAME_MIN), overflow="ellipsis")
        header.append(rest)
        if header.plain != self.header_plain:  # an update repaints, even with the same text
            self.header_plain = header.plain
            self.query_one("#explorer-header", Static).update(header)

    # -- keys --------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#explorer-filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#explorer-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.apply_filter()

    def focus_keys(self) -> None:
        if self.has_class("-list"):
            self.query_one("#explorer-keys", OptionList).focus()
        else:
            self.set_focus(None)

    def action_back(self) -> None:
        """`esc`: clear the filter, else leave the zoom, else close the explorer."""
        box = self.query_one("#explorer-filter", Input)
        if box.display or self.filter_text:
            box.value = ""
            box.display = False
            self.filter_text = ""
            self.apply_filter()
            self.focus_keys()
        elif self.zoomed:
            self.action_zoom()
        else:
            self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_zoom(self) -> None:
        """The highlighted chart fills the screen; again (or `esc`) goes back. In the filter box: the
        filter is done."""
        if self.query_one("#explorer-filter", Input).has_focus:
            self.focus_keys()
            return
        if self.current is None and not self.zoomed:
            return
        self.zoomed = not self.zoomed
        self.set_layout()
        if self.zoomed:
            self.set_focus(None)
        self.show_keys()

    def action_smoothing(self) -> None:
        self.smoothing = self.smoothing.cycled()
        self.update_header()
        self.draw_charts()

    def action_smoothing_step(self, direction: int) -> None:
        self.smoothing = self.smoothing.stronger() if direction > 0 else self.smoothing.weaker()
        self.update_header()
        self.draw_charts()

    def action_log(self) -> None:
        if self.current is None or self.is_heat(self.current):
            return
        self.log_keys ^= {self.current}
        self.draw_charts()

    def action_pin(self) -> None:
        if self.current is None or self.pin_callback is None:
            return
        if self.is_heat(self.current):
            self.notify("a key of histograms is drawn here only: it cannot be pinned", severity="warning")
            return
        self.pinned = set(self.pin_callback(self.current))
        self.show_keys()

    def action_inspect(self) -> None:
        if self.inspect_callback is not None and self.runs:
            step = self.cursor_step if (self.zoomed or not self.wide) else None
            self.inspect_callback(self.runs[0].id, step)

    def action_move(self, dx: int, dy: int) -> None:
        """In the grid: the next chart (← →) or row (↑ ↓). On one chart: ← → move the step cursor,
        ↑ ↓ the next key."""
        if self.current is None:
            return
        if self.zoomed or not self.wide:
            if dx and self.is_heat(self.current):
                heat = self.heats.get((self.runs[0].id, self.current)) if self.runs else None
                self.cursor_step = moved_among(heat.steps if heat else [], self.cursor_step, dx)
                self.draw_charts()
            elif dx:
                series = self.series.get((self.runs[0].id, self.current)) if self.runs else None
                self.cursor_step = moved_step(series, self.cursor_step, dx)
                self.draw_charts()
            elif self.zoomed:
                self.move_key(dy)
            return
        where = locate(self.rows, self.current)
        if where is None:
            return
        row, column = where
        if dx:
            self.move_key(dx)
            return
        target = min(max(row + dy, 0), len(self.rows) - 1)
        keys = self.rows[target].keys
        self.current = keys[min(column, len(keys) - 1)]
        self.show_keys()

    def move_key(self, step: int) -> None:
        names = [info.key for info in self.keys]
        index = names.index(self.current) if self.current in names else 0
        self.current = names[min(max(index + step, 0), len(names) - 1)]
        self.show_keys()

    def action_page(self, direction: int) -> None:
        if (self.zoomed or not self.wide) and self.is_heat(self.current) and self.runs:
            self.page_heat(direction)
            return
        if not self.wide or self.zoomed or not self.rows:
            return
        grid = self.query_one(ChartGrid)
        page = rows_in_view(self.rows, self.top, grid.size.height, CHART_HEIGHT)
        target = min(max(self.top + direction * page, 0), len(self.rows) - 1)
        self.top = target
        self.current = self.rows[target].keys[0]
        self.show_keys()

    def page_heat(self, direction: int) -> None:
        """Page up or down a heat strip: the cursor a screen of steps away."""
        series = self.heats.get((self.runs[0].id, self.current or ""))
        if not series:
            return
        heat = self.query_one("#explorer-heat-zoom" if self.zoomed else "#explorer-heat", HeatStrip)
        steps = series.steps
        at = steps.index(self.cursor_step) if self.cursor_step in steps else len(steps) - 1
        at = min(max(at + direction * max(heat.plot_height, 1), 0), len(steps) - 1)
        self.cursor_step = steps[at]
        self.draw_charts()


def short_count(value: float) -> str:
    """A count of values: whole as 2,000, else in a few characters."""
    return f"{value:,.0f}" if value.is_integer() and value < 1e12 else short_number(value)


def _same(a: PlanParts, b: PlanParts) -> bool:
    """Two plans' ingredients are the same: the series by identity, the rest by value."""
    (raws_a, *rest_a), (raws_b, *rest_b) = a, b
    return (
        len(raws_a) == len(raws_b)
        and all(x is y for x, y in zip(raws_a, raws_b, strict=True))
        and (rest_a == rest_b)
    )


def draw(chart: Chart, plan: ChartPlan | None, empty_text: str) -> None:
    """Hand a chart a plan; the same plan again costs nothing."""
    chart.empty_text = empty_text
    if plan is None:
        if getattr(chart, "_explorer_plan", True) is None:
            return
        chart.set_series()
        set_title(chart, "")
        chart._explorer_plan = None  # type: ignore[attr-defined]
        return
    if getattr(chart, "_explorer_plan", None) is plan:
        return
    chart._explorer_plan = plan  # type: ignore[attr-defined]
    chart.set_right_transform(Pow10() if plan.log else None)
    chart.set_series(*plan.lines, band=plan.band, colors=plan.colors)
    set_title(chart, plan.title)
