"""Feeding the Phi and Rewards panes: from a RunView (one run) or a ComparePlan (marked runs), which
series go where, the pane titles and the reward bars or the comparison's legend."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.containers import Horizontal
from textual.content import Content
from textual.screen import Screen
from textual.widget import Widget

from engine.text import visible_line
from widgets.chart import LINE_COLOURS, AxisScale, Chart, entropy_axis
from widgets.command_log import CommandLog
from widgets.reward_bars import RewardBars

from .model import CompareRun, RunView

if TYPE_CHECKING:
    from widgets.legend import Legend

    from .comparison import ComparePlan

# Each axis' smallest span, so a flat series' noise reads as the wiggle it is. Φ lives in [0, 1]:
# a window widened near either end is shifted to stay inside.
PHI_SCALE = AxisScale(min_span=0.05, limits=(0.0, 1.0))
ENTROPY_SCALE = AxisScale(min_span=0.1, limits=(0.0, math.inf))  # nats
# Rewards are mostly scores in [0, 1] or [-1, 1] per function: a swing smaller than 0.1 is noise
# at that scale. Reward functions may return any value, so no limits.
REWARD_SCALE = AxisScale(min_span=0.1)
TITLE_MARGIN = 6  # a border title's columns besides its text: `╭─ ` and ` ─╮`


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}f}"


def _key(value: object) -> object:
    """Series by identity (the watcher returns the same object for a series that received no
    rows), tuples element by element, plain values (colour indices) by value."""
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    if value is None or isinstance(value, (int, float, str)):
        return value
    return id(value)


def _feed(chart: Chart, *series: object, **kwargs: object) -> None:
    """Hand the chart new data only when some series object changed, so an unchanged pane is not
    redrawn."""
    key = (_key(series), tuple((k, _key(v)) for k, v in sorted(kwargs.items())))
    if getattr(chart, "_carl_feed_key", None) == key:
        return
    chart._carl_feed_key = key  # type: ignore[attr-defined]
    chart.set_series(*series, **kwargs)  # type: ignore[arg-type]


def draw_phi(chart: Chart, view: RunView) -> str:
    """Phi mean with its p10-p90 band; entropy (nats) on the right axis. Returns the pane title."""
    phi = view.series.get("phi/mean")
    vocab = view.run.vocab_size
    chart.right_scale = ENTROPY_SCALE  # the entropy series' own scale, or the labels H(Φ)
    if phi is not None and len(phi):
        chart.left_scale = PHI_SCALE
        band = None
        if "phi/p10" in view.series and "phi/p90" in view.series:
            band = (view.series["phi/p10"], view.series["phi/p90"])
        secondary = None
        if vocab and vocab > 1:
            chart.set_right_transform(entropy_axis(vocab))  # H = (1 - Phi) ln|V|: same line, two scales
        else:
            chart.set_right_transform(None)
            secondary = view.series.get("phi/entropy")
        _feed(chart, phi, band=band, secondary=secondary)
        title = f"Φ coherence {_num(phi.latest)}"
        entropy = view.latest("phi/entropy")
        if entropy is None and vocab and phi.latest is not None:
            entropy = (1 - phi.latest) * math.log(vocab)
        title += f" · H {_num(entropy, 3)} nats"
        if band is not None:
            title += f" · p10–p90 {_num(band[0].latest, 3)}–{_num(band[1].latest, 3)}"
        if vocab:
            title += f" · |V| {vocab:,}"
        return title
    entropy_series = view.series.get("entropy")
    if entropy_series is not None and len(entropy_series):
        chart.left_scale = ENTROPY_SCALE
        chart.set_right_transform(None)
        _feed(chart, entropy_series)
        return f"entropy {_num(entropy_series.latest, 3)} nats · Φ needs the vocabulary size |V|"
    _feed(chart)
    return "Φ coherence"


class RewardsPane(Horizontal):
    """The Rewards pane (its chart and bars): its title says less when the pane is narrower (`rewards_title`),
    so `refit` fits it again when the pane's size changes (the terminal's, or a pane maximized)."""

    def __init__(
        self, refit: Callable[[], None], *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.refit = refit

    def on_resize(self) -> None:
        self.refit()


def draw_rewards(chart: Chart, view: RunView, colors: list[str], width: int = 0) -> str:
    """One line per reward function (the total when there are none). Returns the pane title for a pane
    `width` columns wide (0: not laid out yet, the whole title)."""
    series = [view.series[f"rewards/{name}/mean"] for name in view.reward_names]
    if not series and "reward" in view.series:
        series = [view.series["reward"]]
    chart.left_scale = REWARD_SCALE
    _feed(chart, *series)
    return rewards_title(view, width)


def rewards_title(view: RunView, width: int = 0) -> str:
    """`Rewards · total 1.74 · mismatch KL 0.012 · stale 1.3 · gate ... · 3 functions`, as much of it as fits
    a pane `width` columns wide (0: all of it). Narrower, the count of functions goes first (the bars show
    them), then the long forms and the word "total", then the gate, staleness and the mismatch."""
    total = view.latest("reward")
    number = _num(total, 3) if total is not None else None
    kl, diff = view.async_rl.get("mismatch/kl"), view.async_rl.get("mismatch/logprob_abs_diff/mean")
    mismatch: tuple[str | None, str | None] = (None, None)  # the long and the short form
    if kl is not None:
        mismatch = (f"mismatch KL {kl:.2g}", f"mismatch {kl:.2g}")
    elif diff is not None:
        mismatch = (f"mismatch |Δlog p| {diff:.2g}", f"|Δlog p| {diff:.2g}")
    stale = view.async_rl.get("staleness/mean")
    stale_text = f"stale {stale:.2g}" if stale is not None else None
    gate: tuple[str | None, str | None] = (None, None)
    if view.gate:
        gate = (f"gate {view.gate['reason'] or view.gate['state']}", f"gate {view.gate['state']}")
    count = len(view.reward_names)
    functions = f"{count} function{'s' if count != 1 else ''}" if count else None
    head = "Rewards" + (f" · total {number}" if number else "")
    short_head = "Rewards" + (f" {number}" if number else "")
    variants = (
        (head, mismatch[0], stale_text, gate[0], functions),
        (head, mismatch[0], stale_text, gate[0]),
        (head, mismatch[1], stale_text, gate[0]),
        (head, mismatch[1], stale_text, gate[1]),
        (short_head, mismatch[1], stale_text, gate[1]),
        (short_head, mismatch[1], stale_text),
        (short_head, mismatch[1]),
        (short_head,),
    )
    room = width - TITLE_MARGIN
    title = head
    for parts in variants:
        title = " · ".join(p for p in parts if p)
        if not width or cell_len(title) <= room:
            break
    return title


def reward_colors(chart: Chart, count: int) -> list[str]:
    """The colour of each reward function's line, so its bar matches it."""
    colors = []
    for index in range(count):
        style = chart.line_style(index % LINE_COLOURS)
        colors.append(str(style.color.name) if style.color else "")
    return colors


