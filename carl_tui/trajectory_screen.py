"""One trajectory up close (enter on the Trajectories pane): its tool sequence with ok/fail marks,
the five signals as bars with the reward, the advantage and its domain's baseline; beside it the
domain baselines of the whole store and the retraining (plasticity) triggers."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.text import visible, visible_line
from widgets.reward_bars import bar

SIGNALS = ("outcome", "process", "efficiency", "verification", "consistency")
WEIGHTS = {"outcome": 0.30, "process": 0.25, "efficiency": 0.15, "verification": 0.15, "consistency": 0.15}
WIDE = 120  # columns from which the domain table sits beside the detail
MARKS = {1: ("✓", "green"), 0: ("✕", "red"), None: ("?", "yellow")}


def _f(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def cell(text: str) -> Text:
    """A table cell of stored text: a `Text` (a str cell of a Rich table is markup), on one line, its
    control characters written out."""
    return Text(visible_line(text))


def _event_text(event: dict[str, Any]) -> str:
    params = event.get("params") or {}
    keys = ("file_path", "command", "pattern", "query", "url", "description")  # the most specific first
    detail = next((params[k] for k in keys if params.get(k)), "")
    code = event.get("exit_code")
    tail = f"  (exit {code})" if code not in (None, 0) else ""
    return visible_line(f"{event['tool']} {detail}")[:90] + tail


def trajectory_view(t: dict[str, Any], baselines: dict[str, dict[str, Any]]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(t["started_at"])) if t.get("started_at") else "—"
    duration = f"{t['duration_s']:.0f}s" if t.get("duration_s") is not None else "—"
    table.add_row("session", cell(f"{t['session_id']} ({t['agent']}, turn {t.get('turn_index') or 0})"))
    table.add_row(
        "domain",
        cell(f"{t.get('domain') or '_global'}" + (f" · skill {t['skill']}" if t.get("skill") else "")),
    )
    table.add_row("when", f"{started}, {duration}" + (" · holdout" if t.get("holdout") else ""))
    table.add_row("prompt", Text(visible(t.get("prompt")), overflow="fold"))
    outcome = t.get("outcome") or {}
    flags = ", ".join(
        f"{k.replace('_detected', '').replace('_', ' ')} {v}"
        for k, v in outcome.items()
        if isinstance(v, bool)
    )  # the cross-turn flags only: `recorded` (a record file's own scores) is not shown
    table.add_row("next prompt", cell(flags or "none yet (correction, redo and continuation come from it)"))
    table.add_row("", "")
    domain = baselines.get(t.get("domain") or "_global")
    adv = t.get("advantage")
    signals = t.get("signals") or {}
    for name in SIGNALS:
        value = signals.get(name)
        line = Text(bar(value or 0.0, 24), style="cyan")
        line.append(f" {_f(value)}  ×{WEIGHTS[name]:.2f}")
        table.add_row(name, line)
    reward = Text(bar(t.get("reward") or 0.0, 24), style="bold")
    reward.append(f" {_f(t.get('reward'))}")
    table.add_row("reward", reward)
    if domain:
        base = (
            f"baseline {_f(domain['baseline'])} (mean {_f(domain['mean'])}, σ {_f(domain['sigma'])}, "
            f"n {domain['n']})"
        )
    else:
        base = "baseline not computed yet"
    style = "green" if (adv or 0) > 0 else "red"
    table.add_row(
        "advantage",
        Text.assemble((_f(adv, "+.2f") + " σ", f"bold {style}"), f"  vs domain {visible_line(base)}"),
    )
    fingerprint = t.get("fingerprint") or {}
    if fingerprint.get("signature"):
        flow = " ".join(fingerprint.get("tool_flow") or [])
        table.add_row("process", cell(f"{fingerprint['signature']} · flow {flow}"))
    table.add_row("", "")
    events = t.get("events") or []
    total = t.get("total_tools") or len(events)
    table.add_row(
        "tools",
        f"{total} calls, {t.get('failures') or 0} failed" + (" (first 50 shown)" if total > 50 else ""),
    )
    for event in events:
        mark, color = MARKS.get(event.get("ok"), MARKS[None])
        table.add_row(
            Text(f"{event['seq'] + 1:>3} {mark}", style=color),
            Text(_event_text(event), overflow="ellipsis", no_wrap=True),
        )
    return table


def domains_view(domains: list[dict[str, Any]], plasticity: dict[str, Any] | None) -> Group:
    table = Table(title="Domain baselines", title_justify="left", box=None, padding=(0, 1), show_edge=False)
    table.add_column("domain", no_wrap=True, max_width=16, overflow="ellipsis")
    for column in ("n", "mean", "base", "σ"):
        table.add_column(column, justify="right", no_wrap=True, min_width=4)
    for d in domains[:20]:
        table.add_row(
            cell(d["domain"]),
            str(d["n"]),
            _f(d["mean"], ".2f"),
            _f(d["baseline"], ".2f"),
            _f(d["sigma"], ".2f"),
        )
    if not domains:
        table.add_row("no trajectories", "", "", "", "")
    text = Text("\nRetraining triggers\n", style="bold")
    triggers = (plasticity or {}).get("triggers") or []
    if plasticity is None:
        text.append("not computed yet (the engine does it)\n", style="dim")
    elif not triggers:
        text.append("none fired\n", style="green")
    for trigger in triggers:
        text.append(f"⚑ {visible_line(trigger['kind'])}: ", style="yellow")
        text.append(f"{visible(trigger['detail'])}\n")
    return Group(table, text)


class TrajectoryScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close", id="trajectory.close")]

    def __init__(
        self, trajectory: dict[str, Any], domains: list[dict[str, Any]], plasticity: dict[str, Any] | None
    ) -> None:
        super().__init__()
        self.trajectory = trajectory
        self.domains = domains
        self.plasticity = plasticity

    def compose(self) -> ComposeResult:
        baselines = {d["domain"]: d for d in self.domains}
        with Horizontal() as box:
            box.border_title = Text(f"Trajectory #{self.trajectory['id']}")
            with VerticalScroll(id="trajectory-detail"):
                yield Static(trajectory_view(self.trajectory, baselines))
                yield Static(domains_view(self.domains, self.plasticity), id="domains-below")
            with VerticalScroll(id="trajectory-domains"):
                yield Static(domains_view(self.domains, self.plasticity))

    def on_resize(self) -> None:
        """Side by side when there is room; on a narrow terminal the domains follow the detail."""
        wide = self.size.width >= WIDE
        self.query_one("#trajectory-domains").display = wide
        self.query_one("#domains-below").display = not wide

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
