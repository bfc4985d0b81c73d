"""The training runner for real: `python -m engine.training` trains the tiny model with TRL on CPU,
reports every step to the store, obeys the control room's commands, survives kill -9, and fails
bad input with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import OFFLINE, ROOT, Launched, end_all, finish, launched_together, wait_for
from support import start_training as start
from test_command_vocabulary import command_row

from engine.store import ROLLUP_LEVELS, Store, StoreReader
from engine.store.commands import CommandError
from engine.training.backend import paused_polls_key

pytestmark = pytest.mark.slow
os.environ.update(OFFLINE)  # nothing here may reach the Hugging Face hub


def write_config(path: Path, tiny: Path, **settings: Any) -> Path:
    config = {
        "name": "t",
        "model": str(tiny),
        "max_steps": 6,
        "save_steps": 3,
        "max_completion_length": 12,
        "rewards": [
            {"name": "task"},
            {"name": "format", "weight": 0.5},
            {"name": "coherence", "weight": 0.25},
        ],
        "cascade": {"min_points": 2, "window": 2, "min_above": 1, "ramp_steps": 2},
        **settings,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home" / "carl.db") as s:
        yield s


def run_row(store: Store, name: str) -> dict[str, Any]:
    run_id = store.run_id_by_name(name)
    assert run_id is not None
    return store.run(run_id)  # type: ignore[return-value]


def steps_of(store: Store, run_id: int, key: str) -> dict[int, float | None]:
    rows = store.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step", (run_id, key)
    )
    return dict(rows.fetchall())


def command_state(store: Store, command_id: int) -> tuple[str, str | None]:
    return store.conn.execute("SELECT state, result FROM commands WHERE id=?", (command_id,)).fetchone()


def done(store: Store, command_id: int) -> tuple[str, str | None] | None:
    state = command_state(store, command_id)
    return state if state[0] in ("done", "failed") else None


PAUSED_POLLS = 3  # looks at the queue a paused run must have taken before a test checks it trained nothing


def held_polls(store: Store, run_id: int, step: int) -> int:
    """How often the paused run has looked at its command queue while holding at `step` (0 elsewhere)."""
    held = store.kv(paused_polls_key(run_id)) or {}
    return held.get("polls", 0) if held.get("step") == step else 0


# -- a real run ------------------------------------------------------------------------------------


def sum_rows() -> list[dict[str, str]]:
    """A dataset with a `reference` column: the rewards know no task, the reference task checks it."""
    return [
        {
            "prompt": f"What is {a} + {b}?",
            "reference": str(a + b),
            "verifier": "number",
            "completion": f"<answer>{a + b}</answer>",
        }
        for a in range(6)
        for b in range(4)
    ]


@pytest.fixture(scope="module")
def one_shot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launched]]:
    """The runs that need nothing from their tests while they train, started together when the first is
    wanted, each in a home of its own: their tests wait for their end and read their stores."""
    root = tmp_path_factory.mktemp("one-shot")
    short = write_config(root / "short.yaml", tiny_model, sft_warmup_steps=2)
    runs = {"short": (root / "short", ["--config", str(short), "--name", "short"])}
    dataset = root / "sums.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in sum_rows()))
    for backend in ("torch", "mlx"):
        config = write_config(
            root / f"sums-{backend}.yaml",
            tiny_model,
            dataset=str(dataset),
            max_steps=2,
            backend=backend,
            rewards=[{"name": "task"}, {"name": "format", "weight": 0.5}],
        )
        runs[f"sums-{backend}"] = (root / f"sums-{backend}", ["--config", str(config), "--name", "sums"])
    with launched_together(runs) as started:
        yield started


def test_a_short_grpo_run_reports_every_step(one_shot: dict[str, Launched]) -> None:
    store = one_shot["short"].store
    code, out, err = one_shot["short"].finish()
    assert code == 0, err
    run = run_row(store, "short")
    assert run["status"] == "finished" and run["error"] is None and run["source_kind"] == "carl"
    assert (run["max_steps"], run["last_step"], run["vocab_size"], run["temperature"]) == (8, 8, 512, 1.0)
    run_id = run["id"]
    # The SFT warm-up is steps 1-2, GRPO steps 3-8, each logged once with TRL's own keys.
    assert sorted(steps_of(store, run_id, "loss")) == list(range(1, 9))
    assert sorted(steps_of(store, run_id, "rewards/task/mean")) == list(range(3, 9))
    for key in (
        "reward",
        "reward_std",
        "rewards/format/mean",
        "frac_reward_zero_std",
        "completions/mean_length",
    ):
        assert sorted(steps_of(store, run_id, key)) == list(range(3, 9)), key
    for key in ("entropy", "learning_rate", "grad_norm", "phi/mean", "phi/entropy"):  # SFT logs these too
        assert sorted(steps_of(store, run_id, key)) == list(range(1, 9)), key
    assert not steps_of(store, run_id, "train_runtime")
    # Phi per step (token-weighted, with percentiles and a histogram), the entropy in nats beside it.
    phi = store.conn.execute(
        "SELECT step, phi_mean, phi_p10, phi_p90, entropy_mean, tokens, vocab_size, hist FROM phi_stats"
        " WHERE run_id=? AND step>2 ORDER BY step",
        (run_id,),
    ).fetchall()
    assert [r[0] for r in phi] == list(range(3, 9))
    for _, mean, p10, p90, entropy, tokens, vocab, hist in phi:
        assert 0 <= p10 <= mean <= 1 and p10 <= p90 <= 1 and tokens > 0 and vocab == 512
        assert entropy == pytest.approx(json_entropy(store, run_id, _), rel=1e-6)
        assert sum(json.loads(hist)) == tokens
    gates = store.conn.execute(
        "SELECT step, state, reason FROM gate_states WHERE run_id=? ORDER BY step", (run_id,)
    ).fetchall()
    assert [g[0] for g in gates] == list(range(3, 9)) and all(g[2] for g in gates)
    samples = store.conn.execute(
        "SELECT step, kind, completion, tokens, phi, entropy, rewards FROM samples WHERE run_id=?", (run_id,)
    ).fetchall()
    assert {s[1] for s in samples} == {"best", "worst", "median", "random"}
    for _, _, _, tokens, phi_json, entropy_json, rewards in samples:
        assert len(json.loads(tokens)) == len(json.loads(phi_json)) == len(json.loads(entropy_json))
        assert {"task", "format", "coherence", "total"} <= set(json.loads(rewards))
    check_rollouts(store, run_id, range(3, 9), group=8)
    check_health_keys(store, run_id, range(3, 9), kl=False)  # beta 0: no KL term, no kl key
    check_perf(store, run_id, sft=range(1, 3), grpo=range(3, 9), rows=32, completions=8)
    # TRL's own count of the warm-up's tokens (every rank's, cumulative) is the perf record's.
    tokens = steps_of(store, run_id, "num_tokens")
    for step in (1, 2):
        per_s, seconds = (steps_of(store, run_id, k)[step] for k in ("perf/tokens_per_s", "perf/step_time_s"))
        assert per_s * seconds == pytest.approx(tokens[step] - tokens.get(step - 1, 0.0))
    # Checkpoints, each with the gate's state beside it, recorded on the run.
    assert run["last_checkpoint_step"] == 8 and Path(run["last_checkpoint"]).name == "checkpoint-6"
    assert (Path(run["last_checkpoint"]) / "carl_gate.json").is_file()
    assert "grpo step 8/8" in out


def check_rollouts(store: Store, run_id: int, steps: range, group: int) -> None:
    """Every GRPO step stored all its samples (8, under the default cap of 64) as rollouts: one group, each
    reward function's value, the total and TRL's advantage, and per token the text, the log-probability and
    the entropy the run's Phi came from (the same numbers as the samples table and phi_stats, within
    float16)."""
    reader = StoreReader(store.path)
    assert reader.rollout_steps(run_id) == [(step, group) for step in steps]
    picked = {
        (step, idx): (json.loads(entropy), json.loads(rewards))
        for step, idx, entropy, rewards in store.conn.execute(
            "SELECT step, idx, entropy, rewards FROM samples WHERE run_id=?", (run_id,)
        )
    }
    for step in steps:
        rows = reader.rollouts(run_id, step)
        assert [r["idx"] for r in rows] == list(range(group)) and {r["group_id"] for r in rows} == {"0"}
        assert sum(r["advantage"] for r in rows) == pytest.approx(0.0, abs=1e-4)  # TRL normalises them
        for row in rows:
            assert set(row["rewards"]) == {"task", "format", "coherence"} and row["total"] is not None
            assert row["length"] == len(row["tokens"]) == len(row["entropy"]) == len(row["logprob"]) > 0
            assert max(row["logprob"]) <= 1e-3 and min(row["entropy"]) >= 0
            if (step, row["idx"]) in picked:
                entropy, rewards = picked[step, row["idx"]]
                assert row["entropy"] == pytest.approx(entropy, rel=1e-3, abs=1e-3)
                assert row["total"] == pytest.approx(rewards["total"], abs=1e-5)
        pooled = [h for r in rows for h in r["entropy"]]
        mean = store.conn.execute(
            "SELECT entropy_mean FROM phi_stats WHERE run_id=? AND step=?", (run_id, step)
        ).fetchone()[0]
        assert sum(pooled) / len(pooled) == pytest.approx(mean, rel=1e-3)
    assert {s for s, _ in picked if s in steps} == set(steps)
    assert sorted(steps_of(store, run_id, "timing/rollouts_s")) == list(steps)
    reader.close()


HEALTH_KEYS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "completions/clipped_ratio",
    "frac_reward_zero_std",
    "entropy/p10",
    "entropy/p50",
    "entropy/p90",
    "cov/logp_adv",
)


def check_health_keys(store: Store, run_id: int, steps: range, *, kl: bool) -> None:
    """Every GRPO step recorded the RL health keys under TRL's names, and the entropy percentiles and
    Cov(log π, A) agree with the step's stored rollouts (every sample of the step; float16 per token)."""
    import numpy as np

    for key in HEALTH_KEYS:
        assert sorted(steps_of(store, run_id, key)) == list(steps), key
    assert sorted(steps_of(store, run_id, "kl")) == (list(steps) if kl else [])
    reader = StoreReader(store.path)
    try:
        for step in steps:
            values = {key: steps_of(store, run_id, key)[step] for key in HEALTH_KEYS}
            low, high, region = (values[f"clip_ratio/{k}_mean"] for k in ("low", "high", "region"))
            assert 0 <= low <= region <= 1 and 0 <= high <= region and region == pytest.approx(low + high)
            rows = reader.rollouts(run_id, step)
            entropy = np.concatenate([r["entropy"] for r in rows])
            assert values["entropy/p10"] <= values["entropy/p50"] <= values["entropy/p90"]
            assert values["entropy/p50"] == pytest.approx(np.median(entropy), rel=1e-2, abs=1e-3)
            logp = np.concatenate([r["logprob"] for r in rows])
            advantage = np.concatenate([[r["advantage"]] * len(r["logprob"]) for r in rows])
            covariance = np.mean((logp - logp.mean()) * (advantage - advantage.mean()))
            assert values["cov/logp_adv"] == pytest.approx(covariance, rel=2e-2, abs=2e-3)
            lengths = [r["length"] for r in rows]
            assert values["completions/mean_length"] == pytest.approx(np.mean(lengths))
            unended = [r["tokens"][-1] != "</s>" for r in rows]  # TRL's clipped: no end-of-sequence token
            assert values["completions/clipped_ratio"] == pytest.approx(np.mean(unended))
            assert all(n == 12 for r, n in zip(rows, lengths, strict=True) if r["tokens"][-1] != "</s>")
    finally:
        reader.close()


