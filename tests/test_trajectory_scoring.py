"""Trajectory intelligence: the reward (docs/reference/karl.md §3, rules 12(a)/(b)), advantages (§4, 12(c)),
domain inference (§8, 12(f)), the fingerprint (§7), plasticity triggers (§9) and the ablation (§11).

`reference_score` and `reference_advantages` below are the oracle: a literal, line-by-line
transcription of the formulas in docs/reference/karl.md, written without the engine's helpers. The batch path
(`score_many`) and the readable path (`score`) must both agree with it.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.trajectories.ablation.leave_one_out import ablate, average_ranks, format_table, spearman
from engine.trajectories.scoring.advantages import compute_advantages
from engine.trajectories.scoring.domains import DEFAULT_TABLE, DomainTable, infer
from engine.trajectories.scoring.fingerprint import fingerprint
from engine.trajectories.scoring.plasticity import TrainState, compute_triggers, evaluate_triggers
from engine.trajectories.scoring.signals import bash_errors, quality, score, score_many
from engine.trajectories.trajectory import Event, Scored, Trajectory

# --- the oracle -------------------------------------------------------------------------------


def reference_score(t: Trajectory) -> dict[str, Any]:
    """docs/reference/karl.md §3 transcribed literally, on the stored record: counts over all events,
    scans over 50."""
    # The record (§2.1).
    all_events = t.events
    total = len(all_events)
    failures = len([e for e in all_events if e.success is False])
    errors = len(
        [
            e
            for e in all_events
            if e.tool == "Bash" and (e.success is False or (e.exit_code is not None and e.exit_code != 0))
        ]
    )  # docs/reference/karl.md §12(b)
    counts: dict[str, int] = {}
    for e in all_events:
        counts[e.tool] = counts.get(e.tool, 0) + 1
    events = all_events[:50]
    n = len(events)
    duration = None if t.started_at is None or t.ended_at is None else t.ended_at - t.started_at
    comps: dict[str, float] = {}

    # 3.1 Outcome: o = clip(0.5 + Σ deltas).
    o = 0.5
    if t.correction is not None:
        o += -0.35 if t.correction else 0.35
        comps["r_no_correction"] = 0.0 if t.correction else 1.0
    if t.redo is not None:
        o += -0.25 if t.redo else 0.25
        comps["r_no_redo"] = 0.0 if t.redo else 1.0
    if t.build_success is not None:
        o += 0.20 if t.build_success else -0.10
        comps["r_build_pass"] = 1.0 if t.build_success else 0.0
    if t.session_continued is not None:
        o += 0.20 if t.session_continued else 0.0
        comps["r_session_continued"] = 1.0 if t.session_continued else 0.0
    comps["outcome_signals_available"] = float(len(comps))
    o = min(1, max(0, o))

    # 3.2 Process.
    if total == 0:
        p = 0.5
        comps.update(r_success_rate=0.5, r_bash_clean=1.0, r_error_density=1.0, r_temporal_weight=0.5)
    else:
        num = den = 0.0
        for i in range(n):
            w_i = 0.5 + i / max(n - 1, 1)
            den += w_i
            if events[i].success is not False:
                num += w_i
        success_rate = num / den if n > 0 else 0.5
        bash_count = len([e for e in events if e.tool == "Bash"])
        bash_clean = 1 - errors / bash_count if bash_count > 0 else 1.0
        m = run = 0
        for e in events:
            run = run + 1 if e.success is False else 0
            m = max(m, run)
        error_density = max(0, 1 - 0.15 * (m - 2)) if failures > 0 and m >= 3 else 1.0
        f_late = len([e for e in events[n - max(1, n // 4) :] if e.success is False])
        late_penalty = max(0, 1 - 0.15 * f_late) if n > 0 else 1.0
        p = min(
            1, max(0, 0.40 * success_rate + 0.25 * bash_clean + 0.20 * error_density + 0.15 * late_penalty)
        )
        comps.update(
            r_success_rate=success_rate,
            r_bash_clean=bash_clean,
            r_error_density=error_density,
            r_temporal_weight=late_penalty,
        )

    # 3.3 Efficiency.
    if total == 0:
        eff = 0.5
        comps.update(r_diversity=0.5, r_duration_eff=0.5, r_file_touch=0.5)
    else:
        u = len(counts)
        if u <= 1:
            diversity = 0.3
        else:
            h = 0.0
            for count in counts.values():
                p_t = count / total
                h -= p_t * math.log2(p_t)
            diversity = h / math.log2(u)
        if duration is None or not duration > 0:
            duration_eff = 0.5
        else:
            tpm = 60 * total / duration
            if 2 <= tpm <= 8:
                duration_eff = 1.0
            elif tpm > 8:
                duration_eff = 0.8
            elif 1 <= tpm < 2:
                duration_eff = 0.6
            else:
                duration_eff = max(0.2, 0.5 - 0.3 * (1 - tpm))
        mutations = counts.get("Write", 0) + counts.get("Edit", 0) + counts.get("NotebookEdit", 0)
        file_touch = min(1, mutations / max(0.3 * total, 1))
        eff = min(1, max(0, 0.35 * diversity + 0.35 * duration_eff + 0.30 * file_touch))
        comps.update(r_diversity=diversity, r_duration_eff=duration_eff, r_file_touch=file_touch)

    # 3.4 Verification, docs/reference/karl.md §12(a): v = 0.4·[test] + 0.3·[build] + 0.3·[read-after-write].
    if total == 0:
        v = 0.5
        comps.update(r_has_test=0.0, r_has_build=0.0, r_read_after_write=0.0)
    elif "Write" not in counts and "Edit" not in counts and "NotebookEdit" not in counts:
        v = 0.6
        comps.update(r_has_test=0.0, r_has_build=0.0, r_read_after_write=0.0, r_no_mutation=1.0)
    else:
        test = build = raw = False
        written: set[str] = set()
        for e in events:
            cmd = (e.params.get("command") or "").lower()
            if e.tool == "Bash" and any(
                k in cmd for k in ("pytest", "npm test", "bun test", "cargo test", "go test", "make test")
            ):
                test = True
            if e.tool == "Bash" and any(
                k in cmd for k in ("xcodebuild", "cargo build", "make ", "npm run build", "bun build")
            ):
                build = True
            path = e.params.get("file_path") or ""
            if e.tool in ("Write", "Edit") and path:
                written.add(path)
            if e.tool == "Read" and path and path in written:
                raw = True
        v = min(1, max(0, 0.4 * test + 0.3 * build + 0.3 * raw))
        comps.update(r_has_test=float(test), r_has_build=float(build), r_read_after_write=float(raw))

    # 3.5 Consistency.
    if total < 3:
        c = 0.6
        comps.update(r_read_before_write=0.5, r_no_thrashing=1.0)
    else:
        reads: set[str] = set()
        writes = writes_read = 0
        per_file: dict[str, int] = {}
        for e in events:
            path = e.params.get("file_path") or ""
            if e.tool == "Read" and path:
                reads.add(path)
            elif e.tool in ("Edit", "Write") and path:
                writes += 1
                if path in reads:
                    writes_read += 1
                per_file[path] = per_file.get(path, 0) + 1
        rbw = writes_read / writes if writes > 0 else 0.5
        thrash = len([f for f, edits in per_file.items() if edits >= 3])
        no_thrash = 1.0 if thrash == 0 else max(0, 1 - 0.2 * thrash)
        c = min(1, max(0, 0.6 * rbw + 0.4 * no_thrash))
        comps.update(r_read_before_write=rbw, r_no_thrashing=no_thrash)

    r = 0.30 * o + 0.25 * p + 0.15 * eff + 0.15 * v + 0.15 * c
    return {
        "reward": round(r, 4),
        "outcome": round(o, 4),
        "process": round(p, 4),
        "efficiency": round(eff, 4),
        "verification": round(v, 4),
        "consistency": round(c, 4),
        "components": {k: round(v, 4) for k, v in comps.items()},
    }


def reference_advantages(rewards: list[float], domains: list[str | None]) -> list[float]:
    """docs/reference/karl.md §4 with rule 12(c), literally: κ = 10, σ floor 0.02,
    domain σ only when n_d ≥ 5."""
    keys = [d if d else "_global" for d in domains]
    mu_g = sum(rewards) / len(rewards) if rewards else 0.5
    var_g = sum((r - mu_g) ** 2 for r in rewards) / len(rewards) if rewards else 0.04
    by_domain: dict[str, list[float]] = {}
    for r, d in zip(rewards, keys, strict=True):
        by_domain.setdefault(d, []).append(r)
    baseline: dict[str, float] = {}
    sigma: dict[str, float] = {}
    for d, mine in by_domain.items():
        n_d = len(mine)
        mu_d = sum(mine) / n_d
        baseline[d] = (n_d * mu_d + 10 * mu_g) / (n_d + 10)
        if n_d >= 5:
            sigma[d] = max(math.sqrt(sum((x - mu_d) ** 2 for x in mine) / n_d), 0.02)
        else:
            sigma[d] = max(math.sqrt(var_g), 0.02)
    return [round((r - baseline[d]) / sigma[d], 4) for r, d in zip(rewards, keys, strict=True)]


# --- helpers ------------------------------------------------------------------------------------


def ev(tool: str, ok: bool | None = True, exit_code: int | None = None, **params: str) -> Event:
    return Event(tool, ok, exit_code, params=dict(params))


def traj(events: list[Event], duration: float | None = None, **fields: Any) -> Trajectory:
    started = 1_000.0 if duration is not None else None
    ended = 1_000.0 + duration if duration is not None else None
    return Trajectory("u", "s", "karl", "test", started_at=started, ended_at=ended, events=events, **fields)


def same(a: Scored, b: dict[str, Any]) -> bool:
    heads = all(abs(getattr(a, k) - b[k]) <= 1e-9 for k in ("reward", *a.signals()))
    return (
        heads
        and a.components.keys() == b["components"].keys()
        and all(abs(a.components[k] - b["components"][k]) <= 1e-9 for k in a.components)
    )


# --- 3.1 outcome -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        ({}, 0.5),  # no signals: 0.5
        ({"correction": False}, 0.85),  # 0.5 + 0.35
        ({"correction": False, "session_continued": True}, 1.0),  # 0.5 + 0.35 + 0.20 = 1.05, clipped
        ({"correction": True, "session_continued": True}, 0.35),  # 0.5 − 0.35 + 0.20
        ({"redo": True, "build_success": False}, 0.15),  # 0.5 − 0.25 − 0.10
        ({"session_continued": False}, 0.5),  # continued=false adds 0
    ],
)
def test_outcome_examples(signals: dict[str, bool], expected: float) -> None:
    s = score(traj([ev("Read")], **signals))
    assert s.outcome == expected
    assert s.components["outcome_signals_available"] == len(signals)
    assert ("r_no_correction" in s.components) == ("correction" in signals)  # a null signal has no key


# --- 3.2 process ---------------------------------------------------------------------------------


def test_process_hand_computed() -> None:
    # n = 4: w = 0.5, 0.8333, 1.1667, 1.5 (Σ = 4); event 1 failed → success_rate = (4 − 0.8333) / 4 = 0.7917.
    # bash_errors = 1 (the failed Bash; the other has exit null), bash_count = 2 → bash_clean = 1 − 1/2.
    # longest failure run 1 → error_density 1.0; last max(1, 4//4) = 1 event ok → late_penalty 1.0.
    # P = 0.40·0.7917 + 0.25·0.5 + 0.20·1 + 0.15·1 = 0.7917
    t = traj(
        [
            ev("Read", file_path="a.py"),
            ev("Bash", False, 1, command="ls"),
            ev("Bash", True, None),
            ev("Edit", file_path="a.py"),
        ]
    )
    s = score(t)
    assert s.components["r_success_rate"] == 0.7917
    assert s.components["r_bash_clean"] == 0.5
    assert s.components["r_error_density"] == 1.0
    assert s.components["r_temporal_weight"] == 1.0
    assert s.process == 0.7917


def test_error_density_and_late_penalty() -> None:
    # 8 events, 5 consecutive failures at the end: m = 5 → error_density = 1 − 0.15·(5 − 2) = 0.55;
    # last ⌊8/4⌋ = 2 events both failed → late_penalty = 1 − 0.15·2 = 0.7.
    t = traj([ev("Read")] * 3 + [ev("Grep", False)] * 5)
    s = score(t)
    assert s.components["r_error_density"] == 0.55
    assert s.components["r_temporal_weight"] == 0.7
    # w_i = 0.5 + i/7; ok weights are i = 0..2 → (1.5 + 3/7) / 8 = 0.2411
    assert s.components["r_success_rate"] == round((1.5 + 3 / 7) / 8, 4)


def test_empty_trajectory_is_neutral() -> None:
    s = score(traj([]))
    # O 0.5, P 0.5, E 0.5, V 0.5, C 0.6 → R = 0.15 + 0.125 + 0.075 + 0.075 + 0.09 = 0.515
    assert (s.outcome, s.process, s.efficiency, s.verification, s.consistency) == (0.5, 0.5, 0.5, 0.5, 0.6)
    assert s.reward == 0.515


# --- docs/reference/karl.md §12(b): Bash errors -------------------------------------------------------------


def test_bash_error_rule() -> None:
    events = [
        ev("Bash", True, None),  # null exit code: never an error
        ev("Bash", None, None),  # unknown success, null exit: not an error
        ev("Bash", True, 0),  # clean
        ev("Bash", True, 2),  # known non-zero exit: error
        ev("Bash", False, None),  # failed call: error
        ev("Read", False, 1),  # not Bash: a failure, never a bash error
    ]
    t = traj(events)
    assert bash_errors(t) == 2
    # bash_clean = 1 − 2/5 = 0.6
    assert score(t).components["r_bash_clean"] == 0.6
    # error_rate = (failures 2 + bash_errors 2) / 6 = 0.667 → grade low; success_rate = 3/6
    q = quality(t)
    assert q == {
        "success_rate": 0.5,
        "error_rate": 0.667,
        "correction_count": 0,
        "tool_diversity": 2,
        "grade": "low",
    }


def test_quality_grades() -> None:
    assert quality(traj([ev("Read")] * 10))["grade"] == "high"
    assert quality(traj([ev("Read")] * 8 + [ev("Read", False)] * 2))["grade"] == "medium"  # 0.2 > 0.15


# --- 3.3 efficiency ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        (None, 0.5),  # missing duration
        (0.0, 0.5),  # non-positive
        (300.0, 1.0),  # 60·10/300 = 2 tools/min → band [2, 8]
        (60.0, 0.8),  # 10 tools/min > 8
        (400.0, 0.6),  # 1.5 tools/min in [1, 2)
        (1200.0, 0.35),  # 0.5 tools/min → max(0.2, 0.5 − 0.3·0.5)
        (6000.0, 0.23),  # 0.1 tools/min → max(0.2, 0.5 − 0.3·0.9) = 0.23
    ],
)
def test_duration_efficiency(duration: float | None, expected: float) -> None:
    s = score(traj([ev("Read")] * 10, duration))
    assert s.components["r_duration_eff"] == expected


def test_diversity_and_file_touch() -> None:
    # One tool: single-tool penalty 0.3. Read×5 + Edit×5: H = 1 bit over log2(2) = 1.0.
    assert score(traj([ev("Read")] * 4)).components["r_diversity"] == 0.3
    s = score(traj([ev("Read")] * 5 + [ev("Edit", file_path="x")] * 5))
    assert s.components["r_diversity"] == 1.0
    # file_touch = min(1, 5 / max(0.3·10, 1)) = 1.0; with one Edit in 10: 1/3
    assert s.components["r_file_touch"] == 1.0
    assert score(traj([ev("Read")] * 9 + [ev("Edit")])).components["r_file_touch"] == 0.3333
    # Read×3, Bash×1: p = 3/4, 1/4 → H = 0.8113, / log2 2
    assert score(traj([ev("Read")] * 3 + [ev("Bash")])).components["r_diversity"] == 0.8113


# --- 3.4 verification, docs/reference/karl.md §12(a) --------------------------------------------------------


def test_verification_signals() -> None:
    edit = ev("Edit", file_path="app.py")
    # no Write/Edit/NotebookEdit anywhere: V = 0.6, with r_no_mutation
    s = score(traj([ev("Read"), ev("Bash", command="pytest")]))
    assert s.verification == 0.6 and s.components["r_no_mutation"] == 1.0
    # V = 0.4·[test]: a failed test still counts
    assert score(traj([edit, ev("Bash", False, 1, command="python -m PYTEST -q")])).verification == 0.4
    # V = 0.3·[build]: "make " with its trailing space
    assert score(traj([edit, ev("Bash", command="make all")])).verification == 0.3
    assert score(traj([edit, ev("Bash", command="make")])).verification == 0.0
    # docs/reference/karl.md §12(a): read-after-write is worth the full 0.3 (published: 0.09)
    s = score(traj([edit, ev("Read", file_path="app.py")]))
    assert s.verification == 0.3 and s.components["r_read_after_write"] == 1.0
    assert "r_no_mutation" not in s.components
    # NotebookEdit is a mutation, but reading its notebook back is not read-after-write
    assert (
        score(traj([ev("NotebookEdit", file_path="n.ipynb"), ev("Read", file_path="n.ipynb")])).verification
        == 0
    )
    # all three: 0.4 + 0.3 + 0.3 = 1.0
    assert (
        score(
            traj([edit, ev("Read", file_path="app.py"), ev("Bash", command="cargo test && make build")])
        ).verification
        == 1.0
    )


# --- 3.5 consistency -------------------------------------------------------------------------------------


def test_consistency() -> None:
    # rbw: Edit a.py after reading it, Edit b.py without → 1/2; no thrash → C = 0.6·0.5 + 0.4·1 = 0.7
    t = traj([ev("Read", file_path="a.py"), ev("Edit", file_path="a.py"), ev("Edit", file_path="b.py")])
    assert score(t).consistency == 0.7
    # a.py edited 3 times → thrash 1 → no_thrash 0.8; rbw 1 → C = 0.6 + 0.32 = 0.92
    t = traj([ev("Read", file_path="a.py")] + [ev("Edit", file_path="a.py")] * 3)
    s = score(t)
    assert (s.components["r_no_thrashing"], s.consistency) == (0.8, 0.92)
    # fewer than 3 tools: 0.6
    assert score(traj([ev("Edit", file_path="a.py")] * 2)).consistency == 0.6
    # no Edit/Write with a path: rbw 0.5 → C = 0.3 + 0.4 = 0.7
    assert score(traj([ev("Read")] * 3)).consistency == 0.7


# --- the >50 events split ------------------------------------------------------------------------------


def test_counts_cover_all_events_scans_only_fifty() -> None:
    # 49 Reads + 1 Bash stored, then 10 failed Bash beyond the cut: bash_errors = 10 (all events) but
    # bash_count = 1 (stored) → bash_clean = 1 − 10/1 = −9, unclipped; the stored events all succeeded.
    t = traj([ev("Read")] * 49 + [ev("Bash", command="ls")] + [ev("Bash", False, 1, command="pytest")] * 10)
    s = score(t)
    assert s.components["r_bash_clean"] == -9.0
    assert s.components["r_success_rate"] == 1.0
    assert s.components["r_error_density"] == 1.0  # the failure run lies beyond the 50
    assert s.components["r_temporal_weight"] == 1.0
    # P = clip(0.4 + 0.25·(−9) + 0.2 + 0.15) = 0
    assert s.process == 0.0
    # a mutation beyond the cut leaves the no-mutation branch, a test beyond it is not seen
    t = traj([ev("Read")] * 50 + [ev("Edit", file_path="a.py"), ev("Bash", command="pytest")])
    s = score(t)
    assert s.verification == 0.0 and "r_no_mutation" not in s.components
    # diversity uses tool_counts over all 52 events
    assert s.components["r_diversity"] == round(
        -(50 / 52 * math.log2(50 / 52) + 2 * (1 / 52) * math.log2(1 / 52)) / math.log2(3), 4
    )


# --- the batch path against the oracle ------------------------------------------------------------------

PATHS = st.sampled_from(["a.py", "b.py", "src/c.ts", "", "docs/x.md"])
COMMANDS = st.sampled_from(["pytest -q", "make build", "ls", "NPM TEST", "cargo build", "git status", "make"])


@st.composite
def events_strategy(draw: st.DrawFn) -> Event:
    tool = draw(
        st.sampled_from(["Read", "Edit", "Write", "Bash", "Grep", "NotebookEdit", "Glob", "TaskUpdate"])
    )
    params: dict[str, str] = {}
    if tool in ("Read", "Edit", "Write", "NotebookEdit") and draw(st.booleans()):
        params["file_path"] = draw(PATHS)
    if tool == "Bash" and draw(st.booleans()):
        params["command"] = draw(COMMANDS)
    return Event(
        tool,
        draw(st.sampled_from([True, False, None])),
        draw(st.sampled_from([None, 0, 1, 127])),
        params=params,
    )


@st.composite
def trajectories_strategy(draw: st.DrawFn) -> Trajectory:
    size = draw(st.one_of(st.integers(0, 8), st.integers(45, 70)))
    events = draw(st.lists(events_strategy(), min_size=size, max_size=size))
    start = draw(st.one_of(st.none(), st.floats(0, 1e9)))
    length = draw(st.one_of(st.none(), st.floats(-10, 5_000), st.sampled_from([0.0, 30.0, 60.0])))
    signal = st.sampled_from([None, True, False])
    return Trajectory(
        "u",
        "s",
        "karl",
        "h",
        started_at=start,
        ended_at=None if start is None or length is None else start + length,
        events=events,
        correction=draw(signal),
        redo=draw(signal),
        build_success=draw(signal),
        session_continued=draw(signal),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(trajectories_strategy(), min_size=1, max_size=12))
def test_batch_equals_score_equals_oracle(ts: list[Trajectory]) -> None:
    batch = score_many(ts)
    for t, fast in zip(ts, batch, strict=True):
        slow = score(t)
        oracle = reference_score(t)
        assert same(fast, oracle), (fast, oracle)
        assert same(slow, oracle), (slow, oracle)


def test_batch_handles_empty_and_mixed_sizes() -> None:
    assert score_many([]) == []
    ts = [traj([]), traj([ev("Read")] * 120), traj([ev("mcp__x__y", None)] * 3, 30.0)]
    assert score_many(ts) == [score(t) for t in ts]


def test_batch_across_chunks() -> None:
    from engine.trajectories.scoring import signals

    rng = np.random.default_rng(7)
    tools = ["Read", "Edit", "Bash", "Write", "Grep"]
    ts = [
        traj(
            [
                ev(
                    tools[k],
                    bool(rng.random() > 0.2),
                    int(rng.integers(0, 2)),
                    file_path=f"f{k % 3}",
                    command="pytest" if k == 2 else "ls",
                )
                for k in rng.integers(0, 5, size=int(rng.integers(0, 60)))
            ],
            float(rng.integers(1, 900)),
            correction=bool(rng.random() > 0.5),
        )
        for _ in range(signals.CHUNK_TRAJECTORIES * 2 + 7)
    ]
    assert score_many(ts) == [score(t) for t in ts]


# --- 4 advantages, docs/reference/karl.md §12(c) ------------------------------------------------------------


def test_advantages_smoothing_and_small_domains() -> None:
    rewards = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 0.2])
    domains = ["a"] * 5 + [None]
    adv, table = compute_advantages(rewards, domains)
    mu_g = 3.7 / 6
    # a: n = 5 → b = (5·0.7 + 10·μ_g) / 15, σ = popstd(a) = √0.02
    assert table["a"].baseline == pytest.approx((3.5 + 10 * mu_g) / 15)
    assert table["a"].sigma == pytest.approx(math.sqrt(0.02))
    # _global (None): n = 1 < 5 → global σ about μ_g
    sigma_g = math.sqrt(sum((r - mu_g) ** 2 for r in rewards) / 6)
    assert table["_global"].sigma == pytest.approx(sigma_g)
    assert table["_global"].baseline == pytest.approx((0.2 + 10 * mu_g) / 11)
    assert adv[5] == round((0.2 - (0.2 + 10 * mu_g) / 11) / sigma_g, 4)
    assert adv.tolist() == reference_advantages(rewards.tolist(), domains)
    assert table["a"].n == 5 and table["a"].mean == pytest.approx(0.7)


def test_advantage_sigma_floor_and_empty_domain() -> None:
    rewards = np.array([0.6] * 6 + [0.61])
    adv, table = compute_advantages(rewards, ["d"] * 6 + [""])
    assert table["d"].sigma == 0.02  # popstd 0 → floor
    assert "_global" in table  # "" buckets as _global
    assert adv.tolist() == reference_advantages(rewards.tolist(), ["d"] * 6 + [""])
    assert compute_advantages(np.zeros(0), [])[0].size == 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.sampled_from([None, "", "a", "b", "c"])), min_size=1, max_size=40)
)
def test_advantages_match_reference(pairs: list[tuple[float, str | None]]) -> None:
    rewards = [r for r, _ in pairs]
    domains = [d for _, d in pairs]
    adv, _ = compute_advantages(np.array(rewards), domains)
    np.testing.assert_allclose(adv, reference_advantages(rewards, domains), atol=1e-4 + 1e-9)


# --- 8 domains, docs/reference/karl.md §12(f) ---------------------------------------------------------------


def test_domain_defaults() -> None:
    t = traj(
        [
            ev("Edit", file_path="/x/app/main.py"),
            ev("Bash", command="pytest -q"),
            ev("Read", file_path="README.md"),
        ]
    )
    assert infer(t) == ("python-dev", "python")
    t = traj([ev("Edit", file_path="src/lib.rs"), ev("Bash", command="cargo build")])
    assert infer(t) == ("rust-dev", "rust")
    assert infer(traj([ev("Write", file_path="deploy/Dockerfile")])) == ("deploy-ops", "infra")
    assert infer(traj([ev("Read")])) == (None, None)  # no evidence: _global
    assert infer(traj([ev("Read")], skill="mine")) == ("mine", None)  # explicit skill kept
    # ties go to the entry listed first: one .swift, one .py → ios is listed before python
    assert infer(traj([ev("Read", file_path="a.swift"), ev("Read", file_path="b.py")])) == (
        "ios-build",
        "ios",
    )
    # the repository name and the prompt are evidence too
    assert DEFAULT_TABLE.classify(["supabase-dashboard"]) == ("supabase-ops", "data")


def test_default_table_is_portable() -> None:
    patterns = " ".join(e.pattern.pattern for e in DEFAULT_TABLE.entries)
    assert not re.search(r"/Users/|/home/|~/|\.local\b|Desktop", patterns)


def test_domain_user_entries_and_override() -> None:
    table = DomainTable.from_config([{"pattern": r"^billing-", "skill": "billing", "domain": "payments"}])
    t = traj([ev("Edit", file_path="a.py")], git_repo="billing-api")
    assert table.infer(t) == ("billing", "payments")  # 1 vs 1: user entries come first, win the tie
    only = DomainTable.from_config([{"pattern": "zzz", "skill": "z", "domain": "z"}], replace_defaults=True)
    assert only.infer(traj([ev("Edit", file_path="a.py")])) == (None, None)


def test_domain_bad_regex_message() -> None:
    with pytest.raises(ValueError, match=r"^domain table entry 1: bad pattern '\(unclosed': ") as err:
        DomainTable.from_config(
            [
                {"pattern": "ok", "skill": "s", "domain": "d"},
                {"pattern": "(unclosed", "skill": "s", "domain": "d"},
            ]
        )
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="entry 0"):
        DomainTable.from_config([{"pattern": "x", "skill": "s"}])


# --- 7 fingerprint ---------------------------------------------------------------------------------------


def test_fingerprint() -> None:
    t = traj(
        [
            ev("Read", file_path="/r/src/a.py"),  # R
            ev("Grep", pattern="foo"),  # R
            ev("Edit", file_path="/r/src/a.py"),  # M
            ev("Bash", False, 1, command="pytest"),  # X, failure streak 1 ...
            ev("Bash", False, 1, command="pytest"),  # ... continues
            ev("Edit", file_path="/r/src/b.py"),  # M: recovers
            ev("Bash", True, 0, command="npm run lint"),  # X
            ev("Bash", False, 1, command="ls"),  # X, streak 2, never recovered
        ]
    )
    fp = fingerprint(t)
    assert fp["tool_flow"] == ["RR", "RM", "MX", "XX", "XM"]
    assert fp["mutation_depth"] == 2 and fp["modified_files"] == ["/r/src/a.py", "/r/src/b.py"]
    assert fp["research_count"] == 2 and fp["mutation_count"] == 2 and fp["total_events"] == 8
    assert fp["research_ratio"] == 0.25
    assert fp["verification"] is True
    assert fp["recovery_score"] == 0.5  # 2 streaks, 1 recovered
    # paths split on "/": ["", "r", "src", "x.py"] ×3 → common prefix 3 / mean depth 4
    assert fp["scope_coherence"] == 0.75
    assert fp["signature"] == "R2M2VYE0.5"
    assert fingerprint(traj([]))["signature"] == "R0M0VNE0.0"
    assert fingerprint(traj([ev("Read"), ev("Bash", command="pytest")]))["verification"] is None


# --- 9 plasticity ---------------------------------------------------------------------------------------


def test_plasticity_triggers() -> None:
    now = 1_000_000.0
    rewards = np.array([0.9] * 40 + [0.4] * 20)
    domains = ["web"] * 40 + ["python"] * 20
    stamps = np.array([now - 10 * 86_400.0] * 40 + [now - 3_600.0] * 20)  # only python is recent
    _, baselines = compute_advantages(rewards, domains)
    never = compute_triggers(now, TrainState(), rewards, domains, stamps, baselines)
    assert never.kinds == ["stale", "volume", "drift", "coverage"]
    assert never.fired[0].detail == "never trained"
    # μ_g = 44/60; python baseline = (20·0.4 + 10·μ_g) / 30 = 0.5111; recent mean 0.4 → drift 0.1111 > 0.08
    python_drift = (20 * 0.4 + 10 * 44 / 60) / 30 - 0.4
    assert never.fired[2].drift == {"python": pytest.approx(python_drift)}
    assert never.drift.global_drift == pytest.approx(python_drift)
    assert "0.111" in never.fired[2].detail
    fresh = TrainState(ts=now - 3_600.0, count=60, domains=frozenset({"web", "python"}))
    calm = {"python": replace(baselines["python"], baseline=0.45)}  # drift 0.05 <= 0.08
    quiet = compute_triggers(now, fresh, rewards, domains, stamps, calm)
    assert quiet.fired == [] and not quiet.should_retrain
    assert quiet.drift.per_domain["python"] == pytest.approx(0.05)
    old = TrainState(ts=now - 73 * 3_600.0, count=10, domains=frozenset({"web"}))
    fired = compute_triggers(now, old, rewards, domains, np.full(60, np.nan), baselines)
    assert fired.kinds == ["stale", "volume", "coverage"]  # unknown timestamps: no drift data
    assert fired.drift.global_drift is None
    assert "73.0 h" in fired.fired[0].detail and "50 new" in fired.fired[1].detail
    assert "python (20)" in fired.fired[2].detail
    # the plain-values entry point, with baselines as the store keeps them (domain -> value)
    plain = evaluate_triggers(
        now=now,
        rewards=rewards,
        domains=domains,
        timestamps=stamps,
        baselines={"python": 0.45},
        last_train_ts=now - 60.0,
        last_train_count=60,
        trained_domains={"web", "python"},
    )
    assert plain == []
    assert [
        t.kind
        for t in evaluate_triggers(now=now, rewards=rewards, domains=domains, timestamps=stamps, baselines={})
    ] == ["stale", "volume", "drift", "coverage"]


# --- 11 ablation ----------------------------------------------------------------------------------------


def test_spearman_average_ranks() -> None:
    assert average_ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)


def test_ablation_dominant_signal() -> None:
    rng = np.random.default_rng(3)
    n = 200
    m = np.column_stack(
        [
            np.full(n, 0.5),  # outcome constant: dropping it changes nothing
            rng.random(n),  # process: wide spread, drives the ranking
            0.5 + 0.01 * rng.random(n),
            0.5 + 0.01 * rng.random(n),
            0.5 + 0.01 * rng.random(n),
        ]
    )
    rows = ablate(m)
    assert rows[0].signal == "process"
    assert rows[0].impact > 0.5
    outcome = next(r for r in rows if r.signal == "outcome")
    assert (
        outcome.rho == pytest.approx(1.0) and outcome.overlap == 20 and outcome.impact == pytest.approx(0.0)
    )
    table = format_table(rows)
    assert table.splitlines()[1].startswith("process")
