"""Hostile values and mutations, as hypothesis strategies shared by every family.

Three layers, each drawn by hypothesis (so a failing case shrinks to a small one):
- atoms: text that a terminal obeys (ESC, OSC 52, C1 CSI, CR, BS), markup, lone surrogates, path tricks, long
  text; integers past every bound (2**63, 5,000 digits), NaN and inf, nesting thousands of levels deep;
- JSON: a real value (a seed) with nodes replaced, keys poisoned, types changed, nesting added, every string
  tainted; written with or without ASCII escapes (so a lone surrogate is a `\\ud800` escape or invalid UTF-8);
- bytes: flipped, cut, duplicated, spliced from another seed, with hostile bytes inserted.
`Raw` is JSON text written as it is (a number no Python float holds, `[[[[...`), which json.dumps cannot
write.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

# -- atoms ---------------------------------------------------------------------------------------------------

TERMINAL = [
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b]0;pwned\x07",  # set the window title
    "\x1b]52;c;cHduZWQ=\x07",  # OSC 52: set the clipboard
    "\x9b31m",  # C1 CSI
    "\x1b[31mred\x1b[0m",
    "a\rb",
    "a\x08b",
    "\x00",
    "\x7f",
    "\x85",
]
MARKUP = ["[b]bold[/b]", "x[link=http://127.0.0.1/]y", "[/]", "[", "]", "[@click=app.quit]x[/]", "\\[b]"]
UNENCODABLE = ["\ud800", "\udcff", "a\udc80b", "\udfff\ud800"]
OTHER = [
    "",
    " ",
    "\n",
    "\t",
    "\u202eevil",  # right-to-left override
    "\ufeff",
    "\u2028",
    "😀",
    "é",
    "../../../../elsewhere/x",
    "/etc/passwd",
    "..",
    ".",
    "a/b\\c",
    "%s%n{0}",
    "$(touch /tmp/x)",
    "'\"`",
    "NaN",
    "-Infinity",
    "1e400",
    "9" * 40,
    "null",
]
TEXT_ATOMS = TERMINAL + MARKUP + UNENCODABLE + OTHER


@dataclass(frozen=True)
class Raw:
    """JSON text written as is."""

    text: str


NUMBER_ATOMS: list[Any] = [
    0,
    -1,
    1,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    10**30,
    10**300,
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -0.0,
    5e-324,
    0.5,
    3.0,
    True,
    False,
    None,
    Raw("1e400"),  # inf once parsed
    Raw("-1e400"),
    Raw("9" * 5000),  # past Python's 4,300 digits: json.loads refuses it
    Raw("-0"),
    Raw("1E+2"),
]


def deep(depth: int, opener: str = "[") -> Raw:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return Raw('{"a":' * depth + "1" + "}" * depth)
    return Raw(opener * depth + closer * depth)


SHAPE_ATOMS: list[Any] = [
    [],
    {},
    [None],
    {"": None},
    [[[[[]]]]],
    deep(40),
    deep(2_000),
    deep(100_000),
    deep(3_000, "{"),
]


def long_text(draw: st.DrawFn) -> str:
    size = draw(st.sampled_from([300, 5_000, 70_000, 1_100_000]))
    return draw(st.sampled_from(["x", "é", "\x1b", "[", "\ud800"])) * size


@st.composite
def text_strategy(draw: st.DrawFn) -> str:
    """Text built from one to four atoms and some arbitrary characters (surrogates and controls included)."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return long_text(draw)
    if kind == 1:
        return draw(st.text(st.characters(codec=None, exclude_categories=()), max_size=20))
    parts = draw(st.lists(st.sampled_from(TEXT_ATOMS), min_size=1, max_size=4))
    filler = draw(st.text(st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=6))
    return filler.join(parts) if draw(st.booleans()) else "".join(parts) + filler


def storable_text(text: str) -> str:
    """`text` with each lone surrogate made "?" (for the writers that cannot take one: protobuf, Arrow)."""
    return text.encode("utf-8", "replace").decode("utf-8")


@functools.cache
def hostile_text() -> st.SearchStrategy[str]:
    """Hostile text (one strategy, built once: hypothesis spends more on building strategies than on
    drawing)."""
    return text_strategy()


@functools.cache
def hostile_number() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(NUMBER_ATOMS),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
    )


