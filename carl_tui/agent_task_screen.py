"""One task of the agents plane up close (enter on the Agents pane): its prompt, each step with the
PRM's score for it, the answer, the verifier, outcome, PRM and reward scores, the manager's own
feedback, its hint and what the trainer distilled from it (the answer's tokens coloured by their OPD
advantage, the teacher/student KL), the rollout the trainer gets from it, and the task's events in order."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.text import visible, visible_line
from widgets.agents import KIND_NAMES, clock
from widgets.reward_bars import bar
from widgets.token_text import OPD_ADVANTAGE, diverging_legend, token_text

from .rollouts_detail import OPD_MEANING, token_styles
from .screens import phi_colour

BAR = 10  # cells of a score bar


def score_line(
    value: float | None, colours: tuple[str, str, str], note: str = "", *, bold: bool = False
) -> Text:
    """A small bar and the number, coloured from low (the theme's error) to high (its success)."""
    if value is None:
        return Text("—" + (f"  {note}" if note else ""), style="dim")
    colour = phi_colour(value, *colours)
    filled = bar(value, BAR).rstrip()
    line = Text(filled, style=colour)
    line.append("░" * (BAR - len(filled)), style="dim")  # the track: a short bar still reads as short
    line.append(f" {value:.2f}", style=f"bold {colour}" if bold else colour)
    if note:
        line.append(f"  {note}", style="dim")
    return line


def task_view(task: dict[str, Any], colours: tuple[str, str, str], opd_styles: Sequence[Style] = ()) -> Table:
    """`opd_styles`: the OPD advantage scale's colours (without them the answer's tokens are not drawn).
    Every stored string of the task is a `Text` (a str cell of a Rich table is markup), its control
    characters written out: `visible_line` for a name or an id, `visible` for a prompt or an answer."""
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, style="bold")
    table.add_column(overflow="fold")
    kind = visible_line(f"{task.get('task_type') or '?'} · {task.get('environment') or 'chat'}")
    state = task.get("state") or "?"
    table.add_row(
        "task",
        Text.assemble(
            f"{visible_line(task['task_id'])}  ",
            (kind, "dim"),
            "  ",
            (visible_line(state), _state_colour(state, colours)),
        ),
    )
    who = [worker_line(task)]
    if task.get("model_version"):
        who.append(f"model {task['model_version']}")
    if task.get("elapsed_s") is not None:
        elapsed = task["elapsed_s"]
        who.append(f"{elapsed * 1000:.0f} ms" if elapsed < 1 else f"{elapsed:.1f}s")
    if task.get("tokens"):
        who.append(f"{task['tokens']} tokens")
    if task.get("phi_mean") is not None:
        who.append(f"Φ mean {task['phi_mean']:.3f}")
    table.add_row("by", Text(visible_line(" · ".join(who))))
    if task.get("group_id"):
        table.add_row("group", Text(visible_line(task["group_id"])))
    table.add_row("prompt", Text(visible(task.get("prompt")), overflow="fold"))
    table.add_row("", "")

    steps, scores = task.get("steps") or [], task.get("step_scores") or []
    if not steps:
        table.add_row("steps", Text("none yet" if task.get("status") is None else "none", style="dim"))
    for i, step in enumerate(steps):
        score = scores[i] if i < len(scores) else None
        line = score_line(score, colours)
        line.append(f"  {visible(step)}")
        table.add_row(f"step {i + 1}", line)
    if steps and not scores:
        table.add_row("", Text("the PRM has not scored these steps yet", style="dim"))
    if task.get("status") == "failed":
        table.add_row("failed", Text(visible(task.get("result")), style=colours[0]))
    else:
        table.add_row("answer", Text(visible(task.get("answer")) or "—", style="bold"))
    table.add_row("", "")

    verifier = visible_line(task.get("verifier"))
    reference = (
        f"{verifier} vs {task['reference']!r}"  # repr writes out every character a terminal would obey
        if verifier and task.get("reference")
        else verifier
    )
    table.add_row(
        "verifier", score_line(task.get("verifier_score"), colours, reference or "the task has none")
    )
    scored = task.get("rollout") or {}
    profile = (
        f"the {visible_line(scored['profile'])} profile"
        if scored.get("profile")
        else "the environment's profile"
    )
    table.add_row("outcome", score_line(task.get("outcome_score"), colours, profile))
    if scored.get("dimensions"):  # those that had evidence; the others were left out, weights renormalised
        parts = [f"{visible_line(name)} {value:.2f}" for name, value in scored["dimensions"].items()]
        table.add_row("", Text("scored on " + " · ".join(parts), style="dim"))
    table.add_row("PRM", score_line(task.get("prm_score"), colours, "mean of the step scores"))
    table.add_row("reward", score_line(task.get("reward"), colours, "what the trainer optimises", bold=True))
    table.add_row("", "")

    source = task.get("feedback_source")
    table.add_row(
        "feedback",
        score_line(
            task.get("feedback_score"), colours, f"from {visible_line(source)}" if source else "none yet"
        ),
    )
    if task.get("feedback_text"):
        table.add_row("", Text(visible(task["feedback_text"]), overflow="fold"))
    if task.get("hint"):
        add_hint(table, task, opd_styles)
    table.add_row("", "")

    rollout = task.get("rollout")
    if rollout is None:
        table.add_row("rollout", Text("none (the manager publishes one per scored result)", style="dim"))
    else:
        tokens = len(rollout.get("response_token_ids") or [])
        temperature = rollout.get("temperature")
        parts = [
            f"worker {rollout.get('worker_id') or '?'}",
            f"model {rollout.get('model_version') or '—'}",
            f"{tokens} tokens" + ("" if tokens else " (cannot train the local model)"),
            f"temperature {temperature:g}" if temperature is not None else "temperature —",
        ]
        group = rollout.get("group_id")
        parts.append(f"group {group[:8]} of {rollout.get('group_size') or 1}" if group else "no group")
        table.add_row("rollout", Text(visible_line(" · ".join(parts))))
        if rollout.get("token_logprobs"):
            logprobs = rollout["token_logprobs"]
            table.add_row(
                "", Text(f"behaviour log-prob mean {sum(logprobs) / len(logprobs):.3f}", style="dim")
            )
    events = task.get("events") or []
    if events:
        table.add_row("", "")
        for i, event in enumerate(events):
            line = Text(f"{clock(event.get('received_at'))} ", style="dim")
            line.append(f"{visible_line(KIND_NAMES.get(event['kind'], event['kind'])):<8} ")
            line.append(visible_line(event.get("worker_id")))
            if event.get("score") is not None:
                line.append(f"  {event['score']:.2f}")
            table.add_row("events" if i == 0 else "", line)
    return table


