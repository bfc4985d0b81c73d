"""One training run is one carl run, and a followed run ends (issue 29): from files the real writers wrote.

- veRL 0.9.1 `Tracking(["file", "tensorboard"])` with its rollout dump (tests/data/verl/, written by
  write_verl.py with veRL's own code): one run, each series once, the rollouts on it, no false "nothing
  imported"; `--separate` and `--join`; |V| from veRL's checkpoint layout and from the model path a run's
  config names;
- tensorboardX 2.6.5 (tests/data/tensorboardx/) and torch's SummaryWriter `add_scalars`: the sub-runs are keys
  of their parent run, with no reward alias;
- verifiers 0.4 `traces.jsonl` (tests/data/verifiers/, written by its own `write_episode`): found and read;
- MLflow and TensorBoard logging one run: the MLflow run joins the TensorBoard run, another stays apart;
- the engine's follow (register_source / ingest_source ticks, then `ending.settle`, as daemon/loop.py calls
  it): a run whose writer is done is `finished`, `stopped` with its reason short of its planned steps, and
  running again when its source grows; the control room shows it (Pilot: the run list and the rollouts
  viewer).

Where a venv of the writer's own exists (/work/venvs/...), the writers are run again and their files checked
the same way; CI reads the committed files.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import series, until

from engine.observe import ending
from engine.observe.discover import describe, discover, import_order, register
from engine.observe.ingest import import_source, ingest_source
from engine.store import Store

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
VENVS = Path("/work/venvs")
VERL_KEYS = ("entropy", "loss", "reward", "policy_kl", "clip_ratio/region_mean", "completions/mean_length")


def copy(name: str, to: Path) -> Path:
    """A fixture folder copied (times kept, as the writer left them relative to each other)."""
    shutil.copytree(DATA / name, to, ignore=shutil.ignore_patterns("*.py"))
    return to


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def follow_dir(store: Store, root: Path, pairing: str = "auto") -> list[int]:
    """The engine's side of `carl observe DIR --follow`: every source registered, then ticked until caught up;
    returns the source ids."""
    registered = register(store, discover(root, pairing), follow=True, pairing=pairing)
    sources = [source_id for source_id, _ in import_order(registered)]
    tick(store, sources)
    return sources


def tick(store: Store, sources: list[int]) -> None:
    for source_id in sources:
        for _ in range(1000):
            if ingest_source(store, source_id, max_rows=50).caught_up:
                break


def run_ids(store: Store) -> list[int]:
    return [r[0] for r in store.conn.execute("SELECT id FROM runs ORDER BY id")]


def rows_per_key(store: Store, run_id: int) -> dict[str, int]:
    return dict(
        store.conn.execute("SELECT key, count(*) FROM metrics WHERE run_id=? GROUP BY key", (run_id,))
    )


# -- veRL: file logger + TensorBoard + rollout dump ----------------------------------------------------------


@pytest.mark.slow
def test_verl_file_and_tensorboard_are_one_run_with_its_rollouts(tmp_path: Path) -> None:
    root = copy("verl", tmp_path / "verl")
    home = tmp_path / "home"
    done = carl(home, "observe", str(root))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        f"found 1 run(s) in {root}:",
        "  veRL log: my_project/grpo_run.jsonl + TensorBoard run: tensorboard_log/my_project/grpo_run"
        " + veRL rollout dump: rollouts",
    ]
    assert "nothing imported" not in done.stderr and "Traceback" not in done.stderr
    with Store(home / "carl.db") as store:
        [run_id] = run_ids(store)
        run = store.run(run_id)
        assert (run["name"], run["framework"], run["last_step"]) == ("grpo_run", "verl", 3)
        counts = rows_per_key(store, run_id)
        assert set(VERL_KEYS) <= set(counts)
        assert set(counts.values()) == {3}  # every series once: three steps, not six
        expected = {s: 0.25 + 0 / 1000 + s / 10 for s in (1, 2, 3)}  # actor/entropy, as the writer logged it
        assert series(store, run_id, "entropy") == pytest.approx(expected)  # the JSON's, not float32's
        steps = store.conn.execute(
            "SELECT step, count(*) FROM rollouts WHERE run_id=? GROUP BY step", (run_id,)
        ).fetchall()
        assert steps == [(1, 4), (2, 4), (3, 4)]
    again = carl(home, "observe", str(root))  # read before: nothing new, and no false line either
    assert again.returncode == 0 and "nothing imported" not in again.stderr, again.stderr

    separate = carl(tmp_path / "home2", "observe", str(root), "--separate")
    assert separate.returncode == 0, separate.stderr
    assert separate.stdout.splitlines()[0] == f"found 2 run(s) in {root}:"
    with Store(tmp_path / "home2" / "carl.db") as store:
        assert len(run_ids(store)) == 2


def test_join_makes_one_run_of_sources_pairing_would_not(tmp_path: Path) -> None:
    """Two logs whose values differ (not the same run by their values) are one run with `--join`."""
    root = tmp_path / "two"
    (root / "p").mkdir(parents=True)
    for name, base in (("a", 1.0), ("b", 2.0)):
        (root / "p" / f"{name}.jsonl").write_text(
            "".join(json.dumps({"step": s, "data": {"actor/entropy": base + s}}) + "\n" for s in range(1, 5))
        )
    assert len(discover(root).runs) == 2
    # One kind each is what pairing joins; --join takes the user's word for it.
    [run] = discover(root, "join").runs
    assert [f.path.name for f in (run.metrics, *run.joined)] == ["a.jsonl", "b.jsonl"]


def test_pairing_needs_the_same_values_at_the_same_steps(tmp_path: Path) -> None:
    """A TensorBoard run and a veRL log written side by side with different values (a second run of the same
    script) are two runs; with the same values, one."""
    from torch.utils.tensorboard import SummaryWriter

    for name, offset in (("same", 0.0), ("other", 0.5)):
        root = tmp_path / name
        (root / "p").mkdir(parents=True)
        writer = SummaryWriter(str(root / "tb"))
        with open(root / "p" / "exp.jsonl", "w") as log:
            for step in range(1, 6):
                values = {"actor/entropy": 1.0 / step, "critic/score/mean": step / 10}
                log.write(json.dumps({"step": step, "data": values}) + "\n")
                for key, value in values.items():
                    writer.add_scalar(key, value + offset, step)
        writer.close()
    assert [len(r.joined) for r in discover(tmp_path / "same").runs] == [1]
    assert [len(r.joined) for r in discover(tmp_path / "other").runs] == [0, 0]


# -- a followed run ends -------------------------------------------------------------------------------------


def test_a_followed_verl_run_ends_finished_then_runs_again_when_it_grows(tmp_path: Path) -> None:
    root = copy("verl", tmp_path / "verl")
    with Store(tmp_path / "carl.db") as store:
        sources = follow_dir(store, root)
        [run_id] = run_ids(store)
        assert store.run(run_id)["status"] == "running"
        now = time.time()
        assert ending.settle(store, now) == []  # just read: alive
        later = now + ending.QUIET_MIN_SECONDS + 1
        assert ending.settle(store, later) == [run_id]
        run = store.run(run_id)
        assert run["status"] == "finished" and run["error"] is None and run["ended_at"] is not None
        [(kind, detail)] = store.conn.execute("SELECT kind, detail FROM events WHERE run_id=?", (run_id,))
        assert (
            kind == "ended" and detail.startswith("finished: no new data for ") and "after step 3" in detail
        )
        assert ending.settle(store, later + 1000) == []  # ended once

        # The writer goes on (a resumed run): the run is running again.
        with open(root / "my_project" / "grpo_run.jsonl", "ab") as log:
            log.write(json.dumps({"step": 4, "data": {"actor/entropy": 0.9}}).encode() + b"\n")
        tick(store, sources)
        assert ending.settle(store, time.time()) == [run_id]
        assert store.run(run_id)["status"] == "running" and store.run(run_id)["ended_at"] is None

        # Short of its planned steps, it is stopped, and says why.
        store.update_run(run_id, max_steps=10)
        assert ending.settle(store, time.time() + ending.QUIET_MIN_SECONDS + 1) == [run_id]
        run = store.run(run_id)
        assert run["status"] == "stopped" and run["error"].endswith("at step 4 of 10")


def test_a_slow_run_waits_for_five_of_its_steps(tmp_path: Path) -> None:
    """Steps ten minutes apart: quiet means fifty minutes, not five."""
    log = tmp_path / "slow.jsonl"
    log.write_text(
        "".join(json.dumps({"step": s, "time": 1e9 + 600 * s, "loss": 1.0}) + "\n" for s in range(6))
    )
    with Store(tmp_path / "carl.db") as store:
        from engine.observe.ingest import register_source

        source_id = register_source(store, log, follow=True)
        tick(store, [source_id])
        [run_id] = run_ids(store)
        assert ending.quiet_seconds(store, run_id) == pytest.approx(5 * 600)
        assert ending.settle(store, time.time() + 1000) == []
        assert ending.settle(store, time.time() + 3001) == [run_id]


def test_a_tracker_that_records_its_end_keeps_it(tmp_path: Path) -> None:
    """trainer_state.json's last entry ends the run itself; the quiet rule never takes it back to running."""
    out = tmp_path / "out"
    out.mkdir()
    history = [{"loss": 1.0 / s, "step": s} for s in range(1, 4)] + [{"train_runtime": 3.0, "step": 3}]
    (out / "trainer_state.json").write_text(json.dumps({"log_history": history, "max_steps": 3}))
    with Store(tmp_path / "carl.db") as store:
        from engine.observe.ingest import register_source

        tick(store, [register_source(store, out, follow=True)])
        [run_id] = run_ids(store)
        assert store.run(run_id)["status"] == "finished"
        assert ending.settle(store, time.time() + 10 * ending.QUIET_MIN_SECONDS) == []


