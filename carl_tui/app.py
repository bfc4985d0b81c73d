"""The control room: one screen, keyboard first, drawn only when the store changed.

Harlequin's split: thread workers poll the store, read it and write commands, and each result comes back to
the UI thread as a message; the UI thread never touches the store. The watcher reads it (carl_tui/model.py),
short reads run in workers (carl_tui/reads.py) and so do commands, the only rows the control room writes
(carl_tui/command_sender.py); the engine's supervisor looks at the engine from a worker too
(carl_tui/supervisor.py).

The app is the session: where the store is, whether it is watch-only, the user's preferences and keymap,
and those services, which its parts reach through `Room` (carl_tui/room.py). What is on screen is the main
screen's (carl_tui/main_screen.py): its layout, its keys beside their actions, the runs and the selected
run; the other screens open over it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual import events, on
from textual.app import SystemCommand
from textual.message import Message
from textual.reactive import Reactive
from textual.screen import Screen
from textual.theme import Theme
from textual.worker import get_current_worker

from engine import paths
from themes import DEFAULT_THEME, STYLESHEET, THEME_NAMES, THEMES

from .command_sender import CommandSender
from .keymap import check_keymap, keymap_line, known_ids
from .main_screen import PANES, MainScreen
from .model import FirstRead, Snapshot, StoreWatcher
from .notices import HeldNotices
from .preferences import ConfigError, TuiConfig, config_path, load_config, save_config
from .reads import StoreReads
from .supervisor import EngineState, EngineSupervisor, ended, nap

DESTRUCTIVE = frozenset({"stop_run", "agents_stop_worker"})  # debounced longer


class StoreUpdated(Message):
    """The watcher's news: what changed in the store since its last look."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class ControlRoom(HeldNotices):
    TITLE = "carl-tui"
    CSS_PATH = str(STYLESHEET)
    # The control room's default theme is the app's from the start: setting `theme` in __init__ has Textual
    # parse every stylesheet again and restyle the screen as the app starts (about 15 ms of the first frame).
    theme: Reactive[str] = Reactive(DEFAULT_THEME)
    ENABLE_COMMAND_PALETTE = True

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
        self.engine = EngineSupervisor(
            self,
            self.home,
            readonly=readonly,
            start=start_engine,
            up=self.first_read.engine_up,
            stopped=self.first_read.engine_stopped,
        )
        self.sender = CommandSender(self, self.db_path, self.watcher, readonly=readonly)
        self.reads = StoreReads(self, self.db_path)
        self.last_key: dict[str, float] = {}
        self.experiment_ref = experiment  # `carl-tui --experiment NAME`, opened at mount
        self.follow_run = follow_run
        self.main_screen: MainScreen | None = None  # made when the app starts
        for theme in THEMES:
            self.register_theme(theme)
        if self.config.theme != self.theme:  # another theme chosen: set as Textual sets it (a refresh)
            self.theme = self.config.theme

    # -- the main screen -------------------------------------------------------------------------

    def get_default_screen(self) -> MainScreen:
        self.main_screen = MainScreen(
            self, first=self.first_read.take(), experiment=self.experiment_ref, follow_run=self.follow_run
        )
        return self.main_screen

    @property
    def main(self) -> MainScreen:
        """The control room's own screen: store updates keep drawing it while a dialog, the chat or a
        trajectory is open on top (App.query_one would search the screen on top)."""
        assert self.main_screen is not None, "the app has not started"
        return self.main_screen

    def widgets_gone(self) -> bool:
        """A message that arrives while the app starts or shuts down finds the main screen's widgets not
        there (yet, or any more)."""
        return self.main_screen is None or self.main_screen.gone()

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        if self.config_error:
            self.notify(self.config_error, title="config", severity="error", timeout=10)
        self.theme_changed_signal.subscribe(self, self.theme_changed)

    @on(MainScreen.Ready)
    def main_ready(self) -> None:
        """The main screen shows the store's first read: the watcher follows the store from there."""
        self.watch_store()
        self.call_after_refresh(self.after_first_paint)

    def after_first_paint(self) -> None:
        if not gc.isenabled():  # `carl-tui` starts without the collector (launch.py): back on now
            gc.freeze()  # what start-up built lives as long as the app: later collections skip it
            gc.enable()
        self.engine.supervise()  # not urgent
        if self.config.keymap:  # the screens that declare the other ids load on first use: check now
            _, problems = check_keymap(self.config.keymap, known_ids())
            if problems:
                line = keymap_line(problems, config_path(self.home))
                self.notify(line, title="keymap", severity="warning", timeout=10, markup=False)

    def on_resize(self, event: events.Resize) -> None:
        if self.main_screen is not None:
            self.main_screen.size_system_pane(event.size.height)  # before App's own handler takes the size

    # -- the store's watcher, in a worker ----------------------------------------------------------

    def watch_store(self) -> None:
        self.run_worker(self._watch_store, thread=True, exclusive=True, group="store", description="watch")

    def _watch_store(self) -> None:
        """Poll `PRAGMA data_version` at most `refresh_hz` times a second; post only news."""
        worker = get_current_worker()
        period = 1.0 / self.refresh_hz
        while not ended(worker):
            started = time.monotonic()
            snapshot = self.watcher.poll()
            if snapshot is not None:
                self.post_message(StoreUpdated(snapshot))
            nap(worker, period - (time.monotonic() - started))

    # -- what comes back from the workers ----------------------------------------------------------

    @on(StoreUpdated)
    def store_updated(self, event: StoreUpdated) -> None:
        if self.widgets_gone():
            return
        with self.batch_update():
            self.main.show(event.snapshot)
            if event.snapshot.news():
                self.expire_notices()  # a notice whose time is up goes with this frame (carl_tui/notices.py)

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

    @on(EngineState)
    def engine_state(self, event: EngineState) -> None:
        if self.widgets_gone():
            return
        self.engine.changed(event, shown=self.main.message)
        self.main.engine_changed()

    # -- the session: preferences, keys ------------------------------------------------------------

    def theme_changed(self, theme: Theme) -> None:
        if theme.name in THEME_NAMES and theme.name != self.config.theme:
            self.config = self.config.replace(theme=theme.name)
            self.save_config()
        if not self.widgets_gone():
            self.main.theme_changed()

    def save_config(self) -> None:
        if self.config_error:
            return  # never overwrite a file the user has to fix by hand
        if self.readonly:
            return  # a watch-only session writes nothing: the theme and chart mode hold for this session
        try:
            save_config(self.home, self.config)
        except OSError as exc:
            self.notify(f"cannot save {config_path(self.home)}: {exc}", severity="warning", markup=False)

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

    # -- the command palette ------------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        # Textual's own, but its "Theme" picker: it offers every theme Textual knows, where ours below
        # offers the control room's four (and two "Theme" entries read as a mistake).
        yield from (command for command in super().get_system_commands(screen) if command.title != "Theme")
        main = self.main
        yield SystemCommand(
            "Observe a run",
            "Import or follow a run: TensorBoard, W&B, MLflow, Trackio, trainer_state.json, JSONL, rollouts",
            main.action_observe,
        )
        yield SystemCommand("Toggle chart mode", "Braille or block characters", main.action_toggle_chart_mode)
        yield SystemCommand(
            "Metrics explorer", "Every key of the run, or of the marked runs (m)", main.action_explore
        )
        yield SystemCommand(
            "Record inspector", "The stored row of the run's newest step (i)", main.action_inspect
        )
        for theme in THEME_NAMES:
            yield SystemCommand(
                f"Theme: {theme}", "Switch theme (remembered)", lambda t=theme: setattr(self, "theme", t)
            )
        if not self.readonly:  # a watch-only session starts nothing (the status line says how to)
            yield SystemCommand(
                "Start engine", "Start the engine daemon if it is down", self.engine.start_now
            )
        for pane in PANES:
            yield SystemCommand(
                f"Maximize {pane}",
                "Toggle the pane filling the screen",
                lambda p=pane: main.action_maximize_pane(p),
            )
