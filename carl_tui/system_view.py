"""The System screen (`S`): every node's machine over wall time, lined up with the selected run's steps, and
the run's processes.

Per node, one section: a heading (its state, cores, memory, platform, note) and its charts: CPU (all cores and
the busiest), memory (RAM and swap), disk free (each watched mount), network, and for its GPUs their
utilisation, memory, power and temperature (a line per GPU). Every chart spans the same window of wall time
(`[` `]`: 15 min, 1 h, 6 h, 1 day), ending at the newest sample; under its clock, the step the selected run
was at (widgets/time_chart.py). `←` `→` move a cursor through the window: the header gives the time and the
run's step there, each chart's bottom border its values. Then the run's processes in a table (pid, role and
rank, node, CPU, RSS, GPU memory, state, how it ended).

A reader thread (carl_tui/system_model.py) reads the series when the box moves (a sample every 2 s) or another
window is asked for, and posts them; nothing here touches the store. The keys are in
docs/guide/control-room.md, what each number is in docs/guide/system.md.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from engine.durations import compact_duration
from engine.store import RunRow, Series
from engine.store.system_reads import TimeSeries
from engine.text import visible_line
from widgets.chart import LINE_COLOURS
from widgets.key_bar import KeyBar
from widgets.system_pane import clock, size
from widgets.time_chart import TimeChart, step_at

from .panes import set_border
from .shown_errors import ONE_LINE
from .system_model import WINDOWS, ChartSpec, NodeSeries, SystemFeed, SystemNews

WIDE = 120  # from this many columns the charts stand two abreast
CURSOR_STEPS = 60  # `←` `→` move the cursor a sixtieth of the window
NO_PROCESSES = (
    "No processes recorded for this run. The engine records the processes of the runs it starts (the runner, "
    "its ranks) and those working in an observed run's directory, with how each ended."
)
PROCESS_COLUMNS = ("pid", "role", "node", "cpu", "rss", "gpu mem", "state", "end")
MAX_CELL = 60  # characters of an end reason shown in its cell
WINDOW = Binding.Group("Window")  # the key bar's names of the pairs of keys
CURSOR = Binding.Group("Cursor")


class Fed(Message):
    def __init__(self, news: SystemNews) -> None:
        super().__init__()
        self.news = news


class FeedFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def as_series(series: TimeSeries, scale: float) -> Series:
    """A node's series over wall time as a chart draws it (wall times where steps would be), in its unit."""
    if scale == 1.0:
        mean, vmin, vmax = series.mean, series.vmin, series.vmax
    else:
        mean = [v / scale for v in series.mean]
        vmin = [v / scale for v in series.vmin]
        vmax = [v / scale for v in series.vmax]
    latest = mean[-1] if mean else None
    return Series(series.t, series.t, vmin, vmax, mean, 1, latest, None)  # type: ignore[arg-type]


def value_at(series: TimeSeries, t: float) -> float | None:
    """The series' value at wall time `t`: its last point by then."""
    index = bisect_right(series.t, t)
    return series.mean[index - 1] if index else None


UNIT_SUFFIX = {"GiB": "G", "MiB/s": "M/s"}  # a value's unit as its chart title prints it


def amount(value: float | None, unit: str) -> str:
    """A chart's value in its unit, short: 37%, 312W, 71°C, 12.3G, 1.2M/s."""
    if value is None:
        return "—"
    digits = 0 if unit in ("%", "W", "°C") or abs(value) >= 100 else 1
    return f"{value:.{digits}f}{UNIT_SUFFIX.get(unit, unit)}"


def window_name(seconds: float) -> str:
    """15 min, 1 h, 6 h, 1 d."""
    for unit, size_s in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size_s and seconds % size_s == 0:
            return f"{seconds / size_s:.0f} {unit}"
    return compact_duration(seconds)


