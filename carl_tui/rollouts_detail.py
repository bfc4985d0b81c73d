"""A sample up close (`enter` in the rollouts viewer) and a GRPO group side by side (`g`).

The sample: its place (step, group, index), each reward function's value, the total, the advantage, the
length, the source's other fields, the whole prompt and the whole completion. When the run stored per-token
values (our own runs), the completion is drawn token by token in the colour of each token's entropy, the
forking tokens underlined, with the legend (widgets/token_text.py). The group: one prompt, and its completions
in columns, as many as fit, scrolled sideways with `←` `→`. Stored text is shown as text, control characters
made visible.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import HorizontalScroll, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from engine.store import RunRow
from engine.text import visible, visible_line
from widgets.key_bar import KeyBar
from widgets.long_text import LongText
from widgets.token_text import LEVELS, legend, token_pieces, token_text

GROUP_CHARS = 20_000  # of a completion shown in a group's column (the sample screen draws the whole of it)
GROUP_TOKENS = 5_000


def token_styles(app: App[Any]) -> list[Style]:
    """The token entropy scale's colours: the theme's success (committed) through its warning to its error
    (uncertain)."""
    theme = app.current_theme
    low, mid, high = (
        Color.parse(c or fallback)
        for c, fallback in ((theme.success, "green"), (theme.warning, "yellow"), (theme.error, "red"))
    )
    styles = []
    for i in range(LEVELS):
        t = i / (LEVELS - 1)
        colour = low.blend(mid, t * 2) if t < 0.5 else mid.blend(high, t * 2 - 1)
        styles.append(Style(color=colour.rich_color))
    return styles


def value(number: float | None, spec: str = "+z.3f") -> str:  # z: no "-0.000"
    return "—" if number is None else format(number, spec)


def sign_styles(app: App[Any]) -> tuple[Style, Style]:
    """An advantage's colours, above and below zero: the theme's success and error, as in the list."""
    theme = app.current_theme
    return Style(color=theme.success or "green"), Style(color=theme.error or "red")


def numbers(sample: dict[str, Any], signs: tuple[Style, Style], *, length: bool = True) -> Text:
    """`reward +1.500 · adv +0.500 · 12 tokens`, the advantage in its sign's colour."""
    text = Text()
    text.append(f"reward {value(sample.get('total'))}", style="bold")
    advantage = sample.get("advantage")
    text.append(" · adv ")
    text.append(value(advantage), style=signs[advantage < 0] if advantage else "")
    if length and sample.get("length") is not None:
        text.append(f" · {sample['length']:,} tokens")
    return text


def completion_text(sample: dict[str, Any], styles: list[Style]) -> Text:
    """The completion as one Text (a group's column), token-coloured when its per-token entropies are stored
    for exactly its tokens; cut at GROUP_CHARS characters (the sample screen shows it whole)."""
    tokens, entropy = sample.get("tokens"), sample.get("entropy")
    if tokens and entropy and len(tokens) == len(entropy):
        if len(tokens) > GROUP_TOKENS:
            text = token_text(tokens[:GROUP_TOKENS], entropy[:GROUP_TOKENS], styles)
            return text.append(
                f" … ({len(tokens) - GROUP_TOKENS:,} more tokens: enter opens it)", style="dim"
            )
        return token_text(tokens, entropy, styles)
    completion = sample.get("completion") or ""
    if len(completion) > GROUP_CHARS:
        rest = f" … ({len(completion) - GROUP_CHARS:,} more characters: enter opens it)"
        return Text(visible(completion[:GROUP_CHARS])).append(rest, style="dim")
    return Text(visible(completion))


def completion_pieces(sample: dict[str, Any], styles: list[Style]) -> list[tuple[str, Style | None]]:
    """The whole completion as pieces for a LongText: token-coloured as `completion_text`, or plain."""
    tokens, entropy = sample.get("tokens"), sample.get("entropy")
    if tokens and entropy and len(tokens) == len(entropy):
        return token_pieces(tokens, entropy, styles)
    return [(visible(sample.get("completion")), None)]


def extras(extra: dict[str, Any]) -> str:
    return visible(json.dumps(extra, ensure_ascii=False, indent=1, default=str)) if extra else "—"


def entropy_summary(entropy: list[float], vocab_size: int | None) -> str:
    finite = [v for v in entropy if math.isfinite(v)]
    if not finite:
        return "—"
    mean = sum(finite) / len(finite)
    line = f"mean {mean:.3f} · min {min(finite):.3f} · max {max(finite):.3f} nats over {len(finite)} tokens"
    if vocab_size and vocab_size > 1:
        line += f" · Φ mean {1 - mean / math.log(vocab_size):.4f}"
    return line


def policy(sample: dict[str, Any]) -> str:
    """The policy version that sampled it, and how far behind the step's it was (async RL), when the source
    says (engine/observe/rollouts/columns.py `policy_version`)."""
    version = (sample.get("extra") or {}).get("policy_version")
    if type(version) is not int:
        return ""
    behind = sample["step"] - version
    return f" · policy v{version:,}" + (f" ({behind:,} behind)" if behind > 0 else "")


