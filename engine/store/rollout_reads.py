"""Reading the rollouts table a page at a time, in any order the viewer lists it, at any size.

A list of a run's samples (one step's, or every step's) is a `RolloutQuery`: its scope, its order (the
source's order, or by total reward, advantage or length, either way) and its filter. Pages are read by keyset:
each row carries its key (where it sits in the order) and the next page starts after the last key shown, along
an index (schema v7), so reading page 10,000 costs what page 1 costs. A row without the value sorted by (a
source with no advantage) comes after those with one, whichever the direction.

The filter language (docs/guide/control-room.md, "The rollouts viewer"): words separated by spaces, every one
must hold.
- `reward<0.2`, `adv>=0`, `len>200`, `step=12`: a comparison (`<`, `<=`, `>`, `>=`, `=`, `!=`) of the total
  reward (`reward`, `total`, `r`), the advantage (`adv`, `advantage`, `a`), the length (`len`, `length`), the
  step, or any reward function by its name (`task>0.5`, `accuracy_reward=1`);
- any other word, or "a quoted phrase": a substring of the prompt or the completion (ASCII letters in any
  case).

The token entropy statistics (a step's histogram, the p10/p50/p90 band over steps) are computed here from the
stored per-token values, bounded: a few hundred samples a step, a few hundred steps.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .rollouts import ROLLOUT_COLUMNS, rollout_dict, unpack_half

SORTS = ("order", "reward", "advantage", "length")
SORT_COLUMNS = {"reward": "total", "advantage": "advantage", "length": "length"}
FIELDS = {
    "reward": "total",
    "total": "total",
    "r": "total",
    "adv": "advantage",
    "advantage": "advantage",
    "a": "advantage",
    "len": "length",
    "length": "length",
    "step": "step",
}
OPERATORS = ("<=", ">=", "!=", "=", "<", ">")
SEEK_STEPS = 2000  # steps listed by one index seek each; past them, by one scan
HEAD = 200  # characters of the prompt and the completion a list row carries
# A list row: what the viewer draws of a sample, without its full text or per-token values.
LIST_COLUMNS = (
    f"id, step, idx, group_id, substr(prompt, 1, {HEAD}), substr(completion, 1, {HEAD}), total, advantage,"
    " length, entropy IS NOT NULL"
)
_TERM = re.compile(
    r'"(?P<quoted>[^"]*)"?'
    r"|(?P<field>[A-Za-z_][\w.:/-]*)\s*(?P<op><=|>=|!=|==|=|<|>)\s*"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?=\s|$)"
    r"|(?P<word>\S+)"
)

_HALF_COMPARISON = re.compile(r"[A-Za-z_][\w.:/-]*\s*(<=|>=|!=|==|=|<|>)")


class FilterError(ValueError):
    """A filter that cannot be read, with a one-line reason."""


@dataclass(frozen=True)
class RolloutFilter:
    """Substrings each found in the prompt or the completion, and comparisons each true."""

    text: tuple[str, ...] = ()
    ranges: tuple[tuple[str, str, float], ...] = ()  # (column, or "rewards.<function>"; operator; value)

    def __bool__(self) -> bool:
        return bool(self.text or self.ranges)


def parse_filter(text: str) -> RolloutFilter:
    """The filter language above; raises FilterError for a comparison it cannot read."""
    words: list[str] = []
    ranges: list[tuple[str, str, float]] = []
    for match in _TERM.finditer(text):
        if match["quoted"] is not None:
            if match["quoted"]:
                words.append(match["quoted"])
        elif match["field"] is not None:
            name, op, value = match["field"], match["op"], float(match["value"])
            if not math.isfinite(value):
                raise FilterError(f"{match[0]}: the value is not a finite number")
            column = FIELDS.get(name.lower(), f"rewards.{name}")
            ranges.append((column, "=" if op == "==" else op, value))
        else:
            word = match["word"]
            if _HALF_COMPARISON.match(word) or word.startswith(OPERATORS):
                raise FilterError(
                    f"{word}: a comparison is name<number, e.g. reward<0.2 or adv>0"
                    " (quote text to search for it)"
                )
            words.append(word)
    return RolloutFilter(tuple(words), tuple(ranges))


@dataclass(frozen=True)
class RolloutQuery:
    """A list of a run's samples: one step's (or every step's), in an order, filtered."""

    run_id: int
    step: int | None = None  # None: every step
    sort: str = "order"  # order (the source's: step, then place in the step) | reward | advantage | length
    descending: bool = False
    filter: RolloutFilter = field(default_factory=RolloutFilter)

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise ValueError(f"sort must be one of {SORTS}, not {self.sort!r}")


Key = tuple[Any, ...]  # (segment, *the segment's order columns): where a row sits in its query's order


@dataclass(frozen=True)
class RolloutRow:
    """One line of the list: a sample's place, its numbers and the heads of its texts."""

    id: int
    step: int
    idx: int
    group_id: str
    prompt: str
    completion: str
    total: float | None
    advantage: float | None
    length: int | None
    has_tokens: bool  # per-token entropies are stored (our own runs)
    key: Key


@dataclass(frozen=True)
class _Segment:
    """A stretch of the order, read along one index: its rows' condition, the columns they are ordered by."""

    condition: str
    columns: tuple[str, ...]


def _segments(query: RolloutQuery) -> tuple[_Segment, ...]:
    """The order as stretches: rows with the sorted value, then (by id) those without."""
    if query.sort == "order":
        return (_Segment("", ("step", "idx")),)
    column = SORT_COLUMNS[query.sort]
    if query.step is not None:
        # One step: its rows are found by the (run_id, step, idx) index and sorted. `+` keeps the planner off
        # the run-wide index of the column, which would walk the whole run's rows for one step's.
        column = f"+{column}"
    return (_Segment(f"{column} IS NOT NULL", (column, "id")), _Segment(f"{column} IS NULL", ("id",)))


def _where(query: RolloutQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = ["run_id=?"]
    params: list[Any] = [query.run_id]
    if query.step is not None:
        clauses.append("step=?")
        params.append(query.step)
    for word in query.filter.text:
        pattern = "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        clauses.append("(prompt LIKE ? ESCAPE '\\' OR completion LIKE ? ESCAPE '\\')")
        params += [pattern, pattern]
    for column, op, value in query.filter.ranges:
        if column.startswith("rewards."):
            name = column.removeprefix("rewards.").replace('"', "")
            clauses.append(f"json_extract(rewards, ?) {op} ?")
            params += [f'$."{name}"', value]
        else:
            clauses.append(f"{column} {op} ?")
            params.append(value)
    return " AND ".join(clauses), params


def _row(values: Sequence[Any], segment: int, width: int) -> RolloutRow:
    id_, step, idx, group_id, prompt, completion, total, advantage, length, has_tokens = values[:10]
    key = (segment, *values[10 : 10 + width])
    return RolloutRow(
        id_, step, idx, group_id, prompt, completion, total, advantage, length, bool(has_tokens), key
    )


def _read(
    conn: sqlite3.Connection,
    query: RolloutQuery,
    index: int,
    bound: Key | None,
    limit: int,
    *,
    backward: bool,
    inclusive: bool,
    columns: str = LIST_COLUMNS,
    offset: int = 0,
) -> list[tuple[Any, ...]]:
    """Rows of one segment past `bound` (its order columns' values), in the order read."""
    segment = _segments(query)[index]
    where, params = _where(query)
    if segment.condition:
        where += f" AND {segment.condition}"
    descending = query.descending != backward
    order = ", ".join(segment.columns)
    if bound is not None:
        op = ("<" if descending else ">") + ("=" if inclusive else "")
        where += f" AND ({order}) {op} ({', '.join('?' * len(bound))})"
        params += list(bound)
    direction = " DESC" if descending else ""
    sql = (
        f"SELECT {columns}, {order} FROM rollouts WHERE {where}"
        f" ORDER BY {', '.join(c + direction for c in segment.columns)} LIMIT ? OFFSET ?"
    )
    return conn.execute(sql, (*params, limit, offset)).fetchall()


def rollout_page(
    conn: sqlite3.Connection,
    query: RolloutQuery,
    *,
    after: Key | None = None,
    limit: int = 100,
    backward: bool = False,
    inclusive: bool = False,
) -> list[RolloutRow]:
    """Up to `limit` rows in the query's order, just after the row keyed `after` (from the first row when
    None); `backward`: just before it (from the last row when None). `inclusive` starts at that row itself.
    The rows come in the query's order either way."""
    segments = _segments(query)
    start = after[0] if after is not None else (len(segments) - 1 if backward else 0)
    walk = range(start, -1, -1) if backward else range(start, len(segments))
    rows: list[RolloutRow] = []
    for index in walk:
        bound = tuple(after[1:]) if after is not None and index == after[0] else None
        width = len(segments[index].columns)
        got = _read(
            conn,
            query,
            index,
            bound,
            limit - len(rows),
            backward=backward,
            inclusive=inclusive and bound is not None,
        )
        rows += [_row(values, index, width) for values in got]
        if len(rows) >= limit:
            break
    return rows[::-1] if backward else rows


def rollout_key_at(conn: sqlite3.Connection, query: RolloutQuery, position: int, total: int) -> Key | None:
    """The key of the row at `position` (0-based) of a list of `total` rows: found from the nearer end by
    skipping over the order's index (its entries only, no row is read). Far jumps only (a scroll bar dragged):
    paging is by keyset."""
    if not 0 <= position < total:
        return None
    backward = position >= total - position
    skip = total - 1 - position if backward else position
    segments = _segments(query)
    walk = range(len(segments) - 1, -1, -1) if backward else range(len(segments))
    for index in walk:
        got = _read(conn, query, index, None, 1, backward=backward, inclusive=False, columns="1", offset=skip)
        if got:
            return (index, *got[0][1:])
        where, params = _where(query)  # past this segment: skip what it holds
        sql = f"SELECT count(*) FROM rollouts WHERE {where} AND {segments[index].condition or '1'}"
        skip -= int(conn.execute(sql, params).fetchone()[0])
    return None


def rollout_total(conn: sqlite3.Connection, query: RolloutQuery) -> int:
    where, params = _where(query)
    return int(conn.execute(f"SELECT count(*) FROM rollouts WHERE {where}", params).fetchone()[0])


def rollout_step_list(conn: sqlite3.Connection, run_id: int, after: int | None = None) -> list[int]:
    """The steps of a run that have rollouts (after `after`), oldest first: one index seek per step while the
    steps are few (a big step costs no more than a small one), one scan of the index past that."""
    steps: list[int] = []
    step = -(2**63) if after is None else after
    while len(steps) < SEEK_STEPS:
        row = conn.execute(
            "SELECT min(step) FROM rollouts WHERE run_id=? AND step>?", (run_id, step)
        ).fetchone()
        if row[0] is None:
            return steps
        step = int(row[0])
        steps.append(step)
    rest = conn.execute(
        "SELECT DISTINCT step FROM rollouts WHERE run_id=? AND step>? ORDER BY step", (run_id, step)
    ).fetchall()
    return steps + [int(s) for (s,) in rest]


def rollout_group(
    conn: sqlite3.Connection, run_id: int, step: int, group_id: str, prompt: str | None, limit: int = 64
) -> list[dict[str, Any]]:
    """The samples of one GRPO group, in their step's order: its group id's, or (a source with no groups)
    those of the step with the same prompt."""
    params: tuple[int, int, str | None]
    if group_id:
        where, params = "run_id=? AND step=? AND group_id=?", (run_id, step, group_id)
    else:
        where, params = "run_id=? AND step=? AND group_id='' AND prompt IS ?", (run_id, step, prompt)
    rows = conn.execute(
        f"SELECT id, {ROLLOUT_COLUMNS} FROM rollouts WHERE {where} ORDER BY idx LIMIT ?", (*params, limit)
    ).fetchall()
    return [rollout_dict(r) for r in rows]


def next_rollout_idx(conn: sqlite3.Connection, run_id: int, step: int) -> int:
    """The place after the last sample stored at a run's step (0 for a step with none): where a source whose
    samples carry no place of their own (a tracker's traces, TensorBoard texts) puts its next one. One seek
    of the (run_id, step, idx) index."""
    row = conn.execute("SELECT max(idx) FROM rollouts WHERE run_id=? AND step=?", (run_id, step)).fetchone()
    return 0 if row[0] is None else int(row[0]) + 1


# -- token entropy -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntropyHistogram:
    """Token entropy (nats) over one step's samples: `counts[i]` tokens in [edges[i], edges[i + 1])."""

    step: int
    edges: list[float]
    counts: list[int]
    tokens: int
    samples: int


def step_entropies(conn: sqlite3.Connection, run_id: int, step: int, max_samples: int = 256) -> list[float]:
    """Every stored token entropy of a step's first `max_samples` samples that have them."""
    blobs = conn.execute(
        "SELECT entropy FROM rollouts WHERE run_id=? AND step=? AND entropy IS NOT NULL ORDER BY idx LIMIT ?",
        (run_id, step, max_samples),
    ).fetchall()
    values: list[float] = []
    for (blob,) in blobs:
        values += [v for v in unpack_half(blob) or () if math.isfinite(v)]
    return values


def entropy_histogram(
    conn: sqlite3.Connection, run_id: int, step: int, *, bins: int = 24, top: float | None = None
) -> EntropyHistogram | None:
    """A step's token entropies in `bins` equal bins from 0 to `top` (ln|V| when known; else the step's
    largest value); None when the step has no per-token values."""
    values = step_entropies(conn, run_id, step)
    if not values:
        return None
    samples = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM rollouts"
        " WHERE run_id=? AND step=? AND entropy IS NOT NULL LIMIT 256)",
        (run_id, step),
    ).fetchone()[0]
    high = max(top or 0.0, max(values), 1e-6)
    width = high / bins
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, max(0, int(value / width)))] += 1
    return EntropyHistogram(step, [i * width for i in range(bins + 1)], counts, len(values), int(samples))


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Nearest-rank percentiles (q in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    n = len(ordered)
    return [ordered[min(n - 1, max(0, math.ceil(q / 100 * n) - 1))] for q in qs]


def entropy_band(
    conn: sqlite3.Connection, run_id: int, steps: Sequence[int], *, max_samples: int = 64
) -> list[tuple[int, float, float, float]]:
    """(step, p10, p50, p90) of token entropy for each of `steps` that has per-token values, from its first
    `max_samples` samples: the caller bounds the steps (a few hundred, spread over the run)."""
    band: list[tuple[int, float, float, float]] = []
    for step in steps:
        values = step_entropies(conn, run_id, step, max_samples)
        if values:
            p10, p50, p90 = percentiles(values, (10, 50, 90))
            band.append((step, p10, p50, p90))
    return band


def spread(steps: Sequence[int], count: int) -> list[int]:
    """At most `count` of `steps`, evenly spread, the first and the last always among them."""
    if len(steps) <= count:
        return list(steps)
    if count < 2:
        return list(steps[-count:]) if count else []
    last = len(steps) - 1
    return [steps[round(i * last / (count - 1))] for i in range(count)]
