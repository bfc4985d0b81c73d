"""A run's console end to end, with real processes: `carl observe ... --log` names it (a file, a directory, a
FIFO refused in one line); a W&B run's `files/output.log` is its console; the engine's training processes get
theirs; and the issue's "done when": a TRL-style script whose stdout goes to a file, observed with `--log`,
shows its traceback when it crashes: the finding, the run's health reason, the analyst's answer to "why did
it crash?" and the log view on the traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, end_all, until, wait_for
from test_observe_wandb import grpo_step, write_run
from textual.widgets import Static

from carl_tui.app import ControlRoom
from carl_tui.console_view import ConsoleScreen
from engine import paths
from engine.console.scan import scan_console
from engine.control import stop_engine
from engine.diagnosis.analyst import answer
from engine.diagnosis.digest import build_digest
from engine.observe import observe
from engine.store import Store, StoreReader
from widgets.log_lines import LogLines

pytestmark = pytest.mark.slow
EXCEPTION = "RuntimeError: CUDA error: an illegal memory access was encountered"

# A script as TRL users write them: it prints its logs (what TRL's console shows) and writes its metrics
# (carl observes the JSONL); told to go on, its next step raises.
SCRIPT = f"""
import json, sys
metrics = open(sys.argv[1], "a", buffering=1)
for step in range(1, 6):
    print({{"loss": round(1 / step, 4), "reward": step / 10, "epoch": step / 5}}, flush=True)
    metrics.write(json.dumps({{"step": step, "loss": 1 / step, "reward": step / 10}}) + "\\n")
print("waiting", flush=True)
sys.stdin.readline()

def training_step():
    raise RuntimeError("{EXCEPTION.split(": ", 1)[1]}")

training_step()
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "carl"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("CARL_HOME", str(home))
    yield home
    stop_engine(home, timeout=10.0)  # never leave a daemon behind


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )


def consoles(home: Path) -> list[tuple[int, str, str]]:
    with Store(paths.db_path(home)) as store:
        return [(c["run_id"], Path(c["path"]).name, c["kind"]) for c in store.system.consoles()]


def test_observe_with_log_names_the_console_and_refuses_a_fifo(home: Path, tmp_path: Path) -> None:
    metrics, log, fifo = tmp_path / "metrics.jsonl", tmp_path / "train.log", tmp_path / "pipe"
    metrics.write_text('{"step": 1, "loss": 0.5}\n')
    log.write_text("step 1\n")
    os.mkfifo(fifo)
    refused = carl(home, "observe", str(metrics), "--log", str(fifo))
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"carl: {fifo}: a FIFO (named pipe), not a regular file (a log)"
    ]
    done = carl(home, "observe", str(metrics), "--log", str(log), "--log", str(tmp_path / "later.log"))
    assert done.returncode == 0, done.stderr
    assert "console: train.log, later.log for 1 run(s)" in done.stdout
    assert f"--log {tmp_path / 'later.log'}: not there yet; shown once it is" in done.stderr
    assert consoles(home) == [(1, "train.log", "user"), (1, "later.log", "user")]

    runs = tmp_path / "runs"  # a directory: every run found in it gets the console
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    done = carl(home, "observe", str(runs), "--log", str(log))
    assert done.returncode == 0, done.stderr
    assert "console: train.log for 1 run(s)" in done.stdout
    assert consoles(home)[-1] == (2, "train.log", "user")


def test_the_engine_s_training_process_log_is_its_run_s_console(home: Path, tmp_path: Path) -> None:
    """A `train` command: the engine starts the process with its output to logs/train-...log, and the run it
    opens (here one whose config is wrong: it fails at once, and says why in its log) gets that log."""
    from engine.control import start_engine

    config = tmp_path / "bad.yaml"
    config.write_text("max_steps: -3\n")
    start_engine(home)
    with Store(paths.db_path(home)) as store:
        store.enqueue_command("train", {"config": str(config)}, target="engine")
    (run_id, name, kind) = wait_for(lambda: consoles(home), what="the training run's console")[0]
    assert kind == "train" and name.startswith("train-") and name.endswith(".log")
    log = home / "logs" / name
    with Store(paths.db_path(home)) as store:
        assert store.run(run_id)["status"] == "failed"
    assert "max_steps: Input should be greater than 0" in log.read_text()


def test_a_wandb_runs_output_log_is_its_console(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "wb", {"name": "grpo", "steps": [[s, grpo_step(s)] for s in range(3)]})
    # W&B writes what the script printed there (an online run, and wandb 0.31 offline too; wandb 0.29 offline
    # keeps it in the .wandb file, tests/test_wandb_log.py): the scan reads it like any console.
    output_log = run_dir / "files" / "output.log"
    output_log.write_text("step 0\n")
    with Store(tmp_path / "carl.db") as store:
        _, result = observe(store, run_dir)
        (run_id,) = result.run_ids
        (console,) = store.system.consoles()
        assert (console["run_id"], console["path"], console["kind"]) == (run_id, str(output_log), "wandb")
        with open(output_log, "a") as f:
            f.write(f"Traceback (most recent call last):\n  File x\n{EXCEPTION}\n")
        assert scan_console(store, console).new == 1


