"""The held-out split: prompts kept out of training so `carl eval` measures generalisation.

Rows are ordered by a hash of their prompt and the first `share` of them are held out. The split
depends only on the prompts, not on row order or the seed, so a resumed run and `carl eval` see
the same split, and identical prompts never land on both sides.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def prompt_key(row: dict[str, Any]) -> str:
    text = json.dumps(row.get("prompt"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def split_holdout(
    rows: list[dict[str, Any]], share: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows), each in the original order. A share > 0 holds out at least
    one prompt and keeps at least one for training, when the rows have two different prompts."""
    if share <= 0 or len(rows) < 2:
        return list(rows), []
    keys = [prompt_key(row) for row in rows]
    order = sorted(range(len(rows)), key=keys.__getitem__)
    # Cut only between different prompts, as near the wanted share as that allows.
    cuts = [i for i in range(1, len(rows)) if keys[order[i]] != keys[order[i - 1]]]
    if not cuts:
        return list(rows), []
    want = math.ceil(share * len(rows))
    cut = min(cuts, key=lambda i: (abs(i - want), i))
    held = set(order[:cut])
    train = [row for i, row in enumerate(rows) if i not in held]
    return train, [row for i, row in enumerate(rows) if i in held]


def distinct_prompts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row of each prompt, in order: a prompt listed several times (several reference
    completions of one request) is evaluated once, so it weighs as much as any other prompt."""
    seen: set[str] = set()
    out = []
    for row in rows:
        key = prompt_key(row)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def holdout_line(train: list[dict[str, Any]], held: list[dict[str, Any]]) -> str:
    """What a run says of its split: prompts, and rows too where prompts repeat."""
    prompts = len(distinct_prompts(held)), len(distinct_prompts(train + held))
    line = f"held out {prompts[0]} of {prompts[1]} prompts"
    if (len(held), len(train) + len(held)) != prompts:
        line += f" ({len(held)} of {len(train) + len(held)} rows)"
    return line + " for `carl eval`"
