"""`carl trajectories ablate --paper FILE`: KARL's published ablation table (docs/reference/karl.md §11)
rebuilt from the signals stored in a KARL record file, beside our scorer's. Two shapes, told apart per record:
the recorder's per-turn records (signals as `outcome.<signal>_score`, docs/reference/karl.md §2) and the
published 290-record file (whole sessions, signals in `outcome.signals`, docs/reference/karl.md §11, scored by
the simplified scorer of §13 item 8).

The expected numbers are computed here independently, in exact rational arithmetic: exact scores, ranks
by counting (ties share the mean of their positions), Pearson of the ranks, top-20 by sorting
(score descending, earlier record first), impact = (1 − ρ) + (20 − overlap) / 20.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cli import main as carl_main
from engine.trajectories.ablation.karl import Side, format_paper_ablation, paper_ablation
from engine.trajectories.ablation.leave_one_out import renormalised
from engine.trajectories.importers.karl_records import record_to_trajectory
from engine.trajectories.scoring.signals import score_many

SIGNALS = ("outcome", "process", "efficiency", "verification", "consistency")
PAPER_WEIGHTS = {
    "outcome": "0.30",
    "process": "0.25",
    "efficiency": "0.15",
    "verification": "0.15",
    "consistency": "0.15",
}


# --- an independent oracle -------------------------------------------------------------------------------


def exact_weights(drop: str | None = None) -> list[Fraction]:
    w = [Fraction(PAPER_WEIGHTS[s]) if s != drop else Fraction(0) for s in SIGNALS]
    return [x / sum(w) for x in w]


def exact_scores(rows: list[list[float]], weights: list[Fraction]) -> list[Fraction]:
    return [
        sum((Fraction(str(v)) * w for v, w in zip(row, weights, strict=True)), Fraction(0)) for row in rows
    ]


def mean_ranks(xs: list[Fraction]) -> list[float]:
    """Rank 1 = smallest; k tied values at positions p+1..p+k all get p + (k + 1) / 2."""
    out = []
    for x in xs:
        below = sum(1 for y in xs if y < x)
        equal = sum(1 for y in xs if y == x)
        out.append(below + (equal + 1) / 2)
    return out


def ordinal_ranks(xs: list[Fraction]) -> list[float]:
    """Ties broken by position: what a naive argsort-of-argsort gives."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], i))
    out = [0.0] * len(xs)
    for rank, i in enumerate(order, start=1):
        out[i] = float(rank)
    return out


def pearson(a: list[float], b: list[float]) -> float:
    return float(np.corrcoef(np.array(a), np.array(b))[0, 1])


def top(xs: list[Fraction], k: int) -> set[int]:
    return set(sorted(range(len(xs)), key=lambda i: (-xs[i], i))[:k])


def expected_table(rows: list[list[float]], k: int = 20) -> dict[str, tuple[float, int, float]]:
    full = exact_scores(rows, exact_weights())
    k = min(k, len(rows))
    table = {}
    for s in SIGNALS:
        ablated = exact_scores(rows, exact_weights(drop=s))
        rho = pearson(mean_ranks(full), mean_ranks(ablated))
        overlap = len(top(full, k) & top(ablated, k))
        table[s] = (rho, overlap, (1 - rho) + (k - overlap) / k)
    return table


def assert_rows(side: Side, want: dict[str, tuple[float, int, float]]) -> None:
    """Each signal's row on that side of the table is the oracle's."""
    for s, (rho, overlap, impact) in want.items():
        got = side.row(s)
        assert got.rho == pytest.approx(rho, abs=1e-12), s
        assert got.overlap == overlap, s
        assert got.impact == pytest.approx(impact, abs=1e-12), s


# --- records in the recorder's shape (docs/reference/karl.md §2) --------------------------------------------


def event(tool: str, ok: bool | None = True, exit_code: int | None = None, **params: str) -> dict[str, Any]:
    return {
        "tool_name": tool,
        "key_params": params,
        "success": ok,
        "exit_code": exit_code,
        "duration_ms": 40.0,
        "ts": "2026-01-10T09:00:05Z",
    }


# Three sessions whose signals under OUR scorer are worked out by hand below.
CLEAN_FIX = {
    "events": [
        event("Read", file_path="src/a.py"),
        event("Edit", file_path="src/a.py"),
        event("Bash", exit_code=0, command="pytest -q"),
        event("Read", file_path="src/a.py"),
    ],
    "flags": {
        "correction_detected": False,
        "redo_detected": False,
        "build_success": None,
        "session_continued": True,
    },
    "duration": 120,
}
LOOK_AROUND = {  # Bash calls without exit codes: errors under the published rule, not under 12(b)
    "events": [
        event("Bash", command="ls"),
        event("Bash", command="git status"),
        event("Grep", pattern="TODO"),
    ],
    "flags": {
        "correction_detected": None,
        "redo_detected": None,
        "build_success": None,
        "session_continued": None,
    },
    "duration": 60,
}
FAILING = {
    "events": [
        event("Edit", False, file_path="src/b.py"),
        *[event("Bash", False, 2, command="make build")] * 3,
    ],
    "flags": {
        "correction_detected": True,
        "redo_detected": False,
        "build_success": False,
        "session_continued": True,
    },
    "duration": None,
}


