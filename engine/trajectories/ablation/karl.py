"""KARL's published ablation table (docs/reference/karl.md §11) rebuilt from a record file, beside ours.

The paper's 290 ablation records are KARL `trajectories.jsonl` records (docs/reference/karl.md §2), one whole session
each, scored by a simplified scorer (docs/reference/karl.md §13 item 8). A record keeps each signal where scoring
writes it, in its `outcome` block (§2.1), rounded to 4 decimals:

    outcome.outcome_score   outcome.process_score   outcome.efficiency_score
    outcome.verification_score   outcome.consistency_score      (outcome.reward_score: R)

The sub-scores in `reward_components` (§3.6) belong to the full scorer, not to what §11 ablates, and
`quality.success_rate` is rounded to 3 decimals: neither is read.

Paper side: the stored signals, ranked with the weights of the paper's code at the time of the
ablation (0.30/0.25/0.15/0.15/0.15, docs/reference/karl.md §13 item 1). Our side: the same records mapped back to
trajectories by `karl_records` and re-scored by our scorer (docs/reference/karl.md §3 with the rules of §12). Both are
ablated by `ablation.ablate`, the §11 method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import CarlError
from engine.trajectories.ablation.leave_one_out import TOP_K, AblationRow, ablate, renormalised, signal_matrix
from engine.trajectories.importers.common import Line
from engine.trajectories.importers.files import read_jsonl
from engine.trajectories.importers.karl_records import record_to_trajectory
from engine.trajectories.scoring.signals import SIGNALS, score_many

# The paper's code at the time of the ablation (docs/reference/karl.md §13 item 1); the same numbers as ours.
PAPER_WEIGHTS = {
    "outcome": 0.30,
    "process": 0.25,
    "efficiency": 0.15,
    "verification": 0.15,
    "consistency": 0.15,
}
SIGNAL_FIELDS = {name: f"{name}_score" for name in SIGNALS}  # keys of the record's `outcome` block
REWARD_FIELD = "reward_score"
# Stored signals and R are each rounded to 4 decimals: a larger gap means other weights.
REWARD_GAP_TOLERANCE = 1e-3


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
class PaperAblation:
    path: str
    records: int
    tool_calls: int
    top_k: int
    weights: dict[str, float]
    paper: Side
    ours: Side
    reward_gap: float | None  # largest |outcome.reward_score − weighted stored signals|, if stored

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
        return {
            "file": self.path,
            "records": self.records,
            "tool_calls": self.tool_calls,
            "top_k": self.top_k,
            "weights": self.weights,
            "rows": rows,
            "paper": {**side(self.paper), "reward_gap": self.reward_gap},
            "ours": side(self.ours),
        }


def read_records(path: Path) -> list[Line]:
    """Every line of the file as a JSON object; the first bad line is an error."""
    if not path.exists():
        raise KarlAblationError(f"{path}: no such file")
    if not path.is_file():
        raise KarlAblationError(f"{path}: not a file")
    try:
        lines, bad = read_jsonl(path)
    except OSError as exc:
        raise KarlAblationError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if bad:
        raise KarlAblationError(bad[0])
    if len(lines) < 2:
        raise KarlAblationError(f"{path}: {len(lines)} record(s); an ablation ranks at least 2")
    return lines


def stored_signals(path: Path, lines: list[Line]) -> tuple[np.ndarray, np.ndarray | None]:
    """The N×5 matrix of the stored signals (columns in SIGNALS order), and the stored rewards
    (None unless every record has one)."""
    rows: list[list[float]] = []
    rewards: list[float | None] = []
    for number, record in lines:
        where = f"{path}:{number}"
        outcome = record.get("outcome")
        if not isinstance(outcome, dict):
            raise KarlAblationError(f"{where}: no outcome object (the signals are read from outcome.*_score)")
        if not isinstance(record.get("trajectory"), dict):
            raise KarlAblationError(f"{where}: no trajectory object (our scorer re-scores trajectory.events)")
        rows.append([_signal(where, outcome, SIGNAL_FIELDS[name]) for name in SIGNALS])
        rewards.append(_number(where, outcome, REWARD_FIELD))
    stored = None if any(r is None for r in rewards) else np.array(rewards, dtype=float)
    return np.array(rows, dtype=float).reshape(-1, len(SIGNALS)), stored


def _signal(where: str, outcome: dict[str, Any], key: str) -> float:
    value = _number(where, outcome, key)
    if value is None:
        raise KarlAblationError(f"{where}: outcome.{key} missing")
    return value


def _number(where: str, outcome: dict[str, Any], key: str) -> float | None:
    """outcome[key] as a float in [0, 1]; None when absent or null."""
    value = outcome.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise KarlAblationError(f"{where}: outcome.{key} is not a number ({str(value)[:40]!r})")
    if not 0.0 <= value <= 1.0:
        raise KarlAblationError(f"{where}: outcome.{key} = {value} is outside [0, 1]")
    return float(value)


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
    lines = read_records(path)
    paper_matrix, stored = stored_signals(path, lines)
    weights = [PAPER_WEIGHTS[name] for name in SIGNALS]
    weighted = paper_matrix @ np.asarray(weights)
    if stored is None:
        paper_rewards, source, gap = weighted, "weighted stored signals", None
    else:
        paper_rewards, source = stored, f"outcome.{REWARD_FIELD}"
        gap = float(np.abs(stored - weighted).max())
    paper = Side(
        "paper file: stored outcome.*_score (simplified scorer, docs/reference/karl.md §13 item 8)",
        ablate(paper_matrix, weights, SIGNALS, k),
        _means(paper_matrix),
        _reward_stats(paper_rewards),
        source,
    )

    trajectories = [record_to_trajectory(path, record) for _, record in lines]
    scored = score_many(trajectories)
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
        len(lines),
        sum(t.total for t in trajectories),
        min(k, len(lines)),
        dict(PAPER_WEIGHTS),
        paper,
        ours,
        gap,
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
        f"{'signal dropped':<18} {'rho':>8} {'overlap':>9} {'impact':>9}   {'rho':>8} {'overlap':>9} {'impact':>9}",
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
            f"{name + ' mean':<18} {result.paper.signal_means[name]:>10.3f} {result.ours.signal_means[name]:>10.3f}"
        )
    for stat in ("mean", "sd", "min", "max"):
        lines.append(
            f"{'reward ' + stat:<18} {result.paper.reward[stat]:>10.3f} {result.ours.reward[stat]:>10.3f}"
        )
    lines.append(f"paper reward from {result.paper.reward_source}; sd is the population sd")
    if result.reward_gap is not None and result.reward_gap > REWARD_GAP_TOLERANCE:
        lines.append(
            f"note: outcome.{REWARD_FIELD} differs from the weighted stored signals by up to "
            f"{result.reward_gap:.4f}: the file was not scored with these weights"
        )
    if k >= result.records:
        lines.append(
            f"note: {result.records} records, so the top set holds all of them and overlap is always {k}"
        )
    return "\n".join(lines)