PERF_KEYS = ("perf/step_time_s", "perf/tokens_per_s", "perf/samples_per_s", "perf/time/update_s")
PHASES = ("perf/time/generation_s", "perf/time/scoring_s", "perf/time/update_s")
GRPO_PERF_KEYS = (*PHASES, "perf/prompt_tokens_per_s", "perf/completion_tokens_per_s")
PHASES_SHARE = 0.75  # the phases, each measured where it runs, cover at least this much of the step


def check_perf(store: Store, run_id: int, *, sft: range, grpo: range, rows: int, completions: int) -> None:
    """Every step's throughput, the same keys on either backend (engine/training/perf.py): its time, split
    into generation, scoring and update, which together are nearly all of it; its tokens and samples per
    second, consistent with the step's own counts. SFT steps have what applies to them: no generation or
    scoring. On one CPU process: no per-GPU figure and no MFU (no peak is known for a CPU)."""
    values = {key: steps_of(store, run_id, key) for key in {*PERF_KEYS, *GRPO_PERF_KEYS}}
    steps = [*sft, *grpo]
    for key in PERF_KEYS:
        assert sorted(values[key]) == steps, key
    for key in GRPO_PERF_KEYS:
        assert set(grpo) <= set(values[key]), key
    for key in PHASES[:2]:
        assert not set(sft) & set(values[key]), key
    lengths = steps_of(store, run_id, "completions/mean_length")
    for step in steps:
        seconds = values["perf/step_time_s"][step]
        phases = [values[key].get(step, 0.0) for key in PHASES]
        assert seconds > 0 and min(phases) >= 0 and values["perf/time/update_s"][step] > 0
        assert PHASES_SHARE * seconds <= sum(phases) <= seconds * (1 + 1e-9), (step, seconds, phases)
        samples = values["perf/samples_per_s"][step] * seconds
        assert samples == pytest.approx(rows if step in sft else completions), step
        assert values["perf/tokens_per_s"][step] * seconds > samples  # a sample has a token or more
    for step in grpo:
        seconds = values["perf/step_time_s"][step]
        assert values["perf/time/generation_s"][step] > 0
        prompt, completion = (values[f"perf/{k}_tokens_per_s"][step] for k in ("prompt", "completion"))
        assert prompt + completion == pytest.approx(values["perf/tokens_per_s"][step])
        assert completion * seconds == pytest.approx(lengths[step] * completions)
    for key in ("perf/tokens_per_s_per_gpu", "perf/mfu"):
        assert not steps_of(store, run_id, key), key


