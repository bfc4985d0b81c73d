"""Per-domain advantages: a Bayesian-smoothed z-score of each reward (docs/reference/karl.md §4,
project rule 12(c)).

    μ_g = mean of all rewards                      b_d = (n_d·μ_d + κ·μ_g) / (n_d + κ),  κ = 10
    σ_d = max(popstd(rewards of d), 0.02)          if n_d ≥ 5
        = max(popstd(all rewards about μ_g), 0.02) otherwise
    A   = round((R − b_d) / σ_d, 4)

docs/reference/karl.md §12(c): this is the only advantage. It is computed once, over the whole store, after
every record has been scored, and recomputed whenever records are added or re-scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.trajectories.scoring.signals import round4

GLOBAL_DOMAIN = "_global"
KAPPA = 10.0  # prior strength: a domain needs about 10 records to outweigh the global mean
SIGMA_FLOOR = 0.02
MIN_DOMAIN_N = 5  # fewer records than this: the domain's own spread is noise, use the global σ


@dataclass(frozen=True)
class DomainBaseline:
    """One domain's §4 statistics, as the store's trajectory_domains table keeps them."""

    domain: str
    n: int
    mean: float  # plain mean of the domain's rewards
    baseline: float  # smoothed toward the global mean
    sigma: float


def domain_key(domain: str | None) -> str:
    return domain or GLOBAL_DOMAIN


def compute_advantages(
    rewards: np.ndarray, domains: Sequence[str | None]
) -> tuple[np.ndarray, dict[str, DomainBaseline]]:
    """§4 advantages for every reward (rounded to 4 decimals) and the baseline of every domain."""
    r = np.asarray(rewards, dtype=float)
    if len(r) != len(domains):
        raise ValueError(f"{len(r)} rewards but {len(domains)} domains")
    if len(r) == 0:
        return np.zeros(0), {}
    index: dict[str, int] = {}  # domain -> column, in first-seen order
    inverse = np.array([index.setdefault(d or GLOBAL_DOMAIN, len(index)) for d in domains], dtype=np.int64)
    names = list(index)
    mu_g = float(r.mean())
    sigma_g = max(float(np.sqrt(np.mean((r - mu_g) ** 2))), SIGMA_FLOOR)
    n = np.bincount(inverse, minlength=len(names))
    mean = np.bincount(inverse, r, len(names)) / n
    var = np.bincount(inverse, (r - mean[inverse]) ** 2, len(names)) / n  # two-pass: stable
    baseline = (n * mean + KAPPA * mu_g) / (n + KAPPA)
    sigma = np.where(n >= MIN_DOMAIN_N, np.maximum(np.sqrt(var), SIGMA_FLOOR), sigma_g)
    advantages = round4((r - baseline[inverse]) / sigma[inverse])
    table = {
        name: DomainBaseline(name, int(n[i]), float(mean[i]), float(baseline[i]), float(sigma[i]))
        for i, name in enumerate(names)
    }
    return advantages, table
