"""`carl eval`: a real run trained on the tiny model, evaluated on the prompts it held out.

The held-out prompts never reach training (the store's samples prove it), the end-of-run eval is
stored, `carl eval` re-evaluates with the run's own rewards and thresholds, and bad input is one
line. The control room shows the verdict in its status line and the details on `e`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.store import Store, StoreReader
from engine.training.config import ConfigError, load_config
from engine.training.holdout import split_holdout

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


# -- the split -------------------------------------------------------------------------------


def _rows(prompts: list[str]) -> list[dict[str, Any]]:
    return [{"prompt": [{"role": "user", "content": p}], "i": i} for i, p in enumerate(prompts)]


@given(st.lists(st.text(max_size=6), min_size=2, max_size=60), st.floats(0.01, 0.9))
def test_split_is_a_partition_that_keeps_equal_prompts_together(prompts: list[str], share: float) -> None:
    rows = _rows(prompts)
    train, held = split_holdout(rows, share)
    assert sorted(r["i"] for r in train + held) == list(range(len(rows)))
    assert bool(held) == (len(set(prompts)) > 1), "held out: at least one prompt, when there are two"
    assert train
    held_prompts = {json.dumps(r["prompt"]) for r in held}
    assert not any(json.dumps(r["prompt"]) in held_prompts for r in train)


def test_split_ignores_row_order_and_zero_disables_it() -> None:
    rows = _rows([f"request {i}" for i in range(100)])
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    held = {r["i"] for r in split_holdout(rows, 0.1)[1]}
    assert held == {r["i"] for r in split_holdout(shuffled, 0.1)[1]}
    assert len(held) == 10
    assert split_holdout(rows, 0.0) == (rows, [])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"eval": {"holdout": 1.5}}, "eval.holdout: Input should be less than 1"),
        ({"eval": {"min_format": -1}}, "eval.min_format: Input should be greater than or equal to 0"),
        ({"eval": {"at_end": "sometimes"}}, "eval.at_end: Input should be a valid boolean"),
        ({"eval": {"threshold": 1}}, "eval.threshold: unknown field"),
        ({"eval": {"min_solved": 2}}, "eval.min_solved: Input should be less than or equal to 1"),
    ],
)
def test_bad_eval_settings_are_one_line(tmp_path: Path, settings: dict[str, Any], message: str) -> None:
    path = tmp_path / "carl.yaml"
    path.write_text(json.dumps(settings))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: {message}")


# -- a real run ------------------------------------------------------------------------------


def carl(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        cwd=ROOT,
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo task: a short warm-up and GRPO phase, evaluated when it finishes."""
    home = tmp_path_factory.mktemp("eval-home")
    config = home / "carl.yaml"
    config.write_text(
        json.dumps(
            {
                "name": "ev",
                "max_steps": 8,
                "save_steps": 4,
                "sft_warmup_steps": 60,
                "learning_rate": 0.0005,
                "rewards": [{"name": "task"}, {"name": "format", "weight": 0.5}],
                "eval": {"holdout": 0.1, "at_end": True, "max_prompts": 16},
            }
        )
    )
    done = carl(home, "train", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "eval of run 'ev'" in done.stdout  # the end-of-run eval printed its verdict
    (home / "train.out").write_text(done.stdout)
    return home


@pytest.mark.slow
def test_a_run_says_what_it_does_before_its_first_step(trained: Path) -> None:
    """The first minute of a run is its framework's import, the tiny model's build and the first step's
    preparation: each is said as it starts (the log, and the store for the control room's status line)."""
    said = [line.removeprefix("[carl] ") for line in (trained / "train.out").read_text().splitlines()]
    stages = [line for line in said if line.startswith(("importing", "building", "loading", "preparing"))]
    assert stages == [
        "importing torch, transformers and TRL",
        "building the tiny model (first use: a BPE tokenizer and a small Llama), then loading it",
        "preparing the SFT warm-up's first step (of 60)",
    ]
    reader = StoreReader(trained / "carl.db")
    try:
        [run] = [r for r in reader.runs() if r.name == "ev"]
        stage = reader.run_stage(run.id)
    finally:
        reader.close()
    assert stage is not None and stage["text"] == stages[-1]  # the last said before its first step


@pytest.mark.slow
def test_the_tiny_model_is_evaluated_without_torch_and_with_the_same_answers_and_figures(
    trained: Path,
) -> None:
    """`carl eval` of a tiny-model run answers in numpy (engine/models/tiny_numpy.py) rather than importing
    torch and transformers, which took ~90% of its time; its answers and stored figures are the ones the
    transformers path gives."""
    from engine.training import evaluate

    probe = (
        "import sys, json; from engine.cli import main; code = main(sys.argv[1:]); "
        "heavy = sorted({'torch', 'transformers', 'trl', 'peft'} & set(sys.modules)); "
        "print(json.dumps(heavy), file=sys.stderr); raise SystemExit(code)"
    )
    argv = [
        sys.executable,
        "-c",
        probe,
        "--home",
        str(trained),
        "eval",
        "ev",
        "--json",
        "--max-prompts",
        "16",
    ]
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=180
    )
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stderr.splitlines()[-1]) == []  # nothing heavy was imported
    stored = json.loads(done.stdout)["metrics"]

    with Store(trained / "carl.db") as store:
        run = evaluate.find_carl_run(store, "ev")
    config, path = evaluate.run_config(run), evaluate.model_dir(run)
    held = evaluate.held_out_prompts(config)[:16]
    assert evaluate._with_numpy(path)
    light = evaluate._answer_numpy(config, path, held, trained)
    heavy = evaluate._answer(config, path, held, trained)  # transformers' generate, torch's Phi
    assert [a["ids"] for a in light[0]] == [a["ids"] for a in heavy[0]]
    assert [a["text"] for a in light[0]] == [a["text"] for a in heavy[0]]
    for mine, theirs in zip(light[1:], heavy[1:], strict=True):  # Phi and entropy per answer
        assert mine == pytest.approx(theirs, abs=1e-5, nan_ok=True)
    figures = evaluate._score(config, held, *heavy)[0]
    assert evaluate._score(config, held, *light)[0] == figures
    assert {k: stored[k] for k in figures} == figures