@functools.cache
def hostile_value() -> st.SearchStrategy[Any]:
    """Any JSON value a hostile writer may put where another was expected."""
    return st.one_of(
        hostile_text(),
        hostile_number(),
        st.sampled_from(SHAPE_ATOMS).map(copy.deepcopy),  # a copy: a later mutation must not change the atom
        st.lists(st.one_of(hostile_text(), hostile_number()), max_size=4),
        st.dictionaries(hostile_text(), st.one_of(hostile_text(), hostile_number()), max_size=3),
    )


# -- JSON ----------------------------------------------------------------------------------------------------

RAW_MARK = "\ue000raw{}\ue000"


def dumps(value: Any, *, ascii_only: bool = True) -> bytes:
    """`value` as JSON bytes: NaN and inf as Python writes them, `Raw` as its text, a lone surrogate as a
    `\\ud800` escape (ascii_only) or as the bytes UTF-8 forbids (surrogatepass)."""
    raws: list[str] = []

    def swap(node: Any) -> Any:
        if isinstance(node, Raw):
            raws.append(node.text)
            return RAW_MARK.format(len(raws) - 1)
        if isinstance(node, dict):
            return {swap_key(k): swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    def swap_key(key: Any) -> Any:
        return key if not isinstance(key, Raw) else key.text

    text = json.dumps(swap(value), ensure_ascii=ascii_only)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(RAW_MARK.format(index), ensure_ascii=ascii_only), raw, 1)
    return text.encode("utf-8", "surrogatepass")


def paths_of(value: Any, limit: int = 400) -> list[tuple[Any, Any]]:
    """(container, key or index) of the nodes below `value`, breadth first, at most `limit` of them."""
    found: list[tuple[Any, Any]] = []
    queue = [value]
    while queue and len(found) < limit:
        node = queue.pop(0)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            found.append((node, key))
            if isinstance(child, dict | list):
                queue.append(child)
    return found


JSON_OPS = ("value", "key", "delete", "type", "nest", "insert", "taint")


