"""Leave-one-out signal ablation (docs/reference/karl.md §11): how much each signal moves the ranking.

For each signal s: drop it, renormalize the other weights to sum to 1, re-score, and compare the
ranking with the full one: ρ = Spearman correlation (average ranks for ties), overlap = size of
the intersection of the two top-20 sets, impact = (1 − ρ) + (20 − overlap) / 20.

Scores that are equal in exact arithmetic can differ in their last bits in floating point (0.15·0.7 +
0.15·0.4 against 0.15·0.3 + 0.15·0.8), so scores within 1e-9 of each other are taken as tied before
ranking. Signals are stored to 4 decimals, so distinct sums differ by far more than that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.trajectories.scoring.signals import SIGNALS, WEIGHTS
from engine.trajectories.trajectory import Scored

TOP_K = 20
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class AblationRow:
    signal: str
    rho: float
    overlap: int
    impact: float


def signal_matrix(scored: Sequence[Scored]) -> np.ndarray:
    """N×5 matrix of the five signals, columns in `SIGNALS` order."""
    return np.array([[getattr(s, name) for name in SIGNALS] for s in scored], dtype=float).reshape(
        -1, len(SIGNALS)
    )


def renormalised(weights: Sequence[float] | np.ndarray, drop: int) -> np.ndarray:
    """The weights without the one at index `drop`, rescaled to sum to 1 (that one set to 0)."""
    rest = np.asarray(weights, dtype=float).copy()
    rest[drop] = 0.0
    total = rest.sum()
    if total <= 0.0:
        raise ValueError("the remaining weights sum to 0: nothing left to score with")
    return rest / total


def merge_ties(x: np.ndarray, tolerance: float = TIE_TOLERANCE) -> np.ndarray:
    """Scores within `tolerance` of their neighbour in sorted order replaced by one value (the
    smallest of their group), so that rounding noise never breaks a tie."""
    x = np.asarray(x, dtype=float)
    if not len(x):
        return x
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new_group = np.r_[True, np.diff(xs) > tolerance]
    firsts = np.flatnonzero(new_group)
    out = np.empty(len(x))
    out[order] = np.repeat(xs[firsts], np.diff(np.r_[firsts, len(x)]))
    return out


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of their positions (as Spearman needs)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new_group = np.r_[True, xs[1:] != xs[:-1]]
    firsts = np.flatnonzero(new_group)
    sizes = np.diff(np.r_[firsts, len(x)])
    avg = firsts + (sizes + 1) / 2.0  # mean of positions firsts+1 .. firsts+size
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(avg, sizes)
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of average ranks.
    Undefined when a ranking is constant: 1.0 if both are, else 0.0."""
    ra, rb = average_ranks(a), average_ranks(b)
    da, db = ra - ra.mean(), rb - rb.mean()
    denom = float(np.sqrt((da * da).sum() * (db * db).sum()))
    if denom == 0.0:
        return 1.0 if not da.any() and not db.any() else 0.0
    return float((da * db).sum() / denom)


def top_k(scores: np.ndarray, k: int) -> set[int]:
    """Indices of the k highest scores; ties go to the earlier trajectory."""
    return set(np.argsort(-scores, kind="stable")[:k].tolist())


def ablate(
    matrix: np.ndarray,
    weights: Sequence[float] | None = None,
    signals: Sequence[str] = SIGNALS,
    k: int = TOP_K,
) -> list[AblationRow]:
    """§11 leave-one-out rows, sorted by impact (largest first). With fewer than k trajectories the
    top set is all of them and the overlap term is (n − overlap) / n."""
    m = np.asarray(matrix, dtype=float)
    w = np.asarray([WEIGHTS[s] for s in signals] if weights is None else weights, dtype=float)
    if m.ndim != 2 or m.shape[1] != len(w) or len(w) != len(signals):
        raise ValueError(f"signal matrix {m.shape} does not match {len(w)} weights / {len(signals)} signals")
    full = merge_ties(m @ w)
    k = min(k, len(full))
    full_top = top_k(full, k)
    rows = []
    for j, name in enumerate(signals):
        ablated = merge_ties(m @ renormalised(w, j))
        rho = spearman(full, ablated)
        overlap = len(full_top & top_k(ablated, k))
        impact = (1.0 - rho) + ((k - overlap) / k if k else 0.0)
        rows.append(AblationRow(name, rho, overlap, impact))
    return sorted(rows, key=lambda r: -r.impact)


def format_table(rows: Sequence[AblationRow]) -> str:
    """The rows as the §11 table, in plain text."""
    lines = [f"{'signal dropped':<16} {'rho':>7} {'top-20 overlap':>15} {'impact':>7}"]
    lines += [f"{r.signal:<16} {r.rho:>7.3f} {r.overlap:>15d} {r.impact:>7.3f}" for r in rows]
    return "\n".join(lines)
