"""A rollout as the store keeps it: one sample of a step, from any source, in the `rollouts` table.

The light half (no sqlite-utils, no numpy): the writer turns dicts into rows here, and the reader turns rows
back into dicts. Per-token values travel as float16 little-endian bytes: 2 bytes a token, about a thousandth
of the step's own cost to write (bench/bench_rollouts.py).
"""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Sequence
from typing import Any

from engine.limits import COUNT_MAX, int_within
from engine.text import storable

# A run keeps at most this many rollouts; past it its oldest steps are thinned (Store.add_rollouts). At a few
# KiB a sample this bounds a run's rollouts to a few hundred MiB.
ROLLOUT_CAP = 200_000
FIELDS = (
    "run_id",
    "step",
    "idx",
    "group_id",
    "prompt",
    "completion",
    "rewards",
    "total",
    "advantage",
    "length",
    "extra",
    "tokens",
    "entropy",
    "logprob",
    "wall_time",
)
ROLLOUT_COLUMNS = ", ".join(FIELDS)
ROLLOUT_WIDTH = len(FIELDS)
HALF_MAX = 65504.0  # the largest finite float16


def rollout_record(run_id: int, row: dict[str, Any]) -> tuple[Any, ...]:
    """The table row of one sample. `row` has `step` and `idx` (its place in the step) and any of: group_id,
    prompt, completion, rewards {function: value}, total, advantage, length, extra {...}, tokens [str],
    entropy [nats per token], logprob [per token], wall_time."""
    rewards = {str(k): _number(v) for k, v in (row.get("rewards") or {}).items()}
    total = _number(row.get("total"))
    if total is None and rewards and all(v is not None for v in rewards.values()):
        total = math.fsum(v for v in rewards.values() if v is not None)
    tokens = row.get("tokens")
    return (
        run_id,
        int(row["step"]),
        int(row["idx"]),
        str(row.get("group_id") or ""),
        _text(row.get("prompt")),
        _text(row.get("completion")),
        json.dumps(rewards) if rewards else None,
        total,
        _number(row.get("advantage")),
        int_within(row.get("length"), 0, COUNT_MAX),
        extra_json(row["extra"]) if row.get("extra") else None,
        json.dumps([_text(t) for t in tokens]) if tokens is not None else None,
        pack_half(row.get("entropy")),
        pack_half(row.get("logprob")),
        float(row.get("wall_time") or time.time()),
    )


def rollout_dict(row: Sequence[Any]) -> dict[str, Any]:
    """A stored row (in FIELDS order, prefixed with its id) back as a dict, per-token values as lists."""
    out = dict(zip(("id", *FIELDS), row, strict=True))
    out["rewards"] = json.loads(out["rewards"]) if out["rewards"] else {}
    out["extra"] = json.loads(out["extra"]) if out["extra"] else {}
    out["tokens"] = json.loads(out["tokens"]) if out["tokens"] else None
    out["entropy"] = unpack_half(out["entropy"])
    out["logprob"] = unpack_half(out["logprob"])
    return out


def pack_half(values: Sequence[float] | None) -> bytes | None:
    """float16 little-endian bytes; values beyond float16's range are clamped to it (NaN stays NaN)."""
    if values is None:
        return None
    clamped = [
        v if -HALF_MAX <= v <= HALF_MAX or v != v else math.copysign(HALF_MAX, v) for v in map(float, values)
    ]
    return struct.pack(f"<{len(clamped)}e", *clamped)


def unpack_half(blob: bytes | None) -> list[float] | None:
    if blob is None:
        return None
    return list(struct.unpack(f"<{len(blob) // 2}e", blob))


def extra_json(extra: Any) -> str:
    """A sample's `extra` as JSON text. A dump's record is kept whole, and a hostile one may nest deeper than
    the encoder goes (the parser went deeper): then a note says so, and the sample is stored all the same."""
    try:
        return json.dumps(extra, default=str)
    except RecursionError:
        return json.dumps({"unkept": "nested too deeply to store"})


def _number(value: Any) -> float | None:
    """A finite float, or None (bool, text, NaN and inf are no reward)."""
    if type(value) not in (int, float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    """Text as SQLite can store it: lone surrogates (which JSON escapes can carry) become U+FFFD."""
    if value is None:
        return None
    if not isinstance(value, str):
        value = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return storable(value)
