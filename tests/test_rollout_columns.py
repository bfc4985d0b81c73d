"""The declarative column maps of tables of samples (engine/observe/rollouts/columns.py): which map a table's
columns fit, and the samples of its rows."""

from __future__ import annotations

from engine.observe.rollouts.columns import COLUMN_MAPS, ColumnMap, has_completion, mapped, match


def test_a_wide_verl_row_is_several_samples() -> None:
    columns = ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    layout = match(columns)
    assert layout is not None and layout.source == "verl"
    first, second = layout.samples([8, "2+2?", "4", 1.0, "3+3?", "7", 0.0])
    assert (first["step"], first["prompt"], first["completion"], first["rewards"]) == (
        8,
        "2+2?",
        "4",
        {"score": 1.0},
    )
    assert (second["prompt"], second["rewards"], second["extra"]) == ("3+3?", {"score": 0.0}, {})
    assert first["group_id"] != second["group_id"]  # no group column: the prompt's
    assert layout.samples([8, "2+2?"]) == [layout.samples([8, "2+2?", None])[0]]  # a short row: cells empty


def test_trls_reward_columns_are_the_numbers_after_the_completion() -> None:
    columns = ["step", "prompt", "completion", "brevity", "accuracy", "solution", "advantage"]
    rows = [[1, [{"role": "user", "content": "2+2?"}], "4", 0.5, 1, "4", 0.3]]
    layout = match(columns, rows)
    assert layout is not None and layout.source == "trl" and layout.same_as == "rollouts-trl"
    [sample] = layout.samples(rows[0])
    assert sample["prompt"] == "user: 2+2?" and sample["rewards"] == {"brevity": 0.5, "accuracy": 1.0}
    assert (sample["advantage"], sample["extra"], sample["step"]) == (0.3, {"solution": "4"}, 1)


def test_any_table_of_prompts_and_responses_and_tables_that_are_not_samples() -> None:
    layout = match(["question", "response", "reward", "uid", "note"])
    assert layout is not None and layout.source == "samples"
    [sample] = layout.samples(["q", "r", 0.5, "g7", {"k": 1}])
    assert (sample["total"], sample["rewards"], sample["group_id"], sample["step"]) == (0.5, {}, "g7", None)
    assert sample["extra"] == {"note": {"k": 1}}
    assert match(["loss", "accuracy"]) is None
    assert match(["prompt"]) is None


def test_a_source_declares_its_own_map() -> None:
    """How another reader (Trackio traces, TensorBoard text) names its columns: a map of its own."""
    maps = {"mine": ColumnMap("a test's own table", prompt=("q",), completion=("a",), rewards=("r1", "r2"))}
    layout = match(["q", "a", "r1", "r2", "t"], maps=maps)
    assert layout is not None and layout.source == "mine"
    [sample] = layout.samples(["x", "y", 1.0, float("nan"), "z"])
    assert sample["rewards"] == {"r1": 1.0, "r2": None} and sample["extra"] == {"t": "z"}
    assert list(COLUMN_MAPS) == ["verl", "trl", "samples"]  # the order is the preference


def test_one_map_serves_a_table_and_a_record() -> None:
    """A reward name ending in "/" is a prefix in a table's row as in a record (`mapped`, which also reads a
    dict of rewards, the policy version and the length, and compares names case-insensitively)."""
    cm = ColumnMap(
        "a test's own samples",
        prompt=("q",),
        completion=("a",),
        rewards=("rewards/",),
        reward_dicts=("scores",),
        policy_version=("model_version",),
        length=("completion_tokens",),
    )
    layout = match(["q", "a", "rewards/acc", "rewards/"], maps={"mine": cm})
    assert layout is not None
    [sample] = layout.samples(["x", "y", 1.0, 2.0])
    assert sample["rewards"] == {"acc": 1.0} and sample["extra"] == {"rewards/": 2.0}
    record = {"Q": "x", "a": "y", "rewards/acc": 1, "scores": {"len": 0.5}, "model_version": 3, "t": "z"}
    row = mapped(cm, record)
    assert (row["prompt"], row["completion"], row["rewards"]) == ("x", "y", {"acc": 1.0, "len": 0.5})
    assert row["extra"] == {"t": "z", "policy_version": 3} and row["length"] is None and row["step"] is None
    assert has_completion(cm, ["A "]) and not has_completion(cm, ["q"])
