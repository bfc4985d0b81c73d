"""The five-signal reward of a trajectory (docs/reference/karl.md §3, with project rules 12(a) and 12(b)).

    R = 0.30·O + 0.25·P + 0.15·E + 0.15·V + 0.15·C        reward = round(R, 4)

Two ways in, one answer:

- `score(t)` scores one trajectory with plain Python, one small function per signal (§3.1–§3.5);
  tap D re-scores a single record with it.
- `score_many(ts)` scores a batch column-wise with numpy (flattened events plus offsets); the
  store's rescoring uses it. It gives exactly what `score` gives: every float is produced by the
  same IEEE operations in the same order, sums are sequential (`np.bincount`), and rounding
  reproduces Python's `round(x, 4)`.

Counts (`total`, `failures`, `bash_errors`, `tool_counts`) cover every event; the scans over
events (process weights, `bash_count`, longest failure run, late failures, verification,
consistency) see only the first 50, as the stored record does (§2.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.trajectories.trajectory import MAX_STORED_EVENTS, MUTATION_TOOLS, Event, Scored, Trajectory

WEIGHTS = {"outcome": 0.30, "process": 0.25, "efficiency": 0.15, "verification": 0.15, "consistency": 0.15}
SIGNALS = tuple(WEIGHTS)
TEST_MARKERS = ("pytest", "npm test", "bun test", "cargo test", "go test", "make test")
# "make " keeps its trailing space: a bare "make" or "makefile" is not a build (published quirk).
BUILD_MARKERS = ("xcodebuild", "cargo build", "make ", "npm run build", "bun build")
WRITE_TOOLS = frozenset({"Write", "Edit"})  # read-after-write and consistency: NotebookEdit does not count
# (component key, delta when the signal is true, delta when false), in §3.1 order.
OUTCOME_SIGNALS = (
    ("correction", "r_no_correction", -0.35, 0.35),
    ("redo", "r_no_redo", -0.25, 0.25),
    ("build_success", "r_build_pass", 0.20, -0.10),
    ("session_continued", "r_session_continued", 0.20, 0.0),
)
PROCESS_KEYS = ("r_success_rate", "r_bash_clean", "r_error_density", "r_temporal_weight")
EFFICIENCY_KEYS = ("r_diversity", "r_duration_eff", "r_file_touch")
VERIFICATION_KEYS = ("r_has_test", "r_has_build", "r_read_after_write")
CONSISTENCY_KEYS = ("r_read_before_write", "r_no_thrashing")
# Components of the early branches (total == 0, fewer than 3 tools): neutral values, as published.
EMPTY_PROCESS = (0.5, 1.0, 1.0, 0.5)
EMPTY_EFFICIENCY = (0.5, 0.5, 0.5)
SHORT_CONSISTENCY = (0.5, 1.0)


def clip(x: float) -> float:
    return min(1.0, max(0.0, x))


# --- counts over every event (§2.1, docs/reference/karl.md §12(b)) ------------------------------------------


def bash_errors(t: Trajectory) -> int:
    """docs/reference/karl.md §12(b): Bash events that failed or have a known non-zero exit code
    (null never counts)."""
    return sum(1 for e in t.events if e.bash_error)


def tool_counts(t: Trajectory) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in t.events:
        counts[e.tool] = counts.get(e.tool, 0) + 1
    return counts


def quality(t: Trajectory) -> dict[str, float | int | str]:
    """§2.4 quality block. With no events both rates are 0.0 (the recorder never writes such a record)."""
    total = t.total
    success_rate = round(t.successes / total, 3) if total else 0.0
    error_rate = round((t.failures + bash_errors(t)) / total, 3) if total else 0.0
    corrections = 0  # no tap sets `is_correction` on an event
    if error_rate > 0.3 or corrections > 2:
        grade = "low"
    elif error_rate > 0.15 or corrections > 0:
        grade = "medium"
    else:
        grade = "high"
    return {
        "success_rate": success_rate,
        "error_rate": error_rate,
        "correction_count": corrections,
        "tool_diversity": len({e.tool for e in t.events}),
        "grade": grade,
    }


# --- the five signals, one trajectory at a time ------------------------------------------------


def outcome_score(t: Trajectory) -> tuple[float, dict[str, float]]:
    """§3.1: 0.5 plus a delta per known signal, clipped; a null signal adds nothing and has no key."""
    o = 0.5
    comps: dict[str, float] = {}
    for attr, key, if_true, if_false in OUTCOME_SIGNALS:
        value = getattr(t, attr)
        if value is None:
            continue
        o += if_true if value else if_false
        good = not value if attr in ("correction", "redo") else bool(value)
        comps[key] = 1.0 if good else 0.0
    comps["outcome_signals_available"] = float(len(comps))
    return clip(o), comps


def longest_failure_run(events: Sequence[Event]) -> int:
    longest = run = 0
    for e in events:
        run = run + 1 if e.failed else 0
        longest = max(longest, run)
    return longest


def process_score(
    total: int, failures: int, bash_err: int, stored: Sequence[Event]
) -> tuple[float, list[float]]:
    """§3.2: rising-weight success rate, clean Bash, error density, late penalty (stored events)."""
    if total == 0:
        return 0.5, list(EMPTY_PROCESS)
    n = len(stored)
    weight_sum = weighted_ok = 0.0
    for i, e in enumerate(stored):
        w = 0.5 + i / max(n - 1, 1)
        weight_sum += w
        if not e.failed:
            weighted_ok += w
    success_rate = weighted_ok / weight_sum if n else 0.5
    bash_count = sum(1 for e in stored if e.tool == "Bash")
    bash_clean = 1.0 - bash_err / bash_count if bash_count else 1.0  # not clipped: may go below 0
    m = longest_failure_run(stored)
    error_density = max(0.0, 1.0 - 0.15 * (m - 2)) if failures > 0 and m >= 3 else 1.0
    late = sum(1 for e in stored[n - max(1, n // 4) :] if e.failed)
    late_penalty = max(0.0, 1.0 - 0.15 * late) if n else 1.0
    p = 0.40 * success_rate + 0.25 * bash_clean + 0.20 * error_density + 0.15 * late_penalty
    return clip(p), [success_rate, bash_clean, error_density, late_penalty]


def duration_efficiency(total: int, duration_s: float | None) -> float:
    """§3.3 tools-per-minute bands; a missing, NaN or non-positive duration is neutral."""
    if duration_s is None or not duration_s > 0:
        return 0.5
    tpm = 60 * total / duration_s
    if 2 <= tpm <= 8:
        return 1.0
    if tpm > 8:
        return 0.8
    if tpm >= 1:
        return 0.6
    return max(0.2, 0.5 - 0.3 * (1 - tpm))


def efficiency_score(
    total: int, counts: dict[str, int], duration_s: float | None
) -> tuple[float, list[float]]:
    """§3.3: normalized tool entropy, pace, share of mutating calls."""
    if total == 0:
        return 0.5, list(EMPTY_EFFICIENCY)
    unique = len(counts)
    if unique <= 1:
        diversity = 0.3  # single-tool penalty
    else:
        entropy = 0.0
        for count in counts.values():
            p = count / total
            entropy -= p * math.log2(p)
        diversity = entropy / math.log2(unique)
    pace = duration_efficiency(total, duration_s)
    mutations = sum(counts.get(tool, 0) for tool in MUTATION_TOOLS)
    file_touch = min(1.0, mutations / max(0.3 * total, 1.0))
    return clip(0.35 * diversity + 0.35 * pace + 0.30 * file_touch), [diversity, pace, file_touch]


def command_flags(command: str | None) -> tuple[bool, bool]:
    """(is a test command, is a build command) of a Bash command, lower-cased (§3.4)."""
    cmd = (command or "").lower()
    return any(m in cmd for m in TEST_MARKERS), any(m in cmd for m in BUILD_MARKERS)


def read_after_write(stored: Sequence[Event]) -> bool:
    """§3.4: a Read of a path that a Write or Edit wrote earlier (empty paths never match)."""
    written: set[str] = set()
    for e in stored:
        path = e.params.get("file_path")
        if not path:
            continue
        if e.tool in WRITE_TOOLS:
            written.add(path)
        elif e.tool == "Read" and path in written:
            return True
    return False


def verification_score(
    total: int, counts: dict[str, int], stored: Sequence[Event]
) -> tuple[float, dict[str, float]]:
    """§3.4 with docs/reference/karl.md §12(a): V = 0.4·[test] + 0.3·[build] + 0.3·[read-after-write]."""
    if total == 0:
        return 0.5, dict.fromkeys(VERIFICATION_KEYS, 0.0)
    if not any(tool in counts for tool in MUTATION_TOOLS):
        return 0.6, {**dict.fromkeys(VERIFICATION_KEYS, 0.0), "r_no_mutation": 1.0}
    test = build = False
    for e in stored:
        if e.tool == "Bash":
            is_test, is_build = command_flags(e.params.get("command"))
            test, build = test or is_test, build or is_build
    raw = read_after_write(stored)
    v = 0.4 * float(test) + 0.3 * float(build) + 0.3 * float(raw)
    return clip(v), dict(zip(VERIFICATION_KEYS, (float(test), float(build), float(raw)), strict=True))


def consistency_score(total: int, stored: Sequence[Event]) -> tuple[float, list[float]]:
    """§3.5: read before write, and no file edited three or more times."""
    if total < 3:
        return 0.6, list(SHORT_CONSISTENCY)
    read: set[str] = set()
    writes = writes_after_read = 0
    edits: dict[str, int] = {}
    for e in stored:
        path = e.params.get("file_path")
        if not path:
            continue
        if e.tool == "Read":
            read.add(path)
        elif e.tool in WRITE_TOOLS:
            writes += 1
            writes_after_read += path in read
            edits[path] = edits.get(path, 0) + 1
    rbw = writes_after_read / writes if writes else 0.5
    thrash = sum(1 for count in edits.values() if count >= 3)
    no_thrash = 1.0 if thrash == 0 else max(0.0, 1.0 - 0.2 * thrash)
    return clip(0.6 * rbw + 0.4 * no_thrash), [rbw, no_thrash]


def score(t: Trajectory) -> Scored:
    """§3: the reward of one trajectory, its five signals and every component, rounded to 4 decimals."""
    stored = t.events[:MAX_STORED_EVENTS]
    counts = tool_counts(t)
    total = t.total
    o, comps = outcome_score(t)
    p, p_parts = process_score(total, t.failures, bash_errors(t), stored)
    e, e_parts = efficiency_score(total, counts, t.duration_s)
    v, v_comps = verification_score(total, counts, stored)
    c, c_parts = consistency_score(total, stored)
    comps.update(zip(PROCESS_KEYS, p_parts, strict=True))
    comps.update(zip(EFFICIENCY_KEYS, e_parts, strict=True))
    comps.update(v_comps)
    comps.update(zip(CONSISTENCY_KEYS, c_parts, strict=True))
    r = 0.30 * o + 0.25 * p + 0.15 * e + 0.15 * v + 0.15 * c
    return Scored(
        round(r, 4),
        round(o, 4),
        round(p, 4),
        round(e, 4),
        round(v, 4),
        round(c, 4),
        {k: round(x, 4) for k, x in comps.items()},
    )


# --- the batch path: columns over flattened events ----------------------------------------------

CHUNK_TRAJECTORIES = 256  # a chunk's events, dicts and strings stay in cache between the passes
_SIGNAL_CODES = {True: 2, False: 4, None: 0}  # outcome signals
_FLAG_TEST, _FLAG_BUILD = 1, 2


class _Ids(dict[str, int]):
    """Interns names to 0, 1, 2, ... on first sight."""

    def __missing__(self, key: str) -> int:
        self[key] = value = len(self)
        return value


@dataclass
class BatchScores:
    """Column-wise scores of a batch: one float64 array per signal and per component key.

    `components[key]` is NaN where that key is absent for a trajectory (an unknown outcome signal,
    `r_no_mutation` outside the no-mutation branch). Values are unrounded; `scored()` rounds.
    """

    reward: np.ndarray
    outcome: np.ndarray
    process: np.ndarray
    efficiency: np.ndarray
    verification: np.ndarray
    consistency: np.ndarray
    components: dict[str, np.ndarray]

    def scored(self) -> list[Scored]:
        return _to_scored(self)


def round4(x: np.ndarray) -> np.ndarray:
    """Python's `round(v, 4)` for every element: numpy's rounding, with Python's for near-ties."""
    out = np.round(x, 4)
    scaled = x * 1e4
    near_tie = np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6
    for i in np.flatnonzero(near_tie).tolist():
        out[i] = round(float(x[i]), 4)
    return out


