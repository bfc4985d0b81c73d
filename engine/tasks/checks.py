"""Reference checks shared by training tasks and the agents plane: each scores an answer in [0, 1].

- exact: the answer equals the reference, ignoring case, surrounding and repeated whitespace, and
  trailing punctuation;
- contains: the (so normalised) reference appears in the answer;
- json: the answer parses as JSON equal to the reference's;
- number: the last number in the answer equals the reference's within 1e-6 (relative).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

CHECKS = ("exact", "contains", "json", "number")

_TRAILING_PUNCTUATION = ".,;:!?"
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)
_NOT_JSON = object()  # an answer that does not parse equals no reference


def normalise(text: str) -> str:
    """Case folded, whitespace runs made one space, trimmed, trailing punctuation dropped."""
    return " ".join(text.casefold().split()).rstrip(_TRAILING_PUNCTUATION).rstrip()


def last_number(text: str) -> float | None:
    """The last number written in `text` (`1,234.5` is one number), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def expected(check: str, reference: str) -> Any:
    """What `check` compares answers with; raises ValueError naming the field at fault."""
    if check not in CHECKS:
        raise ValueError(f"verifier: must be one of {', '.join(CHECKS)} (got {check!r})")
    if check in ("exact", "contains"):
        return normalise(reference)
    if check == "json":
        try:
            return json.loads(reference)
        except ValueError:
            raise ValueError("reference: is not JSON (the 'json' verifier compares JSON)") from None
    number = last_number(reference)
    if number is None:
        raise ValueError("reference: has no number (the 'number' verifier compares numbers)")
    return number


def check(name: str, answer: str, want: Any) -> float:
    """1.0 when `answer` passes check `name` against `want` (from `expected`), else 0.0."""
    if name == "exact":
        return 1.0 if normalise(answer) == want else 0.0
    if name == "contains":
        return 1.0 if want in normalise(answer) else 0.0
    if name == "json":
        return 1.0 if json_equal(json_answer(answer), want) else 0.0
    found = last_number(answer)
    return 1.0 if found is not None and math.isclose(found, want, rel_tol=1e-6, abs_tol=1e-12) else 0.0


def json_answer(answer: str) -> Any:
    """The answer as JSON (a ``` fence around it is allowed), or a marker equal to nothing."""
    text = answer.strip()
    fenced = _FENCE.match(text)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return _NOT_JSON


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, and 1 is 1.0 (JSON has one number type)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
