"""One line at the top: run, state, step / max with ETA, phase, health, engine, the agents plane's NATS."""

from __future__ import annotations

from dataclasses import dataclass, field

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


NAME_MIN = 12  # cells a long run name is cut to, at the least, before the ETA goes
REASON_MIN = 13  # cells the health reason needs (a space and a few words), else the health mark says it
ALWAYS = 93  # parts of this priority and above are never dropped


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
        """The parts in reading order. When the line is too narrow: first the agents plane's NATS and the
        backend go, then the phase loses its word (`│ crystallizing`), a long run name is cut and the step
        loses its word (`│ 640/1,000 64%`), then the engine's hint, the eval, the phase and the health reason
        go, and last the ETA, which stays while the run is live. A word or a name taken is given back when a
        part dropped later made room. The run and its state, the step, the health and the engine always
        stay; the health reason takes what room is left."""
        theme = self.app.current_theme
        health_color = {"green": theme.success, "yellow": theme.warning, "red": theme.error}
        parts: list[Part] = []
        reason: Part | None = None  # the health reason: after the health, cut to the room that is left
        name_part: Part | None = None

        def part(priority: float, *pieces: Piece, short: tuple[Piece, ...] = ()) -> Part:
            made = Part(priority, styled(pieces), styled(short) if short else None)
            parts.append(made)
            return made

        if info.message:
            part(99, (f"✕ {info.message}  ", f"bold {theme.error}"))
        if info.run is None:
            part(98, ("no run selected", "dim"))
        else:
            name_part = part(98, (info.run, "bold"))
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
                part(96, f" │ step {info.step:,}{total}{share}", short=(f" │ {info.step:,}{total}{share}",))
            if info.eta_s is not None:  # only while the run is live: then it outlasts the phase and the eval
                label = f" {info.eta_label}" if info.eta_label else ""
                part(9, f" ETA{label} {compact_duration(info.eta_s)}")
            if info.phase:
                part(6, f" │ phase {info.phase}", short=(f" │ {info.phase}",))
            else:  # not judged yet: the first to go after the NATS and the backend
                part(2, " │ phase —")
            if info.eval_passed is not None:
                mark = ("✓", theme.success) if info.eval_passed else ("✕", theme.error)
                task = f" {info.eval_task:.2f}" if info.eval_task is not None else ""
                part(7, " │ eval ", mark, task)
            if info.health:
                health = f"{HEALTH_MARK.get(info.health, '?')} {info.health}"
                part(95, " │ ", (health, health_color.get(info.health, "")))
                if info.health_reason:  # kept before the phase: it says why the health is not green
                    reason = part(8.5, (f" {info.health_reason}", "dim"))
                    reason.short = reason.text[:REASON_MIN]  # its room at the least, while fitting
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
        fit(parts, width, name_part, reason)
        line = Text(no_wrap=True, overflow="ellipsis")
        for kept in parts:
            line.append_text(kept.text)
        return line

    def on_resize(self) -> None:
        self.update(self.render_info(self.info))


Piece = str | tuple[str, str | None]  # plain text, or text in a style (a theme's colour may be unset)


@dataclass(eq=False)
class Part:
    """One part of the status line: lower priorities go first; `short` is said when the line is narrow."""

    priority: float
    text: Text
    short: Text | None = None
    full: Text = field(init=False)  # the text as made, given back when there is room

    def __post_init__(self) -> None:
        self.full = self.text


def styled(pieces: tuple[Piece, ...]) -> Text:
    """Stored names (the run, its phase, a source's error) are text on one line."""
    text = Text()
    for piece in pieces:
        if isinstance(piece, tuple):
            text.append(visible_line(piece[0]), style=piece[1])
        else:
            text.append(visible_line(piece))
    return text


def fit(parts: list[Part], width: int, name: Part | None, fill: Part | None = None) -> None:
    """Make the parts fit `width` cells (0: no limit), in place, in the order render_info says; `fill` (the
    health reason) keeps its short text while the others are fitted, then takes the room that is left."""

    def over() -> int:
        return sum(p.text.cell_len for p in parts) - width if width else 0

    def drop_lowest(below: float) -> bool:
        lowest = min(parts, key=lambda p: p.priority)
        if lowest.priority >= below or len(parts) == 1:
            return False
        parts.remove(lowest)
        return True

    def cut_name() -> None:
        if name is not None and over() > 0 and name.full.cell_len > NAME_MIN:
            name.text = name.full.copy()
            name.text.truncate(max(NAME_MIN, name.full.cell_len - over()), overflow="ellipsis")

    if fill is not None and fill.short is not None:
        fill.text = fill.short
    while over() > 0 and drop_lowest(5):  # the NATS and the backend: the Agents pane and the run say them
        pass
    shortened = [p for p in sorted(parts, key=lambda p: p.priority) if p.short is not None]
    for part in shortened:  # the phase's word, then a long name and the step's word
        if over() > 0:
            part.text = part.short  # type: ignore[assignment]
        if part.priority > 8:
            cut_name()  # before the step loses its word
    while over() > 0 and drop_lowest(ALWAYS):
        pass
    for part in reversed([p for p in shortened if p is not fill]):  # what a drop made room for comes back
        if (
            part in parts
            and part.text is not part.full
            and over() + part.full.cell_len - part.text.cell_len <= 0
        ):
            part.text = part.full
    if name is not None and name.text is not name.full:  # and what is left of a cut name
        name.text = name.full
        cut_name()
    if fill is not None and fill in parts and width:
        room = width - sum(p.text.cell_len for p in parts if p is not fill)
        fill.text = fill.full.copy()
        fill.text.truncate(room, overflow="ellipsis")