def _event_codes(events: list[Event], ids: _Ids) -> np.ndarray:
    """One pass over the events (the pass that pays the cache misses): tool id·4 + 2·[failed] +
    [exit code known and non-zero]."""
    codes = [ids[e.tool] * 4 + (2 if e.success is False else 0) + (1 if e.exit_code else 0) for e in events]
    return np.array(codes, dtype=np.int64)


def _flags(command: str | None) -> int:
    cmd = (command or "").lower()
    flag = 0
    for m in TEST_MARKERS:
        if m in cmd:
            flag = _FLAG_TEST
            break
    for m in BUILD_MARKERS:
        if m in cmd:
            return flag | _FLAG_BUILD
    return flag


def _optional(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    return np.where(present, values, np.nan)


def _segment_max(values: np.ndarray, starts: np.ndarray, nonempty: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=values.dtype)
    if len(values):
        out[nonempty] = np.maximum.reduceat(values, starts[nonempty])
    return out


def _outcome_columns(ts: Sequence[Trajectory], comps: dict[str, np.ndarray]) -> np.ndarray:
    """§3.1, the same additions in the same order as `outcome_score` (a null adds +0.0, exact)."""
    o = np.full(len(ts), 0.5)
    available = np.zeros(len(ts))
    for attr, key, if_true, if_false in OUTCOME_SIGNALS:
        # 2 true, 4 false, 0 null
        code = np.array([_SIGNAL_CODES[getattr(t, attr)] for t in ts], dtype=np.int8)
        known, true = code != 0, code == 2
        o = o + np.where(known, np.where(true, if_true, if_false), 0.0)
        good = ~true if attr in ("correction", "redo") else true
        comps[key] = _optional(good.astype(float), known)
        available += known
    comps["outcome_signals_available"] = available
    return np.clip(o, 0.0, 1.0)


def _score_chunk(ts: Sequence[Trajectory]) -> BatchScores:
    """One chunk: flatten the events once, then every signal as array operations over them."""
    n_traj = len(ts)
    lens = np.array([len(t.events) for t in ts], dtype=np.int64)
    events = [e for t in ts for e in t.events]
    ids = _Ids(Read=0, Write=1, Edit=2, NotebookEdit=3, Bash=4)
    codes = _event_codes(events, ids)
    tool, failed, nonzero_exit = codes >> 2, (codes & 2) != 0, (codes & 1) != 0
    traj = np.repeat(np.arange(n_traj), lens)
    starts = np.cumsum(lens) - lens

    # Counts over every event.
    total = lens
    failures = np.bincount(traj, failed, n_traj)
    bash_err = np.bincount(traj, (tool == 4) & (failed | nonzero_exit), n_traj)
    n_tools = len(ids)
    counts = np.bincount(traj * n_tools + tool, minlength=n_traj * n_tools).reshape(n_traj, n_tools)

    # Scans see the first 50 events only.
    if len(lens) and lens.max() > MAX_STORED_EVENTS:
        keep = np.arange(len(events)) - np.repeat(starts, lens) < MAX_STORED_EVENTS
        kept = np.flatnonzero(keep)
        events = [events[i] for i in kept.tolist()]
        tool, failed, traj = tool[kept], failed[kept], traj[kept]
    n = np.minimum(lens, MAX_STORED_EVENTS)
    s_starts = np.cumsum(n) - n
    pos = np.arange(len(events)) - np.repeat(s_starts, n)

    comps: dict[str, np.ndarray] = {}
    o = _outcome_columns(ts, comps)
    p = _process_columns(total, failures, bash_err, n, s_starts, traj, pos, tool, failed, comps)
    durations = np.array([_duration(t) for t in ts], dtype=float)
    e = _efficiency_columns(total, counts, durations, comps)
    paths = _path_groups(events, traj, pos, tool)
    v = _verification_columns(total, counts, events, traj, tool, paths, comps)
    c = _consistency_columns(total, paths, comps)
    r = 0.30 * o + 0.25 * p + 0.15 * e + 0.15 * v + 0.15 * c
    return BatchScores(r, o, p, e, v, c, comps)


def _duration(t: Trajectory) -> float:
    d = t.duration_s
    return math.nan if d is None else d


def _process_columns(
    total: np.ndarray,
    failures: np.ndarray,
    bash_err: np.ndarray,
    n: np.ndarray,
    s_starts: np.ndarray,
    traj: np.ndarray,
    pos: np.ndarray,
    tool: np.ndarray,
    failed: np.ndarray,
    comps: dict[str, np.ndarray],
) -> np.ndarray:
    """§3.2 over the stored events; bincount sums in event order, like the loop in `process_score`."""
    size = len(total)
    w = 0.5 + pos / np.maximum(n - 1, 1)[traj]
    weight_sum = np.bincount(traj, w, size)
    weighted_ok = np.bincount(traj, np.where(failed, 0.0, w), size)
    success_rate = np.where(n > 0, weighted_ok / np.where(n > 0, weight_sum, 1.0), 0.5)
    bash_count = np.bincount(traj, tool == 4, size)
    bash_clean = np.where(bash_count > 0, 1.0 - bash_err / np.maximum(bash_count, 1), 1.0)

    # Longest run of failed events: distance to the last non-failed event (or the segment start).
    idx = np.arange(len(pos))
    brk = np.where(failed, -1, idx)
    nonempty = n > 0
    first = s_starts[nonempty]
    brk[first] = np.where(failed[first], first - 1, first)
    run = np.where(failed, idx - np.maximum.accumulate(brk), 0)
    m = _segment_max(run, s_starts, nonempty, size)
    error_density = np.where((failures > 0) & (m >= 3), np.maximum(0.0, 1.0 - 0.15 * (m - 2)), 1.0)

    late_from = n - np.maximum(1, n // 4)
    late = np.bincount(traj, failed & (pos >= late_from[traj]), size)
    late_penalty = np.where(nonempty, np.maximum(0.0, 1.0 - 0.15 * late), 1.0)

    p = 0.40 * success_rate + 0.25 * bash_clean + 0.20 * error_density + 0.15 * late_penalty
    empty = total == 0
    for key, value, neutral in zip(
        PROCESS_KEYS, (success_rate, bash_clean, error_density, late_penalty), EMPTY_PROCESS, strict=True
    ):
        comps[key] = np.where(empty, neutral, value)
    return np.where(empty, 0.5, np.clip(p, 0.0, 1.0))


def _efficiency_columns(
    total: np.ndarray, counts: np.ndarray, durations: np.ndarray, comps: dict[str, np.ndarray]
) -> np.ndarray:
    """§3.3 on the tool-count matrix (one row per trajectory, one column per tool name)."""
    safe_total = np.maximum(total, 1)[:, None]
    probs = counts / safe_total
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(counts > 0, probs * np.log2(np.where(counts > 0, probs, 1.0)), 0.0)
    entropy = -terms.sum(axis=1)
    unique = (counts > 0).sum(axis=1)
    diversity = np.where(unique <= 1, 0.3, entropy / np.log2(np.maximum(unique, 2)))

    valid = durations > 0  # NaN (missing) compares False
    with np.errstate(divide="ignore", invalid="ignore"):
        tpm = np.where(valid, 60 * total / np.where(valid, durations, 1.0), 0.0)
    pace = np.select(
        [~valid, (tpm >= 2) & (tpm <= 8), tpm > 8, tpm >= 1],
        [0.5, 1.0, 0.8, 0.6],
        np.maximum(0.2, 0.5 - 0.3 * (1 - tpm)),
    )
    mutations = counts[:, 1:4].sum(axis=1)  # ids 1..3: Write, Edit, NotebookEdit
    file_touch = np.minimum(1.0, mutations / np.maximum(0.3 * total, 1.0))
    e = 0.35 * diversity + 0.35 * pace + 0.30 * file_touch
    empty = total == 0
    for key, value, neutral in zip(
        EFFICIENCY_KEYS, (diversity, pace, file_touch), EMPTY_EFFICIENCY, strict=True
    ):
        comps[key] = np.where(empty, neutral, value)
    return np.where(empty, 0.5, np.clip(e, 0.0, 1.0))


@dataclass
class _PathGroups:
    """Stored Read/Write/Edit events with a path, grouped by (trajectory, path)."""

    traj: np.ndarray  # per event
    pos: np.ndarray
    is_write: np.ndarray
    group: np.ndarray  # per event: group index
    group_traj: np.ndarray  # per group: its trajectory


def _path_groups(events: list[Event], traj: np.ndarray, pos: np.ndarray, tool: np.ndarray) -> _PathGroups:
    sel = np.flatnonzero(tool <= 2)  # Read, Write, Edit
    pid, n_paths = _intern([e.params.get("file_path") for e in _gather(events, sel)])
    sel, pid = sel[pid >= 0], pid[pid >= 0]
    key = traj[sel] * n_paths + pid
    uniq, group = np.unique(key, return_inverse=True)
    return _PathGroups(traj[sel], pos[sel], tool[sel] != 0, group.reshape(-1), uniq // n_paths)


def _gather(items: list[Event], idx: np.ndarray) -> list[Event]:
    return list(map(items.__getitem__, idx.tolist()))


def _intern(values: list[str | None]) -> tuple[np.ndarray, int]:
    """Ids 0, 1, ... for distinct values, -1 for None and ""; and how many ids there are (at least 1)."""
    ids = dict.fromkeys(values)
    ids.pop(None, None)
    ids.pop("", None)
    ids.update(zip(ids, range(len(ids)), strict=True))
    ids[None] = ids[""] = -1
    return np.array([ids[v] for v in values], dtype=np.int64), max(len(ids) - 2, 1)


def _verification_columns(
    total: np.ndarray,
    counts: np.ndarray,
    events: list[Event],
    traj: np.ndarray,
    tool: np.ndarray,
    paths: _PathGroups,
    comps: dict[str, np.ndarray],
) -> np.ndarray:
    """§3.4 with docs/reference/karl.md §12(a); test/build flags are computed once per distinct command."""
    size = len(total)
    bash = np.flatnonzero(tool == 4)
    commands = [e.params.get("command") for e in _gather(events, bash)]
    flag_of = {c: _flags(c) for c in set(commands)}
    flags = np.array([flag_of[c] for c in commands], dtype=np.int64)
    test = np.bincount(traj[bash], (flags & _FLAG_TEST) != 0, size) > 0
    build = np.bincount(traj[bash], (flags & _FLAG_BUILD) != 0, size) > 0
    raw = _read_after_write(paths, size)
    mutated = counts[:, 1:4].sum(axis=1) > 0
    v = 0.4 * test.astype(float) + 0.3 * build.astype(float) + 0.3 * raw.astype(float)
    plain = (total > 0) & mutated
    for key, flag in zip(VERIFICATION_KEYS, (test, build, raw), strict=True):
        comps[key] = np.where(plain, flag.astype(float), 0.0)
    comps["r_no_mutation"] = _optional(np.ones(size), (total > 0) & ~mutated)
    return np.where(total == 0, 0.5, np.where(mutated, np.clip(v, 0.0, 1.0), 0.6))


def _read_after_write(g: _PathGroups, size: int) -> np.ndarray:
    groups = len(g.group_traj)
    first_write = np.full(groups, np.iinfo(np.int64).max)
    last_read = np.full(groups, -1)
    np.minimum.at(first_write, g.group[g.is_write], g.pos[g.is_write])
    np.maximum.at(last_read, g.group[~g.is_write], g.pos[~g.is_write])
    return np.bincount(g.group_traj, last_read > first_write, size) > 0


def _consistency_columns(total: np.ndarray, g: _PathGroups, comps: dict[str, np.ndarray]) -> np.ndarray:
    """§3.5: a write is 'after a read' when its path's first Read comes earlier."""
    size = len(total)
    groups = len(g.group_traj)
    first_read = np.full(groups, np.iinfo(np.int64).max)
    np.minimum.at(first_read, g.group[~g.is_write], g.pos[~g.is_write])
    w = g.is_write
    writes = np.bincount(g.traj[w], minlength=size)
    after_read = np.bincount(g.traj[w], first_read[g.group[w]] < g.pos[w], size)
    rbw = np.where(writes > 0, after_read / np.maximum(writes, 1), 0.5)
    edits = np.bincount(g.group[w], minlength=groups)
    thrash = np.bincount(g.group_traj, edits >= 3, size)
    no_thrash = np.where(thrash == 0, 1.0, np.maximum(0.0, 1.0 - 0.2 * thrash))
    c = 0.6 * rbw + 0.4 * no_thrash
    short = total < 3
    for key, value, neutral in zip(CONSISTENCY_KEYS, (rbw, no_thrash), SHORT_CONSISTENCY, strict=True):
        comps[key] = np.where(short, neutral, value)
    return np.where(short, 0.6, np.clip(c, 0.0, 1.0))


COMPONENT_ORDER = (
    *(key for _, key, _, _ in OUTCOME_SIGNALS),
    "outcome_signals_available",
    *PROCESS_KEYS,
    *EFFICIENCY_KEYS,
    *VERIFICATION_KEYS,
    "r_no_mutation",
    *CONSISTENCY_KEYS,
)


def score_batch(trajectories: Sequence[Trajectory]) -> BatchScores:
    """The column-wise scores of a batch, computed chunk by chunk (no rounding)."""
    parts = [
        _score_chunk(trajectories[i : i + CHUNK_TRAJECTORIES])
        for i in range(0, len(trajectories), CHUNK_TRAJECTORIES)
    ]
    if not parts:
        empty = np.zeros(0)
        return BatchScores(empty, empty, empty, empty, empty, empty, {k: empty for k in COMPONENT_ORDER})
    cat = np.concatenate
    return BatchScores(
        cat([b.reward for b in parts]),
        cat([b.outcome for b in parts]),
        cat([b.process for b in parts]),
        cat([b.efficiency for b in parts]),
        cat([b.verification for b in parts]),
        cat([b.consistency for b in parts]),
        {k: cat([b.components[k] for b in parts]) for k in COMPONENT_ORDER},
    )


def _to_scored(b: BatchScores) -> list[Scored]:
    """Rows of `Scored`; rows that share the same set of present keys are built together."""
    size = len(b.reward)
    cols = {k: round4(v) for k, v in b.components.items()}
    signature = np.zeros(size, dtype=np.int64)  # bit j: COMPONENT_ORDER[j] is present
    for j, k in enumerate(COMPONENT_ORDER):
        signature |= (~np.isnan(cols[k])).astype(np.int64) << j
    heads = [round4(x) for x in (b.reward, b.outcome, b.process, b.efficiency, b.verification, b.consistency)]
    out: list[Scored | None] = [None] * size
    for sig in np.unique(signature).tolist():
        rows = np.flatnonzero(signature == sig)
        keys = [k for j, k in enumerate(COMPONENT_ORDER) if sig >> j & 1]
        values = zip(*(cols[k][rows].tolist() for k in keys), strict=True)
        head = zip(*(h[rows].tolist() for h in heads), strict=True)
        for i, (r, o, p, e, v, c), row in zip(rows.tolist(), head, values, strict=True):
            out[i] = Scored(r, o, p, e, v, c, dict(zip(keys, row, strict=True)))
    return out  # type: ignore[return-value]


def score_many(trajectories: Sequence[Trajectory]) -> list[Scored]:
    """`score` for every trajectory, computed column-wise: the same results, in bulk."""
    return score_batch(trajectories).scored()
