"""Phases and the crystallization step, on constructed Phi series (health: test_health.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.coherence.phases import _running_noise as running_noise
from engine.coherence.phases import (
    classify_phase,
    crystallization_step,
    phases_per_step,
    robust_noise,
)


def sigmoid_series(
    n: int, mid: float, scale: float, noise: float, seed: int, lo: float = 0.3, hi: float = 0.7
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.arange(n, dtype=np.float64)
    return x, lo + (hi - lo) / (1 + np.exp(-(x - mid) / scale)) + rng.normal(0, noise, n)


# --- crystallization step ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "mid", "scale", "noise"),
    [(60, 20, 2, 0.04), (200, 120, 5, 0.02), (1000, 700, 30, 0.05), (10_000, 3000, 100, 0.05)],
)
def test_clean_sigmoid_is_found(n: int, mid: float, scale: float, noise: float) -> None:
    for seed in range(3):
        x, y = sigmoid_series(n, mid, scale, noise, seed)
        found = crystallization_step(x, y)
        assert found is not None
        assert abs(found.step - mid) <= 0.03 * n
        assert found.confidence > 0.9
        assert found.phi_before == pytest.approx(0.3, abs=0.03)
        assert found.phi_after == pytest.approx(0.7, abs=0.03)
        assert found.width == pytest.approx(2 * np.log(9) * scale, rel=0.25)


def test_uneven_steps_and_gaps() -> None:
    x, y = sigmoid_series(80, 40, 3, 0.02, seed=4)
    steps = x * 10 + 5  # logged every 10 steps
    y[[3, 50]] = np.nan
    found = crystallization_step(steps, y)
    assert found is not None and found.step in set(steps.astype(int)) and abs(found.step - 405) <= 20


@pytest.mark.parametrize("seed", range(20))
def test_noise_flat_and_trend_are_not_transitions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 400))
    x = np.arange(n)
    for y in (0.5 + rng.normal(0, 0.02, n), np.linspace(0.2, 0.8, n) + rng.normal(0, 0.02, n)):
        found = crystallization_step(x, y)
        assert found is None or found.confidence < 0.3


def test_degenerate_series() -> None:
    assert crystallization_step(np.arange(50), np.full(50, 0.4)) is None
    assert crystallization_step(np.arange(5), np.linspace(0, 1, 5)) is None  # too few points
    assert crystallization_step(np.arange(0), np.arange(0)) is None
    x, y = sigmoid_series(200, 100, 5, 0.02, seed=0, lo=0.7, hi=0.3)
    assert crystallization_step(x, y) is None  # falling: melting, not crystallization


# --- phases -----------------------------------------------------------------------------------


def test_phase_labels_on_simple_series() -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.002, 200)
    assert classify_phase(np.linspace(0.9, 0.3, 200) + noise) == "melting"
    assert classify_phase(np.linspace(0.3, 0.9, 200) + noise) == "crystallizing"
    assert classify_phase(np.full(200, 0.9) + noise) == "knowing"
    assert classify_phase(np.full(200, 0.2) + noise) == "guessing"
    assert classify_phase(np.full(4, 0.5)) is None
    falling = phases_per_step(np.linspace(0.9, 0.3, 200) + noise)
    assert falling[:4] == [None] * 4 and falling[-1] == "melting"


@pytest.mark.parametrize("seed", range(6))
def test_phases_per_step_matches_every_prefix(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 300
    series = [
        0.5 + np.cumsum(rng.normal(0, 0.01, n)),
        rng.integers(0, 4, n) / 8.0,  # ties everywhere: the medians' even/odd cases
        sigmoid_series(n, 150, 10, 0.01, seed)[1],
    ][seed % 3]
    if seed >= 3:
        series[rng.integers(0, n, 10)] = np.nan
    assert phases_per_step(series) == [classify_phase(series[: i + 1]) for i in range(n)]
    finite = series[np.isfinite(series)]
    noise = running_noise(finite)
    assert all(noise[k - 1] == robust_noise(finite[:k]) for k in range(2, len(finite) + 1))


def test_phases_per_step_is_fast() -> None:
    phi = 0.5 + np.cumsum(np.random.default_rng(1).normal(0, 0.01, 10_000))
    start = time.perf_counter()
    phases = phases_per_step(phi)
    assert time.perf_counter() - start < 1.0
    assert len(phases) == 10_000 and phases[-1] == classify_phase(phi)
    assert phases_per_step(np.array([])) == []