def json_entropy(store: Store, run_id: int, step: int) -> float:
    return store.conn.execute(
        "SELECT value FROM metrics WHERE run_id=? AND step=? AND key='phi/entropy'", (run_id, step)
    ).fetchone()[0]


# -- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_reference_answer_dataset_trains_on_either_backend_with_its_own_checks(
    one_shot: dict[str, Launched], backend: str
) -> None:
    """The rewards know no task: a dataset with a `reference` column is checked by the reference task."""
    from engine.tasks import ReferenceTask

    store = one_shot[f"sums-{backend}"].store
    code, _, err = one_shot[f"sums-{backend}"].finish()
    assert code == 0, err
    run_id = run_row(store, "sums")["id"]
    assert sorted(steps_of(store, run_id, "rewards/task/mean")) == [1, 2]
    reference = {row["prompt"]: row["reference"] for row in sum_rows()}
    samples = store.conn.execute("SELECT prompt, completion, rewards FROM samples WHERE run_id=?", (run_id,))
    checked = 0
    task = ReferenceTask()
    for prompt, completion, rewards in samples.fetchall():
        want = reference[prompt.removeprefix("user: ")]
        scores = json.loads(rewards)
        assert scores["task"] == task.score(completion, {"reference": want, "verifier": "number"})
        assert scores["format"] == pytest.approx(task.format_score(completion))
        checked += 1
    assert checked > 0


