"""The latest reward breakdown: one horizontal bar per reward function, with its value."""

from __future__ import annotations

import math

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from engine.text import visible_line

BAR = "█"
EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float, width: int) -> str:
    """A left-aligned bar of `fraction` (0..1) of `width` cells, in eighth-cell steps."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = BAR * full + (EIGHTHS[part] if part and full < width else "")
    return text.ljust(width)


def fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "  n/a" if value is None else f"{value:>5}"
    return f"{value:+.3f}" if abs(value) < 100 else f"{value:+.3g}"


class RewardBars(Widget):
    """Bars scaled to the largest magnitude shown; negative values draw in the error colour.

    With no values it takes no room (class `-empty`): the chart beside it then spans the pane,
    and its "no data yet" is the pane's one empty state, centred in the whole pane."""

    COMPONENT_CLASSES = {"reward-bars--name", "reward-bars--bar", "reward-bars--negative", "reward-bars--dim"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-empty")
        self._values: list[tuple[str, float | None]] = []
        self._colors: list[str] = []

    def set_values(self, values: list[tuple[str, float | None]], colors: list[str] | None = None) -> None:
        if values == self._values and (colors or []) == self._colors:
            return
        relayout = len(values) != len(self._values)  # only a new row count changes the height
        self._values = values
        self._colors = colors or []
        self.set_class(not values, "-empty")
        self.refresh(layout=relayout)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._values))

    def render(self) -> Text:
        if not self._values:
            return Text("")  # hidden (see -empty): the chart beside says there is no data yet
        width = self.size.width
        names = [visible_line(n) for n, _ in self._values]  # a reward's name is stored text
        name_w = min(max(map(len, names)), max(6, width // 3))
        bar_w = max(1, width - name_w - 9)
        finite = [abs(v) for _, v in self._values if v is not None and math.isfinite(v)]
        scale = max(finite) if finite and max(finite) > 0 else 1.0
        name_style = self.get_component_rich_style("reward-bars--name")
        neg_style = self.get_component_rich_style("reward-bars--negative")
        out = Text(no_wrap=True, overflow="crop")
        for i, (name, (_, value)) in enumerate(zip(names, self._values, strict=True)):
            if i:
                out.append("\n")
            out.append(name[:name_w].ljust(name_w) + " ", name_style)
            shown = value if value is not None and math.isfinite(value) else None
            color = self._colors[i] if i < len(self._colors) else None
            style = (
                neg_style
                if shown is not None and shown < 0
                else (color or self.get_component_rich_style("reward-bars--bar"))
            )
            out.append(bar(abs(shown) / scale if shown is not None else 0.0, bar_w), style)
            out.append(" " + fmt(value).rjust(7))
        return out
