"""The control room: one screen, keyboard first, drawn only when the store changed.

Harlequin's split: a thread worker polls the store and posts one message per change; the
app owns all state and hands each widget only what it shows. Widgets redraw only when their
data differs, so an idle screen writes nothing to the terminal.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import Footer, OptionList
from textual.widgets.option_list import Option
from textual.worker import Worker, get_current_worker

if TYPE_CHECKING:
    from textual.widgets import Input

    from widgets.legend import Legend

    from .screens import ObserveRequest

from engine import paths
from engine.store import RunRow
from themes import STYLESHEET, THEME_NAMES, THEMES
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane
from widgets.chart import LINE_COLOURS, Chart
from widgets.command_log import CommandLog
from widgets.reward_bars import RewardBars
from widgets.status_bar import StatusBar, StatusInfo

from .config import ConfigError, TuiConfig, load_config, save_config
from .model import (
    CompareRun,
    ExperimentView,
    FirstRead,
    RunView,
    Snapshot,
    StoreWatcher,
    find_experiment,
    run_state,
)
from .panes import (
    COMPARE_REWARDS,
    draw_compare_phi,
    draw_compare_rewards,
    draw_phi,
    draw_rewards,
    reward_colors,
)

PANES = ("phi", "rewards", "trajectories", "agents")
DOWN = ("down", "stopped")  # engine states in which nothing runs it
READONLY_ENGINE_HINT = "`carl engine start` starts it"  # after "engine ✕ down" in a read-only status line
READONLY_ENGINE_DOWN = (
    "engine down — this session is watch-only and starts nothing; start it with `carl engine start`"
)
MARK = "▌"  # a run marked for comparison, in the Runs list


def _nap(worker: Worker, seconds: float) -> None:
    """Sleep in a thread worker, waking within 50 ms of its cancellation: `q` waits for the
    workers' threads, so a plain sleep (up to a minute of engine backoff) would hold the exit."""
    deadline = time.monotonic() + seconds
    while not worker.is_cancelled and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


class StoreUpdated(Message):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class EngineState(Message):
    def __init__(self, state: str, detail: str = "", *, started_pid: int | None = None) -> None:
        super().__init__()
        self.state = state
        self.detail = detail  # an error to show
        self.started_pid = started_pid  # this control room has just started the engine, as this process


class RunList(OptionList):
    """Runs, newest last; `j`/`k` move like the arrows, and the panes follow the highlight."""

    BINDINGS = [
        Binding("j", "cursor_down", "Next run", show=False),
        Binding("k", "cursor_up", "Previous run", show=False),
        Binding("x", "app.toggle_mark", "Mark / unmark the run for comparison", show=False),
    ]


@dataclass(frozen=True)
class Mark:
    """A run marked for comparison: its legend label and its chart colour (an index into the
    chart's line colours); the runs of one experiment arm share the arm's colour."""

    label: str
    color: int
    arm: str | None = None