def add_hint(table: Table, task: dict[str, Any], styles: Sequence[Style]) -> None:
    """The hint and where it came from; once the trainer distilled from it, the answer's tokens coloured by
    their OPD advantage (widgets/token_text.py, as the rollouts viewer colours a sample), the scale's legend,
    and the sample's teacher/student KL with the trainer's step."""
    source = f"({visible_line(task['hint_source'])}) " if task.get("hint_source") else ""
    table.add_row("hint", Text.assemble((source, "dim"), visible(task["hint"])))
    tokens, advantage = task.get("opd_tokens") or [], task.get("opd_advantage") or []
    if advantage and len(tokens) == len(advantage) and len(styles) == OPD_ADVANTAGE.levels:
        table.add_row("OPD", token_text(tokens, advantage, styles, OPD_ADVANTAGE))
        table.add_row("", diverging_legend(styles, OPD_ADVANTAGE, OPD_MEANING))
    elif advantage:
        note = f"{len(advantage)} OPD advantages for {len(tokens)} tokens: not drawn"
        table.add_row("OPD", Text(note, style="dim"))
    parts = []
    if task.get("opd_kl") is not None:
        parts.append(f"teacher/student KL {task['opd_kl']:.3g} nats")
    if task.get("opd_step") is not None:
        parts.append(f"step {task['opd_step']:,}")
    if parts:
        table.add_row("" if advantage else "OPD", Text(" · ".join(parts), style="dim"))


def worker_line(task: dict[str, Any]) -> str:
    """Who has the task: the worker whose result stands; before a result, the worker its newest event names
    (a worker says it is busy with the task before it answers: `worker w1 · answering`); else nobody yet."""
    if task.get("worker_id"):
        return f"worker {task['worker_id']}"
    events = task.get("events") or []
    worker = next((e["worker_id"] for e in reversed(events) if e.get("worker_id")), None)
    if worker is None:
        return "no worker yet"
    return f"worker {worker} · answering" if task.get("state") in (None, "assigned") else f"worker {worker}"


def _state_colour(state: str, colours: tuple[str, str, str]) -> str:
    low, middle, high = colours
    return {"done": high, "failed": low, "timed_out": low}.get(state, middle)


class AgentTaskScreen(ModalScreen[None]):
    """Scrolls with the arrows, page up/down and home/end; escape closes. It follows the task: the app hands
    it the task again whenever the task's row or events move (`show_task`)."""

    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close", id="task.close")]

    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__()
        self.agent_task = task

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="task-detail") as scroll:
            scroll.border_title = Text(f"Task {visible_line(self.agent_task['task_id'])[:8]}")
            yield Static(id="task-body")

    def on_mount(self) -> None:
        self.draw()
        self.query_one("#task-detail").focus()

    def show_task(self, task: dict[str, Any]) -> None:
        if task != self.agent_task:  # an unchanged task sends nothing to the terminal
            self.agent_task = task
            self.draw()

    def draw(self) -> None:
        theme = self.app.current_theme
        colours = (theme.error or "red", theme.warning or "yellow", theme.success or "green")
        task = self.agent_task
        when = task.get("done_at") or task.get("assigned_at")
        self.query_one("#task-detail").border_subtitle = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) + " · esc closes" if when else None
        )
        opd = token_styles(self.app, OPD_ADVANTAGE)
        self.query_one("#task-body", Static).update(task_view(task, colours, opd))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