def test_commands_pause_resume_checkpoint_set_lr_set_weight_stop(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model, max_steps=2000, save_steps=1000)
    proc = start(tmp_path / "home", "--config", str(config), "--name", "ctl")
    try:
        run_id = wait_for(lambda: store.run_id_by_name("ctl"), proc=proc)
        last_step = lambda: store.run(run_id)["last_step"] or 0  # noqa: E731
        wait_for(lambda: last_step() >= 2, proc=proc)

        def send(verb: str, args: dict | None = None) -> tuple[str, str]:
            command_id = store.enqueue_command(verb, args, target="run", run_id=run_id)
            return wait_for(lambda: done(store, command_id), proc=proc)

        state, result = send("set_lr", {"lr": 0.000123})
        assert state == "done", result
        applied = int(result.rsplit(" ", 1)[1])
        wait_for(lambda: applied in steps_of(store, run_id, "learning_rate"), proc=proc)
        assert steps_of(store, run_id, "learning_rate")[applied] == pytest.approx(0.000123)

        assert send("set_weight", {"reward": "format", "weight": 2.0}) == ("done", "weight of format = 2")
        state, result = send("set_weight", {"reward": "coherence", "weight": 5.0})
        assert state == "done" and "capped at 0.5" in result
        assert send("set_weight", {"reward": "nope", "weight": 1.0})[0] == "failed"
        with pytest.raises(CommandError, match="^set_lr: lr must be a number > 0, got -1$"):
            send("set_lr", {"lr": -1})  # refused at the sender; a row written by hand, by the runner:
        refused = command_row(store, "set_lr", {"lr": -1}, target="run", run_id=run_id)
        assert wait_for(lambda: done(store, refused), proc=proc) == (
            "failed",
            "set_lr: lr must be a number > 0, got -1",
        )
        unknown = command_row(store, "warp", {}, target="run", run_id=run_id)
        state, result = wait_for(lambda: done(store, unknown), proc=proc)
        assert state == "failed" and "unknown command 'warp'" in result

        state, result = send("checkpoint")
        assert state == "done", result
        saved = Path(result.split(": ", 1)[1])
        assert saved.is_dir() and (saved / "carl_gate.json").is_file()
        run = store.run(run_id)
        assert run["last_checkpoint"] == str(saved)
        events = store.conn.execute("SELECT kind, detail FROM events WHERE run_id=?", (run_id,)).fetchall()
        assert ("checkpoint", str(saved)) in events

        state, result = send("pause")
        assert state == "done", result
        assert store.run(run_id)["status"] == "paused"
        held = int(result.removeprefix("paused at step "))
        wait_for(lambda: last_step() == held, proc=proc)  # the step the pause came at is stored
        wait_for(lambda: held_polls(store, run_id, held) >= PAUSED_POLLS, proc=proc)  # it held, polling
        assert last_step() == held  # nothing trains while paused
        state, result = send("checkpoint")  # a checkpoint while paused is still saved
        assert state == "done" and f"checkpoint-{held}" in result
        assert store.run(run_id)["status"] == "paused" and last_step() == held
        assert send("resume")[0] == "done"
        assert store.run(run_id)["status"] == "running"
        wait_for(lambda: last_step() > held + 1, proc=proc)

        state, result = send("stop")
        assert state == "done", result
        code, _, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    run = store.run(run_id)
    assert run["status"] == "stopped" and run["last_step"] < 2000
    assert run["last_checkpoint_step"] == run["last_step"]  # the stop saved a final checkpoint
    assert Path(run["last_checkpoint"]).name == f"checkpoint-{run['last_step']}"


