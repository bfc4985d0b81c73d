"""`carl experiment`: arms x seeds as real runs through a real engine, evaluated, tabled and stored;
re-running finishes only what did not finish; bad input is one line before anything trains."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import end_all, kill_runs, wait_for

from engine.control import stop_engine
from engine.experiments.arms import ExperimentError, cell_config, check_base, parse_arms, parse_seeds
from engine.experiments.experiment_runner import open_experiment
from engine.experiments.stats import mean_ci, paired_delta
from engine.store import Store
from engine.training.config import config_from_data

ROOT = Path(__file__).resolve().parent.parent

BASE = {
    "name": "tinyexp",
    "model": "carl-tiny",
    "dataset": "demo",
    "method": "grpo",
    "max_steps": 30,
    "learning_rate": 0.0005,
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_completion_length": 8,
    "save_steps": 100,
    "sft_warmup_steps": 4,
    "lora": {"enabled": False},
    "rewards": [{"name": "task"}, {"name": "format", "weight": 0.5}, {"name": "coherence", "weight": 0.1}],
    "cascade": {"min_points": 2, "window": 2, "min_above": 1, "ramp_steps": 2},
    "eval": {"holdout": 0.1, "max_prompts": 4},
}


# -- arms, seeds and configs ---------------------------------------------------------------------------


def test_arms_and_seeds_parse_and_bad_ones_are_one_line() -> None:
    assert parse_arms("cascade,sft-only,cascade") == ["sft-only", "cascade"]  # the table's order, once
    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("4,1") == [4, 1]
    for bad, message in [("sft-only,nope", "--arms: unknown arm 'nope'"), (",", "--arms: no arm given")]:
        with pytest.raises(ExperimentError, match=message):
            parse_arms(bad)
    for bad, message in [("0", "at least one seed"), ("1,1", "distinct"), ("x", "a count")]:
        with pytest.raises(ExperimentError, match=message):
            parse_seeds(bad)


def test_a_base_the_arms_cannot_share_is_refused() -> None:
    def refused(arms: list[str], **change: Any) -> str:
        with pytest.raises(ExperimentError) as caught:
            check_base(config_from_data({**BASE, **change}, "x.yaml"), arms, "x.yaml")
        return str(caught.value)

    assert refused(["task-only"], method="sft").startswith("x.yaml: method:")
    assert "sft_warmup_steps" in refused(["sft-only"], sft_warmup_steps=0)
    no_coherence = [{"name": "task"}, {"name": "format"}]
    assert "arm cascade needs coherence" in refused(["cascade"], rewards=no_coherence)
    assert "lora.enabled" in refused(["task-only"], lora={"enabled": True})
    check_base(config_from_data({**BASE, "rewards": no_coherence}, "x"), ["sft-only", "task-only"], "x")


def test_each_arm_derives_its_config_from_the_base() -> None:
    base = config_from_data(BASE, "x")
    sft = cell_config(base, "sft-only", 3, 7, None)
    assert (sft["method"], sft["max_steps"], sft["seed"]) == ("sft", 4, 3)
    assert sft["learning_rate"] == pytest.approx(0.0025) and sft["per_device_train_batch_size"] == 16
    task = cell_config(base, "task-only", 3, 7, "/w/final")
    assert (task["method"], task["max_steps"], task["model"], task["sft_warmup_steps"]) == (
        "grpo",
        7,
        "/w/final",
        0,
    )
    assert [r["name"] for r in task["rewards"]] == ["task", "format"]
    assert cell_config(base, "cascade", 3, 7, "/w")["cascade"]["mode"] == "gated"
    always = cell_config(base, "always-on", 3, 7, "/w")
    assert always["cascade"]["mode"] == "always" and [r["name"] for r in always["rewards"]][-1] == "coherence"
    for arm in ("sft-only", "task-only", "cascade", "always-on"):
        data = cell_config(base, arm, 0, 7, "/w")
        assert data["eval"]["at_end"] is False
        config_from_data(data, arm)  # every cell's config is valid as it stands


# -- statistics ----------------------------------------------------------------------------------------


def test_mean_ci_is_students_t_interval() -> None:
    got = mean_ci([0.5, 0.6, 0.7])
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, df=2) x sd / sqrt(n)
    assert got["mean"] == pytest.approx(0.6) and got["ci95"] == pytest.approx([0.6 - half, 0.6 + half])
    assert mean_ci([0.4]) == {"mean": 0.4, "ci95": None, "n": 1}
    assert mean_ci([None, float("nan")]) == {"mean": None, "ci95": None, "n": 0}


def test_paired_delta_pairs_by_seed() -> None:
    arm, base = [0.8, 0.7, 0.9, None], [0.6, 0.6, 0.6, 0.5]  # the fourth seed did not finish in the arm
    got = paired_delta(arm, base)
    assert got["mean"] == pytest.approx(0.2) and got["n"] == 3  # differences 0.2, 0.1, 0.3: sd 0.1
    # t = 0.2 / (0.1 / sqrt(3)) = 3.4641 on 2 degrees of freedom: two-sided p = 1 - 2/sqrt(3)*... = 0.0742
    t = 0.2 / (0.1 / math.sqrt(3))
    assert got["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-9)  # the t(2) CDF in closed form
    assert paired_delta([0.5, 0.5], [0.5, 0.5])["p"] == 1.0


def test_more_seeds_or_arms_extend_a_stored_experiment_and_keep_its_finished_cells(tmp_path: Path) -> None:
    base = config_from_data(BASE, "base")
    with Store(tmp_path / "carl.db") as store:
        first = open_experiment(store, "grow", base, ["sft-only", "task-only"], [0], 3, "base")
        store.update_experiment_run(first.id, "task-only", 0, status="finished", task=0.9, solved=0.8)
        grown = open_experiment(store, "grow", base, ["task-only", "cascade", "sft-only"], [0, 1], 3, "base")
        assert (grown.id, grown.arms, grown.seeds) == (first.id, ["sft-only", "task-only", "cascade"], [0, 1])
        cells = {(c["arm"], c["seed"]): c for c in store.experiment_runs(first.id)}
        assert store.experiment("grow")["seeds"] == [0, 1]
        assert sorted(cells) == sorted((a, s) for a in grown.arms for s in (0, 1))
        assert cells["task-only", 0]["status"] == "finished" and cells["task-only", 0]["task"] == 0.9
        assert {c["status"] for key, c in cells.items() if key != ("task-only", 0)} == {"pending"}
        # Fewer seeds, other seeds or other steps ask another question: refused, nothing changed.
        for arms, seeds, steps in ((grown.arms, [1], 3), (grown.arms, [0, 1], 4)):
            with pytest.raises(ExperimentError, match="exists with another"):
                open_experiment(store, "grow", base, arms, seeds, steps, "base")
        assert len(store.experiment_runs(first.id)) == 6


# -- the real thing ----------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, tiny_home: Path) -> Iterator[Path]:
    yield tiny_home
    stop_engine(tiny_home, timeout=10.0)  # never leave a daemon behind
    kill_runs(tiny_home)  # nor a run it started (runs outlive the engine), when a test failed midway


def carl(home: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CARL_HOME": str(home)}
    return subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_at_a_terminal,
    )


def sigint_as_at_a_terminal() -> None:
    """A shell starts a background command (`pytest &`) with SIGINT ignored, and every child inherits that:
    the command would never see the test's Ctrl-C. It gets SIGINT's default, as a command at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen[str], timeout: float = 280) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