async def test_a_crashing_trl_style_script_observed_with_log_shows_its_traceback(
    home: Path, tmp_path: Path
) -> None:
    metrics, log = tmp_path / "metrics.jsonl", tmp_path / "train.log"
    with open(log, "wb") as out:  # its stdout and stderr go to a file, as `python train.py > train.log 2>&1`
        script = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(metrics)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=out,
            text=True,
        )
    try:
        wait_for(
            lambda: log.exists() and "waiting" in log.read_text(),
            what="the script's first steps",
            proc=script,
        )
        followed = carl(home, "observe", str(metrics), "--follow", "--name", "trl-grpo", "--log", str(log))
        assert followed.returncode == 0, followed.stderr
        assert "the engine keeps following it" in followed.stdout
        wait_for(lambda: consoles(home) == [(1, "train.log", "user")], what="the engine names the console")

        assert script.stdin is not None
        script.stdin.write("go\n")  # its next step raises
        script.stdin.flush()
        assert script.wait(timeout=60) == 1
    finally:
        end_all([script])

    reason = f"traceback in the console: {EXCEPTION} (train.log line 7)"  # 5 steps, "waiting", then it

    def health() -> tuple[str, list[str]]:
        with Store(paths.db_path(home)) as store:
            row = store.conn.execute("SELECT health, health_reasons FROM runs WHERE id=1").fetchone()
        return row[0], json.loads(row[1])

    wait_for(lambda: reason in health()[1], timeout=60, what="the run's health says why")
    with Store(paths.db_path(home)) as store:
        found = store.conn.execute("SELECT kind, line, line_no FROM console_findings").fetchall()
    assert found == [("traceback", EXCEPTION, 7)]
    assert health()[0] in ("yellow", "red")  # yellow until it has been quiet CRASH_QUIET_S (then red)

    reader = StoreReader(paths.db_path(home))
    try:
        reply = answer(build_digest(reader, 1), "why did it crash?")
    finally:
        reader.close()
    assert f"Its console's last error: `{EXCEPTION}` (train.log line 7)" in reply

    # The log view, on the run: the traceback at the end of its console, `T` on its first line.
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == 1)
        await pilot.press("L")
        await until(pilot, lambda: isinstance(app.screen, ConsoleScreen))
        lines = app.screen.query_one(LogLines)
        await until(pilot, lambda: lines.count == 10)
        shown = [lines.render_line(y).text for y in range(lines.size.height)]
        assert any(EXCEPTION in text for text in shown)
        await pilot.press("T")
        await until(pilot, lambda: lines.mark == 6)
        assert f"traceback: {EXCEPTION}" in str(app.screen.query_one("#console-status", Static).content)


# A real TRL script: GRPOTrainer on the tiny model, TensorBoard for its metrics, its stdout and stderr to a
# file; its reward function fails at the third step, as a user's buggy reward does.
TRL_SCRIPT = """
import sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

model, out = sys.argv[1], sys.argv[2]
calls = []

def brevity(completions, **_):
    calls.append(1)
    if len(calls) == 3:
        raise ValueError("reward server answered 502 for batch 3")
    return [1.0 / (1 + len(c)) for c in completions]

args = GRPOConfig(
    output_dir=out, max_steps=6, per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
    report_to=["tensorboard"], use_cpu=True, logging_steps=1, save_strategy="no", disable_tqdm=True,
)
prompts = Dataset.from_list([{"prompt": f"hello {i}"} for i in range(32)])
print("training", flush=True)
GRPOTrainer(model=model, reward_funcs=[brevity], args=args, train_dataset=prompts).train()
"""


async def test_a_real_trl_script_whose_stdout_goes_to_a_file_shows_its_traceback_when_it_crashes(
    home: Path, tmp_path: Path, tiny_model: Path
) -> None:
    out, log = tmp_path / "grpo-out", tmp_path / "train.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "wb") as sink:  # `python train.py > train.log 2>&1`
        script = subprocess.Popen(
            [sys.executable, "-c", TRL_SCRIPT, str(tiny_model), str(out)], stdout=sink, stderr=sink, env=env
        )
    try:
        # Followed from its first logged step: the event file TRL's TensorBoard callback writes.
        wait_for(lambda: any(out.glob("runs/*/events.out.tfevents.*")), timeout=180, what="TRL's first step")
        followed = carl(home, "observe", str(out), "--follow", "--name", "grpo", "--log", str(log))
        assert followed.returncode == 0, followed.stderr
        assert script.wait(timeout=180) == 1  # the reward function raised
    finally:
        end_all([script])
    exception = "ValueError: reward server answered 502 for batch 3"
    assert exception in log.read_text()

    def reasons() -> list[str]:
        with Store(paths.db_path(home)) as store:
            row = store.conn.execute("SELECT health_reasons FROM runs WHERE name='grpo'").fetchone()
        return json.loads(row[0]) if row else []

    wait_for(
        lambda: any(r.startswith(f"traceback in the console: {exception}") for r in reasons()),
        timeout=90,
        what="the run's health naming the traceback",
    )
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "grpo")
        await pilot.press("L")
        await until(pilot, lambda: isinstance(app.screen, ConsoleScreen))
        lines = app.screen.query_one(LogLines)
        await until(pilot, lambda: lines.count > 0)
        await pilot.press("T")  # the last traceback, from the end of the file
        status = app.screen.query_one("#console-status", Static)
        await until(pilot, lambda: exception in str(status.content))
        shown = [lines.render_line(y).text for y in range(lines.size.height)]
        assert any("Traceback (most recent call last):" in text for text in shown)
