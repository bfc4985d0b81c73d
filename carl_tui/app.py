"""The control room: one screen, keyboard first, drawn only when the store changed.

Harlequin's split: thread workers poll the store, read it and write commands, and post one message
per result; the app owns all state and hands each widget only what it shows. Widgets redraw only
when their data differs, so an idle screen writes nothing to the terminal. The UI thread never
touches the store: the watcher reads it (carl_tui/model.py), short reads run in workers
(carl_tui/reads.py) and so do commands, the only rows the control room writes (carl_tui/commands.py).

The keys live by concern, in mixins of the app (so their actions are the app's): training control
(controls.py), comparing runs (comparing.py), the activity panes (activity.py), what the screen
shows (screen_keys.py), the metrics explorer, the record inspector and the pinned charts
(explorer_keys.py), the System pane and screen (system_keys.py); and the engine's supervision
(supervisor.py).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from pathlib import Path

from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import Reactive
from textual.screen import Screen
from textual.widgets import OptionList
from textual.worker import get_current_worker

from engine import paths
from engine.store import RunRow
from engine.text import visible_line
from themes import DEFAULT_THEME, STYLESHEET, THEME_NAMES, THEMES
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane
from widgets.chart import LINE_COLOURS, Chart
from widgets.command_log import CommandLog
from widgets.key_bar import KeyBar
from widgets.reward_bars import RewardBars
from widgets.status_bar import StatusBar, StatusInfo
from widgets.system_pane import SystemPane

from .activity import ActivityPanes
from .commands import QUEUED_UNTIL_UP, CommandSender
from .comparing import ComparingRuns
from .comparison import Comparison
from .config import ConfigError, TuiConfig, config_path, load_config
from .controls import CONTROL_ACTIONS, RUN_ACTIONS, RunControls
from .explorer_keys import ExplorerKeys
from .keymap import check_keymap, keymap_line, known_ids
from .model import (
    FirstRead,
    RunView,
    Snapshot,
    Starting,
    StoreWatcher,
    command_of_run,
    nats_state,
    plane_starting,
    queued_state,
    run_state,
    starting_state,
    state_line,
)
from .notices import HeldNotices
from .panes import RewardsPane, draw_run, line_style, rewards_title, set_title
from .reads import StoreReads
from .runs import RunList
from .screen_keys import PANES, ScreenKeys
from .supervisor import READONLY_ENGINE_HINT, EngineSupervision, ended, nap
from .system_keys import SystemPanes

DESTRUCTIVE = frozenset({"stop_run", "agents_stop_worker"})  # debounced longer


class StoreUpdated(Message):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class ControlRoom(
    RunControls,
    ComparingRuns,
    ActivityPanes,
    ScreenKeys,
    ExplorerKeys,
    EngineSupervision,
    SystemPanes,
    HeldNotices,
    App[None],
):
    TITLE = "carl-tui"
    CSS_PATH = str(STYLESHEET)
    # The control room's default theme is the app's from the start: setting `theme` in __init__ has Textual
    # parse every stylesheet again and restyle the screen as the app starts (about 15 ms of the first frame).
    theme: Reactive[str] = Reactive(DEFAULT_THEME)
    ENABLE_COMMAND_PALETTE = True
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
            "1", "maximize('phi')", "Maximize the Φ pane (again: restore)", show=False, id="maximize-phi"
        ),
        Binding("2", "maximize('rewards')", "Maximize the Rewards pane", show=False, id="maximize-rewards"),
        Binding(
            "3",
            "maximize('trajectories')",
            "Maximize the Trajectories pane",
            show=False,
            id="maximize-trajectories",
        ),
        Binding("4", "maximize('agents')", "Maximize the Agents pane", show=False, id="maximize-agents"),
        Binding("5", "maximize('system')", "Maximize the System pane", show=False, id="maximize-system"),
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
        home: Path | None = None,
        *,
        readonly: bool = False,
        start_engine: bool = True,
        refresh_hz: float | None = None,
        api_key: str | None = None,
        claude_base_url: str | None = None,
        experiment: str | None = None,
        first_read: FirstRead | None = None,
        follow_run: str | None = None,
    ) -> None:
        """`first_read`: the store's first read, already made (`carl-tui` makes it before it
        imports Textual); by default the control room makes it here. `follow_run`: the name of a run the
        engine was just asked to start (`carl-tui --demo`): the status line says how far it has come until
        it opens, and the control room selects it then."""
        super().__init__()
        self.home = home or paths.carl_home()
        self.db_path = paths.db_path(self.home)
        self.api_key = api_key  # for the diagnosis chat only; never stored or shown
        self.claude_base_url = claude_base_url
        self.readonly = readonly
        # A watch-only session starts nothing that writes: it shows the engine as it finds it.
        self.auto_engine = start_engine and not readonly
        self.engine_started_pid: int | None = None  # the engine this control room started, if any
        self.engine_found_down = False  # the last look found it down (read-only: say how to start it)
        self.engine_asked = False  # the user asked for the engine from the palette
        self.engine_state = "down"  # until the first read says (below)
        self.engine_said: str | None = (
            None  # the engine's last problem notified (said again only if it changes)
        )
        self.config_error: str | None = None
        try:
            self.config = load_config(self.home)
        except ConfigError as exc:
            self.config, self.config_error = TuiConfig(), str(exc)
        self.keymap, _ = check_keymap(self.config.keymap)  # the ids are checked after the first frame
        self.refresh_hz = min(refresh_hz or self.config.refresh_hz, 4.0)
        # The first paint has the store's data: it is read before the screen is built.
        self.first_read = first_read or FirstRead(StoreWatcher(self.db_path))
        self.watcher = self.first_read.watcher
        # The first frame says what the supervisor will find: up, or starting when this session starts it.
        if self.first_read.engine_up:
            self.engine_state = "up"
        elif self.auto_engine:
            self.engine_state = "starting"
        else:
            self.engine_state = "stopped" if self.first_read.engine_stopped else "down"
        self.starting = Starting()  # runs and the agents plane on their way (model.py)
        self.agent_data: tuple[list[dict], list[dict], int | None] = ([], [], None)
        self.sender = CommandSender(self, self.db_path, self.watcher, readonly=readonly)
        self.reads = StoreReads(self, self.db_path)
        self.runs: list[RunRow] = []
        self.selected: int | None = None  # the run asked of the watcher (it picks the newest at first)
        self.view: RunView | None = None
        self.filter_text = ""
        self.message: str | None = None
        self.maximized: str | None = None
        self.last_key: dict[str, float] = {}
        self.select_next_new_run = False
        self.follow_run = follow_run  # the run on its way that is selected when it opens (by its name)
        self.domains: list[dict] = []  # trajectory domain baselines, with the trajectories
        self.plasticity: dict | None = None
        self.agents_overview: dict = {}  # the agents plane: server, plane, manager, model (see the reader)
        self.comparison = Comparison(LINE_COLOURS)  # UI state only, never stored
        self.experiment_ref = experiment  # `carl-tui --experiment NAME`, opened at mount
        for theme in THEMES:
            self.register_theme(theme)
        if self.config.theme != self.theme:  # another theme chosen: set as Textual sets it (a refresh)
            self.theme = self.config.theme

    # -- layout ----------------------------------------------------------------------------

    @property
    def main(self) -> Screen:
        """The control room's own screen: store updates keep drawing it while a dialog, the chat or a
        trajectory is open on top (App.query_one would search the screen on top)."""
        return self.screen_stack[0] if self.screen_stack else self.screen

    @property
    def run_list(self) -> RunList:
        return self.main.query_one("#run-list", RunList)

    def widgets_gone(self) -> bool:
        """A message that arrives while the app shuts down finds its screen or widgets gone."""
        return not self.screen_stack or not self.screen_stack[0].query(StatusBar)

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                with Vertical(id="runs-pane") as runs:
                    runs.border_title = "Runs"
                    yield RunList(id="run-list")
                    yield CommandLog(id="command-log")
                system = SystemPane(id="system", classes="pane")  # the machines (carl_tui/system_keys.py)
                system.border_title = "System"
                yield system
            with Vertical(id="main"):
                # The panes with one widget are that widget, border and title included: a
                # container around each would cost the first frame a widget and its lines.
                phi = Chart(id="phi-chart", classes="pane")
                phi.border_title = "Φ coherence"
                yield phi
                with RewardsPane(id="rewards-pane", classes="pane") as rewards:
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
        yield KeyBar()  # fitted to the width; ctrl+p is listed in the help instead

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        self.main.query_one("#phi-chart", Chart).empty_text = "no Φ data yet"
        self.main.query_one("#reward-chart", Chart).empty_text = "no reward data yet"
        self.apply_chart_mode()
        self.run_list.focus()
        if self.config_error:
            self.notify(self.config_error, title="config", severity="error", timeout=10)
        self.update_status()
        self.size_system_pane()
        self.theme_changed_signal.subscribe(self, self.theme_changed)
        # The store was read before the screen was built: apply it now so the first paint has the data.
        if (snapshot := self.first_read.take()) is not None:
            self.store_updated(StoreUpdated(snapshot))
        if self.experiment_ref is not None:
            self.open_experiment(self.experiment_ref)
        self.watch_store()
        self.call_after_refresh(self.after_first_paint)

    def after_first_paint(self) -> None:
        if not gc.isenabled():  # `carl-tui` starts without the collector (cli.py): back on now
            gc.freeze()  # what start-up built lives as long as the app: later collections skip it
            gc.enable()
        self.supervise_engine()  # not urgent
        if self.config.keymap:  # the screens that declare the other ids load on first use: check now
            _, problems = check_keymap(self.config.keymap, known_ids())
            if problems:
                line = keymap_line(problems, config_path(self.home))
                self.notify(line, title="keymap", severity="warning", timeout=10, markup=False)

    # -- workers ---------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="store")
    def watch_store(self) -> None:
        """Poll `PRAGMA data_version` at most `refresh_hz` times a second; post only news."""
        worker = get_current_worker()
        period = 1.0 / self.refresh_hz
        while not ended(worker):
            started = time.monotonic()
            snapshot = self.watcher.poll()
            if snapshot is not None:
                self.post_message(StoreUpdated(snapshot))
            nap(worker, period - (time.monotonic() - started))

    # -- messages from workers -------------------------------------------------------------

    @on(CommandSender.Queued)
    def command_queued(self, event: CommandSender.Queued) -> None:
        self.sender.queued(event.request)

    @on(CommandSender.Failed)
    def command_failed(self, event: CommandSender.Failed) -> None:
        self.sender.failed(event.request, event.error)

    @on(StoreReads.Done)
    def read_done(self, event: StoreReads.Done) -> None:
        if not self.widgets_gone():
            event.then(event.result)

    @on(StoreReads.Failed)
    def read_failed(self, event: StoreReads.Failed) -> None:
        self.notify(event.error, title=event.title, severity="error", timeout=10, markup=False)

    @on(StoreUpdated)
    def store_updated(self, event: StoreUpdated) -> None:
        if self.widgets_gone():
            return
        snap = event.snapshot
        if snap.error:
            self.message = snap.error
        if self.selected is None and snap.selected is not None:
            self.selected = snap.selected  # the watcher's pick: the newest run
        with self.batch_update():
            if snap.runs is not None:
                newest = max((r.id for r in snap.runs), default=0)
                if self.select_next_new_run and newest > max((r.id for r in self.runs), default=0):
                    self.select_next_new_run = False  # the run started with `n`: follow it
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
                draw_run(self.main, self.view, comparing=self.comparison.comparing)
                self.draw_pins()
                if status_changed:
                    self.refresh_bindings()  # run controls depend on the run's state
            if snap.trajectories is not None:
                self.main.query_one(TrajectoriesPane).set_rows(snap.trajectories, snap.trajectory_count or 0)
                self.domains, self.plasticity = snap.domains or [], snap.plasticity
                self.main.query_one("#trajectories").border_subtitle = trajectory_summary(
                    self.domains, self.plasticity
                )
            if snap.starting is not None:
                self.starting = snap.starting
            if snap.agent_events is not None:
                self.agents_overview = snap.agent_overview or {}
                self.agent_data = (snap.agent_events or [], snap.agent_workers or [], snap.agent_count)
            if snap.agent_events is not None or snap.starting is not None:
                self.feed_agents_pane()
            if snap.agent_task is not None:
                self.agent_task_updated(snap.agent_task)
            for command in snap.commands:
                self.sender.finished(command)
                ok = command["state"] == "done"
                self.notify(
                    command.get("result") or command["state"],
                    title=command["verb"],
                    severity="information" if ok else "error",
                    timeout=8,
                )
            if snap.box is not None:
                self.box_updated(snap.box)
            elif snap.view is not None or snap.runs is not None:
                self.draw_system()  # the run's throughput, or another run selected
            if snap.trajectories is not None or snap.agent_events is not None:
                self.place_pins()  # pinned charts take the activity row's place while it is empty
            if snap.news():
                self.expire_notices()  # a notice whose time is up goes with this frame (carl_tui/notices.py)
            if snap.source_errors is not None:
                errors = snap.source_errors
                path = self.view.run.source_path if self.view else None
                self.message = errors.get(path) if path else (next(iter(errors.values())) if errors else None)
            self.update_status()

    def on_resize(self, event: events.Resize) -> None:
        self.size_system_pane(event.size.height)  # before App's own handler takes the new size

    def refit_rewards_title(self) -> None:
        """The Rewards pane's title for the pane's new width (narrower, it says less; carl_tui/panes.py); the
        pane calls it when it is resized."""
        if self.view is not None and not self.comparison.comparing:
            pane = self.main.query_one("#rewards-pane")
            set_title(pane, rewards_title(self.view, pane.outer_size.width))

    # -- the run list and the status line -------------------------------------------------------

    def select(self, run_id: int) -> None:
        """Show this run: the watcher reads it in full, and its view replaces the last one."""
        self.selected = run_id
        self.watcher.select(run_id)
        self.view = None
        self.run_list.highlight_run(run_id)  # the list says which run the panes show

    def fill_run_list(self) -> None:
        self.run_list.show(
            self.runs,
            filter_text=self.filter_text,
            selected=self.selected,
            marks=self.comparison.marks,
            style_of=lambda color: line_style(self.main, color),
        )

    @on(OptionList.OptionHighlighted, "#run-list")
    def run_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index != event.option_list.highlighted:
            return  # the highlight moved on since this message was sent (a run selected meanwhile)
        run_id = int(event.option.id) if event.option.id else None
        if run_id is not None and run_id != self.selected:
            self.select(run_id)
            self.draw_compare()  # the highlighted run's lines go on top

    def feed_agents_pane(self) -> None:
        """The Agents pane: the plane's events and workers, and whether the plane is on its way."""
        overview = dict(self.agents_overview)
        if plane_starting(overview, self.starting, self.engine_state):
            overview["starting"] = True
        events, workers, count = self.agent_data
        self.main.query_one(AgentsPane).set_data(events, workers, overview, count)

    def update_status(self) -> None:
        view = self.view
        run = view.run if view else None
        now = time.time()
        state = state_line(run) if run else None
        waiting = run is None or self.select_next_new_run or self.follow_run is not None
        queued = self.starting.queued_run(self.runs) if waiting else None
        if queued is not None:  # a run on its way (`--demo`, `n`): how far it has come, not the last run
            run, view, state = None, None, queued_state(queued, self.engine_state, now)
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
            engine=self.engine_state,
            engine_hint=READONLY_ENGINE_HINT if self.readonly and self.engine_found_down else None,
            # The plane's NATS server, while the plane is wanted or on its way.
            nats=nats_state(self.agents_overview, self.starting, self.engine_state),
            readonly=self.readonly,
            message=self.message,
        )
        self.main.query_one(StatusBar).show(info)

    def action_rollouts(self) -> None:
        """The rollouts viewer on the selected run (carl_tui/rollouts_view.py, loaded on first use)."""
        if self.view is None:
            self.notify("no run selected: no rollouts to show", title="rollouts")
            return
        from .rollouts_model import RolloutsReader
        from .rollouts_view import RolloutsScreen

        reader = RolloutsReader(self.db_path, self.view.run.id, period=1.0 / self.refresh_hz)
        self.push_screen(RolloutsScreen(self.view.run, reader, chart_mode=self.config.chart_mode))

    def action_log_view(self) -> None:
        """The log view on the selected run's console (carl_tui/console_view.py, loaded on first use)."""
        if self.view is None:
            self.notify("no run selected: no console to show", title="console")
            return
        from .console_view import ConsoleScreen

        self.push_screen(ConsoleScreen(self.view.run, self.db_path))

    def queued_suffix(self) -> str:
        return "" if self.engine_state == "up" else QUEUED_UNTIL_UP

    # -- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only sessions hide every key that writes; run controls are dimmed for runs that
        no carl runner listens to (observed runs)."""
        if action in CONTROL_ACTIONS and self.sender.readonly:
            return False
        if action == "pause_resume":
            paused = self.view is not None and self.view.run.status == "paused"
            if parameters == (("resume",) if not paused else ("pause",)):
                return False  # the other of the pair is the one in force
        if action in RUN_ACTIONS and not self.runs_controllable():
            return None
        return True

    def key_for(self, binding_id: str, default: str) -> str:
        """The first key bound to this id, after the keymap (a confirmation asks for it again)."""
        return self.keymap.get(binding_id, default).split(",")[0]

    def debounced(self, action: str) -> bool:
        """Dolphie's debounce: 300 ms for destructive keys, 50 ms for the rest."""
        now = time.monotonic()
        wait = 0.3 if action in DESTRUCTIVE else 0.05
        if now - self.last_key.get(action, 0.0) < wait:
            return True
        self.last_key[action] = now
        return False

    # -- the command palette ------------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # Textual's own, but its "Theme" picker: it offers every theme Textual knows, where ours below
        # offers the control room's four (and two "Theme" entries read as a mistake).
        yield from (command for command in super().get_system_commands(screen) if command.title != "Theme")
        yield SystemCommand(
            "Observe a run",
            "Import or follow a run: TensorBoard, W&B, MLflow, Trackio, trainer_state.json, JSONL, rollouts",
            self.action_observe,
        )
        yield SystemCommand("Toggle chart mode", "Braille or block characters", self.action_toggle_chart_mode)
        yield SystemCommand(
            "Metrics explorer", "Every key of the run, or of the marked runs (m)", self.action_explore
        )
        yield SystemCommand(
            "Record inspector", "The stored row of the run's newest step (i)", self.action_inspect
        )
        for theme in THEME_NAMES:
            yield SystemCommand(
                f"Theme: {theme}", "Switch theme (remembered)", lambda t=theme: setattr(self, "theme", t)
            )
        if not self.readonly:  # a watch-only session starts nothing (the status line says how to)
            yield SystemCommand(
                "Start engine", "Start the engine daemon if it is down", self.start_engine_now
            )
        for pane in PANES:
            yield SystemCommand(
                f"Maximize {pane}",
                "Toggle the pane filling the screen",
                lambda p=pane: self.action_maximize(p),
            )


def trajectory_summary(domains: list[dict], plasticity: dict | None) -> Text | None:
    """The Trajectories pane's subtitle: domains and any retraining trigger that fired (as text: a
    border title given a str is markup)."""
    if not domains:
        return None
    fired = [t["kind"] for t in (plasticity or {}).get("triggers") or []]
    return Text(
        f"{len(domains)} domain{'s' if len(domains) != 1 else ''}"
        + (f" · ⚑ {visible_line(', '.join(fired))}" if fired else "")
    )
