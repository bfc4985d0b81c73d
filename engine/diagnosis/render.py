"""An answer (Markdown, as Claude and the offline analyst write it) printed for where it goes.

On a terminal, Rich's Markdown draws it (bold, code, lists, tables, in colour); into a pipe or a file it
stays the Markdown as written, for a script, a file or an issue to take. Either way the text is stored text
first: its control characters are written out (`visible`) before it is parsed or written, and the parser
takes no HTML and no links (`answer_parser`, which the control room's pane uses too), so a name that holds
`<b>`, `[x](url)` or `[bold]` shows as written. Rich's own markup is never read from it: Markdown makes
`Text`, not markup.

A streamed answer is drawn a block at a time, as each block ends (a blank line outside a code fence), so a
long answer from Claude appears as it comes."""

from __future__ import annotations

import io
import re
from typing import Any, TextIO

from markdown_it import MarkdownIt

from engine.text import visible

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
# A blank line, then a line that starts a block at the margin: not indented, not a list item.
BREAK = re.compile(r"\n[ \t]*\n(?=[ \t]*\n)*(?:[ \t]*\n)*((?![ \t]|[-*+][ \t]|\d{1,9}[.)][ \t])\S)")
PIPE_WIDTH = 100  # columns of the plain text written into a pipe (a terminal's own width on a terminal)


def answer_parser() -> MarkdownIt:
    """Markdown as Claude writes it (GitHub's flavour: tables, strikethrough), with HTML, links, autolinks,
    bare URLs and images left as the text they are."""
    return MarkdownIt("gfm-like", {"html": False}).disable(["linkify", "link", "autolink", "image"])


def _markdown(text: str) -> Any:
    from rich.markdown import Markdown

    md = Markdown(text, hyperlinks=False)
    md.parsed = answer_parser().parse(text)  # Rich's own parser takes HTML (and drops it) and links
    return md


def render(text: str, *, terminal: bool, width: int | None = None) -> str:
    """`text` (Markdown) drawn by Rich: with colours and styles for a terminal, else as plain text (no escape
    sequences, no trailing spaces)."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width or PIPE_WIDTH,
        force_terminal=terminal,
        no_color=None if terminal else True,  # on a terminal, NO_COLOR and TERM as Rich reads them
        color_system="auto" if terminal else None,
        emoji=False,
        markup=False,
        highlight=False,
        legacy_windows=False,
    )
    console.print(_markdown(visible(text)))
    out = buf.getvalue()
    return out if terminal else "\n".join(line.rstrip() for line in out.split("\n"))


class AnswerPrinter:
    """Prints a streamed Markdown answer to `out`: on a terminal rendered (`render`) a finished block at a
    time, else as the Markdown it is, each fragment as it comes (made `visible`)."""

    def __init__(self, out: TextIO, *, terminal: bool, width: int | None = None) -> None:
        self.out, self.terminal, self.width = out, terminal, width
        self.pending = ""
        self.printed = False
        self.last = "\n"  # the last character written as Markdown, to end the answer with a newline

    def feed(self, fragment: str) -> None:
        if not self.terminal:
            if fragment:
                self.out.write(visible(fragment))
                self.out.flush()
                self.last = fragment[-1]
            return
        self.pending += fragment
        end = _finished(self.pending)
        if end:
            self._print(self.pending[:end])
            self.pending = self.pending[end:]

    def close(self) -> None:
        if not self.terminal and self.last != "\n":
            self.out.write("\n")
            self.out.flush()
            self.last = "\n"
        if self.pending.strip():
            self._print(self.pending)
        self.pending = ""

    def _print(self, blocks: str) -> None:
        if not blocks.strip():
            return
        drawn = render(blocks, terminal=self.terminal, width=self.width).strip("\n")
        self.out.write(("\n" if self.printed else "") + drawn + "\n")
        self.out.flush()
        self.printed = True


def _finished(text: str) -> int:
    """Where the finished blocks of `text` end: after its last blank line outside a code fence that a new
    block has begun after, at the margin (not a list's next item, not an item's indented continuation); 0 for
    none."""
    at = 0
    for match in BREAK.finditer(text):
        if len(FENCE.findall(text, 0, match.start())) % 2 == 0:
            at = match.start(1)
    return at
