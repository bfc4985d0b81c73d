"""`carl observe DIR`: every run in an output directory found, grouped one carl run per training run, and
registered (metrics first, rollouts attached), from files the real writers wrote: a tiny TRL GRPO run
reporting to TensorBoard and W&B (offline) with its completions on, W&B offline runs, veRL's and prime-rl's
writers (copied from their source, named in tests/test_observe_jsonl_frameworks.py), MLflow's file store.

Discovery is checked here, not the reading of TensorBoard, W&B or rollouts
(their readers have their own tests).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from support import series
from test_observe_jsonl_frameworks import VerlFileLogger, prime_rl_log_metrics, verl_step

from engine.observe import ObserveError
from engine.observe import discover as discover_module
from engine.observe.discover import describe, discover, register
from engine.store import Store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """W&B offline, silent, with no network and no login. wandb reads its environment once per process (in
    `wandb.setup()`), so the setup is torn down whenever the environment changes: else a run started after
    another test's run ignores WANDB_DIR and writes `wandb/` into the working directory."""
    import wandb

    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DIR", "WANDB_API_KEY")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    os.environ.pop("WANDB_API_KEY", None)
    wandb.teardown()
    yield
    wandb.teardown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def trl_output(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, wandb_env: None) -> Path:
    """A real TRL GRPO run of the tiny model, 2 steps, report_to TensorBoard and W&B (offline, into the output
    dir), log_completions on, then save_state: the output dir a TRL user has."""
    import wandb
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path_factory.mktemp("trl") / "grpo-out"
    out.mkdir()
    os.environ["WANDB_DIR"] = str(out)
    wandb.teardown()  # the next run reads WANDB_DIR (see wandb_env)

    def brevity(completions: list[str], **_: object) -> list[float]:
        return [1.0 / (1 + len(c)) for c in completions]

    args = GRPOConfig(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        beta=0.04,  # a reference model, so TRL logs its KL too
        logging_steps=1,
        report_to=["tensorboard", "wandb"],
        log_completions=True,
        use_cpu=True,
        save_strategy="no",
        run_name="tiny-grpo",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list([{"prompt": f"count to {i}:"} for i in range(8)])
    trainer = GRPOTrainer(model=str(tiny_model), reward_funcs=[brevity], args=args, train_dataset=dataset)
    trainer.train()
    trainer.save_state()
    wandb.finish()
    return out


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory: pytest.TempPathFactory, wandb_env: None) -> Path:
    """A `wandb/` directory holding two offline runs, as wandb writes them."""
    import wandb

    root = tmp_path_factory.mktemp("wb")
    for name in ("first", "second"):
        run = wandb.init(project="p", name=name, dir=str(root), config={"vocab_size": 64})
        for step in range(3):
            run.log({"train/entropy": 1.0 + step, "train/reward": step / 2}, step=step)
        run.finish()
    return root / "wandb"


def kinds(found: list) -> list[str]:
    return [f.kind for f in found]


def sources(store: Store) -> list[dict]:
    ids = [r[0] for r in store.conn.execute("SELECT id FROM sources ORDER BY id")]
    return [store.source(i) for i in ids]


# -- a TRL output dir ----------------------------------------------------------------------------------------


def test_a_trl_output_dir_is_one_run(store: Store, trl_output: Path) -> None:
    [board] = list((trl_output / "runs").iterdir())
    found = discover(trl_output)
    [run] = found.runs
    assert run.metrics.kind == "tensorboard" and run.metrics.path == board
    # The same run, logged to three trackers holding the same values at the same steps: read into one run.
    assert kinds(run.joined) == ["wandb", "trainer_state"] and run.same == []
    assert [(f.kind, f.path) for f in run.rollouts] == [("rollouts-trl", trl_output / "completions")]
    assert run.name == "grpo-out"  # not the date and host of its TensorBoard folder
    line = describe(found, run)
    assert line.startswith(f"TensorBoard run: runs/{board.name} + W&B run: wandb/offline-run-")
    assert line.endswith(" + trainer_state.json: . + TRL completions: completions")
    assert found.notes == []

    # From the folder above, the same.
    [above] = discover(trl_output.parent).runs
    assert (above.metrics, above.joined, above.rollouts, above.name) == (
        run.metrics,
        run.joined,
        run.rollouts,
        run.name,
    )

    [registered] = register(store, found, follow=False)
    assert registered.errors == []
    board_source, wandb_source, state_source, completions = sources(store)
    assert (board_source["kind"], board_source["path"], board_source["name"]) == (
        "tensorboard",
        str(board),
        "grpo-out",
    )
    assert (completions["kind"], completions["path"]) == ("rollouts-trl", str(trl_output / "completions"))
    assert completions["attach_to"] == board_source["id"] and board_source["attach_to"] is None
    assert wandb_source["attach_to"] == state_source["attach_to"] == board_source["id"]  # joined
    # Registering again keeps the sources (and their cursors).
    register(store, found, follow=True)
    assert [s["id"] for s in sources(store)] == [
        board_source["id"],
        wandb_source["id"],
        state_source["id"],
        completions["id"],
    ]
    assert all(s["follow"] == 1 for s in sources(store))


