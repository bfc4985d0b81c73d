"""Modal screens: help (generated from the live bindings) and the observe dialog.

What they show is text, never markup: a title, a message or a cell quotes stored names and values, so it
is a `Text` with its control characters made visible (engine/text.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from engine.text import visible, visible_line
from widgets.long_text import LongText, Piece


def bindings_table(rows: list[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, description in rows:
        if key:
            table.add_row(Text(key), Text(description))
        else:  # a section header
            table.add_row(Text(description, style="bold underline"), "")
    return table


class HelpScreen(ModalScreen[bool | None]):
    """Every binding active where `?` was pressed, from the same table that drives the footer. (Its result is
    None; the eval, a HelpScreen in its looks, answers True to evaluate again.)"""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close help", id="help.close")]

    def __init__(self, rows: list[tuple[str, str]], extra: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.extra = extra

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = "Keys"
            yield Static(bindings_table(self.rows))
            if self.extra:
                yield Static(Text(self.extra, style="dim"))

    async def action_dismiss(self, result: bool | None = None) -> None:
        self.dismiss(result)


def eval_table(evaluation: dict[str, Any]) -> Table:
    """A stored eval: the verdict, the reasons (failed checks first) and every figure."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    passed = evaluation["passed"]
    table.add_row("verdict", Text("✓ passed" if passed else "✕ failed", style="green" if passed else "red"))
    for reason in evaluation["reasons"]:
        table.add_row("", Text(visible(str(reason))))
    # key -> (label, how its value reads): shares as percentages, a mean count to one decimal.
    labels: dict[str, tuple[str, Any]] = {
        "task": ("task reward (mean)", "{:.3f}".format),
        "solved": ("solved", "{:.0%}".format),
        "format": ("format-compliant", "{:.0%}".format),
        "phi": ("Φ (mean)", "{:.4f}".format),
        "entropy": ("entropy (nats)", "{:.3f}".format),
        "answer_tokens": ("answer tokens (mean)", "{:.1f}".format),
        "prompts": ("held-out prompts", "{:,}".format),
        "step": ("step", "{:,}".format),
        "model_dir": ("model", str),
        "seconds": ("took", lambda s: f"{s:.1f} s"),
    }
    for key, (label, shown) in labels.items():
        value = evaluation["metrics"].get(key)
        if value is not None:
            try:
                text = shown(value)
            except (TypeError, ValueError):  # a stored value of another type: shown as it is
                text = str(value)
            table.add_row(label, Text(visible(text)))
    return table


class EvalScreen(HelpScreen):
    """The run's newest held-out evaluation; `r` runs it again (the screen returns True)."""

    BINDINGS = [
        Binding("escape,q,e", "dismiss", "Close", id="eval.close"),
        Binding("r", "again", "Evaluate again", id="eval.again"),
    ]

    def action_again(self) -> None:
        self.dismiss(True)

    def __init__(self, run_name: str, evaluation: dict[str, Any]) -> None:
        super().__init__([])
        self.run_name = run_name
        self.evaluation = evaluation

    def compose(self) -> ComposeResult:
        import datetime

        with VerticalScroll() as scroll:
            scroll.border_title = Text(f"Eval of {visible_line(self.run_name)}")
            yield Static(eval_table(self.evaluation))
            when = datetime.datetime.fromtimestamp(self.evaluation["created_at"]).strftime("%Y-%m-%d %H:%M")
            yield Static(Text(f"evaluated {when} · r evaluates again · esc closes", style="dim"))


class TextScreen(HelpScreen):
    """A long text to read and scroll (what is sent to Claude)."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close", id="text.close")]

    def __init__(self, title: str, text: str) -> None:
        super().__init__([])
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = Text(visible_line(self.title_text))
            yield Static(Text(visible(self.text)))


class Dialog(ModalScreen[Any]):
    """A centred box over the control room; `escape` cancels with `CANCELLED`. Subclasses add only
    what differs (width, border colour, their own widgets)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]
    CANCELLED: Any = None

    def action_cancel(self) -> None:
        self.dismiss(self.CANCELLED)


@dataclass
class ObserveRequest:
    path: str
    follow: bool
    name: str | None
    log: str | None = None  # the file the run's script writes its output to: its console


