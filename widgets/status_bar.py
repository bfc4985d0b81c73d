"""One line at the top: run, state, step / max with ETA, phase, health, engine, the agents plane's NATS."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from engine.durations import compact_duration
from engine.text import visible_line

HEALTH_MARK = {"green": "●", "yellow": "▲", "red": "✕"}
READ_ONLY = " │ read-only"
ENGINE_MARK = {
    "up": "●",
    "starting": "◌",
    "restarting": "◌",
    "down": "✕",
    "stopped": "○",
    "external": "●",
    "stalled": "▲",  # up, but no heartbeat for 20 s: a full disk, a store it cannot write
}


@dataclass(frozen=True)
class StatusInfo:
    run: str | None = None
    state: str | None = None
    backend: str | None = None  # what a carl run trains on: torch or mlx
    step: int | None = None
    max_steps: int | None = None
    eta_s: float | None = None
    eta_label: str | None = None  # what the ETA is of, when not the whole run (e.g. "warm-up")
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
        """The parts in reading order; when the line is too narrow, the least needed go first: the
        agents plane's NATS, the backend, the health reason, the ETA, the phase, the eval, then the
        engine's hint. The run and its state, the step, the health and the engine always stay."""
        theme = self.app.current_theme
        health_color = {"green": theme.success, "yellow": theme.warning, "red": theme.error}
        parts: list[tuple[int, Text]] = []  # (priority: lower is dropped first, text)
        health_part: Text | None = None  # the health reason follows it, cut to the room that is left

        def part(priority: int, *pieces: str | tuple[str, str]) -> None:
            text = Text()  # stored names (the run, its phase, a source's error) are text on one line
            for piece in pieces:
                if isinstance(piece, tuple):
                    text.append(visible_line(piece[0]), style=piece[1])
                else:
                    text.append(visible_line(piece))
            parts.append((priority, text))

        if info.message:
            part(99, (f"✕ {info.message}  ", f"bold {theme.error}"))
        if info.run is None:
            part(98, ("no run selected", "dim"))
        else:
            part(98, (info.run, "bold"))
            if info.state:
                part(97, (f" {info.state}", theme.success if info.state == "live" else ""))
            if info.backend:
                part(1, (f" · {info.backend}", "dim"))
            if info.step is not None:
                total = f"/{info.max_steps:,}" if info.max_steps else ""
                share = (
                    f" {info.step / info.max_steps:.0%}"
                    if info.max_steps and info.step <= info.max_steps
                    else ""
                )
                part(96, f" │ step {info.step:,}{total}{share}")
            if info.eta_s is not None:
                label = f" {info.eta_label}" if info.eta_label else ""
                part(5, f" ETA{label} {compact_duration(info.eta_s)}")
            part(6, f" │ phase {info.phase or '—'}")
            if info.eval_passed is not None:
                mark = ("✓", theme.success) if info.eval_passed else ("✕", theme.error)
                task = f" {info.eval_task:.2f}" if info.eval_task is not None else ""
                part(7, " │ eval ", mark, task)
            if info.health:
                mark = f"{HEALTH_MARK.get(info.health, '?')} {info.health}"
                part(95, " │ ", (mark, health_color.get(info.health, "")))
                health_part = parts[-1][1]
        engine_color = theme.success if info.engine == "up" else theme.warning
        part(94, " │ engine ", (f"{ENGINE_MARK.get(info.engine, '?')} {info.engine}", engine_color))
        if info.engine_hint:
            part(8, f": {info.engine_hint}")  # whole or not at all: a cut one reads as nonsense
        if info.nats:
            nats_color = theme.success if info.nats in ("up", "external") else theme.warning
            part(0, " │ nats ", (f"{ENGINE_MARK.get(info.nats, '?')} {info.nats}", nats_color))
        if info.readonly:
            part(93, (READ_ONLY, "dim"))
        width = self.content_size.width
        while width and len(parts) > 1 and sum(t.cell_len for _, t in parts) > width:
            lowest = min(range(len(parts)), key=lambda i: parts[i][0])
            if parts[lowest][0] >= 93:
                break  # only what always stays is left: the line is cut at its end
            del parts[lowest]
        if info.health_reason and health_part is not None:
            room = (width or 10_000) - sum(t.cell_len for _, t in parts)
            reason = f" {visible_line(info.health_reason)}"
            if room >= 12:  # enough for a few words; else the health mark alone says it
                if len(reason) > room:
                    reason = reason[: room - 1] + "…"
                at = next(i for i, (_, text) in enumerate(parts) if text is health_part) + 1
                parts.insert(at, (3, Text(reason, style="dim")))
        line = Text(no_wrap=True, overflow="ellipsis")
        for _, text in parts:
            line.append_text(text)
        return line

    def on_resize(self) -> None:
        self.update(self.render_info(self.info))
