"""RolloutList: a list of any length of rollout rows on Textual's Line API, as Toolong draws a log.

The list knows how many rows it has (or how many it has seen, until told) and keeps only the pages of rows
near what is shown; it draws only the visible lines, each through an LRU cache of rendered strips, and asks
for the pages it lacks with a `Wanted` message: whoever feeds it reads them (off the UI thread) and hands them
back with `set_page`. A row not read yet is drawn as `loading…`. The widget knows nothing of the store or the
app.

Keys (their own, not ScrollView's): `↑`/`↓` (`k`/`j`) move the cursor (`cursor`), `pgup`/`pgdn` a screen,
`enter` opens the row (`Selected`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from engine.text import visible, visible_line

if TYPE_CHECKING:
    from engine.store.rollout_reads import RolloutRow

MAX_PAGES = 100  # pages kept; past them those farthest from the screen are forgotten (read again if needed)
MARGIN = 1  # pages read ahead of the screen, above and below, so a screen's move is drawn at once
LOADING = "loading…"
_PARTS = ("loading", "number", "positive", "negative")
SIGNS = {True: "positive", False: "negative", None: "number"}  # the advantage's style by its sign
_FLAT = str.maketrans({"\n": " ", "\t": " "})


def head(text: str | None, width: int) -> str:
    """The start of a stored text on one line, control characters made visible."""
    return visible((text or "")[: width * 2]).translate(_FLAT)


def number(value: float | None, width: int, spec: str = "+z.3f") -> str:  # z: no "-0.000"
    text = "—" if value is None else format(value, spec)
    return text.rjust(width)[-width:] if len(text) <= width else format(value, ".2g").rjust(width)


def header(show_step: bool) -> str:
    """The column titles over the rows."""
    return (" step " if show_step else "") + "  idx  grp   reward      adv    len  prompt ▸ completion"


class RolloutList(ScrollView, can_focus=True, inherit_bindings=False):
    BINDINGS: ClassVar = [
        Binding("up,k", "move(-1)", "Up", show=False, id="rollout-list.up"),
        Binding("down,j", "move(1)", "Down", show=False, id="rollout-list.down"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="rollout-list.page-up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="rollout-list.page-down"),
        Binding("enter", "open", "Open sample", id="rollout-list.open"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "rollout-list--cursor",
        "rollout-list--loading",
        "rollout-list--positive",
        "rollout-list--negative",
        "rollout-list--number",
    }

    cursor: reactive[int] = reactive(0, repaint=False, init=False)
    """The highlighted row's position. A reactive, so that whoever shows where the cursor is (the viewer's
    status line) can `watch` it and draw it in the same refresh as the list."""

    class Wanted(Message):
        """Pages of rows to read: rows [page * page_size, (page + 1) * page_size)."""

        def __init__(self, pages: list[int]) -> None:
            super().__init__()
            self.pages = pages

    class Selected(Message):
        def __init__(self, position: int, row: RolloutRow) -> None:
            super().__init__()
            self.position = position
            self.row = row

    def __init__(self, page_size: int = 100, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.page_size = page_size
        self.total: int | None = None  # None: not counted yet
        self.pages: dict[int, list[RolloutRow]] = {}
        self.pending: set[int] = set()  # asked for, not arrived
        self.show_step = True  # the step column (a list of every step's samples)
        self._strips: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._style_generation = 0
        self._styles: dict[tuple[int, bool], dict[str, Style]] = {}

    # -- feeding ---------------------------------------------------------------------------------------------

    def reset(self, *, show_step: bool, cursor: int = 0) -> None:
        """A new list (another step, order or filter): nothing known, the cursor at `cursor`."""
        self.pages.clear()
        self.pending.clear()
        self._strips.clear()
        self.total = None
        self.show_step = show_step
        self.cursor = cursor
        self._resize()
        self.scroll_to(y=max(0, cursor - self.size.height // 2), animate=False, immediate=True)
        self.refresh()
        self.request_rows()

    def set_total(self, total: int) -> None:
        self.total = total
        self.pending.clear()  # a page asked for before the size was known may have gone unanswered
        if self.cursor >= total:
            self.cursor = max(0, total - 1)
        self._resize()
        self.refresh()
        self.request_rows()

    def set_page(self, number: int, rows: list[RolloutRow]) -> None:
        self.pending.discard(number)
        self.pages[number] = rows
        if self.total is None and len(rows) < self.page_size and (number == 0 or number - 1 in self.pages):
            self.total = number * self.page_size + len(rows)  # the list ends here
        self._forget_far_pages()
        self._resize()
        start = number * self.page_size
        top, height = int(self.scroll_offset.y), self.size.height
        first, last = max(start, top), min(start + self.page_size, top + height)
        if first < last:  # only the lines of this page that are on screen
            self.refresh_lines(first, last - first)
        self.request_rows()

    def row(self, position: int) -> RolloutRow | None:
        page = self.pages.get(position // self.page_size)
        offset = position % self.page_size
        return page[offset] if page is not None and offset < len(page) else None

    @property
    def known_rows(self) -> int:
        """The list's length as far as known: its total, or up to the last page read (and one more page)."""
        if self.total is not None:
            return self.total
        if not self.pages:
            return 0
        last = max(self.pages)
        return last * self.page_size + len(self.pages[last]) + (self.page_size if self.pages[last] else 0)

    def request_rows(self) -> None:
        """Ask for the pages around the screen that are neither here nor asked for."""
        height = max(1, self.size.height)
        top = int(self.scroll_offset.y)
        first = max(0, top // self.page_size - MARGIN)
        last = (top + height) // self.page_size + MARGIN
        rows = self.known_rows if self.total is not None else max(self.known_rows, self.page_size)
        last = min(last, max(0, (rows - 1) // self.page_size))
        if self.total == 0:
            return
        missing = [n for n in range(first, last + 1) if n not in self.pages and n not in self.pending]
        if missing:
            self.pending.update(missing)
            self.post_message(self.Wanted(missing))

    def _forget_far_pages(self) -> None:
        if len(self.pages) <= MAX_PAGES:
            return
        here = (int(self.scroll_offset.y) + self.size.height // 2) // self.page_size  # the screen's middle
        for number in sorted(self.pages, key=lambda n: abs(n - here))[MAX_PAGES:]:
            del self.pages[number]

    def _resize(self) -> None:
        self.virtual_size = Size(self.size.width, self.known_rows)

    # -- drawing ---------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        position = int(self.scroll_offset.y) + y
        width = self.size.width
        if position >= self.known_rows:
            return Strip.blank(width, self.rich_style)
        row = self.row(position)
        selected = position == self.cursor
        key = (position, row.id if row else None, width, selected, self.show_step, self._style_generation)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_row(row, width, selected)
            self._strips[key] = strip
        return strip

    def _render_row(self, row: RolloutRow | None, width: int, selected: bool) -> Strip:
        """One line as segments (no Text layout: a screen of them is drawn at every scroll)."""
        styles = self._line_styles(selected)
        base = styles["base"]
        if row is None:
            return Strip([Segment(f"  {LOADING}", styles["loading"])]).adjust_cell_length(width, base)
        numbers = styles["number"]
        sign = None if row.advantage is None or row.advantage == 0 else row.advantage > 0
        group = visible_line(row.group_id)[-4:]
        step = f"{row.step:>6} " if self.show_step else ""
        left = f"{step}{row.idx:>5} {group:>4} {number(row.total, 8)}"
        length = ("—" if row.length is None else f"{row.length:,}").rjust(6)
        used = cell_len(left) + 17
        room = max(8, width - used)
        prompt_width = max(8, room * 2 // 5)
        segments = [
            Segment(left, numbers),
            Segment(" " + number(row.advantage, 8), styles[SIGNS[sign]]),
            Segment(f" {length}  ", numbers),
            Segment(set_cell_size(head(row.prompt, prompt_width), prompt_width), base),
            Segment(" ▸ ", numbers),
            Segment(head(row.completion, room), base),
        ]
        # Parts in the same style are joined: fewer style changes, fewer bytes to the terminal at each scroll.
        return Strip(segments).adjust_cell_length(width, base).simplify()

    def _line_styles(self, selected: bool) -> dict[str, Style]:
        """The styles of a line's parts, over the cursor's when `selected`; made once per theme."""
        key = (self._style_generation, selected)
        styles = self._styles.get(key)
        if styles is None:
            base = self.rich_style
            if selected:
                base += self.get_component_rich_style("rollout-list--cursor")
            parts = {name: base + self.get_component_rich_style(f"rollout-list--{name}") for name in _PARTS}
            styles = self._styles[key] = {"base": base, **parts}
        return styles

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style_generation += 1  # a theme change: every line is drawn again
        self._styles.clear()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.request_rows()

    def on_resize(self) -> None:
        self._resize()
        self.request_rows()

    # -- keys ------------------------------------------------------------------------------------------------

    def move_to(self, position: int) -> None:
        """Put the cursor on `position` (clamped to the list) and scroll it into view."""
        rows = self.known_rows
        position = max(0, min(position, rows - 1)) if rows else 0
        if position == self.cursor and rows:
            return
        previous = self.cursor
        self.cursor = position
        height = max(1, self.size.height)
        top = old_top = int(self.scroll_offset.y)
        if position < top:
            top = position
        elif position >= top + height:
            top = position - height + 1
        if top != old_top:
            self.scroll_to(y=top, animate=False, immediate=True)  # the whole screen is drawn again
        else:  # the two lines the cursor left and reached
            self.refresh_line(previous)
            self.refresh_line(position)
        self.request_rows()

    def action_move(self, delta: int) -> None:
        self.move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self.move_to(self.cursor + direction * max(1, self.size.height - 1))

    def action_open(self) -> None:
        row = self.row(self.cursor)
        if row is not None:
            self.post_message(self.Selected(self.cursor, row))