def summary(run: RunRow, sample: dict[str, Any], signs: tuple[Style, Style]) -> Table:
    """Where the sample sits, its numbers, each reward function's value, its entropy, the source's extras."""
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    group = visible_line(sample.get("group_id")) or "—"
    table.add_row(
        "sample", Text(f"step {sample['step']:,} · group {group} · #{sample['idx']}{policy(sample)}")
    )
    table.add_row("", numbers(sample, signs))
    for name, score in (sample.get("rewards") or {}).items():
        table.add_row(Text(visible_line(name), style="dim"), value(score))
    if sample.get("entropy"):
        table.add_row("entropy", entropy_summary(sample["entropy"], run.vocab_size))
    table.add_row("extra", Text(extras(sample.get("extra") or {})))
    return table


def legend_or_note(run: RunRow, sample: dict[str, Any], styles: list[Style]) -> Text:
    if sample.get("tokens") and sample.get("entropy"):
        return legend(styles, run.vocab_size, sample["entropy"])
    if run.source_kind != "carl":
        return Text("per-token entropy is stored by carl's own runs only", style="dim")
    return Text("no per-token values stored for this sample", style="dim")


class RolloutSampleScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Close", id="rollout-sample.close")]

    def __init__(self, run: RunRow, sample: dict[str, Any]) -> None:
        super().__init__()
        self.run = run
        self.sample = sample

    def compose(self) -> ComposeResult:
        styles = token_styles(self.app)
        with VerticalScroll(id="rollout-sample") as box:
            box.border_title = Text(f"Sample · {visible_line(self.run.name)} · step {self.sample['step']:,}")
            yield Static(summary(self.run, self.sample, sign_styles(self.app)), id="sample-summary")
            yield Static("prompt", classes="sample-heading")
            yield LongText([(visible(self.sample.get("prompt")), None)], id="sample-prompt")
            yield Static("completion", classes="sample-heading")
            yield LongText(completion_pieces(self.sample, styles), id="sample-completion")
            yield Static(legend_or_note(self.run, self.sample, styles), id="sample-legend")
        yield KeyBar()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


def column_view(sample: dict[str, Any], styles: list[Style], signs: tuple[Style, Style]) -> Group:
    """A column of the group: `#3 reward +1.0 · adv -0.5`, then its length and each reward, the completion."""
    head = Text(f"#{sample['idx']} ", style="bold")
    head.append_text(numbers(sample, signs, length=False))
    parts = [] if sample.get("length") is None else [f"{sample['length']:,} tokens"]
    parts += [f"{visible_line(k)} {value(v, '.3g')}" for k, v in (sample.get("rewards") or {}).items()]
    return Group(head, Text(" · ".join(parts), style="dim"), Text(""), completion_text(sample, styles))


class RolloutGroupScreen(ModalScreen[None]):
    """One prompt and its completions side by side, the sample it was opened on focused first."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="rollout-group.close"),
        Binding("left", "column(-1)", "Previous", priority=True, id="rollout-group.previous"),
        Binding("right", "column(1)", "Next", priority=True, id="rollout-group.next"),
        Binding("enter", "open", "Open sample", id="rollout-group.open"),
    ]

    def __init__(self, run: RunRow, samples: list[dict[str, Any]], current: int | None = None) -> None:
        super().__init__()
        self.run = run
        self.samples = samples
        ids = [s["id"] for s in samples]
        self.column = ids.index(current) if current in ids else 0

    def compose(self) -> ComposeResult:
        first = self.samples[0] if self.samples else None
        with Vertical(id="rollout-group") as box:
            name = visible_line(self.run.name)
            if first is None:
                box.border_title = Text(f"Group · {name}")
                yield Static("This sample's group could not be read.")
                return
            group = visible_line(first.get("group_id")) or "same prompt"
            count = len(self.samples)
            box.border_title = Text(f"Group {group} · step {first['step']:,} · {count} completions · {name}")
            with VerticalScroll(id="group-prompt"):
                yield Static(Text(visible(first.get("prompt"))))
            styles, signs = token_styles(self.app), sign_styles(self.app)
            with HorizontalScroll(id="group-columns"):
                for i, sample in enumerate(self.samples):
                    with VerticalScroll(classes="group-column", id=f"group-column-{i}"):
                        yield Static(column_view(sample, styles, signs))
        yield KeyBar()

    def on_mount(self) -> None:
        if self.samples:
            self.focus_column(self.column)

    def focus_column(self, index: int) -> None:
        self.column = max(0, min(len(self.samples) - 1, index))
        column = self.query_one(f"#group-column-{self.column}")
        column.focus(scroll_visible=False)
        # the focused column first, on the left, as far as the columns scroll
        self.query_one("#group-columns").scroll_to(x=column.virtual_region.x, animate=False)

    def action_column(self, delta: int) -> None:
        if self.samples:
            self.focus_column(self.column + delta)

    def on_descendant_focus(self, event: Any) -> None:
        widget_id = getattr(event.widget, "id", None) or ""
        if widget_id.startswith("group-column-"):
            self.column = int(widget_id.removeprefix("group-column-"))

    def action_open(self) -> None:
        if self.samples:
            self.app.push_screen(RolloutSampleScreen(self.run, self.samples[self.column]))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