# -- comparing runs ------------------------------------------------------------------------------


def draw_compare_phi(chart: Chart, runs: list[CompareRun], colors: list[int]) -> None:
    """Each run's Φ mean in its colour, the first drawn on top; entropy on the right axis when
    the runs share one vocabulary size."""
    vocabs = {c.run.vocab_size for c in runs}
    vocab = next(iter(vocabs)) if len(vocabs) == 1 else None
    chart.left_scale, chart.right_scale = PHI_SCALE, ENTROPY_SCALE
    chart.set_right_transform(entropy_axis(vocab) if vocab and vocab > 1 else None)
    _feed(chart, *(c.series.get("phi/mean") for c in runs), colors=tuple(colors))


def draw_compare_rewards(chart: Chart, runs: list[CompareRun], colors: list[int], key: str) -> None:
    """Each run's total (or task) reward in its colour, aligned by step."""
    chart.left_scale = REWARD_SCALE
    _feed(chart, *(c.series.get(key) for c in runs), colors=tuple(colors))


# -- the panes of the control room's screen ----------------------------------------------------------


def short_name(reward_name: str) -> str:
    """TRL names reward keys after the function: `format_reward` reads better as `format`."""
    return reward_name.removesuffix("_reward") or reward_name


def draw_run(screen: Screen[Any], view: RunView, *, comparing: bool) -> None:
    """The selected run: its command log, and (unless a comparison holds them) its Φ and Rewards."""
    screen.query_one(CommandLog).set_commands(view.commands)
    if comparing:
        return  # the Φ and Rewards panes show the comparison
    phi_chart = screen.query_one("#phi-chart", Chart)  # the Φ pane is its chart
    set_title(phi_chart, draw_phi(phi_chart, view))
    reward_chart = screen.query_one("#reward-chart", Chart)
    if view.warmup_steps and (view.run.last_step or 0) <= view.warmup_steps:
        reward_chart.empty_text = f"rewards start after the SFT warm-up (step {view.warmup_steps:,})"
    else:
        reward_chart.empty_text = "no reward data yet"
    colors = reward_colors(reward_chart, len(view.reward_names))
    pane = screen.query_one("#rewards-pane")
    set_title(pane, draw_rewards(reward_chart, view, colors, pane.outer_size.width))
    bars = [(short_name(name), view.latest(f"rewards/{name}/mean")) for name in view.reward_names]
    if "reward" in view.series:
        bars.append(("total", view.latest("reward")))
    screen.query_one(RewardBars).set_values(bars, colors + ([""] if "reward" in view.series else []))
    phi_chart.set_markers(view.markers("gate_open", "crystallization"))
    reward_chart.set_markers(view.markers("gate_open"))
    set_subtitle(phi_chart, None)