class ControlRoom(App[None]):
    TITLE = "carl-tui"
    CSS_PATH = str(STYLESHEET)
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("slash", "filter", "Filter runs", key_display="/", show=False),
        Binding("o", "observe", "Observe"),
        Binding("n", "new_run", "New run"),
        Binding("space", "pause_resume", "Pause", key_display="space", tooltip="Pause or resume the run"),
        Binding("c", "checkpoint", "Checkpoint"),
        Binding("s", "stop_run", "Stop"),
        Binding("l", "set_lr", "Learning rate", show=False),
        Binding("w", "set_weight", "Reward weight", show=False),
        Binding("r", "resume_run", "Resume a stopped or crashed run", show=False),
        Binding("v", "samples", "Samples (per-token Φ)", show=False),
        Binding("d", "diagnose", "Diagnose"),
        Binding("e", "show_eval", "Held-out eval: show it, or run it when there is none", show=False),
        Binding("t", "next_theme", "Theme", show=False),
        Binding("b", "toggle_chart_mode", "Braille or block charts", show=False),
        Binding("1", "maximize('phi')", "Maximize the Φ pane (again: restore)", show=False),
        Binding("2", "maximize('rewards')", "Maximize the Rewards pane", show=False),
        Binding("3", "maximize('trajectories')", "Maximize the Trajectories pane", show=False),
        Binding("4", "maximize('agents')", "Maximize the Agents pane", show=False),
        Binding("X", "clear_marks", "Clear the comparison (unmark every run)", show=False),
        Binding("E", "open_experiment", "Open an experiment as a comparison", show=False),
        Binding("T", "toggle_compare_reward", "Comparison: total or task reward", show=False),
        Binding("escape", "escape", "Close the filter / restore panes", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        home: Path | None = None,
        *,
        readonly: bool = False,
        start_engine: bool = True,
        refresh_hz: float | None = None,
        api_key: str | None = None,
        claude_base_url: str | None = None,
        experiment: str | None = None,
        first_read: FirstRead | None = None,
    ) -> None:
        """`first_read`: the store's first read, already made (`carl-tui` makes it before it
        imports Textual); by default the control room makes it here."""
        super().__init__()
        self.home = home or paths.carl_home()
        self._api_key = api_key  # for the diagnosis chat only; never stored or shown
        self.claude_base_url = claude_base_url
        self.readonly = readonly
        # A watch-only session starts nothing that writes: it shows the engine as it finds it.
        self.auto_engine = start_engine and not readonly
        self.engine_started_pid: int | None = None  # the engine this control room started, if any
        self._engine_found_down = False  # the last look found it down (read-only: say how to start it)
        self.config_error: str | None = None
        try:
            self.config = load_config(self.home)
        except ConfigError as exc:
            self.config, self.config_error = TuiConfig(), str(exc)
        self.refresh_hz = min(refresh_hz or self.config.refresh_hz, 4.0)
        # The first paint has the store's data: it is read before the screen is built.
        self._first_read = first_read or FirstRead(StoreWatcher(paths.db_path(self.home)))
        self.watcher = self._first_read.watcher
        self.runs: list[RunRow] = []
        self.view: RunView | None = None
        self.filter_text = ""
        self.engine_state = "down"
        self.message: str | None = None
        self.maximized: str | None = None
        self._last_key: dict[str, float] = {}
        self._select_next_new_run = False
        self._engine_asked = False  # the user asked for the engine from the palette
        self.domains: list[dict] = []  # trajectory domain baselines, with the trajectories
        self.plasticity: dict | None = None
        self._in_flight: dict[int, tuple[int, str]] = {}  # run id -> (command id, verb) sent from here
        self.agents_overview: dict = {}  # the agents plane: server, plane, manager, model (see the reader)
        self._agents_in_flight: dict[int, str] = {}  # agents command id -> verb, sent from here
        # Comparing runs: UI state only, never stored. Two or more marks overlay the Φ and reward charts.
        self.marks: dict[int, Mark] = {}  # run id -> mark, in the order marked (the legend's order)
        self.compared: dict[int, CompareRun] = {}  # the marked runs' series, from the watcher
        self.compare_reward = "reward"  # or "rewards/task/mean" (`T`)
        self.experiment: ExperimentView | None = None  # the experiment opened as the comparison
        self._experiment_cells: dict[tuple[str, int], int] = {}  # (arm, seed) -> run id marked for it
        self._open_experiment_ref = experiment  # `carl-tui --experiment NAME`, opened at mount
        for theme in THEMES:
            self.register_theme(theme)
        self.theme = self.config.theme

    # -- layout ----------------------------------------------------------------------------

    @property
    def main(self) -> Screen:
        """The control room's own screen: store updates keep drawing it while a dialog, the chat or a
        trajectory is open on top (App.query_one would search the screen on top)."""
        return self.screen_stack[0] if self.screen_stack else self.screen

    def _widgets_gone(self) -> bool:
        """A message that arrives while the app shuts down finds its screen or widgets gone."""
        return not self.screen_stack or not self.screen_stack[0].query(StatusBar)

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="runs-pane") as runs:
                runs.border_title = "Runs"
                yield RunList(id="run-list")
                yield CommandLog(id="command-log")
            with Vertical(id="main"):
                # The panes with one widget are that widget, border and title included: a
                # container around each would cost the first frame a widget and its lines.
                phi = Chart(id="phi-chart", classes="pane")
                phi.border_title = "Φ coherence"
                yield phi
                with Horizontal(id="rewards-pane", classes="pane") as rewards:
                    rewards.border_title = "Rewards"
                    yield Chart(id="reward-chart")
                    yield RewardBars(id="reward-bars")
                    # the comparison's legend (hidden until two runs are marked) is mounted on first use
                with Horizontal(id="activity"):
                    traj = TrajectoriesPane(id="trajectories", classes="pane")
                    traj.border_title = "Trajectories"
                    yield traj
                    agents = AgentsPane(readonly=self.readonly, id="agents", classes="pane")
                    agents.border_title = "Agents"
                    yield agents
        yield Footer(show_command_palette=False)  # ctrl+p is listed in the help instead

    def on_mount(self) -> None:
        self.main.query_one("#phi-chart", Chart).empty_text = "no Φ data yet"
        self.main.query_one("#reward-chart", Chart).empty_text = "no reward data yet"
        self._apply_chart_mode()
        self.main.query_one("#run-list", RunList).focus()
        if self.config_error:
            self.notify(self.config_error, title="config", severity="error", timeout=10)
        self._update_status()
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        # The store was read before the screen was built: apply it now so the first paint has the data.
        if (snapshot := self._first_read.take()) is not None:
            self._store_updated(StoreUpdated(snapshot))
        if self._open_experiment_ref is not None:
            self.open_experiment(self._open_experiment_ref)
        self.watch_store()
        self.call_after_refresh(self._after_first_paint)

    def _after_first_paint(self) -> None:
        if not gc.isenabled():  # `carl-tui` starts without the collector (cli.py): back on now
            gc.freeze()  # what start-up built lives as long as the app: later collections skip it
            gc.enable()
        self.supervise_engine()  # not urgent

    # -- workers ---------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="store")
    def watch_store(self) -> None:
        """Poll `PRAGMA data_version` at most `refresh_hz` times a second; post only news."""
        worker = get_current_worker()
        period = 1.0 / self.refresh_hz
        while not worker.is_cancelled:
            started = time.monotonic()
            snapshot = self.watcher.poll()
            if snapshot is not None:
                self.post_message(StoreUpdated(snapshot))
            _nap(worker, period - (time.monotonic() - started))

    @work(thread=True, exclusive=True, group="engine")
    def supervise_engine(self) -> None:
        """Start the engine if it is down; restart it (with backoff) if it dies."""
        from engine.control import engine_status, start_engine

        worker = get_current_worker()
        backoff = 2.0
        seen_up = False
        while not worker.is_cancelled:
            # Read-only: not even a dead engine's pidfile is removed.
            status = engine_status(self.home, recover=not self.readonly)
            if status.state == "up":
                self.post_message(EngineState("up"))
                seen_up, backoff = True, 2.0
            elif (status.stopped_by_user and not self._engine_asked) or not self.auto_engine:
                self.post_message(EngineState("stopped" if status.stopped_by_user else "down"))
            else:
                self.post_message(EngineState("restarting" if seen_up else "starting"))
                started = False
                try:
                    status, started = start_engine(self.home, wait=10.0)
                except Exception as exc:  # report, keep showing what is stored
                    self.post_message(EngineState("down", f"engine failed to start: {exc}"))
                if status.state != "up":
                    self.post_message(EngineState("down", f"engine did not start; see {status.log_path}"))
                    _nap(worker, backoff)
                    backoff = min(backoff * 2, 60.0)
                    continue
                self.post_message(EngineState("up", started_pid=status.pid if started else None))
                seen_up = True
            _nap(worker, 2.0)

    # -- messages from workers -------------------------------------------------------------

    @on(EngineState)
    def _engine_state(self, event: EngineState) -> None:
        if self._widgets_gone():
            return
        if event.detail and event.detail != self.message:
            self.notify(event.detail, title="engine", severity="error", timeout=8)
        if event.started_pid is not None:
            # The engine outlives this control room: say so now, and (cli.py) again after `q`.
            from engine.control import started_line

            self.engine_started_pid = event.started_pid
            self.notify(
                started_line(event.started_pid, after="you quit"), title="engine", timeout=12, markup=False
            )
        down = event.state in DOWN
        if self.readonly and down and not self._engine_found_down:  # once, until it has been up again
            self.notify(READONLY_ENGINE_DOWN, title="engine", severity="warning", timeout=30, markup=False)
        self._engine_found_down = down
        self.engine_state = event.state
        self._update_status()

    @on(StoreUpdated)
    def _store_updated(self, event: StoreUpdated) -> None:
        if self._widgets_gone():
            return
        snap = event.snapshot
        if snap.error:
            self.message = snap.error
        with self.batch_update():
            if snap.runs is not None:
                newest = max((r.id for r in snap.runs), default=0)
                if self._select_next_new_run and newest > max((r.id for r in self.runs), default=0):
                    self._select_next_new_run = False  # the run started with `n`: follow it
                    self.watcher.select(newest)
                    self.view = None
                self.runs = snap.runs
                self._fill_run_list()
            if snap.compare is not None:
                self.compared = snap.compare
                self._draw_compare()
            if snap.experiment is not None and self.experiment and snap.experiment.id == self.experiment.id:
                self._apply_experiment(snap.experiment)  # a cell started: its run joins the comparison
            if snap.view is not None and snap.view.run.id == self.watcher.selected:
                status_changed = self.view is None or self.view.run.status != snap.view.run.status
                self.view = snap.view
                self._draw_view()
                if status_changed:
                    self.refresh_bindings()  # run controls depend on the run's state
            if snap.trajectories is not None:
                self.main.query_one(TrajectoriesPane).set_rows(snap.trajectories, snap.trajectory_count or 0)
                self.domains, self.plasticity = snap.domains or [], snap.plasticity
                self.main.query_one("#trajectories").border_subtitle = _trajectory_summary(
                    self.domains, self.plasticity
                )
            if snap.agent_events is not None:
                self._agents_updated(snap)
            for command in snap.commands:
                if self._in_flight.get(command.get("run_id") or -1, (None,))[0] == command["id"]:
                    del self._in_flight[command["run_id"]]
                self._agents_in_flight.pop(command["id"], None)
                ok = command["state"] == "done"
                self.notify(
                    command.get("result") or command["state"],
                    title=command["verb"],
                    severity="information" if ok else "error",
                    timeout=8,
                )
            if snap.source_errors is not None:
                errors = snap.source_errors
                path = self.view.run.source_path if self.view else None
                self.message = errors.get(path) if path else (next(iter(errors.values())) if errors else None)
            self._update_status()

    def _agents_updated(self, snap: Snapshot) -> None:
        self.agents_overview = snap.agent_overview or {}
        pane = self.main.query_one(AgentsPane)
        pane.set_data(
            snap.agent_events or [], snap.agent_workers or [], self.agents_overview, snap.agent_count
        )

    # -- drawing ---------------------------------------------------------------------------

    def _visible_runs(self) -> list[RunRow]:
        if not self.filter_text:
            return self.runs
        try:
            pattern = re.compile(self.filter_text, re.IGNORECASE)
        except re.error:
            pattern = re.compile(re.escape(self.filter_text), re.IGNORECASE)
        return [r for r in self.runs if pattern.search(r.name)]

    def _fill_run_list(self) -> None:
        run_list = self.main.query_one("#run-list", RunList)
        runs = self._visible_runs()
        options = [Option(self._run_label(r), id=str(r.id)) for r in reversed(runs)]
        selected = self.watcher.selected
        with self.batch_update():
            run_list.clear_options()
            run_list.add_options(options)
            for index, run in enumerate(reversed(runs)):
                if run.id == selected:
                    run_list.highlighted = index
                    break

    def _run_label(self, run: RunRow) -> str | Text:
        mark = {"live": "●", "silent": "◌", "presumed crashed": "✕", "finished": "✓", "failed": "✕"}
        label = f"{mark.get(run_state(run), '·')} {run.name}"
        marked = self.marks.get(run.id)
        if marked is None:
            return " " + label
        # Marked for comparison: a stripe in the run's colour in the first column (the list has no
        # left padding for it), so the list doubles as a legend.
        return Text.assemble((MARK, self._line_style(marked.color)), label)

    @on(OptionList.OptionHighlighted, "#run-list")
    def _run_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        run_id = int(event.option.id) if event.option.id else None
        if run_id is not None and run_id != self.watcher.selected:
            self.watcher.select(run_id)
            self.view = None
            if self.comparing:
                self._draw_compare()  # the highlighted run's lines go on top

    def _draw_view(self) -> None:
        view = self.view
        if view is None:
            return
        self.main.query_one(CommandLog).set_commands(view.commands)
        if self.comparing:
            return  # the Φ and Rewards panes show the comparison
        phi_chart = self.main.query_one("#phi-chart", Chart)  # the Φ pane is its chart
        phi_chart.border_title = draw_phi(phi_chart, view)
        colors = reward_colors(self.main.query_one("#reward-chart", Chart), len(view.reward_names))
        rewards_pane = self.main.query_one("#rewards-pane")
        rewards_pane.border_title = draw_rewards(self.main.query_one("#reward-chart", Chart), view, colors)
        bars = [(_short(name), view.latest(f"rewards/{name}/mean")) for name in view.reward_names]
        if "reward" in view.series:
            bars.append(("total", view.latest("reward")))
        self.main.query_one(RewardBars).set_values(bars, colors + ([""] if "reward" in view.series else []))
        phi_chart.set_markers(view.markers("gate_open", "crystallization"))
        self.main.query_one("#reward-chart", Chart).set_markers(view.markers("gate_open"))
        _set_subtitle(phi_chart, None)

    # -- comparing runs ------------------------------------------------------------------------

    @property
    def comparing(self) -> bool:
        return len(self.marks) >= 2

    def _line_style(self, color: int) -> Style:
        return self.main.query_one("#phi-chart", Chart).line_style(color)

    def _draw_compare(self) -> None:
        """Overlay the marked runs on the Φ and reward charts: one colour per run (per arm for an
        experiment), the highlighted run on top, a legend with each run's latest values."""
        if not self.comparing:
            return
        phi_chart = self.main.query_one("#phi-chart", Chart)
        reward_chart = self.main.query_one("#reward-chart", Chart)
        marked = [run_id for run_id in self.marks if run_id in self.compared]
        if self.watcher.selected in marked:  # drawn last, so on top
            marked.remove(self.watcher.selected)
            marked.insert(0, self.watcher.selected)
        runs = [self.compared[run_id] for run_id in marked]
        colors = [self.marks[run_id].color for run_id in marked]
        draw_compare_phi(phi_chart, runs, colors)
        draw_compare_rewards(reward_chart, runs, colors, self.compare_reward)
        phi_chart.set_markers(())
        reward_chart.set_markers(())
        reading = COMPARE_REWARDS[self.compare_reward]
        other = next(name for key, name in COMPARE_REWARDS.items() if key != self.compare_reward)
        what = f"experiment {self.experiment.name} · " if self.experiment else ""
        _set_title(phi_chart, f"Φ coherence · {what}{len(self.marks)} runs compared")
        _set_subtitle(phi_chart, self._compact_legend())
        _set_title(self.main.query_one("#rewards-pane"), f"Rewards · {reading} reward per run · T: {other}")
        from widgets.legend import LegendRow

        rows = []
        for run_id, mark in self.marks.items():
            run = self.compared.get(run_id)
            phi = run.latest("phi/mean") if run else None
            reward = run.latest(self.compare_reward) if run else None
            values = ("—" if phi is None else f"{phi:.4f}", "—" if reward is None else f"{reward:+.3f}")
            rows.append(LegendRow(mark.label, self._line_style(mark.color), values))
        self._legend().set_rows(rows, header=("Φ", reading))

    def _legend(self) -> Legend:
        """The comparison's legend, mounted in the Rewards pane the first time runs are compared:
        the first frame, which compares nothing, neither imports nor styles it."""
        from widgets.legend import Legend

        legends = self.main.query(Legend)
        if legends:
            return legends.first(Legend)
        legend = Legend(id="compare-legend")
        self.main.query_one("#rewards-pane").mount(legend)
        return legend

    def _compact_legend(self) -> Text:
        """The Φ pane's legend, in its bottom border: one entry per arm of an experiment (its seeds
        share the colour), else one per run."""
        out = Text()
        seen: set[str] = set()
        for mark in self.marks.values():
            name = mark.arm or mark.label
            if name in seen:
                continue
            seen.add(name)
            out.append(" ━ " + name, self._line_style(mark.color))
        out.append(" ")
        return out

    def _marks_changed(self) -> None:
        """Marks moved: the watcher reads the marked runs (only while two or more are marked), the
        list shows the marks, and the panes switch between one run and the comparison."""
        self.watcher.compare(list(self.marks) if self.comparing else [])
        if not self.comparing:
            self.compared = {}
        self.main.query_one("#rewards-pane").set_class(self.comparing, "-compare")
        self._fill_run_list()
        if self.comparing:
            self._draw_compare()
        else:
            self._draw_view()

    def action_toggle_mark(self) -> None:
        option = self.main.query_one("#run-list", RunList).highlighted_option
        if option is None or option.id is None:
            return
        run_id = int(option.id)
        if run_id in self.marks:
            del self.marks[run_id]
            if not self.marks:
                self._forget_experiment()
        else:
            cell = next((k for k, v in self._experiment_cells.items() if v == run_id), None)
            if cell is not None and self.experiment is not None:
                self.marks[run_id] = Mark(f"{cell[0]} s{cell[1]}", self._arm_color(cell[0]), cell[0])
            else:
                run = next((r for r in self.runs if r.id == run_id), None)
                self.marks[run_id] = Mark(run.name if run else str(run_id), self._free_color())
        self._marks_changed()

    def _free_color(self) -> int:
        used = {m.color for m in self.marks.values()}
        return next((i for i in range(LINE_COLOURS) if i not in used), len(self.marks) % LINE_COLOURS)

    def _arm_color(self, arm: str) -> int:
        arms = self.experiment.arms if self.experiment else []
        return (arms.index(arm) if arm in arms else len(arms)) % LINE_COLOURS

    def action_clear_marks(self) -> None:
        if not self.marks:
            return
        self.marks = {}
        self._forget_experiment()
        self._marks_changed()

    def _forget_experiment(self) -> None:
        self.experiment = None
        self._experiment_cells = {}
        self.watcher.follow_experiment(None)

    def action_toggle_compare_reward(self) -> None:
        if not self.comparing:
            self.notify("mark two or more runs with x (in the Runs list) to compare them", title="compare")
            return
        self.compare_reward = "rewards/task/mean" if self.compare_reward == "reward" else "reward"
        self._draw_compare()

    def action_open_experiment(self) -> None:
        from engine.store import StoreReader

        from .screens import ChoiceScreen

        db = paths.db_path(self.home)
        experiments = []
        if db.exists():
            reader = StoreReader(db)  # a short read of its own; the watcher is busy
            try:
                experiments = reader.experiments()
            finally:
                reader.close()
        if not experiments:
            self.notify("no experiments in the store yet", title="experiments")
            return
        choices = [
            (
                str(e["id"]),
                f"{e['name']} · {', '.join(e['arms'])} × seeds "
                f"{', '.join(map(str, e['seeds']))} · {e['status']}",
            )
            for e in reversed(experiments)
        ]
        self.push_screen(
            ChoiceScreen("Experiments", "Compare the runs of which experiment?", choices),
            lambda chosen: self.open_experiment(int(chosen)) if chosen else None,
        )

    def open_experiment(self, ref: str | int) -> bool:
        """Mark exactly the runs of an experiment (by name, or id), labelled `arm s<seed>` and
        coloured by arm, and follow it: cells that start later join the comparison."""
        from engine.store import StoreError, StoreReader

        db = paths.db_path(self.home)
        experiment = None
        try:
            reader = StoreReader(db)  # a short read of its own; the watcher is busy
            try:
                experiment = find_experiment(reader, ref)
            finally:
                reader.close()
        except StoreError as exc:
            self.notify(str(exc), title="experiment", severity="error", timeout=10)
            return False
        if experiment is None:
            self.notify(
                f"no experiment named {ref!r} in {db}", title="experiment", severity="error", timeout=10
            )
            return False
        self.marks = {}
        self._experiment_cells = {}
        self.experiment = experiment
        self.watcher.follow_experiment(experiment.id)
        self._apply_experiment(experiment)
        if not self.marks:
            self.notify(f"experiment {experiment.name}: no run has started yet", title="experiment")
        return True

    def _apply_experiment(self, experiment: ExperimentView) -> None:
        """Mark the runs of cells that started since last seen; a cell's retry replaces its old run."""
        self.experiment = experiment
        changed = False
        for cell in experiment.cells:
            run_id, key = cell["run_id"], (cell["arm"], int(cell["seed"]))
            if run_id is None or self._experiment_cells.get(key) == run_id:
                continue
            old = self._experiment_cells.get(key)
            if old is not None:
                self.marks.pop(old, None)
            self._experiment_cells[key] = run_id
            self.marks[run_id] = Mark(f"{key[0]} s{key[1]}", self._arm_color(key[0]), key[0])
            changed = True
        if changed:
            self._marks_changed()
        elif self.comparing:
            self._draw_compare()  # the experiment's name may show in the title

    def _update_status(self) -> None:
        view = self.view
        run = view.run if view else None
        reason = run.health_reasons[0] if run and run.health_reasons else None
        info = StatusInfo(
            run=run.name if run else None,
            state=run_state(run) if run else None,
            backend=run.backend if run and run.backend in ("torch", "mlx") else None,
            step=run.last_step if run else None,
            max_steps=run.max_steps if run else None,
            eta_s=view.eta_s if view and run_state(view.run) == "live" else None,
            phase=run.phase if run else None,
            health=run.health if run else None,
            health_reason=reason if run and run.health != "green" else None,
            eval_passed=view.eval["passed"] if view and view.eval else None,
            eval_task=view.eval["metrics"].get("task") if view and view.eval else None,
            engine=self.engine_state,
            engine_hint=READONLY_ENGINE_HINT if self.readonly and self._engine_found_down else None,
            nats=self._nats_state(),
            readonly=self.readonly,
            message=self.message,
        )
        self.main.query_one(StatusBar).show(info)

    def _nats_state(self) -> str | None:
        """The plane's NATS server state, while the plane is wanted; None when there is no plane."""
        server = self.agents_overview.get("server") or {}
        wanted = (self.agents_overview.get("plane") or {}).get("wanted")
        return (server.get("state") or "?") if server and wanted else None

    def _apply_chart_mode(self) -> None:
        for chart in self.main.query(Chart):
            chart.mode = self.config.chart_mode

    # -- actions ---------------------------------------------------------------------------

    def action_help(self) -> None:
        """Keys from the same binding tables that drive the footer: the control room's own first,
        then those of the widget that has focus, then Textual's app-wide ones."""
        active = self.screen.active_bindings
        own = {b.action for b in self._bindings_of(type(self))}
        rows: list[tuple[str, str]] = [("", "Control room")]
        for binding in self._bindings_of(type(self)):
            rows.append((binding.key_display or self._keys_of(binding.key), binding.description))
        rows.append(("", "Here"))
        seen = {d for _, d in rows}
        for entry in active.values():
            b = entry.binding
            if b.description and b.description not in seen and b.action not in own and entry.node is not self:
                seen.add(b.description)
                rows.append((self.get_key_display(b), b.tooltip or b.description))  # the longer one
        rows.append(("", "Everywhere"))
        rows += [
            ("ctrl+p", "Command palette: themes, chart mode, observe, engine, panes"),
            ("tab", "Next pane"),
        ]
        for entry in active.values():
            b = entry.binding
            if (
                b.description
                and b.description not in seen
                and entry.node is self
                and b.action != "command_palette"
            ):
                seen.add(b.description)
                rows.append((self.get_key_display(b), b.description))
        extra = f"Store: {paths.db_path(self.home)}\nConfig: {self.home / 'tui.toml'}"
        from .screens import HelpScreen  # modal screens load on first use, not at start-up

        self.push_screen(HelpScreen(rows, extra))

    @staticmethod
    def _bindings_of(cls: type) -> list[Binding]:
        return [b for b in cls.BINDINGS if isinstance(b, Binding) and b.description]

    @staticmethod
    def _keys_of(keys: str) -> str:
        names = {"question_mark": "?", "slash": "/", "escape": "esc"}
        return " / ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))

    def _filter_box(self) -> Input | None:
        boxes = self.main.query("#run-filter")
        return boxes.first() if boxes else None  # type: ignore[return-value]

    def action_filter(self) -> None:
        box = self._filter_box()
        if box is None:
            from textual.widgets import Input  # mounted on first use: one widget less at start-up

            box = Input(placeholder="filter (regex)", id="run-filter")
            self.main.query_one("#runs-pane").mount(box, before=0)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "run-filter":
            self.filter_text = event.value
            self._fill_run_list()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "run-filter":
            self.main.query_one("#run-list", RunList).focus()

    def action_escape(self) -> None:
        box = self._filter_box()
        if box is not None and box.display:
            box.value = ""
            box.display = False
            self.main.query_one("#run-list", RunList).focus()
        elif self.maximized:
            self.action_maximize(self.maximized)

    def action_maximize(self, pane: str) -> None:
        """Toggle one pane filling the main area (LEET's digit keys)."""
        main = self.main.query_one("#main")
        for name in PANES:
            main.remove_class(f"-max-{name}")
        self.maximized = None if self.maximized == pane else pane
        if self.maximized:
            main.add_class(f"-max-{pane}")
            lists = {"trajectories": TrajectoriesPane, "agents": AgentsPane}
            if pane in lists:  # its keys work at once (the pane that had focus may be hidden now)
                self.main.query_one(lists[pane]).focus()

    def action_next_theme(self) -> None:
        names = list(THEME_NAMES)
        index = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(index + 1) % len(names)]

    def _theme_changed(self, theme: Theme) -> None:
        if theme.name in THEME_NAMES and theme.name != self.config.theme:
            self.config = self.config.replace(theme=theme.name)
            self._save_config()
        self._draw_view()  # reward bar colours come from the theme
        if self.marks:
            self._fill_run_list()  # so do the marks' colours
            self._draw_compare()
        self.main.query_one(AgentsPane).redraw()
        self.main.query_one(StatusBar).info = StatusInfo()  # force the status line to recolour
        self._update_status()

    def action_toggle_chart_mode(self) -> None:
        mode = "block" if self.config.chart_mode == "braille" else "braille"
        self.config = self.config.replace(chart_mode=mode)
        self._save_config()
        self._apply_chart_mode()

    def _save_config(self) -> None:
        if self.config_error:
            return  # never overwrite a file the user has to fix by hand
        if self.readonly:
            return  # a watch-only session writes nothing: the theme and chart mode hold for this session
        try:
            save_config(self.home, self.config)
        except OSError as exc:
            self.notify(f"cannot save {self.home / 'tui.toml'}: {exc}", severity="warning")

    # -- training control -------------------------------------------------------------------

    CONTROL_ACTIONS = frozenset(
        {
            "new_run",
            "pause_resume",
            "checkpoint",
            "stop_run",
            "set_lr",
            "set_weight",
            "resume_run",
            "observe",
            "diagnose",
        }
    )
    RUN_ACTIONS = frozenset({"pause_resume", "checkpoint", "stop_run", "set_lr", "set_weight"})
    DESTRUCTIVE = frozenset({"stop_run", "agents_stop_worker"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only sessions hide every key that writes; run controls are dimmed for runs that
        no carl runner listens to (observed runs)."""
        if action in self.CONTROL_ACTIONS and self.readonly:
            return False
        if action in self.RUN_ACTIONS:
            run = self.view.run if self.view else None
            if run is None or run.source_kind not in CONTROLLABLE or run.status not in ("running", "paused"):
                return None
        return True

    def _debounced(self, action: str) -> bool:
        """Dolphie's debounce: 300 ms for destructive keys, 50 ms for the rest."""
        now = time.monotonic()
        wait = 0.3 if action in self.DESTRUCTIVE else 0.05
        if now - self._last_key.get(action, 0.0) < wait:
            return True
        self._last_key[action] = now
        return False

    def _pending_command(self) -> dict | None:
        """A command to this run not finished yet: one sent from here (known at once) or seen in
        the store (sent from another control room)."""
        if self.view is None:
            return None
        if self.view.run.id in self._in_flight:
            return {"verb": self._in_flight[self.view.run.id][1]}
        return next((c for c in self.view.commands if c["state"] in ("pending", "running")), None)

    def _send(self, verb: str, args: dict | None = None, *, target: str = "run") -> int | None:
        """Queue a command (the runner applies it at its next step boundary) and watch its outcome."""
        from engine.store import connect, insert_command

        run_id = self.view.run.id if (self.view and target == "run") else None
        if target == "run":
            pending = self._pending_command()
            if pending is not None:
                self.notify(
                    f"a command is already running: {pending['verb']}; wait for it", severity="warning"
                )
                return None
        db = paths.db_path(self.home)
        if not db.exists():
            self.notify("the store does not exist yet; is the engine starting?", severity="error")
            return None
        conn = connect(db, readonly=False)
        try:
            command_id = insert_command(conn, verb, args, target=target, run_id=run_id, origin="tui")
        finally:
            conn.close()
        self.watcher.watch_command(command_id)
        if run_id is not None:
            self._in_flight[run_id] = (command_id, verb)
        return command_id

    def action_pause_resume(self) -> None:
        if self._debounced("pause_resume") or self.view is None:
            return
        verb = "resume" if self.view.run.status == "paused" else "pause"
        if self._send(verb):
            self.notify(f"{verb} {self.view.run.name}: applied at the next step boundary", title=verb)

    def action_checkpoint(self) -> None:
        if self._debounced("checkpoint") or self.view is None:
            return
        if self._send("checkpoint"):
            self.notify(f"checkpoint of {self.view.run.name} requested", title="checkpoint")

    def action_stop_run(self) -> None:
        if self._debounced("stop_run") or self.view is None:
            return
        from .screens import ConfirmScreen

        run = self.view.run
        message = (
            f"Stop run {run.name!r} at step {run.last_step or 0:,}?\nIt saves a checkpoint first; "
            "you can resume it later with r.\n\ntab then enter (or s again) to stop, esc to cancel."
        )
        self.push_screen(ConfirmScreen("Stop training", message, "Stop", "s"), self._stop_confirmed)

    def _stop_confirmed(self, confirmed: bool | None) -> None:
        if confirmed and self.view is not None and self._send("stop"):
            self.notify(f"stopping {self.view.run.name}", title="stop")

    def action_set_lr(self) -> None:
        if self.view is None:
            return
        from .screens import ValueScreen

        current = self.view.latest("learning_rate")
        value = f"{current:g}" if current else ""
        self.push_screen(
            ValueScreen(
                "Learning rate", f"New learning rate for {self.view.run.name}", value, _positive_number
            ),
            self._lr_chosen,
        )

    def _lr_chosen(self, value: str | None) -> None:
        if value is not None and self._send("set_lr", {"lr": float(value)}):
            self.notify(f"learning rate → {float(value):g}", title="set_lr")

    def action_set_weight(self) -> None:
        if self.view is None:
            return
        from .screens import ValueScreen

        names = (
            ", ".join(_short(n) for n in self.view.reward_names)
            or "task, format, coherence, commitment, concise"
        )
        self.push_screen(
            ValueScreen("Reward weight", f"name=weight (rewards: {names})", "", _weight_problem),
            self._weight_chosen,
        )

    def _weight_chosen(self, value: str | None) -> None:
        if value is None:
            return
        name, weight = (part.strip() for part in value.split("=", 1))
        if self._send("set_weight", {"reward": name, "weight": float(weight)}):
            self.notify(f"weight of {name} → {float(weight):g}", title="set_weight")

    def action_new_run(self) -> None:
        if self._debounced("new_run"):
            return
        from .screens import ChoiceScreen

        choices = [("demo", "demo · the built-in tiny model on the tool-calling task (CPU, a few minutes)")]
        for path in sorted({*Path.cwd().glob("*.yaml"), *(self.home / "configs").glob("*.yaml")}):
            choices.append((str(path.resolve()), f"{path.name} · {path.parent}"))
        self.push_screen(
            ChoiceScreen("New run", "Train with which config? (carl init writes one)", choices),
            self._config_chosen,
        )

    def _config_chosen(self, config: str | None) -> None:
        if config is not None and self._send("train", {"config": config}, target="engine"):
            self._select_next_new_run = True
            queued = "" if self.engine_state == "up" else " (queued until the engine is up)"
            self.notify(f"starting a run with {Path(config).name}{queued}", title="new run")

    def action_resume_run(self) -> None:
        run = self.view.run if self.view else None
        if run is None or self._debounced("resume_run"):
            return
        if run.source_kind not in RESUMABLE or run.status in ("running", "paused", "finished"):
            self.notify("resume is for a stopped, failed or crashed carl run", severity="warning")
            return
        if self._send("train", {"resume": run.name}, target="engine"):
            self.notify(f"resuming {run.name} from its last checkpoint", title="resume")

    def action_samples(self) -> None:
        if self.view is None:
            return
        from engine.store import StoreReader

        from .screens import SamplesScreen

        reader = StoreReader(paths.db_path(self.home))  # a short read of its own; the watcher is busy
        try:
            samples = reader.samples(self.view.run.id, limit=40)
        finally:
            reader.close()
        self.push_screen(SamplesScreen(samples, self.view.run.vocab_size))

    def action_diagnose(self) -> None:
        if self.view is None:
            self.notify("no run selected: nothing to diagnose", title="diagnose")
            return
        db = paths.db_path(self.home)
        if not db.exists():
            return
        from .chat import ChatScreen

        run = self.view.run
        self.push_screen(
            ChatScreen(
                db,
                run.id,
                run.name,
                api_key=self._api_key,
                model=self.config.claude_model,
                base_url=self.claude_base_url,
            )
        )

    # -- the agents plane -------------------------------------------------------------------

    @on(AgentsPane.TitleChanged)
    def _agents_title(self, event: AgentsPane.TitleChanged) -> None:
        if self._widgets_gone():
            return
        pane = self.main.query_one("#agents")
        pane.border_title, pane.border_subtitle = event.title, event.subtitle or None

    @on(AgentsPane.OpenTask)
    def _open_agent_task(self, event: AgentsPane.OpenTask) -> None:
        from engine.store import StoreReader

        from .agents import AgentTaskScreen

        reader = StoreReader(paths.db_path(self.home))  # a short read of its own
        try:
            task = reader.agent_task(event.task_id)
        finally:
            reader.close()
        if task is None:
            self.notify(
                f"task {event.task_id[:8]} is not in the store (yet)", title="agents", severity="warning"
            )
            return
        self.push_screen(AgentTaskScreen(task))

    @on(AgentsPane.Control)
    def _agents_control(self, event: AgentsPane.Control) -> None:
        """`p`, `+` and `x` on the Agents pane: engine commands, answered by the plane itself."""
        if self.readonly or self._debounced(f"agents_{event.verb}"):
            return
        plane = self.agents_overview.get("plane") or {}
        if not plane.get("wanted"):
            self.notify(
                "the agents plane is not up: start it with `carl agents up`",
                title="agents",
                severity="warning",
            )
            return
        if event.verb == "pause_resume":
            self._agents_pause_resume()
        elif event.verb == "add_worker":
            if self._send_agents("agents_add_worker"):
                self.notify("adding a worker" + self._queued(), title="agents")
        elif event.verb == "stop_worker":
            self._agents_stop_worker(event.worker_id)

    def _agents_pause_resume(self) -> None:
        manager = self.agents_overview.get("manager") or {}
        state = manager.get("state")
        if state in ("done", "stopped"):
            self.notify(
                f"the manager is {state}: there is no assignment to pause", title="agents", severity="warning"
            )
            return
        pending = next(
            (v for v in self._agents_in_flight.values() if v in ("agents_pause", "agents_resume")), None
        )
        if pending:
            self.notify(f"a command is already running: {pending}; wait for it", severity="warning")
            return
        verb = "agents_resume" if state == "paused" else "agents_pause"
        if self._send_agents(verb):
            what = "resuming task assignment" if verb == "agents_resume" else "pausing task assignment"
            self.notify(what + self._queued(), title="agents")

    def _agents_stop_worker(self, worker_id: str | None) -> None:
        if worker_id is None:
            self.notify(
                "highlight a worker (or one of its events) to stop it", title="agents", severity="warning"
            )
            return
        worker = next(
            (w for w in self.main.query_one(AgentsPane).agent_workers if w["worker_id"] == worker_id), {}
        )
        if worker.get("state") in ("stopped", "stopping"):
            self.notify(f"worker {worker_id} is {worker['state']} already", title="agents")
            return
        from .screens import ConfirmScreen

        busy = " It finishes the task in hand first." if worker.get("state") == "busy" else ""
        message = (
            f"Stop worker {worker_id!r}?{busy}\nThe + key adds a new one.\n\n"
            "tab then enter (or x again) to stop, esc to cancel."
        )
        self.push_screen(
            ConfirmScreen("Stop worker", message, "Stop", "x"),
            lambda ok: self._stop_worker_confirmed(ok, worker_id),
        )

    def _stop_worker_confirmed(self, confirmed: bool | None, worker_id: str) -> None:
        if confirmed and self._send_agents("agents_stop_worker", {"worker_id": worker_id}):
            self.notify(f"stopping worker {worker_id}" + self._queued(), title="agents")

    def _send_agents(self, verb: str, args: dict | None = None) -> int | None:
        command_id = self._send(verb, args, target="engine")
        if command_id is not None:
            self._agents_in_flight[command_id] = verb
        return command_id

    def _queued(self) -> str:
        return "" if self.engine_state == "up" else " (queued until the engine is up)"

    @on(TrajectoriesPane.Selected)
    def _open_trajectory(self, event: TrajectoriesPane.Selected) -> None:
        from engine.store import StoreReader

        from .trajectories import TrajectoryScreen

        reader = StoreReader(paths.db_path(self.home))  # a short read of its own
        try:
            trajectory = reader.trajectory(int(event.row["id"]))
        finally:
            reader.close()
        if trajectory is None:
            self.notify("that trajectory is gone from the store", severity="warning")
            return
        self.push_screen(TrajectoryScreen(trajectory, self.domains, self.plasticity))

    def action_show_eval(self) -> None:
        if self.view is None:
            return
        run = self.view.run
        if self.view.eval is None:
            self._run_eval(True)
            return
        from .screens import EvalScreen

        self.push_screen(EvalScreen(run.name, self.view.eval), self._run_eval)

    def _run_eval(self, again: bool | None) -> None:
        """Ask the engine to evaluate the selected run on its held-out prompts (`e`, or `r` in the eval)."""
        if not again or self.view is None:
            return
        run = self.view.run
        if run.source_kind != "carl":
            self.notify(
                f"{run.name} was not trained by carl: there is no held-out split to evaluate on",
                title="eval",
                severity="warning",
            )
            return
        if self.readonly:
            self.notify(f"read-only session: run `carl eval {run.name}` from a shell", title="eval")
            return
        if run.status in ("running", "paused"):
            self.notify(
                f"{run.name} is still training: evaluate it once it has finished or stopped", title="eval"
            )
            return
        if self._send("eval", {"run": run.name}, target="engine"):
            self.notify(f"evaluating {run.name} on its held-out prompts…", title="eval")

    def action_observe(self) -> None:
        if self.readonly:
            self.notify("read-only session: observing a source writes to the store", severity="warning")
            return
        from .screens import ObserveScreen

        self.push_screen(ObserveScreen(validate=_observe_problem), self._observe_chosen)

    def _observe_chosen(self, request: ObserveRequest | None) -> None:  # noqa: F821
        if request is None:
            return
        from engine.store import connect, insert_command

        db = paths.db_path(self.home)
        if not db.exists():
            self.notify("the store does not exist yet; is the engine starting?", severity="error")
            return
        conn = connect(db, readonly=False)
        try:
            args = {
                "path": str(Path(request.path).expanduser().resolve()),
                "follow": request.follow,
                "name": request.name,
            }
            command_id = insert_command(conn, "observe", args, target="engine", origin="tui")
        finally:
            conn.close()
        self.watcher.watch_command(command_id)
        queued = "" if self.engine_state == "up" else " (queued until the engine is up)"
        self.notify(f"observe {request.path}{queued}", title="observe")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Observe a run", "Import a Trackio db, trainer_state.json or JSONL", self.action_observe
        )
        yield SystemCommand("Toggle chart mode", "Braille or block characters", self.action_toggle_chart_mode)
        for theme in THEME_NAMES:
            yield SystemCommand(
                f"Theme: {theme}", "Switch theme (remembered)", lambda t=theme: setattr(self, "theme", t)
            )
        if not self.readonly:  # a watch-only session starts nothing (the status line says how to)
            yield SystemCommand(
                "Start engine", "Start the engine daemon if it is down", self._start_engine_now
            )
        for pane in PANES:
            yield SystemCommand(
                f"Maximize {pane}",
                "Toggle the pane filling the screen",
                lambda p=pane: self.action_maximize(p),
            )

    def _start_engine_now(self) -> None:
        """Asked for by name (the palette): start it even if `carl engine stop` stopped it."""
        if self.readonly:
            self.notify(READONLY_ENGINE_DOWN, title="engine", severity="warning", markup=False)
            return
        self.auto_engine = True
        self._engine_asked = True
        self.supervise_engine()


CONTROLLABLE = (
    "carl",
    "callback",
    "agents",
)  # runs a carl runner, CarlCallback or the plane's trainer listens to
RESUMABLE = ("carl", "callback")  # runs `carl train --resume` carries on (the plane's trainer resumes itself)


def _positive_number(text: str) -> str | None:
    try:
        value = float(text)
    except ValueError:
        return f"{text!r} is not a number"
    return None if value > 0 and value == value and value != float("inf") else "must be a positive number"


def _weight_problem(text: str) -> str | None:
    if "=" not in text:
        return "write name=weight, e.g. coherence=0.5"
    name, weight = (part.strip() for part in text.split("=", 1))
    if not name:
        return "the reward name is empty"
    try:
        value = float(weight)
    except ValueError:
        return f"{weight!r} is not a number"
    return None if value >= 0 else "a weight cannot be negative"


def _set_title(pane: Widget, title: str) -> None:
    _set_border(pane, "title", title)


def _set_subtitle(pane: Widget, subtitle: Text | None) -> None:
    _set_border(pane, "subtitle", subtitle)


def _set_border(pane: Widget, which: str, text: str | Text | None) -> None:
    """Set a border title as plain text (a run name is not markup), and only when it changed:
    setting one repaints the pane even when it is the same."""
    new = None if text is None else Content.from_rich_text(text if isinstance(text, Text) else Text(text))
    if getattr(pane, f"_border_{which}", None) != new:
        setattr(pane, f"border_{which}", new)


def _short(reward_name: str) -> str:
    """TRL names reward keys after the function: `format_reward` reads better as `format`."""
    return reward_name.removesuffix("_reward") or reward_name


def _observe_problem(path: str) -> str | None:
    """A one-line reason the path cannot be observed, checked before anything is queued."""
    from engine.observe import ObserveError, detect_kind

    try:
        detect_kind(Path(path).expanduser())
    except ObserveError as exc:
        return str(exc)
    return None


def _trajectory_summary(domains: list[dict], plasticity: dict | None) -> str:
    """The Trajectories pane's subtitle: domains and any retraining trigger that fired."""
    if not domains:
        return ""
    fired = [t["kind"] for t in (plasticity or {}).get("triggers") or []]
    return f"{len(domains)} domain{'s' if len(domains) != 1 else ''}" + (
        f" · ⚑ {', '.join(fired)}" if fired else ""
    )
