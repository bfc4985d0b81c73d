"""`CarlCallback` streams a user's own transformers / TRL script into the store, live, and obeys commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.store import Store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# A user's script: a TRL SFT run, then a plain transformers Trainer that a command stops at step 2.
SCRIPT = """
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments
from trl import SFTConfig, SFTTrainer

from engine.store import Store
from engine.training import CarlCallback

model_dir, home, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
common = dict(use_cpu=True, report_to=[], logging_steps=1, disable_tqdm=True, max_steps=4, learning_rate=1e-3)

rows = [{"prompt": [{"role": "user", "content": f"Weather in city {i}?"}],
         "completion": [{"role": "assistant", "content": '{"tool": "get_weather"}'}]} for i in range(16)]
SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir), processing_class=tokenizer,
    args=SFTConfig(output_dir=str(out / "sft"), per_device_train_batch_size=4, save_strategy="no", **common),
    train_dataset=Dataset.from_list(rows), callbacks=[CarlCallback(run_name="sft-script", home=home)],
).train()

class StopAtTwo(TrainerCallback):  # stands in for a person pressing `s` in the control room
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            with Store(home / "carl.db") as store:
                run_id = store.run_id_by_name("plain-script")
                store.enqueue_command("stop", target="run", run_id=run_id)

ids = tokenizer("hello world, the weather in Paris", return_tensors="pt")["input_ids"][0]
data = [{"input_ids": ids, "labels": ids} for _ in range(16)]
Trainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir),
    args=TrainingArguments(
        output_dir=str(out / "plain"), per_device_train_batch_size=2, save_strategy="no", **common
    ),
    train_dataset=data, callbacks=[StopAtTwo(), CarlCallback(run_name="plain-script", home=home)],
).train()
print("script done")
"""

FAILING = """
import sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments
from engine.training import CarlCallback

model_dir, home = sys.argv[1], Path(sys.argv[2])
class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("the user's script broke")

ids = AutoTokenizer.from_pretrained(model_dir)("hello", return_tensors="pt")["input_ids"][0]
Trainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir),
    args=TrainingArguments(output_dir=sys.argv[3], use_cpu=True, report_to=[], logging_steps=1, max_steps=5,
                           disable_tqdm=True, save_strategy="no"),
    train_dataset=[{"input_ids": ids, "labels": ids}] * 8,
    callbacks=[Boom(), CarlCallback(run_name="broken", home=home)],
).train()
"""


def start_script(where: Path, source: str, model: Path) -> subprocess.Popen[str]:
    script = where / "user_script.py"
    script.write_text(textwrap.dedent(source))
    argv = [sys.executable, str(script), str(model), str(where / "home"), str(where / "out")]
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        argv, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@dataclass
class Script:
    """A user's script running in `where` (its home, its output)."""

    where: Path
    proc: subprocess.Popen[str]

    def finish(self) -> tuple[int, str]:
        """Its exit status and stderr, once it has ended."""
        _, err = self.proc.communicate(timeout=180)
        return self.proc.returncode, err


@pytest.fixture(scope="module")
def scripts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Script]]:
    """Both users' scripts, started together (each trains on one thread: side by side they use both cores),
    each in a directory of its own; a test waits for its own. Neither outlives the module."""
    started: dict[str, Script] = {}
    try:
        for name, source in (("streams", SCRIPT), ("dies", FAILING)):
            where = tmp_path_factory.mktemp(name)
            started[name] = Script(where, start_script(where, source, tiny_model))
        yield started
    finally:
        for script in started.values():
            if script.proc.poll() is None:
                script.proc.kill()
            script.proc.communicate()