def test_a_tracker_whose_package_is_missing_comes_last(
    trl_output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discover_module, "installed", lambda package: package != "tensorboard")
    [run] = discover(trl_output).runs
    assert run.metrics.kind == "wandb" and kinds(run.joined) == ["trainer_state"]
    assert kinds(run.same) == ["tensorboard"]  # not readable: told by its start, and named in a note
    monkeypatch.setattr(discover_module, "installed", lambda package: package not in ("tensorboard", "wandb"))
    [run] = discover(trl_output).runs
    assert run.metrics.kind == "trainer_state" and kinds(run.same) == ["tensorboard", "wandb"]
    monkeypatch.setattr(discover_module, "installed", lambda package: package != "pyarrow")
    found = discover(trl_output)
    assert found.notes == [
        "completions: reading TRL completions needs pyarrow: pip install 'carl-tui[parquet]'"
    ]


def test_runs_are_paired_by_start_time(trl_output: Path, tmp_path: Path) -> None:
    """Two W&B runs in an output dir beside one TensorBoard run, holding the same values: the one that started
    with it is the same run, the one an hour later a run of its own (the same values, but not the same run),
    and trainer_state.json goes with the run whose values it holds; the completions with the newest run."""
    out = tmp_path / "out"
    shutil.copytree(trl_output, out, symlinks=True)
    [original] = [p for p in (out / "wandb").iterdir() if p.name.startswith("offline-run-")]
    stamp = time.strftime(
        "%Y%m%d_%H%M%S",
        time.localtime(time.mktime(time.strptime(original.name[12:27], "%Y%m%d_%H%M%S")) + 3600),
    )
    later = out / "wandb" / f"offline-run-{stamp}-later0"
    shutil.copytree(original, later)
    found = discover(out)
    assert [(r.metrics.kind, kinds(r.joined)) for r in found.runs] == [
        ("tensorboard", ["wandb", "trainer_state"]),
        ("wandb", []),
    ]
    assert found.runs[0].joined[0].path == original and found.runs[1].metrics.path == later
    assert kinds(found.runs[1].rollouts) == ["rollouts-trl"]  # the newest run of the dir


def test_a_wandb_directory_with_several_runs(store: Store, wandb_runs: Path) -> None:
    found = discover(wandb_runs)
    assert [r.metrics.kind for r in found.runs] == ["wandb", "wandb"]
    assert all(r.metrics.path.parent == wandb_runs and not r.same and not r.rollouts for r in found.runs)
    assert len(register(store, found, follow=False)) == 2
    assert [s["kind"] for s in sources(store)] == ["wandb", "wandb"]
    # latest-run is a link to one of them: not a third run
    assert (wandb_runs / "latest-run").is_symlink()


# -- veRL, prime-rl, verifiers, stores -----------------------------------------------------------------------


