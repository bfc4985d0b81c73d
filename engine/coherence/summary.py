"""Phi aggregation: per completion, per step, and the completions shown in the samples table.

numpy only (no torch), so the store, the daemon and the TUI can use it. Definitions follow
docs/reference/carl.md §3 and §5:

- crystallization: dPhi > +DEFECT_THRESHOLD between consecutive tokens; melting: dPhi < -it;
  defect_density = (crystallizations + meltings) / tokens.
- commitment event: an upward jump dPhi > COMMITMENT_THRESHOLD (default 0.03, the same size as a
  crystallization; kept separate so a reward can be tuned without moving the defect counts). At
  |V| = 151,936 a jump of 0.03 is a drop of ~0.36 nats of entropy in one token.
- per step, `phi_mean` is TOKEN-weighted (every completion token counts once, as TRL's `entropy`
  metric), recorded as weighting="token"; the completion-weighted mean (mean of per-completion
  means, what the published callback logs) and the spread (std of per-completion means) are
  separate metrics, because the two means differ whenever completion lengths differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFECT_THRESHOLD = 0.03
COMMITMENT_THRESHOLD = 0.03
HIST_BINS = 20
# Where a step's coherence rewards got Φ: 1 from the generating pass (measured while sampling, no
# extra forward), 0 from one no-grad forward; logged only on steps that called them (gate open).
PHI_FROM_GENERATE = "phi/from_generate"


@dataclass(frozen=True)
class CompletionSummary:
    """One completion's Phi trace in a few numbers (NaN statistics when it has no tokens)."""

    tokens: int
    phi_mean: float
    phi_std: float
    phi_min: float
    phi_p10: float
    phi_p50: float
    phi_p90: float
    entropy_mean: float  # nats
    surprisal_mean: float  # nats; NaN when not given
    n_crystallizations: int
    n_meltings: int
    defect_density: float
    commitments: tuple[int, ...]  # token indices t where Phi[t] - Phi[t-1] > the threshold

    @property
    def n_commitments(self) -> int:
        return len(self.commitments)


def _floats(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).ravel()


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def summarize_completion(
    phi: Any,
    entropy: Any,
    surprisal: Any = None,
    *,
    defect_threshold: float = DEFECT_THRESHOLD,
    commitment_threshold: float = COMMITMENT_THRESHOLD,
) -> CompletionSummary:
    """Summary of one completion's per-token Phi, entropy (nats) and optional surprisal."""
    phi, entropy = _floats(phi), _floats(entropy)
    if phi.shape != entropy.shape:
        raise ValueError(f"phi has {phi.size} tokens but entropy has {entropy.size}")
    surprisal_mean = math.nan if surprisal is None else _mean(_floats(surprisal))
    if phi.size == 0:
        nan = math.nan
        return CompletionSummary(0, nan, nan, nan, nan, nan, nan, nan, surprisal_mean, 0, 0, 0.0, ())
    dphi = np.diff(phi)
    crystallizations = int((dphi > defect_threshold).sum())
    meltings = int((dphi < -defect_threshold).sum())
    p10, p50, p90 = np.percentile(phi, [10, 50, 90])
    return CompletionSummary(
        tokens=int(phi.size),
        phi_mean=float(phi.mean()),
        phi_std=float(phi.std()),
        phi_min=float(phi.min()),
        phi_p10=float(p10),
        phi_p50=float(p50),
        phi_p90=float(p90),
        entropy_mean=float(entropy.mean()),
        surprisal_mean=surprisal_mean,
        n_crystallizations=crystallizations,
        n_meltings=meltings,
        defect_density=(crystallizations + meltings) / phi.size,
        # dphi[i] is the jump into token i + 1
        commitments=tuple(int(i) + 1 for i in np.flatnonzero(dphi > commitment_threshold)),
    )