def write_base(tmp_path: Path, **change: Any) -> Path:
    path = tmp_path / "base.json"
    path.write_text(json.dumps({**BASE, **change}))
    return path


def cells(home: Path) -> dict[tuple[str, int], dict[str, Any]]:
    with Store(home / "carl.db") as store:
        found = store.experiments()
        return {(c["arm"], c["seed"]): c for c in store.experiment_runs(found[0]["id"])} if found else {}


def runs(home: Path) -> dict[str, dict[str, Any]]:
    with Store(home / "carl.db") as store:
        ids = [r[0] for r in store.conn.execute("SELECT id FROM runs")]
        return {run["name"]: run for run in (store.run(i) for i in ids) if run}


@pytest.mark.slow
@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_an_experiment_trains_every_arm_through_the_engine_and_reruns_nothing_finished(
    tmp_path: Path, home: Path
) -> None:
    base = write_base(tmp_path, max_steps=3)
    code, out, err = finish(
        carl(home, "experiment", "--name", "e1", "--config", str(base), "--seeds", "1", "--json")
    )
    assert code == 0, err
    summary = json.loads(out)
    assert list(summary["arms"]) == ["sft-only", "task-only", "cascade", "always-on"]
    assert summary["baseline"] == "task-only" and summary["steps"] == 3 and summary["warmup_steps"] == 4
    trained = runs(home)
    assert sorted(trained) == sorted(f"e1-{arm}-s0" for arm in summary["arms"])
    assert all(run["status"] == "finished" for run in trained.values())
    warm = trained["e1-sft-only-s0"]
    assert json.loads(warm["config"])["method"] == "sft" and warm["last_step"] == 4
    for arm in ("task-only", "cascade", "always-on"):
        config = json.loads(trained[f"e1-{arm}-s0"]["config"])
        assert config["model"] == str(
            Path(warm["output_dir"]) / "final"
        )  # every GRPO arm starts from the warm-up
        assert trained[f"e1-{arm}-s0"]["last_step"] == 3
    assert "coherence" not in [r["name"] for r in json.loads(trained["e1-task-only-s0"]["config"])["rewards"]]
    for arm, entry in summary["arms"].items():
        (run,) = entry["runs"]
        assert run["status"] == "finished" and run["run"] == f"e1-{arm}-s0"
        assert (
            0.0 <= run["task"] <= 1.0
            and entry["task"]["mean"] == run["task"]
            and entry["task"]["ci95"] is None
        )
        assert set(entry["solved"]) >= {"mean", "ci95"}
    assert summary["arms"]["always-on"]["runs"][0]["gate_step"] == 1  # open from the first step
    assert summary["arms"]["task-only"]["runs"][0]["gate_step"] is None
    assert summary["arms"]["cascade"]["delta_task"]["mean"] == pytest.approx(
        summary["arms"]["cascade"]["runs"][0]["task"] - summary["arms"]["task-only"]["runs"][0]["task"]
    )
    with Store(home / "carl.db") as store:  # every eval is stored with its run
        evals = store.conn.execute("SELECT run_id FROM evals").fetchall()
    assert sorted(r[0] for r in evals) == sorted(run["id"] for run in trained.values())

    # Run again, shown, and asked with other seeds: side by side, as none of them trains or changes a cell.
    again = carl(home, "experiment", "--name", "e1", "--config", str(base), "--seeds", "1")
    show = carl(home, "experiment", "--name", "e1", "--show", "--json")
    other_seeds = carl(home, "experiment", "--name", "e1", "--config", str(base), "--seeds", "5,6")
    try:
        code, out, err = finish(again)
        assert code == 0, err
        assert sorted(runs(home)) == sorted(trained)  # nothing trained again
        assert "held-out task" in out and "cascade" in out and "(baseline)" in out
        code, shown, _ = finish(show)
        assert code == 0 and json.loads(shown)["arms"] == summary["arms"]
        code, _, err = finish(other_seeds)
        assert code == 2 and err.strip().endswith(
            "experiment 'e1' exists with another --seeds; run it as it was,"
            " with more seeds or arms, or pick another --name"
        )
    finally:
        end_all([again, show, other_seeds])


