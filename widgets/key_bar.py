"""The key bar at the foot of every screen: Textual's Footer, made to fit its width.

Below NARROW columns it is compact (no padding around each key: one cell a key less). When its keys still do
not fit, it leaves out the keys furthest down its list, which are the screen's and the app's general keys (the
focused pane's come first), but never the ways to help and out: `? Help`, `q Quit`, `esc Close` and the like.
Every key still works, and the help screen (`?`) lists them all. The command palette's key is left to the help
too: on a narrow screen it took a dozen cells of the bar."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.compose import compose
from textual.events import Resize
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey, FooterLabel, KeyGroup

NARROW = 100  # columns below which the bar is compact
KEEP = frozenset({"help", "quit", "close", "back", "leave", "dismiss", "app.pop_screen"})  # help, and out


class KeyBar(Footer):
    def __init__(self, *, id: str | None = None) -> None:
        # Compact from the start: set after mounting, it would restyle the bar once more on the first frame.
        super().__init__(id=id, show_command_palette=False, compact=self.app.size.width < NARROW)
        self.fitted_to = 0  # the width the keys were chosen for

    def bindings_changed(self, screen: Screen[Any]) -> None:
        """Footer's, but the first keys show even while the app is blurred: a browser's tab (`--serve`) may
        say it is blurred before the screen has published its keys, and Footer would wait for a focus."""
        first = not self._bindings_ready
        super().bindings_changed(screen)
        if first and not screen.app.app_focus and self.is_attached and screen is self.screen:
            self.call_after_refresh(self.recompose)

    def on_resize(self, event: Resize) -> None:
        self.compact = event.size.width < NARROW
        if event.size.width != self.fitted_to and self._bindings_ready:
            self.refresh(recompose=True)  # the keys that fit change with the width

    def compose(self) -> ComposeResult:
        self.fitted_to = width = self.size.width or self.app.size.width
        # Footer's own keys, composed here (a key group holds its keys) to be measured before they are shown.
        yield from fitted(compose(self, super().compose()), width, compact=self.compact)


def fitted(items: list[Widget], width: int, *, compact: bool) -> Iterable[Widget]:
    """The items in their order, less those furthest down the list that do not fit (never a key in KEEP)."""
    kept = list(items)
    while sum(cells(item, compact) for item in kept) > width:
        droppable = [i for i, item in enumerate(kept) if not keeps(item)]
        if not droppable:
            break
        del kept[droppable[-1]]
    return kept


def keeps(item: Widget) -> bool:
    if isinstance(item, FooterKey):
        return item.action.split("(")[0] in KEEP
    return False


def cells(item: Widget, compact: bool) -> int:
    """How wide Textual's Footer draws the item, with the gap after it (its CSS: padding round a key and a
    space before its text, or, compact, a margin after it; a group's keys are one cell apart)."""
    if isinstance(item, FooterKey):
        text = cell_len(item.description)
        if compact:
            return cell_len(item.key_display) + (text + 1 if text else 0) + 1
        return cell_len(item.key_display) + 2 + (text + 1 if text else 0)
    if isinstance(item, KeyGroup):
        keys = [cell_len(key.key_display) for key in item._pending_children if isinstance(key, FooterKey)]
        padded = [width + (0 if compact else 2) for width in keys]
        return sum(padded) + (2 if item.has_class("-compact") else len(keys) + 1)
    if isinstance(item, FooterLabel):
        return cell_len(str(item.content)) + 1  # the stylesheet keeps its margin in a compact bar too
    return 0
