"""The audit log of control commands sent to the selected run: time, verb, outcome (lazygit's
command log). Newest first, bounded."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.text import Text
from textual.widgets import Static

from engine.store.commands import Verb
from engine.text import visible_line

STATE_MARK = {"pending": "…", "running": "▸", "done": "✓", "failed": "✕"}
EMPTY = "No commands yet: space pause · c checkpoint · s stop · l learning rate · w weight"


def describe(command: dict[str, Any]) -> str:
    """`set_lr 2e-05`, `set_weight format=0.5`, `pause`: the verb with its arguments, short."""
    try:
        args = json.loads(command.get("args") or "{}")
    except ValueError:
        args = {}
    if command["verb"] == Verb.SET_LR and "lr" in args:
        return f"set_lr {args['lr']:g}"
    if command["verb"] == Verb.SET_WEIGHT and "reward" in args:
        return f"set_weight {args['reward']}={args.get('weight')}"
    return str(command["verb"])


class CommandLog(Static):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(EMPTY, id=id, classes="-empty")
        self.commands: list[dict[str, Any]] = []

    def set_commands(self, commands: list[dict[str, Any]]) -> None:
        if commands == self.commands:
            return
        self.commands = commands
        self.set_class(not commands, "-empty")
        if not commands:
            self.update(EMPTY)
            return
        theme = self.app.current_theme
        colours = {"done": theme.success, "failed": theme.error}
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, command in enumerate(commands[:10]):
            if i:
                text.append("\n")
            state = command["state"]
            text.append(time.strftime("%H:%M ", time.localtime(command["created_at"])), style="dim")
            text.append(f"{STATE_MARK.get(state, '?')} ", style=colours.get(state, ""))
            text.append(visible_line(describe(command)))
            if state == "failed" and command.get("result"):
                text.append(f": {visible_line(command['result'])}", style=theme.error)
        self.update(text)