@pytest.mark.slow
@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_an_interrupted_experiment_adopts_its_running_run_and_a_stopped_arm_is_reported_then_rerun(
    tmp_path: Path, home: Path
) -> None:
    base = write_base(tmp_path)
    args = (
        "experiment",
        "--name",
        "e2",
        "--config",
        str(base),
        "--seeds",
        "1",
        "--arms",
        "sft-only,task-only",
    )
    first = carl(home, *args)
    try:  # interrupt the command once the task-only run exists: the run itself carries on in the engine
        wait_for(
            lambda: (
                cells(home).get(("task-only", 0), {}).get("run_id") if (home / "carl.db").exists() else None
            ),
            timeout=240,
            what="the task-only run started",
        )
        first.send_signal(signal.SIGINT)
        code, _, err = finish(first)
    finally:
        first.kill()
    assert code == 130 and "carries on in the engine" in err, (code, err)
    adopted = cells(home)[("task-only", 0)]["run_id"]
    code, out, err = finish(carl(home, *args, "--json"))
    assert code == 0, err
    assert (
        "following run 'e2-task-only-s0', still training" in err
        or runs(home)["e2-task-only-s0"]["status"] == "finished"
    )
    assert sorted(runs(home)) == ["e2-sft-only-s0", "e2-task-only-s0"]  # adopted, not started again
    assert cells(home)[("task-only", 0)]["run_id"] == adopted

    # A stopped arm: reported as such, the other arm's result stays, and the next run redoes only it.
    with Store(home / "carl.db") as store:
        store.update_experiment_run(
            cells(home)[("task-only", 0)]["experiment_id"], "task-only", 0, status="pending"
        )
    rerun = carl(home, *args, "--json")
    try:
        run_id = wait_for(
            lambda: (runs(home).get("e2-task-only-s0-r2") or {}).get("id"), timeout=240, what="the rerun"
        )
        with Store(home / "carl.db") as store:
            store.enqueue_command("stop", {}, target="run", run_id=run_id, origin="test")
        code, out, err = finish(rerun)
    finally:
        rerun.kill()
    assert code == 1, err
    summary = json.loads(out)
    assert summary["status"] == "partial"
    assert summary["arms"]["task-only"]["runs"][0]["status"] == "stopped"
    assert summary["arms"]["sft-only"]["runs"][0]["status"] == "finished"
    assert summary["arms"]["sft-only"]["task"]["mean"] is not None
    assert sorted(runs(home)) == ["e2-sft-only-s0", "e2-task-only-s0", "e2-task-only-s0-r2"]