class SystemScreen(ModalScreen[None]):
    """The machines over time. `feed` reads the store on a thread of this screen's; `run` is the selected run
    (None: no step row and no processes)."""

    BINDINGS = [
        # `[ ] Window` and `← → Cursor` in the key bar: one entry a pair (80 columns), each key in the help.
        Binding(
            "left_square_bracket", "window(-1)", "Shorter", key_display="[", group=WINDOW, id="system.shorter"
        ),
        Binding(
            "right_square_bracket", "window(1)", "Longer", key_display="]", group=WINDOW, id="system.longer"
        ),
        Binding("left", "cursor(-1)", "Cursor ←", key_display="←", group=CURSOR, id="system.cursor-back"),
        Binding("right", "cursor(1)", "Cursor →", key_display="→", group=CURSOR, id="system.cursor-on"),
        Binding("n", "node(1)", "Next node", id="system.next-node"),
        Binding("N", "node(-1)", "Previous node", show=False, id="system.previous-node"),
        Binding("p", "processes", "Processes", id="system.processes"),
        Binding("up", "scroll(-1)", "Scroll up", show=False, id="system.up"),
        Binding("down", "scroll(1)", "Scroll down", show=False, id="system.down"),
        Binding("pageup", "scroll(-10)", "Page up", show=False, id="system.page-up"),
        Binding("pagedown", "scroll(10)", "Page down", show=False, id="system.page-down"),
        Binding("escape", "back", "Back", id="system.back"),
        Binding("S,q", "close", "Close", show=False, id="system.close"),
    ]
    AUTO_FOCUS = ""  # the screen's keys work at once; tab or `p` goes to the processes table

    def __init__(self, feed: SystemFeed, run: RunRow | None, *, chart_mode: str = "braille") -> None:
        super().__init__()
        self.feed = feed
        self.run = run
        self.chart_mode = chart_mode
        self.window = feed.window
        self.news: SystemNews | None = None
        self.cursor: float | None = None
        self.charts: dict[tuple[int, str], TimeChart] = {}
        self.specs: dict[tuple[int, str], ChartSpec] = {}
        self.sections: list[int] = []  # node ids, in order
        self.processes: list[dict[str, Any]] | None = None
        self.error: str | None = None

    # -- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("", id="system-header")
        with VerticalScroll(id="system-body"):
            yield Static("reading…", id="system-empty")
            yield Static("", id="system-processes-title", classes="system-heading")
            yield Static(NO_PROCESSES, id="system-no-processes")
            yield DataTable(id="system-processes", cursor_type="row", zebra_stripes=True)
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#system-body").can_focus = False
        table = self.query_one("#system-processes", DataTable)
        table.add_columns(*PROCESS_COLUMNS)
        table.display = False
        self.query_one("#system-processes-title").display = self.run is not None
        self.query_one("#system-no-processes").display = False
        self.set_wide()
        self.show_header()
        self.follow()

    def on_resize(self) -> None:
        self.set_wide()
        self.show_header()  # its run name is cut to the new width

    def set_wide(self) -> None:
        self.set_class(self.app.size.width >= WIDE, "-wide")

    # -- the reader thread ----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="system-feed")
    def follow(self) -> None:
        worker = get_current_worker()
        feed = self.feed
        try:
            while not worker.is_cancelled:
                started = time.monotonic()
                try:
                    news = feed.poll()
                except ONE_LINE as exc:  # a locked or damaged store: one line, the screen stays up
                    self.post_message(FeedFailed(str(exc)))
                    news = None
                if news is not None and not worker.is_cancelled:
                    self.post_message(Fed(news))
                deadline = started + feed.period
                while not worker.is_cancelled and time.monotonic() < deadline:
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        finally:
            feed.close()

    @on(FeedFailed)
    def feed_failed(self, event: FeedFailed) -> None:
        if event.error != self.error:
            self.error = event.error
            self.show_header()

    @on(Fed)
    def fed(self, event: Fed) -> None:
        self.error = None
        news = self.news = event.news
        if self.cursor is not None and not news.since <= self.cursor <= news.until:
            self.cursor = None  # the window moved past it
        with self.app.batch_update():
            self.query_one("#system-empty", Static).update(
                Text(
                    "No machine sampled yet: the engine samples this one every 2 s ([system] in engine.toml)."
                )
            )
            self.query_one("#system-empty").display = not news.nodes
            for node in news.nodes:
                self.draw_node(node, news)
            self.draw_processes(news.processes)
            self.show_header()

    # -- drawing --------------------------------------------------------------------------------------------

    def draw_node(self, node: NodeSeries, news: SystemNews) -> None:
        node_id = int(node.node["id"])
        body = self.query_one("#system-body")
        if node_id not in self.sections:
            self.sections.append(node_id)
            heading = Static("", id=f"system-node-{node_id}", classes="system-heading")
            grid = Container(id=f"system-charts-{node_id}", classes="system-charts")
            body.mount(heading, grid, before=self.query_one("#system-processes-title"))
        self.query_one(f"#system-node-{node_id}", Static).update(node_heading(node))
        grid = self.query_one(f"#system-charts-{node_id}", Container)
        for spec in node.charts:
            key = (node_id, spec.kind)
            chart = self.charts.get(key)
            if chart is None:
                chart = TimeChart(
                    mode=self.chart_mode, empty_text="no samples in this window", classes="system-chart"
                )
                self.charts[key] = chart
                grid.mount(chart)
            self.specs[key] = spec
            series = [as_series(node.series.get(k) or TimeSeries(), spec.scale) for k in spec.keys]
            chart.x_range = (news.since, news.until)
            chart.y_range = spec.y_range or fixed_range(spec, node)
            chart.set_series(*series)
            chart.set_steps(news.steps)
            chart.set_markers([self.cursor] if self.cursor is not None else [])
            set_border(chart, "title", self.chart_title(chart, spec, node))
            set_border(chart, "subtitle", self.cursor_values(chart, spec, node))

    def chart_title(self, chart: TimeChart, spec: ChartSpec, node: NodeSeries) -> Text:
        """`CPU % ━ all cores 37 ━ busiest core 80`: each line's newest value in its colour."""
        title = Text(f"{spec.title} ({spec.unit})")
        for index, (key, name) in enumerate(zip(spec.keys, spec.names, strict=True)):
            series = node.series.get(key)
            value = series.latest / spec.scale if series is not None and series.latest is not None else None
            style = chart.line_style(index % LINE_COLOURS)
            title.append(f" ━ {visible_line(name)} ", style)
            title.append(amount(value, spec.unit))
        return title

    def cursor_values(self, chart: TimeChart, spec: ChartSpec, node: NodeSeries) -> Text | None:
        if self.cursor is None:
            return None
        out = Text(f" {clock(self.cursor)}")
        for index, key in enumerate(spec.keys):
            series = node.series.get(key)
            value = value_at(series, self.cursor) if series is not None else None
            out.append(" ━ ", chart.line_style(index % LINE_COLOURS))
            out.append(amount(None if value is None else value / spec.scale, spec.unit))
        return out.append(" ")

    def draw_processes(self, processes: list[dict[str, Any]]) -> None:
        if self.run is None or processes == self.processes:
            return
        self.processes = processes
        table = self.query_one("#system-processes", DataTable)
        table.clear()
        for row in processes:
            table.add_row(*process_cells(row))
        table.display = bool(processes)
        self.query_one("#system-no-processes").display = not processes

    def show_header(self) -> None:
        """`System · last 15 min · cursor 14:03:20 step 400 · run demo steps 0–399 · 2 nodes`: what matters
        first, as a narrow screen cuts it from the right."""
        news = self.news
        line = Text("System", style="bold")
        line.append(f" · last {window_name(self.window)}")
        if self.cursor is not None and news is not None:
            step = step_at(news.steps, self.cursor)
            line.append(f" · cursor {clock(self.cursor)}")
            if step is not None:
                line.append(f" step {step:,}", style="bold")
        if self.error:
            line.append(f" · ✕ {visible_line(self.error)}", style="bold red")
        name = Text(visible_line(self.run.name) if self.run is not None else "", style="bold")
        rest = Text()
        if self.run is not None:
            if news is not None and news.steps:
                rest.append(f" steps {news.steps[0][0]:,}–{news.steps[-1][0]:,}")
            elif news is not None:
                rest.append(" no step in view")
        if news is not None:
            count = len(news.nodes)
            rest.append(f" · {count} node{'s' if count != 1 else ''}")
        header = self.query_one("#system-header", Static)
        width = header.content_size.width
        if self.run is not None:
            line.append(" · run ")
            over = line.cell_len + name.cell_len + rest.cell_len - width
            if width and over > 0 and name.cell_len > 12:  # a long run name is cut before the counts are
                name.truncate(max(12, name.cell_len - over), overflow="ellipsis")
            line.append_text(name)
        line.append_text(rest)
        header.update(line)
        title = self.query_one("#system-processes-title", Static)
        if self.run is not None:
            title.update(Text(f"Processes of run {visible_line(self.run.name)}"))

    def redraw(self) -> None:
        if self.news is not None:
            self.fed(Fed(self.news))

    # -- keys -----------------------------------------------------------------------------------------------

    def action_window(self, direction: int) -> None:
        index = min(range(len(WINDOWS)), key=lambda i: abs(WINDOWS[i] - self.window))
        index = max(0, min(len(WINDOWS) - 1, index + direction))
        if WINDOWS[index] != self.window:
            self.window = WINDOWS[index]
            self.cursor = None
            self.feed.set_window(self.window)
            self.show_header()

    def action_cursor(self, direction: int) -> None:
        news = self.news
        if news is None:
            return
        if self.cursor is None:
            self.cursor = news.until
        else:
            self.cursor += direction * self.window / CURSOR_STEPS
        self.cursor = max(news.since, min(news.until, self.cursor))
        self.redraw()

    def action_node(self, direction: int) -> None:
        """Scroll to the next (or previous) node's section."""
        if not self.sections:
            return
        body = self.query_one("#system-body", VerticalScroll)
        tops = [self.query_one(f"#system-node-{n}").virtual_region.y for n in self.sections]
        now = body.scroll_y
        if direction > 0:
            target = next((y for y in tops if y > now), tops[0])
        else:
            target = next((y for y in reversed(tops) if y < now), tops[-1])
        body.scroll_to(y=target, animate=False)

    def action_processes(self) -> None:
        table = self.query_one("#system-processes", DataTable)
        if table.display:
            self.query_one("#system-body", VerticalScroll).scroll_to_widget(table, animate=False, top=True)
            table.focus()

    def action_scroll(self, lines: int) -> None:
        self.query_one("#system-body", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_back(self) -> None:
        if self.cursor is not None:
            self.cursor = None
            self.redraw()
        elif self.focused is not None:
            self.set_focus(None)
        else:
            self.dismiss()

    def action_close(self) -> None:
        self.dismiss()


def fixed_range(spec: ChartSpec, node: NodeSeries) -> tuple[float, float] | None:
    """RAM is drawn against the node's memory, from 0: a line near the top is a machine near its end."""
    total = node.sample.get("mem_total") if node.sample else None
    if spec.kind == "mem" and isinstance(total, int | float) and total > 0:
        return (0.0, total / spec.scale)
    return None


def node_heading(node: NodeSeries) -> Text:
    """`● box · live · 16 cores · 125 GiB · Linux x86_64 · no NVIDIA GPU: ...` (stored text as text)."""
    row, info = node.node, node.node.get("info") or {}
    state = str(row.get("state") or "?")
    mark = {"live": "●", "lost": "✕", "stopped": "○"}.get(state, "?")
    line = Text(f"{mark} ", style="green" if state == "live" else "red")
    line.append(visible_line(str(row.get("name") or "?")), style="bold")
    line.append(f" · {state}")
    if state == "lost" and row.get("lost_at"):
        line.append(f" at {clock(row['lost_at'])}")
    if isinstance(info, dict):
        if isinstance(info.get("cores"), int):
            line.append(f" · {info['cores']} cores")
        if isinstance(info.get("memory"), int | float):
            line.append(f" · {size(info['memory'])} RAM")
        if isinstance(info.get("platform"), str):
            line.append(f" · {visible_line(info['platform'])}")
        gpus = info.get("gpus")
        if isinstance(gpus, list) and gpus:
            names = {visible_line(str(g.get("name"))) for g in gpus if isinstance(g, dict)}
            line.append(f" · {len(gpus)} × {', '.join(sorted(names))}")
    if node.sample is not None:
        line.append(f" · sampled {clock(node.sample.get('t'))}")
    note = row.get("note")
    if isinstance(note, str) and note:
        line.append(f" · {visible_line(note)}", style="dim")
    return line


def process_cells(row: dict[str, Any]) -> list[Text]:
    """A process of the run as the table's cells (stored text as text)."""
    role = str(row.get("role") or "")
    if row.get("rank") is not None:
        role += f" {row['rank']}"
    ended = row.get("ended_at") is not None
    if ended:
        end = row.get("end_reason") or ""
        if not end and row.get("signal") is not None:
            end = f"signal {row['signal']}"
        elif not end and row.get("exit_code") is not None:
            end = f"exit {row['exit_code']}"
        if row.get("end_step") is not None and "step" not in end:
            end += f" at step {row['end_step']:,}"
    else:
        end = ""
    cpu = row.get("cpu")
    cells = [
        str(row.get("pid") or ""),
        role,
        str(row.get("node") or ""),
        f"{cpu:.0f}%" if isinstance(cpu, int | float) and not ended else "—",
        size(row["rss"]) if isinstance(row.get("rss"), int) and not ended else "—",
        size(row["gpu_mem"]) if isinstance(row.get("gpu_mem"), int) and not ended else "—",
        str(row.get("state") or ""),
        end[:MAX_CELL],
    ]
    return [
        Text(visible_line(cell), style="red" if ended and i == 7 and cell else "")
        for i, cell in enumerate(cells)
    ]
