"""The Agents pane: the plane's workers, then its event stream, newest first.

The app hands it the audit's rows (workers, the newest events, the plane's overview, with the manager's
judged quality); it never reads the store. It draws only the rows that fit: at 80x24 the pane is a few
lines, so the workers fold into one summary line above the newest events; maximized (`4`) it shows the
workers table and as many events as fit. Under the workers, one line says how the manager is judged, once it
is. Keys post messages; the app turns them into engine commands.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from engine.text import visible, visible_line

from .status_bar import ENGINE_MARK

AGENTS_EMPTY = (
    "No agent events yet. `carl agents up` starts the agents plane (a local NATS server, a manager and "
    "workers on the demo tasks); `carl-tui --demo` starts one beside the demo run. Every task, result, "
    "score, feedback and alarm streams in here, newest first."
)
AGENTS_STARTING = (
    "The agents plane is starting: a local NATS server, a manager and its workers, which load their model "
    "first. Every task, result, score, feedback and alarm streams in here, newest first."
)
MAX_EVENTS = 200
KIND_NAMES = {
    "worker_status": "status",
    "manager_status": "manager",
    "model_update": "model",
    "manager_rollout": "mgr-roll",
}
STATE_MARKS = {"busy": "●", "idle": "○", "starting": "◌", "stopping": "◌", "stopped": "·", "error": "✕"}
NARROW = 40  # below this many columns, event lines drop the clock and the task id
MEDIUM = 50  # from here the workers table shows the task type
WIDE = 90  # from here rows carry the environment, failures and the worker's detail
JUDGED_ROOM = 2  # the manager's line shows when this many event lines still fit under it
STATUS_KINDS = ("worker_status", "manager_status")
Line = tuple[Text, tuple[str, Any] | None]  # a drawn line and the key of the row it shows (None: a heading)


def shown(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as one line of the pane draws it: each text field on one line, its control characters
    written out (`visible_line`). The row itself keeps its values (its ids are what keys look up)."""
    return {key: visible_line(value) if isinstance(value, str) else value for key, value in row.items()}


def clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "--:--:--"


