"""Key normalization and derived Phi, shared by the three observe formats."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.observe import derived_phi, normalize_key


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("train/loss", "loss"),
        ("loss", "loss"),
        ("eval/loss", "eval/loss"),
        ("test/accuracy", "test/accuracy"),
        ("train/rewards/format/mean", "rewards/format/mean"),
        ("rewards/format/std", "rewards/format/std"),
        ("phi", "phi/mean"),
        ("phi_mean", "phi/mean"),
        ("trace/phi_mean", "phi/mean"),
        ("train/trace/phi_mean", "phi/mean"),
        ("coherence/phi_mean", "phi/mean"),
        ("phi_std", "phi/std"),
        ("trace/phi_std", "phi/std"),
        ("entropy_mean", "phi/entropy"),
        ("trace/entropy_mean", "phi/entropy"),
        ("reward_mean", "reward"),
        ("mean_reward", "reward"),
        ("reward_format", "rewards/format/mean"),
        ("train/reward_task_success", "rewards/task_success/mean"),
        ("reward_std", "reward_std"),
        ("reward", "reward"),
        ("entropy", "entropy"),
        ("kl", "kl"),
        ("frac_reward_zero_std", "frac_reward_zero_std"),
        ("train_loss", "train_loss"),  # trainer_state's end-of-run summary keeps its name
        ("profiling/Time taken: GRPOTrainer.transformers.generate", None),
        ("train/profiling/Time taken: x", None),
        ("train/global_step", None),
        ("global_step", None),
        ("step", None),
        ("", None),
        ("train/", None),
        ("x" * 201, None),
        ("bad\ud800key", "bad\ufffdkey"),  # made storable where it enters (issue 22 §2), not dropped
    ],
)
def test_normalize_key(key: str, expected: str | None) -> None:
    assert normalize_key(key) == expected


def test_train_loss_is_the_loss_in_jsonl_only() -> None:
    assert normalize_key("train_loss", jsonl=True) == "loss"
    assert normalize_key("train/train_loss", jsonl=True) == "loss"
    assert normalize_key("train_loss") == "train_loss"


def test_derived_phi_from_entropy() -> None:
    derived = dict(derived_phi({"entropy": 2.0, "loss": 1.0}, 64))
    assert derived["phi/mean"] == pytest.approx(1 - 2.0 / math.log(64), abs=1e-15)
    assert derived["phi/entropy"] == 2.0


def test_derived_entropy_from_phi() -> None:
    assert derived_phi({"phi/mean": 0.75}, 1000) == [("phi/entropy", pytest.approx(0.25 * math.log(1000)))]


@pytest.mark.parametrize(
    ("values", "vocab"),
    [
        ({"entropy": 2.0}, None),  # |V| unknown
        ({"entropy": 2.0}, 1),  # ln|V| = 0
        ({"entropy": 2.0, "phi/mean": 0.9}, 64),  # Phi already there
        ({"phi/mean": 0.9, "phi/entropy": 0.3}, 64),  # both there
        ({"phi/mean": 0.9, "entropy": 0.3}, 64),
        ({"loss": 1.0}, 64),
        ({"entropy": None}, 64),
    ],
)
def test_nothing_derived(values: dict[str, float | None], vocab: int | None) -> None:
    assert derived_phi(values, vocab) == []


@given(st.text(max_size=300))
def test_normalize_key_never_raises(key: str) -> None:
    result = normalize_key(key)
    jsonl_result = normalize_key(key, jsonl=True)
    for out in (result, jsonl_result):
        if out is not None:
            assert out
            out.encode("utf-8")  # storable
            assert not out.startswith("profiling/")
            assert out not in ("step", "global_step")


@given(
    st.dictionaries(
        st.sampled_from(["entropy", "phi/mean", "phi/entropy", "loss"]), st.floats(allow_nan=True) | st.none()
    ),
    st.integers(min_value=-5, max_value=300_000) | st.none(),
)
def test_derived_phi_never_raises(values: dict[str, float | None], vocab: int | None) -> None:
    for key, value in derived_phi(values, vocab):
        assert key in ("phi/mean", "phi/entropy") and key not in values
        assert isinstance(value, float)