def phi_histogram(phi: Any, bins: int = HIST_BINS) -> list[int]:
    """Counts of Phi in `bins` equal bins over [0, 1] (rounding just outside is clipped in)."""
    values = np.clip(_floats(phi), 0.0, 1.0)
    counts, _ = np.histogram(values[np.isfinite(values)], bins=bins, range=(0.0, 1.0))
    return [int(c) for c in counts]


def step_phi_stats(
    step: int,
    phi: Sequence[Any],
    entropy: Sequence[Any],
    vocab_size: int,
    *,
    commitment_threshold: float = COMMITMENT_THRESHOLD,
    defect_threshold: float = DEFECT_THRESHOLD,
) -> tuple[dict[str, Any], dict[str, float]]:
    """(row for `Store.add_phi_stats`, extra metrics by key) for one step's completions.

    phi and entropy: one per-token array per completion. The row's mean and percentiles pool
    every completion token (weighting="token"); the metrics are per completion:
    `phi/completion_mean`, `phi/spread` (std of per-completion means), `phi/commitments`
    (commitment events per completion), `phi/defect_density` (mean over completions) and
    `phi/entropy_completion_mean` (nats). Empty completions count in no mean.
    """
    if len(phi) != len(entropy):
        raise ValueError(f"{len(phi)} Phi traces but {len(entropy)} entropy traces")
    summaries = [
        summarize_completion(
            p, h, defect_threshold=defect_threshold, commitment_threshold=commitment_threshold
        )
        for p, h in zip(phi, entropy, strict=True)
    ]
    pooled_phi = np.concatenate([_floats(p) for p in phi]) if phi else np.zeros(0)
    pooled_entropy = np.concatenate([_floats(h) for h in entropy]) if entropy else np.zeros(0)
    row: dict[str, Any] = {
        "step": int(step),
        "phi_mean": None,
        "phi_p10": None,
        "phi_p50": None,
        "phi_p90": None,
        "entropy_mean": None,
        "tokens": int(pooled_phi.size),
        "weighting": "token",
        "vocab_size": int(vocab_size),
        "hist": phi_histogram(pooled_phi),
    }
    if pooled_phi.size:
        p10, p50, p90 = np.percentile(pooled_phi, [10, 50, 90])
        row.update(
            phi_mean=float(pooled_phi.mean()),
            phi_p10=float(p10),
            phi_p50=float(p50),
            phi_p90=float(p90),
            entropy_mean=float(pooled_entropy.mean()),
        )
    return row, _completion_metrics([s for s in summaries if s.tokens])


def _completion_metrics(summaries: list[CompletionSummary]) -> dict[str, float]:
    if not summaries:
        return {}
    means = np.array([s.phi_mean for s in summaries])
    return {
        "phi/completion_mean": float(means.mean()),
        "phi/spread": float(means.std()),
        "phi/commitments": float(np.mean([s.n_commitments for s in summaries])),
        "phi/defect_density": float(np.mean([s.defect_density for s in summaries])),
        "phi/entropy_completion_mean": float(np.mean([s.entropy_mean for s in summaries])),
    }


def pick_traces(rewards: Sequence[float] | np.ndarray, rng: np.random.Generator) -> dict[str, int]:
    """Indices of the best, worst and median completion by reward, and one random other one.

    Ties keep index order (best and worst: the lowest index); the median is the lower middle of
    the rewards sorted that way. NaN
    rewards are never best, worst or median. `random` avoids the three picked by rank when
    another completion exists.
    """
    values = _floats(rewards)
    if values.size == 0:
        return {}
    picks: dict[str, int] = {}
    ranked = np.flatnonzero(np.isfinite(values))
    if ranked.size:
        order = ranked[np.argsort(values[ranked], kind="stable")]
        picks["best"] = int(ranked[np.argmax(values[ranked])])
        picks["worst"] = int(order[0])
        picks["median"] = int(order[(order.size - 1) // 2])
    others = np.setdiff1d(np.arange(values.size), list(picks.values()))
    pool = others if others.size else np.arange(values.size)
    picks["random"] = int(pool[rng.integers(pool.size)])
    return picks
