"""The control room's main screen: the Runs list and the System pane on the left; the Φ, Rewards,
Trajectories and Agents panes (and any pinned charts) on the right; the status line on top and the key bar
at the foot. Its keys are bound here, beside their actions, by concern: what the screen shows (help, filter,
maximise, theme, chart mode), the selected run's views (metrics explorer, record inspector, rollouts, log,
System screen), training control (carl_tui/controls.py), comparing runs.

It draws each store snapshot the watcher posts (carl_tui/model.py), handing each pane only what it shows;
a pane redraws only when its data differs, so an idle screen writes nothing to the terminal. It owns what it
shows: the runs, the selected run and its view, the comparison (carl_tui/comparison.py), the filter, the
maximised pane, the box; its parts own the rest: the run controls (carl_tui/controls.py), the activity row
(carl_tui/activity_row.py), the pinned charts (carl_tui/pins.py). What it needs of the control room is a
`Room` (carl_tui/room.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input, OptionList

from engine.store import RunRow
from engine.text import visible_line
from themes import THEME_NAMES
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane
from widgets.chart import LINE_COLOURS, Chart
from widgets.command_log import CommandLog
from widgets.key_bar import KeyBar
from widgets.reward_bars import RewardBars
from widgets.status_bar import StatusBar, StatusInfo
from widgets.system_pane import BoxData, SystemPane

from .activity_row import ActivityRow
from .comparison import Comparison
from .controls import CONTROL_ACTIONS, RUN_ACTIONS, RunControls
from .explorer_model import ShownRun
from .keymap import help_rows, key_display
from .model import (
    BoxView,
    ExperimentView,
    RunView,
    Snapshot,
    Starting,
    command_of_run,
    find_experiment,
    nats_state,
    queued_state,
    run_state,
    starting_state,
    state_line,
)
from .panes import (
    RewardsPane,
    draw_comparison,
    draw_run,
    line_style,
    rewards_title,
    set_title,
)
from .pins import PinsRow
from .preferences import config_path
from .runs import RunList
from .supervisor import READONLY_ENGINE_HINT

if TYPE_CHECKING:
    from .room import Room

PANES = ("phi", "rewards", "trajectories", "agents", "system")  # what the digit keys maximise
SYSTEM_SHARE = 2  # the System pane takes at most half the body's height (as tall as its lines: often fewer)
SYSTEM_MIN_LINES = 3


class MainScreen(Screen[None]):
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help", key_display="?", id="help"),
        Binding("slash", "filter", "Filter runs", key_display="/", show=False, id="filter"),
        Binding("o", "observe", "Observe", id="observe"),
        Binding("n", "new_run", "New run", id="new-run"),
        # One key, two bindings: the key bar says what space will do (check_action shows one of them).
        Binding(
            "space",
            "pause_resume('pause')",
            "Pause",
            key_display="space",
            tooltip="Pause the run",
            id="pause",
        ),
        Binding(
            "space",
            "pause_resume('resume')",
            "Resume",
            key_display="space",
            tooltip="Resume the run",
            id="resume",
        ),
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint"),
        Binding("s", "stop_run", "Stop", id="stop"),
        Binding("l", "set_lr", "Learning rate", show=False, id="learning-rate"),
        Binding("w", "set_weight", "Reward weight", show=False, id="reward-weight"),
        Binding("r", "resume_run", "Resume a stopped or crashed run", show=False, id="resume-run"),
        Binding("v", "samples", "Samples (per-token Φ)", show=False, id="samples"),
        Binding("R", "rollouts", "Rollouts viewer", show=False, id="rollouts"),
        Binding("L", "log_view", "Console log of the run", show=False, id="log-view"),
        Binding("d", "diagnose", "Diagnose", id="diagnose"),
        Binding(
            "m",
            "explore",
            "Metrics explorer: every key of the run, or of the marked runs",
            show=False,
            id="explorer",
        ),
        Binding("i", "inspect", "Record inspector: the newest step's stored row", show=False, id="inspect"),
        Binding(
            "e", "show_eval", "Held-out eval: show it, or run it when there is none", show=False, id="eval"
        ),
        Binding("t", "next_theme", "Theme", show=False, id="next-theme"),
        Binding("b", "toggle_chart_mode", "Braille or block charts", show=False, id="chart-mode"),
        Binding(
            "1", "maximize_pane('phi')", "Maximize the Φ pane (again: restore)", show=False, id="maximize-phi"
        ),
        Binding(
            "2", "maximize_pane('rewards')", "Maximize the Rewards pane", show=False, id="maximize-rewards"
        ),
        Binding(
            "3",
            "maximize_pane('trajectories')",
            "Maximize the Trajectories pane",
            show=False,
            id="maximize-trajectories",
        ),
        Binding("4", "maximize_pane('agents')", "Maximize the Agents pane", show=False, id="maximize-agents"),
        Binding("5", "maximize_pane('system')", "Maximize the System pane", show=False, id="maximize-system"),
        Binding(
            "S",
            "system",
            "System screen: the machines over time, aligned with the run's steps, and its processes",
            show=False,
            id="system",
        ),
        Binding("X", "clear_marks", "Clear the comparison (unmark every run)", show=False, id="clear-marks"),
        Binding("E", "open_experiment", "Open an experiment as a comparison", show=False, id="experiments"),
        Binding(
            "T", "toggle_compare_reward", "Comparison: total or task reward", show=False, id="compare-reward"
        ),
        Binding("escape", "escape", "Close the filter / restore panes", show=False, id="escape"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(
        self,
        room: Room,
        *,
        first: Snapshot | None = None,
        experiment: str | None = None,
        follow_run: str | None = None,
    ) -> None:
        """`first`: the store's first read, drawn before the first paint; `experiment`: one to open as
        a comparison (`carl-tui --experiment NAME`); `follow_run`: the name of a run the engine was just
        asked to start (`carl-tui --demo`): the status line says how far it has come until it opens, and
        it is selected then."""
        super().__init__()
        self.room = room
        self.first = first
        self.experiment_ref = experiment
        self.follow_run = follow_run
        self.runs: list[RunRow] = []
        self.selected: int | None = None  # the run asked of the watcher (it picks the newest at first)
        self.view: RunView | None = None
        self.starting = Starting()  # runs and the agents plane on their way (model.py)
        self.box: BoxView | None = None  # the machines, from the watcher
        self.comparison = Comparison(LINE_COLOURS)  # UI state only, never stored
        self.filter_text = ""
        self.message: str | None = None  # the store's or the selected source's error, in the status line
        self.maximized_pane: str | None = None
        self.controls = RunControls(room, self)
        self.ready = False  # its widgets are composed (as the app starts, after the app's first events)

    class Ready(Message):
        """The screen is composed and shows the store's first read: the watcher may start."""

    # -- layout ----------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with Vertical(id="runs-pane") as runs:
                    runs.border_title = "Runs"
                    yield RunList(id="run-list")
                    yield CommandLog(id="command-log")
                system = SystemPane(id="system", classes="pane")  # the machines, from the watcher's box
                system.border_title = "System"
                yield system
            with Vertical(id="main"):
                # The panes with one widget are that widget, border and title included: a
                # container around each would cost the first frame a widget and its lines.
                phi = Chart(id="phi-chart", classes="pane")
                phi.border_title = "Φ coherence"
                yield phi
                with RewardsPane(self.refit_rewards_title, id="rewards-pane", classes="pane") as rewards:
                    rewards.border_title = "Rewards"
                    yield Chart(id="reward-chart")
                    yield RewardBars(id="reward-bars")
                    # the comparison's legend (hidden until two runs are marked) is mounted on first use
                yield ActivityRow(self.room, id="activity")
        yield KeyBar()  # fitted to the width; ctrl+p is listed in the help instead

    def on_mount(self) -> None:
        self.ready = True
        self.query_one("#phi-chart", Chart).empty_text = "no Φ data yet"
        self.query_one("#reward-chart", Chart).empty_text = "no reward data yet"
        self.apply_chart_mode()
        self.run_list.focus()
        self.update_status()
        self.size_system_pane()
        # The store was read before the screen was built: draw it now so that the first paint has the data.
        if self.first is not None:
            first, self.first = self.first, None
            self.show(first)
        if self.experiment_ref is not None:
            self.open_experiment(self.experiment_ref)
        self.post_message(self.Ready())

    @property
    def run_list(self) -> RunList:
        return self.query_one("#run-list", RunList)

    @property
    def activity(self) -> ActivityRow:
        return self.query_one(ActivityRow)

    def gone(self) -> bool:
        """Not composed yet, or no longer: a message that arrives while the app shuts down finds the
        screen's widgets gone."""
        return not self.ready or not self.query(StatusBar)

    # -- a snapshot of the store --------------------------------------------------------------------------

    def show(self, snap: Snapshot) -> None:
        """Draw what the watcher read: each pane gets only what it shows, and only when it changed."""
        if snap.error:
            self.message = snap.error
        if self.selected is None and snap.selected is not None:
            self.selected = snap.selected  # the watcher's pick: the newest run
        with self.app.batch_update():
            if snap.runs is not None:
                newest = max((r.id for r in snap.runs), default=0)
                if self.controls.follow_new_run and newest > max((r.id for r in self.runs), default=0):
                    self.controls.follow_new_run = False  # the run started with `n`: follow it
                    self.select(newest)
                opened = next((r.id for r in snap.runs if r.name == self.follow_run), None)
                if opened is not None:  # the run `--demo` asked for has opened: show it
                    self.follow_run = None
                    self.select(opened)
                self.runs = snap.runs
                self.fill_run_list()
            if snap.compare is not None:
                self.comparison.compared = snap.compare
                self.draw_compare()
            experiment = self.comparison.experiment
            if snap.experiment is not None and experiment and snap.experiment.id == experiment.id:
                self.experiment_updated(snap.experiment)  # a cell started: its run joins the comparison
            if snap.view is not None and snap.view.run.id == self.selected:
                status_changed = self.view is None or self.view.run.status != snap.view.run.status
                self.view = snap.view
                draw_run(self, self.view, comparing=self.comparison.comparing)
                self.draw_pins()
                if status_changed:
                    self.refresh_bindings()  # run controls depend on the run's state
            activity = self.activity
            if snap.trajectories is not None:
                activity.show_trajectories(
                    snap.trajectories, snap.trajectory_count or 0, snap.domains or [], snap.plasticity
                )
            if snap.starting is not None:
                self.starting = snap.starting
            if snap.agent_events is not None:
                activity.take_agents(
                    snap.agent_events, snap.agent_workers or [], snap.agent_count, snap.agent_overview or {}
                )
            if snap.agent_events is not None or snap.starting is not None:
                activity.show_agents(self.starting, self.room.engine.state)
            if snap.agent_task is not None:
                activity.agent_task_updated(snap.agent_task)
            for command in snap.commands:
                self.room.sender.finished(command)
                ok = command["state"] == "done"
                self.notify(
                    command.get("result") or command["state"],
                    title=command["verb"],
                    severity="information" if ok else "error",
                    timeout=8,
                )
            if snap.box is not None:
                self.box = snap.box
                self.draw_system()
            elif snap.view is not None or snap.runs is not None:
                self.draw_system()  # the run's throughput, or another run selected
            if snap.trajectories is not None or snap.agent_events is not None:
                self.place_pins()  # pinned charts take the activity row's place while it is empty
            if snap.source_errors is not None:
                errors = snap.source_errors
                path = self.view.run.source_path if self.view else None
                self.message = errors.get(path) if path else (next(iter(errors.values())) if errors else None)
            self.update_status()

    def engine_changed(self) -> None:
        """The engine's state moved: the status line, the agents plane on its way with it, the System pane
        (which says when a quiet machine's engine is down)."""
        self.update_status()
        self.activity.show_agents(self.starting, self.room.engine.state)
        self.draw_system()

    def theme_changed(self) -> None:
        """Redraw what the theme colours: the reward bars, the marks, the Agents pane, the status line."""
        if self.view is not None:
            draw_run(self, self.view, comparing=self.comparison.comparing)  # bar colours: the theme's
        if self.comparison.marks:
            self.fill_run_list()  # so are the marks' colours
            self.draw_compare()
        self.query_one(AgentsPane).redraw()
        self.query_one(StatusBar).info = StatusInfo()  # force the status line to recolour
        self.update_status()

    # -- the run list and the status line ---------------------------------------------------------------

    def select(self, run_id: int) -> None:
        """Show this run: the watcher reads it in full, and its view replaces the last one."""
        self.selected = run_id
        self.room.watcher.select(run_id)
        self.view = None
        self.run_list.highlight_run(run_id)  # the list says which run the panes show

    def fill_run_list(self) -> None:
        self.run_list.show(
            self.runs,
            filter_text=self.filter_text,
            selected=self.selected,
            marks=self.comparison.marks,
            style_of=lambda color: line_style(self, color),
        )

    @on(OptionList.OptionHighlighted, "#run-list")
    def run_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index != event.option_list.highlighted:
            return  # the highlight moved on since this message was sent (a run selected meanwhile)
        run_id = int(event.option.id) if event.option.id else None
        if run_id is not None and run_id != self.selected:
            self.select(run_id)
            self.draw_compare()  # the highlighted run's lines go on top

    def update_status(self) -> None:
        view = self.view
        run = view.run if view else None
        now = time.time()
        engine = self.room.engine
        state = state_line(run) if run else None
        waiting = run is None or self.controls.follow_new_run or self.follow_run is not None
        queued = self.starting.queued_run(self.runs) if waiting else None
        if queued is not None:  # a run on its way (`--demo`, `n`): how far it has come, not the last run
            run, view, state = None, None, queued_state(queued, engine.state, now)
        elif run is not None and state == "starting":
            command = command_of_run(self.starting, run)
            since = command["created_at"] if command else run.started_at
            state = starting_state(self.starting.stage, since, now)
        reason = run.health_reasons[0] if run and run.health_reasons else None
        info = StatusInfo(
            run=run.name if run else (queued["args"].get("name") or "run") if queued else None,
            state=state,
            backend=run.backend if run and run.backend in ("torch", "mlx") else None,
            step=run.last_step if run else None,
            max_steps=run.max_steps if run else None,
            eta_s=view.eta_s if view and run_state(view.run) == "live" else None,
            eta_label=view.eta_label if view else None,
            phase=run.phase if run else None,
            health=run.health if run else None,
            health_reason=reason if run and run.health != "green" else None,
            eval_passed=view.eval["passed"] if view and view.eval else None,
            eval_task=view.eval["metrics"].get("task") if view and view.eval else None,
            engine=engine.state,
            engine_hint=READONLY_ENGINE_HINT if self.room.readonly and engine.found_down else None,
            # The plane's NATS server, while the plane is wanted or on its way.
            nats=nats_state(self.activity.overview, self.starting, engine.state),
            readonly=self.room.readonly,
            message=self.message,
        )
        self.query_one(StatusBar).show(info)

    def refit_rewards_title(self) -> None:
        """The Rewards pane's title for the pane's new width (narrower, it says less; carl_tui/panes.py); the
        pane calls it when it is resized."""
        if self.view is not None and not self.comparison.comparing:
            pane = self.query_one("#rewards-pane")
            set_title(pane, rewards_title(self.view, pane.outer_size.width))

    # -- keys ---------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only sessions hide every key that writes; run controls are dimmed for runs that
        no carl runner listens to (observed runs)."""
        if action in CONTROL_ACTIONS and self.room.sender.readonly:
            return False
        if action == "pause_resume":
            paused = self.view is not None and self.view.run.status == "paused"
            if parameters == (("resume",) if not paused else ("pause",)):
                return False  # the other of the pair is the one in force
        if action in RUN_ACTIONS and not self.controls.controllable():
            return None
        return True

    # -- what the screen shows: help, the filter, a maximised pane, the theme, the chart mode -------------

    def action_help(self) -> None:
        """The keys in force here (carl_tui/keymap.py `help_rows`), as the keymap maps them."""
        from .screens import HelpScreen  # modal screens load on first use, not at start-up

        keymap = self.room.keymap
        close = key_display(keymap.get("help.close", "escape")).split(" / ")[0]
        extra = f"{close} closes this · Store: {self.room.db_path}\nConfig: {config_path(self.room.home)}"
        self.app.push_screen(HelpScreen(help_rows(self, keymap), extra))

    def filter_box(self) -> Input | None:
        boxes = self.query("#run-filter")
        return boxes.first(Input) if boxes else None

    def action_filter(self) -> None:
        box = self.filter_box()
        if box is None:
            box = Input(placeholder="filter (regex)", id="run-filter")  # mounted on first use
            self.query_one("#runs-pane").mount(box, before=0)
        box.display = True
        box.focus()

    @on(Input.Changed, "#run-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.fill_run_list()

    @on(Input.Submitted, "#run-filter")
    def filter_submitted(self) -> None:
        self.run_list.focus()

    def action_escape(self) -> None:
        box = self.filter_box()
        if box is not None and box.display:
            box.value = ""
            box.display = False
            self.run_list.focus()
        elif self.maximized_pane:
            self.action_maximize_pane(self.maximized_pane)

    def action_maximize_pane(self, pane: str) -> None:
        """Toggle one pane filling the main area (LEET's digit keys)."""
        main = self.query_one("#main")
        body = self.query_one("#body")  # the System pane sits in the left column: it fills the body
        for name in PANES:
            main.remove_class(f"-max-{name}")
        body.remove_class("-max-system")
        self.maximized_pane = None if self.maximized_pane == pane else pane
        self.size_system_pane()
        if self.maximized_pane == "system":
            body.add_class("-max-system")
        elif self.maximized_pane:
            main.add_class(f"-max-{pane}")
            lists: dict[str, type[Widget]] = {"trajectories": TrajectoriesPane, "agents": AgentsPane}
            if pane in lists:  # its keys work at once (the pane that had focus may be hidden now)
                self.query_one(lists[pane]).focus()

    def action_quit(self) -> None:
        """Leave the control room (training and the engine go on)."""
        self.app.exit()

    def action_next_theme(self) -> None:
        names = list(THEME_NAMES)
        index = names.index(self.app.theme) if self.app.theme in names else -1
        self.app.theme = names[(index + 1) % len(names)]

    def action_toggle_chart_mode(self) -> None:
        mode = "block" if self.room.config.chart_mode == "braille" else "braille"
        self.room.config = self.room.config.replace(chart_mode=mode)
        self.room.save_config()
        self.apply_chart_mode()

    def apply_chart_mode(self) -> None:
        for chart in self.query(Chart):
            chart.mode = self.room.config.chart_mode

    # -- training control (carl_tui/controls.py) ----------------------------------------------------------

    def action_pause_resume(self, verb: str | None = None) -> None:
        self.controls.pause_resume(verb)

    def action_checkpoint(self) -> None:
        self.controls.checkpoint()

    def action_stop_run(self) -> None:
        self.controls.stop_run()

    def action_set_lr(self) -> None:
        self.controls.set_lr()

    def action_set_weight(self) -> None:
        self.controls.set_weight()

    def action_new_run(self) -> None:
        self.controls.new_run()

    def action_resume_run(self) -> None:
        self.controls.resume_run()

    def action_show_eval(self) -> None:
        self.controls.show_eval()

    def action_observe(self) -> None:
        self.controls.observe()

    def action_samples(self) -> None:
        self.controls.samples()

    def action_diagnose(self) -> None:
        self.controls.diagnose()

    # -- the selected run's views -------------------------------------------------------------------------

    def action_rollouts(self) -> None:
        """The rollouts viewer on the selected run (carl_tui/rollouts_view.py, loaded on first use)."""
        if self.view is None:
            self.notify("no run selected: no rollouts to show", title="rollouts")
            return
        from .rollouts_model import RolloutsReader
        from .rollouts_view import RolloutsScreen

        reader = RolloutsReader(self.room.db_path, self.view.run.id, period=1.0 / self.room.refresh_hz)
        self.app.push_screen(RolloutsScreen(self.view.run, reader, chart_mode=self.room.config.chart_mode))

    def action_log_view(self) -> None:
        """The log view on the selected run's console (carl_tui/console_view.py, loaded on first use)."""
        if self.view is None:
            self.notify("no run selected: no console to show", title="console")
            return
        from .console_view import ConsoleScreen

        self.app.push_screen(ConsoleScreen(self.view.run, self.room.db_path))

    def action_system(self) -> None:
        """The System screen: every node's series over wall time, aligned with the selected run's steps, and
        the run's processes (carl_tui/system_view.py, loaded on first use)."""
        from .system_model import SystemFeed
        from .system_view import SystemScreen

        run = self.view.run if self.view is not None else None
        feed = SystemFeed(self.room.db_path, run.id if run else None, period=1.0 / self.room.refresh_hz)
        self.app.push_screen(SystemScreen(feed, run, chart_mode=self.room.config.chart_mode))

    def shown_runs(self) -> list[ShownRun]:
        """The marked runs in their colours, the selected one first, while comparing;
        else the selected run."""
        names = {run.id: run.name for run in self.runs}
        marks = self.comparison.marks
        if self.comparison.comparing:
            order = sorted(marks, key=lambda run_id: run_id != self.selected)
            return [ShownRun(i, visible_line(names.get(i) or marks[i].label), marks[i].color) for i in order]
        if self.selected is None or self.selected not in names:
            return []
        return [ShownRun(self.selected, visible_line(names[self.selected]))]

    def action_explore(self) -> None:
        """The metrics explorer on the shown runs (carl_tui/explorer.py, loaded on first use)."""
        runs = self.shown_runs()
        if not runs:
            self.notify("no run to explore yet", title="metrics")
            return
        from .explorer import ExplorerScreen

        name = next(run.name for run in self.runs if run.id == runs[0].id)
        self.app.push_screen(
            ExplorerScreen(
                self.room.db_path,
                runs,
                pinned=self.room.config.pinned(name),
                pin=lambda key: self.toggle_pin(name, key),
                inspect=self.open_inspector,
                chart_mode=self.room.config.chart_mode,
                refresh_s=1.0 / self.room.refresh_hz,
            )
        )

    def action_inspect(self) -> None:
        if self.selected is None:
            self.notify("no run to inspect yet", title="record")
            return
        self.open_inspector(self.selected, None)

    def open_inspector(self, run_id: int, step: int | None) -> None:
        from .inspector import InspectorScreen

        self.app.push_screen(InspectorScreen(self.room.db_path, run_id, step))

    # -- the pinned charts (carl_tui/pins.py) ---------------------------------------------------------------

    def toggle_pin(self, run_name: str, key: str) -> list[str]:
        """Pin the key for the run, or unpin it; kept in tui.toml (not by a watch-only session)."""
        self.room.config = self.room.config.toggle_pin(run_name, key)
        self.room.save_config()
        self.draw_pins()
        pinned = self.room.config.pinned(run_name)
        where = "pinned to" if key in pinned else "unpinned from"
        session = " for this session (read-only)" if self.room.readonly else ""
        self.notify(f"{visible_line(key)} {where} the main screen{session}", title="pins", markup=False)
        return pinned

    def pins_row(self) -> PinsRow | None:
        rows = self.query(PinsRow)
        return rows.first(PinsRow) if rows else None

    def draw_pins(self) -> None:
        """The selected run's pinned charts (their row mounted on first use)."""
        if self.view is None or self.gone():
            return
        keys = self.room.config.pinned(self.view.run.name)
        row = self.pins_row()
        if not keys:
            if row is not None:
                row.display = False
                self.place_pins()
            return
        if row is None:
            row = PinsRow(self.room, self, id="pins")
            self.query_one("#main").mount(row, before="#activity")
        row.show(self.view.run, keys)
        self.place_pins()

    def place_pins(self) -> None:
        """The pinned charts take the Trajectories/Agents row's place while both of its panes are empty."""
        row = self.pins_row()
        pinned = row is not None and bool(row.display)
        empty = self.query_one(TrajectoriesPane).has_class("-empty") and self.query_one(AgentsPane).has_class(
            "-empty"
        )
        self.query_one("#main").set_class(pinned and empty, "-pins-only")

    # -- the System pane ----------------------------------------------------------------------------------

    def draw_system(self) -> None:
        """Hand the System pane what it shows now; it redraws only the lines that changed."""
        if self.gone():
            return
        box = self.box
        view = self.view
        ours = box is not None and box.run_id == self.selected
        data = BoxData(
            nodes=box.nodes if box else [],
            samples=box.samples if box else {},
            intervals=box.intervals if box else {},
            run_dir=box.run_dir if box and ours else None,
            home=str(self.room.home),
            perf=view.perf if view is not None and view.run.id == self.selected else {},
            processes=box.processes if box and ours else [],
            engine=self.room.engine.state,
        )
        pane = self.query_one(SystemPane)
        pane.show(data)
        title = "System"
        if box and len(box.nodes) == 1:
            title += f" · {visible_line(str(box.nodes[0].get('name') or ''))}"
        elif box and box.nodes:
            title += f" · {len(box.nodes)} nodes"
        set_title(pane, title)

    def size_system_pane(self, height: int | None = None) -> None:
        """The System pane's height from the screen's (`height`, or the app's): at most half the body, or all
        of it maximised."""
        if self.gone():
            return
        body = max(0, (height or self.app.size.height) - 2)  # the status line and the key bar
        wide = self.maximized_pane == "system"
        lines = body - 2 if wide else max(SYSTEM_MIN_LINES, body // SYSTEM_SHARE - 2)
        self.query_one(SystemPane).set_size(lines, wide)

    # -- comparing runs: `x` marks the highlighted run, `X` clears the marks, `T` switches the reward drawn,
    # `E` (or `carl-tui --experiment NAME`) opens an experiment's runs as a comparison -----------------------

    def draw_compare(self) -> None:
        """Overlay the marked runs (one colour per run, per arm for an experiment), the highlighted
        run on top, a legend with each run's latest values."""
        if self.comparison.comparing:
            draw_comparison(self, self.comparison.plan(self.selected))

    def marks_changed(self) -> None:
        """Marks moved: the watcher reads the marked runs (only while two or more are marked), the
        list shows the marks, and the panes switch between one run and the comparison."""
        self.room.watcher.compare(self.comparison.wanted())
        self.room.watcher.follow_experiment(self.comparison.experiment_id)
        comparing = self.comparison.comparing
        self.query_one("#rewards-pane").set_class(comparing, "-compare")
        self.fill_run_list()
        if comparing:
            self.draw_compare()
        elif self.view is not None:
            draw_run(self, self.view, comparing=False)

    def action_toggle_mark(self) -> None:
        option = self.run_list.highlighted_option
        if option is None or option.id is None:
            return
        run_id = int(option.id)
        run = next((r for r in self.runs if r.id == run_id), None)
        self.comparison.toggle(run_id, run.name if run else None)
        self.marks_changed()

    def action_clear_marks(self) -> None:
        if not self.comparison.marks:
            return
        self.comparison.clear()
        self.marks_changed()

    def action_toggle_compare_reward(self) -> None:
        if not self.comparison.comparing:
            self.notify("mark two or more runs with x (in the Runs list) to compare them", title="compare")
            return
        self.comparison.toggle_reward()
        self.draw_compare()

    def action_open_experiment(self) -> None:
        self.room.reads.read(lambda reader: reader.experiments(), self.choose_experiment, title="experiments")

    def choose_experiment(self, experiments: list[dict[str, Any]] | None) -> None:
        if not experiments:
            self.notify("no experiments in the store yet", title="experiments")
            return
        from .screens import ChoiceScreen

        choices = [
            (
                str(e["id"]),
                f"{e['name']} · {', '.join(e['arms'])} × seeds "
                f"{', '.join(map(str, e['seeds']))} · {e['status']}",
            )
            for e in reversed(experiments)
        ]

        def chosen(experiment_id: str | None) -> None:
            if experiment_id:
                self.open_experiment(int(experiment_id))

        self.app.push_screen(
            ChoiceScreen("Experiments", "Compare the runs of which experiment?", choices), chosen
        )

    def open_experiment(self, ref: str | int) -> None:
        """Mark exactly the runs of an experiment (by name, or id), labelled `arm s<seed>` and
        coloured by arm, and follow it: cells that start later join the comparison."""
        self.room.reads.read(
            lambda reader: find_experiment(reader, ref),
            lambda experiment: self.experiment_found(ref, experiment),
            title="experiment",
        )

    def experiment_found(self, ref: str | int, experiment: ExperimentView | None) -> None:
        if experiment is None:
            self.notify(
                f"no experiment named {ref!r} in {self.room.db_path}",
                title="experiment",
                severity="error",
                timeout=10,
            )
            return
        self.comparison.open_experiment(experiment)
        self.marks_changed()
        if not self.comparison.marks:
            self.notify(
                f"experiment {experiment.name}: no run has started yet", title="experiment", markup=False
            )

    def experiment_updated(self, experiment: ExperimentView) -> None:
        """The followed experiment moved (a cell started): its new runs join the comparison."""
        if self.comparison.apply_experiment(experiment):
            self.marks_changed()
        elif self.comparison.comparing:
            self.draw_compare()  # the experiment's name may show in the title