# -- add_scalars ---------------------------------------------------------------------------------------------


def test_tensorboardx_add_scalars_sub_runs_are_keys_of_their_run(tmp_path: Path) -> None:
    root = copy("tensorboardx", tmp_path / "tbx")
    [found] = discover(root).runs
    assert found.metrics.kind == "tensorboard" and found.metrics.path == root / "run"
    with Store(tmp_path / "carl.db") as store:
        [(source_id, _)] = register(store, discover(root), follow=False)[0].sources
        import_source(store, source_id)
        [run_id] = run_ids(store)
        keys = set(rows_per_key(store, run_id))
        assert keys == {"reward", "entropy", "loss", "reward_parts/format", "reward_parts/accuracy"}
        assert series(store, run_id, "reward_parts/accuracy") == pytest.approx({1: 0.25, 2: 0.5, 3: 0.75})


def test_torch_add_scalars_sub_runs_are_keys_of_their_run(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step in range(3):
        writer.add_scalar("train/reward", step / 2, step)
        writer.add_scalars("reward_parts", {"format": 1.0, "accuracy": step / 4}, step)
        writer.add_scalars("train/kl_parts", {"ref": 0.1}, step)
    writer.close()
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_dir()) == [
        "reward_parts_accuracy",
        "reward_parts_format",
        "train_kl_parts_ref",
    ]
    with Store(tmp_path / "carl.db") as store:
        from engine.observe.ingest import observe

        _, result = observe(store, tmp_path / "run")
        [run_id] = result.run_ids
        assert set(rows_per_key(store, run_id)) == {
            "reward",
            "reward_parts/format",
            "reward_parts/accuracy",
            "kl_parts/ref",
        }


