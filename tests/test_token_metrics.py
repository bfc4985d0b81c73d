"""A GRPO step's token metrics (engine/coherence/tokens.py): entropy percentiles over the pooled completion
tokens and Cov(log π, A) with the advantage broadcast per token and token-level centring,
against direct numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.coherence.tokens import COVARIANCE_KEY, logp_advantage_covariance, step_token_metrics


def test_percentiles_pool_every_completion_token() -> None:
    rng = np.random.default_rng(0)
    entropies = [rng.gamma(0.5, 0.4, n) for n in (3, 11, 7)]
    metrics = step_token_metrics([*entropies, None], [None] * 4, None)
    pooled = np.concatenate(entropies)
    assert metrics["entropy/p10"] == pytest.approx(np.percentile(pooled, 10))
    assert metrics["entropy/p50"] == pytest.approx(np.median(pooled))
    assert metrics["entropy/p90"] == pytest.approx(np.percentile(pooled, 90))
    assert COVARIANCE_KEY not in metrics  # no advantages: no covariance, rather than a made-up 0


def test_the_covariance_broadcasts_the_advantage_over_each_completions_tokens() -> None:
    rng = np.random.default_rng(1)
    logprobs = [-rng.gamma(1.0, 0.5, n) for n in (4, 9, 1, 6)]
    advantages = np.array([1.2, -0.4, 0.3, -1.1])
    got = logp_advantage_covariance(logprobs, advantages)
    tokens = np.concatenate(logprobs)
    per_token = np.repeat(advantages, [len(x) for x in logprobs])
    # Token-level centring: the population covariance over tokens, not over completions.
    assert got == pytest.approx(np.cov(tokens, per_token, ddof=0)[0, 1])
    assert got == pytest.approx(np.mean((tokens - tokens.mean()) * (per_token - per_token.mean())))
    weighted_by_completion = np.cov([x.mean() for x in logprobs], advantages, ddof=0)[0, 1]
    assert got != pytest.approx(weighted_by_completion)


def test_rewarding_the_confident_tokens_gives_a_positive_covariance() -> None:
    sure, unsure = np.full(5, -0.01), np.full(5, -2.0)
    assert logp_advantage_covariance([sure, unsure], np.array([1.0, -1.0])) > 0  # entropy will fall
    assert logp_advantage_covariance([sure, unsure], np.array([-1.0, 1.0])) < 0  # entropy will rise


def test_unknown_pieces_are_left_out() -> None:
    logprobs = [np.array([-0.5, -1.0]), None, np.array([-0.2, np.nan, -0.3]), np.array([])]
    advantages = np.array([1.0, 5.0, np.nan, 2.0])
    assert logp_advantage_covariance(logprobs, advantages) == pytest.approx(0.0)  # one completion: A constant
    both = logp_advantage_covariance(logprobs[:1] + [np.array([-0.2, -0.3])], np.array([1.0, -1.0]))
    assert both == pytest.approx(np.cov([-0.5, -1.0, -0.2, -0.3], [1, 1, -1, -1], ddof=0)[0, 1])
    assert logp_advantage_covariance([None, None], np.array([1.0, 2.0])) is None
    assert step_token_metrics([], [], None) == {}
