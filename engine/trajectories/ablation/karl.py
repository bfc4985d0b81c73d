"""KARL's published ablation table (docs/reference/karl.md §11) rebuilt from a record file, beside ours.

The file is read as published: the paper's 290 records, one whole session a line, keep the five signals in
`outcome.signals` (docs/reference/karl.md §11); the recorder's own per-turn records keep them as
`outcome.<signal>_score` (§2.1). `karl_records` tells the two apart per record, so a file may hold both.
Either way each signal is read as stored, with `outcome.reward_score` (R) and `outcome.advantage` beside it.
The sub-scores in `reward_components` (§3.6) belong to the full scorer, not to what §11 ablates, and
`quality.success_rate` is rounded to 3 decimals: neither is read.

Paper side: the stored signals, ranked with the weights of the paper's code at the time of the
ablation (0.30/0.25/0.15/0.15/0.15, docs/reference/karl.md §13 item 1). Our side: the same records mapped back
to trajectories by `karl_records` and re-scored by our scorer (docs/reference/karl.md §3 with the rules of
§12). Both are ablated by `ablation.ablate`, the §11 method: ties share their average rank in ρ, and a top-20
set holds exactly 20 records (the paper counts "5 of 20 displaced"),
a tie at its edge going to the earlier record in the file.

A record that cannot be used (not JSON, no outcome or trajectory object, a signal missing or not a number in
[0, 1], ...) costs one `file:line: field ...` line in `skipped`; the tables cover the rest of the file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import CarlError
from engine.trajectories.ablation.leave_one_out import TOP_K, AblationRow, ablate, renormalised, signal_matrix
from engine.trajectories.importers.karl_records import (
    PUBLISHED,
    RecordError,
    record_to_trajectory,
    signal_field,
    stored_scores,
)
from engine.trajectories.importers.trace_files import read_jsonl
from engine.trajectories.importers.trace_lines import Line
from engine.trajectories.scoring.signals import SIGNALS, score_many
from engine.trajectories.trajectory import Trajectory

# The paper's code at the time of the ablation (docs/reference/karl.md §13 item 1); the same numbers as ours.
PAPER_WEIGHTS = {
    "outcome": 0.30,
    "process": 0.25,
    "efficiency": 0.15,
    "verification": 0.15,
    "consistency": 0.15,
}
REWARD_FIELD = "reward_score"
# Stored signals and R may each be rounded to 4 decimals: a larger gap means other weights.
REWARD_GAP_TOLERANCE = 1e-3
# The published advantage is a global z-score of R (docs/reference/karl.md §11), stored to 4 decimals.
ADVANTAGE_GAP_TOLERANCE = 1e-3
# The paper compares the mean reward of the 35 records of highest advantage with 35 at random (§11).
ADVANTAGE_TOP = 35
SHOWN_SKIPS = 10  # skipped-record lines printed under the table (the JSON has them all)


class KarlAblationError(CarlError):
    """A record file that cannot be ablated: `file[:line]: what is wrong`."""


@dataclass(frozen=True)
class Side:
    """One scorer's view of the records: its ablation rows (largest impact first) and summaries."""

    scorer: str
    rows: list[AblationRow]
    signal_means: dict[str, float]
    reward: dict[str, float]  # mean, sd (population), min, max
    reward_source: str

    def row(self, signal: str) -> AblationRow:
        return next(r for r in self.rows if r.signal == signal)


@dataclass(frozen=True)
class AdvantageCheck:
    """What the file's own `outcome.advantage` says, against its rewards."""

    records: int  # records that store an advantage
    z_gap: float | None  # largest |A − (R − mean R) / sd R| (population sd), when every record stores A
    top: int  # records in the highest-advantage set (ADVANTAGE_TOP at most)
    top_reward: float | None  # the mean reward of that set (a tie at its edge goes to the earlier record)

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "z_gap": self.z_gap, "top": self.top, "top_reward": self.top_reward}


@dataclass(frozen=True)
class PaperRecords:
    """The usable records of a file: their stored signals, rewards and advantages, and as trajectories."""

    signals: np.ndarray  # N×5, columns in SIGNALS order
    rewards: list[float | None]  # outcome.reward_score
    advantages: list[float | None]  # outcome.advantage
    trajectories: list[Trajectory]
    shapes: Counter[str]  # records per shape (published, recorder)
    skipped: list[str]  # `file:line: reason`, one per record not used