# -- verifiers 0.4 -------------------------------------------------------------------------------------------


def test_verifiers_04_traces_are_found_and_read(tmp_path: Path) -> None:
    outputs = copy("verifiers", tmp_path / "outputs")
    run_dir = outputs / "gsm8k--tiny--default--a1b2c3d4"
    found = discover(outputs)
    [run] = found.runs
    assert (run.main.kind, run.main.path, run.metrics) == (
        "rollouts-verifiers",
        run_dir / "traces.jsonl",
        None,
    )
    assert (
        describe(found, run)
        == "verifiers traces: gsm8k--tiny--default--a1b2c3d4/traces.jsonl (rollouts only)"
    )
    with Store(tmp_path / "carl.db") as store:
        [(source_id, _)] = register(store, found, follow=False)[0].sources
        result = import_source(store, source_id)
        assert result.bad_lines == 0 and result.rows == 4
        [run_id] = result.run_ids
        assert store.run(run_id)["name"] == "gsm8k--tiny--default--a1b2c3d4"
        samples = store.conn.execute(
            "SELECT step, group_id, prompt, completion, total FROM rollouts WHERE run_id=? ORDER BY idx",
            (run_id,),
        ).fetchall()
        assert samples == [
            (0, "q-4", "user: What is 2+2?", "4", 1.5),  # correct 1 + format 1 x 0.5
            (0, "q-4", "user: What is 2+2?", "5", 0.5),
            (0, "q-9", "user: What is 3*3?", "9", 1.5),
            (0, "q-9", "user: What is 3*3?", "6", 0.5),
        ]
    # A run dir vf-eval has just set up: traces.jsonl still empty beside configs/.
    (run_dir / "traces.jsonl").write_bytes(b"")
    assert [r.main.kind for r in discover(outputs).runs] == ["rollouts-verifiers"]
    shutil.rmtree(run_dir / "configs")
    with pytest.raises(Exception, match="no runs found"):
        discover(outputs)


# -- MLflow + TensorBoard ------------------------------------------------------------------------------------


