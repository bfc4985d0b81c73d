"""Data-parallel training for real: `carl train --processes 2` runs two ranks of the tiny model through
accelerate's launcher (torchrun, gloo on CPU). Rank 0 alone writes every step once, Phi pools both
ranks' completions, commands reach both ranks at the same step, and a rank that dies fails the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import end_all, finish, wait_for
from support import start_training as start
from test_training_runner import PAUSED_POLLS, held_polls

from engine.store import SCHEMA_VERSION, Store
from engine.store.system_reads import SystemReads

pytestmark = pytest.mark.slow
GLOBAL_BATCH = 16  # 8 completions per rank (per_device_train_batch_size), two ranks


def write_config(path: Path, tiny: Path, **settings: Any) -> Path:
    config = {
        "name": "dp",
        "model": str(tiny),
        "max_steps": 3,
        "save_steps": 2,
        "max_completion_length": 6,
        "rewards": [
            {"name": "task"},
            {"name": "format", "weight": 0.5},
            {"name": "coherence", "weight": 0.25},
        ],
        "cascade": {"mode": "always"},  # the coherence reward (and its pooled calibration) from step 1
        **settings,
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home" / "carl.db") as s:
        yield s


def per_step(store: Store, run_id: int, table: str, where: str = "") -> list[tuple[int, int]]:
    return store.conn.execute(
        f"SELECT step, count(*) FROM {table} WHERE run_id=? {where} GROUP BY step ORDER BY step", (run_id,)
    ).fetchall()


def ranks_of(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """The training processes under the launcher (the carl train process's grandchildren)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    return [
        p
        for p in children
        if "engine.training" in p.cmdline() and "accelerate.commands.launch" not in p.cmdline()
    ]


def kill_all(proc: subprocess.Popen[str]) -> None:
    """Nothing this test started outlives it (the launcher runs in its own session)."""
    if proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


# -- two ranks, every step once -------------------------------------------------------------------


@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_two_processes_write_each_step_once_with_phi_over_both_ranks(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model)
    home = tmp_path / "home"
    code, out, err = finish(start(home, "--config", str(config), "--processes", "2"))
    assert code == 0, err
    run_id = store.run_id_by_name("dp")
    run = store.run(run_id)
    assert (run["status"], run["last_step"], run["backend"], run["error"]) == ("finished", 3, "torch", None)
    assert json.loads(run["config"])["processes"] == 2
    for key in ("loss", "reward", "rewards/task/mean", "completions/mean_length", "phi/mean"):
        assert per_step(store, run_id, "metrics", f"AND key='{key}'") == [(1, 1), (2, 1), (3, 1)], key
    for table in ("phi_stats", "gate_states"):
        assert per_step(store, run_id, table) == [(1, 1), (2, 1), (3, 1)], table
    assert per_step(store, run_id, "samples") == [(1, 4), (2, 4), (3, 4)]
    # Phi pools both ranks' completions: the step's token count is the global batch's (TRL's mean
    # completion length is over both ranks). Counting rank 0's alone would give about half.
    lengths = dict(
        store.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key='completions/mean_length'", (run_id,)
        )
    )
    for step, tokens, hist in store.conn.execute(
        "SELECT step, tokens, hist FROM phi_stats WHERE run_id=?", (run_id,)
    ):
        assert tokens == round(lengths[step] * GLOBAL_BATCH), step
        assert sum(json.loads(hist)) == tokens
    # Throughput counts every rank's completions and tokens (rank 0 writes it); per GPU is per rank here.
    perf = {
        key: dict(
            store.conn.execute("SELECT step, value FROM metrics WHERE run_id=? AND key=?", (run_id, key))
        )
        for key in (
            "perf/step_time_s",
            "perf/samples_per_s",
            "perf/tokens_per_s",
            "perf/tokens_per_s_per_gpu",
            "perf/completion_tokens_per_s",
        )
    }
    for step in (1, 2, 3):
        seconds = perf["perf/step_time_s"][step]
        assert perf["perf/samples_per_s"][step] * seconds == pytest.approx(GLOBAL_BATCH)
        assert perf["perf/completion_tokens_per_s"][step] * seconds == pytest.approx(
            lengths[step] * GLOBAL_BATCH
        )
        assert perf["perf/tokens_per_s_per_gpu"][step] == pytest.approx(perf["perf/tokens_per_s"][step] / 2)
    # Every completion of the global batch is a rollout, with both ranks' advantages and per-token values.
    assert per_step(store, run_id, "rollouts") == [(1, GLOBAL_BATCH), (2, GLOBAL_BATCH), (3, GLOBAL_BATCH)]
    assert store.conn.execute(
        "SELECT count(*) FROM rollouts WHERE run_id=? AND advantage IS NOT NULL AND entropy IS NOT NULL"
        " AND length(entropy) = 2 * length AND length(logprob) = 2 * length",
        (run_id,),
    ).fetchone() == (3 * GLOBAL_BATCH,)
    samples = store.conn.execute("SELECT idx, tokens, phi FROM samples WHERE run_id=?", (run_id,)).fetchall()
    assert all(0 <= idx < GLOBAL_BATCH for idx, _, _ in samples)
    assert all(len(json.loads(t)) == len(json.loads(p)) for _, t, p in samples)
    # Checkpoints as TRL saves them under data parallelism: each rank's RNG state, carl's state once.
    checkpoint = Path(run["last_checkpoint"])
    assert run["last_checkpoint_step"] == 3 and checkpoint.name == "checkpoint-3"
    for name in ("carl_gate.json", "rng_state_0.pth", "rng_state_1.pth", "model.safetensors"):
        assert (checkpoint / name).is_file(), name
    assert (checkpoint.parent / "final" / "config.json").is_file()
    # The coherence reward calibrated on both ranks' answers: one value per completion of the global batch.
    (coherence,) = json.loads((checkpoint / "carl_gate.json").read_text())["rewards"]["coherence"]
    assert coherence["batches_seen"] >= 1
    assert len(coherence["calibration"]) == GLOBAL_BATCH * coherence["batches_seen"]
    assert out.count("[carl] grpo step 3/3") == 1  # rank 0 alone prints
    # Every process of the run recorded (engine/system/run_processes.py), each ended cleanly: no death.
    ended = SystemReads(store.conn, SCHEMA_VERSION).run_processes(run_id)
    assert sorted((p["role"], p["rank"]) for p in ended) == [
        ("launcher", None),
        ("launcher", None),
        ("rank", 0),
        ("rank", 1),
    ]
    assert [(p["exit_code"], p["signal"], p["died"]) for p in ended] == [(0, None, 0)] * 4

    # Resume with both ranks from the last checkpoint: step 4 is added, nothing is repeated.
    code, out, err = finish(start(home, "--resume", "dp", "--max-steps", "4"))
    assert code == 0, err
    run = store.run(run_id)
    assert (run["status"], run["last_step"]) == ("finished", 4)
    assert per_step(store, run_id, "metrics", "AND key='loss'") == [(s, 1) for s in range(1, 5)]
    assert per_step(store, run_id, "phi_stats") == [(s, 1) for s in range(1, 5)]
    resumed = store.conn.execute(
        "SELECT step FROM events WHERE run_id=? AND kind='resume'", (run_id,)
    ).fetchall()
    assert resumed == [(3,)]
    assert "grpo step 4/4" in out