@dataclass(frozen=True)
class PaperAblation:
    path: str
    records: int
    tool_calls: int
    top_k: int
    weights: dict[str, float]
    paper: Side
    ours: Side
    reward_gap: float | None  # largest |outcome.reward_score − weighted stored signals|, if stored
    advantage: AdvantageCheck
    shapes: dict[str, int]
    skipped: list[str]

    def to_json(self) -> dict[str, Any]:
        def cells(r: AblationRow) -> dict[str, Any]:
            return {"rho": r.rho, "overlap": r.overlap, "impact": r.impact}

        def side(s: Side) -> dict[str, Any]:
            return {
                "scorer": s.scorer,
                "signal_means": s.signal_means,
                "reward": {**s.reward, "source": s.reward_source},
            }

        w = [self.weights[name] for name in SIGNALS]
        rows = [
            {
                "signal": r.signal,
                "weights_without": dict(
                    zip(SIGNALS, renormalised(w, SIGNALS.index(r.signal)).tolist(), strict=True)
                ),
                "paper": cells(r),
                "ours": cells(self.ours.row(r.signal)),
            }
            for r in self.paper.rows
        ]
        paper = {
            **side(self.paper),
            "reward_gap": self.reward_gap,
            "advantage": self.advantage.to_json(),
            "shapes": self.shapes,
        }
        return {
            "file": self.path,
            "records": self.records,
            "tool_calls": self.tool_calls,
            "top_k": self.top_k,
            "weights": self.weights,
            "rows": rows,
            "paper": paper,
            "ours": side(self.ours),
            "skipped": self.skipped,
        }


def read_records(path: Path) -> tuple[list[Line], list[str]]:
    """The file's JSON objects with their line numbers, and one line per line that is not one."""
    if not path.exists():
        raise KarlAblationError(f"{path}: no such file")
    if not path.is_file():
        raise KarlAblationError(f"{path}: not a file")
    try:
        return read_jsonl(path)
    except OSError as exc:
        raise KarlAblationError(f"{path}: unreadable ({exc.strerror or exc})") from None


def paper_records(path: Path, lines: list[Line], skipped: list[str] | None = None) -> PaperRecords:
    """Each record's stored signals (read where its shape keeps them), reward, advantage and trajectory;
    a record missing any of the five signals, or malformed, is skipped with one line."""
    skipped = list(skipped or [])
    rows: list[list[float]] = []
    rewards: list[float | None] = []
    advantages: list[float | None] = []
    trajectories: list[Trajectory] = []
    shapes: Counter[str] = Counter()
    for number, record in lines:
        where = f"{path}:{number}"
        if not isinstance(record.get("outcome"), dict):
            skipped.append(
                f"{where}: no outcome object (the signals are read from outcome.signals or outcome.*)"
            )
            continue
        if not isinstance(record.get("trajectory"), dict):
            skipped.append(f"{where}: no trajectory object (our scorer re-scores trajectory.events)")
            continue
        try:
            scores = stored_scores(record)
            missing = [name for name in SIGNALS if name not in scores.signals]
            if missing:
                raise RecordError(f"{signal_field(scores.shape, missing[0])} missing")
            trajectory = record_to_trajectory(path, record)
        except RecordError as err:
            skipped.append(f"{where}: {err}")
            continue
        rows.append([scores.signals[name] for name in SIGNALS])
        rewards.append(scores.reward)
        advantages.append(scores.advantage)
        trajectories.append(trajectory)
        shapes[scores.shape] += 1
    matrix = np.array(rows, dtype=float).reshape(-1, len(SIGNALS))
    return PaperRecords(matrix, rewards, advantages, trajectories, shapes, skipped)


def advantage_check(advantages: list[float | None], rewards: np.ndarray) -> AdvantageCheck:
    """How the stored advantages relate to the rewards: the gap to the global z-score, and the mean
    reward of the records of highest advantage (both only when every record stores one)."""
    stored = sum(a is not None for a in advantages)
    if not stored or stored < len(advantages):
        return AdvantageCheck(stored, None, 0, None)
    a = np.array(advantages, dtype=float)
    sd = float(rewards.std())
    z_gap = float(np.abs(a - (rewards - rewards.mean()) / sd).max()) if sd > 0 else None
    top = min(ADVANTAGE_TOP, len(a))
    best = np.argsort(-a, kind="stable")[:top]
    return AdvantageCheck(stored, z_gap, top, float(rewards[best].mean()))


def _reward_stats(rewards: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(rewards.mean()),
        "sd": float(rewards.std()),
        "min": float(rewards.min()),
        "max": float(rewards.max()),
    }


def _means(matrix: np.ndarray) -> dict[str, float]:
    return dict(zip(SIGNALS, matrix.mean(axis=0).tolist(), strict=True))