SESSIONS = {
    "clean": CLEAN_FIX,
    "clean_slow": {**CLEAN_FIX, "duration": 600},  # 4 tools in 10 minutes
    "look": LOOK_AROUND,
    "look_on": {
        **LOOK_AROUND,
        "flags": {**LOOK_AROUND["flags"], "correction_detected": False, "session_continued": True},
    },
    "failing": FAILING,
}
KINDS = tuple(SESSIONS)


def ours_by_hand() -> dict[str, list[float]]:
    """Our scorer's five signals (docs/reference/karl.md §3 + rules 12(a), 12(b)) for each session,
    rounded as stored."""
    h = lambda *p: -sum(x * math.log2(x) for x in p)  # noqa: E731  (Shannon entropy, bits)
    clean = [
        1.0,  # O: 0.5 + 0.35 + 0.25 + 0.20, clipped
        1.0,  # P: nothing failed
        0.35 * h(0.5, 0.25, 0.25) / math.log2(3) + 0.35 * 1.0 + 0.30 * (1 / 1.2),  # E: 4 tools in 2 min
        0.4 + 0.3,  # V: a test, and a Read of the edited file at full weight (12(a); published 0.49)
        0.6 * 1.0 + 0.4 * 1.0,  # C: the edit came after a read
    ]
    slow_pace = max(0.2, 0.5 - 0.3 * (1 - 0.4))  # 0.4 tools a minute
    clean_slow = [
        1.0,
        1.0,
        0.35 * h(0.5, 0.25, 0.25) / math.log2(3) + 0.35 * slow_pace + 0.30 / 1.2,
        0.7,
        1.0,
    ]
    look = [
        0.5,
        1.0,
        0.35 * h(2 / 3, 1 / 3) + 0.35 * 1.0 + 0.0,
        0.6,
        0.6 * 0.5 + 0.4,
    ]  # P 1.0: docs/reference/karl.md §12(b)
    look_on = [1.0, *look[1:]]  # 0.5 + 0.35 + 0.20, clipped
    failing = [
        0.5 - 0.35 + 0.25 - 0.10 + 0.20,
        0.20 * (1 - 0.15 * 2) + 0.15 * (1 - 0.15),  # all 4 failed (a run of 4), the last one too
        0.35 * h(0.25, 0.75) + 0.35 * 0.5 + 0.30 * (1 / 1.2),  # no duration: pace 0.5
        0.3,  # "make build" is a build
        0.6 * 0.0 + 0.4 * 1.0,  # an edit with no read before it
    ]
    raw = {"clean": clean, "clean_slow": clean_slow, "look": look, "look_on": look_on, "failing": failing}
    return {kind: [round(x, 4) for x in signals] for kind, signals in raw.items()}


def kinds_for(n: int, seed: int = 24) -> list[str]:
    return [str(k) for k in np.random.default_rng(seed).choice(KINDS, n)]


def weighted_reward(signals: list[float]) -> float:
    exact = sum(Fraction(str(v)) * Fraction(PAPER_WEIGHTS[s]) for s, v in zip(SIGNALS, signals, strict=True))
    return round(float(exact), 4)


def record(
    i: int, signals: list[float], kind: str = "clean", *, reward: float | None = None, omit: str | None = None
) -> dict[str, Any]:
    session = SESSIONS[kind]
    events = session["events"]
    counts: dict[str, int] = {}
    for e in events:
        counts[e["tool_name"]] = counts.get(e["tool_name"], 0) + 1
    scores = {f"{s}_score": v for s, v in zip(SIGNALS, signals, strict=True)}
    if reward is None:
        reward = weighted_reward(signals)
    outcome = {
        "annotation_status": "scored",
        **session["flags"],
        "reward_score": reward,
        "reward_components": {},
        **scores,
        "advantage": round((reward - 0.63495) / 0.09530, 4),
    }
    if omit:
        del outcome[omit]
    timing = {"started_at": "2026-01-10T09:00:00Z"}
    if session["duration"] is not None:
        timing |= {
            "ended_at": f"2026-01-10T09:{session['duration'] // 60:02d}:{session['duration'] % 60:02d}Z",
            "duration_s": float(session["duration"]),
        }
    return {
        "id": f"traj_{i:08x}_1768035600",
        "session_id": f"{i:08x}-0000-4000-8000-000000000000",
        "channel": "live",
        "recorded_at": timing.get("ended_at", "2026-01-10T09:00:00Z"),
        "skill": {"name": None, "domain": "unknown"},
        "context": {"prompt_text": f"session {i}", "cwd": "/home/dev/proj", "git_repo": "proj"},
        "trajectory": {
            "tool_sequence": [e["tool_name"] for e in events],
            "tool_counts": counts,
            "total_tools": len(events),
            "successes": sum(e["success"] is True for e in events),
            "failures": sum(e["success"] is False for e in events),
            "bash_errors": 0,
            "events": events,
        },
        "outcome": outcome,
        "timing": timing,
        "quality": {
            "success_rate": 1.0,
            "error_rate": 0.0,
            "correction_count": 0,
            "tool_diversity": len(counts),
            "grade": "high",
        },
    }