def dump_generations(
    dump_path: Path, step: int, inputs: list[str], outputs: list[str], scores: list[float]
) -> None:
    """verl/trainer/ppo/ray_trainer.py RayPPOTrainer._dump_generations (volcengine/verl b178a3cd)."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{step}.jsonl")
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": ["4"] * n, "score": scores, "step": [step] * n}
    lines = [json.dumps({k: v[i] for k, v in base_data.items()}, ensure_ascii=False) for i in range(n)]
    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture
def verl_dir(tmp_path: Path) -> Path:
    root = tmp_path / "verl-exp"
    (root / "my_project").mkdir(parents=True)
    logger = VerlFileLogger(root / "my_project" / "grpo_run.jsonl")
    for step in range(1, 4):
        logger.log(verl_step(step), step)
        dump_generations(root / "rollouts", step, ["2+2="] * 2, ["4", "5"], [1.0, 0.0])
    logger.finish()
    return root


def test_a_verl_experiment_dir(store: Store, verl_dir: Path) -> None:
    found = discover(verl_dir)
    [run] = found.runs
    assert (run.metrics.kind, run.metrics.what) == ("jsonl", "veRL log")
    assert [(f.kind, f.path) for f in run.rollouts] == [("rollouts-verl", verl_dir / "rollouts")]
    assert describe(found, run) == "veRL log: my_project/grpo_run.jsonl + veRL rollout dump: rollouts"
    register(store, found, follow=False)
    log, dumps = sources(store)
    assert (log["kind"], dumps["kind"], dumps["attach_to"]) == ("jsonl", "rollouts-verl", log["id"])


def test_a_verl_dump_in_the_folder_of_its_log(tmp_path: Path) -> None:
    logger = VerlFileLogger(tmp_path / "exp.jsonl")
    logger.log(verl_step(1), 1)
    logger.finish()
    dump_generations(tmp_path, 1, ["q"], ["a"], [1.0])
    [run] = discover(tmp_path).runs
    assert run.metrics.path == tmp_path / "exp.jsonl" and kinds(run.rollouts) == ["rollouts-verl"]


def log_episodes(output_dir: Path, step: int, records: list[dict]) -> None:
    """src/prime_rl/monitors/file.py FileMonitor.log_episodes (the records are vf.Episode.to_record()'s shape:
    id, env, task, group, traces with their rewards)."""
    path = output_dir / "rollouts" / f"step_{step}" / "train" / "all" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for record in records:
            f.write(
                orjson.dumps(
                    record, default=str, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
                )
            )


def test_a_prime_rl_output_dir(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "prime-run"
    out.mkdir()
    with open(out / "metrics.jsonl", "a", buffering=1) as file:
        for step in range(2):
            prime_rl_log_metrics(
                file, {"entropy/all/mean": 1.0, "optim/grad_norm": 0.5, "loss/mean": 0.1}, step
            )
            episode = {
                "id": f"e{step}",
                "env": {"id": "gsm8k"},
                "group": {"id": "g0"},
                "traces": [{"reward": 1.0}],
            }
            log_episodes(out, step, [episode])
    found = discover(tmp_path)
    [run] = found.runs
    assert (run.metrics.kind, run.metrics.what, run.name) == ("jsonl", "prime-rl JSONL log", "prime-run")
    assert [(f.kind, f.path) for f in run.rollouts] == [("rollouts-prime", out / "rollouts")]
    register(store, found, follow=False)
    log, rollouts = sources(store)
    assert (log["name"], rollouts["attach_to"]) == ("prime-run", log["id"])


def test_verifiers_results_and_stores_are_runs_of_their_own(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow")
    evals = tmp_path / "outputs" / "evals" / "gsm8k--tiny" / "abc123"
    evals.mkdir(parents=True)
    with open(
        evals / "results.jsonl", "w"
    ) as f:  # vf-eval's results: prompt, completion, reward, rubric scores
        for i in range(3):
            f.write(
                json.dumps(
                    {"prompt": [{"role": "user", "content": f"q{i}"}], "completion": "a", "reward": 1.0}
                )
                + "\n"
            )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run_id = client.create_run(client.create_experiment("e"), run_name="r").info.run_id
    client.log_metric(run_id, "loss", 1.0, step=1)
    Store(tmp_path / "carl.db").close()  # our own store is no run of anyone's
    found = discover(tmp_path)
    assert [(r.main.kind, r.metrics is None) for r in found.runs] == [
        ("mlflow", False),
        ("rollouts-verifiers", True),
    ]
    assert describe(found, found.runs[1]).endswith("(rollouts only)")
    register(store, found, follow=False)
    assert [(s["kind"], s["attach_to"]) for s in sources(store)] == [
        ("mlflow", None),
        ("rollouts-verifiers", None),
    ]


def test_nothing_found_and_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "data.jsonl").write_text('{"text": "a dataset, not a log"}\n')
    with pytest.raises(ObserveError, match="no runs found"):
        discover(tmp_path)
    deep = tmp_path.joinpath(*"abcdefghijkl")
    deep.mkdir(parents=True)
    (deep / "m.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    monkeypatch.setattr(discover_module, "MAX_DEPTH", 4)
    with pytest.raises(ObserveError, match="no runs found"):
        discover(tmp_path)
    monkeypatch.setattr(discover_module, "MAX_DEPTH", 20)
    assert discover(tmp_path).runs[0].metrics.path == deep / "m.jsonl"


def test_a_name_is_for_one_run(store: Store, wandb_runs: Path) -> None:
    with pytest.raises(ObserveError, match="--name names one run, but 2 were found"):
        register(store, discover(wandb_runs), follow=False, name="x")


# -- the command ---------------------------------------------------------------------------------------------


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )


def test_carl_observe_a_directory(tmp_path: Path, verl_dir: Path) -> None:
    home = tmp_path / "home"
    result = carl(home, "observe", str(verl_dir), "--vocab-size", "32000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"found 1 run(s) in {verl_dir}:"
    assert lines[1] == "  veRL log: my_project/grpo_run.jsonl + veRL rollout dump: rollouts"
    assert any(line.startswith("jsonl: my_project/grpo_run.jsonl: ") for line in lines)
    assert "Traceback" not in result.stderr
    with Store(home / "carl.db") as store:
        [run] = [store.run(r[0]) for r in store.conn.execute("SELECT id FROM runs")]
        assert (run["name"], run["framework"], run["vocab_size"]) == ("grpo_run", "verl", 32_000)
        entropy = series(store, run["id"], "entropy")
        assert series(store, run["id"], "phi/mean") == pytest.approx(
            {s: 1 - h / math.log(32_000) for s, h in entropy.items()}
        )
    two = tmp_path / "two"
    shutil.copytree(verl_dir, two / "a")
    shutil.copytree(verl_dir, two / "b")
    refused = carl(home, "observe", str(two), "--name", "x")
    assert refused.returncode == 2 and "--name names one run, but 2" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = carl(home, "observe", str(empty))
    assert nothing.returncode == 2 and "no runs found" in nothing.stderr and "Traceback" not in nothing.stderr


def test_carl_observe_a_directory_follows_it(tmp_path: Path, verl_dir: Path) -> None:
    from engine.control import stop_engine

    home = tmp_path / "home"
    try:
        result = carl(home, "observe", str(verl_dir), "--follow")
        assert result.returncode == 0, result.stderr
        assert "the engine keeps following 2 source(s)" in result.stdout
        with Store(home / "carl.db") as store:
            log, dumps = sources(store)
            assert (log["follow"], dumps["follow"], dumps["attach_to"]) == (1, 1, log["id"])
            [run_id] = [r[0] for r in store.conn.execute("SELECT id FROM runs")]
            logger = VerlFileLogger.__new__(VerlFileLogger)
            logger.fp = open(verl_dir / "my_project" / "grpo_run.jsonl", "ab", buffering=0)  # noqa: SIM115
            logger.log(verl_step(4), 4)
            logger.finish()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and 4 not in series(store, run_id, "entropy"):
                time.sleep(0.1)
            assert series(store, run_id, "entropy")[4] == pytest.approx(verl_step(4)["actor/entropy"])
    finally:
        stop_engine(home, timeout=5.0)


def test_hostile_file_names(store: Store, tmp_path: Path) -> None:
    """A name that could drive the terminal or break the one-line listing is shown written out (engine/text.py
    `visible_line`, as every other listing); a name that is not UTF-8 on disk is skipped (the store could not
    hold it)."""
    odd = tmp_path / "run\x1b[31m\nred"
    odd.mkdir()
    (odd / "m.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"bad\xff"))
    with open(os.path.join(os.fsencode(tmp_path), b"bad\xff", b"m.jsonl"), "w") as f:
        f.write('{"step": 1, "loss": 1.0}\n')
    found = discover(tmp_path)
    [run] = found.runs
    assert describe(found, run) == "JSONL log: run\\x1b[31m\\nred/m.jsonl"
    register(store, found, follow=False)
    [source] = sources(store)
    assert source["path"] == str(odd / "m.jsonl")  # the real path is what is read


def test_vocab_size_from_a_config_json_beside_the_run(
    store: Store, trl_output: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """A TensorBoard run says nothing of |V|: the model's config.json in the newest checkpoint does."""
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    out = tmp_path / "out"
    shutil.copytree(trl_output, out, symlinks=True)
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir()
    shutil.copy(tiny_model / "config.json", checkpoint / "config.json")  # as Trainer's save writes it
    shutil.copy(out / "trainer_state.json", checkpoint / "trainer_state.json")
    [run] = discover(out).runs
    assert run.metrics.kind == "tensorboard" and run.vocab_size == vocab
    from engine.observe.runkeys import vocab_key

    register(store, discover(out), follow=False)
    board = sources(store)[0]
    assert store.kv(vocab_key(board["id"], fallback=True)) == vocab

    # Read through a reader that exists here: a JSONL log in an output dir with the model's config.json.
    logged = tmp_path / "logged"
    logged.mkdir()
    shutil.copy(tiny_model / "config.json", logged / "config.json")
    (logged / "log.jsonl").write_text(
        "".join(json.dumps({"step": s, "entropy": 1.0 + s}) + "\n" for s in range(3))
    )
    from engine.observe.ingest import import_source

    [registered] = register(store, discover(logged), follow=False)
    [(source_id, _)] = registered.sources
    result = import_source(store, source_id)
    run_id = result.run_ids[0]
    assert store.run(run_id)["vocab_size"] == vocab
    assert series(store, run_id, "phi/mean") == pytest.approx(
        {s: 1 - (1.0 + s) / math.log(vocab) for s in range(3)}
    )