def age(ts: float | None, now: float) -> str:
    """How long ago, in one short unit: 3s, 12m, 5h, 2d."""
    if not ts:
        return "—"
    seconds = max(0, int(now - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def tail(text: str | None, width: int) -> str:
    """The end of a long name (an adapter version ends in its step): `…run-v0012`."""
    text = text or "—"
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def version_text(version: str | None, width: int) -> str:
    """A model version in `width` columns: an adapter named `<run>-v0012` keeps its `v0012`."""
    if version and len(version) > width and "-v" in version:
        version = version[version.rindex("-v") + 1 :]
    return tail(version, width)


def score_text(value: float | None) -> str:
    return "    " if value is None else f"{value:.2f}"


Part = tuple[str, str]  # text and its role: "" or ok / warn / error, for the caller to colour


def plane_summary(
    overview: dict[str, Any] | None, workers: list[dict[str, Any]], alarms: int, *, compact: bool = False
) -> tuple[list[Part], list[Part]]:
    """The pane's title and subtitle: `nats ● up · ⚠ 1 alarm · 2 workers · 123/∞ tasks · paused · model v3`
    in the title (`nats ● up · serving demo step 650 · 2 workers · 123/∞ tasks` when the plane serves a
    run); a compact pane keeps what needs attention in its title (alarms, a paused manager, a server that
    is not up) and puts the model and the counts in its subtitle."""
    overview = overview or {}
    server, plane = overview.get("server") or {}, overview.get("plane") or {}
    manager, model = overview.get("manager") or {}, overview.get("model") or {}
    nats: Part | None = None
    if server and plane.get("wanted"):
        state = server.get("state") or "?"
        nats = (
            f"nats {ENGINE_MARK.get(state, '?')} {state}",
            "ok" if state in ("up", "external") else "warn",
        )
    elif server and plane:
        nats = ("plane stopped", "")
    alarm = (f"⚠ {alarms} alarm{'s' if alarms != 1 else ''}", "error") if alarms else None
    live = sum(1 for w in workers if w.get("state") != "stopped")
    count = (f"{live} worker{'s' if live != 1 else ''}", "") if workers else None
    tasks = state_part = None
    if manager:
        total = manager.get("total")
        tasks = (f"{manager.get('done') or 0:,}/{'∞' if total is None else f'{total:,}'} tasks", "")
        stopped_too = manager.get("state") == "stopped" and nats == ("plane stopped", "")  # said once
        if manager.get("state") and manager["state"] != "assigning" and not stopped_too:
            state_part = (manager["state"], "warn" if manager["state"] == "paused" else "")
    version = served_part(plane.get("serving"), model)
    if not compact:
        if (plane.get("serving") or {}).get("run"):  # the served run before the counts: seen at 80 columns
            return [p for p in (nats, alarm, state_part, version, count, tasks) if p], []
        return [p for p in (nats, alarm, state_part, count, tasks, version) if p], []
    nats = nats if nats and nats[1] != "ok" else None  # the status bar says the server is up
    # what is served before the counts: the subtitle of a narrow pane is cut from the right
    return [p for p in (alarm, state_part, nats) if p], [p for p in (version, tasks) if p]


def served_part(serving: dict[str, Any] | None, model: dict[str, Any]) -> Part | None:
    """What the workers are given to serve: the run the plane serves and the step of its newest weights
    announced (`serving demo step 650`), or else the newest model update's version."""
    if serving and serving.get("run"):
        run = visible_line(str(serving["run"]))
        if serving.get("state") == "refused":
            return (f"not serving {run}", "warn")
        if isinstance(serving.get("step"), int):
            return (f"serving {run} step {serving['step']:,}", "")
        return (f"serving base · {run} not saved yet", "")
    if model.get("model_version"):
        return (f"model {visible_line(str(model['model_version']))}", "")
    return None


def manager_line(judged: dict[str, Any] | None, width: int, theme: Any = None) -> Text | None:
    """How the manager is judged (engine/agents/manager_judge.py), from StoreReader.manager_quality():
    `manager: agrees with the verifier 0.82 · hints help +0.11`, each judgement's count beside its mean when
    the line still fits (`(n=37)`), shorter words when it does not; a kind never judged is left out, and
    nothing at all when neither was. Agreement is coloured as a score, hint help by its sign."""
    judged = judged or {}
    parts = []  # (long words, short words, the mean as shown, its style, the count)
    if "agreement" in judged:
        mean, count = judged["agreement"]
        style = AgentsPane._score_style(mean, theme) if theme is not None else ""
        parts.append(("agrees with the verifier", "agrees", f"{mean:.2f}", style, count))
    if "hint_help" in judged:
        mean, count = judged["hint_help"]
        style = ((theme.success if mean > 0 else theme.error if mean < 0 else "") if theme else "") or ""
        parts.append(("hints help", "hints", f"{mean:+z.2f}", style, count))
    if not parts:
        return None
    for counted, words in ((True, 0), (False, 0), (False, 1)):  # the longest that fits
        line = Text("manager: ", style="dim", no_wrap=True, overflow="ellipsis")
        for i, (*said, figure, style, count) in enumerate(parts):
            if i:
                line.append(" · ", style="dim")
            line.append(f"{said[words]} ")
            line.append(figure, style=style)
            if counted:
                line.append(f" (n={count:,})", style="dim")
        if line.cell_len <= width:
            return line
    return line  # the shortest, cut at the pane's edge


class AgentsPane(Static):
    """Workers, then events newest first; focus it (tab), move with up/down or j/k, `enter` opens the
    task of the highlighted row, `p` pauses or resumes assignment, `+` adds a worker, `x` stops one."""

    can_focus = True
    BINDINGS = [
        Binding("up,k", "move(-1)", "Previous row", show=False, id="agents.previous"),
        Binding("down,j", "move(1)", "Next row", show=False, id="agents.next"),
        Binding("home", "newest", "Back to the newest event", show=False, id="agents.newest"),
        Binding("end", "move(100000)", "The oldest event shown", show=False, id="agents.oldest"),
        Binding(
            "enter",
            "open",
            "Open task",
            tooltip="Open the highlighted row's task (an alarm: its whole reason)",
            id="agents.open",
        ),
        Binding(
            "p",
            "control('pause_resume')",
            "Pause/resume",
            tooltip="Pause or resume task assignment",
            id="agents.pause-resume",
        ),
        Binding(
            "plus",
            "control('add_worker')",
            "Add worker",
            key_display="+",
            tooltip="Add a worker",
            id="agents.add-worker",
        ),
        Binding(
            "x",
            "control('stop_worker')",
            "Stop worker",
            tooltip="Stop the highlighted worker (asks first)",
            id="agents.stop-worker",
        ),
    ]
    CONTROLS = frozenset({"control"})

    class OpenTask(Message):
        def __init__(self, task_id: str) -> None:
            super().__init__()
            self.task_id = task_id

    class TitleChanged(Message):
        """The pane's summary for its container's border: the app puts it there."""

        def __init__(self, title: Text, subtitle: Text) -> None:
            super().__init__()
            self.title = title
            self.subtitle = subtitle

    class Control(Message):
        """`verb` is pause_resume, add_worker or stop_worker (with the worker it names)."""

        def __init__(self, verb: str, worker_id: str | None = None) -> None:
            super().__init__()
            self.verb = verb
            self.worker_id = worker_id

    def __init__(self, *, readonly: bool = False, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(AGENTS_EMPTY, id=id, classes=classes)
        self.readonly = readonly
        self.agent_events: list[dict[str, Any]] = []
        self.agent_workers: list[dict[str, Any]] = []
        self.overview: dict[str, Any] = {}
        self.total = 0
        self.cursor: tuple[str, Any] | None = None  # ("worker", id) or ("event", id): stays on its row
        self.follow = True  # the cursor is on the newest event and stays there, as a log tail does
        self.top = 0
        self.shown: Text | str = AGENTS_EMPTY  # what is on screen now
        self.titles: tuple[Text, Text] | None = None  # the summary last posted
        self.add_class("-empty")

    def on_mount(self) -> None:
        self.set_interval(10.0, self._draw)  # "last seen" ages; nothing is sent unless a line changed

    # -- data ----------------------------------------------------------------------------------

    def set_data(
        self,
        events: list[dict[str, Any]],
        workers: list[dict[str, Any]],
        overview: dict[str, Any] | None,
        total: int | None = None,
    ) -> None:
        events = events[:MAX_EVENTS]
        overview = overview or {}
        if (events, workers, overview) == (self.agent_events, self.agent_workers, self.overview):
            return
        self.agent_events, self.agent_workers, self.overview = events, workers, overview
        self.total = total if total is not None else len(events)
        self._draw()

    @property
    def alarm_count(self) -> int:
        return sum(1 for e in self.agent_events if e.get("kind") == "alarm" and e.get("status", "ok") == "ok")

    def titles_for(self, width: int, height: int) -> tuple[Text, Text]:
        """`Agents · nats ● up · ⚠ 1 alarm · 2 workers · 123/∞ tasks · paused`, coloured by the theme."""
        theme = self.app.current_theme
        colours = {"ok": theme.success or "", "warn": theme.warning or "", "error": theme.error or ""}
        compact = width < MEDIUM or not self._table_fits(height)
        parts, below = plane_summary(self.overview, self.agent_workers, self.alarm_count, compact=compact)
        title, subtitle = Text("Agents"), Text()
        for text, items in ((title, parts), (subtitle, below)):
            for part, role in items:
                if text.plain:
                    text.append(" · ")
                text.append(visible_line(part), style=colours.get(role, ""))
        return title, subtitle

    def highlighted(self) -> tuple[str, dict[str, Any]] | None:
        if self.cursor is None:
            return None
        kind, key = self.cursor
        rows = self.agent_workers if kind == "worker" else self.agent_events
        field = "worker_id" if kind == "worker" else "id"
        row = next((r for r in rows if r.get(field) == key), None)
        return (kind, row) if row is not None else None

    def highlighted_task(self) -> str | None:
        current = self.highlighted()
        return current[1].get("task_id") if current else None

    def highlighted_worker(self) -> str | None:
        """The highlighted worker, or the worker of the highlighted event (if it is one the plane has)."""
        current = self.highlighted()
        if current is None:
            return None
        worker = current[1].get("worker_id")
        return worker if worker in {w["worker_id"] for w in self.agent_workers} else None

    # -- layout --------------------------------------------------------------------------------

    def _table_fits(self, height: int) -> bool:
        """Whether the workers table leaves room for a few events (else it folds into one line)."""
        return height - len(self.agent_workers) - 2 >= min(3, max(1, len(self.agent_events)))

    def _table_shown(self, height: int) -> bool:
        """Whether the workers show as a table (with a line about the events under it), not folded."""
        return bool(self.agent_workers) and self._table_fits(height)

    def _layout(self, width: int, height: int) -> tuple[list[Line], list[Line]]:
        """The lines that stay put (the workers) and the lines that scroll (the events), with the row
        key of each selectable line. When the table would crowd out the events, the workers fold into
        one line and the status events (which that line and the title sum up) leave the stream.
        Below the workers table, `_draw` adds a line about the events."""
        theme = self.app.current_theme
        now = time.time()
        head: list[Line] = []
        body: list[Line] = []
        folded = bool(self.agent_workers) and not self._table_fits(height)
        if folded:
            head.append((self._workers_folded(theme), None))
        elif self.agent_workers:
            head.append((Text(self._worker_header(width), style="dim"), None))
            for worker in self.agent_workers:
                head.append((self._worker_line(worker, width, now, theme), ("worker", worker["worker_id"])))
        judged = manager_line(self.overview.get("judged"), width, theme)
        table = not folded and bool(self.agent_workers)  # then a line about the events follows (`_draw`)
        if judged is not None and height - len(head) - 1 - table >= JUDGED_ROOM:
            head.append((judged, None))
        # A folded pane has room for a few lines: the results and their scores, not the bookkeeping
        # (statuses, which the folded line sums up, and assignments, which every result implies).
        hidden = (*STATUS_KINDS, "task") if folded else ()
        events = [e for e in self.agent_events if e.get("kind") not in hidden]
        for event in events:
            body.append((self._event_line(event, width, theme), ("event", event["id"])))
        return head, body

    def _keys(self) -> list[tuple[str, Any]]:
        head, body = self._layout(self.size.width or 80, self.size.height or 24)
        return [key for _, key in head + body if key is not None]

    def _draw(self) -> None:
        empty = not self.agent_events and not self.agent_workers
        self.set_class(empty, "-empty")
        if empty:
            # A plane on its way (an `agents up` not carried out yet, a server not up yet) says so.
            note = AGENTS_STARTING if self.overview.get("starting") else AGENTS_EMPTY
            if self.shown != note:
                self.shown = note
                self.update(note)
            self._post_titles()
            return
        width, height = self.size.width or 80, self.size.height or 24
        head, body = self._layout(width, height)
        keys = [key for _, key in head + body if key is not None]
        newest = self._newest(head, body, height)
        if self.follow or self.cursor not in keys:
            self.cursor = newest or (keys[0] if keys else None)
        at = next((i for i, (_, key) in enumerate(body) if key == self.cursor), None)
        if self._table_shown(height) and body:  # under the workers table: where the events stand
            shown = f"{self.total:,} events" if self.total > len(self.agent_events) else "events"
            if self.follow or not at:
                heading = f"{shown} · newest first · enter opens a task"
            else:
                heading = f"{shown} · {at} newer above · home: newest"
            head.append((Text(heading, style="dim"), None))
        room = max(1, height - len(head))
        if at is not None:  # keep the cursor in view
            self.top = min(max(self.top, at - room + 1), at)
        self.top = max(0, min(self.top, len(body) - room))
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, (line, key) in enumerate(head + body[self.top : self.top + room]):
            if i:
                text.append("\n")
            if key is not None and key == self.cursor and self.has_focus:
                line = line.copy()
                line.append(" " * max(0, width - line.cell_len))  # the highlight spans the pane
                line.stylize("reverse")
            text.append_text(line)
        if text != self.shown:  # an unchanged drawing sends nothing to the terminal
            self.shown = text
            self.update(text)
        self._post_titles()

    def _post_titles(self) -> None:
        titles = self.titles_for(self.size.width or 80, self.size.height or 24)
        if titles != self.titles:
            self.titles = titles
            self.post_message(self.TitleChanged(*titles))

    # -- rows ----------------------------------------------------------------------------------

    def _worker_header(self, width: int) -> str:
        if width >= WIDE:
            return (
                f"{'worker':<12} {'state':<9} {'task type':<12} {'model version':<22} {'done':>5} {'fail':>4}"
                f" {'ok':>4} {'score':>5} {'seen':>4}  detail"
            )
        if width >= MEDIUM:
            return (
                f"{'worker':<6} {'state':<7} {'type':<6} {'version':<9} {'done':>4} {'ok':>4} "
                f"{'score':>5} {'seen':>4}"
            )
        return f"{'worker':<6} {'state':<7} {'done':>4} {'ok':>4} {'score':>5}"

    def _worker_line(self, w: dict[str, Any], width: int, now: float, theme: Any) -> Text:
        w = shown(w)
        state = w.get("state") or "?"
        rate = w.get("success_rate")
        ok = "  — " if rate is None else f"{rate:>4.0%}"
        score = score_text(w.get("mean_score")).strip() or "—"
        types = ",".join(w.get("task_types") or []) or "—"
        done = w.get("tasks_done") or 0
        line = Text(no_wrap=True, overflow="ellipsis")
        if width >= WIDE:
            line.append(f"{w['worker_id'][:12]:<12} ")
            line.append(f"{STATE_MARKS.get(state, '?')} {state:<7.7}", style=self._state_style(state, theme))
            line.append(
                f" {types[:12]:<12} {version_text(w.get('model_version'), 22):<22} {done:>5} "
                f"{w.get('failures') or 0:>4} {ok} {score:>5} {age(w.get('last_seen'), now):>4}"
            )
            detail = w.get("detail") or w.get("model")
            if detail:
                line.append(f"  {detail}", style="dim")
            return line
        line.append(f"{w['worker_id'][:6]:<6} ")
        line.append(f"{state:<7.7}", style=self._state_style(state, theme))
        if width >= MEDIUM:
            line.append(
                f" {types[:6]:<6} {version_text(w.get('model_version'), 9):<9} {done:>4} {ok} {score:>5}"
                f" {age(w.get('last_seen'), now):>4}"
            )
        else:
            line.append(f" {done:>4} {ok} {score:>5}")
        return line

    def _workers_folded(self, theme: Any) -> Text:
        """The workers on one line, for a pane too small for the table: `w1 busy · w2 idle`; stopped
        ones are left out (the table shows them), and many are counted by state."""
        line = Text(no_wrap=True, overflow="ellipsis")
        live = [shown(w) for w in self.agent_workers if w.get("state") != "stopped"]
        if not live:
            line.append(f"{len(self.agent_workers)} workers, all stopped", style="dim")
        elif len(live) <= 3:
            for i, w in enumerate(live):
                if i:
                    line.append(" · ", style="dim")
                state = w.get("state") or "?"
                line.append(f"{w['worker_id']} ")
                line.append(state, style=self._state_style(state, theme))
        else:
            counts: dict[str, int] = {}
            for w in live:
                counts[w.get("state") or "?"] = counts.get(w.get("state") or "?", 0) + 1
            line.append(f"{len(live)} workers: ")
            line.append(
                ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            )
        return line

    @staticmethod
    def _state_style(state: str, theme: Any) -> str:
        return {
            "busy": theme.success or "",
            "error": theme.error or "",
            "starting": theme.warning or "",
            "stopping": theme.warning or "",
            "stopped": "dim",
            "paused": theme.warning or "",
        }.get(state, "")

    def _event_line(self, e: dict[str, Any], width: int, theme: Any) -> Text:
        """`12:01:03 result   w1       1a2b3c4d 0.82`; a narrow pane keeps the kind, the worker and the
        score. An alarm or a rejected payload gives its reason the rest of the line
        (enter shows all of it)."""
        e = shown(e)
        kind = e.get("kind") or "?"
        narrow = width < NARROW
        error = theme.error or ""
        line = Text(no_wrap=True, overflow="ellipsis")
        if not narrow:
            line.append(f"{clock(e.get('received_at') or e.get('created_at'))} ", style="dim")
        if e.get("status") == "rejected":
            if not narrow:
                line.append(f"{KIND_NAMES.get(kind, kind):<8.8} ", style=theme.warning or "")
            line.append(f"rejected: {e.get('reason') or 'invalid payload'}", style=theme.warning or "")
            if width >= WIDE and e.get("subject"):
                line.append(f"  ({e['subject']})", style="dim")
            return line
        who = e.get("worker_id") or e.get("manager_id") or ""
        if kind == "alarm" and width < WIDE:  # the reason needs the room more than the columns do
            line.append(f"⚠ {e.get('alarm_kind') or 'alarm'}", style=f"bold {error}")
            line.append(f" {who}" if who else "", style=error)
            line.append(f": {e['alarm_reason']}" if e.get("alarm_reason") else "", style=error)
            return line
        line.append(f"{KIND_NAMES.get(kind, kind):<8.8} ", style=self._kind_style(kind, theme))
        if narrow:  # the manager is implied: the room is the worker's
            line.append(f"{(e.get('worker_id') or '')[:5]:<5} ")
        elif kind not in ("manager_status", "model_update"):  # no worker and no task: no columns for them
            line.append(f"{who[:8]:<8} ")
            line.append(f"{(e.get('task_id') or '')[:8]:<8} ", style="dim")
        if kind == "alarm":
            line.append(f"⚠ {e.get('alarm_kind') or 'alarm'}", style=f"bold {error}")
            if e.get("alarm_reason"):
                line.append(f": {e['alarm_reason']}", style=error)
            return line
        if kind == "model_update":
            version = e.get("model_version") or "?"
            line.append(f"→ {version_text(version, 14) if narrow else version}", style=theme.accent or "")
            return line
        if kind in STATUS_KINDS:  # what the status said
            state = e.get("state") or ""
            line.append(state, style=self._state_style(state, theme) or "dim")
            if kind == "manager_status" and e.get("done") is not None:
                total = e.get("total")
                line.append(
                    f" · {e['done']:,}/{'∞' if total is None else f'{total:,}'} tasks done", style="dim"
                )
            if width >= WIDE and e.get("detail"):
                line.append(f"  {e['detail']}", style="dim")
            return line
        if kind == "hint":  # what the manager told the worker (enter shows all of it)
            source = e.get("hint_source")
            line.append(f"({source}) " if source and not narrow else "", style="dim")
            line.append(str(e.get("hint") or ""))
            return line
        if kind == "judged" and e.get("judged_value") is not None:
            value = float(e["judged_value"])
            if e.get("judged_kind") == "hint_help":  # a difference of two scores, not a score
                line.append(f"hint help {value:+.2f}", style=self._score_style(0.5 + value, theme))
            else:
                line.append(f"agreement {value:.2f}", style=self._score_style(value, theme))
            return line
        line.append(score_text(e.get("score")), style=self._score_style(e.get("score"), theme))
        if width >= WIDE:
            extra = " · ".join(str(v) for v in (e.get("environment"), e.get("model_version")) if v)
            if extra:
                line.append(f"  {extra}", style="dim")
        return line

    @staticmethod
    def _kind_style(kind: str, theme: Any) -> str:
        if kind == "alarm":
            return f"bold {theme.error or ''}"
        if kind in ("worker_status", "manager_status", "control"):
            return "dim"
        return ""

    @staticmethod
    def _score_style(score: float | None, theme: Any) -> str:
        if score is None:
            return ""
        return (theme.success if score >= 0.7 else theme.warning if score >= 0.4 else theme.error) or ""

    # -- keys ------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only sessions hide the keys that send commands."""
        return not (action in self.CONTROLS and self.readonly)

    def redraw(self) -> None:
        """Draw again even if nothing moved (a new theme's colours)."""
        self.shown, self.titles = "", None
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def on_focus(self) -> None:
        self._draw()

    def on_blur(self) -> None:
        if self.app.screen is self.screen:  # focus went elsewhere (not to a dialog): follow again
            self.follow = True
        self._draw()

    def action_newest(self) -> None:
        self.follow, self.top = True, 0
        self._draw()

    def action_move(self, delta: int) -> None:
        keys = self._keys()
        if not keys:
            return
        at = keys.index(self.cursor) if self.cursor in keys else 0
        self.cursor = keys[max(0, min(len(keys) - 1, at + delta))]
        height = self.size.height or 24
        self.follow = self.cursor == self._newest(*self._layout(self.size.width or 80, height), height)
        self._draw()

    def _newest(self, head: list[Line], body: list[Line], height: int) -> tuple[str, Any] | None:
        """Where a following cursor rests: the newest event of a task on the first screen, so that enter
        opens one (a status line, the newest event most of the time, has no task to open); else the
        newest event. The newest events stay on top either way."""
        with_task = {e["id"] for e in self.agent_events if e.get("task_id")}
        room = max(1, height - len(head) - (1 if self._table_shown(height) and body else 0))
        keys = [key for _, key in body if key is not None]
        return next((key for key in keys[:room] if key[1] in with_task), keys[0] if keys else None)

    def action_open(self) -> None:
        """The task of the row; an alarm or a rejected payload without one shows its whole reason."""
        current = self.highlighted()
        if current is None:
            return
        kind, row = current
        if row.get("task_id"):
            self.post_message(self.OpenTask(row["task_id"]))
        elif kind == "event" and row.get("status") == "rejected":
            self.notify(
                visible(f"{row.get('subject')}: {row.get('reason')}"),
                title="rejected payload",
                severity="warning",
                markup=False,
            )
        elif kind == "event" and row.get("kind") == "alarm":
            who = f" ({row['worker_id']})" if row.get("worker_id") else ""
            self.notify(
                visible(f"{row.get('alarm_reason') or '?'}{who}"),
                title=visible_line(f"alarm: {row.get('alarm_kind')}"),
                severity="error",
                timeout=15,
                markup=False,
            )
        else:
            self.notify("no task on this row: pick an event of a task, or a busy worker", title="agents")

    def action_control(self, verb: str) -> None:
        self.post_message(self.Control(verb, self.highlighted_worker() if verb == "stop_worker" else None))
