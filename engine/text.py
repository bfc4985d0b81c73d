"""Text from outside made safe to keep: every string that enters the store passes through here.

A Python `str` can hold what UTF-8 cannot encode: lone surrogates, which a JSON `\\ud800` escape or a
file name that was not valid UTF-8 on disk (`os.fsdecode`) put there. SQLite refuses them at insert,
far from where they came in, so they are replaced at the edge by U+FFFD, the replacement character.
"""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
SURROGATES = re.compile("[\ud800-\udfff]")
# A JSON text can only produce a lone surrogate through a \uD800-\uDFFF escape (its own characters were
# decoded from valid UTF-8): lines without one skip the walk over the parsed value.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def storable(text: str) -> str:
    """`text` with every code point UTF-8 cannot encode (lone surrogates) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATES.sub(REPLACEMENT, text)
    return text


def storable_value(value: Any) -> Any:
    """A parsed JSON value with every string in it, keys included, made storable."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(k) if isinstance(k, str) else k: storable_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_value(v) for v in value]
    return value


def loads_storable(raw: str | bytes) -> Any:
    """`json.loads(raw)` with the strings of the result made storable; raises what json.loads raises
    (ValueError, RecursionError). Costs one substring search on a line without a surrogate escape."""
    value = json.loads(raw)
    probe = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if "\\u" in probe and SURROGATE_ESCAPE.search(probe):
        return storable_value(value)
    return value


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), cut to `limit`
    characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"