def paper_ablation(path: Path, k: int = TOP_K) -> PaperAblation:
    """The §11 table from the file's stored signals, and the same records re-scored and ablated by ours."""
    lines, bad = read_records(path)
    records = paper_records(path, lines, bad)
    n = len(records.trajectories)
    if n < 2:
        first = (
            f" ({len(records.skipped)} skipped; the first: {records.skipped[0]})" if records.skipped else ""
        )
        raise KarlAblationError(f"{path}: {n} record(s) to rank; an ablation ranks at least 2{first}")
    weights = [PAPER_WEIGHTS[name] for name in SIGNALS]
    weighted = records.signals @ np.asarray(weights)
    if any(r is None for r in records.rewards):
        paper_rewards, source, gap = weighted, "weighted stored signals", None
    else:
        paper_rewards, source = np.array(records.rewards, dtype=float), f"outcome.{REWARD_FIELD}"
        gap = float(np.abs(paper_rewards - weighted).max())
    paper = Side(
        "paper file: stored signals (simplified scorer, docs/reference/karl.md §13 item 8)",
        ablate(records.signals, weights, SIGNALS, k),
        _means(records.signals),
        _reward_stats(paper_rewards),
        source,
    )

    scored = score_many(records.trajectories)
    our_matrix = signal_matrix(scored)
    ours = Side(
        "ours: docs/reference/karl.md §3 with the rules of §12 (scoring/signals.py)",
        ablate(our_matrix, weights, SIGNALS, k),
        _means(our_matrix),
        _reward_stats(np.array([s.reward for s in scored])),
        "our scorer",
    )
    return PaperAblation(
        str(path),
        n,
        sum(t.total for t in records.trajectories),
        min(k, n),
        dict(PAPER_WEIGHTS),
        paper,
        ours,
        gap,
        advantage_check(records.advantages, paper_rewards),
        dict(records.shapes),
        records.skipped,
    )


def format_paper_ablation(result: PaperAblation) -> str:
    """The two tables side by side, rows in the order of the paper file's impact, then the summaries."""
    k = result.top_k
    weights = ", ".join(f"{name} {w:.2f}" for name, w in result.weights.items())
    lines = [
        f"{result.path}: {result.records} records, {result.tool_calls} tool calls; top-{k} sets",
        f"weights {weights}; a dropped signal's weight is shared out pro rata",
        "",
        f"{'':<18} {'paper file (stored signals)':^28}   {'ours (re-scored)':^28}",
        f"{'signal dropped':<18} {'rho':>8} {'overlap':>9} {'impact':>9}   {'rho':>8} {'overlap':>9} "
        f"{'impact':>9}",
    ]
    for p in result.paper.rows:
        o = result.ours.row(p.signal)
        lines.append(
            f"{p.signal:<18} {p.rho:>8.3f} {p.overlap:>9d} {p.impact:>9.3f}   "
            f"{o.rho:>8.3f} {o.overlap:>9d} {o.impact:>9.3f}"
        )
    lines += ["", f"{'':<18} {'paper file':>10} {'ours':>10}"]
    for name in SIGNALS:
        lines.append(
            f"{name + ' mean':<18} {result.paper.signal_means[name]:>10.3f} "
            f"{result.ours.signal_means[name]:>10.3f}"
        )
    for stat in ("mean", "sd", "min", "max"):
        lines.append(
            f"{'reward ' + stat:<18} {result.paper.reward[stat]:>10.3f} {result.ours.reward[stat]:>10.3f}"
        )
    lines.append(f"paper signals from {_shapes(result.shapes)}")
    lines.append(f"paper reward from {result.paper.reward_source}; sd is the population sd")
    if result.reward_gap is not None and result.reward_gap > REWARD_GAP_TOLERANCE:
        lines.append(
            f"note: outcome.{REWARD_FIELD} differs from the weighted stored signals by up to "
            f"{result.reward_gap:.4f}: the file was not scored with these weights"
        )
    lines += _advantage_lines(result)
    if k >= result.records:
        lines.append(
            f"note: {result.records} records, so the top set holds all of them and overlap is always {k}"
        )
    if result.skipped:
        lines.append(f"skipped {len(result.skipped)} record(s); the tables cover the other {result.records}:")
        lines += [f"  {line}" for line in result.skipped[:SHOWN_SKIPS]]
        if len(result.skipped) > SHOWN_SKIPS:
            lines.append(f"  … and {len(result.skipped) - SHOWN_SKIPS} more")
    return "\n".join(lines)


def _shapes(shapes: dict[str, int]) -> str:
    where = {
        PUBLISHED: "outcome.signals (the published file's shape)",
        "recorder": "outcome.*_score (the recorder's shape)",
    }
    return "; ".join(f"{where[shape]}: {count} records" for shape, count in sorted(shapes.items()))


def _advantage_lines(result: PaperAblation) -> list[str]:
    check, reward = result.advantage, result.paper.reward
    if not check.records:
        return ["advantage: not stored (no outcome.advantage)"]
    if check.top_reward is None:
        return [f"advantage: outcome.advantage in {check.records} of {result.records} records only"]
    if check.z_gap is None:
        how = "every reward is the same, so it is no z-score"
    elif check.z_gap <= ADVANTAGE_GAP_TOLERANCE:
        how = f"the global z-score of the reward, (R − {reward['mean']:.5f}) / {reward['sd']:.5f}"
    else:
        how = f"differs from the global z-score of the reward by up to {check.z_gap:.4f}"
    return [
        f"advantage: outcome.advantage in all {check.records} records: {how}",
        f"top {check.top} by advantage: mean reward {check.top_reward:.3f} (all: {reward['mean']:.3f})",
    ]
