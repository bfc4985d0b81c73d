"""Integers from outside, bounded where they enter.

SQLite stores 64-bit integers; a larger Python int raises OverflowError at insert, far from the file or
flag it came from. Every integer read from a file, a flag or a config passes one of these at the edge:
`bounded_int` says what is wrong in one line naming the field, `int_within` quietly gives None (a
reader that skips a bad row and counts it).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from engine.errors import CarlError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what an SQLite INTEGER holds
COUNT_MAX = 2**31 - 1  # steps, sizes, counts: far beyond any real run, well inside every library's ints
PORT_MIN, PORT_MAX = 1, 65535
EXIT_CODE_MIN, EXIT_CODE_MAX = -(2**31), 2**31 - 1  # a process's exit status fits 32 bits


class BoundError(CarlError):
    """An integer that is not one, or is out of range: one line naming the field."""


def integer(value: Any) -> int | None:
    """`value` as an int, or None: bool is not an int, a float counts only when integral (NaN and inf
    never), text never."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def int_within(value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """`value` as an int in [lo, hi] (see `integer`), or None."""
    number = integer(value)
    return number if number is not None and lo <= number <= hi else None


def int_text(text: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """A decimal integer written as text (a file name's step, an MLflow param) in [lo, hi], or None; a run of
    thousands of digits is refused before int() would spend time on it."""
    text = text.strip()
    digits = text[1:] if text[:1] in ("-", "+") else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 19:
        return None
    return int_within(int(text), lo, hi)


def bounded_int(value: Any, field: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """`value` as an int in [lo, hi]; BoundError naming `field` otherwise."""
    number = integer(value)
    if number is None:
        raise BoundError(f"{field}: expected an integer from {lo} to {hi}, not {shown(value)}")
    if not lo <= number <= hi:
        raise BoundError(f"{field}: {shown(value)} is out of range ({lo} to {hi})")
    return number


def shown(value: Any, limit: int = 40) -> str:
    """A value as an error line shows it: short, and never the 10,000 digits of a huge int."""
    if type(value) is int and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def int_flag(lo: int = INT64_MIN, hi: int = COUNT_MAX) -> Callable[[str], int]:
    """An argparse `type` for an integer flag in [lo, hi]: out of range is argparse's one-line usage error."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= number <= hi:
            raise argparse.ArgumentTypeError(f"{number} is out of range ({lo} to {hi})")
        return number

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse
