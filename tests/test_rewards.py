"""The five reward functions on hand-made completions, for the tool-call and the reference task, and
loading a user's reward by import path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine.demo import task as demo
from engine.rewards import (
    CachedPhiProvider,
    CoherenceReward,
    CommitmentReward,
    RewardError,
    concise_reward,
    load_reward,
    make_concise_reward,
    make_format_reward,
    make_task_reward,
)
from engine.tasks import ReferenceTask, ToolCallTask, task_for

task_reward = make_task_reward(ToolCallTask())
format_reward = make_format_reward(ToolCallTask())

CALL = '{"tool": "get_weather", "args": {"city": "Paris"}}'


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_names_are_the_short_stable_ones() -> None:
    names = [
        f.__name__
        for f in (task_reward, format_reward, concise_reward, CoherenceReward(), CommitmentReward())
    ]
    assert names == ["task", "format", "concise", "coherence", "commitment"]
    assert make_concise_reward(10, "tokens").__name__ == "concise"


# --- task -------------------------------------------------------------------------------------


def test_task_reward_scores_tool_and_argument() -> None:
    completions = [
        CALL,
        '{"tool": "get_weather", "args": {"city": "Rome"}}',
        '{"tool": "get_time", "args": {"city": "Paris"}}',
        '{"tool": "get_time", "args": {}}',
        "get_weather in Paris please",
        "no idea",
    ]
    n = len(completions)
    got = task_reward([""] * n, completions, answer_tool=["get_weather"] * n, answer_city=["Paris"] * n)
    assert got == [1.0, 0.5, 0.5, 0.0, 0.4, 0.0]


def test_task_reward_on_the_demo_rows_and_chat_completions() -> None:
    rows = demo.task_rows()[:24]
    completions = [chat(CALL), chat("x"), chat('{"tool": "get_news", "args": {"city": "Oslo"}}')] * 8
    kwargs = {
        "answer_tool": [r["answer_tool"] for r in rows],
        "answer_city": [r["answer_city"] for r in rows],
    }
    prompts = [r["prompt"] for r in rows]
    want = []
    for row, text in zip(
        rows, [CALL, "x", '{"tool": "get_news", "args": {"city": "Oslo"}}'] * 8, strict=True
    ):
        call = demo.TASK.parse(text)
        if call is None:
            want.append(0.0)
        else:
            want.append(
                0.5 * (call["tool"] == row["answer_tool"])
                + 0.5 * (call["args"]["city"] == row["answer_city"])
            )
    assert task_reward(prompts, completions, **kwargs) == want
    assert demo.REWARD_FUNCS[1](prompts, completions, **kwargs) == want


def test_task_reward_generalizes_to_any_answer_columns() -> None:
    call = '{"tool": "book", "args": {"city": "Lima", "nights": 2}}'
    got = task_reward(
        ["", "", ""],
        [call, call, call],
        answer_tool=["book", "book", "book"],
        answer_city=["Lima", "Lima", "Oslo"],
        answer_nights=[2, None, 3],  # None: this row does not check the argument
        trainer_state=object(),
    )
    assert got == [1.0, 1.0, 0.5]
    assert task_reward([""], ['{"tool": "ping", "args": {}}'], answer_tool=["ping"]) == [1.0]


def test_task_reward_without_the_answer_column_says_so() -> None:
    with pytest.raises(
        RewardError, match="'answer_tool' dataset column .*toolcall task; columns: answer_city"
    ):
        task_reward([""], [CALL], answer_city=["Paris"])


# --- the reference task -----------------------------------------------------------------------


def test_the_reference_task_checks_the_answer_block_with_the_rows_verifier() -> None:
    reward = make_task_reward(ReferenceTask())
    texts = [
        "<step>6 x 7</step><answer>42</answer>",
        "<answer> The answer is 42. </answer>",  # exact: only the normalised reference
        "the answer is 42",  # no tags: the whole text is the answer
        "<answer>41</answer>",
        "<answer>[1, 2]</answer>",
        "<answer></answer>",
    ]
    got = reward(
        [""] * 6,
        texts,
        reference=["42", "42", "42", "42", "[1,2]", "x"],
        verifier=["exact", "exact", "number", "number", "json", "exact"],
    )
    assert got == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert make_task_reward(ReferenceTask("contains"))(
        [""], ["<answer>it is Paris!</answer>"], reference=["paris"]
    ) == [1.0]
    with pytest.raises(RewardError, match="'reference' dataset column .*reference task"):
        reward([""], ["x"], answer=["42"])


def test_the_reference_task_format_needs_one_non_empty_answer_block() -> None:
    reward = make_format_reward(ReferenceTask())
    texts = [
        "<answer>42</answer>",
        "<answer>1</answer><answer>2</answer>",
        "<answer> </answer>",
        "<answer>42",
        "42",
    ]
    assert reward([""] * 5, texts) == [1.0, 0.7, 0.7, 0.35, 0.0]


def test_a_task_is_read_off_the_columns() -> None:
    assert task_for("auto", {"prompt", "answer_tool"}).name == "toolcall"
    assert task_for("auto", {"prompt", "reference"}).name == "reference"
    assert task_for("auto", {"prompt", "answer"}).name == "toolcall"  # its error names answer_tool
    assert task_for("reference", {"prompt", "answer_tool"}).name == "reference"
    with pytest.raises(ValueError, match="task: must be one of auto, toolcall, reference"):
        task_for("maths", {"prompt"})


# --- format -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "score"),
    [
        (CALL, 1.0),
        ("Sure: " + CALL + " done", 1.0),
        ('{"tool": "get_weather", "args": "Paris"}', 0.7),  # every piece, wrong types
        ('{"tool": "get_weather"', 0.3),
        ("{}", 0.4),
        ("hello", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(text: str, score: float) -> None:
    assert format_reward([""], [text]) == [score]
    assert format_reward([""], [chat(text)]) == [score]


# --- concise ----------------------------------------------------------------------------------


def test_concise_reward_by_characters_and_tokens() -> None:
    texts = ["x" * 50, "x" * 60, "x" * 120, "x" * 500, "   "]
    assert concise_reward([""] * 5, texts) == [1.0, 1.0, 0.5, 0.0, 0.0]
    by_tokens = make_concise_reward(target=4, unit="tokens", slack=1.0)
    ids = [[1, 2], [1] * 6, [1] * 8, []]
    assert by_tokens([""] * 4, ["a"] * 4, completion_ids=ids) == [1.0, 0.5, 0.0, 0.0]
    assert by_tokens([""], ["a"]) == [None]  # no ids, no token count
    with pytest.raises(RewardError, match="unit"):
        make_concise_reward(unit="words")


# --- coherence --------------------------------------------------------------------------------


def test_coherence_is_centred_on_the_batch_median_and_bounded() -> None:
    reward = CoherenceReward(answer_tail=1.0, scale_floor=0.01)
    traces = [np.full(6, 0.90), np.full(6, 0.95), np.full(6, 0.99), None, [np.nan, np.nan]]
    got = reward([""] * 5, ["a"] * 5, phi_traces=traces)
    b, s = reward.baseline
    assert b == pytest.approx(0.95) and s == pytest.approx(1.4826 * 0.04)
    assert got[1] == pytest.approx(0.5)
    assert got[0] == pytest.approx(1 / (1 + math.exp(0.05 / s)))
    assert got[2] == pytest.approx(1 / (1 + math.exp(-0.04 / s)))
    assert got[3] is None and got[4] is None
    assert all(0 < v < 1 for v in got[:3])


def test_coherence_scores_the_answer_not_the_uniformity() -> None:
    reward = CoherenceReward(answer_tail=0.5)
    uniform_low = np.full(10, 0.05)  # noise logits: perfectly uniform, Phi ~ 0
    decides = np.r_[np.full(5, 0.3), np.full(5, 0.95)]  # unsure while reasoning, sure at the answer
    wobbly_then_sure = np.r_[np.array([0.2, 0.6, 0.1, 0.7, 0.3]), np.full(5, 0.9)]
    low, high, wobbly = reward([""] * 3, ["a"] * 3, phi_traces=[uniform_low, decides, wobbly_then_sure])
    assert low < wobbly < high and low < 0.5 < high


def test_coherence_uses_answer_masks() -> None:
    reward = CoherenceReward(answer_tail=1.0)
    phi = np.array([0.1, 0.9, 0.1, 0.1])
    mask = np.array([False, True, False, False])
    reward([""] * 2, ["a"] * 2, phi_traces=[phi, np.full(4, 0.5)], answer_masks=[mask, None])
    assert reward.calibration == pytest.approx([0.9, 0.5])
    with pytest.raises(RewardError, match="answer masks"):
        reward([""], ["a"], phi_traces=[phi], answer_masks=[mask, mask])


def test_coherence_baseline_freezes_and_restores() -> None:
    reward = CoherenceReward(calibration_batches=2, answer_tail=1.0)
    for level in (0.5, 0.6, 0.9):
        reward([""] * 2, ["a"] * 2, phi_traces=[np.full(3, level), np.full(3, level + 0.02)])
    assert reward.batches_seen == 2 and len(reward.calibration) == 4  # the 0.9 batch did not move it
    restored = CoherenceReward(calibration_batches=2, answer_tail=1.0)
    restored.load_state_dict(json.loads(json.dumps(reward.state_dict())))
    probe = [np.full(3, 0.55), np.full(3, 0.7)]
    assert restored([""] * 2, ["a"] * 2, phi_traces=probe) == reward([""] * 2, ["a"] * 2, phi_traces=probe)


def test_phi_missing_gives_none_and_bad_lengths_fail() -> None:
    for reward in (CoherenceReward(), CommitmentReward()):
        assert reward([""] * 2, ["a", chat("b")]) == [None, None]
        assert reward([""] * 2, ["a", "b"], phi_traces=[None, []]) == [None, None]
        with pytest.raises(RewardError, match="1 Phi traces for 2"):
            reward([""] * 2, ["a", "b"], phi_traces=[np.ones(3)])


def test_both_coherence_rewards_share_one_provider_call() -> None:
    seen: list[int] = []

    def compute(*, prompts: list, completions: list, completion_ids: list, **kwargs: object) -> list:
        seen.append(len(completions))
        return [np.linspace(0.2, 0.9, len(ids)) for ids in completion_ids]

    provider = CachedPhiProvider(compute)
    coherence, commitment = CoherenceReward(provider), CommitmentReward(provider)
    ids = [[1, 2, 3], [4, 5, 6, 7]]
    for fn in (coherence, commitment):
        values = fn(prompts=["p", "p"], completions=["a", "b"], completion_ids=ids, answer_tool=["x", "x"])
        assert all(v is not None for v in values)
    assert provider.calls == 1 and seen == [2]
    coherence(prompts=["p"], completions=["c"], completion_ids=[[9, 9]])
    assert provider.calls == 2
    # An explicit `phi_traces` keyword wins over the provider.
    assert commitment([""], ["a"], phi_traces=[np.full(3, 0.5)], completion_ids=[[3]]) == [0.5]
    assert provider.calls == 2


# --- commitment -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phi", "score"),
    [
        ([0.2, 0.2, 0.8, 0.8, 0.8, 0.8], 1.0),  # commits and holds
        ([0.2, 0.8, 0.2, 0.2], 0.25),  # commits and melts straight back
        ([0.1, 0.5, 0.5, 0.3, 0.5], 11 / 18),  # holds 2/3, then a melt, then a jump at the end
        ([0.5] * 8, 0.5),  # flat: no decision point, neutral
        ([0.99] * 8, 0.5),  # flat and certain earns no more than flat and unsure
        ([0.2, np.nan, 0.8, 0.8], 1.0),  # a lost token joins its neighbours
        ([0.7], 0.5),
    ],
)
def test_commitment_known_values(phi: list[float], score: float) -> None:
    assert CommitmentReward()([""], ["a"], phi_traces=[np.array(phi)]) == [pytest.approx(score)]


def test_commitment_penalizes_noise() -> None:
    rng = np.random.default_rng(0)
    scores = CommitmentReward()([""] * 50, ["a"] * 50, phi_traces=list(rng.uniform(0, 1, (50, 40))))
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert float(np.mean(scores)) < 0.45


# --- load_reward ------------------------------------------------------------------------------


def test_load_reward_finds_functions() -> None:
    assert load_reward("engine.rewards.functions:concise_reward") is concise_reward
    assert load_reward("engine.rewards:CoherenceReward.answer_phi") is CoherenceReward.answer_phi


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "must look like 'package.module:function'"),
        ("mod:", "must look like"),
        ("no_such_pkg_zz.mod:f", "reward module 'no_such_pkg_zz.mod' not found"),
        ("engine.no_such_mod_zz:f", "reward module 'engine.no_such_mod_zz' not found"),
        ("json:no_such_fn", "reward module 'json' has no attribute 'no_such_fn'"),
        ("math:pi", "reward 'math:pi' is not callable (it is a float)"),
    ],
)
def test_load_reward_errors_are_one_line(path: str, message: str) -> None:
    with pytest.raises(RewardError) as info:
        load_reward(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_load_reward_reports_a_broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_reward_zz.py").write_text("import missing_dependency_zz\n")
    (tmp_path / "crashing_reward_zz.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        RewardError, match="importing reward module 'broken_reward_zz' failed: .*missing_dependency_zz"
    ):
        load_reward("broken_reward_zz:f")
    with pytest.raises(RewardError, match="RuntimeError: boom"):
        load_reward("crashing_reward_zz:f")