def records_of(rows: list[list[float]]) -> list[dict[str, Any]]:
    """One record per signal row, its session drawn from the hand-scored kinds."""
    return [record(i, r, k) for i, (r, k) in enumerate(zip(rows, kinds_for(len(rows)), strict=True))]


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def simplified_signals(rng: np.random.Generator, n: int) -> list[list[float]]:
    """Signals as the paper's simplified scorer produced them (docs/reference/karl.md §13 item 8)."""
    return [
        [
            float(rng.choice([0.4, 0.7])),
            round(float(rng.uniform(0.6, 1.0)), 4),
            round(float(rng.uniform(0.2, 1.0)), 4),
            float(rng.choice([0.3, 0.7])),
            float(rng.choice([0.4, 0.8])),
        ]
        for _ in range(n)
    ]


# --- records in the published file's shape (docs/reference/karl.md §11) -------------------------------------

TOOLS = ("Bash", "Read", "Edit", "Grep", "Glob", "Write")
# Mostly short sessions over few tools, so that tool-count distributions (and so efficiencies) repeat; some
# long ones, past the 50 stored events.
TOTALS = (1, 2, 2, 3, 3, 4, 4, 5, 6, 8, 12, 30, 75, 199)
T_FIRST = 1767258000  # 2026-01-01T09:00:00Z


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def normalised_entropy(counts: Counter[str]) -> float:
    """§11: the tool counts' Shannon entropy over log2 of the number of tools; 0 for a single tool."""
    if len(counts) < 2:
        return 0.0
    total = sum(counts.values())
    h = -sum(c / total * math.log2(c / total) for c in counts.values())
    return h / math.log2(len(counts))


