"""The demo task's rewards, and a real (short) SFT + GRPO run launched the way the engine launches it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.demo.task import REWARD_FUNCS, TASK, TEACHER_CONFUSES, TEACHER_SAMPLES, demo_rows, task_rows
from engine.training.holdout import distinct_prompts, holdout_line, prompt_key, split_holdout

format_reward, task_reward, concise_reward = REWARD_FUNCS
parse_call = TASK.parse

GOLD = '{"tool": "get_weather", "args": {"city": "Paris"}}'


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_task_rows_are_deterministic_and_carry_the_answer_columns() -> None:
    rows = task_rows(seed=0)
    assert rows == task_rows(seed=0)
    assert len(rows) == 384
    row = rows[0]
    assert set(row) == {"prompt", "completion", "answer_tool", "answer_city"}
    assert row["answer_city"] in row["prompt"][0]["content"]
    assert parse_call(row["completion"][0]["content"]) == {
        "tool": row["answer_tool"],
        "args": {"city": row["answer_city"]},
    }


def test_the_warmup_set_samples_a_weaker_teacher_and_keeps_the_gold_answers() -> None:
    rows = demo_rows(seed=0)
    assert rows == demo_rows(seed=0) and rows != demo_rows(seed=1)
    gold = task_rows(seed=0)
    assert len(rows) == TEACHER_SAMPLES * len(gold)
    # Each request's samples sit together and keep its gold answer columns.
    for i, request in enumerate(gold):
        for row in rows[i * TEACHER_SAMPLES : (i + 1) * TEACHER_SAMPLES]:
            assert row["prompt"] == request["prompt"]
            assert (row["answer_tool"], row["answer_city"]) == (
                request["answer_tool"],
                request["answer_city"],
            )
    called = [(row["answer_tool"], parse_call(row["completion"][0]["content"])["tool"]) for row in rows]
    # The teacher always gets weather and news right, and mostly confuses time and hotels.
    for tool, wrong in TEACHER_CONFUSES.items():
        answers = [c for t, c in called if t == tool]
        right = answers.count(tool) / len(answers)
        assert 0.25 < right < 0.45 and answers.count(wrong) == len(answers) - answers.count(tool)
    assert all(c == t for t, c in called if t not in TEACHER_CONFUSES)
    # A request's samples never straddle the held-out split, and eval asks each prompt once.
    train, held = split_holdout(rows, 0.1)
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in held}
    assert len(distinct_prompts(held)) == len(held) // TEACHER_SAMPLES
    assert holdout_line(train, held) == "held out 38 of 384 prompts (152 of 1536 rows) for `carl eval`"
    gold_train, gold_held = split_holdout(gold, 0.1)
    assert holdout_line(gold_train, gold_held) == "held out 39 of 384 prompts for `carl eval`"


def test_format_reward_gives_full_and_partial_credit() -> None:
    completions = [GOLD, f"sure: {GOLD} done", '{"tool": "get_weather", "args"', "{}", "hello", ""]
    scores = format_reward([None] * 6, completions)
    assert scores[0] == scores[1] == 1.0
    assert 0.0 < scores[2] < 1.0
    assert 0.0 < scores[3] < scores[2]
    assert scores[4] == scores[5] == 0.0
    # TRL hands conversational completions over as message lists.
    assert format_reward([None], [chat(GOLD)]) == [1.0]


def test_task_reward_checks_tool_and_city() -> None:
    completions = [
        GOLD,
        '{"tool": "get_time", "args": {"city": "Paris"}}',
        '{"tool": "get_weather", "args": {"city": "Rome"}}',
        '{"tool": "get_news", "args": {}}',
        "get_weather Paris",
        "nothing",
    ]
    n = len(completions)
    scores = task_reward([None] * n, completions, answer_tool=["get_weather"] * n, answer_city=["Paris"] * n)
    assert scores == [1.0, 0.5, 0.5, 0.0, 0.4, 0.0]


def test_concise_reward_prefers_short_non_empty_answers() -> None:
    scores = concise_reward([None] * 4, [GOLD, GOLD + " " * 10 + "x" * 60, "x" * 500, "   "])
    assert scores[0] == 1.0
    assert 0.0 < scores[1] < 1.0
    assert scores[2] == scores[3] == 0.0


# The run is a child process, as the engine starts it. An audit hook in that process refuses any
# Internet socket, so the test fails if TRL, transformers or Trackio try the network or a server.
OFFLINE_LAUNCHER = textwrap.dedent(
    """
    import runpy, socket, sys

    def refuse_network(event, args):
        internet = (socket.AF_INET, socket.AF_INET6)
        if event not in ("socket.connect", "socket.bind") or args[0].family not in internet:
            return
        # urllib3 probes for IPv6 at import by binding ('::1', 0): a loopback socket that never listens
        # nor connects is no network use.
        if event == "socket.bind" and args[1][0] in ("::1", "127.0.0.1") and args[1][1] == 0:
            return
        print(f"network use during the demo: {event} {args[1]}", file=sys.stderr, flush=True)
        raise RuntimeError("the demo must stay offline")

    sys.addaudithook(refuse_network)
    sys.argv = ["engine.demo", *sys.argv[1:]]
    runpy.run_module("engine.demo", run_name="__main__", alter_sys=True)
    """
)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "CARL_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run_dir, model_dir = root / "run", root / "model"
    argv = [str(run_dir), "--max-steps", "4", "--warmup-sft-steps", "2", "--model-dir", str(model_dir)]
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE_LAUNCHER, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir, done.stdout + done.stderr


def trackio_rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        blobs = conn.execute("SELECT metrics FROM metrics ORDER BY id").fetchall()
    finally:
        conn.close()
    return [json.loads(blob) for (blob,) in blobs]


@pytest.mark.slow
def test_demo_prints_progress_and_exits_cleanly(demo_run: tuple[Path, str]) -> None:
    run_dir, output = demo_run
    assert "[carl-demo] grpo step 4/4 reward=" in output
    assert f"[carl-demo] done: {run_dir}" in output
    assert "network use" not in output


@pytest.mark.slow
def test_demo_leaves_trainer_state_with_grpo_metrics(demo_run: tuple[Path, str]) -> None:
    run_dir, _ = demo_run
    state = json.loads((run_dir / "grpo" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    steps = [entry for entry in state["log_history"] if "reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2, 3, 4]
    for name in (
        "entropy",
        "reward",
        "reward_std",
        "loss",
        "rewards/format/mean",
        "rewards/task/mean",
        "rewards/concise/std",
        "completions/mean_length",
        "frac_reward_zero_std",
    ):
        assert name in steps[0], name
    # A random model generates near-uniform tokens: entropy close to ln(512) = 6.24 nats.
    assert 0.0 < steps[0]["entropy"] <= 6.24 + 1e-3
    assert any(entry["rewards/format/std"] > 0 for entry in steps), "rewards never varied"
    # The final step is checkpointed, with its own trainer_state.json.
    assert (run_dir / "grpo" / "checkpoint-4" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_demo_leaves_a_local_trackio_project(demo_run: tuple[Path, str]) -> None:
    run_dir, _ = demo_run
    db = run_dir / "trackio" / "carl-demo.db"
    assert db.is_file()
    rows = trackio_rows(db)
    train_rows = [row for row in rows if "train/reward" in row]
    assert [row["train/global_step"] for row in train_rows] == [1, 2, 3, 4]
    for name in (
        "train/entropy",
        "train/loss",
        "train/rewards/format/mean",
        "train/rewards/task/mean",
    ):
        assert all(name in row for row in train_rows), name
    # TRL's profiler rows land in the same table, without the train/ prefix.
    assert any(key.startswith("profiling/") for row in rows for key in row)