# -- the end to end: a TRL output dir, and a W&B run on its own, in the control room -----------------


def carl_observe(home: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), "observe", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


WATCHED = (
    "entropy",
    "phi/mean",  # from the entropy: |V| comes from the model config TensorBoardCallback writes
    "reward",
    "rewards/brevity/mean",
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "completions/mean_length",
)


async def test_a_trl_output_dir_shows_up_in_the_control_room(trl_output: Path, tmp_path: Path) -> None:
    """TensorBoard and W&B and completions from one real TRL GRPO run: one run with its steps, rewards,
    entropy, Φ, KL and clip fractions, and its rollouts, and the control room draws it."""
    from support import status_text, until

    from carl_tui.app import ControlRoom
    from engine.store import StoreReader

    home = tmp_path / "home"
    done = carl_observe(home, trl_output)
    assert done.returncode == 0, done.stderr
    reader = StoreReader(home / "carl.db")
    [run] = reader.runs()
    assert (run.name, run.framework, run.vocab_size, run.last_step) == ("grpo-out", "trl", 512, 2)
    keys = set(reader.metric_keys(run.id))
    assert set(WATCHED) <= keys, set(WATCHED) - keys
    assert [step for step, _ in reader.rollout_steps(run.id)] == [1, 2]
    sample = reader.rollouts(run.id, 1)[0]
    assert sample["prompt"].startswith("count to") and "brevity" in sample["rewards"]
    assert sample["advantage"] is not None
    reader.close()

    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "grpo-out" in status_text(app) and "step 2" in status_text(app))
        await until(pilot, lambda: "Φ" in str(app.query_one("#phi-chart").border_title))
        assert "brevity" in str(
            app.query_one("#rewards-pane").border_title
        ) or app.main.view.reward_names == ["brevity"]


def test_a_wandb_offline_run_on_its_own_shows_the_same(trl_output: Path, tmp_path: Path) -> None:
    from engine.store import StoreReader

    [run_dir] = list((trl_output / "wandb").glob("offline-run-*"))
    home = tmp_path / "home"
    done = carl_observe(home, run_dir)
    assert done.returncode == 0, done.stderr
    reader = StoreReader(home / "carl.db")
    [run] = reader.runs()
    assert (run.framework, run.last_step) == ("trl", 2)
    keys = set(reader.metric_keys(run.id))
    assert set(WATCHED) - {"phi/mean"} <= keys, (
        set(WATCHED) - keys
    )  # Φ once |V| is known (W&B config has it?)
    reader.close()