@pytest.mark.slow
def test_the_end_of_run_eval_is_stored_and_held_out_prompts_never_trained(trained: Path) -> None:
    from engine.training.data import load_rows

    reader = StoreReader(trained / "carl.db")
    try:
        run = next(r for r in reader.runs() if r.name == "ev")
        evaluation = reader.latest_eval(run.id)
        samples = reader.samples(run.id, limit=10_000)
        events = [e["kind"] for e in reader.events(run.id)]
    finally:
        reader.close()
    assert evaluation is not None
    metrics = evaluation["metrics"]
    assert metrics["prompts"] == 16 and metrics["step"] == 68
    assert 0.0 <= metrics["task"] <= 1.0 and 0.0 <= metrics["format"] <= 1.0
    assert 0.0 < metrics["phi"] <= 1.0 and metrics["entropy"] >= 0.0
    assert Path(metrics["model_dir"]).name == "final"
    # Every check is a reason, failed ones first; the verdict is their conjunction.
    assert len(evaluation["reasons"]) == 2
    assert evaluation["passed"] == all(">=" in r for r in evaluation["reasons"])
    assert "eval" in events and "final" in events

    _, held = split_holdout(load_rows("demo", 0), 0.1)
    held_prompts = {r["prompt"][0]["content"] for r in held}
    trained_prompts = {s["prompt"].removeprefix("user: ") for s in samples}
    assert trained_prompts and not trained_prompts & held_prompts


@pytest.mark.slow
def test_carl_eval_reevaluates_with_the_runs_thresholds(trained: Path) -> None:
    with Store(trained / "carl.db") as store:
        before = store.conn.execute("SELECT count(*) FROM evals").fetchone()[0]
    # Two evals side by side (each mostly one core's work): neither needs the other.
    with ThreadPoolExecutor(2) as pool:
        done, repeated = pool.map(
            lambda _: carl(trained, "eval", "ev", "--json", "--max-prompts", "8"), range(2)
        )
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["passed"] else 1)
    assert result["metrics"]["prompts"] == 8 and len(result["answers"]) == 8
    answer = result["answers"][0]
    assert set(answer) >= {"prompt", "answer", "task", "format"}
    # Re-running gives the same greedy answers: the figures are the model's, not the sampler's.
    again = json.loads(repeated.stdout)
    assert again["metrics"]["task"] == result["metrics"]["task"]
    with Store(trained / "carl.db") as store:
        assert store.conn.execute("SELECT count(*) FROM evals").fetchone()[0] == before + 2