# -- crash safety ----------------------------------------------------------------------------------


def paused_at(store: Store, run_id: int, proc: subprocess.Popen[str], after_step: int) -> int:
    """Drive a run to a known point: once it is past `after_step`, pause it through the command queue and
    return the step boundary it holds at (a kill then lands there, not wherever the run had got to)."""
    wait_for(lambda: (store.run(run_id)["last_step"] or 0) >= after_step, proc=proc)
    command = store.enqueue_command("pause", target="run", run_id=run_id, origin="test")
    result = wait_for(
        lambda: store.conn.execute(
            "SELECT result FROM commands WHERE id=? AND state='done'", (command,)
        ).fetchone(),
        proc=proc,
    )
    return int(result[0].removeprefix("paused at step "))


def last_checkpoint_before(store: Store, run_id: int, step: int) -> int:
    rows = store.conn.execute(
        "SELECT step FROM events WHERE run_id=? AND kind='checkpoint' AND step<=?", (run_id, step)
    ).fetchall()
    return max(r[0] for r in rows)


def test_kill_9_then_resume_leaves_every_step_exactly_once(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model, max_steps=16, save_steps=4, sft_warmup_steps=2)
    proc = start(tmp_path / "home", "--config", str(config), "--name", "crash")
    try:  # a run left paused would wait for its commands for ever
        run_id = wait_for(lambda: store.run_id_by_name("crash"), proc=proc)
        held = paused_at(store, run_id, proc, after_step=11)  # past the checkpoints at store steps 6 and 10
        expected = last_checkpoint_before(store, run_id, held)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        end_all([proc])
    assert store.run(run_id)["status"] == "paused"  # what a crash leaves

    code, out, err = finish(start(tmp_path / "home", "--resume", "crash"))
    assert code == 0, err
    run = store.run(run_id)
    assert run["status"] == "finished" and run["last_step"] == 18
    counts = store.conn.execute(
        "SELECT step, count(*) FROM metrics WHERE run_id=? AND key='loss' GROUP BY step", (run_id,)
    ).fetchall()
    assert counts == [(step, 1) for step in range(1, 19)]
    for table in ("phi_stats", "gate_states"):
        steps = [
            r[0]
            for r in store.conn.execute(f"SELECT step FROM {table} WHERE run_id=? ORDER BY step", (run_id,))
        ]
        assert steps == sorted(set(steps)) and steps[-1] == 18, table
    assert [
        r[0]
        for r in store.conn.execute("SELECT step FROM gate_states WHERE run_id=? ORDER BY step", (run_id,))
    ] == list(range(3, 19))
    # The rollups agree with the rows they summarise.
    for level in ROLLUP_LEVELS[:2]:
        stored = store.conn.execute(
            "SELECT key, bucket, n, vsum FROM rollups WHERE run_id=? AND level=? ORDER BY key, bucket",
            (run_id, level),
        ).fetchall()
        fresh = store.conn.execute(
            "SELECT key, step / ?, count(value), sum(value) FROM metrics WHERE run_id=? "
            "GROUP BY key, step / ? ORDER BY key, step / ?",
            (level, run_id, level, level),
        ).fetchall()
        assert [(k, b, n) for k, b, n, _ in stored] == [(k, b, n) for k, b, n, _ in fresh]
        for (_, _, _, a), (_, _, _, b) in zip(stored, fresh, strict=True):
            assert (a is None and b is None) or a == pytest.approx(b)
    resumed = store.conn.execute(
        "SELECT step FROM events WHERE run_id=? AND kind='resume'", (run_id,)
    ).fetchone()
    assert resumed == (expected,)  # the last checkpoint before the kill, nothing after it
    assert f"grpo step {expected + 1}/18" in out and "sft" not in out  # the warm-up is not repeated


