"""LogLines: a log file of any size on Textual's Line API, as Toolong draws one.

The widget is given a document (a LineIndex, its own LogFile descriptor, how many lines and bytes it holds:
engine/console/logfile.py) and draws only the lines on screen: each is read with one pread at its offset
when first drawn, made text (every byte visible, a long line cut with its length said) and kept in an LRU
cache of strips. At the bottom it follows (`following`): lines that come are scrolled into view, as `tail -f`;
scrolled up, it stays where it is. Line numbers are in a gutter when the document knows them. `mark` is a line
shown highlighted (a search match, a traceback jumped to), and `highlight` a text shown wherever it is on
screen. The widget reads no file on its own and knows nothing of runs or the store.

Keys (its own): `↑` `↓` / `k` `j`, `pgup` `pgdn`, `home` `end` / `g` `G`, `←` `→` / `h` `l` (long lines).
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from engine.console.logfile import LineIndex, LogFile, LogFileError, read_line

CACHE_LINES = 2000  # strips kept: a few screens at 160×50, read again when scrolled back to
SIDEWAYS = 8  # columns `←` `→` move
MARK_AT = 4  # a line jumped to is shown this far down the screen (a traceback's frames follow it)


class LogLines(ScrollView, can_focus=True, inherit_bindings=False):
    BINDINGS: ClassVar = [
        Binding("up,k", "move(-1)", "Up", show=False, id="log-lines.up"),
        Binding("down,j", "move(1)", "Down", show=False, id="log-lines.down"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="log-lines.page-up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="log-lines.page-down"),
        Binding("home,g", "top", "Top", show=False, id="log-lines.top"),
        Binding("end,G", "bottom", "Follow", key_display="G", id="log-lines.bottom"),
        Binding("left,h", "sideways(-1)", "Left", show=False, id="log-lines.left"),
        Binding("right,l", "sideways(1)", "Right", show=False, id="log-lines.right"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "log-lines--number",
        "log-lines--mark",
        "log-lines--match",
        "log-lines--cut",
    }

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.index: LineIndex | None = None
        self.file: LogFile | None = None
        self.count = 0
        self.end = 0
        self.whole = True  # False: the end of the file only (line numbers unknown)
        self.following = True
        self.wants_top = False  # `g` before the whole file was indexed: the top once it is
        self.mark: int | None = None
        self.highlight = ""
        self.error: str | None = None  # the file could not be read at some line
        self.widest = 0  # cells of the widest line drawn so far: how far `→` goes
        self._document = 0  # moved with each document: cached strips of another are not used
        self._strips: LRUCache[tuple[int, int], Strip] = LRUCache(CACHE_LINES)
        self._styles: dict[str, Style] = {}

    # -- feeding ---------------------------------------------------------------------------------------------

    def show(self, index: LineIndex, file: LogFile, count: int, end: int, *, whole: bool) -> None:
        """A new document: the file opened, its whole index after its end, or the file read anew. The view
        keeps its place: at the bottom when following, on the same line when the end became the whole."""
        top = int(self.scroll_offset.y)
        before, was_whole = self.index, self.whole
        self.close()
        self.index, self.file, self.count, self.end, self.whole = index, file, count, end, whole
        self._document += 1
        self._strips.clear()
        self.mark, self.widest = None, 0
        self._resize()
        if self.following:
            self.scroll_end_now()
        elif whole and self.wants_top:
            self.wants_top = False
            self.scroll_to(y=0, animate=False, immediate=True, force=True)
        elif whole and not was_whole and before is not None and before.start >= index.start:
            self.scroll_to(y=index.line_of(before.start) + top, animate=False, immediate=True, force=True)
        else:
            self.scroll_to(y=0, animate=False, immediate=True, force=True)
        self.refresh()

    def grow(self, count: int, end: int) -> None:
        """The file grew: `count` lines, `end` bytes. The line that was last may have grown too."""
        if self.index is None:
            return
        last = self.count - 1
        self.count, self.end = count, end
        self._strips.discard((self._document, last))
        self._resize()
        if self.following:
            self.scroll_end_now()
        top = self.top_line
        if last < top + self.rows and count > top:  # what changed is on screen (cached lines cost nothing)
            self.refresh()

    def close(self) -> None:
        """Close the document's descriptor (each document has its own)."""
        if self.file is not None:
            self.file.close()
            self.file = None

    def on_unmount(self) -> None:
        self.close()

    def set_highlight(self, text: str) -> None:
        if text != self.highlight:
            self.highlight = text
            self._strips.clear()
            self.refresh()

    # -- where it is -----------------------------------------------------------------------------------------

    @property
    def top_line(self) -> int:
        return int(self.scroll_offset.y)

    @property
    def rows(self) -> int:
        """Lines on screen (a horizontal scrollbar takes one)."""
        return max(1, self.scrollable_content_region.height)

    def here(self, *, forward: bool) -> int:
        """The line a search or a jump starts from (exclusive): the marked one while it is on screen; else,
        so that every line on screen is looked at, the one above the screen (forward) or below it."""
        top, height = self.top_line, self.rows
        if self.mark is not None and top <= self.mark < top + height:
            return self.mark
        return top - 1 if forward else min(self.count, top + height)

    def go_to(self, line: int) -> None:
        """Mark `line` and show it MARK_AT lines down the screen; following stops."""
        self.following = False
        previous, self.mark = self.mark, line
        for old in (previous, line):
            if old is not None:
                self._strips.discard((self._document, old))
        self.scroll_to(
            y=max(0, line - min(MARK_AT, self.rows // 4)), animate=False, immediate=True, force=True
        )
        self.refresh()

    def scroll_end_now(self) -> None:
        self.following = True
        self.scroll_to(y=self.max_scroll_y, animate=False, immediate=True, force=True)

    def _resize(self) -> None:
        self.virtual_size = Size(self._gutter() + self.widest, self.count)

    def _gutter(self) -> int:
        if self.index is None or self.index.first_number is None:
            return 0
        return len(f"{self.index.first_number + self.count:,}") + 1

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.following = new_value >= self.max_scroll_y  # at the bottom: what comes is shown

    def on_resize(self) -> None:
        self._resize()
        if self.following:
            self.scroll_end_now()

    # -- drawing ---------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        """The gutter, then the cached text from the view's column, padded: one Strip made a line (a Strip is
        not cheap to make, and a page of new lines makes fifty)."""
        width = self.size.width
        styles = self._line_styles()
        i = int(self.scroll_offset.y) + y
        if self.index is None or i >= self.count:
            return Strip.blank(width, styles["base"])
        marked = i == self.mark
        base = styles["mark"] if marked else styles["base"]
        content = self._content(i)
        gutter = self._gutter()
        room = max(0, width - gutter)
        x = int(self.scroll_offset.x)
        cells = min(room, max(0, content.cell_length - x))
        shown = list(content) if x == 0 and content.cell_length <= room else list(content.crop(x, x + room))
        if marked:
            shown = list(Segment.apply_style(shown, styles["mark"]))
        segments = [Segment(f"{self.index.number(i):>{gutter - 1},} ", styles["number"])] if gutter else []
        segments += shown
        if cells < room:
            segments.append(Segment(" " * (room - cells), base))
        return Strip(segments, gutter + room)

    def _content(self, i: int) -> Strip:
        """Line i's text (from its first column), made once and cached."""
        key = (self._document, i)
        strip = self._strips.get(key)
        if strip is not None:
            return strip
        styles = self._line_styles()
        assert self.index is not None and self.file is not None
        try:
            text, note = read_line(self.file, self.index, i, self.end)
        except LogFileError as exc:
            self.error = str(exc)
            text, note = "", f"(unreadable: {exc})"
        segments = self._highlighted(text, styles["base"], styles["match"])
        if note:
            segments.append(Segment(note, styles["cut"]))
        strip = Strip(segments)
        cells = strip.cell_length
        if cells > self.widest:
            self.widest = cells
            self.call_later(self._resize)
        self._strips[key] = strip
        return strip

    def _highlighted(self, text: str, base: Style, match: Style) -> list[Segment]:
        """The text with every place of `highlight` in the match style (smart case, as the search)."""
        needle = self.highlight
        if not needle:
            return [Segment(text, base)]
        fold = not any(c.isupper() for c in needle)
        hay = text.lower() if fold else text
        needle = needle.lower() if fold else needle
        out, pos = [], 0
        while (at := hay.find(needle, pos)) >= 0:
            if at > pos:
                out.append(Segment(text[pos:at], base))
            out.append(Segment(text[at : at + len(needle)], match))
            pos = at + len(needle)
        if pos < len(text):
            out.append(Segment(text[pos:], base))
        return out

    def _line_styles(self) -> dict[str, Style]:
        if not self._styles:
            base = self.rich_style
            self._styles = {
                "base": base,
                **{
                    part: base + self.get_component_rich_style(f"log-lines--{part}")
                    for part in ("number", "mark", "match", "cut")
                },
            }
        return self._styles

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = {}  # a theme change: every line is drawn again
        self._strips.clear()

    # -- keys ------------------------------------------------------------------------------------------------

    def action_move(self, delta: int) -> None:
        self.scroll_to(y=self.scroll_offset.y + delta, animate=False, immediate=True, force=True)

    def action_page(self, direction: int) -> None:
        step = max(1, self.rows - 1)
        self.scroll_to(y=self.scroll_offset.y + direction * step, animate=False, immediate=True, force=True)

    def action_top(self) -> None:
        self.following = False
        self.wants_top = not self.whole
        self.scroll_to(y=0, animate=False, immediate=True, force=True)

    def action_bottom(self) -> None:
        self.wants_top = False
        self.scroll_end_now()

    def action_sideways(self, direction: int) -> None:
        self.scroll_to(
            x=max(0, self.scroll_offset.x + direction * SIDEWAYS), animate=False, immediate=True, force=True
        )
