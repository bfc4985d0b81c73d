"""One line at the top: run, state, step / max with ETA, phase, health, engine, the agents plane's NATS."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from engine.durations import compact_duration

HEALTH_MARK = {"green": "●", "yellow": "▲", "red": "✕"}
READ_ONLY = " │ read-only"
ENGINE_MARK = {"up": "●", "starting": "◌", "restarting": "◌", "down": "✕", "stopped": "○", "external": "●"}


@dataclass(frozen=True)
class StatusInfo:
    run: str | None = None
    state: str | None = None
    backend: str | None = None  # what a carl run trains on: torch or mlx
    step: int | None = None
    max_steps: int | None = None
    eta_s: float | None = None
    phase: str | None = None
    health: str | None = None
    health_reason: str | None = None
    eval_passed: bool | None = None  # the newest held-out eval: None when there is none
    eval_task: float | None = None
    engine: str = "down"
    engine_hint: str | None = None  # how to start an engine this session will not start (read-only)
    nats: str | None = None  # the agents plane's NATS server (up, restarting, down, external); None: no plane
    readonly: bool = False
    message: str | None = None  # a one-line error to show, e.g. an unreadable source


class StatusBar(Static):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.info = StatusInfo()

    def show(self, info: StatusInfo) -> None:
        if info != self.info:  # an unchanged status sends nothing to the terminal
            self.info = info
            self.update(self.render_info(info))

    def render_info(self, info: StatusInfo) -> Text:
        theme = self.app.current_theme
        health_color = {"green": theme.success, "yellow": theme.warning, "red": theme.error}
        text = Text(no_wrap=True, overflow="ellipsis")
        if info.message:
            text.append(f"✕ {info.message}  ", style=f"bold {theme.error}")
        if info.run is None:
            text.append("no run selected", style="dim")
        else:
            text.append(info.run, style="bold")
            if info.state:
                text.append(f" {info.state}", style=theme.success if info.state == "live" else "")
            if info.backend:
                text.append(f" · {info.backend}", style="dim")
            if info.step is not None:
                total = f"/{info.max_steps:,}" if info.max_steps else ""
                text.append(f" │ step {info.step:,}{total}")
                if info.max_steps and info.step <= info.max_steps:
                    text.append(f" {info.step / info.max_steps:.0%}")
            if info.eta_s is not None:
                text.append(f" ETA {compact_duration(info.eta_s)}")
            text.append(f" │ phase {info.phase or '—'}")
            if info.eval_passed is not None:
                text.append(" │ eval ")
                mark = "✓" if info.eval_passed else "✕"
                text.append(mark, style=theme.success if info.eval_passed else theme.error)
                if info.eval_task is not None:
                    text.append(f" {info.eval_task:.2f}")
        engine_color = theme.success if info.engine == "up" else theme.warning
        text.append(" │ engine ")
        text.append(f"{ENGINE_MARK.get(info.engine, '?')} {info.engine}", style=engine_color)
        hint = f": {info.engine_hint}" if info.engine_hint else ""
        if hint and self._fits(text.cell_len + len(hint) + (len(READ_ONLY) if info.readonly else 0)):
            text.append(hint)  # whole or not at all (a cut one reads as nonsense); the notice says it too
        if info.nats:
            text.append(" │ nats ")
            nats_color = theme.success if info.nats in ("up", "external") else theme.warning
            text.append(f"{ENGINE_MARK.get(info.nats, '?')} {info.nats}", style=nats_color)
        if info.run is not None and info.health:
            text.append(" │ ")
            text.append(
                f"{HEALTH_MARK.get(info.health, '?')} {info.health}", style=health_color.get(info.health)
            )
            if info.health_reason:  # last: the longest part, the one to cut on a narrow screen
                text.append(f" {info.health_reason}", style="dim")
        if info.readonly:
            text.append(READ_ONLY, style="dim")
        return text

    def _fits(self, cells: int) -> bool:
        width = self.content_size.width
        return not width or cells <= width  # not laid out yet: the resize that follows draws it again

    def on_resize(self) -> None:
        self.update(self.render_info(self.info))
