"""What the main screen and its parts need of the control room, as a Protocol: none of them imports the app
(carl_tui/app.py, whose `ControlRoom` is the one implementation), and mypy checks both sides of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen

from .command_sender import CommandSender
from .model import RunView, StoreWatcher
from .preferences import TuiConfig
from .reads import StoreReads
from .supervisor import EngineSupervisor


class Room(Protocol):
    """The session (its home and store, whether it is watch-only, the user's preferences, the refresh rate,
    the key for Claude), the services its parts share (the store's watcher, the one command sender, the short
    reads, the engine's supervisor), and the app's two ways to the user: a notice and a screen."""

    home: Path
    db_path: Path
    readonly: bool
    api_key: str | None  # for the diagnosis chat only; never stored or shown
    claude_base_url: str | None
    refresh_hz: float
    config: TuiConfig
    keymap: dict[str, str]  # binding ids to keys: the usable entries of tui.toml's [keymap]
    watcher: StoreWatcher
    sender: CommandSender
    reads: StoreReads
    engine: EngineSupervisor

    def save_config(self) -> None:
        """Keep `config` in tui.toml (a watch-only session keeps it for the session)."""

    def key_for(self, binding_id: str, default: str) -> str:
        """The first key bound to this id, after the keymap (a confirmation asks for it again)."""

    def debounced(self, action: str) -> bool:
        """True when this key came again too soon (300 ms for destructive keys, 50 ms for the rest)."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """A notice (carl_tui/notices.py: always text, and it leaves with the next change on screen)."""

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], None] | None = None) -> object:
        """Open a screen over the main one; `callback` gets what it answers when it closes."""


class Shown(Protocol):
    """What a part of the main screen needs of it: the selected run as the screen shows it (None until the
    watcher has read it)."""

    @property
    def view(self) -> RunView | None: ...
