"""A text of any length (a 1 MB completion, 100,000 coloured tokens) drawn a screen at a time.

One Static holding the whole text made Rich lay out every line of it on open (8 s for a 1 MB completion, 29 s
and 300 MB for 100,000 tokens: issue 30 §10). `LongText` holds the text as pieces (a string and its style:
one piece for a plain text, one per token for a coloured completion), works out where each screen line starts
in one pass over the pieces when its width is known, and draws on Textual's Line API only the lines the
screen shows, each built when asked for (an LRU of rendered strips). It wraps at the width, breaking a word
only when it is longer than a line; a newline starts a line. Its height is its line count, so it scrolls
inside any scrolling container, which asks it for the visible lines only.

The pieces must already be visible (engine.text.visible): a control character would move the cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

Piece = tuple[str, Style | None]
# A screen line: (piece index, start, end) spans of the pieces it shows, in order.
Line = tuple[tuple[int, int, int], ...]
CACHE_LINES = 512  # rendered strips kept (a few screens)


class LongText(Widget, can_focus=False):
    DEFAULT_CSS = """
    LongText {
        height: auto;
    }
    """

    def __init__(self, pieces: Sequence[Piece] = (), *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.pieces: list[Piece] = list(pieces)
        self._lines: list[Line] = []
        self._width = -1
        self._strip = lru_cache(maxsize=CACHE_LINES)(self._render_strip)

    def set_pieces(self, pieces: Sequence[Piece]) -> None:
        self.pieces = list(pieces)
        self._width = -1
        self._strip.cache_clear()
        self.refresh(layout=True)

    @property
    def line_count(self) -> int:
        return len(self._lines)

    @property
    def plain(self) -> str:
        """The whole text, without its styles."""
        return "".join(text for text, _ in self.pieces)

    # -- layout ---------------------------------------------------------------------------------------------

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._layout(width)
        return max(1, len(self._lines))

    def _layout(self, width: int) -> None:
        width = max(1, width)
        if width == self._width:
            return
        self._width = width
        self._strip.cache_clear()
        self._lines = wrap(self.pieces, width)

    # -- drawing --------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        self._layout(width)
        if y >= len(self._lines):
            return Strip.blank(width, self.rich_style)
        return self._strip(y, width)

    def _render_strip(self, y: int, width: int) -> Strip:
        base = self.rich_style
        segments = []
        for index, start, end in self._lines[y]:
            text, style = self.pieces[index]
            segments.append(Segment(text[start:end], base + style if style else base))
        return Strip(segments).adjust_cell_length(width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip.cache_clear()


def wrap(pieces: Sequence[Piece], width: int) -> list[Line]:
    """Where each screen line of `pieces` starts and ends at `width` cells: a newline ends a line; a line full
    breaks after its last space, or inside a word longer than the line. One pass over the text; ASCII runs are
    measured by their length."""
    lines: list[Line] = []
    line: list[tuple[int, int, int]] = []
    used = 0
    space: tuple[int, int, int] | None = None  # (span index in `line`, piece index, offset after the space)

    def end_line() -> None:
        nonlocal line, used, space
        lines.append(tuple(line))
        line, used, space = [], 0, None

    for index, (text, _) in enumerate(pieces):
        start, n = 0, len(text)
        while start < n:
            newline = text.find("\n", start)
            stop = n if newline < 0 else newline
            while start < stop:
                room = width - used
                take, cells = _fit(text, start, stop, room)
                if take == start:  # nothing fits on this line: break it (at its last space when it has one)
                    if space is not None and space[0] < len(line):
                        line, carry = _split_at_space(line, space)
                        lines.append(tuple(line))
                        line, space = carry, None
                        used = sum(_cells(pieces[i][0][a:b]) for i, a, b in line)
                    else:
                        end_line()
                    if used == 0 and room == width:  # a single character wider than the line
                        take, cells = start + 1, 1
                    else:
                        continue
                line.append((index, start, take))
                used += cells
                last_space = text.rfind(" ", start, take)
                if last_space >= 0:
                    space = (len(line) - 1, index, last_space + 1)
                start = take
            if newline >= 0:
                end_line()
                start = newline + 1
    if line or not lines:
        lines.append(tuple(line))
    return lines


def _fit(text: str, start: int, stop: int, room: int) -> tuple[int, int]:
    """How far from `start` (before `stop`) fits in `room` cells, and the cells it takes."""
    if room <= 0:
        return start, 0
    chunk = text[start : min(stop, start + room)]
    if chunk.isascii():
        return start + len(chunk), len(chunk)
    cells = 0
    end = start
    for char in text[start:stop]:
        width = cell_len(char)
        if cells + width > room:
            break
        cells += width
        end += 1
    return end, cells


def _cells(text: str) -> int:
    return len(text) if text.isascii() else cell_len(text)


def _split_at_space(
    line: list[tuple[int, int, int]], space: tuple[int, int, int]
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """A full line cut after its last space: what stays, and what starts the next line."""
    at, index, offset = space
    span_index, start, end = line[at]
    head = [*line[:at], (span_index, start, offset)]
    tail = [(span_index, offset, end)] if offset < end else []
    return head, tail + line[at + 1 :]
