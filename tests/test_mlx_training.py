"""The MLX backend for real (mlx[cpu] on this machine): `python -m engine.training --backend mlx` trains the
tiny model, reports every step like the torch backend, obeys the command queue, resumes exactly after kill -9,
and its SFT warm-up reaches the torch backend's loss on the same data."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from support import Launched, end_all, launched_together  # noqa: E402
from test_training_runner import (  # noqa: E402
    PAUSED_POLLS,
    check_health_keys,
    check_perf,
    check_rollouts,
    done,
    finish,
    held_polls,
    last_checkpoint_before,
    paused_at,
    run_row,
    start,
    steps_of,
    wait_for,
    write_config,
)

from engine.store import Store  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """The store of the runs these tests start (their home is tmp_path / "home")."""
    with Store(tmp_path / "home" / "carl.db") as s:
        yield s


def mlx_config(path: Path, tiny: Path, **settings: Any) -> Path:
    return write_config(path, tiny, backend="mlx", **settings)


LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def one_shot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launched]]:
    """The runs that need nothing from their tests while they train, started together when the first is
    wanted, each in a home of its own: their tests wait for their end and read their stores."""
    root = tmp_path_factory.mktemp("one-shot")
    configs = {
        "short": mlx_config(root / "short.yaml", tiny_model, sft_warmup_steps=2, beta=0.04),
        "sft": mlx_config(root / "sft.yaml", tiny_model, method="sft", max_steps=5, save_steps=5, lora=LORA),
        "bad": mlx_config(
            root / "bad.yaml", tiny_model, lora={"enabled": True, "target_modules": ["c_attn"]}
        ),
    }
    runs = {
        name: (root / name, ["--config", str(config), "--name", name]) for name, config in configs.items()
    }
    with launched_together(runs) as started:
        yield started


def test_a_short_mlx_grpo_run_reports_every_step_like_torch(one_shot: dict[str, Launched]) -> None:
    store = one_shot["short"].store
    code, out, err = one_shot["short"].finish()
    assert code == 0, err
    run = run_row(store, "short")
    assert (run["status"], run["backend"], run["source_kind"]) == ("finished", "mlx", "carl")
    assert (run["max_steps"], run["last_step"], run["vocab_size"], run["temperature"]) == (8, 8, 512, 1.0)
    run_id = run["id"]
    assert sorted(steps_of(store, run_id, "loss")) == list(range(1, 9))
    for key in (
        "reward",
        "reward_std",
        "rewards/task/mean",
        "rewards/format/mean",
        "frac_reward_zero_std",
        "completions/mean_length",
        "clip_ratio/region_mean",
    ):
        assert sorted(steps_of(store, run_id, key)) == list(range(3, 9)), key
    for key in ("entropy", "learning_rate", "grad_norm", "phi/mean", "phi/entropy"):
        assert sorted(steps_of(store, run_id, key)) == list(range(1, 9)), key
    assert set(steps_of(store, run_id, "learning_rate").values()) == {5e-3, 1e-3}  # warm-up at 5x
    phi = store.conn.execute(
        "SELECT step, phi_mean, phi_p10, phi_p90, entropy_mean, tokens, vocab_size, hist FROM phi_stats"
        " WHERE run_id=? AND step>2 ORDER BY step",
        (run_id,),
    ).fetchall()
    assert [r[0] for r in phi] == list(range(3, 9))
    for _, mean, p10, p90, entropy, tokens, vocab, hist in phi:
        assert 0 <= p10 <= mean <= 1 and p10 <= p90 <= 1 and tokens > 0 and vocab == 512
        assert mean == pytest.approx(
            1 - entropy / np.log(512), abs=0.02
        )  # token-weighted, as torch writes it
        assert sum(json.loads(hist)) == tokens
    gates = store.conn.execute(
        "SELECT step, state, reason FROM gate_states WHERE run_id=? ORDER BY step", (run_id,)
    ).fetchall()
    assert [g[0] for g in gates] == list(range(3, 9)) and all(g[2] for g in gates)
    samples = store.conn.execute(
        "SELECT kind, tokens, phi, entropy, rewards FROM samples WHERE run_id=?", (run_id,)
    ).fetchall()
    assert {s[0] for s in samples} == {"best", "worst", "median", "random"}
    for _, tokens, phi_json, entropy_json, rewards in samples:
        assert len(json.loads(tokens)) == len(json.loads(phi_json)) == len(json.loads(entropy_json)) > 0
        assert {"task", "format", "coherence", "total"} <= set(json.loads(rewards))
    check_rollouts(store, run_id, range(3, 9), group=8)
    check_health_keys(store, run_id, range(3, 9), kl=True)  # beta 0.04: the k3 KL to the starting model
    check_perf(store, run_id, sft=range(1, 3), grpo=range(3, 9), rows=32, completions=8)
    # MLX's memory, which only the training process sees: the step's peak, and what is held at its end.
    active, peak = (steps_of(store, run_id, f"mlx/{k}_memory_gb") for k in ("active", "peak"))
    assert sorted(active) == sorted(peak) == list(range(1, 9))
    assert all(0 < active[step] <= peak[step] < 1 for step in active)  # a tiny model: under 1 GiB
    assert all(v >= 0 for v in steps_of(store, run_id, "kl").values())
    assert run["last_checkpoint_step"] == 8 and Path(run["last_checkpoint"]).name == "checkpoint-8"
    final = Path(run["output_dir"]) / "final"
    assert (final / "model.safetensors").is_file() and (final / "config.json").is_file()
    assert "grpo step 8/8" in out


def test_an_mlx_lora_sft_run_saves_an_adapter(one_shot: dict[str, Launched], tiny_model: Path) -> None:
    store = one_shot["sft"].store
    code, out, err = one_shot["sft"].finish()
    assert code == 0, err
    run = run_row(store, "sft")
    assert (run["status"], run["backend"], run["last_step"]) == ("finished", "mlx", 5)
    losses = steps_of(store, run["id"], "loss")
    assert sorted(losses) == list(range(1, 6)) and losses[5] < losses[1]
    assert sorted(steps_of(store, run["id"], "mean_token_accuracy")) == list(range(1, 6))
    final = Path(run["output_dir"]) / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["fine_tune_type"] == "lora" and adapter["lora_parameters"]["rank"] == 4
    assert adapter["lora_parameters"]["scale"] == 2.0 and adapter["base_model_name_or_path"] == str(
        tiny_model
    )
    assert sorted(adapter["lora_parameters"]["keys"]) == ["self_attn.q_proj", "self_attn.v_proj"]
    from mlx_lm import load

    model, _ = load(str(tiny_model), adapter_path=str(final))  # mlx-lm loads what the run saved
    assert model is not None


def test_a_lora_target_mlx_cannot_honour_is_one_line(one_shot: dict[str, Launched]) -> None:
    code, _, err = one_shot["bad"].finish()
    assert code == 2
    [line] = [line for line in err.splitlines() if line.strip()]
    assert line.startswith(
        "carl train: lora.target_modules: c_attn is not a linear layer of this model's blocks"
    )


def test_mlx_commands_pause_resume_checkpoint_set_lr_set_weight_stop(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = mlx_config(tmp_path / "carl.yaml", tiny_model, max_steps=5000, save_steps=1000)
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
        assert send("set_weight", {"reward": "nope", "weight": 1.0})[0] == "failed"

        state, result = send("checkpoint")
        assert state == "done", result
        saved = Path(result.split(": ", 1)[1])
        assert (saved / "carl_state.json").is_file() and (saved / "optimizer.safetensors").is_file()

        state, result = send("pause")
        assert state == "done", result
        assert store.run(run_id)["status"] == "paused"
        held = int(result.removeprefix("paused at step "))
        wait_for(lambda: last_step() == held, proc=proc)  # the step the pause came at is stored
        wait_for(lambda: held_polls(store, run_id, held) >= PAUSED_POLLS, proc=proc)  # it held, polling
        assert last_step() == held  # nothing trains while paused
        state, result = send("checkpoint")  # a checkpoint while paused is still saved
        assert state == "done" and f"checkpoint-{held}" in result
        assert send("resume")[0] == "done"
        assert store.run(run_id)["status"] == "running"
        wait_for(lambda: last_step() > held + 1, proc=proc)

        assert send("stop")[0] == "done"
        code, _, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    run = store.run(run_id)
    assert run["status"] == "stopped" and run["last_step"] < 5000
    assert run["last_checkpoint_step"] == run["last_step"]  # the stop saved a final checkpoint


def test_kill_9_then_resume_replays_the_lost_steps_exactly(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    """No step lost or doubled, and the replayed steps are the steps an unbroken run takes: each step's
    prompts and samples come from the seed and the step, the weights and optimizer from the checkpoint."""
    settings = {"max_steps": 12, "save_steps": 4, "sft_warmup_steps": 2}
    config = mlx_config(tmp_path / "carl.yaml", tiny_model, **settings)
    code, _, err = finish(start(tmp_path / "home", "--config", str(config), "--name", "unbroken"))
    assert code == 0, err
    unbroken = steps_of(store, run_row(store, "unbroken")["id"], "loss")

    proc = start(tmp_path / "home", "--config", str(config), "--name", "crash")
    try:  # a run left paused would wait for its commands for ever
        run_id = wait_for(lambda: store.run_id_by_name("crash"), proc=proc)
        held = paused_at(store, run_id, proc, after_step=9)  # past the checkpoint at step 8
        expected = last_checkpoint_before(store, run_id, held)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        end_all([proc])
    code, out, err = finish(start(tmp_path / "home", "--resume", "crash"))
    assert code == 0, err
    run = store.run(run_id)
    assert (run["status"], run["last_step"]) == ("finished", 14)
    counts = store.conn.execute(
        "SELECT step, count(*) FROM metrics WHERE run_id=? AND key='loss' GROUP BY step", (run_id,)
    ).fetchall()
    assert counts == [(step, 1) for step in range(1, 15)]
    resumed = store.conn.execute(
        "SELECT step FROM events WHERE run_id=? AND kind='resume'", (run_id,)
    ).fetchone()
    assert resumed == (expected,) and f"resumed from checkpoint-{expected}" in out
    replayed = steps_of(store, run_id, "loss")
    assert replayed == pytest.approx(unbroken, abs=1e-5)


@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_the_mlx_warmup_reaches_the_torch_loss_on_the_demo(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    """The same SFT warm-up (the demo's data, batch, learning rate) on both backends, from the same weights:
    the mean loss of the last 10 of 80 steps agrees within 25% (their batches differ: each backend orders the
    data its own way), and both have learned (from ~6.3 nats to well under 1)."""
    losses = {}
    runs = {}
    try:
        for backend in ("torch", "mlx"):  # side by side: one run alone leaves a core of two idle
            config = write_config(
                tmp_path / f"{backend}.yaml",
                tiny_model,
                backend=backend,
                method="sft",
                max_steps=80,
                save_steps=1000,
                per_device_train_batch_size=32,
                learning_rate=2.5e-3,
                rewards=[{"name": "task"}],
            )
            runs[backend] = start(tmp_path / "home", "--config", str(config), "--name", backend)
        for backend, proc in runs.items():
            code, _, err = finish(proc, timeout=300)
            assert code == 0, err
            series = steps_of(store, run_row(store, backend)["id"], "loss")
            losses[backend] = float(np.mean([series[s] for s in range(71, 81)]))
            assert series[1] > 5.0 and losses[backend] < 1.0
    finally:
        end_all(runs.values())
    assert losses["mlx"] == pytest.approx(losses["torch"], rel=0.25), losses
