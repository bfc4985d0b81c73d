"""Text from outside, made safe to keep and to show.

Every string that comes from outside (a file, a NATS message, a hook payload, a flag) is data. Two
things can go wrong with it: SQLite (and any UTF-8 file) cannot take a lone UTF-16 surrogate, which
JSON's `\\ud800` escape and Python's `surrogateescape` both produce; and a terminal obeys the control
characters it holds (ESC, CSI, OSC 52, CR, BS). `storable` fixes the first where text enters the
store, `visible` the second where text is printed.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

REPLACEMENT = "\ufffd"
SURROGATES = re.compile("[\ud800-\udfff]")
# A JSON text can only produce a lone surrogate through a \uD800-\uDFFF escape (its own characters were
# decoded from valid UTF-8): text without one needs no walk over the parsed value.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
# C0 controls but tab and newline, DEL, and the C1 controls (\x9b is a one-byte CSI).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NAMED = {"\r": "\\r"}
# Characters a terminal does not show as themselves, written out as a \u escape (four hex digits): Unicode's
# format characters (category Cf: bidi overrides and isolates, which make `rtl\u202egpj.exe` print as
# "rtlexe.jpg"; zero-width spaces and joiners, which glue emoji into one glyph of a width no two terminals
# agree on; the BOM, soft hyphen, invisible operators, tags) and the variation selectors (U+FE0F makes a
# narrow symbol wide in some terminals, not in others). Cf's ranges as of Unicode 15 (tests/test_text.py
# checks them against the running Python's unicodedata).
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufe00-\ufe0f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000e0100-\U000e01ef]"
)
# Combining marks past the second on one character (a "zalgo" run stacks dozens on one cell, and terminals
# draw them over the lines above and below): written out too.
_MARKS = "\u0300-\u036f\u0483-\u0489\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
_MARK_RUN = re.compile(f"(?<=[{_MARKS}][{_MARKS}])[{_MARKS}]+")


def encodable(s: str) -> bool:
    """Whether UTF-8 (and so SQLite, a file, a NATS message) can take `s` as it is."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(s: str) -> str:
    """`s` with each code point UTF-8 cannot encode (a lone surrogate) replaced by U+FFFD."""
    return s if encodable(s) else SURROGATES.sub(REPLACEMENT, s)


def storable_value(value: Any) -> Any:
    """A parsed JSON value with every string and key made `storable`. Dicts and lists are changed in
    place (a loop, not recursion: the value may be nested as deep as the parser allowed)."""
    if isinstance(value, str):
        return storable(value)
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in list(node):
                item = node[key]
                if isinstance(item, str):
                    node[key] = storable(item)
                elif isinstance(item, dict | list):
                    stack.append(item)
                if not encodable(key):
                    node[storable(key)] = node.pop(key)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = storable(item)
                elif isinstance(item, dict | list):
                    stack.append(item)
    return value


def loads_storable(raw: str | bytes) -> Any:
    """`json.loads(raw)` with the strings of the result made storable; raises what json.loads raises
    (ValueError, RecursionError). Costs one substring search on a line without a surrogate escape."""
    value = json.loads(raw)
    return storable_value(value) if may_hold_surrogates(raw) else value


def may_hold_surrogates(raw: str | bytes) -> bool:
    """Whether `json.loads(raw)` may give a lone surrogate: a `\\ud800` escape, or (bytes) bytes that are not
    UTF-8, which json.loads decodes with `surrogatepass`, so a surrogate encoded as bytes comes through as
    one."""
    if isinstance(raw, bytes):
        try:
            probe = raw.decode("utf-8")
        except UnicodeDecodeError:
            return True
    else:
        probe = raw
    return "\\u" in probe and SURROGATE_ESCAPE.search(probe) is not None


def visible(s: str | None) -> str:
    """`s` with control characters other than newline and tab written out (`\\x1b`, `\\x9b`, `\\r`),
    so printing it never moves the cursor, clears the screen or sets the clipboard; format characters and
    variation selectors (`\\u202e`, `\\u200d`, `\\ufe0f`) and combining marks past two on a character
    written out too, so what is printed takes the cells it is measured to take; storable too (a lone
    surrogate cannot be printed either). None (a stored NULL) shows as nothing."""
    if not s:
        return ""
    s = _CONTROLS.sub(_escape, storable(s))
    if s.isascii():
        return s
    s = _INVISIBLE.sub(_escape_wide, s)
    return _MARK_RUN.sub(_escape_run, s)


def visible_line(s: str | None) -> str:
    """`visible(s)` on one line: newline and tab written out too (`\\n`, `\\t`), for a name or a key
    shown in a column, a title or a label, where two keys that differ only there must still differ."""
    return visible(s).replace("\n", "\\n").replace("\t", "\\t")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def _escape_wide(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escape_run(match: re.Match[str]) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in match.group())


class VisibleStream:
    """A text stream whose every write goes through `visible`: what a command prints can hold stored
    names, keys, prompts and paths, and none of them may drive the terminal. The rest (fileno, isatty,
    flush, encoding) is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, s: str) -> int:
        self.stream.write(visible(s))
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def visible_streams(*names: str) -> Iterator[None]:
    """`sys.stdout` and/or `sys.stderr` (by name) through `VisibleStream` while the block runs.
    A command's stdout is wrapped whole; its stderr is not (the progress bars of the libraries it
    loads redraw with CR there), so carl's own lines on stderr are made visible where they are
    printed (`engine.errors.fail`)."""
    before = {name: getattr(sys, name) for name in names}
    for name, stream in before.items():
        setattr(sys, name, VisibleStream(stream))
    try:
        yield
    finally:
        for name, stream in before.items():
            setattr(sys, name, stream)


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), cut to `limit`
    characters with an ellipsis. (Kept as text: what prints it makes it `visible`.)"""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"