# -- commands reach both ranks ------------------------------------------------------------------


def test_pause_checkpoint_and_stop_reach_both_ranks_at_one_step(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model, max_steps=2000, save_steps=1000)
    proc = start(tmp_path / "home", "--config", str(config), "--processes", "2")
    try:
        run_id = wait_for(lambda: store.run_id_by_name("dp"), proc=proc)
        last_step = lambda: store.run(run_id)["last_step"] or 0  # noqa: E731
        wait_for(lambda: last_step() >= 2, proc=proc)

        def send(verb: str, args: dict | None = None) -> tuple[str, str]:
            command_id = store.enqueue_command(verb, args, target="run", run_id=run_id)
            return wait_for(
                lambda: store.conn.execute(
                    "SELECT state, result FROM commands WHERE id=? AND state IN ('done', 'failed')",
                    (command_id,),
                ).fetchone(),
                proc=proc,
            )

        state, result = send("pause")
        assert state == "done", result
        held = int(result.removeprefix("paused at step "))
        wait_for(lambda: last_step() == held, proc=proc)
        # Every look rank 0 takes at the queue is an exchange with rank 1, so both ranks hold.
        wait_for(lambda: held_polls(store, run_id, held) >= PAUSED_POLLS, proc=proc)
        assert last_step() == held and store.run(run_id)["status"] == "paused"
        state, result = send("checkpoint")  # saved while paused: both ranks write their part at `held`
        assert state == "done" and result.endswith(f"checkpoint-{held}"), result
        assert {"rng_state_0.pth", "rng_state_1.pth", "carl_gate.json"} <= {
            p.name for p in Path(result.split(": ", 1)[1]).iterdir()
        }
        assert send("resume")[0] == "done"
        wait_for(lambda: last_step() > held, proc=proc)
        state, result = send("stop")
        assert state == "done", result
        code, _, err = finish(proc)
    finally:
        kill_all(proc)
    assert code == 0, err
    run = store.run(run_id)
    assert run["status"] == "stopped" and run["error"] is None
    stopped = run["last_step"]
    assert run["last_checkpoint_step"] == stopped  # the stop's checkpoint, both ranks at that step
    checkpoint = Path(run["last_checkpoint"])
    assert checkpoint.name == f"checkpoint-{stopped}"
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert per_step(store, run_id, "metrics", "AND key='loss'") == [(s, 1) for s in range(1, stopped + 1)]