@st.composite
def mutated_json(draw: st.DrawFn, seed: Any, *, max_ops: int = 3) -> Any:
    """A copy of the JSON value `seed` with one to `max_ops` hostile changes."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(JSON_OPS))
        if op == "taint":
            value = taint_strings(value, draw(st.sampled_from(TEXT_ATOMS)), draw(st.integers(0, 2)))
            continue
        if not isinstance(value, dict | list):
            value = {"value": value}
        paths = paths_of(value)
        if not paths:  # an empty object or list: something goes in
            if isinstance(value, dict):
                value[draw(hostile_text())] = draw(hostile_value())
            else:
                value.append(draw(hostile_value()))
            continue
        node, key = paths[draw(st.integers(0, len(paths) - 1))]
        if op == "value":
            node[key] = draw(hostile_value())
        elif op == "key" and isinstance(node, dict):
            node[draw(hostile_text())] = node.pop(key)
        elif op == "delete":
            del node[key]
        elif op == "type":
            node[key] = retyped(node[key], draw(st.integers(0, 5)))
        elif op == "nest":
            node[key] = wrap(node[key], draw(st.sampled_from([1, 3, 40, 3_000])))
        elif op == "insert" and isinstance(node, dict):
            node[draw(hostile_text())] = draw(hostile_value())
        elif op == "insert" and isinstance(node, list):
            node.insert(key, draw(hostile_value()))
        else:
            node[key] = draw(hostile_value())
    return value


def retyped(value: Any, how: int) -> Any:
    """`value` as another JSON type: text, a number, a list, an object, null or a bool."""
    return [
        json.dumps(value, default=str)[:100],
        len(str(value)),
        [value],
        {"value": value},
        None,
        True,
    ][how]


def wrap(value: Any, depth: int) -> Any:
    if depth > 100:  # as text: json.dumps would recurse as deep
        return Raw("[" * depth + dumps(value).decode("utf-8", "surrogatepass") + "]" * depth)
    for _ in range(depth):
        value = [value]
    return value


def taint_strings(value: Any, atom: str, where: int) -> Any:
    """Every string of `value` (keys too) with `atom` put before (0), after (1) or in the middle (2) of it."""

    def taint(text: str) -> str:
        if where == 0:
            return atom + text
        if where == 1:
            return text + atom
        return text[: len(text) // 2] + atom + text[len(text) // 2 :]

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return taint(node)
        if isinstance(node, dict):
            return {taint(k): walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(value)


@st.composite
def json_bytes(draw: st.DrawFn, seed: Any, *, max_ops: int = 3) -> bytes:
    """A mutated `seed` as JSON bytes, sometimes with its bytes mutated too."""
    value = draw(mutated_json(seed, max_ops=max_ops)) if draw(st.integers(0, 9)) else seed
    data = dumps(value, ascii_only=draw(st.booleans()))
    if draw(st.integers(0, 3)) == 0:
        data = draw(mutated_bytes(data))
    return data


# -- bytes ---------------------------------------------------------------------------------------------------

BYTE_ATOMS = [
    b"\x1b[2J",
    b"\x1b]52;c;cHduZWQ=\x07",
    b"\xc2\x9b",  # C1 CSI, as UTF-8
    b"\x9b",
    b"\r",
    b"\x08",
    b"\x00",
    b"\xff\xfe",
    b"\xed\xa0\x80",  # a surrogate, as UTF-8 never writes one
    b"\\ud800",
    b"\xef\xbb\xbf",
    b"[link=http://127.0.0.1/]",
    b"\n",
    b"\r\n",
    b"9" * 5000,
    b"[" * 5000,
    b"{" * 3000,
    b"NaN",
    b"1e400",
]
BYTE_OPS = ("flip", "set", "cut", "delete", "duplicate", "insert", "splice", "repeat")


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, *, others: tuple[bytes, ...] = (), max_ops: int = 4) -> bytes:
    """`data` with one to `max_ops` byte-level changes; `splice` takes a piece of one of `others`."""
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(BYTE_OPS))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        elif op == "set" and data:
            at = min(at, len(data) - 1)
            data = (
                data[:at] + bytes([draw(st.sampled_from([0, 0x7F, 0x80, 0xFF, 0x1B, 0x0A]))]) + data[at + 1 :]
            )
        elif op == "cut":
            data = data[:at]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 64)) :]
        elif op == "duplicate":
            size = draw(st.integers(1, 256))
            data = data[: at + size] + data[at : at + size] + data[at + size :]
        elif op == "insert":
            data = data[:at] + draw(st.sampled_from(BYTE_ATOMS)) + data[at:]
        elif op == "splice" and others:
            other = draw(st.sampled_from(others))
            start = draw(st.integers(0, len(other)))
            data = data[:at] + other[start : start + draw(st.integers(1, 512))] + data[at:]
        elif op == "repeat":
            data = data + data[at:] * draw(st.integers(1, 3))
    return data


# -- lines ---------------------------------------------------------------------------------------------------


def line_bytes(line: Any) -> bytes:
    """A line of a JSONL file: a JSON value, or (a str) a line that is not JSON, as it is."""
    return line.encode("utf-8", "surrogatepass") if isinstance(line, str) else dumps(line)


def dumps_lines(lines: list[Any]) -> bytes:
    return b"".join(line_bytes(line) + b"\n" for line in lines)


LINE_OPS = ("mutate", "mutate", "mutate", "drop", "duplicate", "swap", "garbage", "bytes")


@st.composite
def mutated_lines(draw: st.DrawFn, lines: list[Any], *, max_ops: int = 3) -> bytes:
    """A JSONL file from the JSON values `lines`: some lines mutated, dropped, doubled, swapped or replaced by
    garbage; line endings LF or CRLF, the last one sometimes missing."""
    out = [line_bytes(line) for line in lines]
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(LINE_OPS))
        index = draw(st.integers(0, max(len(out) - 1, 0)))
        if not out:
            out.append(draw(json_bytes({"step": 1})))
        elif op == "mutate":
            out[index] = dumps(
                draw(mutated_json(lines[index] if index < len(lines) else {})), ascii_only=draw(st.booleans())
            )
        elif op == "drop":
            del out[index]
        elif op == "duplicate":
            out.insert(index, out[index])
        elif op == "swap":
            other = draw(st.integers(0, len(out) - 1))
            out[index], out[other] = out[other], out[index]
        elif op == "garbage":
            out.insert(index, draw(st.sampled_from(BYTE_ATOMS)) + draw(st.binary(max_size=40)))
        else:
            out[index] = draw(mutated_bytes(out[index]))
    newline = draw(st.sampled_from([b"\n", b"\n", b"\r\n"]))
    data = newline.join(out)
    return data if draw(st.integers(0, 4)) == 0 else data + newline
