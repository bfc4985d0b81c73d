"""What a GRPO step's completion tokens say about its RL health, beyond their mean entropy (numpy only).

Both training backends record these per step, from arrays the step already has (the loss forward's per-token
entropy and log-probability, and the advantages): no extra model call.

- `entropy/p10`, `entropy/p50`, `entropy/p90`: percentiles of the per-token entropy (nats, at the sampling
  temperature) over every completion token of the step, pooled as `phi/*` pools them. The mean hides a policy
  that is certain on most tokens and undecided on a few (the "forking" tokens,
  docs/reference/frameworks.md §4).
- `cov/logp_adv`: Cov(log π(a|s), A) over the same tokens, each token carrying its completion's advantage,
  centred at the token level: mean_t[(logp_t - mean(logp)) * (A_t - mean(A))], veRL's per-token form
  (docs/reference/frameworks.md §4). Under natural policy gradient the entropy moves by about -η times this
  covariance: while it is positive (the tokens the policy was already sure of are the rewarded ones), the
  entropy falls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ENTROPY_PERCENTILES = (10, 50, 90)
COVARIANCE_KEY = "cov/logp_adv"


def entropy_key(percentile: int) -> str:
    return f"entropy/p{percentile}"


def step_token_metrics(
    entropies: Sequence[np.ndarray | None],
    logprobs: Sequence[np.ndarray | None],
    advantages: np.ndarray | None,
) -> dict[str, float]:
    """The step's entropy percentiles and log-prob/advantage covariance; one array (or None) per completion.

    A completion without entropies counts in no percentile; one without log-probabilities, or whose advantage
    is unknown or not finite, counts in no covariance. A key is left out when no token counts for it.
    """
    out: dict[str, float] = {}
    known = [np.asarray(e, dtype=np.float64) for e in entropies if e is not None and len(e)]
    if known:
        pooled = np.concatenate(known)
        pooled = pooled[np.isfinite(pooled)]
        if pooled.size:
            for p, value in zip(ENTROPY_PERCENTILES, np.percentile(pooled, ENTROPY_PERCENTILES), strict=True):
                out[entropy_key(p)] = float(value)
    covariance = logp_advantage_covariance(logprobs, advantages)
    if covariance is not None:
        out[COVARIANCE_KEY] = covariance
    return out


def logp_advantage_covariance(
    logprobs: Sequence[np.ndarray | None], advantages: np.ndarray | None
) -> float | None:
    """mean_t[(logp_t - mean(logp)) * (A_t - mean(A))] over the completion tokens, A broadcast per token."""
    if advantages is None:
        return None
    logp_parts, adv_parts = [], []
    for logp, advantage in zip(logprobs, np.asarray(advantages, dtype=np.float64), strict=True):
        if logp is None or not len(logp) or not np.isfinite(advantage):
            continue
        values = np.asarray(logp, dtype=np.float64)
        keep = np.isfinite(values)
        logp_parts.append(values[keep])
        adv_parts.append(np.full(int(keep.sum()), advantage))
    if not logp_parts:
        return None
    logp, adv = np.concatenate(logp_parts), np.concatenate(adv_parts)
    if not logp.size:
        return None
    return float(np.mean((logp - logp.mean()) * (adv - adv.mean())))