def test_sigterm_to_carl_train_stops_both_ranks_with_a_checkpoint(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model, max_steps=2000, save_steps=1000)
    proc = start(tmp_path / "home", "--config", str(config), "--processes", "2")
    try:
        run_id = wait_for(lambda: store.run_id_by_name("dp"), proc=proc)
        wait_for(lambda: (store.run(run_id)["last_step"] or 0) >= 1, proc=proc)
        proc.send_signal(signal.SIGTERM)  # carl train passes it to rank 0, which tells rank 1
        code, _, err = finish(proc)
    finally:
        kill_all(proc)
    assert code == 0, err
    run = store.run(run_id)
    assert run["status"] == "stopped" and run["last_checkpoint_step"] == run["last_step"] < 2000
    assert (Path(run["last_checkpoint"]) / "rng_state_1.pth").is_file()


# -- a rank that dies ------------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["rank 1", "rank 0"])
def test_a_rank_that_dies_fails_the_run_and_stops_the_others(
    tmp_path: Path, tiny_model: Path, store: Store, victim: str
) -> None:
    config = write_config(tmp_path / "carl.yaml", tiny_model, max_steps=2000, save_steps=1000)
    proc = start(tmp_path / "home", "--config", str(config), "--processes", "2")
    try:
        run_id = wait_for(lambda: store.run_id_by_name("dp"), proc=proc)
        wait_for(lambda: (store.run(run_id)["last_step"] or 0) >= 2, proc=proc)
        ranks = ranks_of(proc)
        assert len(ranks) == 2
        rank0 = store.run(run_id)["pid"]
        assert rank0 in {p.pid for p in ranks}
        (target,) = [p for p in ranks if (p.pid == rank0) == (victim == "rank 0")]
        target.send_signal(signal.SIGKILL)
        code, _, err = finish(proc, timeout=120)
        assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        kill_all(proc)
    assert code == 1, err
    run = store.run(run_id)
    assert run["status"] == "failed"
    if victim == "rank 1":  # rank 0 saw its collective fail and recorded it
        assert run["error"].startswith("another training process died or stopped answering"), run["error"]
    else:  # the launching carl train recorded it
        assert run["error"].startswith(f"training process rank 0 (pid {rank0}) died"), run["error"]
    assert err.strip().splitlines()[-1] == f"carl train: {run['error']}"


# -- refused before anything starts -----------------------------------------------------------------


def test_more_processes_than_cores_or_on_mlx_is_one_line(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the limit counts GPUs here")
    config = write_config(tmp_path / "carl.yaml", tiny_model)
    cores = len(os.sched_getaffinity(0))
    too_many = start(tmp_path / "home", "--config", str(config), "--processes", str(cores + 1))
    on_mlx = start(tmp_path / "home", "--config", str(config), "--processes", "2", "--backend", "mlx")
    try:  # side by side: each is refused on its own
        code, _, err = finish(too_many)
        assert code == 2
        assert err.strip() == (
            f"carl train: --processes {cores + 1}: no GPU, and this machine has {cores} CPU cores "
            "(one process per core)"
        )
        code, _, err = finish(on_mlx)
        assert code == 2
        assert err.strip() == "carl train: --processes 2: several processes train on the torch backend only"
    finally:
        end_all([too_many, on_mlx])
    assert store.conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_bad_input_a_rank_would_meet_is_one_line_before_the_launch(
    tmp_path: Path, tiny_model: Path, store: Store
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(8)))
    cases = [
        ({"dataset": str(rows)}, f"dataset {rows}: no 'answer_tool' column, which the task reward needs"),
        ({"model": str(tmp_path / "nowhere")}, f"model {tmp_path / 'nowhere'}: no such directory"),
    ]
    started = []  # side by side: each is refused on its own
    try:
        for i, (settings, _) in enumerate(cases):
            config = write_config(tmp_path / f"carl-{i}.yaml", tiny_model, **settings)
            started.append(start(tmp_path / "home", "--config", str(config), "--processes", "2"))
        for proc, (_, reason) in zip(started, cases, strict=True):
            code, _, err = finish(proc)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert err.strip().startswith(f"carl train: {reason}"), err
    finally:
        end_all(started)
    assert store.conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)  # nothing was launched