def test_mlflow_and_tensorboard_of_one_run_are_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow")
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.create_experiment("e")
    logged = client.create_run(experiment, run_name="logged-twice").info.run_id
    other = client.create_run(experiment, run_name="another").info.run_id
    writer = SummaryWriter(str(tmp_path / "tb" / "exp"))
    for step in range(1, 6):
        values = {"actor/entropy": 1.0 / step, "critic/score/mean": step / 10}
        for key, value in values.items():
            writer.add_scalar(key, value, step)
            client.log_metric(logged, key, value, step=step)
            client.log_metric(other, key, value + 1.0, step=step)
    client.log_param(logged, "lr", "1e-6")  # only MLflow has it: the run gets it too
    writer.close()
    found = discover(tmp_path)
    by_kind = {r.main.kind: r for r in found.runs}
    assert set(by_kind) == {"tensorboard", "mlflow"}
    [joined] = by_kind["tensorboard"].joined
    assert (joined.kind, joined.external_id) == ("mlflow", logged)
    with Store(tmp_path / "carl.db") as store:
        registered = register(store, found, follow=False)
        for source_id, _ in import_order(registered):
            import_source(store, source_id)
        names = dict(store.conn.execute("SELECT name, id FROM runs"))
        assert set(names) == {"exp", "another"}  # "logged-twice" is the TensorBoard run
        assert set(rows_per_key(store, names["exp"]).values()) == {5}
        assert series(store, names["another"], "entropy")[1] == pytest.approx(2.0)


# -- |V| for veRL --------------------------------------------------------------------------------------------


def test_vocab_from_verl_checkpoints_and_from_the_model_path(tmp_path: Path, tiny_model: Path) -> None:
    from transformers import LlamaConfig

    root = copy("verl", tmp_path / "verl")
    for step, vocab in ((2, 1234), (3, 4321)):  # veRL saves the model's config with each checkpoint
        folder = (
            root / "checkpoints" / "my_project" / "grpo_run" / f"global_step_{step}" / "actor" / "huggingface"
        )
        LlamaConfig(vocab_size=vocab).save_pretrained(folder)
    [run] = discover(root).runs
    assert run.vocab_size == 4321  # the newest checkpoint's

    # A run whose config names its model (veRL's actor_rollout_ref.model.path, as W&B or MLflow keep it).
    log = tmp_path / "named" / "exp.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"step": 1, "data": {"actor/entropy": 1.0}}) + "\n")
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    with Store(tmp_path / "carl.db") as store:
        from engine.observe.ingest import register_source

        source_id = register_source(store, log, follow=True)
        tick(store, [source_id])
        [run_id] = run_ids(store)
        assert store.run(run_id)["vocab_size"] is None
        store.update_run(run_id, config={"actor_rollout_ref": {"model": {"path": str(tiny_model)}}})
        with open(log, "a") as f:
            f.write(json.dumps({"step": 2, "data": {"actor/entropy": 2.0}}) + "\n")
        tick(store, [source_id])
        assert store.run(run_id)["vocab_size"] == vocab
        assert series(store, run_id, "phi/mean")[2] == pytest.approx(1 - 2.0 / math.log(vocab))


# -- the control room ----------------------------------------------------------------------------------------


async def test_the_control_room_shows_one_verl_run_with_its_rollouts_and_its_end(tmp_path: Path) -> None:
    from test_app_rollouts import open_viewer, rows

    from carl_tui.app import ControlRoom
    from carl_tui.runs import RunList

    root = copy("verl", tmp_path / "verl")
    home = tmp_path / "home"
    with Store(home / "carl.db") as store:
        follow_dir(store, root)
        ending.settle(store, time.time() + ending.QUIET_MIN_SECONDS + 1)
        [run_id] = run_ids(store)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        runs = app.query_one("#run-list", RunList)
        await until(pilot, lambda: runs.option_count == 1)
        assert str(runs.get_option_at_index(0).prompt).strip() == "✓ grpo_run"
        screen = await open_viewer(pilot, run_id)
        assert screen.list.total == 4  # a step's samples, the newest step first
        assert {r.step for r in rows(app)} == {3} and {r.completion for r in rows(app)} == {
            "4",
            "5",
            "9",
            "6",
        }


# -- the writers themselves, where their venvs are here ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("venv", "script", "expected"),
    [
        ("verl-0.9.1", "verl/write_verl.py", "veRL log: my_project/grpo_run.jsonl + TensorBoard run"),
        ("tbx-2.6.5", "tensorboardx/write_tbx.py", "TensorBoard run: run"),
        ("verifiers-0.4", "verifiers/write_traces.py", "verifiers traces: gsm8k--tiny--default--a1b2c3d4"),
    ],
)
def test_the_writers_write_what_the_fixtures_hold(
    venv: str, script: str, expected: str, tmp_path: Path
) -> None:
    python = VENVS / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python} here (CI reads the committed files in tests/data/)")
    out = tmp_path / "out"
    out.mkdir()
    target = out / "run" if "tbx" in venv else out
    subprocess.run(
        [python, DATA / script, str(target)], cwd=out, check=True, capture_output=True, timeout=300
    )
    found = discover(out)
    [run] = found.runs
    assert describe(found, run).startswith(expected)
    if "verl" in venv:
        assert [f.kind for f in run.joined] == ["tensorboard"] and [f.kind for f in run.rollouts] == [
            "rollouts-verl"
        ]
