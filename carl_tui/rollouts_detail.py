"""A sample up close (`enter` in the rollouts viewer) and a GRPO group side by side (`g`).

The sample: its place (step, group, index), each reward function's value, the total, the advantage, the
length, the source's other fields, the whole prompt, the hint the agents plane's trainer distilled from (its
`extra`), and the whole completion. When the run stored per-token values (our own runs), the completion is
drawn token by token in the colour of each token's entropy, the forking tokens underlined, with the legend
(widgets/token_text.py); a hinted sample of the agents plane also has its OPD advantage per token, and `c`
switches the colouring between the two. The group: one prompt, and its completions in columns, as many as
fit, scrolled sideways with `←` `→`. Stored text is shown as text, control characters made visible.
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
from widgets.token_text import (
    ENTROPY,
    OPD_ADVANTAGE,
    Scale,
    diverging_legend,
    legend,
    token_pieces,
    token_text,
)

GROUP_CHARS = 20_000  # of a completion shown in a group's column (the sample screen draws the whole of it)
GROUP_TOKENS = 5_000
OPD_MEANING = "+ liked more with the hint"  # the OPD legend's words: what a positive advantage means


def token_styles(app: App[Any], scale: Scale = ENTROPY) -> list[Style]:
    """A token scale's colours, one style per step. Entropy: the theme's success (committed) through its
    warning to its error (uncertain). A diverging scale (the OPD advantage): the theme's error (below zero)
    fading to plain text at its middle step, then its success (above zero), as an advantage's sign is
    coloured everywhere else."""
    theme = app.current_theme
    success, warning, error = (
        Color.parse(c or fallback)
        for c, fallback in ((theme.success, "green"), (theme.warning, "yellow"), (theme.error, "red"))
    )
    last = scale.levels - 1
    styles = []
    if scale.diverging:
        plain, middle = Color.parse(theme.foreground or "white"), last // 2
        for i in range(scale.levels):
            t = (i - middle) / middle  # -1 .. 1
            colour = plain.blend(error if t < 0 else success, abs(t))
            styles.append(Style() if i == middle else Style(color=colour.rich_color))
        return styles
    for i in range(scale.levels):
        t = i / last
        colour = success.blend(warning, t * 2) if t < 0.5 else warning.blend(error, t * 2 - 1)
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


Colouring = tuple[Scale, list[float]]  # a token scale and the sample's value of each token on it


def colourings(sample: dict[str, Any]) -> list[Colouring]:
    """What the sample's tokens can be coloured by, each stored for exactly its tokens: their entropy (our own
    runs), their OPD advantage (a hinted sample of the agents plane's trainer, in its `extra`)."""
    tokens = sample.get("tokens")
    if not tokens:
        return []
    out: list[Colouring] = []
    entropy = sample.get("entropy")
    if entropy and len(entropy) == len(tokens):
        out.append((ENTROPY, entropy))
    advantage = opd_advantage(sample)
    if advantage is not None and len(advantage) == len(tokens):
        out.append((OPD_ADVANTAGE, advantage))
    return out


def opd_advantage(sample: dict[str, Any]) -> list[float] | None:
    """The sample's OPD advantage per token, as the agents plane's trainer keeps it in `extra` (None: it has
    none, or what is there is not a list of numbers). A null is a token without one (NaN: drawn plain)."""
    values = (sample.get("extra") or {}).get("opd_advantage")
    if not isinstance(values, list) or not all(type(v) in (int, float) or v is None for v in values):
        return None
    return [math.nan if v is None else float(v) for v in values]


def completion_pieces(
    sample: dict[str, Any], colouring: Colouring | None, styles: list[Style]
) -> list[tuple[str, Style | None]]:
    """The whole completion as pieces for a LongText: its tokens coloured by `colouring` on `styles` (the
    scale's colours), or plain."""
    if colouring is not None:
        scale, values = colouring
        return token_pieces(sample["tokens"], values, styles, scale)
    return [(visible(sample.get("completion")), None)]


def extras(extra: dict[str, Any]) -> str:
    """The source's other fields as JSON, but for those the sample screen shows in a place of their own: the
    hint (a text) and the OPD advantage (a list of numbers, summed up in its own row)."""
    apart = {"hint"} if isinstance(extra.get("hint"), str) else set()
    if opd_advantage({"extra": extra}) is not None:
        apart.add("opd_advantage")
    extra = {k: v for k, v in extra.items() if k not in apart}
    return visible(json.dumps(extra, ensure_ascii=False, indent=1, default=str)) if extra else "—"


def signed_summary(values: list[float], unit: str = "nats") -> str:
    """`mean +0.031 · min -0.410 · max +0.620 nats over 23 tokens` of the finite values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "—"
    mean = sum(finite) / len(finite)
    return (
        f"mean {mean:+.3f} · min {min(finite):+.3f} · max {max(finite):+.3f} {unit} over {len(finite)} tokens"
    )


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
    advantage = opd_advantage(sample)
    if advantage:
        table.add_row("OPD", signed_summary(advantage))
    table.add_row("extra", Text(extras(sample.get("extra") or {})))
    return table


def legend_or_note(
    run: RunRow, sample: dict[str, Any], colouring: Colouring | None, styles: list[Style]
) -> Text:
    if colouring is not None and colouring[0].diverging:
        return diverging_legend(styles, colouring[0], OPD_MEANING)
    if colouring is not None:
        return legend(styles, run.vocab_size, colouring[1])
    if run.source_kind != "carl":
        return Text("per-token entropy is stored by carl's own runs only", style="dim")
    return Text("no per-token values stored for this sample", style="dim")


class RolloutSampleScreen(ModalScreen[None]):
    """A sample whole; `c` colours its tokens by the next value it has per token (entropy, OPD advantage)."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="rollout-sample.close"),
        Binding(
            "c",
            "colour",
            "Colour by",
            tooltip="Colour the tokens by their entropy or by their OPD advantage",
            id="rollout-sample.colour",
        ),
    ]

    def __init__(self, run: RunRow, sample: dict[str, Any]) -> None:
        super().__init__()
        self.run = run
        self.sample = sample
        self.colourings = colourings(sample)
        self.colouring = 0  # which of them colours the tokens: the first (entropy, when stored)

    @property
    def current(self) -> Colouring | None:
        return self.colourings[self.colouring] if self.colourings else None

    def compose(self) -> ComposeResult:
        hint = (self.sample.get("extra") or {}).get("hint")
        with VerticalScroll(id="rollout-sample") as box:
            box.border_title = Text(f"Sample · {visible_line(self.run.name)} · step {self.sample['step']:,}")
            yield Static(summary(self.run, self.sample, sign_styles(self.app)), id="sample-summary")
            yield Static("prompt", classes="sample-heading")
            yield LongText([(visible(self.sample.get("prompt")), None)], id="sample-prompt")
            if isinstance(hint, str) and hint:  # the teacher's extra context: after the prompt, as it read it
                yield Static("hint", classes="sample-heading")
                yield Static(Text(visible(hint)), id="sample-hint")
            yield Static("completion", classes="sample-heading", id="sample-completion-heading")
            yield LongText(id="sample-completion")
            yield Static(id="sample-legend")
        yield KeyBar()

    def on_mount(self) -> None:
        self.draw_tokens()

    def draw_tokens(self) -> None:
        """The completion in the current colouring, its heading naming it, and its legend."""
        colouring = self.current
        styles = token_styles(self.app, colouring[0] if colouring else ENTROPY)
        heading = f"completion · coloured by {colouring[0].name}" if colouring else "completion"
        self.query_one("#sample-completion-heading", Static).update(Text(heading))
        self.query_one("#sample-completion", LongText).set_pieces(
            completion_pieces(self.sample, colouring, styles)
        )
        self.query_one("#sample-legend", Static).update(
            legend_or_note(self.run, self.sample, colouring, styles)
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`c` is there only for a sample with more than one thing to colour by."""
        return len(self.colourings) > 1 if action == "colour" else True

    def action_colour(self) -> None:
        if len(self.colourings) > 1:
            self.colouring = (self.colouring + 1) % len(self.colourings)
            self.draw_tokens()

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