class ObserveScreen(Dialog):
    """Ask for a path to observe: a run's files, or a directory of runs (discovery finds them)."""

    def __init__(self, validate: callable | None = None) -> None:  # type: ignore[valid-type]
        super().__init__()
        self.validate_path = validate

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Observe a run"
            yield Label(
                "Path: a training output dir (TensorBoard, W&B, completions, trainer_state.json), a wandb/ or"
                " mlruns/ dir, an event file, a .wandb file, a Trackio .db, or a JSONL log"
            )
            yield Input(placeholder="~/runs/grpo-out", id="observe-path")
            yield Label("Run name (optional)")
            yield Input(placeholder="derived from the source", id="observe-name")
            yield Label("Console log (optional): the file its stdout/stderr go to")
            yield Input(placeholder="~/runs/grpo-out/train.log", id="observe-log")
            with Horizontal():
                yield Checkbox("Follow (keep tailing)", value=True, id="observe-follow")
                yield Button("Observe", variant="primary", id="observe-ok")
            yield Static("", id="observe-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self._submit()

    def _submit(self) -> None:
        path = self.query_one("#observe-path", Input).value.strip()
        if not path:
            self.query_one("#observe-error", Static).update("enter a path")
            return
        if self.validate_path is not None:
            problem = self.validate_path(path)
            if problem:
                self.query_one("#observe-error", Static).update(Text(visible(problem)))  # a path is text
                return
        name = self.query_one("#observe-name", Input).value.strip() or None
        follow = self.query_one("#observe-follow", Checkbox).value
        log = self.query_one("#observe-log", Input).value.strip() or None
        if log is not None and (problem := log_problem(log)):
            self.query_one("#observe-error", Static).update(Text(visible(problem)))
            return
        self.dismiss(ObserveRequest(path, follow, name, log))


def log_problem(path: str) -> str | None:
    """Why `path` cannot be a console log (a FIFO, a device, a directory), in one line; a file not there yet
    is fine (the script is about to write it)."""
    from engine.files import FileKindError, regular_file

    target = Path(path).expanduser()
    if not target.exists():
        return None
    try:
        regular_file(target, "regular file (a log)")
    except FileKindError as exc:
        return f"log: {exc}"
    return None


class ConfirmScreen(Dialog):
    """A destructive action needs a deliberate second step: focus starts on Cancel, so it takes
    tab then enter (k9s' confirmation) or the action's own key pressed again."""

    CANCELLED = False

    def __init__(self, title: str, message: str, confirm_label: str, confirm_key: str) -> None:
        super().__init__()
        self.title_text, self.message, self.confirm_label, self.confirm_key = (
            title,
            message,
            confirm_label,
            confirm_key,
        )

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = Text(visible_line(self.title_text))
            yield Static(Text(visible(self.message)))
            with Horizontal():
                yield Button("Cancel", id="confirm-cancel")
                yield Button(self.confirm_label, variant="error", id="confirm-ok")

    def on_mount(self) -> None:
        self.query_one("#confirm-cancel", Button).focus()

    def on_key(self, event: events.Key) -> None:
        if self.confirm_key in (event.key, event.character):  # a keymap may name it either way
            event.stop()  # the key is spent here: under the dialog it would ask again
            event.prevent_default()
            self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-ok")


class ValueScreen(Dialog):
    """Ask for one value (a learning rate, a reward weight) with a check before it is sent."""

    def __init__(self, title: str, label: str, value: str, check: Callable[[str], str | None]) -> None:
        super().__init__()
        self.title_text, self.label, self.value, self.check = title, label, value, check

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = Text(visible_line(self.title_text))
            yield Label(Text(visible(self.label)))
            yield Input(value=self.value, id="value-input")
            yield Static("", id="value-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        problem = self.check(event.value.strip())
        if problem:
            self.query_one("#value-error", Static).update(Text(visible(problem)))
            return
        self.dismiss(event.value.strip())


class ChoiceScreen(Dialog):
    """Pick one of a few labelled choices (a training config for a new run)."""

    def __init__(self, title: str, label: str, choices: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text, self.label, self.choices = title, label, choices

    def compose(self) -> ComposeResult:
        from textual.widgets import OptionList
        from textual.widgets.option_list import Option

        with Vertical() as box:
            box.border_title = Text(visible_line(self.title_text))
            yield Label(Text(visible(self.label)))
            options = [Option(Text(visible_line(text)), id=value) for value, text in self.choices]
            yield OptionList(*options, id="choice-list")

    def on_option_list_option_selected(self, event: object) -> None:
        option = getattr(event, "option", None)
        self.dismiss(option.id if option is not None else None)


def phi_colour(phi: float, low: str, mid: str, high: str) -> str:
    """A token's colour by its Phi: low -> mid -> high (the theme's error, warning, success)."""
    from textual.color import Color

    phi = min(max(phi, 0.0), 1.0)
    a, b, t = (low, mid, phi * 2) if phi < 0.5 else (mid, high, phi * 2 - 1)
    return Color.parse(a).blend(Color.parse(b), t).hex


class SamplesScreen(ModalScreen[None]):
    """Recent completions of the run, each token coloured by the Phi of the distribution that
    produced it (red: uncertain, green: committed)."""

    BINDINGS = [Binding("escape,v,q", "dismiss", "Close", id="samples.close")]

    def __init__(self, samples: list[dict[str, Any]], vocab_size: int | None) -> None:
        super().__init__()
        self.samples = samples
        self.vocab_size = vocab_size

    def compose(self) -> ComposeResult:
        from textual.widgets import OptionList
        from textual.widgets.option_list import Option

        with Vertical() as box:
            box.border_title = "Samples · per-token Φ"
            if not self.samples:
                yield Static(
                    "No samples stored for this run (carl's own training keeps best, worst, median "
                    "and a random completion of every step)."
                )
                return
            options = []
            for i, s in enumerate(self.samples):
                rewards = " ".join(
                    f"{visible_line(k.removesuffix('_reward'))}={v:.2f}"
                    for k, v in (s["rewards"] or {}).items()
                    if isinstance(v, int | float)
                )
                phi = s.get("phi") or []
                mean = f"Φ̄ {sum(phi) / len(phi):.3f}" if phi else "Φ —"
                kind = visible_line(s.get("kind"))
                options.append(Option(Text(f"step {s['step']:>6} {kind:<7} {mean} {rewards}"), id=str(i)))
            yield OptionList(*options, id="sample-list")
            with VerticalScroll(id="sample-text"):
                yield Static("", id="sample-body")
                yield LongText(id="sample-completion")  # the completion, of any length, a screen at a time
                yield Static("", id="sample-figures")

    def on_mount(self) -> None:
        if self.samples:
            self.show(0)

    def on_option_list_option_highlighted(self, event: object) -> None:
        option = getattr(event, "option", None)
        if option is not None and option.id is not None:
            self.show(int(option.id))

    def show(self, index: int) -> None:
        sample = self.samples[index]
        theme = self.app.current_theme
        body = Text()
        body.append("prompt: ", style="bold")
        body.append(visible((sample.get("prompt") or "")[-400:]) + "\n\n", style="dim")
        body.append("completion (coloured by per-token Φ):", style="bold")
        tokens, phi = sample.get("tokens"), sample.get("phi")
        colours = (theme.error or "red", theme.warning or "yellow", theme.success or "green")
        pieces: list[Piece]
        if tokens and phi and len(tokens) == len(phi):
            pieces = [
                (visible(token), Style.parse(phi_colour(value, *colours)))
                for token, value in zip(tokens, phi, strict=True)
            ]
        else:
            pieces = [(visible(sample.get("completion")), None)]
        figures = Text()
        if phi:
            entropy = sample.get("entropy") or []
            figures.append(f"\nΦ min {min(phi):.3f} · mean {sum(phi) / len(phi):.3f} · max {max(phi):.3f}")
            if entropy:
                figures.append(f" · H mean {sum(entropy) / len(entropy):.3f} nats")
            figures.append(f" · {len(phi)} tokens")
        self.query_one("#sample-body", Static).update(body)
        self.query_one("#sample-completion", LongText).set_pieces(pieces)
        self.query_one("#sample-figures", Static).update(figures)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