def test_bad_input_is_one_line_before_anything_trains(tmp_path: Path, home: Path) -> None:
    base = write_base(tmp_path, rewards=[{"name": "task"}])
    cases = [
        (("--arms", "sft-only,bogus"), "--arms: unknown arm 'bogus'"),
        (("--seeds", "0"), "--seeds: at least one seed is needed"),
        (("--arms", "cascade"), "rewards: arm cascade needs coherence or commitment"),
        (("--show",), "--show needs --name"),
    ]
    started = [carl(home, "experiment", "--config", str(base), *args) for args, _ in cases]  # side by side
    ghost = carl(home, "experiment", "--name", "ghost", "--show")
    try:
        for proc, (_, message) in zip(started, cases, strict=True):
            code, out, err = finish(proc)
            assert code == 2 and err.strip().splitlines() == [
                f"carl: {err.strip().removeprefix('carl: ')}"
            ], err
            assert message in err and "Traceback" not in err
        code, _, err = finish(ghost)
        assert code == 2 and "no experiment 'ghost'" in err
    finally:
        end_all([*started, ghost])
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


@pytest.mark.slow
def test_a_run_killed_mid_training_is_reported_as_crashed(tmp_path: Path, home: Path) -> None:
    base = write_base(tmp_path, sft_warmup_steps=400)  # long enough to be killed while it trains
    proc = carl(
        home,
        "experiment",
        "--name",
        "e3",
        "--config",
        str(base),
        "--seeds",
        "1",
        "--arms",
        "sft-only",
        "--json",
    )
    try:
        run = wait_for(
            lambda: (
                (runs(home).get("e3-sft-only-s0") or {}).get("last_step") and runs(home)["e3-sft-only-s0"]
            ),
            timeout=240,
            what="the warm-up training",
        )
        os.kill(run["pid"], signal.SIGKILL)
        code, out, err = finish(proc)
    finally:
        proc.kill()
    assert code == 1, err
    (cell,) = json.loads(out)["arms"]["sft-only"]["runs"]
    assert cell["status"] == "crashed" and f"the run's process ({run['pid']}) died at step" in cell["error"]
    assert "sft-only s0: run 'e3-sft-only-s0' crashed: the run's process" in err