def line_style(screen: Screen[Any], color: int) -> Style:
    """A comparison colour index as the charts draw it (the theme decides)."""
    return screen.query_one("#phi-chart", Chart).line_style(color)


def draw_comparison(screen: Screen[Any], plan: ComparePlan) -> None:
    """Overlay the marked runs on the Φ and reward charts, with a legend of their latest values."""
    from widgets.legend import LegendRow

    phi_chart = screen.query_one("#phi-chart", Chart)
    reward_chart = screen.query_one("#reward-chart", Chart)
    draw_compare_phi(phi_chart, plan.runs, plan.colors)
    draw_compare_rewards(reward_chart, plan.runs, plan.colors, plan.reward_key)
    phi_chart.set_markers(())
    reward_chart.set_markers(())
    set_title(phi_chart, plan.phi_title)
    compact = Text()
    for name, color in plan.compact:
        compact.append(" ━ " + visible_line(name), line_style(screen, color))
    compact.append(" ")
    set_subtitle(phi_chart, compact)
    set_title(screen.query_one("#rewards-pane"), plan.rewards_title)
    rows = [LegendRow(e.label, line_style(screen, e.color), e.values) for e in plan.legend]
    legend(screen).set_rows(rows, header=plan.legend_header)


def legend(screen: Screen[Any]) -> Legend:
    """The comparison's legend, mounted in the Rewards pane the first time runs are compared:
    the first frame, which compares nothing, neither imports nor styles it."""
    from widgets.legend import Legend

    legends = screen.query(Legend)
    if legends:
        return legends.first(Legend)
    mounted = Legend(id="compare-legend")
    screen.query_one("#rewards-pane").mount(mounted)
    return mounted


def set_title(pane: Widget, title: str) -> None:
    set_border(pane, "title", title)


def set_subtitle(pane: Widget, subtitle: str | Text | None) -> None:
    set_border(pane, "subtitle", subtitle)


def set_border(pane: Widget, which: str, text: str | Text | None) -> None:
    """Set a border title as plain text (a run name is not markup; a str has its control characters
    made visible, a Text is built from visible parts), and only when it changed: setting one repaints
    the pane even when it is the same."""
    if isinstance(text, str):
        text = Text(visible_line(text))
    new = None if text is None else Content.from_rich_text(text)
    if getattr(pane, f"_border_{which}", None) != new:
        setattr(pane, f"border_{which}", new)
