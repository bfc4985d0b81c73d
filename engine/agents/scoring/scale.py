"""The [0, 1] scale every score of the agents plane is on."""

from __future__ import annotations

import math
from collections.abc import Sequence

NEUTRAL = 0.5  # the score of a vote, step or profile that could not be judged: undecided, not wrong


def clamp01(value: float) -> float:
    """`value` limited to [0, 1]; NaN (undecided) is 0.5."""
    if math.isnan(value):
        return NEUTRAL
    return min(1.0, max(0.0, value))


def mean(values: Sequence[float], empty: float = 0.0) -> float:
    return sum(values) / len(values) if values else empty
