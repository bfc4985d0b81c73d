"""Rollouts from other tools' dumps: TRL's completions parquet, veRL's rollout dumps, prime-rl's traces and
verifiers' results, each written here the way its own writer writes it (the writer named at each helper), read
into the one `rollouts` table, followed as they grow, restart-safe, and bad input as one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.observe import IngestResult, ObserveError, ingest_source
from engine.observe.ingest import finish_import
from engine.observe.rollouts import dumps
from engine.store import Store, StoreReader

REPO = Path(__file__).resolve().parent.parent


def register(
    store: Store, path: Path, kind: str, *, follow: bool = False, attach_to: int | None = None
) -> int:
    source_id = store.upsert_source(kind, str(path), name=None, follow=follow)
    if attach_to is not None:
        with store.transaction():
            store.conn.execute("UPDATE sources SET attach_to=? WHERE id=?", (attach_to, source_id))
    return source_id


def drain(store: Store, source_id: int, **bounds: Any) -> IngestResult:
    total = IngestResult()
    while not total.caught_up:
        total.merge(ingest_source(store, source_id, **bounds))
    return total


def rollouts(store: Store, run_id: int) -> list[dict[str, Any]]:
    reader = StoreReader(store.path)
    try:
        return reader.rollouts(run_id, limit=100_000)
    finally:
        reader.close()


def only_run(store: Store, source_id: int) -> int:
    (run_id,) = [r[0] for r in store.conn.execute("SELECT id FROM runs WHERE source_id=?", (source_id,))]
    return run_id


# -- TRL -----------------------------------------------------------------------------------------------------


def trl_log_completions(
    out: Path,
    step: int,
    prompts: list[Any],
    completions: list[Any],
    rewards: dict[str, list[float]],
    advantages: list[float],
    extra: dict[str, list[Any]] | None = None,
) -> Path:
    """What GRPOTrainer.log writes with log_completions=True (trl 1.16, trl/trainer/grpo_trainer.py): the same
    table, the same `pd.DataFrame(table).to_parquet(...)` call, the same file name."""
    os.makedirs(out / "completions", exist_ok=True)
    table = {
        "step": [step] * len(prompts),
        "prompt": prompts,
        "completion": completions,
        **rewards,
        **(extra or {}),
        "advantage": advantages,
    }
    path = out / "completions" / f"completions_{step:05d}.parquet"
    pd.DataFrame(table).to_parquet(os.path.join(out, "completions", f"completions_{step:05d}.parquet"))
    return path


def chat(role: str, text: str) -> list[dict[str, str]]:
    return [{"role": role, "content": text}]


def trl_step(out: Path, step: int, *, g: int = 2, prompts: int = 2, conversational: bool = False) -> Path:
    texts = [f"question {step}.{p}" for p in range(prompts) for _ in range(g)]
    answers = [f"answer {step}.{i}" for i in range(len(texts))]
    return trl_log_completions(
        out,
        step,
        [chat("user", t) for t in texts] if conversational else texts,
        [chat("assistant", a) for a in answers] if conversational else answers,
        {
            "accuracy_reward": [float(i % 2) for i in range(len(texts))],
            "format_reward": [0.5] * len(texts),
        },
        [(-1.0) ** i for i in range(len(texts))],
        extra={"solution": [f"sol {i}" for i in range(len(texts))]},
    )


def test_trl_completions_become_rollouts_with_groups_rewards_and_advantages(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "grpo-out"
    trl_step(out, 1)
    trl_step(out, 2, conversational=True)
    source_id = register(store, out / "completions", "rollouts-trl")
    result = drain(store, source_id)
    assert result.rows == 8 and result.bad_lines == 0
    run_id = only_run(store, source_id)
    run = store.run(run_id)
    assert (run["name"], run["framework"], run["source_kind"]) == ("grpo-out", "trl", "rollouts-trl")
    rows = rollouts(store, run_id)
    assert [(r["step"], r["idx"], r["group_id"]) for r in rows] == [
        (1, 0, "0"),
        (1, 1, "0"),
        (1, 2, "1"),
        (1, 3, "1"),
        (2, 0, "0"),
        (2, 1, "0"),
        (2, 2, "1"),
        (2, 3, "1"),
    ]
    first, second = rows[0], rows[1]
    assert (first["prompt"], first["completion"]) == ("question 1.0", "answer 1.0")
    assert first["rewards"] == {"accuracy_reward": 0.0, "format_reward": 0.5} and first["total"] == 0.5
    assert second["rewards"]["accuracy_reward"] == 1.0 and second["total"] == 1.5  # the file has no weights
    assert (first["advantage"], second["advantage"]) == (1.0, -1.0)
    assert first["extra"] == {"solution": "sol 0"}
    conversation = rows[4]
    assert conversation["prompt"] == "user: question 2.0" and conversation["completion"] == "answer 2.0"


@pytest.mark.slow
def test_a_real_trl_grpo_run_with_log_completions(
    store: Store, tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer itself: TRL's GRPOTrainer on the tiny model, two steps, `log_completions=True`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def short(completions: list[str], **_: Any) -> list[float]:
        return [1.0 / (1 + len(c)) for c in completions]

    def has_a(completions: list[str], log_extra: Any = None, **_: Any) -> list[float]:
        if log_extra is not None:
            log_extra("has_a_text", ["a" in c for c in completions])
        return [float("a" in c) for c in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        log_completions=True,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    prompts = Dataset.from_list([{"prompt": f"hello {i}"} for i in range(8)])
    GRPOTrainer(model=str(tiny_model), reward_funcs=[short, has_a], args=args, train_dataset=prompts).train()
    source_id = register(store, tmp_path / "out" / "completions", "rollouts-trl")
    assert drain(store, source_id).rows == 8
    rows = rollouts(store, only_run(store, source_id))
    assert [(r["step"], r["idx"], r["group_id"]) for r in rows] == [
        (step, i, str(i // 2)) for step in (1, 2) for i in range(4)
    ]
    for row in rows:
        assert set(row["rewards"]) == {"short", "has_a"} and row["advantage"] is not None
        assert row["total"] == pytest.approx(row["rewards"]["short"] + row["rewards"]["has_a"])
        assert row["extra"] == {"has_a_text": row["rewards"]["has_a"] == 1.0}
        assert row["prompt"].startswith("hello ") and row["completion"]


def test_trl_follows_new_step_files_and_reads_each_once(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "run"
    trl_step(out, 1)
    source_id = register(store, out / "completions", "rollouts-trl", follow=True)
    assert drain(store, source_id, max_rows=20).rows == 4  # two samples a batch: a file read in slices
    assert ingest_source(store, source_id).rows == 0  # caught up: nothing twice
    trl_step(out, 2)
    trl_step(out, 3)
    result = drain(store, source_id)
    assert result.rows == 8 and result.caught_up
    assert [s for s, _ in StoreReader(store.path).rollout_steps(only_run(store, source_id))] == [1, 2, 3]
    store.save_source_progress(source_id, {})  # replayed from scratch, as after a lost cursor
    assert drain(store, source_id).rows == 0
    assert len(rollouts(store, only_run(store, source_id))) == 12


def test_a_parquet_without_completion_is_one_line_and_loses_nothing(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "run"
    trl_step(out, 1)
    source_id = register(store, out / "completions", "rollouts-trl", follow=True)
    drain(store, source_id)
    broken = out / "completions" / "completions_00002.parquet"
    pd.DataFrame({"step": [2], "prompt": ["p"], "advantage": [0.0]}).to_parquet(broken)
    trl_step(out, 3)
    result = drain(store, source_id)
    assert result.rows == 4 and result.bad_lines == 1
    assert result.problems == [
        "completions_00002.parquet: no completion column (it has: step, prompt, advantage)"
    ]
    steps = [r["step"] for r in rollouts(store, only_run(store, source_id))]
    assert steps == [1] * 4 + [3] * 4


def test_a_parquet_caught_mid_write_is_waited_for_while_following(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "run"
    whole = trl_step(out, 1).read_bytes()
    path = out / "completions" / "completions_00001.parquet"
    path.write_bytes(
        whole[: len(whole) // 2]
    )  # pandas writes the file in place: a reader can catch it half done
    source_id = register(store, out / "completions", "rollouts-trl", follow=True)
    result = drain(store, source_id)
    assert result.rows == 0 and result.bad_lines == 0 and result.caught_up
    path.write_bytes(whole)
    assert drain(store, source_id).rows == 4
    # Not followed, a file that cannot be read is a broken one: one line, and the next file is read.
    (out / "completions" / "completions_00002.parquet").write_bytes(b"PAR1 not really")
    trl_step(out, 3)
    imported = register(store, out / "completions", "rollouts-trl", follow=False)
    result = drain(store, imported)
    assert result.rows == 4 and result.bad_lines == 1
    assert result.problems[0].startswith("completions_00002.parquet: not a readable parquet file")


def test_one_parquet_file_alone(store: Store, tmp_path: Path) -> None:
    path = trl_step(tmp_path / "x", 7)
    source_id = register(store, path, "rollouts-trl")
    assert drain(store, source_id).rows == 4
    assert {r["step"] for r in rollouts(store, only_run(store, source_id))} == {7}


# -- attached to the run of another source ---------------------------------------------------------------


def test_rollouts_join_the_run_of_the_source_they_are_attached_to(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "run"
    trl_step(out, 1)
    log = tmp_path / "metrics.jsonl"
    log.write_text("")
    metrics_id = register(store, log, "jsonl", follow=True)
    source_id = register(store, out / "completions", "rollouts-trl", follow=True, attach_to=metrics_id)
    with pytest.raises(ObserveError, match="waiting for the run of source") as err:
        ingest_source(store, source_id)  # the metrics have made no run yet: the samples wait
    assert err.value.transient and store.source(source_id)["state"] == "following"
    log.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    drain(store, metrics_id)
    result = drain(store, source_id)
    assert result.rows == 4 and result.run_ids == [only_run(store, metrics_id)]
    assert store.conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1  # no run of its own


# -- veRL ----------------------------------------------------------------------------------------------------


def verl_dump_generations(
    dump_path: Path,
    global_steps: int,
    inputs: list[str],
    outputs: list[str],
    gts: list[Any],
    scores: list[float],
    reward_extra_infos_dict: dict[str, list[Any]],
) -> Path:
    """RayPPOTrainer._dump_generations (verl/trainer/ppo/ray_trainer.py, volcengine/verl b178a3c), line for
    line."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{global_steps}.jsonl")
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [global_steps] * n}
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    lines = []
    for i in range(n):
        entry = {k: v[i] for k, v in base_data.items()}
        lines.append(json.dumps(entry, ensure_ascii=False))
    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")
    return Path(filename)