def test_a_users_scripts_stream_into_the_store_and_obey_stop(scripts: dict[str, Script]) -> None:
    tmp_path = scripts["streams"].where
    code, err = scripts["streams"].finish()
    assert code == 0, err[-3000:]
    with Store(tmp_path / "home" / "carl.db") as store:
        sft = store.run(store.run_id_by_name("sft-script"))
        assert sft is not None and sft["source_kind"] == "callback" and sft["status"] == "finished"
        assert (sft["max_steps"], sft["last_step"], sft["vocab_size"]) == (4, 4, 512)
        assert sft["pid"] and sft["output_dir"] == str(tmp_path / "out" / "sft")
        loss = store.conn.execute(
            "SELECT step FROM metrics WHERE run_id=? AND key='loss' ORDER BY step", (sft["id"],)
        ).fetchall()
        assert loss == [(1,), (2,), (3,), (4,)]
        # TRL's SFT logs the mean token entropy: Phi per step is derived from it with |V| = 512.
        phi = store.conn.execute(
            "SELECT step, phi_mean, entropy_mean, vocab_size FROM phi_stats WHERE run_id=? ORDER BY step",
            (sft["id"],),
        ).fetchall()
        assert [p[0] for p in phi] == [1, 2, 3, 4]
        for _, phi_mean, entropy, vocab in phi:
            assert vocab == 512 and phi_mean == pytest.approx(1 - entropy / __import__("math").log(512))
        assert not store.conn.execute(
            "SELECT 1 FROM metrics WHERE run_id=? AND key='train_runtime'", (sft["id"],)
        ).fetchone()
        # Each step's time, and tokens/s from TRL's running num_tokens (every step logged; from the second
        # on).
        perf = {
            key: values(store, sft["id"], key)
            for key in ("perf/step_time_s", "perf/tokens_per_s", "num_tokens")
        }
        assert sorted(perf["perf/step_time_s"]) == [1, 2, 3, 4] and min(perf["perf/step_time_s"].values()) > 0
        assert sorted(perf["perf/tokens_per_s"]) == [2, 3, 4]
        tokens = perf["num_tokens"]
        for step in (2, 3, 4):
            seconds = perf["perf/step_time_s"][step]
            assert perf["perf/tokens_per_s"][step] * seconds == pytest.approx(tokens[step] - tokens[step - 1])

        plain = store.run(store.run_id_by_name("plain-script"))
        assert plain is not None and plain["status"] == "stopped" and plain["last_step"] == 2
        assert sorted(values(store, plain["id"], "perf/step_time_s")) == [1, 2]  # no token count to divide
        assert not values(store, plain["id"], "perf/tokens_per_s")
        stop = store.conn.execute(
            "SELECT state, result FROM commands WHERE run_id=?", (plain["id"],)
        ).fetchone()
        assert stop[0] == "done" and "stopping after step 2" in stop[1]
        # The stop saved a checkpoint first, even with save_strategy="no".
        assert plain["last_checkpoint"] == str(tmp_path / "out" / "plain" / "checkpoint-2")
        assert (tmp_path / "out" / "plain" / "checkpoint-2").is_dir()
        events = store.conn.execute("SELECT step, kind FROM events WHERE run_id=?", (plain["id"],)).fetchall()
        assert events == [(2, "checkpoint")]
        assert json.loads(plain["config"]) == {"output_dir": str(tmp_path / "out" / "plain")}


def values(store: Store, run_id: int, key: str) -> dict[int, float]:
    rows = store.conn.execute("SELECT step, value FROM metrics WHERE run_id=? AND key=?", (run_id, key))
    return dict(rows.fetchall())


def test_a_script_that_dies_leaves_its_run_failed_with_the_reason(scripts: dict[str, Script]) -> None:
    tmp_path = scripts["dies"].where
    code, err = scripts["dies"].finish()
    assert code == 1 and "the user's script broke" in err
    with Store(tmp_path / "home" / "carl.db") as store:
        run = store.run(store.run_id_by_name("broken"))
        assert run is not None and run["status"] == "failed"
        assert run["error"] == "RuntimeError: the user's script broke"
        assert run["last_step"] == 1  # it raised at the end of step 2, before that step was logged