# -- bad input ---------------------------------------------------------------------------------------


def test_bad_input_fails_with_one_line(tmp_path: Path, tiny_model: Path, store: Store) -> None:
    home = tmp_path / "home"
    cases = [
        ("badfield", {"cascade": {"ramp_steps": 0}}, 2, "cascade.ramp_steps: Input should be greater than 0"),
        (
            "nomodel",
            {"model": str(tmp_path / "missing-model")},
            2,
            f"model {tmp_path / 'missing-model'}: no such directory",
        ),
        (
            "nocols",
            {"dataset": str(write_rows(tmp_path / "rows.jsonl"))},
            2,
            "no 'answer_tool' column, which the task reward needs",
        ),
        ("nobackend", {"backend": "cuda"}, 2, "backend: Input should be 'auto', 'torch' or 'mlx'"),
        (
            "badimport",
            {"rewards": [{"name": "no_such_module_x:fn"}]},
            2,
            "reward module 'no_such_module_x' not found",
        ),
        (
            "raises",
            {"rewards": [{"name": "carl_user_rewards:explode"}]},
            1,
            "reward 'explode' raised ZeroDivisionError",
        ),
        ("diverges", {"learning_rate": 1e12}, 1, "the model's probabilities became NaN or inf"),
    ]
    (tmp_path / "carl_user_rewards.py").write_text(
        "def explode(prompts, completions, **kwargs):\n    return [1 / 0 for _ in completions]\n"
    )
    procs: list[subprocess.Popen[str]] = []  # side by side: each fails on its own
    try:
        for name, settings, _, _ in cases:
            config = write_config(tmp_path / f"{name}.yaml", tiny_model, **settings)
            env = {**os.environ, **OFFLINE, "PYTHONPATH": str(tmp_path)}
            argv = [
                sys.executable,
                "-m",
                "engine.training",
                "--home",
                str(home),
                "--config",
                str(config),
                "--name",
                name,
            ]
            procs.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        for proc, (name, _, code, reason) in zip(procs, cases, strict=True):
            returncode, _, err = finish(proc)
            lines = err.strip().splitlines()
            assert returncode == code, (name, err)
            assert lines and reason in lines[-1], (name, err)
            assert lines[-1].startswith("carl train: ")
            run = run_row(store, name)
            assert run["status"] == "failed" and reason in run["error"], name
            assert "\n" not in run["error"]
    finally:
        end_all(procs)
    assert store.conn.execute(
        "SELECT count(*) FROM metrics WHERE run_id=?", (run_row(store, "nocols")["id"],)
    ).fetchone() == (0,)


def write_rows(path: Path) -> Path:
    path.write_text("\n".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) for i in range(8)) + "\n")
    return path


def test_resume_of_an_unknown_run_is_bad_input(tmp_path: Path) -> None:
    code, _, err = finish(start(tmp_path / "home", "--resume", "ghost"))
    assert code == 2 and err.strip() == "carl train: --resume ghost: no such run"