def verl_step(folder: Path, step: int, n: int = 4) -> Path:
    return verl_dump_generations(
        folder,
        step,
        [f"<|user|>2+{i // 2}=?" for i in range(n)],  # a group of two samples per prompt
        [f"ok {step}.{i} é" for i in range(n)],
        [str(2 + i // 2) for i in range(n)],
        [float(i % 2) for i in range(n)],
        {"acc": [bool(i % 2) for i in range(n)], "short": [1]},  # lists of another length are left out
    )


def test_verl_dumps_are_read_in_step_order_and_followed(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "rollout_data"
    verl_step(folder, 10)
    verl_step(folder, 2)  # numeric order, not the names' order
    source_id = register(store, folder, "rollouts-verl", follow=True)
    assert drain(store, source_id).rows == 8
    run_id = only_run(store, source_id)
    assert store.run(run_id)["framework"] == "verl" and store.run(run_id)["name"] == "rollout_data"
    rows = rollouts(store, run_id)
    assert [(r["step"], r["idx"]) for r in rows] == [(2, i) for i in range(4)] + [(10, i) for i in range(4)]
    first, second, third = rows[:3]
    assert first["prompt"] == "<|user|>2+0=?" and first["completion"] == "ok 2.0 é"
    assert (second["rewards"], second["total"], second["advantage"]) == ({"score": 1.0}, 1.0, None)
    assert second["extra"] == {"gts": "2", "acc": True}
    assert first["group_id"] == second["group_id"] != third["group_id"]
    # Following: a new step's file, and a file the writer has not finished.
    verl_step(folder, 11)
    part = folder / "12.jsonl"
    line = json.dumps({"input": "q", "output": "a", "gts": None, "score": 0.0, "step": 12})
    part.write_text(line[:20])
    assert drain(store, source_id).rows == 4
    part.write_text(line + "\n")
    assert drain(store, source_id).rows == 1
    assert StoreReader(store.path).rollout_steps(run_id)[-2:] == [(11, 4), (12, 1)]


def test_verl_bad_lines_are_one_line_each(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "dump"
    path = verl_step(folder, 1, n=2)
    with open(path, "a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"input": "only an input"}) + "\n")
        f.write(json.dumps([1, 2]) + "\n")
        f.write(json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 1}) + "\n")
    source_id = register(store, folder, "rollouts-verl")
    result = drain(store, source_id)
    assert result.rows == 3 and result.bad_lines == 3
    assert result.problems == [
        "dump/1.jsonl:3: not JSON",
        "dump/1.jsonl:4: no input or output field (not a veRL rollout dump)",
        "dump/1.jsonl:5: not an object",
    ]
    assert [r["idx"] for r in rollouts(store, only_run(store, source_id))] == [0, 1, 2]


def test_a_fifo_among_the_dumps_is_refused_by_type_without_opening_it(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "dump"
    verl_step(folder, 1, n=2)
    os.mkfifo(folder / "2.jsonl")
    verl_step(folder, 3, n=2)
    source_id = register(store, folder, "rollouts-verl", follow=True)
    result = drain(store, source_id)
    assert result.rows == 4 and result.problems == ["dump/2.jsonl:0: a FIFO (named pipe), not a regular file"]
    assert drain(store, source_id).bad_lines == 0  # said once


KILLED_IMPORT = """
import sys
from engine.store import Store
from engine.observe import ingest_source
store = Store(sys.argv[1])
while not ingest_source(store, 1, max_rows=50).caught_up:
    pass
"""


@pytest.mark.slow
def test_kill_9_mid_import_then_resume_stores_every_sample_once(tmp_path: Path) -> None:
    folder = tmp_path / "dump"
    steps, per_step = 300, 64
    for step in range(1, steps + 1):
        verl_step(folder, step, n=per_step)
    db = tmp_path / "carl.db"
    with Store(db) as store:
        register(store, folder, "rollouts-verl")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_IMPORT, str(db)], cwd=REPO)
    try:
        stored = 0
        deadline = time.monotonic() + 60
        while stored < 2000 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            reader = StoreReader(db)
            stored = reader.conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
            reader.close()
    finally:
        os.kill(proc.pid, 9)
        proc.wait()
    with Store(db) as store:
        before = store.conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
        assert 0 < before < steps * per_step, "the import should have been killed midway"
        assert store.source(1)["rows"] == before  # the cursor and its rows committed together
        result = drain(store, 1)
        assert result.rows == steps * per_step - before
        pairs = store.conn.execute("SELECT step, idx FROM rollouts ORDER BY step, idx").fetchall()
        assert pairs == [(s, i) for s in range(1, steps + 1) for i in range(per_step)]


# -- prime-rl ------------------------------------------------------------------------------------------------


def node(
    role: str, text: str, *, sampled: bool = False, tokens: int = 0, advantage: float | None = None
) -> dict:
    """A MessageNode as Episode.to_record() dumps it (verifiers/v1/graph.py: parent, message, sampled,
    timestamp, token_ids, mask, is_content, logprobs, advantages, reference_logprobs, loss_weights)."""
    return {
        "parent": None,
        "message": {"role": role, "content": text},
        "sampled": sampled,
        "timestamp": 1.7e9,
        "token_ids": list(range(tokens + 2)),
        "mask": [False, False] + [sampled] * tokens,
        "is_content": [],
        "logprobs": [-0.5 - t for t in range(tokens)] if sampled else [],
        "advantages": [advantage] * tokens if sampled and advantage is not None else None,
    }


def episode(step: int, group: str, answer: str, score: float, advantage: float) -> dict:
    """Episode.to_record() (verifiers/v1/episode.py, exclude_none): env, task, group, run, ok, errors, traces;
    a Trace (verifiers/v1/trace.py) with its nodes, rewards {name: {score, weight}}, metrics and status."""
    trace = {
        "version": 1,
        "id": f"t-{group}-{answer}",
        "verifiers": {"version": "1.0"},
        "task": {"type": "math", "data": {"question": "2+2"}},
        "agent": {"config": {}, "name": "agent", "trainable": True},
        "tools": [],
        "nodes": [
            node("system", "be brief"),
            node("user", "2+2?"),
            node("assistant", answer, sampled=True, tokens=3, advantage=advantage),
        ],
        "calls": [],
        "rewards": {"correct": {"score": score, "weight": 1.0}, "format": {"score": 1.0, "weight": 0.5}},
        "metrics": {"num_turns": 1.0},
        "info": {},
        "is_completed": True,
        "ok": True,
        "stop_condition": "stop",
        "errors": [],
        "timing": {"start": 1.7e9},
    }
    return {
        "id": f"e-{group}-{answer}",
        "env": {"id": "gsm8k", "name": "gsm8k"},
        "task": {"type": "math", "data": {"question": "2+2"}},
        "group": {"id": group},
        "run": {"type": "train", "id": "r1", "work": {"type": "train", "step": step - 1}},
        "ok": True,
        "errors": [],
        "traces": [trace],
    }


def prime_log_episodes(run_dir: Path, step: int, kind: str, subset: str, episodes: list[dict]) -> Path:
    """FileMonitor.log_episodes (prime-rl src/prime_rl/monitors/file.py): one record a line, appended
    ("ab")."""
    path = run_dir / "rollouts" / f"step_{step}" / kind / subset / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for record in episodes:
            f.write(json.dumps(record).encode() + b"\n")
    return path


def test_prime_rl_traces_are_read_from_the_trained_subset(store: Store, tmp_path: Path) -> None:
    run_dir = tmp_path / "prime-run"
    trained = [episode(1, "g1", "4", 1.0, 0.5), episode(1, "g1", "5", 0.0, -0.5)]
    prime_log_episodes(run_dir, 1, "train", "all", trained + [episode(1, "g2", "x", 0.0, 0.0)])
    prime_log_episodes(run_dir, 1, "train", "effective", trained)
    prime_log_episodes(run_dir, 1, "eval", "effective", [episode(1, "e", "4", 1.0, 0.0)])
    source_id = register(store, run_dir, "rollouts-prime", follow=True)
    assert drain(store, source_id).rows == 2
    run_id = only_run(store, source_id)
    assert store.run(run_id)["name"] == "prime-run" and store.run(run_id)["framework"] == "prime-rl"
    right, wrong = rollouts(store, run_id)
    assert (right["step"], right["group_id"], right["prompt"], right["completion"]) == (
        1,
        "g1",
        "system: be brief\nuser: 2+2?",
        "4",
    )
    assert right["rewards"] == {"correct": 1.0, "format": 1.0} and right["total"] == 1.5  # score x weight
    assert (right["advantage"], wrong["advantage"], wrong["total"]) == (0.5, -0.5, 0.5)
    assert right["length"] == 3 and right["logprob"] == [-0.5, -1.5, -2.5]
    assert right["extra"]["env"] == "gsm8k" and right["extra"]["metrics"] == {"num_turns": 1.0}
    prime_log_episodes(run_dir, 2, "train", "effective", [episode(2, "g3", "4", 1.0, 0.0)])
    assert drain(store, source_id).rows == 1
    assert StoreReader(store.path).rollout_steps(run_id) == [(1, 2), (2, 1)]


# -- verifiers -----------------------------------------------------------------------------------------------


def vf_save_outputs(results_path: Path, outputs: list[dict]) -> Path:
    """save_outputs (verifiers/legacy/utils/save_utils.py): json.dumps(output) + "\\n", appended to
    results.jsonl."""
    results_path.mkdir(parents=True, exist_ok=True)
    path = results_path / "results.jsonl"
    with open(path, "a") as f:
        f.write("".join(json.dumps(o) + "\n" for o in outputs))
    return path


def vf_output(example_id: int, answer: str, correct: float) -> dict:
    """state_to_output's shape: the rubric's metrics also flattened to the top level."""
    metrics = {"correct_answer": correct, "format_reward": 1.0}
    return {
        "example_id": example_id,
        "prompt": [{"role": "user", "content": f"question {example_id}"}],
        "completion": [{"role": "assistant", "content": answer}],
        "answer": "4",
        "reward": correct + 0.2,
        "error": None,
        "timing": {"generation_ms": 10.0, "scoring_ms": 1.0, "total_ms": 11.0},
        "is_completed": True,
        "is_truncated": False,
        "stop_condition": "stop",
        "metrics": metrics,
        "tool_defs": None,
        "token_usage": {"input_tokens": 12.0, "output_tokens": 5.0},
        **metrics,
    }


def test_verifiers_results_are_followed_as_they_are_appended(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "outputs" / "evals" / "gsm8k--gpt-4.1-mini" / "a1b2c3d4"
    vf_save_outputs(folder, [vf_output(0, "4", 1.0), vf_output(0, "5", 0.0)])
    source_id = register(store, folder, "rollouts-verifiers", follow=True)
    assert drain(store, source_id).rows == 2
    run_id = only_run(store, source_id)
    assert store.run(run_id)["name"] == "gsm8k--gpt-4.1-mini-a1b2c3d4"
    right, wrong = rollouts(store, run_id)
    assert (right["step"], right["group_id"], right["prompt"], right["completion"]) == (
        0,
        "0",
        "user: question 0",
        "4",
    )
    assert right["rewards"] == {"correct_answer": 1.0, "format_reward": 1.0} and right["total"] == 1.2
    assert wrong["total"] == pytest.approx(0.2) and right["length"] == 5
    assert right["extra"] == {
        "answer": "4",
        "error": None,
        "is_completed": True,
        "is_truncated": False,
        "stop_condition": "stop",
        "token_usage": {"input_tokens": 12.0, "output_tokens": 5.0},
    }
    path = vf_save_outputs(folder, [vf_output(1, "4", 1.0)])
    with open(path, "a") as f:
        f.write('{"example_id": 2, "prompt": "q", "compl')  # still being written
    assert drain(store, source_id).rows == 1
    with open(path, "a") as f:
        f.write('etion": "a", "reward": 0.0}\n')
    assert drain(store, source_id).rows == 1
    assert [r["idx"] for r in rollouts(store, run_id)] == [0, 1, 2, 3]
    finish_import(store, source_id)  # stops following: what was read stays
    assert store.run(run_id)["status"] == "imported" and len(rollouts(store, run_id)) == 4


def test_an_over_long_line_is_skipped_without_being_held_even_while_written(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dumps, "MAX_LINE", 800)  # the reader's bounds, made small enough to cross here
    monkeypatch.setattr(dumps, "CHUNK", 64)
    folder = tmp_path / "eval"
    path = vf_save_outputs(folder, [vf_output(0, "4", 1.0)])
    with open(path, "a") as f:
        f.write(json.dumps(vf_output(1, "x" * 3000, 0.0))[:1500])  # a long line, still being written
    source_id = register(store, folder, "rollouts-verifiers", follow=True)
    result = drain(store, source_id)
    assert result.rows == 1 and len(result.problems) == 1
    assert result.problems[0].startswith("eval/results.jsonl:2: line longer than")
    with open(path, "a") as f:
        f.write("x" * 2000 + "\n")
    vf_save_outputs(folder, [vf_output(2, "4", 1.0)])
    result = drain(store, source_id)
    assert result.rows == 1 and result.bad_lines == 0  # said once; the line after it is read
    rows = rollouts(store, only_run(store, source_id))
    assert [(r["group_id"], r["idx"]) for r in rows] == [("0", 0), ("2", 1)]
    assert store.source(source_id)["cursor"]["line"] == 3


GARBAGE = st.one_of(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from(
        [
            b"[1]",
            b"null",
            b'{"traces": [1, "x", {"nodes": 3}]}',
            b'{"traces": [{"nodes": [{"message": 1, "logprobs": "x"}], "rewards": {"r": 2}}]}',
            b'{"prompt": {"role": 5}, "completion": [null], "metrics": [1], "token_usage": 3}',
            b'{"input": [], "output": {}, "score": "high", "step": 1e400}',
            b"[" * 3000,
            b'{"prompt": "\\ud800", "completion": "\\udfff"}',
        ]
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(GARBAGE, st.just(b"GOOD")), max_size=12),
    st.sampled_from(["rollouts-verl", "rollouts-verifiers", "rollouts-prime"]),
    st.sampled_from([10, 30, 1000]),
)
def test_fuzz_garbage_lines_never_stop_a_dump_reader(lines: list[bytes], kind: str, max_rows: int) -> None:
    good = {
        "rollouts-verl": json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 1}).encode(),
        "rollouts-verifiers": json.dumps(vf_output(0, "4", 1.0)).encode(),
        "rollouts-prime": json.dumps(episode(1, "g", "4", 1.0, 0.0)).encode(),
    }[kind]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        name = {"rollouts-verl": "1.jsonl", "rollouts-verifiers": "results.jsonl"}.get(kind)
        path = folder / (name or "rollouts/step_1/train/effective/traces.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(good if line == b"GOOD" else line for line in lines) + b"\n")
        with Store(folder / "carl.db") as store:
            source_id = register(store, folder, kind)
            result = drain(store, source_id, max_rows=max_rows)
            expected = sum(1 for line in lines if line == b"GOOD")
            stored = store.conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
            assert stored >= expected and result.rows == stored
            assert all(p.startswith(path.parent.name + "/") for p in result.problems)


def test_a_missing_source_is_transient_while_followed(store: Store, tmp_path: Path) -> None:
    source_id = register(store, tmp_path / "gone", "rollouts-verl", follow=True)
    with pytest.raises(ObserveError, match="no such file or directory") as err:
        ingest_source(store, source_id)
    assert err.value.transient and store.source(source_id)["state"] == "following"


def test_a_file_slower_to_read_than_a_batch_still_goes_on(store: Store, tmp_path: Path) -> None:
    """A batch whose budget is spent before its first row (the whole file used to be read first, then
    nothing stored, for ever: 0 of 1,024 rollouts of a 67 MiB file) stores a row at least and moves on; the
    groups carry over from one batch to the next."""
    from engine.observe.rollouts import trl as trl_reader

    out = tmp_path / "grpo"
    trl_step(out, 1, g=4, prompts=10)  # 40 rows, groups of 4
    source_id = register(store, out / "completions", "rollouts-trl")
    batches = 0
    while True:
        result = ingest_source(store, source_id, max_rows=1_000_000, max_seconds=0)
        batches += 1
        assert result.rows >= 1 or result.caught_up
        if result.caught_up:
            break
        assert batches <= 40
        # the next batch goes on from where this one stopped, not from the row group's first row
        assert any(kept.row == store.source(source_id)["cursor"]["row"] for kept in trl_reader.KEPT.values())
    rows = rollouts(store, only_run(store, source_id))
    assert len(rows) == 40 and batches >= 2
    groups = {(r["prompt"], r["group_id"]) for r in rows}
    assert len(groups) == 10 and len({g for _, g in groups}) == 10  # one group per prompt, across batches


def test_a_small_file_of_one_huge_completion_is_read_in_bounded_memory(store: Store, tmp_path: Path) -> None:
    """300 copies of one 512 KiB completion: a 1 MB dictionary-encoded file that is 150 MB once decoded. It
    is read a few rows at a time, and a batch holds a bounded amount of text before it is written."""
    import tracemalloc

    out = tmp_path / "grpo"
    huge = "y" * (512 << 10)
    path = trl_log_completions(out, 1, ["p"] * 300, [huge] * 300, {"r": [1.0] * 300}, [0.0] * 300)
    assert path.stat().st_size < 2 << 20
    source_id = register(store, out / "completions", "rollouts-trl")
    tracemalloc.start()
    try:
        result = drain(store, source_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.rows == 300 and result.problems == []
    assert peak < 120 << 20, f"{peak / 2**20:.0f} MiB held at once"  # the whole file decoded: 150 MB and more
    [first] = rollouts(store, only_run(store, source_id))[:1]
    assert first["completion"] == huge