def published_record(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """One whole session as the paper's file keeps it, scored by the simplified scorer (§13 item 8):
    process = successes / total, efficiency = normalised tool entropy, outcome 0.7 when more than half the
    calls succeeded (else 0.4), verification 0.3 or 0.7, consistency 0.4 or 0.8; R = Σ w·signal unrounded.
    The advantage is filled in by `published_records` (a z-score over the whole file)."""
    total = int(rng.choice(TOTALS))
    kinds = rng.choice(TOOLS, size=int(rng.integers(1, 4)), replace=False)
    sequence = [str(rng.choice(kinds)) for _ in range(total)]
    failed: set[int] = set()
    if rng.random() < 0.35:
        failed = set(rng.choice(total, size=int(rng.integers(0, total + 1)), replace=False).tolist())
    events = [
        {
            "tool_name": tool,
            "success": j not in failed,
            "exit_code": (1 if j in failed else 0) if tool == "Bash" and rng.random() < 0.5 else None,
        }
        for j, tool in enumerate(sequence)
    ]
    counts = Counter(sequence)
    successes = total - len(failed)
    signals = {
        "outcome": 0.7 if successes / total > 0.5 else 0.4,
        "process": round(successes / total, 4),
        "efficiency": round(normalised_entropy(counts), 4),
        "verification": 0.7 if rng.random() < 0.08 else 0.3,
        "consistency": 0.8 if rng.random() < 0.11 else 0.4,
    }
    reward = sum(float(PAPER_WEIGHTS[name]) * signals[name] for name in SIGNALS)
    first = T_FIRST + 3600 * i
    return {
        "id": f"traj_{i:012x}",
        "session_id": f"{i:08x}-1111-4000-8000-000000000000",
        "skill": {"domain": "unknown" if rng.random() < 0.8 else "infra"},
        "trajectory": {
            "tool_sequence": sequence,
            "tool_counts": dict(counts),
            "total_tools": total,
            "successes": successes,
            "failures": len(failed),
            "bash_errors": sum(e["tool_name"] == "Bash" and e["exit_code"] != 0 for e in events),
            "events": events[:50],
        },
        "context": {"git_repo": f"repo-{i % 7}"},
        "timing": {
            "num_prompts": int(rng.integers(1, 30)),
            "first": iso(first),
            "last": iso(first + int(rng.integers(60, 3000))),
        },
        "outcome": {"reward_score": reward, "signals": signals, "advantage": None},
    }


def published_records(rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    """n records, each advantage the global z-score of its reward (population sd), to 4 decimals (§11)."""
    records = [published_record(i, rng) for i in range(n)]
    rewards = np.array([r["outcome"]["reward_score"] for r in records])
    for r in records:
        r["outcome"]["advantage"] = round((r["outcome"]["reward_score"] - rewards.mean()) / rewards.std(), 4)
    return records


def stored_row(r: dict[str, Any]) -> list[float]:
    """The five stored signals of a record of either shape."""
    outcome = r["outcome"]
    if "signals" in outcome:
        return [outcome["signals"][name] for name in SIGNALS]
    return [outcome[f"{name}_score"] for name in SIGNALS]


# --- (1) the ablation arithmetic ---------------------------------------------------------------------------


def test_paper_table_matches_hand_computation(tmp_path: Path) -> None:
    rows = simplified_signals(np.random.default_rng(12), 25)
    kinds = kinds_for(25)
    path = write_records(tmp_path / "ablation.jsonl", [record(i, r, kinds[i]) for i, r in enumerate(rows)])
    result = paper_ablation(path)
    assert result.records == 25 and result.top_k == 20
    assert result.tool_calls == sum(len(SESSIONS[k]["events"]) for k in kinds)

    want = expected_table(rows)
    assert_rows(result.paper, want)
    assert [r.signal for r in result.paper.rows] == sorted(SIGNALS, key=lambda s: -want[s][2])
    assert any(o < 20 for _, o, _ in want.values())  # the case exercises the overlap term
    assert min(r for r, _, _ in want.values()) < 0.99  # and the correlation term

    # Our side: the same records re-scored by our scorer, whose signals are known by hand.
    by_hand = ours_by_hand()
    ours_rows = [by_hand[k] for k in kinds]
    ours_want = expected_table(ours_rows)
    assert min(o for _, o, _ in ours_want.values()) < 20 and min(r for r, _, _ in ours_want.values()) < 0.99
    assert_rows(result.ours, ours_want)
    for j, s in enumerate(SIGNALS):
        assert result.ours.signal_means[s] == pytest.approx(np.mean([r[j] for r in ours_rows]), abs=1e-12)
        assert result.paper.signal_means[s] == pytest.approx(np.mean([r[j] for r in rows]), abs=1e-12)

    stored = np.array([weighted_reward(r) for r in rows])
    assert result.paper.reward["mean"] == pytest.approx(stored.mean())
    assert result.paper.reward["sd"] == pytest.approx(np.sqrt(((stored - stored.mean()) ** 2).mean()))
    assert (result.paper.reward["min"], result.paper.reward["max"]) == (stored.min(), stored.max())
    assert result.paper.reward_source == "outcome.reward_score" and result.reward_gap < 1e-4


def test_small_case_by_hand(tmp_path: Path) -> None:
    """Five records and top-2 sets, small enough to check on paper.
    Full scores: r0 0.535, r1 0.745, r2 0.705, r3 0.660, r4 0.555 -> top-2 {r1, r2}.
    Without outcome (×0.70): r0 0.235, r1 0.625, r2 0.405, r3 0.540, r4 0.345 -> top-2 {r1, r3}."""
    rows = [
        [1.0, 0.4, 0.2, 0.3, 0.4],
        [0.4, 1.0, 1.0, 0.7, 0.8],
        [1.0, 0.9, 0.5, 0.3, 0.4],
        [0.4, 0.9, 0.6, 0.7, 0.8],
        [0.7, 0.6, 0.6, 0.3, 0.4],
    ]
    path = write_records(tmp_path / "five.jsonl", [record(i, r) for i, r in enumerate(rows)])
    result = paper_ablation(path, k=2)
    assert result.top_k == 2
    outcome = result.paper.row("outcome")
    # ranks (1 = lowest), full: r0 1, r4 2, r3 3, r2 4, r1 5; without outcome: r0 1, r4 2, r2 3, r3 4, r1 5
    d2 = (3 - 4) ** 2 + (4 - 3) ** 2  # no ties: ρ = 1 − 6·Σd² / (n(n² − 1))
    assert outcome.rho == pytest.approx(1 - 6 * d2 / (5 * 24))  # 0.9
    assert outcome.overlap == 1
    assert outcome.impact == pytest.approx(0.1 + 0.5)


# --- (2) renormalised weights ------------------------------------------------------------------------------


def test_renormalised_weights() -> None:
    w = [0.30, 0.25, 0.15, 0.15, 0.15]
    without_outcome = renormalised(w, 0)
    assert without_outcome.tolist() == pytest.approx(
        [0.0, 0.25 / 0.70, 0.15 / 0.70, 0.15 / 0.70, 0.15 / 0.70]
    )
    for j in range(5):
        r = renormalised(w, j)
        assert r.sum() == pytest.approx(1.0) and r[j] == 0.0
        kept = [i for i in range(5) if i != j]
        assert (r[kept] / np.array(w)[kept]) == pytest.approx(np.full(4, 1 / (1 - w[j])))
    assert w == [0.30, 0.25, 0.15, 0.15, 0.15]  # the caller's list is left alone


def test_json_reports_the_renormalised_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rows = simplified_signals(np.random.default_rng(5), 22)
    path = write_records(
        tmp_path / "a.jsonl",
        records_of(rows),
    )
    assert carl_main(["trajectories", "ablate", "--paper", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for row in data["rows"]:
        exact = exact_weights(drop=row["signal"])
        assert [row["weights_without"][s] for s in SIGNALS] == pytest.approx(
            [float(x) for x in exact], abs=1e-15
        )


# --- (3) ties -------------------------------------------------------------------------------------------


def test_ties_take_average_ranks(tmp_path: Path) -> None:
    """Identical signal rows, and rows equal only in exact arithmetic (verification and consistency share
    the weight 0.15, so V 0.7 / C 0.4 ties with V 0.3 / C 0.8), are tied in both rankings."""
    base = [
        [0.7, 0.9, 0.5, 0.7, 0.4],
        [0.7, 0.9, 0.5, 0.3, 0.8],
        [0.4, 0.9, 0.5, 0.7, 0.4],
        [0.7, 0.6, 0.8, 0.3, 0.4],
        [0.4, 0.6, 0.8, 0.3, 0.4],
        [0.7, 0.9, 0.5, 0.7, 0.4],
    ]
    rows = [base[i % len(base)] for i in range(24)]
    path = write_records(tmp_path / "ties.jsonl", [record(i, r) for i, r in enumerate(rows)])
    result = paper_ablation(path)
    full = exact_scores(rows, exact_weights())
    assert len(set(full)) < len(full)
    for s in SIGNALS:
        ablated = exact_scores(rows, exact_weights(drop=s))
        want = pearson(mean_ranks(full), mean_ranks(ablated))
        assert result.paper.row(s).rho == pytest.approx(want, abs=1e-12), s
        assert result.paper.row(s).overlap == len(top(full, 20) & top(ablated, 20)), s
    # Ordinal ranks (ties broken by position) would give another ρ: the test can tell them apart.
    ablated = exact_scores(rows, exact_weights(drop="verification"))
    assert (
        abs(pearson(ordinal_ranks(full), ordinal_ranks(ablated)) - result.paper.row("verification").rho)
        > 1e-3
    )


def test_tied_scores_enter_the_top_set_in_file_order(tmp_path: Path) -> None:
    """With top-2 and three records tied for first, the first two in the file are the top set; dropping
    process breaks the tie in favour of the third."""
    rows = [
        [0.7, 0.9, 0.5, 0.3, 0.4],
        [0.7, 0.9, 0.5, 0.3, 0.4],
        [0.7, 0.6, 0.5, 0.3, 0.9],
        [0.4, 0.6, 0.5, 0.3, 0.4],
    ]
    assert exact_scores(rows, exact_weights())[:3] == [Fraction("0.615")] * 3
    result = paper_ablation(
        write_records(tmp_path / "t.jsonl", [record(i, r) for i, r in enumerate(rows)]), k=2
    )
    assert result.paper.row("outcome").overlap == 2
    assert result.paper.row("process").overlap == 1  # {0, 1} against {2, 0}


# --- (4) the command ------------------------------------------------------------------------------------


def test_cli_side_by_side_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rows = simplified_signals(np.random.default_rng(12), 25)
    path = write_records(
        tmp_path / "ablation.jsonl",
        records_of(rows),
    )
    assert carl_main(["trajectories", "ablate", "--paper", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"{path}: 25 records, ") and "top-20" in lines[0]
    assert "0.30" in lines[1] and "0.25" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("signal dropped"))
    assert "paper file" in lines[header - 1] and "ours" in lines[header - 1]
    table = [line.split() for line in lines[header + 1 : header + 6]]
    want = expected_table(rows)
    ours = expected_table([ours_by_hand()[k] for k in kinds_for(25)])
    assert [t[0] for t in table] == sorted(SIGNALS, key=lambda s: -want[s][2])
    for t in table:
        rho, overlap, impact = want[t[0]]
        assert t[1:4] == [f"{rho:.3f}", str(overlap), f"{impact:.3f}"]
        rho, overlap, impact = ours[t[0]]
        assert t[4:7] == [f"{rho:.3f}", str(overlap), f"{impact:.3f}"]
    means = {line.split()[0]: line.split()[2:] for line in lines if line.split()[1:2] == ["mean"]}
    assert set(means) == {*SIGNALS, "reward"}
    assert means["verification"][1] == f"{np.mean([ours_by_hand()[k][3] for k in kinds_for(25)]):.3f}"
    assert any(line.startswith("reward sd") for line in lines)
    assert not (tmp_path / "home" / "carl.db").exists()  # the file mode never opens the store


def test_cli_json_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rows = simplified_signals(np.random.default_rng(12), 25)
    path = write_records(
        tmp_path / "ablation.jsonl",
        records_of(rows),
    )
    assert carl_main(["trajectories", "ablate", "--paper", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object on one line
    data = json.loads(out)
    assert set(data) == {
        "file",
        "records",
        "tool_calls",
        "top_k",
        "weights",
        "rows",
        "paper",
        "ours",
        "skipped",
    }
    assert (
        data["records"] == 25 and data["top_k"] == 20 and data["file"] == str(path) and data["skipped"] == []
    )
    assert data["weights"] == {
        "outcome": 0.30,
        "process": 0.25,
        "efficiency": 0.15,
        "verification": 0.15,
        "consistency": 0.15,
    }
    assert sorted(r["signal"] for r in data["rows"]) == sorted(SIGNALS)
    want = expected_table(rows)
    for row in data["rows"]:
        assert set(row) == {"signal", "weights_without", "paper", "ours"}
        assert set(row["paper"]) == set(row["ours"]) == {"rho", "overlap", "impact"}
        assert row["paper"]["overlap"] == want[row["signal"]][1]
        assert row["paper"]["rho"] == pytest.approx(want[row["signal"]][0], abs=1e-12)
    for side in ("paper", "ours"):
        assert set(data[side]["signal_means"]) == set(SIGNALS)
        assert set(data[side]["reward"]) == {"mean", "sd", "min", "max", "source"}
    assert data["paper"]["reward"]["source"] == "outcome.reward_score"
    assert data["paper"]["reward_gap"] < 1e-4
    assert data["paper"]["shapes"] == {"recorder": 25}
    assert set(data["paper"]["advantage"]) == {"records", "z_gap", "top", "top_reward"}
    assert data["paper"]["advantage"]["records"] == 25


def test_rewards_scored_with_other_weights_are_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rows = simplified_signals(np.random.default_rng(7), 21)
    three_signal = [round(0.40 * r[0] + 0.35 * r[1] + 0.25 * r[2], 4) for r in rows]  # the paper's §4 formula
    records = [record(i, r, reward=three_signal[i]) for i, r in enumerate(rows)]
    assert (
        carl_main(["trajectories", "ablate", "--paper", str(write_records(tmp_path / "w.jsonl", records))])
        == 0
    )
    out = capsys.readouterr().out
    assert "not scored with these weights" in out
    assert f"{np.mean(three_signal):.3f}" in next(
        line for line in out.splitlines() if line.startswith("reward mean")
    )


# --- (5) bad input ----------------------------------------------------------------------------------------


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert carl_main(["trajectories", "ablate", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_file_that_cannot_be_ablated_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    good = [record(i, r) for i, r in enumerate(simplified_signals(np.random.default_rng(1), 4))]

    assert (
        fails(capsys, "--paper", str(tmp_path / "nope.jsonl"))
        == f"carl: {tmp_path / 'nope.jsonl'}: no such file"
    )
    assert fails(capsys, "--paper", str(tmp_path)) == f"carl: {tmp_path}: not a file"

    write_records(tmp_path / "one.jsonl", good[:1])
    assert "1 record(s)" in fails(capsys, "--paper", str(tmp_path / "one.jsonl"))

    # One usable record left once the bad one is skipped: still nothing to rank, and the line says why.
    wrong = dict(good[1], outcome={**good[1]["outcome"], "verification_score": "high"})
    path = write_records(tmp_path / "wrong.jsonl", [good[0], wrong])
    assert fails(capsys, "--paper", str(path), "--json") == (
        f"carl: {path}: 1 record(s) to rank; an ablation ranks at least 2 (1 skipped; the first: "
        f"{path}:2: outcome.verification_score is not a number ('high'))"
    )


def test_bad_records_are_one_line_each_and_the_rest_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kind of bad record, in both shapes, between good ones: one `file:line: field ...` line each, and
    the tables are those of the good records alone."""
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rng = np.random.default_rng(1)
    good = [record(i, r) for i, r in enumerate(simplified_signals(rng, 12))]
    published = published_records(np.random.default_rng(2), 12)
    pub = published[0]

    def outcome(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return dict(base, outcome={**base["outcome"], **fields})

    def signals(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return outcome(base, signals={**base["outcome"]["signals"], **fields})

    no_efficiency = {k: v for k, v in pub["outcome"]["signals"].items() if k != "efficiency"}
    bad: list[tuple[Any, str]] = [
        ("{not json", "invalid JSON"),
        ([1, 2], "not a JSON object"),
        (record(90, [0.7, 0.9, 0.5, 0.3, 0.4], omit="efficiency_score"), "outcome.efficiency_score missing"),
        (outcome(good[1], verification_score="high"), "outcome.verification_score is not a number ('high')"),
        (outcome(good[1], process_score=1.5), "outcome.process_score = 1.5 is outside [0, 1]"),
        (
            {k: v for k, v in good[2].items() if k != "outcome"},
            "no outcome object (the signals are read from outcome.signals or outcome.*)",
        ),
        (
            {k: v for k, v in good[2].items() if k != "trajectory"},
            "no trajectory object (our scorer re-scores trajectory.events)",
        ),
        (outcome(pub, signals=no_efficiency), "outcome.signals.efficiency missing"),
        (signals(pub, process=None), "outcome.signals.process missing"),
        (signals(pub, outcome="0.7"), "outcome.signals.outcome is not a number ('0.7')"),
        (outcome(pub, signals=[0.7, 1.0]), "outcome.signals is not an object"),
        (outcome(pub, reward_score=7), "outcome.reward_score = 7.0 is outside [0, 1]"),
        (outcome(pub, advantage="high"), "outcome.advantage is not a number ('high')"),
        (
            dict(pub, timing={**pub["timing"], "num_prompts": -3}),
            "timing.num_prompts is not a count of prompts ('-3')",
        ),
        (
            dict(pub, trajectory={**pub["trajectory"], "events": [{"tool_name": "Bash"}, "Read"]}),
            "trajectory.events[1] is not an object",
        ),
        (dict(pub, trajectory={**pub["trajectory"], "events": "Bash"}), "trajectory.events is not a list"),
        (dict(pub, context="repo"), "context is not an object"),
    ]
    usable = good + published[1:]
    lines = [json.dumps(r) for r in usable]
    for i, (item, _) in enumerate(bad):  # each bad record after a good one
        lines.insert(2 * i + 1, item if isinstance(item, str) else json.dumps(item))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    want_skipped = [f"{path}:{2 * i + 2}: {reason}" for i, (_, reason) in enumerate(bad)]

    assert carl_main(["trajectories", "ablate", "--paper", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"] == want_skipped
    assert data["records"] == len(usable)
    assert data["paper"]["shapes"] == {"recorder": 12, "published": 11}
    want = expected_table([stored_row(r) for r in usable])
    for row in data["rows"]:
        rho, overlap, impact = want[row["signal"]]
        assert (row["paper"]["rho"], row["paper"]["overlap"]) == (pytest.approx(rho, abs=1e-12), overlap)
        assert row["paper"]["impact"] == pytest.approx(impact, abs=1e-12)

    assert carl_main(["trajectories", "ablate", "--paper", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index(f"skipped {len(bad)} record(s); the tables cover the other {len(usable)}:")
    assert out[at + 1 : at + 11] == [f"  {line}" for line in want_skipped[:10]]
    assert out[at + 11] == f"  … and {len(bad) - 10} more"


def test_store_mode_is_unchanged_and_has_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --paper the command still ablates the store's own scores."""
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    rows = simplified_signals(np.random.default_rng(3), 24)
    path = write_records(tmp_path / "records.jsonl", records_of(rows))
    assert carl_main(["trajectories", "import", str(path)]) == 0
    capsys.readouterr()
    assert carl_main(["trajectories", "ablate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["signal", "dropped", "rho", "top-20", "overlap", "impact"] and len(lines) == 6
    assert carl_main(["trajectories", "ablate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["trajectories"] == 24
    assert sorted(r["signal"] for r in data["rows"]) == sorted(SIGNALS)
    # The store holds our scores: the same table as the file mode's "ours" side.
    ours = paper_ablation(path).ours
    for row in data["rows"]:
        assert (row["rho"], row["overlap"]) == (
            pytest.approx(ours.row(row["signal"]).rho),
            ours.row(row["signal"]).overlap,
        )


# --- (6) the published file's shape -------------------------------------------------------------------------


def edge_tied(scores: list[Fraction], k: int = 20) -> bool:
    """The k-th and (k+1)-th highest scores are equal:
    which records make the top set is up to the tie rule."""
    ordered = sorted(scores, reverse=True)
    return ordered[k - 1] == ordered[k]


def test_published_file_gives_the_oracle_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """290 whole sessions in the published shape, two-valued signals so that ties are everywhere: ρ from
    average ranks, top-20 sets of exactly 20 (the earlier record wins a tie at the edge), impacts by §11."""
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    records = published_records(np.random.default_rng(11), 290)
    path = write_records(tmp_path / "karl-ablation-290.jsonl", records)
    before = path.read_bytes()
    result = paper_ablation(path)
    assert path.read_bytes() == before  # read, never written
    assert (result.records, result.top_k, result.skipped, result.shapes) == (290, 20, [], {"published": 290})
    assert result.tool_calls == sum(r["trajectory"]["total_tools"] for r in records)

    rows = [stored_row(r) for r in records]
    full = exact_scores(rows, exact_weights())
    assert len(set(full)) < len(full) * 0.8  # ties are frequent
    ablated = {s: exact_scores(rows, exact_weights(drop=s)) for s in SIGNALS}
    assert any(edge_tied(scores) for scores in ablated.values())  # the tie rule at the edge is exercised
    want = expected_table(rows)
    assert_rows(result.paper, want)
    assert [r.signal for r in result.paper.rows] == sorted(SIGNALS, key=lambda s: -want[s][2])
    assert any(
        abs(pearson(ordinal_ranks(full), ordinal_ranks(ablated[s])) - result.paper.row(s).rho) > 1e-3
        for s in SIGNALS
    )  # ordinal ranks would not do
    for j, s in enumerate(SIGNALS):
        assert result.paper.signal_means[s] == pytest.approx(np.mean([r[j] for r in rows]), abs=1e-12)

    # The reward check: reward_score is Σ w·signal with the ablation-time weights, so it passes.
    stored = np.array([r["outcome"]["reward_score"] for r in records])
    assert result.paper.reward_source == "outcome.reward_score" and result.reward_gap < 1e-12
    assert result.paper.reward["mean"] == pytest.approx(stored.mean())
    assert result.paper.reward["sd"] == pytest.approx(stored.std())

    # The advantage is read: the global z-score of R, and the 35 of highest advantage.
    advantages = [r["outcome"]["advantage"] for r in records]
    best = sorted(range(290), key=lambda i: (-advantages[i], i))[:35]
    check = result.advantage
    assert (check.records, check.top) == (290, 35)
    assert check.z_gap is not None and check.z_gap <= 5e-5 + 1e-12
    assert check.top_reward == pytest.approx(np.mean(stored[best]), abs=1e-12)
    assert check.top_reward > result.paper.reward["mean"]

    # Our side: the same sessions re-scored (events past the 50th come back from tool_sequence).
    ours = [
        [getattr(x, s) for s in SIGNALS] for x in score_many([record_to_trajectory(path, r) for r in records])
    ]
    assert_rows(result.ours, expected_table(ours))

    assert carl_main(["trajectories", "ablate", "--paper", str(path)]) == 0
    out = capsys.readouterr().out
    assert "paper signals from outcome.signals (the published file's shape): 290 records" in out
    assert "not scored with these weights" not in out
    assert "advantage: outcome.advantage in all 290 records: the global z-score of the reward" in out
    assert f"top 35 by advantage: mean reward {np.mean(stored[best]):.3f}" in out
    assert "skipped" not in out


def test_shapes_are_told_apart_per_record(tmp_path: Path) -> None:
    """The same signals kept as outcome.signals or as outcome.*_score give the same table,
    one file or mixed."""
    records = published_records(np.random.default_rng(4), 60)

    def as_recorder(r: dict[str, Any]) -> dict[str, Any]:
        outcome = {k: v for k, v in r["outcome"].items() if k != "signals"}
        return dict(r, outcome=outcome | {f"{s}_score": v for s, v in r["outcome"]["signals"].items()})

    published = paper_ablation(write_records(tmp_path / "published.jsonl", records))
    recorder = paper_ablation(write_records(tmp_path / "recorder.jsonl", [as_recorder(r) for r in records]))
    mixed_records = [as_recorder(r) if i % 3 == 0 else r for i, r in enumerate(records)]
    mixed = paper_ablation(write_records(tmp_path / "mixed.jsonl", mixed_records))
    assert recorder.shapes == {"recorder": 60} and mixed.shapes == {"recorder": 20, "published": 40}
    want = expected_table([stored_row(r) for r in records])
    for result in (published, recorder, mixed):
        assert_rows(result.paper, want)
        assert result.reward_gap < 1e-12 and result.advantage.records == 60


def test_other_advantages_are_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An advantage that is not the global z-score (R − 0.5, as the recorder wrote it) is said to differ."""
    records = published_records(np.random.default_rng(8), 40)
    for r in records:
        r["outcome"]["advantage"] = round(r["outcome"]["reward_score"] - 0.5, 4)
    result = paper_ablation(write_records(tmp_path / "a.jsonl", records))
    assert result.advantage.z_gap is not None and result.advantage.z_gap > 0.1
    text = format_paper_ablation(result)
    assert "differs from the global z-score of the reward by up to" in text
    del records[3]["outcome"]["advantage"]
    result = paper_ablation(write_records(tmp_path / "b.jsonl", records))
    assert (result.advantage.records, result.advantage.top_reward) == (39, None)
    assert "advantage: outcome.advantage in 39 of 40 records only" in format_paper_ablation(result)
