"""A model worker's model runs in a process of its own (engine/agents/model_process.py): it answers as the
model itself does, answers asked for ahead included; a model that cannot load says so in one line; and the
model process ends with its worker, even one killed with SIGKILL. The real tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.agents.backends import ModelBackend
from engine.agents.model_process import ModelProcess
from engine.agents.plane_settings import AgentsSettings
from engine.agents.tasks import demo_tasks
from engine.errors import CarlError

pytestmark = pytest.mark.slow

SETTINGS = AgentsSettings(worker_kind="model", max_new_tokens=8)


def test_the_model_process_answers_as_the_model_does_with_answers_asked_ahead(tiny_home: Path) -> None:
    tasks = [spec.event("manager") for spec in demo_tasks()[:4]]
    here = ModelBackend(SETTINGS, tiny_home, seed=0)
    expected = [here.answer(task) for task in tasks]
    apart = ModelProcess(SETTINGS, tiny_home, seed=0)
    try:
        first = apart.answer(tasks[0])
        apart.submit(tasks[1])  # asked ahead, as a worker does while it hands in the answer in hand
        apart.submit(tasks[2])
        got = [first, apart.answer(tasks[1]), apart.answer(tasks[2]), apart.answer(tasks[3])]
        version = apart.version
        child = apart.proc.pid
    finally:
        apart.close()
    assert [a.token_ids for a in got] == [a.token_ids for a in expected]  # the same samples, in order
    for answer, reference in zip(got, expected, strict=True):
        assert answer.logprobs == pytest.approx(reference.logprobs)
    assert version == here.version and child != os.getpid()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_model_that_cannot_load_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = AgentsSettings(worker_kind="model", model=str(tmp_path / "no-model-here"))
    with pytest.raises(CarlError) as refused:
        ModelProcess(settings, tmp_path)
    assert "\n" not in str(refused.value) and str(refused.value)


SPAWN = """
import sys, time
from pathlib import Path
from engine.agents.plane_settings import AgentsSettings
from engine.agents.model_process import ModelProcess
if __name__ == "__main__":
    model = ModelProcess(AgentsSettings(worker_kind="model", max_new_tokens=8), Path(sys.argv[1]))
    print(model.proc.pid, flush=True)
    time.sleep(600)
"""


def test_the_model_process_ends_with_its_worker_even_one_killed(tiny_home: Path, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SPAWN)
    worker = subprocess.Popen(
        [sys.executable, str(script), str(tiny_home)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    child = None
    try:
        assert worker.stdout is not None
        child = int(worker.stdout.readline())
        assert psutil.pid_exists(child)
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        deadline = time.monotonic() + 30
        while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the model process outlived its worker"
            time.sleep(0.05)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
        if child is not None and psutil.pid_exists(child):
            psutil.Process(child).kill()