@pytest.mark.slow
def test_a_failed_check_fails_the_eval_with_its_reason(trained: Path) -> None:
    with Store(trained / "carl.db") as store:
        run_id = store.run_id_by_name("ev")
        config = json.loads(store.run(run_id)["config"])  # type: ignore[index]
        config["eval"]["min_phi"] = 1.5  # Phi never reaches it
        config["eval"]["min_solved"] = 0.0  # always met: a passing check is a reason too
        store.update_run(run_id, config=config)
    done = carl(trained, "eval", "ev", "--max-prompts", "4")
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stdout
    assert "mean Phi of the answers" in done.stdout and "< 1.5" in done.stdout
    assert "share of held-out prompts solved" in done.stdout and ">= 0" in done.stdout


def test_bad_runs_are_one_line(tmp_path: Path, store: Store) -> None:
    observed = store.create_run("watched", source_kind="trackio")
    pending = store.create_run("young", source_kind="carl", config={"name": "young"})
    store.update_run(pending, output_dir=str(tmp_path / "young"))
    holdout_off = store.create_run("all-in", source_kind="carl", config={"eval": {"holdout": 0}})
    home = Path(store.path).parent
    cases = {
        "nosuch": "carl: nosuch: no such run",
        str(observed): "carl: run 'watched' was not trained by carl (it is trackio): nothing to evaluate",
        "young": "carl: run 'young' has no saved model yet (no final/ or checkpoint-* in",
        str(holdout_off): "carl: run 'all-in' held no prompts out of training (eval.holdout is 0.0)",
    }
    with ThreadPoolExecutor(len(cases)) as pool:  # side by side: each is refused on its own
        answers = pool.map(lambda ref: carl(home, "eval", ref), cases)
    for (ref, message), done in zip(cases.items(), answers, strict=True):
        assert done.returncode == 2, (ref, done.stdout)
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_offline_analyst_diagnoses_the_real_run(trained: Path) -> None:
    done = carl(trained, "diagnose", "ev", "why is the task reward where it is?", "--offline", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["offline"] and result["answer"].startswith("**Offline analyst**")
    # Its numbers are the store's: the eval it reports is the stored one.
    reader = StoreReader(trained / "carl.db")
    try:
        run = next(r for r in reader.runs() if r.name == "ev")
        stored = reader.latest_eval(run.id)
        last_task = reader.latest_values(run.id, ["rewards/task/mean"])["rewards/task/mean"][1]
    finally:
        reader.close()
    eval_finding = next(f for f in result["findings"] if f["topic"] == "eval")
    assert f"task {stored['metrics']['task']:.3g}" in eval_finding["detail"]
    assert f"→{last_task:.3g}" in result["answer"]


@pytest.mark.slow
def test_the_engine_runs_an_eval_command_for_the_control_room(
    trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from engine.control import start_engine, stop_engine

    monkeypatch.setenv("CARL_HOME", str(trained))
    start_engine(trained)
    try:
        with Store(trained / "carl.db") as store:
            before = store.conn.execute("SELECT count(*) FROM evals").fetchone()[0]
            good = store.enqueue_command("eval", {"run": "ev"})
            bad = store.enqueue_command("eval", {"run": "nosuch"})
            deadline = time.monotonic() + 120
            states: dict[int, tuple[str, str]] = {}
            while time.monotonic() < deadline and len(states) < 2:
                for command in (good, bad):
                    row = store.conn.execute(
                        "SELECT state, result FROM commands WHERE id=?", (command,)
                    ).fetchone()
                    if row[0] in ("done", "failed"):
                        states[command] = (row[0], row[1])
                time.sleep(0.2)
            after = store.conn.execute("SELECT count(*) FROM evals").fetchone()[0]
    finally:
        stop_engine(trained, timeout=10.0)
    assert states[good][0] == "done" and states[good][1].startswith(("eval passed: ", "eval failed: "))
    assert states[bad] == ("failed", "nosuch: no such run")
    assert after == before + 1
