"""Chart: a braille (or block) line chart on Textual's Line API, for Phi and reward series.

The numbers go through `widgets.raster` (no Textual there); this module lays out the axes, turns the
raster into Strips and caches them. Strips are rebuilt only when data, size, mode or theme
changed, and `render_line` just indexes the cached list. The widget runs no timers: whoever
feeds it data decides when to redraw.

Styling. Each colour comes from a component class, which TCSS can set:

    Chart > .chart--line-0 { color: $accent; }    /* primary series; extra lines use 1..5 */
    Chart > .chart--band { color: $accent 35%; }   /* the band, e.g. p10..p90 */
    Chart > .chart--secondary { color: $primary-lighten-2; }  /* right-axis series, its labels */
    Chart > .chart--marker { color: $error; }      /* vertical markers */
    Chart > .chart--axis { color: $foreground-muted; }  /* axis lines and tick labels */
    Chart > .chart--empty { color: $foreground-muted; text-style: italic; }

A theme may instead define a variable named like the class with one dash (`chart-line-0`,
`chart-band`, `chart-marker`, `chart-axis`, ...); when it does, that colour wins, so a theme
alone decides how charts look while themes without those variables fall back to the TCSS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.color import Color, ColorParseError
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from .raster import (
    CELL_DOTS,
    BandLayer,
    Layer,
    LineLayer,
    MarkerLayer,
    Range,
    Raster,
    at_least,
    cell_col,
    cell_row,
    draw,
    envelopes,
    extent,
    format_tick,
    nice_ticks,
    padded,
    widen,
    x_extent,
)

if TYPE_CHECKING:
    from engine.store.reader import Series

LINE_COLOURS = 6  # chart--line-0 .. chart--line-5, cycled for more series
LABEL_DIGITS = 4  # significant digits of a value-axis label at most: 6.224, not 6.22366
Transform = Callable[[float], float]


@dataclass(frozen=True)
class EntropyAxis:
    """Right-axis labels for a Phi chart: entropy in nats, H = (1 - Phi) * ln|V|.

    A value object, so setting an equal transform again does not redraw the chart."""

    vocab_size: int

    def __call__(self, phi: float) -> float:
        return (1.0 - phi) * math.log(self.vocab_size)


def entropy_axis(vocab_size: int) -> EntropyAxis:
    return EntropyAxis(vocab_size)


@dataclass(frozen=True)
class AxisScale:
    """How a value axis fits its data when no fixed range is given.

    `min_span`: the window is never narrower, so a flat series' noise is drawn as the small
    wiggle it is, not blown up to fill the chart. `limits`: where the values live (Φ in [0, 1]);
    a window widened to `min_span` is shifted to stay inside them rather than cut."""

    min_span: float = 0.0
    limits: Range | None = None

    def fit(self, extent: Range, min_span: float | None = None) -> Range:
        """The window for data spanning `extent`: padded off the frame, widened to `min_span`
        (this scale's by default) about the data's centre, kept inside `limits`."""
        span = self.min_span if min_span is None else max(min_span, self.min_span)
        lo, hi = extent
        # a single value is widened by `span` alone, not first by `padded`'s guess (±0.5 at 0)
        window = padded(extent) if hi > lo or span <= 0 else extent
        return at_least(window, span, self.limits, extent)


@dataclass
class _Axes:
    left: dict[int, str]  # tick label by cell row
    right: dict[int, str]
    right_is_series: bool  # the right axis is the secondary series' own scale, not a transform
    gutters: tuple[int, int]  # left and right widths, axis line included


class Chart(Widget):
    """A line chart of bucketed series: primary line, band, extra lines, optional right axis.

    - `set_series(primary, *extra, band=(lo, hi), secondary=s, colors=...)` sets the data;
    - `set_markers(steps)` draws vertical lines (gate opened, crystallization);
    - `set_right_transform(fn)` labels a right axis with fn(left tick) (see `entropy_axis`);
      a `secondary` series instead gets an independent right scale;
    - `left_scale` and `right_scale` (`AxisScale`) give each axis a minimum span and limits.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "chart--axis",
        "chart--band",
        "chart--empty",
        "chart--marker",
        "chart--secondary",
        *(f"chart--line-{i}" for i in range(LINE_COLOURS)),
    }

    # Defaults for any theme; carl themes override colours through `chart-*` variables (see top). The
    # one widget that keeps DEFAULT_CSS (themes/carl.tcss says why): it is drawn outside the app too.
    DEFAULT_CSS = """
    Chart { width: 1fr; height: 1fr; }
    Chart > .chart--axis { color: $foreground-muted; }
    Chart > .chart--band { color: $accent 35%; }
    Chart > .chart--empty { color: $foreground-muted; text-style: italic; }
    Chart > .chart--marker { color: $error; }
    Chart > .chart--secondary { color: $primary-lighten-2; }
    Chart > .chart--line-0 { color: $accent; }
    Chart > .chart--line-1 { color: $primary; }
    Chart > .chart--line-2 { color: $success; }
    Chart > .chart--line-3 { color: $secondary; }
    Chart > .chart--line-4 { color: $foreground; }
    Chart > .chart--line-5 { color: $warning; }
    """

    mode: reactive[str] = reactive("braille")
    """'braille' (2x4 dots a cell) or 'block' (2x2 quadrant blocks, for fonts without braille)."""
    y_range: reactive[Range | None] = reactive(None)
    """Fixed left scale, e.g. (0, 1) for Phi; None fits the visible data."""
    secondary_y_range: reactive[Range | None] = reactive(None)
    """Fixed right scale for the secondary series; None fits it."""
    x_range: reactive[Range | None] = reactive(None)
    """Steps shown; None spans all series."""
    left_scale: reactive[AxisScale] = reactive(AxisScale())
    """How the left axis fits its data when `y_range` is None: its minimum span and limits."""
    right_scale: reactive[AxisScale] = reactive(AxisScale())
    """The right axis': for the secondary series' own scale, and the minimum span of the labels
    a right transform prints (the left window widens until they span that much)."""
    empty_text: reactive[str] = reactive("no data yet")
    """Shown centred when no series has a finite value."""

    def __init__(
        self,
        *,
        mode: str = "braille",
        empty_text: str = "no data yet",
        y_range: Range | None = None,
        right_transform: Transform | None = None,
        left_scale: AxisScale | None = None,
        right_scale: AxisScale | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        self._lines: tuple[Series | None, ...] = ()
        self._colors: tuple[int, ...] = ()
        self._band: tuple[Series, Series] | None = None
        self._secondary: Series | None = None
        self._markers: tuple[float, ...] = ()
        self._right_transform = right_transform
        self._strips: list[Strip] = []
        self._built_size: tuple[int, int] | None = None
        self._gutters = (6, 0)  # widths of the left and right axes at the last build
        self._drawn: tuple[Range | None, Range | None] = (None, None)
        self._dirty = True
        self.build_count = 0  # strips rebuilt so far; lets tests and benches see the cache work
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.set_reactive(Chart.mode, self.validate_mode(mode))
        self.set_reactive(Chart.empty_text, empty_text)
        self.set_reactive(Chart.y_range, y_range)
        self.set_reactive(Chart.left_scale, left_scale or AxisScale())
        self.set_reactive(Chart.right_scale, right_scale or AxisScale())

    # -- public API ----------------------------------------------------------------------------

    def set_series(
        self,
        primary: Series | None = None,
        *extra: Series | None,
        band: tuple[Series, Series] | None = None,
        secondary: Series | None = None,
        colors: Sequence[int] | None = None,
    ) -> None:
        """Replace the data: `primary` (colour line-0, drawn on top), `extra` lines (line-1, ...; None: a line
        with no data, which keeps the others' colours),
        a `band` (lo, hi) under them, and a `secondary` series on its own right-hand scale.
        `colors` gives each line its colour index instead (lines may share one: the seeds of an arm)."""
        self._lines = (primary, *extra)
        given = tuple(colors or ())[: len(self._lines)]
        self._colors = given + tuple(range(len(given), len(self._lines)))  # the rest: by position
        self._band = band
        self._secondary = secondary
        self.invalidate()

    @property
    def lines(self) -> tuple[Series | None, ...]:
        """The line series drawn, primary first (what `set_series` was given)."""
        return self._lines

    @property
    def line_colors(self) -> tuple[int, ...]:
        """The colour index of each line (`line_style(index)` is its style)."""
        return self._colors

    def set_markers(self, steps: Iterable[float]) -> None:
        """Vertical lines at these steps (e.g. gate opened, crystallization); the same steps again
        cost nothing."""
        markers = tuple(float(s) for s in steps)
        if markers != self._markers:
            self._markers = markers
            self.invalidate()

    def set_right_transform(self, transform: Transform | None) -> None:
        """Label a right axis with transform(left tick), e.g. `entropy_axis(vocab_size)`; an equal
        transform again costs nothing."""
        if transform != self._right_transform:
            self._right_transform = transform
            self.invalidate()

    @property
    def drawn_range(self) -> Range | None:
        """The left axis' value range at the last build; None while there is nothing to draw."""
        return self._drawn[0]

    @property
    def drawn_right_range(self) -> Range | None:
        """The secondary series' own value range at the last build; None without one."""
        return self._drawn[1]

    def line_style(self, index: int) -> Style:
        """The style of line `index` (0 = primary), e.g. to colour a legend or bars to match."""
        return self.component_style(f"chart--line-{index % LINE_COLOURS}")

    def invalidate(self) -> None:
        """Rebuild the strips at the next paint."""
        self._dirty = True
        self.refresh()

    def strips(self) -> list[Strip]:
        """One Strip per line of the content area, rebuilt only when something changed."""
        size = (self.size.width, self.size.height)
        if self._dirty or size != self._built_size:
            self._strips = self._build(*size)
            self._built_size = size
            self._dirty = False
            self.build_count += 1
        return self._strips

    def render_line(self, y: int) -> Strip:
        strips = self.strips()
        return strips[y] if 0 <= y < len(strips) else Strip.blank(self.size.width, self.rich_style)

    # -- change tracking -----------------------------------------------------------------------

    def validate_mode(self, mode: str) -> str:
        if mode not in CELL_DOTS:
            raise ValueError(f"chart mode must be one of {sorted(CELL_DOTS)}, not {mode!r}")
        return mode

    def watch_mode(self) -> None:
        self.invalidate()

    def watch_y_range(self) -> None:
        self.invalidate()

    def watch_secondary_y_range(self) -> None:
        self.invalidate()

    def watch_x_range(self) -> None:
        self.invalidate()

    def watch_left_scale(self) -> None:
        self.invalidate()

    def watch_right_scale(self) -> None:
        self.invalidate()

    def watch_empty_text(self) -> None:
        self.invalidate()

    def notify_style_update(self) -> None:
        # Called when styles are reapplied: a theme change, a CSS reload, a class change.
        super().notify_style_update()
        self._dirty = True

    # -- building strips -----------------------------------------------------------------------

    def _layers(self) -> tuple[list[Layer], list[str]]:
        """Layers in paint order with their component class: later ones win a shared cell."""
        layers: list[tuple[Layer, str]] = []
        if self._band is not None:
            layers.append((BandLayer(*self._band), "chart--band"))
        if self._markers:
            layers.append((MarkerLayer(self._markers), "chart--marker"))
        if self._secondary is not None:
            layers.append((LineLayer(self._secondary, axis=1), "chart--secondary"))
        for index in reversed(range(len(self._lines))):  # the primary last, so it stays on top
            series = self._lines[index]
            if series is not None:
                layers.append((LineLayer(series), f"chart--line-{self._colors[index] % LINE_COLOURS}"))
        return [layer for layer, _ in layers], [name for _, name in layers]

    def _build(self, width: int, height: int) -> list[Strip]:
        self._drawn = (None, None)
        layers, names = self._layers()
        x_range = self.x_range or x_extent(layers)
        if x_range is None:
            return self._message_strips(width, height)
        plot_h = height - 1  # the last row holds the step labels
        cols_per_cell = CELL_DOTS[self.mode][1]
        # The data is reduced at the plot width the axis labels left at the last build; only
        # if the labels now need another width is it reduced again (the y extents do not
        # depend on the width, so the labels stay as they are).
        gutters = self._gutters
        if plot_h < 1 or width - sum(gutters) < 2:
            return [Strip.blank(width, self.rich_style)] * height
        envs = envelopes(layers, x_range, (width - sum(gutters)) * cols_per_cell)
        left, right = extent(envs, 0), extent(envs, 1)
        if left is None and right is None:
            return self._message_strips(width, height)
        left_range = self.y_range or self._fit_left(left, right)
        right_range = (self.secondary_y_range or self.right_scale.fit(right)) if right is not None else None
        self._drawn = (left_range, right_range)
        axes = self._axes(left_range, right_range, plot_h)
        if axes.gutters != gutters:
            self._gutters = gutters = axes.gutters
            if width - sum(gutters) < 2:
                return [Strip.blank(width, self.rich_style)] * height
            envs = envelopes(layers, x_range, (width - sum(gutters)) * cols_per_cell)
        raster = draw(envs, plot_h, left_range, self.mode, right_range)
        return self._chart_strips(width, raster, names, axes, x_range)

    def _fit_left(self, left: Range | None, right: Range | None) -> Range:
        """The left window for the data: the left scale's fit, widened further when a right
        transform's labels would span less than the right scale's minimum (entropy in nats)."""
        if left is None:  # only the secondary series has data: the left axis follows it
            return self.right_scale.fit(right)  # type: ignore[arg-type]
        window = self.left_scale.fit(left)
        wanted = self.right_scale.min_span
        if self._right_transform is None or right is not None or wanted <= 0:
            return window
        lo, hi = window
        labels_span = abs(self._right_transform(hi) - self._right_transform(lo))
        if not 0 < labels_span < wanted:
            return window
        # transforms are affine here (entropy is): the label span grows with the window's
        return self.left_scale.fit(left, (hi - lo) * wanted / labels_span)

    def _axes(self, left_range: Range, right_range: Range | None, plot_h: int) -> _Axes:
        """Tick labels by row for both axes, and the gutter widths they need (axis line included)."""
        left_ticks, left_step = self._y_ticks(left_range, plot_h)
        left = {row: format_tick(v, left_step, digits=LABEL_DIGITS) for row, v in left_ticks}
        right, right_is_series = self._right_labels(left_ticks, right_range, plot_h)
        left_w = max(map(len, left.values()), default=0) + 1
        right_w = max(map(len, right.values()), default=0) + 1 if right else 0
        return _Axes(left, right, right_is_series, (left_w, right_w))

    def _chart_strips(
        self, width: int, raster: Raster, names: list[str], axes: _Axes, x_range: Range
    ) -> list[Strip]:
        left_w, right_w = axes.gutters
        base = self.rich_style  # computed on each access: fetch once
        axis = self.component_style("chart--axis")
        right_style = self.component_style("chart--secondary") if axes.right_is_series else axis
        layer_styles = [self.component_style(name) for name in names]
        strips = []
        for row, text in enumerate(raster.lines()):
            label = axes.left.get(row)
            segments = [Segment(f"{label or '':>{left_w - 1}}{'┤' if label else '│'}", axis)]
            segments += _row_segments(text, raster.owner[row], layer_styles, base)
            if right_w:
                label = axes.right.get(row)
                segments += [
                    Segment("├" if label else "│", axis),
                    Segment(f"{label or '':<{right_w - 1}}", right_style),
                ]
            strips.append(Strip(segments, width))
        plot_w = raster.width
        x_row = [Segment(" " * (left_w - 1) + "└", axis), Segment(self._x_labels(x_range, plot_w), axis)]
        if right_w:
            x_row.append(Segment("┘" + " " * (right_w - 1), axis))
        strips.append(Strip(x_row, width))
        return strips

    def _y_ticks(self, y_range: Range, plot_h: int) -> tuple[list[tuple[int, float]], float]:
        """(cell row, value) of round ticks, at most one a row, and their step."""
        values, step = nice_ticks(widen(y_range), max(2, plot_h // 3))
        ticks: dict[int, float] = {}
        for value in values:
            row = cell_row(value, y_range, plot_h, self.mode)
            if row >= 0:
                ticks.setdefault(row, value)
        return sorted(ticks.items()), step

    def _right_labels(
        self, left_ticks: list[tuple[int, float]], right_range: Range | None, plot_h: int
    ) -> tuple[dict[int, str], bool]:
        """Right-axis labels by row, and whether they belong to the secondary series' own scale."""
        if right_range is not None:
            ticks, step = self._y_ticks(right_range, plot_h)
            return {row: format_tick(v, step, digits=LABEL_DIGITS) for row, v in ticks}, True
        if self._right_transform is None or not left_ticks:
            return {}, False
        values = [self._right_transform(v) for _, v in left_ticks]
        # one digit more than the spacing of the transformed ticks needs: 4.16 rather than 4.2
        spacing = abs(values[1] - values[0]) if len(values) > 1 else abs(values[0])
        step = spacing / 10 if spacing > 0 else 0.01
        rows = [row for row, _ in left_ticks]
        return {
            row: format_tick(v, step, digits=LABEL_DIGITS) for row, v in zip(rows, values, strict=True)
        }, False

    def _x_labels(self, x_range: Range, plot_w: int) -> str:
        """The step-axis row: compact labels (1.2k, 3.4M) centred under their columns, never overlapping."""
        values, step = nice_ticks(widen(x_range, 1.0), max(2, plot_w // 12), integer=True)
        line = [" "] * plot_w
        free_from = 0
        for value in values:
            col = cell_col(value, x_range, plot_w, self.mode)
            label = format_tick(value, step, trim=True)
            start = max(0, min(col - len(label) // 2, plot_w - len(label)))
            if col < 0 or start < free_from or start + len(label) > plot_w:
                continue
            line[start : start + len(label)] = label
            free_from = start + len(label) + 1
        return "".join(line)

    def _message_strips(self, width: int, height: int) -> list[Strip]:
        base = self.rich_style
        text = (
            self.empty_text if cell_len(self.empty_text) <= width else set_cell_size(self.empty_text, width)
        )
        pad = (width - cell_len(text)) // 2
        message = Strip(
            [Segment(" " * pad, base), Segment(text, self.component_style("chart--empty"))]
        ).extend_cell_length(width, base)
        strips = [Strip.blank(width, base)] * height
        strips[(height - 1) // 2] = message
        return strips

    def component_style(self, name: str) -> Style:
        """A component's style (e.g. "chart--band"), its colour replaced by the theme variable of
        the same name with one dash (e.g. `chart-band`) when the theme defines one."""
        style = self.get_component_rich_style(name)
        value = self.app.theme_variables.get(name.replace("--", "-"))
        if not value:
            return style
        try:
            colour = Color.parse(value)
        except ColorParseError:
            return style
        if colour.a < 1 and style.bgcolor is not None:
            colour = Color.from_rich_color(style.bgcolor) + colour
        return style + Style(color=colour.rich_color)


def _row_segments(text: str, owner: list[int], styles: list[Style], base: Style) -> list[Segment]:
    """One Segment per run of cells coloured by the same layer."""
    changes = [col for col in range(1, len(owner)) if owner[col] != owner[col - 1]]
    bounds = [0, *changes, len(text)]
    return [
        Segment(text[a:b], styles[owner[a]] if owner[a] >= 0 else base)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
