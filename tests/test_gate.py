"""The cascade gate (docs/reference/carl.md §7, driven by task reward only), the capped weights,
and the gated wrapper."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rewards import CascadeGate, CascadeWeights, CoherenceReward, GateState, RewardError, gated

REFERENCE = [0.0, 0.0, 0.1, 0.0, 0.2, 0.1]


def feed(gate: CascadeGate, values: list[float], first_step: int = 0, stride: int = 1) -> list[GateState]:
    return [gate.update(first_step + i * stride, v) for i, v in enumerate(values)]


def naive_fires(values: list[float]) -> int | None:
    """Index at which the percentile rule first holds, recomputed from scratch (the spec, literally)."""
    clean: list[float] = []
    for i, v in enumerate(values):
        clean.append(v if math.isfinite(v) else 0.0)
        n = len(clean)
        if n < 5:
            continue
        threshold = sorted(clean)[min(math.floor(0.6 * n), n - 1)]
        if threshold > 0 and sum(1 for x in clean[-5:] if x >= threshold and x > 0) >= 3:
            return i
    return None


def test_reference_example_fires_on_the_sixth_value() -> None:
    states = feed(CascadeGate(), REFERENCE, first_step=36)
    assert [s.state for s in states] == ["closed"] * 5 + ["ramping"]
    fifth, sixth = states[4], states[5]
    assert fifth.reason == "closed: 2/5 above p60=0.10 (n=5)"
    assert (fifth.threshold, fifth.above, fifth.window, fifth.history_len) == (0.1, 2, 5, 5)
    assert sixth.threshold == 0.1 and sixth.above == 3 and sixth.opened_at == 41
    assert sixth.reason == "ramping 1/10 since step 41" and sixth.multiplier == pytest.approx(0.1)
    assert states[2].reason == "closed: 3/5 points" and states[2].multiplier == 0.0


def test_ramp_then_open_and_latched() -> None:
    gate = CascadeGate()
    feed(gate, REFERENCE, first_step=36)
    later = feed(gate, [0.0] * 12, first_step=42)  # the task reward collapses: the gate stays open
    assert [s.multiplier for s in later] == pytest.approx(
        [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1, 1, 1]
    )
    assert later[2].reason == "ramping 4/10 since step 41"
    assert later[8].state == "open" and later[8].reason == "open since step 41"
    assert all(s.opened_at == 41 for s in later) and gate.multiplier == 1.0


def test_ramp_follows_step_numbers_and_cap() -> None:
    gate = CascadeGate(ramp_steps=4, coherence_cap=0.5)
    feed(gate, REFERENCE, first_step=0)  # opens at step 5
    assert gate.update(6, 0.1).multiplier == pytest.approx(0.5 * 2 / 4)
    assert gate.update(20, 0.1).state == "open" and gate.multiplier == 0.5
    instant = CascadeGate(ramp_steps=1)
    assert feed(instant, REFERENCE)[-1].state == "open"


def test_decision_ignores_step_numbers() -> None:
    values = [0.0, 0.05, 0.0, 0.3, 0.1, 0.0, 0.2, 0.4, 0.1, 0.5]
    a = feed(CascadeGate(), values, first_step=0)
    b = feed(CascadeGate(), values, first_step=5000, stride=7)
    assert [s.state != "closed" for s in a] == [s.state != "closed" for s in b]
    assert [(s.threshold, s.above, s.history_len) for s in a] == [
        (s.threshold, s.above, s.history_len) for s in b
    ]
    # The ramp counts steps from the opening, wherever it happened.
    opened = next(i for i, s in enumerate(a) if s.opened_at is not None)
    assert b[opened].multiplier == a[opened].multiplier == pytest.approx(0.1)


def test_non_finite_values_count_as_zero() -> None:
    gate = CascadeGate()
    states = feed(gate, [math.nan, math.inf, -math.inf, None, 0.0, 0.0])  # type: ignore[list-item]
    assert gate.history == [0.0] * 6 and states[-1].state == "closed"
    assert states[-1].reason == "closed: 0/5 above p60=0.00 (n=6)"
    assert json.dumps(gate.to_dict())  # still JSON-safe


def test_serialization_round_trip_resumes_exactly() -> None:
    values = [0.0, 0.1, 0.0, 0.0, 0.2, 0.15, 0.3, 0.05, 0.4, 0.2]
    original = CascadeGate(ramp_steps=6)
    feed(original, values[:7])
    restored = CascadeGate.from_dict(json.loads(json.dumps(original.to_dict())))
    assert restored.last == original.last and restored.history == original.history
    assert restored.multiplier == original.multiplier
    tail = values[7:] + [0.0] * 5
    assert feed(restored, tail, first_step=7) == feed(original, tail, first_step=7)
    state = original.last
    assert state is not None and GateState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_invalid_settings_are_one_line_errors() -> None:
    for kwargs in ({"percentile": 1.5}, {"min_above": 6}, {"window": 0}, {"coherence_cap": 0.0}):
        with pytest.raises(RewardError):
            CascadeGate(**kwargs)


values_st = st.lists(
    st.floats(allow_nan=True, allow_infinity=True, width=32) | st.sampled_from([0.0, 0.1, 0.2, 0.5]),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(max_value=0.0, allow_nan=False) | st.just(math.nan), max_size=40))
def test_never_opens_without_positive_task_reward(values: list[float]) -> None:
    gate = CascadeGate()
    assert all(s.state == "closed" and s.multiplier == 0.0 for s in feed(gate, values))


@settings(max_examples=150, deadline=None)
@given(values_st)
def test_matches_the_rule_recomputed_from_scratch(values: list[float]) -> None:
    states = feed(CascadeGate(), values)
    fired = next((i for i, s in enumerate(states) if s.state != "closed"), None)
    assert fired == naive_fires(values)


# --- weights ----------------------------------------------------------------------------------

BASE = {"task": 2.0, "format": 1.0, "coherence": 3.0, "commitment": 0.5}


def test_weights_gate_and_cap_coherence() -> None:
    weights = CascadeWeights(BASE)
    assert weights.weights(0.0) == {"task": 2.0, "format": 1.0, "coherence": 0.0, "commitment": 0.0}
    assert weights.weights(1.0) == {"task": 2.0, "format": 1.0, "coherence": 1.0, "commitment": 0.5}
    assert weights.weights(0.5)["coherence"] == 0.5  # capped first, then ramped
    assert weights.weights(math.nan)["coherence"] == 0.0 and weights.weights(7.0)["coherence"] == 1.0
    assert weights.is_capped("coherence") and not weights.is_capped("commitment")
    assert weights.ordered(["coherence", "task"], 1.0) == [1.0, 2.0]


def test_set_weight_validates_and_keeps_the_cap() -> None:
    weights = CascadeWeights(BASE)
    assert weights.set_weight("commitment", 10.0) == 1.0  # capped at 0.5 * task
    assert weights.set_weight("task", 1.0) == 1.0
    assert weights.weights(1.0)["coherence"] == 0.5 and weights.weights(1.0)["commitment"] == 0.5
    assert weights.set_weight("format", 0.0) == 0.0
    with pytest.raises(
        RewardError, match=r"unknown reward 'nope' \(known: task, format, coherence, commitment\)"
    ):
        weights.set_weight("nope", 1.0)
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(RewardError, match="finite number >= 0"):
            weights.set_weight("coherence", bad)
    restored = CascadeWeights.from_dict(json.loads(json.dumps(weights.to_dict())))
    assert restored.weights(0.3) == weights.weights(0.3)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["format", "coherence", "commitment", "concise"]),
        st.floats(min_value=0, max_value=1e6),
    ),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0, max_value=0.99),
    st.floats(min_value=0, max_value=1),
)
def test_coherence_never_outweighs_the_task(base: dict, task: float, ratio: float, m: float) -> None:
    weights = CascadeWeights({"task": task, **base}, cap_ratio=ratio).weights(m)
    for name in ("coherence", "commitment"):
        assert weights.get(name, 0.0) <= ratio * task + 1e-9


def test_weights_settings_errors() -> None:
    with pytest.raises(RewardError, match="cap_ratio"):
        CascadeWeights(BASE, cap_ratio=1.0)
    with pytest.raises(RewardError, match="task reward"):
        CascadeWeights({"format": 1.0})
    with pytest.raises(RewardError, match="finite number"):
        CascadeWeights({"task": -1.0})
    assert CascadeWeights({"mine": 4.0, "coherence": 4.0}, task_names=["mine"]).weights(1)["coherence"] == 2.0


# --- gated ------------------------------------------------------------------------------------


class Counting:
    """A reward that counts its calls."""

    __name__ = "coherence"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        self.calls += 1
        return [0.8, None][: len(completions)]


def test_gated_does_not_call_while_closed() -> None:
    inner, multiplier = Counting(), [0.0]
    wrapped = gated(inner, lambda: multiplier[0])
    assert wrapped.__name__ == "coherence"
    assert wrapped(prompts=["p", "p"], completions=["a", "b"]) == [0.0, 0.0] and inner.calls == 0
    multiplier[0] = math.nan
    assert wrapped(prompts=["p"], completions=["a"]) == [0.0] and inner.calls == 0
    multiplier[0] = 0.25
    assert wrapped(prompts=["p", "p"], completions=["a", "b"]) == [0.8, None] and inner.calls == 1
    scaled = gated(inner, lambda: 0.25, scale=True)
    assert scaled(prompts=["p", "p"], completions=["a", "b"]) == [0.2, None]


def test_gated_follows_a_live_gate() -> None:
    gate, inner = CascadeGate(), Counting()
    wrapped = gated(inner, lambda: gate.multiplier)
    for step, value in enumerate(REFERENCE):
        wrapped(prompts=["p"], completions=["a"])  # this step's rewards use the gate as it stood before
        gate.update(step, value)
    assert inner.calls == 0 and gate.multiplier > 0
    wrapped(prompts=["p"], completions=["a"])
    assert inner.calls == 1
    assert gated(CoherenceReward(), lambda: 1.0).__name__ == "coherence"


def test_always_open_is_open_at_full_strength_from_the_first_step_and_survives_a_resume() -> None:
    gate = CascadeGate(min_points=5, ramp_steps=10, always_open=True)
    first = gate.update(7, 0.0)  # no evidence the task works: the ablation opens all the same
    assert (first.state, first.multiplier, first.opened_at) == ("open", 1.0, 7)
    assert "always on" in first.reason
    restored = CascadeGate.from_dict(json.loads(json.dumps(gate.to_dict())))
    assert restored.always_open and restored.update(8, 0.5).multiplier == 1.0
    gated = CascadeGate(min_points=5, ramp_steps=10)
    assert gated.update(7, 0.0).multiplier == 0.0
